//! Retrying through Obol never causes a second effect, and every effect leaves a receipt that
//! tells the truth (`spec/idempotency.md`). Embedded store here; `redis_store` runs the
//! shared-state cases against a real redis-server.

use std::time::Duration;

use serde_json::{Value, json};

use crate::support::client::RawResponse;
use crate::support::{GatewayConfig, GatewayProcess, McpClient, MockVendor, RawMcp, Reply, TOKEN};

pub fn key(tag: &str) -> String {
    format!("idt_{tag}_{:016x}", rand_u64())
}

fn rand_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos(),
    );
    h.finish()
}

pub fn meta(result: &rmcp::model::CallToolResult) -> Value {
    result.meta.as_ref().unwrap().0["obol"].clone()
}

pub async fn receipt(gateway: &GatewayProcess, id: &str) -> Value {
    receipt_as(gateway, TOKEN, id).await
}

/// A receipt, read with `token` (a key of its workspace with the receipts scope).
pub async fn receipt_as(gateway: &GatewayProcess, token: &str, id: &str) -> Value {
    let url = gateway.url.replace("/mcp", &format!("/v1/receipts/{id}"));
    let response = reqwest::Client::new()
        .get(url)
        .bearer_auth(token)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    response.json().await.unwrap()
}

const REFUND: &str = "stripe.create_refund";

#[tokio::test]
async fn a_replay_returns_the_stored_result_and_sends_nothing() {
    let vendor = MockVendor::start().await;
    let gateway = GatewayProcess::start(&GatewayConfig::new(&vendor.base_url()));
    let k = key("replay");
    let client = McpClient::with_key(&gateway.url, TOKEN, &k).await;
    let args = json!({"charge": "ch_42", "amount": 500});

    let first = client.call(REFUND, args.clone()).await.unwrap();
    let again = client.call(REFUND, args.clone()).await.unwrap();
    assert_eq!(
        vendor.count("/v1/refunds"),
        1,
        "the replay reached the vendor"
    );
    assert_eq!(first.content, again.content);
    assert_eq!(first.structured_content, again.structured_content);
    assert_eq!(first.is_error, again.is_error);
    assert_eq!(meta(&first)["replayed"], json!(false));
    assert_eq!(meta(&again)["replayed"], json!(true));
    assert_eq!(meta(&first)["idempotency_key"], json!(k));
    assert_eq!(meta(&first)["receipt_id"], meta(&again)["receipt_id"]);
    assert_eq!(meta(&first)["verification"], json!("verified"));
    // The key reached the vendor exactly as the EffectSpec propagates it.
    assert_eq!(vendor.seen()[0].header("idempotency-key"), Some(k.as_str()));

    // The receipt tells the truth and carries no arguments.
    let id = meta(&first)["receipt_id"].as_str().unwrap().to_owned();
    let receipt = receipt(&gateway, &id).await;
    assert_eq!(receipt["attempt_count"], json!(1));
    assert_eq!(receipt["outcome"], json!("accepted"));
    assert_eq!(receipt["evidence"], json!("gateway_observed"));
    assert_eq!(receipt["verification"], json!("verified"));
    assert_eq!(receipt["key_source"], json!("supplied"));
    assert_eq!(receipt["vendor_status"], json!(200));
    assert!(
        !receipt.to_string().contains("ch_42"),
        "raw arguments in the receipt: {receipt}"
    );

    // Different arguments under the same key: a conflict, nothing sent.
    let (code, _, data) = client
        .call_err(REFUND, json!({"charge": "ch_42", "amount": 501}))
        .await;
    assert_eq!(code, -32019);
    assert_eq!(
        data.as_ref().unwrap()["type"],
        json!("idempotency_conflict")
    );
    assert_eq!(data.unwrap()["idempotency_key"], json!(k));
    assert_eq!(vendor.count("/v1/refunds"), 1);

    // The same key on another tool is another slot.
    let list = client.call("stripe.charges.list", json!({})).await.unwrap();
    assert_eq!(list.is_error, Some(false));
    assert_eq!(vendor.count("/v1/charges"), 1);
    client.close().await;
}

