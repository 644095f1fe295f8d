//! A destructive production call happens only after a human said yes to that exact call
//! (issue 4, approvals): the hold, the inbox, signed tokens, and every way a resume can fail.

use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};

use crate::idempotency::key;
use crate::support::browser::Browser;
use crate::support::gateway::Key;
use crate::support::{GatewayConfig, GatewayProcess, McpClient, MockVendor, RawMcp};

pub const OWNER: &str = "obo_test_acme_owner";
/// A prod key that names the destructive tool verbatim, with the approvals scope.
pub const AGENT: &str = "obk_prod_agent";
/// Another key of the same workspace.
const OTHER: &str = "obk_prod_other";
const NO_APPROVALS: &str = "obk_prod_no_approvals";
const REFUND: &str = "stripe.create_refund";

fn prod_key(token: &str, scopes: &[&str]) -> Key {
    let mut key = Key::new(
        token,
        "acme",
        &["stripe.create_refund", "stripe.charges.list"],
    );
    key.environment = "prod".into();
    key.scopes = scopes.iter().map(|s| s.to_string()).collect();
    key
}

pub fn prod_config(vendor: &MockVendor) -> GatewayConfig {
    prod_config_at(&vendor.base_url())
}

pub fn prod_config_at(vendor: &str) -> GatewayConfig {
    let mut config = GatewayConfig::new(vendor);
    config.environment = Some("prod".into());
    config.owner = Some(OWNER.into());
    config.keys = vec![
        prod_key(AGENT, &["mcp", "receipts", "approvals"]),
        prod_key(OTHER, &["mcp", "approvals"]),
        prod_key(NO_APPROVALS, &["mcp"]),
    ];
    config
}

/// Writes signing keys into `dir` and returns the `[approvals]` table: `signer` signs, the
/// others only verify.
fn signing(
    dir: &Path,
    signer: (&str, &ed25519_dalek::SigningKey),
    verifiers: &[(&str, &ed25519_dalek::SigningKey)],
) -> String {
    let file = dir.join(format!("{}.key", signer.0));
    std::fs::write(&file, hex::encode(signer.1.to_bytes())).unwrap();
    let verify: Vec<String> = verifiers
        .iter()
        .map(|(id, key)| {
            format!(
                "{{ id = {id:?}, public_key = \"{}\" }}",
                hex::encode(key.verifying_key().to_bytes())
            )
        })
        .collect();
    format!(
        "\n[approvals]\nsigning_key = {{ id = {:?}, file = {:?} }}\nverify_keys = [{}]\n",
        signer.0,
        file,
        verify.join(", ")
    )
}

fn refund_vendor(vendor: &MockVendor) {
    vendor.on(
        "/v1/refunds",
        crate::support::Reply::json(
            200,
            json!({"id": "re_1", "object": "refund", "amount": 500, "charge": "ch_42", "status": "succeeded"}),
        ),
    );
}

fn base(gateway: &GatewayProcess) -> String {
    gateway.url.trim_end_matches("/mcp").to_owned()
}

/// Calls the refund and expects the hold; returns `error.data`.
pub async fn held(gateway: &GatewayProcess, idempotency_key: &str, args: Value) -> Value {
    let client = McpClient::with_key(&gateway.url, AGENT, idempotency_key).await;
    let data = held_by(&client, args).await;
    assert_eq!(data["type"], json!("approval_required"));
    data
}

