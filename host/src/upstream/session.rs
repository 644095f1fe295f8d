//! One MCP session with one upstream, through rmcp's client on the gateway's own HTTP client.
//!
//! rmcp's Streamable HTTP transport would, by default, re-initialize and silently send a
//! `tools/call` again after a session 404; here it is told not to, and the 404 comes back as
//! [`Observed::SessionExpired`] so the lifecycle resends under the same reservation
//! (docs/design/rmcp-client.md §6).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use rmcp::model::{
    CallToolRequest, CallToolRequestParams, ClientCapabilities, ClientConfig, ClientRequest,
    Implementation, PaginatedRequestParams, ProtocolVersion, ServerResult, Tool,
};
use rmcp::service::{
    ClientCacheConfig, ClientInitializeError, NotificationContext, RunningService,
};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::common::client_side_sse::ExponentialBackoff;
use rmcp::transport::streamable_http_client::{
    StreamableHttpClientTransportConfig, StreamableHttpError,
};
use rmcp::{ClientHandler, RoleClient, ServiceError, ServiceExt};
use serde_json::{Map, Value};

use super::effect::{Observed, ResultFlag};

/// What an upstream answered to one `tools/call`, beside how the host classifies it.
#[derive(Debug)]
pub enum Answer {
    /// A `CallToolResult`, as JSON.
    Result(Value),
    /// A JSON-RPC error; its message is the upstream's and goes only to the caller.
    RpcError { code: i64, message: String },
    /// An HTTP status before any JSON-RPC answer.
    Status(u16),
    /// Nothing readable.
    Nothing,
    /// More than the response cap.
    TooLarge,
}

/// Fired when the upstream says its tool list changed.
pub type OnChange = Arc<dyn Fn() + Send + Sync>;

#[derive(Clone)]
struct Handler {
    info: ClientConfig,
    on_change: OnChange,
}

impl ClientHandler for Handler {
    fn get_info(&self) -> ClientConfig {
        self.info.clone()
    }

    async fn on_tool_list_changed(&self, _context: NotificationContext<RoleClient>) {
        (self.on_change)();
    }
}

/// A live, initialized session.
pub struct Session {
    service: RunningService<RoleClient, Handler>,
    /// The version the upstream answered in `initialize`.
    pub protocol_version: String,
    /// The credential this session was made with (a rotated one needs a new session).
    pub fingerprint: [u8; 32],
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("protocol_version", &self.protocol_version)
            .finish_non_exhaustive()
    }
}

/// How a session is made.
pub struct Dial<'a> {
    pub http: reqwest::Client,
    pub url: &'a str,
    /// The credential header, already marked sensitive.
    pub credential: Option<(reqwest::header::HeaderName, reqwest::header::HeaderValue)>,
    pub fingerprint: [u8; 32],
    pub offered_version: Option<&'a str>,
    pub max_response_bytes: usize,
    pub on_change: OnChange,
}

/// Why a session could not be made; never carries the URL or the credential.
#[derive(Debug, thiserror::Error)]
pub enum DialError {
    #[error("the upstream could not be reached")]
    Unreachable,
    #[error("the upstream refused the MCP handshake")]
    Handshake,
    #[error("the upstream answered protocol version {0:?}, which the gateway does not speak")]
    Version(String),
    #[error("the connection's credential is unavailable")]
    Credential,
}

impl Session {
    pub async fn open(dial: Dial<'_>) -> Result<Session, DialError> {
        let mut headers = HashMap::new();
        if let Some((name, value)) = dial.credential {
            headers.insert(name, value);
        }
        let mut config = StreamableHttpClientTransportConfig::with_uri(dial.url.to_owned())
            .custom_headers(headers)
            .reinit_on_expired_session(false);
        config.max_json_response_size = dial.max_response_bytes;
        config.max_sse_event_size = dial.max_response_bytes;
        // The standalone GET stream (where list_changed arrives) reconnects a bounded number of
        // times; a session whose stream is gone is replaced on its next failure.
        let mut backoff = ExponentialBackoff::default();
        backoff.max_times = Some(5);
        backoff.max_delay = Some(Duration::from_secs(10));
        config.retry_config = Arc::new(backoff);
        let transport =
            StreamableHttpClientTransport::with_client(super::keyed::Keyed(dial.http), config);
        let offered = match dial.offered_version {
            None => ProtocolVersion::LATEST,
            Some(text) => protocol_version(text).unwrap_or(ProtocolVersion::LATEST),
        };
        let info = ClientConfig::new(
            ClientCapabilities::default(),
            Implementation::new("obol", env!("CARGO_PKG_VERSION")),
        )
        .with_protocol_version(offered);
        let handler = Handler {
            info,
            on_change: dial.on_change,
        };
        // rmcp's error text may hold the URL; only the kind is kept.
        let service = handler
            .serve(transport)
            .await
            .map_err(|error| match &error {
                ClientInitializeError::TransportError { error, .. } => match error
                    .error
                    .downcast_ref::<StreamableHttpError<
                    reqwest::Error,
                >>() {
                    Some(StreamableHttpError::Client(inner)) if inner.is_connect() => {
                        DialError::Unreachable
                    }
                    _ => DialError::Handshake,
                },
                _ => DialError::Handshake,
            })?;
        let protocol_version = service
            .peer_info()
            .map(|info| info.protocol_version.to_string())
            .unwrap_or_default();
        if !super::PROTOCOL_VERSIONS.contains(&protocol_version.as_str()) {
            return Err(DialError::Version(
                protocol_version.chars().take(32).collect(),
            ));
        }
        service
            .peer()
            .set_response_cache_config(ClientCacheConfig::disabled())
            .await;
        Ok(Session {
            service,
            protocol_version,
            fingerprint: dial.fingerprint,
        })
    }

