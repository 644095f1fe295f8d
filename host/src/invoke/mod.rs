//! The invocation lifecycle: every `tools/call` runs through [`invoke`], top to bottom.
//!
//! ```text
//! parse ─▶ route ─▶ resolve (a capability's provider) ─▶ authorize
//!   ─▶ prepare (dispatch seam, before any state is written)
//!   ─▶ claim ──▶ Replay | Conflict | NotReady | Held (-32003, the slot is claimed held)
//!          └──▶ Claimed ─▶ reserve attempt ─▶ send one attempt ─▶ classify
//!               ─▶ [one immediate retry, only by the two rules of spec/idempotency.md]
//!               ─▶ render (dispatch seam) + check output ─▶ finalize ─▶ respond
//! ```
//!
//! Each phase lives in its own file and takes the previous phase's value: only an
//! [`authorize::Authorized`] call can be prepared, only a [`dispatch::Planned`] one can claim,
//! only a [`attempt::Reserved`] attempt can be sent, and only a [`finalize::Finalized`] call is
//! answered with a result. Ending a slot that will never dispatch (a dead holder, a denial, an
//! expired approval) goes through [`settle`], whoever notices it: the claim phase, the owner's
//! inbox, or the [`sweeper`].
//!
//! The order is the contract. Nothing leaves the gateway before its attempt is durably
//! reserved; the status is classified by the host before the connector renders anything; the
//! result is exposed only after the store acknowledged the final write (ADR-0031, ADR-0007).

// Each phase returns the call's answer as its `Err` when it ends the call early. That answer
// is built once per call and moved a few times; boxing it would cost an allocation on every
// refusal for nothing.
#![allow(clippy::result_large_err)]

mod attempt;
mod authorize;
mod claim;
pub mod dispatch;
mod finalize;
mod hold;
mod owned;
mod parse;
pub(crate) mod receipt;
mod render;
pub mod resolve;
mod route;
pub mod settle;
pub mod sweeper;

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Map, Value};
use tracing::Instrument;

use crate::approvals::ApprovalGrant;
use crate::catalog::Catalog;
use crate::error::ObolError;
use crate::idempotency::IdempotencyKey;
use crate::metrics::Phase;
pub use crate::metrics::ResultSource;
use crate::outbound::Outbound;
use crate::policy::VirtualKey;
use crate::runtime::Runtime;
use crate::store::{ResultJson, Store};
use crate::telemetry::phase_span;
use dispatch::Planned;

#[cfg(test)]
pub(crate) use route::admit;
pub use route::{RefusalBudget, route};
pub use settle::{Settlement, settle_ticket};

/// What the lifecycle needs from the gateway.
#[derive(Debug)]
pub struct Services {
    pub runtime: Arc<Runtime>,
    pub outbound: Outbound,
    /// The pool of MCP upstream sessions.
    pub upstreams: Arc<crate::upstream::Upstreams>,
    /// Every connection's breaker, fed by each attempt; capability routing reads it.
    pub breakers: crate::capability::breaker::Breakers,
    pub store: Store,
    /// How long a reserved attempt may stay in flight before its holder is presumed dead.
    pub lease: Duration,
    /// Where the owner's inbox is (`inbox_url` in -32003).
    pub inbox_base: String,
    /// How many refusal receipts each key has left this minute.
    pub refusals: RefusalBudget,
    /// Work no client can cancel: invocations from their claim on, and outcomes kept because
    /// their final write failed (ADR-0007). Shutdown waits for it.
    pub owned: owned::Owned,
    /// What `GET /metrics` reports; every phase counts into it.
    pub metrics: Arc<crate::metrics::Metrics>,
}

/// A `tools/call` as the client sent it: the params object and the parsed headers.
#[derive(Debug)]
pub struct CallRequest {
    pub params: Map<String, Value>,
    /// Whether every number in the arguments, as the client wrote them, is one a double
    /// carries exactly (else two different calls could hash alike).
    pub exactness: Result<(), crate::idempotency::InexactNumber>,
    /// The client's `Idempotency-Key`, already parsed; `None` means mint one.
    pub idempotency_key: Option<IdempotencyKey>,
    /// A verified approval token: this call resumes a held one.
    pub approval: Option<ApprovalGrant>,
    /// The client's trace (`_meta.traceparent`), for the receipt.
    pub trace_id: Option<crate::mcp::trace::TraceId>,
}

