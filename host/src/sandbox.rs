//! A local stand-in for the vendors the first-party connectors talk to, so `obol serve` with
//! the example config lists and calls tools end to end with no account and no network.
//!
//! It imitates just enough of a Stripe-shaped payments API (`/v1/refunds`, `/v1/charges`,
//! honouring `Idempotency-Key` as Stripe does) and a GitHub-Issues-shaped tracker. State lives
//! in memory and is lost on exit.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Value, json};

#[derive(Default)]
struct Vendor {
    refunds_by_key: HashMap<String, Value>,
    refunds: u64,
    issues: Vec<Value>,
}

type Shared = Arc<Mutex<Vendor>>;

/// Starts the sandbox vendor and returns the address it listens on.
pub async fn spawn(address: SocketAddr) -> std::io::Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind(address).await?;
    let bound = listener.local_addr()?;
    let app = Router::new()
        .route("/v1/refunds", post(create_refund))
        .route("/v1/charges", get(list_charges))
        .route("/repos/{owner}/{repo}/issues", post(create_issue))
        .route(
            "/repos/{owner}/{repo}/issues/{number}",
            get(get_issue).patch(update_issue),
        )
        .with_state(Shared::default());
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Ok(bound)
}

fn stripe_error(status: StatusCode, message: &str) -> Response {
    let body = json!({ "error": { "type": "invalid_request_error", "message": message } });
    (status, axum::Json(body)).into_response()
}

async fn create_refund(
    State(vendor): State<Shared>,
    headers: HeaderMap,
    axum::Form(form): axum::Form<HashMap<String, String>>,
) -> Response {
    let Some(charge) = form.get("charge").filter(|c| c.starts_with("ch_")) else {
        return stripe_error(StatusCode::BAD_REQUEST, "No such charge");
    };
    let amount: u64 = form
        .get("amount")
        .and_then(|a| a.parse().ok())
        .unwrap_or(1000);
    let key = headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let mut vendor = vendor.lock().expect("sandbox lock");
    if let Some(previous) = key.as_ref().and_then(|k| vendor.refunds_by_key.get(k)) {
        return axum::Json(previous.clone()).into_response();
    }
    vendor.refunds += 1;
    let refund = json!({
        "id": format!("re_sandbox{:06}", vendor.refunds),
        "object": "refund",
        "amount": amount,
        "charge": charge,
        "currency": "usd",
        "status": "succeeded",
    });
    if let Some(key) = key {
        vendor.refunds_by_key.insert(key, refund.clone());
    }
    axum::Json(refund).into_response()
}

async fn list_charges(Query(query): Query<HashMap<String, String>>) -> Response {
    let limit: usize = query
        .get("limit")
        .and_then(|l| l.parse().ok())
        .unwrap_or(10)
        .min(100);
    let data: Vec<Value> = (1..=3)
        .take(limit)
        .map(|n| {
            json!({
                "id": format!("ch_sandbox{n:04}"),
                "object": "charge",
                "amount": 1000 * n,
                "currency": "usd",
                "customer": query.get("customer").cloned().unwrap_or_else(|| "cus_sandbox".into()),
                "status": "succeeded",
            })
        })
        .collect();
    axum::Json(json!({ "object": "list", "data": data, "has_more": false })).into_response()
}

async fn create_issue(
    State(vendor): State<Shared>,
    Path((owner, repo)): Path<(String, String)>,
    axum::Json(body): axum::Json<Value>,
) -> Response {
    let Some(title) = body.get("title").and_then(Value::as_str) else {
        return (
            StatusCode::UNPROCESSABLE_ENTITY,
            axum::Json(json!({"message": "Validation Failed"})),
        )
            .into_response();
    };
    let mut vendor = vendor.lock().expect("sandbox lock");
    let number = vendor.issues.len() + 1;
    let issue = json!({
        "number": number,
        "title": title,
        "body": body.get("body").cloned().unwrap_or(Value::Null),
        "state": "open",
        "html_url": format!("https://tracker.example/{owner}/{repo}/issues/{number}"),
        "url": format!("https://tracker.example/{owner}/{repo}/issues/{number}"),
    });
    vendor.issues.push(issue.clone());
    (StatusCode::CREATED, axum::Json(issue)).into_response()
}

async fn get_issue(
    State(vendor): State<Shared>,
    Path((_, _, number)): Path<(String, String, usize)>,
) -> Response {
    let vendor = vendor.lock().expect("sandbox lock");
    match number.checked_sub(1).and_then(|i| vendor.issues.get(i)) {
        Some(issue) => axum::Json(issue.clone()).into_response(),
        None => (
            StatusCode::NOT_FOUND,
            axum::Json(json!({"message": "Not Found"})),
        )
            .into_response(),
    }
}

async fn update_issue(
    State(vendor): State<Shared>,
    Path((_, _, number)): Path<(String, String, usize)>,
    axum::Json(body): axum::Json<Value>,
) -> Response {
    let mut vendor = vendor.lock().expect("sandbox lock");
    match number.checked_sub(1).and_then(|i| vendor.issues.get_mut(i)) {
        Some(issue) => {
            if let Some(state) = body.get("state") {
                issue["state"] = state.clone();
            }
            axum::Json(issue.clone()).into_response()
        }
        None => (
            StatusCode::NOT_FOUND,
            axum::Json(json!({"message": "Not Found"})),
        )
            .into_response(),
    }
}
