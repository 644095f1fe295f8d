//! The claim record and its state machine. Every transition is a method that returns the next
//! record; [`ClaimRecord::next`] is the one place a version is incremented, and
//! [`ClaimRecord::attempts`] is the one count of requests that may have reached the vendor.
//!
//! ```text
//!            reserve_next                    release_unsent (nothing left)
//! Claimed ─────────────────▶ Reserved ───────────────────────────────────▶ Claimed | AwaitingApproval
//!    │ hold                   │  ▲ renew (same attempt, provably unsent)     (back where it was)
//!    ▼                        │  └─ reserve_next (the one immediate retry)
//! AwaitingApproval ─reserve_next (approved token)─▶ Reserved
//!    │                        │
//!    └─finalize (denied, expired)──▶ Finalized ◀──finalize──┘
//!                                     │ reserve_next: only `unknown` with a vendor binding,
//!                                     ▼ and, for a slot once held, only under its token
//!                                   Reserved
//! ```
//!
//! The store compares and sets whole records; these methods decide what a legal next record
//! is, so no caller writes a state by hand.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{EvidenceClass, KeySource};
use crate::approvals::ApprovalId;
use crate::idempotency::RequestHash;

/// The tool's idempotency propagation as a claim pins it. Stored in its text form
/// (`none`, `unsupported`, `header:NAME`, `body_field:POINTER`), so records of every version
/// compare alike.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum PinnedBinding {
    None,
    Unsupported,
    Header(String),
    BodyField(String),
}

impl From<&crate::catalog::Propagation> for PinnedBinding {
    /// The form pinned in a claim: the propagation with its header name or pointer, so a
    /// changed binding is a different call.
    fn from(propagation: &crate::catalog::Propagation) -> PinnedBinding {
        use crate::catalog::Propagation;
        match propagation {
            Propagation::None => PinnedBinding::None,
            Propagation::Unsupported => PinnedBinding::Unsupported,
            Propagation::Header(name) => PinnedBinding::Header(name.to_string()),
            Propagation::BodyField(pointer) => {
                PinnedBinding::BodyField(pointer.as_str().to_owned())
            }
        }
    }
}

impl PinnedBinding {
    /// Whether the vendor deduplicates on the key it receives, so a resend under the same key
    /// cannot become a second effect.
    pub fn is_vendor_binding(&self) -> bool {
        matches!(self, PinnedBinding::Header(_) | PinnedBinding::BodyField(_))
    }
}

impl From<PinnedBinding> for String {
    fn from(binding: PinnedBinding) -> String {
        match binding {
            PinnedBinding::None => "none".into(),
            PinnedBinding::Unsupported => "unsupported".into(),
            PinnedBinding::Header(name) => format!("header:{name}"),
            PinnedBinding::BodyField(pointer) => format!("body_field:{pointer}"),
        }
    }
}

impl TryFrom<String> for PinnedBinding {
    type Error = String;
    fn try_from(text: String) -> Result<PinnedBinding, String> {
        if let Some(name) = text.strip_prefix("header:") {
            return Ok(PinnedBinding::Header(name.to_owned()));
        }
        if let Some(pointer) = text.strip_prefix("body_field:") {
            return Ok(PinnedBinding::BodyField(pointer.to_owned()));
        }
        match text.as_str() {
            "none" => Ok(PinnedBinding::None),
            "unsupported" => Ok(PinnedBinding::Unsupported),
            _ => Err(format!("unknown pinned binding {text:?}")),
        }
    }
}

/// What a claim pins when it is first acquired. A later call under the same key must make the
/// same call (request hash and destination) or it is an `idempotency_conflict`; to be sent
/// again it must match all of it, the connector version included.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "StoredPin")]
pub struct Pin {
    /// sha256 of the canonical arguments.
    pub request_hash: String,
    pub binding: PinnedBinding,
    /// Non-secret destination facts: connection, connector name, method, origin, upstream tool.
    pub fingerprint: String,
    /// The component version that prepared the request (components only). Not part of the
    /// destination: a finished call replays across a hot upgrade, but is never resent by
    /// another version than the one that prepared it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connector_version: Option<String>,
}

impl Pin {
    pub fn new(request_hash: RequestHash, binding: PinnedBinding, fingerprint: String) -> Pin {
        Pin {
            request_hash: request_hash.to_string(),
            binding,
            fingerprint,
            connector_version: None,
        }
    }

    /// The same pin, for a request a component of `version` prepared.
    pub fn prepared_by(self, version: &str) -> Pin {
        Pin {
            connector_version: Some(version.to_owned()),
            ..self
        }
    }

    /// Whether `other` is the same call: the same arguments to the same destination. A slot's
    /// stored outcome answers it, whichever connector version is serving now.
    pub fn same_call(&self, other: &Pin) -> bool {
        self.request_hash == other.request_hash && self.fingerprint == other.fingerprint
    }
}

/// A pin as stored. Records written before the version had a field of its own carry it in
/// the fingerprint (`CONNECTION NAME@VERSION METHOD ORIGIN TOOL`); it is moved out on read, so
/// a retry across the upgrade that brought this format is still the same call.
#[derive(Deserialize)]
struct StoredPin {
    request_hash: String,
    binding: PinnedBinding,
    fingerprint: String,
    #[serde(default)]
    connector_version: Option<String>,
}