/// The idempotency identity of an authenticated call: returned on every answer, errors
/// included, so a client that supplied no key can still retry the same logical call.
#[derive(Debug, Clone)]
pub struct ClaimIdentity {
    pub key: IdempotencyKey,
    /// The receipt the call has or will have; `None` before a claim, and when nothing was
    /// sent and the claim was released.
    pub receipt_id: Option<String>,
}

/// What the client gets: the MCP result or an error, and the call's identity.
#[derive(Debug)]
pub struct Answer {
    pub result: Result<ToolResult, ObolError>,
    pub identity: Option<ClaimIdentity>,
}

/// A call's MCP result, as the JSON text the client is sent, and where it came from.
#[derive(Debug)]
pub struct ToolResult {
    pub json: ResultJson,
    pub source: ResultSource,
}

impl Answer {
    fn refused(error: ObolError, identity: Option<ClaimIdentity>) -> Answer {
        Answer {
            result: Err(error),
            identity,
        }
    }

    /// Arguments the tool cannot accept are a tool execution error the model reads and
    /// corrects (MCP 2025-11-25, SEP-1303), not a protocol error: a `CallToolResult` with
    /// `isError: true` whose text is the error's message (JSON pointers and schema rules, never
    /// a value). Nothing was claimed; the effective key is echoed for a retry.
    fn invalid_arguments_as_tool_error(self) -> Answer {
        let Err(error @ ObolError::InvalidArguments(_)) = &self.result else {
            return self;
        };
        let mut obol = serde_json::json!({ "error": error.wire().kind });
        if let Some(identity) = &self.identity {
            obol["idempotency_key"] = identity.key.as_str().into();
        }
        let result = serde_json::json!({
            "content": [{ "type": "text", "text": error.to_string() }],
            "isError": true,
            "_meta": { "obol": obol },
        });
        Answer {
            result: Ok(ToolResult {
                json: ResultJson::of(&result),
                source: ResultSource::Gateway,
            }),
            identity: self.identity,
        }
    }
}

/// Runs one tool call.
pub async fn invoke(
    services: &Arc<Services>,
    catalog: &Catalog,
    key: &VirtualKey,
    request: CallRequest,
) -> Answer {
    // Read before the lifecycle takes the request; only a name the catalog routes becomes a
    // metric label.
    let name = request
        .params
        .get("name")
        .and_then(Value::as_str)
        .map(str::to_owned);
    let span = crate::telemetry::call_span(request.trace_id.as_ref());
    // Every phase either hands its value to the next or answers the call itself.
    // Boxed, so the future of every `/mcp` request holds a pointer, not the lifecycle's.
    let answer = Box::pin(lifecycle(services, catalog, key, request))
        .instrument(span.clone())
        .await
        .unwrap_or_else(|answered| answered);
    let labels = services.metrics.tool_call(
        catalog,
        &key.workspace,
        name.as_deref(),
        answer.result.as_ref().map(|r| r.source),
    );
    span.record("tool", labels.tool.as_str());
    span.record("connection", labels.connection.as_str());
    span.record("outcome", labels.outcome);
    answer.invalid_arguments_as_tool_error()
}

async fn lifecycle(
    services: &Arc<Services>,
    catalog: &Catalog,
    key: &VirtualKey,
    request: CallRequest,
) -> Result<Answer, Answer> {
    let parsed = parse::parse(request, key.tools_mode)?; // call_tool(X) becomes X
    let routed = parsed.route(services, catalog, key)?;
    let resolved = routed.resolve(services, catalog, key).await?; // cap.* → one provider
    let authorized = resolved.authorize()?;
    let planned = dispatch::prepare(services, catalog, key, authorized).await?;
    // From the claim on, the call runs in a task the gateway owns: a client that hangs up
    // cannot leave a claim written and its attempt unsent, nor an outcome unrecorded.
    let identity = planned.identity();
    let task = Arc::clone(services);
    // Its own statement: a temporary in the awaiting one would be kept in this future.
    // Spawned boxed: a task's future is copied whole each time tokio moves it (into the
    // task, in and out of its stage), a pointer instead of kilobytes (ADR-0061).
    let owned = services
        .owned
        .spawn(Box::pin(async move { from_the_claim(&task, planned).await }).in_current_span());
    owned.await.unwrap_or_else(|failed| {
        // The panic's message may carry values from the call: only its task is named.
        tracing::error!(task = %failed.id(), "an invocation task panicked");
        Err(Answer::refused(ObolError::Internal, Some(identity)))
    })
}

