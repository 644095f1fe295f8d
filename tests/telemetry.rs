//! OpenTelemetry export (the `otlp` feature, which the tests build): a tool call's spans reach
//! an OTLP/HTTP receiver on loopback, continue the client's trace, and carry nothing secret.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::State;
use axum::routing::post;
use serde_json::{Value, json};

use crate::support::{GatewayConfig, GatewayProcess, MockVendor, RawMcp, SECRET, TOKEN};

/// An OTLP/HTTP receiver: every `POST /v1/traces` body (JSON), kept.
struct Receiver {
    url: String,
    bodies: Arc<Mutex<Vec<Value>>>,
}

impl Receiver {
    async fn start() -> Receiver {
        let bodies: Arc<Mutex<Vec<Value>>> = Arc::default();
        let app = Router::new()
            .route(
                "/v1/traces",
                post(
                    |State(bodies): State<Arc<Mutex<Vec<Value>>>>, body: axum::body::Bytes| async move {
                        let parsed = serde_json::from_slice(&body)
                            .unwrap_or_else(|e| json!({ "unparsed": e.to_string() }));
                        bodies.lock().unwrap().push(parsed);
                        ([("content-type", "application/json")], "{}")
                    },
                ),
            )
            .with_state(Arc::clone(&bodies));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        Receiver { url, bodies }
    }

    /// Every span received so far.
    fn spans(&self) -> Vec<Value> {
        let bodies = self.bodies.lock().unwrap();
        bodies
            .iter()
            .flat_map(|body| {
                body["resourceSpans"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default()
            })
            .flat_map(|resource| {
                resource["scopeSpans"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default()
            })
            .flat_map(|scope| scope["spans"].as_array().cloned().unwrap_or_default())
            .collect()
    }
}

fn attribute<'s>(span: &'s Value, key: &str) -> Option<&'s str> {
    span["attributes"]
        .as_array()?
        .iter()
        .find(|a| a["key"] == key)?["value"]["stringValue"]
        .as_str()
}

#[tokio::test]
async fn a_tool_call_is_exported_as_spans_that_continue_the_clients_trace() {
    let receiver = Receiver::start().await;
    let vendor = MockVendor::start().await;
    let mut config = GatewayConfig::new(&vendor.base_url());
    config.env.extend([
        (
            "OTEL_EXPORTER_OTLP_ENDPOINT".to_owned(),
            receiver.url.clone(),
        ),
        ("OTEL_BSP_SCHEDULE_DELAY".to_owned(), "100".to_owned()),
    ]);
    let gateway = GatewayProcess::start(&config);

    let trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let parent = "00f067aa0ba902b7";
    let raw = RawMcp::new(&gateway.url);
    let (session, _) = raw.initialize(TOKEN, "2025-11-25").await;
    let called = raw
        .request(
            TOKEN,
            &session,
            2,
            "tools/call",
            json!({
                "name": "stripe.charges.list",
                "arguments": {"limit": 2},
                "_meta": {"traceparent": format!("00-{trace}-{parent}-01")}
            }),
        )
        .await;
    assert!(called.body.contains("\"isError\":false"), "{}", called.body);

    let deadline = Instant::now() + Duration::from_secs(15);
    let call = loop {
        if let Some(call) = receiver
            .spans()
            .into_iter()
            .find(|s| s["name"] == "tools/call")
        {
            break call;
        }
        assert!(
            Instant::now() < deadline,
            "no span exported: {}",
            gateway.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    // The client's trace, under the client's span.
    assert_eq!(
        call["traceId"].as_str().map(str::to_lowercase),
        Some(trace.to_owned())
    );
    assert_eq!(
        call["parentSpanId"].as_str().map(str::to_lowercase),
        Some(parent.to_owned())
    );
    assert_eq!(attribute(&call, "tool"), Some("stripe.charges.list"));
    assert_eq!(attribute(&call, "connection"), Some("stripe-main"));
    assert_eq!(attribute(&call, "outcome"), Some("accepted"));
    // The phases are its children.
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let spans = receiver.spans();
        let phases: Vec<&str> = spans
            .iter()
            .filter(|s| s["parentSpanId"] == call["spanId"])
            .filter_map(|s| s["name"].as_str())
            .collect();
        if ["claim", "dispatch", "finalize"]
            .iter()
            .all(|phase| phases.contains(phase))
        {
            break;
        }
        assert!(Instant::now() < deadline, "phases: {phases:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let exported = serde_json::to_string(&*receiver.bodies.lock().unwrap()).unwrap();
    assert!(exported.contains("\"obol\""), "service.name: {exported}");
    for secret in [SECRET, TOKEN, session.as_str()] {
        assert!(!exported.contains(secret), "{secret} was exported");
    }
}
