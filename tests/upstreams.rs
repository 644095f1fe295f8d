//! Remote MCP upstreams (`kind = "mcp"` connections) through the one lifecycle: listing and
//! calling under the prefix, ADR-0045's outcome classes, sessions that expire, tool lists that
//! change, upstreams that go down, and secrets that never show. The upstream is the
//! misbehaving mock in `support::upstream`; `everything` runs the official reference server.
//!
//! The tests run on a multi-threaded runtime: the gateway lists its upstreams before it
//! serves, while the test thread waits for it, so the mock must be served by another thread.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::idempotency::{key, receipt};
use crate::support::upstream::default_tools;
use crate::support::{GatewayConfig, GatewayProcess, McpClient, MockUpstream, MockVendor, TOKEN};

/// A secret carried in the upstream URL's query: it must never be shown anywhere.
pub const URL_SECRET: &str = "q_secret_InTheUpstreamUrlQuery";
pub const UPSTREAM_TOKEN: &str = "up_token_NeverInALogOrReceipt";

/// The `[[workspaces.connections]]` table of an MCP upstream with prefix `up`.
pub fn mcp_connection(url: &str, extra: &str) -> String {
    format!(
        "[[workspaces.connections]]\nid = \"up-main\"\nkind = \"mcp\"\nurl = \"{url}?token={URL_SECRET}\"\nprefix = \"up\"\n{extra}\n"
    )
}

/// A gateway whose workspace `acme` has the components and the upstream at `url`.
pub fn config(vendor: &MockVendor, url: &str, extra: &str) -> GatewayConfig {
    let mut config = GatewayConfig::new(&vendor.base_url());
    config.acme_connections = mcp_connection(url, extra);
    config
}

async fn start(upstream: &MockUpstream, extra: &str) -> (MockVendor, GatewayProcess) {
    let vendor = MockVendor::start().await;
    let gateway = GatewayProcess::start(&config(&vendor, &upstream.url(), extra));
    (vendor, gateway)
}

fn meta(result: &rmcp::model::CallToolResult) -> Value {
    result.meta.as_ref().unwrap().0["obol"].clone()
}

/// Everything a test can see of the gateway's output must be free of the upstream's secrets.
fn assert_no_secrets(gateway: &GatewayProcess, also: &[&str]) {
    let log = gateway.log();
    for secret in [URL_SECRET, UPSTREAM_TOKEN].iter().chain(also) {
        assert!(!log.contains(secret), "{secret} leaked into the log");
    }
}

