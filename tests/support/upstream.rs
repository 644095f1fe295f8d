//! A remote MCP server on loopback that misbehaves on demand: a hand-written Streamable HTTP
//! server (JSON-RPC over POST, a GET event stream for notifications), because the faults the
//! tests need — a connection dropped after the call arrived, an expired session, off-schema
//! output, a listing with colliding names — are what a well-made server library refuses to do.
//! It records every `tools/call` it receives, so a test can count what reached the upstream.

use std::collections::{HashMap, HashSet};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use tokio::sync::broadcast;

/// One `tools/call` as the upstream received it.
#[derive(Debug, Clone)]
pub struct Call {
    pub tool: String,
    pub arguments: Value,
    pub headers: HashMap<String, String>,
}

struct Inner {
    tools: Vec<Value>,
    sessions: HashSet<String>,
    next_session: u64,
    calls: Vec<Call>,
    /// Every request's headers (initialize and listings too).
    headers: Vec<HashMap<String, String>>,
    listings: usize,
    page_size: usize,
    slow: Duration,
    /// The protocol version `initialize` answers.
    version: String,
    /// Refuse every request with this status (an upstream that is down behind a proxy).
    down: Option<u16>,
    /// How long `initialize` takes to answer.
    slow_initialize: Duration,
    /// Where `tools/call` of `redirect` sends the caller (307).
    redirect_to: Option<String>,
}

#[derive(Clone)]
pub struct MockUpstream {
    pub address: SocketAddr,
    inner: Arc<Mutex<Inner>>,
    notify: broadcast::Sender<String>,
}

/// The tools the mock lists by default. Their names say what they do.
pub fn default_tools() -> Vec<Value> {
    let object = json!({ "type": "object" });
    vec![
        json!({
            "name": "echo",
            "description": "Echoes `text`.",
            "inputSchema": { "type": "object", "properties": { "text": { "type": "string" } }, "required": ["text"] },
            "outputSchema": { "type": "object", "properties": { "echo": { "type": "string" } }, "required": ["echo"] },
            "annotations": { "readOnlyHint": true },
        }),
        json!({ "name": "write", "description": "Writes; says nothing of its effects.", "inputSchema": object }),
        json!({ "name": "slow", "description": "Answers after a delay.", "inputSchema": object }),
        json!({ "name": "drop", "description": "Drops the connection once the call arrived.", "inputSchema": object }),
        json!({
            "name": "off_schema",
            "description": "Answers structured content its output schema forbids.",
            "inputSchema": object,
            "outputSchema": { "type": "object", "properties": { "n": { "type": "integer" } }, "required": ["n"] },
        }),
        json!({ "name": "huge", "description": "Answers 2 MiB.", "inputSchema": object }),
        json!({ "name": "fails", "description": "Answers isError: true.", "inputSchema": object }),
        json!({ "name": "invalid", "description": "Answers JSON-RPC invalid params.", "inputSchema": object }),
        json!({ "name": "busy", "description": "Answers HTTP 503.", "inputSchema": object }),
        json!({ "name": "files.read", "description": "A dotted name.", "inputSchema": object }),
    ]
}

impl MockUpstream {
    pub async fn start() -> MockUpstream {
        MockUpstream::start_with(default_tools()).await
    }

    pub async fn start_with(tools: Vec<Value>) -> MockUpstream {
        let inner = Arc::new(Mutex::new(Inner {
            tools,
            sessions: HashSet::new(),
            next_session: 0,
            calls: Vec::new(),
            headers: Vec::new(),
            listings: 0,
            page_size: 3,
            slow: Duration::from_secs(10),
            version: "2025-06-18".into(),
            down: None,
            slow_initialize: Duration::ZERO,
            redirect_to: None,
        }));
        let (notify, _) = broadcast::channel(16);
        let upstream = MockUpstream {
            address: "127.0.0.1:0".parse().unwrap(),
            inner,
            notify,
        };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let upstream = MockUpstream {
            address,
            ..upstream
        };
        let app = Router::new().fallback(handle).with_state(upstream.clone());
        tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        upstream
    }

    pub fn url(&self) -> String {
        format!("http://{}/mcp", self.address)
    }

    pub fn calls(&self) -> Vec<Call> {
        self.inner.lock().unwrap().calls.clone()
    }

    /// How many `tools/call` requests named `tool`.
    pub fn calls_to(&self, tool: &str) -> usize {
        self.calls().iter().filter(|c| c.tool == tool).count()
    }

