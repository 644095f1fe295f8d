//! The bridge from the generated `Guest` trait to [`Connector`]: every conversion between
//! the author's types and the contract's types lives here, including the JSON text.

use std::marker::PhantomData;

use crate::bindings::obol::connector::types as wit;
use crate::bindings::{self, Guest};
use crate::{
    Arguments, Broker, ConnectionFacts, Connector, Content, EffectSpec, InterpretError, Manifest,
    Method, OutboundRequest, Outcome, PrepareError, Propagation, Route, Status, Tool, ToolOutput,
    VendorResponse,
};

/// Implements the generated `Guest` for any [`Connector`]; [`export!`](crate::export) exports
/// `Adapter<YourType>`. Generic, so the conversions are written once, here, not in a macro.
pub struct Adapter<T>(PhantomData<T>);

impl<T: Connector> Guest for Adapter<T> {
    fn manifest() -> bindings::Manifest {
        T::manifest().into()
    }

    fn prepare(
        tool: String,
        arguments: String,
        connection: bindings::ConnectionFacts,
    ) -> Result<bindings::OutboundRequest, bindings::PrepareError> {
        let connection = ConnectionFacts {
            base_url: connection.base_url,
            settings: connection.settings,
        };
        Arguments::from_json_text(arguments)
            .and_then(|arguments| T::prepare(&tool, arguments, connection))
            .map(Into::into)
            .map_err(Into::into)
    }

    fn interpret(
        tool: String,
        response: bindings::VendorResponse,
    ) -> Result<bindings::ToolOutput, bindings::InterpretError> {
        let response = VendorResponse {
            status: response.status,
            headers: response
                .headers
                .into_iter()
                .map(|header| (header.name, header.value))
                .collect(),
            body: response.body,
        };
        T::interpret(&tool, response)
            .map(Into::into)
            .map_err(Into::into)
    }
}

impl From<Manifest> for wit::Manifest {
    fn from(manifest: Manifest) -> Self {
        wit::Manifest {
            name: manifest.name,
            version: manifest.version,
            tools: manifest.tools.into_iter().map(Into::into).collect(),
        }
    }
}

impl From<Tool> for wit::Tool {
    fn from(tool: Tool) -> Self {
        // The contract keeps the output schema inside the effect; authors set it on the tool,
        // next to the input schema, where it is easier to find.
        let output_schema = tool.output_schema.map(|schema| schema.to_string());
        wit::Tool {
            name: tool.name,
            description: tool.description,
            input_schema: tool.input_schema.to_string(),
            effect: effect_spec(tool.effect, output_schema),
        }
    }
}

fn effect_spec(effect: EffectSpec, output_schema: Option<String>) -> wit::EffectSpec {
    let ranges = |statuses: Vec<Status>| {
        statuses
            .into_iter()
            .map(|status| wit::StatusRange {
                first: status.first(),
                last: status.last(),
            })
            .collect()
    };
    wit::EffectSpec {
        route: match effect.route {
            Route::Native => wit::RouteKind::Native,
            Route::Federated(Broker::Nango) => wit::RouteKind::Federated(wit::BrokerKind::Nango),
            Route::Federated(Broker::Composio) => {
                wit::RouteKind::Federated(wit::BrokerKind::Composio)
            }
        },
        destructive: effect.destructive,
        accepted: ranges(effect.accepted),
        definitely_rejected: ranges(effect.definitely_rejected),
        retryable: ranges(effect.retryable),
        propagation: match effect.propagation {
            Propagation::None => wit::Propagation::None,
            Propagation::Unsupported => wit::Propagation::Unsupported,
            Propagation::Header(name) => wit::Propagation::Header(name.to_owned()),
            Propagation::BodyField(pointer) => wit::Propagation::BodyField(pointer.to_owned()),
        },
        output_schema,
        body_rules: effect
            .body_rules
            .into_iter()
            .map(|rule| wit::BodyRule {
                pointer: rule.pointer.to_owned(),
                equals: rule.equals.to_owned(),
                class: match rule.outcome {
                    Outcome::Accepted => wit::OutcomeClass::Accepted,
                    Outcome::DefinitelyRejected => wit::OutcomeClass::DefinitelyRejected,
                    Outcome::Retryable => wit::OutcomeClass::Retryable,
                    Outcome::Unknown => wit::OutcomeClass::Unknown,
                },
            })
            .collect(),
    }
}

