//! Who sees what: the errors before the MCP server, the prefilter rules, and existence hiding
//! (issue 4, first part: keys, environments, freeze, scopes, prefilter with CEL).

use serde_json::json;

use crate::support::client::RawResponse;
use crate::support::gateway::Key;
use crate::support::{GatewayConfig, GatewayProcess, McpClient, MockVendor, RawMcp, TOKEN};

async fn names(gateway: &GatewayProcess, token: &str) -> Vec<String> {
    McpClient::connect(&gateway.url, token)
        .await
        .tool_names()
        .await
}

fn assert_refused(r: &RawResponse, status: u16, kind: &str) {
    assert_eq!(r.status, status, "{r:?}");
    assert_eq!(r.header("content-type"), Some("text/event-stream"));
    assert_eq!(r.error_type(), kind, "{r:?}");
}

#[tokio::test]
async fn errors_before_the_mcp_server_name_their_cause() {
    let vendor = MockVendor::start().await;
    let mut config = GatewayConfig::new(&vendor.base_url());
    config.environment = Some("staging".into());
    config.connection_environment = Some("staging".into());
    config.frozen = vec!["globex".into()];
    let mut staging = Key::new("obk_staging", "acme", &["*"]);
    staging.environment = "staging".into();
    let mut no_mcp = Key::new("obk_no_mcp", "acme", &["*"]);
    no_mcp.environment = "staging".into();
    no_mcp.scopes = vec!["receipts".into()];
    let mut frozen = Key::new("obk_frozen", "globex", &["*"]);
    frozen.environment = "staging".into();
    config.keys.extend([staging, no_mcp, frozen]);
    let gateway = GatewayProcess::start(&config);
    let raw = RawMcp::new(&gateway.url);

    // TOKEN is a dev key; this deployment serves staging.
    let (_, r) = raw.initialize(TOKEN, "2025-11-25").await;
    assert_refused(&r, 403, "environment_mismatch");
    let (_, r) = raw.initialize("obk_no_mcp", "2025-11-25").await;
    assert_refused(&r, 403, "scope_denied");
    let (_, r) = raw.initialize("obk_frozen", "2025-11-25").await;
    assert_refused(&r, 403, "frozen");
    let (_, r) = raw.initialize("obk_unknown", "2025-11-25").await;
    assert_refused(&r, 401, "unauthenticated");
    let (session, r) = raw.initialize("obk_staging", "2025-11-25").await;
    assert_eq!(r.status, 200, "{r:?}");
    assert!(session.starts_with("mcs_"));

    // The receipts endpoint needs its own scope; the answer is the same envelope.
    let receipts = gateway.url.replace("/mcp", "/v1/receipts");
    let http = reqwest::Client::new();
    let denied = http
        .get(&receipts)
        .bearer_auth("obk_no_mcp")
        .send()
        .await
        .unwrap();
    assert_eq!(denied.status(), 200, "obk_no_mcp has the receipts scope");
    let wrong_env = http.get(&receipts).bearer_auth(TOKEN).send().await.unwrap();
    assert_eq!(wrong_env.status(), 403);
    let body: serde_json::Value = wrong_env.json().await.unwrap();
    assert_eq!(body["error"]["type"], json!("environment_mismatch"));
    assert!(vendor.seen().is_empty());
}

#[tokio::test]
async fn the_prefilter_hides_what_a_key_may_not_call() {
    let vendor = MockVendor::start().await;
    let mut config = GatewayConfig::new(&vendor.base_url());
    config.environment = Some("prod".into());
    let prod = |token: &str, allowed: &[&str]| {
        let mut key = Key::new(token, "acme", allowed);
        key.environment = "prod".into();
        key
    };
    let mut cel = prod("obk_cel", &["*"]);
    cel.filter = Some("!tool.destructive && tool.connector != 'hostile'".into());
    config.keys = vec![
        prod("obk_glob", &["stripe.*", "tracker.*"]),
        prod("obk_verbatim", &["stripe.*", "stripe.create_refund"]),
        cel,
    ];
    let gateway = GatewayProcess::start(&config);

    // In prod a glob never reveals a destructive tool...
    let glob = names(&gateway, "obk_glob").await;
    assert!(
        glob.contains(&"stripe.charges.list".to_string()),
        "{glob:?}"
    );
    assert!(
        !glob.contains(&"stripe.create_refund".to_string()),
        "{glob:?}"
    );
    assert!(
        !glob.contains(&"tracker.issues.close".to_string()),
        "{glob:?}"
    );
    assert!(glob.contains(&"tracker.issues.get".to_string()), "{glob:?}");
    // ...and what is not listed is not callable.
    let client = McpClient::connect(&gateway.url, "obk_glob").await;
    let (code, message, data) = client
        .call_err("stripe.create_refund", json!({"charge": "ch_1"}))
        .await;
    assert_eq!(
        (code, message.as_str(), data),
        (-32602, "Unknown tool", None)
    );

    // Naming the tool verbatim does.
    let verbatim = names(&gateway, "obk_verbatim").await;
    assert!(
        verbatim.contains(&"stripe.create_refund".to_string()),
        "{verbatim:?}"
    );

    // The operator's CEL filter narrows further.
    let cel = names(&gateway, "obk_cel").await;
    assert!(cel.iter().all(|n| !n.starts_with("hostile.")), "{cel:?}");
    assert!(cel.contains(&"tracker.issues.get".to_string()), "{cel:?}");
    assert!(
        !cel.contains(&"tracker.issues.close".to_string()),
        "{cel:?}"
    );
    assert!(vendor.seen().is_empty());
}

