//! `obol new connector`: the scaffold, outside this repository, builds and passes its own
//! tests on first try, `obol check` accepts what it builds, and a gateway serves it.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::json;

use crate::support::gateway::run_obol;
use crate::support::{McpClient, MockVendor, Reply};

/// The scaffold's own target directory, inside this build's (kept between runs, so only the
/// first run compiles the gateway and harness it depends on).
fn scaffold_target() -> PathBuf {
    std::env::current_exe()
        .unwrap()
        .ancestors()
        .nth(3)
        .unwrap()
        .join("scaffold")
}

/// `cargo` in `dir` with the scaffold's target directory and nothing of the outer cargo's
/// settings.
fn cargo(dir: &Path, args: &[&str]) -> (bool, String) {
    let target = scaffold_target();
    let output = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .args(args)
        .current_dir(dir)
        .env("CARGO_TARGET_DIR", &target)
        // The harness runs the component in this build's gateway (ADR-0056).
        .env("OBOL_BIN", env!("CARGO_BIN_EXE_obol"))
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.success(), text)
}

#[tokio::test]
async fn a_new_connector_builds_tests_checks_and_serves_on_first_try() {
    let dir = tempfile::tempdir().unwrap();
    let crate_dir = dir.path().join("acme");
    let repository = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/.."));
    let (code, out, err) = run_obol(&[
        "new",
        "connector",
        "acme",
        "--path",
        crate_dir.to_str().unwrap(),
        "--obol",
        repository.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("cargo test"), "{out}");

    // The author's build links no part of the gateway: the harness runs the component in
    // the `obol` binary, so neither its store, policy, HTTP server, MCP client or Redis
    // crates nor the WebAssembly runtime and Cranelift are compiled (ADR-0056).
    let (listed, tree) = cargo(
        &crate_dir,
        &[
            "tree",
            "--offline",
            "--edges",
            "normal,dev,build",
            "--prefix",
            "none",
        ],
    );
    assert!(listed, "{tree}");
    assert!(tree.contains("obol-harness v"), "{tree}");
    for gateway_only in [
        "obol v",
        "obol-runtime v",
        "wasmtime v",
        "cranelift-codegen v",
        "jsonschema v",
        "redb v",
        "redis v",
        "cedar-policy v",
        "axum v",
        "rmcp v",
        "reqwest v",
    ] {
        assert!(
            !tree.lines().any(|line| line.starts_with(gateway_only)),
            "the scaffold's tests would compile {gateway_only}…:\n{tree}"
        );
    }

    // Run twice: the second, of an unchanged crate, compiles nothing, neither by cargo nor
    // by Cranelift (the harness caches compiled components by sha256).
    for (run, unchanged) in [
        ("first cargo test of the scaffold", false),
        ("cargo test of the unchanged scaffold", true),
    ] {
        let started = std::time::Instant::now();
        let (tested, log) = tokio::task::spawn_blocking({
            let crate_dir = crate_dir.clone();
            move || cargo(&crate_dir, &["test", "--offline"])
        })
        .await
        .unwrap();
        assert!(tested, "{run} failed:\n{log}");
        assert!(
            log.contains("items_are_read_and_created_as_the_vendor_expects ... ok"),
            "{log}"
        );
        if unchanged {
            assert!(!log.contains("Compiling"), "{run} compiled again:\n{log}");
        }
        eprintln!("{run}: {:.2} s", started.elapsed().as_secs_f64());
    }

    // The component the harness built and tested is the file the author ships: where
    // `cargo build --release --target wasm32-wasip2` puts it. Checked, then served.
    let wasm = scaffold_target().join("wasm32-wasip2/release/acme.wasm");
    assert!(wasm.is_file(), "{}", wasm.display());
    let (code, out, err) = run_obol(&["check", wasm.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("acme.items.create"), "{out}");
    assert!(
        out.contains("propagation:   header:idempotency-key"),
        "{out}"
    );

    // The generated obol.toml, pointed at this build's component and a mock vendor.
    let vendor = MockVendor::start().await;
    vendor.on(
        "/v1/items/it_1",
        Reply::json(200, json!({"id": "it_1", "name": "first"})),
    );
    let config = std::fs::read_to_string(crate_dir.join("obol.toml"))
        .unwrap()
        .replace(
            "target/wasm32-wasip2/release/acme.wasm",
            wasm.to_str().unwrap(),
        )
        .replace("http://127.0.0.1:8790", &vendor.base_url())
        .replace("127.0.0.1:8780", "127.0.0.1:0");
    std::fs::write(crate_dir.join("obol.toml"), config).unwrap();
    let mut gateway = Command::new(env!("CARGO_BIN_EXE_obol"))
        .args(["serve", "--config", "obol.toml"])
        .current_dir(&crate_dir)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(gateway.stdout.take().unwrap()),
        &mut line,
    )
    .unwrap();
    let url = line
        .trim()
        .strip_prefix("obol listening on ")
        .unwrap()
        .to_owned();
    let client = McpClient::connect(&url, "obk_acme_dev").await;
    let result = client
        .call("acme.items.get", json!({"id": "it_1"}))
        .await
        .unwrap();
    assert_eq!(result.is_error, Some(false), "{result:?}");
    assert_eq!(
        result.structured_content,
        Some(json!({"id": "it_1", "name": "first"}))
    );
    client.close().await;
    let _ = gateway.kill();
    let _ = gateway.wait();
}

/// `obol harness` answers a harness of another protocol, and a component the gateway would
/// refuse, with one line saying so and exit code 2.
#[test]
fn obol_harness_says_why_it_will_not_serve() {
    let dir = tempfile::tempdir().unwrap();
    let not_a_component = dir.path().join("broken.wasm");
    std::fs::write(&not_a_component, b"not wasm").unwrap();
    let path = not_a_component.to_str().unwrap();

    let (code, out, _) = run_obol(&["harness", "--protocol", "99", path]);
    assert_eq!(code, 2);
    let reply: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(
        reply,
        serde_json::json!({"unsupported": {"speaks": 1, "asked": 99}})
    );

    let (code, out, _) = run_obol(&["harness", "--protocol", "1", path]);
    assert_eq!(code, 2);
    let reply: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    let why = reply["refused"].as_str().unwrap();
    assert!(why.contains("not a valid connector component"), "{why}");
    assert_eq!(out.lines().count(), 1, "{out}");
}
