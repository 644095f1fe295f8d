//! The invocation lifecycle: every `tools/call` runs through [`invoke`], top to bottom.
//!
//! ```text
//! route ─▶ authorize ─▶ check arguments ─▶ prepare (guest) ─▶ check + complete the request
//!   ─▶ [approval required: claim AwaitingApproval + ticket ─▶ -32003; approved resume:
//!       AwaitingApproval ─▶ Reserved{1}, in place of the claim below]
//!   ─▶ claim (idempotency; attempt 1 reserved in the same write) ─▶ send one attempt
//!   ─▶ [reserve + send one immediate retry, only when the rules allow] ─▶ classify (EffectSpec)
//!   ─▶ interpret (guest) ─▶ check output ─▶ finalize (claim + receipt + audit, one write) ─▶ respond
//! ```
//!
//! The order is the contract. Nothing leaves the gateway before its attempt is durably
//! reserved; the status is classified by the host before the guest renders anything; and the
//! result is exposed only after the store acknowledged the final write (ADR-0031, ADR-0032).

mod receipt;

use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use serde_json::{Map, Value, json};

use crate::approvals::{
    self, ApprovalGrant, ApprovalId, ApprovalNotice, Decision, Ticket, TicketStatus,
};
use crate::catalog::{Catalog, Route, StatusClass, ToolName};
use crate::error::ObolError;
use crate::idempotency::{IdempotencyKey, RequestHash};
use crate::outbound::{AttemptOutcome, Outbound, Prepared, VendorReply};
use crate::policy::{ApprovalRule, Verdict, VirtualKey};
use crate::runtime::{GuestFailure, Runtime, wit};
use crate::store::{
    Claim, ClaimKey, ClaimRecord, ClaimState, ConnectionSegment, OutcomeClass, Pin, Store,
    StoredOutcome, Verification, now_ms,
};

/// What the lifecycle needs from the gateway.
#[derive(Debug)]
pub struct Services {
    pub runtime: Arc<Runtime>,
    pub outbound: Outbound,
    pub store: Store,
    /// How long a claim may stay in flight before it is presumed dead.
    pub lease: Duration,
    /// Where the owner's inbox is (`inbox_url` in -32003).
    pub inbox_base: String,
    /// How many refusal receipts each key has left this minute.
    pub refusals: RefusalBudget,
}

/// Refusal receipts are written at most [`RefusalBudget::PER_MINUTE`] times a minute per key,
/// so a key sending junk names cannot grow the store or push real receipts out of listings;
/// beyond that, one log line per minute counts them.
#[derive(Debug, Default)]
pub struct RefusalBudget {
    spent: std::sync::Mutex<std::collections::HashMap<crate::policy::KeyHash, (u64, u32)>>,
}

impl RefusalBudget {
    pub const PER_MINUTE: u32 = 60;

    fn take(&self, key: &VirtualKey) -> bool {
        let minute = now_ms() / 60_000;
        let mut spent = self.spent.lock().expect("refusal budget");
        if spent.len() > 10_000 {
            spent.retain(|_, (m, _)| *m == minute);
        }
        let entry = spent.entry(key.hash).or_insert((minute, 0));
        if entry.0 != minute {
            *entry = (minute, 0);
        }
        entry.1 += 1;
        if entry.1 == Self::PER_MINUTE + 1 {
            tracing::warn!(key = %key.name, "more than {} refused calls this minute; not recording receipts for the rest of it", Self::PER_MINUTE);
        }
        entry.1 <= Self::PER_MINUTE
    }
}

/// A `tools/call` as the client sent it.
#[derive(Debug)]
pub struct CallRequest {
    pub name: String,
    pub arguments: Map<String, Value>,
    /// The client's `Idempotency-Key`, already parsed; `None` means mint one.
    pub idempotency_key: Option<IdempotencyKey>,
    /// A verified approval token: this call resumes a held one.
    pub approval: Option<ApprovalGrant>,
}

/// The idempotency identity of a call that reached its claim; returned on every answer after
/// that point, errors included.
#[derive(Debug, Clone)]
pub struct ClaimIdentity {
    pub key: IdempotencyKey,
    /// `None` when the call left no receipt (nothing was sent and the claim was released).
    pub receipt_id: Option<String>,
}

/// What the client gets: the MCP result or an error, and the claim identity when one exists.
#[derive(Debug)]
pub struct Answer {
    pub result: Result<Value, ObolError>,
    pub claim: Option<ClaimIdentity>,
}

