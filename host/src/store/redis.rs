//! The Redis backend, for several gateways sharing one state: one Redis server (with or
//! without replicas) or a Redis Cluster.
//!
//! Every multi-key transition is one Lua script, and every key a script touches carries the
//! claim's hash tag (`obol:{<slot>}:…`), so the same scripts run unchanged on a cluster. The
//! indexes that live outside a claim's slot (the lease index, a receipt's pointer and its
//! workspace listing) are written by the script itself on a single server: with the write
//! they belong to, only when it happens, in one command. A cluster script cannot touch keys
//! of other slots, so there they are written in the same [`Writes`] as the script, one
//! pipeline per slot, in order ([`Entries`]). A call's audit record is always written by the
//! script with its receipt: on a single server to its workspace's stream, on a cluster to a
//! stream in the claim's slot ([`audit_stream`]).
//!
//! Durability: Obol relies on what Redis acknowledges. It refuses a server that could lose
//! an acknowledged write (`appendonly yes`, `appendfsync always` and `noeviction` are
//! required, on every node of a cluster), and with `redis_replicas` it counts a write only
//! once that many replicas acknowledged it (`WAITAOF` where the server has it, else `WAIT`),
//! pipelined with the write itself (`docs/operations.md`).

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{MultipleNodeRoutingInfo, RoutingInfo, SingleNodeRoutingInfo};
use redis::{AsyncCommands, Cmd, RedisFuture, RedisResult, Script, Value};

use super::{Claim, ClaimKey, ClaimRecord, Receipt, Registry, RegistryWrite, StoreError};
use crate::approvals::{ApprovalId, Decided, Decision, Ticket};
use crate::listener::lanes;

/// Slot → lease end (ms) of claims with an attempt reserved, for the sweeper. It lives outside
/// every claim's hash tag: on a cluster it is written beside the scripts, before a reservation
/// (a failed write fails the call closed, and an entry whose claim moved on is dropped by the
/// sweeper) and after the claim leaves `Reserved`; on one server the scripts write it.
const LEASES: &str = "obol:leases";

/// Drops a slot's lease index entry unless a later reservation wrote a later lease since.
const DROP_LEASE_FN: &str = r"
local function drop_lease(index, slot, bound)
  local s = redis.call('ZSCORE', index, slot)
  if s and tonumber(s) <= tonumber(bound) then redis.call('ZREM', index, slot) end
end
";

const DROP_LEASE_BODY: &str = "drop_lease(KEYS[1], ARGV[1], ARGV[2])\nreturn 0\n";

/// Keeps a workspace's key (its audit stream, its receipt listing) at least a retention past
/// its newest entry, and at most a tenth of one more. Its expiry is renewed only once it has
/// left that window (below: a new entry; above: the retention was lowered), not on every
/// write: each renewal is a command in the append-only file, and a busy workspace's keys
/// would otherwise be re-expired on every call (two more commands a finalize). Its entries
/// are trimmed by age on each write whatever the key's expiry. (A claim's own keys keep the
/// exact retention: the retention is one policy with the embedded store's.)
const KEEP_FOR_FN: &str = r"
local function keep_for(key, retention_s)
  local retention = tonumber(retention_s)
  local kept = retention + math.ceil(retention / 10)
  local ttl = redis.call('PTTL', key)
  if ttl < retention * 1000 or ttl > kept * 1000 then
    redis.call('EXPIRE', key, string.format('%d', kept))
  end
end
";

/// Lists a receipt in its workspace's listing (a sorted set by finalize time), trims the
/// entries past the retention (finalized before `horizon`) and keeps the listing
/// ([`KEEP_FOR_FN`]). The trim runs on every write, so each removes about one entry: trimmed
/// only now and then, a busy workspace's listing would lose hours of entries in one command,
/// and Redis serves nothing else meanwhile.
const LIST_RECEIPT_FN: &str = r"
local function list_receipt(listing, id, at, horizon, retention_s)
  redis.call('ZADD', listing, at, id)
  redis.call('ZREMRANGEBYSCORE', listing, 0, horizon)
  keep_for(listing, retention_s)
end
";

const LIST_RECEIPT_BODY: &str =
    "list_receipt(KEYS[1], ARGV[1], ARGV[2], ARGV[3], ARGV[4])\nreturn 0\n";

/// Appends an audit record to a stream and trims the stream to the retention: entries whose
/// id (the server's time when each was added) is older than `now` - the retention, in whole
/// nodes (`~`: cheap, may keep a few older entries until their node is all old). The caller
/// sets the stream's expiry. (A retention longer than the time since 1970 trims nothing: a
/// negative bound is no stream id.)
const APPEND_AUDIT_FN: &str = r"
local function append_audit(stream, event, now, retention_s)
  local horizon = math.max(0, now - tonumber(retention_s) * 1000)
  redis.call('XADD', stream, 'MINID', '~', string.format('%d', horizon), '*', 'event', event)
end
";

const APPEND_AUDIT_BODY: &str =
    "append_audit(KEYS[1], ARGV[1], now, ARGV[2])\nkeep_for(KEYS[1], ARGV[2])\nreturn 0\n";

/// Leases live on the server's clock: a reservation stores `l`, the server time its lease
/// ends (`TIME` + the remaining lease the gateway asks for), and every read returns `l` with
/// the server's time, so a reader judges a lease by the server's clock, never its own. (Since
/// Redis 7 scripts replicate their effects, so `TIME` in a script is allowed.)
///
/// Every script passes the numbers it computes to commands as formatted integers: Redis
/// 7.2.0-7.2.4 turn a Lua number that is a multiple of 10^8 into text such as `9.9e+9`
/// (redis/redis#13113), which `EXPIRE` and `XADD … MINID` refuse and a reader of `l` cannot
/// parse.
const NOW_MS: &str =
    "local t = redis.call('TIME')\nlocal now = t[1] * 1000 + math.floor(t[2] / 1000)\n";

/// The `l` a write stores: where its lease ends, or -1 when none runs, which reads as a
/// missing `l` does. Written in the record's own `HSET` rather than deleted apart: one
/// logged command a write instead of two. (Records before it have no `l` once settled.)
const LEASE_END_FN: &str = r"
local function lease_end(now, remaining)
  if remaining == '' then return -1 end
  return string.format('%d', now + tonumber(remaining))
end
";

/// `{0}`: claimed. `{1, r, l, now}`: another record is there. Safe to run twice: every write
/// stores its unique write id `w`, so a client that resends after a lost reply (the cluster
/// client does, on a dropped connection) finds its own write and is told it claimed. (Not the
/// record's content: two racers can write identical records in the same millisecond.)
/// With `KEYS[2]` (the lease index, one server only), a reservation's entry is written first.
const CLAIM_BODY: &str = r"
local v = redis.call('HGET', KEYS[1], 'v')
if v then
  if redis.call('HGET', KEYS[1], 'w') == ARGV[5] then return {0} end
  return {1, redis.call('HGET', KEYS[1], 'r'), redis.call('HGET', KEYS[1], 'l') or -1, now}
end
if KEYS[2] and ARGV[6] ~= '' then redis.call('ZADD', KEYS[2], 'GT', ARGV[6], ARGV[7]) end
redis.call('HSET', KEYS[1], 'v', ARGV[2], 'r', ARGV[1], 'w', ARGV[5], 'l', lease_end(now, ARGV[4]))
redis.call('EXPIRE', KEYS[1], ARGV[3])
return {0}
";

/// A claim with its server-clock lease: `{r, l or -1, now}`.
const GET_CLAIM_BODY: &str = r"
return {redis.call('HGET', KEYS[1], 'r') or false, redis.call('HGET', KEYS[1], 'l') or -1, now}
";

/// -1: the record is gone (never a lost race); 0: another version is stored; 1: done (also
/// when this very write, by its write id, is already stored: a resend after a lost reply).
/// The claim record is written last, so a script that fails part-way never leaves a finalized
/// claim without its receipt. With a receipt it appends the audit record to `KEYS[3]` (see
/// [`audit_stream`]), trimmed to the retention by the server's clock: the workspace's stream
/// on one server (kept by [`KEEP_FOR_FN`]), the claim's own on a cluster (kept as long as the
/// claim). On one server
/// (`KEYS[4]`, the lease index, and with a receipt `KEYS[5]`, the workspace's listing, and
/// `KEYS[6]`, the receipt's pointer) the script also writes the lease index entry of a new
/// reservation or drops the one this transition leaves, and lists the receipt before writing
/// it. The drop needs no compare there: the compare-and-set passed in this very script, so no
/// later reservation of the slot can have written its entry.
const TRANSITION_BODY: &str = r"
local v = redis.call('HGET', KEYS[1], 'v')
if not v then return -1 end
if tonumber(ARGV[2]) ~= tonumber(ARGV[1]) + 1 then
  return redis.error_reply('OBOL_VERSION_STEP')
