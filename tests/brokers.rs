//! Federated connectors through catalog brokers (spec/idempotency.md, "Why broker retries are
//! disabled"): the host turns the broker's retries off on every attempt whatever the component
//! does, the vendor behind the broker sees exactly the attempts the receipts count, evidence
//! is `broker_attested` only when the host read the broker's record id, and a federated tool
//! without its broker profile never loads. Also: components built against contract 0.1.0.

use serde_json::{Value, json};

use crate::idempotency::{key, receipt};
use crate::support::broker::MockBroker;
use crate::support::{GatewayConfig, GatewayProcess, McpClient, MockVendor, TOKEN, guests};

fn config(vendor: &MockVendor, broker: &MockBroker, nango: &str, composio: &str) -> GatewayConfig {
    let mut config = GatewayConfig::new(&vendor.base_url());
    config.components.push(guests::NANGO.into());
    config.components.push(guests::COMPOSIO.into());
    let base = broker.base_url();
    config.acme_connections = format!(
        "[[workspaces.connections]]\nid = \"crm\"\nconnector = \"nango\"\nbase_url = \"{base}\"\n{nango}\n[workspaces.connections.settings]\nconnection_id = \"conn-1\"\nprovider_config_key = \"hubspot\"\n\
         [[workspaces.connections]]\nid = \"actions\"\nconnector = \"composio\"\nbase_url = \"{base}\"\n{composio}\n[workspaces.connections.settings]\nuser_id = \"u-1\"\n"
    );
    config
}

async fn start(nango: &str, composio: &str) -> (MockBroker, GatewayProcess) {
    let vendor = MockVendor::start().await;
    let broker = MockBroker::start().await;
    let gateway = GatewayProcess::start(&config(&vendor, &broker, nango, composio));
    (broker, gateway)
}

fn meta(result: &rmcp::model::CallToolResult) -> Value {
    result.meta.as_ref().unwrap().0["obol"].clone()
}

/// `composio.github.create_issue` with fixed arguments.
async fn create_issue(client: &McpClient) -> rmcp::model::CallToolResult {
    client
        .call(
            "composio.github.create_issue",
            json!({"owner": "acme", "repo": "app", "title": "t"}),
        )
        .await
        .unwrap()
}

const BROKERED: &str = "broker = \"nango\"";
const EXECUTED: &str = "broker = \"composio\"";

#[tokio::test]
async fn every_call_carries_the_retry_off_directive_and_the_vendor_sees_what_receipts_count() {
    let (broker, gateway) = start(BROKERED, EXECUTED).await;
    let client = McpClient::connect(&gateway.url, TOKEN).await;
    // A vendor that fails once: a broker left to itself would retry (and could write twice).
    broker.script_vendor(&[503]);
    let created = client
        .call("nango.contacts.create", json!({"email": "a@example.com"}))
        .await
        .unwrap();
    let obol = meta(&created);
    assert_eq!(obol["outcome"], json!("unknown"), "{obol}");
    assert_eq!(obol["attempt_count"], json!(1));
    assert_eq!(broker.vendor_requests(), 1, "the broker retried on its own");

    let done = client
        .call("nango.contacts.get", json!({"id": "c_1"}))
        .await
        .unwrap();
    assert_eq!(meta(&done)["outcome"], json!("accepted"));
    let issue = create_issue(&client).await;
    assert_eq!(meta(&issue)["outcome"], json!("accepted"));

    let calls = broker.calls();
    assert_eq!(calls.len(), 3);
    for call in &calls {
        assert_eq!(call.retries, Some(0), "{call:?}");
    }
    // Nango's directive is a header, Composio's a body field; the proxy saw its settings.
    assert!(
        calls[0]
            .headers
            .iter()
            .any(|(k, v)| k == "connection-id" && v == "conn-1")
    );
    assert_eq!(broker.vendor_requests(), 3);
    let receipts = crate::lifecycle::receipts(&gateway, TOKEN).await;
    let attempts: u64 = receipts
        .iter()
        .filter(|r| r["route"] == json!("federated"))
        .map(|r| r["attempt_count"].as_u64().unwrap())
        .sum();
    assert_eq!(attempts as usize, broker.vendor_requests(), "{receipts:?}");
}

