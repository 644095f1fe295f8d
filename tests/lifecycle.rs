//! The invocation lifecycle's accounting and ownership rules (issue 8): `attempt_count` equals
//! the requests that may have reached the vendor on every path, a slot's facts are its own,
//! and a call runs to its final write whether or not its client stays.

use std::time::Duration;

use serde_json::{Value, json};

use crate::approvals::{AGENT, approve, held, prod_config_at, resumer};
use crate::idempotency::{key, meta};
use crate::support::vendor::{ScriptedVendor, Step};
use crate::support::{GatewayConfig, GatewayProcess, McpClient, TOKEN};

const REFUND: &str = "stripe.create_refund";

fn refund_args() -> Value {
    json!({"charge": "ch_42", "amount": 500})
}

fn refunded() -> Step {
    Step::answer(
        200,
        json!({"id": "re_1", "object": "refund", "amount": 500, "charge": "ch_42", "status": "succeeded"}),
    )
}

/// The ways one invocation can go, as the vendor and the gateway make them happen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Path {
    Accepted,
    DefinitelyRejected,
    RetryableThenAccepted,
    RetryableThenRefusedAtConnect,
    RefusedAtConnect,
    PostSendFailure,
    HolderKilled,
    FinalizeWriteFailing,
}

const PATHS: [Path; 8] = [
    Path::Accepted,
    Path::DefinitelyRejected,
    Path::RetryableThenAccepted,
    Path::RetryableThenRefusedAtConnect,
    Path::RefusedAtConnect,
    Path::PostSendFailure,
    Path::HolderKilled,
    Path::FinalizeWriteFailing,
];

impl Path {
    fn script(self) -> Vec<Step> {
        let busy = || Step::answer(503, json!({"error": {"message": "busy"}}));
        match self {
            Path::Accepted | Path::HolderKilled | Path::FinalizeWriteFailing => vec![refunded()],
            Path::DefinitelyRejected => {
                vec![Step::answer(
                    400,
                    json!({"error": {"message": "no such charge"}}),
                )]
            }
            Path::RetryableThenAccepted => vec![busy(), refunded()],
            Path::RetryableThenRefusedAtConnect => vec![busy(), Step::Close],
            Path::RefusedAtConnect => vec![Step::Close],
            // Longer than the test config's 1.5 s request timeout.
            Path::PostSendFailure => vec![Step::Answer {
                status: 200,
                body: json!({}),
                delay: Duration::from_secs(3),
            }],
        }
    }

    fn failpoints(self) -> Option<&'static str> {
        match self {
            Path::HolderKilled => Some("hang-after-send"),
            // The first two final writes fail; the kept outcome is recorded on a later try.
            Path::FinalizeWriteFailing => Some("store-finalize=2"),
            _ => None,
        }
    }

    /// What the vendor must have received by the end of one call.
    fn expected_requests(self) -> usize {
        match self {
            Path::RefusedAtConnect => 0,
            Path::RetryableThenAccepted => 2,
            _ => 1,
        }
    }
}

/// How the call reaches its slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Entry {
    Fresh,
    ApprovedResume,
}

fn config(entry: Entry, vendor: &str, dir: &std::path::Path, path: Path) -> GatewayConfig {
    let mut config = match entry {
        Entry::Fresh => GatewayConfig::new(vendor),
        Entry::ApprovedResume => prod_config_at(vendor),
    };
    // The shortest lease the config accepts: 2 x (1.5 s request timeout + 0.5 s deadline).
    config.store = Some(format!(
        "path = {:?}\nlease_ms = 4000",
        dir.join("state.redb")
    ));
    if let Some(failpoints) = path.failpoints() {
        config.env = vec![("OBOL_FAILPOINTS".into(), failpoints.into())];
    }
    config
}

/// Every receipt of the gateway's workspace, as a key with the receipts scope reads them.
pub async fn receipts(gateway: &GatewayProcess, token: &str) -> Vec<Value> {
    let url = gateway.url.replace("/mcp", "/v1/receipts?limit=1000");
    let listed: Value = reqwest::Client::new()
        .get(url)
        .bearer_auth(token)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    listed["receipts"].as_array().cloned().unwrap_or_default()
}

