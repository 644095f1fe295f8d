//! Components built against `obol:connector@0.1.0` (ADR-0002: released contracts keep
//! loading). Their calls are translated at this boundary to and from the current contract's
//! types, so nothing past the runtime knows which version a component speaks. A 0.1.0 tool
//! that is federated is refused: that contract cannot name the broker whose retries the host
//! must turn off.

use super::wit as current;

wasmtime::component::bindgen!({
    path: "../../wit/since_v0.1.0",
    world: "connector",
    exports: { "prepare": async, "interpret": async },
});

use self::obol::connector::types as old;

pub fn facts(facts: &current::ConnectionFacts) -> old::ConnectionFacts {
    old::ConnectionFacts {
        base_url: facts.base_url.clone(),
        settings: facts.settings.clone(),
    }
}

pub fn response(response: &current::VendorResponse) -> old::VendorResponse {
    old::VendorResponse {
        status: response.status,
        headers: response.headers.iter().map(header_back).collect(),
        body: response.body.clone(),
    }
}

fn header_back(header: &current::Header) -> old::Header {
    old::Header {
        name: header.name.clone(),
        value: header.value.clone(),
    }
}

pub fn prepared(
    prepared: Result<old::OutboundRequest, old::PrepareError>,
) -> Result<current::OutboundRequest, current::PrepareError> {
    match prepared {
        Ok(request) => Ok(current::OutboundRequest {
            method: match request.method {
                old::Method::Get => current::Method::Get,
                old::Method::Post => current::Method::Post,
                old::Method::Put => current::Method::Put,
                old::Method::Patch => current::Method::Patch,
                old::Method::Delete => current::Method::Delete,
            },
            url: request.url,
            headers: request
                .headers
                .into_iter()
                .map(|h| current::Header {
                    name: h.name,
                    value: h.value,
                })
                .collect(),
            body: request.body,
        }),
        Err(old::PrepareError::InvalidArguments(message)) => {
            Err(current::PrepareError::InvalidArguments(message))
        }
        Err(old::PrepareError::UnknownTool) => Err(current::PrepareError::UnknownTool),
    }
}

pub fn output(
    output: Result<old::ToolOutput, old::InterpretError>,
) -> Result<current::ToolOutput, current::InterpretError> {
    match output {
        Ok(output) => Ok(current::ToolOutput {
            content: output
                .content
                .into_iter()
                .map(|item| match item {
                    old::Content::Text(text) => current::Content::Text(text),
                    old::Content::Image(image) => current::Content::Image(current::Image {
                        mime_type: image.mime_type,
                        data: image.data,
                    }),
                })
                .collect(),
            structured: output.structured,
        }),
        Err(old::InterpretError::MalformedResponse(message)) => {
            Err(current::InterpretError::MalformedResponse(message))
        }
        Err(old::InterpretError::UnknownTool) => Err(current::InterpretError::UnknownTool),
    }
}

/// The manifest in the current contract's terms, or why a 0.1.0 component cannot load.
pub fn manifest(manifest: old::Manifest) -> Result<current::Manifest, String> {
    let mut tools = Vec::with_capacity(manifest.tools.len());
    for tool in manifest.tools {
        let effect = tool.effect;
        let route = match effect.route {
            old::RouteKind::Native => current::RouteKind::Native,
            old::RouteKind::Federated => {
                return Err(format!(
                    "tool {:?} is federated under obol:connector@0.1.0, which cannot name its broker; rebuild it against 0.2.0 and declare the broker (nango or composio)",
                    tool.name.chars().take(64).collect::<String>()
                ));
            }
        };
        let ranges = |list: Vec<old::StatusRange>| {
            list.into_iter()
                .map(|r| current::StatusRange {
                    first: r.first,
                    last: r.last,
                })
                .collect()
        };
        tools.push(current::Tool {
            name: tool.name,
            description: tool.description,
            input_schema: tool.input_schema,
            effect: current::EffectSpec {
                route,
                destructive: effect.destructive,
                accepted: ranges(effect.accepted),
                definitely_rejected: ranges(effect.definitely_rejected),
                retryable: ranges(effect.retryable),
                propagation: match effect.propagation {
                    old::Propagation::None => current::Propagation::None,
                    old::Propagation::Unsupported => current::Propagation::Unsupported,
                    old::Propagation::Header(name) => current::Propagation::Header(name),
                    old::Propagation::BodyField(pointer) => {
                        current::Propagation::BodyField(pointer)
                    }
                },
                output_schema: effect.output_schema,
                body_rules: Vec::new(),
            },
        });
    }
    Ok(current::Manifest {
        name: manifest.name,
        version: manifest.version,
        tools,
    })
}
