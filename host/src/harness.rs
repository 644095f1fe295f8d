//! `obol harness`: the gateway's side of `obol-harness` (ADR-0056). It loads one component
//! with the loader `obol serve` uses, then runs a connector's test calls with the checks a
//! real call gets around them: the input schema before `prepare`; the output cap, JSON and the
//! output schema after `interpret`. JSON lines on stdin and stdout (`obol_harness::protocol`).

use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use axum::http::{HeaderMap, HeaderName, HeaderValue};

use obol_harness::protocol::{self, Reply, Request};

use crate::catalog::{Connector, load_connector};
use crate::config::RuntimeConfig;
use crate::outbound::component_headers;
use crate::runtime::manifest::{
    BodyRule, Broker, Manifest, Propagation, RouteKind, StatusClass, ToolSpec, classify_body,
};
use crate::runtime::{GuestFailure, Runtime, wit};

/// Serves `component` to the harness on stdin/stdout until stdin closes. Exit code 2 when
/// the component is refused (the reason is the one reply).
pub fn serve(asked: u32, cache: Option<PathBuf>, component: &Path) -> anyhow::Result<ExitCode> {
    let mut out = std::io::stdout().lock();
    let mut say = |reply: &Reply| -> std::io::Result<()> {
        let mut line = serde_json::to_string(reply).map_err(std::io::Error::other)?;
        line.push('\n');
        out.write_all(line.as_bytes())?;
        out.flush()
    };
    if asked != protocol::VERSION {
        say(&Reply::Unsupported {
            speaks: protocol::VERSION,
            asked,
        })?;
        return Ok(ExitCode::from(2));
    }
    let runtime = Runtime::new(RuntimeConfig {
        // The harness asks one thing at a time.
        max_concurrent_calls: 1,
        cache_dir: cache,
        ..RuntimeConfig::default()
    })?;
    let loaded = std::fs::read(component)
        .map_err(|e| format!("{}: {e}", component.display()))
        .and_then(|bytes| {
            load_connector(&runtime, &component.display().to_string(), &bytes)
                .map_err(|e| e.to_string())
        });
    let connector = match loaded {
        Ok(connector) => connector,
        Err(why) => {
            say(&Reply::Refused(why))?;
            return Ok(ExitCode::from(2));
        }
    };
    say(&Reply::Loaded(view(&connector)))?;
    let executor = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()?;
    for line in std::io::stdin().lock().lines() {
        let reply = match serde_json::from_str::<Request>(&line?) {
            Ok(request) => executor.block_on(answer(&runtime, &connector, request)),
            Err(e) => Reply::Misused(format!("not a harness request: {e}")),
        };
        say(&reply)?;
    }
    Ok(ExitCode::SUCCESS)
}

async fn answer(runtime: &Runtime, connector: &Connector, request: Request) -> Reply {
    let manifest = &connector.manifest;
    let name = manifest.name.as_str();
    let tool = match &request {
        Request::Prepare { tool, .. }
        | Request::Interpret { tool, .. }
        | Request::Classify { tool, .. } => tool,
    };
    let Some(spec) = manifest.tools.iter().find(|t| &t.upstream_name == tool) else {
        return Reply::Misused(format!("the manifest has no tool {tool:?}"));
    };
    match request {
        Request::Prepare {
            tool,
            arguments,
            base_url,
            settings,
        } => {
            let violations = spec.input_schema.violations(&arguments);
            if !violations.is_empty() {
                return Reply::Prepared(Err(protocol::PrepareError::InvalidArguments(format!(
                    "rejected by the input schema before the component: {}",
                    violations.join("; ")
                ))));
            }
            let facts = wit::ConnectionFacts { base_url, settings };
            match runtime
                .prepare(&connector.guest, name, &tool, arguments.to_string(), facts)
                .await
            {
                // Each harness request stands alone: a kept instance is let go.
                Ok(prepared) => {
                    Reply::Prepared(prepared.map(|(request, _)| request_view(request)).map_err(
                        |e| match e {
                            wit::PrepareError::InvalidArguments(why) => {
                                protocol::PrepareError::InvalidArguments(why)
                            }
                            wit::PrepareError::UnknownTool => protocol::PrepareError::UnknownTool,
                        },
                    ))
                }
                Err(failure) => failed(failure),
            }
        }
        Request::Interpret {
            tool,
            status,
            headers,
            body,
        } => {
            let headers = match answer_headers(headers) {
                Ok(headers) => headers,
                Err(why) => return Reply::Misused(why),
            };
            let class = classify(spec, status, &body);
            let response = wit::VendorResponse {
                status,
                headers,
                body,
            };
            match runtime
                .interpret(&connector.guest, name, &tool, response, None)
                .await
            {
                Ok(Ok(output)) => {
                    let limit = runtime.limits().max_output_bytes;
                    let refused =
                        match crate::invoke::dispatch::component::parsed_output(limit, &output) {
                            Err(error) => Some(error.to_string()),
                            Ok(structured) => spec
                                .effect
                                .output_fault(class, structured.as_ref())
                                .map(|fault| fault.to_string()),
                        };
                    match refused {
                        Some(why) => Reply::OutputRefused(why),
                        None => Reply::Interpreted(Ok(output_view(output))),
                    }
                }
                Ok(Err(error)) => Reply::Interpreted(Err(match error {
                    wit::InterpretError::MalformedResponse(why) => {
                        protocol::InterpretError::MalformedResponse(why)
                    }
                    wit::InterpretError::UnknownTool => protocol::InterpretError::UnknownTool,
                })),
                Err(failure) => failed(failure),
            }
        }
        Request::Classify { status, body, .. } => {
            Reply::Classified(class_view(classify(spec, status, &body)))
        }
    }
}

