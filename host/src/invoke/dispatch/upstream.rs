//! The MCP upstream kind: the host sends `tools/call` through the pooled rmcp session and
//! classifies the attempt by ADR-0045's table; the upstream's result is relayed, checked
//! against the tool's output schema and the output cap.

use std::sync::Arc;

use serde_json::{Map, Value};

use super::{Outcome, Reply, failpoint};
use crate::catalog::{Propagation, Route, StatusClass};
use crate::config::{ConnectionConfig, ConnectionKind, McpUpstream};
use crate::error::ObolError;
use crate::invoke::Services;
use crate::upstream::effect::{self, ErrorResults, Verdict};
use crate::upstream::keyed::IdempotencyHeader;
use crate::upstream::session::Answer;
use crate::upstream::{Target, UpstreamId};

/// A `tools/call` ready to be sent.
#[derive(Debug, Clone)]
pub struct Request {
    id: UpstreamId,
    connection: Arc<ConnectionConfig>,
    upstream: Arc<McpUpstream>,
    /// The upstream's own name for the tool (unprefixed, dots and all).
    name: String,
    arguments: Map<String, Value>,
    error_results: ErrorResults,
    /// The key, in the header the operator declared the upstream deduplicates on.
    key: Option<IdempotencyHeader>,
}

/// Builds the call and its pinned facts (`mcp ORIGIN UPSTREAM_TOOL`). A credential that
/// cannot be read refuses the call before anything is written.
pub fn prepare(
    route: &Route,
    id: &UpstreamId,
    arguments: &Map<String, Value>,
    idempotency_key: &crate::idempotency::IdempotencyKey,
) -> Result<(Request, String), ObolError> {
    let ConnectionKind::Mcp(upstream) = &route.connection.kind else {
        return Err(ObolError::Internal);
    };
    if let Some(secret) = &route.connection.secret {
        crate::outbound::credential_header(secret)?;
    }
    let name = route.name.upstream().to_owned();
    let error_results = upstream
        .tools
        .get(&name)
        .map(|tool| tool.error_results)
        .unwrap_or_default();
    let key = match &route.tool().effect.propagation {
        Propagation::Header(header) => Some(IdempotencyHeader {
            name: header.clone(),
            value: idempotency_key
                .as_str()
                .parse()
                .map_err(|_| ObolError::Internal)?,
        }),
        _ => None,
    };
    let facts = format!("mcp {} {name}", upstream.url.origin());
    Ok((
        Request {
            id: id.clone(),
            connection: Arc::clone(&route.connection),
            upstream: Arc::clone(upstream),
            name,
            arguments: arguments.clone(),
            error_results,
            key,
        },
        facts,
    ))
}

/// Sends one `tools/call` and classifies it.
pub async fn send(services: &Services, request: &Request) -> Outcome {
    failpoint("hang-before-send").await;
    let target = Target {
        id: &request.id,
        connection: &request.connection,
        upstream: &request.upstream,
    };
    let (observed, answer) = services
        .upstreams
        .call(
            target,
            &request.name,
            request.arguments.clone(),
            request.key.clone(),
        )
        .await;
    failpoint("hang-after-send").await;
    let class = match effect::classify(observed, request.error_results) {
        // Refused before it ran (nothing sent, or a session the upstream expired): the
        // lifecycle sends again under the same reservation.
        Verdict::SendAgain => return Outcome::NotSent,
        Verdict::Accepted => StatusClass::Accepted,
        Verdict::DefinitelyRejected => StatusClass::DefinitelyRejected,
        Verdict::Retryable => StatusClass::Retryable,
        Verdict::Unknown => StatusClass::Unknown,
    };
    match answer {
        Answer::Nothing => Outcome::SentNoReply,
        Answer::TooLarge => Outcome::TooLarge { class },
        answer => Outcome::Replied {
            reply: Reply::Upstream(answer),
            class,
        },
    }
}

/// The `CallToolResult` the client gets. Only `content`, `structuredContent` and the host's
/// `isError` are relayed.
pub fn render(
    services: &Services,
    route: &Route,
    class: StatusClass,
    answer: Answer,
) -> Result<super::CallResult, ObolError> {
    let failed = |text: String| Ok(super::CallResult::failed(text));
    let mut result = match answer {
        Answer::Result(result) => result,
        Answer::RpcError { code, message } => {
            return failed(format!(
                "the upstream refused the call (JSON-RPC error {code}): {message}"
            ));
        }
        Answer::Status(status) => {
            return failed(format!(
                "the upstream answered HTTP {status} before any result"
            ));
        }
        Answer::Nothing | Answer::TooLarge => return Err(ObolError::Internal),
    };
    let limit = services.runtime.limits().max_output_bytes;
    if serde_json::to_string(&result).map_or(usize::MAX, |text| text.len()) > limit {
        return Err(ObolError::UpstreamResponseTooLarge { limit });
    }
    let content = match result.get_mut("content").map(Value::take) {
        Some(Value::Array(items)) => items,
        _ => Vec::new(),
    };
    let structured = result.get_mut("structuredContent").map(Value::take);
    super::tool_result(route, class, content, structured)
}