async fn from_the_claim(services: &Services, planned: Box<Planned>) -> Result<Answer, Answer> {
    let timer = PhaseTimer::start(&services.metrics);
    let claimed = planned
        .claim(services) // or: replay, conflict, not ready, held
        .instrument(phase_span("claim"))
        .await;
    let timer = timer.lap(Phase::claim);
    let rendered = async {
        let reserved = claimed?.reserve(services).await?;
        let sent = reserved.send(services).await;
        let classified = attempt::retry_once(services, sent.classify()).await;
        let observed = classified.observed(services).await?; // or: released, nothing was sent
        Ok::<_, Answer>(observed.render(services).await)
    }
    .instrument(phase_span("dispatch"))
    .await?;
    let timer = timer.lap(Phase::dispatch);
    let finalized = rendered
        .finalize(services) // or: not ready, kept and retried
        .instrument(phase_span("finalize"))
        .await;
    timer.lap(Phase::finalize);
    Ok(finalized?.respond())
}

/// Times consecutive phases of one call, a phase that fails included (a slow store that
/// then fails is what an operator looks for); `dispatch` runs from the reservation to the
/// rendered result and is not timed when the attempt was released unsent.
struct PhaseTimer<'a> {
    metrics: &'a crate::metrics::Metrics,
    since: std::time::Instant,
}

impl<'a> PhaseTimer<'a> {
    fn start(metrics: &'a crate::metrics::Metrics) -> PhaseTimer<'a> {
        PhaseTimer {
            metrics,
            since: std::time::Instant::now(),
        }
    }

    fn lap(self, phase: Phase) -> PhaseTimer<'a> {
        let now = std::time::Instant::now();
        self.metrics.phase(phase, now - self.since);
        PhaseTimer {
            metrics: self.metrics,
            since: now,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The size of the future `make` returns; `make` is never called (its arguments are
    /// `unreachable!()`).
    fn size_of_future<F: std::future::Future>(_make: impl FnOnce() -> F) -> usize {
        std::mem::size_of::<F>()
    }

    /// A future is copied whole each time it moves: into the future that awaits it, into a
    /// box, into a tokio task and in and out of the task's stage. Most of a call's futures
    /// were the Redis store's and the MCP upstream's futures and the rare paths' (an existing
    /// slot, a retry), inline on every call: in this (test) build 5 KB for the request's and
    /// 24 KB for the owned task's, in a release build, which inlines more, 194 KB and 94 KB
    /// (ADR-0061). The phase values the owned task holds across its awaits carried the plan
    /// inline (about 2.2 KB each; the task 11.5 KB in this build); with the plan boxed they
    /// are 0.6-0.75 KB and the task 4.6 KB, which the bound keeps.
    #[test]
    #[allow(unreachable_code)]
    fn a_calls_futures_stay_a_few_kilobytes() {
        let sizes = [
            (
                "invoke",
                size_of_future(|| {
                    invoke(
                        unreachable!(),
                        unreachable!(),
                        unreachable!(),
                        unreachable!(),
                    )
                }),
                2 * 1024,
            ),
            (
                "lifecycle",
                size_of_future(|| {
                    lifecycle(
                        unreachable!(),
                        unreachable!(),
                        unreachable!(),
                        unreachable!(),
                    )
                }),
                8 * 1024,
            ),
            (
                "from_the_claim",
                size_of_future(|| from_the_claim(unreachable!(), unreachable!())),
                6 * 1024,
            ),
        ];
        for (future, size, limit) in sizes {
            assert!(
                size <= limit,
                "{future}'s future is {size} bytes, more than {limit}"
            );
        }
    }
}
