//! The operator console in a real headless Chromium: an owner signs in, reads the charts,
//! filters receipts and opens one; the admin sees connectors and keys, which an owner may not.

use serde_json::json;

use crate::admin::ADMIN;
use crate::approvals::{AGENT, OWNER};
use crate::support::browser::Browser;
use crate::support::{GatewayProcess, McpClient, MockVendor, key_hash};

/// With `OBOL_SCREENSHOTS=DIR`, the pages are saved there as PNG (how `docs/` got them).
async fn screenshot(browser: &Browser, name: &str) {
    if let Ok(dir) = std::env::var("OBOL_SCREENSHOTS") {
        browser.client.set_window_size(1100, 1000).await.unwrap();
        let png = browser.client.screenshot().await.unwrap();
        std::fs::write(std::path::Path::new(&dir).join(format!("{name}.png")), png).unwrap();
    }
}

async fn sign_in(browser: &Browser, gateway: &GatewayProcess, token: &str) {
    let base = gateway.url.trim_end_matches("/mcp");
    browser
        .client
        .goto(&format!("{base}/console"))
        .await
        .unwrap();
    browser.fill("#token", token).await;
    browser.click("#sign-in").await;
}

#[tokio::test]
async fn an_owner_reads_charts_and_receipts_and_the_admin_sees_connectors_and_keys() {
    let vendor = MockVendor::start().await;
    let mut config = crate::approvals::prod_config(&vendor);
    config.extra = format!("\n[admin]\ntoken_hash = \"{}\"\n", key_hash(ADMIN));
    let gateway = GatewayProcess::start(&config);
    let base = gateway.url.trim_end_matches("/mcp").to_owned();

    // Real traffic: three reads, and a refund held for the owner.
    let client = McpClient::connect(&gateway.url, AGENT).await;
    for limit in 1..=3 {
        let read = client
            .call("stripe.charges.list", json!({"limit": limit}))
            .await
            .unwrap();
        assert_eq!(read.is_error, Some(false));
    }
    let held = crate::approvals::held(
        &gateway,
        &crate::idempotency::key("console"),
        json!({"charge": "ch_42", "amount": 500}),
    )
    .await;
    let approval_id = held["approval"]["approval_id"].as_str().unwrap().to_owned();

    let browser = Browser::start().await;
    sign_in(&browser, &gateway, "obo_not_a_token").await;
    assert!(browser.text_of("#problem").await.contains("neither"));
    browser.fill("#token", OWNER).await;
    browser.click("#sign-in").await;
    assert_eq!(browser.text_of("#viewer").await, "owner of acme");
    assert_eq!(browser.text_of("#calls-total").await, "3 calls");
    // The chart draws the three accepted calls, in the current minute (or the one before).
    let bars = browser
        .client
        .find_all(fantoccini::Locator::Css("#calls-chart rect.bar.accepted"))
        .await
        .unwrap();
    assert!(!bars.is_empty() && bars.len() <= 2, "{} bars", bars.len());
    let latency = browser
        .client
        .find_all(fantoccini::Locator::Css("#latency-chart rect.bar"))
        .await
        .unwrap();
    assert!(!latency.is_empty());
    // The held call is pending, with a link to decide it in the inbox.
    let pending = browser.text_of("#pending").await;
    assert!(pending.contains("stripe.create_refund"), "{pending}");
    let link = browser
        .client
        .find(fantoccini::Locator::Css("#pending a"))
        .await
        .unwrap();
    assert_eq!(
        link.attr("href").await.unwrap().as_deref(),
        Some(format!("/inbox/{approval_id}").as_str())
    );
    screenshot(&browser, "console-overview").await;

    // Receipts: filter by tool, open one, read its whole record.
    browser.click("#nav-receipts").await;
    browser.fill("#filter-tool", "charges").await;
    browser.click("#filter").await;
    assert_eq!(browser.text_of("#receipt-count").await, "3 receipts");
    browser.fill("#filter-since", "5").await;
    browser
        .client
        .find(fantoccini::Locator::Css(
            "#filter-outcome option:nth-child(3)",
        ))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    browser.click("#filter").await;
    // The old page answers until the new one replaces it.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while browser.text_of("#receipt-count").await != "0 receipts" {
        assert!(
            std::time::Instant::now() < deadline,
            "the filter found receipts"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    browser
        .client
        .goto(&format!("{base}/console/receipts?tool=charges"))
        .await
        .unwrap();
    screenshot(&browser, "console-receipts").await;
    browser.click("#receipts a.open").await;
    let record = browser.text_of("#receipt").await;
    let id = browser.text_of("#receipt-id").await;
    assert!(id.starts_with("rcp_"), "{id}");
    assert!(record.contains("\"outcome\": \"accepted\""), "{record}");
    assert!(record.contains("stripe.charges.list"), "{record}");

    // The admin's pages are not an owner's; neither is another workspace.
    browser
        .client
        .goto(&format!("{base}/console/connectors"))
        .await
        .unwrap();
    assert!(browser.text_of("#admin-only").await.contains("admin"));
    browser
        .client
        .goto(&format!("{base}/console?workspace=globex"))
        .await
        .unwrap();
    assert!(browser.text_of("body").await.contains("No such workspace"));
    browser.click("#sign-out").await;
    assert!(browser.text_of("#token").await.is_empty());

    // The admin: every workspace, the connectors with their digests, the keys without hashes.
    browser.fill("#token", ADMIN).await;
    browser.click("#sign-in").await;
    assert_eq!(browser.text_of("#viewer").await, "admin");
    assert!(browser.text_of("#workspaces").await.contains("globex"));
    browser.click("#nav-connectors").await;
    let stripe = browser.text_of("#connector-stripe").await;
    let digest = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(
        std::fs::read(crate::support::guests::PAYMENTS).unwrap(),
    ));
    assert!(stripe.contains(&digest), "{stripe}");
    assert!(stripe.contains("header:"), "{stripe}");
    assert!(stripe.contains("accepted 200-299"), "{stripe}");
    screenshot(&browser, "console-connectors").await;
    browser.click("#nav-keys").await;
    let keys = browser.text_of("#keys").await;
    assert!(
        keys.contains("key-0") && keys.contains("approvals"),
        "{keys}"
    );
    assert!(
        !keys.contains("sha256:"),
        "a key hash on the keys page: {keys}"
    );
    browser.close().await;
    client.close().await;
}
