//! The one error type of the gateway and its one rendering to the wire.
//!
//! Every failure a client can see is an [`ObolError`]. [`ObolError::wire`] is the single place
//! that decides its JSON-RPC code, HTTP status and `error.data` envelope; `docs/errors.md` is
//! the same table in prose, and a unit test keeps the two in step.

use axum::http::StatusCode;
use serde_json::{Value, json};

/// A failure, named by what a client or operator can do about it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ObolError {
    // --- Transport: refused before the MCP server is reached. -------------------------------
    #[error("missing or invalid credentials: {0}")]
    Unauthenticated(&'static str),
    #[error("origin {0:?} is not allowed")]
    OriginNotAllowed(String),
    #[error("the Accept header must allow {0}")]
    NotAcceptable(&'static str),
    #[error("Content-Type must be application/json")]
    UnsupportedMediaType,
    #[error("request body exceeds {limit} bytes")]
    PayloadTooLarge { limit: usize },
    #[error("unsupported MCP-Protocol-Version {0:?}")]
    UnsupportedProtocolVersion(String),
    #[error("Mcp-Session-Id header is required; call initialize first")]
    SessionRequired,
    #[error("malformed header {header}: {reason}")]
    MalformedHeader {
        header: &'static str,
        reason: &'static str,
    },
    #[error("unknown session")]
    UnknownSession,
    #[error("invalid Idempotency-Key: {0}")]
    InvalidIdempotencyKey(String),
    #[error("this gateway serves the {served} environment; the key belongs to {key}")]
    EnvironmentMismatch {
        served: &'static str,
        key: &'static str,
    },
    #[error("the workspace is frozen: every call is refused")]
    Frozen,
    #[error("the key lacks the {0:?} scope")]
    ScopeDenied(&'static str),
    /// A resume's approval headers or token are not a genuine approval for this key.
    #[error("approval refused: {0}")]
    ApprovalInvalid(&'static str),

    // --- JSON-RPC. --------------------------------------------------------------------------
    #[error("parse error: {0}")]
    Parse(String),
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    #[error("method not found")]
    MethodNotFound,
    #[error("invalid params: {0}")]
    InvalidParams(String),
    /// Malformed, absent, not routable or not allowed: deliberately indistinguishable.
    #[error("Unknown tool")]
    UnknownTool,

    // --- The invocation. --------------------------------------------------------------------
    #[error("invalid arguments: {0}")]
    InvalidArguments(String),
    #[error("the connector component failed: {0}")]
    ComponentFailed(String),
    #[error("the connector asked to send a request outside its connection's origin")]
    EgressDenied,
    #[error("the connector's request is not acceptable: {0}")]
    InvalidOutboundRequest(String),
    #[error("the vendor could not be reached; nothing was sent")]
    UpstreamUnreachable,
    #[error("the vendor did not answer in time; the outcome is unknown")]
    UpstreamTimeout,
    #[error("the vendor's response exceeds {limit} bytes")]
    UpstreamResponseTooLarge { limit: usize },
    #[error("the connector's output exceeds {limit} bytes")]
    ComponentOutputTooLarge { limit: usize },
    #[error("the vendor's response does not match the tool's output schema")]
    OutputSchemaViolation,
    #[error("the connection's credential is unavailable")]
    CredentialUnavailable,
    #[error("this idempotency key was used for a different call; nothing was dispatched")]
    IdempotencyConflict,
    #[error("the first call under this idempotency key is still in flight; retry later")]
    NotReady,
    #[error("the state store is unavailable; nothing was dispatched")]
    StoreUnavailable,
    #[error("every connector slot is busy; retry shortly")]
    Overloaded,

    // --- Approvals. -------------------------------------------------------------------------
    /// The one deliberate exception to existence hiding: the agent shows it to a human.
    #[error("this call needs a human's approval; nothing was sent")]
    ApprovalRequired(Box<crate::approvals::ApprovalNotice>),
    #[error("the approval expired; nothing was sent")]
    ApprovalExpired,
    #[error("the workspace owner denied this call; nothing was sent")]
    ApprovalDenied,
    #[error("the approval was given for another call: {0}")]
    ApprovalMismatch(&'static str),
    #[error("internal error")]
    Internal,
    /// The stored error of a finished call, answered again verbatim to a same-key replay.
    #[error("replayed error")]
    Replayed(serde_json::Value),
}

/// How an [`ObolError`] appears on the wire.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Wire {
    pub code: i64,
    pub http: StatusCode,
    /// The envelope's `type`; `None` for the plain JSON-RPC errors that carry no data.
    pub kind: Option<&'static str>,
    pub retryable: bool,
}

impl ObolError {
    /// The single mapping from error to JSON-RPC code, HTTP status and envelope type.
    pub fn wire(&self) -> Wire {
        use ObolError::*;
        let (code, http, kind, retryable) = match self {
            Unauthenticated(_) => (-32001, StatusCode::UNAUTHORIZED, "unauthenticated", false),
            OriginNotAllowed(_) => (-32002, StatusCode::FORBIDDEN, "origin_not_allowed", false),
            NotAcceptable(_) => (-32004, StatusCode::NOT_ACCEPTABLE, "not_acceptable", false),
            UnsupportedMediaType => (
                -32005,
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "unsupported_media_type",
                false,
            ),
            PayloadTooLarge { .. } => (
                -32006,
                StatusCode::PAYLOAD_TOO_LARGE,
                "payload_too_large",
                false,
            ),
            UnsupportedProtocolVersion(_) => (
                -32007,
                StatusCode::BAD_REQUEST,
                "unsupported_protocol_version",
                false,
            ),
            SessionRequired => (-32008, StatusCode::BAD_REQUEST, "session_required", false),
            MalformedHeader { .. } => (-32009, StatusCode::BAD_REQUEST, "malformed_header", false),
            UnknownSession => (-32010, StatusCode::NOT_FOUND, "unknown_session", false),
            EnvironmentMismatch { .. } => {
                (-32012, StatusCode::FORBIDDEN, "environment_mismatch", false)
            }
            Frozen => (-32013, StatusCode::FORBIDDEN, "frozen", false),
            ScopeDenied(_) => (-32014, StatusCode::FORBIDDEN, "scope_denied", false),
            ApprovalInvalid(_) => (-32015, StatusCode::FORBIDDEN, "approval_invalid", false),
            ApprovalRequired(_) => (-32003, StatusCode::OK, "approval_required", false),
            ApprovalExpired => (-32016, StatusCode::OK, "approval_expired", false),
            ApprovalDenied => (-32017, StatusCode::OK, "approval_denied", false),
            ApprovalMismatch(_) => (-32018, StatusCode::OK, "approval_mismatch", false),
            InvalidIdempotencyKey(_) => (
                -32011,
                StatusCode::BAD_REQUEST,
                "invalid_idempotency_key",
                false,
            ),
            Parse(_) => return plain(-32700, StatusCode::BAD_REQUEST),
            InvalidRequest(_) => return plain(-32600, StatusCode::BAD_REQUEST),
            MethodNotFound => return plain(-32601, StatusCode::OK),
            InvalidParams(_) | UnknownTool => return plain(-32602, StatusCode::OK),
            InvalidArguments(_) => (-32602, StatusCode::OK, "invalid_arguments", false),
            ComponentFailed(_) => (-32030, StatusCode::OK, "component_failed", false),
            EgressDenied => (-32031, StatusCode::OK, "egress_denied", false),
            InvalidOutboundRequest(_) => {
                (-32032, StatusCode::OK, "invalid_outbound_request", false)
            }
            UpstreamUnreachable => (-32033, StatusCode::OK, "upstream_unreachable", true),
            UpstreamTimeout => (-32034, StatusCode::OK, "upstream_timeout", false),
            UpstreamResponseTooLarge { .. } => {
                (-32035, StatusCode::OK, "upstream_response_too_large", false)
            }
            ComponentOutputTooLarge { .. } => {
                (-32036, StatusCode::OK, "component_output_too_large", false)
            }
            OutputSchemaViolation => (-32037, StatusCode::OK, "output_schema_violation", false),
            CredentialUnavailable => (-32038, StatusCode::OK, "credential_unavailable", true),
            IdempotencyConflict => (-32040, StatusCode::OK, "idempotency_conflict", false),
            NotReady => (-32041, StatusCode::OK, "not_ready", true),
            StoreUnavailable => (-32042, StatusCode::OK, "store_unavailable", true),
            Overloaded => (-32043, StatusCode::OK, "overloaded", true),
            Internal => return plain(-32603, StatusCode::INTERNAL_SERVER_ERROR),
            Replayed(stored) => {
                return plain(stored["code"].as_i64().unwrap_or(-32603), StatusCode::OK);
            }
        };
        Wire {
            code,
            http,
            kind: Some(kind),
            retryable,
        }
    }

    /// The JSON-RPC `error` object: `{code, message, data?}`.
    ///
    /// `Unknown tool` has a fixed message and no data so that every cause renders the same
    /// bytes; other plain errors keep their message, which never contains anything a client
    /// did not send.
    pub fn to_jsonrpc_error(&self) -> Value {
        if let ObolError::Replayed(stored) = self {
            return stored.clone();
        }
        let wire = self.wire();
        let message = match self {
            ObolError::UnknownTool => "Unknown tool".to_owned(),
            ObolError::MethodNotFound => "Method not found".to_owned(),
            ObolError::Internal => "Internal error".to_owned(),
            other => other.to_string(),
        };
        let mut rendered = match wire.kind {
            None => json!({ "code": wire.code, "message": message }),
            Some(kind) => json!({
                "code": wire.code,
                "message": message,
                "data": { "type": kind, "message": message, "retryable": wire.retryable },
            }),
        };
        if let ObolError::ApprovalRequired(notice) = self {
            rendered["data"]["approval"] = json!(notice);
        }
        rendered
    }
}

fn plain(code: i64, http: StatusCode) -> Wire {
    Wire {
        code,
        http,
        kind: None,
        retryable: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every envelope type in code appears in `docs/errors.md` with the same code and status,
    /// so the operator-facing table cannot drift from what the gateway sends.
    #[test]
    fn error_table_in_docs_matches_the_enum() {
        let doc = include_str!("../../docs/errors.md");
        let samples = [
            ObolError::Unauthenticated("x"),
            ObolError::OriginNotAllowed(String::new()),
            ObolError::NotAcceptable("x"),
            ObolError::UnsupportedMediaType,
            ObolError::PayloadTooLarge { limit: 1 },
            ObolError::UnsupportedProtocolVersion(String::new()),
            ObolError::SessionRequired,
            ObolError::MalformedHeader {
                header: "x",
                reason: "y",
            },
            ObolError::UnknownSession,
            ObolError::InvalidArguments(String::new()),
            ObolError::ComponentFailed(String::new()),
            ObolError::EgressDenied,
            ObolError::InvalidOutboundRequest(String::new()),
            ObolError::UpstreamUnreachable,
            ObolError::UpstreamTimeout,
            ObolError::UpstreamResponseTooLarge { limit: 1 },
            ObolError::ComponentOutputTooLarge { limit: 1 },
            ObolError::OutputSchemaViolation,
            ObolError::CredentialUnavailable,
            ObolError::InvalidIdempotencyKey(String::new()),
            ObolError::EnvironmentMismatch {
                served: "prod",
                key: "dev",
            },
            ObolError::Frozen,
            ObolError::ScopeDenied("mcp"),
            ObolError::IdempotencyConflict,
            ObolError::NotReady,
            ObolError::StoreUnavailable,
            ObolError::Overloaded,
            ObolError::ApprovalInvalid("x"),
            ObolError::ApprovalExpired,
            ObolError::ApprovalDenied,
            ObolError::ApprovalMismatch("x"),
            ObolError::ApprovalRequired(Box::new(crate::approvals::ApprovalNotice {
                approval_id: String::new(),
                tool: String::new(),
                expires_at: String::new(),
                inbox_url: String::new(),
            })),
        ];
        for error in samples {
            let wire = error.wire();
            let kind = wire.kind.unwrap();
            let row = format!(
                "| `{kind}` | {} | {} | {} |",
                wire.code,
                wire.http.as_u16(),
                if wire.retryable { "yes" } else { "no" }
            );
            assert!(doc.contains(&row), "docs/errors.md lacks the row {row}");
        }
    }

    #[test]
    fn unknown_tool_has_no_data() {
        let rendered = ObolError::UnknownTool.to_jsonrpc_error();
        assert_eq!(
            rendered,
            json!({ "code": -32602, "message": "Unknown tool" })
        );
    }
}
