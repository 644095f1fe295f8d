//! The one error type of the gateway and its one rendering to the wire.
//!
//! Every failure a client can see is an [`ObolError`]. [`ObolError::wire`] is the single place
//! that decides its JSON-RPC code, HTTP statuses and envelope type; `docs/errors.md` is the
//! same table in prose, and a unit test keeps the two in step. `/mcp` renders an error with
//! [`ObolError::to_jsonrpc_error`], the REST routes with [`ObolError::to_rest_response`]; both
//! carry the same envelope.
//!
//! Codes are categories, `data.type` is the discriminator (ADR-0004): Obol's codes stay inside
//! -32000..-32019 because MCP allocates -32020..-32099 to itself, so several types share
//! [`RETRY_LATER`] or [`CALL_FAILED`].

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

/// "Retry later; nothing was dispatched": every type under this code is retryable.
pub const RETRY_LATER: i64 = -32000;
/// "The call failed; `data.type` and the receipt say how": no type under it is retryable
/// unchanged.
pub const CALL_FAILED: i64 = -32019;

/// The longest error message sent, in characters.
pub const MAX_MESSAGE_CHARS: usize = 1024;

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
    /// MCP 2026-07-28: a routing header is missing or disagrees with the body (-32020).
    #[error("Header mismatch: {0}")]
    HeaderMismatch(String),
    /// MCP 2026-07-28: the request's protocol version is not one served (-32022).
    #[error("Unsupported protocol version")]
    UnsupportedStatelessVersion { requested: String },
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
    /// A `fail_closed` workspace cannot list one of its MCP upstreams.
    #[error("MCP upstream {connection:?} cannot be listed; retry later")]
    UpstreamUnavailable { connection: String },
    /// A capability the key can reach, none of whose providers it can reach is eligible now
    /// (breakers open, upstreams down, other environments). Names nothing but the capability.
    #[error("no provider of {capability} is eligible now; retry later")]
    NoEligibleRoute { capability: String },
    #[error("the vendor's response exceeds {limit} bytes")]
    UpstreamResponseTooLarge { limit: usize },
    #[error("the connector's output exceeds {limit} bytes")]
    ComponentOutputTooLarge { limit: usize },
    #[error(
        "the tool's result nests more than {limit} levels deep, more than the gateway keeps; the receipt records the call"
    )]
    ResultTooDeep { limit: usize },
    #[error(
        "the tool's structured output does not match its own output schema: a bug of the connector or MCP server, not of the call (the gateway's log names the tool)"
    )]
    OutputSchemaViolation,
    #[error("the connection's credential is unavailable")]
    CredentialUnavailable,
    #[error("this idempotency key was used for a different call; nothing was dispatched")]
    IdempotencyConflict,
    #[error("the first call under this idempotency key is still in flight; retry later")]
    NotReady,
    #[error("the state store is unavailable; nothing was dispatched")]
    StoreUnavailable,
    /// The store or its other gateways are of another claim-key layout: admitting a call could
    /// address another slot than its retry (ADR-0047). The operator's log says what to drain.
    #[error(
        "this gateway admits no traffic until its store is migrated to its key layout (the operator runs `obol store migrate`); retry later"
    )]
    LayoutMismatch,
    #[error("every connector slot is busy; retry shortly")]
    Overloaded,
    #[error("the gateway is reading as many request bodies as it may; retry shortly")]
    BodyBudgetFull,
    #[error("the request body arrived too slowly; send it again")]
    RequestTimeout,
    #[error(
        "this key holds as many sessions as it may, all in use; close one (DELETE /mcp) or retry later"
    )]
    SessionLimit,
    #[error(
        "this key already has {pending} calls waiting for the workspace owner; retry once some are decided"
    )]
    ApprovalBacklog { pending: usize },
    #[error("too many failed authentications from this address; retry in {retry_after} s")]
    RateLimited { retry_after: u64 },

    // --- Approvals. -------------------------------------------------------------------------
    /// The one deliberate exception to existence hiding: the agent shows it to a human.
    #[error("this call needs a human's approval; nothing was sent")]
    ApprovalRequired(Box<ApprovalNotice>),
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

    // --- REST routes and the admin API only: never sent on `/mcp`, so they have no code. ----
    /// A receipt, approval, key or workspace that does not exist or that the caller may not
    /// see: deliberately the same answer.
    #[error("no such {0}")]
    NotFound(&'static str),
    /// The admin API answers only to the gateway's own host names (DNS rebinding).
    #[error("this gateway does not answer to that host name")]
    ForeignHost,
    #[error("the admin API is disabled; set [admin] token_hash to enable it")]
    AdminDisabled,
    /// An admin request whose body the gateway refuses; the message says why.
    #[error("{0}")]
    InvalidAdminRequest(String),
    /// The admin request collides with an existing record.
    #[error("{0}")]
    Conflict(&'static str),
    #[error("this key is defined in the config file; remove it there and restart")]
    DefinedInConfig,
}

/// What the agent gets with -32003 (`error.data.approval`): plain strings, so that the error
/// owns its data and imports no domain module. The approvals module builds one from a
/// ticket ([`ApprovalNotice::of`]).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ApprovalNotice {
    pub approval_id: String,
    pub tool: String,
    /// For a capability call: the provider tool it resolved to (the approval is for it only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub provider: Option<String>,
    /// RFC 3339, UTC.
    pub expires_at: String,
    pub inbox_url: String,
}

