//! Claim: the idempotency slot (workspace, connection, tool, key) becomes this call's, or
//! the call is answered from what the slot already holds.
//!
//! A fresh call claims with attempt 1 reserved in the same write, or claims the slot held
//! when it needs approval. A slot that exists is judged by [`Planned::judge`], which is where
//! every rule about someone else's slot lives: a dead holder is settled first, whoever asks;
//! another request under the key conflicts; a held slot moves on only under its own token;
//! and a call that needs approval never takes a free slot without being held first.

use super::authorize::Admission;
use super::dispatch::Planned;
use super::settle::{self, Settlement};
use super::{Answer, ClaimIdentity, ResultSource, Services, ToolResult, hold, receipt};
use crate::approvals::{self, ApprovalId, Decision};
use crate::clock::now_ms;
use crate::error::ObolError;
use crate::store::{
    self, ClaimRecord, ClaimState, HeldFor, OutcomeClass, ResultJson, StoredOutcome,
};

/// A claimed slot and the per-call state the rest of the lifecycle carries.
#[derive(Debug)]
pub struct Claimed {
    pub invocation: Invocation,
    pub reservation: Reservation,
}

/// Everything one call carries after its claim: the plan and the slot's current record (what
/// the next compare-and-set expects).
#[derive(Debug)]
pub struct Invocation {
    /// Boxed (by `prepare`): each phase moves the invocation into the next, and the plan
    /// would be most of its bytes (1.6 of 2.2 KB).
    pub plan: Box<Planned>,
    pub record: ClaimRecord,
}

impl Invocation {
    pub fn identity(&self) -> ClaimIdentity {
        ClaimIdentity {
            key: self.plan.claim_key.key.clone(),
            receipt_id: Some(self.record.receipt_id.clone()),
        }
    }
}

/// How the first attempt of a claimed slot is reserved.
#[derive(Debug)]
pub enum Reservation {
    /// Reserved in the claim's own write.
    Made,
    /// Reserved by replacing the current record with this one.
    Next(Box<ClaimRecord>),
}

impl Planned {
    fn lease_until(&self, services: &Services) -> u64 {
        now_ms() + services.lease.as_millis() as u64
    }

    fn answered(&self, error: ObolError, record: Option<&ClaimRecord>) -> Result<Claimed, Answer> {
        Err(Answer::refused(
            error,
            Some(ClaimIdentity {
                key: self.claim_key.key.clone(),
                receipt_id: record.map(|r| r.receipt_id.clone()),
            }),
        ))
    }

    /// Takes an existing slot for a new attempt. Only under its whole pin: a call prepared by
    /// another connector version than the slot's is the same call, but not the same request.
    fn take(self: Box<Self>, record: ClaimRecord, next: ClaimRecord) -> Result<Claimed, Answer> {
        if *record.pin != self.pin {
            return self.answered(ObolError::IdempotencyConflict, Some(&record));
        }
        Ok(Claimed {
            invocation: Invocation { plan: self, record },
            reservation: Reservation::Next(Box::new(next)),
        })
    }

    /// The paths a first call does not take (an existing slot, a hold) are awaited boxed, so
    /// this future stays the size of the path it does take (ADR-0061).
    pub async fn claim(self: Box<Self>, services: &Services) -> Result<Claimed, Answer> {
        let store = &services.store;
        // A resume never creates a slot: a valid token whose call was never held cannot start
        // an execution of its own.
        if self.authorized.routed.parsed.grant.is_some() {
            return match store.get(&self.claim_key).await {
                Ok(Some(existing)) => Box::pin(self.judge(services, existing)).await,
                Ok(None) => self.answered(ObolError::NotReady, None),
                Err(error) => {
                    tracing::warn!("could not read a claim, nothing sent: {error}");
                    self.answered(ObolError::StoreUnavailable, None)
                }
            };
        }
        // A call that would wait for the owner: a retry of one already held answers from its
        // slot; a new one needs room in its key's share of the inbox.
        if self.authorized.admission == Admission::NeedsApproval {
            match store.get(&self.claim_key).await {
                Ok(Some(existing)) => return Box::pin(self.judge(services, existing)).await,
                Ok(None) => {
                    if let Err(refusal) =
                        hold::room_for_another(services, &self.authorized.holder).await
                    {
                        return self.answered(refusal, None);
                    }
                }
                Err(error) => {
                    tracing::warn!("could not read a claim, nothing sent: {error}");
                    return self.answered(ObolError::StoreUnavailable, None);
                }
            }
        }
        let now = now_ms();
        let opening = match self.authorized.admission {
            Admission::Proceed => store::Opening::Reserved {
                lease_until_ms: self.lease_until(services),
            },
            Admission::NeedsApproval => store::Opening::Held(HeldFor {
                approval_id: ApprovalId::mint(),
                expires_at_ms: now + approvals::TICKET_TTL.as_millis() as u64,
            }),
        };
        let fresh = ClaimRecord::open(
            self.pin.clone(),
            self.authorized.holder.clone(),
            opening,
            receipt::new_id(),
            self.authorized.routed.parsed.key_source,
            now,
        );
        match store.claim(&self.claim_key, &fresh).await {
            Err(error) => {
                tracing::warn!("claim failed, nothing sent: {error}");
                self.answered(ObolError::StoreUnavailable, None)
            }
            Ok(store::Claim::Acquired) => match self.authorized.admission {
                Admission::Proceed => Ok(Claimed {
                    invocation: Invocation {
                        plan: self,
                        record: fresh,
                    },
                    reservation: Reservation::Made,
                }),
                Admission::NeedsApproval => Box::pin(self.held(services, &fresh)).await,
            },
            Ok(store::Claim::Existing(existing)) => Box::pin(self.judge(services, *existing)).await,
        }
    }