#[tokio::test]
async fn key_order_and_whitespace_are_not_a_different_call() {
    let vendor = MockVendor::start().await;
    let gateway = GatewayProcess::start(&GatewayConfig::new(&vendor.base_url()));
    let raw = RawMcp::new(&gateway.url);
    let (session, _) = raw.initialize(TOKEN, "2025-11-25").await;
    let k = key("order");
    let call = |body: &'static str| {
        let (raw, session, k) = (&raw, session.clone(), k.clone());
        async move {
            raw.post(
                Some(TOKEN),
                Some(&session),
                body,
                &[("idempotency-key", k.as_str())],
            )
            .await
        }
    };
    let a = call(r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"stripe.create_refund","arguments":{"charge":"ch_7","amount":300}}}"#).await;
    let b = call(r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"stripe.create_refund","arguments":{ "amount" : 300 , "charge" : "ch_7" }}}"#).await;
    assert_eq!(vendor.count("/v1/refunds"), 1);
    assert_eq!(
        b.message()["result"]["_meta"]["obol"]["replayed"],
        json!(true),
        "{b:?}"
    );
    assert_eq!(a.header("idempotency-key"), Some(k.as_str()));
    assert_eq!(b.header("idempotency-key"), Some(k.as_str()));
}

#[tokio::test]
async fn a_minted_key_comes_back_so_the_client_can_retry() {
    let vendor = MockVendor::start().await;
    let gateway = GatewayProcess::start(&GatewayConfig::new(&vendor.base_url()));
    let raw = RawMcp::new(&gateway.url);
    let (session, _) = raw.initialize(TOKEN, "2025-11-25").await;
    let params = json!({"name": REFUND, "arguments": {"charge": "ch_9", "amount": 1}});
    let first = raw
        .request(TOKEN, &session, 1, "tools/call", params.clone())
        .await;
    let minted = first.header("idempotency-key").unwrap().to_owned();
    assert!(minted.starts_with("idt_"), "{minted}");
    assert_eq!(
        first.message()["result"]["_meta"]["obol"]["idempotency_key"],
        json!(minted)
    );
    let body = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": params});
    let retry = raw
        .post(
            Some(TOKEN),
            Some(&session),
            &body.to_string(),
            &[("idempotency-key", &minted)],
        )
        .await;
    assert_eq!(
        retry.message()["result"]["_meta"]["obol"]["replayed"],
        json!(true)
    );
    assert_eq!(vendor.count("/v1/refunds"), 1);
    let receipt = receipt(
        &gateway,
        first.message()["result"]["_meta"]["obol"]["receipt_id"]
            .as_str()
            .unwrap(),
    )
    .await;
    assert_eq!(receipt["key_source"], json!("minted"));
}

#[tokio::test]
async fn malformed_keys_are_refused_before_anything_is_written() {
    let vendor = MockVendor::start().await;
    let gateway = GatewayProcess::start(&GatewayConfig::new(&vendor.base_url()));
    let raw = RawMcp::new(&gateway.url);
    let (session, _) = raw.initialize(TOKEN, "2025-11-25").await;
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {"name": REFUND, "arguments": {"charge": "ch_1"}}})
    .to_string();
    for bad in [
        "nope",
        "idt_short",
        "idt_has space in it!!",
        &format!("idt_{}", "x".repeat(200)),
    ] {
        let r = raw
            .post(
                Some(TOKEN),
                Some(&session),
                &body,
                &[("idempotency-key", bad)],
            )
            .await;
        assert_invalid_key(&r, bad);
    }
    // Given twice.
    let bearer = format!("Bearer {TOKEN}");
    let twice = raw
        .post_exact(
            &[
                ("authorization", bearer.as_str()),
                ("mcp-session-id", session.as_str()),
                ("accept", "text/event-stream"),
                ("content-type", "application/json"),
                ("idempotency-key", "idt_aaaaaaaaaaaaaaaaaaaa"),
                ("idempotency-key", "idt_bbbbbbbbbbbbbbbbbbbb"),
            ],
            &body,
        )
        .await;
    assert_invalid_key(&twice, "twice");
    assert!(vendor.seen().is_empty());
    assert!(
        crate::lifecycle::receipts(&gateway, TOKEN).await.is_empty(),
        "a refused key left a receipt"
    );
}

fn assert_invalid_key(r: &RawResponse, what: &str) {
    assert_eq!(r.status, 400, "{what}: {r:?}");
    assert_eq!(r.error_type(), "invalid_idempotency_key", "{what}: {r:?}");
}

