//! Approvals: a destructive production call happens only after a human said yes to that exact
//! call (`docs/approvals.md`, ADR-0006).
//!
//! ```text
//! tools/call ─▶ policy says "approval required" ─▶ claim the slot AwaitingApproval
//!   ─▶ write a Ticket (24 h) ─▶ -32003 {approval_id, tool, expires_at, inbox_url}
//! owner ─▶ /inbox (owner token, CSRF-checked form) ─▶ Approve | Deny
//! agent ─▶ GET /v1/approvals/{id} (its own key) ─▶ signed token (ed25519, key id)
//! agent ─▶ the same tools/call + Obol-Approval-Id + Obol-Approval-Token
//!   ─▶ token verified before MCP ─▶ bound to the held claim inside the lifecycle ─▶ dispatch once
//! ```
//!
//! The ticket carries the idempotency key, the request hash and the resolved destination the
//! call was held under, so a token can only resume that call, in that slot.
//!
//! This module owns the artefacts: tickets, tokens, owner tokens, the redacted summary, and
//! how a ticket becomes the -32003 notice. The pages and routes that show and hand them out
//! are HTTP's ([`crate::http::inbox`], [`crate::http`]); the lifecycle holds and resumes
//! ([`crate::invoke`]).

pub mod token;

use std::collections::HashMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::ApprovalNotice;
use crate::policy::KeyHash;

pub use token::{ApprovalGrant, Keyring, TokenError};

/// What the gateway keeps for approvals besides the store.
#[derive(Debug)]
pub struct ApprovalDesk {
    pub keyring: std::sync::Arc<Keyring>,
    pub owners: Owners,
    /// The gateway's address as a browser reaches it.
    pub public_url: String,
}

/// Which workspace an owner token opens: the owner signs in to the inbox with it and reads
/// every receipt of the workspace with it. Tokens are known by their hash only, like keys.
#[derive(Debug, Default)]
pub struct Owners {
    by_hash: HashMap<KeyHash, String>,
}

impl Owners {
    pub fn new(owners: impl IntoIterator<Item = (KeyHash, String)>) -> Owners {
        Owners {
            by_hash: owners.into_iter().collect(),
        }
    }

    /// The workspace whose owner token this is.
    pub fn workspace(&self, token: &str) -> Option<&str> {
        self.by_hash
            .get(&KeyHash::of_token(token))
            .map(String::as_str)
    }

    /// What an owner session of `workspace` carries of the owner's credential: a digest of
    /// its hash (never the hash itself), so the session dies when the credential changes or
    /// the workspace loses its owner. `None` when the workspace has no owner here.
    pub fn session_digest(&self, workspace: &str) -> Option<String> {
        use sha2::Digest;
        let (hash, _) = self.by_hash.iter().find(|(_, w)| *w == workspace)?;
        let digest = sha2::Sha256::digest(format!("obol owner session\0{hash}").as_bytes());
        Some(hex::encode(&digest[..16]))
    }
}

/// How long a ticket (and a token issued for it) stays valid. The spec's ceiling.
pub const TICKET_TTL: Duration = Duration::from_secs(24 * 3600);

/// The request headers a resumed call carries.
pub const APPROVAL_ID_HEADER: &str = "obol-approval-id";
pub const APPROVAL_TOKEN_HEADER: &str = "obol-approval-token";

/// `apr_` and 128 random bits.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ApprovalId(String);

impl ApprovalId {
    pub fn mint() -> ApprovalId {
        let mut bytes = [0u8; 16];
        getrandom::fill(&mut bytes).expect("the OS random source is available");
        ApprovalId(format!("apr_{}", hex::encode(bytes)))
    }

