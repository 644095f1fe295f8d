//! Test a connector component the way the gateway will run it.
//!
//! ```ignore
//! // connectors/acme/tests/component.rs
//! let harness = obol_harness::build_this_crate!();
//! assert_eq!(harness.manifest().name, "acme");
//! let request = harness.prepare("widgets.list", json!({"limit": 5})).unwrap();
//! assert_eq!(request.url, "http://vendor.test/v1/widgets?limit=5");
//! let output = harness.interpret("widgets.list", 200, br#"{"data": []}"#).unwrap();
//! ```
//!
//! [`Harness::build`] compiles the crate for `wasm32-wasip2` and hands the `.wasm` to the
//! gateway itself: `obol harness` loads it with the loader, manifest validation, sandbox and
//! limits `obol serve` uses, checks the arguments against the tool's input schema before
//! `prepare`, and holds what `interpret` returns to the output cap and the tool's output
//! schema ([`protocol`], ADR-0056). The author's `cargo test` compiles no WebAssembly runtime.
//! (The gateway's checks of the request itself, against the connection's origin, need a
//! connection and are not made here.)
//!
//! The `obol` binary is found through `OBOL_BIN`, then beside the test binary (a build of
//! the Obol workspace), then on `PATH`.
//!
//! Within one test binary the crate is built once and one `obol harness` serves every test of
//! a component; the gateway caches compiled code on disk by the component's sha256, so the
//! tests of an unchanged crate skip both cargo's work and Cranelift's.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::{Arc, Mutex, OnceLock};

use serde_json::Value;

pub mod protocol;

pub use protocol::{
    Broker, Content, Effect, Header, Image, InterpretError, Manifest, Method, OutboundRequest,
    PrepareError, Propagation, RouteKind, StatusClass, Tool, ToolOutput,
};
use protocol::{Reply, Request};

/// The base URL `prepare` is given unless a test sets another.
pub const BASE_URL: &str = "http://vendor.test";

/// Builds the calling crate and loads it: `obol_harness::build_this_crate!()`.
#[macro_export]
macro_rules! build_this_crate {
    () => {
        $crate::Harness::build(env!("CARGO_MANIFEST_DIR"), env!("CARGO_PKG_NAME"))
    };
}

/// A loaded component plus the connection facts its calls see.
pub struct Harness {
    sandbox: Arc<Sandbox>,
    pub base_url: String,
    pub settings: Vec<(String, String)>,
}

impl Harness {
    /// Compiles the crate at `manifest_dir` to a component and loads it. Panics with cargo's
    /// or the gateway's message on failure: this is a test helper.
    pub fn build(manifest_dir: &str, package: &str) -> Harness {
        // Tests run in parallel threads: the first one builds, the others wait for its file.
        static BUILT: OnceLock<Mutex<HashMap<PathBuf, PathBuf>>> = OnceLock::new();
        let mut built = BUILT
            .get_or_init(Mutex::default)
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let wasm = built
            .entry(PathBuf::from(manifest_dir))
            .or_insert_with(|| build_component(manifest_dir, package))
            .clone();
        drop(built);
        Harness::load(&wasm)
    }

    /// Loads an already built component into `obol harness`.
    pub fn load(path: &Path) -> Harness {
        let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        // One gateway per distinct component per test binary, whatever the number of tests.
        static LOADED: OnceLock<Mutex<HashMap<Vec<u8>, Arc<Sandbox>>>> = OnceLock::new();
        let mut loaded = LOADED
            .get_or_init(Mutex::default)
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let sandbox = Arc::clone(
            loaded
                .entry(bytes)
                .or_insert_with(|| Arc::new(Sandbox::start(obol_binary(), path))),
        );
        drop(loaded);
        Harness {
            sandbox,
            base_url: BASE_URL.into(),
            settings: Vec::new(),
        }
    }

    /// How the gateway would classify an answer to `tool`: by the tool's declared status
    /// classes, then its body rules (contract 0.2.0). The component is not asked.
    pub fn classify(&self, tool: &str, status: u16, body: &[u8]) -> StatusClass {
        let request = Request::Classify {
            tool: tool.to_owned(),
            status,
            body: body.to_vec(),
        };
        match self.sandbox.ask(&request) {
            Reply::Classified(class) => class,
            other => unexpected(other),
        }
    }

