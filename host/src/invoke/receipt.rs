//! Receipts: what one invocation did, written in the same acknowledged write as its outcome.

use super::Call;
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
        created_at_ms: record.created_at_ms,
        finalized_at_ms: now_ms(),
    }
}
