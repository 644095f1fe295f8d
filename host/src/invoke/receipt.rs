//! Receipts: what one invocation did, written in the same acknowledged write as its outcome.

use super::Call;
use crate::approvals::Ticket;
use crate::catalog::RouteKind;
use crate::store::{
    ClaimRecord, EvidenceClass, KeySource, OutcomeClass, Receipt, Verification, now_ms,
};

/// `rcp_` and 128 random bits.
pub fn new_id() -> String {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes).expect("the OS random source is available");
    format!("rcp_{}", hex::encode(bytes))
}

/// The receipt for `record` as it is being finalized.
pub fn build(
    call: &Call,
    record: &ClaimRecord,
    outcome: OutcomeClass,
    vendor_status: Option<u16>,
    verification: Verification,
    note: Option<&str>,
) -> Receipt {
    // A federated route ran at a broker the gateway did not observe: whatever it answered,
    // its receipt can never be verified.
    let (evidence, verification) = match call.route.tool().effect.route {
        RouteKind::Native => (EvidenceClass::GatewayObserved, verification),
        RouteKind::Federated => (EvidenceClass::Untrusted, Verification::Unverifiable),
    };
    Receipt {
        id: record.receipt_id.clone(),
        workspace: call.claim_key.workspace.clone(),
        idempotency_key: call.claim_key.key.to_string(),
        key_source: if record.key_supplied {
            KeySource::Supplied
        } else {
            KeySource::Minted
        },
        tool: call.claim_key.tool.clone(),
        connection: call.route.connection.id.clone(),
        request_hash: record.pin.request_hash.clone(),
        fingerprint: record.pin.fingerprint.clone(),
        attempt_count: record.attempts,
        outcome,
        vendor_status,
        evidence,
        verification,
        note: note.map(str::to_owned),
        policy_publication: call.verdict.publication,
        matched_policies: call.verdict.policies.clone(),
        approval_id: call.approval.as_ref().map(|g| g.approval_id.to_string()),
        key_name: Some(call.key_name.clone()),
        refusal: false,
        created_at_ms: record.created_at_ms,
        finalized_at_ms: now_ms(),
    }
}

/// The receipt of a held call that ended without being sent (denied or expired).
pub fn held(ticket: &Ticket, record: &ClaimRecord, note: &str) -> Receipt {
    Receipt {
        id: record.receipt_id.clone(),
        workspace: ticket.workspace.clone(),
        idempotency_key: ticket.idempotency_key.clone(),
        key_source: if record.key_supplied {
            KeySource::Supplied
        } else {
            KeySource::Minted
        },
        tool: ticket.tool.clone(),
        connection: ticket.connection.clone(),
        request_hash: record.pin.request_hash.clone(),
        fingerprint: record.pin.fingerprint.clone(),
        attempt_count: 0,
        outcome: OutcomeClass::DefinitelyRejected,
        vendor_status: None,
        // The gateway knows first-hand that nothing left it.
        evidence: EvidenceClass::GatewayObserved,
        verification: Verification::Verified,
        note: Some(note.to_owned()),
        policy_publication: ticket.policy_publication,
        matched_policies: ticket.policies.clone(),
        approval_id: Some(ticket.id.to_string()),
        key_name: Some(ticket.key_name.clone()),
        refusal: false,
        created_at_ms: record.created_at_ms,
        finalized_at_ms: now_ms(),
    }
}

/// The receipt of a call refused as `Unknown tool`: the real reason, for the owner only.
pub fn refused(
    key: &crate::policy::VirtualKey,
    tool: &str,
    connection: Option<&str>,
    arguments: &serde_json::Value,
    reason: String,
    verdict: Option<&crate::policy::Verdict>,
) -> Receipt {
    let now = now_ms();
    Receipt {
        id: new_id(),
        workspace: key.workspace.clone(),
        idempotency_key: String::new(),
        key_source: KeySource::Minted,
        tool: tool.to_owned(),
        connection: connection.unwrap_or_default().to_owned(),
        request_hash: crate::idempotency::RequestHash::of_arguments(arguments).to_string(),
        fingerprint: String::new(),
        attempt_count: 0,
        outcome: OutcomeClass::DefinitelyRejected,
        vendor_status: None,
        evidence: EvidenceClass::GatewayObserved,
        verification: Verification::Verified,
        note: Some(reason),
        policy_publication: verdict.and_then(|v| v.publication),
        matched_policies: verdict.map(|v| v.policies.clone()).unwrap_or_default(),
        approval_id: None,
        key_name: Some(key.name.clone()),
        refusal: true,
        created_at_ms: now,
        finalized_at_ms: now,
    }
}
