//! Settle: the one way a slot that will never dispatch again is ended — a holder presumed
//! dead (its lease ended with an attempt reserved), a hold the owner denied, a hold whose
//! approval expired. Whoever notices (the claim phase, the inbox, the sweeper) settles it
//! here, with a receipt built from the facts the claim recorded, never the noticer's.

use super::receipt::{self, Ending};
use crate::approvals::{Ticket, TicketStatus};
use crate::clock::now_ms;
use crate::error::ObolError;
use crate::idempotency::IdempotencyKey;
use crate::store::{
    ApprovalBasis, ClaimKey, ClaimRecord, ClaimState, ConnectionSegment, EvidenceClass, Holder,
    OutcomeClass, Store, StoredOutcome, Verification,
};

/// Why a slot is being ended without another attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settlement {
    /// The holder's lease ended with an attempt reserved: it may have left, so the outcome is
    /// unknown.
    DeadHolder,
    /// The owner denied the held call: nothing was sent.
    Denied,
    /// The approval expired before the call resumed: nothing was sent.
    Expired,
}

impl Settlement {
    /// Whether `record` is in the state this settlement ends.
    fn applies_to(self, record: &ClaimRecord, now_ms: u64) -> bool {
        match self {
            Settlement::DeadHolder => record.holder_died(now_ms),
            Settlement::Denied | Settlement::Expired => {
                matches!(record.state, ClaimState::AwaitingApproval { .. })
            }
        }
    }

    /// What this and every later call under the key answer.
    pub fn error(self) -> ObolError {
        match self {
            Settlement::DeadHolder => ObolError::UpstreamTimeout,
            Settlement::Denied => ObolError::ApprovalDenied,
            Settlement::Expired => ObolError::ApprovalExpired,
        }
    }

    fn ending(self) -> Ending<'static> {
        match self {
            Settlement::DeadHolder => Ending {
                outcome: OutcomeClass::Unknown,
                vendor_status: None,
                observed: Verification::Inconclusive,
                note: Some("the gateway holding this call stopped before recording its outcome"),
                broker_record: None,
            },
            // The gateway knows first-hand that nothing left it.
            Settlement::Denied => Ending {
                outcome: OutcomeClass::DefinitelyRejected,
                vendor_status: None,
                observed: Verification::Verified,
                note: Some("the workspace owner denied the call; nothing was sent"),
                broker_record: None,
            },
            Settlement::Expired => Ending {
                outcome: OutcomeClass::DefinitelyRejected,
                vendor_status: None,
                observed: Verification::Verified,
                note: Some("the approval expired before the call resumed; nothing was sent"),
                broker_record: None,
            },
        }
    }
}

/// Ends `record` as `why` says, with its receipt, in one compare-and-set. `fallback` names the
/// call for records written before claims recorded their holder. Returns the settled record.
pub async fn settle(
    store: &Store,
    key: &ClaimKey,
    record: &ClaimRecord,
    why: Settlement,
    fallback: Option<&Holder>,
) -> Result<ClaimRecord, ObolError> {
    if !why.applies_to(record, now_ms()) {
        return Err(ObolError::NotReady);
    }
    let Some(holder) = record.holder.as_deref().or(fallback) else {
        return Err(ObolError::NotReady);
    };
    let settled = record.finalize(StoredOutcome {
        class: why.ending().outcome,
        vendor_status: None,
        response: Err(why.error().to_jsonrpc_error()),
    });
    let receipt = receipt::build(key, &settled, holder, why.ending());
    match store.finalize(key, record, &settled, &receipt).await {
        Ok(true) => {
            tracing::info!(receipt = %receipt.id, tool = %key.tool, ?why, "settled a slot");
            Ok(settled)
        }
        // Someone else moved it on first; they answer for it.
        Ok(false) => Err(ObolError::NotReady),
        Err(error) => {
            tracing::warn!(receipt = %receipt.id, "could not settle a slot: {error}");
            Err(ObolError::StoreUnavailable)
        }
    }
}

