//! Capabilities through rmcp's client: `cap.refund` routed across a component provider
//! (`stripe.create_refund`, on the mock vendor) and an MCP upstream provider (`backup.refund`,
//! on the mock upstream). New calls fail over once a breaker opens; a same-key retry stays on
//! the route its slot recorded; a pin change never redirects a retry; visibility and
//! `no_eligible_route` follow the key's reach; `POST /v1/route` and `find_capability` answer
//! the decision without dispatching.
//!
//! Multi-threaded: the gateway lists its upstream before it serves, while the test waits.

use serde_json::{Value, json};

use crate::idempotency::{key, meta, receipt};
use crate::support::gateway::Key;
use crate::support::upstream::MockUpstream;
use crate::support::{
    GatewayConfig, GatewayProcess, McpClient, MockVendor, RawMcp, Reply, TOKEN, key_hash,
};

const ADMIN: &str = "oba_test_admin_token";
/// Reaches both providers and may ask `POST /v1/route`.
const ROUTER: &str = "obk_cap_router";
/// Reaches the capability but only the stripe provider.
const STRIPE_ONLY: &str = "obk_cap_stripe_only";
/// Reaches the capability and no provider.
const NO_PROVIDER: &str = "obk_cap_no_provider";
/// Everything, in progressive mode.
const PROGRESSIVE: &str = "obk_cap_progressive";
/// Reaches every provider, but Cedar forbids it the capability (`key-6`).
const DENIED: &str = "obk_cap_denied";
const OWNER: &str = "obo_acme_cap_owner";

fn refund_tool() -> Value {
    json!({
        "name": "refund",
        "description": "Refunds a charge at the backup processor.",
        "inputSchema": {
            "type": "object",
            "properties": {"charge": {"type": "string"}, "amount": {"type": "integer"}},
            "required": ["charge", "amount"],
        },
    })
}

fn config(vendor: &MockVendor, upstream: &MockUpstream) -> GatewayConfig {
    let mut config = GatewayConfig::new(&vendor.base_url());
    config.acme_connections = format!(
        r#"[[workspaces.connections]]
id = "backup-main"
kind = "mcp"
url = "{}"
prefix = "backup"

[[workspaces.capabilities]]
name = "cap.refund"
description = "Give a customer's money back for a payment."
input_schema = {{ type = "object", properties = {{ payment = {{ type = "string" }}, cents = {{ type = "integer" }} }}, required = ["payment", "cents"] }}

[[workspaces.capabilities.providers]]
tool = "stripe.create_refund"
priority = 1
map = {{ charge = "payment", amount = "cents" }}

[[workspaces.capabilities.providers]]
tool = "backup.refund"
priority = 2
map = {{ charge = "payment", amount = "cents" }}
"#,
        upstream.url()
    );
    config.extra = format!(
        "\n[admin]\ntoken_hash = \"{}\"\n[routing]\nbreaker_failures = 2\nbreaker_cooldown_ms = 600000\n",
        key_hash(ADMIN)
    );
    let mut router = Key::new(ROUTER, "acme", &["*"]);
    router.scopes = vec!["mcp".into(), "receipts".into(), "route".into()];
    config.keys.push(router);
    config
        .keys
        .push(Key::new(STRIPE_ONLY, "acme", &["cap.*", "stripe.*"]));
    config.keys.push(Key::new(NO_PROVIDER, "acme", &["cap.*"]));
    config
        .keys
        .push(Key::progressive(PROGRESSIVE, "acme", &["*"]));
    config
}

fn decision(result: &rmcp::model::CallToolResult) -> Value {
    meta(result)["capability"].clone()
}

