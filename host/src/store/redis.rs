//! The Redis backend, for several gateways sharing one state.
//!
//! Every multi-key transition is one Lua script, and every key a script touches carries the
//! claim's hash tag (`obol:{<slot>}:…`), so the same scripts run unchanged on Redis Cluster.
//! The per-workspace receipt index lives outside the slot and is written after the script
//! succeeds; it only points at receipts, so a lost index write loses nothing but a listing.
//!
//! Durability: Obol relies on what Redis acknowledges. Run it with `appendonly yes` and
//! `appendfsync always` to lose nothing on a Redis crash; with `everysec` a crash can forget
//! up to a second of claims, and a forgotten claim lets a same-key retry dispatch again
//! (`docs/operations.md`).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{AsyncCommands, Script};

use super::{Claim, ClaimKey, ClaimRecord, Receipt, Registry, RegistryWrite, StoreError};
use crate::approvals::{ApprovalId, Decided, Decision, Ticket};

/// Slot → lease end (ms) of claims with an attempt reserved, for the sweeper. It lives outside
/// every claim's hash tag, so it is written beside the scripts, never inside them: before a
/// reservation (a failed write fails the call closed, and an entry whose claim moved on is
/// dropped by the sweeper) and, best-effort, after the claim leaves `Reserved`.
const LEASES: &str = "obol:leases";

/// Drops a slot's lease index entry unless a later reservation wrote a later lease since.
const DROP_LEASE: &str = r"
local s = redis.call('ZSCORE', KEYS[1], ARGV[1])
if s and tonumber(s) <= tonumber(ARGV[2]) then redis.call('ZREM', KEYS[1], ARGV[1]) end
return 0
";

/// Leases live on the server's clock: a reservation stores `l`, the server time its lease
/// ends (`TIME` + the remaining lease the gateway asks for), and every read returns `l` with
/// the server's time, so a reader judges a lease by the server's clock, never its own. (Since
/// Redis 7 scripts replicate their effects, so `TIME` in a script is allowed.)
const NOW_MS: &str =
    "local t = redis.call('TIME')\nlocal now = t[1] * 1000 + math.floor(t[2] / 1000)\n";

const CLAIM_BODY: &str = r"
local v = redis.call('HGET', KEYS[1], 'v')
if v then return {1, redis.call('HGET', KEYS[1], 'r'), redis.call('HGET', KEYS[1], 'l') or -1, now} end
redis.call('HSET', KEYS[1], 'v', ARGV[2], 'r', ARGV[1])
if ARGV[4] ~= '' then redis.call('HSET', KEYS[1], 'l', now + tonumber(ARGV[4])) end
redis.call('EXPIRE', KEYS[1], ARGV[3])
return {0}
";

/// A claim with its server-clock lease: `{r, l or -1, now}`.
const GET_CLAIM_BODY: &str = r"
return {redis.call('HGET', KEYS[1], 'r') or false, redis.call('HGET', KEYS[1], 'l') or -1, now}
";

/// -1: the record is gone (never a lost race); 0: another version is stored; 1: done. The
/// claim record is written last, so a script that fails part-way never leaves a finalized
/// claim without its receipt.
const TRANSITION_BODY: &str = r"
local v = redis.call('HGET', KEYS[1], 'v')
if not v then return -1 end
if tonumber(ARGV[2]) ~= tonumber(ARGV[1]) + 1 then
  return redis.error_reply('OBOL_VERSION_STEP')
end
if v ~= ARGV[1] then return 0 end
if ARGV[5] ~= '' then
  redis.call('SET', KEYS[2], ARGV[5], 'EX', ARGV[4])
  redis.call('XADD', KEYS[3], 'MAXLEN', '~', '1000', '*', 'event', ARGV[6])
  redis.call('EXPIRE', KEYS[3], ARGV[4])
end
redis.call('HSET', KEYS[1], 'v', ARGV[2], 'r', ARGV[3])
if ARGV[7] ~= '' then
  redis.call('HSET', KEYS[1], 'l', now + tonumber(ARGV[7]))
else
  redis.call('HDEL', KEYS[1], 'l')
end
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

