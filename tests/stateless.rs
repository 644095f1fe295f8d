//! MCP 2026-07-28 beside the handshake era: `server/discover`, self-contained requests with
//! no session, the revision's header checks and error codes, `resultType` and caching hints,
//! `subscriptions/listen`, and the same tool table, `Unknown tool` bytes, idempotency and
//! approvals as a session gets. Raw HTTP (so every header is the test's) and rmcp's client
//! in discover mode.

use std::time::Duration;

use futures_util::StreamExt;
use serde_json::{Value, json};

use crate::idempotency::{key, receipt};
use crate::support::{GatewayConfig, GatewayProcess, McpClient, MockVendor, Reply, TOKEN};

const V2026: &str = "2026-07-28";

/// A 2026 request's params: `_meta` as the revision requires, plus `extra`.
fn params(extra: Value) -> Value {
    let mut params = json!({"_meta": {
        "io.modelcontextprotocol/protocolVersion": V2026,
        "io.modelcontextprotocol/clientCapabilities": {},
        "io.modelcontextprotocol/clientInfo": {"name": "test", "version": "0"},
    }});
    if let Value::Object(extra) = extra {
        params.as_object_mut().unwrap().extend(extra);
    }
    params
}

struct Answer {
    status: u16,
    headers: reqwest::header::HeaderMap,
    body: Value,
    text: String,
}

