//! Reserve, send, classify, and the one immediate retry.
//!
//! Every attempt is durably reserved before it is sent (ADR-0031): the count on the record is
//! what may have reached the vendor. At most one immediate second attempt is reserved, and
//! only by the two rules of `spec/idempotency.md` "Retries": the first provably never left,
//! or the vendor answered a retryable status and the tool declares a vendor binding.

use super::claim::{Claimed, Invocation, Reservation};
use super::{Answer, ClaimIdentity, Services, dispatch};
use crate::catalog::StatusClass;
use crate::clock::now_ms;
use crate::error::ObolError;
use dispatch::{Outcome, Reply};

/// A call whose next attempt is durably reserved: the only thing that can be sent.
#[derive(Debug)]
pub struct Reserved {
    invocation: Invocation,
    /// Which attempt of this invocation is reserved.
    turn: Turn,
}

/// The first attempt of this invocation, or its one immediate retry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Turn {
    First,
    /// The retry after an attempt that provably never left (the same attempt, renewed).
    AfterUnsent,
    /// The retry after a retryable answer (a second attempt, counted).
    AfterRetryable,
}

impl Claimed {
    /// Makes the reservation the claim phase decided on (compare-and-set: of two racers, one
    /// wins and the other answers `not_ready`).
    pub async fn reserve(self, services: &Services) -> Result<Reserved, Answer> {
        let Claimed {
            mut invocation,
            reservation,
        } = self;
        if let Reservation::Next(next) = reservation {
            let identity = invocation.identity();
            match services
                .store
                .transition(&invocation.plan.claim_key, &invocation.record, &next)
                .await
            {
                Ok(true) => invocation.record = *next,
                Ok(false) => return Err(Answer::refused(ObolError::NotReady, Some(identity))),
                Err(error) => {
                    tracing::warn!("could not reserve an attempt, nothing sent: {error}");
                    return Err(Answer::refused(ObolError::StoreUnavailable, Some(identity)));
                }
            }
        }
        Ok(Reserved {
            invocation,
            turn: Turn::First,
        })
    }
}

impl Reserved {
    /// Sends exactly one attempt.
    pub async fn send(self, services: &Services) -> Sent {
        let plan = &self.invocation.plan;
        let outcome = dispatch::send(services, plan).await;
        if !matches!(outcome, dispatch::Outcome::NotSent)
            && !matches!(plan.request, dispatch::Request::Gateway(_))
        {
            services.metrics.attempt(&plan.route().connection.id);
        }
        // Every attempt feeds its connection's breaker, which routes capabilities' new calls.
        if let Some(signal) = outcome.signal() {
            let connection = (
                plan.claim_key.workspace.clone(),
                plan.route().connection.id.clone(),
            );
            services.breakers.record(&connection, signal, now_ms());
        }
        Sent {
            reserved: self,
            outcome,
        }
    }
}

/// One attempt's outcome, not yet classified.
#[derive(Debug)]
pub struct Sent {
    reserved: Reserved,
    outcome: Outcome,
}

/// What the host made of what it saw, by the tool's declared status classes.
#[derive(Debug)]
pub enum Observation {
    /// The vendor answered in full.
    Replied { reply: Reply, class: StatusClass },
    /// The request may have reached the vendor; no answer was read.
    NoReply,
    /// The vendor answered more than the cap allows.
    TooLarge { class: StatusClass },
}

/// A classified attempt.
#[derive(Debug)]
pub struct Classified {
    invocation: Invocation,
    turn: Turn,
    seen: Seen,
}

#[derive(Debug)]
enum Seen {
    /// Provably nothing left on this attempt.
    Nothing,
    Observed(Observation),
    /// The retry never left; the outcome is the earlier attempt's, which was observed.
    EarlierObserved(Observation),
}

impl Sent {
    pub fn classify(self) -> Classified {
        let seen = match self.outcome {
            Outcome::NotSent => Seen::Nothing,
            Outcome::SentNoReply => Seen::Observed(Observation::NoReply),
            Outcome::TooLarge { class } => Seen::Observed(Observation::TooLarge { class }),
            Outcome::Replied { reply, class } => {
                Seen::Observed(Observation::Replied { reply, class })
            }
        };
        Classified {
            invocation: self.reserved.invocation,
            turn: self.reserved.turn,
            seen,
        }
    }
}

