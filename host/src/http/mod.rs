//! HTTP routes beside `/mcp`: receipts for the workspace that owns them, approvals for the
//! key that asked for them, and the owner's inbox page ([`inbox`]).
//!
//! `GET /v1/receipts?limit=N` (newest first) and `GET /v1/receipts/{id}`, authenticated with
//! the workspace's owner token or a key of the workspace with the `receipts` scope
//! (`Authorization: Bearer …`). A receipt of another workspace answers exactly like one that
//! does not exist; so does a refusal receipt to a key (only the owner sees refusals).
//!
//! `GET /v1/approvals/{id}` (scope `approvals`): the state of a held call, and once the owner
//! decided, the signed token to resume it with. Only the key whose call was held sees it.
//!
//! `POST /v1/route` (scope `route`), body `{"capability": "cap.NAME", "arguments": {…}}`: the
//! provider a new call of the capability would be routed to now, why, and what was passed
//! over; nothing is dispatched (`find_capability` is its MCP mirror).
//!
//! Every refusal here, and in the admin API, is an [`ObolError`] rendered by
//! [`ObolError::to_rest_response`]: the same envelope `/mcp` sends (`docs/errors.md`). The
//! inbox answers a browser, so it renders HTML pages instead.

pub mod console;
pub mod inbox;
mod page;

use std::sync::Arc;

use axum::Router;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde_json::json;

use crate::approvals::{
    APPROVAL_ID_HEADER, APPROVAL_TOKEN_HEADER, ApprovalId, Decision, TicketStatus, rfc3339,
};
use crate::clock::now_ms;
use crate::error::ObolError;
use crate::gateway::Gateway;
use crate::policy::{Scope, VirtualKey};
use crate::store::{Receipt, StoreError};

pub fn router(gateway: Arc<Gateway>) -> Router {
    Router::new()
        .route("/v1/receipts", get(list))
        .route("/v1/receipts/{id}", get(show))
        .route("/v1/approvals/{id}", get(approval))
        .route("/v1/route", axum::routing::post(route))
        .with_state(gateway)
}

#[derive(serde::Deserialize)]
struct ListQuery {
    limit: Option<usize>,
}

/// A store failure on a REST route. The operator reads the cause in the log; the client
/// learns only that it may retry.
pub(crate) fn store_unavailable(during: &str, cause: &StoreError) -> Response {
    tracing::warn!("{during}: {cause}");
    ObolError::StoreUnavailable.to_rest_response()
}

/// The same admission as `/mcp` (one rule, one place), with the endpoint's scope.
fn authenticate(
    gateway: &Gateway,
    headers: &HeaderMap,
    scope: Scope,
) -> Result<Arc<VirtualKey>, Box<Response>> {
    crate::mcp::single_header(headers, header::AUTHORIZATION.as_str())
        .map_err(|_| ObolError::Unauthenticated("the Authorization header is malformed"))
        .and_then(|authorization| gateway.admit(authorization, scope))
        .map_err(|refused| Box::new(refused.to_rest_response()))
}

/// Who reads receipts: the workspace owner (its owner token) sees every receipt; a key with
/// the receipts scope sees all but refusals, whose reasons would undo existence hiding.
struct Reader {
    workspace: String,
    owner: bool,
}

impl Reader {
    fn admit(gateway: &Gateway, headers: &HeaderMap) -> Result<Reader, Box<Response>> {
        let presented = crate::mcp::single_header(headers, header::AUTHORIZATION.as_str())
            .ok()
            .flatten()
            .and_then(crate::policy::bearer_token);
        if let Some(workspace) = presented.and_then(|t| gateway.approvals.owners.workspace(t)) {
            return Ok(Reader {
                workspace: workspace.to_owned(),
                owner: true,
            });
        }
        let key = authenticate(gateway, headers, Scope::Receipts)?;
        Ok(Reader {
            workspace: key.workspace.clone(),
            owner: false,
        })
    }