/// The gateway's classification of an answer: status classes, then body rules.
fn classify(spec: &ToolSpec, status: u16, body: &[u8]) -> StatusClass {
    let effect = &spec.effect;
    classify_body(&effect.body_rules, effect.statuses.classify(status), body)
}

fn failed(failure: GuestFailure) -> Reply {
    Reply::Failed(failure.to_string())
}

/// The manifest as the harness shows it to the author's tests.
fn view(connector: &Connector) -> protocol::Manifest {
    let Manifest {
        name,
        version,
        tools,
    } = &connector.manifest;
    protocol::Manifest {
        name: name.as_str().to_owned(),
        version: version.clone(),
        contract: connector.guest.contract.label().to_owned(),
        sha256: connector.guest.digest.clone(),
        tools: tools
            .iter()
            .map(|tool| {
                let e = &tool.effect;
                protocol::Tool {
                    upstream_name: tool.upstream_name.clone(),
                    description: tool.description.clone(),
                    input_schema: tool.input_schema.source.clone(),
                    effect: protocol::Effect {
                        route: match e.route {
                            RouteKind::Native => protocol::RouteKind::Native,
                            RouteKind::Federated => protocol::RouteKind::Federated,
                            RouteKind::Mcp => protocol::RouteKind::Mcp,
                            RouteKind::Gateway => protocol::RouteKind::Gateway,
                            RouteKind::Capability => protocol::RouteKind::Capability,
                        },
                        broker: e.broker.map(|broker| match broker {
                            Broker::Nango => protocol::Broker::Nango,
                            Broker::Composio => protocol::Broker::Composio,
                        }),
                        destructive: e.destructive,
                        read_only: e.read_only(),
                        statuses: e
                            .statuses
                            .classes()
                            .into_iter()
                            .map(|(class, ranges)| (class.to_owned(), ranges))
                            .collect(),
                        propagation: match &e.propagation {
                            Propagation::None => protocol::Propagation::None,
                            Propagation::Unsupported => protocol::Propagation::Unsupported,
                            Propagation::Header(name) => {
                                protocol::Propagation::Header(name.as_str().to_owned())
                            }
                            Propagation::BodyField(pointer) => {
                                protocol::Propagation::BodyField(pointer.as_str().to_owned())
                            }
                        },
                        output_schema: e.output_schema.as_ref().map(|s| s.source.clone()),
                        body_rules: e
                            .body_rules
                            .iter()
                            .map(
                                |BodyRule {
                                     pointer,
                                     equals,
                                     class,
                                 }| {
                                    (pointer.clone(), equals.clone(), class_view(*class))
                                },
                            )
                            .collect(),
                    },
                }
            })
            .collect(),
    }
}

fn class_view(class: StatusClass) -> protocol::StatusClass {
    match class {
        StatusClass::Accepted => protocol::StatusClass::Accepted,
        StatusClass::DefinitelyRejected => protocol::StatusClass::DefinitelyRejected,
        StatusClass::Retryable => protocol::StatusClass::Retryable,
        StatusClass::Unknown => protocol::StatusClass::Unknown,
    }
}

/// A test's or a fixture's answer headers as a call would pass them to the component: read
/// as hyper reads an HTTP/1.1 answer's (a value's surrounding spaces and tabs trimmed, a
/// name's values gathered), then the gateway's own rule on which reach it. A name or value
/// no answer could carry is the test's mistake, said as such.
fn answer_headers(headers: Vec<protocol::Header>) -> Result<Vec<wit::Header>, String> {
    // hyper's default: the vendor client refuses an answer with more.
    const MAX_HEADERS: usize = 100;
    if headers.len() > MAX_HEADERS {
        return Err(format!(
            "{} headers: the gateway's HTTP client refuses an answer with more than \
             {MAX_HEADERS}",
            headers.len()
        ));
    }
    let mut answer = HeaderMap::with_capacity(headers.len());
    for header in headers {
        let name = HeaderName::from_bytes(header.name.as_bytes())
            .map_err(|_| format!("{:?} is not an HTTP header name", header.name))?;
        let value = header.value.trim_matches([' ', '\t']);
        let value = HeaderValue::from_bytes(value.as_bytes()).map_err(|_| {
            format!(
                "the value of {:?} holds a character no HTTP header value can (a control \
                 character other than a tab): {:?}",
                header.name, header.value
            )
        })?;
        answer.append(name, value);
    }
    Ok(component_headers(&answer))
}

fn request_view(request: wit::OutboundRequest) -> protocol::OutboundRequest {
    protocol::OutboundRequest {
        method: match request.method {
            wit::Method::Get => protocol::Method::Get,
            wit::Method::Post => protocol::Method::Post,
            wit::Method::Put => protocol::Method::Put,
            wit::Method::Patch => protocol::Method::Patch,
            wit::Method::Delete => protocol::Method::Delete,
        },
        url: request.url,
        headers: request
            .headers
            .into_iter()
            .map(|h| protocol::Header {
                name: h.name,
                value: h.value,
            })
            .collect(),
        body: request.body,
    }
}

fn output_view(output: wit::ToolOutput) -> protocol::ToolOutput {
    protocol::ToolOutput {
        content: output
            .content
            .into_iter()
            .map(|item| match item {
                wit::Content::Text(text) => protocol::Content::Text(text),
                wit::Content::Image(image) => protocol::Content::Image(protocol::Image {
                    mime_type: image.mime_type,
                    data: image.data,
                }),
            })
            .collect(),
        structured: output.structured,
    }
}