#[derive(Clone)]
pub struct RedisStore {
    /// One multiplexed connection, or (with replicas) a few: `WAIT` holds up the connection
    /// it is sent on until the replicas catch up, so each write waits on its own connection.
    connections: Arc<Vec<ConnectionManager>>,
    next_connection: Arc<std::sync::atomic::AtomicUsize>,
    client: Arc<redis::Client>,
    claim: Arc<Script>,
    transition: Arc<Script>,
    get_claim: Arc<Script>,
    drop_lease: Arc<Script>,
    put_ticket: Arc<Script>,
    decide_ticket: Arc<Script>,
    syncs: Arc<AtomicU64>,
    /// How long finalized claims, receipts, audit entries and expired tickets are kept
    /// (every key carries it as its TTL; `[store] retention_hours`).
    retention_s: u64,
    /// How many replicas must acknowledge a write before it counts (`[store] redis_replicas`).
    replicas: Replicas,
    /// Why the server's settings are unsafe, when the last check found them so: until a check
    /// finds them safe again, no claim is made.
    unsafe_settings: Arc<std::sync::Mutex<Option<String>>>,
}

/// The replica acknowledgement a write waits for before the gateway acts on it.
#[derive(Debug, Clone, Copy)]
struct Replicas {
    count: u32,
    timeout_ms: u64,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore").finish_non_exhaustive()
    }
}

/// A call must fail closed quickly when Redis is down, rather than queue behind reconnect
/// attempts: the client retries, the gateway never guesses.
fn manager_config() -> ConnectionManagerConfig {
    ConnectionManagerConfig::new()
        .set_connection_timeout(Some(Duration::from_secs(2)))
        .set_response_timeout(Some(Duration::from_secs(2)))
        .set_number_of_retries(1)
        .set_max_delay(Duration::from_millis(200))
}

fn failed(error: impl std::fmt::Display) -> StoreError {
    StoreError(error.to_string())
}

fn claim_key(key: &ClaimKey) -> (String, String, String) {
    let slot = key.slot();
    (
        format!("obol:{{{slot}}}:claim"),
        format!("obol:{{{slot}}}:receipt"),
        format!("obol:{{{slot}}}:audit"),
    )
}

impl RedisStore {
    /// Connects; fails fast when Redis is unreachable.
    pub async fn connect(url: &str) -> Result<RedisStore, StoreError> {
        let client = redis::Client::open(url).map_err(|e| failed(redact(&e.to_string(), url)))?;
        let connection = ConnectionManager::new_with_config(client.clone(), manager_config())
            .await
            .map_err(|e| failed(redact(&e.to_string(), url)))?;
        check_durability(&mut connection.clone()).await?;
        Ok(RedisStore {
            connections: Arc::new(vec![connection]),
            next_connection: Arc::default(),
            client: Arc::new(client),
            claim: Arc::new(Script::new(&format!("{NOW_MS}{CLAIM_BODY}"))),
            transition: Arc::new(Script::new(&format!("{NOW_MS}{TRANSITION_BODY}"))),
            get_claim: Arc::new(Script::new(&format!("{NOW_MS}{GET_CLAIM_BODY}"))),
            drop_lease: Arc::new(Script::new(DROP_LEASE)),
            put_ticket: Arc::new(Script::new(PUT_TICKET)),
            decide_ticket: Arc::new(Script::new(DECIDE_TICKET)),
            syncs: Arc::new(AtomicU64::new(0)),
            retention_s: super::DEFAULT_RETENTION.as_secs(),
            replicas: Replicas {
                count: 0,
                timeout_ms: 0,
            },
            unsafe_settings: Arc::default(),
        })
    }

    /// Keeps records for `retention` instead of the default.
    pub fn with_retention(mut self, retention: Duration) -> RedisStore {
        self.retention_s = retention.as_secs().max(1);
        self
    }

    /// Counts a write as done only once `count` replicas acknowledged it (`WAIT`), waiting
    /// at most `timeout`: a failover then cannot lose what the gateway acted on. Opens a few
    /// more connections, so that concurrent writes wait side by side.
    pub async fn with_replicas(
        mut self,
        count: u32,
        timeout: Duration,
    ) -> Result<RedisStore, StoreError> {
        const POOL: usize = 8;
        self.replicas = Replicas {
            count,
            timeout_ms: timeout.as_millis() as u64,
        };
        if count > 0 {
            let mut connections = Vec::with_capacity(POOL);
            for _ in 0..POOL {
                connections.push(
                    ConnectionManager::new_with_config((*self.client).clone(), manager_config())
                        .await
                        .map_err(failed)?,
                );
            }
            self.connections = Arc::new(connections);
        }
        Ok(self)
    }