/// Fires `n` identical calls at once and returns how many succeeded and how many were told
/// `not_ready`; anything else fails the test.
pub async fn storm(urls: &[String], k: &str, n: usize) -> (usize, usize) {
    let mut clients = Vec::new();
    for i in 0..4 {
        clients.push(std::sync::Arc::new(
            McpClient::with_key(&urls[i % urls.len()], TOKEN, k).await,
        ));
    }
    let calls: Vec<_> = (0..n)
        .map(|i| {
            let client = std::sync::Arc::clone(&clients[i % clients.len()]);
            tokio::spawn(async move {
                client
                    .call(REFUND, json!({"charge": "ch_storm", "amount": 100}))
                    .await
            })
        })
        .collect();
    let (mut ok, mut not_ready) = (0, 0);
    for call in calls {
        match call.await.unwrap() {
            Ok(result) => {
                assert_eq!(result.is_error, Some(false), "{result:?}");
                ok += 1;
            }
            Err(rmcp::ServiceError::McpError(e))
                if e.code.0 == -32000
                    && e.data
                        .as_ref()
                        .is_some_and(|d| d["type"] == json!("not_ready")) =>
            {
                not_ready += 1
            }
            Err(other) => panic!("unexpected answer in the storm: {other:?}"),
        }
    }
    (ok, not_ready)
}

#[tokio::test]
async fn a_hundred_concurrent_identical_calls_send_once() {
    let vendor = MockVendor::start().await;
    // Slow enough that every call arrives while the first is in flight.
    vendor.on(
        "/v1/refunds",
        Reply::json(200, json!({"id": "re_storm", "object": "refund", "amount": 100, "charge": "ch_storm", "status": "succeeded"}))
            .after(Duration::from_millis(300)),
    );
    let gateway = GatewayProcess::start(&GatewayConfig::new(&vendor.base_url()));
    let (ok, not_ready) = storm(std::slice::from_ref(&gateway.url), &key("storm"), 100).await;
    assert_eq!(vendor.count("/v1/refunds"), 1);
    assert_eq!(ok + not_ready, 100);
    assert!(ok >= 1);
}

#[tokio::test]
async fn retries_happen_only_when_the_spec_allows_them() {
    let vendor = MockVendor::start().await;
    let gateway = GatewayProcess::start(&GatewayConfig::new(&vendor.base_url()));
    let client = McpClient::connect(&gateway.url, TOKEN).await;

    // 503 is retryable; create_refund propagates the key (a vendor binding): one more attempt.
    vendor.on(
        "/v1/refunds",
        Reply::json(503, json!({"error": {"message": "busy"}})),
    );
    let refund = client
        .call(REFUND, json!({"charge": "ch_r", "amount": 5}))
        .await
        .unwrap();
    assert_eq!(vendor.count("/v1/refunds"), 2);
    assert_eq!(meta(&refund)["attempt_count"], json!(2));
    assert_eq!(meta(&refund)["outcome"], json!("unknown"));
    assert_eq!(refund.is_error, Some(true), "unknown is never success");
    let seen = vendor.seen();
    assert_eq!(
        seen[0].header("idempotency-key"),
        seen[1].header("idempotency-key")
    );

    // tracker.issues.create cannot propagate a key: no retry.
    vendor.on(
        "/repos/acme/app/issues",
        Reply::json(503, json!({"message": "busy"})),
    );
    let issue = client
        .call("tracker.issues.create", json!({"title": "t"}))
        .await
        .unwrap();
    assert_eq!(vendor.count("/repos/acme/app/issues"), 1);
    assert_eq!(meta(&issue)["attempt_count"], json!(1));
    client.close().await;
}