    pub fn listings(&self) -> usize {
        self.inner.lock().unwrap().listings
    }

    pub fn headers(&self) -> Vec<HashMap<String, String>> {
        self.inner.lock().unwrap().headers.clone()
    }

    /// Forgets every session: the next request on one is answered 404.
    pub fn expire_sessions(&self) {
        self.inner.lock().unwrap().sessions.clear();
    }

    pub fn sessions_opened(&self) -> u64 {
        self.inner.lock().unwrap().next_session
    }

    /// Replaces the tool list and tells every open stream.
    pub fn set_tools(&self, tools: Vec<Value>) {
        self.inner.lock().unwrap().tools = tools;
        let _ = self.notify.send(
            json!({ "jsonrpc": "2.0", "method": "notifications/tools/list_changed" }).to_string(),
        );
    }

    /// Answers every request with `status` (`None`: serve again).
    pub fn set_down(&self, status: Option<u16>) {
        self.inner.lock().unwrap().down = status;
    }

    /// Makes `initialize` answer only after `delay` (an upstream that accepts connections but
    /// does not get to its handshake).
    pub fn set_slow_initialize(&self, delay: Duration) {
        self.inner.lock().unwrap().slow_initialize = delay;
    }

    /// Makes `tools/call` of `redirect` answer 307 to `location` (a foreign origin).
    pub fn set_redirect(&self, location: &str) {
        self.inner.lock().unwrap().redirect_to = Some(location.to_owned());
    }

    pub fn set_slow(&self, delay: Duration) {
        self.inner.lock().unwrap().slow = delay;
    }
}

fn headers_of(headers: &HeaderMap) -> HashMap<String, String> {
    headers
        .iter()
        .map(|(k, v)| {
            (
                k.as_str().to_owned(),
                v.to_str().unwrap_or_default().to_owned(),
            )
        })
        .collect()
}

fn json_response(body: Value, session: Option<&str>) -> Response {
    let mut response = (
        StatusCode::OK,
        [("content-type", "application/json")],
        body.to_string(),
    )
        .into_response();
    if let Some(session) = session {
        response
            .headers_mut()
            .insert("mcp-session-id", session.parse().unwrap());
    }
    response
}

async fn handle(
    State(upstream): State<MockUpstream>,
    method: Method,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let seen = headers_of(&headers);
    let session = seen.get("mcp-session-id").cloned();
    {
        let mut inner = upstream.inner.lock().unwrap();
        inner.headers.push(seen.clone());
        if let Some(status) = inner.down {
            return StatusCode::from_u16(status).unwrap().into_response();
        }
        if let Some(id) = &session
            && !inner.sessions.contains(id)
        {
            return StatusCode::NOT_FOUND.into_response();
        }
    }
    match method {
        Method::GET => {
            if session.is_none() {
                return StatusCode::METHOD_NOT_ALLOWED.into_response();
            }
            let mut receiver = upstream.notify.subscribe();
            let stream = async_stream(move |tx| async move {
                while let Ok(message) = receiver.recv().await {
                    if tx
                        .send(Ok(Bytes::from(format!("data: {message}\n\n"))))
                        .await
                        .is_err()
                    {
                        return;
                    }
                }
            });
            (
                StatusCode::OK,
                [("content-type", "text/event-stream")],
                Body::from_stream(stream),
            )
                .into_response()
        }
        Method::DELETE => StatusCode::OK.into_response(),
        Method::POST => post(upstream, seen, session, body).await,
        _ => StatusCode::METHOD_NOT_ALLOWED.into_response(),
    }
}

