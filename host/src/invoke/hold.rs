//! Hold: the answer for a call whose slot waits for the workspace owner — its ticket (written
//! again if it was lost, from the facts the claim recorded), or the end of the hold when the
//! owner denied it or it expired.

use super::Services;
use super::settle;
use crate::approvals::{Ticket, TicketStatus};
use crate::error::{ApprovalNotice, ObolError};
use crate::store::{ClaimKey, ClaimRecord, Holder};

/// Calls one key may have waiting for the owner at once. A key that asks for more gets a
/// retryable refusal and claims nothing, so one agent cannot bury the inbox.
pub const MAX_PENDING_PER_KEY: usize = 20;

/// Answers for a slot held under `record`. `caller` names the call only for records written
/// before claims recorded their holder; `summary` is the caller's redacted arguments, which
/// are the held call's (the request hash matched).
pub async fn answer(
    services: &Services,
    key: &ClaimKey,
    record: &ClaimRecord,
    caller: &Holder,
    summary: &[String],
) -> ObolError {
    let Some(held) = record.approval() else {
        return ObolError::Internal;
    };
    let holder = record.holder.as_deref().unwrap_or(caller);
    let stored = match services.store.ticket(&held.approval_id).await {
        Ok(stored) => stored,
        Err(error) => {
            tracing::warn!(approval = %held.approval_id, "could not read a ticket: {error}");
            return ObolError::StoreUnavailable;
        }
    };
    let ticket = stored.unwrap_or_else(|| Ticket {
        id: held.approval_id.clone(),
        workspace: holder.workspace.clone(),
        key_name: holder.key_name.clone(),
        key_hash: holder.key_hash.clone(),
        tool: holder.tool.clone(),
        connection: holder.connection.clone(),
        idempotency_key: holder.idempotency_key.clone(),
        request_hash: record.pin.request_hash.clone(),
        destination: record.pin.fingerprint.clone(),
        summary: summary.to_vec(),
        policy_publication: holder.publication,
        policies: holder.policies.clone(),
        created_at_ms: record.created_at_ms,
        expires_at_ms: held.expires_at_ms,
        status: TicketStatus::Pending,
        capability: holder.capability.clone(),
    });
    // Written again while pending: a no-op for a complete ticket, and the repair of one whose
    // write (or, on Redis, whose inbox entry) was lost.
    if ticket.status == TicketStatus::Pending
        && let Err(error) = services.store.put_ticket(&ticket).await
    {
        tracing::warn!(approval = %ticket.id, "could not write a ticket: {error}");
        return ObolError::StoreUnavailable;
    }
    match settle::ticket_ended(&ticket) {
        None => {
            ObolError::ApprovalRequired(Box::new(ApprovalNotice::of(&ticket, &services.inbox_base)))
        }
        Some(why) => match settle::settle(&services.store, key, record, why, Some(holder)).await {
            Ok(_) => why.error(),
            Err(error) => error,
        },
    }
}

/// Whether `holder`'s key may hold one more call for approval.
pub async fn room_for_another(services: &Services, holder: &Holder) -> Result<(), ObolError> {
    // Newest first; a key at its cap has its pending tickets among the workspace's latest.
    const LOOK_BACK: usize = 1000;
    let tickets = services
        .store
        .tickets(&holder.workspace, LOOK_BACK)
        .await
        .map_err(|error| {
            tracing::warn!("could not count pending approvals: {error}");
            ObolError::StoreUnavailable
        })?;
    let now = crate::clock::now_ms();
    let pending = tickets
        .iter()
        .filter(|t| {
            t.key_hash == holder.key_hash && t.status == TicketStatus::Pending && !t.expired(now)
        })
        .count();
    if pending >= MAX_PENDING_PER_KEY {
        return Err(ObolError::ApprovalBacklog {
            pending: MAX_PENDING_PER_KEY,
        });
    }
    Ok(())
}