impl Answer {
    fn unclaimed(error: ObolError) -> Answer {
        Answer {
            result: Err(error),
            claim: None,
        }
    }
}

/// Runs one tool call.
pub async fn invoke(
    services: &Services,
    catalog: &Catalog,
    key: &VirtualKey,
    request: CallRequest,
) -> Answer {
    match prepare_call(services, catalog, key, request).await {
        Ok(call) => dispatch(services, call).await,
        Err(error) => Answer::unclaimed(error),
    }
}

/// Everything decided before any state is written.
struct Call {
    route: Arc<Route>,
    /// The policy decision that admitted the call, for the receipt.
    verdict: Verdict,
    request: Prepared,
    claim_key: ClaimKey,
    pin: Pin,
    key_supplied: bool,
    /// Who is calling, for the approval ticket.
    key_name: String,
    key_hash: String,
    /// The redacted arguments, for the approval ticket (empty unless approval is required).
    summary: Vec<String>,
    approval: Option<ApprovalGrant>,
}

/// Route, authorize, check arguments, and let the guest build the request. Pure: nothing is
/// written and nothing is sent, so every failure here leaves no trace but the error.
async fn prepare_call(
    services: &Services,
    catalog: &Catalog,
    key: &VirtualKey,
    request: CallRequest,
) -> Result<Call, ObolError> {
    // Route + authorize. Every way of not finding a callable tool is the same answer.
    let Some((route, verdict)) = route(catalog, key, &request.name) else {
        record_refusal(services, catalog, key, &request.name, &request.arguments);
        return Err(ObolError::UnknownTool);
    };
    let tool = route.tool();
    let arguments = Value::Object(request.arguments);

    // Arguments are checked by the host against the declared schema, so a component only
    // ever sees arguments its own schema admits.
    let violations = tool.input_schema.violations(&arguments);
    if !violations.is_empty() {
        return Err(ObolError::InvalidArguments(violations.join("; ")));
    }

    // A token approves one call: its tool, under the key it was held with. A different key
    // is denied rather than reconciled (spec/idempotency.md, "Approval binds the key").
    if let Some(grant) = &request.approval {
        if grant.tool != route.name.as_str() {
            return Err(ObolError::ApprovalMismatch(
                "the token approves another tool",
            ));
        }
        if let Some(supplied) = &request.idempotency_key
            && *supplied != grant.idempotency_key
        {
            return Err(ObolError::ApprovalMismatch(
                "the Idempotency-Key differs from the approved call's",
            ));
        }
    }
    let key_supplied = request.idempotency_key.is_some();
    let idempotency_key = request
        .idempotency_key
        .or_else(|| request.approval.as_ref().map(|g| g.idempotency_key.clone()))
        .unwrap_or_else(IdempotencyKey::mint);
    let summary = match verdict.approval {
        ApprovalRule::Required => approvals::summarize(&arguments),
        ApprovalRule::NotRequired | ApprovalRule::Waived => Vec::new(),
    };

    // Prepare: the guest turns the call into a request template.
    let facts = wit::ConnectionFacts {
        base_url: route.connection.base_url.as_str().to_owned(),
        settings: route
            .connection
            .settings
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
    };
    let template = services
        .runtime
        .prepare(
            &route.connector.guest,
            route.connector.manifest.name.as_str(),
            route.name.upstream(),
            arguments.to_string(),
            facts,
        )
        .await
        .map_err(guest_failed)?
        .map_err(|error| match error {
            wit::PrepareError::InvalidArguments(message) => ObolError::InvalidArguments(message),
            wit::PrepareError::UnknownTool => {
                ObolError::ComponentFailed("the component does not know its own tool".into())
            }
        })?;

    // Check the template and add what only the host adds.
    let prepared = Prepared::new(
        template,
        &route.connection.base_url,
        &tool.effect.propagation,
        Some(idempotency_key.as_str()),
        route.connection.secret.as_ref(),
    )
    .inspect_err(|error| {
        if *error == ObolError::EgressDenied {
            tracing::warn!(tool = %route.name, "refused a request outside the connection's origin");
        }
    })?;

    let pin = Pin::new(
        RequestHash::of_arguments(&arguments),
        tool.effect.propagation.pinned(),
        // The connection is part of the destination: an approval or a claim for one vendor
        // account can never be spent on another, even with the same origin.
        format!(
            "{} {}@{} {} {} {}",
            route.connection.id,
            route.connector.manifest.name,
            route.connector.manifest.version,
            prepared.method(),
            prepared.origin(),
            route.name.upstream()
        ),
    );
    // An approval for one destination or one set of arguments cannot be spent on another.
    if let Some(grant) = &request.approval
        && (grant.request_hash != pin.request_hash || grant.destination != pin.fingerprint)
    {
        return Err(ObolError::IdempotencyConflict);
    }
    let claim_key = ClaimKey {
        workspace: key.workspace.clone(),
        connection: ConnectionSegment::Resolved(route.connection.id.clone()),
        tool: route.name.as_str().to_owned(),
        key: idempotency_key,
    };
    Ok(Call {
        route,
        verdict,
        request: prepared,
        claim_key,
        pin,
        key_supplied,
        key_name: key.name.clone(),
        key_hash: key.hash.to_string(),
        summary,
        approval: request.approval,
    })
}