end
if v ~= ARGV[1] then
  if redis.call('HGET', KEYS[1], 'w') == ARGV[8] then return 1 end
  return 0
end
if KEYS[4] then
  if ARGV[10] ~= '' then
    redis.call('ZADD', KEYS[4], 'GT', ARGV[10], ARGV[9])
  else
    redis.call('ZREM', KEYS[4], ARGV[9])
  end
end
if ARGV[5] ~= '' then
  if KEYS[5] then
    redis.call('SET', KEYS[6], KEYS[2], 'EX', ARGV[4])
    list_receipt(KEYS[5], ARGV[11], ARGV[12], ARGV[13], ARGV[4])
  end
  redis.call('SET', KEYS[2], ARGV[5], 'EX', ARGV[4])
  append_audit(KEYS[3], ARGV[6], now, ARGV[4])
  if KEYS[5] then
    keep_for(KEYS[3], ARGV[4])
  else
    redis.call('EXPIRE', KEYS[3], ARGV[4])
  end
end
redis.call('HSET', KEYS[1], 'v', ARGV[2], 'r', ARGV[3], 'w', ARGV[8], 'l', lease_end(now, ARGV[7]))
redis.call('EXPIRE', KEYS[1], ARGV[4])
return 1
";

/// A ticket is a hash (`s`: status, `t`: the ticket) kept for the retention after the ticket
/// expires. The per-workspace approvals stream carries each ticket's id, tool, idempotency key,
/// request hash, destination and `expires_at_ms`; stream entries cannot expire, so readers
/// judge expiry by that field and by the hash being gone.
/// `x` marks a ticket whose stream entry was written: a ticket without it (the stream write
/// failed after the script) gets its entry on the next put, so the inbox always lists it.
const PUT_TICKET: &str = r"
if redis.call('EXISTS', KEYS[1]) == 1 then
  if redis.call('HEXISTS', KEYS[1], 'x') == 1 then return 0 end
  return 2
end
redis.call('HSET', KEYS[1], 's', 'pending', 't', ARGV[1])
redis.call('PEXPIREAT', KEYS[1], ARGV[2])
return 1
";

const DECIDE_TICKET: &str = r"
local s = redis.call('HGET', KEYS[1], 's')
if not s then return 0 end
if s ~= 'pending' then return 1 end
redis.call('HSET', KEYS[1], 's', ARGV[1], 't', ARGV[2])
return 2
";

/// Marks a ticket's stream entry as written, only if the ticket still exists: one whose
/// expiry already passed is gone, and an unconditional HSET would leave a fragment without a
/// TTL that blocks every later repair.
const MARK_TICKET_LISTED: &str =
    "if redis.call('EXISTS', KEYS[1]) == 1 then redis.call('HSET', KEYS[1], 'x', 1) end return 0";

#[derive(Clone)]
pub struct RedisStore {
    /// One multiplexed connection, or (with replicas) a few: `WAIT` holds up the connection
    /// it is sent on until the replicas catch up, so each write waits on its own connection.
    connections: Arc<Vec<Connection>>,
    next_connection: Arc<AtomicUsize>,
    /// Each lane's own connection, by lane index (see [`RedisStore::lane_connection`]).
    lanes: Arc<Vec<LaneConnection>>,
    server: Arc<Server>,
    scripts: Arc<Scripts>,
    syncs: Arc<AtomicU64>,
    /// This store's random id and its count of writes, which make every claim write's id
    /// unique (the scripts recognise a resend of their own write by it).
    writer: u64,
    writes: Arc<AtomicU64>,
    /// How long finalized claims, receipts, audit entries and expired tickets are kept
    /// (every key carries it as its TTL; `[store] retention_hours`).
    retention_s: u64,
    /// What a write waits for before it counts (`[store] redis_replicas`).
    acknowledgement: Acknowledgement,
    /// Why the server's settings are unsafe, when the last check found them so: until a check
    /// finds them safe again, no claim is made.
    unsafe_settings: Arc<std::sync::Mutex<Option<String>>>,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore").finish_non_exhaustive()
    }
}

struct Scripts {
    claim: Script,
    transition: Script,
    get_claim: Script,
    drop_lease: Script,
    /// The drop's text, for a cluster's pipelines: sent by hash, a drop answered NOSCRIPT by
    /// its own node would have every group of its write resent, the script that ran included.
    drop_lease_text: String,
    /// A refusal's audit record, sent as text: it is the only script of its write, and by
    /// text it never meets a NOSCRIPT that would resend the write.
    append_audit_text: String,
    /// [`LIST_RECEIPT_FN`] for a listing written beside a script (a receipt's on a cluster, or
    /// a refusal's), sent as text like `append_audit_text`.
    list_receipt_text: String,
    put_ticket: Script,
    decide_ticket: Script,
}

impl Scripts {
    fn new() -> Scripts {
        Scripts {
            claim: Script::new(&format!("{NOW_MS}{LEASE_END_FN}{CLAIM_BODY}")),
            transition: Script::new(&format!(
                "{NOW_MS}{LEASE_END_FN}{KEEP_FOR_FN}{LIST_RECEIPT_FN}{APPEND_AUDIT_FN}{TRANSITION_BODY}"
            )),
            get_claim: Script::new(&format!("{NOW_MS}{GET_CLAIM_BODY}")),
            drop_lease: Script::new(&format!("{DROP_LEASE_FN}{DROP_LEASE_BODY}")),
            drop_lease_text: format!("{DROP_LEASE_FN}{DROP_LEASE_BODY}"),
            append_audit_text: format!("{NOW_MS}{KEEP_FOR_FN}{APPEND_AUDIT_FN}{APPEND_AUDIT_BODY}"),
            list_receipt_text: format!("{KEEP_FOR_FN}{LIST_RECEIPT_FN}{LIST_RECEIPT_BODY}"),
            put_ticket: Script::new(PUT_TICKET),
            decide_ticket: Script::new(DECIDE_TICKET),
        }
    }
}

/// A lane's own connection: opened on the lane, so the lane's runtime drives it and a round
/// trip wakes no other thread (ADR-0057). Empty until the lane first asks and the connection
/// is up.
#[derive(Default)]
struct LaneConnection {
    connection: OnceLock<Connection>,
    opening: AtomicBool,
}

/// The Redis deployment the store talks to, and how to open another connection to it.
enum Server {
    /// One server (a primary, with or without replicas).
    Node(redis::Client),
    /// A Redis Cluster, by any of its nodes.
    Cluster(Box<ClusterClient>),
}

/// Where the indexes outside a claim's slot (the lease index, a receipt's pointer and its
/// listing) are written.
#[derive(Debug, Clone, Copy)]
enum Entries {
    /// By the claim's script, with the write they belong to: one server, where a script may
    /// touch any key.
    InScript,
    /// Beside the script, each in a pipeline of its own slot: a cluster.
    Beside,
}

impl Server {
    fn entries(&self) -> Entries {
        match self {
            Server::Node(_) => Entries::InScript,
            Server::Cluster(_) => Entries::Beside,
        }
    }
}

/// A connection to a single server or to a cluster (which routes each command, or each
/// single-slot pipeline, to the primary that owns its slot, following redirects).
#[derive(Clone)]
enum Connection {
    Node(ConnectionManager),
    Cluster(ClusterConnection),
}

impl ConnectionLike for Connection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Connection::Node(c) => c.req_packed_command(cmd),
            Connection::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Connection::Node(c) => c.req_packed_commands(pipeline, offset, count),
            Connection::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Connection::Node(c) => c.get_db(),
            Connection::Cluster(c) => c.get_db(),
        }
    }
}

impl Server {
    /// A call must fail closed quickly when Redis is down, rather than queue behind reconnect
    /// attempts: the client retries a little, the gateway never guesses.
    async fn connect(&self) -> RedisResult<Connection> {
        match self {
            Server::Node(client) => {
                let config = ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(Duration::from_secs(2)))
                    .set_response_timeout(Some(Duration::from_secs(2)))
                    .set_number_of_retries(1)
                    .set_max_delay(Duration::from_millis(200));
                ConnectionManager::new_with_config(client.clone(), config)
                    .await
                    .map(Connection::Node)
            }
            Server::Cluster(client) => client.get_async_connection().await.map(Connection::Cluster),
        }
    }
}