    /// Every page of `tools/list`, up to `max_pages` pages and `max_tools` tools; a cursor
    /// seen twice ends the listing as an error (the upstream would loop).
    pub async fn list_tools(
        &self,
        max_pages: usize,
        max_tools: usize,
    ) -> Result<Vec<Tool>, String> {
        let mut tools = Vec::new();
        let mut cursor: Option<String> = None;
        let mut seen = std::collections::HashSet::new();
        for _ in 0..max_pages {
            let params = cursor
                .clone()
                .map(|c| PaginatedRequestParams::default().with_cursor(Some(c)));
            let page = self
                .service
                .peer()
                .list_tools(params)
                .await
                .map_err(|e| format!("tools/list failed: {}", error_kind(&e)))?;
            tools.extend(page.tools);
            if tools.len() > max_tools {
                return Err(format!("the upstream lists more than {max_tools} tools"));
            }
            match page.next_cursor {
                None => return Ok(tools),
                Some(next) if !seen.insert(next.clone()) => {
                    return Err("the upstream repeated a tools/list cursor".into());
                }
                Some(next) => cursor = Some(next),
            }
        }
        Err(format!(
            "the upstream's tools/list runs past {max_pages} pages"
        ))
    }

    /// Sends exactly one `tools/call` (with the idempotency key in its header, when the tool
    /// declares one) and reports what the host observed.
    pub async fn call(
        &self,
        name: &str,
        arguments: Map<String, Value>,
        key: Option<super::keyed::IdempotencyHeader>,
        deadline: Duration,
    ) -> (Observed, Answer) {
        let params = CallToolRequestParams::new(name.to_owned()).with_arguments(arguments);
        let mut request = CallToolRequest::new(params);
        if let Some(key) = key {
            request.extensions.insert(key);
        }
        // One request, one POST (`RunningService::call_tool` could send more).
        let call = self
            .service
            .peer()
            .send_request(ClientRequest::CallToolRequest(request));
        match tokio::time::timeout(deadline, call).await {
            Err(_) => (Observed::LostAfterSend, Answer::Nothing),
            Ok(Ok(ServerResult::CallToolResult(result))) => {
                let flag = match result.is_error {
                    Some(true) => ResultFlag::Error,
                    _ => ResultFlag::Success,
                };
                match serde_json::to_value(&result) {
                    Ok(value) => (Observed::Result(flag), Answer::Result(value)),
                    Err(_) => (Observed::LostAfterSend, Answer::Nothing),
                }
            }
            // Anything but a result (a task, an input request) may have started the tool.
            Ok(Ok(_)) => (Observed::LostAfterSend, Answer::Nothing),
            Ok(Err(error)) => observe_failure(&error),
        }
    }

    /// Whether the session's worker has stopped (its transport closed).
    pub fn is_closed(&self) -> bool {
        self.service.peer().is_transport_closed()
    }
}

/// Sorts a failed call into the ADR's rows.
fn observe_failure(error: &ServiceError) -> (Observed, Answer) {
    match error {
        ServiceError::McpError(data) => (
            Observed::RpcError {
                code: i64::from(data.code.0),
            },
            Answer::RpcError {
                code: i64::from(data.code.0),
                message: data.message.chars().take(1024).collect(),
            },
        ),
        ServiceError::TransportSend(sent) => {
            match sent
                .error
                .downcast_ref::<StreamableHttpError<reqwest::Error>>()
            {
                Some(StreamableHttpError::SessionExpired) => {
                    (Observed::SessionExpired, Answer::Nothing)
                }
                Some(StreamableHttpError::Client(inner)) if inner.is_connect() => {
                    (Observed::NotSent, Answer::Nothing)
                }
                Some(StreamableHttpError::HttpStatus(status)) => (
                    Observed::Status(status.status),
                    Answer::Status(status.status),
                ),
                Some(StreamableHttpError::AuthRequired(_)) => {
                    (Observed::Status(401), Answer::Status(401))
                }
                Some(StreamableHttpError::InsufficientScope(_)) => {
                    (Observed::Status(403), Answer::Status(403))
                }
                Some(StreamableHttpError::ResponseBodyTooLarge { .. }) => {
                    (Observed::LostAfterSend, Answer::TooLarge)
                }
                _ => (Observed::LostAfterSend, Answer::Nothing),
            }
        }
        // The request may have been written before the worker stopped or gave up.
        _ => (Observed::LostAfterSend, Answer::Nothing),
    }
}

/// A failure's kind, without rmcp's text (which may hold the URL).
fn error_kind(error: &ServiceError) -> &'static str {
    match error {
        ServiceError::McpError(_) => "a JSON-RPC error",
        ServiceError::TransportSend(sent) => match sent
            .error
            .downcast_ref::<StreamableHttpError<reqwest::Error>>()
        {
            Some(StreamableHttpError::SessionExpired) => "the session expired",
            Some(StreamableHttpError::Client(inner)) if inner.is_connect() => {
                "the upstream could not be reached"
            }
            Some(StreamableHttpError::HttpStatus(_)) => "an HTTP error status",
            Some(StreamableHttpError::ResponseBodyTooLarge { .. }) => "an oversized response",
            _ => "a transport failure",
        },
        ServiceError::Timeout { .. } => "a timeout",
        _ => "the session closed",
    }
}

/// Whether a listing failed because the session expired (make a new one and list again).
pub fn expired(error: &str) -> bool {
    error.ends_with("the session expired")
}

fn protocol_version(text: &str) -> Option<ProtocolVersion> {
    serde_json::from_value(Value::String(text.to_owned())).ok()
}