impl From<StoredPin> for Pin {
    fn from(stored: StoredPin) -> Pin {
        let (fingerprint, connector_version) = match stored.connector_version {
            Some(version) => (stored.fingerprint, Some(version)),
            None => match split_legacy_version(&stored.fingerprint) {
                Some((fingerprint, version)) => (fingerprint, Some(version)),
                None => (stored.fingerprint, None),
            },
        };
        Pin {
            request_hash: stored.request_hash,
            binding: stored.binding,
            fingerprint,
            connector_version,
        }
    }
}

/// The destination a fingerprint names, whichever release wrote it: an approval token or a
/// ticket written before the version had a field of its own carries it in the fingerprint.
pub fn destination_of(fingerprint: &str) -> std::borrow::Cow<'_, str> {
    match split_legacy_version(fingerprint) {
        Some((destination, _)) => std::borrow::Cow::Owned(destination),
        None => std::borrow::Cow::Borrowed(fingerprint),
    }
}

/// `NAME@VERSION` followed by an upper-case method and an `http(s)://` origin: the only place
/// an old component fingerprint put the version (a capability's fingerprint ends with one).
fn split_legacy_version(fingerprint: &str) -> Option<(String, String)> {
    let words: Vec<&str> = fingerprint.split(' ').collect();
    let at = words.windows(3).position(|w| {
        w[0].contains('@')
            && !w[1].is_empty()
            && w[1].bytes().all(|b| b.is_ascii_uppercase())
            && (w[2].starts_with("http://") || w[2].starts_with("https://"))
    })?;
    let (name, version) = words[at].split_once('@')?;
    let mut rewritten: Vec<&str> = words.clone();
    rewritten[at] = name;
    Some((rewritten.join(" "), version.to_owned()))
}

/// Whether the call that holds a slot needed a human's approval, as policy decided it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ApprovalBasis {
    NotRequired,
    Waived,
    Required,
}

/// Who holds the slot and under what decision: the facts of the call that made the last
/// reservation (or the hold). A settlement's receipt is built from these, never from whoever
/// asks next, and a lost ticket is rebuilt from them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Holder {
    pub workspace: String,
    pub connection: String,
    /// The namespaced tool name.
    pub tool: String,
    pub idempotency_key: String,
    /// The `sha256:` form of the virtual key.
    pub key_hash: String,
    pub key_name: String,
    pub publication: Option<u32>,
    pub policies: Vec<String>,
    pub approval: ApprovalBasis,
    pub evidence: EvidenceClass,
    /// What served the tool (records written before upstreams existed were all native).
    #[serde(default)]
    pub route: crate::catalog::RouteKind,
    /// A capability call's routing decision (`tool` is then the capability, `connection` the
    /// provider's). A retry or resume of the slot is sent on this route, never another.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capability: Option<crate::capability::router::Decision>,
    /// The client's W3C trace id, when its request carried a well-formed `traceparent`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace_id: Option<String>,
}

/// The approval a slot was held for. Kept after the hold ends: a slot once held is resent
/// only under a valid token for this approval.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeldFor {
    pub approval_id: ApprovalId,
    pub expires_at_ms: u64,
}

/// How a finished invocation ended, as the receipt and the retry rules see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OutcomeClass {
    Accepted,
    DefinitelyRejected,
    /// The vendor may or may not have acted. Never reported as success.
    Unknown,
}

/// A finished invocation, stored so a same-key replay returns exactly what the first call
/// returned.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StoredOutcome {
    pub class: OutcomeClass,
    pub vendor_status: Option<u16>,
    /// The MCP result (`Ok`) or the JSON-RPC error object (`Err`) the first call answered.
    pub response: Result<ResultJson, Value>,
}

/// A tool call's MCP result (`CallToolResult`) as JSON text. It is written out once, when the
/// call finishes: the claim record embeds these bytes and the answer sends them, so a result
/// is not serialised once for the store and again for the client. Stored as the JSON itself,
/// as records before it stored the parsed value, so records of both versions read alike.
#[derive(Debug, Clone, Serialize)]
#[serde(transparent)]
pub struct ResultJson(Box<serde_json::value::RawValue>);

impl<'de> Deserialize<'de> for ResultJson {
    /// Parsed and written out again: a record's state is a tagged enum, which serde reads
    /// through a buffer a raw value cannot be taken from. Only reads of finished records pay
    /// for it (replays, the console), never a call's own writes.
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Value::deserialize(deserializer).map(|value| ResultJson::of(&value))
    }
}

impl ResultJson {
    pub fn of(result: &impl Serialize) -> ResultJson {
        ResultJson(
            serde_json::value::to_raw_value(result)
                .expect("a result is JSON values and strings, which always serialise"),
        )
    }

    pub fn text(&self) -> &str {
        self.0.get()
    }

