//! Operators manage keys and publish policies on a running gateway (`obol keys`,
//! `obol policies`, the admin API): changes take effect without a restart and survive one.

use std::time::Duration;

use serde_json::{Value, json};

use crate::support::gateway::{Key, run_obol};
use crate::support::{
    GatewayConfig, GatewayProcess, McpClient, MockVendor, RawMcp, RedisServer, TOKEN, key_hash,
};

pub const ADMIN: &str = "oba_test_admin_token";

fn admin_config(vendor: &MockVendor) -> GatewayConfig {
    let mut config = GatewayConfig::new(&vendor.base_url());
    config.extra = format!("\n[admin]\ntoken_hash = \"{}\"\n", key_hash(ADMIN));
    config
}

/// `GET /metrics` with the admin token.
pub async fn metrics(gateway: &GatewayProcess) -> String {
    let response = reqwest::Client::new()
        .get(format!("{}/metrics", base(gateway)))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    response.text().await.unwrap()
}

fn base(gateway: &GatewayProcess) -> String {
    gateway.url.trim_end_matches("/mcp").to_owned()
}

/// Runs `obol` against the gateway's admin API; returns (exit code, JSON answer).
pub fn obol(gateway: &GatewayProcess, args: &[&str]) -> (i32, Value) {
    let url = base(gateway);
    let mut full: Vec<&str> = args.to_vec();
    full.extend(["--url", url.as_str(), "--admin-token", ADMIN]);
    let (code, out, err) = run_obol(&full);
    let answer = serde_json::from_str(&out).unwrap_or_else(|_| panic!("{out}\n{err}"));
    (code, answer)
}

/// `obol keys create` with a name, a workspace, one glob and any further flags.
fn create(
    gateway: &GatewayProcess,
    name: &str,
    workspace: &str,
    allow: &str,
    more: &[&str],
) -> (i32, Value) {
    let mut args = vec![
        "keys",
        "create",
        "--name",
        name,
        "--workspace",
        workspace,
        "--allow",
        allow,
    ];
    args.extend_from_slice(more);
    obol(gateway, &args)
}

async fn initialize_status(gateway: &GatewayProcess, token: &str) -> u16 {
    RawMcp::new(&gateway.url)
        .initialize(token, "2025-11-25")
        .await
        .1
        .status
}

#[tokio::test]
async fn keys_are_created_listed_and_revoked_without_a_restart() {
    let vendor = MockVendor::start().await;
    let gateway = GatewayProcess::start(&admin_config(&vendor));

    // Only the admin token opens the admin API; a virtual key does not.
    let http = reqwest::Client::new();
    for token in [TOKEN, "wrong"] {
        let refused = http
            .get(format!("{}/v1/admin/keys", base(&gateway)))
            .bearer_auth(token)
            .send()
            .await
            .unwrap();
        assert_eq!(refused.status(), 401);
    }

    // Nor under a foreign host name (a DNS-rebinding page on the operator's machine).
    let rebound = http
        .get(format!("{}/v1/admin/keys", base(&gateway)))
        .bearer_auth(ADMIN)
        .header("host", "rebind.example")
        .send()
        .await
        .unwrap();
    assert_eq!(rebound.status(), 421);

    let (code, created) = create(
        &gateway,
        "ci-bot",
        "acme",
        "tracker.*",
        &["--scope", "mcp", "--scope", "receipts"],
    );
    assert_eq!(code, 0, "{created}");
    let token = created["token"].as_str().unwrap().to_owned();
    assert!(token.starts_with("obk_"));
    // The new key works at once and sees what its globs allow.
    let client = McpClient::connect(&gateway.url, &token).await;
    assert_eq!(
        client.tool_names().await,
        vec![
            "tracker.issues.close",
            "tracker.issues.create",
            "tracker.issues.get"
        ]
    );
    client.close().await;

    // Listed with the config's keys, never with a hash or a token.
    let (code, listed) = obol(&gateway, &["keys", "list"]);
    assert_eq!(code, 0);
    let names: Vec<&str> = listed["keys"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k["name"].as_str().unwrap())
        .collect();
    assert!(
        names.contains(&"key-0") && names.contains(&"ci-bot"),
        "{names:?}"
    );
    let text = listed.to_string();
    assert!(
        !text.contains("sha256:") && !text.contains(&token),
        "{text}"
    );

    // Refused with a specific reason: a bad spec, a taken name, a config key's revocation.
    let (code, bad) = create(&gateway, "x", "nowhere", "*", &[]);
    assert_eq!((code, bad["error"]["type"].as_str()), (1, Some("invalid")));
    assert!(
        bad["error"]["message"]
            .as_str()
            .unwrap()
            .contains("nowhere")
    );
    let (code, taken) = create(&gateway, "ci-bot", "acme", "*", &[]);
    assert_eq!(
        (code, taken["error"]["type"].as_str()),
        (1, Some("conflict"))
    );
    let (code, config_key) = obol(&gateway, &["keys", "revoke", "key-0"]);
    assert_eq!(
        (code, config_key["error"]["type"].as_str()),
        (1, Some("defined_in_config"))
    );

    // A second key, kept, to check persistence; then revoke the first: refused at once.
    let (_, kept) = create(&gateway, "kept", "acme", "stripe.*", &[]);
    let kept = kept["token"].as_str().unwrap().to_owned();
    let (code, revoked) = obol(&gateway, &["keys", "revoke", "ci-bot"]);
    assert_eq!(code, 0, "{revoked}");
    assert_eq!(initialize_status(&gateway, &token).await, 401);

    // Both decisions survive a restart.
    let dir = gateway.kill();
    let gateway = GatewayProcess::start_in(&admin_config(&vendor), dir);
    assert_eq!(initialize_status(&gateway, &token).await, 401);
    assert_eq!(initialize_status(&gateway, &kept).await, 200);
}

