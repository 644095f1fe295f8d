//! `/mcp`: the Streamable HTTP transport, sessions, JSON-RPC dispatch and error rendering.
//!
//! A POST is checked in the order a request meets the gateway: origin (403), credentials
//! (401), `Accept` (406), `Content-Type` (415), size (413, refused before the body is
//! buffered), JSON (-32700), JSON-RPC shape (-32600), protocol version (400), session (400 /
//! 404). Only then does a method run. Every response is SSE and carries `MCP-Protocol-Version`;
//! `docs/transport.md` is the status matrix.

mod json;
pub mod listens;
mod session;
pub mod stateless;
pub mod trace;

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, Method, Request, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::any;
use futures_util::StreamExt;
use serde_json::{Map, Value, json};

use crate::approvals::{self, ApprovalGrant, ApprovalId, TokenError};
use crate::error::ObolError;
use crate::gateway::{Event, Gateway};
use crate::idempotency::IdempotencyKey;
use crate::invoke::{self, CallRequest, ClaimIdentity};
use crate::policy::{Scope, VirtualKey};

pub use session::{Session, SessionId, Sessions};

/// Bodies larger than this are refused before they are read (spec: "capped at 8 MiB").
pub const MAX_BODY_BYTES: usize = 8 << 20;
/// Protocol versions echoed back by `initialize`; anything else gets the latest.
pub const SUPPORTED_VERSIONS: [&str; 4] = ["2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25"];
pub const LATEST_VERSION: &str = "2025-11-25";

const SESSION_HEADER: &str = "mcp-session-id";
const VERSION_HEADER: &str = "mcp-protocol-version";
const IDEMPOTENCY_HEADER: &str = "idempotency-key";
const KEEPALIVE: Duration = Duration::from_secs(15);

pub fn router(gateway: Arc<Gateway>) -> Router {
    Router::new().route("/mcp", any(handle)).with_state(gateway)
}

async fn handle(State(gateway): State<Arc<Gateway>>, request: Request<Body>) -> Response {
    // Taken apart rather than extracted: axum's `HeaderMap` extractor copies every header.
    let (parts, body) = request.into_parts();
    let (method, headers) = (parts.method, parts.headers);
    let version = known_version(&headers).unwrap_or(LATEST_VERSION);
    // The stateless revision has no GET stream and no session to delete.
    let stateless = headers
        .get(VERSION_HEADER)
        .is_some_and(|v| stateless::SUPPORTED.iter().any(|s| v == *s));
    if stateless && method != Method::POST {
        // Origin and key first, as for every method.
        if let Err(refused) = admit(&gateway, &headers) {
            return rejection(&refused, Value::Null, stateless::VERSION);
        }
        let mut response = method_not_allowed(stateless::VERSION);
        response
            .headers_mut()
            .insert(header::ALLOW, HeaderValue::from_static("POST"));
        return response;
    }
    let outcome = match method {
        Method::POST => post(&gateway, &headers, body).await,
        Method::GET => get(Arc::clone(&gateway), &headers).await,
        Method::DELETE => delete(&gateway, &headers).await,
        _ => Ok(method_not_allowed(version)),
    };
    outcome.unwrap_or_else(|error| rejection(&error, Value::Null, version))
}

/// Checks that precede everything else, for every HTTP method.
fn admit(gateway: &Gateway, headers: &HeaderMap) -> Result<Arc<VirtualKey>, ObolError> {
    if let Some(origin) = single_header(headers, header::ORIGIN.as_str())?
        && !gateway.origin_allowed(origin)
    {
        return Err(ObolError::OriginNotAllowed(origin.to_owned()));
    }
    let authorization = single_header(headers, header::AUTHORIZATION.as_str())
        .map_err(|_| ObolError::Unauthenticated("the Authorization header is malformed"))?;
    gateway.admit(authorization, Scope::Mcp)
}