/// How an [`ObolError`] appears on the wire.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Wire {
    /// The JSON-RPC code; `None` for the errors only REST routes raise.
    pub code: Option<i64>,
    /// The status of the `/mcp` response that carries the error (200 for an error raised
    /// inside the MCP server, as JSON-RPC requires).
    pub http: StatusCode,
    /// The status on the REST routes, where no JSON-RPC code travels with the error.
    pub rest: StatusCode,
    /// The envelope's `type`; `None` for the plain JSON-RPC errors that carry no data.
    pub kind: Option<&'static str>,
    pub retryable: bool,
}

impl ObolError {
    /// The single mapping from error to JSON-RPC code, HTTP statuses and envelope type.
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
            HeaderMismatch(_) => return plain(-32020, StatusCode::BAD_REQUEST),
            UnsupportedStatelessVersion { .. } => return plain(-32022, StatusCode::BAD_REQUEST),
            InvalidParams(_) | UnknownTool => return plain(-32602, StatusCode::OK),
            InvalidArguments(_) => (-32602, StatusCode::OK, "invalid_arguments", false),
            NotReady => (RETRY_LATER, StatusCode::OK, "not_ready", true),
            StoreUnavailable => (RETRY_LATER, StatusCode::OK, "store_unavailable", true),
            LayoutMismatch => (
                RETRY_LATER,
                StatusCode::SERVICE_UNAVAILABLE,
                "layout_mismatch",
                true,
            ),
            Overloaded | BodyBudgetFull => (RETRY_LATER, StatusCode::OK, "overloaded", true),
            RequestTimeout => (
                RETRY_LATER,
                StatusCode::REQUEST_TIMEOUT,
                "request_timeout",
                true,
            ),
            SessionLimit => (RETRY_LATER, StatusCode::OK, "session_limit", true),
            ApprovalBacklog { .. } => (RETRY_LATER, StatusCode::OK, "approval_backlog", true),
            RateLimited { .. } => (
                RETRY_LATER,
                StatusCode::TOO_MANY_REQUESTS,
                "rate_limited",
                true,
            ),
            UpstreamUnreachable => (RETRY_LATER, StatusCode::OK, "upstream_unreachable", true),
            UpstreamUnavailable { .. } => {
                (RETRY_LATER, StatusCode::OK, "upstream_unavailable", true)
            }
            NoEligibleRoute { .. } => (RETRY_LATER, StatusCode::OK, "no_eligible_route", true),
            CredentialUnavailable => (RETRY_LATER, StatusCode::OK, "credential_unavailable", true),
            IdempotencyConflict => (CALL_FAILED, StatusCode::OK, "idempotency_conflict", false),
            ComponentFailed(_) => (CALL_FAILED, StatusCode::OK, "component_failed", false),
            EgressDenied => (CALL_FAILED, StatusCode::OK, "egress_denied", false),
            InvalidOutboundRequest(_) => (
                CALL_FAILED,
                StatusCode::OK,
                "invalid_outbound_request",
                false,
            ),
            UpstreamTimeout => (CALL_FAILED, StatusCode::OK, "upstream_timeout", false),
            UpstreamResponseTooLarge { .. } => (
                CALL_FAILED,
                StatusCode::OK,
                "upstream_response_too_large",
                false,
            ),
            ComponentOutputTooLarge { .. } => (
                CALL_FAILED,
                StatusCode::OK,
                "component_output_too_large",
                false,
            ),
            ResultTooDeep { .. } => (CALL_FAILED, StatusCode::OK, "result_too_deep", false),
            OutputSchemaViolation => (
                CALL_FAILED,
                StatusCode::OK,
                "output_schema_violation",
                false,
            ),
            Internal => return plain(-32603, StatusCode::INTERNAL_SERVER_ERROR),
            Replayed(stored) => {
                return plain(stored["code"].as_i64().unwrap_or(-32603), StatusCode::OK);
            }
            NotFound(_) => return rest_only(StatusCode::NOT_FOUND, "not_found"),
            ForeignHost => return rest_only(StatusCode::MISDIRECTED_REQUEST, "foreign_host"),
            AdminDisabled => return rest_only(StatusCode::NOT_FOUND, "admin_disabled"),
            InvalidAdminRequest(_) => return rest_only(StatusCode::BAD_REQUEST, "invalid"),
            Conflict(_) => return rest_only(StatusCode::CONFLICT, "conflict"),
            DefinedInConfig => return rest_only(StatusCode::CONFLICT, "defined_in_config"),
        };
        Wire {
            code: Some(code),
            http,
            rest: rest_status(code, http),
            kind: Some(kind),
            retryable,
        }
    }

    /// The message a client sees. `Unknown tool` is fixed so that every cause renders the same
    /// bytes; other messages never contain anything a client did not send.
    /// At most [`MAX_MESSAGE_CHARS`]: a message can carry what a connector or a parser said,
    /// and an error body stays small whatever caused it.
    fn message(&self) -> String {
        let message = match self {
            ObolError::UnknownTool => "Unknown tool".to_owned(),
            ObolError::MethodNotFound => "Method not found".to_owned(),
            ObolError::Internal => "Internal error".to_owned(),
            other => other.to_string(),
        };
        match message.char_indices().nth(MAX_MESSAGE_CHARS) {
            Some((at, _)) => format!("{}…", &message[..at]),
            None => message,
        }
    }

    /// The envelope: `/mcp` sends it as `error.data`, a REST route as `error`. `None` for the
    /// plain JSON-RPC errors, which carry no data.
    fn envelope(&self, wire: &Wire) -> Option<Value> {
        let kind = wire.kind?;
        let mut envelope =
            json!({ "type": kind, "message": self.message(), "retryable": wire.retryable });
        if let ObolError::ApprovalRequired(notice) = self {
            envelope["approval"] = json!(notice);
        }
        Some(envelope)
    }

    /// The JSON-RPC `error` object: `{code, message, data?}`.
    pub fn to_jsonrpc_error(&self) -> Value {
        if let ObolError::Replayed(stored) = self {
            return stored.clone();
        }
        let wire = self.wire();
        let Some(code) = wire.code else {
            // A REST-only error has no JSON-RPC form; reaching here is a bug, and a bug
            // tells the client nothing.
            return ObolError::Internal.to_jsonrpc_error();
        };
        let mut rendered = json!({ "code": code, "message": self.message() });
        if let Some(envelope) = self.envelope(&wire) {
            rendered["data"] = envelope;
        }
        // The revision's own shape: what is served, and what was asked for.
        if let ObolError::UnsupportedStatelessVersion { requested } = self {
            rendered["data"] = json!({
                "supported": crate::mcp::stateless::SUPPORTED,
                "requested": requested,
            });
        }
        rendered
    }

    /// The answer of a REST route (`/v1/receipts`, `/v1/approvals`, the admin API): the REST
    /// status and `{"error": <envelope>}`, the envelope being exactly what `/mcp` sends as
    /// `error.data`.
    pub fn to_rest_response(&self) -> Response {
        let (status, body) = self.to_rest();
        (status, axum::Json(body)).into_response()
    }

    fn to_rest(&self) -> (StatusCode, Value) {
        let wire = self.wire();
        // A plain JSON-RPC error has no envelope on `/mcp`; on REST it still needs a body.
        let envelope = self
            .envelope(&wire)
            .unwrap_or_else(|| json!({ "message": self.message(), "retryable": wire.retryable }));
        (wire.rest, json!({ "error": envelope }))
    }
}