#[tokio::test]
async fn a_post_send_timeout_is_unknown_and_resent_only_with_a_binding() {
    let vendor = MockVendor::start().await;
    let gateway = GatewayProcess::start(&GatewayConfig::new(&vendor.base_url()));
    // Longer than the test config's 1.5 s request timeout.
    let slow = |status: u16, body: Value| Reply::json(status, body).after(Duration::from_secs(3));

    // With a binding: the later same-key call resends, carrying the same key.
    vendor.on("/v1/refunds", slow(200, json!({"id": "re_t", "object": "refund", "amount": 5, "charge": "ch_t", "status": "succeeded"})));
    let k = key("timeout");
    let client = McpClient::with_key(&gateway.url, TOKEN, &k).await;
    let args = json!({"charge": "ch_t", "amount": 5});
    let (code, _, data) = client.call_err(REFUND, args.clone()).await;
    assert_eq!(code, -32019, "{data:?}");
    let data = data.unwrap();
    assert_eq!(data["type"], json!("upstream_timeout"));
    let receipt_id = data["receipt_id"].as_str().unwrap().to_owned();
    let first = receipt(&gateway, &receipt_id).await;
    assert_eq!(
        (first["attempt_count"].clone(), first["outcome"].clone()),
        (json!(1), json!("unknown"))
    );
    assert_eq!(first["verification"], json!("inconclusive"));
    vendor.on("/v1/refunds", Reply::json(200, json!({"id": "re_t", "object": "refund", "amount": 5, "charge": "ch_t", "status": "succeeded"})));
    let resent = client.call(REFUND, args).await.unwrap();
    assert_eq!(resent.is_error, Some(false));
    assert_eq!(vendor.count("/v1/refunds"), 2);
    let seen = vendor.seen();
    assert!(
        seen.iter()
            .all(|s| s.header("idempotency-key") == Some(k.as_str()))
    );
    assert_eq!(meta(&resent)["attempt_count"], json!(2));

    // Without a binding: the stored unknown comes back and nothing is resent.
    vendor.on(
        "/repos/acme/app/issues",
        slow(
            201,
            json!({"number": 1, "title": "t", "state": "open", "url": "u"}),
        ),
    );
    let k = key("timeout_unbound");
    let tracker = McpClient::with_key(&gateway.url, TOKEN, &k).await;
    let (code, _, data) = tracker
        .call_err("tracker.issues.create", json!({"title": "t"}))
        .await;
    assert_eq!(code, -32019);
    assert_eq!(data.unwrap()["type"], json!("upstream_timeout"));
    let (code, _, data) = tracker
        .call_err("tracker.issues.create", json!({"title": "t"}))
        .await;
    assert_eq!(code, -32019, "the stored unknown is replayed");
    assert_eq!(data.unwrap()["type"], json!("upstream_timeout"));
    assert_eq!(vendor.count("/repos/acme/app/issues"), 1);
}

#[tokio::test]
async fn an_unrecorded_outcome_is_not_exposed_and_not_redispatched() {
    let vendor = MockVendor::start().await;
    let mut config = GatewayConfig::new(&vendor.base_url());
    config
        .env
        .push(("OBOL_FAILPOINTS".into(), "store-finalize".into()));
    let gateway = GatewayProcess::start(&config);
    let k = key("audit");
    let client = McpClient::with_key(&gateway.url, TOKEN, &k).await;
    let args = json!({"title": "audit"});
    for _ in 0..2 {
        let (code, _, data) = client.call_err("tracker.issues.create", args.clone()).await;
        assert_eq!(code, -32000, "{data:?}");
        let data = data.unwrap();
        assert_eq!(data["type"], json!("not_ready"));
        assert_eq!(data["retryable"], json!(true));
    }
    assert_eq!(
        vendor.count("/repos/acme/app/issues"),
        1,
        "a duplicate redispatched"
    );
}

