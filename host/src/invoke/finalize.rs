//! Finalize: the outcome, the receipt and the audit record in one acknowledged write; then
//! respond. Nothing is exposed before the store acknowledged it (ADR-0007).
//!
//! When that write fails, the gateway keeps the outcome it could not record: it answers
//! `not_ready` (same-key calls get `not_ready` too, the attempt is still reserved), and a
//! task retries the write with bounded backoff, renewing the lease before each try. If the
//! lease cannot be renewed or the tries run out, the dead-holder rule takes over when the
//! lease ends (the slot is settled `unknown`). On shutdown it tries once more and logs the
//! receipt id it could not record.

use std::time::Duration;

use serde::Serialize;
use tokio::sync::watch;

use super::attempt::Withdrawal;
use super::claim::Invocation;
use super::receipt::{self, Ending};
use super::render::Rendered;
use super::{Answer, ClaimIdentity, ResultSource, Services, ToolResult};
use crate::capability::router::Decision;
use crate::catalog::RouteKind;
use crate::clock::now_ms;
use crate::error::ObolError;
use crate::store::{
    ClaimKey, ClaimRecord, ClaimState, EvidenceClass, OutcomeClass, Receipt, Store, StoredOutcome,
    Verification,
};

/// A result's `_meta`: what the gateway did with the call (docs/idempotency.md lists the
/// fields). A replay rewrites `replayed` and `attempt_count` in the stored text by name.
#[derive(Serialize)]
struct Meta<'a> {
    obol: ObolMeta<'a>,
}

/// `_meta.obol`.
#[derive(Serialize)]
struct ObolMeta<'a> {
    idempotency_key: &'a str,
    receipt_id: &'a str,
    verification: Verification,
    outcome: OutcomeClass,
    vendor_status: Option<u16>,
    attempt_count: u32,
    route: RouteKind,
    evidence: EvidenceClass,
    replayed: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    capability: Option<&'a Decision>,
}

/// The pauses between tries of a final write that failed (about 25 s in all; each is cut
/// to a quarter of the lease, and each try renews the lease first).
const BACKOFF_MS: [u64; 9] = [100, 200, 400, 800, 1600, 3200, 5000, 5000, 8000];

/// A call whose outcome is durable: the only kind answered with a result.
#[derive(Debug)]
pub struct Finalized {
    identity: ClaimIdentity,
    result: Result<ToolResult, ObolError>,
}

impl Finalized {
    pub fn respond(self) -> Answer {
        Answer {
            result: self.result,
            identity: Some(self.identity),
        }
    }
}

impl Rendered {
    /// The final write. Until it is acknowledged the call answers `not_ready` (the `Err`).
    pub async fn finalize(self, services: &Services) -> Result<Finalized, Answer> {
        let Rendered {
            invocation,
            withdrawal,
            class,
            vendor_status,
            result,
            observed,
            note,
            broker_record,
        } = self;
        let Invocation { plan, record } = invocation;
        let holder = &plan.authorized.holder;
        let evidence = receipt::evidence(holder.evidence, broker_record.as_deref());
        let verification = receipt::verification(evidence, observed);
        let attempts = match withdrawal {
            Withdrawal::None => record.attempts,
            Withdrawal::UnsentRetry => record.attempts.saturating_sub(1),
        };
        let meta = Meta {
            obol: ObolMeta {
                idempotency_key: plan.claim_key.key.as_str(),
                receipt_id: &record.receipt_id,
                verification,
                outcome: class,
                vendor_status,
                attempt_count: attempts,
                route: holder.route,
                evidence,
                replayed: false,
                capability: holder.capability.as_ref(),
            },
        };
        // The result is written out once: the final record embeds the text and, once the
        // store has it, the answer takes it back from the record and sends it.
        let (response, refusal) = match result {
            Ok(result) => (Ok(result.written(&meta)), None),
            Err(error) => (Err(error.to_jsonrpc_error()), Some(error)),
        };
        let outcome = StoredOutcome {
            class,
            vendor_status,
            response,
        };
        let ending = Ending {
            outcome: class,
            vendor_status,
            observed,
            note,
            broker_record: broker_record.as_deref(),
        };
        let finished = Closing::finish(&record, outcome, withdrawal);
        let receipt = receipt::build(&plan.claim_key, &finished, holder, ending);
        let identity = ClaimIdentity {
            key: plan.claim_key.key.clone(),
            receipt_id: Some(record.receipt_id.clone()),
        };
        match services
            .store
            .finalize(&plan.claim_key, &record, &finished, &receipt)
            .await
        {
            Ok(true) => Ok(Finalized {
                identity,
                result: answered(finished, refusal),
            }),
            // Lost the claim: a lease expired under us and someone settled it. Their record
            // is the answer now.
            Ok(false) => {
                tracing::warn!(receipt = %record.receipt_id, "the claim moved on before its outcome was recorded");
                Err(Answer::refused(ObolError::NotReady, Some(identity)))
            }
            Err(error) => {
                services.metrics.store_error();
                tracing::warn!(receipt = %record.receipt_id, "could not record the outcome, retrying in the background: {error}");
                let pending = Pending {
                    key: plan.claim_key.clone(),
                    closing: Closing::again(&finished, withdrawal),
                    record,
                    receipt,
                };
                let (store, lease) = (services.store.clone(), services.lease);
                let stopping = services.owned.stopping();
                services
                    .owned
                    .spawn(async move { record_later(&store, lease, pending, stopping).await });
                Err(Answer::refused(ObolError::NotReady, Some(identity)))
            }
        }
    }
}