    /// The next connection, round robin.
    fn connection(&self) -> ConnectionManager {
        let at = self.next_connection.fetch_add(1, Ordering::Relaxed) % self.connections.len();
        self.connections[at].clone()
    }

    /// Waits for the configured replicas to acknowledge every write made so far on this
    /// gateway's connection. Short of them, the write does not count: the caller fails closed.
    async fn acknowledged(
        &self,
        connection: &mut ConnectionManager,
        pipelined: Option<u32>,
    ) -> Result<(), StoreError> {
        if self.replicas.count == 0 {
            return Ok(());
        }
        let acked: u32 = match pipelined {
            Some(acked) => acked,
            None => redis::cmd("WAIT")
                .arg(self.replicas.count)
                .arg(self.replicas.timeout_ms)
                .query_async(connection)
                .await
                .map_err(failed)?,
        };
        if acked < self.replicas.count {
            tracing::error!(
                acked,
                wanted = self.replicas.count,
                "Redis replicas did not acknowledge a write; failing the call closed"
            );
            return Err(failed(format!(
                "{acked} of {} Redis replicas acknowledged the write",
                self.replicas.count
            )));
        }
        Ok(())
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
        let (claimed, pipelined) = self.claim_unacknowledged(key, record, &connection).await?;
        if let Err(error) = self.acknowledged(&mut connection, pipelined).await {
            // Acquired but not acknowledged: nothing is sent, so the reserved attempt is
            // released (best effort) rather than left to be settled as a possible effect.
            if claimed == Claim::Acquired && record.reserved_lease().is_some() {
                let released = record.release_unsent(crate::clock::now_ms());
                let _ = self
                    .transition_unacknowledged(key, record, &released, None, &connection)
                    .await;
            }
            return Err(error);
        }
        Ok(claimed)
    }