#[tokio::test]
async fn a_gateway_killed_mid_call_never_sends_twice() {
    for (failpoint, sent_before_kill) in [("hang-before-send", 0), ("hang-after-send", 1)] {
        let vendor = MockVendor::start().await;
        let mut config = GatewayConfig::new(&vendor.base_url());
        // The shortest lease the config accepts: 2 x (1.5 s request timeout + 0.5 s deadline).
        let lease = "lease_ms = 4000";
        config.env = vec![("OBOL_FAILPOINTS".into(), failpoint.into())];
        let dir = tempfile::tempdir().unwrap();
        config.store = Some(format!(
            "path = {:?}\n{lease}",
            dir.path().join("state.redb")
        ));
        let gateway = GatewayProcess::start_in(&config, dir);
        let k = key("crash");
        let client = McpClient::with_key(&gateway.url, TOKEN, &k).await;
        let args = json!({"title": "crash"});
        let pending = tokio::spawn({
            let args = args.clone();
            async move { client.call("tracker.issues.create", args).await }
        });
        gateway
            .wait_for_log(&format!("failpoint {failpoint}"))
            .await;
        let dir = gateway.kill();
        pending.abort();
        assert_eq!(
            vendor.count("/repos/acme/app/issues"),
            sent_before_kill,
            "{failpoint}"
        );

        // Restart on the same state, without the failpoint.
        config.env.clear();
        let restarted = GatewayProcess::start_in(&config, dir);
        let client = McpClient::with_key(&restarted.url, TOKEN, &k).await;
        // While the dead holder's lease runs, the slot is in flight.
        let (code, _, data) = client.call_err("tracker.issues.create", args.clone()).await;
        assert_eq!(code, -32000, "{failpoint}");
        assert_eq!(data.unwrap()["type"], json!("not_ready"), "{failpoint}");
        tokio::time::sleep(Duration::from_millis(4100)).await;
        // Then it is finalized unknown: the tool has no vendor binding, so nothing is resent.
        let (code, _, data) = client.call_err("tracker.issues.create", args.clone()).await;
        assert_eq!(code, -32019, "{failpoint}: {data:?}");
        let data = data.unwrap();
        assert_eq!(data["type"], json!("upstream_timeout"), "{failpoint}");
        let receipt = receipt(&restarted, data["receipt_id"].as_str().unwrap()).await;
        assert_eq!(receipt["outcome"], json!("unknown"));
        assert_eq!(receipt["attempt_count"], json!(1));
        assert_eq!(
            vendor.count("/repos/acme/app/issues"),
            sent_before_kill,
            "{failpoint}: sent twice"
        );
    }
}

#[tokio::test]
async fn obol_receipts_reads_them_as_the_owner() {
    let vendor = MockVendor::start().await;
    let gateway = GatewayProcess::start(&GatewayConfig::new(&vendor.base_url()));
    let client = McpClient::connect(&gateway.url, TOKEN).await;
    let result = client
        .call("stripe.charges.list", json!({"limit": 1}))
        .await
        .unwrap();
    let id = meta(&result)["receipt_id"].as_str().unwrap().to_owned();
    let base = gateway.url.trim_end_matches("/mcp").to_owned();
    let run = |args: Vec<String>| {
        tokio::task::spawn_blocking(move || {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            crate::support::gateway::run_obol(&args)
        })
    };
    let (code, out, err) = run(vec![
        "receipts".into(),
        "--url".into(),
        base.clone(),
        "--key".into(),
        TOKEN.into(),
    ])
    .await
    .unwrap();
    assert_eq!(code, 0, "{err}");
    assert!(out.contains(&id), "{out}");
    let (code, out, _) = run(vec![
        "receipts".into(),
        "--url".into(),
        base.clone(),
        "--key".into(),
        TOKEN.into(),
        id.clone(),
    ])
    .await
    .unwrap();
    assert_eq!(code, 0);
    let shown: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(shown["tool"], json!("stripe.charges.list"));
    // Another workspace's key sees nothing.
    let (code, _, _) = run(vec![
        "receipts".into(),
        "--url".into(),
        base,
        "--key".into(),
        "obk_test_globex".into(),
        id,
    ])
    .await
    .unwrap();
    assert_eq!(code, 1);
}

#[tokio::test]
async fn an_unreachable_vendor_leaves_the_key_reusable_and_no_phantom_receipt() {
    // Nothing listens on the discard port: connections are refused, so nothing is sent.
    let gateway = GatewayProcess::start(&GatewayConfig::new("http://127.0.0.1:9"));
    let k = key("refused");
    let client = McpClient::with_key(&gateway.url, TOKEN, &k).await;
    for _ in 0..2 {
        let (code, _, data) = client
            .call_err(REFUND, json!({"charge": "ch_1", "amount": 1}))
            .await;
        let data = data.unwrap();
        assert_eq!(code, -32000, "{data}");
        assert_eq!(data["type"], json!("upstream_unreachable"));
        assert_eq!(data["retryable"], json!(true));
        assert_eq!(data["idempotency_key"], json!(k));
        assert!(
            data.get("receipt_id").is_none(),
            "no receipt exists: {data}"
        );
    }
}