    /// The validated manifest, exactly as the gateway sees it.
    pub fn manifest(&self) -> &Manifest {
        &self.sandbox.manifest
    }

    /// Runs `prepare` after the gateway's own input-schema check.
    pub fn prepare(&self, tool: &str, arguments: Value) -> Result<OutboundRequest, PrepareError> {
        let request = Request::Prepare {
            tool: tool.to_owned(),
            arguments,
            base_url: self.base_url.clone(),
            settings: self.settings.clone(),
        };
        match self.sandbox.ask(&request) {
            Reply::Prepared(prepared) => prepared,
            other => unexpected(other),
        }
    }

    /// Feeds a canned vendor response, with the one header `content-type: application/json`,
    /// to `interpret`, and checks what it returns as the gateway does: within the output cap,
    /// structured output that is JSON, and on an answer the tool's status classes accept,
    /// structured output that matches the tool's own output schema. A panic says which
    /// (naming the failing field): the gateway would refuse every such call.
    pub fn interpret(
        &self,
        tool: &str,
        status: u16,
        body: &[u8],
    ) -> Result<ToolOutput, InterpretError> {
        self.interpret_with_headers(tool, status, &[("content-type", "application/json")], body)
    }

    /// [`Harness::interpret`] with the answer's headers given, for a connector that reads
    /// them (a next page's cursor, a rate limit, a content type other than JSON). The
    /// component gets them as a call's `interpret` would from an HTTP/1.1 answer: names in
    /// lower case, a name's values together at its first place, values trimmed of spaces and
    /// tabs, without cookies, hop-by-hop headers (`Connection`, `Keep-Alive`,
    /// `Transfer-Encoding`, ...) and values that are not visible ASCII. A name or a value no
    /// HTTP answer could carry panics, as do more than 100 headers (the gateway's HTTP client
    /// refuses such an answer).
    pub fn interpret_with_headers(
        &self,
        tool: &str,
        status: u16,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Result<ToolOutput, InterpretError> {
        let request = Request::Interpret {
            tool: tool.to_owned(),
            status,
            headers: headers
                .iter()
                .map(|&(name, value)| Header {
                    name: name.to_owned(),
                    value: value.to_owned(),
                })
                .collect(),
            body: body.to_vec(),
        };
        match self.sandbox.ask(&request) {
            Reply::OutputRefused(why) => panic!("{tool}: {why}"),
            Reply::Interpreted(output) => output,
            other => unexpected(other),
        }
    }
}

/// A reply that does not answer the request: the component failed, the request was wrong,
/// or the gateway does not speak this harness's protocol. In a connector's own tests each is
/// a bug to see, not a value to assert on.
fn unexpected(reply: Reply) -> ! {
    match reply {
        Reply::Failed(why) => panic!("the component {why}"),
        Reply::Misused(why) => panic!("{why}"),
        other => panic!("obol harness answered out of turn: {other:?}"),
    }
}

/// `obol harness` with one component loaded, serving requests one at a time.
struct Sandbox {
    manifest: Manifest,
    link: Mutex<Link>,
    /// What the gateway wrote to stderr, for the message when it stops answering.
    stderr: Arc<Mutex<String>>,
    binary: PathBuf,
}

struct Link {
    input: ChildStdin,
    output: BufReader<ChildStdout>,
    _child: Child,
}

impl Sandbox {
    fn start(binary: PathBuf, wasm: &Path) -> Sandbox {
        let mut child = Command::new(&binary)
            .arg("harness")
            .arg("--protocol")
            .arg(protocol::VERSION.to_string())
            .arg("--cache")
            .arg(guest_target_dir().join("obol-harness-cache"))
            .arg(wasm)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "obol-harness runs components in the gateway, and `{}` would not start ({e}): install the `obol` of the same Obol release as obol-harness and put it on PATH, or point OBOL_BIN at it",
                    binary.display()
                )
            });
        let stderr = Arc::new(Mutex::new(String::new()));
        if let Some(mut pipe) = child.stderr.take() {
            let stderr = Arc::clone(&stderr);
            std::thread::spawn(move || {
                let mut chunk = [0u8; 4096];
                while let Ok(n @ 1..) = pipe.read(&mut chunk) {
                    let mut kept = stderr.lock().unwrap_or_else(|p| p.into_inner());
                    kept.push_str(&String::from_utf8_lossy(&chunk[..n]));
                    // The last 64 KiB: what explains an exit is at the end (a component
                    // logging on every call cannot push it out, nor fill memory).
                    if kept.len() > 128 << 10 {
                        let mut cut = kept.len() - (64 << 10);
                        while !kept.is_char_boundary(cut) {
                            cut += 1;
                        }
                        kept.drain(..cut);
                    }
                }
            });
        }
        let link = Link {
            input: child.stdin.take().expect("piped stdin"),
            output: BufReader::new(child.stdout.take().expect("piped stdout")),
            _child: child,
        };
        let mut sandbox = Sandbox {
            manifest: Manifest {
                name: String::new(),
                version: String::new(),
                contract: String::new(),
                sha256: String::new(),
                tools: Vec::new(),
            },
            link: Mutex::new(link),
            stderr,
            binary,
        };
        let first = {
            let mut link = sandbox.link.lock().unwrap_or_else(|p| p.into_inner());
            sandbox.read(&mut link, Stage::Starting)
        };
        sandbox.manifest = match first {
            Reply::Loaded(manifest) => manifest,
            Reply::Refused(why) => panic!(
                "the gateway would refuse this component: {}: {why}",
                wasm.display()
            ),
            Reply::Unsupported { speaks, asked } => panic!(
                "`{} harness` speaks harness protocol {speaks}, and obol-harness {} protocol {asked}: use obol and obol-harness of one Obol release",
                sandbox.binary.display(),
                env!("CARGO_PKG_VERSION")
            ),
            other => unexpected(other),
        };
        sandbox
    }

    fn ask(&self, request: &Request) -> Reply {
        let mut link = self.link.lock().unwrap_or_else(|p| p.into_inner());
        let mut line = serde_json::to_string(request).expect("plain data");
        line.push('\n');
        if link.input.write_all(line.as_bytes()).is_err() {
            self.stopped(Stage::Serving);
        }
        self.read(&mut link, Stage::Serving)
    }

    fn read(&self, link: &mut Link, stage: Stage) -> Reply {
        let mut line = String::new();
        match link.output.read_line(&mut line) {
            Ok(1..) => serde_json::from_str(&line).unwrap_or_else(|e| {
                panic!(
                    "`{} harness` answered something obol-harness {} cannot read ({e}): use the obol of the same Obol release",
                    self.binary.display(),
                    env!("CARGO_PKG_VERSION")
                )
            }),
            _ => self.stopped(stage),
        }
    }

    /// The gateway closed its output: it did not start (an `obol` without `harness`) or it
    /// died; its own last words say why.
    fn stopped(&self, stage: Stage) -> ! {
        // Its stderr ends when it exits; give the reader thread a moment to take the rest.
        std::thread::sleep(std::time::Duration::from_millis(100));
        let said = self.stderr.lock().unwrap_or_else(|p| p.into_inner());
        let hint = match stage {
            Stage::Starting => format!(
                "\n(obol-harness {} speaks harness protocol {}: it needs the obol of the same Obol release)",
                env!("CARGO_PKG_VERSION"),
                protocol::VERSION
            ),
            Stage::Serving => String::new(),
        };
        panic!(
            "`{} harness` stopped answering: {}{hint}",
            self.binary.display(),
            said.trim(),
        )
    }
}