async fn post(
    gateway: &Arc<Gateway>,
    headers: &HeaderMap,
    body: Body,
) -> Result<Response, ObolError> {
    let key = admit(gateway, headers)?;
    // A client that supplied a well-formed key gets it back on every authenticated answer,
    // refusals before the MCP server included (a minted key exists only once a call is read).
    let supplied = single_header(headers, IDEMPOTENCY_HEADER)
        .ok()
        .flatten()
        .and_then(|text| IdempotencyKey::parse(text).ok());
    match post_admitted(gateway, headers, body, &key).await {
        Err(error)
            if supplied.is_some() && !matches!(error, ObolError::InvalidIdempotencyKey(_)) =>
        {
            let version = known_version(headers).unwrap_or(LATEST_VERSION);
            let identity = supplied.map(|key| ClaimIdentity {
                key,
                receipt_id: None,
            });
            let mut response = answer(
                StatusCode::OK,
                version,
                Value::Null,
                Err(error),
                identity.as_ref(),
            );
            if let Some(identity) = identity {
                response.headers_mut().insert(
                    IDEMPOTENCY_HEADER,
                    HeaderValue::from_str(identity.key.as_str()).expect("keys are ASCII"),
                );
            }
            Ok(response)
        }
        other => other,
    }
}

async fn post_admitted(
    gateway: &Arc<Gateway>,
    headers: &HeaderMap,
    body: Body,
    key: &Arc<VirtualKey>,
) -> Result<Response, ObolError> {
    let key = Arc::clone(key);
    // A resume's token is verified before anything else runs; the lifecycle binds it to the
    // held call.
    let approval = approval_grant(gateway, headers, &key).await?;
    if !accepts_event_stream(headers)? {
        return Err(ObolError::NotAcceptable("text/event-stream"));
    }
    let content_type = single_header(headers, header::CONTENT_TYPE.as_str())?.unwrap_or("");
    let media_type = content_type.split(';').next().unwrap_or("").trim();
    if !media_type.eq_ignore_ascii_case("application/json") {
        return Err(ObolError::UnsupportedMediaType);
    }
    let body = read_capped(headers, body).await?;

    let message: Value = json::parse(&body)?;
    let message = Message::parse(message)?;
    if let Some(method) = message.method() {
        gateway.services.metrics.request(method);
    }
    if stateless::Era::of(headers, &message) == stateless::Era::Stateless {
        return Ok(serve_stateless(gateway, headers, &key, message, approval, &body).await);
    }
    if let Some(presented) = single_header(headers, VERSION_HEADER)?
        && known_version(headers).is_none()
        && message.method() != Some("initialize")
    {
        return Err(ObolError::UnsupportedProtocolVersion(presented.to_owned()));
    }

    // `initialize` opens a session; `server/discover` (protocol 2026-07-28) is answered with
    // method-not-found so that current clients fall back to `initialize`.
    if let Message::Request { id, method, params } = &message {
        match method.as_str() {
            "initialize" => return Ok(initialize(gateway, &key, id.clone(), params)),
            "server/discover" if !headers.contains_key(SESSION_HEADER) => {
                let version = known_version(headers).unwrap_or(LATEST_VERSION);
                return Ok(answer(
                    StatusCode::OK,
                    version,
                    id.clone(),
                    Err(ObolError::MethodNotFound),
                    None,
                ));
            }
            _ => {}
        }
    }

    let session = session_of(gateway, headers, &key)?;
    let version = session.protocol_version;
    let idempotency_key = idempotency_key_of(headers)?;
    match message {
        Message::Notification | Message::Reply => Ok(accepted(version)),
        Message::Request { id, method, params } => {
            let (result, claim) = dispatch(
                gateway,
                &key,
                &method,
                params,
                idempotency_key,
                approval,
                &body,
            )
            .await;
            let mut response = answer(StatusCode::OK, version, id, result, claim.as_ref());
            if let Some(claim) = claim {
                response.headers_mut().insert(
                    IDEMPOTENCY_HEADER,
                    HeaderValue::from_str(claim.key.as_str()).expect("keys are ASCII"),
                );
            }
            Ok(response)
        }
    }
}

