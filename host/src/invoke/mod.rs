//! The invocation lifecycle: every `tools/call` runs through [`invoke`], top to bottom.
//!
//! ```text
//! route ─▶ authorize ─▶ check arguments ─▶ prepare (guest) ─▶ check + complete the request
//!       ─▶ send one attempt ─▶ classify (EffectSpec) ─▶ interpret (guest) ─▶ check output ─▶ respond
//! ```
//!
//! The order is the contract. Routing happens before authorization so the decision can be
//! recorded; nothing leaves the gateway before the request template passed the outbound
//! checks; the status is classified by the host from the EffectSpec before the guest renders
//! anything, so a guest cannot turn a failure into a success.

use std::sync::Arc;

use serde_json::{Map, Value, json};

use crate::catalog::{Catalog, Route, StatusClass, ToolName};
use crate::error::ObolError;
use crate::outbound::{AttemptOutcome, Outbound, Prepared};
use crate::policy::VirtualKey;
use crate::runtime::{GuestFailure, Runtime, wit};

/// What the lifecycle needs from the gateway.
#[derive(Debug)]
pub struct Services {
    pub runtime: Arc<Runtime>,
    pub outbound: Outbound,
}

/// A `tools/call` as the client sent it.
#[derive(Debug)]
pub struct CallRequest {
    pub name: String,
    pub arguments: Map<String, Value>,
}

/// Runs one tool call and returns the MCP `CallToolResult` as JSON.
pub async fn invoke(
    services: &Services,
    catalog: &Catalog,
    key: &VirtualKey,
    request: CallRequest,
) -> Result<Value, ObolError> {
    // Route + authorize. Every way of not finding a callable tool is the same answer.
    let route = route(catalog, key, &request.name).ok_or(ObolError::UnknownTool)?;
    let tool = route.tool();
    let arguments = Value::Object(request.arguments);

    // Arguments are checked by the host against the declared schema, so a component only
    // ever sees arguments its own schema admits.
    let violations = tool.input_schema.violations(&arguments);
    if !violations.is_empty() {
        return Err(ObolError::InvalidArguments(violations.join("; ")));
    }

    // Prepare: the guest turns the call into a request template.
    let connector = route.connector.manifest.name.as_str();
    let facts = wit::ConnectionFacts {
        base_url: route.connection.base_url.as_str().to_owned(),
        settings: route
            .connection
            .settings
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
    };
    let template = services
        .runtime
        .prepare(
            &route.connector.guest,
            connector,
            route.name.upstream(),
            arguments.to_string(),
            facts,
        )
        .await
        .map_err(guest_failed)?
        .map_err(|error| match error {
            wit::PrepareError::InvalidArguments(message) => ObolError::InvalidArguments(message),
            wit::PrepareError::UnknownTool => {
                ObolError::ComponentFailed("the component does not know its own tool".into())
            }
        })?;

    // Check the template and add what only the host adds.
    let prepared = Prepared::new(
        template,
        &route.connection.base_url,
        &tool.effect.propagation,
        None,
        route.connection.secret.as_ref(),
    )
    .inspect_err(|error| {
        if *error == ObolError::EgressDenied {
            tracing::warn!(tool = %route.name, "refused a request outside the connection's origin");
        }
    })?;

    // Send exactly one attempt.
    let reply = match services.outbound.send(prepared).await {
        AttemptOutcome::Responded(reply) => reply,
        AttemptOutcome::NotSent => return Err(ObolError::UpstreamUnreachable),
        AttemptOutcome::SentNoReply => return Err(ObolError::UpstreamTimeout),
        AttemptOutcome::TooLarge { .. } => {
            return Err(ObolError::UpstreamResponseTooLarge {
                limit: services.outbound.max_response_bytes(),
            });
        }
    };

    // Classify from the EffectSpec, before and independently of the guest.
    let class = tool.effect.statuses.classify(reply.status);
    let status = reply.status;

    // Interpret: the guest renders the response.
    let output = services
        .runtime
        .interpret(
            &route.connector.guest,
            connector,
            route.name.upstream(),
            wit::VendorResponse {
                status: reply.status,
                headers: reply.headers,
                body: reply.body,
            },
        )
        .await
        .map_err(guest_failed)?
        .map_err(|error| match error {
            wit::InterpretError::MalformedResponse(_) => {
                // The message is derived from the vendor's response; it stays out of errors
                // and logs.
                ObolError::ComponentFailed(
                    "the component could not read the vendor's response".into(),
                )
            }
            wit::InterpretError::UnknownTool => {
                ObolError::ComponentFailed("the component does not know its own tool".into())
            }
        })?;

    let result = render_result(services, &route, class, status, output)?;
    Ok(result)
}

/// Finds the route for a name the key may call. `None` covers every reason alike.
pub fn route(catalog: &Catalog, key: &VirtualKey, name: &str) -> Option<Arc<Route>> {
    let parsed = ToolName::parse(name)?;
    let route = catalog.route(&key.workspace, parsed.as_str())?;
    key.allows(route.name.as_str()).then(|| Arc::clone(route))
}

fn guest_failed(failure: GuestFailure) -> ObolError {
    ObolError::ComponentFailed(failure.to_string())
}

/// Builds the `CallToolResult`, enforcing the output cap and the output schema.
fn render_result(
    services: &Services,
    route: &Route,
    class: StatusClass,
    status: u16,
    output: wit::ToolOutput,
) -> Result<Value, ObolError> {
    let limit = services.runtime.limits().max_output_bytes;
    let mut size = output.structured.as_ref().map_or(0, String::len);
    let mut content = Vec::with_capacity(output.content.len());
    for item in output.content {
        let rendered = match item {
            wit::Content::Text(text) => {
                size += text.len();
                json!({ "type": "text", "text": text })
            }
            wit::Content::Image(image) => {
                size += image.data.len() * 4 / 3;
                json!({ "type": "image", "mimeType": image.mime_type, "data": base64(&image.data) })
            }
        };
        if size > limit {
            return Err(ObolError::ComponentOutputTooLarge { limit });
        }
        content.push(rendered);
    }
    if size > limit {
        return Err(ObolError::ComponentOutputTooLarge { limit });
    }
    let structured = match output.structured {
        None => None,
        Some(text) => Some(serde_json::from_str::<Value>(&text).map_err(|_| {
            ObolError::ComponentFailed(
                "the component returned structured output that is not JSON".into(),
            )
        })?),
    };
    // The output schema describes a successful result; a rejected call's error body is not
    // expected to match it. A violation reveals nothing of the response.
    if class == StatusClass::Accepted
        && let Some(schema) = &route.tool().effect.output_schema
    {
        let conforms = structured
            .as_ref()
            .is_some_and(|value| schema.is_valid(value));
        if !conforms {
            tracing::warn!(tool = %route.name, "structured output violates the tool's output schema");
            return Err(ObolError::OutputSchemaViolation);
        }
    }
    let mut result = json!({
        "content": content,
        "isError": class != StatusClass::Accepted,
        "_meta": { "obol": { "outcome": class, "vendor_status": status } },
    });
    if let Some(structured) = structured {
        result["structuredContent"] = structured;
    }
    Ok(result)
}

fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let n = (u32::from(chunk[0]) << 16)
            | (u32::from(*chunk.get(1).unwrap_or(&0)) << 8)
            | u32::from(*chunk.get(2).unwrap_or(&0));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn base64_matches_rfc_4648_vectors() {
        for (input, expected) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foobar", "Zm9vYmFy"),
        ] {
            assert_eq!(super::base64(input.as_bytes()), expected);
        }
    }
}