impl Connection {
    /// `cmd`'s reply from every server: the one server, or every node of a cluster (replicas
    /// included), so a setting is checked wherever a claim may end up.
    async fn on_every_server(&mut self, cmd: Cmd) -> RedisResult<Vec<Value>> {
        match self {
            Connection::Node(connection) => Ok(vec![cmd.query_async(connection).await?]),
            Connection::Cluster(connection) => {
                let everywhere = RoutingInfo::MultiNode((MultipleNodeRoutingInfo::AllNodes, None));
                match connection.route_command(cmd, everywhere).await? {
                    Value::Map(replies) => replies
                        .into_iter()
                        .map(|(_, reply)| reply.extract_error())
                        .collect(),
                    reply => Ok(vec![reply]),
                }
            }
        }
    }
}

/// What a write waits for, after it ran, before the gateway acts on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Acknowledgement {
    /// The server's own reply: with `appendfsync always` the write is on its disk.
    Local,
    /// `WAIT n`: `n` replicas received the write (servers before Redis 7.2).
    Replicated { replicas: u32, timeout_ms: u64 },
    /// `WAITAOF 1 n`: the write is fsynced on the server and on `n` replicas (Redis 7.2+).
    Fsynced { replicas: u32, timeout_ms: u64 },
}

impl Acknowledgement {
    /// `replicas` acknowledgements on a server of `version` (major, minor).
    fn for_server(replicas: u32, timeout: Duration, version: (u32, u32)) -> Acknowledgement {
        let timeout_ms = timeout.as_millis() as u64;
        match replicas {
            0 => Acknowledgement::Local,
            _ if version >= (7, 2) => Acknowledgement::Fsynced {
                replicas,
                timeout_ms,
            },
            _ => Acknowledgement::Replicated {
                replicas,
                timeout_ms,
            },
        }
    }

    /// The command that waits, sent at the end of the write's own pipeline (it waits for
    /// everything written before it on the same connection).
    fn command(self) -> Option<Cmd> {
        let mut cmd;
        match self {
            Acknowledgement::Local => return None,
            Acknowledgement::Replicated {
                replicas,
                timeout_ms,
            } => {
                cmd = redis::cmd("WAIT");
                cmd.arg(replicas).arg(timeout_ms);
            }
            Acknowledgement::Fsynced {
                replicas,
                timeout_ms,
            } => {
                cmd = redis::cmd("WAITAOF");
                cmd.arg(1).arg(replicas).arg(timeout_ms);
            }
        }
        Some(cmd)
    }

    /// Whether the reply to [`Acknowledgement::command`] is enough; short of it, the write
    /// does not count and the caller fails closed.
    fn check(self, reply: &Value) -> Result<(), StoreError> {
        let int = |value: Option<&Value>| match value {
            Some(Value::Int(n)) => Some(*n),
            _ => None,
        };
        let (local, acked, wanted) = match (self, reply) {
            (Acknowledgement::Local, _) => return Ok(()),
            (Acknowledgement::Replicated { replicas, .. }, reply) => {
                (Some(1), int(Some(reply)), replicas)
            }
            (Acknowledgement::Fsynced { replicas, .. }, Value::Array(counts)) => {
                (int(counts.first()), int(counts.get(1)), replicas)
            }
            (Acknowledgement::Fsynced { replicas, .. }, _) => (None, None, replicas),
        };
        let (Some(local), Some(acked)) = (local, acked) else {
            return Err(failed(format!(
                "unexpected reply to the Redis acknowledgement: {reply:?}"
            )));
        };
        if local < 1 {
            tracing::error!("Redis did not fsync a write; failing the call closed");
            return Err(failed("the Redis server did not fsync the write"));
        }
        if acked < i64::from(wanted) {
            tracing::error!(
                acked,
                wanted,
                "Redis replicas did not acknowledge a write; failing the call closed"
            );
            return Err(failed(format!(
                "{acked} of {wanted} Redis replicas acknowledged the write"
            )));
        }
        Ok(())
    }
}

/// Whether a command's reply goes back to the caller.
#[derive(Debug, Clone, Copy)]
enum Reply {
    Keep,
    Ignore,
}

/// Writes sent together, in groups whose keys share a hash slot. On one server every group
/// travels in one pipeline (one round trip); on a cluster, where a pipeline must stay within
/// one slot, each group is a pipeline of its own, sent in order. The acknowledgement rides at
/// the end of every pipeline. Every command must be safe to send twice: a pipeline is resent
/// after its script had to be loaded, and the cluster client resends after a lost connection.
#[derive(Default)]
struct Writes {
    groups: Vec<Vec<(Cmd, Reply)>>,
}

impl Writes {
    /// Starts a group of commands on one hash slot.
    fn group(&mut self) -> Group<'_> {
        self.groups.push(Vec::new());
        Group(self.groups.last_mut().expect("just pushed"))
    }
}

struct Group<'a>(&'a mut Vec<(Cmd, Reply)>);

impl Group<'_> {
    fn keep(&mut self, cmd: Cmd) -> &mut Self {
        self.0.push((cmd, Reply::Keep));
        self
    }

    fn ignore(&mut self, cmd: Cmd) -> &mut Self {
        self.0.push((cmd, Reply::Ignore));
        self
    }
}

/// What came back from [`Writes`]: the kept replies in order, and whether the writes were
/// acknowledged as configured.
struct Sent {
    replies: Vec<Value>,
    acknowledged: Result<(), StoreError>,
}

fn failed(error: impl std::fmt::Display) -> StoreError {
    StoreError(error.to_string())
}

/// A claim's slot and the keys that carry its hash tag.
struct ClaimKeys {
    slot: String,
    claim: String,
    receipt: String,
}

fn claim_key(key: &ClaimKey) -> ClaimKeys {
    let slot = key.slot();
    ClaimKeys {
        claim: format!("obol:{{{slot}}}:claim"),
        receipt: format!("obol:{{{slot}}}:receipt"),
        slot,
    }
}

/// Where a claim's audit records go. On one server, its workspace's stream
/// ([`workspace_audit`]), which the transition script can reach. On a cluster a script
/// reaches only its own slot, so a stream of the claim's own (written beside the script, the
/// record would be a second write, acknowledged apart from the receipt's, and resent on its
/// own): each holds a stream node of its own, about 4.3 KiB more Redis memory a call.
fn audit_stream(key: &ClaimKey, slot: &str, entries: Entries) -> String {
    match entries {
        Entries::InScript => workspace_audit(&key.workspace),
        Entries::Beside => format!("obol:{{{slot}}}:audit"),
    }
}

/// A workspace's audit stream: its calls' records on one server, its refusals' everywhere.
fn workspace_audit(workspace: &str) -> String {
    format!("obol:audit:{workspace}")
}

/// A reservation's lease index entry. GT: a racer that loses the compare-and-set cannot
/// lower a live entry's lease.
fn lease_entry(slot: &str, until_ms: u64) -> Cmd {
    let mut cmd = redis::cmd("ZADD");
    cmd.arg(LEASES).arg("GT").arg(until_ms).arg(slot);
    cmd
}

impl RedisStore {
    /// Connects to one server (`redis://…`); fails fast when it is unreachable or unsafe.
    pub async fn connect(url: &str) -> Result<RedisStore, StoreError> {
        let client = redis::Client::open(url).map_err(|e| failed(redact(&e.to_string(), url)))?;
        RedisStore::open(Server::Node(client), &[url]).await
    }

    /// Connects to a Redis Cluster through any of `nodes` (it discovers the rest); fails fast
    /// when the cluster is unreachable or any node is unsafe.
    pub async fn connect_cluster(nodes: &[String]) -> Result<RedisStore, StoreError> {
        let urls: Vec<&str> = nodes.iter().map(String::as_str).collect();
        let redact_all = |error: &dyn std::fmt::Display| {
            failed(
                urls.iter()
                    .fold(error.to_string(), |message, url| redact(&message, url)),
            )
        };
        let client = ClusterClient::builder(urls.clone())
            .connection_timeout(Duration::from_secs(2))
            .response_timeout(Duration::from_secs(2))
            // Enough to follow redirects and wait out a slot migration's TRYAGAIN (20 ms to
            // 0.5 s apart, about a second in all, not the client's default of seconds per
            // retry); the scripts are safe to run twice, so a resend after a lost reply is
            // harmless.
            .retries(6)
            // Retries included, a call fails closed within 5 s rather than waiting out every
            // retry's own response timeout.
            .overall_response_timeout(Some(Duration::from_secs(5)))
            .retry_wait_formula(10, 2)
            .min_retry_wait(20)
            .max_retry_wait(500)
            .build()
            .map_err(|e| redact_all(&e))?;
        RedisStore::open(Server::Cluster(Box::new(client)), &urls).await
    }

