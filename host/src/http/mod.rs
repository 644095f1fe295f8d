//! REST routes beside `/mcp`: receipts for the workspace that owns them.
//!
//! `GET /v1/receipts?limit=N` (newest first) and `GET /v1/receipts/{id}`, authenticated with
//! a key of the workspace (`Authorization: Bearer <key>`). A receipt of another workspace
//! answers exactly like one that does not exist.

use std::sync::Arc;

use axum::Router;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde_json::json;

use crate::error::ObolError;
use crate::gateway::Gateway;
use crate::policy::{Scope, VirtualKey};

pub fn router(gateway: Arc<Gateway>) -> Router {
    Router::new()
        .route("/v1/receipts", get(list))
        .route("/v1/receipts/{id}", get(show))
        .with_state(gateway)
}

#[derive(serde::Deserialize)]
struct ListQuery {
    limit: Option<usize>,
}

fn error(status: StatusCode, kind: &str, message: &str) -> Response {
    let body = json!({ "error": { "type": kind, "message": message, "retryable": status.is_server_error() } });
    (status, axum::Json(body)).into_response()
}

/// The same admission as `/mcp` (one rule, one place), with the receipts scope.
fn authenticate(gateway: &Gateway, headers: &HeaderMap) -> Result<Arc<VirtualKey>, Box<Response>> {
    crate::mcp::single_header(headers, header::AUTHORIZATION.as_str())
        .map_err(|_| ObolError::Unauthenticated("the Authorization header is malformed"))
        .and_then(|authorization| gateway.admit(authorization, Scope::Receipts))
        .map_err(|refused| {
            let wire = refused.wire();
            Box::new(error(
                wire.http,
                wire.kind.unwrap_or("unauthenticated"),
                &refused.to_string(),
            ))
        })
}

async fn list(
    State(gateway): State<Arc<Gateway>>,
    headers: HeaderMap,
    Query(query): Query<ListQuery>,
) -> Response {
    let key = match authenticate(&gateway, &headers) {
        Ok(key) => key,
        Err(response) => return *response,
    };
    let limit = query.limit.unwrap_or(50).clamp(1, 1000);
    match gateway.services.store.receipts(&key.workspace, limit).await {
        Ok(receipts) => axum::Json(json!({ "receipts": receipts })).into_response(),
        Err(_) => error(
            StatusCode::SERVICE_UNAVAILABLE,
            "store_unavailable",
            "the state store is unavailable",
        ),
    }
}

async fn show(
    State(gateway): State<Arc<Gateway>>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Response {
    let key = match authenticate(&gateway, &headers) {
        Ok(key) => key,
        Err(response) => return *response,
    };
    match gateway.services.store.receipt(&key.workspace, &id).await {
        Ok(Some(receipt)) => axum::Json(receipt).into_response(),
        Ok(None) => error(StatusCode::NOT_FOUND, "not_found", "no such receipt"),
        Err(_) => error(
            StatusCode::SERVICE_UNAVAILABLE,
            "store_unavailable",
            "the state store is unavailable",
        ),
    }
}
