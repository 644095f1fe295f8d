//! MCP 2026-07-28, served beside the handshake era (`docs/transport.md`, "Protocol eras").
//!
//! The revision has no sessions and no `initialize`: every request names its protocol version
//! and the client's capabilities in `params._meta`, and repeats its method (and, for the
//! methods that name one, the target) in headers that must agree with the body. The gateway
//! tells the eras apart per request ([`Era::of`]); a 2026 request is checked in the order the
//! reference SDK checks it — `_meta` (-32602), headers (-32020), version (-32022) — and then
//! runs the same methods as a session would: the same key view, the same lifecycle, the same
//! `Unknown tool` bytes. Its results carry `resultType`, and list results caching hints
//! ([`Gateway::list_ttl_ms`]).

use std::sync::Arc;

use axum::body::Body;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::Response;
use serde_json::{Map, Value, json};

use super::{Message, Outcome, VERSION_HEADER, single_header};
use crate::error::ObolError;
use crate::gateway::{Event, Gateway};
use crate::policy::VirtualKey;

/// The longest `subscriptions/listen` id, as JSON text: it is repeated in every notification.
pub const LISTEN_ID_LIMIT: usize = 256;

/// The one stateless revision served.
pub const VERSION: &str = "2026-07-28";
pub const SUPPORTED: [&str; 1] = [VERSION];

pub const META_PROTOCOL_VERSION: &str = "io.modelcontextprotocol/protocolVersion";
pub const META_CLIENT_CAPABILITIES: &str = "io.modelcontextprotocol/clientCapabilities";
const META_SERVER_INFO: &str = "io.modelcontextprotocol/serverInfo";
const META_SUBSCRIPTION: &str = "io.modelcontextprotocol/subscriptionId";
const METHOD_HEADER: &str = "mcp-method";
const NAME_HEADER: &str = "mcp-name";

/// Which protocol era a POST belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Era {
    /// `initialize`, sessions, and the versions before 2026-07-28.
    Handshake,
    /// Self-contained requests (2026-07-28 and later).
    Stateless,
}

impl Era {
    /// A POST is stateless when its `MCP-Protocol-Version` names a stateless version, or
    /// when its body carries `_meta.io.modelcontextprotocol/protocolVersion`, which only a
    /// stateless client sends (one whose header is missing, unknown or another version, which
    /// the stateless checks then answer). Anything else is the handshake era, exactly as
    /// before the revision existed.
    pub(super) fn of(headers: &HeaderMap, message: &Message) -> Era {
        let presented = headers.get(VERSION_HEADER).and_then(|v| v.to_str().ok());
        if presented.is_some_and(|v| SUPPORTED.contains(&v)) {
            return Era::Stateless;
        }
        let Message::Request { params, .. } = message else {
            return Era::Handshake;
        };
        let declared = params
            .get("_meta")
            .and_then(Value::as_object)
            .is_some_and(|meta| meta.contains_key(META_PROTOCOL_VERSION));
        if declared {
            Era::Stateless
        } else {
            Era::Handshake
        }
    }
}

/// The revision's checks, in the reference SDK's order. A refusal is answered with the
/// request's id and the status the revision gives its code.
pub fn check(
    headers: &HeaderMap,
    method: &str,
    params: &Map<String, Value>,
) -> Result<(), ObolError> {
    let Some(meta) = params.get("_meta").and_then(Value::as_object) else {
        return Err(ObolError::InvalidParams(
            "a 2026-07-28 request carries params._meta".into(),
        ));
    };
    let Some(version) = meta.get(META_PROTOCOL_VERSION).and_then(Value::as_str) else {
        return Err(ObolError::InvalidParams(format!(
            "params._meta must name {META_PROTOCOL_VERSION}"
        )));
    };
    if !meta
        .get(META_CLIENT_CAPABILITIES)
        .is_some_and(Value::is_object)
    {
        return Err(ObolError::InvalidParams(format!(
            "params._meta must carry {META_CLIENT_CAPABILITIES} (an object; {{}} declares none)"
        )));
    }
    headers_agree(headers, version, method, params)?;
    if !SUPPORTED.contains(&version) {
        return Err(ObolError::UnsupportedStatelessVersion {
            requested: version.chars().take(64).collect(),
        });
    }
    Ok(())
}