    async fn open(server: Server, urls: &[&str]) -> Result<RedisStore, StoreError> {
        let mut connection = server.connect().await.map_err(|e| {
            failed(
                urls.iter()
                    .fold(e.to_string(), |message, url| redact(&message, url)),
            )
        })?;
        check_durability(&mut connection).await?;
        Ok(RedisStore {
            connections: Arc::new(vec![connection]),
            next_connection: Arc::default(),
            lanes: Arc::new(
                (0..lanes::count())
                    .map(|_| LaneConnection::default())
                    .collect(),
            ),
            server: Arc::new(server),
            scripts: Arc::new(Scripts::new()),
            syncs: Arc::new(AtomicU64::new(0)),
            writer: {
                let mut bytes = [0u8; 8];
                getrandom::fill(&mut bytes).expect("the OS random source is available");
                u64::from_le_bytes(bytes)
            },
            writes: Arc::new(AtomicU64::new(0)),
            retention_s: super::DEFAULT_RETENTION.as_secs(),
            acknowledgement: Acknowledgement::Local,
            unsafe_settings: Arc::default(),
        })
    }

    /// Keeps records for `retention` instead of the default.
    pub fn with_retention(mut self, retention: Duration) -> RedisStore {
        self.retention_s = retention.as_secs().max(1);
        self
    }

    /// Counts a write as done only once `count` replicas acknowledged it (`WAITAOF` on Redis
    /// 7.2 and later, which also waits for their fsync; `WAIT` before), waiting at most
    /// `timeout`: a failover then cannot lose what the gateway acted on. Opens a few more
    /// connections, so that concurrent writes wait side by side.
    pub async fn with_replicas(
        mut self,
        count: u32,
        timeout: Duration,
    ) -> Result<RedisStore, StoreError> {
        const POOL: usize = 8;
        let version = server_version(&mut self.connection()).await?;
        self.acknowledgement = Acknowledgement::for_server(count, timeout, version);
        if count > 0 {
            let mut connections = Vec::with_capacity(POOL);
            for _ in 0..POOL {
                connections.push(self.server.connect().await.map_err(failed)?);
            }
            self.connections = Arc::new(connections);
        }
        tracing::info!(
            acknowledgement = ?self.acknowledgement,
            "Redis {}.{}",
            version.0,
            version.1
        );
        Ok(self)
    }

    /// Drops `slot`'s lease index entry if its lease is no later than `until_ms`, as a command
    /// of a pipeline.
    fn drop_lease_entry(&self, slot: &str, until_ms: u64) -> Cmd {
        let mut cmd = redis::cmd("EVAL");
        cmd.arg(&self.scripts.drop_lease_text)
            .arg(1)
            .arg(LEASES)
            .arg(slot)
            .arg(until_ms);
        cmd
    }

    /// A write id no other write of any gateway uses: this store's random id and a count.
    fn write_id(&self) -> String {
        let n = self.writes.fetch_add(1, Ordering::Relaxed);
        format!("{:016x}.{n:x}", self.writer)
    }

    /// The calling lane's own connection, else the next shared one, round robin. The shared
    /// connections are driven by the runtime that opened the store: from a lane, each round
    /// trip on them is handed to that runtime's worker and back.
    fn connection(&self) -> Connection {
        if let Some(own) = self.lane_connection() {
            return own;
        }
        let at = self.next_connection.fetch_add(1, Ordering::Relaxed) % self.connections.len();
        self.connections[at].clone()
    }

    /// The calling lane's own connection, for a single server whose writes count on its own
    /// reply (with replicas, `WAIT` holds up the connection it is sent on, so writes keep the
    /// shared pool; a cluster connection routes itself). The first ask opens it in the
    /// background, on the lane, and is answered `None` meanwhile, as is every ask while Redis
    /// is unreachable: a call never waits for a connection to open.
    fn lane_connection(&self) -> Option<Connection> {
        if self.acknowledgement != Acknowledgement::Local
            || !matches!(*self.server, Server::Node(_))
        {
            return None;
        }
        let index = lanes::current()?;
        let own = self.lanes.get(index)?;
        if let Some(connection) = own.connection.get() {
            return Some(connection.clone());
        }
        if !own.opening.swap(true, Ordering::AcqRel) {
            let server = Arc::clone(&self.server);
            let lanes = Arc::clone(&self.lanes);
            tokio::spawn(async move {
                let own = &lanes[index];
                match server.connect().await {
                    Ok(connection) => {
                        let _ = own.connection.set(connection);
                    }
                    // Not the error: it can carry the server's address and credentials.
                    Err(_) => {
                        tracing::debug!("a lane's Redis connection did not open");
                        own.opening.store(false, Ordering::Release);
                    }
                }
            });
        }
        None
    }