/// `GET /v1/approvals/{id}` as `token`.
pub async fn approval(gateway: &GatewayProcess, token: &str, id: &str) -> (u16, Value) {
    let response = reqwest::Client::new()
        .get(format!("{}/v1/approvals/{id}", base(gateway)))
        .bearer_auth(token)
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

/// The owner in the inbox, over plain HTTP (the browser test below clicks the same forms).
struct OwnerSession {
    base: String,
    cookie: String,
    http: reqwest::Client,
}

fn form(pairs: &[(&str, &str)]) -> String {
    url::form_urlencoded::Serializer::new(String::new())
        .extend_pairs(pairs)
        .finish()
}

impl OwnerSession {
    async fn sign_in(gateway: &GatewayProcess, token: &str) -> Result<OwnerSession, u16> {
        let http = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .unwrap();
        let base = base(gateway);
        let response = http
            .post(format!("{base}/inbox/login"))
            .header("content-type", "application/x-www-form-urlencoded")
            .body(form(&[("token", token), ("next", "/inbox")]))
            .send()
            .await
            .unwrap();
        if response.status() != 303 {
            return Err(response.status().as_u16());
        }
        let cookie = response.headers()["set-cookie"]
            .to_str()
            .unwrap()
            .to_owned();
        assert!(cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"));
        let cookie = cookie.split(';').next().unwrap().to_owned();
        Ok(OwnerSession { base, cookie, http })
    }

    async fn page(&self, path: &str) -> String {
        self.http
            .get(format!("{}{path}", self.base))
            .header("cookie", &self.cookie)
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }

    async fn csrf(&self) -> String {
        let page = self.page("/inbox").await;
        let at = page
            .find("name=\"csrf\" value=\"")
            .expect("a pending ticket's form")
            + 19;
        page[at..at + 64].to_owned()
    }

    async fn decide(&self, id: &str, decision: &str, csrf: &str, origin: Option<&str>) -> u16 {
        let mut request = self
            .http
            .post(format!("{}/inbox/{id}/decide", self.base))
            .header("cookie", &self.cookie)
            .header("content-type", "application/x-www-form-urlencoded")
            .body(form(&[("csrf", csrf), ("decision", decision)]));
        if let Some(origin) = origin {
            request = request.header("origin", origin);
        }
        request.send().await.unwrap().status().as_u16()
    }
}

/// A client that resumes: the approval headers (and optionally an idempotency key) on every
/// request.
pub async fn resumer(
    gateway: &GatewayProcess,
    token: &str,
    id: &str,
    approval_token: &str,
    idempotency_key: Option<&str>,
) -> McpClient {
    let mut headers = vec![
        ("obol-approval-id", id),
        ("obol-approval-token", approval_token),
    ];
    if let Some(k) = idempotency_key {
        headers.push(("idempotency-key", k));
    }
    McpClient::connect_with_headers(&gateway.url, token, &headers)
        .await
        .unwrap()
}

/// A resume whose headers are refused before the MCP server runs: checked on `initialize`.
async fn refused_before_mcp(
    gateway: &GatewayProcess,
    token: &str,
    headers: &[(&str, &str)],
) -> (u16, String) {
    let body = json!({
        "jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}}
    });
    let r = RawMcp::new(&gateway.url)
        .post(Some(token), None, &body.to_string(), headers)
        .await;
    (r.status, r.error_type())
}

/// The owner approves `id` in the inbox; returns the agent's token.
/// The owner's inbox page, as the owner sees it.
pub async fn inbox(gateway: &GatewayProcess) -> String {
    let owner = OwnerSession::sign_in(gateway, OWNER).await.unwrap();
    owner.page("/inbox").await
}

pub async fn approve(gateway: &GatewayProcess, id: &str) -> String {
    let owner = OwnerSession::sign_in(gateway, OWNER).await.unwrap();
    let csrf = owner.csrf().await;
    assert_eq!(owner.decide(id, "approve", &csrf, None).await, 303);
    let (status, body) = approval(gateway, AGENT, id).await;
    assert_eq!((status, body["status"].as_str()), (200, Some("approved")));
    body["token"].as_str().unwrap().to_owned()
}

#[tokio::test]
async fn a_held_call_runs_once_after_the_owner_approves() {
    let vendor = MockVendor::start().await;
    refund_vendor(&vendor);
    let gateway = GatewayProcess::start(&prod_config(&vendor));
    let k = key("approve");
    let args = json!({"charge": "ch_42", "amount": 500});

    // Held: -32003 with the approval object, and nothing sent.
    let data = held(&gateway, &k, args.clone()).await;
    let notice = &data["approval"];
    let id = notice["approval_id"].as_str().unwrap().to_owned();
    assert!(id.starts_with("apr_"), "{notice}");
    assert_eq!(notice["tool"], json!(REFUND));
    assert_eq!(
        notice["inbox_url"],
        json!(format!("{}/inbox/{id}", base(&gateway)))
    );
    let expires = notice["expires_at"].as_str().unwrap();
    assert!(expires.ends_with('Z') && expires.len() == 20, "{expires}");
    assert_eq!(data["idempotency_key"], json!(k));
    assert!(vendor.seen().is_empty());

    // Asking again holds the same slot under the same ticket.
    let again = held(&gateway, &k, args.clone()).await;
    assert_eq!(again["approval"]["approval_id"], json!(id));

    // Only the key that asked may read it, and only with the approvals scope.
    let (status, pending) = approval(&gateway, AGENT, &id).await;
    assert_eq!(status, 200);
    assert_eq!(pending["status"], json!("pending"));
    assert_eq!(pending["token"], Value::Null);
    assert_eq!(approval(&gateway, OTHER, &id).await.0, 404);
    let (status, body) = approval(&gateway, NO_APPROVALS, &id).await;
    assert_eq!(
        (status, body["error"]["type"].as_str()),
        (403, Some("scope_denied"))
    );

    // The owner approves; the agent fetches its token and repeats the call with it.
    let token = approve(&gateway, &id).await;
    let client = resumer(&gateway, AGENT, &id, &token, None).await;
    let done = client.call(REFUND, args.clone()).await.unwrap();
    assert_eq!(done.is_error, Some(false));
    let meta = crate::idempotency::meta(&done);
    assert_eq!(
        meta["idempotency_key"],
        json!(k),
        "the approved key is used"
    );
    assert_eq!(vendor.count("/v1/refunds"), 1);
    assert_eq!(
        vendor.seen()[0].header("idempotency-key"),
        Some(k.as_str()),
        "the vendor sees the key the call was held under"
    );

    // Repeating the resume (or the plain call) replays: still one refund.
    let replay = client.call(REFUND, args.clone()).await.unwrap();
    assert_eq!(crate::idempotency::meta(&replay)["replayed"], json!(true));
    let plain = McpClient::with_key(&gateway.url, AGENT, &k).await;
    let replay = plain.call(REFUND, args).await.unwrap();
    assert_eq!(crate::idempotency::meta(&replay)["replayed"], json!(true));
    assert_eq!(vendor.count("/v1/refunds"), 1);

    // The receipt names the approval.
    let receipt =
        crate::idempotency::receipt_as(&gateway, AGENT, meta["receipt_id"].as_str().unwrap()).await;
    assert_eq!(receipt["approval_id"], json!(id));
    assert_eq!(receipt["outcome"], json!("accepted"));
    assert_eq!(receipt["attempt_count"], json!(1));
}

#[tokio::test]
async fn the_owner_approves_in_a_real_browser() {
    let vendor = MockVendor::start().await;
    refund_vendor(&vendor);
    let gateway = GatewayProcess::start(&prod_config(&vendor));
    let k = key("browser");
    let args = json!({"charge": "ch_browser_secret_value", "amount": 1250});
    let data = held(&gateway, &k, args.clone()).await;
    let id = data["approval"]["approval_id"].as_str().unwrap().to_owned();
    let inbox_url = data["approval"]["inbox_url"].as_str().unwrap().to_owned();

    let browser = Browser::start().await;
    browser.client.goto(&inbox_url).await.unwrap();
    // Not signed in: the sign-in form, which brings the owner back to this ticket.
    browser.fill("#token", "not-the-owner").await;
    browser.click("#sign-in").await;
    assert!(browser.text_of("#problem").await.contains("not valid"));
    browser.fill("#token", OWNER).await;
    browser.click("#sign-in").await;
    let text = browser.text_of(&format!("#ticket-{id}")).await;
    for expected in [
        REFUND,
        "stripe-main",
        "amount = 1250",
        "key-0",
        "s ago",
        "pending",
    ] {
        assert!(
            text.contains(expected),
            "{expected:?} missing from {text:?}"
        );
    }
    assert!(
        !text.contains("browser_secret_value"),
        "arguments are redacted: {text:?}"
    );
    let url = browser.client.current_url().await.unwrap();
    assert!(url.as_str().ends_with(&id), "{url}");

    browser.click(&format!("#approve-{id}")).await;
    let mut status = String::new();
    for _ in 0..100 {
        status = browser.text_of(&format!("#status-{id}")).await;
        if status == "approved" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(status, "approved");
    browser.close().await;

    let (_, body) = approval(&gateway, AGENT, &id).await;
    let token = body["token"].as_str().unwrap();
    let client = resumer(&gateway, AGENT, &id, token, Some(&k)).await;
    let done = client.call(REFUND, args).await.unwrap();
    assert_eq!(done.is_error, Some(false));
    assert_eq!(vendor.count("/v1/refunds"), 1);
}

#[tokio::test]
async fn the_inbox_refuses_strangers_and_forged_forms() {
    let vendor = MockVendor::start().await;
    let gateway = GatewayProcess::start(&prod_config(&vendor));
    let data = held(
        &gateway,
        &key("csrf"),
        json!({"charge": "ch_1", "amount": 1}),
    )
    .await;
    let id = data["approval"]["approval_id"].as_str().unwrap().to_owned();

    // An agent key is not an owner token.
    assert_eq!(
        OwnerSession::sign_in(&gateway, AGENT).await.err(),
        Some(401)
    );
    let owner = OwnerSession::sign_in(&gateway, OWNER).await.unwrap();
    let csrf = owner.csrf().await;
    // Without the session's CSRF token, or from another site, nothing is decided.
    assert_eq!(owner.decide(&id, "approve", "forged", None).await, 403);
    assert_eq!(
        owner
            .decide(&id, "approve", &csrf, Some("http://evil.example"))
            .await,
        403
    );
    // Without the cookie: sign in first.
    let anonymous = reqwest::Client::new()
        .post(format!("{}/inbox/{id}/decide", base(&gateway)))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(form(&[("csrf", &csrf), ("decision", "approve")]))
        .send()
        .await
        .unwrap();
    assert_eq!(anonymous.status(), 401);
    assert_eq!(
        approval(&gateway, AGENT, &id).await.1["status"],
        json!("pending")
    );
    // A page reached under a foreign host name (DNS rebinding) is refused.
    let port = base(&gateway).rsplit(':').next().unwrap().to_owned();
    let rebound = reqwest::Client::new()
        .get(format!("{}/inbox", base(&gateway)))
        .header("host", format!("rebind.example:{port}"))
        .send()
        .await
        .unwrap();
    assert_eq!(rebound.status(), 421);
    // The pages forbid scripts and framing.
    let response = reqwest::Client::new()
        .get(format!("{}/inbox", base(&gateway)))
        .send()
        .await
        .unwrap();
    let csp = response.headers()["content-security-policy"]
        .to_str()
        .unwrap();
    assert!(csp.contains("default-src 'none'") && csp.contains("frame-ancestors 'none'"));
    // The genuine form decides, once.
    assert_eq!(owner.decide(&id, "approve", &csrf, None).await, 303);
    assert_eq!(owner.decide(&id, "deny", &csrf, None).await, 303);
    assert_eq!(
        approval(&gateway, AGENT, &id).await.1["status"],
        json!("approved")
    );
}

#[tokio::test]
async fn resumes_that_do_not_match_the_approved_call_are_refused() {
    let vendor = MockVendor::start().await;
    refund_vendor(&vendor);
    let gateway = GatewayProcess::start(&prod_config(&vendor));
    let k = key("mismatch");
    let args = json!({"charge": "ch_42", "amount": 500});
    let data = held(&gateway, &k, args.clone()).await;
    let id = data["approval"]["approval_id"].as_str().unwrap().to_owned();
    let token = approve(&gateway, &id).await;

    // Forged: the payload changed under the signature.
    let mut forged = token.clone().into_bytes();
    let at = forged.len() / 2;
    forged[at] = if forged[at] == b'A' { b'B' } else { b'A' };
    let forged = String::from_utf8(forged).unwrap();
    for headers in [
        vec![
            ("obol-approval-id", id.as_str()),
            ("obol-approval-token", forged.as_str()),
        ],
        vec![("obol-approval-id", id.as_str())],
        vec![
            ("obol-approval-id", "apr_nope"),
            ("obol-approval-token", token.as_str()),
        ],
    ] {
        assert_eq!(
            refused_before_mcp(&gateway, AGENT, &headers).await,
            (403, "approval_invalid".to_owned()),
            "{headers:?}"
        );
    }
    // A genuine token, presented by another key of the workspace.
    assert_eq!(
        refused_before_mcp(
            &gateway,
            OTHER,
            &[("obol-approval-id", &id), ("obol-approval-token", &token)]
        )
        .await,
        (403, "approval_invalid".to_owned())
    );

    // Another idempotency key than the approved one is denied, not reconciled.
    let other_key = key("other");
    let client = resumer(&gateway, AGENT, &id, &token, Some(&other_key)).await;
    let (code, _, data) = client.call_err(REFUND, args.clone()).await;
    assert_eq!(
        (code, data.unwrap()["type"].clone()),
        (-32018, json!("approval_mismatch"))
    );
    // Other arguments under the approval: a conflict.
    let client = resumer(&gateway, AGENT, &id, &token, None).await;
    let (code, _, data) = client
        .call_err(REFUND, json!({"charge": "ch_42", "amount": 99999}))
        .await;
    assert_eq!(
        (code, data.unwrap()["type"].clone()),
        (-32019, json!("idempotency_conflict"))
    );
    assert!(vendor.seen().is_empty());
}

#[tokio::test]
async fn denial_expiry_destinations_lost_claims_and_key_rotation() {
    let vendor = MockVendor::start().await;
    refund_vendor(&vendor);
    let keys = tempfile::tempdir().unwrap();
    let (k1, k2) = (
        obol::approvals::token::generate_signing_key(),
        obol::approvals::token::generate_signing_key(),
    );
    let mut config = prod_config(&vendor);
    config.extra = signing(keys.path(), ("k1", &k1), &[]);
    let gateway = GatewayProcess::start(&config);
    let args = json!({"charge": "ch_42", "amount": 500});

    // Denied: the agent's token says so, and the slot ends with a receipt.
    let denied_key = key("denied");
    let data = held(&gateway, &denied_key, args.clone()).await;
    let denied_id = data["approval"]["approval_id"].as_str().unwrap().to_owned();
    let owner = OwnerSession::sign_in(&gateway, OWNER).await.unwrap();
    let csrf = owner.csrf().await;
    assert_eq!(owner.decide(&denied_id, "deny", &csrf, None).await, 303);
    let (_, body) = approval(&gateway, AGENT, &denied_id).await;
    assert_eq!(body["status"], json!("denied"));
    let denied_token = body["token"].as_str().unwrap().to_owned();
    let client = resumer(&gateway, AGENT, &denied_id, &denied_token, None).await;
    let (code, _, data) = client.call_err(REFUND, args.clone()).await;
    let data = data.unwrap();
    assert_eq!(
        (code, data["type"].clone()),
        (-32017, json!("approval_denied"))
    );
    let receipt =
        crate::idempotency::receipt_as(&gateway, AGENT, data["receipt_id"].as_str().unwrap()).await;
    assert_eq!(receipt["outcome"], json!("definitely_rejected"));
    assert_eq!(receipt["attempt_count"], json!(0));
    assert_eq!(receipt["approval_id"], json!(denied_id));
    // The same call without a token gets the same answer.
    let plain = McpClient::with_key(&gateway.url, AGENT, &denied_key).await;
    assert_eq!(plain.call_err(REFUND, args.clone()).await.0, -32017);

    // Approved, but the gateway now sends this connection elsewhere: the approval cannot be
    // spent on another destination.
    let moved_key = key("moved");
    let data = held(&gateway, &moved_key, args.clone()).await;
    let moved_id = data["approval"]["approval_id"].as_str().unwrap().to_owned();
    let moved_token = approve(&gateway, &moved_id).await;
    // Held and approved, not yet resumed; a second ticket for the expiry case below.
    let late_key = key("late");
    let data = held(&gateway, &late_key, args.clone()).await;
    let late_id = data["approval"]["approval_id"].as_str().unwrap().to_owned();
    let late_token = approve(&gateway, &late_id).await;

    let dir = gateway.kill();
    let elsewhere = MockVendor::start().await;
    let mut moved = config.clone();
    moved.vendor = elsewhere.base_url();
    let gateway = GatewayProcess::start_in(&moved, dir);
    let client = resumer(&gateway, AGENT, &moved_id, &moved_token, None).await;
    let (code, _, data) = client.call_err(REFUND, args.clone()).await;
    assert_eq!(
        (code, data.unwrap()["type"].clone()),
        (-32019, json!("idempotency_conflict"))
    );

    // Rotation: k2 signs, k1 still verifies, so the approval survives the rotation...
    let dir = gateway.kill();
    let mut rotated = config.clone();
    rotated.extra = signing(keys.path(), ("k2", &k2), &[("k1", &k1)]);
    let gateway = GatewayProcess::start_in(&rotated, dir);
    // ...(checked on initialize, before any call is made)...
    let initialize = RawMcp::new(&gateway.url)
        .post(
            Some(AGENT),
            None,
            &json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}}}).to_string(),
            &[("obol-approval-id", &late_id), ("obol-approval-token", &late_token)],
        )
        .await;
    assert_eq!(initialize.status, 200, "{initialize:?}");
    // ...and a fresh token comes signed by k2.
    let (_, body) = approval(&gateway, AGENT, &late_id).await;
    assert!(body["token"].as_str().unwrap().starts_with("oat1.k2."));

    // Retired: k1 is gone, and its tokens with it.
    let dir = gateway.kill();
    let mut retired = config.clone();
    retired.extra = signing(keys.path(), ("k2", &k2), &[]);
    let gateway = GatewayProcess::start_in(&retired, dir);
    assert_eq!(
        refused_before_mcp(
            &gateway,
            AGENT,
            &[
                ("obol-approval-id", &late_id),
                ("obol-approval-token", &late_token)
            ]
        )
        .await,
        (403, "approval_invalid".to_owned())
    );

    // A day later (the clock runs 25 h ahead): the approval has expired, nothing is sent,
    // and the key's slot is settled with a receipt.
    let fresh_token = approval(&gateway, AGENT, &late_id).await.1["token"]
        .as_str()
        .unwrap()
        .to_owned();
    let dir = gateway.kill();
    let mut later = retired.clone();
    later.env.push((
        "OBOL_CLOCK_OFFSET_MS".into(),
        (25 * 3600 * 1000).to_string(),
    ));
    let gateway = GatewayProcess::start_in(&later, dir);
    assert_eq!(
        refused_before_mcp(
            &gateway,
            AGENT,
            &[
                ("obol-approval-id", &late_id),
                ("obol-approval-token", &fresh_token)
            ]
        )
        .await,
        (200, "approval_expired".to_owned()),
        "an expired token"
    );
    let (_, body) = approval(&gateway, AGENT, &late_id).await;
    assert_eq!(
        (body["status"].clone(), body["token"].clone()),
        (json!("expired"), Value::Null)
    );
    let plain = McpClient::with_key(&gateway.url, AGENT, &late_key).await;
    let (code, _, data) = plain.call_err(REFUND, args.clone()).await;
    assert_eq!(code, -32016, "the held call without a token");
    assert!(data.unwrap()["receipt_id"].is_string());
    assert_eq!(
        vendor.count("/v1/refunds") + elsewhere.count("/v1/refunds"),
        0
    );
}

