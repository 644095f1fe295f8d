//! The component kind: the guest prepares a request template, the host checks it, completes
//! it and sends it, and the guest interprets the reply the host already classified.

use base64::Engine;
use serde_json::{Value, json};

use std::sync::Arc;

use crate::catalog::{Connector, Route, ServedBy, StatusClass};
use crate::config::ConnectionKind;
use crate::error::ObolError;
use crate::idempotency::IdempotencyKey;
use crate::invoke::Services;
use crate::outbound::{AttemptOutcome, Prepared, VendorReply};
use crate::runtime::{GuestFailure, Warm, wit};

use super::failpoint;

/// A checked request with the host's parts added (credential, idempotency key).
pub type Request = Prepared;

/// Lets the guest build the request template, then checks it against the connection and
/// completes it. Returns the request, its pinned facts (`METHOD ORIGIN UPSTREAM_TOOL`) and
/// the instance that prepared it when the runtime kept it for the call's `interpret`.
pub async fn prepare(
    services: &Services,
    route: &Route,
    arguments: &Value,
    idempotency_key: &IdempotencyKey,
) -> Result<(Request, String, Option<Warm>), ObolError> {
    let connector = connector(route)?;
    let ConnectionKind::Component {
        base_url,
        settings,
        broker,
        ..
    } = &route.connection.kind
    else {
        return Err(ObolError::Internal);
    };
    let facts = wit::ConnectionFacts {
        base_url: base_url.as_str().to_owned(),
        settings: settings
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
    };
    let (template, warm) = services
        .runtime
        .prepare(
            &connector.guest,
            connector.manifest.name.as_str(),
            route.name.upstream(),
            arguments.to_string(),
            facts,
        )
        .await
        .map_err(|failure| guest_failed(services, route, failure))?
        .map_err(|error| match error {
            wit::PrepareError::InvalidArguments(message) => ObolError::InvalidArguments(message),
            wit::PrepareError::UnknownTool => {
                ObolError::ComponentFailed("the component does not know its own tool".into())
            }
        })?;
    let prepared = Prepared::new(
        template,
        base_url,
        &route.tool().effect.propagation,
        Some(idempotency_key.as_str()),
        route.connection.secret.as_ref(),
        // A federated route's broker (the catalog refused any without one).
        broker
            .as_deref()
            .filter(|_| route.tool().effect.route == crate::catalog::RouteKind::Federated),
    )
    .inspect_err(|error| {
        if *error == ObolError::EgressDenied {
            tracing::warn!(tool = %route.name, "refused a request outside the connection's origin");
        }
    })?;
    let facts = [
        prepared.method().as_str(),
        &prepared.origin(),
        route.name.upstream(),
    ]
    .join(" ");
    Ok((prepared, facts, warm))
}

/// Sends one attempt through the outbound hop.
pub async fn send(services: &Services, request: &Request) -> AttemptOutcome {
    failpoint("hang-before-send").await;
    // A connection refused before anything was written, without a vendor that refuses.
    #[cfg(feature = "test-util")]
    if crate::failpoint::active("refuse-send") {
        return AttemptOutcome::NotSent;
    }
    let outcome = services.outbound.send(request.clone()).await;
    failpoint("hang-after-send").await;
    outcome
}

/// Runs `interpret` (in `warm` when `prepare` kept its instance) and checks its output. The
/// class was decided before, by the host.
pub async fn render(
    services: &Services,
    route: &Route,
    class: StatusClass,
    reply: VendorReply,
    warm: Option<Warm>,
) -> Result<super::CallResult, ObolError> {
    let connector = connector(route)?;
    let output = services
        .runtime
        .interpret(
            &connector.guest,
            connector.manifest.name.as_str(),
            route.name.upstream(),
            wit::VendorResponse {
                status: reply.status,
                headers: reply.headers,
                body: reply.body,
            },
            warm,
        )
        .await
        .map_err(|failure| guest_failed(services, route, failure))?
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
    render_output(services, route, class, output)
}