/// The client's `Idempotency-Key`. A malformed key is refused before anything is written,
/// never ignored.
fn idempotency_key_of(headers: &HeaderMap) -> Result<Option<IdempotencyKey>, ObolError> {
    match single_header(headers, IDEMPOTENCY_HEADER) {
        Err(_) => Err(ObolError::InvalidIdempotencyKey(
            "the header is given more than once or is not ASCII".into(),
        )),
        Ok(None) => Ok(None),
        Ok(Some(text)) => IdempotencyKey::parse(text)
            .map(Some)
            .map_err(|e| ObolError::InvalidIdempotencyKey(e.to_string())),
    }
}

/// A 2026-07-28 request, after the checks both eras share: the revision's own checks, then
/// the same methods a session runs. Every outcome is an answer.
async fn serve_stateless(
    gateway: &Arc<Gateway>,
    headers: &HeaderMap,
    key: &Arc<VirtualKey>,
    message: Message,
    approval: Option<ApprovalGrant>,
    body: &[u8],
) -> Response {
    let Message::Request { id, method, params } = message else {
        return accepted(stateless::VERSION);
    };
    // A well-formed key the client supplied comes back on every answer, refusals included.
    let supplied = single_header(headers, IDEMPOTENCY_HEADER)
        .ok()
        .flatten()
        .and_then(|text| IdempotencyKey::parse(text).ok());
    let echo = |mut response: Response, key: Option<&IdempotencyKey>| {
        if let Some(key) = key {
            response.headers_mut().insert(
                IDEMPOTENCY_HEADER,
                HeaderValue::from_str(key.as_str()).expect("keys are ASCII"),
            );
        }
        response
    };
    let checked =
        stateless::check(headers, &method, &params).and_then(|()| idempotency_key_of(headers));
    let idempotency_key = match checked {
        Ok(key) => key,
        Err(refusal) => {
            return echo(stateless::answer(id, Err(refusal), None), supplied.as_ref());
        }
    };
    let ttl = gateway.list_ttl_ms(&key.workspace);
    let (result, claim) = match method.as_str() {
        "server/discover" => (Ok(Outcome::Value(stateless::discover())), None),
        "tools/list" => (
            gateway
                .list_tools(key)
                .await
                .map(|listing| stateless::tools_list(listing, ttl)),
            None,
        ),
        "tools/call" => {
            let (result, claim) = call(gateway, key, params, idempotency_key, approval, body).await;
            (result.map(stateless::complete), claim)
        }
        "prompts/list" => (
            Ok(Outcome::Value(stateless::empty_list("prompts", ttl))),
            None,
        ),
        "resources/list" => (
            Ok(Outcome::Value(stateless::empty_list("resources", ttl))),
            None,
        ),
        "resources/templates/list" => (
            Ok(Outcome::Value(stateless::empty_list(
                "resourceTemplates",
                ttl,
            ))),
            None,
        ),
        "resources/read" => (
            Err(ObolError::InvalidParams("no resource has this uri".into())),
            None,
        ),
        "prompts/get" => (
            Err(ObolError::InvalidParams("no prompt has this name".into())),
            None,
        ),
        // The listen's id tags every notification: a bounded one.
        "subscriptions/listen" if id.to_string().len() > stateless::LISTEN_ID_LIMIT => (
            Err(ObolError::InvalidParams(format!(
                "a subscriptions/listen id is at most {} bytes",
                stateless::LISTEN_ID_LIMIT
            ))),
            None,
        ),
        "subscriptions/listen" => match gateway.listens.take(key.hash) {
            Some(slot) => {
                return stateless::listen(Arc::clone(gateway), key, id, &params, slot);
            }
            None => (Err(ObolError::SessionLimit), None),
        },
        _ => (Err(ObolError::MethodNotFound), None),
    };
    let response = stateless::answer(id, result, claim.as_ref());
    echo(
        response,
        claim.as_ref().map(|c| &c.key).or(supplied.as_ref()),
    )
}