/// POSTs one 2026 request with the revision's headers (`Mcp-Name` from the params' name),
/// then `overrides` (a header set to `None` is removed).
async fn post(
    gateway: &GatewayProcess,
    token: &str,
    method: &str,
    params: Value,
    overrides: &[(&str, Option<&str>)],
) -> Answer {
    let mut headers = vec![
        ("authorization".to_owned(), format!("Bearer {token}")),
        (
            "accept".to_owned(),
            "application/json, text/event-stream".to_owned(),
        ),
        ("content-type".to_owned(), "application/json".to_owned()),
        ("mcp-protocol-version".to_owned(), V2026.to_owned()),
        ("mcp-method".to_owned(), method.to_owned()),
    ];
    if let Some(name) = params.get("name").and_then(Value::as_str) {
        headers.push(("mcp-name".to_owned(), name.to_owned()));
    }
    for (name, value) in overrides {
        headers.retain(|(n, _)| n != name);
        if let Some(value) = value {
            headers.push(((*name).to_owned(), (*value).to_owned()));
        }
    }
    let body = json!({"jsonrpc": "2.0", "id": 7, "method": method, "params": params});
    let mut request = reqwest::Client::new()
        .post(&gateway.url)
        .body(body.to_string());
    for (name, value) in &headers {
        request = request.header(name.as_str(), value.as_str());
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let text = response.text().await.unwrap();
    let json_text = text
        .lines()
        .find_map(|line| line.strip_prefix("data: "))
        .unwrap_or(&text)
        .to_owned();
    Answer {
        status,
        headers,
        body: serde_json::from_str(&json_text).unwrap_or(Value::Null),
        text,
    }
}

#[tokio::test]
async fn discover_and_a_sessionless_call_answer_like_a_session() {
    let vendor = MockVendor::start().await;
    let gateway = GatewayProcess::start(&GatewayConfig::new(&vendor.base_url()));

    let discovered = post(&gateway, TOKEN, "server/discover", params(json!({})), &[]).await;
    assert_eq!(discovered.status, 200, "{}", discovered.text);
    let result = &discovered.body["result"];
    assert_eq!(result["supportedVersions"], json!([V2026]));
    assert_eq!(result["capabilities"]["tools"]["listChanged"], json!(true));
    assert_eq!(result["resultType"], json!("complete"));
    assert_eq!(
        result["_meta"]["io.modelcontextprotocol/serverInfo"]["name"],
        json!("obol")
    );
    assert!(result["ttlMs"].as_u64().is_some() && result["cacheScope"] == json!("public"));
    // No session is minted or needed.
    assert!(discovered.headers.get("mcp-session-id").is_none());

    let listed = post(&gateway, TOKEN, "tools/list", params(json!({})), &[]).await;
    assert_eq!(listed.status, 200, "{}", listed.text);
    let result = &listed.body["result"];
    assert_eq!(result["resultType"], json!("complete"));
    assert_eq!(result["cacheScope"], json!("private"));
    assert!(result["ttlMs"].as_u64().is_some());
    let names: Vec<&str> = result["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert!(names.contains(&"stripe.charges.list"), "{names:?}");
    // The same table a session lists, in the same order.
    let session = McpClient::connect(&gateway.url, TOKEN).await;
    let mut in_session = session.tool_names().await;
    in_session.sort();
    let mut sessionless: Vec<String> = names.iter().map(|n| n.to_string()).collect();
    sessionless.sort();
    assert_eq!(sessionless, in_session);
    session.close().await;

    // A call, with its idempotency echo, receipt (naming the client's trace) and a stray
    // session id that is ignored.
    let k = key("stateless");
    let mut call = params(json!({"name": "stripe.charges.list", "arguments": {"limit": 2}}));
    call["_meta"]["traceparent"] = json!("00-0af7651916cd43dd8448eb211c80319c-00f067aa0ba902b7-01");
    let called = post(
        &gateway,
        TOKEN,
        "tools/call",
        call.clone(),
        &[
            ("idempotency-key", Some(&k)),
            ("mcp-session-id", Some("mcs_not_a_session_at_all")),
        ],
    )
    .await;
    assert_eq!(called.status, 200, "{}", called.text);
    let result = &called.body["result"];
    assert_eq!(result["resultType"], json!("complete"));
    assert_eq!(result["isError"], json!(false));
    assert_eq!(called.headers["idempotency-key"], k.as_str());
    assert_eq!(result["_meta"]["obol"]["idempotency_key"], json!(k));
    let again = post(
        &gateway,
        TOKEN,
        "tools/call",
        call,
        &[("idempotency-key", Some(&k))],
    )
    .await;
    assert_eq!(
        again.body["result"]["_meta"]["obol"]["replayed"],
        json!(true)
    );
    assert_eq!(vendor.count("/v1/charges"), 1);
    let id = result["_meta"]["obol"]["receipt_id"].as_str().unwrap();
    let stored = receipt(&gateway, id).await;
    assert_eq!(stored["attempt_count"], json!(1));
    assert_eq!(
        stored["trace_id"],
        json!("0af7651916cd43dd8448eb211c80319c")
    );
    // A malformed traceparent is ignored, not an error.
    let mut sloppy = params(json!({"name": "stripe.charges.list", "arguments": {"limit": 1}}));
    sloppy["_meta"]["traceparent"] = json!("00-not-a-trace");
    let answered = post(&gateway, TOKEN, "tools/call", sloppy, &[]).await;
    assert_eq!(
        answered.body["result"]["isError"],
        json!(false),
        "{}",
        answered.text
    );
    let id = answered.body["result"]["_meta"]["obol"]["receipt_id"]
        .as_str()
        .unwrap();
    assert!(receipt(&gateway, id).await.get("trace_id").is_none());

    // The removed methods, and unknown ones, are 404 with -32601.
    for method in ["initialize", "ping", "logging/setLevel", "no/such"] {
        let answer = post(&gateway, TOKEN, method, params(json!({})), &[]).await;
        assert_eq!(answer.status, 404, "{method}: {}", answer.text);
        assert_eq!(answer.body["error"]["code"], json!(-32601), "{method}");
        assert_eq!(answer.body["id"], json!(7), "{method}");
    }
}

#[tokio::test]
async fn the_revisions_checks_answer_with_its_codes() {
    let vendor = MockVendor::start().await;
    let gateway = GatewayProcess::start(&GatewayConfig::new(&vendor.base_url()));
    let call = || params(json!({"name": "stripe.charges.list", "arguments": {}}));

    // `_meta` missing or incomplete: -32602, 400.
    for broken in [
        json!({}),
        json!({"_meta": {"io.modelcontextprotocol/clientCapabilities": {}}}),
        json!({"_meta": {"io.modelcontextprotocol/protocolVersion": V2026}}),
    ] {
        let answer = post(&gateway, TOKEN, "server/discover", broken.clone(), &[]).await;
        assert_eq!(
            (answer.status, answer.body["error"]["code"].clone()),
            (400, json!(-32602)),
            "{broken}"
        );
        assert_eq!(answer.body["id"], json!(7));
    }
    // Headers that disagree with the body, or are missing: -32020, 400.
    for (why, overrides) in [
        ("method differs", vec![("mcp-method", Some("tools/list"))]),
        ("method missing", vec![("mcp-method", None)]),
        (
            "method in capitals",
            vec![("mcp-method", Some("TOOLS/CALL"))],
        ),
        (
            "name differs",
            vec![("mcp-name", Some("stripe.create_refund"))],
        ),
        ("name missing", vec![("mcp-name", None)]),
        (
            "version differs",
            vec![("mcp-protocol-version", Some("2025-11-25"))],
        ),
    ] {
        let answer = post(&gateway, TOKEN, "tools/call", call(), &overrides).await;
        assert_eq!(answer.status, 400, "{why}: {}", answer.text);
        assert_eq!(answer.body["error"]["code"], json!(-32020), "{why}");
    }
    assert_eq!(
        vendor.count("/v1/charges"),
        0,
        "nothing ran on a refused request"
    );
    // Whitespace around a value, a base64-encoded name and another case of the header's
    // name are the same header.
    use base64::Engine;
    let encoded = format!(
        "=?base64?{}?=",
        base64::engine::general_purpose::STANDARD.encode("stripe.charges.list")
    );
    for overrides in [
        vec![("mcp-name", Some("  stripe.charges.list  "))],
        vec![("mcp-name", Some(encoded.as_str()))],
        vec![("mcp-method", None), ("MCP-METHOD", Some("tools/call"))],
    ] {
        let answer = post(&gateway, TOKEN, "tools/call", call(), &overrides).await;
        assert_eq!(answer.status, 200, "{overrides:?}: {}", answer.text);
        assert!(answer.body["result"].is_object(), "{}", answer.text);
    }
    // An unsupported version (header and body agreeing): -32022 with what is supported.
    let mut old = call();
    old["_meta"]["io.modelcontextprotocol/protocolVersion"] = json!("2099-01-01");
    let answer = post(
        &gateway,
        TOKEN,
        "tools/call",
        old,
        &[("mcp-protocol-version", Some("2099-01-01"))],
    )
    .await;
    assert_eq!(answer.status, 400, "{}", answer.text);
    assert_eq!(answer.body["error"]["code"], json!(-32022));
    assert_eq!(
        answer.body["error"]["data"]["requested"],
        json!("2099-01-01")
    );
    assert_eq!(answer.body["error"]["data"]["supported"], json!([V2026]));
    // A header of 2026 with a body of another version: a mismatch first.
    let mut other = call();
    other["_meta"]["io.modelcontextprotocol/protocolVersion"] = json!("2099-01-01");
    let answer = post(&gateway, TOKEN, "tools/call", other, &[]).await;
    assert_eq!(
        answer.body["error"]["code"],
        json!(-32020),
        "{}",
        answer.text
    );

    // A supplied key comes back on a refusal; a malformed one is refused as JSON.
    let k = key("refused");
    let answer = post(
        &gateway,
        TOKEN,
        "tools/call",
        call(),
        &[("mcp-name", None), ("idempotency-key", Some(&k))],
    )
    .await;
    assert_eq!(answer.headers["idempotency-key"], k.as_str());
    let answer = post(
        &gateway,
        TOKEN,
        "tools/call",
        call(),
        &[("idempotency-key", Some("nope"))],
    )
    .await;
    assert_eq!(answer.status, 400, "{}", answer.text);
    assert_eq!(answer.headers["content-type"], "application/json");
    assert_eq!(
        answer.body["error"]["data"]["type"],
        json!("invalid_idempotency_key")
    );
    // prompts/get names nothing Obol serves; a listen id is bounded.
    let answer = post(
        &gateway,
        TOKEN,
        "prompts/get",
        params(json!({"name": "p"})),
        &[],
    )
    .await;
    assert_eq!(
        (answer.status, answer.body["error"]["code"].clone()),
        (400, json!(-32602))
    );
    let mut listen = reqwest::Client::new()
        .post(&gateway.url)
        .header("authorization", format!("Bearer {TOKEN}"))
        .header("accept", "application/json, text/event-stream")
        .header("content-type", "application/json")
        .header("mcp-protocol-version", V2026)
        .header("mcp-method", "subscriptions/listen");
    let long_id = "x".repeat(300);
    listen = listen.body(
        json!({"jsonrpc": "2.0", "id": long_id, "method": "subscriptions/listen", "params": params(json!({}))})
            .to_string(),
    );
    assert_eq!(listen.send().await.unwrap().status(), 400);
    // GET at 2026: 405, but only for a caller that passed origin and key.
    let get = |token: Option<&str>| {
        let mut request = reqwest::Client::new()
            .get(&gateway.url)
            .header("mcp-protocol-version", V2026);
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        request.send()
    };
    assert_eq!(get(None).await.unwrap().status(), 401);
    assert_eq!(get(Some(TOKEN)).await.unwrap().status(), 405);

    // Handshake-era requests keep their answers: an unknown version header without a 2026
    // body is still -32007 (400), and `initialize` never answers 2026-07-28.
    let raw = crate::support::RawMcp::new(&gateway.url);
    let (_, initialized) = raw.initialize(TOKEN, V2026).await;
    assert_eq!(
        initialized.message()["result"]["protocolVersion"],
        json!("2025-11-25")
    );
}

/// Every cause of `Unknown tool` answers the same bytes over 2026 as over a session; the
/// revision gives -32602 its status, 400.
#[tokio::test]
async fn unknown_tool_is_the_same_bytes_without_a_session() {
    let vendor = MockVendor::start().await;
    let mut config = GatewayConfig::new(&vendor.base_url());
    config.keys.push(crate::support::gateway::Key::new(
        "obk_narrow",
        "acme",
        &["stripe.*"],
    ));
    let gateway = GatewayProcess::start(&config);
    let mut bodies = Vec::new();
    for name in ["no-dot", "stripe.nope", "tracker.issues.get", "nosuch.tool"] {
        let answer = post(
            &gateway,
            "obk_narrow",
            "tools/call",
            params(json!({"name": name, "arguments": {}})),
            &[],
        )
        .await;
        assert_eq!(answer.status, 400, "{name}");
        bodies.push(answer.text);
    }
    assert!(bodies.iter().all(|b| *b == bodies[0]), "{bodies:?}");
    assert!(bodies[0].contains("Unknown tool") && !bodies[0].contains("nope"));
}

/// A held destructive call without a session: -32003 with the approval, then resumed with
/// the two headers, once.
#[tokio::test]
async fn a_held_call_resumes_without_a_session() {
    let vendor = MockVendor::start().await;
    vendor.on(
        "/v1/refunds",
        Reply::json(
            200,
            json!({"id": "re_2026", "object": "refund", "amount": 500, "charge": "ch_42", "status": "succeeded"}),
        ),
    );
    let gateway = GatewayProcess::start(&crate::approvals::prod_config(&vendor));
    let agent = crate::approvals::AGENT;
    let k = key("stateless-held");
    let refund = || {
        params(
            json!({"name": "stripe.create_refund", "arguments": {"charge": "ch_42", "amount": 500}}),
        )
    };
    let held = post(
        &gateway,
        agent,
        "tools/call",
        refund(),
        &[("idempotency-key", Some(&k))],
    )
    .await;
    assert_eq!(held.body["error"]["code"], json!(-32003), "{}", held.text);
    let approval = &held.body["error"]["data"]["approval"];
    let id = approval["approval_id"].as_str().unwrap().to_owned();
    let token = crate::approvals::approve(&gateway, &id).await;
    let done = post(
        &gateway,
        agent,
        "tools/call",
        refund(),
        &[
            ("idempotency-key", Some(&k)),
            ("obol-approval-id", Some(&id)),
            ("obol-approval-token", Some(&token)),
        ],
    )
    .await;
    assert_eq!(
        done.body["result"]["isError"],
        json!(false),
        "{}",
        done.text
    );
    assert_eq!(vendor.count("/v1/refunds"), 1);
}

/// `subscriptions/listen`: acknowledged with what it honours, then `tools/list_changed`
/// tagged with the listen's id when a publication changes the key's catalog.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listen_hears_the_catalog_change() {
    let vendor = MockVendor::start().await;
    let mut config = GatewayConfig::new(&vendor.base_url());
    config.extra = format!(
        "\n[admin]\ntoken_hash = \"{}\"\n",
        crate::support::key_hash("oba_test_admin_token")
    );
    let gateway = GatewayProcess::start(&config);
    // With the admin API on, a publication can change the list at any moment: the hint is
    // bounded by the registry poll.
    let listed = post(&gateway, TOKEN, "tools/list", params(json!({})), &[]).await;
    assert_eq!(listed.body["result"]["ttlMs"], json!(2_000));
    let body = json!({"jsonrpc": "2.0", "id": "listen-1", "method": "subscriptions/listen",
        "params": params(json!({"notifications": {"toolsListChanged": true}}))});
    let response = reqwest::Client::new()
        .post(&gateway.url)
        .header("authorization", format!("Bearer {TOKEN}"))
        .header("accept", "application/json, text/event-stream")
        .header("content-type", "application/json")
        .header("mcp-protocol-version", V2026)
        .header("mcp-method", "subscriptions/listen")
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["content-type"], "text/event-stream");
    let mut stream = response.bytes_stream();
    let mut seen = String::new();
    let ack = next_event(&mut stream, &mut seen).await;
    assert_eq!(
        ack["method"],
        json!("notifications/subscriptions/acknowledged")
    );
    assert_eq!(
        ack["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"],
        json!("listen-1")
    );
    assert_eq!(
        ack["params"]["notifications"],
        json!({"toolsListChanged": true})
    );

    // A publication changes what the key may call.
    let url = gateway
        .url
        .replace("/mcp", "/v1/admin/workspaces/acme/publications");
    let published = reqwest::Client::new()
        .post(url)
        .bearer_auth("oba_test_admin_token")
        .body(r#"@id("only-reads") permit(principal, action, resource) when { !resource.destructive };"#)
        .send()
        .await
        .unwrap();
    assert_eq!(published.status(), 201);
    let changed = next_event(&mut stream, &mut seen).await;
    assert_eq!(changed["method"], json!("notifications/tools/list_changed"));
    assert_eq!(
        changed["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"],
        json!("listen-1")
    );
}

/// rmcp's client in discover mode (2026-07-28) and in the handshake (2025-11-25) lists the
/// same tools and calls them.
#[tokio::test]
async fn rmcp_speaks_both_eras() {
    let vendor = MockVendor::start().await;
    let gateway = GatewayProcess::start(&GatewayConfig::new(&vendor.base_url()));
    let modern = McpClient::connect_discover(&gateway.url, TOKEN).await;
    assert_eq!(modern.protocol_version(), V2026);
    let legacy = McpClient::connect(&gateway.url, TOKEN).await;
    assert_eq!(legacy.protocol_version(), "2025-11-25");
    assert_eq!(modern.tool_names().await, legacy.tool_names().await);
    for client in [&modern, &legacy] {
        let result = client
            .call("stripe.charges.list", json!({"limit": 1}))
            .await
            .unwrap();
        assert_eq!(result.is_error, Some(false), "{result:?}");
    }
    assert_eq!(vendor.count("/v1/charges"), 2);
    modern.close().await;
    legacy.close().await;
}

/// The next SSE event's JSON from a stream, waiting at most 10 s.
async fn next_event(
    stream: &mut (impl futures_util::Stream<Item = reqwest::Result<axum::body::Bytes>> + Unpin),
    seen: &mut String,
) -> Value {
    loop {
        if let Some(at) = seen.find("\n\n") {
            let event = seen[..at].to_owned();
            seen.drain(..at + 2);
            if let Some(data) = event.lines().find_map(|l| l.strip_prefix("data: ")) {
                return serde_json::from_str(data).unwrap();
            }
            continue;
        }
        let chunk = tokio::time::timeout(Duration::from_secs(10), stream.next())
            .await
            .expect("an event within 10 s")
            .unwrap()
            .unwrap();
        seen.push_str(&String::from_utf8_lossy(&chunk));
    }
}
