//! Durable state: idempotency claims, attempt reservations, receipts and the audit log.
//!
//! One set of atomic operations, two backends that pass one contract suite
//! ([`contract`]): [`EmbeddedStore`] (a single redb file, the default) and [`RedisStore`]
//! (Lua scripts, for several gateways sharing state).
//!
//! *Architecture Invariant:* every transition is a compare-and-set on the claim record, and
//! every write is acknowledged (fsynced, or acknowledged by Redis) before the caller acts on
//! it. A reservation is therefore durable before its request leaves, and a crash can leave a
//! claim `Reserved` (later finalized `unknown`), never a silent second effect.

mod claim;
pub mod contract;
mod embedded;
mod journal;
pub mod layout;
mod redis;
#[cfg(feature = "test-util")]
mod volatile;

use serde::{Deserialize, Serialize};

use crate::approvals::{ApprovalId, Decided, Decision, Ticket};
use crate::idempotency::IdempotencyKey;

pub(crate) use claim::RecordHead;
pub use claim::{
    ApprovalBasis, Claim, ClaimRecord, ClaimState, HeldFor, Holder, Opening, OutcomeClass, Pin,
    PinnedBinding, Rendered, ResultJson, StoredOutcome, destination_of,
};
pub use embedded::{DEFAULT_CACHE_BYTES, EmbeddedStore};
pub use redis::RedisStore;
#[cfg(feature = "test-util")]
pub use volatile::VolatileStore;

/// Where a claim lives: workspace, resolved connection, tool, key (ADR-0044).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ClaimKey {
    pub workspace: String,
    pub connection: ConnectionSegment,
    /// The namespaced tool name.
    pub tool: String,
    pub key: IdempotencyKey,
}

/// How far a scan goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scan {
    All,
    /// Stop at the first match (whether there is one).
    First,
}

/// A glob (Redis `MATCH` syntax, `*` only) over slots that selects those with a part starting
/// `cap.`: every capability claim, and a few others the caller filters out. A slot's parts
/// are `LEN:TEXT`, and no name holds a `:`.
const CAPABILITY_PATTERN: &str = "*:cap.*";

/// Whether `slot` matches a glob of literal text and `*` (any run), as Redis `MATCH` does.
pub(crate) fn glob_matches(glob: &str, slot: &str) -> bool {
    let mut parts = glob.split('*');
    let first = parts.next().unwrap_or_default();
    let Some(mut rest) = slot.strip_prefix(first) else {
        return false;
    };
    let pieces: Vec<&str> = parts.collect();
    for (i, piece) in pieces.iter().enumerate() {
        if i + 1 == pieces.len() {
            return rest.ends_with(piece);
        }
        match rest.find(piece) {
            Some(at) => rest = &rest[at + piece.len()..],
            None => return false,
        }
    }
    rest.is_empty()
}

/// The connection part of a claim key. A capability call (`cap.*`) claims under the literal
/// unresolved segment, so a retry after the route changed addresses the same slot.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum ConnectionSegment {
    Resolved(String),
    Capability,
    /// The gateway's own tools (`search_tools`), which no connection serves.
    Gateway,
}

impl ConnectionSegment {
    /// As a slot spells it, in two pieces. A connection id is `c` and the id; the others
    /// start with `=`, which no connection id can, so no id reads back as them (`c` + `ap`
    /// once did).
    fn spelled(&self) -> [&str; 2] {
        match self {
            ConnectionSegment::Resolved(id) => ["c", id],
            ConnectionSegment::Capability => ["=cap", ""],
            ConnectionSegment::Gateway => ["=gateway", ""],
        }
    }

    fn read(spelled: &str) -> Option<ConnectionSegment> {
        match spelled {
            "=cap" => Some(ConnectionSegment::Capability),
            "=gateway" => Some(ConnectionSegment::Gateway),
            resolved => Some(ConnectionSegment::Resolved(
                resolved.strip_prefix('c')?.to_owned(),
            )),
        }
    }

    /// As holders and receipts name it.
    pub fn label(&self) -> &str {
        match self {
            ConnectionSegment::Resolved(id) => id,
            ConnectionSegment::Capability => "cap",
            ConnectionSegment::Gateway => "obol",
        }
    }
}