/// A `tools/call`, in either era: the lifecycle, with the call's identity for the answer.
async fn call(
    gateway: &Gateway,
    key: &VirtualKey,
    params: Map<String, Value>,
    idempotency_key: Option<IdempotencyKey>,
    approval: Option<ApprovalGrant>,
    body: &[u8],
) -> (Result<Outcome, ObolError>, Option<ClaimIdentity>) {
    let trace_id = trace::trace_id(
        params
            .get("_meta")
            .and_then(Value::as_object)
            .and_then(|meta| meta.get("traceparent")),
    );
    let request = CallRequest {
        params,
        // Read from the text: a parsed value has already rounded the digits away.
        exactness: crate::idempotency::exact_numbers_at(body, &["params", "arguments"]),
        idempotency_key,
        approval,
        trace_id,
    };
    let catalog = gateway.catalog();
    let answer = invoke::invoke(&gateway.services, &catalog, key, request).await;
    let result = answer
        .result
        .map(|result| Outcome::Raw(result.json.into_string()));
    (result, answer.identity)
}

async fn dispatch(
    gateway: &Gateway,
    key: &VirtualKey,
    method: &str,
    params: Map<String, Value>,
    idempotency_key: Option<IdempotencyKey>,
    approval: Option<ApprovalGrant>,
    body: &[u8],
) -> (Result<Outcome, ObolError>, Option<ClaimIdentity>) {
    match method {
        "ping" => (Ok(Outcome::Value(json!({}))), None),
        "tools/list" => (gateway.list_tools(key).await.map(Outcome::Raw), None),
        "tools/call" => call(gateway, key, params, idempotency_key, approval, body).await,
        _ => (Err(ObolError::MethodNotFound), None),
    }
}

/// The resume headers, verified: both or neither, a well-formed id, a token signed by an
/// accepted key, for that id, issued to this key (by its ticket, on the server: the token
/// names no key), not expired.
async fn approval_grant(
    gateway: &Gateway,
    headers: &HeaderMap,
    key: &VirtualKey,
) -> Result<Option<ApprovalGrant>, ObolError> {
    let header = |name| {
        single_header(headers, name).map_err(|_| {
            ObolError::ApprovalInvalid("an approval header is given twice or is not ASCII")
        })
    };
    let (id, token) = match (
        header(approvals::APPROVAL_ID_HEADER)?,
        header(approvals::APPROVAL_TOKEN_HEADER)?,
    ) {
        (None, None) => return Ok(None),
        (Some(id), Some(token)) => (id, token),
        _ => {
            return Err(ObolError::ApprovalInvalid(
                "Obol-Approval-Id and Obol-Approval-Token are sent together",
            ));
        }
    };
    let id =
        ApprovalId::parse(id).ok_or(ObolError::ApprovalInvalid("the approval id is malformed"))?;
    let grant = gateway
        .approvals
        .keyring
        .verify(token, crate::clock::now_ms())
        .map_err(|error| match error {
            TokenError::Expired => ObolError::ApprovalExpired,
            TokenError::Malformed => ObolError::ApprovalInvalid("the token is malformed"),
            TokenError::UnknownKey => ObolError::ApprovalInvalid(
                "the token is signed with a key this gateway does not accept",
            ),
            TokenError::BadSignature => {
                ObolError::ApprovalInvalid("the token's signature does not verify")
            }
        })?;
    if grant.approval_id != id {
        return Err(ObolError::ApprovalInvalid(
            "the token belongs to another approval",
        ));
    }
    let issued_to_another = || ObolError::ApprovalInvalid("the token was issued to another key");
    if grant.workspace != key.workspace {
        return Err(issued_to_another());
    }
    // A ticket already gone (expired past the retention) binds nothing here; the held slot
    // still belongs to the key that made the call.
    match gateway.services.store.ticket(&grant.approval_id).await {
        Ok(Some(ticket)) if ticket.key_hash != key.hash.to_string() => {
            return Err(issued_to_another());
        }
        Ok(_) => {}
        Err(error) => {
            tracing::warn!("could not read a ticket to check a resume: {error}");
            return Err(ObolError::StoreUnavailable);
        }
    }
    Ok(Some(grant))
}