/// Claims the idempotency slot, then sends, classifies, renders and finalizes. A call that
/// needs approval claims its slot held instead; an approved resume takes that held slot.
async fn dispatch(services: &Services, call: Call) -> Answer {
    let store = &services.store;
    if let Some(grant) = &call.approval {
        return resume_approved(services, &call, grant).await;
    }
    let now = now_ms();
    let state = match call.verdict.approval {
        ApprovalRule::Required => ClaimState::AwaitingApproval {
            approval_id: ApprovalId::mint(),
            expires_at_ms: now + approvals::TICKET_TTL.as_millis() as u64,
        },
        // The first attempt is reserved in the same write that claims the slot.
        ApprovalRule::NotRequired | ApprovalRule::Waived => ClaimState::Reserved { attempt: 1 },
    };
    let (attempts, lease_until_ms) = match &state {
        // Nothing is reserved while held; the slot is kept as long as the ticket lives.
        ClaimState::AwaitingApproval { expires_at_ms, .. } => (0, *expires_at_ms),
        _ => (1, now + services.lease.as_millis() as u64),
    };
    let fresh = ClaimRecord {
        version: 1,
        pin: call.pin.clone(),
        state,
        attempts,
        lease_until_ms,
        receipt_id: receipt::new_id(),
        key_supplied: call.key_supplied,
        created_at_ms: now,
    };
    let identity = |record: &ClaimRecord| ClaimIdentity {
        key: call.claim_key.key.clone(),
        receipt_id: Some(record.receipt_id.clone()),
    };

    let held = match store.claim(&call.claim_key, &fresh).await {
        Err(error) => {
            tracing::warn!("claim failed, nothing sent: {error}");
            return Answer::unclaimed(ObolError::StoreUnavailable);
        }
        Ok(Claim::Acquired) if matches!(fresh.state, ClaimState::AwaitingApproval { .. }) => {
            let claim = Some(identity(&fresh));
            return Answer {
                result: Err(awaiting(services, &call, fresh).await),
                claim,
            };
        }
        Ok(Claim::Acquired) => fresh,
        Ok(Claim::Existing(existing)) => {
            let claim = Some(identity(&existing));
            match resume(services, &call, *existing).await {
                Resume::Answer(result) => return Answer { result, claim },
                Resume::Dispatch(record) => record,
            }
        }
    };
    let mut claim = identity(&held);
    let result = attempt(services, &call, held).await;
    // Nothing left the gateway and the claim was released: there is no receipt to name.
    if matches!(result, Err(ObolError::UpstreamUnreachable)) {
        claim.receipt_id = None;
    }
    Answer {
        result,
        claim: Some(claim),
    }
}

/// What to do with a claim that already existed.
enum Resume {
    Answer(Result<Value, ObolError>),
    /// We now hold the claim with a new attempt reserved.
    Dispatch(ClaimRecord),
}

async fn resume(services: &Services, call: &Call, existing: ClaimRecord) -> Resume {
    let lease_expired = existing.lease_until_ms <= now_ms();
    // A dead holder's attempt is settled first, whoever asks and whatever they ask: it may
    // have left, so its effect is unknown. This also keeps a claim from staying in flight
    // forever when every later call under the key conflicts with it.
    let existing = match existing.state {
        ClaimState::Reserved { .. } if lease_expired => {
            match settle_dead_holder(services, call, existing).await {
                Ok(settled) => settled,
                Err(answer) => return Resume::Answer(Err(answer)),
            }
        }
        _ => existing,
    };
    if existing.pin != call.pin {
        return Resume::Answer(Err(ObolError::IdempotencyConflict));
    }
    match &existing.state {
        ClaimState::Finalized { outcome } => {
            // Redispatch only what is unknown, and only when the vendor deduplicates on the
            // key it receives: then a resend cannot become a second effect.
            if outcome.class == OutcomeClass::Unknown && existing.pin.has_vendor_binding() {
                return take(services, call, existing).await;
            }
            Resume::Answer(replay(outcome, &existing))
        }
        // The holder died before reserving anything beyond what is already counted.
        ClaimState::Claimed if lease_expired => take(services, call, existing).await,
        ClaimState::Claimed | ClaimState::Reserved { .. } => {
            Resume::Answer(Err(ObolError::NotReady))
        }
        // Held: only a token moves it on, whatever policy says now.
        ClaimState::AwaitingApproval { .. } => {
            Resume::Answer(Err(awaiting(services, call, existing).await))
        }
    }
}