#[tokio::test]
async fn publishing_policies_takes_effect_without_a_restart() {
    let vendor = MockVendor::start().await;
    let mut config = admin_config(&vendor);
    config.publications = vec![(
        1,
        r#"@id("all") permit(principal, action, resource);"#.into(),
    )];
    let mut pinned = Key::new("obk_pinned", "acme", &["stripe.*"]);
    pinned.policy = Some("1".into());
    config.keys.push(pinned);
    config
        .keys
        .push(Key::new("obk_latest", "acme", &["stripe.*"]));
    let gateway = GatewayProcess::start(&config);
    let names = |token: &'static str| {
        let url = gateway.url.clone();
        async move { McpClient::connect(&url, token).await.tool_names().await }
    };
    assert!(
        names("obk_latest")
            .await
            .contains(&"stripe.charges.list".to_owned())
    );

    // Cedar that does not parse is refused and uses up no number.
    let cedar = gateway.dir.path().join("bad.cedar");
    std::fs::write(&cedar, "permit(principal, action, resource").unwrap();
    let (code, bad) = obol(
        &gateway,
        &[
            "policies",
            "publish",
            "--workspace",
            "acme",
            cedar.to_str().unwrap(),
        ],
    );
    assert_eq!((code, bad["error"]["type"].as_str()), (1, Some("invalid")));

    let cedar = gateway.dir.path().join("no-listing.cedar");
    std::fs::write(
        &cedar,
        r#"@id("all") permit(principal, action, resource);
@id("no-charges") forbid(principal, action == Obol::Action::"call", resource == Obol::Tool::"stripe.charges.list");"#,
    )
    .unwrap();
    let (code, published) = obol(
        &gateway,
        &[
            "policies",
            "publish",
            "--workspace",
            "acme",
            cedar.to_str().unwrap(),
        ],
    );
    assert_eq!(code, 0, "{published}");
    assert_eq!(published["number"], json!(2));

    // `latest` moved to 2; a key pinned to 1 did not.
    assert!(
        !names("obk_latest")
            .await
            .contains(&"stripe.charges.list".to_owned())
    );
    assert!(
        names("obk_pinned")
            .await
            .contains(&"stripe.charges.list".to_owned())
    );
    let (_, listed) = obol(&gateway, &["policies", "list", "--workspace", "acme"]);
    assert_eq!(
        listed["publications"],
        json!([{"number": 1, "source": "config"}, {"number": 2, "source": "admin"}])
    );

    // And after a restart.
    let dir = gateway.kill();
    let gateway = GatewayProcess::start_in(&config, dir);
    let client = McpClient::connect(&gateway.url, "obk_latest").await;
    assert!(
        !client
            .tool_names()
            .await
            .contains(&"stripe.charges.list".to_owned())
    );
}

#[tokio::test]
async fn gateways_sharing_redis_see_each_others_keys() {
    let vendor = MockVendor::start().await;
    let redis = RedisServer::start();
    let mut config = admin_config(&vendor);
    config.store = Some(format!("redis_url = {:?}", redis.url()));
    let (a, b) = (
        GatewayProcess::start(&config),
        GatewayProcess::start(&config),
    );
    let (code, created) = create(&a, "shared", "acme", "*", &[]);
    assert_eq!(code, 0, "{created}");
    let token = created["token"].as_str().unwrap().to_owned();
    assert_eq!(initialize_status(&a, &token).await, 200);
    // B learns of it by polling the registry (every 2 s).
    assert!(
        becomes(&b, &token, 200).await,
        "the second gateway never accepted the key"
    );
    obol(&a, &["keys", "revoke", "shared"]);
    assert!(
        becomes(&b, &token, 401).await,
        "the second gateway kept accepting a revoked key"
    );
}