#[tokio::test]
async fn a_token_whose_claim_was_never_acquired_is_not_ready() {
    let vendor = MockVendor::start().await;
    refund_vendor(&vendor);
    let keys = tempfile::tempdir().unwrap();
    let signer = obol::approvals::token::generate_signing_key();
    let mut config = prod_config(&vendor);
    config.extra = signing(keys.path(), ("k1", &signer), &[]);
    let gateway = GatewayProcess::start(&config);
    let k = key("lost");
    let args = json!({"charge": "ch_42", "amount": 500});
    let data = held(&gateway, &k, args.clone()).await;
    let id = data["approval"]["approval_id"].as_str().unwrap().to_owned();
    let token = approve(&gateway, &id).await;

    // Another deployment with the same signing key but none of this one's state: the token
    // verifies, the slot was never claimed there, and a token cannot claim one.
    let other = GatewayProcess::start(&config);
    let client = resumer(&other, AGENT, &id, &token, None).await;
    let (code, _, data) = client.call_err(REFUND, args.clone()).await;
    assert_eq!(
        (code, data.unwrap()["type"].clone()),
        (-32000, json!("not_ready"))
    );
    assert_eq!(vendor.count("/v1/refunds"), 0);
    // It stays that way: no claim appeared.
    let (code, _, data) = client.call_err(REFUND, args).await;
    assert_eq!(
        (code, data.unwrap()["type"].clone()),
        (-32000, json!("not_ready"))
    );
    assert_eq!(vendor.count("/v1/refunds"), 0);
}