/// The answer for a call whose slot is held for approval: the ticket again (written again if
/// it was lost), or the end of the hold when the owner denied it or it expired.
async fn awaiting(services: &Services, call: &Call, record: ClaimRecord) -> ObolError {
    let ClaimState::AwaitingApproval {
        approval_id,
        expires_at_ms,
    } = &record.state
    else {
        return ObolError::Internal;
    };
    let stored = match services.store.ticket(approval_id).await {
        Ok(stored) => stored,
        Err(_) => return ObolError::StoreUnavailable,
    };
    let ticket =
        stored.unwrap_or_else(|| ticket_for(call, &record, approval_id.clone(), *expires_at_ms));
    // Written again while pending: a no-op for a complete ticket, and the repair of one whose
    // write (or, on Redis, whose inbox entry) was lost.
    if ticket.status == TicketStatus::Pending && services.store.put_ticket(&ticket).await.is_err() {
        return ObolError::StoreUnavailable;
    }
    let error = match ticket.status {
        _ if ticket.expired(now_ms()) => ObolError::ApprovalExpired,
        TicketStatus::Denied { .. } => ObolError::ApprovalDenied,
        TicketStatus::Pending | TicketStatus::Approved { .. } => {
            return ObolError::ApprovalRequired(Box::new(ApprovalNotice::of(
                &ticket,
                &services.inbox_base,
            )));
        }
    };
    settle_held(&services.store, &ticket, error).await
}

/// The ticket for a call held under `record`.
fn ticket_for(call: &Call, record: &ClaimRecord, id: ApprovalId, expires_at_ms: u64) -> Ticket {
    Ticket {
        id,
        workspace: call.claim_key.workspace.clone(),
        key_name: call.key_name.clone(),
        key_hash: call.key_hash.clone(),
        tool: call.claim_key.tool.clone(),
        connection: call.route.connection.id.clone(),
        idempotency_key: call.claim_key.key.to_string(),
        request_hash: record.pin.request_hash.clone(),
        destination: record.pin.fingerprint.clone(),
        summary: call.summary.clone(),
        policy_publication: call.verdict.publication,
        policies: call.verdict.policies.clone(),
        created_at_ms: record.created_at_ms,
        expires_at_ms,
        status: TicketStatus::Pending,
    }
}