/// Reserves and sends the one immediate retry when a rule allows it. The retry is reserved
/// durably before it is sent, like the first attempt; if it cannot be recorded, it is not sent.
pub async fn retry_once(services: &Services, classified: Classified) -> Classified {
    if classified.turn != Turn::First {
        return classified;
    }
    let record = &classified.invocation.record;
    let lease_until = now_ms() + services.lease.as_millis() as u64;
    let (turn, next) = match &classified.seen {
        // Provably never left: the same attempt is reserved again (renewing its lease), so
        // the count still equals what the vendor may have received.
        Seen::Nothing => (Turn::AfterUnsent, record.renew(lease_until)),
        Seen::Observed(Observation::Replied {
            class: StatusClass::Retryable,
            ..
        }) if record.pin.binding.is_vendor_binding() => {
            let holder = classified.invocation.plan.authorized.holder.clone();
            (
                Turn::AfterRetryable,
                record.reserve_next(holder, lease_until),
            )
        }
        _ => return classified,
    };
    let Classified {
        mut invocation,
        seen: earlier,
        ..
    } = classified;
    match services
        .store
        .transition(&invocation.plan.claim_key, &invocation.record, &next)
        .await
    {
        Ok(true) => invocation.record = next,
        refused => {
            if let Err(error) = refused {
                tracing::warn!("could not reserve the retry, not sending it: {error}");
            }
            return Classified {
                invocation,
                turn: Turn::First,
                seen: earlier,
            };
        }
    }
    // Boxed: inline, the rare retry made every call's future an attempt larger (ADR-0061).
    let retried = Box::pin(Reserved { invocation, turn }.send(services))
        .await
        .classify();
    match (turn, retried.seen, earlier) {
        // The second attempt never left: it is withdrawn, and the first attempt's observed
        // outcome is the call's (the vendor received one request).
        (Turn::AfterRetryable, Seen::Nothing, Seen::Observed(first)) => Classified {
            invocation: retried.invocation,
            turn,
            seen: Seen::EarlierObserved(first),
        },
        (_, seen, _) => Classified {
            invocation: retried.invocation,
            turn,
            seen,
        },
    }
}

/// A call whose last attempt provably never left, and no earlier one either.
#[derive(Debug)]
struct Unsent {
    invocation: Invocation,
}

/// A call with an observed outcome, to be rendered and finalized.
#[derive(Debug)]
pub struct Observed {
    pub invocation: Invocation,
    pub observation: Observation,
    /// Whether the last reserved attempt is to be withdrawn when finalizing.
    pub withdrawal: Withdrawal,
}

/// Whether the final write withdraws an unsent retry from the count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Withdrawal {
    None,
    UnsentRetry,
}

impl Classified {
    /// What was observed; a call that provably sent nothing is released instead, and
    /// answered `upstream_unreachable`.
    pub async fn observed(self, services: &Services) -> Result<Observed, Answer> {
        match self.seen {
            // Boxed, as a path most calls do not take (ADR-0061).
            Seen::Nothing => Err(Box::pin(
                Unsent {
                    invocation: self.invocation,
                }
                .release(services),
            )
            .await),
            Seen::Observed(observation) => Ok(Observed {
                invocation: self.invocation,
                observation,
                withdrawal: Withdrawal::None,
            }),
            Seen::EarlierObserved(observation) => Ok(Observed {
                invocation: self.invocation,
                observation,
                withdrawal: Withdrawal::UnsentRetry,
            }),
        }
    }
}

impl Unsent {
    /// Nothing left the gateway: the reserved attempt is released so the same key can try
    /// again, instead of recording an outcome that never happened. The slot returns to what
    /// it was before (free, held, or its earlier outcome).
    async fn release(self, services: &Services) -> Answer {
        let Invocation { plan, record } = self.invocation;
        let released = record.release_unsent(now_ms());
        match services
            .store
            .transition(&plan.claim_key, &record, &released)
            .await
        {
            Ok(true) => {}
            Ok(false) => {
                tracing::warn!(receipt = %record.receipt_id, "an unsent claim moved on before its release");
            }
            Err(error) => {
                // Left reserved, the slot would be settled `unknown` with an attempt the
                // vendor never received: the release is retried while the lease runs.
                tracing::warn!(receipt = %record.receipt_id, "could not release an unsent claim, retrying: {error}");
                let (store, key) = (services.store.clone(), plan.claim_key.clone());
                let (record, released) = (record.clone(), released.clone());
                services.owned.spawn(async move {
                    for pause_ms in [100, 400, 1600] {
                        tokio::time::sleep(std::time::Duration::from_millis(pause_ms)).await;
                        if record.lease_until_ms <= now_ms() {
                            break;
                        }
                        if let Ok(done) = store.transition(&key, &record, &released).await {
                            if !done {
                                tracing::warn!(receipt = %record.receipt_id, "an unsent claim moved on before its release");
                            }
                            return;
                        }
                    }
                    tracing::error!(receipt = %record.receipt_id, "could not release an unsent claim; it is settled unknown when its lease ends");
                });
            }
        }
        // A receipt exists only when an earlier attempt of the slot was recorded.
        let receipt_id = (released.attempts > 0).then(|| released.receipt_id.clone());
        Answer::refused(
            ObolError::UpstreamUnreachable,
            Some(ClaimIdentity {
                key: plan.claim_key.key.clone(),
                receipt_id,
            }),
        )
    }
}