#[tokio::test]
async fn concurrent_resumes_dispatch_exactly_once() {
    let vendor = MockVendor::start().await;
    vendor.on(
        "/v1/refunds",
        crate::support::Reply::json(
            200,
            json!({"id": "re_1", "object": "refund", "amount": 500, "charge": "ch_42", "status": "succeeded"}),
        )
        .after(Duration::from_millis(200)),
    );
    let gateway = GatewayProcess::start(&prod_config(&vendor));
    let k = key("race");
    let args = json!({"charge": "ch_42", "amount": 500});
    let data = held(&gateway, &k, args.clone()).await;
    let id = data["approval"]["approval_id"].as_str().unwrap().to_owned();
    let token = approve(&gateway, &id).await;

    let mut racers = Vec::new();
    for _ in 0..20 {
        let (url, id, token, args) = (gateway.url.clone(), id.clone(), token.clone(), args.clone());
        racers.push(tokio::spawn(async move {
            let client = McpClient::connect_with_headers(
                &url,
                AGENT,
                &[("obol-approval-id", &id), ("obol-approval-token", &token)],
            )
            .await
            .unwrap();
            match client.call(REFUND, args).await {
                Ok(result) => Ok(result.is_error),
                Err(rmcp::ServiceError::McpError(error)) => {
                    Err((error.code.0, error.data.map(|data| data["type"].clone())))
                }
                Err(other) => panic!("{other:?}"),
            }
        }));
    }
    let mut ok = 0;
    for racer in racers {
        match racer.await.unwrap() {
            Ok(is_error) => {
                assert_eq!(is_error, Some(false));
                ok += 1;
            }
            Err(refused) => assert_eq!(
                refused,
                (-32000, Some(json!("not_ready"))),
                "only not_ready may lose the race"
            ),
        }
    }
    assert!(ok >= 1);
    assert_eq!(vendor.count("/v1/refunds"), 1);
}