async fn post(
    upstream: MockUpstream,
    seen: HashMap<String, String>,
    session: Option<String>,
    body: Bytes,
) -> Response {
    let Ok(request) = serde_json::from_slice::<Value>(&body) else {
        return StatusCode::BAD_REQUEST.into_response();
    };
    let Some(id) = request.get("id").cloned() else {
        return StatusCode::ACCEPTED.into_response();
    };
    let method = request["method"].as_str().unwrap_or_default();
    let params = &request["params"];
    let result = |result: Value| json!({ "jsonrpc": "2.0", "id": id, "result": result });
    if method == "initialize" {
        let delay = upstream.inner.lock().unwrap().slow_initialize;
        if !delay.is_zero() {
            // An event stream that keeps the connection busy with comments, so no read
            // timeout fires, and never gets to the answer.
            let stream = async_stream(move |tx| async move {
                let until = tokio::time::Instant::now() + delay;
                while tokio::time::Instant::now() < until {
                    if tx
                        .send(Ok(Bytes::from_static(b": busy\n\n")))
                        .await
                        .is_err()
                    {
                        return;
                    }
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            });
            return (
                StatusCode::OK,
                [("content-type", "text/event-stream")],
                Body::from_stream(stream),
            )
                .into_response();
        }
        let mut inner = upstream.inner.lock().unwrap();
        inner.next_session += 1;
        let session = format!("mock-session-{}", inner.next_session);
        inner.sessions.insert(session.clone());
        let body = result(json!({
            "protocolVersion": inner.version,
            "capabilities": { "tools": { "listChanged": true } },
            "serverInfo": { "name": "mock-upstream", "version": "1.0.0" },
        }));
        return json_response(body, Some(&session));
    }
    if session.is_none() {
        return StatusCode::BAD_REQUEST.into_response();
    }
    match method {
        "ping" => json_response(result(json!({})), None),
        "tools/list" => {
            let mut inner = upstream.inner.lock().unwrap();
            inner.listings += 1;
            let start: usize = params["cursor"]
                .as_str()
                .and_then(|c| c.strip_prefix("page-"))
                .and_then(|n| n.parse().ok())
                .unwrap_or(0);
            let end = (start + inner.page_size).min(inner.tools.len());
            let mut page = json!({ "tools": inner.tools[start..end].to_vec() });
            if end < inner.tools.len() {
                page["nextCursor"] = json!(format!("page-{end}"));
            }
            json_response(result(page), None)
        }
        "tools/call" => {
            let tool = params["name"].as_str().unwrap_or_default().to_owned();
            let (slow, redirect_to) = {
                let mut inner = upstream.inner.lock().unwrap();
                inner.calls.push(Call {
                    tool: tool.clone(),
                    arguments: params["arguments"].clone(),
                    headers: seen,
                });
                (inner.slow, inner.redirect_to.clone())
            };
            let text = |text: &str| json!([{ "type": "text", "text": text }]);
            match tool.as_str() {
                "echo" => {
                    let said = params["arguments"]["text"].as_str().unwrap_or_default();
                    json_response(
                        result(
                            json!({ "content": text(said), "structuredContent": { "echo": said }, "isError": false }),
                        ),
                        None,
                    )
                }
                "slow" => {
                    tokio::time::sleep(slow).await;
                    json_response(result(json!({ "content": text("late") })), None)
                }
                "drop" => {
                    // Headers go out, then the body fails: the connection is cut mid-answer.
                    let stream = futures_util::stream::iter([Err::<Bytes, std::io::Error>(
                        std::io::Error::other("dropped on purpose"),
                    )]);
                    (
                        StatusCode::OK,
                        [("content-type", "application/json")],
                        Body::from_stream(stream),
                    )
                        .into_response()
                }
                "off_schema" => json_response(
                    result(
                        json!({ "content": text("secret-derived 4242"), "structuredContent": { "n": "not a number: secret-derived" } }),
                    ),
                    None,
                ),
                "huge" => json_response(
                    result(json!({ "content": text(&"x".repeat(2 << 20)) })),
                    None,
                ),
                "fails" => json_response(
                    result(json!({ "content": text("it went wrong"), "isError": true })),
                    None,
                ),
                "invalid" => json_response(
                    json!({ "jsonrpc": "2.0", "id": id, "error": { "code": -32602, "message": "bad arguments for invalid" } }),
                    None,
                ),
                "busy" => StatusCode::SERVICE_UNAVAILABLE.into_response(),
                "redirect" => (
                    StatusCode::TEMPORARY_REDIRECT,
                    [("location", redirect_to.unwrap_or_default())],
                )
                    .into_response(),
                _ => json_response(
                    result(json!({ "content": text(&format!("{tool} done")) })),
                    None,
                ),
            }
        }
        _ => json_response(
            json!({ "jsonrpc": "2.0", "id": id, "error": { "code": -32601, "message": "method not found" } }),
            None,
        ),
    }
}

/// A body stream fed by a task.
fn async_stream<F, Fut>(
    run: F,
) -> impl futures_util::Stream<Item = Result<Bytes, Infallible>> + Send + 'static
where
    F: FnOnce(tokio::sync::mpsc::Sender<Result<Bytes, Infallible>>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let (tx, mut rx) = tokio::sync::mpsc::channel(8);
    tokio::spawn(run(tx));
    futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx))
}