/// Ends a hold that will never dispatch (denied or expired): the slot is finalized as
/// rejected with a receipt, and `error` is what this and every later call under the key
/// answer. Nothing was sent, so the outcome is certain. Returns the error to answer.
pub async fn settle_held(store: &Store, ticket: &Ticket, error: ObolError) -> ObolError {
    let Ok(key) = IdempotencyKey::parse(&ticket.idempotency_key) else {
        return ObolError::Internal;
    };
    let claim_key = ClaimKey {
        workspace: ticket.workspace.clone(),
        connection: ConnectionSegment::Resolved(ticket.connection.clone()),
        tool: ticket.tool.clone(),
        key,
    };
    let record = match store.get(&claim_key).await {
        Ok(Some(record)) => record,
        Ok(None) => return ObolError::NotReady,
        Err(_) => return ObolError::StoreUnavailable,
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
    let mut next = record.clone();
    next.version += 1;
    next.state = ClaimState::Finalized {
        outcome: StoredOutcome {
            class: OutcomeClass::DefinitelyRejected,
            vendor_status: None,
            response: Err(error.to_jsonrpc_error()),
        },
    };
    let note = match error {
        ObolError::ApprovalDenied => "the workspace owner denied the call; nothing was sent",
        _ => "the approval expired before the call resumed; nothing was sent",
    };
    let receipt = receipt::held(ticket, &next, note);
    match store.finalize(&claim_key, &record, &next, &receipt).await {
        Ok(true) => error,
        Ok(false) => ObolError::NotReady,
        Err(_) => ObolError::StoreUnavailable,
    }
}

/// An approved (or denied) resume: the held slot is the only one it may use. It never
/// creates a claim, so a token whose call was never held cannot start an execution.
async fn resume_approved(services: &Services, call: &Call, grant: &ApprovalGrant) -> Answer {
    let identity = |record: &ClaimRecord| ClaimIdentity {
        key: call.claim_key.key.clone(),
        receipt_id: Some(record.receipt_id.clone()),
    };
    let existing = match services.store.get(&call.claim_key).await {
        Err(_) => return Answer::unclaimed(ObolError::StoreUnavailable),
        Ok(None) => {
            return Answer {
                result: Err(ObolError::NotReady),
                claim: Some(ClaimIdentity {
                    key: call.claim_key.key.clone(),
                    receipt_id: None,
                }),
            };
        }
        Ok(Some(existing)) => existing,
    };
    let claim = Some(identity(&existing));
    if existing.pin != call.pin {
        return Answer {
            result: Err(ObolError::IdempotencyConflict),
            claim,
        };
    }
    let held_here = matches!(
        &existing.state,
        ClaimState::AwaitingApproval { approval_id, .. } if *approval_id == grant.approval_id
    );
    if let ClaimState::AwaitingApproval { .. } = &existing.state
        && !held_here
    {
        return Answer {
            result: Err(ObolError::ApprovalMismatch(
                "another approval holds this call",
            )),
            claim,
        };
    }
    if !held_here {
        // Already resumed (by a concurrent or earlier resume) or settled: the ordinary rules
        // answer, so a repeated resume replays instead of dispatching again.
        return match resume(services, call, existing).await {
            Resume::Answer(result) => Answer { result, claim },
            Resume::Dispatch(record) => Answer {
                result: attempt(services, call, record).await,
                claim,
            },
        };
    }
    if grant.decision == Decision::Denied {
        let ticket = ticket_for(
            call,
            &existing,
            grant.approval_id.clone(),
            grant.expires_at_ms,
        );
        return Answer {
            result: Err(settle_held(&services.store, &ticket, ObolError::ApprovalDenied).await),
            claim,
        };
    }
    // Compare-and-set from the held state: of concurrent resumes, exactly one reserves the
    // attempt; the others answer `not_ready`, then replay once it is final.
    let mut next = existing.clone();
    next.version += 1;
    next.attempts = 1;
    next.state = ClaimState::Reserved { attempt: 1 };
    next.lease_until_ms = now_ms() + services.lease.as_millis() as u64;
    match services
        .store
        .transition(&call.claim_key, &existing, &next)
        .await
    {
        Ok(true) => Answer {
            result: attempt(services, call, next).await,
            claim,
        },
        Ok(false) => Answer {
            result: Err(ObolError::NotReady),
            claim,
        },
        Err(_) => Answer {
            result: Err(ObolError::StoreUnavailable),
            claim,
        },
    }
}

/// Finalizes a dead holder's in-flight attempt as `unknown`, with its receipt.
async fn settle_dead_holder(
    services: &Services,
    call: &Call,
    existing: ClaimRecord,
) -> Result<ClaimRecord, ObolError> {
    let outcome = StoredOutcome {
        class: OutcomeClass::Unknown,
        vendor_status: None,
        response: Err(ObolError::UpstreamTimeout.to_jsonrpc_error()),
    };
    let mut next = existing.clone();
    next.version += 1;
    next.state = ClaimState::Finalized { outcome };
    let receipt = receipt::build(
        call,
        &next,
        OutcomeClass::Unknown,
        None,
        Verification::Inconclusive,
        Some("the gateway holding this call stopped before recording its outcome"),
    );
    match services
        .store
        .finalize(&call.claim_key, &existing, &next, &receipt)
        .await
    {
        Ok(true) => Ok(next),
        Ok(false) => Err(ObolError::NotReady),
        Err(_) => Err(ObolError::StoreUnavailable),
    }
}

/// Takes over a claim by reserving its next attempt (compare-and-set: of two racers, one
/// wins and the other answers `not_ready`).
async fn take(services: &Services, call: &Call, existing: ClaimRecord) -> Resume {
    let next = reserve_next(services, &existing);
    match services
        .store
        .transition(&call.claim_key, &existing, &next)
        .await
    {
        Ok(true) => Resume::Dispatch(next),
        Ok(false) => Resume::Answer(Err(ObolError::NotReady)),
        Err(_) => Resume::Answer(Err(ObolError::StoreUnavailable)),
    }
}

/// The same attempt, reserved again with a fresh lease (the previous try provably never left).
fn renew(services: &Services, current: &ClaimRecord) -> ClaimRecord {
    let mut next = current.clone();
    next.version += 1;
    next.lease_until_ms = now_ms() + services.lease.as_millis() as u64;
    next
}

fn reserve_next(services: &Services, current: &ClaimRecord) -> ClaimRecord {
    let mut next = current.clone();
    next.version += 1;
    next.attempts += 1;
    next.state = ClaimState::Reserved {
        attempt: next.attempts,
    };
    next.lease_until_ms = now_ms() + services.lease.as_millis() as u64;
    next
}

/// The stored answer of a finished call, marked as a replay.
fn replay(outcome: &StoredOutcome, record: &ClaimRecord) -> Result<Value, ObolError> {
    match &outcome.response {
        Ok(result) => {
            let mut result = result.clone();
            result["_meta"]["obol"]["replayed"] = Value::Bool(true);
            result["_meta"]["obol"]["attempt_count"] = json!(record.attempts);
            Ok(result)
        }
        Err(error) => Err(ObolError::Replayed(error.clone())),
    }
}

/// How the attempts ended.
enum Sent {
    Reply(VendorReply),
    Failed(ObolError, OutcomeClass),
    /// Provably nothing reached the vendor on the last attempt.
    Nothing,
}

/// Sends the reserved attempt, and at most one immediate retry when the rules allow
/// (`spec/idempotency.md`, Retries), then classifies, renders and finalizes.
async fn attempt(
    services: &Services,
    call: &Call,
    mut held: ClaimRecord,
) -> Result<Value, ObolError> {
    let tool = call.route.tool();
    let binding = call.pin.has_vendor_binding();
    // One immediate retry per invocation, at most.
    let mut retried = false;
    let sent = loop {
        failpoint("hang-before-send").await;
        let outcome = services.outbound.send(call.request.clone()).await;
        failpoint("hang-after-send").await;
        let retry = match &outcome {
            _ if retried => None,
            // Provably never left: the same attempt is reserved again (renewing its lease),
            // so attempt_count still equals what the vendor may have received.
            AttemptOutcome::NotSent => Some(renew(services, &held)),
            AttemptOutcome::Responded(reply)
                if binding
                    && tool.effect.statuses.classify(reply.status) == StatusClass::Retryable =>
            {
                Some(reserve_next(services, &held))
            }
            _ => None,
        };
        if let Some(next) = retry {
            // The retry is reserved durably before it is sent, like the first attempt; if it
            // cannot be recorded, it is not sent.
            if let Ok(true) = services
                .store
                .transition(&call.claim_key, &held, &next)
                .await
            {
                held = next;
                retried = true;
                continue;
            }
        }
        break match outcome {
            AttemptOutcome::Responded(reply) => Sent::Reply(reply),
            AttemptOutcome::NotSent => Sent::Nothing,
            AttemptOutcome::SentNoReply => {
                Sent::Failed(ObolError::UpstreamTimeout, OutcomeClass::Unknown)
            }
            AttemptOutcome::TooLarge { status } => Sent::Failed(
                ObolError::UpstreamResponseTooLarge {
                    limit: services.outbound.max_response_bytes(),
                },
                outcome_class(tool.effect.statuses.classify(status)),
            ),
        };
    };

    let (class, status, result, verification, note) = match sent {
        Sent::Nothing => {
            // Nothing left the gateway on the last attempt: release the claim so the same
            // key can try again, instead of recording an outcome that never happened.
            // The attempt never left, so it is not counted.
            let mut next = held.clone();
            next.version += 1;
            next.attempts -= 1;
            match &call.approval {
                // An approved call goes back to its hold, not to a free slot: only the token
                // may move it on again, never a plain call under the same key.
                Some(grant) => {
                    next.state = ClaimState::AwaitingApproval {
                        approval_id: grant.approval_id.clone(),
                        expires_at_ms: grant.expires_at_ms,
                    };
                    next.lease_until_ms = grant.expires_at_ms;
                }
                None => {
                    next.state = ClaimState::Claimed;
                    next.lease_until_ms = now_ms();
                }
            }
            if !matches!(
                services
                    .store
                    .transition(&call.claim_key, &held, &next)
                    .await,
                Ok(true)
            ) {
                tracing::warn!(receipt = %held.receipt_id, "could not release an unsent claim; it frees itself when its lease ends");
            }
            return Err(ObolError::UpstreamUnreachable);
        }
        Sent::Failed(error, class) => (
            class,
            None,
            Err(error),
            Verification::Inconclusive,
            Some("the vendor's answer was not observed in full"),
        ),
        Sent::Reply(reply) => {
            let status = reply.status;
            let class = tool.effect.statuses.classify(status);
            let rendered = interpret(services, &call.route, class, reply).await;
            let verification = match (&rendered, outcome_class(class)) {
                (Ok(_), OutcomeClass::Accepted | OutcomeClass::DefinitelyRejected) => {
                    Verification::Verified
                }
                _ => Verification::Inconclusive,
            };
            let note = match (&rendered, class) {
                (Err(ObolError::OutputSchemaViolation), _) => {
                    Some("the output did not match the tool's output schema")
                }
                (Err(_), _) => Some("the component could not render the vendor's answer"),
                (Ok(_), StatusClass::Accepted | StatusClass::DefinitelyRejected) => None,
                (Ok(_), _) => Some("the vendor's status is not one the tool declares final"),
            };
            (
                outcome_class(class),
                Some(status),
                rendered,
                verification,
                note,
            )
        }
    };

    // Finalize: the outcome, the receipt and the audit record in one acknowledged write.
    let result = result.map(|mut value| {
        value["_meta"] = json!({ "obol": {
            "idempotency_key": call.claim_key.key.as_str(),
            "receipt_id": held.receipt_id,
            "verification": verification,
            "outcome": class,
            "vendor_status": status,
            "attempt_count": held.attempts,
            "replayed": false,
        }});
        value
    });
    let outcome = StoredOutcome {
        class,
        vendor_status: status,
        response: match &result {
            Ok(value) => Ok(value.clone()),
            Err(error) => Err(error.to_jsonrpc_error()),
        },
    };
    let mut finished = held.clone();
    finished.version += 1;
    finished.state = ClaimState::Finalized { outcome };
    let receipt = receipt::build(call, &finished, class, status, verification, note);
    match services
        .store
        .finalize(&call.claim_key, &held, &finished, &receipt)
        .await
    {
        Ok(true) => result,
        // Lost the claim (a lease expired under us) or could not record: the outcome is not
        // exposed, and the claim stays in flight until its lease says otherwise.
        Ok(false) | Err(_) => {
            tracing::warn!(receipt = %held.receipt_id, "could not record the outcome; answering not_ready");
            Err(ObolError::NotReady)
        }
    }
}

/// Runs `interpret` and checks its output. The class was decided before, by the host.
async fn interpret(
    services: &Services,
    route: &Route,
    class: StatusClass,
    reply: VendorReply,
) -> Result<Value, ObolError> {
    let output = services
        .runtime
        .interpret(
            &route.connector.guest,
            route.connector.manifest.name.as_str(),
            route.name.upstream(),
            wit::VendorResponse {
                status: reply.status,
                headers: reply.headers,
                body: reply.body,
            },
        )
        .await
        .map_err(guest_failed)?
        .map_err(|error| match error {
            wit::InterpretError::MalformedResponse(_) => {
                // The message is derived from the vendor's response; it stays out of errors
                // and logs.
                ObolError::ComponentFailed(
                    "the component could not read the vendor's response".into(),
                )
            }
            wit::InterpretError::UnknownTool => {
                ObolError::ComponentFailed("the component does not know its own tool".into())
            }
        })?;
    render_result(services, route, class, output)
}

/// Crash tests stop the gateway at a named point (`OBOL_FAILPOINTS`); only the `test-util`
/// build has failpoints.
async fn failpoint(name: &str) {
    #[cfg(feature = "test-util")]
    if crate::failpoint::active(name) {
        tracing::warn!("failpoint {name}: hanging");
        std::future::pending::<()>().await;
    }
    let _ = name;
}

fn outcome_class(class: StatusClass) -> OutcomeClass {
    match class {
        StatusClass::Accepted => OutcomeClass::Accepted,
        StatusClass::DefinitelyRejected => OutcomeClass::DefinitelyRejected,
        StatusClass::Retryable | StatusClass::Unknown => OutcomeClass::Unknown,
    }
}

/// Records why a call was answered `Unknown tool`, for the owner. The client's answer is the
/// same bytes whatever the reason; the receipt is written in the background so that the
/// answer does not wait on it either.
fn record_refusal(
    services: &Services,
    catalog: &Catalog,
    key: &VirtualKey,
    name: &str,
    arguments: &Map<String, Value>,
) {
    if !services.refusals.take(key) {
        return;
    }
    // The name is the client's: keep a bounded prefix of it.
    let shown: String = name.chars().take(200).collect();
    let mut connection = None;
    let mut verdict = None;
    let reason = match ToolName::parse(name) {
        None => "the tool name is malformed".to_owned(),
        Some(parsed) => match catalog.route(&key.workspace, parsed.as_str()) {
            None => {
                let exists = catalog.connectors.iter().any(|(connector, loaded)| {
                    connector.as_str() == parsed.connector()
                        && loaded
                            .manifest
                            .tools
                            .iter()
                            .any(|t| t.upstream_name == parsed.upstream())
                });
                if exists {
                    "no connection of the workspace routes this connector".to_owned()
                } else {
                    "no loaded connector has this tool".to_owned()
                }
            }
            Some(route) => {
                connection = Some(route.connection.id.clone());
                match crate::policy::prefilter_refusal(key, route) {
                    Some(rule) => format!("hidden by the prefilter: {rule}"),
                    None => {
                        let decided = catalog.policies.decide(key, route, false);
                        let reason = match decided.publication {
                            Some(number) => format!("denied by Cedar publication {number}"),
                            None => {
                                "the key is pinned to a publication that does not exist".to_owned()
                            }
                        };
                        verdict = Some(decided);
                        reason
                    }
                }
            }
        },
    };
    let receipt = receipt::refused(
        key,
        &shown,
        connection.as_deref(),
        &Value::Object(arguments.clone()),
        reason,
        verdict.as_ref(),
    );
    let store = services.store.clone();
    tokio::spawn(async move {
        if let Err(error) = store.record_refusal(&receipt).await {
            tracing::warn!(receipt = %receipt.id, "could not record a refusal: {error}");
        }
    });
}

/// Finds the route for a name the key may call, with the policy verdict that allowed it.
/// `None` covers every reason alike.
pub fn route(catalog: &Catalog, key: &VirtualKey, name: &str) -> Option<(Arc<Route>, Verdict)> {
    let parsed = ToolName::parse(name)?;
    let route = catalog.route(&key.workspace, parsed.as_str())?;
    let verdict = catalog.view(key).verdicts.get(parsed.as_str())?.clone();
    Some((Arc::clone(route), verdict))
}

fn guest_failed(failure: GuestFailure) -> ObolError {
    match failure {
        GuestFailure::Busy(_) => ObolError::Overloaded,
        other => ObolError::ComponentFailed(other.to_string()),
    }
}

/// Builds the `CallToolResult`, enforcing the output cap and the output schema.
fn render_result(
    services: &Services,
    route: &Route,
    class: StatusClass,
    output: wit::ToolOutput,
) -> Result<Value, ObolError> {
    let limit = services.runtime.limits().max_output_bytes;
    let mut size = output.structured.as_ref().map_or(0, String::len);
    let mut content = Vec::with_capacity(output.content.len());
    for item in output.content {
        let rendered = match item {
            wit::Content::Text(text) => {
                size += text.len();
                json!({ "type": "text", "text": text })
            }
            wit::Content::Image(image) => {
                size += image.data.len() * 4 / 3;
                json!({ "type": "image", "mimeType": image.mime_type, "data": base64::engine::general_purpose::STANDARD.encode(&image.data) })
            }
        };
        if size > limit {
            return Err(ObolError::ComponentOutputTooLarge { limit });
        }
        content.push(rendered);
    }
    if size > limit {
        return Err(ObolError::ComponentOutputTooLarge { limit });
    }
    let structured = match output.structured {
        None => None,
        Some(text) => Some(serde_json::from_str::<Value>(&text).map_err(|_| {
            ObolError::ComponentFailed(
                "the component returned structured output that is not JSON".into(),
            )
        })?),
    };
    // The output schema describes a successful result; a rejected call's error body is not
    // expected to match it. A violation reveals nothing of the response.
    if class == StatusClass::Accepted
        && let Some(schema) = &route.tool().effect.output_schema
    {
        let conforms = structured
            .as_ref()
            .is_some_and(|value| schema.is_valid(value));
        if !conforms {
            tracing::warn!(tool = %route.name, "structured output violates the tool's output schema");
            return Err(ObolError::OutputSchemaViolation);
        }
    }
    let mut result = json!({
        "content": content,
        "isError": class != StatusClass::Accepted,
    });
    if let Some(structured) = structured {
        result["structuredContent"] = structured;
    }
    Ok(result)
}