/// `number` in decimal, zero-padded to at least `width` digits: what `{number:0width$}` writes,
/// without `fmt`'s machinery, which was most of the cost of a store key built with it.
pub(crate) fn push_decimal(out: &mut String, mut number: u64, width: usize) {
    let mut digits = [b'0'; 20];
    let mut start = digits.len();
    while number > 0 || start == digits.len() {
        start -= 1;
        digits[start] = b'0' + (number % 10) as u8;
        number /= 10;
    }
    for _ in digits.len() - start..width {
        out.push('0');
    }
    out.push_str(std::str::from_utf8(&digits[start..]).expect("ASCII digits"));
}

impl ClaimKey {
    /// The storage key. Every part is length-prefixed, so no choice of names can make two
    /// claims collide; the whole is one Redis hash tag, so a claim's keys share a slot.
    pub fn slot(&self) -> String {
        // Built in place: a call builds its slot a few times, and `format!` per part was
        // 1 % of a call's instructions.
        let parts = [
            [self.workspace.as_str(), ""],
            self.connection.spelled(),
            [self.tool.as_str(), ""],
            [self.key.as_str(), ""],
        ];
        let bytes: usize = parts.iter().flatten().map(|piece| piece.len()).sum();
        let mut slot = String::with_capacity(bytes + 4 * 5);
        for [first, second] in parts {
            push_decimal(&mut slot, (first.len() + second.len()) as u64, 1);
            slot.push(':');
            slot.push_str(first);
            slot.push_str(second);
        }
        slot
    }

    /// The key a storage key was made from ([`ClaimKey::slot`] read back).
    pub fn from_slot(slot: &str) -> Option<ClaimKey> {
        let mut rest = slot;
        let mut parts = Vec::with_capacity(4);
        for _ in 0..4 {
            let (length, tail) = rest.split_once(':')?;
            let length: usize = length.parse().ok()?;
            let part = tail.get(..length)?;
            parts.push(part);
            rest = &tail[length..];
        }
        if !rest.is_empty() {
            return None;
        }
        Some(ClaimKey {
            workspace: parts[0].to_owned(),
            connection: ConnectionSegment::read(parts[1])?,
            tool: parts[2].to_owned(),
            key: IdempotencyKey::parse(parts[3]).ok()?,
        })
    }
}

/// A receipt: what one invocation did, for the workspace owner. No secrets, no arguments.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Receipt {
    pub id: String,
    pub workspace: String,
    pub idempotency_key: String,
    pub key_source: KeySource,
    pub tool: String,
    pub connection: String,
    pub request_hash: String,
    pub fingerprint: String,
    /// The version of the component that prepared the request (component routes only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connector_version: Option<String>,
    pub attempt_count: u32,
    pub outcome: OutcomeClass,
    pub vendor_status: Option<u16>,
    /// What served the tool: `native` or `federated` (a component), or `mcp` (an upstream).
    #[serde(default)]
    pub route: crate::catalog::RouteKind,
    pub evidence: EvidenceClass,
    /// The broker's id for this call, read by the gateway (`broker_attested` receipts only).
    #[serde(default)]
    pub broker_record_id: Option<String>,
    pub verification: Verification,
    /// Why verification is not `verified`, when it is not.
    pub note: Option<String>,
    /// The policy publication the call was evaluated under (`None`: the workspace has none).
    #[serde(default)]
    pub policy_publication: Option<u32>,
    /// The policies that allowed the call.
    #[serde(default)]
    pub matched_policies: Vec<String>,
    /// The approval the call was held under, when it was held.
    #[serde(default)]
    pub approval_id: Option<String>,
    /// The name of the key that made the call.
    #[serde(default)]
    pub key_name: Option<String>,
    /// An `Unknown tool` refusal: readable by the workspace owner only.
    #[serde(default)]
    pub refusal: bool,
    /// A capability call's routing decision: which provider, why, and what was passed over.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capability: Option<crate::capability::router::Decision>,
    /// The client's W3C trace id (`_meta.traceparent`), to find a receipt from a trace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace_id: Option<String>,
    pub created_at_ms: u64,
    pub finalized_at_ms: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KeySource {
    Supplied,
    Minted,
}

/// What the gateway saw of the effect (`docs/receipts.md`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EvidenceClass {
    /// The gateway sent the request and read the vendor's answer itself (native routes).
    GatewayObserved,
    /// The call ran at a broker the gateway did not observe (federated routes).
    Untrusted,
    /// A federated call whose broker record id the gateway itself read from the broker's
    /// answer, where the broker's profile says it is (`broker_record_id`). Still not verified:
    /// the broker's word about the vendor is not the gateway's observation.
    BrokerAttested,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verification {
    /// Gateway-observed, a declared status class, and (when declared) output that matches
    /// the output schema.
    Verified,
    /// The outcome is unknown or the output could not be checked.
    Inconclusive,
    /// The evidence class can never be verified (federated routes).
    Unverifiable,
}

