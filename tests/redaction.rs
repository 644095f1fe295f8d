//! Redaction, proven: one scenario touches every kind of call, an approval, errors and a
//! hot-load with canary secrets everywhere a secret can enter, then reads everything the
//! gateway let out (its JSON log, `/metrics`, every error body, every receipt) for them.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::admin::ADMIN;
use crate::support::gateway::Key;
use crate::support::{
    GatewayProcess, McpClient, MockUpstream, MockVendor, RawMcp, Reply, SECRET, guests, key_hash,
};

/// A virtual key's token, an argument's value and a vendor's answer: none may come back out.
const CANARY_KEY: &str = "obk_canary_KeyTokenNeverInAnyOutput";
const CANARY_ARG: &str = "canary_arg_hunter2_NeverInAnyOutput";
const CANARY_VENDOR: &str = "canary_vendor_NeverInAnyOutput";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_secret_reaches_a_log_line_a_metric_an_error_body_or_a_receipt() {
    let vendor = MockVendor::start().await;
    vendor.on(
        "/v1/refunds",
        Reply::json(
            200,
            json!({"id": "re_1", "object": "refund", "amount": 500, "charge": "ch_42", "status": "succeeded"}),
        ),
    );
    let upstream = MockUpstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("upstream-token.txt");
    std::fs::write(&token_file, crate::upstreams::UPSTREAM_TOKEN).unwrap();

    // Prod: the refund is held for the owner. A second key may call everything.
    let mut config = crate::approvals::prod_config(&vendor);
    config.acme_connections = crate::upstreams::mcp_connection(
        &upstream.url(),
        &format!("[workspaces.connections.secret]\nfile = {token_file:?}\nscheme = \"Bearer\""),
    );
    let mut canary = Key::new(CANARY_KEY, "acme", &["*"]);
    canary.environment = "prod".into();
    canary.scopes = vec!["mcp".into(), "receipts".into()];
    config.keys.push(canary);
    config.connectors_dir = true;
    config.extra = format!("\n[admin]\ntoken_hash = \"{}\"\n", key_hash(ADMIN));
    config.env.push(("OBOL_LOG_FORMAT".into(), "json".into()));
    let gateway = GatewayProcess::start_in(&config, dir);
    let mut error_bodies: Vec<String> = Vec::new();

    // A session over raw HTTP, whose id must only ever be logged by its last four characters.
    let raw = RawMcp::new(&gateway.url);
    let (session, opened) = raw.initialize(CANARY_KEY, "2025-11-25").await;
    assert_eq!(opened.status, 200, "{}", opened.body);
    let listed = raw
        .request(CANARY_KEY, &session, 2, "tools/list", json!({}))
        .await;
    assert!(
        listed.body.contains("stripe.charges.list"),
        "{}",
        listed.body
    );
    let read = raw
        .request(
            CANARY_KEY,
            &session,
            3,
            "tools/call",
            json!({"name": "stripe.charges.list", "arguments": {"limit": 2}}),
        )
        .await;
    assert!(read.body.contains("\"isError\":false"), "{}", read.body);

    // Errors with the canary in the request: invalid arguments, an unknown tool, a junk method.
    let client = McpClient::connect(&gateway.url, CANARY_KEY).await;
    for (tool, arguments) in [
        ("stripe.charges.list", json!({"limit": CANARY_ARG})),
        (
            "stripe.charges.list",
            json!({"limit": 2, "password": CANARY_ARG}),
        ),
        ("nope.tool", json!({"api_key": CANARY_ARG})),
        (CANARY_ARG, json!({})),
    ] {
        // Invalid arguments answer a tool error result, an unknown tool a protocol error.
        let answered = client.call(tool, arguments).await;
        error_bodies.push(format!("{answered:?}"));
    }
    let junk = raw
        .request(
            CANARY_KEY,
            &session,
            4,
            CANARY_ARG,
            json!({"secret": CANARY_ARG}),
        )
        .await;
    error_bodies.push(junk.body);

    // A vendor whose answer carries a canary (an error the host classifies).
    vendor.on(
        "/v1/charges",
        Reply::json(500, json!({"error": {"message": CANARY_VENDOR}})),
    );
    let failed = client
        .call("stripe.charges.list", json!({"limit": 3}))
        .await
        .unwrap();
    assert_eq!(failed.is_error, Some(true));

    // An MCP upstream call (held in prod: the upstream's hints are not trusted).
    let (_, message, data) = client
        .call_err("up.echo", json!({"text": CANARY_ARG}))
        .await;
    error_bodies.push(format!("{message} {data:?}"));

    // A held write, approved by the owner, resumed with the approval token.
    let k = crate::idempotency::key("canary");
    let args = json!({"charge": "ch_42", "amount": 500});
    let held = crate::approvals::held(&gateway, &k, args.clone()).await;
    error_bodies.push(held.to_string());
    let id = held["approval"]["approval_id"].as_str().unwrap().to_owned();
    let approval_token = crate::approvals::approve(&gateway, &id).await;
    let resumed = crate::approvals::resumer(
        &gateway,
        crate::approvals::AGENT,
        &id,
        &approval_token,
        None,
    )
    .await;
    let done = resumed.call("stripe.create_refund", args).await.unwrap();
    assert_eq!(done.is_error, Some(false));

    // A hot-load, then a write whose argument is a canary (it goes to the vendor, nowhere else).
    std::fs::copy(
        guests::TRACKER,
        gateway.connectors_dir().join("tracker.wasm"),
    )
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !client
        .tool_names()
        .await
        .iter()
        .any(|t| t == "tracker.issues.create")
    {
        assert!(Instant::now() < deadline, "{}", gateway.log());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let created = client
        .call("tracker.issues.create", json!({"title": CANARY_ARG}))
        .await;
    error_bodies
        .push(format!("{created:?}").replace(CANARY_ARG, "(the title, echoed by the vendor)"));
    assert!(
        vendor
            .seen()
            .iter()
            .any(|seen| seen.body_text().contains(CANARY_ARG)),
        "the argument reached the vendor"
    );
    client.close().await;

    // Everything the gateway let out.
    let metrics = crate::admin::metrics(&gateway).await;
    assert!(metrics.contains("obol_tool_calls_total"), "{metrics}");
    assert!(
        metrics.contains(r#"obol_approvals_total{state="approved"} 1"#),
        "{metrics}"
    );
    let mut receipts = Vec::new();
    for token in [CANARY_KEY, crate::approvals::AGENT] {
        let listed = crate::lifecycle::receipts(&gateway, token).await;
        receipts.push(serde_json::to_string(&listed).unwrap());
    }
    assert!(
        receipts.concat().contains("tracker.issues.create"),
        "{receipts:?}"
    );
    let log = gateway.log();
    for line in log.lines().filter(|line| !line.trim().is_empty()) {
        let event: Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("not a JSON log line ({e}): {line}"));
        assert!(
            event["level"].is_string() && event["fields"].is_object(),
            "{line}"
        );
    }

    let canaries = [
        SECRET,
        CANARY_KEY,
        CANARY_ARG,
        CANARY_VENDOR,
        crate::approvals::AGENT,
        crate::approvals::OWNER,
        ADMIN,
        crate::upstreams::URL_SECRET,
        crate::upstreams::UPSTREAM_TOKEN,
        approval_token.as_str(),
        session.as_str(),
    ];
    let outputs = [
        ("the log", log.clone()),
        ("/metrics", metrics),
        ("an error body", error_bodies.join("\n")),
        ("a receipt", receipts.join("\n")),
    ];
    for (place, text) in &outputs {
        for canary in canaries {
            assert!(!text.contains(canary), "{canary} reached {place}:\n{text}");
        }
    }
    // The session is known to the log by its last four characters only.
    let tail = &session[session.len() - 4..];
    assert!(
        log.contains(&format!("…{tail}")),
        "the session was never logged"
    );
}