impl From<OutboundRequest> for wit::OutboundRequest {
    fn from(request: OutboundRequest) -> Self {
        wit::OutboundRequest {
            method: match request.method {
                Method::Get => wit::Method::Get,
                Method::Post => wit::Method::Post,
                Method::Put => wit::Method::Put,
                Method::Patch => wit::Method::Patch,
                Method::Delete => wit::Method::Delete,
            },
            url: request.url,
            headers: request
                .headers
                .into_iter()
                .map(|(name, value)| wit::Header { name, value })
                .collect(),
            body: request.body,
        }
    }
}

impl From<PrepareError> for wit::PrepareError {
    fn from(error: PrepareError) -> Self {
        match error {
            PrepareError::InvalidArguments(message) => wit::PrepareError::InvalidArguments(message),
            PrepareError::UnknownTool => wit::PrepareError::UnknownTool,
        }
    }
}

impl From<ToolOutput> for wit::ToolOutput {
    fn from(output: ToolOutput) -> Self {
        wit::ToolOutput {
            content: output
                .content
                .into_iter()
                .map(|content| match content {
                    Content::Text(text) => wit::Content::Text(text),
                    Content::Image { mime_type, data } => {
                        wit::Content::Image(wit::Image { mime_type, data })
                    }
                })
                .collect(),
            // serde_json's own writer, not `Display`: that one feeds `fmt` a token at a time
            // through an adapter (29 k more instructions a call, docs/performance-log.md).
            structured: output.structured.map(|value| {
                serde_json::to_string(&value).expect("a JSON value always serializes")
            }),
        }
    }
}

impl From<InterpretError> for wit::InterpretError {
    fn from(error: InterpretError) -> Self {
        match error {
            InterpretError::MalformedResponse(message) => {
                wit::InterpretError::MalformedResponse(message)
            }
            InterpretError::UnknownTool => wit::InterpretError::UnknownTool,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_tool_carries_its_output_schema_inside_the_effect() {
        let tool = Tool::new(
            "create_refund",
            EffectSpec::write()
                .destructive()
                .propagation(Propagation::Header("Idempotency-Key")),
        )
        .description("Refund a charge.")
        .input_schema(json!({"type": "object"}))
        .output_schema(json!({"type": "object", "required": ["id"]}));
        let wit_tool = wit::Tool::from(tool);
        assert_eq!(wit_tool.input_schema, r#"{"type":"object"}"#);
        let effect = wit_tool.effect;
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(effect.output_schema.as_deref().unwrap())
                .unwrap(),
            json!({"type": "object", "required": ["id"]})
        );
        assert!(effect.destructive);
        assert!(matches!(effect.route, wit::RouteKind::Native));
        assert!(
            matches!(&effect.propagation, wit::Propagation::Header(h) if h == "Idempotency-Key")
        );
        assert_eq!(
            (effect.accepted[0].first, effect.accepted[0].last),
            (200, 299)
        );
    }

    #[test]
    fn structured_output_becomes_json_text() {
        let output = wit::ToolOutput::from(ToolOutput::text("t").structured(json!({"a": [1]})));
        assert_eq!(output.structured.as_deref(), Some(r#"{"a":[1]}"#));
        assert!(matches!(&output.content[0], wit::Content::Text(t) if t == "t"));
    }

    #[test]
    fn requests_keep_method_headers_and_body() {
        let request = wit::OutboundRequest::from(
            OutboundRequest::delete("http://h/x").body("text/plain", "hi"),
        );
        assert!(matches!(request.method, wit::Method::Delete));
        assert_eq!(request.headers[0].name, "Content-Type");
        assert_eq!(request.body.as_deref(), Some(&b"hi"[..]));
    }
}