/// Why the store could not do what was asked. Always retryable from the client's view; the
/// gateway fails closed (sends nothing) when it cannot record.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the state store is unavailable: {0}")]
pub struct StoreError(pub String);

/// Operator-managed records kept beside the config file: keys created through the admin API
/// and policy publications made without a restart. Small, and always read whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Registry {
    Keys,
    Publications,
    Capabilities,
    /// The claim-key layout marker (`layout`).
    Layout,
    /// Gateways' heartbeats (`layout::Registration`).
    Gateways,
}

impl Registry {
    pub fn as_str(&self) -> &'static str {
        match self {
            Registry::Keys => "keys",
            Registry::Publications => "publications",
            Registry::Capabilities => "capabilities",
            Registry::Layout => "layout",
            Registry::Gateways => "gateways",
        }
    }
}

/// How long finalized claims, receipts, audit records and expired tickets are kept unless
/// `[store] retention_hours` says otherwise; live claims and pending tickets are never removed.
pub const DEFAULT_RETENTION: std::time::Duration = std::time::Duration::from_secs(72 * 3600);

/// How a registry write treats a record that already exists.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum RegistryWrite {
    /// Publications are immutable: a second write under a name changes nothing.
    InsertOnly,
    /// A key's revocation rewrites its record.
    Overwrite,
}

/// The configured backend.
///
/// Redis's futures are boxed where they are awaited: the `redis` crate's round trips make
/// them kilobytes large, and inline, every caller's future (a call's claim, reserve and
/// finalize phases) was that large on the embedded store too, and copied whole each time it
/// moved (ADR-0061).
#[derive(Debug, Clone)]
pub enum Store {
    Embedded(EmbeddedStore),
    Redis(RedisStore),
    /// In memory, no durability: only for measuring what durability costs.
    #[cfg(feature = "test-util")]
    Volatile(VolatileStore),
}

impl Store {
    /// Creates the record unless one exists; returns the existing one otherwise.
    pub async fn claim(&self, key: &ClaimKey, record: &ClaimRecord) -> Result<Claim, StoreError> {
        match self {
            Store::Embedded(s) => s.claim(key, record).await,
            Store::Redis(s) => Box::pin(s.claim(key, record)).await,
            #[cfg(feature = "test-util")]
            Store::Volatile(s) => s.claim(key, record).await,
        }
    }

    /// Replaces the record with `next` if it is still at `expected.version` (`next.version`
    /// must be one more). Returns whether it did.
    pub async fn transition(
        &self,
        key: &ClaimKey,
        expected: &ClaimRecord,
        next: &ClaimRecord,
    ) -> Result<bool, StoreError> {
        // Failure tests make transitions fail (a lease renewal, a release), as an outage would.
        #[cfg(feature = "test-util")]
        if crate::failpoint::active("store-transition") {
            return Err(StoreError("failpoint store-transition".into()));
        }
        match self {
            Store::Embedded(s) => s.transition(key, expected, next, None).await,
            Store::Redis(s) => Box::pin(s.transition(key, expected, next, None)).await,
            #[cfg(feature = "test-util")]
            Store::Volatile(s) => s.transition(key, expected, next, None).await,
        }
    }

    /// The final transition: like [`Store::transition`], and in the same atomic write stores
    /// the receipt and appends the audit record. Nothing is exposed to the client before
    /// this returns `Ok(true)`.
    pub async fn finalize(
        &self,
        key: &ClaimKey,
        expected: &ClaimRecord,
        next: &ClaimRecord,
        receipt: &Receipt,
    ) -> Result<bool, StoreError> {
        // Crash tests make the final write fail, as a lost audit acknowledgement would.
        #[cfg(feature = "test-util")]
        if crate::failpoint::active("store-finalize") {
            return Err(StoreError("failpoint store-finalize".into()));
        }
        match self {
            Store::Embedded(s) => s.transition(key, expected, next, Some(receipt)).await,
            Store::Redis(s) => Box::pin(s.transition(key, expected, next, Some(receipt))).await,
            #[cfg(feature = "test-util")]
            Store::Volatile(s) => s.transition(key, expected, next, Some(receipt)).await,
        }
    }

