//! Progressive mode through rmcp's client: `search_tools` and `call_tool` list instead of every
//! tool, find only what the key may call, and call through the ordinary path (same slot,
//! same refusals). Each synthetic tool answers only where it is listed.

use serde_json::{Value, json};

use crate::idempotency::{key, meta, receipt};
use crate::support::gateway::Key;
use crate::support::{GatewayConfig, GatewayProcess, McpClient, MockVendor, RawMcp, TOKEN};

const PROGRESSIVE: &str = "obk_progressive";
/// A progressive key that may call only the stripe tools.
const NARROW: &str = "obk_progressive_narrow";

fn config(vendor: &MockVendor) -> GatewayConfig {
    let mut config = GatewayConfig::new(&vendor.base_url());
    config
        .keys
        .push(Key::progressive(PROGRESSIVE, "acme", &["*"]));
    config
        .keys
        .push(Key::progressive(NARROW, "acme", &["stripe.*"]));
    config
}

fn hits(result: &rmcp::model::CallToolResult) -> Vec<String> {
    result.structured_content.as_ref().unwrap()["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|hit| hit["name"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test]
async fn a_progressive_key_lists_two_tools_and_finds_and_calls_the_rest() {
    let vendor = MockVendor::start().await;
    let gateway = GatewayProcess::start(&config(&vendor));
    let client = McpClient::connect(&gateway.url, PROGRESSIVE).await;
    assert_eq!(
        client.tool_names().await,
        vec!["call_tool".to_owned(), "search_tools".to_owned()]
    );

    // A query equal to a connector prefix surfaces that connector's tools first.
    let found = client
        .call("search_tools", json!({"query": "tracker"}))
        .await
        .unwrap();
    assert_eq!(found.is_error, Some(false), "{found:?}");
    let names = hits(&found);
    assert!(names.len() >= 3, "{names:?}");
    assert!(
        names[..3].iter().all(|n| n.starts_with("tracker.")),
        "{names:?}"
    );
    // Each hit carries what a model needs to call it.
    let first = &found.structured_content.as_ref().unwrap()["tools"][0];
    assert!(first["description"].as_str().is_some_and(|d| !d.is_empty()));
    assert_eq!(first["inputSchema"]["type"], json!("object"));

    // A paraphrase sharing no word with the name.
    let found = client
        .call(
            "search_tools",
            json!({"query": "give a customer money back", "limit": 3}),
        )
        .await
        .unwrap();
    let names = hits(&found);
    assert_eq!(names[0], "stripe.create_refund", "{names:?}");
    assert!(names.len() <= 3);

    // call_tool runs the tool.
    let result = client
        .call(
            "call_tool",
            json!({"name": "stripe.charges.list", "arguments": {"limit": 2}}),
        )
        .await
        .unwrap();
    assert_eq!(result.is_error, Some(false), "{result:?}");
    assert_eq!(vendor.count("/v1/charges"), 1);
    client.close().await;
}

#[tokio::test]
async fn search_finds_only_what_the_key_may_call() {
    let vendor = MockVendor::start().await;
    let gateway = GatewayProcess::start(&config(&vendor));
    let client = McpClient::connect(&gateway.url, NARROW).await;
    for query in ["tracker", "issue", "close an issue", "echo", "refund", "*"] {
        let found = client
            .call("search_tools", json!({"query": query}))
            .await
            .unwrap();
        for name in hits(&found) {
            assert!(name.starts_with("stripe."), "{query:?} found {name}");
        }
    }
    client.close().await;
}

/// `call_tool(X)` and a direct `X` under one key are one call: one slot, one vendor request,
/// one receipt.
#[tokio::test]
async fn call_tool_and_the_direct_call_share_one_slot() {
    let vendor = MockVendor::start().await;
    let gateway = GatewayProcess::start(&config(&vendor));
    let k = key("progressive-slot");
    let client = McpClient::with_key(&gateway.url, PROGRESSIVE, &k).await;
    let arguments = json!({"charge": "ch_9", "amount": 900});
    let wrapped = client
        .call(
            "call_tool",
            json!({"name": "stripe.create_refund", "arguments": arguments}),
        )
        .await
        .unwrap();
    let direct = client
        .call("stripe.create_refund", arguments.clone())
        .await
        .unwrap();
    assert_eq!(vendor.count("/v1/refunds"), 1);
    assert_eq!(meta(&wrapped)["replayed"], json!(false));
    assert_eq!(meta(&direct)["replayed"], json!(true));
    assert_eq!(meta(&wrapped)["receipt_id"], meta(&direct)["receipt_id"]);
    assert_eq!(wrapped.content, direct.content);
    let receipt = receipt(&gateway, meta(&wrapped)["receipt_id"].as_str().unwrap()).await;
    assert_eq!(receipt["tool"], json!("stripe.create_refund"));
    assert_eq!(receipt["attempt_count"], json!(1));

    // Other arguments under the same key, through call_tool: a conflict, nothing sent.
    let (code, _, _) = client
        .call_err(
            "call_tool",
            json!({"name": "stripe.create_refund", "arguments": {"charge": "ch_9", "amount": 901}}),
        )
        .await;
    assert_eq!(code, -32019);
    assert_eq!(vendor.count("/v1/refunds"), 1);

    // Malformed call_tool arguments are a clear error.
    let (message, _) = client
        .call_refused("call_tool", json!({"arguments": {}}))
        .await;
    assert!(message.contains("call_tool: name is required"), "{message}");
    let (message, _) = client
        .call_refused(
            "call_tool",
            json!({"name": "stripe.charges.list", "extra": 1}),
        )
        .await;
    assert!(
        message.contains("unexpected property \"extra\""),
        "{message}"
    );
    client.close().await;
}

/// `search_tools` is a tool call like any other: a same-key repeat replays the first answer,
/// the key is echoed, and the owner gets a receipt.
#[tokio::test]
async fn search_tools_crosses_the_call_boundary() {
    let vendor = MockVendor::start().await;
    let gateway = GatewayProcess::start(&config(&vendor));
    let k = key("search");
    let client = McpClient::with_key(&gateway.url, PROGRESSIVE, &k).await;
    let first = client
        .call("search_tools", json!({"query": "refund"}))
        .await
        .unwrap();
    let again = client
        .call("search_tools", json!({"query": "refund"}))
        .await
        .unwrap();
    assert_eq!(meta(&first)["idempotency_key"], json!(k));
    assert_eq!(meta(&first)["replayed"], json!(false));
    assert_eq!(meta(&again)["replayed"], json!(true));
    assert_eq!(first.structured_content, again.structured_content);
    let receipt = receipt(&gateway, meta(&first)["receipt_id"].as_str().unwrap()).await;
    assert_eq!(receipt["tool"], json!("search_tools"));
    assert_eq!(receipt["connection"], json!("obol"));
    assert_eq!(receipt["route"], json!("gateway"));
    assert_eq!(receipt["outcome"], json!("accepted"));
    // Another query under the same key is another call: a conflict.
    let (code, _, _) = client
        .call_err("search_tools", json!({"query": "charges"}))
        .await;
    assert_eq!(code, -32019);
    // The same call by another key of the workspace, under the same idempotency key, is not
    // answered from the first key's view: it conflicts instead of replaying what that key
    // may see.
    let other = McpClient::with_key(&gateway.url, NARROW, &k).await;
    let (code, _, _) = other
        .call_err("search_tools", json!({"query": "refund"}))
        .await;
    assert_eq!(code, -32019);
    other.close().await;
    // Arguments the schema refuses.
    let fresh = McpClient::connect(&gateway.url, PROGRESSIVE).await;
    let (message, _) = fresh.call_refused("search_tools", json!({"q": "x"})).await;
    assert!(message.contains("query"), "{message}");
    fresh.close().await;
    client.close().await;
    assert_eq!(vendor.seen().len(), 0, "nothing reached a vendor");
}

/// The answer to a tools/call of `name` with JSON-RPC id 42, headers but `date` included.
async fn answer(
    gateway: &GatewayProcess,
    token: &str,
    name: &str,
    arguments: Value,
) -> (u16, Vec<String>, String) {
    let raw = RawMcp::new(&gateway.url);
    let (session, _) = raw.initialize(token, "2025-11-25").await;
    let r = raw
        .request(
            token,
            &session,
            42,
            "tools/call",
            json!({"name": name, "arguments": arguments}),
        )
        .await;
    let mut headers: Vec<String> = r
        .headers
        .keys()
        .map(|k| k.as_str().to_owned())
        .filter(|k| k != "date" && k != "mcp-session-id")
        .collect();
    headers.sort();
    (r.status, headers, r.body)
}

/// A hidden tool through call_tool answers exactly like an absent one, and like the direct
/// call of either; the synthetic tools are unknown where they are not listed.
#[tokio::test]
async fn a_hidden_name_answers_like_an_absent_one_and_synthetic_tools_only_where_listed() {
    let vendor = MockVendor::start().await;
    let gateway = GatewayProcess::start(&config(&vendor));
    let absent_direct = answer(&gateway, NARROW, "stripe.nope", json!({})).await;
    assert!(
        absent_direct.2.contains("Unknown tool"),
        "{absent_direct:?}"
    );
    for (token, name, arguments) in [
        (
            NARROW,
            "call_tool",
            json!({"name": "tracker.issues.get", "arguments": {"number": 1}}),
        ),
        (NARROW, "call_tool", json!({"name": "stripe.nope"})),
        (NARROW, "call_tool", json!({"name": "no-dot"})),
        (NARROW, "tracker.issues.get", json!({"number": 1})),
        // find_capability is a full-mode tool.
        (
            NARROW,
            "find_capability",
            json!({"capability": "cap.refund"}),
        ),
        // call_tool and search_tools are progressive-mode tools.
        (TOKEN, "search_tools", json!({"query": "refund"})),
        (TOKEN, "call_tool", json!({"name": "stripe.charges.list"})),
    ] {
        let got = answer(&gateway, token, name, arguments.clone()).await;
        assert_eq!(got, absent_direct, "{token} {name} {arguments}");
    }
    assert_eq!(vendor.seen().len(), 0);
}