    /// The -32003 answer (or the end of the hold) for a slot held under `record`.
    async fn held(
        self: Box<Self>,
        services: &Services,
        record: &ClaimRecord,
    ) -> Result<Claimed, Answer> {
        let error = hold::answer(
            services,
            &self.claim_key,
            record,
            &self.authorized.holder,
            &self.authorized.summary,
        )
        .await;
        self.answered(error, Some(record))
    }

    /// Decides what a call gets from a slot that already exists.
    async fn judge(
        self: Box<Self>,
        services: &Services,
        existing: ClaimRecord,
    ) -> Result<Claimed, Answer> {
        let now = now_ms();
        let caller = &self.authorized.holder;
        let grant = self.authorized.routed.parsed.grant.as_ref();
        // A dead holder's attempt is settled first, whoever asks and whatever they ask, with
        // the dead call's own facts: it may have left, so its effect is unknown.
        let existing = if existing.holder_died(now) {
            match settle::settle(
                &services.store,
                &self.claim_key,
                &existing,
                Settlement::DeadHolder,
                Some(caller),
            )
            .await
            {
                Ok(settled) => settled,
                Err(error) => return self.answered(error, Some(&existing)),
            }
        } else {
            existing
        };
        if !existing.pin.same_call(&self.pin) {
            // A capability call that found no slot when it was routed, and whose first call
            // then claimed it on another provider (the breaker moved in between): the same
            // call, routed twice. Its retry reads the slot and takes the recorded route.
            if existing.pin.request_hash == self.pin.request_hash
                && routed_elsewhere(&existing, &self.authorized.holder)
            {
                return self.answered(ObolError::NotReady, Some(&existing));
            }
            return self.answered(ObolError::IdempotencyConflict, Some(&existing));
        }
        match &existing.state {
            ClaimState::Finalized { outcome } => {
                // Redispatch only what is unknown, and only when the vendor deduplicates on the
                // key it receives. A slot once held is resent only under its own unexpired
                // token; without one (or once it expired) the stored outcome is the answer,
                // and a new approval needs a new key.
                let may_resend = outcome.class == OutcomeClass::Unknown
                    && existing.pin.binding.is_vendor_binding()
                    && match existing.approval() {
                        Some(held) => grant.is_some_and(|g| {
                            g.approval_id == held.approval_id
                                && g.decision == Decision::Approved
                                && g.expires_at_ms > now
                        }),
                        // A record from before 0.2 does not say whether it was ever held:
                        // it is never resent without a token.
                        None => {
                            self.authorized.admission == Admission::Proceed
                                && existing.holder.is_some()
                        }
                    };
                // The vendor deduplicates only for so long: after its window, a resend it no
                // longer recognises would be a second effect, so the unknown stands.
                let window_ms = self.route().connection.idempotency_window.as_millis() as u64;
                let may_resend = may_resend && now < existing.created_at_ms + window_ms;
                // Only the version that prepared the request resends it: after a hot upgrade
                // another version may build another request, so the unknown stands.
                let may_resend = may_resend && *existing.pin == self.pin;
                if may_resend {
                    let next = existing.reserve_next(caller.clone(), self.lease_until(services));
                    return self.take(existing, next);
                }
                let answer = replay(outcome, &existing);
                Err(Answer {
                    result: answer,
                    identity: Some(ClaimIdentity {
                        key: self.claim_key.key.clone(),
                        receipt_id: Some(existing.receipt_id.clone()),
                    }),
                })
            }
            ClaimState::Reserved { .. } => self.answered(ObolError::NotReady, Some(&existing)),
            // Records of 0.1 could be claimed with nothing reserved and a live lease.
            ClaimState::Claimed if existing.lease_until_ms > now => {
                self.answered(ObolError::NotReady, Some(&existing))
            }
            // A free slot (its last attempt provably never left). A call that needs approval
            // holds it first, under its own key and ticket; it never takes it directly.
            ClaimState::Claimed => match self.authorized.admission {
                Admission::Proceed => {
                    let next = existing.reserve_next(caller.clone(), self.lease_until(services));
                    self.take(existing, next)
                }
                // Never held for an approval that could not be spent (see `take`).
                Admission::NeedsApproval if *existing.pin != self.pin => {
                    self.answered(ObolError::IdempotencyConflict, Some(&existing))
                }
                Admission::NeedsApproval => {
                    if let Err(refusal) = hold::room_for_another(services, caller).await {
                        return self.answered(refusal, Some(&existing));
                    }
                    let held = existing.hold(
                        caller.clone(),
                        HeldFor {
                            approval_id: ApprovalId::mint(),
                            expires_at_ms: now + approvals::TICKET_TTL.as_millis() as u64,
                        },
                    );
                    match services
                        .store
                        .transition(&self.claim_key, &existing, &held)
                        .await
                    {
                        Ok(true) => self.held(services, &held).await,
                        Ok(false) => self.answered(ObolError::NotReady, Some(&existing)),
                        Err(error) => {
                            tracing::warn!("could not hold a free slot, nothing sent: {error}");
                            self.answered(ObolError::StoreUnavailable, Some(&existing))
                        }
                    }
                }
            },
            ClaimState::AwaitingApproval { approval_id, .. } => {
                // The hold belongs to the key that made the call; another key never takes it.
                if existing
                    .holder
                    .as_ref()
                    .is_some_and(|holder| holder.key_hash != caller.key_hash)
                {
                    return self.answered(ObolError::IdempotencyConflict, Some(&existing));
                }
                match grant {
                    // Held for another connector version's request: an approval of it could
                    // never be spent by this one (see `take`), so it is not asked for again.
                    None if *existing.pin != self.pin => {
                        self.answered(ObolError::IdempotencyConflict, Some(&existing))
                    }
                    None => self.held(services, &existing).await,
                    Some(grant) if grant.approval_id != *approval_id => self.answered(
                        ObolError::ApprovalMismatch("another approval holds this call"),
                        Some(&existing),
                    ),
                    Some(grant) => match grant.decision {
                        Decision::Denied => {
                            let error = match settle::settle(
                                &services.store,
                                &self.claim_key,
                                &existing,
                                Settlement::Denied,
                                Some(caller),
                            )
                            .await
                            {
                                Ok(_) => ObolError::ApprovalDenied,
                                Err(error) => error,
                            };
                            self.answered(error, Some(&existing))
                        }
                        // The token was checked when the request arrived; the guest's prepare
                        // ran since, so its expiry is checked again right before the slot moves.
                        Decision::Approved if grant.expires_at_ms <= now => {
                            let error = match settle::settle(
                                &services.store,
                                &self.claim_key,
                                &existing,
                                Settlement::Expired,
                                Some(caller),
                            )
                            .await
                            {
                                Ok(_) => ObolError::ApprovalExpired,
                                Err(error) => error,
                            };
                            self.answered(error, Some(&existing))
                        }
                        // Compare-and-set from the held state: of concurrent resumes, exactly
                        // one reserves the attempt; the others answer `not_ready`, then replay.
                        Decision::Approved => {
                            let next =
                                existing.reserve_next(caller.clone(), self.lease_until(services));
                            self.take(existing, next)
                        }
                    },
                }
            }
        }
    }
}

/// The stored answer of a finished call, marked as a replay.
fn replay(outcome: &StoredOutcome, record: &ClaimRecord) -> Result<ToolResult, ObolError> {
    match &outcome.response {
        Ok(result) => {
            let mut result = result.to_value();
            result["_meta"]["obol"]["replayed"] = serde_json::Value::Bool(true);
            result["_meta"]["obol"]["attempt_count"] = serde_json::json!(record.attempts);
            Ok(ToolResult {
                json: ResultJson::of(&result),
                source: ResultSource::Replayed(outcome.class),
            })
        }
        Err(error) => Err(ObolError::Replayed(error.clone())),
    }
}

/// Whether a capability slot records another provider than the one `caller` was routed to.
fn routed_elsewhere(existing: &ClaimRecord, caller: &crate::store::Holder) -> bool {
    let recorded = existing.holder.as_ref().and_then(|h| h.capability.as_ref());
    match (recorded, &caller.capability) {
        (Some(recorded), Some(routed)) => {
            (recorded.provider.as_str(), recorded.connection.as_str())
                != (routed.provider.as_str(), routed.connection.as_str())
        }
        _ => false,
    }
}