/// Whether the gateway had loaded the component when it stopped answering.
#[derive(Clone, Copy)]
enum Stage {
    Starting,
    Serving,
}

/// The `obol` to run components in: `OBOL_BIN`, else the one beside this test binary (a
/// build of the Obol workspace puts it at `<target>/<profile>/obol`), else `obol` on `PATH`.
fn obol_binary() -> PathBuf {
    if let Some(path) = std::env::var_os("OBOL_BIN") {
        return path.into();
    }
    // <target>/<profile>/deps/<test binary>
    let beside = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.ancestors().nth(2).map(|profile| profile.join("obol")));
    match beside {
        Some(path) if path.is_file() => path,
        _ => PathBuf::from("obol"),
    }
}

/// One vendor exchange, recorded once from the real vendor and replayed in tests: the answer
/// `interpret` is fed. Stored as JSON; nothing secret is kept (see [`Harness::record`]).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Fixture {
    pub tool: String,
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

/// Response headers never written to a fixture: they carry credentials or sessions.
#[cfg(feature = "record")]
fn secret_header(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    [
        "authorization",
        "cookie",
        "set-cookie",
        "token",
        "secret",
        "key",
        "session",
    ]
    .iter()
    .any(|word| name.contains(word))
}

impl Harness {
    /// Sends what `prepare` builds for `tool` to the real vendor at [`Harness::base_url`]
    /// (with `credential` as one request header, as the gateway would add it), writes the
    /// answer to `fixture`, and returns it. Secrets stay out of the file: a header whose
    /// name holds `authorization`, `cookie`, `token`, `secret`, `key` or `session` is dropped
    /// (so is a next-page token sent as such a header: write that exchange's headers by hand
    /// and use [`Harness::interpret_with_headers`]), and the credential's value is replaced
    /// (whole, and its token alone after a scheme such as `Bearer`) by `[redacted]` wherever
    /// the answer's headers or body repeat it (`content-length` then counts the body as
    /// written). Run it once (an ignored test, or behind an env
    /// var), commit the fixture, and [`Harness::replay`] it in every run after. The body is
    /// kept byte for byte, so it must be UTF-8 text (a fixture is JSON); an answer that is
    /// not panics, saying so.
    ///
    /// Needs the harness's `record` feature (`features = ["record"]`): the HTTP client it
    /// sends with is a build that replaying does not need.
    #[cfg(feature = "record")]
    pub fn record(
        &self,
        tool: &str,
        arguments: Value,
        credential: Option<(&str, &str)>,
        fixture: &Path,
    ) -> Fixture {
        let request = self
            .prepare(tool, arguments)
            .unwrap_or_else(|e| panic!("{tool}: prepare refused the arguments: {e:?}"));
        let method = match request.method {
            Method::Get => reqwest::Method::GET,
            Method::Post => reqwest::Method::POST,
            Method::Put => reqwest::Method::PUT,
            Method::Patch => reqwest::Method::PATCH,
            Method::Delete => reqwest::Method::DELETE,
        };
        // Only recording talks to the network; replaying needs no runtime.
        let network = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a tokio runtime");
        let answer = network.block_on(async {
            let mut sent = reqwest::Client::new().request(method, &request.url);
            for header in &request.headers {
                sent = sent.header(&header.name, &header.value);
            }
            if let Some((name, value)) = credential {
                sent = sent.header(name, value);
            }
            if let Some(body) = request.body {
                sent = sent.body(body);
            }
            let answer = sent
                .send()
                .await
                .unwrap_or_else(|e| panic!("{tool}: the vendor did not answer: {e}"));
            let status = answer.status().as_u16();
            let headers: Vec<(String, String)> = answer
                .headers()
                .iter()
                .filter(|(name, _)| !secret_header(name.as_str()))
                // The gateway's rule on which reach the component runs on replay (a value that
                // is not UTF-8 becomes one that is not ASCII, which it leaves out too).
                .map(|(name, value)| {
                    let value = String::from_utf8_lossy(value.as_bytes()).into_owned();
                    (name.to_string(), value)
                })
                .collect();
            // As sent: `text()` would transcode by the content type's charset, and the
            // component of a real call gets the bytes.
            let body = answer
                .bytes()
                .await
                .unwrap_or_else(|e| panic!("{tool}: the vendor's answer broke off: {e}"));
            (status, headers, body)
        });
        let (status, mut headers, body) = answer;
        let mut body = String::from_utf8(body.to_vec()).unwrap_or_else(|_| {
            panic!(
                "{tool}: the vendor's answer is not UTF-8 text, which a fixture cannot hold; \
                 feed it to Harness::interpret_with_headers instead"
            )
        });
        let sent = body.len();
        if let Some((_, value)) = credential {
            // The whole value, then its token alone where it has a scheme (`Bearer sk_...`):
            // a vendor may echo either.
            let token = value.split_once(' ').map(|(_, token)| token.trim());
            for secret in [Some(value), token].into_iter().flatten() {
                if secret.is_empty() {
                    continue;
                }
                body = body.replace(secret, "[redacted]");
                for (_, header) in &mut headers {
                    *header = header.replace(secret, "[redacted]");
                }
            }
        }
        if body.len() != sent {
            for (name, value) in &mut headers {
                if name == "content-length" {
                    *value = body.len().to_string();
                }
            }
        }
        let recorded = Fixture {
            tool: tool.to_owned(),
            status,
            headers,
            body,
        };
        let text = serde_json::to_string_pretty(&recorded).expect("plain data");
        if let Some(dir) = fixture.parent() {
            std::fs::create_dir_all(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        }
        std::fs::write(fixture, text).unwrap_or_else(|e| panic!("{}: {e}", fixture.display()));
        recorded
    }

    /// Feeds a recorded exchange (its status, headers and body) to `interpret`, with the same
    /// checks as [`Harness::interpret_with_headers`].
    pub fn replay(&self, fixture: &Path) -> Result<ToolOutput, InterpretError> {
        let text = std::fs::read_to_string(fixture).unwrap_or_else(|e| {
            panic!(
                "{}: {e} (record it once with Harness::record against the vendor)",
                fixture.display()
            )
        });
        let recorded: Fixture = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("{}: not a fixture: {e}", fixture.display()));
        let headers: Vec<(&str, &str)> = recorded
            .headers
            .iter()
            .map(|(name, value)| (name.as_str(), value.as_str()))
            .collect();
        self.interpret_with_headers(
            &recorded.tool,
            recorded.status,
            &headers,
            recorded.body.as_bytes(),
        )
    }
}

