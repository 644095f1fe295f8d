//! Render: the classified outcome becomes what the call answers and its receipt says. The
//! connector renders the vendor's reply through the dispatch seam; the host decides the
//! outcome class, the verification and the note.

use super::attempt::{Observation, Observed, Withdrawal};
use super::claim::Invocation;
use super::{Services, dispatch};
use crate::catalog::StatusClass;
use crate::error::ObolError;
use crate::store::{OutcomeClass, Verification};

/// A call with its answer decided, to be finalized.
#[derive(Debug)]
pub struct Rendered {
    pub invocation: Invocation,
    pub withdrawal: Withdrawal,
    pub class: OutcomeClass,
    pub vendor_status: Option<u16>,
    pub result: Result<dispatch::CallResult, ObolError>,
    /// What the gateway observed, before the route's evidence class is applied.
    pub observed: Verification,
    pub note: Option<&'static str>,
    /// A federated call's broker record id, read by the gateway from the answer.
    pub broker_record: Option<String>,
}

impl Observed {
    pub async fn render(self, services: &Services) -> Rendered {
        let Observed {
            mut invocation,
            observation,
            withdrawal,
        } = self;
        let inconclusive = Some("the vendor's answer was not observed in full");
        let mut broker_record = None;
        let (class, vendor_status, result, observed, note) = match observation {
            Observation::NoReply => (
                OutcomeClass::Unknown,
                None,
                Err(ObolError::UpstreamTimeout),
                Verification::Inconclusive,
                inconclusive,
            ),
            Observation::TooLarge { class } => (
                outcome_class(class),
                None,
                Err(ObolError::UpstreamResponseTooLarge {
                    limit: services.outbound.max_response_bytes(),
                }),
                Verification::Inconclusive,
                inconclusive,
            ),
            Observation::Replied { reply, class } => {
                let status = reply.status();
                let upstream = matches!(reply, dispatch::Reply::Upstream(_));
                broker_record = dispatch::broker_record(invocation.plan.route(), &reply);
                let warm = invocation.plan.warm.take();
                let rendered =
                    dispatch::render(services, invocation.plan.route(), class, reply, warm).await;
                let observed = match (&rendered, outcome_class(class)) {
                    (Ok(_), OutcomeClass::Accepted | OutcomeClass::DefinitelyRejected) => {
                        Verification::Verified
                    }
                    _ => Verification::Inconclusive,
                };
                let note = match (&rendered, class) {
                    (Err(ObolError::OutputSchemaViolation), _) => {
                        Some("the output did not match the tool's output schema")
                    }
                    (Err(ObolError::ResultTooDeep { .. }), _) => {
                        Some("the result nested deeper than the gateway keeps")
                    }
                    (Err(_), _) if upstream => Some("the upstream's answer could not be relayed"),
                    (Err(_), _) => Some("the component could not render the vendor's answer"),
                    (Ok(_), StatusClass::Accepted | StatusClass::DefinitelyRejected) => None,
                    (Ok(_), _) if upstream => {
                        Some("the upstream's answer does not prove whether the tool acted")
                    }
                    (Ok(_), _) => Some("the vendor's status is not one the tool declares final"),
                };
                (outcome_class(class), status, rendered, observed, note)
            }
        };
        Rendered {
            invocation,
            withdrawal,
            class,
            vendor_status,
            result,
            observed,
            note,
            broker_record,
        }
    }
}

fn outcome_class(class: StatusClass) -> OutcomeClass {
    match class {
        StatusClass::Accepted => OutcomeClass::Accepted,
        StatusClass::DefinitelyRejected => OutcomeClass::DefinitelyRejected,
        StatusClass::Retryable | StatusClass::Unknown => OutcomeClass::Unknown,
    }
}
