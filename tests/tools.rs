//! Listing and calling tools through rmcp's client, against mock vendors.

use serde_json::json;

use crate::support::{GatewayConfig, GatewayProcess, McpClient, MockVendor, Reply, SECRET, TOKEN};

#[tokio::test]
async fn a_client_lists_both_connectors_and_calls_through_the_first_dot() {
    let vendor = MockVendor::start().await;
    let gateway = GatewayProcess::start(&GatewayConfig::new(&vendor.base_url()));
    let client = McpClient::connect(&gateway.url, TOKEN).await;
    assert_eq!(client.protocol_version(), "2025-11-25");

    let names = client.tool_names().await;
    for expected in [
        "stripe.create_refund",
        "stripe.charges.list",
        "tracker.issues.create",
        "tracker.issues.get",
        "tracker.issues.close",
    ] {
        assert!(
            names.contains(&expected.to_string()),
            "{expected} missing from {names:?}"
        );
    }
    let tools = client.list_tools().await;
    let refund = tools
        .iter()
        .find(|t| t.name == "stripe.create_refund")
        .unwrap();
    assert_eq!(
        refund.annotations.as_ref().unwrap().destructive_hint,
        Some(true)
    );
    // Issue 16: a tool without effect says so; a write, destructive or not, does not.
    let read_only = |name: &str| {
        let tool = tools.iter().find(|t| t.name == name).unwrap();
        tool.annotations.as_ref().unwrap().read_only_hint
    };
    assert_eq!(read_only("stripe.charges.list"), Some(true));
    assert_eq!(read_only("tracker.issues.get"), Some(true));
    assert_eq!(read_only("stripe.create_refund"), Some(false));
    assert_eq!(read_only("tracker.issues.create"), Some(false));
    let get = tools
        .iter()
        .find(|t| t.name == "tracker.issues.get")
        .unwrap();
    assert!(
        get.output_schema.is_some(),
        "issues.get declares an output schema"
    );

    // `stripe.charges.list` is connector `stripe`, upstream tool `charges.list`.
    let result = client
        .call("stripe.charges.list", json!({"limit": 2}))
        .await
        .unwrap();
    assert_eq!(result.is_error, Some(false), "{result:?}");
    let seen = vendor.seen();
    assert_eq!(seen.len(), 1, "exactly one vendor request");
    assert_eq!(
        (seen[0].method.as_str(), seen[0].path.as_str()),
        ("GET", "/v1/charges")
    );
    assert!(seen[0].query.contains("limit=2"), "{:?}", seen[0].query);
    let text = result.content[0].as_text().unwrap().text.clone();
    assert!(text.contains("ch_1"), "{text}");
    let meta = result.meta.as_ref().unwrap();
    assert_eq!(meta.0["obol"]["outcome"], json!("accepted"));
    assert_eq!(meta.0["obol"]["vendor_status"], json!(200));

    // Structured output that matches the declared schema is relayed.
    let issue = client
        .call("tracker.issues.get", json!({"number": 7}))
        .await
        .unwrap();
    assert_eq!(issue.is_error, Some(false), "{issue:?}");
    assert_eq!(
        issue.structured_content.as_ref().unwrap()["number"],
        json!(7)
    );
    assert_eq!(
        vendor.count("/repos/acme/app/issues/7"),
        1,
        "settings give owner/repo"
    );
    client.close().await;
}

#[tokio::test]
async fn unknown_malformed_and_disallowed_tools_look_the_same() {
    let vendor = MockVendor::start().await;
    let config = GatewayConfig::new(&vendor.base_url()).with_key(
        "obk_reader",
        "acme",
        &["stripe.charges.*"],
    );
    let gateway = GatewayProcess::start(&config);
    let reader = McpClient::connect(&gateway.url, "obk_reader").await;

    assert_eq!(
        reader.tool_names().await,
        vec!["stripe.charges.list".to_string()]
    );
    for name in [
        "stripe.create_refund", // exists, not allowed by the key's globs
        "stripe.nope",          // absent
        "nodot",                // malformed
        ".charges.list",        // empty connector
        "stripe.",              // empty tool
        "globex.thing",         // no such connector
    ] {
        let (code, message, data) = reader.call_err(name, json!({"charge": "ch_1"})).await;
        assert_eq!(
            (code, message.as_str(), data),
            (-32602, "Unknown tool", None),
            "{name}"
        );
    }
    assert!(vendor.seen().is_empty(), "nothing reached the vendor");

    // The allowed tool still works for the same key.
    assert!(reader.call("stripe.charges.list", json!({})).await.is_ok());
    reader.close().await;
}

#[tokio::test]
async fn the_vendor_status_is_classified_by_the_effect_spec() {
    let vendor = MockVendor::start().await;
    let gateway = GatewayProcess::start(&GatewayConfig::new(&vendor.base_url()));
    let client = McpClient::connect(&gateway.url, TOKEN).await;

    vendor.on(
        "/v1/refunds",
        Reply::json(
            400,
            json!({"error": {"type": "invalid_request_error", "message": "No such charge"}}),
        ),
    );
    let rejected = client
        .call(
            "stripe.create_refund",
            json!({"charge": "ch_missing", "amount": 100}),
        )
        .await
        .unwrap();
    assert_eq!(rejected.is_error, Some(true));
    assert_eq!(
        rejected.meta.unwrap().0["obol"]["outcome"],
        json!("definitely_rejected")
    );

    // A status no class names is unknown, never success.
    vendor.on("/v1/refunds", Reply::json(302, json!({})));
    let unknown = client
        .call(
            "stripe.create_refund",
            json!({"charge": "ch_x", "amount": 100}),
        )
        .await
        .unwrap();
    assert_eq!(unknown.is_error, Some(true));
    assert_eq!(unknown.meta.unwrap().0["obol"]["outcome"], json!("unknown"));
    client.close().await;
}