#[tokio::test]
async fn evidence_is_broker_attested_only_when_the_host_read_the_brokers_record() {
    let (broker, gateway) = start(BROKERED, EXECUTED).await;
    let client = McpClient::connect(&gateway.url, TOKEN).await;

    // Composio's profile says where its log id is: the host read it.
    let issue = create_issue(&client).await;
    let obol = meta(&issue);
    assert_eq!(obol["evidence"], json!("broker_attested"), "{obol}");
    assert_eq!(obol["verification"], json!("unverifiable"));
    let attested = receipt(&gateway, obol["receipt_id"].as_str().unwrap()).await;
    assert_eq!(attested["broker_record_id"], json!("log_1"), "{attested}");
    assert_eq!(attested["route"], json!("federated"));
    assert_eq!(attested["connection"], json!("actions"));
    assert!(
        attested["note"]
            .as_str()
            .unwrap()
            .starts_with("broker_attested")
    );

    // Nango's proxy answer carries no record of the broker's: untrusted, and the receipt says why.
    let contact = client
        .call("nango.contacts.get", json!({"id": "c_9"}))
        .await
        .unwrap();
    let obol = meta(&contact);
    assert_eq!(obol["evidence"], json!("untrusted"));
    let untrusted = receipt(&gateway, obol["receipt_id"].as_str().unwrap()).await;
    assert_eq!(untrusted["broker_record_id"], Value::Null);
    assert!(untrusted["note"].as_str().unwrap().starts_with("untrusted"));
    assert_eq!(broker.calls().len(), 2);
}

#[tokio::test]
async fn a_200_that_says_unsuccessful_is_not_a_success() {
    let (broker, gateway) = start(BROKERED, EXECUTED).await;
    let client = McpClient::connect(&gateway.url, TOKEN).await;
    // The vendor fails; the broker (told not to retry) answers 200 with successful: false.
    broker.script_vendor(&[500]);
    let result = create_issue(&client).await;
    assert_eq!(result.is_error, Some(true), "{result:?}");
    let obol = meta(&result);
    assert_eq!(obol["outcome"], json!("unknown"), "{obol}");
    assert_eq!(obol["vendor_status"], json!(200));
    assert_eq!(broker.vendor_requests(), 1);
    // Unknown without a vendor binding: a same-key retry replays instead of sending again.
    let k = key("composio-unknown");
    let keyed = McpClient::with_key(&gateway.url, TOKEN, &k).await;
    broker.script_vendor(&[500]);
    let args = json!({"owner": "acme", "repo": "app", "title": "again"});
    keyed
        .call("composio.github.create_issue", args.clone())
        .await
        .unwrap();
    let again = keyed
        .call("composio.github.create_issue", args)
        .await
        .unwrap();
    assert_eq!(meta(&again)["replayed"], json!(true));
    assert_eq!(broker.vendor_requests(), 2);
}

#[tokio::test]
async fn fifty_concurrent_identical_federated_calls_reach_the_broker_once() {
    let (broker, gateway) = start(BROKERED, EXECUTED).await;
    let client =
        std::sync::Arc::new(McpClient::with_key(&gateway.url, TOKEN, &key("nango-fifty")).await);
    let calls = (0..50).map(|_| {
        let client = std::sync::Arc::clone(&client);
        tokio::spawn(async move {
            client
                .call("nango.contacts.create", json!({"email": "b@example.com"}))
                .await
        })
    });
    futures_util::future::join_all(calls).await;
    assert_eq!(broker.calls().len(), 1);
    assert_eq!(broker.vendor_requests(), 1);
}

#[tokio::test]
async fn a_federated_tool_without_its_broker_profile_never_loads() {
    // No broker on the Nango connection, and the wrong one on Composio's.
    let (broker, gateway) = start("", "broker = \"nango\"").await;
    let client = McpClient::connect(&gateway.url, TOKEN).await;
    let names = client.tool_names().await;
    assert!(
        !names
            .iter()
            .any(|n| n.starts_with("nango.") || n.starts_with("composio.")),
        "{names:?}"
    );
    let (code, _, _) = client
        .call_err("nango.contacts.get", json!({"id": "c_1"}))
        .await;
    assert_eq!(code, -32602);
    let log = gateway.log();
    assert!(
        log.contains(
            "nango.contacts.get is federated through nango, but connection \"crm\" names no broker"
        ),
        "{log}"
    );
    assert!(log.contains("composio.github.create_issue is federated through composio, but connection \"actions\" names broker nango"), "{log}");
    assert!(broker.calls().is_empty());
}

