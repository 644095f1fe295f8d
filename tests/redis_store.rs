//! The Redis backend against a real redis-server: the store contract, gateways sharing one
//! Redis, Redis restarts and outages.

use std::time::Duration;

use serde_json::{Value, json};

use crate::idempotency::{key, meta, storm};
use crate::support::{
    GatewayConfig, GatewayProcess, McpClient, MockVendor, RedisCluster, RedisServer, Reply, TOKEN,
};

fn on_redis(vendor: &MockVendor, redis: &RedisServer) -> GatewayConfig {
    let mut config = GatewayConfig::new(&vendor.base_url());
    config.store = Some(format!("redis_url = {:?}", redis.url()));
    config
}

/// The tracker's answer to an issue creation, `ms` late.
fn issue_after(ms: u64) -> Reply {
    let issue = json!({"number": 1, "title": "t", "state": "open", "url": "u"});
    Reply::json(201, issue).after(Duration::from_millis(ms))
}

/// Creates an issue until the gateway serves it (Redis settings put right, a replica's first
/// sync done), for at most `seconds`.
async fn served_within(client: &McpClient, gateway: &GatewayProcess, args: Value, seconds: u64) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(seconds);
    while client
        .call("tracker.issues.create", args.clone())
        .await
        .is_err()
    {
        assert!(tokio::time::Instant::now() < deadline, "{}", gateway.log());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_redis_store_keeps_the_contract() {
    let redis = RedisServer::start();
    let store = obol::store::RedisStore::connect(&redis.url()).await;
    obol::store::contract::run(&obol::store::Store::Redis(store.unwrap())).await;
}

#[tokio::test]
async fn two_gateways_sharing_redis_send_once() {
    let redis = RedisServer::start();
    let vendor = MockVendor::start().await;
    vendor.on(
        "/v1/refunds",
        Reply::json(200, json!({"id": "re_s", "object": "refund", "amount": 100, "charge": "ch_storm", "status": "succeeded"}))
            .after(Duration::from_millis(300)),
    );
    let config = on_redis(&vendor, &redis);
    let a = GatewayProcess::start(&config);
    let b = GatewayProcess::start(&config);
    let (ok, not_ready) = storm(&[a.url.clone(), b.url.clone()], &key("shared"), 100).await;
    assert_eq!(vendor.count("/v1/refunds"), 1);
    assert_eq!(ok + not_ready, 100);
}

#[tokio::test]
async fn a_claim_survives_a_redis_restart() {
    let mut redis = RedisServer::start();
    let vendor = MockVendor::start().await;
    let gateway = GatewayProcess::start(&on_redis(&vendor, &redis));
    let k = key("restart");
    let client = McpClient::with_key(&gateway.url, TOKEN, &k).await;
    let args = json!({"title": "once"});
    let first = client
        .call("tracker.issues.create", args.clone())
        .await
        .unwrap();
    assert_eq!(vendor.count("/repos/acme/app/issues"), 1);

    redis.restart(); // SIGKILL and start again from the append-only file
    // The connection comes back; the claim is still there, so the call is a replay.
    let mut again = None;
    for _ in 0..50 {
        match client.call("tracker.issues.create", args.clone()).await {
            Ok(result) => {
                again = Some(result);
                break;
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
    let again = again.expect("the gateway reconnected to Redis");
    assert_eq!(meta(&again)["replayed"], json!(true));
    assert_eq!(again.structured_content, first.structured_content);
    assert_eq!(
        vendor.count("/repos/acme/app/issues"),
        1,
        "redispatched after a Redis restart"
    );
}

/// A restarted server has forgotten every script: a new call's claim and final write load
/// them again and land, and the final write drops the call's lease index entry (a stale entry
/// would be swept as a dead holder's).
#[tokio::test]
async fn after_a_restart_calls_load_the_scripts_again() {
    let mut redis = RedisServer::start();
    let vendor = MockVendor::start().await;
    let gateway = GatewayProcess::start(&on_redis(&vendor, &redis));
    let client = McpClient::with_key(&gateway.url, TOKEN, &key("scripts-1")).await;
    client
        .call("tracker.issues.create", json!({"title": "before"}))
        .await
        .unwrap();
    redis.restart();
    let client = McpClient::with_key(&gateway.url, TOKEN, &key("scripts-2")).await;
    let mut landed = None;
    for _ in 0..50 {
        match client
            .call("tracker.issues.create", json!({"title": "after"}))
            .await
        {
            Ok(result) => {
                landed = Some(result);
                break;
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
    let landed = landed.expect("a call after the restart lands");
    assert_eq!(meta(&landed)["replayed"], json!(false));
    assert_eq!(meta(&landed)["outcome"], json!("accepted"));
    let mut connection = redis::Client::open(redis.url())
        .unwrap()
        .get_connection()
        .unwrap();
    let leases: usize = redis::cmd("ZCARD")
        .arg("obol:leases")
        .query(&mut connection)
        .unwrap();
    assert_eq!(leases, 0, "a finished call left its lease index entry");
}

#[tokio::test]
async fn redis_down_fails_closed() {
    let mut redis = RedisServer::start();
    let vendor = MockVendor::start().await;
    let gateway = GatewayProcess::start(&on_redis(&vendor, &redis));
    let client = McpClient::connect(&gateway.url, TOKEN).await;

    // Down before the claim: nothing is sent.
    redis.stop();
    let (code, _, data) = client
        .call_err("tracker.issues.create", json!({"title": "x"}))
        .await;
    assert_eq!(code, -32000, "{data:?}");
    let data = data.unwrap();
    assert_eq!(data["type"], json!("store_unavailable"));
    assert_eq!(data["retryable"], json!(true));
    assert_eq!(vendor.count("/repos/acme/app/issues"), 0);

    // Down while the vendor is answering: the outcome is not exposed (not_ready).
    redis.restart();
    vendor.on("/repos/acme/app/issues", issue_after(800));
    let k = key("midcall");
    let keyed = McpClient::with_key(&gateway.url, TOKEN, &k).await;
    let call = tokio::spawn(async move {
        keyed
            .call_err("tracker.issues.create", json!({"title": "y"}))
            .await
    });
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while vendor.count("/repos/acme/app/issues") == 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the call never reached the vendor"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    redis.stop();
    let (code, _, data) = call.await.unwrap();
    assert_eq!(code, -32000, "{data:?}");
    assert_eq!(data.unwrap()["type"], json!("not_ready"));
    assert_eq!(vendor.count("/repos/acme/app/issues"), 1);
}

/// Bug 11 on Redis: a dead holder that nobody retries (the client never learned its minted
/// key) is settled by the sweeper of a gateway sharing the store, with a receipt.
#[tokio::test]
async fn a_dead_holder_nobody_retries_is_settled_with_a_receipt() {
    let redis = RedisServer::start();
    let vendor = MockVendor::start().await;
    let mut config = on_redis(&vendor, &redis);
    config.store = Some(format!("redis_url = {:?}\nlease_ms = 4000", redis.url()));
    let mut dying = config.clone();
    dying.env = vec![("OBOL_FAILPOINTS".into(), "hang-after-send".into())];
    let gateway = GatewayProcess::start(&dying);
    let client = McpClient::connect(&gateway.url, TOKEN).await;
    let pending = tokio::spawn(async move {
        client
            .call("tracker.issues.create", json!({"title": "orphan"}))
            .await
    });
    gateway.wait_for_log("failpoint hang-after-send").await;
    drop(gateway.kill());
    pending.abort();
    let survivor = GatewayProcess::start(&config);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(12);
    let receipt = loop {
        let listed = crate::lifecycle::receipts(&survivor, TOKEN).await;
        if let Some(found) = listed
            .iter()
            .find(|r| r["tool"] == json!("tracker.issues.create"))
        {
            break found.clone();
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no receipt: {listed:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(receipt["outcome"], json!("unknown"));
    assert_eq!(receipt["attempt_count"], json!(1));
    assert_eq!(receipt["key_source"], json!("minted"));
    assert_eq!(vendor.count("/repos/acme/app/issues"), 1);
}

/// Issue 9: a Redis that would lose acknowledged claims (no fsync per write, or evicting keys
/// with a TTL, as every claim has) is refused at start, naming the setting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_that_could_lose_claims_is_refused_at_start() {
    let redis = RedisServer::start();
    let vendor = MockVendor::start().await;
    let config = on_redis(&vendor, &redis);
    let set = |setting: &str, value: &str| {
        let client = redis::Client::open(redis.url()).unwrap();
        let mut connection = client.get_connection().unwrap();
        let _: () = redis::cmd("CONFIG")
            .arg("SET")
            .arg(setting)
            .arg(value)
            .query(&mut connection)
            .unwrap();
    };
    for (setting, unsafe_value, safe_value) in [
        ("appendfsync", "everysec", "always"),
        ("maxmemory-policy", "volatile-lru", "noeviction"),
        ("appendonly", "no", "yes"),
    ] {
        set(setting, unsafe_value);
        let said = tokio::task::block_in_place(|| config.refused());
        assert!(
            said.contains(setting) && said.contains(unsafe_value),
            "{setting}: {said}"
        );
        set(setting, safe_value);
    }
    // Safe again: it serves.
    let gateway = GatewayProcess::start(&config);
    let client = McpClient::connect(&gateway.url, TOKEN).await;
    assert!(!client.tool_names().await.is_empty());
    // Made unsafe while serving (as a restart with other settings would): claims fail closed
    // once the next check (every 2 s) sees it, and resume when it is fixed.
    set("appendfsync", "everysec");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(8);
    loop {
        match client
            .call("tracker.issues.create", json!({"title": "unsafe"}))
            .await
        {
            Err(rmcp::ServiceError::McpError(error))
                if error.data.as_ref().map(|d| d["type"].clone())
                    == Some(json!("store_unavailable")) =>
            {
                break;
            }
            _ => {
                assert!(tokio::time::Instant::now() < deadline, "{}", gateway.log());
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
    let sent = vendor.count("/repos/acme/app/issues");
    let (_, _, data) = client
        .call_err("tracker.issues.create", json!({"title": "still unsafe"}))
        .await;
    assert_eq!(data.unwrap()["type"], json!("store_unavailable"));
    assert_eq!(vendor.count("/repos/acme/app/issues"), sent);
    assert!(gateway.log().contains("appendfsync"));
    set("appendfsync", "always");
    served_within(&client, &gateway, json!({"title": "safe again"}), 8).await;
}

/// Issue 9: the retention is one policy, the same on Redis as embedded (the contract's
/// retention case, with a one-second retention).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_redis_store_keeps_the_retention_policy() {
    let redis = RedisServer::start();
    let store = obol::store::Store::Redis(
        obol::store::RedisStore::connect(&redis.url())
            .await
            .unwrap()
            .with_retention(Duration::from_secs(1)),
    );
    obol::store::contract::retention_is_one_policy(&store).await;
}

/// Issue 9: with `redis_replicas = 1`, a claim counts only once a replica acknowledged it:
/// without the replica the call fails closed and nothing reaches the vendor; with it back,
/// calls go through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_wait_for_a_replica_to_acknowledge_them() {
    let primary = RedisServer::start();
    let mut replica = RedisServer::replica_of(&primary);
    let vendor = MockVendor::start().await;
    let mut config = on_redis(&vendor, &primary);
    config.store = Some(format!(
        "redis_url = {:?}\nredis_replicas = 1\nredis_replica_timeout_ms = 300",
        primary.url()
    ));
    let gateway = GatewayProcess::start(&config);
    let client = McpClient::connect(&gateway.url, TOKEN).await;
    // The replica syncs first; then calls go through.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        match client.call("stripe.charges.list", json!({})).await {
            Ok(result) if result.is_error == Some(false) => break,
            _ => {
                assert!(tokio::time::Instant::now() < deadline, "{}", gateway.log());
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
    let sent = vendor.count("/repos/acme/app/issues");
    replica.stop();
    let k = key("replicated");
    let keyed = McpClient::with_key(&gateway.url, TOKEN, &k).await;
    let args = json!({"title": "unacknowledged"});
    let (code, _, data) = keyed.call_err("tracker.issues.create", args.clone()).await;
    let data = data.unwrap();
    assert_eq!(
        (code, data["type"].clone()),
        (-32000, json!("store_unavailable"))
    );
    assert_eq!(
        vendor.count("/repos/acme/app/issues"),
        sent,
        "sent without acknowledgement"
    );
    assert!(gateway.log().contains("replicas did not acknowledge"));
    // The replica is back: the same key goes through once, and the attempt that was never
    // sent was released, not counted.
    replica.restart();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let done = loop {
        match keyed.call("tracker.issues.create", args.clone()).await {
            Ok(result) => break result,
            Err(_) => {
                assert!(tokio::time::Instant::now() < deadline, "{}", gateway.log());
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    };
    assert_eq!(done.is_error, Some(false));
    assert_eq!(meta(&done)["attempt_count"], json!(1));
    assert_eq!(vendor.count("/repos/acme/app/issues"), sent + 1);
}

/// Issue 9, failover: every claim a replica acknowledged survives the primary's loss. Calls
/// made on the primary are replayed by a gateway on the promoted replica; none reaches the
/// vendor twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_claims_survive_a_failover() {
    let mut primary = RedisServer::start();
    let replica = RedisServer::replica_of(&primary);
    let vendor = MockVendor::start().await;
    let mut config = on_redis(&vendor, &primary);
    config.store = Some(format!(
        "redis_url = {:?}\nredis_replicas = 1\nredis_replica_timeout_ms = 1000",
        primary.url()
    ));
    let gateway = GatewayProcess::start(&config);
    let keys: Vec<String> = (0..20).map(|n| key(&format!("failover{n:02}"))).collect();
    let args = json!({"title": "failover"});
    for k in &keys {
        let client = McpClient::with_key(&gateway.url, TOKEN, k).await;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        // The first calls may wait for the replica's initial sync.
        loop {
            match client.call("tracker.issues.create", args.clone()).await {
                Ok(done) => {
                    assert_eq!(meta(&done)["replayed"], json!(false));
                    break;
                }
                Err(_) => {
                    assert!(tokio::time::Instant::now() < deadline, "{}", gateway.log());
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        }
    }
    assert_eq!(vendor.count("/repos/acme/app/issues"), 20);
    // The primary dies; the replica is promoted, and a gateway serves from it.
    drop(gateway);
    primary.stop();
    replica.promote();
    let promoted = on_redis(&vendor, &replica);
    let gateway = GatewayProcess::start(&promoted);
    for k in &keys {
        let client = McpClient::with_key(&gateway.url, TOKEN, k).await;
        let again = client
            .call("tracker.issues.create", args.clone())
            .await
            .unwrap();
        assert_eq!(meta(&again)["replayed"], json!(true), "{k} was lost");
    }
    assert_eq!(
        vendor.count("/repos/acme/app/issues"),
        20,
        "a key reached the vendor twice"
    );
}

/// Issue 9, failover with calls on the wire: the primary dies while calls are in flight.
/// Those calls finish or fail closed; once the replica is promoted, a gateway serving from it
/// settles every key (a replay, a fresh send of a claim that never counted, or `unknown`,
/// never resent), and no key reaches the vendor twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_in_flight_during_a_failover_fail_closed_and_recover() {
    let mut primary = RedisServer::start();
    let replica = RedisServer::replica_of(&primary);
    let vendor = MockVendor::start().await;
    vendor.on("/repos/acme/app/issues", issue_after(600));
    let replicated = |redis: &RedisServer| {
        let mut config = on_redis(&vendor, redis);
        config.store = Some(format!(
            "redis_url = {:?}\nredis_replicas = 1\nredis_replica_timeout_ms = 1000\nlease_ms = 4000",
            redis.url()
        ));
        config
    };
    let gateway = GatewayProcess::start(&replicated(&primary));
    // The replica's initial sync is done once a first call is acknowledged.
    let warm = McpClient::with_key(&gateway.url, TOKEN, &key("warmup")).await;
    served_within(&warm, &gateway, json!({"title": "warmup"}), 10).await;
    let keys: Vec<String> = (0..8).map(|n| key(&format!("inflight{n}"))).collect();
    let create = |n: usize| json!({"title": format!("inflight{n}")});
    // Half the keys finish before the switch.
    let mut finished = Vec::new();
    for (n, k) in keys.iter().enumerate().take(4) {
        let client = McpClient::with_key(&gateway.url, TOKEN, k).await;
        let done = client
            .call("tracker.issues.create", create(n))
            .await
            .unwrap();
        assert_eq!(done.is_error, Some(false));
        finished.push(n);
    }
    // The other half is on the wire when the primary dies.
    let sent = vendor.count("/repos/acme/app/issues");
    let mut calls = Vec::new();
    for (n, k) in keys.iter().enumerate().skip(4) {
        let client = McpClient::with_key(&gateway.url, TOKEN, k).await;
        calls.push(tokio::spawn(async move {
            client.call("tracker.issues.create", create(n)).await
        }));
    }
    while vendor.count("/repos/acme/app/issues") < sent + 4 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    primary.stop();
    // Their outcomes cannot be acknowledged: each fails closed, none reports a success the
    // promoted replica could lack.
    for call in calls {
        let answer = call.await.unwrap();
        assert!(
            !matches!(&answer, Ok(done) if done.is_error == Some(false)),
            "{answer:?}"
        );
    }
    replica.promote();
    let promoted = GatewayProcess::start(&on_redis(&vendor, &replica));
    for (n, k) in keys.iter().enumerate() {
        let client = McpClient::with_key(&promoted.url, TOKEN, k).await;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        let settled = loop {
            match client.call("tracker.issues.create", create(n)).await {
                Ok(done) => break Some(done),
                // A claim whose holder died mid-call waits out its lease, then settles.
                Err(rmcp::ServiceError::McpError(e))
                    if e.data.as_ref().is_some_and(|d| {
                        d["type"] == json!("not_ready") || d["type"] == json!("store_unavailable")
                    }) =>
                {
                    assert!(tokio::time::Instant::now() < deadline, "{}", promoted.log());
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
                // Settled without a known outcome: replayed as an error, never resent.
                Err(rmcp::ServiceError::McpError(_)) => break None,
                Err(other) => panic!("{k}: {other:?}\n{}", promoted.log()),
            }
        };
        if finished.contains(&n) {
            let replayed = settled.as_ref().map(|done| meta(done)["replayed"].clone());
            assert_eq!(
                replayed,
                Some(json!(true)),
                "{k}: an acknowledged outcome was lost"
            );
        }
        let sent = vendor
            .seen()
            .iter()
            .filter(|s| s.body_text().contains(&format!("\"inflight{n}\"")))
            .count();
        assert!(sent <= 1, "{k} reached the vendor {sent} times");
    }
}

/// Issue 9: a write can reach Redis twice (its reply lost, the command sent again, as the
/// cluster client does after a dropped connection). Every script recognises its own earlier
/// write by its write id, never as a rival's: the call is sent once, answers, and replays.
#[tokio::test]
async fn a_resent_write_is_recognised_as_its_own() {
    let redis = RedisServer::start();
    let vendor = MockVendor::start().await;
    vendor.on(
        "/v1/refunds",
        Reply::json(200, json!({"id": "re_r", "object": "refund", "amount": 7, "charge": "ch_r", "status": "succeeded"})),
    );
    let mut config = on_redis(&vendor, &redis);
    config.env = vec![("OBOL_FAILPOINTS".into(), "redis_resend".into())];
    let gateway = GatewayProcess::start(&config);
    let client = McpClient::with_key(&gateway.url, TOKEN, &key("resend")).await;
    let args = json!({"charge": "ch_r", "amount": 7});
    let first = client
        .call("stripe.create_refund", args.clone())
        .await
        .unwrap_or_else(|e| panic!("{e:?}\n{}", gateway.log()));
    assert_eq!(first.is_error, Some(false));
    assert_eq!(meta(&first)["attempt_count"], json!(1));
    let again = client.call("stripe.create_refund", args).await.unwrap();
    assert_eq!(meta(&again)["replayed"], json!(true));
    assert_eq!(vendor.count("/v1/refunds"), 1);
}

/// Issue 9: leases are judged on Redis's clock. A gateway whose clock runs a minute ahead
/// (more than a lease) does not take a live call of another gateway for a dead one, so the
/// call is not sent a second time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_with_a_skewed_clock_does_not_kill_a_live_call() {
    let redis = RedisServer::start();
    let vendor = MockVendor::start().await;
    vendor.on(
        "/v1/refunds",
        Reply::json(200, json!({"id": "re_s", "object": "refund", "amount": 5, "charge": "ch_s", "status": "succeeded"}))
            .after(Duration::from_millis(1200)),
    );
    let config = on_redis(&vendor, &redis);
    let mut ahead = config.clone();
    ahead.env = vec![("OBOL_CLOCK_OFFSET_MS".into(), "60000".into())];
    let (a, b) = (
        GatewayProcess::start(&config),
        GatewayProcess::start(&ahead),
    );
    let k = key("skew");
    let args = json!({"charge": "ch_s", "amount": 5});
    let first = McpClient::with_key(&a.url, TOKEN, &k).await;
    let pending = tokio::spawn({
        let args = args.clone();
        async move { first.call("stripe.create_refund", args).await }
    });
    while vendor.count("/v1/refunds") == 0 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // While A's call is on the wire, B (a minute ahead) sees the same slot.
    let second = McpClient::with_key(&b.url, TOKEN, &k).await;
    let (code, _, data) = second.call_err("stripe.create_refund", args.clone()).await;
    let data = data.unwrap();
    assert_eq!(
        (code, data["type"].clone()),
        (-32000, json!("not_ready")),
        "{data}"
    );
    let done = pending.await.unwrap().unwrap();
    assert_eq!(done.is_error, Some(false));
    let replay = second.call("stripe.create_refund", args).await.unwrap();
    assert_eq!(meta(&replay)["replayed"], json!(true));
    assert_eq!(vendor.count("/v1/refunds"), 1, "a live call was sent again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_redis_cluster_store_keeps_the_contract() {
    let cluster = RedisCluster::start();
    let store = obol::store::RedisStore::connect_cluster(&cluster.urls()).await;
    obol::store::contract::run(&obol::store::Store::Redis(store.unwrap())).await;
}

/// Issue 9, Redis Cluster: identical calls through two gateways on a three-primary cluster,
/// while the claim's slot migrates to another primary with the first call on the wire (calls
/// arriving before, during and after the move), reach the vendor exactly once; retries after
/// the move replay from the new owner.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_sends_once_through_a_slot_migration() {
    let cluster = std::sync::Arc::new(RedisCluster::start());
    let vendor = MockVendor::start().await;
    vendor.on(
        "/v1/refunds",
        Reply::json(200, json!({"id": "re_s", "object": "refund", "amount": 100, "charge": "ch_storm", "status": "succeeded"}))
            // The first call's finalize lands while its slot is moving (multi-key scripts
            // get TRYAGAIN until the move ends, and the client waits it out).
            .after(Duration::from_millis(300)),
    );
    let mut config = GatewayConfig::new(&vendor.base_url());
    config.store = Some(format!("redis_cluster = {:?}", cluster.urls()));
    let (a, b) = (
        GatewayProcess::start(&config),
        GatewayProcess::start(&config),
    );
    let urls = [a.url.clone(), b.url.clone()];
    let k = key("cluster");
    let before = tokio::spawn({
        let (urls, k) = (urls.clone(), k.clone());
        async move { storm(&urls, &k, 40).await }
    });
    while vendor.count("/v1/refunds") == 0 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let slot = cluster
        .slot_of("obol:*:claim")
        .expect("the claim is stored");
    let to = (cluster.owner(slot) + 1) % 3;
    let moving = tokio::task::spawn_blocking({
        let cluster = std::sync::Arc::clone(&cluster);
        move || cluster.migrate_slot(slot, to, Duration::from_millis(50))
    });
    // A storm that panics shows both gateways' logs (the store error behind an answer).
    let logs = |panic: tokio::task::JoinError| -> (usize, usize) {
        panic!("{panic}\n{}\n{}", a.log(), b.log())
    };
    let during = tokio::spawn({
        let (urls, k) = (urls.clone(), k.clone());
        async move { storm(&urls, &k, 40).await }
    })
    .await
    .unwrap_or_else(logs);
    moving.await.unwrap();
    let before = before.await.unwrap_or_else(logs);
    let after = tokio::spawn({
        let (urls, k) = (urls.clone(), k.clone());
        async move { storm(&urls, &k, 20).await }
    })
    .await
    .unwrap_or_else(logs);
    assert_eq!(cluster.owner(slot), to, "the slot moved");
    assert_eq!(vendor.count("/v1/refunds"), 1, "{}\n{}", a.log(), b.log());
    assert_eq!(before.0 + before.1 + during.0 + during.1, 80);
    assert_eq!(after, (20, 0), "every retry after the move replays");
}

/// A call on a lane talks to Redis over the lane's own connection, which the lane drives: it
/// is answered while the only worker of the runtime that opened the store is blocked, where a
/// round trip over the shared connection would wait for that worker (ADR-0057).
#[test]
fn a_lane_talks_to_redis_without_the_runtime_that_opened_the_store() {
    use std::sync::mpsc;
    let redis = RedisServer::start();
    let opener = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let store = std::sync::Arc::new(obol::store::Store::Redis(
        opener
            .block_on(obol::store::RedisStore::connect(&redis.url()))
            .unwrap(),
    ));
    let lanes = obol::listener::lanes::Lanes::start().unwrap();
    let lanes_count = obol::listener::lanes::count();
    // One task per lane, held there (each lane serves one): it asks once, which opens the
    // lane's own connection in the background, then waits for the opener to be blocked and
    // asks until an answer comes within 300 ms, for up to 10 s.
    let (asked, first_asked) = mpsc::channel();
    let (answered, answers) = mpsc::channel();
    let (blocked, opener_blocked) = tokio::sync::watch::channel(false);
    for _ in 0..lanes_count {
        let (store, asked, answered, mut opener_blocked) = (
            store.clone(),
            asked.clone(),
            answered.clone(),
            opener_blocked.clone(),
        );
        lanes.serve(async move {
            store.receipt("w", "r").await.unwrap();
            asked.send(()).unwrap();
            let _ = opener_blocked.wait_for(|blocked| *blocked).await;
            let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
            let mut on_time = false;
            while !on_time && tokio::time::Instant::now() < deadline {
                on_time = tokio::time::timeout(Duration::from_millis(300), store.receipt("w", "r"))
                    .await
                    .is_ok_and(|answer| answer.is_ok());
            }
            let _ = answered.send(on_time);
        });
    }
    for _ in 0..lanes_count {
        first_asked.recv_timeout(Duration::from_secs(10)).unwrap();
    }
    let (worker_taken, worker_is_taken) = mpsc::channel();
    let (release, released) = mpsc::channel::<()>();
    opener.spawn(async move {
        worker_taken.send(()).unwrap();
        let _ = released.recv();
    });
    worker_is_taken.recv().unwrap();
    blocked.send(true).unwrap();
    for _ in 0..lanes_count {
        assert_eq!(
            answers.recv_timeout(Duration::from_secs(15)),
            Ok(true),
            "a lane's calls waited for the runtime that opened the store"
        );
    }
    release.send(()).unwrap();
}

/// On one server the indexes beside a claim are written by the claim's own scripts, only when
/// the write they belong to happens. A claim that finds the slot taken leaves the lease index
/// as the winner wrote it (it used to raise the entry to its own, later lease, so the sweeper
/// would find a dead winner late), and a final write that lost its race lists no receipt and
/// leaves no pointer (it used to write both, pointing at a receipt that never existed).
#[tokio::test]
async fn a_write_that_loses_its_race_leaves_no_index_entries() {
    use obol::store::contract::{key, receipt, record, record_leased_until};
    use obol::store::{Claim, OutcomeClass, ResultJson, Store, StoredOutcome};
    let redis = RedisServer::start();
    let store = Store::Redis(
        obol::store::RedisStore::connect(&redis.url())
            .await
            .unwrap(),
    );
    let mut connection = redis::Client::open(redis.url())
        .unwrap()
        .get_connection()
        .unwrap();
    let mut score = |index: &str, member: &str| -> Option<u64> {
        redis::cmd("ZSCORE")
            .arg(index)
            .arg(member)
            .query(&mut connection)
            .unwrap()
    };
    let mut other = redis::Client::open(redis.url())
        .unwrap()
        .get_connection()
        .unwrap();
    let mut exists =
        |key: String| -> bool { redis::cmd("EXISTS").arg(key).query(&mut other).unwrap() };

    let k = key(1);
    let winner = record();
    assert_eq!(store.claim(&k, &winner).await.unwrap(), Claim::Acquired);
    let later = record_leased_until(winner.lease_until_ms + 60_000);
    assert!(matches!(
        store.claim(&k, &later).await.unwrap(),
        Claim::Existing(_)
    ));
    assert_eq!(
        score("obol:leases", &k.slot()),
        Some(winner.lease_until_ms),
        "the losing claim moved the winner's lease index entry"
    );

    let outcome = || StoredOutcome {
        class: OutcomeClass::Accepted,
        vendor_status: Some(200),
        response: Ok(ResultJson::of(&json!({"content": [], "isError": false}))),
    };
    let done = winner.finalize(outcome());
    assert!(
        store
            .finalize(&k, &winner, &done, &receipt(&winner, &k))
            .await
            .unwrap()
    );
    assert_eq!(
        score("obol:leases", &k.slot()),
        None,
        "a finished call's entry"
    );
    assert!(
        score(
            &format!("obol:receipts:{}", k.workspace),
            &winner.receipt_id
        )
        .is_some(),
        "the winner's receipt is listed"
    );
    let mut stale = receipt(&winner, &k);
    stale.id = format!("{}x", stale.id);
    assert!(
        !store
            .finalize(&k, &winner, &winner.finalize(outcome()), &stale)
            .await
            .unwrap()
    );
    assert_eq!(
        score(&format!("obol:receipts:{}", k.workspace), &stale.id),
        None,
        "a lost final write listed its receipt"
    );
    assert!(
        exists(format!(
            "obol:receipt:{}:{}",
            k.workspace, winner.receipt_id
        )),
        "the winner's receipt has its pointer"
    );
    assert!(
        !exists(format!("obol:receipt:{}:{}", k.workspace, stale.id)),
        "a lost final write left a pointer to no receipt"
    );
}

/// Finalizes a call in `acme`, one in `globex` and another in `acme`, and records a refusal
/// in `acme`; returns their receipt ids in that order and the calls' claim keys.
async fn three_calls_and_a_refusal(
    store: &obol::store::Store,
) -> (Vec<String>, Vec<obol::store::ClaimKey>) {
    use obol::store::contract::{key, receipt, record};
    let (mut ids, mut keys) = (Vec::new(), Vec::new());
    for (n, workspace) in [(1, "acme"), (2, "globex"), (3, "acme")] {
        let (id, k) = a_finished_call(store, n, workspace).await;
        ids.push(id);
        keys.push(k);
    }
    let mut refused = receipt(&record(), &key(4));
    refused.id = "rcp_audit_refused".into();
    refused.refusal = true;
    store.record_refusal(&refused).await.unwrap();
    ids.push(refused.id);
    (ids, keys)
}

/// A redis-server of the test's own, a store on it and a connection of the test's.
async fn a_server_with_its_store() -> (RedisServer, obol::store::Store, redis::Connection) {
    let redis = RedisServer::start();
    let store = obol::store::Store::Redis(
        obol::store::RedisStore::connect(&redis.url())
            .await
            .unwrap(),
    );
    let connection = redis::Client::open(redis.url())
        .unwrap()
        .get_connection()
        .unwrap();
    (redis, store, connection)
}

fn expire(connection: &mut redis::Connection, keys: &[&str], seconds: i64) {
    for key in keys {
        let _: () = redis::cmd("EXPIRE")
            .arg(key)
            .arg(seconds)
            .query(connection)
            .unwrap();
    }
}

/// Call `n` of `workspace`, claimed and finalized with a receipt: its receipt id and key.
async fn a_finished_call(
    store: &obol::store::Store,
    n: u32,
    workspace: &str,
) -> (String, obol::store::ClaimKey) {
    use obol::store::contract::{key, receipt, record};
    use obol::store::{OutcomeClass, ResultJson, StoredOutcome};
    let mut k = key(n);
    k.workspace = workspace.into();
    let mut claimed = record();
    claimed.receipt_id = format!("rcp_audit{n}_{}", claimed.receipt_id);
    assert_eq!(
        store.claim(&k, &claimed).await.unwrap(),
        obol::store::Claim::Acquired
    );
    let done = claimed.finalize(StoredOutcome {
        class: OutcomeClass::Accepted,
        vendor_status: Some(200),
        response: Ok(ResultJson::of(&json!({"content": [], "isError": false}))),
    });
    let written = receipt(&claimed, &k);
    assert!(store.finalize(&k, &claimed, &done, &written).await.unwrap());
    (written.id, k)
}

/// Refusal `n` in `acme` (its receipt id `rcp_refused_<n>`).
async fn a_refusal(store: &obol::store::Store, n: u32) {
    use obol::store::contract::{key, receipt, record};
    let mut refused = receipt(&record(), &key(100 + n));
    refused.id = format!("rcp_refused_{n}");
    refused.refusal = true;
    store.record_refusal(&refused).await.unwrap();
}

/// A stream's entries: each one's `event` field, parsed.
fn audit_events(connection: &mut dyn redis::ConnectionLike, stream: &str) -> Vec<Value> {
    let entries: Vec<(String, Vec<(String, String)>)> = redis::cmd("XRANGE")
        .arg(stream)
        .arg("-")
        .arg("+")
        .query(connection)
        .unwrap();
    entries
        .into_iter()
        .map(|(_, fields)| serde_json::from_str(&fields[0].1).unwrap_or(Value::Null))
        .collect()
}

fn receipt_ids(events: &[Value]) -> Vec<&str> {
    events
        .iter()
        .map(|event| event["receipt_id"].as_str().unwrap_or("(none)"))
        .collect()
}

/// On one server a workspace's audit records, calls and refusals alike, are one stream
/// (`obol:audit:<workspace>`), in the order they were written and trimmed to the retention by
/// the server's clock. Each call's record used to be a stream of its own in the claim's slot:
/// about 4.7 KiB of Redis memory a call (a stream node each) for one entry no one could find
/// without the slot; a shared stream keeps about 200 bytes an entry. Refusals had a stream of
/// their own, never trimmed by age.
#[tokio::test]
async fn a_workspaces_audit_records_are_one_stream_on_a_server() {
    let (_redis, store, mut connection) = a_server_with_its_store().await;
    // Entries from long past the retention, filling 30 of the stream's nodes (10 entries
    // each, set here: far from the node's byte limit whatever the encoding), then entries an
    // hour old: the next write trims the first, keeps the second.
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("stream-node-max-entries")
        .arg(10)
        .query(&mut connection)
        .unwrap();
    let hour_ago = obol::clock::now_ms() - 3_600_000;
    let ids: Vec<String> = (1..=300)
        .map(|ms| format!("{ms}-0"))
        .chain((0..5).map(|n| format!("{hour_ago}-{n}")))
        .collect();
    for id in &ids {
        let _: String = redis::cmd("XADD")
            .arg("obol:audit:acme")
            .arg(id)
            .arg("event")
            .arg(json!({"receipt_id": format!("rcp_old_{id}")}).to_string())
            .query(&mut connection)
            .unwrap();
    }
    let (ids, _) = three_calls_and_a_refusal(&store).await;

    let acme = audit_events(&mut connection, "obol:audit:acme");
    let kept: Vec<String> = (0..5).map(|n| format!("rcp_old_{hour_ago}-{n}")).collect();
    let mut expected: Vec<&str> = kept.iter().map(String::as_str).collect();
    expected.extend([ids[0].as_str(), ids[2].as_str(), ids[3].as_str()]);
    assert_eq!(
        receipt_ids(&acme),
        expected,
        "acme's audit stream: entries past the retention trimmed, the rest kept, in order"
    );
    assert_eq!(acme[5]["tool"], json!("stripe.create_refund"));
    assert_eq!(acme[5]["outcome"], json!("accepted"));
    assert_eq!(acme[5]["attempt_count"], json!(1));
    let globex = audit_events(&mut connection, "obol:audit:globex");
    assert_eq!(receipt_ids(&globex), [ids[1].as_str()]);
    let ttl: i64 = redis::cmd("TTL")
        .arg("obol:audit:acme")
        .query(&mut connection)
        .unwrap();
    assert!(
        ttl > 0,
        "the audit stream lives as long as the retention: {ttl}"
    );
    let per_call: Vec<String> = redis::cmd("KEYS")
        .arg("obol:{*}:audit")
        .query(&mut connection)
        .unwrap();
    assert_eq!(per_call, Vec::<String>::new(), "per-call audit streams");
}

/// A workspace's receipt listing and audit stream are kept at least a retention past their
/// newest entry, and at most a tenth of one more; their expiry is renewed, by calls and
/// refusals alike, only once it has left that window (a new entry, a lowered retention).
/// Each renewal is a command in the append-only file, and they used to be renewed on every
/// call of a busy workspace.
#[tokio::test]
async fn a_workspaces_listing_and_stream_are_re_expired_only_outside_their_window() {
    let (_redis, store, mut connection) = a_server_with_its_store().await;
    let retention = obol::store::DEFAULT_RETENTION.as_secs() as i64;
    let kept = retention + retention / 10;
    let keys = ["obol:receipts:acme", "obol:audit:acme"];
    let ttls = |connection: &mut redis::Connection| -> Vec<i64> {
        keys.iter()
            .map(|key| redis::cmd("TTL").arg(key).query(connection).unwrap())
            .collect()
    };

    a_finished_call(&store, 1, "acme").await;
    for ttl in ttls(&mut connection) {
        assert!(
            ttl > retention && ttl <= kept,
            "a new workspace's keys live a retention and a margin: {ttl}"
        );
    }

    expire(&mut connection, &keys, retention + 60);
    a_finished_call(&store, 2, "acme").await;
    a_refusal(&store, 1).await;
    for ttl in ttls(&mut connection) {
        assert!(
            ttl > retention + 50 && ttl <= retention + 60,
            "an expiry within the window is left as it is, by a call and a refusal: {ttl}"
        );
    }

    for (n, set, why) in [
        (
            3,
            retention - 60,
            "an expiry below the retention is renewed",
        ),
        (
            4,
            10 * retention,
            "an expiry past the window (a lowered retention) is renewed",
        ),
    ] {
        expire(&mut connection, &keys, set);
        a_finished_call(&store, n, "acme").await;
        for ttl in ttls(&mut connection) {
            assert!(ttl > retention && ttl <= kept, "{why}: {ttl}");
        }
        expire(&mut connection, &keys, set);
        a_refusal(&store, n).await;
        for ttl in ttls(&mut connection) {
            assert!(ttl > retention && ttl <= kept, "{why} by a refusal: {ttl}");
        }
    }
}

/// On one server a finished call drops its claim's lease index entry whatever lease the entry
/// holds: the finalize's compare-and-set has just passed in the same script, so no later
/// reservation can own it. (An entry raised past the record's lease, as a writer with a
/// later clock leaves it, used to stay for the sweeper.)
#[tokio::test]
async fn a_finished_call_drops_its_lease_entry_whatever_its_lease() {
    use obol::store::contract::{key, receipt, record};
    use obol::store::{OutcomeClass, ResultJson, StoredOutcome};
    let (_redis, store, mut connection) = a_server_with_its_store().await;
    let k = key(77);
    let claimed = record();
    assert_eq!(
        store.claim(&k, &claimed).await.unwrap(),
        obol::store::Claim::Acquired
    );
    let lease = |connection: &mut redis::Connection| -> Option<f64> {
        redis::cmd("ZSCORE")
            .arg("obol:leases")
            .arg(k.slot())
            .query(connection)
            .unwrap()
    };
    let written = lease(&mut connection).expect("a reservation's entry");
    let _: () = redis::cmd("ZADD")
        .arg("obol:leases")
        .arg("GT")
        .arg(written + 60_000.0)
        .arg(k.slot())
        .query(&mut connection)
        .unwrap();
    let done = claimed.finalize(StoredOutcome {
        class: OutcomeClass::Accepted,
        vendor_status: Some(200),
        response: Ok(ResultJson::of(&json!({"content": [], "isError": false}))),
    });
    assert!(
        store
            .finalize(&k, &claimed, &done, &receipt(&claimed, &k))
            .await
            .unwrap()
    );
    assert_eq!(lease(&mut connection), None, "the finished call's entry");
}

/// On a cluster a script reaches only its claim's slot: a call's audit record stays in its
/// claim's own stream; a refusal's (no claim) goes to its workspace's stream, as on one
/// server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_a_calls_audit_record_stays_in_its_claims_slot() {
    let cluster = RedisCluster::start();
    let store = obol::store::Store::Redis(
        obol::store::RedisStore::connect_cluster(&cluster.urls())
            .await
            .unwrap(),
    );
    let mut connection = redis::cluster::ClusterClient::new(cluster.urls())
        .unwrap()
        .get_connection()
        .unwrap();
    let (ids, keys) = three_calls_and_a_refusal(&store).await;
    for (id, key) in ids.iter().zip(&keys) {
        let own = audit_events(&mut connection, &format!("obol:{{{}}}:audit", key.slot()));
        assert_eq!(
            receipt_ids(&own),
            [id.as_str()],
            "{}'s own stream",
            key.slot()
        );
        // Kept as long as its claim, not a workspace's margin longer.
        let ttl: i64 = redis::cmd("TTL")
            .arg(format!("obol:{{{}}}:audit", key.slot()))
            .query(&mut connection)
            .unwrap();
        let retention = obol::store::DEFAULT_RETENTION.as_secs() as i64;
        assert!(ttl > retention - 60 && ttl <= retention, "its TTL: {ttl}");
    }
    let acme = audit_events(&mut connection, "obol:audit:acme");
    assert_eq!(receipt_ids(&acme), [ids[3].as_str()], "acme's refusals");
    // A workspace's listing, written beside the scripts here, is kept as on one server.
    let retention = obol::store::DEFAULT_RETENTION.as_secs() as i64;
    let ttl: i64 = redis::cmd("TTL")
        .arg("obol:receipts:acme")
        .query(&mut connection)
        .unwrap();
    assert!(
        ttl > retention && ttl <= retention + retention / 10,
        "acme's listing TTL: {ttl}"
    );
}

/// A retention longer than the time since 1970 (the config sets no upper bound) still
/// finalizes: the audit stream's trim bound used to go negative, an invalid stream id, and
/// every final write failed after writing the receipt.
#[tokio::test]
async fn a_retention_longer_than_the_epoch_still_finalizes() {
    use obol::store::contract::{key, receipt, record};
    use obol::store::{OutcomeClass, ResultJson, StoredOutcome};
    let redis = RedisServer::start();
    let store = obol::store::Store::Redis(
        obol::store::RedisStore::connect(&redis.url())
            .await
            .unwrap()
            .with_retention(Duration::from_secs(600_000 * 3600)),
    );
    let k = key(1);
    let claimed = record();
    assert_eq!(
        store.claim(&k, &claimed).await.unwrap(),
        obol::store::Claim::Acquired
    );
    let done = claimed.finalize(StoredOutcome {
        class: OutcomeClass::Accepted,
        vendor_status: Some(200),
        response: Ok(ResultJson::of(&json!({"content": [], "isError": false}))),
    });
    let finalized = store
        .finalize(&k, &claimed, &done, &receipt(&claimed, &k))
        .await;
    assert!(matches!(finalized, Ok(true)), "{finalized:?}");
}