    async fn claim_unacknowledged(
        &self,
        key: &ClaimKey,
        record: &ClaimRecord,
        connection: &ConnectionManager,
    ) -> Result<(Claim, Option<u32>), StoreError> {
        let (claim, _, _) = claim_key(key);
        // The replicas' acknowledgement, when it rides in the claim's own round trip.
        let mut pipelined = None;
        let json = serde_json::to_string(record).map_err(failed)?;
        let remaining = remaining_lease(record);
        let mut connection = connection.clone();
        let invoke = |connection: &mut ConnectionManager| {
            let mut invocation = self.claim.key(&claim);
            invocation
                .arg(&json)
                .arg(record.version)
                .arg(self.retention_s)
                .arg(&remaining);
            let mut connection = connection.clone();
            async move {
                invocation
                    .invoke_async::<Vec<redis::Value>>(&mut connection)
                    .await
            }
        };
        let reply = match record.reserved_lease() {
            // The lease index entry and the claim in one round trip: the entry first, so a
            // claim is never reserved without one (a stale entry is dropped by the sweeper).
            Some(until) => {
                let mut pipe = redis::pipe();
                pipe.cmd("ZADD")
                    .arg(LEASES)
                    .arg("GT")
                    .arg(until)
                    .arg(key.slot())
                    .ignore()
                    .cmd("EVALSHA")
                    .arg(self.claim.get_hash())
                    .arg(1)
                    .arg(&claim)
                    .arg(&json)
                    .arg(record.version)
                    .arg(self.retention_s)
                    .arg(&remaining);
                if self.replicas.count > 0 {
                    pipe.cmd("WAIT")
                        .arg(self.replicas.count)
                        .arg(self.replicas.timeout_ms);
                }
                let piped = pipe
                    .query_async::<Vec<redis::Value>>(&mut connection)
                    .await
                    .and_then(|mut replies| {
                        let acked = match replies.get(1) {
                            Some(redis::Value::Int(acked)) => Some(*acked as u32),
                            _ => None,
                        };
                        match replies.drain(..).next() {
                            Some(redis::Value::Array(reply)) => Ok((reply, acked)),
                            _ => Err(redis::RedisError::from((
                                redis::ErrorKind::Client,
                                "unexpected claim pipeline reply",
                            ))),
                        }
                    });
                match piped {
                    Ok((reply, acked)) => {
                        pipelined = acked;
                        Ok(reply)
                    }
                    // Not loaded yet (first use, or Redis restarted): the index entry is
                    // written; the script is loaded and run by the ordinary invocation.
                    Err(error)
                        if error.kind()
                            == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) =>
                    {
                        invoke(&mut connection).await
                    }
                    Err(error) => Err(error),
                }
            }
            None => invoke(&mut connection).await,
        };
        let reply = match reply {
            Err(error) if ambiguous(&error) => {
                // The script may have run: a record with our receipt id at version 1 is ours.
                tracing::warn!(
                    "a claim reply was lost ({error}); reading the claim to see what happened"
                );
                return match self.get(key).await? {
                    Some(stored) if same_record(&stored, record) => Ok((Claim::Acquired, None)),
                    Some(stored) => Ok((Claim::Existing(Box::new(stored)), None)),
                    None => Err(failed(error)),
                };
            }
            other => other,
        };
        let (found, existing, lease_end, server_now) = reply
            .map(|reply| decode_claim_reply(&reply))
            .map_err(failed)??;
        self.syncs.fetch_add(1, Ordering::Relaxed);
        match (found, existing) {
            (0, _) => Ok((Claim::Acquired, pipelined)),
            (_, Some(json)) => Ok((
                Claim::Existing(Box::new(on_local_clock(
                    serde_json::from_str(&json).map_err(failed)?,
                    lease_end,
                    server_now,
                ))),
                pipelined,
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
        let (done, pipelined) = self
            .transition_unacknowledged(key, expected, next, receipt, &connection)
            .await?;
        if done && let Err(error) = self.acknowledged(&mut connection, pipelined).await {
            // A reservation that does not count is not sent: it is released (best effort).
            if next.reserved_lease().is_some() {
                let released = next.release_unsent(crate::clock::now_ms());
                let _ = self
                    .transition_unacknowledged(key, next, &released, None, &connection)
                    .await;
            }
            return Err(error);
        }
        Ok(done)
    }

    async fn transition_unacknowledged(
        &self,
        key: &ClaimKey,
        expected: &ClaimRecord,
        next: &ClaimRecord,
        receipt: Option<&Receipt>,
        connection: &ConnectionManager,
    ) -> Result<(bool, Option<u32>), StoreError> {
        if next.version != expected.version + 1 {
            return Err(super::version_step(expected.version, next.version));
        }
        let (claim, receipt_key, audit_key) = claim_key(key);
        let receipt_json = receipt
            .map(serde_json::to_string)
            .transpose()
            .map_err(failed)?
            .unwrap_or_default();
        let event = receipt
            .map(|r| super::audit_event(r).to_string())
            .unwrap_or_default();
        let next_json = serde_json::to_string(next).map_err(failed)?;
        let remaining = remaining_lease(next);
        let mut connection = connection.clone();
        let mut pipe = redis::pipe();
        // Everything outside the claim's hash tag goes in the same round trip, before the
        // script: the lease index entry of a new reservation (so a reserved claim always has
        // one), and a receipt's pointer and listing entry (so a receipt is findable the
        // moment it exists; readers skip an entry whose receipt was never written).
        if let Some(until) = next.reserved_lease() {
            // GT: a racer that loses the compare-and-set cannot lower a live entry's lease.
            pipe.cmd("ZADD")
                .arg(LEASES)
                .arg("GT")
                .arg(until)
                .arg(key.slot())
                .ignore();
        }
        if let Some(receipt) = receipt {
            index_receipt(&mut pipe, receipt, &receipt_key, self.retention_s);
        }
        pipe.cmd("EVALSHA")
            .arg(self.transition.get_hash())
            .arg(3)
            .arg(&claim)
            .arg(&receipt_key)
            .arg(&audit_key)
            .arg(expected.version)
            .arg(next.version)
            .arg(&next_json)
            .arg(self.retention_s)
            .arg(&receipt_json)
            .arg(&event)
            .arg(&remaining);
        // A claim leaving `Reserved` drops its lease index entry in the same round trip. It
        // runs whatever the script decided, and is harmless when the script refused: it drops
        // only an entry no later than the lease this transition started from, never the entry
        // of a later reservation.
        let leaves_reserved = next.reserved_lease().is_none();
        if leaves_reserved {
            pipe.cmd("EVAL")
                .arg(DROP_LEASE)
                .arg(1)
                .arg(LEASES)
                .arg(key.slot())
                .arg(expected.lease_until_ms)
                .ignore();
        }
        if self.replicas.count > 0 {
            pipe.cmd("WAIT")
                .arg(self.replicas.count)
                .arg(self.replicas.timeout_ms);
        }
        // The replicas' acknowledgement, when it rides in the transition's own round trip.
        let mut pipelined = None;
        let reply = match pipe.query_async::<Vec<redis::Value>>(&mut connection).await {
            Err(error)
                if error.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) =>
            {
                // Not loaded yet: the indexes are written; load and run the script.
                self.transition
                    .key(&claim)
                    .key(&receipt_key)
                    .key(&audit_key)
                    .arg(expected.version)
                    .arg(next.version)
                    .arg(&next_json)
                    .arg(self.retention_s)
                    .arg(&receipt_json)
                    .arg(&event)
                    .arg(&remaining)
                    .invoke_async::<i64>(&mut connection)
                    .await
            }
            other => other.and_then(|replies| {
                pipelined = match replies.get(1) {
                    Some(redis::Value::Int(acked)) => Some(*acked as u32),
                    _ => None,
                };
                match replies.first() {
                    Some(redis::Value::Int(done)) => Ok(*done),
                    _ => Err(redis::RedisError::from((
                        redis::ErrorKind::Client,
                        "unexpected transition pipeline reply",
                    ))),
                }
            }),
        };
        let done = match reply {
            Ok(done) => done,
            Err(error) if ambiguous(&error) => {
                // The script may have run: what is stored now says whether it did.
                return self
                    .settle_ambiguous(key, expected, next, &error)
                    .await
                    .map(|done| (done, None));
            }
            Err(error) => return Err(failed(error)),
        };
        self.syncs.fetch_add(1, Ordering::Relaxed);
        match done {
            -1 => Err(super::gone(&key.slot())),
            1 => Ok((true, pipelined)),
            _ => Ok((false, pipelined)),
        }
    }

    /// After a reply whose outcome is unknown (a timeout or a dropped connection once the
    /// script was sent), reads the record and continues from what is there: `next` stored
    /// means the transition happened; `expected` still stored means it did not (a failure,
    /// nothing to act on); anything else means someone else moved it (a lost race).
    async fn settle_ambiguous(
        &self,
        key: &ClaimKey,
        expected: &ClaimRecord,
        next: &ClaimRecord,
        cause: &redis::RedisError,
    ) -> Result<bool, StoreError> {
        tracing::warn!("a store reply was lost ({cause}); reading the claim to see what happened");
        match self.get(key).await? {
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
        self.drop_lease
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
        let mut connection = self.connection();
        let location = format!("obol:refusal:{}:{}", receipt.workspace, receipt.id);
        let json = serde_json::to_string(receipt).map_err(failed)?;
        let mut pipe = redis::pipe();
        index_receipt(&mut pipe, receipt, &location, self.retention_s);
        pipe.set_ex(&location, json, self.retention_s)
            .ignore()
            .cmd("XADD")
            .arg(format!("obol:refusals:{}", receipt.workspace))
            .arg("MAXLEN")
            .arg("~")
            .arg(10_000)
            .arg("*")
            .arg("event")
            .arg(super::audit_event(receipt).to_string())
            .ignore()
            .query_async::<()>(&mut connection)
            .await
            .map_err(failed)?;
        self.syncs.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    pub async fn get(&self, key: &ClaimKey) -> Result<Option<ClaimRecord>, StoreError> {
        self.get_slot(&key.slot()).await
    }

    /// A claim by its slot, with its lease on the reader's clock.
    async fn get_slot(&self, slot: &str) -> Result<Option<ClaimRecord>, StoreError> {
        let mut connection = self.connection();
        let (json, lease_end, server_now): (Option<String>, i64, i64) = self
            .get_claim
            .key(format!("obol:{{{slot}}}:claim"))
            .invoke_async(&mut connection)
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
        let mut out = Vec::with_capacity(ids.len());
        for id in ids {
            if let Some(receipt) = self.receipt(workspace, &id).await? {
                out.push(receipt);
            }
        }
        Ok(out)
    }

    pub async fn registry_write(
        &self,
        registry: Registry,
        name: &str,
        value: &str,
        mode: RegistryWrite,
    ) -> Result<bool, StoreError> {
        let mut connection = self.connection();
        let hash = format!("obol:registry:{}", registry.as_str());
        let written: bool = if mode == RegistryWrite::InsertOnly {
            connection
                .hset_nx(hash, name, value)
                .await
                .map_err(failed)?
        } else {
            let _: i64 = connection.hset(hash, name, value).await.map_err(failed)?;
            true
        };
        self.syncs.fetch_add(1, Ordering::Relaxed);
        self.acknowledged(&mut connection, None).await?;
        Ok(written)
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
            .put_ticket
            .key(ticket_key(&ticket.id))
            .arg(serde_json::to_string(ticket).map_err(failed)?)
            .arg(ticket.expires_at_ms + self.retention_s * 1000)
            .invoke_async(&mut connection)
            .await
            .map_err(failed)?;
        if created != 0 {
            let stream = format!("obol:approvals:{}", ticket.workspace);
            redis::pipe()
                .cmd("XADD")
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
                .arg(ticket.expires_at_ms)
                .ignore()
                .expire(&stream, self.retention_s as i64)
                .ignore()
                // Marked only if the ticket still exists: one whose expiry already passed is
                // gone by now, and an unconditional HSET would leave a fragment without a TTL
                // that blocks every later repair.
                .cmd("EVAL")
                .arg("if redis.call('EXISTS', KEYS[1]) == 1 then redis.call('HSET', KEYS[1], 'x', 1) end return 0")
                .arg(1)
                .arg(ticket_key(&ticket.id))
                .ignore()
                .query_async::<()>(&mut connection)
                .await
                .map_err(failed)?;
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

/// Adds a receipt's pointer (`obol:receipt:{workspace}:{id}` → where it lives) and its
/// listing entry to `pipe`. Written before the receipt itself: a reader that follows either
/// to nothing skips it.
fn index_receipt(pipe: &mut redis::Pipeline, receipt: &Receipt, location: &str, retention_s: u64) {
    let index = format!("obol:receipts:{}", receipt.workspace);
    let pointer = format!("obol:receipt:{}:{}", receipt.workspace, receipt.id);
    let horizon = receipt.finalized_at_ms.saturating_sub(retention_s * 1000);
    pipe.set_ex(&pointer, location, retention_s)
        .ignore()
        .zadd(&index, &receipt.id, receipt.finalized_at_ms)
        .ignore()
        .zrembyscore(&index, 0, horizon)
        .ignore()
        .expire(&index, retention_s as i64)
        .ignore();
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

/// Refuses a server whose persistence or eviction settings would lose acknowledged claims,
/// naming the setting. A server that hides `CONFIG` is refused too: Obol cannot tell.
async fn check_durability(connection: &mut ConnectionManager) -> Result<(), StoreError> {
    for (setting, wanted) in REQUIRED {
        let reply: Vec<String> = redis::cmd("CONFIG")
            .arg("GET")
            .arg(setting)
            .query_async(connection)
            .await
            .map_err(|error| {
                failed(format!(
                    "could not read the Redis setting {setting} ({error}); Obol needs {setting} {wanted} and checks it with CONFIG GET"
                ))
            })?;
        let actual = reply.get(1).map(String::as_str).unwrap_or("");
        if actual != wanted {
            return Err(failed(format!(
                "Redis runs with {setting} {actual:?}; Obol needs {setting} {wanted}, or acknowledged claims can be lost and a retry could send a call twice (docs/operations.md)"
            )));
        }
    }
    Ok(())
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
    let text = |value: &redis::Value| match value {
        redis::Value::BulkString(bytes) => Some(String::from_utf8_lossy(bytes).into_owned()),
        redis::Value::SimpleString(text) => Some(text.clone()),
        _ => None,
    };
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
