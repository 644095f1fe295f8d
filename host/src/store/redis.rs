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

/// Claims, receipts and audit entries are kept this long (at least 24 h, longer than an
/// approval ticket).
const RETENTION_SECONDS: u64 = 72 * 3600;

/// Slot → lease end (ms) of claims with an attempt reserved, for the sweeper. It lives outside
/// every claim's hash tag, so it is written beside the scripts, never inside them: before a
/// reservation (a failed write fails the call closed, and an entry whose claim moved on is
/// dropped by the sweeper) and, best-effort, after the claim leaves `Reserved`.
const LEASES: &str = "obol:leases";

const CLAIM: &str = r"
local v = redis.call('HGET', KEYS[1], 'v')
if v then return {1, redis.call('HGET', KEYS[1], 'r')} end
redis.call('HSET', KEYS[1], 'v', ARGV[2], 'r', ARGV[1])
redis.call('EXPIRE', KEYS[1], ARGV[3])
return {0}
";

const TRANSITION: &str = r"
local v = redis.call('HGET', KEYS[1], 'v')
if v ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'v', ARGV[2], 'r', ARGV[3])
redis.call('EXPIRE', KEYS[1], ARGV[4])
if ARGV[5] ~= '' then
  redis.call('SET', KEYS[2], ARGV[5], 'EX', ARGV[4])
  redis.call('XADD', KEYS[3], 'MAXLEN', '~', '1000', '*', 'event', ARGV[6])
  redis.call('EXPIRE', KEYS[3], ARGV[4])
end
return 1
";