    pub fn parse(text: &str) -> Option<ApprovalId> {
        let body = text.strip_prefix("apr_")?;
        (body.len() == 32 && body.bytes().all(|b| b.is_ascii_hexdigit()))
            .then(|| ApprovalId(text.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for ApprovalId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// What the owner decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum TicketStatus {
    Pending,
    Approved { at_ms: u64 },
    Denied { at_ms: u64 },
}

/// The owner's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Decision {
    Approved,
    Denied,
}

/// A held call, as the owner sees it and the resume checks it. Holds no secret and no
/// argument value beyond the redacted summary.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Ticket {
    pub id: ApprovalId,
    pub workspace: String,
    pub key_name: String,
    /// The `sha256:` form of the key that made the call: only that key may fetch its token.
    pub key_hash: String,
    pub tool: String,
    pub connection: String,
    /// The claim slot the call holds (`ClaimKey::slot`), so a decision can settle it.
    pub idempotency_key: String,
    pub request_hash: String,
    /// The resolved destination (the claim's dispatch fingerprint).
    pub destination: String,
    pub summary: Vec<String>,
    /// The publication and policies that held the call, for the receipt of a denied call.
    pub policy_publication: Option<u32>,
    pub policies: Vec<String>,
    pub created_at_ms: u64,
    pub expires_at_ms: u64,
    pub status: TicketStatus,
    /// A capability call: `tool` is the capability, and this says which provider it resolved
    /// to (the approver sees both; the token is for this provider only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capability: Option<crate::capability::router::Decision>,
}

impl Ticket {
    pub fn expired(&self, now_ms: u64) -> bool {
        now_ms >= self.expires_at_ms
    }
}

/// What [`crate::store::Store::decide_ticket`] did.
#[derive(Debug, Clone, PartialEq)]
pub enum Decided {
    Now(Box<Ticket>),
    Already(Box<Ticket>),
    Missing,
}

impl ApprovalNotice {
    /// The notice for a held call's ticket. (The struct is [`crate::error`]'s: it is part of
    /// the -32003 error's data; this module knows how a ticket becomes one.)
    pub fn of(ticket: &Ticket, inbox_base: &str) -> crate::error::ApprovalNotice {
        crate::error::ApprovalNotice {
            approval_id: ticket.id.to_string(),
            tool: ticket.tool.clone(),
            provider: ticket.capability.as_ref().map(|d| d.provider.clone()),
            expires_at: rfc3339(ticket.expires_at_ms),
            inbox_url: format!("{}/inbox/{}", inbox_base.trim_end_matches('/'), ticket.id),
        }
    }
}

/// Argument names whose values are never shown, whatever their type: a PIN or a CVC is short
/// enough to be shown whole otherwise.
const SECRET_NAMES: [&str; 14] = [
    "pin", "cvc", "cvv", "otp", "password", "passwd", "secret", "token", "ssn", "card", "iban",
    "account", "code", "key",
];

/// One line per top-level argument for the approver: numbers and booleans as given (an
/// approver must see the amount), strings cut to their first four characters, nested values
/// by their size only, and nothing of a value whose name suggests a secret. Enough to
/// recognise the call, not enough to leak a whole value.
pub fn summarize(arguments: &Value) -> Vec<String> {
    let Value::Object(arguments) = arguments else {
        return Vec::new();
    };
    arguments
        .iter()
        .map(|(name, value)| {
            let lowered = name.to_ascii_lowercase();
            let secret = SECRET_NAMES.iter().any(|s| lowered.contains(s));
            let shown = match value {
                _ if secret => "(hidden)".to_owned(),
                Value::Null => "null".to_owned(),
                Value::Bool(b) => b.to_string(),
                Value::Number(n) => n.to_string(),
                Value::String(s) if s.chars().count() <= 4 => format!("{s:?}"),
                Value::String(s) => {
                    let head: String = s.chars().take(4).collect();
                    format!("\"{head}…\" ({} chars)", s.chars().count())
                }
                Value::Array(items) => format!("[{} items]", items.len()),
                Value::Object(fields) => format!("{{{} fields}}", fields.len()),
            };
            format!("{name} = {shown}")
        })
        .collect()
}

/// Milliseconds since the epoch as RFC 3339 (UTC, second precision).
pub fn rfc3339(ms: u64) -> String {
    let secs = ms / 1000;
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Civil date from days since 1970-01-01 (H. Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn rfc3339_matches_known_instants() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(951_782_400_000), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339(1_796_083_199_000), "2026-11-30T23:59:59Z");
    }

    #[test]
    fn summary_shows_amounts_and_hides_most_of_strings() {
        let lines = summarize(&json!({
            "charge": "ch_secretvalue",
            "amount": 500,
            "reason": "dup",
            "meta": {"a": 1},
            "pin": "1234",
            "card_cvc": 123,
        }));
        assert!(lines.contains(&"pin = (hidden)".to_owned()));
        assert!(lines.contains(&"card_cvc = (hidden)".to_owned()));
        assert!(lines.contains(&"amount = 500".to_owned()));
        assert!(lines.contains(&"charge = \"ch_s…\" (14 chars)".to_owned()));
        assert!(lines.contains(&"reason = \"dup\"".to_owned()));
        assert!(lines.contains(&"meta = {1 fields}".to_owned()));
        assert!(!lines.concat().contains("secretvalue"));
    }

    #[test]
    fn approval_ids_parse_only_their_own_shape() {
        let id = ApprovalId::mint();
        assert_eq!(ApprovalId::parse(id.as_str()), Some(id));
        assert_eq!(ApprovalId::parse("apr_xyz"), None);
        assert_eq!(
            ApprovalId::parse("rcp_00000000000000000000000000000000"),
            None
        );
    }
}