/// `MCP-Protocol-Version`, `Mcp-Method` and (for the methods that name a target) `Mcp-Name`
/// are present, given once, and equal to what the body says. Values compare exactly; a
/// value's surrounding whitespace is not part of it (HTTP trims it), and `=?base64?…?=` is
/// decoded first.
fn headers_agree(
    headers: &HeaderMap,
    version: &str,
    method: &str,
    params: &Map<String, Value>,
) -> Result<(), ObolError> {
    let read = |name: &'static str| -> Result<Option<String>, ObolError> {
        match single_header(headers, name) {
            Ok(value) => Ok(value.map(|v| v.trim().to_owned())),
            Err(_) => Err(ObolError::HeaderMismatch(format!(
                "{name} is given more than once or is not visible ASCII"
            ))),
        }
    };
    let agree = |name: &'static str, body: &str| -> Result<(), ObolError> {
        match read(name)? {
            None => Err(ObolError::HeaderMismatch(format!(
                "the {name} header is missing"
            ))),
            Some(value) => {
                let value = decoded(&value).ok_or_else(|| {
                    ObolError::HeaderMismatch(format!("{name} is not valid =?base64?…?="))
                })?;
                if value == body {
                    Ok(())
                } else {
                    Err(ObolError::HeaderMismatch(format!(
                        "{name} does not match the body"
                    )))
                }
            }
        }
    };
    agree(VERSION_HEADER, version)?;
    agree(METHOD_HEADER, method)?;
    let target = match method {
        "tools/call" | "prompts/get" => params.get("name"),
        "resources/read" => params.get("uri"),
        _ => return Ok(()),
    };
    // A target that is not a string cannot name anything: the method answers that.
    match target.and_then(Value::as_str) {
        Some(target) => agree(NAME_HEADER, target),
        None => Ok(()),
    }
}

/// A header value, with the revision's `=?base64?…?=` form decoded.
fn decoded(value: &str) -> Option<String> {
    let Some(inner) = value
        .strip_prefix("=?base64?")
        .and_then(|rest| rest.strip_suffix("?="))
    else {
        return Some(value.to_owned());
    };
    use base64::Engine;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(inner)
        .ok()?;
    String::from_utf8(bytes).ok()
}

/// The `server/discover` result: the stateless versions, what the gateway serves, and who it
/// is. The same for every caller.
pub fn discover() -> Value {
    json!({
        "resultType": "complete",
        "supportedVersions": SUPPORTED,
        "capabilities": {
            "tools": {"listChanged": true},
            "prompts": {},
            "resources": {},
        },
        "ttlMs": DISCOVER_TTL_MS,
        "cacheScope": "public",
        "_meta": {META_SERVER_INFO: server_info()},
    })
}

/// Discovery changes only with the binary.
const DISCOVER_TTL_MS: u64 = 3_600_000;

fn server_info() -> Value {
    json!({"name": "obol", "version": env!("CARGO_PKG_VERSION")})
}

/// A list result's caching hints: private (a tool table is one key's), and fresh no longer
/// than the catalog can go without changing.
fn cacheable(mut result: Map<String, Value>, ttl_ms: u64) -> Value {
    result.insert("resultType".into(), "complete".into());
    result.insert("ttlMs".into(), ttl_ms.into());
    result.insert("cacheScope".into(), "private".into());
    Value::Object(result)
}