fn initialize(
    gateway: &Gateway,
    key: &VirtualKey,
    id: Value,
    params: &Map<String, Value>,
) -> Response {
    let requested = params.get("protocolVersion").and_then(Value::as_str);
    let version = SUPPORTED_VERSIONS
        .into_iter()
        .find(|v| Some(*v) == requested)
        .unwrap_or(LATEST_VERSION);
    let session = match gateway.sessions.open(key.hash, version) {
        Ok(session) => session,
        Err(session::SessionLimit) => {
            return answer(
                StatusCode::OK,
                version,
                id,
                Err(ObolError::SessionLimit),
                None,
            );
        }
    };
    tracing::info!(session = %session.redacted(), key = %key.name, version, "session opened");
    let result = json!({
        "protocolVersion": version,
        "capabilities": { "tools": { "listChanged": true } },
        "serverInfo": { "name": "obol", "version": env!("CARGO_PKG_VERSION") },
        "instructions": "Tools are named connector.tool. Obol owns idempotency, retries and receipts for every call.",
    });
    let mut response = answer(
        StatusCode::OK,
        version,
        id,
        Ok(Outcome::Value(result)),
        None,
    );
    response.headers_mut().insert(
        SESSION_HEADER,
        HeaderValue::from_str(session.as_str()).expect("session ids are ASCII"),
    );
    response
}

async fn get(gateway: Arc<Gateway>, headers: &HeaderMap) -> Result<Response, ObolError> {
    let key = admit(&gateway, headers)?;
    if !accepts_event_stream(headers)? {
        return Err(ObolError::NotAcceptable("text/event-stream"));
    }
    let session = session_of(&gateway, headers, &key)?;
    let id = presented_session(headers)?.expect("session_of checked it");
    let events = gateway.subscribe();
    let owner = key.hash;
    let stream = futures_util::stream::unfold(
        (events, id, gateway),
        move |(mut events, id, gateway)| async move {
            // Re-checked on every event and keepalive: a stream never outlives its session,
            // even if it missed the close notice.
            gateway.sessions.get(&id, owner)?;
            let frame = match tokio::time::timeout(KEEPALIVE, events.recv()).await {
                Err(_) => ": keepalive\n\n".to_owned(),
                Ok(Ok(Event::CatalogChanged))
                | Ok(Err(tokio::sync::broadcast::error::RecvError::Lagged(_))) => {
                    let note =
                        json!({"jsonrpc": "2.0", "method": "notifications/tools/list_changed"});
                    format!("event: message\ndata: {note}\n\n")
                }
                Ok(Ok(Event::SessionClosed(closed))) if closed == id => return None,
                Ok(Ok(Event::SessionClosed(_))) => ": \n\n".to_owned(),
                Ok(Err(tokio::sync::broadcast::error::RecvError::Closed)) => return None,
            };
            Some((
                Ok::<_, std::convert::Infallible>(frame),
                (events, id, gateway),
            ))
        },
    );
    let mut response = Response::new(Body::from_stream(stream.boxed()));
    decorate(&mut response, StatusCode::OK, session.protocol_version);
    Ok(response)
}

async fn delete(gateway: &Gateway, headers: &HeaderMap) -> Result<Response, ObolError> {
    let key = admit(gateway, headers)?;
    let session = session_of(gateway, headers, &key)?;
    let id = presented_session(headers)?.expect("session_of checked it");
    gateway.close_session(&id, key.hash);
    tracing::info!(session = %id.redacted(), "session closed");
    let mut response = Response::new(Body::empty());
    *response.status_mut() = StatusCode::OK;
    response.headers_mut().insert(
        VERSION_HEADER,
        HeaderValue::from_static(session.protocol_version),
    );
    Ok(response)
}