    /// The result parsed, for the rare reader that changes it (a replay marks itself).
    pub fn to_value(&self) -> Value {
        serde_json::from_str(self.text()).expect("a result is stored as the JSON it was")
    }

    pub fn into_string(self) -> String {
        Box::<str>::from(self.0).into_string()
    }
}

impl PartialEq for ResultJson {
    fn eq(&self, other: &ResultJson) -> bool {
        self.text() == other.text()
    }
}

/// A part of a claim record that its transitions carry unchanged (its pin, its holder), with
/// its JSON kept from the first time it is written. A call writes its record when it claims
/// and again when it finalizes; these two parts hold most of its strings, which serde_json
/// escaped anew each time. Read only through `Deref`: it cannot change under its JSON.
#[derive(Clone)]
pub struct Rendered<T> {
    value: T,
    json: std::sync::OnceLock<Box<serde_json::value::RawValue>>,
}

impl<T> Rendered<T> {
    pub fn new(value: T) -> Rendered<T> {
        Rendered {
            value,
            json: std::sync::OnceLock::new(),
        }
    }
}

impl<T> std::ops::Deref for Rendered<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.value
    }
}

impl<T: std::fmt::Debug> std::fmt::Debug for Rendered<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.value.fmt(f)
    }
}

impl<T: PartialEq> PartialEq for Rendered<T> {
    fn eq(&self, other: &Rendered<T>) -> bool {
        self.value == other.value
    }
}

impl<T: Eq> Eq for Rendered<T> {}

impl<T: Serialize> Serialize for Rendered<T> {
    /// The same bytes as the value's own serialisation in serde_json's compact form, which
    /// renders a nested value alike whether it writes it alone or inside the record: every
    /// store writes records so. A pretty printer would get these parts compact, and a format
    /// other than JSON is not supported (`to_value` reads the kept text back).
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let json = match self.json.get() {
            Some(json) => json,
            None => {
                let json = serde_json::value::to_raw_value(&self.value)
                    .map_err(serde::ser::Error::custom)?;
                self.json.get_or_init(|| json)
            }
        };
        json.serialize(serializer)
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Rendered<T> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        T::deserialize(deserializer).map(Rendered::new)
    }
}

/// Where a claim is in its life.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum ClaimState {
    /// Nothing is in flight; every attempt counted so far was settled. A released slot (its
    /// last attempt provably never left) is `Claimed` with its lease ended.
    Claimed,
    /// Held for a human's decision: nothing is reserved or sent. Only a valid token for
    /// `approval_id` moves it on; it outlives the ticket, so a late resume finds the slot.
    AwaitingApproval {
        approval_id: ApprovalId,
        expires_at_ms: u64,
    },
    /// Attempt number [`ClaimRecord::attempts`] is durably reserved and may be on the wire
    /// until the lease ends. `prior` is the outcome a redispatch replaces, restored if the
    /// attempt provably never left. (Records written before 0.2 also name the attempt here;
    /// it is ignored on read, the count is the record's.)
    Reserved {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        prior: Option<Box<StoredOutcome>>,
    },
    Finalized {
        outcome: StoredOutcome,
    },
}

/// One claim, as stored. Its first three fields are its [`RecordHead`], in the order that
/// lets [`RecordHead::read`] take them off the front of the stored JSON: serde writes fields
/// in declaration order and an internally tagged enum's tag before its fields.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClaimRecord {
    /// Incremented by every transition; the compare in compare-and-set.
    pub version: u64,
    /// Until when the holder's lease runs (ms since the epoch). A `Reserved` record past its
    /// lease belongs to a holder that died.
    pub lease_until_ms: u64,
    pub state: ClaimState,
    pub pin: Rendered<Pin>,
    /// Attempts reserved and not released; equals the requests that may have reached the
    /// vendor (ADR-0031).
    pub attempts: u32,
    pub receipt_id: String,
    /// Whether the client supplied the key (else the gateway minted it).
    pub key_supplied: bool,
    pub created_at_ms: u64,
    /// The facts of the call holding the slot. `None` on records written before 0.2.
    #[serde(default)]
    pub holder: Option<Rendered<Holder>>,
    /// The approval this slot was held for, if it ever was.
    #[serde(default)]
    pub held_for: Option<HeldFor>,
}

/// What a fresh claim starts as.
#[derive(Debug, Clone)]
pub enum Opening {
    /// Attempt 1 is reserved in the same write that claims the slot.
    Reserved { lease_until_ms: u64 },
    /// Held for approval: nothing reserved; the slot lives as long as the ticket.
    Held(HeldFor),
}

/// What a compare-and-set reads of the record it replaces: the version it compares, whether
/// the record is final and the lease its retention counts from. The rest (the stored answer
/// above all) is skipped, not built: the writer does this once per transition, compaction
/// once per claim it removes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub(crate) struct RecordHead {
    pub version: u64,
    #[serde(deserialize_with = "state_tag")]
    state: StateName,
    pub lease_until_ms: u64,
}

/// `ClaimState`'s tag alone, read as a name (a string), as the tag of the whole record is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(variant_identifier, rename_all = "snake_case")]
enum StateName {
    Claimed,
    AwaitingApproval,
    Reserved,
    Finalized,
}

