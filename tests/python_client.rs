//! An outside view: the official Python `mcp` SDK lists and calls tools through the gateway.
//!
//! `.ci/run` installs the SDK into `.venv/` (see `tests/python/requirements.txt`); the test
//! uses `OBOL_PYTHON` when set, else that venv's interpreter. A missing SDK fails the test: it
//! is a dependency of the suite, not an optional extra.

use std::path::PathBuf;
use std::process::Command;

use crate::support::{GatewayConfig, GatewayProcess, MockVendor, TOKEN};

/// Runs a script of `tests/python/` with arguments; returns its JSON report.
async fn run_script(name: &str, args: Vec<String>) -> serde_json::Value {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/python")
        .join(name);
    let python = python();
    let output = tokio::task::spawn_blocking(move || {
        Command::new(&python)
            .arg(script)
            .args(args)
            .output()
            .unwrap_or_else(|e| {
                panic!(
                    "{}: {e} (run .ci/test or set OBOL_PYTHON)",
                    python.display()
                )
            })
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "python client failed:\n{stdout}\n{stderr}"
    );
    serde_json::from_str(stdout.trim()).unwrap()
}

fn python() -> PathBuf {
    if let Some(python) = std::env::var_os("OBOL_PYTHON") {
        return python.into();
    }
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    root.join(".venv/bin/python")
}

/// The SDK in its default `auto` mode picks 2026-07-28; pinned to the handshake era, it
/// picks 2025-11-25. Either way: the same tools, the same call, the same `Unknown tool`.
#[tokio::test]
async fn the_official_python_sdk_lists_and_calls_tools_in_both_eras() {
    let vendor = MockVendor::start().await;
    let gateway = GatewayProcess::start(&GatewayConfig::new(&vendor.base_url()));
    let mut tool_lists = Vec::new();
    for (mode, protocol) in [("auto", "2026-07-28"), ("legacy", "2025-11-25")] {
        let report = run_script(
            "client.py",
            vec![gateway.url.clone(), TOKEN.into(), mode.into()],
        )
        .await;
        assert_eq!(report["protocol"], protocol, "{report}");
        let tools = report["tools"].as_array().unwrap();
        assert!(tools.iter().any(|t| t == "stripe.charges.list"), "{report}");
        assert_eq!(report["call"]["isError"], false, "{report}");
        assert!(
            report["call"]["text"].as_str().unwrap().contains("ch_1"),
            "{report}"
        );
        assert_eq!(report["unknown"]["code"], -32602, "{report}");
        assert_eq!(report["unknown"]["message"], "Unknown tool", "{report}");
        tool_lists.push(report["tools"].clone());
    }
    assert_eq!(tool_lists[0], tool_lists[1]);
    assert_eq!(vendor.count("/v1/charges"), 2);
}

/// The approval round trip as a client built on the official SDK sees it: `-32003` with the
/// approval object in `error.data`, then the same call with the two resume headers.
#[tokio::test]
async fn the_official_python_sdk_sees_the_hold_and_resumes() {
    let vendor = MockVendor::start().await;
    vendor.on(
        "/v1/refunds",
        crate::support::Reply::json(
            200,
            serde_json::json!({"id": "re_py", "object": "refund", "amount": 700, "charge": "ch_py", "status": "succeeded"}),
        ),
    );
    let gateway = GatewayProcess::start(&crate::approvals::prod_config(&vendor));
    let key = crate::idempotency::key("python");
    let agent = crate::approvals::AGENT.to_owned();
    let held = run_script(
        "approval.py",
        vec![gateway.url.clone(), agent.clone(), key.clone()],
    )
    .await;
    assert_eq!(held["code"], -32003, "{held}");
    assert_eq!(held["protocol"], "2026-07-28", "{held}");
    let approval = &held["data"]["approval"];
    assert_eq!(approval["tool"], "stripe.create_refund", "{held}");
    let id = approval["approval_id"].as_str().unwrap().to_owned();
    let token = crate::approvals::approve(&gateway, &id).await;
    let done = run_script(
        "approval.py",
        vec![gateway.url.clone(), agent, key, id, token],
    )
    .await;
    assert_eq!(done["isError"], false, "{done}");
    assert_eq!(vendor.count("/v1/refunds"), 1);
}

/// Progressive mode as the official SDK sees it: two tools listed, a paraphrase found through
/// `search_tools`, the hit called through `call_tool`, held for approval like the direct
/// call, and resumed with the approval headers on the same `call_tool`.
#[tokio::test]
async fn the_official_python_sdk_searches_calls_and_resumes_in_progressive_mode() {
    let vendor = MockVendor::start().await;
    vendor.on(
        "/v1/refunds",
        crate::support::Reply::json(
            200,
            serde_json::json!({"id": "re_py", "object": "refund", "amount": 700, "charge": "ch_py", "status": "succeeded"}),
        ),
    );
    let mut config = crate::approvals::prod_config(&vendor);
    config.keys[0].tools_mode = Some("progressive".into());
    let gateway = GatewayProcess::start(&config);
    let key = crate::idempotency::key("python-progressive");
    let agent = crate::approvals::AGENT.to_owned();
    let query = "give the customer their money back".to_owned();
    let held = run_script(
        "progressive.py",
        vec![
            gateway.url.clone(),
            agent.clone(),
            key.clone(),
            query.clone(),
        ],
    )
    .await;
    assert_eq!(
        held["tools"],
        serde_json::json!(["call_tool", "search_tools"]),
        "{held}"
    );
    assert_eq!(held["hits"][0], "stripe.create_refund", "{held}");
    // The key may call two stripe tools; nothing else is found.
    assert!(
        held["hits"]
            .as_array()
            .unwrap()
            .iter()
            .all(|hit| hit == "stripe.create_refund" || hit == "stripe.charges.list"),
        "{held}"
    );
    assert!(
        held["first_schema"]["properties"]["charge"].is_object(),
        "{held}"
    );
    assert_eq!(held["call"]["code"], -32003, "{held}");
    let approval = &held["call"]["data"]["approval"];
    assert_eq!(approval["tool"], "stripe.create_refund", "{held}");
    assert_eq!(vendor.count("/v1/refunds"), 0);

    let id = approval["approval_id"].as_str().unwrap().to_owned();
    let token = crate::approvals::approve(&gateway, &id).await;
    let done = run_script(
        "progressive.py",
        vec![gateway.url.clone(), agent, key, query, id, token],
    )
    .await;
    assert_eq!(done["call"]["isError"], false, "{done}");
    assert!(
        done["call"]["text"].as_str().unwrap().contains("re_py"),
        "{done}"
    );
    assert_eq!(vendor.count("/v1/refunds"), 1);
}