#[tokio::test]
async fn an_explicit_directive_replaces_the_profiles() {
    let (broker, gateway) = start(
        "broker = \"nango\"\n[workspaces.connections.retry_off]\nheader = \"x-max-retries\"\nvalue = \"0\"",
        EXECUTED,
    )
    .await;
    let client = McpClient::connect(&gateway.url, TOKEN).await;
    client
        .call("nango.contacts.get", json!({"id": "c_1"}))
        .await
        .unwrap();
    let call = &broker.calls()[0];
    assert!(
        call.headers
            .iter()
            .any(|(k, v)| k == "x-max-retries" && v == "0"),
        "{call:?}"
    );
}

/// Contract 0.1.0 components keep loading and working (ADR-0002); a 0.1.0 federated tool,
/// which cannot name its broker, is refused with a clear error.
#[tokio::test]
async fn components_built_against_contract_0_1_0_still_load() {
    let fixtures = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures");
    let (code, stdout, _) =
        crate::support::gateway::run_obol(&["check", &format!("{fixtures}/payments-v0.1.0.wasm")]);
    assert_eq!(code, 0, "{stdout}");
    assert!(stdout.contains("obol:connector@0.1.0"), "{stdout}");
    let (code, _, stderr) = crate::support::gateway::run_obol(&[
        "check",
        &format!("{fixtures}/hostile-federated-v0.1.0.wasm"),
    ]);
    assert_eq!(code, 2);
    assert!(
        stderr.contains("\"brokered\" is federated under obol:connector@0.1.0"),
        "{stderr}"
    );

    // The 0.1.0 payments component serves calls through the whole lifecycle.
    let vendor = MockVendor::start().await;
    vendor.on(
        "/v1/charges",
        crate::support::Reply::json(200, json!({"object": "list", "has_more": false, "data": [{"id": "ch_1", "object": "charge", "amount": 100, "currency": "usd", "status": "succeeded"}]})),
    );
    let mut config = GatewayConfig::new(&vendor.base_url());
    config.components = vec![format!("{fixtures}/payments-v0.1.0.wasm")];
    let gateway = GatewayProcess::start(&config);
    let client = McpClient::connect(&gateway.url, TOKEN).await;
    let result = client
        .call("stripe.charges.list", json!({"limit": 1}))
        .await
        .unwrap();
    assert_eq!(meta(&result)["outcome"], json!("accepted"), "{result:?}");
    assert_eq!(vendor.seen().len(), 1);
}

#[tokio::test]
async fn a_lost_broker_answer_is_unknown_with_one_attempt_and_other_arguments_conflict() {
    let (broker, gateway) = start(BROKERED, EXECUTED).await;
    let k = key("nango-lost");
    let client = McpClient::with_key(&gateway.url, TOKEN, &k).await;
    // The vendor acts, but the broker answers after the gateway's 1.5 s deadline.
    broker.set_delay(std::time::Duration::from_secs(3));
    let (_, message, data) = client
        .call_err("nango.contacts.create", json!({"email": "c@example.com"}))
        .await;
    let data = data.unwrap();
    assert_eq!(data["type"], json!("upstream_timeout"), "{message}");
    let lost = receipt(&gateway, data["receipt_id"].as_str().unwrap()).await;
    assert_eq!(lost["outcome"], json!("unknown"));
    assert_eq!(lost["attempt_count"], json!(1));
    assert_eq!(lost["route"], json!("federated"));
    assert_eq!(broker.vendor_requests(), 1);
    // The same key with other arguments is a different call: refused, nothing sent.
    broker.set_delay(std::time::Duration::ZERO);
    let (_, _, data) = client
        .call_err(
            "nango.contacts.create",
            json!({"email": "other@example.com"}),
        )
        .await;
    assert_eq!(data.unwrap()["type"], json!("idempotency_conflict"));
    assert_eq!(broker.calls().len(), 1);
}