#[tokio::test]
async fn a_policy_can_waive_approval_and_the_receipt_names_it() {
    let vendor = MockVendor::start().await;
    refund_vendor(&vendor);
    let mut config = prod_config(&vendor);
    config.publications = vec![(
        1,
        r#"@id("agents-call")
permit(principal, action in [Obol::Action::"list", Obol::Action::"call"], resource);
@id("small-refunds-unattended")
permit(principal == Obol::Key::"key-0", action == Obol::Action::"call_without_approval", resource)
when { resource.connector == "stripe" };"#
            .into(),
    )];
    let gateway = GatewayProcess::start(&config);
    let args = json!({"charge": "ch_42", "amount": 500});
    // key-0 (AGENT) is waived...
    let client = McpClient::with_key(&gateway.url, AGENT, &key("waived")).await;
    let done = client.call(REFUND, args.clone()).await.unwrap();
    let receipt = crate::idempotency::receipt_as(
        &gateway,
        AGENT,
        crate::idempotency::meta(&done)["receipt_id"]
            .as_str()
            .unwrap(),
    )
    .await;
    assert_eq!(
        receipt["matched_policies"],
        json!(["agents-call", "small-refunds-unattended"])
    );
    assert_eq!(receipt["approval_id"], Value::Null);
    assert_eq!(vendor.count("/v1/refunds"), 1);
    // ...key-1 (OTHER) is not.
    let client = McpClient::with_key(&gateway.url, OTHER, &key("unwaived")).await;
    assert_eq!(client.call_err(REFUND, args).await.0, -32003);
    assert_eq!(vendor.count("/v1/refunds"), 1);
}