/// Whether `initialize` with `token` answers `status` within 6 s.
async fn becomes(gateway: &GatewayProcess, token: &str, status: u16) -> bool {
    for _ in 0..60 {
        if initialize_status(gateway, token).await == status {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}

/// Issue 9: a registry that loses a revocation (a failover that forgot the write) does not
/// bring the key back on a gateway that had seen it revoked.
#[tokio::test]
async fn a_revocation_once_seen_is_never_unseen() {
    let vendor = MockVendor::start().await;
    let redis = RedisServer::start();
    let mut config = admin_config(&vendor);
    config.store = Some(format!("redis_url = {:?}", redis.url()));
    let gateway = GatewayProcess::start(&config);
    let (code, created) = create(&gateway, "doomed", "acme", "*", &[]);
    assert_eq!(code, 0, "{created}");
    let token = created["token"].as_str().unwrap().to_owned();
    let client = redis::Client::open(redis.url()).unwrap();
    let mut connection = client.get_connection().unwrap();
    let before: String = redis::cmd("HGET")
        .arg("obol:registry:keys")
        .arg("doomed")
        .query(&mut connection)
        .unwrap();
    obol(&gateway, &["keys", "revoke", "doomed"]);
    assert!(becomes(&gateway, &token, 401).await);
    // The store forgets the revocation: the unrevoked record is back.
    let _: () = redis::cmd("HSET")
        .arg("obol:registry:keys")
        .arg("doomed")
        .arg(&before)
        .query(&mut connection)
        .unwrap();
    // Several registry polls later (every 2 s), the key is still refused.
    tokio::time::sleep(Duration::from_millis(4500)).await;
    assert_eq!(initialize_status(&gateway, &token).await, 401);
}

/// Names are checked where they enter: a key name with a line break and a terminal escape, or
/// 100,000 characters long, is refused with a short, escaped error, and no log line is forged.
#[tokio::test]
async fn hostile_key_names_are_refused_and_never_forge_a_log_line() {
    let vendor = MockVendor::start().await;
    let gateway = GatewayProcess::start(&admin_config(&vendor));
    let http = reqwest::Client::new();
    for name in [
        "evil\n2026-12-02T00:00:00Z ERROR forged line\u{1b}[2J".to_owned(),
        "x".repeat(100_000),
    ] {
        let answer = http
            .post(format!("{}/v1/admin/keys", base(&gateway)))
            .bearer_auth(ADMIN)
            .json(&json!({"name": name, "workspace": "acme", "environment": "dev", "allowed_tools": ["*"]}))
            .send()
            .await
            .unwrap();
        assert_eq!(answer.status().as_u16(), 400);
        let text = answer.text().await.unwrap();
        assert!(text.len() < 1024, "an error of {} bytes", text.len());
        assert!(text.contains("key name"), "{text}");
        assert!(!text.contains('\u{1b}'), "{text}");
    }
    let (_, listed) = obol(&gateway, &["keys", "list"]);
    assert!(!listed.to_string().contains("evil"), "{listed}");
    assert!(!gateway.log().contains("forged line"), "{}", gateway.log());
    assert!(!gateway.log().contains('\u{1b}'));
}

/// Issue 10: revoking a key ends its sessions and its open `GET /mcp` stream at once.
#[tokio::test]
async fn revoking_a_key_ends_its_sessions_and_streams_at_once() {
    let vendor = MockVendor::start().await;
    let gateway = GatewayProcess::start(&admin_config(&vendor));
    let (_, created) = create(&gateway, "streamer", "acme", "*", &[]);
    let token = created["token"].as_str().unwrap().to_owned();
    let raw = RawMcp::new(&gateway.url);
    let (session, _) = raw.initialize(&token, "2025-11-25").await;
    let mut stream = reqwest::Client::new()
        .get(&gateway.url)
        .header("authorization", format!("Bearer {token}"))
        .header("accept", "text/event-stream")
        .header("mcp-session-id", &session)
        .header("mcp-protocol-version", "2025-11-25")
        .send()
        .await
        .unwrap();
    assert_eq!(stream.status().as_u16(), 200);
    let (code, _) = obol(&gateway, &["keys", "revoke", "streamer"]);
    assert_eq!(code, 0);
    let revoked = std::time::Instant::now();
    // The stream ends (its keep-alive comes every 15 s: an end within 2 s is the revocation).
    let ended = tokio::time::timeout(Duration::from_secs(2), async {
        while let Ok(Some(_)) = stream.chunk().await {}
    })
    .await;
    assert!(ended.is_ok(), "the stream outlived the revocation");
    println!("stream ended {:?} after the revocation", revoked.elapsed());
    let after = raw.request(&token, &session, 2, "ping", json!({})).await;
    assert_eq!(after.status, 401, "{:?}", after.message());
}

/// Issue 15: `GET /metrics` behind the admin token counts requests by an allowlisted method,
/// calls by connection, tool and outcome, attempts, replays, guest faults and phase times;
/// nothing a client sent (a junk method, an unknown tool's name, keys, sessions, arguments)
/// and no secret becomes part of it.
#[tokio::test]
async fn metrics_count_what_happened_and_carry_nothing_a_client_sent() {
    let vendor = MockVendor::start().await;
    vendor.on(
        "/v1/refunds",
        crate::support::Reply::json(
            200,
            json!({"id": "re_m", "object": "refund", "amount": 100, "charge": "ch_m", "status": "succeeded"}),
        ),
    );
    let gateway = GatewayProcess::start(&admin_config(&vendor));
    let http = reqwest::Client::new();
    let scrape = |token: &'static str| {
        let (http, url) = (http.clone(), format!("{}/metrics", base(&gateway)));
        async move { http.get(url).bearer_auth(token).send().await.unwrap() }
    };
    for token in [TOKEN, "wrong"] {
        assert_eq!(scrape(token).await.status(), 401);
    }

    let canary_key = "idt_canary_metrics_0001";
    let client = McpClient::with_key(&gateway.url, TOKEN, canary_key).await;
    let refund = json!({"charge": "ch_canary_argument", "amount": 100});
    client
        .call("stripe.create_refund", refund.clone())
        .await
        .unwrap();
    client.call("stripe.create_refund", refund).await.unwrap(); // replayed
    let plain = McpClient::connect(&gateway.url, TOKEN).await;
    plain.call("stripe.charges.list", json!({})).await.unwrap();
    assert!(plain.call("stripe.canary_tool", json!({})).await.is_err());
    assert!(plain.call("hostile.spin", json!({})).await.is_err());
    let raw = RawMcp::new(&gateway.url);
    let (session, _) = raw.initialize(TOKEN, "2025-11-25").await;
    let junk = raw
        .request(TOKEN, &session, 7, "canary/method_sk_live", json!({}))
        .await;
    assert_eq!(junk.status, 200);

    let scraped = scrape(ADMIN).await;
    assert_eq!(scraped.status(), 200);
    assert!(
        scraped.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("application/openmetrics-text")
    );
    let text = scraped.text().await.unwrap();
    let value = |series: &str| -> f64 {
        text.lines()
            .find_map(|line| line.strip_prefix(series)?.trim().parse().ok())
            .unwrap_or_else(|| panic!("no {series} in\n{text}"))
    };
    assert_eq!(value(r#"obol_requests_total{method="unknown"}"#), 1.0);
    assert!(value(r#"obol_requests_total{method="tools/call"}"#) >= 5.0);
    assert_eq!(
        value(
            r#"obol_tool_calls_total{connection="stripe-main",tool="stripe.create_refund",outcome="accepted"}"#
        ),
        2.0
    );
    assert_eq!(
        value(r#"obol_tool_calls_total{connection="unknown",tool="unknown",outcome="error"}"#),
        1.0
    );
    assert_eq!(
        value(
            r#"obol_tool_calls_total{connection="hostile-main",tool="hostile.spin",outcome="component_failed"}"#
        ),
        1.0
    );
    assert_eq!(value(r#"obol_claims_found_total{found="replayed"}"#), 1.0);
    // The replay sent nothing: one refund and one listing reached the vendor.
    assert_eq!(
        value(r#"obol_attempts_total{connection="stripe-main"}"#),
        2.0
    );
    assert_eq!(
        value(r#"obol_guest_faults_total{connection="hostile-main",fault="deadline"}"#),
        1.0
    );
    assert!(value(r#"obol_phase_seconds_count{phase="claim"}"#) >= 2.0);
    assert!(value(r#"obol_phase_seconds_count{phase="finalize"}"#) >= 2.0);
    for never in [
        "canary",
        canary_key,
        &session,
        TOKEN,
        ADMIN,
        crate::support::SECRET,
        &vendor.base_url(),
    ] {
        assert!(!text.contains(never), "{never} in\n{text}");
    }
}