/// A parsed JSON-RPC message.
enum Message {
    Request {
        id: Value,
        method: String,
        params: Map<String, Value>,
    },
    Notification,
    /// A response to a request the server sent; the gateway sends none that need one.
    Reply,
}

impl Message {
    fn parse(value: Value) -> Result<Message, ObolError> {
        let Value::Object(mut object) = value else {
            return Err(ObolError::InvalidRequest(
                "expected a JSON-RPC object (batches are not supported)".into(),
            ));
        };
        if object.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
            return Err(ObolError::InvalidRequest("jsonrpc must be \"2.0\"".into()));
        }
        let id = object.remove("id");
        if let Some(id) = &id
            && !(id.is_string() || id.is_i64() || id.is_u64())
        {
            return Err(ObolError::InvalidRequest(
                "id must be a string or an integer".into(),
            ));
        }
        let method = match object.remove("method") {
            Some(Value::String(method)) => method,
            Some(_) => return Err(ObolError::InvalidRequest("method must be a string".into())),
            None if id.is_some()
                && (object.contains_key("result") || object.contains_key("error")) =>
            {
                return Ok(Message::Reply);
            }
            None => return Err(ObolError::InvalidRequest("method is missing".into())),
        };
        let params = match object.remove("params") {
            None | Some(Value::Null) => Map::new(),
            Some(Value::Object(params)) => params,
            Some(_) => return Err(ObolError::InvalidRequest("params must be an object".into())),
        };
        Ok(match id {
            Some(id) => Message::Request { id, method, params },
            None => Message::Notification,
        })
    }

    fn method(&self) -> Option<&str> {
        match self {
            Message::Request { method, .. } => Some(method),
            _ => None,
        }
    }
}

/// The session a request belongs to: 400 without the header, 404 for anything that is not a
/// live session of this key.
fn session_of(
    gateway: &Gateway,
    headers: &HeaderMap,
    key: &VirtualKey,
) -> Result<Session, ObolError> {
    let id = presented_session(headers)?.ok_or(ObolError::SessionRequired)?;
    gateway
        .sessions
        .get(&id, key.hash)
        .ok_or(ObolError::UnknownSession)
}

fn presented_session(headers: &HeaderMap) -> Result<Option<SessionId>, ObolError> {
    match single_header(headers, SESSION_HEADER)? {
        None => Ok(None),
        Some(text) => SessionId::parse(text)
            .map(Some)
            .ok_or(ObolError::UnknownSession),
    }
}

/// A header that must appear at most once, as visible ASCII.
pub(crate) fn single_header<'h>(
    headers: &'h HeaderMap,
    name: &'static str,
) -> Result<Option<&'h str>, ObolError> {
    let mut values = headers.get_all(name).iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(ObolError::MalformedHeader {
            header: name,
            reason: "given more than once",
        });
    }
    value
        .to_str()
        .map(Some)
        .map_err(|_| ObolError::MalformedHeader {
            header: name,
            reason: "not visible ASCII",
        })
}

fn accepts_event_stream(headers: &HeaderMap) -> Result<bool, ObolError> {
    let mut accepted = false;
    for value in headers.get_all(header::ACCEPT) {
        let value = value.to_str().map_err(|_| ObolError::MalformedHeader {
            header: "accept",
            reason: "not visible ASCII",
        })?;
        accepted |= value.split(',').any(|range| {
            let media = range.split(';').next().unwrap_or("").trim();
            media.eq_ignore_ascii_case("text/event-stream") || media == "text/*" || media == "*/*"
        });
    }
    Ok(accepted)
}

fn known_version(headers: &HeaderMap) -> Option<&'static str> {
    let presented = headers.get(VERSION_HEADER)?.to_str().ok()?;
    SUPPORTED_VERSIONS.into_iter().find(|v| *v == presented)
}

