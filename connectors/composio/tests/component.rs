//! The built component as the gateway loads it: federated through Composio, no key propagated,
//! and a 200 that says `"successful": false` classified unknown by the host's body rule.

use obol_harness::{Broker, Propagation, RouteKind, StatusClass};
use serde_json::json;

#[test]
fn the_component_is_federated_and_an_unsuccessful_200_is_not_accepted() {
    let mut harness = obol_harness::build_this_crate!();
    harness.settings = vec![("user_id".into(), "u-1".into())];
    let tool = &harness.manifest().tools[0];
    assert_eq!(tool.effect.route, RouteKind::Federated);
    assert_eq!(tool.effect.broker, Some(Broker::Composio));
    assert_eq!(tool.effect.propagation, Propagation::None);

    let request = harness
        .prepare(
            "github.create_issue",
            json!({"owner": "acme", "repo": "app", "title": "t"}),
        )
        .unwrap();
    assert_eq!(
        request.url,
        "http://vendor.test/api/v3/tools/execute/GITHUB_CREATE_AN_ISSUE"
    );
    let body: serde_json::Value = serde_json::from_slice(&request.body.unwrap()).unwrap();
    assert_eq!(body["user_id"], json!("u-1"));
    assert!(
        body.get("retries").is_none(),
        "the host, not the component, sets retries"
    );

    let ok = br#"{"successful": true, "data": {"number": 1}, "log_id": "log_1"}"#;
    let failed = br#"{"successful": false, "error": "nope", "log_id": "log_2"}"#;
    assert_eq!(
        harness.classify("github.create_issue", 200, ok),
        StatusClass::Accepted
    );
    assert_eq!(
        harness.classify("github.create_issue", 200, failed),
        StatusClass::Unknown
    );
    let rendered = harness
        .interpret("github.create_issue", 200, failed)
        .unwrap();
    assert!(format!("{:?}", rendered.content).contains("nope"));
}
