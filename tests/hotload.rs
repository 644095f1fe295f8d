//! Hot-loading: components added, replaced and removed on a running gateway, through the
//! watched directory and the admin API (`obol connectors`), under load.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::admin::{ADMIN, obol};
use crate::support::gateway::run_obol;
use crate::support::vendor::{ScriptedVendor, Step};
use crate::support::{
    GatewayConfig, GatewayProcess, McpClient, MockVendor, TOKEN, guests, key_hash,
};

const V1: &str = "0.1.0";
const V2: &str = "0.2.0-next";

/// A gateway serving the bundled payments component from its config and the tracker from
/// its watched directory, with the admin API on.
fn hot_config(vendor: &str) -> GatewayConfig {
    let mut config = GatewayConfig::new(vendor);
    config.components = vec![guests::PAYMENTS.into(), guests::HOSTILE.into()];
    config.connectors_dir = true;
    config.extra = format!("\n[admin]\ntoken_hash = \"{}\"\n", key_hash(ADMIN));
    config
}

fn admin(gateway: &GatewayProcess) -> (reqwest::Client, String) {
    (
        reqwest::Client::new(),
        format!(
            "{}/v1/admin/connectors",
            gateway.url.trim_end_matches("/mcp")
        ),
    )
}

/// Uploads `component` as a new version of `name` (or, without a name, as a new connector).
async fn upload(gateway: &GatewayProcess, name: Option<&str>, component: &str) -> (u16, Value) {
    let (http, url) = admin(gateway);
    let bytes = std::fs::read(component).unwrap();
    let request = match name {
        Some(name) => http.put(format!("{url}/{name}")),
        None => http.post(url),
    };
    let response = request
        .bearer_auth(ADMIN)
        .header("content-type", "application/wasm")
        .body(bytes)
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap())
}

async fn listed(gateway: &GatewayProcess) -> Value {
    let (http, url) = admin(gateway);
    let response = http.get(url).bearer_auth(ADMIN).send().await.unwrap();
    assert_eq!(response.status(), 200);
    response.json().await.unwrap()
}

/// The tracker version that answered, from the text of an `issues.get` result.
fn tracker_version(result: &rmcp::model::CallToolResult) -> &'static str {
    let text = format!("{:?}", result.content);
    if text.contains(&format!("[tracker {V2}]")) {
        V2
    } else {
        V1
    }
}

fn percentile(samples: &mut [Duration], p: f64) -> Duration {
    samples.sort();
    samples[((samples.len() as f64 - 1.0) * p).round() as usize]
}