/// The status of an error on a REST route. `/mcp` answers an error raised inside the MCP
/// server with HTTP 200 and lets the JSON-RPC code say what happened; a REST answer has no
/// code, so its status must say it. Retry-later is 503; any other in-band error has no REST
/// route that raises it, and one that did would be a bug (500).
fn rest_status(code: i64, http: StatusCode) -> StatusCode {
    match code {
        _ if http != StatusCode::OK => http,
        RETRY_LATER => StatusCode::SERVICE_UNAVAILABLE,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

fn plain(code: i64, http: StatusCode) -> Wire {
    Wire {
        code: Some(code),
        http,
        rest: rest_status(code, http),
        kind: None,
        retryable: false,
    }
}

/// An error of the REST routes alone: one status, no JSON-RPC code.
fn rest_only(http: StatusCode, kind: &'static str) -> Wire {
    Wire {
        code: None,
        http,
        rest: http,
        kind: Some(kind),
        retryable: false,
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use ObolError as E;

    /// Declares one sample of every variant. Each line is a pattern and a value of it; the
    /// patterns form one exhaustive `match`, so a new variant of [`ObolError`] does not compile
    /// until it has a line here, and every sample is checked against its own pattern.
    macro_rules! one_of_each {
        ($($pattern:pat => $sample:expr),+ $(,)?) => {
            fn every_variant() -> Vec<ObolError> {
                #[deny(unreachable_patterns)]
                fn listed(error: &ObolError) {
                    match error {
                        $($pattern => {})+
                    }
                }
                let samples = vec![$($sample),+];
                samples.iter().for_each(listed);
                let patterns = [$(stringify!($pattern)),+];
                let matching = [$(matches!($sample, $pattern)),+];
                for (pattern, matched) in patterns.iter().zip(matching) {
                    assert!(matched, "the sample of {pattern} is another variant");
                }
                samples
            }
        };
    }

    one_of_each! {
        E::Unauthenticated(_) => E::Unauthenticated("x"),
        E::OriginNotAllowed(_) => E::OriginNotAllowed(String::new()),
        E::NotAcceptable(_) => E::NotAcceptable("x"),
        E::UnsupportedMediaType => E::UnsupportedMediaType,
        E::PayloadTooLarge { .. } => E::PayloadTooLarge { limit: 1 },
        E::UnsupportedProtocolVersion(_) => E::UnsupportedProtocolVersion(String::new()),
        E::SessionRequired => E::SessionRequired,
        E::MalformedHeader { .. } => E::MalformedHeader { header: "x", reason: "y" },
        E::UnknownSession => E::UnknownSession,
        E::InvalidIdempotencyKey(_) => E::InvalidIdempotencyKey(String::new()),
        E::EnvironmentMismatch { .. } => E::EnvironmentMismatch { served: "prod", key: "dev" },
        E::Frozen => E::Frozen,
        E::ScopeDenied(_) => E::ScopeDenied("mcp"),
        E::ApprovalInvalid(_) => E::ApprovalInvalid("x"),
        E::Parse(_) => E::Parse(String::new()),
        E::InvalidRequest(_) => E::InvalidRequest(String::new()),
        E::MethodNotFound => E::MethodNotFound,
        E::HeaderMismatch(_) => E::HeaderMismatch(String::new()),
        E::UnsupportedStatelessVersion { .. } => E::UnsupportedStatelessVersion {
            requested: String::new(),
        },
        E::InvalidParams(_) => E::InvalidParams(String::new()),
        E::UnknownTool => E::UnknownTool,
        E::InvalidArguments(_) => E::InvalidArguments(String::new()),
        E::ComponentFailed(_) => E::ComponentFailed(String::new()),
        E::EgressDenied => E::EgressDenied,
        E::InvalidOutboundRequest(_) => E::InvalidOutboundRequest(String::new()),
        E::UpstreamUnreachable => E::UpstreamUnreachable,
        E::UpstreamTimeout => E::UpstreamTimeout,
        E::UpstreamUnavailable { .. } => E::UpstreamUnavailable {
            connection: String::new(),
        },
        E::NoEligibleRoute { .. } => E::NoEligibleRoute {
            capability: String::new(),
        },
        E::UpstreamResponseTooLarge { .. } => E::UpstreamResponseTooLarge { limit: 1 },
        E::ComponentOutputTooLarge { .. } => E::ComponentOutputTooLarge { limit: 1 },
        E::ResultTooDeep { .. } => E::ResultTooDeep { limit: 1 },
        E::OutputSchemaViolation => E::OutputSchemaViolation,
        E::CredentialUnavailable => E::CredentialUnavailable,
        E::IdempotencyConflict => E::IdempotencyConflict,
        E::NotReady => E::NotReady,
        E::StoreUnavailable => E::StoreUnavailable,
        E::LayoutMismatch => E::LayoutMismatch,
        E::Overloaded => E::Overloaded,
        E::BodyBudgetFull => E::BodyBudgetFull,
        E::RequestTimeout => E::RequestTimeout,
        E::RateLimited { .. } => E::RateLimited { retry_after: 1 },
        E::SessionLimit => E::SessionLimit,
        E::ApprovalBacklog { .. } => E::ApprovalBacklog { pending: 1 },
        E::ApprovalRequired(_) => E::ApprovalRequired(Box::new(ApprovalNotice {
            approval_id: String::new(),
            tool: String::new(),
            provider: None,
            expires_at: String::new(),
            inbox_url: String::new(),
        })),
        E::ApprovalExpired => E::ApprovalExpired,
        E::ApprovalDenied => E::ApprovalDenied,
        E::ApprovalMismatch(_) => E::ApprovalMismatch("x"),
        E::Internal => E::Internal,
        E::Replayed(_) => E::Replayed(json!({ "code": CALL_FAILED, "message": "stored" })),
        E::NotFound(_) => E::NotFound("receipt"),
        E::ForeignHost => E::ForeignHost,
        E::AdminDisabled => E::AdminDisabled,
        E::InvalidAdminRequest(_) => E::InvalidAdminRequest(String::new()),
        E::Conflict(_) => E::Conflict("x"),
        E::DefinedInConfig => E::DefinedInConfig,
    }

    /// A row of an envelope table in `docs/errors.md`: code (`None` for `—`), HTTP status,
    /// retryable.
    type Row = (Option<i64>, u16, bool);

    /// Every row of the envelope tables (those whose first cell is a backticked type), by
    /// type. A type listed twice must be listed the same way: the docs may not disagree with
    /// themselves.
    fn documented_rows(doc: &str) -> BTreeMap<String, Row> {
        let mut rows = BTreeMap::new();
        for line in doc.lines().filter(|l| l.starts_with("| `")) {
            let cells: Vec<&str> = line.split('|').map(str::trim).collect();
            let kind = cells[1].trim_matches('`').to_owned();
            let code = match cells[2] {
                "—" => None,
                code => Some(code.parse().unwrap_or_else(|_| panic!("code in {line}"))),
            };
            let http = cells[3]
                .parse()
                .unwrap_or_else(|_| panic!("HTTP in {line}"));
            let retryable = match cells[4] {
                "yes" => true,
                "no" => false,
                other => panic!("retryable {other:?} in {line}"),
            };
            let row = (code, http, retryable);
            if let Some(earlier) = rows.insert(kind.clone(), row) {
                assert_eq!(
                    earlier, row,
                    "docs/errors.md lists `{kind}` twice, differently"
                );
            }
        }
        rows
    }

    /// Every envelope type in code has its row in `docs/errors.md` with the same code, status
    /// and retryability, and the docs list no type the code lacks, so the operator-facing
    /// table cannot drift from what the gateway sends.
    #[test]
    fn error_table_in_docs_matches_the_enum() {
        let documented = documented_rows(include_str!("../../docs/errors.md"));
        let mut unseen = documented.clone();
        for error in every_variant() {
            let wire = error.wire();
            let Some(kind) = wire.kind else { continue };
            let row = (wire.code, wire.http.as_u16(), wire.retryable);
            // Several variants may share a type (with one wire form): each must match its row.
            assert_eq!(
                documented.get(kind),
                Some(&row),
                "docs/errors.md: the row of `{kind}` (code, HTTP, retryable)"
            );
            unseen.remove(kind);
        }
        assert!(
            unseen.is_empty(),
            "docs/errors.md lists types the gateway never sends: {unseen:?}"
        );
    }

    /// The other docs name codes too (`docs/transport.md`, `docs/idempotency.md`,
    /// `docs/approvals.md`): a table row there that names exactly one envelope type and one
    /// code must give the type's code, so no row anywhere disagrees with `docs/errors.md`.
    #[test]
    fn other_docs_name_the_same_codes() {
        let codes: BTreeMap<&str, Option<i64>> = every_variant()
            .iter()
            .filter_map(|error| {
                let wire = error.wire();
                Some((wire.kind?, wire.code))
            })
            .collect();
        let docs = [
            ("docs/transport.md", include_str!("../../docs/transport.md")),
            (
                "docs/idempotency.md",
                include_str!("../../docs/idempotency.md"),
            ),
            ("docs/approvals.md", include_str!("../../docs/approvals.md")),
        ];
        for (file, doc) in docs {
            for line in doc.lines().filter(|l| l.starts_with('|')) {
                let kinds: Vec<&str> = line
                    .split('`')
                    .skip(1)
                    .step_by(2)
                    .filter(|quoted| codes.contains_key(quoted))
                    .collect();
                let named: Vec<i64> = line
                    .match_indices("-32")
                    .filter_map(|(at, _)| line.get(at..at + 6)?.parse().ok())
                    .collect();
                if let ([kind], [code]) = (kinds.as_slice(), named.as_slice()) {
                    assert_eq!(codes[kind], Some(*code), "{file}: {line}");
                }
            }
        }
    }

    /// The plain JSON-RPC rows: each plain error's code appears with its HTTP status.
    #[test]
    fn plain_errors_in_docs_match_the_enum() {
        let doc = include_str!("../../docs/errors.md");
        for error in every_variant() {
            let wire = error.wire();
            if wire.kind.is_some() || matches!(error, E::Replayed(_)) {
                continue;
            }
            let code = wire.code.unwrap();
            let http = wire.http.as_u16();
            let documented = doc.lines().any(|line| {
                let cells: Vec<&str> = line.split('|').map(str::trim).collect();
                cells.len() > 3 && cells[1] == code.to_string() && cells[3] == http.to_string()
            });
            assert!(
                documented,
                "docs/errors.md lacks a plain row {code} with HTTP {http}"
            );
        }
    }

    /// Only MCP's -32003 and Obol's -32000..-32019 are Obol codes, and a shared code is a
    /// category: everything under retry-later is retryable, nothing under call-failed is.
    #[test]
    fn codes_stay_outside_the_range_mcp_allocates() {
        for error in every_variant() {
            let wire = error.wire();
            let (Some(code), Some(kind)) = (wire.code, wire.kind) else {
                continue;
            };
            assert!(
                (-32019..=-32000).contains(&code) || code == -32602,
                "`{kind}` has {code}"
            );
            match code {
                RETRY_LATER => assert!(wire.retryable, "`{kind}` is not retryable"),
                CALL_FAILED => assert!(!wire.retryable, "`{kind}` is retryable"),
                _ => {}
            }
        }
    }

    /// A REST route sends the same envelope `/mcp` sends as `error.data`, and a status that is
    /// never a success.
    #[test]
    fn rest_answers_carry_the_mcp_envelope() {
        for error in every_variant() {
            let (status, body) = error.to_rest();
            assert!(!status.is_success(), "{error:?} answers {status} on REST");
            let wire = error.wire();
            if wire.code.is_some() && wire.kind.is_some() {
                assert_eq!(body["error"], error.to_jsonrpc_error()["data"], "{error:?}");
            }
        }
        assert_eq!(
            E::StoreUnavailable.to_rest(),
            (
                StatusCode::SERVICE_UNAVAILABLE,
                json!({ "error": {
                    "type": "store_unavailable",
                    "message": "the state store is unavailable; nothing was dispatched",
                    "retryable": true,
                }})
            )
        );
        assert_eq!(E::NotFound("receipt").to_rest().0, StatusCode::NOT_FOUND);
    }

    /// An error only REST routes raise renders as a bare internal error if it ever reached
    /// `/mcp`.
    #[test]
    fn rest_only_errors_tell_mcp_nothing() {
        assert_eq!(
            E::Conflict("a key with this name exists").to_jsonrpc_error(),
            json!({ "code": -32603, "message": "Internal error" })
        );
    }

    #[test]
    fn unknown_tool_has_no_data() {
        let rendered = ObolError::UnknownTool.to_jsonrpc_error();
        assert_eq!(
            rendered,
            json!({ "code": -32602, "message": "Unknown tool" })
        );
    }

    #[test]
    fn shared_codes_are_told_apart_by_data_type() {
        let rendered = ObolError::StoreUnavailable.to_jsonrpc_error();
        assert_eq!(rendered["code"], json!(-32000));
        assert_eq!(rendered["data"]["type"], json!("store_unavailable"));
        assert_eq!(rendered["data"]["retryable"], json!(true));
    }
}