/// The component a component route runs (the seam only sends such routes here).
fn connector(route: &Route) -> Result<&Arc<Connector>, ObolError> {
    match &route.served_by {
        ServedBy::Component { connector, .. } => Ok(connector),
        ServedBy::Upstream { .. } | ServedBy::Gateway(_) | ServedBy::Capability { .. } => {
            Err(ObolError::Internal)
        }
    }
}

fn guest_failed(services: &Services, route: &Route, failure: GuestFailure) -> ObolError {
    services.metrics.guest_fault(&route.connection.id, &failure);
    match failure {
        GuestFailure::Busy(_) => ObolError::Overloaded,
        other => ObolError::ComponentFailed(other.to_string()),
    }
}

/// Builds the `CallToolResult`, enforcing the output cap and the output schema.
fn render_output(
    services: &Services,
    route: &Route,
    class: StatusClass,
    output: wit::ToolOutput,
) -> Result<super::CallResult, ObolError> {
    let structured = parsed_output(services.runtime.limits().max_output_bytes, &output)?;
    let content = output
        .content
        .into_iter()
        .map(|item| match item {
            wit::Content::Text(text) => json!({ "type": "text", "text": text }),
            wit::Content::Image(image) => {
                json!({ "type": "image", "mimeType": image.mime_type, "data": base64::engine::general_purpose::STANDARD.encode(&image.data) })
            }
        })
        .collect();
    super::tool_result(route, class, content, structured)
}