    /// Every claim slot the store holds whose tool is a capability (`cap.*`), in any layout:
    /// what a key-layout cutover must account for (`layout`). A full scan, for the rare
    /// operator action and for startup; never on a call's path.
    pub async fn capability_slots(&self) -> Result<Vec<ClaimKey>, StoreError> {
        let slots = match self {
            Store::Embedded(s) => s.slots_matching(CAPABILITY_PATTERN).await?,
            Store::Redis(s) => Box::pin(s.slots_matching(CAPABILITY_PATTERN, Scan::All)).await?,
            #[cfg(feature = "test-util")]
            Store::Volatile(s) => s.slots_matching(CAPABILITY_PATTERN).await?,
        };
        Ok(slots
            .iter()
            .filter_map(|slot| ClaimKey::from_slot(slot))
            .filter(|key| key.tool.starts_with("cap."))
            .collect())
    }

    /// Whether the store holds any claim at all.
    pub async fn holds_claims(&self) -> Result<bool, StoreError> {
        match self {
            Store::Embedded(s) => s.holds_claims().await,
            Store::Redis(s) => Ok(!Box::pin(s.slots_matching("*", Scan::First))
                .await?
                .is_empty()),
            #[cfg(feature = "test-util")]
            Store::Volatile(s) => Ok(!s.slots_matching("*").await?.is_empty()),
        }
    }

    pub async fn get(&self, key: &ClaimKey) -> Result<Option<ClaimRecord>, StoreError> {
        match self {
            Store::Embedded(s) => s.get(key).await,
            Store::Redis(s) => Box::pin(s.get(key)).await,
            #[cfg(feature = "test-util")]
            Store::Volatile(s) => s.get(key).await,
        }
    }

    /// Up to `limit` claims whose reserved attempt's lease ended by `now_ms`: holders presumed
    /// dead, for the sweeper to settle.
    pub async fn expired_leases(
        &self,
        now_ms: u64,
        limit: usize,
    ) -> Result<Vec<(String, ClaimRecord)>, StoreError> {
        match self {
            Store::Embedded(s) => s.expired_leases(now_ms, limit).await,
            Store::Redis(s) => Box::pin(s.expired_leases(now_ms, limit)).await,
            #[cfg(feature = "test-util")]
            Store::Volatile(s) => s.expired_leases(now_ms, limit).await,
        }
    }

    /// Removes what is past the retention as of `now_ms` (finalized claims, receipts, audit
    /// records, expired tickets), in small batches that never hold up a claim. Redis keys
    /// expire by themselves; returns how many records were removed here.
    pub async fn compact(&self, now_ms: u64) -> Result<usize, StoreError> {
        match self {
            Store::Embedded(s) => s.compact(now_ms).await,
            Store::Redis(_) => Ok(0),
            #[cfg(feature = "test-util")]
            Store::Volatile(_) => Ok(0),
        }
    }

    pub async fn receipt(&self, workspace: &str, id: &str) -> Result<Option<Receipt>, StoreError> {
        match self {
            Store::Embedded(s) => s.receipt(workspace, id).await,
            Store::Redis(s) => Box::pin(s.receipt(workspace, id)).await,
            #[cfg(feature = "test-util")]
            Store::Volatile(s) => s.receipt(workspace, id).await,
        }
    }

    /// The newest receipts of a workspace, newest first.
    pub async fn receipts(
        &self,
        workspace: &str,
        limit: usize,
    ) -> Result<Vec<Receipt>, StoreError> {
        match self {
            Store::Embedded(s) => s.receipts(workspace, limit).await,
            Store::Redis(s) => Box::pin(s.receipts(workspace, limit)).await,
            #[cfg(feature = "test-util")]
            Store::Volatile(s) => s.receipts(workspace, limit).await,
        }
    }

    /// Stores the receipt of a call that was refused before it claimed anything (an
    /// `Unknown tool`), with its audit record: the owner learns the real reason.
    pub async fn record_refusal(&self, receipt: &Receipt) -> Result<(), StoreError> {
        match self {
            Store::Embedded(s) => s.record_refusal(receipt).await,
            Store::Redis(s) => Box::pin(s.record_refusal(receipt)).await,
            #[cfg(feature = "test-util")]
            Store::Volatile(s) => s.record_refusal(receipt).await,
        }
    }