/// How the final record is made from the current one (again after each lease renewal).
#[derive(Debug, Clone)]
struct Closing {
    outcome: StoredOutcome,
    withdrawal: Withdrawal,
}

impl Closing {
    fn finish(record: &ClaimRecord, outcome: StoredOutcome, withdrawal: Withdrawal) -> ClaimRecord {
        match withdrawal {
            Withdrawal::None => record.finalize(outcome),
            Withdrawal::UnsentRetry => record.finalize_withdrawing_unsent(outcome),
        }
    }

    /// How `finished` was made, to make it again on a later record.
    fn again(finished: &ClaimRecord, withdrawal: Withdrawal) -> Closing {
        let ClaimState::Finalized { outcome } = &finished.state else {
            unreachable!("`Closing::finish` makes only finalized records")
        };
        Closing {
            outcome: outcome.clone(),
            withdrawal,
        }
    }

    fn of(&self, record: &ClaimRecord) -> ClaimRecord {
        Closing::finish(record, self.outcome.clone(), self.withdrawal)
    }
}

/// The client's answer: the refusal, or the result taken back from the record it was stored in.
fn answered(finished: ClaimRecord, refusal: Option<ObolError>) -> Result<ToolResult, ObolError> {
    match (refusal, finished.state) {
        (Some(error), _) => Err(error),
        (
            None,
            ClaimState::Finalized {
                outcome:
                    StoredOutcome {
                        class,
                        response: Ok(json),
                        ..
                    },
            },
        ) => Ok(ToolResult {
            json,
            source: ResultSource::Recorded(class),
        }),
        (None, _) => unreachable!("a result without a refusal is stored as a finalized `Ok`"),
    }
}

/// An outcome held in memory until its final write succeeds.
#[derive(Debug)]
struct Pending {
    key: ClaimKey,
    record: ClaimRecord,
    closing: Closing,
    receipt: Receipt,
}

async fn record_later(
    store: &Store,
    lease: Duration,
    mut pending: Pending,
    mut stopping: watch::Receiver<bool>,
) {
    let id = pending.receipt.id.clone();
    // No pause is longer than a quarter of the lease, so a renewal always lands before the
    // lease it renews has ended.
    let cap = (lease.as_millis() as u64 / 4).max(1);
    for pause in BACKOFF_MS.map(|pause| pause.min(cap)) {
        let stopping_now = tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(pause)) => false,
            _ = stopping.wait_for(|stop| *stop) => true,
        };
        // The lease is renewed first, so a same-key call keeps answering `not_ready` instead
        // of settling a live outcome as unknown. A store that refuses the renewal may still
        // take the final write while the current lease runs: both are tried until it ends.
        let renewed = pending.record.renew(now_ms() + lease.as_millis() as u64);
        match store
            .transition(&pending.key, &pending.record, &renewed)
            .await
        {
            Ok(true) => pending.record = renewed,
            Ok(false) => {
                tracing::warn!(receipt = %id, "the claim moved on while its outcome waited to be recorded");
                return;
            }
            Err(error) => {
                tracing::warn!(receipt = %id, "could not renew the lease of an unrecorded outcome: {error}")
            }
        }
        if pending.record.lease_until_ms <= now_ms() {
            tracing::error!(receipt = %id, "the lease of an unrecorded outcome ended; it is settled as unknown");
            return;
        }
        let finished = pending.closing.of(&pending.record);
        pending.receipt.finalized_at_ms = now_ms();
        match store
            .finalize(&pending.key, &pending.record, &finished, &pending.receipt)
            .await
        {
            Ok(true) => {
                tracing::info!(receipt = %id, "recorded an outcome that had failed to record");
                return;
            }
            Ok(false) => return,
            Err(error) if stopping_now => {
                tracing::error!(receipt = %id, "shutting down with an outcome that could not be recorded; it is settled as unknown when its lease ends: {error}");
                return;
            }
            Err(error) => tracing::warn!(receipt = %id, "still cannot record an outcome: {error}"),
        }
    }
    tracing::error!(receipt = %id, "gave up recording an outcome; it is settled as unknown when its lease ends");
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::{Meta, ObolMeta};
    use crate::catalog::RouteKind;
    use crate::store::{EvidenceClass, OutcomeClass, Verification};

    /// Clients read `vendor_status: null` as "no HTTP status was seen" and find `capability`
    /// only on capability calls.
    #[test]
    fn meta_writes_a_missing_status_as_null_and_leaves_out_a_missing_capability() {
        let meta = Meta {
            obol: ObolMeta {
                idempotency_key: "idt_1",
                receipt_id: "rcpt_1",
                verification: Verification::Inconclusive,
                outcome: OutcomeClass::Unknown,
                vendor_status: None,
                attempt_count: 1,
                route: RouteKind::Native,
                evidence: EvidenceClass::GatewayObserved,
                replayed: false,
                capability: None,
            },
        };
        let obol = serde_json::to_value(&meta).unwrap()["obol"].take();
        assert_eq!(obol["vendor_status"], json!(null));
        assert!(obol.as_object().unwrap().contains_key("vendor_status"));
        assert!(!obol.as_object().unwrap().contains_key("capability"));
        assert_eq!(obol["attempt_count"], json!(1));
        assert_eq!(obol["replayed"], json!(false));
    }
}