async fn eventually<F, Fut>(what: &str, within: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + within;
    while !check().await {
        assert!(Instant::now() < deadline, "not within {within:?}: {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_tools_join_the_catalog_under_their_prefix_and_run_through_the_lifecycle() {
    let upstream = MockUpstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("upstream-token.txt");
    std::fs::write(&token_file, UPSTREAM_TOKEN).unwrap();
    let (_vendor, gateway) = start(
        &upstream,
        &format!("[workspaces.connections.secret]\nfile = {token_file:?}\nscheme = \"Bearer\""),
    )
    .await;
    let client = McpClient::connect(&gateway.url, TOKEN).await;
    let tools = client.list_tools().await;
    let names: Vec<&str> = tools.iter().map(|t| t.name.as_ref()).collect();
    for expected in [
        "up.echo",
        "up.write",
        "up.files.read",
        "stripe.create_refund",
    ] {
        assert!(
            names.contains(&expected),
            "{expected} missing from {names:?}"
        );
    }
    // Pagination was followed (3 tools a page), and every tool came through.
    assert_eq!(
        names.iter().filter(|n| n.starts_with("up.")).count(),
        default_tools().len()
    );
    // The upstream's readOnlyHint is not trusted on this connection.
    let echo = tools.iter().find(|t| t.name == "up.echo").unwrap();
    assert_eq!(
        echo.annotations.as_ref().unwrap().destructive_hint,
        Some(true)
    );
    assert!(echo.output_schema.is_some());

    // A dotted upstream name reaches the upstream unprefixed, with the credential.
    let result = client.call("up.files.read", json!({})).await.unwrap();
    assert_eq!(result.is_error, Some(false), "{result:?}");
    let calls = upstream.calls();
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].tool, "files.read");
    assert_eq!(
        calls[0].headers.get("authorization").map(String::as_str),
        Some(format!("Bearer {UPSTREAM_TOKEN}").as_str())
    );

    // Structured output that matches the declared schema is relayed.
    let result = client.call("up.echo", json!({"text": "hi"})).await.unwrap();
    assert_eq!(result.structured_content, Some(json!({"echo": "hi"})));
    let obol = meta(&result);
    assert_eq!(obol["outcome"], json!("accepted"));
    assert_eq!(obol["verification"], json!("verified"));
    let receipt = receipt(&gateway, obol["receipt_id"].as_str().unwrap()).await;
    assert_eq!(receipt["route"], json!("mcp"), "{receipt}");
    assert_eq!(receipt["connection"], json!("up-main"));
    assert_eq!(receipt["evidence"], json!("gateway_observed"));
    assert_eq!(receipt["attempt_count"], json!(1));
    assert_eq!(receipt["tool"], json!("up.echo"));
    let text = receipt.to_string();
    assert!(!text.contains(URL_SECRET) && !text.contains(UPSTREAM_TOKEN));

    // Arguments are checked against the upstream's input schema before anything is sent.
    let (_, obol) = client.call_refused("up.echo", json!({"text": 5})).await;
    assert_eq!(obol["error"], json!("invalid_arguments"));
    assert_eq!(upstream.calls_to("echo"), 1);
    assert_no_secrets(&gateway, &[]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_sends_nothing_new_and_other_arguments_conflict() {
    let upstream = MockUpstream::start().await;
    let (_vendor, gateway) = start(&upstream, "").await;
    let client = McpClient::with_key(&gateway.url, TOKEN, &key("upstream-replay")).await;
    let first = client.call("up.write", json!({"a": 1})).await.unwrap();
    let again = client.call("up.write", json!({"a": 1})).await.unwrap();
    assert_eq!(
        upstream.calls_to("write"),
        1,
        "the replay reached the upstream"
    );
    assert_eq!(meta(&again)["replayed"], json!(true));
    assert_eq!(meta(&first)["receipt_id"], meta(&again)["receipt_id"]);
    let (_, _, data) = client.call_err("up.write", json!({"a": 2})).await;
    assert_eq!(data.unwrap()["type"], json!("idempotency_conflict"));
    assert_eq!(upstream.calls_to("write"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_concurrent_identical_calls_reach_the_upstream_once() {
    let upstream = MockUpstream::start().await;
    upstream.set_slow(Duration::from_millis(300));
    let (_vendor, gateway) = start(&upstream, "").await;
    let client =
        std::sync::Arc::new(McpClient::with_key(&gateway.url, TOKEN, &key("upstream-fifty")).await);
    let calls = (0..50).map(|_| {
        let client = std::sync::Arc::clone(&client);
        tokio::spawn(async move { client.call("up.slow", json!({"n": 1})).await })
    });
    let answers = futures_util::future::join_all(calls).await;
    let succeeded = answers
        .iter()
        .filter(|a| matches!(a.as_ref().unwrap(), Ok(r) if r.is_error == Some(false)))
        .count();
    assert!(succeeded >= 1, "one call ran");
    assert_eq!(
        upstream.calls_to("slow"),
        1,
        "50 identical calls, one upstream request"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_kind_of_answer_gets_the_outcome_adr_0045_gives_it() {
    let upstream = MockUpstream::start().await;
    let (_vendor, gateway) = start(
        &upstream,
        "[workspaces.connections.tools.\"fails\"]\nrejected_on_error = false\n[workspaces.connections.tools.\"write\"]\nrejected_on_error = true",
    )
    .await;
    let client = McpClient::connect(&gateway.url, TOKEN).await;
    let outcome = |result: &rmcp::model::CallToolResult| meta(result)["outcome"].clone();

    // isError: true may have acted, unless the operator says this tool's errors are refusals.
    let fails = client.call("up.fails", json!({})).await.unwrap();
    assert_eq!(fails.is_error, Some(true));
    assert_eq!(outcome(&fails), json!("unknown"));
    // JSON-RPC invalid params: refused before execution; the upstream's message is relayed.
    let invalid = client.call("up.invalid", json!({})).await.unwrap();
    assert_eq!(invalid.is_error, Some(true));
    assert_eq!(outcome(&invalid), json!("definitely_rejected"));
    let text = invalid.content[0].as_text().unwrap().text.clone();
    assert!(text.contains("bad arguments for invalid"), "{text}");
    // HTTP 503 is retryable, but with propagation `unsupported` the gateway does not resend.
    let busy = client.call("up.busy", json!({})).await.unwrap();
    assert_eq!(busy.is_error, Some(true));
    assert_eq!(outcome(&busy), json!("unknown"));
    assert_eq!(meta(&busy)["vendor_status"], json!(503));
    assert_eq!(meta(&busy)["attempt_count"], json!(1));

    // Off-schema structured output never reaches the agent, the error, the receipt or the log.
    let (_, message, data) = client.call_err("up.off_schema", json!({})).await;
    let data = data.unwrap();
    assert_eq!(data["type"], json!("output_schema_violation"), "{message}");
    let schema_receipt = receipt(&gateway, data["receipt_id"].as_str().unwrap()).await;
    assert_eq!(schema_receipt["verification"], json!("inconclusive"));
    for shown in [
        message,
        data.to_string(),
        schema_receipt.to_string(),
        gateway.log(),
    ] {
        assert!(
            !shown.contains("secret-derived"),
            "response-derived text leaked: {shown}"
        );
    }

    // 2 MiB against a 1 MiB cap: refused, and unknown (the upstream may have acted).
    let (_, _, data) = client.call_err("up.huge", json!({})).await;
    let data = data.unwrap();
    assert_eq!(data["type"], json!("upstream_response_too_large"), "{data}");
    let huge = receipt(&gateway, data["receipt_id"].as_str().unwrap()).await;
    assert_eq!(huge["outcome"], json!("unknown"));
    assert_eq!(huge["attempt_count"], json!(1));
    for tool in ["fails", "invalid", "busy", "off_schema", "huge"] {
        assert_eq!(upstream.calls_to(tool), 1, "{tool} was sent more than once");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_answer_is_unknown_with_one_attempt() {
    let upstream = MockUpstream::start().await;
    upstream.set_slow(Duration::from_secs(5));
    let (_vendor, gateway) = start(&upstream, "").await;
    let client = McpClient::connect(&gateway.url, TOKEN).await;
    // The connection dropped after the call arrived; then a call that outlives the deadline.
    for tool in ["up.drop", "up.slow"] {
        let (_, message, data) = client.call_err(tool, json!({})).await;
        let data = data.unwrap();
        assert_eq!(data["type"], json!("upstream_timeout"), "{tool}: {message}");
        let receipt = receipt(&gateway, data["receipt_id"].as_str().unwrap()).await;
        assert_eq!(receipt["outcome"], json!("unknown"), "{tool}");
        assert_eq!(receipt["attempt_count"], json!(1), "{tool}");
    }
    assert_eq!(upstream.calls_to("drop"), 1);
    assert_eq!(upstream.calls_to("slow"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_session_is_replaced_and_the_call_sent_once_under_one_attempt() {
    let upstream = MockUpstream::start().await;
    let (_vendor, gateway) = start(&upstream, "").await;
    let client = McpClient::connect(&gateway.url, TOKEN).await;
    client.call("up.echo", json!({"text": "a"})).await.unwrap();
    let sessions = upstream.sessions_opened();
    upstream.expire_sessions();
    let result = client.call("up.write", json!({})).await.unwrap();
    assert_eq!(result.is_error, Some(false), "{result:?}");
    assert_eq!(
        upstream.sessions_opened(),
        sessions + 1,
        "a new session was opened"
    );
    // The refused request never ran; the one on the new session did, once.
    assert_eq!(upstream.calls_to("write"), 1);
    assert_eq!(meta(&result)["attempt_count"], json!(1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_tool_list_reaches_the_sessions_and_colliding_names_are_left_out() {
    use futures_util::StreamExt;
    let upstream = MockUpstream::start().await;
    let (_vendor, gateway) = start(&upstream, "").await;
    let raw = crate::support::RawMcp::new(&gateway.url);
    let (session, _) = raw.initialize(TOKEN, "2025-11-25").await;
    let stream = raw
        .http
        .get(&raw.url)
        .header("authorization", format!("Bearer {TOKEN}"))
        .header("mcp-session-id", &session)
        .header("accept", "text/event-stream")
        .send()
        .await
        .unwrap();
    assert_eq!(stream.status(), 200);
    let mut events = stream.bytes_stream();
    let mut tools = default_tools();
    tools.push(json!({"name": "added", "inputSchema": {"type": "object"}}));
    tools.push(json!({"name": "twin", "inputSchema": {"type": "object"}}));
    tools.push(
        json!({"name": "twin", "description": "the other", "inputSchema": {"type": "object"}}),
    );
    upstream.set_tools(tools);
    // Well inside the 45-second cache: only the upstream's notification can explain it.
    let mut received = String::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !received.contains("notifications/tools/list_changed") {
        let chunk = tokio::time::timeout_at(deadline, events.next())
            .await
            .expect("no tools/list_changed within 10 s")
            .unwrap()
            .unwrap();
        received.push_str(&String::from_utf8_lossy(&chunk));
    }
    let client = McpClient::connect(&gateway.url, TOKEN).await;
    let names = client.tool_names().await;
    assert!(names.contains(&"up.added".to_owned()), "{names:?}");
    assert!(!names.iter().any(|n| n == "up.twin"), "{names:?}");
    let (code, _, _) = client.call_err("up.twin", json!({})).await;
    assert_eq!(code, -32602);
    assert!(gateway.log().contains("listed more than once"));
    assert_eq!(upstream.calls_to("twin"), 0);
}

/// A rotated credential is read on the next call and gets a session of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotated_credential_opens_a_new_session() {
    let upstream = MockUpstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("upstream-token.txt");
    std::fs::write(&token_file, "first_token").unwrap();
    let (_vendor, gateway) = start(
        &upstream,
        &format!("[workspaces.connections.secret]\nfile = {token_file:?}\nscheme = \"Bearer\""),
    )
    .await;
    let client = McpClient::connect(&gateway.url, TOKEN).await;
    client.call("up.write", json!({"n": 1})).await.unwrap();
    let opened = upstream.sessions_opened();
    std::fs::write(&token_file, "second_token").unwrap();
    client.call("up.write", json!({"n": 2})).await.unwrap();
    let calls = upstream.calls();
    let auth = |i: usize| calls[i].headers.get("authorization").cloned();
    assert_eq!(auth(0).as_deref(), Some("Bearer first_token"));
    assert_eq!(auth(1).as_deref(), Some("Bearer second_token"));
    assert_eq!(upstream.sessions_opened(), opened + 1);
    let log = gateway.log();
    assert!(!log.contains("first_token") && !log.contains("second_token"));
}

/// Cedar sees `route = "mcp"` and the honest `propagation = "unsupported"`, so an operator can
/// deny production writes the upstream cannot deduplicate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cedar_can_deny_upstream_writes_that_cannot_be_deduplicated() {
    let upstream = MockUpstream::start().await;
    let vendor = MockVendor::start().await;
    let mut config = config(
        &vendor,
        &upstream.url(),
        "[workspaces.connections.tools.\"echo\"]\ndestructive = false",
    );
    config.owner = Some("obo_acme_owner".into());
    config.publications = vec![(
        1,
        r#"@id("all") permit(principal, action, resource);
@id("no-blind-upstream-writes") forbid(principal, action, resource) when { resource.route == "mcp" && resource.propagation == "unsupported" && resource.destructive };"#
            .into(),
    )];
    let gateway = GatewayProcess::start(&config);
    let client = McpClient::connect(&gateway.url, TOKEN).await;
    let names = client.tool_names().await;
    assert!(names.contains(&"up.echo".to_owned()), "{names:?}");
    assert!(names.contains(&"stripe.create_refund".to_owned()));
    assert!(!names.iter().any(|n| n == "up.write"), "{names:?}");
    let (code, _, _) = client.call_err("up.write", json!({})).await;
    assert_eq!(code, -32602);
    client.call("up.echo", json!({"text": "ok"})).await.unwrap();
    assert_eq!(upstream.calls_to("write"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_down_upstream_is_skipped_until_it_answers_again() {
    let upstream = MockUpstream::start().await;
    upstream.set_down(Some(502));
    let (_vendor, gateway) = start(&upstream, "").await;
    let client = McpClient::connect(&gateway.url, TOKEN).await;
    let names = client.tool_names().await;
    assert!(names.contains(&"stripe.create_refund".to_owned()));
    assert!(!names.iter().any(|n| n.starts_with("up.")), "{names:?}");
    // Listing and calling agree: a skipped tool is unknown.
    let (code, message, _) = client.call_err("up.echo", json!({"text": "x"})).await;
    assert_eq!((code, message.as_str()), (-32602, "Unknown tool"));
    let log = gateway.log();
    assert!(
        log.contains("up-main") && log.contains("could not list"),
        "{log}"
    );
    // The probe brings it back, and the tools return.
    upstream.set_down(None);
    eventually(
        "the upstream's tools return",
        Duration::from_secs(15),
        || async { client.tool_names().await.contains(&"up.echo".to_owned()) },
    )
    .await;
    client
        .call("up.echo", json!({"text": "back"}))
        .await
        .unwrap();
    assert_no_secrets(&gateway, &[]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fail_closed_workspace_refuses_the_listing_while_an_upstream_is_down() {
    let upstream = MockUpstream::start().await;
    upstream.set_down(Some(502));
    let vendor = MockVendor::start().await;
    let mut config = config(&vendor, &upstream.url(), "");
    config.acme_settings = "upstream_failure = \"fail_closed\"".into();
    let gateway = GatewayProcess::start(&config);
    let client = McpClient::connect(&gateway.url, TOKEN).await;
    let listed = client.service().list_tools(None).await;
    let Err(rmcp::ServiceError::McpError(error)) = listed else {
        panic!("expected a refused listing, got {listed:?}");
    };
    assert_eq!(error.code.0, -32000);
    assert_eq!(error.data.unwrap()["type"], json!("upstream_unavailable"));
    assert!(error.message.contains("up-main"));
    assert!(!error.message.contains(URL_SECRET));
    upstream.set_down(None);
    eventually(
        "the listing answers again",
        Duration::from_secs(15),
        || async { client.service().list_tools(None).await.is_ok() },
    )
    .await;
}

#[test]
fn mcp_connections_that_cannot_work_are_refused_at_load() {
    let base = |extra: &str, prefix: &str| {
        let mut config = GatewayConfig::new("http://127.0.0.1:9");
        config.acme_connections = format!(
            "[[workspaces.connections]]\nid = \"up-main\"\nkind = \"mcp\"\nurl = \"http://127.0.0.1:9/mcp\"\nprefix = \"{prefix}\"\n{extra}"
        );
        config.refused()
    };
    // A prefix a component already has: both connections are named.
    let said = base("", "stripe");
    assert!(
        said.contains("stripe-main") && said.contains("up-main"),
        "{said}"
    );
    assert!(base("", "obol").contains("reserved"));
    assert!(base("", "has.dot").contains("prefix"));
    assert!(base("base_url = \"http://127.0.0.1:9\"", "up").contains("url and prefix"));
    assert!(base("protocol_version = \"1999-01-01\"", "up").contains("protocol_version"));
    let key_header = |header: &str| {
        base(
            &format!("[workspaces.connections.tools.\"write\"]\nidempotency_header = \"{header}\""),
            "up",
        )
    };
    for taken in ["mcp-session-id", "authorization", "content-type"] {
        assert!(
            key_header(taken).contains("belongs to the gateway, the transport or the credential"),
            "{taken}"
        );
    }
    let mut config = GatewayConfig::new("http://127.0.0.1:9");
    config.acme_connections = format!(
        "[[workspaces.connections]]\nid = \"up-main\"\nkind = \"mcp\"\nurl = \"http://user:{URL_SECRET}@127.0.0.1:9/mcp\"\nprefix = \"up\""
    );
    let said = config.refused();
    assert!(
        said.contains("credentials") && !said.contains(URL_SECRET),
        "{said}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_reference_server_works_through_the_gateway() {
    let everything = crate::support::everything::Everything::start();
    let vendor = MockVendor::start().await;
    let mut config = GatewayConfig::new(&vendor.base_url());
    config.acme_connections = format!(
        "[[workspaces.connections]]\nid = \"everything\"\nkind = \"mcp\"\nurl = \"{}\"\nprefix = \"everything\"\ntrusted_annotations = true\n",
        everything.url()
    );
    let gateway = GatewayProcess::start(&config);
    let client = McpClient::connect(&gateway.url, TOKEN).await;
    let tools = client.list_tools().await;
    let tool = |name: &str| {
        tools
            .iter()
            .find(|t| t.name == name)
            .unwrap_or_else(|| panic!("{name} missing"))
            .clone()
    };
    // A trusted readOnlyHint makes `echo` safe; a tool that says nothing stays destructive.
    let destructive = |name: &str| tool(name).annotations.unwrap().destructive_hint;
    assert_eq!(destructive("everything.echo"), Some(false));
    assert_eq!(
        destructive("everything.toggle-simulated-logging"),
        Some(true)
    );

    let result = client
        .call("everything.echo", json!({"message": "hello"}))
        .await
        .unwrap();
    assert_eq!(result.content[0].as_text().unwrap().text, "Echo: hello");
    let obol = meta(&result);
    assert_eq!(obol["outcome"], json!("accepted"));
    let receipt = receipt(&gateway, obol["receipt_id"].as_str().unwrap()).await;
    assert_eq!(receipt["route"], json!("mcp"));
    assert_eq!(receipt["connection"], json!("everything"));

    // Its output schema is checked, and conforming structured content is relayed verified.
    let result = client
        .call(
            "everything.get-structured-content",
            json!({"location": "Chicago"}),
        )
        .await
        .unwrap();
    assert_eq!(
        result.structured_content.as_ref().unwrap()["humidity"],
        json!(82)
    );
    assert_eq!(meta(&result)["verification"], json!("verified"));

    // The gateway offered 2026-07-28; the reference server answered an older version, and
    // the gateway says which one it speaks to it.
    let log = gateway.log();
    assert!(
        log.contains("opened an upstream MCP session") && log.contains("2025-11-25"),
        "{log}"
    );
}

/// In production an unannotated upstream tool is destructive: a glob does not show it, and a
/// call is held for the owner and sent once after approval.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_prod_an_unannotated_upstream_tool_is_hidden_from_globs_and_held_for_approval() {
    use crate::approvals::{AGENT, approve, resumer};
    use crate::support::gateway::Key;
    let upstream = MockUpstream::start().await;
    let vendor = MockVendor::start().await;
    let mut config = crate::approvals::prod_config_at(&vendor.base_url());
    config.acme_connections = mcp_connection(&upstream.url(), "");
    let prod = |token: &str, allowed: &[&str]| {
        let mut key = Key::new(token, "acme", allowed);
        key.environment = "prod".into();
        key.scopes = vec!["mcp".into(), "receipts".into(), "approvals".into()];
        key
    };
    config.keys = vec![
        prod(AGENT, &["up.*", "up.write"]),
        prod("obk_prod_glob", &["up.*"]),
    ];
    let gateway = GatewayProcess::start(&config);

    let glob = McpClient::connect(&gateway.url, "obk_prod_glob").await;
    let names = glob.tool_names().await;
    assert!(!names.iter().any(|n| n == "up.write"), "{names:?}");
    assert!(
        !names.iter().any(|n| n == "up.echo"),
        "untrusted hints prove nothing: {names:?}"
    );
    let (code, _, _) = glob.call_err("up.write", json!({})).await;
    assert_eq!(code, -32602, "listing and calling agree");

    let held_key = key("upstream-held");
    let agent = McpClient::with_key(&gateway.url, AGENT, &held_key).await;
    assert!(agent.tool_names().await.contains(&"up.write".to_owned()));
    let (code, message, data) = agent.call_err("up.write", json!({"v": 1})).await;
    assert_eq!(code, -32003, "{message}");
    let id = data.unwrap()["approval"]["approval_id"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(
        upstream.calls_to("write"),
        0,
        "nothing sent before the approval"
    );
    let token = approve(&gateway, &id).await;
    let resumed = resumer(&gateway, AGENT, &id, &token, Some(&held_key)).await;
    let done = resumed.call("up.write", json!({"v": 1})).await.unwrap();
    assert_eq!(done.is_error, Some(false), "{done:?}");
    let again = resumed.call("up.write", json!({"v": 1})).await.unwrap();
    assert_eq!(meta(&again)["replayed"], json!(true));
    assert_eq!(upstream.calls_to("write"), 1, "resumed once");
}

/// `obol upstreams` shows, before any call, what the gateway derived for each upstream tool.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn obol_upstreams_shows_the_derived_effect_spec_of_each_tool() {
    let upstream = MockUpstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("obol.toml");
    std::fs::write(
        &config,
        format!(
            "[server]\nenvironment = \"prod\"\n[[workspaces]]\nid = \"acme\"\n{}\n[[workspaces.connections]]\nid = \"gone\"\nkind = \"mcp\"\nurl = \"http://127.0.0.1:9/mcp\"\nprefix = \"gone\"\n",
            mcp_connection(
                &upstream.url(),
                "[workspaces.connections.tools.\"fails\"]\nrejected_on_error = true\n[workspaces.connections.tools.\"echo\"]\ndestructive = false"
            )
        ),
    )
    .unwrap();
    let json_config = config.clone();
    let (code, stdout, stderr) = tokio::task::spawn_blocking(move || {
        crate::support::gateway::run_obol(&["upstreams", "--config", config.to_str().unwrap()])
    })
    .await
    .unwrap();
    // The same findings as JSON, for scripts.
    let (json_code, json_out, _) = tokio::task::spawn_blocking(move || {
        crate::support::gateway::run_obol(&[
            "upstreams",
            "--json",
            "--config",
            json_config.to_str().unwrap(),
        ])
    })
    .await
    .unwrap();
    assert_eq!(json_code, 1);
    let found: Value = serde_json::from_str(&json_out).unwrap();
    let up = found
        .as_array()
        .unwrap()
        .iter()
        .find(|u| u["connection"] == "up-main")
        .unwrap();
    assert_eq!(up["protocol"], json!("2025-06-18"));
    let write = up["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "up.write")
        .unwrap();
    assert_eq!(write["destructive"], json!(true));
    assert_eq!(write["propagation"], json!("unsupported"));
    assert!(
        found
            .as_array()
            .unwrap()
            .iter()
            .any(|u| u["connection"] == "gone" && u["up"] == json!(false)),
        "{json_out}"
    );
    assert!(!json_out.contains(URL_SECRET));
    assert_eq!(code, 1, "one upstream is down: {stdout}\n{stderr}");
    assert!(
        stdout.contains("acme/up-main (prefix up, prod): protocol 2025-06-18"),
        "{stdout}"
    );
    assert!(
        stdout.contains("acme/gone (prefix gone, prod): DOWN"),
        "{stdout}"
    );
    let line = |tool: &str| {
        stdout
            .lines()
            .find(|l| l.trim_start().starts_with(&format!("{tool} ")))
            .unwrap_or_else(|| panic!("{tool} missing: {stdout}"))
            .to_owned()
    };
    assert!(line("up.write").contains("destructive: held for approval, hidden from glob keys"));
    assert!(line("up.echo").contains("read-only"));
    assert!(line("up.echo").contains("output_schema=true"));
    assert!(line("up.fails").contains("is_error=rejected"));
    assert!(line("up.write").contains("propagation=unsupported"));
    for shown in [&stdout, &stderr] {
        assert!(!shown.contains(URL_SECRET), "{shown}");
    }
}

/// Review finding: opening a session had no deadline of its own, so an upstream that accepts
/// connections but never finishes its handshake held the call (and its lease) indefinitely.
/// The open and the call share the request deadline; a handshake that misses it sent nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handshake_that_never_finishes_sends_nothing_within_the_deadline() {
    let upstream = MockUpstream::start().await;
    let (_vendor, gateway) = start(&upstream, "").await;
    let client = McpClient::connect(&gateway.url, TOKEN).await;
    client.call("up.echo", json!({"text": "a"})).await.unwrap();
    upstream.expire_sessions();
    upstream.set_slow_initialize(Duration::from_secs(30));
    let started = Instant::now();
    let (code, message, data) = client.call_err("up.write", json!({})).await;
    assert_eq!(code, -32000, "{message}");
    assert_eq!(data.unwrap()["type"], json!("upstream_unreachable"));
    // Two attempts at most (the 404, then one more), each within the 1.5 s request deadline.
    assert!(
        started.elapsed() < Duration::from_secs(6),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(upstream.calls_to("write"), 0);
}

/// An upstream the operator knows deduplicates on a header gets the call's key there, and only
/// then may a retryable answer be sent once more (under the same key, counted).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_declared_key_header_carries_the_key_and_licenses_one_retry() {
    let upstream = MockUpstream::start().await;
    let (_vendor, gateway) = start(
        &upstream,
        "[workspaces.connections.tools.\"busy\"]\nidempotency_header = \"Idempotency-Key\"\n[workspaces.connections.tools.\"write\"]\nidempotency_header = \"X-Request-Key\"",
    )
    .await;
    let k = key("upstream-keyed");
    let client = McpClient::with_key(&gateway.url, TOKEN, &k).await;
    let written = client.call("up.write", json!({"a": 1})).await.unwrap();
    assert_eq!(meta(&written)["idempotency_key"], json!(k));
    let calls = upstream.calls();
    assert_eq!(calls[0].headers.get("x-request-key"), Some(&k));

    // 503 is retryable; with the header declared the gateway resends once, with the same key.
    let other = key("upstream-keyed-busy");
    let busy_client = McpClient::with_key(&gateway.url, TOKEN, &other).await;
    let busy = busy_client.call("up.busy", json!({})).await.unwrap();
    assert_eq!(meta(&busy)["attempt_count"], json!(2), "{busy:?}");
    let sent: Vec<_> = upstream
        .calls()
        .into_iter()
        .filter(|c| c.tool == "busy")
        .map(|c| c.headers.get("idempotency-key").cloned())
        .collect();
    assert_eq!(sent, vec![Some(other.clone()), Some(other)]);
}

/// A redirect from an upstream is never followed: the foreign origin receives nothing, and the
/// call (which reached the upstream) is unknown with one attempt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redirect_to_a_foreign_origin_is_not_followed() {
    let mut tools = default_tools();
    tools.push(json!({"name": "redirect", "inputSchema": {"type": "object"}}));
    let upstream = MockUpstream::start_with(tools).await;
    let foreign = MockVendor::start().await;
    upstream.set_redirect(&format!("{}/steal", foreign.base_url()));
    let (_vendor, gateway) = start(&upstream, "").await;
    let client = McpClient::connect(&gateway.url, TOKEN).await;
    // Relayed as an error result (an HTTP status before any JSON-RPC answer) or refused as an
    // unreadable answer: either way the call is unknown.
    let receipt_id = match client.call("up.redirect", json!({})).await {
        Ok(result) => {
            assert_eq!(result.is_error, Some(true), "{result:?}");
            meta(&result)["receipt_id"].clone()
        }
        Err(rmcp::ServiceError::McpError(error)) => error.data.unwrap()["receipt_id"].clone(),
        Err(other) => panic!("{other:?}"),
    };
    let lost = receipt(&gateway, receipt_id.as_str().unwrap()).await;
    assert_eq!(lost["outcome"], json!("unknown"), "{lost}");
    assert_eq!(lost["attempt_count"], json!(1));
    assert!(foreign.seen().is_empty(), "the redirect was followed");
    assert_eq!(upstream.calls_to("redirect"), 1);
}