    /// Writes `ticket` unless a ticket with its id exists (a repeated hold re-writes the same
    /// ticket, so a lost ticket write is repaired by the next call under the key).
    pub async fn put_ticket(&self, ticket: &Ticket) -> Result<(), StoreError> {
        match self {
            Store::Embedded(s) => s.put_ticket(ticket).await,
            Store::Redis(s) => Box::pin(s.put_ticket(ticket)).await,
            #[cfg(feature = "test-util")]
            Store::Volatile(s) => s.put_ticket(ticket).await,
        }
    }

    pub async fn ticket(&self, id: &ApprovalId) -> Result<Option<Ticket>, StoreError> {
        match self {
            Store::Embedded(s) => s.ticket(id).await,
            Store::Redis(s) => Box::pin(s.ticket(id)).await,
            #[cfg(feature = "test-util")]
            Store::Volatile(s) => s.ticket(id).await,
        }
    }

    /// The newest tickets of a workspace, newest first (expired ones included; the caller
    /// judges expiry against its clock).
    pub async fn tickets(&self, workspace: &str, limit: usize) -> Result<Vec<Ticket>, StoreError> {
        match self {
            Store::Embedded(s) => s.tickets(workspace, limit).await,
            Store::Redis(s) => Box::pin(s.tickets(workspace, limit)).await,
            #[cfg(feature = "test-util")]
            Store::Volatile(s) => s.tickets(workspace, limit).await,
        }
    }

    /// Records the owner's decision if the ticket is still pending (compare-and-set: of two
    /// owners clicking at once, one decides).
    pub async fn decide_ticket(
        &self,
        id: &ApprovalId,
        decision: Decision,
        at_ms: u64,
    ) -> Result<Decided, StoreError> {
        match self {
            Store::Embedded(s) => s.decide_ticket(id, decision, at_ms).await,
            Store::Redis(s) => Box::pin(s.decide_ticket(id, decision, at_ms)).await,
            #[cfg(feature = "test-util")]
            Store::Volatile(s) => s.decide_ticket(id, decision, at_ms).await,
        }
    }

    /// Adds `name` to the registry unless it is there; returns whether it added it.
    /// Publications are immutable, so they are only ever inserted.
    pub async fn registry_insert(
        &self,
        registry: Registry,
        name: &str,
        value: &str,
    ) -> Result<bool, StoreError> {
        match self {
            Store::Embedded(s) => {
                s.registry_write(registry, name, value, RegistryWrite::InsertOnly)
                    .await
            }
            Store::Redis(s) => {
                Box::pin(s.registry_write(registry, name, value, RegistryWrite::InsertOnly)).await
            }
            #[cfg(feature = "test-util")]
            Store::Volatile(s) => {
                s.registry_write(registry, name, value, RegistryWrite::InsertOnly)
                    .await
            }
        }
    }

    /// Sets `name` (a key's revocation rewrites its record).
    pub async fn registry_put(
        &self,
        registry: Registry,
        name: &str,
        value: &str,
    ) -> Result<(), StoreError> {
        let result = match self {
            Store::Embedded(s) => {
                s.registry_write(registry, name, value, RegistryWrite::Overwrite)
                    .await
            }
            Store::Redis(s) => {
                Box::pin(s.registry_write(registry, name, value, RegistryWrite::Overwrite)).await
            }
            #[cfg(feature = "test-util")]
            Store::Volatile(s) => {
                s.registry_write(registry, name, value, RegistryWrite::Overwrite)
                    .await
            }
        };
        result.map(|_| ())
    }

    /// Every record of `registry`, by name.
    pub async fn registry(
        &self,
        registry: Registry,
    ) -> Result<std::collections::BTreeMap<String, String>, StoreError> {
        match self {
            Store::Embedded(s) => s.registry(registry).await,
            Store::Redis(s) => Box::pin(s.registry(registry)).await,
            #[cfg(feature = "test-util")]
            Store::Volatile(s) => s.registry(registry).await,
        }
    }

    /// How many durable syncs (fsync or Redis write round trips) the store has made; for the
    /// benchmark's per-call figures.
    pub fn syncs(&self) -> u64 {
        match self {
            Store::Embedded(s) => s.syncs(),
            Store::Redis(s) => s.syncs(),
            #[cfg(feature = "test-util")]
            Store::Volatile(_) => 0,
        }
    }
}

