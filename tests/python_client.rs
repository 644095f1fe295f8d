//! An outside view: the official Python `mcp` SDK lists and calls tools through the gateway.
//!
//! `.ci/run` installs the SDK into `.venv/` (see `tests/python/requirements.txt`); the test
//! uses `OBOL_PYTHON` when set, else that venv's interpreter. A missing SDK fails the test: it
//! is a dependency of the suite, not an optional extra.

use std::path::PathBuf;
use std::process::Command;

use crate::support::{GatewayConfig, GatewayProcess, MockVendor, TOKEN};

fn python() -> PathBuf {
    if let Some(python) = std::env::var_os("OBOL_PYTHON") {
        return python.into();
    }
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    root.join(".venv/bin/python")
}

#[tokio::test]
async fn the_official_python_sdk_lists_and_calls_tools() {
    let vendor = MockVendor::start().await;
    let gateway = GatewayProcess::start(&GatewayConfig::new(&vendor.base_url()));
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/python/client.py");
    let python = python();
    let output = tokio::task::spawn_blocking(move || {
        Command::new(&python)
            .arg(script)
            .arg(&gateway.url)
            .arg(TOKEN)
            .output()
            .unwrap_or_else(|e| {
                panic!("{}: {e} (run .ci/run or set OBOL_PYTHON)", python.display())
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
    let report: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    let tools = report["tools"].as_array().unwrap();
    assert!(tools.iter().any(|t| t == "stripe.charges.list"), "{report}");
    assert_eq!(report["call"]["isError"], false, "{report}");
    assert!(
        report["call"]["text"].as_str().unwrap().contains("ch_1"),
        "{report}"
    );
    assert_eq!(report["unknown"]["code"], -32602, "{report}");
    assert_eq!(report["unknown"]["message"], "Unknown tool", "{report}");
    assert_eq!(vendor.count("/v1/charges"), 1);
}