fn payment() -> Value {
    json!({"payment": "ch_cap", "cents": 700})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_calls_fail_over_once_the_breaker_opens_and_retries_keep_their_route() {
    let vendor = MockVendor::start().await;
    vendor.on("/v1/refunds", Reply::json(503, json!({"error": "down"})));
    let upstream = MockUpstream::start_with(vec![refund_tool()]).await;
    let gateway = GatewayProcess::start(&config(&vendor, &upstream));

    // The first call goes to the first provider by priority, which answers 503 twice (the
    // call and its one retry): two failures open its breaker.
    let first_key = key("cap-first");
    let first = McpClient::with_key(&gateway.url, TOKEN, &first_key).await;
    let failed = first.call("cap.refund", payment()).await.unwrap();
    assert_eq!(decision(&failed)["provider"], json!("stripe.create_refund"));
    assert_eq!(decision(&failed)["why"], json!("priority"));
    assert_eq!(vendor.count("/v1/refunds"), 2);
    // The provider got its own arguments, mapped from the capability's.
    assert!(
        vendor.seen()[0].body_text().contains("charge=ch_cap"),
        "{}",
        vendor.seen()[0].body_text()
    );

    // A new key: the breaker is open, so the next provider takes it.
    let second = McpClient::with_key(&gateway.url, TOKEN, &key("cap-second")).await;
    let moved = second.call("cap.refund", payment()).await.unwrap();
    assert_eq!(moved.is_error, Some(false), "{moved:?}");
    let routed = decision(&moved);
    assert_eq!(routed["provider"], json!("backup.refund"));
    assert_eq!(routed["connection"], json!("backup-main"));
    assert_eq!(
        routed["passed_over"][0]["provider"],
        json!("stripe.create_refund")
    );
    assert_eq!(routed["passed_over"][0]["why"], json!("circuit_open"));
    assert_eq!(upstream.calls_to("refund"), 1);
    assert_eq!(
        upstream.calls()[0].arguments,
        json!({"charge": "ch_cap", "amount": 700})
    );
    // The receipt names the capability, the provider and why.
    let id = meta(&moved)["receipt_id"].as_str().unwrap().to_owned();
    let stored = receipt(&gateway, &id).await;
    assert_eq!(stored["tool"], json!("cap.refund"));
    assert_eq!(stored["connection"], json!("backup-main"));
    assert_eq!(stored["capability"]["provider"], json!("backup.refund"));
    assert_eq!(stored["attempt_count"], json!(1));

    // The first call's retry, under its own key, stays on its recorded route: the breaker
    // never moves a call that may already have had an effect.
    let retried = first.call("cap.refund", payment()).await.unwrap();
    assert_eq!(
        decision(&retried)["provider"],
        json!("stripe.create_refund")
    );
    // The slot keeps the router's first decision, why and all.
    assert_eq!(decision(&retried)["source"], json!("slot"));
    assert_eq!(decision(&retried)["why"], json!("priority"));
    assert!(
        vendor.count("/v1/refunds") > 2,
        "the retry was resent to stripe"
    );
    assert_eq!(
        upstream.calls_to("refund"),
        1,
        "nothing moved to the backup"
    );

    // Other arguments under the first key conflict, whatever the route now is.
    let (code, _, _) = first
        .call_err("cap.refund", json!({"payment": "ch_cap", "cents": 701}))
        .await;
    assert_eq!(code, -32019);
    first.close().await;
    second.close().await;
}

async fn admin(
    gateway: &GatewayProcess,
    method: reqwest::Method,
    path: &str,
    body: Value,
) -> (u16, Value) {
    let url = gateway.url.replace("/mcp", path);
    let response = reqwest::Client::new()
        .request(method, url)
        .bearer_auth(ADMIN)
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_after_a_pin_change_replays_the_first_providers_result() {
    let vendor = MockVendor::start().await;
    vendor.on(
        "/v1/refunds",
        Reply::json(
            200,
            json!({"id": "re_stripe", "object": "refund", "amount": 700, "charge": "ch_cap", "status": "succeeded"}),
        ),
    );
    let upstream = MockUpstream::start_with(vec![refund_tool()]).await;
    let gateway = GatewayProcess::start(&config(&vendor, &upstream));
    let (status, created) = admin(
        &gateway,
        reqwest::Method::POST,
        "/v1/admin/keys",
        json!({
            "name": "pinned-agent", "workspace": "acme", "environment": "dev",
            "allowed_tools": ["*"], "capability_pins": {"cap.refund": "backup-main"},
        }),
    )
    .await;
    assert_eq!(status, 201, "{created}");
    let token = created["token"].as_str().unwrap().to_owned();

    let k = key("cap-pin");
    let client = McpClient::with_key(&gateway.url, &token, &k).await;
    let first = client.call("cap.refund", payment()).await.unwrap();
    assert_eq!(decision(&first)["provider"], json!("backup.refund"));
    assert_eq!(decision(&first)["why"], json!("pinned"));

    // The operator pins the key to stripe: new calls go there, the old one's retry does not.
    let (status, answer) = admin(
        &gateway,
        reqwest::Method::PUT,
        "/v1/admin/keys/pinned-agent/capability_pins",
        json!({"cap.refund": "stripe-main"}),
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    let again = client.call("cap.refund", payment()).await.unwrap();
    assert_eq!(meta(&again)["replayed"], json!(true));
    assert_eq!(again.content, first.content);
    assert_eq!(meta(&again)["receipt_id"], meta(&first)["receipt_id"]);
    assert_eq!(vendor.count("/v1/refunds"), 0);
    assert_eq!(upstream.calls_to("refund"), 1);

    let fresh = McpClient::with_key(&gateway.url, &token, &key("cap-pin-new")).await;
    let moved = fresh.call("cap.refund", payment()).await.unwrap();
    assert_eq!(decision(&moved)["provider"], json!("stripe.create_refund"));
    assert_eq!(decision(&moved)["why"], json!("pinned"));
    assert_eq!(vendor.count("/v1/refunds"), 1);

    // A pin that names no capability is refused, and changes nothing.
    let (status, _) = admin(
        &gateway,
        reqwest::Method::PUT,
        "/v1/admin/keys/pinned-agent/capability_pins",
        json!({"refund": "stripe-main"}),
    )
    .await;
    assert_eq!(status, 400);
    client.close().await;
    fresh.close().await;
}

/// The answer to `tools/call` of `name` (JSON-RPC id 7), without headers that vary.
async fn answer(gateway: &GatewayProcess, token: &str, name: &str, arguments: Value) -> String {
    let raw = RawMcp::new(&gateway.url);
    let (session, _) = raw.initialize(token, "2025-11-25").await;
    raw.request(
        token,
        &session,
        7,
        "tools/call",
        json!({"name": name, "arguments": arguments}),
    )
    .await
    .body
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn visibility_follows_reach_and_no_eligible_route_names_only_the_capability() {
    let vendor = MockVendor::start().await;
    vendor.on("/v1/refunds", Reply::json(503, json!({"error": "down"})));
    let upstream = MockUpstream::start_with(vec![refund_tool()]).await;
    let mut config = config(&vendor, &upstream);
    config.keys.push(Key::new(DENIED, "acme", &["*"]));
    config.owner = Some(OWNER.into());
    config.publications = vec![(
        1,
        r#"@id("all") permit(principal, action, resource);
@id("no-capability-for-key-6") forbid(principal == Obol::Key::"key-6", action, resource == Obol::Tool::"cap.refund");"#
            .into(),
    )];
    let gateway = GatewayProcess::start(&config);

    // Listed with find_capability for a key that reaches a provider...
    let router = McpClient::connect(&gateway.url, ROUTER).await;
    let names = router.tool_names().await;
    assert!(names.contains(&"cap.refund".to_owned()), "{names:?}");
    assert!(names.contains(&"find_capability".to_owned()), "{names:?}");
    let card = router
        .list_tools()
        .await
        .into_iter()
        .find(|t| t.name == "cap.refund")
        .unwrap();
    assert_eq!(card.input_schema["required"], json!(["payment", "cents"]));

    // ...and invisible, byte for byte, to a key that reaches none.
    let none = McpClient::connect(&gateway.url, NO_PROVIDER).await;
    assert!(none.tool_names().await.is_empty());
    let absent = answer(&gateway, NO_PROVIDER, "cap.nope", payment()).await;
    assert!(absent.contains("Unknown tool"), "{absent}");
    assert_eq!(
        answer(&gateway, NO_PROVIDER, "cap.refund", payment()).await,
        absent
    );
    // So is a capability Cedar forbids, to a key that reaches its providers; the owner's
    // refusal receipt names the policy and the provider the router would have picked.
    assert_eq!(
        answer(&gateway, DENIED, "cap.refund", payment()).await,
        absent
    );
    let refusals = loop {
        let receipts = crate::lifecycle::receipts(&gateway, OWNER).await;
        let refusals: Vec<Value> = receipts
            .into_iter()
            .filter(|r| r["refusal"] == json!(true) && r["tool"] == json!("cap.refund"))
            .collect();
        if refusals.len() >= 2 {
            break refusals;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    let denied = refusals
        .iter()
        .find(|r| r["key_name"] == json!("key-6"))
        .unwrap();
    assert!(
        denied["matched_policies"]
            .as_array()
            .unwrap()
            .contains(&json!("no-capability-for-key-6")),
        "{denied}"
    );
    assert_eq!(
        denied["capability"]["provider"],
        json!("stripe.create_refund")
    );
    let unreachable = refusals
        .iter()
        .find(|r| r["key_name"] == json!("key-4"))
        .unwrap();
    assert!(
        unreachable["note"]
            .as_str()
            .unwrap()
            .contains("none of the capability's providers"),
        "{unreachable}"
    );

    // In progressive mode, search_tools interleaves the capability's card with the tools;
    // find_capability is not a progressive tool.
    let progressive = McpClient::connect(&gateway.url, PROGRESSIVE).await;
    let found = progressive
        .call(
            "search_tools",
            json!({"query": "give a customer money back"}),
        )
        .await
        .unwrap();
    let hits: Vec<&str> = found.structured_content.as_ref().unwrap()["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|hit| hit["name"].as_str().unwrap())
        .collect();
    assert!(hits[..3].contains(&"cap.refund"), "{hits:?}");
    assert!(hits.contains(&"stripe.create_refund"), "{hits:?}");
    let through = progressive
        .call(
            "call_tool",
            json!({"name": "find_capability", "arguments": {"capability": "cap.refund"}}),
        )
        .await;
    assert!(through.is_err(), "{through:?}");
    progressive.close().await;

    // Arguments the card refuses are refused before any provider is asked.
    let (_, obol) = router
        .call_refused("cap.refund", json!({"payment": 1}))
        .await;
    assert_eq!(obol["error"], json!("invalid_arguments"));

    // POST /v1/route answers the decision without dispatching (scope `route`).
    let ask = |token: &'static str| {
        let url = gateway.url.replace("/mcp", "/v1/route");
        async move {
            let response = reqwest::Client::new()
                .post(url)
                .bearer_auth(token)
                .json(&json!({"capability": "cap.refund", "arguments": payment()}))
                .send()
                .await
                .unwrap();
            let status = response.status().as_u16();
            (status, response.json::<Value>().await.unwrap())
        }
    };
    let (status, routed) = ask(ROUTER).await;
    assert_eq!(status, 200, "{routed}");
    assert_eq!(routed["provider"], json!("stripe.create_refund"));
    assert_eq!(routed["source"], json!("router"));
    assert!(routed.get("provider_arguments").is_none(), "{routed}");
    let (status, refused) = ask(STRIPE_ONLY).await;
    assert_eq!(status, 403, "{refused}");
    assert_eq!(vendor.count("/v1/refunds"), 0, "route dispatches nothing");
    // find_capability is its MCP mirror.
    let found = router
        .call(
            "find_capability",
            json!({"capability": "cap.refund", "arguments": payment()}),
        )
        .await
        .unwrap();
    assert_eq!(
        found.structured_content.as_ref().unwrap()["provider"],
        json!("stripe.create_refund")
    );

    // A key that reaches only stripe: once its breaker is open, no_eligible_route, naming
    // nothing but the capability (not the backup it cannot see).
    let stripe_only = McpClient::with_key(&gateway.url, STRIPE_ONLY, &key("cap-open")).await;
    stripe_only.call("cap.refund", payment()).await.unwrap();
    let body = answer(&gateway, STRIPE_ONLY, "cap.refund", payment()).await;
    assert!(body.contains("no_eligible_route"), "{body}");
    assert!(
        body.contains("cap.refund") && !body.contains("backup"),
        "{body}"
    );
    // The router key still reaches the backup.
    let (_, routed) = ask(ROUTER).await;
    assert_eq!(routed["provider"], json!("backup.refund"));
    assert_eq!(routed["passed_over"][0]["why"], json!("circuit_open"));
    router.close().await;
    none.close().await;
    stripe_only.close().await;
}

/// The rolling cutover (spec/idempotency.md, the capability-scope note): a Redis store
/// holding a capability record of the old key layout (claimed under its resolved connection,
/// written here as an older gateway would) and no layout marker is refused; `obol store
/// migrate` names the record to drain and deletes nothing; once it is drained (its retention
/// passed: deleted here as Redis would expire it) the migration marks the store and traffic
/// flows. Nothing was ever dispatched for the old record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_of_the_old_key_layout_is_refused_until_drained_and_migrated() {
    use obol::store::{
        ApprovalBasis, ClaimKey, ClaimRecord, ConnectionSegment, EvidenceClass, Holder, KeySource,
        Opening, Pin, PinnedBinding,
    };
    let redis = crate::support::RedisServer::start();
    let vendor = MockVendor::start().await;
    let upstream = MockUpstream::start_with(vec![refund_tool()]).await;
    let store = obol::store::Store::Redis(
        obol::store::RedisStore::connect(&redis.url())
            .await
            .unwrap(),
    );
    let old_key = key("cap-legacy");
    let old = ClaimKey {
        workspace: "acme".into(),
        connection: ConnectionSegment::Resolved("stripe-main".into()),
        tool: "cap.refund".into(),
        key: obol::idempotency::IdempotencyKey::parse(&old_key).unwrap(),
    };
    let now = obol::clock::now_ms();
    let record = ClaimRecord::open(
        Pin::new(
            obol::idempotency::RequestHash::of_arguments(&payment()),
            PinnedBinding::Header("idempotency-key".into()),
            "stripe-main stripe POST https://api.stripe.com /v1/refunds".into(),
        )
        .prepared_by("0.1.0"),
        Holder {
            workspace: "acme".into(),
            connection: "stripe-main".into(),
            tool: "cap.refund".into(),
            idempotency_key: old_key.clone(),
            key_hash: key_hash(TOKEN),
            key_name: "key-0".into(),
            publication: None,
            policies: Vec::new(),
            approval: ApprovalBasis::NotRequired,
            evidence: EvidenceClass::GatewayObserved,
            route: Default::default(),
            capability: None,
            trace_id: None,
        },
        Opening::Reserved {
            lease_until_ms: now + 3_600_000,
        },
        "rcp_legacy".into(),
        KeySource::Supplied,
        now,
    );
    store.claim(&old, &record).await.unwrap();

    let mut config = config(&vendor, &upstream);
    config.store = Some(format!("redis_url = {:?}", redis.url()));
    let gateway = GatewayProcess::start(&config);
    let raw = RawMcp::new(&gateway.url);
    let (_, refused) = raw.initialize(TOKEN, "2025-11-25").await;
    assert_eq!(refused.status, 503, "{}", refused.body);
    assert!(refused.body.contains("layout_mismatch"), "{}", refused.body);
    assert!(
        gateway.log().contains("obol store migrate"),
        "{}",
        gateway.log()
    );

    // The migration names what to drain, and leaves it.
    let config_path = gateway.dir.path().join("obol.toml");
    let migrate = || {
        crate::support::gateway::run_obol(&[
            "store",
            "migrate",
            "--config",
            config_path.to_str().unwrap(),
        ])
    };
    let (code, out, err) = migrate();
    assert_eq!(code, 1, "{out}{err}");
    assert!(
        out.contains("cap.refund") && out.contains("stripe-main") && out.contains("drain"),
        "{out}"
    );
    assert_eq!(store.get(&old).await.unwrap(), Some(record));

    // Drained: the old record's retention passed.
    let slot = old.slot();
    let client = redis::Client::open(redis.url()).unwrap();
    let mut connection = client.get_connection().unwrap();
    let _: () = redis::cmd("DEL")
        .arg(format!("obol:{{{slot}}}:claim"))
        .query(&mut connection)
        .unwrap();
    let (code, out, err) = migrate();
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("\"migrated\":true"), "{out}");

    // Within a heartbeat, the gateway admits traffic; the same logical call, under the new
    // layout, is one new call.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    loop {
        let (_, response) = raw.initialize(TOKEN, "2025-11-25").await;
        if response.status == 200 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{}", gateway.log());
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    assert_eq!(
        vendor.count("/v1/refunds"),
        0,
        "nothing was dispatched while refused"
    );
    assert_eq!(upstream.calls_to("refund"), 0);
}

/// In prod, a capability is as destructive as the provider it resolves to: the call is held,
/// its ticket names the capability and the provider, and the approval is bound to that
/// provider. With the provider removed from the capability (through the admin API), the
/// approved call conflicts instead of running on another; put back, it runs once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_capability_call_names_both_tools_and_its_approval_is_bound_to_the_provider() {
    use crate::approvals::{AGENT, approve, prod_config_at, resumer};
    let vendor = MockVendor::start().await;
    vendor.on(
        "/v1/refunds",
        Reply::json(
            200,
            json!({"id": "re_held", "object": "refund", "amount": 700, "charge": "ch_cap", "status": "succeeded"}),
        ),
    );
    let upstream = MockUpstream::start_with(vec![refund_tool()]).await;
    let mut config = prod_config_at(&vendor.base_url());
    for tool in ["cap.refund", "backup.refund"] {
        config.keys[0].allowed_tools.push(tool.into());
    }
    config.acme_connections = format!(
        "[[workspaces.connections]]\nid = \"backup-main\"\nkind = \"mcp\"\nurl = \"{}\"\nprefix = \"backup\"\n",
        upstream.url()
    );
    config.extra = format!("\n[admin]\ntoken_hash = \"{}\"\n", key_hash(ADMIN));
    let gateway = GatewayProcess::start(&config);
    let declare = |providers: &[&str]| {
        let providers: Vec<Value> = providers
            .iter()
            .enumerate()
            .map(|(priority, tool)| {
                json!({"tool": tool, "priority": priority, "map": {"charge": "payment", "amount": "cents"}})
            })
            .collect();
        json!({
            "name": "cap.refund",
            "description": "Give a customer's money back for a payment.",
            "input_schema": {"type": "object", "properties": {"payment": {"type": "string"}, "cents": {"type": "integer"}}, "required": ["payment", "cents"]},
            "providers": providers,
        })
    };
    let path = "/v1/admin/workspaces/acme/capabilities/cap.refund";
    let (status, answer) = admin(
        &gateway,
        reqwest::Method::PUT,
        path,
        declare(&["stripe.create_refund", "backup.refund"]),
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    let (_, listed) = admin(
        &gateway,
        reqwest::Method::GET,
        "/v1/admin/workspaces/acme/capabilities",
        Value::Null,
    )
    .await;
    assert_eq!(
        listed["capabilities"][0]["providers"],
        json!(["stripe.create_refund", "backup.refund"]),
        "{listed}"
    );

    let k = key("cap-held");
    let agent = McpClient::with_key(&gateway.url, AGENT, &k).await;
    let (code, _, data) = agent.call_err("cap.refund", payment()).await;
    assert_eq!(code, -32003, "{data:?}");
    let approval = &data.unwrap()["approval"];
    assert_eq!(approval["tool"], json!("cap.refund"));
    assert_eq!(approval["provider"], json!("stripe.create_refund"));
    let id = approval["approval_id"].as_str().unwrap().to_owned();
    // The inbox row names both: what the agent called, and the provider it resolved to.
    let page = crate::approvals::inbox(&gateway).await;
    let row = &page[page.find(&format!("id=\"ticket-{id}\"")).expect(&page)..];
    let row = &row[..row.find("</tr>").unwrap()];
    assert!(
        row.contains("cap.refund") && row.contains("stripe.create_refund"),
        "{row}"
    );
    let token = approve(&gateway, &id).await;

    // The operator takes stripe out of the capability: the approval is not spent elsewhere.
    let (status, _) = admin(
        &gateway,
        reqwest::Method::PUT,
        path,
        declare(&["backup.refund"]),
    )
    .await;
    assert_eq!(status, 200);
    let resumed = resumer(&gateway, AGENT, &id, &token, Some(&k)).await;
    let (code, _, _) = resumed.call_err("cap.refund", payment()).await;
    assert_eq!(
        code, -32019,
        "an approval for stripe was spent on another provider"
    );
    assert_eq!(vendor.count("/v1/refunds"), 0);
    assert_eq!(upstream.calls_to("refund"), 0);

    // Back in the capability, the approved call runs, once, on stripe.
    let (status, _) = admin(
        &gateway,
        reqwest::Method::PUT,
        path,
        declare(&["stripe.create_refund", "backup.refund"]),
    )
    .await;
    assert_eq!(status, 200);
    let done = resumed.call("cap.refund", payment()).await.unwrap();
    assert_eq!(done.is_error, Some(false), "{done:?}");
    assert_eq!(decision(&done)["provider"], json!("stripe.create_refund"));
    assert_eq!(decision(&done)["source"], json!("slot"));
    assert_eq!(vendor.count("/v1/refunds"), 1);
    assert_eq!(upstream.calls_to("refund"), 0);
    agent.close().await;
    resumed.close().await;
}