/// Runs `cargo build --release --target wasm32-wasip2` for the crate and returns the `.wasm`
/// it made: the file the author ships.
fn build_component(manifest_dir: &str, package: &str) -> PathBuf {
    let target_dir = guest_target_dir();
    let status = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .args([
            "build",
            "--release",
            "--target",
            "wasm32-wasip2",
            "--manifest-path",
        ])
        .arg(Path::new(manifest_dir).join("Cargo.toml"))
        .arg("--target-dir")
        .arg(&target_dir)
        .env_remove("CARGO_TARGET_DIR")
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .env_remove("RUSTFLAGS")
        .status()
        .expect("run cargo");
    assert!(
        status.success(),
        "building {package} for wasm32-wasip2 failed"
    );
    let wasm = target_dir
        .join("wasm32-wasip2/release")
        .join(format!("{}.wasm", package.replace('-', "_")));
    assert!(
        wasm.is_file(),
        "cargo built {package} but made no {}: a connector crate needs\n\n    [lib]\n    crate-type = [\"cdylib\", \"rlib\"]\n\nin its Cargo.toml (cdylib is the component the gateway loads)",
        wasm.display()
    );
    wasm
}

/// The test binary's own target directory: the component the harness builds and tests is
/// `<target>/wasm32-wasip2/release/NAME.wasm`, the very file `cargo build --release --target
/// wasm32-wasip2` makes for the author to ship (cargo holds no lock on it while tests run).
/// `OBOL_GUEST_TARGET_DIR` overrides it.
fn guest_target_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("OBOL_GUEST_TARGET_DIR") {
        return dir.into();
    }
    // <target>/<profile>/deps/<test binary>
    let exe = std::env::current_exe().expect("the test binary's path");
    exe.ancestors()
        .nth(3)
        .map(Path::to_owned)
        .unwrap_or_else(|| std::env::temp_dir().join("obol-guests"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[should_panic(
        expected = "would not start (No such file or directory (os error 2)): install the `obol` of the same Obol release as obol-harness and put it on PATH, or point OBOL_BIN at it"
    )]
    fn a_missing_gateway_says_where_to_get_one() {
        Sandbox::start(PathBuf::from("/nonexistent/obol"), Path::new("acme.wasm"));
    }

    /// An `obol` without the `harness` command (an older release) exits at once: its own
    /// error is shown with the release rule.
    #[test]
    #[should_panic(expected = "harness` stopped answering: ")]
    fn a_binary_that_does_not_serve_the_harness_is_named_with_its_own_error() {
        Sandbox::start(PathBuf::from("/bin/sh"), Path::new("acme.wasm"));
    }
}
