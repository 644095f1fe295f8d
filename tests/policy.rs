//! Who sees what: the errors before the MCP server, the prefilter rules, and existence hiding
//! (issue 4, first part: keys, environments, freeze, scopes, prefilter with CEL).

use obol::policy::cases::{self, Case, Universe};
use rmcp::ServiceError;
use serde_json::{Value, json};

use crate::support::client::RawResponse;
use crate::support::gateway::Key;
use crate::support::{
    GatewayConfig, GatewayProcess, McpClient, MockVendor, RawMcp, Reply, TOKEN, guests,
};

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

/// Every tool of `acme` with the first-party connectors, and arguments its vendor call
/// succeeds with.
fn acme_tools() -> Vec<(String, Value)> {
    [
        ("stripe.create_refund", json!({"charge": "ch_1"})),
        ("stripe.charges.list", json!({})),
        ("tracker.issues.create", json!({"title": "x"})),
        ("tracker.issues.get", json!({"number": 7})),
        ("tracker.issues.close", json!({"number": 7})),
    ]
    .into_iter()
    .map(|(name, arguments)| (name.to_owned(), arguments))
    .collect()
}

/// Names no snapshot routes: absent, unloaded, malformed.
const ABSENT: [&str; 3] = ["stripe.no_such_tool", "hostile.echo", "no-dot-here"];

/// What the cases saw: tools listed, tools of the catalog hidden, and calls that ran to a
/// result.
#[derive(Default)]
struct Tally {
    listed: usize,
    hidden: usize,
    succeeded: usize,
}

/// Lists as the case's key, then calls every name: a listed tool must not answer
/// `Unknown tool`, anything else must answer exactly that. The call may fail later for its
/// own reasons (approval required, the vendor's answer); only existence is the property.
async fn replay(gateway: &GatewayProcess, case: &Case, tally: &mut Tally) {
    let client = McpClient::connect(&gateway.url, &token(case)).await;
    let listed = client.tool_names().await;
    let tools = acme_tools();
    let mut calls = tools.clone();
    calls.extend(ABSENT.map(|name| (name.to_owned(), json!({}))));
    // Whatever is listed is called, even a name this test does not know.
    for name in &listed {
        if !calls.iter().any(|(n, _)| n == name) {
            calls.push((name.clone(), json!({})));
        }
    }
    for (name, arguments) in calls {
        let answer = client.call(&name, arguments).await;
        let unknown = match &answer {
            Ok(_) => false,
            Err(ServiceError::McpError(error)) => {
                error.code.0 == -32602 && error.message == "Unknown tool" && error.data.is_none()
            }
            Err(other) => panic!("case {}: {name}: no JSON-RPC answer: {other}", case.number),
        };
        let is_listed = listed.contains(&name);
        assert_eq!(
            is_listed, !unknown,
            "case {}: {name} listed={is_listed}, answered {answer:?}\nlisted {listed:?}\n{}key {:?} filter {:?}",
            case.number, case.publication, case.allowed_tools, case.filter
        );
        if is_listed {
            tally.listed += 1;
        } else if tools.iter().any(|(n, _)| *n == name) {
            tally.hidden += 1;
        }
        if matches!(&answer, Ok(result) if result.is_error != Some(true)) {
            tally.succeeded += 1;
        }
    }
    client.close().await;
}

fn token(case: &Case) -> String {
    format!("obk_case_{}", case.number)
}

/// Listing equals calling through the real gateway (ADR-0005): every 20th of the property
/// test's generated cases (`obol::policy::cases`), each a publication and a key pinned to it,
/// replayed with real `tools/list` and `tools/call` requests. Keys must match the
/// deployment's environment, so the dev and the prod cases each get a gateway.
#[tokio::test]
async fn a_sample_of_generated_cases_calls_exactly_what_it_lists() {
    let universe = Universe {
        connectors: &["stripe", "tracker"],
        tools: &[
            "create_refund",
            "charges.list",
            "issues.create",
            "issues.get",
            "issues.close",
        ],
    };
    let sample: Vec<Case> = cases::generate(universe, 1000)
        .into_iter()
        .step_by(20)
        .collect();
    let vendor = MockVendor::start().await;
    // The issue both `issues.get` and `issues.close` address (a PATCH would be echoed).
    vendor.on(
        "/repos/acme/app/issues/7",
        Reply::json(
            200,
            json!({"number": 7, "title": "Crash on start", "state": "closed", "url": "https://tracker.example/o/r/issues/7", "html_url": "https://tracker.example/o/r/issues/7"}),
        ),
    );
    let mut tally = Tally::default();
    for prod in [false, true] {
        let cases: Vec<&Case> = sample.iter().filter(|case| case.prod == prod).collect();
        let environment = if prod { "prod" } else { "dev" };
        let mut config = GatewayConfig::new(&vendor.base_url());
        // The hostile connector's tools would spin and flood when listed; its connection
        // stays configured, and unroutable.
        config.components = vec![guests::PAYMENTS.into(), guests::TRACKER.into()];
        config.environment = Some(environment.into());
        config.publications = cases
            .iter()
            .zip(1..)
            .map(|(case, number)| (number, case.publication.clone()))
            .collect();
        config.keys = cases
            .iter()
            .zip(1..)
            .map(|(case, number): (&&Case, u32)| {
                let mut key = Key::new(&token(case), "acme", &[]);
                key.allowed_tools = case.allowed_tools.clone();
                key.environment = environment.into();
                key.filter = case.filter.clone();
                key.policy = Some(number.to_string());
                key
            })
            .collect();
        let gateway = GatewayProcess::start(&config);
        for case in cases {
            replay(&gateway, case, &mut tally).await;
        }
    }
    // The sample exercises both sides, and listed calls do reach the vendor.
    assert!(
        sample.iter().any(|c| c.prod) && sample.iter().any(|c| !c.prod),
        "both environments"
    );
    assert!(
        tally.listed >= 30 && tally.hidden >= 30 && tally.succeeded >= 10,
        "listed {} hidden {} succeeded {}",
        tally.listed,
        tally.hidden,
        tally.succeeded
    );
}