    fn may_read(&self, receipt: &Receipt) -> bool {
        self.owner || !receipt.refusal
    }
}

async fn list(
    State(gateway): State<Arc<Gateway>>,
    headers: HeaderMap,
    Query(query): Query<ListQuery>,
) -> Response {
    let reader = match Reader::admit(&gateway, &headers) {
        Ok(reader) => reader,
        Err(response) => return *response,
    };
    let limit = query.limit.unwrap_or(50).clamp(1, 1000);
    match gateway
        .services
        .store
        .receipts(&reader.workspace, limit)
        .await
    {
        Ok(mut receipts) => {
            receipts.retain(|r| reader.may_read(r));
            axum::Json(json!({ "receipts": receipts })).into_response()
        }
        Err(cause) => store_unavailable("listing receipts", &cause),
    }
}

async fn show(
    State(gateway): State<Arc<Gateway>>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Response {
    let reader = match Reader::admit(&gateway, &headers) {
        Ok(reader) => reader,
        Err(response) => return *response,
    };
    match gateway.services.store.receipt(&reader.workspace, &id).await {
        Ok(Some(receipt)) if reader.may_read(&receipt) => axum::Json(receipt).into_response(),
        Ok(_) => ObolError::NotFound("receipt").to_rest_response(),
        Err(cause) => store_unavailable("reading a receipt", &cause),
    }
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct RouteQuestion {
    capability: String,
    #[serde(default)]
    arguments: serde_json::Map<String, serde_json::Value>,
}

async fn route(
    State(gateway): State<Arc<Gateway>>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    let key = match authenticate(&gateway, &headers, Scope::Route) {
        Ok(key) => key,
        Err(response) => return *response,
    };
    let question: RouteQuestion = match serde_json::from_slice(&body) {
        Ok(question) => question,
        Err(error) => {
            return ObolError::InvalidParams(format!(
                "the body is {{\"capability\": \"cap.NAME\", \"arguments\": {{…}}}} ({error})"
            ))
            .to_rest_response();
        }
    };
    let catalog = gateway.catalog();
    match crate::invoke::resolve::preview(
        &gateway.services,
        &catalog,
        &key,
        &question.capability,
        &question.arguments,
    ) {
        Ok(answer) => axum::Json(answer).into_response(),
        Err(error) => error.to_rest_response(),
    }
}

async fn approval(
    State(gateway): State<Arc<Gateway>>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Response {
    let key = match authenticate(&gateway, &headers, Scope::Approvals) {
        Ok(key) => key,
        Err(response) => return *response,
    };
    let not_found = || ObolError::NotFound("approval").to_rest_response();
    let Some(id) = ApprovalId::parse(&id) else {
        return not_found();
    };
    let ticket = match gateway.services.store.ticket(&id).await {
        // Another key's ticket answers exactly like a missing one.
        Ok(Some(ticket))
            if ticket.workspace == key.workspace && ticket.key_hash == key.hash.to_string() =>
        {
            ticket
        }
        Ok(_) => return not_found(),
        Err(cause) => return store_unavailable("reading an approval", &cause),
    };
    let keyring = &gateway.approvals.keyring;
    let (status, token) = match ticket.status {
        _ if ticket.expired(now_ms()) => ("expired", None),
        TicketStatus::Pending => ("pending", None),
        TicketStatus::Approved { .. } => {
            ("approved", Some(keyring.sign(&ticket, Decision::Approved)))
        }
        TicketStatus::Denied { .. } => ("denied", Some(keyring.sign(&ticket, Decision::Denied))),
    };
    axum::Json(json!({
        "approval_id": ticket.id,
        "tool": ticket.tool,
        "status": status,
        "expires_at": rfc3339(ticket.expires_at_ms),
        "idempotency_key": ticket.idempotency_key,
        "token": token,
        "resume": {
            "headers": [APPROVAL_ID_HEADER, APPROVAL_TOKEN_HEADER],
        },
    }))
    .into_response()
}