/// A ticket is a hash (`s`: status, `t`: the ticket) that expires an hour after the ticket
/// does. The per-workspace approvals stream carries each ticket's id, tool, idempotency key,
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
    connection: ConnectionManager,
    claim: Arc<Script>,
    transition: Arc<Script>,
    put_ticket: Arc<Script>,
    decide_ticket: Arc<Script>,
    syncs: Arc<AtomicU64>,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore").finish_non_exhaustive()
    }
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
        // A call must fail closed quickly when Redis is down, rather than queue behind
        // reconnect attempts: the client retries, the gateway never guesses.
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(Duration::from_secs(2)))
            .set_response_timeout(Some(Duration::from_secs(2)))
            .set_number_of_retries(1)
            .set_max_delay(Duration::from_millis(200));
        let connection = ConnectionManager::new_with_config(client, config)
            .await
            .map_err(|e| failed(redact(&e.to_string(), url)))?;
        Ok(RedisStore {
            connection,
            claim: Arc::new(Script::new(CLAIM)),
            transition: Arc::new(Script::new(TRANSITION)),
            put_ticket: Arc::new(Script::new(PUT_TICKET)),
            decide_ticket: Arc::new(Script::new(DECIDE_TICKET)),
            syncs: Arc::new(AtomicU64::new(0)),
        })
    }

    pub async fn claim(&self, key: &ClaimKey, record: &ClaimRecord) -> Result<Claim, StoreError> {
        let (claim, _, _) = claim_key(key);
        let json = serde_json::to_string(record).map_err(failed)?;
        let mut connection = self.connection.clone();
        let invoke = |connection: &mut ConnectionManager| {
            let mut invocation = self.claim.key(&claim);
            invocation
                .arg(&json)
                .arg(record.version)
                .arg(RETENTION_SECONDS);
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
                let piped = redis::pipe()
                    .zadd(LEASES, key.slot(), until)
                    .ignore()
                    .cmd("EVALSHA")
                    .arg(self.claim.get_hash())
                    .arg(1)
                    .arg(&claim)
                    .arg(&json)
                    .arg(record.version)
                    .arg(RETENTION_SECONDS)
                    .query_async::<(Vec<redis::Value>,)>(&mut connection)
                    .await;
                match piped {
                    Ok((reply,)) => Ok(reply),
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
        let (found, existing): (i64, Option<String>) = reply
            .map(|reply| decode_claim_reply(&reply))
            .map_err(failed)??;
        self.syncs.fetch_add(1, Ordering::Relaxed);
        match (found, existing) {
            (0, _) => Ok(Claim::Acquired),
            (_, Some(json)) => Ok(Claim::Existing(Box::new(
                serde_json::from_str(&json).map_err(failed)?,
            ))),
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
        let (claim, receipt_key, audit_key) = claim_key(key);
        let receipt_json = receipt
            .map(serde_json::to_string)
            .transpose()
            .map_err(failed)?
            .unwrap_or_default();
        let event = receipt
            .map(|r| super::audit_event(r).to_string())
            .unwrap_or_default();
        let mut connection = self.connection.clone();
        if let Some(until) = next.reserved_lease() {
            self.index_lease(key, until).await?;
        }
        let done: i64 = self
            .transition
            .key(claim)
            .key(&receipt_key)
            .key(audit_key)
            .arg(expected.version)
            .arg(next.version)
            .arg(serde_json::to_string(next).map_err(failed)?)
            .arg(RETENTION_SECONDS)
            .arg(receipt_json)
            .arg(event)
            .invoke_async(&mut connection)
            .await
            .map_err(failed)?;
        self.syncs.fetch_add(1, Ordering::Relaxed);
        let settled_slot = (done == 1 && next.reserved_lease().is_none()).then(|| key.slot());
        match (done == 1, receipt) {
            // The outcome is already durable; the indexes only serve lookups by id, listings
            // and the sweeper, so failing to write them must not turn a recorded outcome into
            // an error.
            (true, Some(receipt)) => {
                if let Err(error) = self
                    .index_receipt(receipt, &receipt_key, settled_slot.as_deref())
                    .await
                {
                    tracing::warn!(receipt = %receipt.id, "receipt recorded but not indexed: {error}");
                }
            }
            _ => {
                if let Some(slot) = settled_slot {
                    let removed: Result<(), _> = connection.zrem(LEASES, slot).await;
                    if let Err(error) = removed {
                        tracing::warn!(
                            "a settled claim stays in the lease index until the sweeper drops it: {error}"
                        );
                    }
                }
            }
        }
        Ok(done == 1)
    }

    async fn index_lease(&self, key: &ClaimKey, until_ms: u64) -> Result<(), StoreError> {
        let mut connection = self.connection.clone();
        connection
            .zadd::<_, _, _, ()>(LEASES, key.slot(), until_ms)
            .await
            .map_err(failed)
    }

    pub async fn expired_leases(
        &self,
        now_ms: u64,
        limit: usize,
    ) -> Result<Vec<ClaimRecord>, StoreError> {
        let mut connection = self.connection.clone();
        let slots: Vec<String> = connection
            .zrangebyscore_limit(LEASES, 0, now_ms, 0, limit as isize)
            .await
            .map_err(failed)?;
        let mut out = Vec::new();
        for slot in slots {
            let json: Option<String> = connection
                .hget(format!("obol:{{{slot}}}:claim"), "r")
                .await
                .map_err(failed)?;
            let record = json
                .map(|j| serde_json::from_str::<ClaimRecord>(&j).map_err(failed))
                .transpose()?;
            match record {
                Some(record) if record.holder_died(now_ms) => out.push(record),
                // Moved on (or expired): the entry points at nothing the sweeper must settle.
                _ => {
                    let _: Result<(), _> = connection.zrem(LEASES, &slot).await;
                }
            }
        }
        Ok(out)
    }

    /// Points `obol:receipt:{workspace}:{id}` at where the receipt lives and lists it; drops
    /// `settled`'s lease index entry in the same round trip.
    async fn index_receipt(
        &self,
        receipt: &Receipt,
        location: &str,
        settled: Option<&str>,
    ) -> Result<(), StoreError> {
        let mut connection = self.connection.clone();
        let index = format!("obol:receipts:{}", receipt.workspace);
        let pointer = format!("obol:receipt:{}:{}", receipt.workspace, receipt.id);
        let horizon = receipt
            .finalized_at_ms
            .saturating_sub(RETENTION_SECONDS * 1000);
        let mut pipe = redis::pipe();
        if let Some(slot) = settled {
            pipe.zrem(LEASES, slot).ignore();
        }
        pipe.set_ex(&pointer, location, RETENTION_SECONDS)
            .ignore()
            .zadd(&index, &receipt.id, receipt.finalized_at_ms)
            .ignore()
            .zrembyscore(&index, 0, horizon)
            .ignore()
            .expire(&index, RETENTION_SECONDS as i64)
            .ignore()
            .query_async::<()>(&mut connection)
            .await
            .map_err(failed)?;
        self.syncs.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// A refused call's receipt: no claim, so it lives under its own key.
    pub async fn record_refusal(&self, receipt: &Receipt) -> Result<(), StoreError> {
        let mut connection = self.connection.clone();
        let location = format!("obol:refusal:{}:{}", receipt.workspace, receipt.id);
        let json = serde_json::to_string(receipt).map_err(failed)?;
        redis::pipe()
            .set_ex(&location, json, RETENTION_SECONDS)
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
        self.index_receipt(receipt, &location, None).await
    }

    pub async fn get(&self, key: &ClaimKey) -> Result<Option<ClaimRecord>, StoreError> {
        let (claim, _, _) = claim_key(key);
        let mut connection = self.connection.clone();
        let json: Option<String> = connection.hget(claim, "r").await.map_err(failed)?;
        json.map(|j| serde_json::from_str(&j).map_err(failed))
            .transpose()
    }

    pub async fn receipt(&self, workspace: &str, id: &str) -> Result<Option<Receipt>, StoreError> {
        let mut connection = self.connection.clone();
        let pointer: Option<String> = connection
            .get(format!("obol:receipt:{workspace}:{id}"))
            .await
            .map_err(failed)?;
        let Some(location) = pointer else {
            return Ok(None);
        };
        let json: Option<String> = connection.get(location).await.map_err(failed)?;
        json.map(|j| serde_json::from_str(&j).map_err(failed))
            .transpose()
    }

    pub async fn receipts(
        &self,
        workspace: &str,
        limit: usize,
    ) -> Result<Vec<Receipt>, StoreError> {
        let mut connection = self.connection.clone();
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
        let mut connection = self.connection.clone();
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
        Ok(written)
    }

    pub async fn registry(
        &self,
        registry: Registry,
    ) -> Result<std::collections::BTreeMap<String, String>, StoreError> {
        let mut connection = self.connection.clone();
        connection
            .hgetall(format!("obol:registry:{}", registry.as_str()))
            .await
            .map_err(failed)
    }

    pub async fn put_ticket(&self, ticket: &Ticket) -> Result<(), StoreError> {
        let mut connection = self.connection.clone();
        let created: i64 = self
            .put_ticket
            .key(ticket_key(&ticket.id))
            .arg(serde_json::to_string(ticket).map_err(failed)?)
            .arg(ticket.expires_at_ms + 3_600_000)
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
                .expire(&stream, RETENTION_SECONDS as i64)
                .ignore()
                .hset(ticket_key(&ticket.id), "x", 1)
                .ignore()
                .query_async::<()>(&mut connection)
                .await
                .map_err(failed)?;
        }
        Ok(())
    }

    pub async fn ticket(&self, id: &ApprovalId) -> Result<Option<Ticket>, StoreError> {
        let mut connection = self.connection.clone();
        let json: Option<String> = connection.hget(ticket_key(id), "t").await.map_err(failed)?;
        json.map(|j| serde_json::from_str(&j).map_err(failed))
            .transpose()
    }

    pub async fn tickets(&self, workspace: &str, limit: usize) -> Result<Vec<Ticket>, StoreError> {
        let mut connection = self.connection.clone();
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
        let mut connection = self.connection.clone();
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

fn decode_claim_reply(reply: &[redis::Value]) -> Result<(i64, Option<String>), StoreError> {
    let found = match reply.first() {
        Some(redis::Value::Int(n)) => *n,
        _ => return Err(failed("unexpected claim script reply")),
    };
    let record = match reply.get(1) {
        Some(redis::Value::BulkString(bytes)) => Some(String::from_utf8_lossy(bytes).into_owned()),
        Some(redis::Value::SimpleString(text)) => Some(text.clone()),
        _ => None,
    };
    Ok((found, record))
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