    /// Sends `writes` with the configured acknowledgement. A script not loaded yet (first
    /// use, or a restarted server) is loaded and the writes resent.
    async fn send(&self, writes: Writes, connection: &mut Connection) -> RedisResult<Sent> {
        let pipelines = self.pipelines(writes);
        match self.send_once(&pipelines, connection).await {
            Err(error)
                if error.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) =>
            {
                self.scripts.claim.load_async(connection).await?;
                self.scripts.transition.load_async(connection).await?;
                self.send_once(&pipelines, connection).await
            }
            other => other,
        }
    }

    /// One pipeline on a single server; one per group on a cluster. Each ends with the
    /// acknowledgement, if one is configured.
    fn pipelines(&self, writes: Writes) -> Vec<redis::Pipeline> {
        let groups: Vec<Vec<(Cmd, Reply)>> = match *self.server {
            Server::Node(_) => vec![writes.groups.into_iter().flatten().collect()],
            Server::Cluster(_) => writes.groups,
        };
        let acknowledgement = self.acknowledgement.command();
        groups
            .into_iter()
            .filter(|group| !group.is_empty())
            .map(|group| {
                let mut pipe = redis::pipe();
                for (cmd, reply) in group {
                    pipe.add_command(cmd);
                    if let Reply::Ignore = reply {
                        pipe.ignore();
                    }
                }
                if let Some(acknowledgement) = &acknowledgement {
                    pipe.add_command(acknowledgement.clone());
                }
                pipe
            })
            .collect()
    }

    async fn send_once(
        &self,
        pipelines: &[redis::Pipeline],
        connection: &mut Connection,
    ) -> RedisResult<Sent> {
        let mut sent = Sent {
            replies: Vec::new(),
            acknowledged: Ok(()),
        };
        for pipe in pipelines {
            // Test builds can lose every first reply: the server ran the pipeline, and it is
            // sent again (what the cluster client does after a dropped connection).
            #[cfg(feature = "test-util")]
            if crate::failpoint::active("redis_resend") {
                let _: RedisResult<Vec<Value>> = pipe.query_async(connection).await;
            }
            let mut replies: Vec<Value> = send_through_migration(pipe, connection).await?;
            if self.acknowledgement != Acknowledgement::Local {
                let reply = replies.pop().unwrap_or(Value::Nil);
                if sent.acknowledged.is_ok() {
                    sent.acknowledged = self.acknowledgement.check(&reply);
                }
            }
            sent.replies.extend(replies);
        }
        self.syncs.fetch_add(1, Ordering::Relaxed);
        Ok(sent)
    }

    /// After a reply was lost, waits for the acknowledgement of what is stored now: a
    /// harmless write to the claim (its TTL, set again) makes the wait cover the write whose
    /// reply was lost, whichever connection sent it.
    async fn acknowledge_claim(
        &self,
        claim: &str,
        connection: &mut Connection,
    ) -> Result<(), StoreError> {
        if self.acknowledgement == Acknowledgement::Local {
            return Ok(());
        }
        let mut writes = Writes::default();
        writes
            .group()
            .ignore(Cmd::expire(claim, self.retention_s as i64));
        self.send(writes, connection)
            .await
            .map_err(failed)?
            .acknowledged
    }

    /// Checks the server's persistence and eviction settings again (a Redis restarted or
    /// failed over may come back with others); while they are unsafe, claims fail closed.
    pub async fn recheck_durability(&self) {
        let verdict = check_durability(&mut self.connection()).await;
        let mut unsafe_settings = self.unsafe_settings.lock().expect("settings lock");
        match verdict {
            Ok(()) => {
                if unsafe_settings.take().is_some() {
                    tracing::info!("Redis settings are safe again; claims resume");
                }
            }
            // Unreachable is not unsafe: calls fail closed on their own then.
            Err(error) if error.0.starts_with("could not read") => {}
            Err(error) => {
                if unsafe_settings.is_none() {
                    tracing::error!("{error}; refusing claims until it is fixed");
                }
                *unsafe_settings = Some(error.0);
            }
        }
    }

    pub async fn claim(&self, key: &ClaimKey, record: &ClaimRecord) -> Result<Claim, StoreError> {
        if let Some(reason) = self.unsafe_settings.lock().expect("settings lock").clone() {
            return Err(StoreError(reason));
        }
        let mut connection = self.connection();
        let (claimed, acknowledged) = self
            .claim_unacknowledged(key, record, &mut connection)
            .await?;
        if let Err(error) = acknowledged {
            // Acquired but not acknowledged: nothing is sent, so the reserved attempt is
            // released (best effort) rather than left to be settled as a possible effect.
            if claimed == Claim::Acquired && record.reserved_lease().is_some() {
                let released = record.release_unsent(crate::clock::now_ms());
                let _ = self
                    .transition_unacknowledged(key, record, &released, None, &mut connection)
                    .await;
            }
            return Err(error);
        }
        Ok(claimed)
    }

    /// The claim and whether it was acknowledged.
    async fn claim_unacknowledged(
        &self,
        key: &ClaimKey,
        record: &ClaimRecord,
        connection: &mut Connection,
    ) -> Result<(Claim, Result<(), StoreError>), StoreError> {
        let ClaimKeys { slot, claim, .. } = claim_key(key);
        let json = serde_json::to_string(record).map_err(failed)?;
        let lease = record.reserved_lease();
        let mut writes = Writes::default();
        let mut script = redis::cmd("EVALSHA");
        script.arg(self.scripts.claim.get_hash());
        match self.server.entries() {
            Entries::InScript => {
                script.arg(2).arg(&claim).arg(LEASES);
            }
            Entries::Beside => {
                // The lease index entry before the claim, so a claim is never reserved
                // without one (a stale entry is dropped by the sweeper).
                if let Some(until) = lease {
                    writes.group().ignore(lease_entry(&slot, until));
                }
                script.arg(1).arg(&claim);
            }
        }
        script
            .arg(&json)
            .arg(record.version)
            .arg(self.retention_s)
            .arg(remaining_lease(record))
            .arg(self.write_id())
            .arg(lease.map(|until| until.to_string()).unwrap_or_default())
            .arg(&slot);
        writes.group().keep(script);
        let sent = match self.send(writes, connection).await {
            Ok(sent) => sent,
            Err(error) if ambiguous(&error) => {
                // The script may have run: a record with our receipt id at version 1 is ours.
                tracing::warn!(
                    "a claim reply was lost ({error}); reading the claim to see what happened"
                );
                return match self.get_slot_on(&slot, connection).await? {
                    Some(stored) if same_record(&stored, record) => Ok((
                        Claim::Acquired,
                        self.acknowledge_claim(&claim, connection).await,
                    )),
                    Some(stored) => Ok((Claim::Existing(Box::new(stored)), Ok(()))),
                    None => Err(failed(error)),
                };
            }
            Err(error) => return Err(failed(error)),
        };
        let Some(Value::Array(reply)) = sent.replies.first() else {
            return Err(failed("unexpected claim script reply"));
        };
        let (found, existing, lease_end, server_now) = decode_claim_reply(reply)?;
        match (found, existing) {
            (0, _) => Ok((Claim::Acquired, sent.acknowledged)),
            (_, Some(json)) => Ok((
                Claim::Existing(Box::new(on_local_clock(
                    serde_json::from_str(&json).map_err(failed)?,
                    lease_end,
                    server_now,
                ))),
                sent.acknowledged,
            )),
            _ => Err(failed("claim script returned no record")),
        }
    }

    pub async fn transition(
        &self,
        key: &ClaimKey,
        expected: &ClaimRecord,
        next: &ClaimRecord,
        receipt: Option<&Receipt>,
    ) -> Result<bool, StoreError> {
        let mut connection = self.connection();
        let (done, acknowledged) = self
            .transition_unacknowledged(key, expected, next, receipt, &mut connection)
            .await?;
        if done && let Err(error) = acknowledged {
            // A reservation that does not count is not sent: it is released (best effort).
            if next.reserved_lease().is_some() {
                let released = next.release_unsent(crate::clock::now_ms());
                let _ = self
                    .transition_unacknowledged(key, next, &released, None, &mut connection)
                    .await;
            }
            return Err(error);
        }
        Ok(done)
    }

    /// Whether the transition happened, and whether it was acknowledged.
    async fn transition_unacknowledged(
        &self,
        key: &ClaimKey,
        expected: &ClaimRecord,
        next: &ClaimRecord,
        receipt: Option<&Receipt>,
        connection: &mut Connection,
    ) -> Result<(bool, Result<(), StoreError>), StoreError> {
        if next.version != expected.version + 1 {
            return Err(super::version_step(expected.version, next.version));
        }
        let ClaimKeys {
            slot,
            claim,
            receipt: receipt_key,
        } = claim_key(key);
        let entries = self.server.entries();
        let audit_key = audit_stream(key, &slot, entries);
        let receipt_json = receipt
            .map(serde_json::to_string)
            .transpose()
            .map_err(failed)?
            .unwrap_or_default();
        let event = receipt
            .map(|r| serde_json::to_string(&super::AuditEvent::of(r)))
            .transpose()
            .map_err(failed)?
            .unwrap_or_default();
        let listing = receipt.map(|receipt| Listing::of(receipt, self.retention_s));
        let lease = next.reserved_lease();
        let mut writes = Writes::default();
        let mut script = redis::cmd("EVALSHA");
        script.arg(self.scripts.transition.get_hash());
        match (entries, &listing) {
            (Entries::InScript, Some(listing)) => {
                script
                    .arg(6)
                    .arg(&claim)
                    .arg(&receipt_key)
                    .arg(&audit_key)
                    .arg(LEASES)
                    .arg(&listing.index)
                    .arg(&listing.pointer);
            }
            (Entries::InScript, None) => {
                script
                    .arg(4)
                    .arg(&claim)
                    .arg(&receipt_key)
                    .arg(&audit_key)
                    .arg(LEASES);
            }
            (Entries::Beside, _) => {
                // Before the script: the lease index entry of a new reservation (so a
                // reserved claim always has one), and a receipt's pointer and listing entry
                // (so a receipt is findable the moment it exists; readers skip an entry whose
                // receipt was never written).
                if let Some(until) = lease {
                    writes.group().ignore(lease_entry(&slot, until));
                }
                if let Some(listing) = &listing {
                    listing.write(&mut writes, &receipt_key, self.retention_s, &self.scripts);
                }
                script.arg(3).arg(&claim).arg(&receipt_key).arg(&audit_key);
            }
        }
        script
            .arg(expected.version)
            .arg(next.version)
            .arg(serde_json::to_string(next).map_err(failed)?)
            .arg(self.retention_s)
            .arg(&receipt_json)
            .arg(&event)
            .arg(remaining_lease(next))
            .arg(self.write_id())
            .arg(&slot)
            .arg(lease.map(|until| until.to_string()).unwrap_or_default());
        if let Some(listing) = &listing {
            script
                .arg(listing.id)
                .arg(listing.finalized_at_ms)
                .arg(listing.horizon_ms);
        }
        writes.group().keep(script);
        // On a cluster, a claim leaving `Reserved` drops its lease index entry after the
        // script. It runs whatever the script decided, and is harmless when the script
        // refused: it drops only an entry no later than the lease this transition started
        // from, never the entry of a later reservation.
        if let (Entries::Beside, None) = (entries, lease) {
            writes
                .group()
                .ignore(self.drop_lease_entry(&slot, expected.lease_until_ms));
        }
        let sent = match self.send(writes, connection).await {
            Ok(sent) => sent,
            Err(error) if ambiguous(&error) => {
                // The script may have run: what is stored now says whether it did.
                let done = self
                    .settle_ambiguous(key, expected, next, &error, connection)
                    .await?;
                let acknowledged = match done {
                    true => self.acknowledge_claim(&claim, connection).await,
                    false => Ok(()),
                };
                return Ok((done, acknowledged));
            }
            Err(error) => return Err(failed(error)),
        };
        match sent.replies.first() {
            Some(Value::Int(-1)) => Err(super::gone(&slot)),
            Some(Value::Int(1)) => Ok((true, sent.acknowledged)),
            Some(Value::Int(_)) => Ok((false, Ok(()))),
            _ => Err(failed("unexpected transition script reply")),
        }
    }

    /// After a reply whose outcome is unknown (a timeout or a dropped connection once the
    /// script was sent), reads the record and continues from what is there: `next` stored
    /// means the transition happened; `expected` still stored means it did not (a failure,
    /// nothing to act on); anything else means someone else moved it (a lost race). Read on
    /// the write's own connection, behind the write: on another, the read could overtake a
    /// write still queued and find the record as it was before it.
    async fn settle_ambiguous(
        &self,
        key: &ClaimKey,
        expected: &ClaimRecord,
        next: &ClaimRecord,
        cause: &redis::RedisError,
        connection: &mut Connection,
    ) -> Result<bool, StoreError> {
        tracing::warn!("a store reply was lost ({cause}); reading the claim to see what happened");
        match self.get_slot_on(&key.slot(), connection).await? {
            Some(stored) if same_record(&stored, next) => Ok(true),
            Some(stored) if stored.version == expected.version => Err(failed(cause)),
            Some(_) => Ok(false),
            None => Err(super::gone(&key.slot())),
        }
    }

    /// Drops `slot`'s lease index entry if its lease is no later than `until_ms` (a newer
    /// reservation's entry stays).
    async fn drop_lease(&self, slot: &str, until_ms: u64) -> Result<(), StoreError> {
        let mut connection = self.connection();
        self.scripts
            .drop_lease
            .key(LEASES)
            .arg(slot)
            .arg(until_ms)
            .invoke_async::<i64>(&mut connection)
            .await
            .map(|_| ())
            .map_err(failed)
    }

    pub async fn expired_leases(
        &self,
        now_ms: u64,
        limit: usize,
    ) -> Result<Vec<(String, ClaimRecord)>, StoreError> {
        let mut connection = self.connection();
        let entries: Vec<(String, f64)> = connection
            .zrangebyscore_limit_withscores(LEASES, 0, now_ms, 0, limit as isize)
            .await
            .map_err(failed)?;
        let mut out = Vec::new();
        for (slot, score) in entries {
            let record = match self.get_slot(&slot).await {
                Ok(record) => record,
                // One unreadable record must not stop the sweep of every other.
                Err(error) => {
                    tracing::error!("the sweeper skips a claim it cannot read: {error}");
                    continue;
                }
            };
            match record {
                Some(record) if record.holder_died(now_ms) => out.push((slot, record)),
                // Alive with a later lease than its entry says: the entry follows the record.
                Some(record) if record.reserved_lease().is_some() => {
                    let _: Result<(), _> = redis::cmd("ZADD")
                        .arg(LEASES)
                        .arg("GT")
                        .arg(record.lease_until_ms)
                        .arg(&slot)
                        .query_async(&mut connection)
                        .await;
                }
                // Moved on (or expired): the entry points at nothing the sweeper must settle.
                _ => {
                    let _ = self.drop_lease(&slot, score as u64).await;
                }
            }
        }
        Ok(out)
    }

    /// A refused call's receipt: no claim, so it lives under its own key.
    pub async fn record_refusal(&self, receipt: &Receipt) -> Result<(), StoreError> {
        let location = format!("obol:refusal:{}:{}", receipt.workspace, receipt.id);
        let json = serde_json::to_string(receipt).map_err(failed)?;
        let mut writes = Writes::default();
        Listing::of(receipt, self.retention_s).write(
            &mut writes,
            &location,
            self.retention_s,
            &self.scripts,
        );
        writes
            .group()
            .ignore(Cmd::set_ex(&location, json, self.retention_s));
        let mut event = redis::cmd("EVAL");
        event
            .arg(&self.scripts.append_audit_text)
            .arg(1)
            .arg(workspace_audit(&receipt.workspace))
            .arg(serde_json::to_string(&super::AuditEvent::of(receipt)).map_err(failed)?)
            .arg(self.retention_s);
        writes.group().ignore(event);
        self.send(writes, &mut self.connection())
            .await
            .map_err(failed)?
            .acknowledged
    }

    /// Claim slots matching `glob` (all, or as soon as one is found): `SCAN … MATCH
    /// obol:{GLOB}:claim` on the server, or on every primary of a cluster in turn.
    pub async fn slots_matching(
        &self,
        glob: &str,
        scan: super::Scan,
    ) -> Result<Vec<String>, StoreError> {
        let pattern = format!("obol:{{{glob}}}:claim");
        let mut keys: Vec<String> = Vec::new();
        match self.connection() {
            Connection::Node(mut connection) => {
                let mut cursor = 0;
                loop {
                    let (next, batch): (u64, Vec<String>) = scan_step(cursor, &pattern)
                        .query_async(&mut connection)
                        .await
                        .map_err(failed)?;
                    keys.extend(batch);
                    if next == 0 || (scan == super::Scan::First && !keys.is_empty()) {
                        break;
                    }
                    cursor = next;
                }
            }
            Connection::Cluster(mut connection) => {
                let nodes: String = connection
                    .route_command(
                        redis::cmd("CLUSTER").arg("NODES").clone(),
                        RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random),
                    )
                    .await
                    .map_err(failed)
                    .and_then(|reply| redis::from_redis_value(reply).map_err(failed))?;
                for (host, port) in primaries(&nodes)? {
                    if scan == super::Scan::First && !keys.is_empty() {
                        break;
                    }
                    let node =
                        RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress { host, port });
                    let mut cursor = 0;
                    loop {
                        let (next, batch): (u64, Vec<String>) = connection
                            .route_command(scan_step(cursor, &pattern), node.clone())
                            .await
                            .map_err(failed)
                            .and_then(|reply| redis::from_redis_value(reply).map_err(failed))?;
                        keys.extend(batch);
                        if next == 0 || (scan == super::Scan::First && !keys.is_empty()) {
                            break;
                        }
                        cursor = next;
                    }
                }
            }
        }
        Ok(keys
            .iter()
            .filter_map(|key| key.strip_prefix("obol:{")?.strip_suffix("}:claim"))
            .map(str::to_owned)
            .collect())
    }

    pub async fn get(&self, key: &ClaimKey) -> Result<Option<ClaimRecord>, StoreError> {
        self.get_slot(&key.slot()).await
    }

    /// A claim by its slot, with its lease on the reader's clock.
    async fn get_slot(&self, slot: &str) -> Result<Option<ClaimRecord>, StoreError> {
        self.get_slot_on(slot, &mut self.connection()).await
    }

    /// [`RedisStore::get_slot`] on `connection`.
    async fn get_slot_on(
        &self,
        slot: &str,
        connection: &mut Connection,
    ) -> Result<Option<ClaimRecord>, StoreError> {
        let (json, lease_end, server_now): (Option<String>, i64, i64) = self
            .scripts
            .get_claim
            .key(format!("obol:{{{slot}}}:claim"))
            .invoke_async(connection)
            .await
            .map_err(failed)?;
        json.map(|j| {
            serde_json::from_str(&j)
                .map(|record| on_local_clock(record, lease_end, server_now))
                .map_err(failed)
        })
        .transpose()
    }

    pub async fn receipt(&self, workspace: &str, id: &str) -> Result<Option<Receipt>, StoreError> {
        let mut connection = self.connection();
        let pointer: Option<String> = connection
            .get(format!("obol:receipt:{workspace}:{id}"))
            .await
            .map_err(failed)?;
        let Some(location) = pointer else {
            return Ok(None);
        };
        let json: Option<String> = connection.get(location).await.map_err(failed)?;
        let receipt: Option<Receipt> = json
            .map(|j| serde_json::from_str(&j).map_err(failed))
            .transpose()?;
        // Pointers are written before their receipt: one whose write never followed (a stale
        // finalize) leads to nothing, or to another receipt of the slot.
        Ok(receipt.filter(|r| r.id == id && r.workspace == workspace))
    }

    pub async fn receipts(
        &self,
        workspace: &str,
        limit: usize,
    ) -> Result<Vec<Receipt>, StoreError> {
        let mut connection = self.connection();
        let ids: Vec<String> = connection
            .zrevrange(format!("obol:receipts:{workspace}"), 0, limit as isize - 1)
            .await
            .map_err(failed)?;
        // Many reads in flight on the multiplexed connection, not one round trip after another
        // (the console reads thousands), answered in the order asked.
        use futures_util::StreamExt;
        let read: Vec<Result<Option<Receipt>, StoreError>> = futures_util::stream::iter(ids)
            .map(|id| async move { self.receipt(workspace, &id).await })
            .buffered(64)
            .collect()
            .await;
        read.into_iter().filter_map(Result::transpose).collect()
    }

    /// A registry write (a key, a revocation, a publication) counts once acknowledged, like a
    /// claim: a failover must not bring back a revoked key.
    pub async fn registry_write(
        &self,
        registry: Registry,
        name: &str,
        value: &str,
        mode: RegistryWrite,
    ) -> Result<bool, StoreError> {
        let hash = format!("obol:registry:{}", registry.as_str());
        let mut writes = Writes::default();
        writes.group().keep(match mode {
            RegistryWrite::InsertOnly => Cmd::hset_nx(hash, name, value),
            RegistryWrite::Overwrite => Cmd::hset(hash, name, value),
        });
        let sent = self
            .send(writes, &mut self.connection())
            .await
            .map_err(failed)?;
        sent.acknowledged?;
        Ok(match mode {
            RegistryWrite::InsertOnly => matches!(sent.replies.first(), Some(Value::Int(1))),
            RegistryWrite::Overwrite => true,
        })
    }

    pub async fn registry(
        &self,
        registry: Registry,
    ) -> Result<std::collections::BTreeMap<String, String>, StoreError> {
        let mut connection = self.connection();
        connection
            .hgetall(format!("obol:registry:{}", registry.as_str()))
            .await
            .map_err(failed)
    }

    pub async fn put_ticket(&self, ticket: &Ticket) -> Result<(), StoreError> {
        let mut connection = self.connection();
        let created: i64 = self
            .scripts
            .put_ticket
            .key(ticket_key(&ticket.id))
            .arg(serde_json::to_string(ticket).map_err(failed)?)
            .arg(ticket.expires_at_ms + self.retention_s * 1000)
            .invoke_async(&mut connection)
            .await
            .map_err(failed)?;
        if created != 0 {
            let stream = format!("obol:approvals:{}", ticket.workspace);
            let mut entry = redis::cmd("XADD");
            entry
                .arg(&stream)
                .arg("MAXLEN")
                .arg("~")
                .arg(10_000)
                .arg("*")
                .arg("id")
                .arg(ticket.id.as_str())
                .arg("tool")
                .arg(&ticket.tool)
                .arg("idempotency_key")
                .arg(&ticket.idempotency_key)
                .arg("request_hash")
                .arg(&ticket.request_hash)
                .arg("destination")
                .arg(&ticket.destination)
                .arg("expires_at_ms")
                .arg(ticket.expires_at_ms);
            let mut mark = redis::cmd("EVAL");
            mark.arg(MARK_TICKET_LISTED)
                .arg(1)
                .arg(ticket_key(&ticket.id));
            let mut writes = Writes::default();
            writes
                .group()
                .ignore(entry)
                .ignore(Cmd::expire(&stream, self.retention_s as i64));
            writes.group().ignore(mark);
            self.send(writes, &mut connection).await.map_err(failed)?;
        }
        Ok(())
    }

    pub async fn ticket(&self, id: &ApprovalId) -> Result<Option<Ticket>, StoreError> {
        let mut connection = self.connection();
        let json: Option<String> = connection.hget(ticket_key(id), "t").await.map_err(failed)?;
        json.map(|j| serde_json::from_str(&j).map_err(failed))
            .transpose()
    }

    pub async fn tickets(&self, workspace: &str, limit: usize) -> Result<Vec<Ticket>, StoreError> {
        let mut connection = self.connection();
        let entries: redis::Value = redis::cmd("XREVRANGE")
            .arg(format!("obol:approvals:{workspace}"))
            .arg("+")
            .arg("-")
            .arg("COUNT")
            .arg(limit)
            .query_async(&mut connection)
            .await
            .map_err(failed)?;
        let mut out: Vec<Ticket> = Vec::new();
        for id in stream_ids(&entries) {
            // A repaired entry may list a ticket twice.
            if out.iter().any(|t| t.id.as_str() == id) {
                continue;
            }
            if let Some(id) = ApprovalId::parse(&id)
                && let Some(ticket) = self.ticket(&id).await?
            {
                out.push(ticket);
            }
        }
        Ok(out)
    }

    pub async fn decide_ticket(
        &self,
        id: &ApprovalId,
        decision: Decision,
        at_ms: u64,
    ) -> Result<Decided, StoreError> {
        let Some(ticket) = self.ticket(id).await? else {
            return Ok(Decided::Missing);
        };
        let next = super::decided(ticket, decision, at_ms);
        let status = match decision {
            Decision::Approved => "approved",
            Decision::Denied => "denied",
        };
        let mut connection = self.connection();
        let done: i64 = self
            .scripts
            .decide_ticket
            .key(ticket_key(id))
            .arg(status)
            .arg(serde_json::to_string(&next).map_err(failed)?)
            .invoke_async(&mut connection)
            .await
            .map_err(failed)?;
        self.syncs.fetch_add(1, Ordering::Relaxed);
        Ok(match done {
            2 => Decided::Now(Box::new(next)),
            1 => match self.ticket(id).await? {
                Some(current) => Decided::Already(Box::new(current)),
                None => Decided::Missing,
            },
            _ => Decided::Missing,
        })
    }

    pub fn syncs(&self) -> u64 {
        self.syncs.load(Ordering::Relaxed)
    }
}