/// Settles the slot a ticket holds (the inbox's denial, an expiry noticed on a ticket).
/// Returns what the call under that key now answers.
pub async fn settle_ticket(store: &Store, ticket: &Ticket, why: Settlement) -> ObolError {
    let Ok(idempotency_key) = IdempotencyKey::parse(&ticket.idempotency_key) else {
        return ObolError::Internal;
    };
    let key = ClaimKey {
        workspace: ticket.workspace.clone(),
        connection: match ticket.capability {
            Some(_) => ConnectionSegment::Capability,
            None => ConnectionSegment::Resolved(ticket.connection.clone()),
        },
        tool: ticket.tool.clone(),
        key: idempotency_key,
    };
    let record = match store.get(&key).await {
        Ok(Some(record)) => record,
        Ok(None) => return ObolError::NotReady,
        Err(error) => {
            tracing::warn!(approval = %ticket.id, "could not read a held slot: {error}");
            return ObolError::StoreUnavailable;
        }
    };
    match &record.state {
        ClaimState::AwaitingApproval { approval_id, .. } if *approval_id == ticket.id => {}
        // Already settled (by the inbox, or a concurrent call): answer what was recorded.
        ClaimState::Finalized { outcome } => {
            return match &outcome.response {
                Err(stored) => ObolError::Replayed(stored.clone()),
                Ok(_) => ObolError::IdempotencyConflict,
            };
        }
        _ => return ObolError::NotReady,
    }
    match settle(store, &key, &record, why, Some(&holder_of(ticket))).await {
        Ok(_) => why.error(),
        Err(error) => error,
    }
}

/// The holder a ticket describes (for slots held before claims recorded their holder).
pub fn holder_of(ticket: &Ticket) -> Holder {
    Holder {
        workspace: ticket.workspace.clone(),
        connection: ticket.connection.clone(),
        tool: ticket.tool.clone(),
        idempotency_key: ticket.idempotency_key.clone(),
        key_hash: ticket.key_hash.clone(),
        key_name: ticket.key_name.clone(),
        publication: ticket.policy_publication,
        policies: ticket.policies.clone(),
        approval: ApprovalBasis::Required,
        evidence: EvidenceClass::GatewayObserved,
        route: Default::default(),
        capability: ticket.capability.clone(),
        trace_id: None,
    }
}

/// Whether a ticket's hold is over, and how.
pub fn ticket_ended(ticket: &Ticket) -> Option<Settlement> {
    match ticket.status {
        _ if ticket.expired(now_ms()) => Some(Settlement::Expired),
        TicketStatus::Denied { .. } => Some(Settlement::Denied),
        TicketStatus::Pending | TicketStatus::Approved { .. } => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::EmbeddedStore;

    /// A dead holder's record as 0.1 wrote it (no holder facts) is settled with the facts the
    /// settling call supplies, and its attempt count is kept.
    #[tokio::test]
    async fn a_record_of_the_previous_release_is_settled() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::Embedded(EmbeddedStore::open(&dir.path().join("s.redb")).unwrap());
        let old: ClaimRecord = serde_json::from_str(
            r#"{"version":3,"pin":{"request_hash":"ab","binding":"none","fingerprint":"f"},
            "state":{"state":"reserved","attempt":1},"attempts":1,"lease_until_ms":10,"receipt_id":"rcp_old0",
            "key_supplied":false,"created_at_ms":1}"#,
        )
        .unwrap();
        let key = ClaimKey {
            workspace: "acme".into(),
            connection: ConnectionSegment::Resolved("tracker".into()),
            tool: "tracker.issues.create".into(),
            key: IdempotencyKey::parse("idt_previous_release_0001").unwrap(),
        };
        store.claim(&key, &old).await.unwrap();
        // Without facts of its own or a caller's, nobody can write its receipt.
        assert_eq!(
            settle(&store, &key, &old, Settlement::DeadHolder, None).await,
            Err(ObolError::NotReady)
        );
        let caller = Holder {
            workspace: "acme".into(),
            connection: "tracker".into(),
            tool: "tracker.issues.create".into(),
            idempotency_key: "idt_previous_release_0001".into(),
            key_hash: "sha256:00".into(),
            key_name: "caller".into(),
            publication: None,
            policies: Vec::new(),
            approval: ApprovalBasis::NotRequired,
            evidence: EvidenceClass::GatewayObserved,
            route: Default::default(),
            capability: None,
            trace_id: None,
        };
        let settled = settle(&store, &key, &old, Settlement::DeadHolder, Some(&caller))
            .await
            .unwrap();
        assert_eq!(settled.attempts, 1);
        let receipt = store.receipt("acme", "rcp_old0").await.unwrap().unwrap();
        assert_eq!(receipt.outcome, OutcomeClass::Unknown);
        assert_eq!(receipt.attempt_count, 1);
        assert_eq!(store.get(&key).await.unwrap(), Some(settled));
    }
}
