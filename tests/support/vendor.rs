//! A mock vendor: a real HTTP server on loopback that records every request and answers
//! from a script, so a test can assert exactly what the vendor saw.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

/// One request as the vendor received it.
#[derive(Debug, Clone)]
pub struct Seen {
    pub method: String,
    pub path: String,
    pub query: String,
    pub headers: HashMap<String, String>,
    pub body: Vec<u8>,
}

impl Seen {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(String::as_str)
    }

    pub fn body_text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// A scripted answer.
#[derive(Debug, Clone)]
pub struct Reply {
    pub status: u16,
    pub body: Vec<u8>,
    pub delay: Duration,
}

impl Reply {
    pub fn json(status: u16, body: Value) -> Reply {
        Reply {
            status,
            body: body.to_string().into_bytes(),
            delay: Duration::ZERO,
        }
    }

    pub fn after(mut self, delay: Duration) -> Reply {
        self.delay = delay;
        self
    }
}

#[derive(Default)]
struct Script {
    seen: Vec<Seen>,
    replies: HashMap<String, Reply>,
}

#[derive(Clone)]
pub struct MockVendor {
    pub address: SocketAddr,
    script: Arc<Mutex<Script>>,
}

impl MockVendor {
    pub async fn start() -> MockVendor {
        let script = Arc::new(Mutex::new(Script::default()));
        let app = Router::new()
            .fallback(answer)
            .with_state(Arc::clone(&script));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        MockVendor { address, script }
    }

    pub fn base_url(&self) -> String {
        format!("http://{}", self.address)
    }

    /// Answer requests to `path` with `reply` from now on.
    pub fn on(&self, path: &str, reply: Reply) {
        self.script
            .lock()
            .unwrap()
            .replies
            .insert(path.to_owned(), reply);
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.script.lock().unwrap().seen.clone()
    }

    pub fn count(&self, path: &str) -> usize {
        self.seen().iter().filter(|s| s.path == path).count()
    }
}

async fn answer(
    State(script): State<Arc<Mutex<Script>>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let path = uri.path().to_owned();
    let seen = Seen {
        method: method.to_string(),
        path: path.clone(),
        query: uri.query().unwrap_or_default().to_owned(),
        headers: headers
            .iter()
            .map(|(k, v)| (k.as_str().to_owned(), v.to_str().unwrap_or("").to_owned()))
            .collect(),
        body: body.to_vec(),
    };
    let scripted = {
        let mut script = script.lock().unwrap();
        script.seen.push(seen.clone());
        script.replies.get(&path).cloned()
    };
    let reply = scripted.unwrap_or_else(|| default_reply(&seen));
    tokio::time::sleep(reply.delay).await;
    let status = StatusCode::from_u16(reply.status).unwrap();
    (status, [("content-type", "application/json")], reply.body).into_response()
}

/// Plausible vendor answers for the first-party connectors' routes.
fn default_reply(seen: &Seen) -> Reply {
    let path = seen.path.as_str();
    if path == "/v1/refunds" {
        return Reply::json(
            200,
            json!({"id": "re_mock1", "object": "refund", "amount": 500, "charge": "ch_mock", "currency": "usd", "status": "succeeded"}),
        );
    }
    if path == "/v1/charges" {
        return Reply::json(
            200,
            json!({"object": "list", "has_more": false, "data": [
                {"id": "ch_1", "object": "charge", "amount": 1000, "currency": "usd", "status": "succeeded"},
                {"id": "ch_2", "object": "charge", "amount": 2000, "currency": "usd", "status": "succeeded"}
            ]}),
        );
    }
    if path.contains("/issues/") && seen.method == "GET" {
        return Reply::json(
            200,
            json!({"number": 7, "title": "Crash on start", "state": "open", "url": "https://tracker.example/o/r/issues/7", "html_url": "https://tracker.example/o/r/issues/7"}),
        );
    }
    if path.ends_with("/issues") {
        return Reply::json(
            201,
            json!({"number": 8, "title": "New", "state": "open", "url": "https://tracker.example/o/r/issues/8", "html_url": "https://tracker.example/o/r/issues/8"}),
        );
    }
    // `/echo`, `/peek` and anything else: echo the body back.
    let body = if seen.body.is_empty() {
        b"{}".to_vec()
    } else {
        seen.body.clone()
    };
    Reply {
        status: 200,
        body,
        delay: Duration::ZERO,
    }
}