/// A transition found no record where a claim was: it was evicted, expired, or lost in a
/// failover. That is never a lost race (a fresh claim would send the call again): it is an
/// alarm, and the call fails closed.
pub(crate) fn gone(slot: &str) -> StoreError {
    tracing::error!(
        slot = %slot.chars().take(96).collect::<String>(),
        "a claim record is gone (evicted, expired or lost in a failover); failing the call closed"
    );
    StoreError("a claim record is gone; check the store's eviction and persistence".into())
}

/// A transition must move the version by exactly one: anything else is a bug in the caller,
/// refused by every backend.
pub(crate) fn version_step(expected: u64, next: u64) -> StoreError {
    tracing::error!(
        expected,
        next,
        "refused a claim transition that does not step its version by one"
    );
    StoreError(format!(
        "a transition from version {expected} must write version {}, not {next}",
        expected + 1
    ))
}

/// The audit record written with a receipt (both backends write the same shape). Its time is
/// the receipt's: a write applied again from the journal after a crash must write what it
/// wrote the first time, so nothing here reads the clock.
#[derive(Serialize)]
pub(crate) struct AuditEvent<'a> {
    at_ms: u64,
    workspace: &'a str,
    receipt_id: &'a str,
    tool: &'a str,
    outcome: OutcomeClass,
    attempt_count: u32,
}

impl<'a> AuditEvent<'a> {
    pub(crate) fn of(receipt: &'a Receipt) -> AuditEvent<'a> {
        AuditEvent {
            at_ms: receipt.finalized_at_ms,
            workspace: &receipt.workspace,
            receipt_id: &receipt.id,
            tool: &receipt.tool,
            outcome: receipt.outcome,
            attempt_count: receipt.attempt_count,
        }
    }
}

/// The ticket as decided (shared by every backend).
pub(crate) fn decided(mut ticket: Ticket, decision: Decision, at_ms: u64) -> Ticket {
    ticket.status = match decision {
        Decision::Approved => crate::approvals::TicketStatus::Approved { at_ms },
        Decision::Denied => crate::approvals::TicketStatus::Denied { at_ms },
    };
    ticket
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        #![proptest_config(crate::properties::config())]

        /// The store's keys spell numbers as `format!` does: they are keys in files written.
        #[test]
        fn numbers_in_keys_are_spelled_as_format_spells_them(
            number in proptest::prop_oneof![
                proptest::prelude::Just(0u64),
                proptest::prelude::Just(u64::MAX),
                0u64..1_000,
                proptest::prelude::any::<u64>(),
            ],
            width in 0usize..=22,
        ) {
            let mut built = String::from("k:");
            push_decimal(&mut built, number, width);
            proptest::prop_assert_eq!(built, format!("k:{number:0width$}"));
        }
    }

    #[test]
    fn every_slot_reads_back_as_the_key_it_was_made_from() {
        let key = IdempotencyKey::parse("idt_property-key-00001").unwrap();
        for connection in [
            ConnectionSegment::Resolved("stripe-main".into()),
            // `c` + `ap` is the old capability spelling: it must stay a connection.
            ConnectionSegment::Resolved("ap".into()),
            ConnectionSegment::Resolved("=cap".into()),
            ConnectionSegment::Capability,
            ConnectionSegment::Gateway,
        ] {
            let claim = ClaimKey {
                workspace: "acme".into(),
                connection,
                tool: "cap.refund".into(),
                key: key.clone(),
            };
            assert_eq!(ClaimKey::from_slot(&claim.slot()), Some(claim.clone()));
        }
    }

    /// Slots are keys in stores already written: their spelling never changes.
    #[test]
    fn a_slot_is_spelled_as_stores_already_hold_it() {
        let key = IdempotencyKey::parse("idt_property-key-00001").unwrap();
        let spelled = |connection| {
            ClaimKey {
                workspace: "acme".into(),
                connection,
                tool: "cap.refund".into(),
                key: key.clone(),
            }
            .slot()
        };
        assert_eq!(
            spelled(ConnectionSegment::Resolved("stripe-main".into())),
            "4:acme12:cstripe-main10:cap.refund22:idt_property-key-00001"
        );
        assert_eq!(
            spelled(ConnectionSegment::Capability),
            "4:acme4:=cap10:cap.refund22:idt_property-key-00001"
        );
        assert_eq!(
            spelled(ConnectionSegment::Gateway),
            "4:acme8:=gateway10:cap.refund22:idt_property-key-00001"
        );
    }
}