/// The claim script's reply: (found, the existing record, its server-clock lease end or -1,
/// the server's time).
fn decode_claim_reply(
    reply: &[redis::Value],
) -> Result<(i64, Option<String>, i64, i64), StoreError> {
    let int = |at: usize| match reply.get(at) {
        Some(redis::Value::Int(n)) => Some(*n),
        Some(redis::Value::BulkString(bytes)) => String::from_utf8_lossy(bytes).parse().ok(),
        _ => None,
    };
    let found = int(0).ok_or_else(|| failed("unexpected claim script reply"))?;
    let record = match reply.get(1) {
        Some(redis::Value::BulkString(bytes)) => Some(String::from_utf8_lossy(bytes).into_owned()),
        Some(redis::Value::SimpleString(text)) => Some(text.clone()),
        _ => None,
    };
    Ok((found, record, int(2).unwrap_or(-1), int(3).unwrap_or(0)))
}

/// What is left of a reservation's lease, for the script to stamp on the server's clock;
/// empty when nothing is reserved.
fn remaining_lease(record: &ClaimRecord) -> String {
    record
        .reserved_lease()
        .map(|until| until.saturating_sub(crate::clock::now_ms()).to_string())
        .unwrap_or_default()
}

/// Puts a lease stamped on the server's clock onto this gateway's clock: what is left of it,
/// by the server, from now, by us. A gateway whose clock runs ahead or behind the writer's
/// therefore judges the lease as the server does. Within a second of the written value (the
/// writer's clock agrees) the record is returned as written.
fn on_local_clock(mut record: ClaimRecord, lease_end: i64, server_now: i64) -> ClaimRecord {
    if lease_end >= 0 && server_now > 0 {
        let local = (crate::clock::now_ms() as i64 + (lease_end - server_now)).max(0) as u64;
        if local.abs_diff(record.lease_until_ms) > 1000 {
            record.lease_until_ms = local;
        }
    }
    record
}