/// A `tools/list` answer rendered ahead of time, with the stateless fields spliced in (the
/// listing is never parsed again).
pub(super) fn tools_list(listing: String, ttl_ms: u64) -> Outcome {
    Outcome::Raw(with_fields(
        listing,
        &format!(r#""resultType":"complete","ttlMs":{ttl_ms},"cacheScope":"private""#),
    ))
}

/// Adds `fields` (`"name":value` members) to the text of a JSON object, without parsing it.
fn with_fields(object: String, fields: &str) -> String {
    let Some(open) = object.trim_end().strip_suffix('}') else {
        return object;
    };
    let separator = if open.trim_end().ends_with('{') {
        ""
    } else {
        ","
    };
    format!("{open}{separator}{fields}}}")
}

/// The empty lists of what the gateway does not serve (prompts, resources): answered, with
/// caching hints, so that a client's generic discovery works.
pub fn empty_list(field: &str, ttl_ms: u64) -> Value {
    let mut result = Map::new();
    result.insert(field.into(), Value::Array(Vec::new()));
    cacheable(result, ttl_ms)
}

/// A method's result as the revision shapes it.
pub(super) fn complete(result: Outcome) -> Outcome {
    match result {
        Outcome::Value(Value::Object(mut object)) => {
            object.insert("resultType".into(), "complete".into());
            Outcome::Value(Value::Object(object))
        }
        // A tool's result, as the text it was recorded as.
        Outcome::Raw(text) => Outcome::Raw(with_fields(text, r#""resultType":"complete""#)),
        other => other,
    }
}

/// `subscriptions/listen`: acknowledges the notifications it honours (`toolsListChanged`),
/// then streams `notifications/tools/list_changed` whenever the catalog changes, each tagged
/// with the listen request's id, until the client hangs up or its key is revoked.
pub fn listen(
    gateway: Arc<Gateway>,
    key: &VirtualKey,
    id: Value,
    params: &Map<String, Value>,
    slot: super::listens::Slot,
) -> Response {
    let wanted = params
        .get("notifications")
        .and_then(Value::as_object)
        .and_then(|n| n.get("toolsListChanged"))
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let honoured = if wanted {
        json!({"toolsListChanged": true})
    } else {
        json!({})
    };
    let ack = json!({
        "jsonrpc": "2.0",
        "method": "notifications/subscriptions/acknowledged",
        "params": {"_meta": {META_SUBSCRIPTION: id}, "notifications": honoured},
    });
    // Rendered once; every notification is a clone of the same text.
    let changed: Arc<str> = format!(
        "event: message\ndata: {}\n\n",
        json!({
            "jsonrpc": "2.0",
            "method": "notifications/tools/list_changed",
            "params": {"_meta": {META_SUBSCRIPTION: id}},
        })
    )
    .into();
    let first = futures_util::stream::once(async move {
        Ok::<_, std::convert::Infallible>(format!("event: message\ndata: {ack}\n\n"))
    });
    let events = gateway.subscribe();
    let owner = key.hash;
    let rest = futures_util::stream::unfold(
        (events, gateway, slot),
        move |(mut events, gateway, slot)| {
            let changed = Arc::clone(&changed);
            async move {
                // Re-checked on every event and keepalive: a revoked key's stream ends.
                if !gateway.keys().knows(&owner) {
                    return None;
                }
                let frame = match tokio::time::timeout(super::KEEPALIVE, events.recv()).await {
                    Err(_) => ": keepalive\n\n".to_owned(),
                    Ok(Ok(Event::CatalogChanged))
                    | Ok(Err(tokio::sync::broadcast::error::RecvError::Lagged(_)))
                        if wanted =>
                    {
                        changed.to_string()
                    }
                    Ok(Ok(_)) | Ok(Err(tokio::sync::broadcast::error::RecvError::Lagged(_))) => {
                        ": \n\n".to_owned()
                    }
                    Ok(Err(tokio::sync::broadcast::error::RecvError::Closed)) => return None,
                };
                Some((Ok(frame), (events, gateway, slot)))
            }
        },
    );
    use futures_util::StreamExt;
    let mut response = Response::new(Body::from_stream(first.chain(rest).boxed()));
    *response.status_mut() = StatusCode::OK;
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    headers.insert("x-accel-buffering", HeaderValue::from_static("no"));
    headers.insert(VERSION_HEADER, HeaderValue::from_static(VERSION));
    response
}

/// The status the revision gives a JSON-RPC error code; Obol's own errors keep theirs.
fn status_of(error: &ObolError) -> StatusCode {
    let wire = error.wire();
    match wire.code {
        Some(-32700 | -32600 | -32602 | -32020 | -32021 | -32022) => StatusCode::BAD_REQUEST,
        Some(-32601) => StatusCode::NOT_FOUND,
        _ => wire.http,
    }
}

/// A stateless answer: one JSON body (a stream only for `subscriptions/listen`). The
/// revision's own refusals carry its statuses (400, and 404 for an unknown method); every
/// other error keeps the status the handshake era gives it, so the same call answers the same.
pub(super) fn answer(
    id: Value,
    result: Result<Outcome, ObolError>,
    claim: Option<&crate::invoke::ClaimIdentity>,
) -> Response {
    let status = match &result {
        Ok(_) => StatusCode::OK,
        Err(error) => status_of(error),
    };
    let (_, message) = super::message(id, result, claim, Vec::new());
    let mut response = Response::new(Body::from(message));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    headers.insert(VERSION_HEADER, HeaderValue::from_static(VERSION));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Members spliced into an object's text read back as the object with them.
    #[test]
    fn fields_join_an_objects_text() {
        for (object, joined) in [
            (
                r#"{"content":[]}"#,
                json!({"content": [], "resultType": "complete"}),
            ),
            ("{ }", json!({"resultType": "complete"})),
            ("{\"a\":{}}\n", json!({"a": {}, "resultType": "complete"})),
        ] {
            let text = with_fields(object.to_owned(), r#""resultType":"complete""#);
            assert_eq!(
                serde_json::from_str::<Value>(&text).unwrap(),
                joined,
                "{text}"
            );
        }
    }
}