#[tokio::test]
async fn a_call_held_on_one_gateway_resumes_on_another_sharing_redis() {
    let vendor = MockVendor::start().await;
    refund_vendor(&vendor);
    let redis = crate::support::RedisServer::start();
    let keys = tempfile::tempdir().unwrap();
    let signer = obol::approvals::token::generate_signing_key();
    let mut config = prod_config(&vendor);
    config.store = Some(format!("redis_url = {:?}", redis.url()));
    config.extra = signing(keys.path(), ("fleet", &signer), &[]);
    let (a, b) = (
        GatewayProcess::start(&config),
        GatewayProcess::start(&config),
    );
    let k = key("fleet");
    let args = json!({"charge": "ch_42", "amount": 500});

    // Held on A; the owner signs in on A and approves with that session on B (sessions are
    // sealed with the shared key, not kept in one process); the agent resumes on B.
    let data = held(&a, &k, args.clone()).await;
    let id = data["approval"]["approval_id"].as_str().unwrap().to_owned();
    let mut owner = OwnerSession::sign_in(&a, OWNER).await.unwrap();
    owner.base = base(&b);
    let csrf = owner.csrf().await;
    assert_eq!(owner.decide(&id, "approve", &csrf, None).await, 303);
    let (_, body) = approval(&b, AGENT, &id).await;
    let token = body["token"].as_str().unwrap().to_owned();
    let client = resumer(&b, AGENT, &id, &token, None).await;
    let done = client.call(REFUND, args.clone()).await.unwrap();
    assert_eq!(done.is_error, Some(false));
    // A replays what B did.
    let again = McpClient::with_key(&a.url, AGENT, &k).await;
    let replay = again.call(REFUND, args).await.unwrap();
    assert_eq!(crate::idempotency::meta(&replay)["replayed"], json!(true));
    assert_eq!(vendor.count("/v1/refunds"), 1);
}

