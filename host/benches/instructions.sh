#!/usr/bin/env bash
# Instructions per tool call, counted by valgrind's callgrind: a figure that repeats run to
# run (this machine has no hardware counters, and timings move 10-15 % between runs).
#
#   host/benches/instructions.sh [path/to/obol] [calls]
#
# Starts the bench's Node vendor and one `obol serve` (embedded store) under callgrind with
# instrumentation off, warms it with 50 calls, counts `calls` more (default 400, c=1, one
# keep-alive connection) and writes the profile to $OUT (default ./instructions.out.1).
# Read it with `callgrind_annotate instructions.out.1` (self) or `--inclusive=yes`.
# COMPONENT=path/to/payments.wasm serves another build of the bundled `stripe` connector
# instead (a connector change counted without rebuilding the gateway). With
# OBOL_WASM_PERFMAP=1 the gateway writes /tmp/perf-<pid>.map, which names the guest's
# functions behind the profile's bare `???:0x…` addresses (docs/performance.md).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
bin="${1:-${CARGO_TARGET_DIR:-$here/../../target}/release/obol}"
calls="${2:-400}"
out="$(realpath -m "${OUT:-instructions.out}")"
component="${COMPONENT:-bundled:stripe}"
[[ "$component" == bundled:* ]] || component="$(realpath -m "$component")"
dir="$(mktemp -d)"
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$dir"' EXIT
cd "$dir"
node "$here/vendor.js" > vendor.out &
for _ in $(seq 50); do grep -q listening vendor.out && break; sleep 0.1; done
port="$(sed -n 's/^listening //p' vendor.out)"
python3 -c 'import os; print(os.urandom(32).hex())' > approval.key
hash() { python3 -c "import hashlib,sys; print(hashlib.sha256(sys.argv[1].encode()).hexdigest())" "$1"; }
cat > obol.toml <<TOML
[connectors]
components = ["$component"]
[[workspaces]]
id = "bench"
[[workspaces.connections]]
id = "stripe"
connector = "stripe"
base_url = "http://127.0.0.1:$port"
[[keys]]
name = "bench"
hash = "sha256:$(hash obk_bench)"
workspace = "bench"
environment = "dev"
allowed_tools = ["stripe.*"]
[approvals]
signing_key = { id = "bench", file = "$dir/approval.key" }
[store]
path = "$dir/store.redb"
[runtime]
# Valgrind's address space (~64 GiB) holds the guard-page reservations of 4 slots' memories,
# not the default 64 slots' (ADR-0065): with more, the gateway would fall back to
# bounds-checked guests and this would count code a deployment does not run.
max_concurrent_calls = 4
TOML
RUST_LOG=warn valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file="$out" \
  "$bin" serve --listen 127.0.0.1:0 --config obol.toml > obol.out 2> valgrind.err &
gateway=$!
for _ in $(seq 600); do grep -q "obol listening on" obol.out && break; sleep 0.5; done
address="$(sed -n 's|.*obol listening on http://\([^/]*\)/.*|\1|p' obol.out | head -1)"
drive() {
  python3 - "$address" "$1" "${2:-}" <<'PY'
import http.client, json, sys
host, port = sys.argv[1].split(":")
calls, session = int(sys.argv[2]), sys.argv[3]
connection = http.client.HTTPConnection(host, int(port))
headers = {"authorization": "Bearer obk_bench", "content-type": "application/json",
           "accept": "application/json, text/event-stream"}
if not session:
    connection.request("POST", "/mcp", json.dumps({"jsonrpc": "2.0", "id": 0,
        "method": "initialize", "params": {"protocolVersion": "2025-11-25",
        "capabilities": {}, "clientInfo": {"name": "instructions", "version": "0"}}}), headers)
    answer = connection.getresponse(); answer.read()
    session = answer.getheader("mcp-session-id")
    print(session)
headers["mcp-session-id"] = session
call = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
    "params": {"name": "stripe.charges.list", "arguments": {"limit": 2}}})
for _ in range(calls):
    connection.request("POST", "/mcp", call, headers)
    text = connection.getresponse().read()
    assert b'"result"' in text, text
PY
}
session="$(drive 50)"
callgrind_control -i on "$gateway" > /dev/null 2>&1
drive "$calls" "$session"
callgrind_control -d "$gateway" > /dev/null 2>&1
sleep 1
profile="$(callgrind_annotate "$out.1" 2>/dev/null)"
total="$(sed -n 's/^ *\([0-9,]*\) .*PROGRAM TOTALS.*/\1/p' <<< "$profile" | tr -d ,)"
# valgrind counts a large copy's `rep movsb` one instruction per byte: shown apart.
copies="$(grep -m1 '__memcpy_avx_unaligned' <<< "$profile" | sed 's/^ *\([0-9,]*\) .*/\1/' | tr -d , || true)"
if grep -q "bounds-checked" obol.out valgrind.err; then
  echo "warning: the gateway fell back to bounds-checked guests under valgrind" >&2
fi
echo "$calls calls: $((total / calls)) instructions per call, of them $((${copies:-0} / calls)) in memcpy ($out.1)"