/// The same record, leases aside (they are re-stamped on the reader's clock).
fn same_record(stored: &ClaimRecord, written: &ClaimRecord) -> bool {
    stored.version == written.version
        && stored.receipt_id == written.receipt_id
        && stored.state == written.state
        && stored.attempts == written.attempts
}

/// A receipt's entry in its workspace's listing (`obol:receipts:<workspace>`, by finalization
/// time, trimmed to the retention) and its pointer (`obol:receipt:<workspace>:<id>`, naming the
/// key that holds it). Both are written before the receipt itself: a reader that follows either
/// to nothing skips it.
struct Listing<'r> {
    index: String,
    pointer: String,
    id: &'r str,
    finalized_at_ms: u64,
    /// Entries finalized before this are past the retention.
    horizon_ms: u64,
}

impl<'r> Listing<'r> {
    fn of(receipt: &'r Receipt, retention_s: u64) -> Listing<'r> {
        Listing {
            index: format!("obol:receipts:{}", receipt.workspace),
            pointer: format!("obol:receipt:{}:{}", receipt.workspace, receipt.id),
            id: &receipt.id,
            finalized_at_ms: receipt.finalized_at_ms,
            horizon_ms: receipt.finalized_at_ms.saturating_sub(retention_s * 1000),
        }
    }

    /// As commands of their own slots (the script that writes a claim's receipt writes its
    /// listing itself on one server).
    fn write(&self, writes: &mut Writes, location: &str, retention_s: u64, scripts: &Scripts) {
        writes
            .group()
            .ignore(Cmd::set_ex(&self.pointer, location, retention_s));
        let mut list = redis::cmd("EVAL");
        list.arg(&scripts.list_receipt_text)
            .arg(1)
            .arg(&self.index)
            .arg(self.id)
            .arg(self.finalized_at_ms)
            .arg(self.horizon_ms)
            .arg(retention_s);
        writes.group().ignore(list);
    }
}

/// The settings under which what Redis acknowledges is what it keeps: every write fsynced to
/// the append-only file before the reply, and nothing evicted under memory pressure (every
/// claim carries a TTL, so a `volatile-*` policy would evict claims first, and a missing
/// claim would let a same-key retry send again).
const REQUIRED: [(&str, &str); 3] = [
    ("appendonly", "yes"),
    ("appendfsync", "always"),
    ("maxmemory-policy", "noeviction"),
];

/// Sends one group's pipeline, again while its slot is being migrated. A key that has left a
/// migrating slot (or not arrived in an importing one) is answered `ASK` or `TRYAGAIN`, and
/// the importing primary answers `MOVED` back to the old owner when the client's `ASKING`
/// did not precede the pipeline on the shared connection (another request's command took
/// it); none of these ran the command. The cluster client follows them a few times and then
/// hands the last one back: only this group is resent, never a group before it, so a script
/// that ran is never run twice. A migration lasts as long as its keys take to move, so the
/// resends are bounded by time (`MIGRATION_WAIT`, 10 to 100 ms apart), not by a count (seen
/// under load: a claim answered `MOVED` mid-migration failed as `store_unavailable`).
async fn send_through_migration(
    pipe: &redis::Pipeline,
    connection: &mut Connection,
) -> RedisResult<Vec<Value>> {
    let started = std::time::Instant::now();
    let mut pause = std::time::Duration::from_millis(10);
    loop {
        match pipe.query_async(connection).await {
            Err(error)
                if started.elapsed() < MIGRATION_WAIT
                    && matches!(
                        error.kind(),
                        redis::ErrorKind::Server(
                            redis::ServerErrorKind::Ask
                                | redis::ServerErrorKind::Moved
                                | redis::ServerErrorKind::TryAgain
                        )
                    ) =>
            {
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(std::time::Duration::from_millis(100));
            }
            other => return other,
        }
    }
}

/// How long a write waits out a slot migration before it fails closed.
const MIGRATION_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// Refuses a server whose persistence or eviction settings would lose acknowledged claims,
/// naming the setting (and, on a cluster, the first node found wrong). A server that hides
/// `CONFIG` is refused too: Obol cannot tell.
async fn check_durability(connection: &mut Connection) -> Result<(), StoreError> {
    for (setting, wanted) in REQUIRED {
        let mut get = redis::cmd("CONFIG");
        get.arg("GET").arg(setting);
        let replies = connection.on_every_server(get).await.map_err(|error| {
            failed(format!(
                "could not read the Redis setting {setting} ({error}); Obol needs {setting} {wanted} and checks it with CONFIG GET"
            ))
        })?;
        for reply in replies {
            let actual = config_value(&reply).unwrap_or_default();
            if actual != wanted {
                return Err(failed(format!(
                    "Redis runs with {setting} {actual:?}; Obol needs {setting} {wanted}, or acknowledged claims can be lost and a retry could send a call twice (docs/operations.md)"
                )));
            }
        }
    }
    Ok(())
}

/// The value in a `CONFIG GET` reply (an array `[name, value]`, or a map under RESP3).
fn config_value(reply: &Value) -> Option<String> {
    match reply {
        Value::Array(pair) => pair.get(1).and_then(text),
        Value::Map(pairs) => pairs.first().and_then(|(_, value)| text(value)),
        _ => None,
    }
}

fn text(value: &Value) -> Option<String> {
    match value {
        Value::BulkString(bytes) => Some(String::from_utf8_lossy(bytes).into_owned()),
        Value::SimpleString(text) => Some(text.clone()),
        Value::VerbatimString { text, .. } => Some(text.clone()),
        _ => None,
    }
}

/// The oldest server's version (major, minor), from `INFO server` on every node: the
/// acknowledgement must be one every node understands.
async fn server_version(connection: &mut Connection) -> Result<(u32, u32), StoreError> {
    let mut info = redis::cmd("INFO");
    info.arg("server");
    let replies = connection
        .on_every_server(info)
        .await
        .map_err(|error| failed(format!("could not read the Redis version ({error})")))?;
    replies
        .iter()
        .map(|reply| text(reply).as_deref().and_then(parse_version))
        .collect::<Option<Vec<_>>>()
        .and_then(|versions| versions.into_iter().min())
        .ok_or_else(|| failed("could not read the Redis version from INFO server"))
}

/// `redis_version:7.0.15` → (7, 0).
fn parse_version(info: &str) -> Option<(u32, u32)> {
    let version = info
        .lines()
        .find_map(|line| line.strip_prefix("redis_version:"))?;
    let mut parts = version.trim().split('.');
    Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
}

/// Whether the command may have run although its reply was lost.
fn ambiguous(error: &redis::RedisError) -> bool {
    error.is_timeout() || error.is_connection_dropped() || error.is_io_error()
}

fn ticket_key(id: &ApprovalId) -> String {
    format!("obol:approval:{id}")
}

/// The `id` field of every entry of an XRANGE/XREVRANGE reply.
fn stream_ids(reply: &redis::Value) -> Vec<String> {
    let redis::Value::Array(entries) = reply else {
        return Vec::new();
    };
    let mut ids = Vec::new();
    for entry in entries {
        let redis::Value::Array(parts) = entry else {
            continue;
        };
        let Some(redis::Value::Array(fields)) = parts.get(1) else {
            continue;
        };
        for pair in fields.chunks(2) {
            if pair.len() == 2 && text(&pair[0]).as_deref() == Some("id") {
                ids.extend(text(&pair[1]));
            }
        }
    }
    ids
}

/// Redis URLs may carry a password; errors name the server without it.
fn redact(message: &str, url: &str) -> String {
    match url::Url::parse(url) {
        Ok(parsed) if parsed.password().is_some() => {
            message.replace(parsed.password().unwrap_or(""), "***")
        }
        _ => message.to_owned(),
    }
}

/// One `SCAN` step: the next cursor and the keys of this page that match `pattern`.
fn scan_step(cursor: u64, pattern: &str) -> Cmd {
    let mut scan = redis::cmd("SCAN");
    scan.arg(cursor)
        .arg("MATCH")
        .arg(pattern)
        .arg("COUNT")
        .arg(1000);
    scan
}

/// The primaries of a cluster, from `CLUSTER NODES` (`id host:port@bus flags …`). A
/// primary that is failing (or suspected to) is an error, not a skip: a scan that missed its
/// keys would report records absent that are not.
fn primaries(nodes: &str) -> Result<Vec<(String, u16)>, StoreError> {
    let mut out = Vec::new();
    for line in nodes.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let Some(flags) = fields.get(2) else {
            continue;
        };
        if !flags.split(',').any(|f| f == "master") {
            continue;
        }
        if flags.split(',').any(|f| f == "fail" || f == "fail?") {
            return Err(failed(
                "a cluster primary is failing; cannot scan every slot",
            ));
        }
        let address = fields
            .get(1)
            .and_then(|a| a.split('@').next())
            .and_then(|a| a.rsplit_once(':'))
            .and_then(|(host, port)| Some((host.to_owned(), port.parse().ok()?)))
            .ok_or_else(|| failed("CLUSTER NODES names a primary without an address"))?;
        out.push(address);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_acknowledgement_follows_the_server_version() {
        let timeout = Duration::from_millis(500);
        assert_eq!(
            Acknowledgement::for_server(0, timeout, (7, 4)),
            Acknowledgement::Local
        );
        assert_eq!(
            Acknowledgement::for_server(1, timeout, (7, 0)),
            Acknowledgement::Replicated {
                replicas: 1,
                timeout_ms: 500
            }
        );
        let fsynced = Acknowledgement::for_server(2, timeout, (7, 2));
        assert_eq!(
            fsynced,
            Acknowledgement::Fsynced {
                replicas: 2,
                timeout_ms: 500
            }
        );
        let packed =
            String::from_utf8_lossy(&fsynced.command().unwrap().get_packed_command()).into_owned();
        assert!(
            packed.contains("WAITAOF") && packed.ends_with("$1\r\n1\r\n$1\r\n2\r\n$3\r\n500\r\n"),
            "{packed:?}"
        );
        assert!(Acknowledgement::Local.command().is_none());
    }

    #[test]
    fn short_acknowledgements_fail_closed() {
        let wait = Acknowledgement::Replicated {
            replicas: 2,
            timeout_ms: 1,
        };
        assert!(wait.check(&Value::Int(2)).is_ok());
        assert!(wait.check(&Value::Int(1)).unwrap_err().0.contains("1 of 2"));
        assert!(wait.check(&Value::Nil).is_err());
        let waitaof = Acknowledgement::Fsynced {
            replicas: 1,
            timeout_ms: 1,
        };
        assert!(
            waitaof
                .check(&Value::Array(vec![Value::Int(1), Value::Int(1)]))
                .is_ok()
        );
        assert!(
            waitaof
                .check(&Value::Array(vec![Value::Int(0), Value::Int(1)]))
                .unwrap_err()
                .0
                .contains("did not fsync")
        );
        assert!(
            waitaof
                .check(&Value::Array(vec![Value::Int(1), Value::Int(0)]))
                .is_err()
        );
        assert!(waitaof.check(&Value::Int(1)).is_err());
    }

    #[test]
    fn the_version_is_read_from_info() {
        let info = "# Server\r\nredis_version:7.0.15\r\nredis_git_sha1:00000000\r\n";
        assert_eq!(parse_version(info), Some((7, 0)));
        assert_eq!(parse_version("redis_version:7.2.4\n"), Some((7, 2)));
        assert_eq!(parse_version("# Server\r\n"), None);
    }
}