#[tokio::test]
async fn a_dropped_file_is_served_within_a_second_and_a_broken_replacement_keeps_the_old() {
    let vendor = MockVendor::start().await;
    let gateway = GatewayProcess::start(&hot_config(&vendor.base_url()));
    let client = McpClient::connect(&gateway.url, TOKEN).await;
    assert!(
        !client
            .tool_names()
            .await
            .iter()
            .any(|t| t.starts_with("tracker."))
    );

    // No polling: the watcher sees the file.
    let dropped = Instant::now();
    std::fs::copy(
        guests::TRACKER,
        gateway.connectors_dir().join("tracker.wasm"),
    )
    .unwrap();
    let served = loop {
        if client
            .tool_names()
            .await
            .iter()
            .any(|t| t == "tracker.issues.get")
        {
            break dropped.elapsed();
        }
        assert!(
            dropped.elapsed() < Duration::from_secs(10),
            "{}",
            gateway.log()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    println!("file dropped -> listed: {} ms", served.as_millis());

    // A replacement that is not a component: the old version stays, and the log says why.
    std::fs::write(gateway.connectors_dir().join("tracker.wasm"), b"not wasm").unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !gateway.log().contains("not a valid connector component") {
        assert!(Instant::now() < deadline, "{}", gateway.log());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let result = client
        .call("tracker.issues.get", json!({"number": 7}))
        .await
        .expect("the last good version still serves");
    assert_eq!(result.is_error, Some(false));
    assert_eq!(tracker_version(&result), V1);

    // Removing the file removes the tools.
    std::fs::remove_file(gateway.connectors_dir().join("tracker.wasm")).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while client
        .tool_names()
        .await
        .iter()
        .any(|t| t.starts_with("tracker."))
    {
        assert!(Instant::now() < deadline, "{}", gateway.log());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    client.close().await;
}

#[tokio::test]
async fn the_admin_api_adds_replaces_and_removes_and_refuses_with_the_reason() {
    let vendor = MockVendor::start().await;
    let gateway = GatewayProcess::start(&hot_config(&vendor.base_url()));

    let (status, added) = upload(&gateway, None, guests::TRACKER).await;
    assert_eq!(status, 200, "{added}");
    assert_eq!(
        (added["name"].as_str(), added["version"].as_str()),
        (Some("tracker"), Some(V1))
    );
    assert!(
        gateway.connectors_dir().join("tracker.wasm").is_file(),
        "kept in the directory"
    );
    // Adding it again is a conflict; replacing something unknown is not found.
    let (status, _) = upload(&gateway, None, guests::TRACKER).await;
    assert_eq!(status, 409);
    let (status, _) = upload(&gateway, Some("nothing"), guests::TRACKER).await;
    assert_eq!(status, 404);
    // A component that is another connector, or not a component, changes nothing.
    let (status, refused) = upload(&gateway, Some("tracker"), guests::PAYMENTS_NEXT).await;
    assert_eq!(status, 400);
    assert!(
        refused.to_string().contains("not \\\"tracker\\\""),
        "{refused}"
    );
    let garbage = gateway.dir.path().join("garbage.wasm");
    std::fs::write(&garbage, b"\0asm garbage").unwrap();
    let (status, refused) = upload(&gateway, Some("tracker"), garbage.to_str().unwrap()).await;
    assert_eq!(status, 400);
    assert!(
        refused
            .to_string()
            .contains("not a valid connector component"),
        "{refused}"
    );
    // The config's own connectors are changed in the config.
    let (status, refused) = upload(&gateway, Some("stripe"), guests::PAYMENTS_NEXT).await;
    assert_eq!(status, 409, "{refused}");

    let client = McpClient::connect(&gateway.url, TOKEN).await;
    let result = client
        .call("tracker.issues.get", json!({"number": 7}))
        .await
        .unwrap();
    assert_eq!(tracker_version(&result), V1);

    // Through the CLI: replace, list, remove.
    let (code, replaced) = obol(
        &gateway,
        &["connectors", "replace", "tracker", guests::TRACKER_NEXT],
    );
    assert_eq!(code, 0, "{replaced}");
    assert_eq!(replaced["replaced"], json!(V1));
    assert_eq!(replaced["version"], json!(V2));
    let result = client
        .call("tracker.issues.get", json!({"number": 7}))
        .await
        .unwrap();
    assert_eq!(
        tracker_version(&result),
        V2,
        "served from the moment the API answered"
    );
    let (code, list) = obol(&gateway, &["connectors", "list"]);
    assert_eq!(code, 0);
    let tracker = list["connectors"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "tracker")
        .cloned()
        .unwrap();
    assert_eq!(tracker["version"], json!(V2));
    assert_eq!(tracker["source"], json!("directory"));
    assert_eq!(tracker["digest"].as_str().unwrap().len(), 64);
    let stripe = &listed(&gateway).await["connectors"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "stripe")
        .cloned()
        .unwrap();
    assert_eq!(stripe["source"], json!("configured"));

    // It survives a restart: the directory is the state.
    let dir = gateway.kill();
    let gateway = GatewayProcess::start_in(&hot_config(&vendor.base_url()), dir);
    let client = McpClient::connect(&gateway.url, TOKEN).await;
    let result = client
        .call("tracker.issues.get", json!({"number": 7}))
        .await
        .unwrap();
    assert_eq!(tracker_version(&result), V2);

    // A second file providing the same connector would serve once the first is gone: a
    // remove takes both (review finding).
    std::fs::copy(
        guests::TRACKER,
        gateway.connectors_dir().join("z-tracker-copy.wasm"),
    )
    .unwrap();
    let (code, removed) = obol(&gateway, &["connectors", "remove", "tracker"]);
    assert_eq!(code, 0, "{removed}");
    let (code, message, _) = client
        .call_err("tracker.issues.get", json!({"number": 7}))
        .await;
    assert_eq!((code, message.as_str()), (-32602, "Unknown tool"));
    assert!(!gateway.connectors_dir().join("tracker.wasm").exists());
    assert!(
        !gateway
            .connectors_dir()
            .join("z-tracker-copy.wasm")
            .exists()
    );

    // An add never overwrites a file that holds another connector (review finding).
    std::fs::copy(guests::NANGO, gateway.connectors_dir().join("tracker.wasm")).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !listed(&gateway).await.to_string().contains("\"nango\"") {
        assert!(Instant::now() < deadline, "{}", gateway.log());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (status, refused) = upload(&gateway, None, guests::TRACKER).await;
    assert_eq!(status, 409, "{refused}");
    assert!(listed(&gateway).await.to_string().contains("\"nango\""));
    client.close().await;
}

/// Review finding: a slot held for approval under one connector version was held again for
/// a retry under the next, so the owner could approve a call no version could then send.
#[tokio::test]
async fn a_call_held_under_another_version_is_a_conflict_not_a_new_approval() {
    let vendor = MockVendor::start().await;
    let mut config = crate::approvals::prod_config(&vendor);
    config.components = vec![guests::TRACKER.into(), guests::HOSTILE.into()];
    config.connectors_dir = true;
    config.extra = format!("\n[admin]\ntoken_hash = \"{}\"\n", key_hash(ADMIN));
    let gateway = GatewayProcess::start(&config);
    let (status, added) = upload(&gateway, None, guests::PAYMENTS).await;
    assert_eq!(status, 200, "{added}");
    let k = crate::idempotency::key("held-upgrade");
    let args = json!({"charge": "ch_42", "amount": 500});
    crate::approvals::held(&gateway, &k, args.clone()).await;
    let (status, upgraded) = upload(&gateway, Some("stripe"), guests::PAYMENTS_NEXT).await;
    assert_eq!(status, 200, "{upgraded}");
    let client = McpClient::with_key(&gateway.url, crate::approvals::AGENT, &k).await;
    let (_, _, data) = client.call_err("stripe.create_refund", args).await;
    assert_eq!(data.unwrap()["type"], json!("idempotency_conflict"));
    assert!(vendor.seen().is_empty());
}

/// A call finished before a hot upgrade replays after it; an unknown outcome is never resent
/// by the new version (it might build another request), only by the one that prepared it.
#[tokio::test]
async fn a_retry_across_a_hot_upgrade_replays_and_is_never_resent_by_the_new_version() {
    let vendor = ScriptedVendor::start(vec![
        Step::answer(
            200,
            json!({"id": "re_1", "object": "refund", "amount": 500, "charge": "ch_42", "status": "succeeded"}),
        ),
        // Past the outbound timeout: the outcome is unknown.
        Step::Answer {
            status: 200,
            body: json!({}),
            delay: Duration::from_secs(3),
        },
        Step::answer(
            200,
            json!({"id": "re_2", "object": "refund", "amount": 1, "charge": "ch_43", "status": "succeeded"}),
        ),
    ])
    .await;
    let mut config = hot_config(&vendor.base_url());
    config.components = vec![guests::TRACKER.into(), guests::HOSTILE.into()];
    let gateway = GatewayProcess::start(&config);
    let (status, added) = upload(&gateway, None, guests::PAYMENTS).await;
    assert_eq!(status, 200, "{added}");

    let done = McpClient::with_key(&gateway.url, TOKEN, "idt_hot_upgrade_done_0001").await;
    let first = done
        .call(
            "stripe.create_refund",
            json!({"charge": "ch_42", "amount": 500}),
        )
        .await
        .unwrap();
    assert_eq!(first.is_error, Some(false));
    let unknown = McpClient::with_key(&gateway.url, TOKEN, "idt_hot_upgrade_unknown_01").await;
    let (_, _, data) = unknown
        .call_err(
            "stripe.create_refund",
            json!({"charge": "ch_42", "amount": 500}),
        )
        .await;
    assert_eq!(data.unwrap()["type"], json!("upstream_timeout"));
    assert_eq!(vendor.received(), 2);

    let (status, upgraded) = upload(&gateway, Some("stripe"), guests::PAYMENTS_NEXT).await;
    assert_eq!(status, 200, "{upgraded}");
    assert_eq!(upgraded["version"], json!(V2));

    let replayed = done
        .call(
            "stripe.create_refund",
            json!({"charge": "ch_42", "amount": 500}),
        )
        .await
        .expect("a finished call replays across versions, not idempotency_conflict");
    assert_eq!(replayed.content, first.content);
    assert_eq!(crate::idempotency::meta(&replayed)["replayed"], json!(true));
    let (_, _, data) = unknown
        .call_err(
            "stripe.create_refund",
            json!({"charge": "ch_42", "amount": 500}),
        )
        .await;
    assert_eq!(data.unwrap()["type"], json!("upstream_timeout"));
    assert_eq!(
        vendor.received(),
        2,
        "resent by a version that did not prepare it"
    );
    // Other arguments under a used key still conflict.
    let (_, _, data) = done
        .call_err(
            "stripe.create_refund",
            json!({"charge": "ch_42", "amount": 501}),
        )
        .await;
    assert_eq!(data.unwrap()["type"], json!("idempotency_conflict"));
    // A new key runs on the new version, and its receipt says which.
    let fresh = McpClient::connect(&gateway.url, TOKEN).await;
    let third = fresh
        .call(
            "stripe.create_refund",
            json!({"charge": "ch_43", "amount": 1}),
        )
        .await
        .unwrap();
    assert_eq!(third.is_error, Some(false));
    assert_eq!(vendor.received(), 3);
    let receipts = crate::lifecycle::receipts(&gateway, TOKEN).await;
    let versions: Vec<&str> = receipts
        .iter()
        .filter_map(|r| r["connector_version"].as_str())
        .collect();
    assert!(
        versions.contains(&V1) && versions.contains(&V2),
        "{receipts:?}"
    );
}

/// 100 swaps between two versions, then a remove and an add, while 32 clients call: no call
/// fails but the removed connector's (`Unknown tool`), every answer comes from a version that
/// was serving while the call ran, and compiled versions do not pile up in memory.
#[tokio::test]
async fn a_hundred_swaps_under_load_lose_no_call() {
    let vendor = MockVendor::start().await;
    let mut config = hot_config(&vendor.base_url());
    // A small store cache, full within the warm-up, so RSS shows what the swaps leave.
    let dir = tempfile::tempdir().unwrap();
    config.store = Some(format!(
        "path = {:?}\ncache_mib = 2",
        dir.path().join("obol.redb")
    ));
    let gateway = GatewayProcess::start_in(&config, dir);
    let (status, added) = upload(&gateway, None, guests::TRACKER).await;
    assert_eq!(status, 200, "{added}");

    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let mut workers = Vec::new();
    for worker in 0..32 {
        let client = McpClient::connect(&gateway.url, TOKEN).await;
        let stop = Arc::clone(&stop);
        workers.push(tokio::spawn(async move {
            // (start, end, what answered)
            let mut calls: Vec<(Duration, Duration, Result<&'static str, String>)> = Vec::new();
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                n += 1;
                let begun = started.elapsed();
                let outcome = if (n + worker).is_multiple_of(3) {
                    match client
                        .call("stripe.charges.list", json!({"limit": 2}))
                        .await
                    {
                        Ok(result) if result.is_error == Some(false) => Ok("stripe"),
                        other => Err(format!("stripe: {other:?}")),
                    }
                } else {
                    match client
                        .call("tracker.issues.get", json!({"number": 7}))
                        .await
                    {
                        Ok(result) if result.is_error == Some(false) => {
                            Ok(tracker_version(&result))
                        }
                        Ok(result) => Err(format!("tracker: {result:?}")),
                        Err(error) => Err(format!("{error}")),
                    }
                };
                calls.push((begun, started.elapsed(), outcome));
            }
            client.close().await;
            calls
        }));
    }

    // (sent, answered, the version serving from `answered` on)
    let mut swaps: Vec<(Duration, Duration, Option<&'static str>)> =
        vec![(Duration::ZERO, started.elapsed(), Some(V1))];
    let mut latencies = Vec::new();
    let mut swap_ms = Vec::new();
    // Warm-up: the allocator, the store cache and every pool slot reach their working size.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let rss_before = gateway.rss_mib();
    let mut rss_first_swap = 0.0;
    for swap in 0..100u32 {
        let (component, version) = match swap % 2 {
            0 => (guests::TRACKER_NEXT, V2),
            _ => (guests::TRACKER, V1),
        };
        let sent = started.elapsed();
        let (status, answer) = upload(&gateway, Some("tracker"), component).await;
        let answered = started.elapsed();
        assert_eq!(status, 200, "swap {swap}: {answer}");
        swaps.push((sent, answered, Some(version)));
        latencies.push(answered - sent);
        swap_ms.push(Duration::from_millis(answer["swap_ms"].as_u64().unwrap()));
        if swap == 0 {
            rss_first_swap = gateway.rss_mib();
        }
        if (swap + 1).is_multiple_of(10) {
            println!("after swap {}: RSS {:.1} MiB", swap + 1, gateway.rss_mib());
        }
    }
    let rss_after_swaps = gateway.rss_mib();
    // Remove, let calls meet `Unknown tool` for a moment, add it back.
    let sent = started.elapsed();
    let (code, removed) = obol(&gateway, &["connectors", "remove", "tracker"]);
    assert_eq!(code, 0, "{removed}");
    swaps.push((sent, started.elapsed(), None));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let sent = started.elapsed();
    let (code, readded) = obol(&gateway, &["connectors", "add", guests::TRACKER]);
    assert_eq!(code, 0, "{readded}");
    swaps.push((sent, started.elapsed(), Some(V1)));
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.store(true, Ordering::Relaxed);

    let mut calls = Vec::new();
    for worker in workers {
        calls.extend(worker.await.unwrap());
    }
    // Every replaced version was dropped with its last call: the three served remain.
    let metrics = crate::admin::metrics(&gateway).await;
    assert!(
        metrics.contains("\nobol_components_in_memory 3\n"),
        "{}",
        metrics
            .lines()
            .filter(|l| l.contains("components_in_memory"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    // What may have answered a call that ran over [begun, ended]: the version serving when
    // it began, and any swapped in before it ended.
    let may_answer = |begun: Duration, ended: Duration| -> Vec<Option<&'static str>> {
        let serving_at_begin = swaps
            .iter()
            .rev()
            .find(|(sent, _, _)| *sent <= begun)
            .map(|(_, _, v)| *v)
            .unwrap();
        let mut allowed = vec![serving_at_begin];
        // A swap still completing when the call began has its predecessor serving too.
        for window in swaps.windows(2) {
            let (_, _, before) = window[0];
            let (sent, answered, after) = window[1];
            if sent <= ended && answered >= begun {
                allowed.push(before);
                allowed.push(after);
            }
        }
        allowed
    };
    let mut unknown_tool = 0;
    let mut by_version = std::collections::BTreeMap::new();
    for (begun, ended, outcome) in &calls {
        match outcome {
            Ok("stripe") => {}
            Ok(version) => {
                *by_version.entry(*version).or_insert(0) += 1;
                assert!(
                    may_answer(*begun, *ended).contains(&Some(*version)),
                    "a call over {begun:?}..{ended:?} was answered by {version}, not serving then"
                );
            }
            Err(error) if error.contains("Unknown tool") => {
                assert!(
                    may_answer(*begun, *ended).contains(&None),
                    "Unknown tool outside the removal: {begun:?}..{ended:?}"
                );
                unknown_tool += 1;
            }
            Err(error) => panic!("a call failed over {begun:?}..{ended:?}: {error}"),
        }
    }
    assert!(unknown_tool > 0, "no call met the removed connector");
    assert!(by_version.len() == 2, "{by_version:?}");
    let p50 = percentile(&mut latencies, 0.5);
    let p99 = percentile(&mut latencies, 0.99);
    let in_gateway_p50 = percentile(&mut swap_ms, 0.5);
    let in_gateway_p99 = percentile(&mut swap_ms, 0.99);
    println!(
        "{} calls at c=32 ({unknown_tool} Unknown tool while removed; by version {by_version:?}); \
         100 swaps: upload -> serving p50 {} ms p99 {} ms (in the gateway: write -> serving p50 {} ms p99 {} ms); \
         RSS before {rss_before:.1} MiB, after the first swap {rss_first_swap:.1}, after 100 swaps {rss_after_swaps:.1}",
        calls.len(),
        p50.as_millis(),
        p99.as_millis(),
        in_gateway_p50.as_millis(),
        in_gateway_p99.as_millis(),
    );
    assert!(
        (rss_after_swaps - rss_first_swap).abs() <= rss_first_swap * 0.10,
        "RSS moved from {rss_first_swap:.1} to {rss_after_swaps:.1} MiB over 100 swaps"
    );
}

/// Makes a publisher key pair with `obol connectors keygen`; returns (secret key file, public
/// key).
fn publisher(dir: &std::path::Path, name: &str) -> (std::path::PathBuf, String) {
    let secret = dir.join(format!("{name}.key"));
    let (code, out, err) = run_obol(&["connectors", "keygen", secret.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    let public = out
        .lines()
        .find_map(|line| line.strip_prefix("public key: "))
        .unwrap()
        .to_owned();
    (secret, public)
}

/// `obol connectors sign`: writes COMPONENT.minisig.
fn sign(secret: &std::path::Path, component: &std::path::Path) {
    let (code, _, err) = run_obol(&[
        "connectors",
        "sign",
        "--secret-key",
        secret.to_str().unwrap(),
        component.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{err}");
}

/// `obol connectors verify`: COMPONENT.minisig against a public key (its line or its file).
fn verify(public: &str, component: &std::path::Path) -> (i32, String, String) {
    run_obol(&[
        "connectors",
        "verify",
        "--public-key",
        public,
        component.to_str().unwrap(),
    ])
}

/// `hot_config` under `[connectors.trust]` with one publisher (a TOML inline table's
/// fields); the configured components are pinned by digest.
fn trusting(vendor: &str, publisher: &str) -> GatewayConfig {
    let mut config = hot_config(vendor);
    config.extra.push_str(&format!(
        "\n[connectors.trust]\npublishers = [{{ {publisher} }}]\npinned = [\"sha256:{}\", \"sha256:{}\"]\n",
        sha256_of(guests::PAYMENTS),
        sha256_of(guests::HOSTILE)
    ));
    config
}

fn sha256_of(path: &str) -> String {
    hex::encode(<sha2::Sha256 as sha2::Digest>::digest(
        std::fs::read(path).unwrap(),
    ))
}

#[tokio::test]
async fn only_components_signed_by_a_trusted_publisher_or_pinned_load() {
    let keys = tempfile::tempdir().unwrap();
    let (acme_secret, acme_public) = publisher(keys.path(), "acme");
    let (stranger_secret, stranger_public) = publisher(keys.path(), "stranger");
    let tracker = keys.path().join("tracker.wasm");
    std::fs::copy(guests::TRACKER, &tracker).unwrap();
    sign(&acme_secret, &tracker);
    let next = keys.path().join("tracker-next.wasm");
    std::fs::copy(guests::TRACKER_NEXT, &next).unwrap();

    // Offline verification, by key.
    let (code, out, err) = verify(&acme_public, &tracker);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("verified") && out.contains("file:tracker.wasm"),
        "{out}"
    );
    let (code, _, err) = verify(&stranger_public, &tracker);
    assert_eq!(code, 1);
    assert!(err.contains("which no publisher"), "{err}");

    let vendor = MockVendor::start().await;
    // The configured components are pinned by digest; hot-loaded ones must be signed.
    let config = trusting(
        &vendor.base_url(),
        &format!("name = \"acme\", key = \"{acme_public}\""),
    );
    let gateway = GatewayProcess::start(&config);

    let (code, added) = obol(&gateway, &["connectors", "add", tracker.to_str().unwrap()]);
    assert_eq!(code, 0, "{added}");
    let listed = listed(&gateway).await;
    let entry = |name: &str| {
        listed["connectors"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == name)
            .cloned()
            .unwrap()
    };
    assert_eq!(entry("tracker")["provenance"]["trust"], json!("signed"));
    assert_eq!(entry("tracker")["provenance"]["publisher"], json!("acme"));
    assert_eq!(entry("stripe")["provenance"]["trust"], json!("pinned"));

    // Unsigned, signed by a stranger, or signed but changed since: refused, v1 keeps serving.
    let (status, refused) = upload(&gateway, Some("tracker"), next.to_str().unwrap()).await;
    assert_eq!(status, 400);
    assert!(refused.to_string().contains("not signed"), "{refused}");
    sign(&stranger_secret, &next);
    let (code, refused) = obol(
        &gateway,
        &["connectors", "replace", "tracker", next.to_str().unwrap()],
    );
    assert_eq!(code, 1);
    assert!(
        refused.to_string().contains("which no publisher"),
        "{refused}"
    );
    std::fs::copy(
        obol::catalog::signature_path(&tracker),
        obol::catalog::signature_path(&next),
    )
    .unwrap();
    let (code, refused) = obol(
        &gateway,
        &["connectors", "replace", "tracker", next.to_str().unwrap()],
    );
    assert_eq!(code, 1);
    assert!(
        refused.to_string().contains("changed after it was signed"),
        "{refused}"
    );
    let client = McpClient::connect(&gateway.url, TOKEN).await;
    let result = client
        .call("tracker.issues.get", json!({"number": 7}))
        .await
        .unwrap();
    assert_eq!(tracker_version(&result), V1);

    // Signed by the trusted publisher: it replaces v1.
    sign(&acme_secret, &next);
    let (code, replaced) = obol(
        &gateway,
        &["connectors", "replace", "tracker", next.to_str().unwrap()],
    );
    assert_eq!(code, 0, "{replaced}");
    let result = client
        .call("tracker.issues.get", json!({"number": 7}))
        .await
        .unwrap();
    assert_eq!(tracker_version(&result), V2);

    // A file dropped in unsigned is refused at hot-load, with the reason in the log.
    std::fs::copy(guests::NANGO, gateway.connectors_dir().join("nango.wasm")).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !gateway.log().contains("nango.wasm: refused: not signed") {
        assert!(Instant::now() < deadline, "{}", gateway.log());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // `obol check` names the signer, and whether a config trusts it.
    let config_path = gateway.dir.path().join("obol.toml");
    let (code, out, err) = run_obol(&[
        "check",
        tracker.to_str().unwrap(),
        "--config",
        config_path.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("signed by acme: trusted"), "{out}");

    // A configured component neither pinned nor signed stops the gateway at start.
    let mut unpinned = config.clone();
    unpinned.extra = config
        .extra
        .replace(&sha256_of(guests::HOSTILE), &"0".repeat(64));
    let refused = unpinned.refused();
    assert!(refused.contains("refused: not signed"), "{refused}");
    client.close().await;
}

/// Signatures are minisign's: the reference `minisign` tool checks what `obol connectors sign`
/// makes, and a component signed with `minisign` loads under `[connectors.trust]`.
#[tokio::test]
async fn signatures_interoperate_with_the_reference_minisign() {
    let dir = tempfile::tempdir().unwrap();
    let minisign = |args: &[&str]| {
        let output = std::process::Command::new("minisign")
            .args(args)
            .current_dir(dir.path())
            .output()
            .expect("minisign is installed (.ci/test installs it)");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        (output.status.success(), text)
    };
    // obol signs, minisign verifies.
    let (obol_secret, obol_public) = publisher(dir.path(), "obol");
    let ours = dir.path().join("ours.wasm");
    std::fs::copy(guests::TRACKER, &ours).unwrap();
    sign(&obol_secret, &ours);
    let (verified, text) = minisign(&["-V", "-P", &obol_public, "-m", "ours.wasm"]);
    assert!(verified, "{text}");
    assert!(text.contains("obol component sha256:"), "{text}");

    // minisign signs (an unencrypted key), obol verifies and the gateway loads it.
    let (made, text) = minisign(&["-G", "-W", "-p", "ref.pub", "-s", "ref.key"]);
    assert!(made, "{text}");
    let theirs = dir.path().join("theirs.wasm");
    std::fs::copy(guests::TRACKER, &theirs).unwrap();
    let (signed, text) = minisign(&["-S", "-s", "ref.key", "-m", "theirs.wasm"]);
    assert!(signed, "{text}");
    let public_file = dir.path().join("ref.pub");
    let (code, out, err) = verify(public_file.to_str().unwrap(), &theirs);
    assert_eq!(code, 0, "{out}{err}");
    let vendor = MockVendor::start().await;
    let config = trusting(
        &vendor.base_url(),
        &format!("name = \"reference\", key_file = {public_file:?}"),
    );
    let gateway = GatewayProcess::start(&config);
    let (code, added) = obol(&gateway, &["connectors", "add", theirs.to_str().unwrap()]);
    assert_eq!(code, 0, "{added}");
    let client = McpClient::connect(&gateway.url, TOKEN).await;
    let result = client
        .call("tracker.issues.get", json!({"number": 7}))
        .await
        .unwrap();
    assert_eq!(result.is_error, Some(false));
    client.close().await;
}