#[tokio::test]
async fn arguments_are_checked_against_the_input_schema_before_the_component() {
    let vendor = MockVendor::start().await;
    let gateway = GatewayProcess::start(&GatewayConfig::new(&vendor.base_url()));
    let client = McpClient::connect(&gateway.url, TOKEN).await;
    // Issue 16 (MCP 2025-11-25, SEP-1303): a tool execution error the model can read and
    // correct, not a JSON-RPC protocol error; the key is echoed for the retry.
    let (text, obol) = client
        .call_refused("stripe.create_refund", json!({"amount": "lots"}))
        .await;
    assert_eq!(obol["error"], json!("invalid_arguments"));
    assert!(text.contains("charge"), "{text}");
    assert!(
        obol["idempotency_key"]
            .as_str()
            .unwrap()
            .starts_with("idt_"),
        "{obol}"
    );
    assert!(vendor.seen().is_empty());
    client.close().await;
}

#[tokio::test]
async fn the_credential_reaches_only_the_vendor() {
    let vendor = MockVendor::start().await;
    let gateway = GatewayProcess::start(&GatewayConfig::new(&vendor.base_url()));
    let client = McpClient::connect(&gateway.url, TOKEN).await;

    client.call("stripe.charges.list", json!({})).await.unwrap();
    // `hostile.peek` sends the vendor everything the component can see.
    client
        .call("hostile.peek", json!({"note": "hello"}))
        .await
        .unwrap();
    let seen = vendor.seen();
    let peek = seen.iter().find(|s| s.path == "/peek").unwrap();
    assert!(
        peek.body_text().contains("hello"),
        "the peek body is what the guest saw"
    );
    assert!(
        !peek.body_text().contains(SECRET),
        "the component saw the credential"
    );
    for request in &seen {
        assert_eq!(
            request.header("authorization"),
            Some(format!("Bearer {SECRET}").as_str()),
            "the host adds the credential on the outbound hop"
        );
    }
    let log = gateway.log();
    assert!(!log.contains(SECRET), "the credential reached the log");
    assert!(!log.contains(TOKEN), "the key's token reached the log");
    client.close().await;
}

/// A vendor on HTTPS whose certificate a private authority issued: the gateway trusts the
/// roots the system's store holds, and `SSL_CERT_FILE` names that store (docs/operations.md).
/// Without the authority the handshake fails: nothing is sent, the caller may retry, and the
/// log says why.
#[tokio::test]
async fn an_https_vendor_is_reached_only_through_roots_the_operator_trusts() {
    let vendor = MockVendor::start_tls().await;
    let untrusting = GatewayProcess::start(&GatewayConfig::new(&vendor.base_url()));
    let client = McpClient::connect(&untrusting.url, TOKEN).await;
    let (code, _, data) = client.call_err("stripe.charges.list", json!({})).await;
    assert_eq!(code, -32000);
    assert_eq!(data.unwrap()["type"], "upstream_unreachable");
    assert!(vendor.seen().is_empty(), "the vendor got a request");
    let log = untrusting.log();
    assert!(
        log.contains("could not connect to the vendor") && log.contains("UnknownIssuer"),
        "the log does not say the certificate is not trusted: {log}"
    );
    client.close().await;

    let mut config = GatewayConfig::new(&vendor.base_url());
    let authority = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/tls/ca.pem");
    config.env.push(("SSL_CERT_FILE".into(), authority.into()));
    let trusting = GatewayProcess::start(&config);
    let client = McpClient::connect(&trusting.url, TOKEN).await;
    let result = client.call("stripe.charges.list", json!({})).await.unwrap();
    assert_ne!(result.is_error, Some(true), "{result:?}");
    let seen = vendor.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!(
        seen[0].header("authorization"),
        Some(format!("Bearer {SECRET}").as_str())
    );
    client.close().await;
}

#[tokio::test]
async fn off_schema_structured_output_is_refused_without_echoing_it() {
    let vendor = MockVendor::start().await;
    let gateway = GatewayProcess::start(&GatewayConfig::new(&vendor.base_url()));
    let client = McpClient::connect(&gateway.url, TOKEN).await;
    // `hostile.relay` passes the vendor's JSON through unchecked; only the host's check of the
    // declared output schema stands in the way.
    vendor.on(
        "/relay",
        Reply::json(200, json!({"number": "nine", "title": "CANARY-7f3a"})),
    );
    let (code, message, data) = client.call_err("hostile.relay", json!({})).await;
    assert_eq!(code, -32019);
    let data = data.unwrap();
    assert_eq!(data["type"], json!("output_schema_violation"));
    assert!(!message.contains("CANARY") && !data.to_string().contains("CANARY"));
    assert!(
        !gateway.log().contains("CANARY"),
        "the response reached the log"
    );

    // The same tool with an on-schema response is relayed.
    vendor.on(
        "/relay",
        Reply::json(200, json!({"number": 9, "title": "fine"})),
    );
    let relayed = client.call("hostile.relay", json!({})).await.unwrap();
    assert_eq!(relayed.structured_content.unwrap()["number"], json!(9));
    client.close().await;
}
