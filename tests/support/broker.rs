//! A mock catalog broker on loopback, serving both shapes the first-party federated
//! connectors speak: a Nango-shaped proxy (`/proxy/...`, retries set by a `Retries` header)
//! and a Composio-shaped execute API (`/api/v3/tools/execute/{ACTION}`, retries set by a
//! `retries` body field, answering `successful` and a `log_id`). Like the real brokers it
//! retries on its own unless told not to: a vendor answer of 5xx is tried again up to three
//! times. It records the directive it saw on every call and counts what the vendor behind it
//! received, so a test can compare that count with the receipts' attempts.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

/// One call the broker received.
#[derive(Debug, Clone)]
pub struct BrokerCall {
    pub path: String,
    /// The retries the caller asked for (`None`: it said nothing, so the broker's default).
    pub retries: Option<u64>,
    pub headers: Vec<(String, String)>,
}

#[derive(Default)]
struct Inner {
    calls: Vec<BrokerCall>,
    vendor_requests: usize,
    /// Vendor answers to play, in order (then 200).
    vendor_script: Vec<u16>,
    log_ids: u64,
    /// How long the broker takes to answer (after the vendor acted).
    delay: std::time::Duration,
}

#[derive(Clone)]
pub struct MockBroker {
    pub address: SocketAddr,
    inner: Arc<Mutex<Inner>>,
}

/// What a broker does without a directive: retry a failed vendor call three times.
const DEFAULT_RETRIES: u64 = 3;

impl MockBroker {
    pub async fn start() -> MockBroker {
        let inner = Arc::new(Mutex::new(Inner::default()));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let broker = MockBroker { address, inner };
        let app = Router::new().fallback(handle).with_state(broker.clone());
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        broker
    }

    pub fn base_url(&self) -> String {
        format!("http://{}", self.address)
    }

    pub fn calls(&self) -> Vec<BrokerCall> {
        self.inner.lock().unwrap().calls.clone()
    }

    /// Requests the vendor behind the broker received.
    pub fn vendor_requests(&self) -> usize {
        self.inner.lock().unwrap().vendor_requests
    }

    /// Answers only after `delay` (the vendor has acted by then).
    pub fn set_delay(&self, delay: std::time::Duration) {
        self.inner.lock().unwrap().delay = delay;
    }

    /// The vendor's next answers (statuses), in order.
    pub fn script_vendor(&self, statuses: &[u16]) {
        self.inner.lock().unwrap().vendor_script = statuses.to_vec();
    }
}

async fn handle(
    State(broker): State<MockBroker>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let path = uri.path().to_owned();
    let seen: Vec<(String, String)> = headers
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_str().unwrap_or_default().to_owned()))
        .collect();
    let json: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let retries = if path.starts_with("/proxy/") {
        headers
            .get("retries")
            .and_then(|v| v.to_str().ok()?.parse().ok())
    } else {
        json["retries"].as_u64()
    };
    let (response, delay) = {
        let mut inner = broker.inner.lock().unwrap();
        let response = answer(&mut inner, &method, path, seen, &json, retries);
        (response, inner.delay)
    };
    tokio::time::sleep(delay).await;
    response
}

fn answer(
    inner: &mut Inner,
    method: &Method,
    path: String,
    seen: Vec<(String, String)>,
    json: &Value,
    retries: Option<u64>,
) -> Response {
    inner.calls.push(BrokerCall {
        path: path.clone(),
        retries,
        headers: seen,
    });
    // The broker's own loop: one vendor request, then retries while the vendor fails.
    let mut status = 200;
    for _ in 0..=retries.unwrap_or(DEFAULT_RETRIES) {
        inner.vendor_requests += 1;
        status = if inner.vendor_script.is_empty() {
            200
        } else {
            inner.vendor_script.remove(0)
        };
        if status < 500 {
            break;
        }
    }
    if let Some(action) = path.strip_prefix("/api/v3/tools/execute/") {
        inner.log_ids += 1;
        let log_id = format!("log_{}", inner.log_ids);
        let answer = match status {
            200 => json!({
                "successful": true,
                "error": null,
                "data": {"action": action, "arguments": json["arguments"]},
                "log_id": log_id,
            }),
            _ => json!({
                "successful": false,
                "error": format!("the vendor answered {status}"),
                "data": {},
                "log_id": log_id,
            }),
        };
        // Composio answers 200 even when the action failed.
        return (StatusCode::OK, axum::Json(answer)).into_response();
    }
    if path.starts_with("/proxy/") {
        let body = match *method {
            Method::POST => json!({"id": "c_1", "properties": json["properties"]}),
            _ => json!({"id": path.rsplit('/').next().unwrap_or_default()}),
        };
        return (StatusCode::from_u16(status).unwrap(), axum::Json(body)).into_response();
    }
    StatusCode::NOT_FOUND.into_response()
}