#[tokio::test]
async fn an_approved_call_that_could_not_be_sent_stays_held() {
    // Port 1 refuses connections: provably nothing is sent.
    let gateway = GatewayProcess::start(&prod_config_at("http://127.0.0.1:1"));
    let k = key("unsent");
    let args = json!({"charge": "ch_42", "amount": 500});
    let data = held(&gateway, &k, args.clone()).await;
    let id = data["approval"]["approval_id"].as_str().unwrap().to_owned();
    let token = approve(&gateway, &id).await;
    let client = resumer(&gateway, AGENT, &id, &token, None).await;
    let (code, _, data) = client.call_err(REFUND, args.clone()).await;
    assert_eq!(
        (code, data.unwrap()["type"].clone()),
        (-32000, json!("upstream_unreachable"))
    );
    // The slot went back to its hold: a plain call under the key is held again, not sent...
    let plain = McpClient::with_key(&gateway.url, AGENT, &k).await;
    let again = held_by(&plain, args.clone()).await;
    assert_eq!(again["approval"]["approval_id"], json!(id));
    // ...and the token still resumes it.
    let (code, _, data) = client.call_err(REFUND, args).await;
    assert_eq!(
        (code, data.unwrap()["type"].clone()),
        (-32000, json!("upstream_unreachable"))
    );
}

async fn held_by(client: &McpClient, args: Value) -> Value {
    let (code, message, data) = client.call_err(REFUND, args).await;
    assert_eq!(code, -32003, "{message}");
    data.unwrap()
}

