//! Receipts: what one invocation did, written in the same acknowledged write as its outcome.
//! Every receipt of a claimed call is built from the facts its claim recorded (the holder),
//! so a settlement made by someone else still names the call that was made.

use crate::clock::now_ms;
use crate::policy::{Verdict, VirtualKey};
use crate::store::{
    ClaimKey, ClaimRecord, EvidenceClass, Holder, KeySource, OutcomeClass, Receipt, Verification,
};

/// `rcp_`, the time in milliseconds and 128 random bits: ids sort by when they were made.
pub fn new_id() -> String {
    crate::clock::time_ordered_id::<16>("rcp_")
}

/// How an invocation ended, as its receipt says.
#[derive(Debug, Clone, Copy)]
pub struct Ending<'a> {
    pub outcome: OutcomeClass,
    pub vendor_status: Option<u16>,
    /// What the gateway observed; [`verification`] lowers it for routes it cannot observe.
    pub observed: Verification,
    pub note: Option<&'a str>,
    /// The broker's record id, when the gateway read one from a federated call's answer.
    pub broker_record: Option<&'a str>,
}

/// What may be claimed of an outcome with this evidence: a federated route ran at a broker
/// the gateway did not observe, so whatever it answered can never be verified.
pub fn verification(evidence: EvidenceClass, observed: Verification) -> Verification {
    match evidence {
        EvidenceClass::GatewayObserved => observed,
        EvidenceClass::Untrusted | EvidenceClass::BrokerAttested => Verification::Unverifiable,
    }
}

/// The evidence of an ending: a federated call is `broker_attested` only when the gateway read
/// the broker's record id itself.
pub fn evidence(holder: EvidenceClass, broker_record: Option<&str>) -> EvidenceClass {
    match (holder, broker_record) {
        (EvidenceClass::Untrusted, Some(_)) => EvidenceClass::BrokerAttested,
        (evidence, _) => evidence,
    }
}

/// The receipt for `record` (the record as it is being finalized), held by `holder`.
pub fn build(key: &ClaimKey, record: &ClaimRecord, holder: &Holder, ending: Ending) -> Receipt {
    let evidence = evidence(holder.evidence, ending.broker_record);
    // A federated receipt says why it has the evidence it has.
    let note = ending.note.or(match evidence {
        EvidenceClass::BrokerAttested => Some(
            "broker_attested: the gateway read the broker's record id from its answer; what the broker reports of the vendor is not verified",
        ),
        EvidenceClass::Untrusted => Some(
            "untrusted: the call ran at a broker, and the gateway read no broker record of it",
        ),
        EvidenceClass::GatewayObserved => None,
    });
    Receipt {
        id: record.receipt_id.clone(),
        workspace: key.workspace.clone(),
        idempotency_key: key.key.to_string(),
        key_source: if record.key_supplied {
            KeySource::Supplied
        } else {
            KeySource::Minted
        },
        tool: key.tool.clone(),
        connection: holder.connection.clone(),
        request_hash: record.pin.request_hash.clone(),
        fingerprint: record.pin.fingerprint.clone(),
        connector_version: record.pin.connector_version.clone(),
        attempt_count: record.attempts,
        outcome: ending.outcome,
        vendor_status: ending.vendor_status,
        route: holder.route,
        evidence,
        broker_record_id: ending.broker_record.map(str::to_owned),
        verification: verification(evidence, ending.observed),
        note: note.map(str::to_owned),
        policy_publication: holder.publication,
        matched_policies: holder.policies.clone(),
        approval_id: record.approval().map(|held| held.approval_id.to_string()),
        key_name: Some(holder.key_name.clone()),
        refusal: false,
        capability: holder.capability.clone(),
        trace_id: holder.trace_id.clone(),
        created_at_ms: record.created_at_ms,
        finalized_at_ms: now_ms(),
    }
}

/// The receipt of a call refused as `Unknown tool`: the real reason, for the owner only.
pub fn refused(
    key: &VirtualKey,
    tool: &str,
    connection: Option<&str>,
    arguments: &serde_json::Value,
    reason: String,
    verdict: Option<&Verdict>,
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
        connector_version: None,
        attempt_count: 0,
        outcome: OutcomeClass::DefinitelyRejected,
        vendor_status: None,
        route: Default::default(),
        evidence: EvidenceClass::GatewayObserved,
        broker_record_id: None,
        verification: Verification::Verified,
        note: Some(reason),
        policy_publication: verdict.and_then(|v| v.publication),
        matched_policies: verdict.map(|v| v.policies.clone()).unwrap_or_default(),
        approval_id: None,
        key_name: Some(key.name.clone()),
        refusal: true,
        capability: None,
        trace_id: None,
        created_at_ms: now,
        finalized_at_ms: now,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Bug 12: whatever the gateway observed of a federated route's answer, it is never
    /// reported verified (the receipt and `_meta.obol.verification` both read this).
    #[test]
    fn a_federated_route_is_never_verified() {
        for observed in [
            Verification::Verified,
            Verification::Inconclusive,
            Verification::Unverifiable,
        ] {
            assert_eq!(
                verification(EvidenceClass::Untrusted, observed),
                Verification::Unverifiable
            );
            assert_eq!(
                verification(EvidenceClass::GatewayObserved, observed),
                observed
            );
        }
    }
}