/// Reads the `state` tag of a `ClaimState` map and skips its other fields unbuilt. Derived
/// internally tagged reading would first copy the whole map into an owned tree, and a
/// finalized record's map holds its stored answer: compaction reads one per claim it removes.
fn state_tag<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<StateName, D::Error> {
    use serde::de::{Error, IgnoredAny, MapAccess, Visitor};

    #[derive(Deserialize)]
    #[serde(field_identifier, rename_all = "snake_case")]
    enum Field {
        State,
        #[serde(other)]
        Other,
    }

    struct Tag;

    impl<'de> Visitor<'de> for Tag {
        type Value = StateName;

        fn expecting(&self, formatter: &mut std::fmt::Formatter) -> std::fmt::Result {
            formatter.write_str("a claim state: a map with a `state` tag")
        }

        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<StateName, A::Error> {
            let mut tag = None;
            while let Some(field) = map.next_key::<Field>()? {
                match field {
                    Field::State if tag.is_some() => {
                        return Err(A::Error::duplicate_field("state"));
                    }
                    Field::State => tag = Some(map.next_value::<StateName>()?),
                    Field::Other => {
                        map.next_value::<IgnoredAny>()?;
                    }
                }
            }
            tag.ok_or_else(|| A::Error::missing_field("state"))
        }
    }

    deserializer.deserialize_map(Tag)
}

impl RecordHead {
    /// The head of a stored record. A record written in [`ClaimRecord`]'s field order starts
    /// `{"version":V,"lease_until_ms":L,"state":{"state":"T"`, read here without scanning the
    /// rest (a parse skipping the holder, the pin and any stored answer was about a fiftieth
    /// of a call's instructions); any other record, one written before that order above all,
    /// is parsed whole. Only the front is read: a record damaged after it reads as its front
    /// says, and the reads that build the whole record still refuse it.
    pub fn read(stored: &[u8]) -> Result<RecordHead, serde_json::Error> {
        match RecordHead::in_front(stored) {
            Some(head) => Ok(head),
            None => serde_json::from_slice(stored),
        }
    }