#[test]
fn a_retry_off_directive_cannot_replace_the_credential_or_a_gateway_header() {
    for header in ["authorization", "cookie", "content-length"] {
        let vendor_url = "http://127.0.0.1:9";
        let mut config = GatewayConfig::new(vendor_url);
        config.components.push(guests::NANGO.into());
        config.acme_connections = format!(
            "[[workspaces.connections]]\nid = \"crm\"\nconnector = \"nango\"\nbase_url = \"{vendor_url}\"\nbroker = \"nango\"\n[workspaces.connections.retry_off]\nheader = \"{header}\"\nvalue = \"0\"\n"
        );
        let said = config.refused();
        assert!(
            said.contains("belongs to the gateway or the credential"),
            "{header}: {said}"
        );
    }
}

/// The retry-off directive is on the gateway-reserved retry too: the first attempt never
/// left (a refused connection), the same reservation is sent again, and the broker sees one
/// call, with its retries off, for one counted attempt.
#[tokio::test]
async fn the_gateway_reserved_retry_carries_the_directive_too() {
    let vendor = MockVendor::start().await;
    let broker = MockBroker::start().await;
    let mut config = config(&vendor, &broker, BROKERED, EXECUTED);
    config.env = vec![("OBOL_FAILPOINTS".into(), "refuse-send=1".into())];
    let gateway = GatewayProcess::start(&config);
    let client = McpClient::connect(&gateway.url, TOKEN).await;
    let created = client
        .call("nango.contacts.create", json!({"email": "d@example.com"}))
        .await
        .unwrap();
    assert_eq!(meta(&created)["outcome"], json!("accepted"));
    assert_eq!(meta(&created)["attempt_count"], json!(1));
    let calls = broker.calls();
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].retries, Some(0));
    assert_eq!(broker.vendor_requests(), 1);
}

/// A destructive federated tool in production is held for the owner and sent once after the
/// approval, with the broker's retries off.
#[tokio::test]
async fn a_destructive_federated_tool_is_held_in_prod_and_sent_once_after_approval() {
    use crate::approvals::{AGENT, approve, resumer};
    use crate::support::gateway::Key;
    let vendor = MockVendor::start().await;
    let broker = MockBroker::start().await;
    let mut config = config(&vendor, &broker, BROKERED, EXECUTED);
    let prod = crate::approvals::prod_config_at(&vendor.base_url());
    config.environment = prod.environment;
    config.owner = prod.owner;
    let mut agent = Key::new(AGENT, "acme", &["nango.contacts.delete"]);
    agent.environment = "prod".into();
    agent.scopes = vec!["mcp".into(), "receipts".into(), "approvals".into()];
    config.keys = vec![agent];
    let gateway = GatewayProcess::start(&config);
    let k = key("nango-delete");
    let client = McpClient::with_key(&gateway.url, AGENT, &k).await;
    let names = client.tool_names().await;
    assert_eq!(names, ["nango.contacts.delete"], "{}", gateway.log());
    let (code, message, data) = client
        .call_err("nango.contacts.delete", json!({"id": "c_7"}))
        .await;
    assert_eq!(code, -32003, "{message}");
    let id = data.unwrap()["approval"]["approval_id"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        broker.calls().is_empty(),
        "nothing sent before the approval"
    );
    let token = approve(&gateway, &id).await;
    let resumed = resumer(&gateway, AGENT, &id, &token, Some(&k)).await;
    let done = resumed
        .call("nango.contacts.delete", json!({"id": "c_7"}))
        .await
        .unwrap();
    assert_eq!(meta(&done)["outcome"], json!("accepted"), "{done:?}");
    let again = resumed
        .call("nango.contacts.delete", json!({"id": "c_7"}))
        .await
        .unwrap();
    assert_eq!(meta(&again)["replayed"], json!(true));
    let calls = broker.calls();
    assert_eq!(calls.len(), 1, "resumed once");
    assert_eq!(calls[0].retries, Some(0));
}