fn attempts(receipts: &[Value]) -> u64 {
    receipts
        .iter()
        .map(|r| r["attempt_count"].as_u64().unwrap())
        .sum()
}

/// Waits until the receipts' attempts add up to at least `want` (a sweeper or a background
/// write may still be on its way), or 12 s pass.
async fn settled_attempts(gateway: &GatewayProcess, token: &str, want: u64) -> u64 {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(12);
    loop {
        let sum = attempts(&receipts(gateway, token).await);
        if sum >= want || tokio::time::Instant::now() > deadline {
            return sum;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// One row of the matrix: makes the call, lets the path play out, and returns (requests the
/// vendor received, attempts the receipts count).
async fn run(entry: Entry, path: Path) -> (usize, u64) {
    let vendor = ScriptedVendor::start(path.script()).await;
    let dir = tempfile::tempdir().unwrap();
    let config = config(entry, &vendor.base_url(), dir.path(), path);
    let gateway = GatewayProcess::start_in(&config, dir);
    let k = key("matrix");
    let (token, client) = match entry {
        Entry::Fresh => (TOKEN, McpClient::with_key(&gateway.url, TOKEN, &k).await),
        Entry::ApprovedResume => {
            let data = held(&gateway, &k, refund_args()).await;
            let id = data["approval"]["approval_id"].as_str().unwrap().to_owned();
            let approval_token = approve(&gateway, &id).await;
            (
                AGENT,
                resumer(&gateway, AGENT, &id, &approval_token, None).await,
            )
        }
    };
    let gateway = if path == Path::HolderKilled {
        let pending = tokio::spawn(async move { client.call(REFUND, refund_args()).await });
        gateway.wait_for_log("failpoint hang-after-send").await;
        let dir = gateway.kill();
        pending.abort();
        let mut config = config;
        config.env.clear();
        // Nobody calls again: the restarted gateway's sweeper settles the dead holder.
        GatewayProcess::start_in(&config, dir)
    } else {
        let _ = client.call(REFUND, refund_args()).await;
        gateway
    };
    let want = path.expected_requests() as u64;
    let counted = settled_attempts(&gateway, token, want).await;
    (vendor.received(), counted)
}

async fn matrix(entry: Entry) {
    let mut rows = Vec::new();
    for path in PATHS {
        let (received, counted) = run(entry, path).await;
        rows.push((path, received, counted));
    }
    let report = format!("{entry:?}: (path, vendor received, receipts count) {rows:?}");
    for (path, received, counted) in &rows {
        assert_eq!(
            *received,
            path.expected_requests(),
            "{path:?} did not play out: {report}"
        );
        assert_eq!(*received as u64, *counted, "{path:?}: {report}");
    }
}

#[tokio::test]
async fn attempt_count_equals_vendor_requests_on_every_fresh_path() {
    matrix(Entry::Fresh).await;
}

#[tokio::test]
async fn attempt_count_equals_vendor_requests_on_every_approved_resume_path() {
    matrix(Entry::ApprovedResume).await;
}

/// Bug 1: a retryable answer whose retry is refused at connect is the first attempt's
/// outcome, with its receipt: the vendor did receive one request.
#[tokio::test]
async fn a_retry_refused_at_connect_finalizes_the_first_attempt() {
    let vendor = ScriptedVendor::start(vec![
        Step::answer(503, json!({"error": {"message": "busy"}})),
        Step::Close,
    ])
    .await;
    let gateway = GatewayProcess::start(&GatewayConfig::new(&vendor.base_url()));
    let client = McpClient::with_key(&gateway.url, TOKEN, &key("retry_refused")).await;
    let result = client.call(REFUND, refund_args()).await.unwrap();
    assert_eq!(vendor.received(), 1);
    let obol = meta(&result);
    assert_eq!(obol["attempt_count"], json!(1));
    assert_eq!(obol["outcome"], json!("unknown"));
    assert_eq!(obol["vendor_status"], json!(503));
    let receipt = crate::idempotency::receipt(&gateway, obol["receipt_id"].as_str().unwrap()).await;
    assert_eq!(receipt["attempt_count"], json!(1));
}

/// Bug 10: a client that hangs up after its claim does not lose the outcome; the retry
/// replays what the vendor really did.
#[tokio::test]
async fn a_client_that_hangs_up_mid_call_finds_the_real_outcome() {
    let vendor = ScriptedVendor::start(vec![Step::Answer {
        status: 200,
        body: json!({"number": 9, "title": "t", "state": "open", "url": "u", "html_url": "u"}),
        delay: Duration::from_millis(800),
    }])
    .await;
    let gateway = GatewayProcess::start(&GatewayConfig::new(&vendor.base_url()));
    let k = key("hangup");
    let client = McpClient::with_key(&gateway.url, TOKEN, &k).await;
    // tracker.issues.create has no vendor binding: before the fix, the abandoned call's slot
    // became a permanent `unknown`.
    let pending = tokio::spawn(async move {
        client
            .call("tracker.issues.create", json!({"title": "t"}))
            .await
    });
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while vendor.received() == 0 {
        assert!(tokio::time::Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    pending.abort();
    let _ = pending.await;
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let again = McpClient::with_key(&gateway.url, TOKEN, &k).await;
    let replay = again
        .call("tracker.issues.create", json!({"title": "t"}))
        .await
        .unwrap();
    assert_eq!(replay.is_error, Some(false), "{replay:?}");
    assert_eq!(meta(&replay)["replayed"], json!(true));
    assert_eq!(meta(&replay)["outcome"], json!("accepted"));
    assert_eq!(vendor.received(), 1);
}

/// Bug 5: the final write fails a few times, then the store recovers: one vendor request,
/// same-key calls meanwhile get `not_ready`, and the replay returns the real outcome.
#[tokio::test]
async fn an_outcome_whose_write_failed_is_recorded_later_and_replayed() {
    let vendor = ScriptedVendor::start(vec![Step::answer(
        201,
        json!({"number": 8, "title": "New", "state": "open", "url": "u", "html_url": "u"}),
    )])
    .await;
    let mut config = GatewayConfig::new(&vendor.base_url());
    config.env = vec![("OBOL_FAILPOINTS".into(), "store-finalize=4".into())];
    let gateway = GatewayProcess::start(&config);
    let k = key("recover");
    let client = McpClient::with_key(&gateway.url, TOKEN, &k).await;
    let args = json!({"title": "audit"});
    let (code, _, data) = client.call_err("tracker.issues.create", args.clone()).await;
    let data = data.unwrap();
    assert_eq!((code, data["type"].clone()), (-32000, json!("not_ready")));
    // Tries at +0.1, +0.3, +0.7 s fail; the one at +1.5 s succeeds.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let replay = loop {
        match client.call("tracker.issues.create", args.clone()).await {
            Ok(result) => break result,
            Err(_) => {
                assert!(tokio::time::Instant::now() < deadline, "never recorded");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    assert_eq!(replay.is_error, Some(false));
    assert_eq!(meta(&replay)["replayed"], json!(true));
    assert_eq!(meta(&replay)["outcome"], json!("accepted"));
    assert_eq!(vendor.received(), 1);
}

/// Bug 6: every authenticated `tools/call` answer names the effective key, errors raised
/// before the claim included; `Unknown tool` keeps its bytes and gains only the header.
#[tokio::test]
async fn every_call_answer_names_its_idempotency_key() {
    let vendor = ScriptedVendor::start(vec![]).await;
    let gateway = GatewayProcess::start(&GatewayConfig::new(&vendor.base_url()));
    let raw = crate::support::RawMcp::new(&gateway.url);
    let (session, _) = raw.initialize(TOKEN, "2025-11-25").await;
    let call = |params: Value| {
        let (raw, session) = (&raw, session.clone());
        async move {
            let body = json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": params});
            raw.post(Some(TOKEN), Some(&session), &body.to_string(), &[])
                .await
        }
    };
    // Invalid arguments: refused before the claim, with a minted key.
    let invalid = call(json!({"name": REFUND, "arguments": {"charge": 5}})).await;
    let minted = invalid
        .header("idempotency-key")
        .expect("minted key header")
        .to_owned();
    assert!(minted.starts_with("idt_"));
    let refused = &invalid.message()["result"];
    assert_eq!(refused["isError"], json!(true), "{invalid:?}");
    assert_eq!(
        refused["_meta"]["obol"]["error"],
        json!("invalid_arguments")
    );
    assert_eq!(refused["_meta"]["obol"]["idempotency_key"], json!(minted));
    // Unknown tool: the header, and the very same body as ever.
    let unknown = call(json!({"name": "nope.nothing"})).await;
    assert!(unknown.header("idempotency-key").is_some());
    assert_eq!(
        unknown.message()["error"],
        json!({"code": -32602, "message": "Unknown tool"})
    );
    // Invalid params (no name): the header too.
    let no_name = call(json!({})).await;
    assert!(no_name.header("idempotency-key").is_some());
    // A refusal before the MCP server runs (an approval header alone) names a supplied key.
    let supplied = key("supplied");
    let body = json!({"jsonrpc": "2.0", "id": 8, "method": "tools/call", "params": {"name": REFUND, "arguments": refund_args()}});
    let refused = raw
        .post(
            Some(TOKEN),
            Some(&session),
            &body.to_string(),
            &[
                ("idempotency-key", supplied.as_str()),
                ("obol-approval-id", "apr_00000000000000000000000000000000"),
            ],
        )
        .await;
    assert_eq!(refused.error_type(), "approval_invalid", "{refused:?}");
    assert_eq!(refused.header("idempotency-key"), Some(supplied.as_str()));
    assert_eq!(
        refused.message()["error"]["data"]["idempotency_key"],
        json!(supplied)
    );
    assert_eq!(vendor.received(), 0);
}

/// Starts a dev gateway on `vendor` with a 4 s lease, in its own state directory.
fn leased(vendor: &str, failpoints: Option<&str>) -> (GatewayConfig, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let mut config = GatewayConfig::new(vendor).with_key("obk_test_second", "acme", &["tracker.*"]);
    config.store = Some(format!(
        "path = {:?}\nlease_ms = 4000",
        dir.path().join("state.redb")
    ));
    if let Some(failpoints) = failpoints {
        config.env = vec![("OBOL_FAILPOINTS".into(), failpoints.into())];
    }
    (config, dir)
}

/// Bug 3: a dead holder's slot is settled with the dead call's own facts, even when another
/// key of the workspace is the one that finds it.
#[tokio::test]
async fn a_dead_holders_receipt_names_the_dead_call_not_the_next_caller() {
    let vendor = ScriptedVendor::start(vec![]).await;
    let (mut config, dir) = leased(&vendor.base_url(), Some("hang-after-send"));
    let gateway = GatewayProcess::start_in(&config, dir);
    let k = key("dead");
    let args = json!({"title": "dead"});
    let client = McpClient::with_key(&gateway.url, TOKEN, &k).await;
    let pending = tokio::spawn({
        let args = args.clone();
        async move { client.call("tracker.issues.create", args).await }
    });
    gateway.wait_for_log("failpoint hang-after-send").await;
    let dir = gateway.kill();
    pending.abort();
    config.env.clear();
    let restarted = GatewayProcess::start_in(&config, dir);
    tokio::time::sleep(Duration::from_millis(4100)).await;
    // Another key of the workspace asks about the same slot once the lease is over.
    let other = McpClient::with_key(&restarted.url, "obk_test_second", &k).await;
    let (code, _, data) = other.call_err("tracker.issues.create", args).await;
    let data = data.unwrap();
    assert_eq!(
        (code, data["type"].clone()),
        (-32019, json!("upstream_timeout"))
    );
    let receipt =
        crate::idempotency::receipt(&restarted, data["receipt_id"].as_str().unwrap()).await;
    assert_eq!(receipt["key_name"], json!("key-0"), "{receipt}");
    assert_eq!(receipt["outcome"], json!("unknown"));
    assert_eq!(receipt["attempt_count"], json!(1));
    assert_eq!(vendor.received(), 1);
}

/// Bug 4: once an approved call finalized `unknown` on a tool with a vendor binding, only a
/// valid token for that approval resends it; a plain same-key call replays.
#[tokio::test]
async fn an_approved_unknown_is_resent_only_under_its_token() {
    let vendor = ScriptedVendor::start(vec![
        // Longer than the 1.5 s request timeout: the outcome is unknown.
        Step::Answer {
            status: 200,
            body: json!({}),
            delay: Duration::from_secs(3),
        },
        refunded(),
    ])
    .await;
    let gateway = GatewayProcess::start(&prod_config_at(&vendor.base_url()));
    let k = key("approved_unknown");
    let data = held(&gateway, &k, refund_args()).await;
    let id = data["approval"]["approval_id"].as_str().unwrap().to_owned();
    let token = approve(&gateway, &id).await;
    let resume = resumer(&gateway, AGENT, &id, &token, None).await;
    let (_, _, data) = resume.call_err(REFUND, refund_args()).await;
    assert_eq!(data.unwrap()["type"], json!("upstream_timeout"));
    assert_eq!(vendor.received(), 1);
    // A plain call under the same key, without the token: the stored unknown, nothing sent.
    let plain = McpClient::with_key(&gateway.url, AGENT, &k).await;
    let (_, _, data) = plain.call_err(REFUND, refund_args()).await;
    assert_eq!(data.unwrap()["type"], json!("upstream_timeout"));
    assert_eq!(vendor.received(), 1, "a plain call resent an approved slot");
    // Under the token it is resent once, with the same key.
    let done = resume.call(REFUND, refund_args()).await.unwrap();
    assert_eq!(done.is_error, Some(false));
    assert_eq!(meta(&done)["attempt_count"], json!(2));
    assert_eq!(vendor.received(), 2);
}

const WAIVER: &str = r#"@id("agents-call")
permit(principal, action in [Obol::Action::"list", Obol::Action::"call"], resource);
@id("key-0-unattended")
permit(principal == Obol::Key::"key-0", action == Obol::Action::"call_without_approval", resource);"#;

/// Bug 9, first route: key A (waived) finds the vendor unreachable; key B (not waived)
/// repeats A's idempotency key: B's call is held for approval, never sent unapproved, and A
/// cannot take B's hold either.
#[tokio::test]
async fn a_released_slot_is_held_before_a_call_that_needs_approval_takes_it() {
    let vendor = ScriptedVendor::start(vec![Step::Close]).await;
    let mut config = prod_config_at(&vendor.base_url());
    config.publications = vec![(1, WAIVER.into())];
    let gateway = GatewayProcess::start(&config);
    let k = key("bypass");
    let waived = McpClient::with_key(&gateway.url, AGENT, &k).await;
    let (_, _, data) = waived.call_err(REFUND, refund_args()).await;
    assert_eq!(data.unwrap()["type"], json!("upstream_unreachable"));
    vendor.reopen(vec![refunded()]).await;
    let other = McpClient::with_key(&gateway.url, "obk_prod_other", &k).await;
    let (code, _, data) = other.call_err(REFUND, refund_args()).await;
    assert_eq!(code, -32003, "{data:?}");
    assert_eq!(vendor.received(), 0, "sent without approval");
    // The hold is B's: A repeating the key conflicts instead of taking it over.
    let (_, _, data) = waived.call_err(REFUND, refund_args()).await;
    assert_eq!(data.unwrap()["type"], json!("idempotency_conflict"));
    assert_eq!(vendor.received(), 0);
}

/// Bug 9, second route: the same key retries after a publication removed its waiver.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_after_the_waiver_was_withdrawn_is_held() {
    let vendor = ScriptedVendor::start(vec![Step::Close]).await;
    let mut config = prod_config_at(&vendor.base_url());
    config.publications = vec![(1, WAIVER.into())];
    config.extra = format!(
        "\n[admin]\ntoken_hash = \"{}\"\n",
        crate::support::key_hash(crate::admin::ADMIN)
    );
    let gateway = GatewayProcess::start(&config);
    let k = key("withdrawn");
    let client = McpClient::with_key(&gateway.url, AGENT, &k).await;
    let (_, _, data) = client.call_err(REFUND, refund_args()).await;
    assert_eq!(data.unwrap()["type"], json!("upstream_unreachable"));
    let cedar = gateway.dir.path().join("no-waiver.cedar");
    std::fs::write(
        &cedar,
        r#"@id("agents-call") permit(principal, action in [Obol::Action::"list", Obol::Action::"call"], resource);"#,
    )
    .unwrap();
    let (code, published) = tokio::task::block_in_place(|| {
        crate::admin::obol(
            &gateway,
            &[
                "policies",
                "publish",
                "--workspace",
                "acme",
                cedar.to_str().unwrap(),
            ],
        )
    });
    assert_eq!(code, 0, "{published}");
    vendor.reopen(vec![refunded()]).await;
    let again = McpClient::with_key(&gateway.url, AGENT, &k).await;
    let (code, _, data) = again.call_err(REFUND, refund_args()).await;
    assert_eq!(code, -32003, "{data:?}");
    assert_eq!(vendor.received(), 0, "sent without approval");
}

/// `hostile.echo` with these arguments (raw JSON text, sent as written) under `key`.
async fn echo_under_key(
    raw: &crate::support::RawMcp,
    session: &str,
    arguments: &str,
    key: &str,
) -> crate::support::client::RawResponse {
    let body = format!(
        r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"name":"hostile.echo","arguments":{arguments}}}}}"#
    );
    raw.post(
        Some(TOKEN),
        Some(session),
        &body,
        &[("idempotency-key", key)],
    )
    .await
}

/// Bug 7: 2^53 and 2^53+1 would hash alike as doubles; the second is refused rather than
/// replaying the first call's result, and near-equal exact numbers are different calls.
#[tokio::test]
async fn numbers_a_double_cannot_carry_are_refused_not_collided() {
    let vendor = crate::support::MockVendor::start().await;
    let gateway = GatewayProcess::start(&GatewayConfig::new(&vendor.base_url()));
    let raw = crate::support::RawMcp::new(&gateway.url);
    let (session, _) = raw.initialize(TOKEN, "2025-11-25").await;
    let k = key("numbers");
    let call = |arguments: &'static str| echo_under_key(&raw, &session, arguments, &k);
    let first = call(r#"{"n": 9007199254740992}"#).await;
    assert_eq!(
        first.message()["result"]["isError"],
        json!(false),
        "{first:?}"
    );
    // As a fraction it parses to the same double as 2^53: the call that used to replay the
    // first one's result. (As an integer it was already hashed exactly.)
    let inexact = call(r#"{"n": 9007199254740993.0}"#).await;
    let refused = &inexact.message()["result"];
    assert_eq!(
        refused["_meta"]["obol"]["error"],
        json!("invalid_arguments"),
        "{inexact:?}"
    );
    let message = refused["content"].to_string();
    assert!(
        message.contains("/n") && !message.contains("9007199254740993"),
        "{message}"
    );
    assert_eq!(vendor.seen().len(), 1);
    // Exact but different numbers are another call under the same key: a conflict.
    let other = call(r#"{"n": 9007199254740994}"#).await;
    assert_eq!(other.error_type(), "idempotency_conflict", "{other:?}");
    // The same value spelled differently is the same call: a replay.
    let same = call(r#"{"n": 9.007199254740992e15}"#).await;
    assert_eq!(
        same.message()["result"]["_meta"]["obol"]["replayed"],
        json!(true),
        "{same:?}"
    );
    assert_eq!(vendor.seen().len(), 1);
}

/// A result nested deeper than the gateway keeps (the echo's structured output is the
/// arguments, 124 objects deep) used to be answered once and then make its claim record
/// unreadable: the record nests the result five levels further, past the JSON reader's
/// 128-level limit, so the retry under the same key failed instead of replaying. Now such a
/// result is refused once, by name, and its retry replays the refusal; a result within the
/// limit is answered and replayed whole. The vendor sees one request per key.
#[tokio::test]
async fn a_result_too_deep_to_keep_is_refused_and_replays_as_refused() {
    let vendor = crate::support::MockVendor::start().await;
    let gateway = GatewayProcess::start(&GatewayConfig::new(&vendor.base_url()));
    let raw = crate::support::RawMcp::new(&gateway.url);
    let (session, _) = raw.initialize(TOKEN, "2025-11-25").await;
    let nested = |depth: usize| format!("{}1{}", r#"{"a":"#.repeat(depth), "}".repeat(depth));
    let deep = key("deep");
    let refused = echo_under_key(&raw, &session, &nested(124), &deep).await;
    assert_eq!(refused.error_type(), "result_too_deep", "{refused:?}");
    let error = refused.message()["error"].clone();
    assert!(
        error["message"].as_str().unwrap().contains("100 levels"),
        "{error}"
    );
    let again = echo_under_key(&raw, &session, &nested(124), &deep).await;
    assert_eq!(again.message()["error"], error, "{again:?}");
    assert_eq!(vendor.seen().len(), 1);
    let within = key("within");
    let depth = 99;
    for attempt in 0..2 {
        let answer = echo_under_key(&raw, &session, &nested(depth), &within).await;
        let result = &answer.message()["result"];
        assert_eq!(result["isError"], json!(false), "{answer:?}");
        assert_eq!(result["_meta"]["obol"]["replayed"], json!(attempt == 1));
        let mut inner = &result["structuredContent"];
        for _ in 0..depth {
            inner = &inner["a"];
        }
        assert_eq!(inner, &json!(1), "{answer:?}");
    }
    assert_eq!(vendor.seen().len(), 2);
}

/// Review of bug 5: a store that refuses the lease renewal may still take the final write;
/// the kept outcome is tried while the lease runs instead of being given up at once.
#[tokio::test]
async fn a_failed_renewal_does_not_give_the_kept_outcome_up() {
    let vendor = ScriptedVendor::start(vec![Step::answer(
        201,
        json!({"number": 8, "title": "New", "state": "open", "url": "u", "html_url": "u"}),
    )])
    .await;
    let mut config = GatewayConfig::new(&vendor.base_url());
    config.env = vec![(
        "OBOL_FAILPOINTS".into(),
        "store-finalize=1,store-transition=2".into(),
    )];
    let gateway = GatewayProcess::start(&config);
    let client = McpClient::with_key(&gateway.url, TOKEN, &key("renewal")).await;
    let args = json!({"title": "renewal"});
    let (_, _, data) = client.call_err("tracker.issues.create", args.clone()).await;
    assert_eq!(data.unwrap()["type"], json!("not_ready"));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let replay = loop {
        match client.call("tracker.issues.create", args.clone()).await {
            Ok(result) => break result,
            Err(_) => {
                assert!(tokio::time::Instant::now() < deadline, "{}", gateway.log());
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    assert_eq!(meta(&replay)["outcome"], json!("accepted"));
    assert_eq!(vendor.received(), 1);
}

/// Issue 9: a vendor deduplicates on the key for a limited time (24 h by default). After it,
/// an `unknown` call with a vendor binding replays as unknown instead of being resent.
#[tokio::test]
async fn an_unknown_past_the_vendors_window_is_not_resent() {
    let vendor = ScriptedVendor::start(vec![Step::Answer {
        status: 200,
        body: json!({}),
        delay: Duration::from_secs(3),
    }])
    .await;
    let (mut config, dir) = leased(&vendor.base_url(), None);
    let gateway = GatewayProcess::start_in(&config, dir);
    let k = key("window");
    let client = McpClient::with_key(&gateway.url, TOKEN, &k).await;
    let (_, _, data) = client.call_err(REFUND, refund_args()).await;
    assert_eq!(data.unwrap()["type"], json!("upstream_timeout"));
    assert_eq!(vendor.received(), 1);
    // A day and an hour later (the gateway's clock runs ahead), the same key replays.
    let dir = gateway.kill();
    config.env = vec![(
        "OBOL_CLOCK_OFFSET_MS".into(),
        (25 * 3_600_000u64).to_string(),
    )];
    let later = GatewayProcess::start_in(&config, dir);
    let client = McpClient::with_key(&later.url, TOKEN, &k).await;
    let (_, _, data) = client.call_err(REFUND, refund_args()).await;
    assert_eq!(data.unwrap()["type"], json!("upstream_timeout"));
    assert_eq!(vendor.received(), 1, "resent after the vendor's window");
}