/// Issue 10: a key keeps at most 20 calls waiting for the owner; the 21st is refused
/// (retryable) and claims nothing, a retry of a held call still gets its hold, other keys are
/// unaffected, and an `inbox_url` shows its ticket wherever it sits in a long inbox.
#[tokio::test]
async fn a_key_cannot_bury_the_inbox_and_every_inbox_url_shows_its_ticket() {
    let vendor = MockVendor::start().await;
    refund_vendor(&vendor);
    let gateway = GatewayProcess::start(&prod_config(&vendor));
    let hold = |token: &'static str, idempotency_key: String, n: usize| {
        let gateway_url = gateway.url.clone();
        async move {
            let client = McpClient::with_key(&gateway_url, token, &idempotency_key).await;
            client
                .call_err(REFUND, json!({"charge": format!("ch_{n}"), "amount": 5}))
                .await
        }
    };
    let mut notices = Vec::new();
    let mut keys = Vec::new();
    for token in [AGENT, OTHER, NO_APPROVALS] {
        for n in 0..20 {
            let k = key(&format!("bury{n}"));
            let (code, _, data) = hold(token, k.clone(), n).await;
            assert_eq!(code, -32003, "{data:?}");
            notices.push(data.unwrap()["approval"].clone());
            keys.push(k);
        }
    }
    let (code, _, data) = hold(AGENT, key("bury20"), 20).await;
    let data = data.unwrap();
    assert_eq!(
        (code, data["type"].clone()),
        (-32000, json!("approval_backlog")),
        "{data}"
    );
    assert_eq!(data["retryable"], json!(true));
    // A retry of a held call is not a new one: it still gets its own hold.
    let (code, _, again) = hold(AGENT, keys[0].clone(), 0).await;
    assert_eq!(code, -32003, "{again:?}");
    assert_eq!(
        again.unwrap()["approval"]["approval_id"],
        notices[0]["approval_id"]
    );
    assert!(vendor.seen().is_empty());

    // 60 tickets: the oldest is not on the inbox's first page, but its inbox_url shows it.
    let owner = OwnerSession::sign_in(&gateway, OWNER).await.unwrap();
    let oldest = notices[0]["approval_id"].as_str().unwrap();
    let first = owner.page("/inbox").await;
    assert!(!first.contains(&format!("ticket-{oldest}")));
    assert!(first.contains("id=\"older\""));
    let url = notices[0]["inbox_url"].as_str().unwrap();
    let path = &url[url.find("/inbox").unwrap()..];
    assert!(owner.page(path).await.contains(&format!("ticket-{oldest}")));
    assert!(
        owner
            .page("/inbox?page=1")
            .await
            .contains(&format!("ticket-{oldest}"))
    );
}

/// Issue 10: an owner session carries a digest of the owner credential it was opened with. A
/// gateway whose owner token for the workspace changed (same signing key) refuses it; one with
/// the same owner accepts it; signing out clears the cookie.
#[tokio::test]
async fn owner_sessions_die_with_their_credential_and_can_sign_out() {
    let vendor = MockVendor::start().await;
    let keys = tempfile::tempdir().unwrap();
    let signer = obol::approvals::token::generate_signing_key();
    let mut config = prod_config(&vendor);
    config.extra = signing(keys.path(), ("k1", &signer), &[]);
    let first = GatewayProcess::start(&config);
    let owner = OwnerSession::sign_in(&first, OWNER).await.unwrap();
    assert!(
        owner
            .page("/inbox")
            .await
            .contains("Workspace <strong>acme")
    );

    let inbox_on = |gateway: &GatewayProcess| {
        let (base, cookie) = (base(gateway), owner.cookie.clone());
        async move {
            reqwest::Client::new()
                .get(format!("{base}/inbox"))
                .header("cookie", cookie)
                .send()
                .await
                .unwrap()
                .text()
                .await
                .unwrap()
        }
    };
    let same = GatewayProcess::start(&config);
    assert!(inbox_on(&same).await.contains("Workspace <strong>acme"));
    let mut changed = config.clone();
    changed.owner = Some("obo_test_acme_new_owner".into());
    let rotated = GatewayProcess::start(&changed);
    let page = inbox_on(&rotated).await;
    assert!(!page.contains("Workspace <strong>acme"), "{page}");
    assert!(page.contains("name=\"token\""), "the sign-in page: {page}");

    let out = owner
        .http
        .post(format!("{}/inbox/logout", owner.base))
        .header("cookie", &owner.cookie)
        .send()
        .await
        .unwrap();
    assert_eq!(out.status().as_u16(), 303);
    let cleared = out.headers()["set-cookie"].to_str().unwrap();
    assert!(
        cleared.starts_with("obol_owner=;") && cleared.contains("Max-Age=0"),
        "{cleared}"
    );
}