/// Reads the body, refusing it as soon as it is known to exceed the cap: from
/// `Content-Length` before reading anything, or while streaming a chunked body.
async fn read_capped(headers: &HeaderMap, body: Body) -> Result<Vec<u8>, ObolError> {
    let too_large = ObolError::PayloadTooLarge {
        limit: MAX_BODY_BYTES,
    };
    if let Some(length) = single_header(headers, header::CONTENT_LENGTH.as_str())? {
        let length: u64 = length.parse().map_err(|_| ObolError::MalformedHeader {
            header: "content-length",
            reason: "not a number",
        })?;
        if length > MAX_BODY_BYTES as u64 {
            return Err(too_large);
        }
    }
    let mut stream = body.into_data_stream();
    let mut buffer = Vec::new();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|error| match crate::listener::body::Refusal::of(&error) {
            Some(refusal) => refusal.to_obol_error(),
            None => ObolError::InvalidRequest("the body could not be read".into()),
        })?;
        if buffer.len() + chunk.len() > MAX_BODY_BYTES {
            return Err(too_large);
        }
        buffer.extend_from_slice(&chunk);
    }
    Ok(buffer)
}

/// A method's result: a value, or JSON text rendered ahead of time (tool listings).
enum Outcome {
    Value(Value),
    Raw(String),
}

/// A JSON-RPC response (result or error) as one SSE event.
fn answer(
    status: StatusCode,
    version: &'static str,
    id: Value,
    result: Result<Outcome, ObolError>,
    claim: Option<&ClaimIdentity>,
) -> Response {
    let (error_status, mut event) = message(id, result, claim, b"event: message\ndata: ".to_vec());
    event.extend_from_slice(b"\n\n");
    let status = error_status.unwrap_or(status);
    let mut response = Response::new(Body::from(event));
    decorate(&mut response, status, version);
    response
}

/// Room for a stored result's envelope: `{"jsonrpc":"2.0","id":…,"result":` and `}` around it,
/// and the event's closing blank line.
const RAW_ENVELOPE: usize = 64;

/// A JSON-RPC response's text, appended to `out`, and for an error, the status its wire gives
/// it. An error raised after a claim exists names the claim's key and receipt, so the client
/// can retry the same logical call.
fn message(
    id: Value,
    result: Result<Outcome, ObolError>,
    claim: Option<&ClaimIdentity>,
    mut out: Vec<u8>,
) -> (Option<StatusCode>, Vec<u8>) {
    use std::io::Write as _;
    /// Borrows the result: a tool's result is written out once, not copied into a new tree.
    #[derive(serde::Serialize)]
    struct Success<'a> {
        jsonrpc: &'static str,
        id: &'a Value,
        result: &'a Value,
    }
    match result {
        Ok(Outcome::Value(result)) => {
            let success = Success {
                jsonrpc: "2.0",
                id: &id,
                result: &result,
            };
            serde_json::to_writer(&mut out, &success).expect("a Value always serialises");
            (None, out)
        }
        Ok(Outcome::Raw(result)) => {
            // The whole event in one allocation (a few dozen bytes of envelope, the result,
            // and the caller's closing blank line), not regrown and copied as it fills.
            out.reserve(RAW_ENVELOPE + result.len());
            write!(out, r#"{{"jsonrpc":"2.0","id":{id},"result":"#)
                .expect("a Vec takes every write");
            out.extend_from_slice(result.as_bytes());
            out.push(b'}');
            (None, out)
        }
        Err(error) => {
            let mut rendered = error.to_jsonrpc_error();
            if let Some(claim) = claim
                && let Some(data) = rendered.get_mut("data").and_then(Value::as_object_mut)
            {
                data.insert("idempotency_key".into(), claim.key.as_str().into());
                if let Some(receipt_id) = &claim.receipt_id {
                    data.insert("receipt_id".into(), receipt_id.clone().into());
                }
            }
            let envelope = json!({ "jsonrpc": "2.0", "id": id, "error": rendered });
            serde_json::to_writer(&mut out, &envelope).expect("a Value always serialises");
            (Some(error.wire().http), out)
        }
    }
}