#[tokio::test]
async fn tools_of_another_environment_are_invisible() {
    let vendor = MockVendor::start().await;
    let mut config = GatewayConfig::new(&vendor.base_url());
    // The gateway serves dev, but these connections are staging's.
    config.connection_environment = Some("staging".into());
    let gateway = GatewayProcess::start(&config);
    assert_eq!(names(&gateway, TOKEN).await, Vec::<String>::new());
}

/// Every reason a call finds no tool answers the same bytes and the same headers; the owner's
/// receipts tell the reasons apart.
#[tokio::test]
async fn unknown_tool_is_byte_identical_whatever_the_cause() {
    let vendor = MockVendor::start().await;
    let mut config = GatewayConfig::new(&vendor.base_url());
    let mut key = Key::new("obk_narrow", "acme", &["stripe.*", "hostile.*"]);
    key.filter = Some("tool.connector != 'hostile'".into());
    config.keys.push(key);
    config.owner = Some("obo_acme_owner".into());
    config.publications = vec![(
        1,
        r#"@id("all") permit(principal, action, resource);
@id("narrow-no-refunds") forbid(principal == Obol::Key::"key-2", action == Obol::Action::"call", resource == Obol::Tool::"stripe.create_refund");"#
            .into(),
    )];
    let gateway = GatewayProcess::start(&config);
    let raw = RawMcp::new(&gateway.url);
    let (session, _) = raw.initialize("obk_narrow", "2025-11-25").await;
    let mut answers = Vec::new();
    for (cause, name) in [
        ("malformed", "no-dot-here"),
        ("absent", "stripe.no_such_tool"),
        ("not routable", "nosuch.tool"),
        ("hidden by the key's globs", "tracker.issues.get"),
        ("hidden by the key's filter", "hostile.echo"),
        ("denied by Cedar", "stripe.create_refund"),
    ] {
        let r = raw
            .request(
                "obk_narrow",
                &session,
                42,
                "tools/call",
                json!({"name": name, "arguments": {}}),
            )
            .await;
        let mut headers: Vec<String> = r
            .headers
            .keys()
            .map(|k| k.as_str().to_owned())
            .filter(|k| k != "date")
            .collect();
        headers.sort();
        answers.push((cause, r.status, headers, r.body.clone()));
    }
    let (_, status, headers, body) = answers[0].clone();
    assert!(
        body.contains("Unknown tool") && !body.contains("no-dot-here"),
        "{body}"
    );
    for (cause, s, h, b) in &answers {
        assert_eq!((*s, h, b), (status, &headers, &body), "{cause}");
    }
    assert!(vendor.seen().is_empty());

    // The owner's receipts carry the real reasons (written in the background); a key, even
    // with the receipts scope, sees none of them: they would undo the hiding.
    let url = gateway.url.replace("/mcp", "/v1/receipts");
    let mut notes = Vec::new();
    for _ in 0..50 {
        let listed: serde_json::Value = reqwest::Client::new()
            .get(&url)
            .bearer_auth("obo_acme_owner")
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        notes = listed["receipts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| {
                (
                    r["tool"].as_str().unwrap().to_owned(),
                    r["note"].as_str().unwrap_or_default().to_owned(),
                    r["matched_policies"].clone(),
                )
            })
            .collect();
        if notes.len() == answers.len() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let note = |tool: &str| {
        notes
            .iter()
            .find(|(t, _, _)| t == tool)
            .cloned()
            .unwrap_or_else(|| panic!("no receipt for {tool}: {notes:?}"))
    };
    assert!(note("no-dot-here").1.contains("malformed"));
    assert!(
        note("stripe.no_such_tool")
            .1
            .contains("no loaded connector")
    );
    assert!(note("tracker.issues.get").1.contains("allowed_tools"));
    assert!(note("hostile.echo").1.contains("CEL filter"));
    let as_key: serde_json::Value = reqwest::Client::new()
        .get(&url)
        .bearer_auth("obk_narrow")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(as_key["receipts"], json!([]), "{as_key}");
    let cedar = note("stripe.create_refund");
    assert!(cedar.1.contains("Cedar publication 1"), "{cedar:?}");
    // `all` permitted listing; the forbid decided the call.
    assert_eq!(cedar.2, json!(["all", "narrow-no-refunds"]));
}

