//! The built component, loaded the way the gateway loads it (via `obol-harness`): its manifest
//! passes the gateway's validation, `prepare` builds the vendor request, and `interpret` renders
//! canned vendor responses.

use obol_harness::{Method, PrepareError, StatusClass};
use serde_json::json;

#[test]
fn the_component_passes_the_gateways_checks_and_translates_both_ways() {
    let harness = obol_harness::build_this_crate!();

    let manifest = harness.manifest();
    assert_eq!(manifest.name, "stripe");
    let refund = manifest
        .tools
        .iter()
        .find(|t| t.upstream_name == "create_refund")
        .unwrap();
    assert!(refund.effect.destructive);
    assert!(
        refund.effect.propagation.is_binding(),
        "refunds propagate the key"
    );
    assert_eq!(
        harness.classify("create_refund", 409, b"{}"),
        StatusClass::Unknown
    );
    assert_eq!(
        harness.classify("create_refund", 429, b"{}"),
        StatusClass::Retryable
    );

    // prepare: a form POST to /v1/refunds; the guest never sets credentials or the key.
    let request = harness
        .prepare("create_refund", json!({"charge": "ch_123", "amount": 500}))
        .unwrap();
    assert_eq!(request.method, Method::Post);
    assert_eq!(request.url, "http://vendor.test/v1/refunds");
    let body = String::from_utf8(request.body.unwrap()).unwrap();
    assert!(
        body.contains("charge=ch_123") && body.contains("amount=500"),
        "{body}"
    );
    assert!(
        request
            .headers
            .iter()
            .all(|h| !h.name.eq_ignore_ascii_case("authorization")
                && !h.name.eq_ignore_ascii_case("idempotency-key"))
    );

    // The gateway's input schema runs first: a charge id must look like one.
    let refused = harness.prepare("create_refund", json!({"charge": "nope"}));
    assert!(
        matches!(refused, Err(PrepareError::InvalidArguments(_))),
        "{refused:?}"
    );

    // interpret: a Stripe refund object becomes text plus structured output.
    let output = harness
        .interpret(
            "create_refund",
            200,
            br#"{"id":"re_1","object":"refund","amount":500,"charge":"ch_123","currency":"usd","status":"succeeded"}"#,
        )
        .unwrap();
    assert_eq!(
        output
            .structured
            .as_deref()
            .map(|s| serde_json::from_str::<serde_json::Value>(s).unwrap()["id"].clone()),
        Some(json!("re_1"))
    );

    let list = harness
        .prepare("charges.list", json!({"limit": 3}))
        .unwrap();
    assert_eq!(list.method, Method::Get);
    assert_eq!(list.url, "http://vendor.test/v1/charges?limit=3");
}