    fn in_front(stored: &[u8]) -> Option<RecordHead> {
        let rest = stored.strip_prefix(br#"{"version":"#)?;
        let (version, rest) = leading_number(rest)?;
        let rest = rest.strip_prefix(br#","lease_until_ms":"#)?;
        let (lease_until_ms, rest) = leading_number(rest)?;
        let rest = rest.strip_prefix(br#","state":{"state":""#)?;
        let end = rest.iter().position(|&byte| byte == b'"')?;
        let state = match &rest[..end] {
            b"claimed" => StateName::Claimed,
            b"awaiting_approval" => StateName::AwaitingApproval,
            b"reserved" => StateName::Reserved,
            b"finalized" => StateName::Finalized,
            _ => return None,
        };
        matches!(rest.get(end + 1), Some(b',' | b'}')).then_some(RecordHead {
            version,
            state,
            lease_until_ms,
        })
    }

    pub fn is_finalized(&self) -> bool {
        self.state == StateName::Finalized
    }
}

/// A JSON number that starts `bytes` and fits a `u64`, as serde writes one (no sign, no
/// fraction, no leading zero), and what follows it.
fn leading_number(bytes: &[u8]) -> Option<(u64, &[u8])> {
    let digits = bytes
        .iter()
        .take_while(|byte| byte.is_ascii_digit())
        .count();
    if digits == 0 || (digits > 1 && bytes[0] == b'0') {
        return None;
    }
    let number = std::str::from_utf8(&bytes[..digits]).ok()?.parse().ok()?;
    Some((number, &bytes[digits..]))
}

impl ClaimRecord {
    /// A record for a slot that does not exist yet.
    pub fn open(
        pin: Pin,
        holder: Holder,
        opening: Opening,
        receipt_id: String,
        key_source: KeySource,
        now_ms: u64,
    ) -> ClaimRecord {
        let (state, attempts, lease_until_ms, held_for) = match opening {
            Opening::Reserved { lease_until_ms } => (
                ClaimState::Reserved { prior: None },
                1,
                lease_until_ms,
                None,
            ),
            Opening::Held(held) => (
                ClaimState::AwaitingApproval {
                    approval_id: held.approval_id.clone(),
                    expires_at_ms: held.expires_at_ms,
                },
                0,
                held.expires_at_ms,
                Some(held),
            ),
        };
        ClaimRecord {
            version: 1,
            pin: Rendered::new(pin),
            state,
            attempts,
            lease_until_ms,
            receipt_id,
            key_supplied: key_source == KeySource::Supplied,
            created_at_ms: now_ms,
            holder: Some(Rendered::new(holder)),
            held_for,
        }
    }

    /// The one place a version moves: every transition below goes through here.
    fn next(&self, state: ClaimState) -> ClaimRecord {
        let mut next = self.clone();
        next.version += 1;
        next.state = state;
        next
    }

    /// Reserves one more attempt for `holder`; it may be on the wire until `lease_until_ms`.
    pub fn reserve_next(&self, holder: Holder, lease_until_ms: u64) -> ClaimRecord {
        let prior = match &self.state {
            ClaimState::Finalized { outcome } => Some(Box::new(outcome.clone())),
            ClaimState::Reserved { prior } => prior.clone(),
            ClaimState::Claimed | ClaimState::AwaitingApproval { .. } => None,
        };
        let mut next = self.next(ClaimState::Reserved { prior });
        next.attempts += 1;
        next.lease_until_ms = lease_until_ms;
        next.holder = Some(Rendered::new(holder));
        next
    }

    /// The reserved attempt provably never left: it is no longer counted, and the slot goes
    /// back to where it was before the reservation — the outcome a redispatch would have
    /// replaced, else its hold if it was ever held (only the token may move it on again), else
    /// a free slot whose lease has ended.
    pub fn release_unsent(&self, now_ms: u64) -> ClaimRecord {
        let prior = match &self.state {
            ClaimState::Reserved { prior } => prior.clone(),
            _ => None,
        };
        let (state, lease_until_ms) = match (prior, &self.held_for) {
            (Some(outcome), _) => (
                ClaimState::Finalized { outcome: *outcome },
                self.lease_until_ms,
            ),
            (None, Some(held)) => (
                ClaimState::AwaitingApproval {
                    approval_id: held.approval_id.clone(),
                    expires_at_ms: held.expires_at_ms,
                },
                held.expires_at_ms,
            ),
            (None, None) => (ClaimState::Claimed, now_ms),
        };
        let mut next = self.next(state);
        next.attempts = next.attempts.saturating_sub(1);
        next.lease_until_ms = lease_until_ms;
        next
    }

    /// The same attempt, reserved again with a fresh lease (the previous try provably never
    /// left, so nothing more is counted).
    pub fn renew(&self, lease_until_ms: u64) -> ClaimRecord {
        let mut next = self.next(self.state.clone());
        next.lease_until_ms = lease_until_ms;
        next
    }

    /// Holds a free slot for `holder`'s approval.
    pub fn hold(&self, holder: Holder, held: HeldFor) -> ClaimRecord {
        let mut next = self.next(ClaimState::AwaitingApproval {
            approval_id: held.approval_id.clone(),
            expires_at_ms: held.expires_at_ms,
        });
        next.lease_until_ms = held.expires_at_ms;
        next.holder = Some(Rendered::new(holder));
        next.held_for = Some(held);
        next
    }

    /// Records how the invocation ended. The attempt count stays what was reserved.
    pub fn finalize(&self, outcome: StoredOutcome) -> ClaimRecord {
        self.next(ClaimState::Finalized { outcome })
    }

    /// Records how the invocation ended when its last reserved attempt (the immediate retry)
    /// provably never left: the outcome is the earlier attempt's, and the unsent one is not
    /// counted. One write, so the slot is never seen free in between.
    pub fn finalize_withdrawing_unsent(&self, outcome: StoredOutcome) -> ClaimRecord {
        let mut next = self.finalize(outcome);
        next.attempts = next.attempts.saturating_sub(1);
        next
    }

    /// The approval the slot is or was held for.
    pub fn approval(&self) -> Option<HeldFor> {
        match &self.state {
            ClaimState::AwaitingApproval {
                approval_id,
                expires_at_ms,
            } => Some(HeldFor {
                approval_id: approval_id.clone(),
                expires_at_ms: *expires_at_ms,
            }),
            _ => self.held_for.clone(),
        }
    }

    /// When the reserved attempt's lease ends, if an attempt is reserved (what the stores
    /// index for the sweeper).
    pub fn reserved_lease(&self) -> Option<u64> {
        matches!(self.state, ClaimState::Reserved { .. }).then_some(self.lease_until_ms)
    }

    /// Whether a holder that reserved an attempt is presumed dead: its lease ended with the
    /// attempt still reserved.
    pub fn holder_died(&self, now_ms: u64) -> bool {
        matches!(self.state, ClaimState::Reserved { .. }) && self.lease_until_ms <= now_ms
    }
}

/// What [`super::Store::claim`] found.
#[derive(Debug, Clone, PartialEq)]
pub enum Claim {
    /// The record did not exist and is now ours, as given.
    Acquired,
    /// A record exists; the caller decides (replay, conflict, not ready, redispatch).
    Existing(Box<ClaimRecord>),
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The claim's pin and holder keep their JSON once written, and a transition carries it:
    /// the finalized record must read as the one written from scratch does, escapes and all.
    #[test]
    fn a_record_written_again_from_its_kept_parts_is_the_same_text() {
        let holder = Holder {
            workspace: "acme".into(),
            connection: "stripe-main".into(),
            tool: "stripe.create_refund".into(),
            idempotency_key: "idt_\"quoted\" \\ é \u{1}".into(),
            key_hash: "sha256:00".into(),
            key_name: "agent\nname".into(),
            publication: Some(7),
            policies: vec!["allow \"refunds\"".into(), "ops".into()],
            approval: ApprovalBasis::Waived,
            evidence: EvidenceClass::GatewayObserved,
            route: Default::default(),
            capability: None,
            trace_id: Some("0af7651916cd43dd8448eb211c80319c".into()),
        };
        let pin = Pin::new(
            RequestHash::of_arguments(&serde_json::json!({"charge": "ch_\"1"})),
            PinnedBinding::Header("idempotency-key".into()),
            "stripe-main stripe GET http://127.0.0.1:9 \"charges\"".into(),
        )
        .prepared_by("0.1.0");
        let claimed = ClaimRecord::open(
            pin,
            holder,
            Opening::Reserved { lease_until_ms: 5 },
            "rcp_1".into(),
            KeySource::Supplied,
            1,
        );
        let first = serde_json::to_string(&claimed).unwrap();
        let outcome = StoredOutcome {
            class: OutcomeClass::Accepted,
            vendor_status: Some(200),
            response: Ok(ResultJson::of(&serde_json::json!({"content": []}))),
        };
        // The kept path: the finalized record is a clone of the one just written.
        let kept = serde_json::to_string(&claimed.finalize(outcome.clone())).unwrap();
        // Written from scratch: the same record read back, nothing kept.
        let read: ClaimRecord = serde_json::from_str(&first).unwrap();
        assert_eq!(read, claimed);
        let fresh = serde_json::to_string(&read.finalize(outcome)).unwrap();
        assert_eq!(kept, fresh);
        // And as a tree of plain values writes it (no kept text on that path; the map keeps
        // the fields' order): what the derived serialisation wrote before the parts were kept.
        let plain = |text: &str| {
            serde_json::to_string(&serde_json::from_str::<Value>(text).unwrap()).unwrap()
        };
        assert_eq!(first, plain(&first));
        assert_eq!(kept, plain(&kept));
        assert!(kept.contains(r#""key_name":"agent\nname""#), "{kept}");
    }

    /// Records written by 0.1 (no holder, the attempt named in the state) still read.
    #[test]
    fn records_of_the_previous_release_read() {
        let old = r#"{"version":3,"pin":{"request_hash":"ab","binding":"header:idempotency-key","fingerprint":"f"},
            "state":{"state":"reserved","attempt":2},"attempts":2,"lease_until_ms":10,"receipt_id":"rcp_1",
            "key_supplied":true,"created_at_ms":1}"#;
        let record: ClaimRecord = serde_json::from_str(old).unwrap();
        assert_eq!(record.state, ClaimState::Reserved { prior: None });
        assert_eq!(record.attempts, 2);
        assert!(record.pin.binding.is_vendor_binding());
        assert!(record.holder.is_none());
        assert!(record.holder_died(10));
        let held = r#"{"version":1,"pin":{"request_hash":"ab","binding":"none","fingerprint":"f"},
            "state":{"state":"awaiting_approval","approval_id":"apr_00000000000000000000000000000001","expires_at_ms":99},
            "attempts":0,"lease_until_ms":99,"receipt_id":"rcp_1","key_supplied":false,"created_at_ms":1}"#;
        let record: ClaimRecord = serde_json::from_str(held).unwrap();
        assert_eq!(record.approval().unwrap().expires_at_ms, 99);
        assert_eq!(record.pin.binding, PinnedBinding::None);
    }

    /// A finished record, written and read back as every store does, answers a replay with
    /// the text its first call was answered with; and a record of the release before, which
    /// stored the result as a parsed value, reads the same.
    #[test]
    fn a_finished_record_keeps_its_results_text() {
        let result = serde_json::json!({
            "content": [{"type": "text", "text": "{\"id\":\"re_1\",\"amount\":1000}"}],
            "structuredContent": {"id": "re_1", "amount": 1000, "ratio": 0.1},
            "isError": false,
        });
        let finished = reserved().finalize(StoredOutcome {
            class: OutcomeClass::Accepted,
            vendor_status: Some(200),
            response: Ok(ResultJson::of(&result)),
        });
        let written = serde_json::to_string(&finished).unwrap();
        let read: ClaimRecord = serde_json::from_str(&written).unwrap();
        assert_eq!(read, finished);
        let ClaimState::Finalized { outcome } = &read.state else {
            panic!("{read:?}")
        };
        let text = outcome.response.as_ref().unwrap().text();
        assert_eq!(text, serde_json::to_string(&result).unwrap());
        assert_eq!(serde_json::from_str::<Value>(text).unwrap(), result);
        let earlier = written.replace(text, &serde_json::to_string_pretty(&result).unwrap());
        assert_ne!(earlier, written);
        let read: ClaimRecord = serde_json::from_str(&earlier).unwrap();
        assert_eq!(read, finished);
    }

    fn holder() -> Holder {
        Holder {
            workspace: "w".into(),
            connection: "c".into(),
            tool: "a.b".into(),
            idempotency_key: "idt_x".into(),
            key_hash: "sha256:00".into(),
            key_name: "k".into(),
            publication: None,
            policies: Vec::new(),
            approval: ApprovalBasis::NotRequired,
            evidence: EvidenceClass::GatewayObserved,
            route: Default::default(),
            capability: None,
            trace_id: None,
        }
    }

    fn pin() -> Pin {
        Pin {
            request_hash: "h".into(),
            binding: PinnedBinding::None,
            fingerprint: "f".into(),
            connector_version: None,
        }
    }

    #[test]
    fn an_old_pin_moves_its_connector_version_out_of_the_destination() {
        let old = r#"{"request_hash":"ab","binding":"none","fingerprint":"stripe stripe@0.1.0 POST http://127.0.0.1:9 charges.create"}"#;
        let pin: Pin = serde_json::from_str(old).unwrap();
        assert_eq!(
            pin.fingerprint,
            "stripe stripe POST http://127.0.0.1:9 charges.create"
        );
        assert_eq!(pin.connector_version.as_deref(), Some("0.1.0"));
        let capability = r#"{"request_hash":"ab","binding":"none","fingerprint":"cap.pay.charge stripe mapped:cd stripe stripe@2.0.0-rc.1 POST https://api.example charges.create"}"#;
        let pin: Pin = serde_json::from_str(capability).unwrap();
        assert_eq!(
            (pin.fingerprint.as_str(), pin.connector_version.as_deref()),
            (
                "cap.pay.charge stripe mapped:cd stripe stripe POST https://api.example charges.create",
                Some("2.0.0-rc.1")
            )
        );
        // Upstream and gateway destinations never carried a version; an `@` elsewhere stays.
        for unchanged in [
            "notion mcp http://127.0.0.1:9 search@v2",
            "gateway search_tools for abc",
        ] {
            let stored =
                format!(r#"{{"request_hash":"ab","binding":"none","fingerprint":"{unchanged}"}}"#);
            let pin: Pin = serde_json::from_str(&stored).unwrap();
            assert_eq!(
                (pin.fingerprint.as_str(), pin.connector_version),
                (unchanged, None)
            );
        }
        // An approval token's destination from before this format names the same destination.
        assert_eq!(
            destination_of("stripe stripe@0.1.0 POST http://127.0.0.1:9 charges.create"),
            "stripe stripe POST http://127.0.0.1:9 charges.create"
        );
        assert_eq!(
            destination_of("gateway search_tools for abc"),
            "gateway search_tools for abc"
        );
        // And a new pin reads back as written.
        let new = Pin::new(
            RequestHash::of_arguments(&serde_json::json!({})),
            PinnedBinding::None,
            "a b@c POST http://x t".into(),
        )
        .prepared_by("1.0.0");
        let again: Pin = serde_json::from_str(&serde_json::to_string(&new).unwrap()).unwrap();
        assert_eq!(again, new);
    }

    /// A fresh claim with attempt 1 reserved until 5.
    fn reserved() -> ClaimRecord {
        ClaimRecord::open(
            pin(),
            holder(),
            Opening::Reserved { lease_until_ms: 5 },
            "rcp".into(),
            KeySource::Supplied,
            0,
        )
    }

    #[test]
    fn attempts_count_what_may_have_left() {
        let fresh = reserved();
        assert_eq!((fresh.version, fresh.attempts), (1, 1));
        let retry = fresh.reserve_next(holder(), 9);
        assert_eq!((retry.version, retry.attempts), (2, 2));
        let released = retry.release_unsent(7);
        assert_eq!((released.version, released.attempts), (3, 1));
        assert_eq!(released.state, ClaimState::Claimed);
        assert_eq!(released.lease_until_ms, 7);
        let renewed = fresh.renew(20);
        assert_eq!((renewed.attempts, renewed.lease_until_ms), (1, 20));
    }

    #[test]
    fn a_held_slot_returns_to_its_hold_and_remembers_it() {
        let held = HeldFor {
            approval_id: ApprovalId::mint(),
            expires_at_ms: 1000,
        };
        let fresh = ClaimRecord::open(
            pin(),
            holder(),
            Opening::Held(held.clone()),
            "rcp".into(),
            KeySource::Minted,
            0,
        );
        assert_eq!(fresh.attempts, 0);
        let resumed = fresh.reserve_next(holder(), 50);
        assert_eq!(resumed.attempts, 1);
        let back = resumed.release_unsent(10);
        assert_eq!(back.attempts, 0);
        assert_eq!(back.approval(), Some(held.clone()));
        assert!(matches!(back.state, ClaimState::AwaitingApproval { .. }));
        let done = resumed.finalize(StoredOutcome {
            class: OutcomeClass::Unknown,
            vendor_status: None,
            response: Err(Value::Null),
        });
        assert_eq!(done.approval(), Some(held.clone()));
        // A redispatch that never left restores the outcome it would have replaced.
        let again = done.reserve_next(holder(), 70);
        assert_eq!(again.attempts, 2);
        let restored = again.release_unsent(80);
        assert_eq!(restored.state, done.state);
        assert_eq!(restored.attempts, 1);
        let withdrawn = again.finalize_withdrawing_unsent(StoredOutcome {
            class: OutcomeClass::Accepted,
            vendor_status: Some(200),
            response: Ok(ResultJson::of(&Value::Null)),
        });
        assert_eq!(withdrawn.attempts, 1);
    }

    /// The head a transition reads says what the whole record says, in every state and in
    /// the previous release's format.
    #[test]
    fn a_records_head_reads_what_the_whole_record_says() {
        let fresh = reserved();
        let finalized = fresh.finalize(StoredOutcome {
            class: OutcomeClass::Accepted,
            vendor_status: Some(200),
            response: Ok(ResultJson::of(
                &serde_json::json!({"content": [{"type": "text", "text": "ok"}]}),
            )),
        });
        let held = ClaimRecord::open(
            pin(),
            holder(),
            Opening::Held(HeldFor {
                approval_id: ApprovalId::mint(),
                expires_at_ms: 1000,
            }),
            "rcp".into(),
            KeySource::Minted,
            0,
        );
        let mut bytes: Vec<Vec<u8>> = [
            fresh.clone(),
            fresh.release_unsent(7),
            finalized.clone(),
            finalized.reserve_next(holder(), 90),
            held,
        ]
        .iter()
        .map(|record| serde_json::to_vec(record).unwrap())
        .collect();
        bytes.push(
            br#"{"version":3,"pin":{"request_hash":"ab","binding":"none","fingerprint":"f"},
            "state":{"state":"reserved","attempt":2},"attempts":2,"lease_until_ms":10,
            "receipt_id":"rcp_1","key_supplied":true,"created_at_ms":1}"#
                .to_vec(),
        );
        // The tag after the state's other fields, an answer with nested maps and escapes.
        bytes.push(
            br#"{"version":4,"pin":{"request_hash":"ab","binding":"none","fingerprint":"f"},
            "state":{"outcome":{"class":"accepted","vendor_status":200,"response":{"Ok":
            {"content":[{"type":"text","text":"a \"state\": {\"state\":\"x\"}"}],
            "state":{"state":"claimed"}}}},"state":"finalized"},"attempts":1,
            "lease_until_ms":11,"receipt_id":"rcp_2","key_supplied":false,"created_at_ms":1}"#
                .to_vec(),
        );
        for (n, stored) in bytes.iter().enumerate() {
            let whole: ClaimRecord = serde_json::from_slice(stored).unwrap();
            let head: RecordHead = serde_json::from_slice(stored).unwrap();
            assert_eq!(
                (head.version, head.is_finalized(), head.lease_until_ms),
                (
                    whole.version,
                    matches!(whole.state, ClaimState::Finalized { .. }),
                    whole.lease_until_ms
                ),
                "{}",
                String::from_utf8_lossy(stored)
            );
            assert_eq!(RecordHead::read(stored).unwrap(), head);
            // Records written now are read off the front; the two in the old order are not.
            assert_eq!(
                RecordHead::in_front(stored).is_some(),
                n < 5,
                "{}",
                String::from_utf8_lossy(stored)
            );
        }
    }

    /// The head read off a written record's front is the head a JSON parser reads of it, for
    /// any version and lease, every state, and answers whose text looks like a record's.
    #[test]
    fn a_head_read_off_the_front_is_the_parsed_head() {
        use proptest::prelude::*;
        let text = proptest::string::string_regex(r#"[a-z"\\{}:,]{0,12}"#).unwrap();
        let state = (0..4u8, text).prop_map(|(which, text)| {
            let outcome = StoredOutcome {
                class: OutcomeClass::Accepted,
                vendor_status: Some(200),
                response: Ok(ResultJson::of(&serde_json::json!({
                    "content": [{"type": "text", "text": text}],
                    "state": {"state": "claimed"},
                }))),
            };
            match which {
                0 => ClaimState::Claimed,
                1 => ClaimState::AwaitingApproval {
                    approval_id: ApprovalId::mint(),
                    expires_at_ms: 5,
                },
                2 => ClaimState::Reserved {
                    prior: Some(Box::new(outcome)),
                },
                _ => ClaimState::Finalized { outcome },
            }
        });
        proptest!(|(version in any::<u64>(), lease in any::<u64>(), state in state)| {
            let mut record = reserved();
            record.version = version;
            record.lease_until_ms = lease;
            record.state = state;
            let stored = serde_json::to_vec(&record).unwrap();
            let parsed: RecordHead = serde_json::from_slice(&stored).unwrap();
            prop_assert_eq!(RecordHead::in_front(&stored), Some(parsed));
        });
    }

    #[test]
    fn a_records_head_refuses_a_state_without_one_tag() {
        let record = |state: &str| {
            format!(r#"{{"version":1,"pin":{{}},"state":{state},"attempts":1,"lease_until_ms":1}}"#)
        };
        for state in [
            r#"{"prior":null}"#,
            r#"{"state":"reserved","state":"finalized"}"#,
            r#"{"state":"resting"}"#,
            r#""finalized""#,
        ] {
            let read = serde_json::from_str::<RecordHead>(&record(state));
            assert!(read.is_err(), "{state} read as {read:?}");
            let read = RecordHead::read(record(state).as_bytes());
            assert!(read.is_err(), "{state} read as {read:?}");
            let whole = serde_json::from_str::<ClaimState>(state);
            assert!(
                whole.is_err(),
                "the whole record reads {state} as {whole:?}"
            );
        }
    }
}