const PUBLICATION_1: &str = r#"
permit(principal, action, resource);
"#;

/// Publication 2: destructive tools may be listed but never called (a call-only forbid), and
/// the tracker is off limits to everyone.
const PUBLICATION_2: &str = r#"
@id("allow-all")
permit(principal, action, resource);
@id("no-destructive-calls")
forbid(principal, action == Obol::Action::"call", resource) when { resource.destructive };
@id("no-tracker")
forbid(principal, action, resource) when { resource.connector == "tracker" };
"#;

fn with_publications(vendor: &MockVendor) -> GatewayConfig {
    let mut config = GatewayConfig::new(&vendor.base_url());
    config.publications = vec![(1, PUBLICATION_1.into()), (2, PUBLICATION_2.into())];
    let mut pinned = Key::new("obk_pinned", "acme", &["*"]);
    pinned.policy = Some("1".into());
    config.keys.push(pinned);
    config
}

#[tokio::test]
async fn cedar_forbids_override_permits_and_listing_matches_calling() {
    let vendor = MockVendor::start().await;
    let gateway = GatewayProcess::start(&with_publications(&vendor));

    // TOKEN evaluates the latest publication (2).
    let listed = names(&gateway, TOKEN).await;
    assert!(
        listed.contains(&"stripe.charges.list".to_string()),
        "{listed:?}"
    );
    assert!(
        !listed.contains(&"stripe.create_refund".to_string()),
        "a call-only forbid hides it: {listed:?}"
    );
    assert!(
        listed.iter().all(|n| !n.starts_with("tracker.")),
        "{listed:?}"
    );
    let client = McpClient::connect(&gateway.url, TOKEN).await;
    for hidden in ["stripe.create_refund", "tracker.issues.get"] {
        let (code, message, data) = client
            .call_err(hidden, json!({"charge": "ch_1", "number": 1}))
            .await;
        assert_eq!(
            (code, message.as_str(), data),
            (-32602, "Unknown tool", None),
            "{hidden}"
        );
    }

    // The receipt names the publication and the policies that decided.
    let result = client.call("stripe.charges.list", json!({})).await.unwrap();
    let id = result.meta.as_ref().unwrap().0["obol"]["receipt_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let receipt = crate::idempotency::receipt(&gateway, &id).await;
    assert_eq!(receipt["policy_publication"], json!(2));
    assert_eq!(
        receipt["matched_policies"],
        json!(["allow-all"]),
        "{receipt}"
    );

    // A key pinned to publication 1 still sees everything.
    let pinned = names(&gateway, "obk_pinned").await;
    assert!(
        pinned.contains(&"stripe.create_refund".to_string()),
        "{pinned:?}"
    );
    assert!(
        pinned.contains(&"tracker.issues.get".to_string()),
        "{pinned:?}"
    );
    assert!(vendor.count("/v1/refunds") == 0 && vendor.count("/v1/charges") == 1);
}

/// A tool that honestly declares it cannot pass the idempotency key on ("unsupported") can be
/// kept out of production by policy, while the rest of the connector stays available.
#[tokio::test]
async fn an_unsupported_propagation_is_deniable_for_production_writes() {
    let vendor = MockVendor::start().await;
    let mut config = GatewayConfig::new(&vendor.base_url());
    config.environment = Some("prod".into());
    let mut key = Key::new(
        "obk_prod_tracker",
        "acme",
        &["tracker.*", "tracker.issues.close"],
    );
    key.environment = "prod".into();
    config.keys = vec![key];
    config.publications = vec![(
        1,
        r#"@id("all") permit(principal, action, resource);
@id("no-unkeyed-prod-writes") forbid(principal, action == Obol::Action::"call", resource)
when { resource.environment == "prod" && resource.propagation == "unsupported" };"#
            .into(),
    )];
    let gateway = GatewayProcess::start(&config);
    assert_eq!(
        names(&gateway, "obk_prod_tracker").await,
        vec!["tracker.issues.get".to_owned()]
    );
    let client = McpClient::connect(&gateway.url, "obk_prod_tracker").await;
    let (code, message, _) = client
        .call_err("tracker.issues.create", json!({"title": "x"}))
        .await;
    assert_eq!((code, message.as_str()), (-32602, "Unknown tool"));
    assert!(vendor.seen().is_empty());
}