/// A refusal made before a request reaches `/mcp`'s handler (the listener's), rendered as
/// `/mcp` renders its own.
pub fn transport_refusal(error: &ObolError, headers: &HeaderMap) -> Response {
    rejection(
        error,
        Value::Null,
        known_version(headers).unwrap_or(LATEST_VERSION),
    )
}

fn rejection(error: &ObolError, id: Value, version: &'static str) -> Response {
    let mut response = answer(StatusCode::OK, version, id, Err(error.clone()), None);
    if matches!(error, ObolError::Unauthenticated(_)) {
        response.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            HeaderValue::from_static("Bearer realm=\"obol\""),
        );
    }
    response
}

fn accepted(version: &'static str) -> Response {
    let mut response = Response::new(Body::empty());
    *response.status_mut() = StatusCode::ACCEPTED;
    response
        .headers_mut()
        .insert(VERSION_HEADER, HeaderValue::from_static(version));
    response
}

fn method_not_allowed(version: &'static str) -> Response {
    let mut response = (StatusCode::METHOD_NOT_ALLOWED, "").into_response();
    let headers = response.headers_mut();
    headers.insert(header::ALLOW, HeaderValue::from_static("GET, POST, DELETE"));
    headers.insert(VERSION_HEADER, HeaderValue::from_static(version));
    response
}

fn decorate(response: &mut Response, status: StatusCode, version: &'static str) {
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    headers.insert(VERSION_HEADER, HeaderValue::from_static(version));
}

/// The JSON-RPC envelope against generated input (`crate::properties` says how many cases).
#[cfg(test)]
mod properties {
    use proptest::arbitrary::any;
    use proptest::prelude::*;

    use super::*;
    use crate::properties::{config, json_value};

    proptest! {
        #![proptest_config(config())]

        /// Any bytes: a message, or a typed refusal (-32700 or -32600), never a panic.
        #[test]
        fn properties_any_body_gets_a_typed_answer(body in prop::collection::vec(any::<u8>(), 0..256)) {
            match json::parse(&body).and_then(Message::parse) {
                Ok(_) | Err(ObolError::Parse(_)) | Err(ObolError::InvalidRequest(_)) => {}
                Err(other) => prop_assert!(false, "unexpected refusal {other:?}"),
            }
        }

        /// Any JSON document: the strict reader reads what serde_json wrote (an independent
        /// serializer), and the envelope either parses or is refused as an invalid request.
        #[test]
        fn properties_json_documents_read_back(value in json_value()) {
            let text = serde_json::to_vec(&value).unwrap();
            prop_assert_eq!(json::parse(&text).unwrap(), value.clone());
            match Message::parse(value) {
                Ok(_) | Err(ObolError::InvalidRequest(_)) => {}
                Err(other) => prop_assert!(false, "unexpected refusal {other:?}"),
            }
        }

        /// Requests built from generated ids, methods and params parse into requests.
        #[test]
        fn properties_requests_parse(id in any::<i64>(), method in "[a-z/]{1,20}", params in json_value()) {
            let params = match params {
                Value::Object(map) => Value::Object(map),
                _ => json!({}),
            };
            let request = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
            let message = json::parse(request.to_string().as_bytes()).and_then(Message::parse);
            prop_assert!(message.is_ok(), "{:?}", message.err());
        }

        /// Header values of any bytes: a value or a typed refusal, never a panic.
        #[test]
        fn properties_headers_take_any_bytes(values in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..40), 0..3)) {
            let mut headers = HeaderMap::new();
            for value in &values {
                if let Ok(value) = HeaderValue::from_bytes(value) {
                    headers.append(VERSION_HEADER, value);
                }
            }
            let _ = single_header(&headers, VERSION_HEADER);
            let _ = known_version(&headers);
            let _ = accepts_event_stream(&headers);
        }
    }
}