/// A component's output as the gateway takes it: within the output cap (counted as rendered,
/// images as base64) and with structured output that is JSON, which it returns parsed.
pub fn parsed_output(limit: usize, output: &wit::ToolOutput) -> Result<Option<Value>, ObolError> {
    let size = output.structured.as_ref().map_or(0, String::len)
        + output
            .content
            .iter()
            .map(|item| match item {
                wit::Content::Text(text) => text.len(),
                wit::Content::Image(image) => image.data.len() * 4 / 3,
            })
            .sum::<usize>();
    if size > limit {
        return Err(ObolError::ComponentOutputTooLarge { limit });
    }
    output
        .structured
        .as_deref()
        .map(|text| {
            serde_json::from_str::<Value>(text).map_err(|_| {
                ObolError::ComponentFailed(
                    "the component returned structured output that is not JSON".into(),
                )
            })
        })
        .transpose()
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::runtime::{Guest, Runtime, RuntimeConfig, Warm, wit};

    const CHARGES: &str = r#"{"object":"list","has_more":false,"data":[{"id":"ch_1","amount":1000,"currency":"usd","status":"succeeded"}]}"#;

    fn runtime(slots: u32, deadline: Duration) -> (Runtime, Guest) {
        let runtime = Runtime::new(RuntimeConfig {
            max_concurrent_calls: slots,
            call_deadline: deadline,
            ..Default::default()
        })
        .unwrap();
        let (guest, _) = runtime
            .load(include_bytes!(env!("OBOL_GUEST_PAYMENTS")))
            .unwrap();
        (runtime, guest)
    }

    async fn prepare(runtime: &Runtime, guest: &Guest) -> Option<Warm> {
        let facts = wit::ConnectionFacts {
            base_url: "http://127.0.0.1:4242".into(),
            settings: Vec::new(),
        };
        let (request, warm) = runtime
            .prepare(
                guest,
                "stripe",
                "charges.list",
                r#"{"limit":1}"#.into(),
                facts,
            )
            .await
            .unwrap()
            .unwrap();
        assert_eq!(request.url, "http://127.0.0.1:4242/v1/charges?limit=1");
        warm
    }

    async fn interpret(runtime: &Runtime, guest: &Guest, warm: Option<Warm>) -> wit::ToolOutput {
        let response = wit::VendorResponse {
            status: 200,
            headers: Vec::new(),
            body: CHARGES.as_bytes().to_vec(),
        };
        runtime
            .interpret(guest, "stripe", "charges.list", response, warm)
            .await
            .unwrap()
            .unwrap()
    }

    fn text(output: &wit::ToolOutput) -> &str {
        match &output.content[0] {
            wit::Content::Text(text) => text,
            wit::Content::Image(_) => panic!("an image"),
        }
    }

    /// One instantiation a call instead of two (ADR-0064), and the output is the same as a
    /// fresh instance's.
    #[tokio::test]
    async fn a_calls_interpret_runs_in_the_instance_its_prepare_ran_in() {
        let (runtime, guest) = runtime(8, Duration::from_secs(2));
        let warm = prepare(&runtime, &guest).await;
        assert!(warm.is_some(), "an idle pool keeps the prepared instance");
        let kept = interpret(&runtime, &guest, warm).await;
        assert_eq!(runtime.instances_made(), 1);
        let fresh = interpret(&runtime, &guest, None).await;
        assert_eq!(runtime.instances_made(), 2);
        assert_eq!(text(&kept), text(&fresh));
        assert!(text(&kept).starts_with("1 charge(s)"), "{}", text(&kept));
    }

    /// Kept instances wait on vendors; they never take the last quarter of the pool, so a
    /// guest call never waits for a slot behind calls that are only waiting on vendors.
    #[tokio::test]
    async fn instances_are_kept_only_while_a_quarter_of_the_pool_is_free() {
        let (runtime, guest) = runtime(4, Duration::from_secs(2));
        let mut kept = Vec::new();
        for _ in 0..3 {
            kept.push(prepare(&runtime, &guest).await.expect("kept"));
        }
        // One slot left: the next call prepares in it, and lets it go for others.
        assert!(prepare(&runtime, &guest).await.is_none());
        let started = std::time::Instant::now();
        assert!(prepare(&runtime, &guest).await.is_none());
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "waited for a slot"
        );
        let output = interpret(&runtime, &guest, None).await;
        assert!(text(&output).starts_with("1 charge(s)"));
        for warm in kept {
            interpret(&runtime, &guest, Some(warm)).await;
        }
        assert!(prepare(&runtime, &guest).await.is_some(), "slots came back");
    }

    /// The task waiting for a call's result gets it before the call's instance is reset (the
    /// reset's pagemap scan alone was 8 µs p50 of a c=1 call); the slot counts as taken until
    /// the reset ran, then is free again. On a single-threaded runtime, as a lane is.
    #[tokio::test(flavor = "current_thread")]
    async fn a_call_is_answered_before_its_instance_is_reset() {
        let (runtime, guest) = runtime(4, Duration::from_secs(2));
        let (runtime, guest) = (std::sync::Arc::new(runtime), std::sync::Arc::new(guest));
        let warm = prepare(&runtime, &guest).await;
        assert!(warm.is_some());
        assert_eq!(runtime.free_slots(), 3);
        let call = {
            let (runtime, guest) = (runtime.clone(), guest.clone());
            tokio::spawn(async move { text(&interpret(&runtime, &guest, warm).await).to_owned() })
        };
        let answer = call.await.unwrap();
        assert!(answer.starts_with("1 charge(s)"), "{answer}");
        assert_eq!(
            runtime.free_slots(),
            3,
            "the instance was reset before the call's result reached its waiter"
        );
        tokio::time::timeout(Duration::from_secs(5), async {
            while runtime.free_slots() < 4 {
                tokio::task::yield_now().await;
            }
        })
        .await
        .expect("the spent instance's slot came back");
    }

    /// A kept instance's `interpret` gets a deadline of its own: the vendor's time is not the
    /// guest's.
    #[tokio::test]
    async fn a_kept_instance_gets_a_fresh_deadline_for_its_interpret() {
        let (runtime, guest) = runtime(8, Duration::from_millis(100));
        let warm = prepare(&runtime, &guest).await;
        assert!(warm.is_some());
        // A vendor slower than the guest's deadline.
        tokio::time::sleep(Duration::from_millis(250)).await;
        let output = interpret(&runtime, &guest, warm).await;
        assert!(text(&output).starts_with("1 charge(s)"));
    }
}
