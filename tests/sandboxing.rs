//! Hostile components are contained, and broken ones are refused at load time.

use std::time::{Duration, Instant};

use serde_json::json;

use crate::support::gateway::run_obol;
use crate::support::{GatewayConfig, GatewayProcess, McpClient, MockVendor, Reply, TOKEN, guests};

/// After each hostile call the gateway must still serve a well-behaved one.
async fn still_serving(client: &McpClient) {
    let result = client
        .call("hostile.echo", json!({"ping": 1}))
        .await
        .expect("a well-behaved call after a hostile one");
    assert_eq!(result.is_error, Some(false), "{result:?}");
}

async fn error_type(client: &McpClient, tool: &str) -> (i32, String, String) {
    let (code, message, data) = client.call_err(tool, json!({})).await;
    let kind = data.map(|d| d["type"].as_str().unwrap_or_default().to_owned());
    (code, kind.unwrap_or_default(), message)
}

/// A guest's load from past its memory traps; it never reads a byte from outside.
async fn stray_read_traps(client: &McpClient) {
    let (code, kind, message) = error_type(client, "hostile.stray").await;
    assert_eq!((code, kind.as_str()), (-32019, "component_failed"));
    assert!(message.contains("out of bounds memory access"), "{message}");
}

/// An infinite loop is stopped by the epoch deadline (500 ms in the test config), answered
/// within `within`.
async fn spin_is_stopped(client: &McpClient, within: Duration) {
    let started = Instant::now();
    let (code, kind, message) = error_type(client, "hostile.spin").await;
    assert_eq!((code, kind.as_str()), (-32019, "component_failed"));
    assert!(message.contains("deadline"), "{message}");
    assert!(started.elapsed() < within, "{:?}", started.elapsed());
}

/// An idle gateway does not wake every epoch tick (500 times a second), and a guest that
/// spins after the idle gateway stopped ticking is still stopped at its deadline.
#[tokio::test]
async fn an_idle_gateway_stops_ticking_and_still_stops_a_spinning_guest() {
    let vendor = MockVendor::start().await;
    let gateway = GatewayProcess::start(&GatewayConfig::new(&vendor.base_url()));
    let client = McpClient::connect(&gateway.url, TOKEN).await;
    still_serving(&client).await;

    // The ticker runs on for a second after the last guest, then parks.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let before = gateway.thread_wakeups("obol-epoch");
    tokio::time::sleep(Duration::from_secs(1)).await;
    let idle = gateway.thread_wakeups("obol-epoch") - before;
    assert!(
        idle <= 5,
        "the epoch thread woke {idle} times in an idle second"
    );

    spin_is_stopped(&client, Duration::from_secs(2)).await;
    still_serving(&client).await;
}

#[tokio::test]
async fn hostile_components_are_stopped_and_the_gateway_keeps_serving() {
    let vendor = MockVendor::start().await;
    let gateway = GatewayProcess::start(&GatewayConfig::new(&vendor.base_url()));
    let client = McpClient::connect(&gateway.url, TOKEN).await;
    still_serving(&client).await;

    spin_is_stopped(&client, Duration::from_secs(5)).await;
    still_serving(&client).await;

    // A memory bomb traps at the cap (32 MiB in the test config).
    let (code, kind, message) = error_type(&client, "hostile.bomb").await;
    assert_eq!((code, kind.as_str()), (-32019, "component_failed"));
    assert!(message.contains("memory limit"), "{message}");
    still_serving(&client).await;

    // A read outside its memory traps on the guard pages.
    stray_read_traps(&client).await;
    still_serving(&client).await;

    // A request to a foreign origin is refused before anything is sent.
    let before = vendor.seen().len();
    let (code, kind, _) = error_type(&client, "hostile.foreign").await;
    assert_eq!((code, kind.as_str()), (-32019, "egress_denied"));
    assert_eq!(vendor.seen().len(), before, "nothing was sent");
    still_serving(&client).await;

    // Huge guest output is capped.
    let (code, kind, _) = error_type(&client, "hostile.flood").await;
    assert_eq!(
        (code, kind.as_str()),
        (-32019, "component_output_too_large")
    );
    still_serving(&client).await;

    // An oversized vendor response is capped (1 MiB in the test config).
    vendor.on(
        "/echo",
        Reply {
            status: 200,
            body: vec![b'x'; 3 << 20],
            delay: Duration::ZERO,
        },
    );
    let (code, kind, _) = error_type(&client, "hostile.echo").await;
    assert_eq!(
        (code, kind.as_str()),
        (-32019, "upstream_response_too_large")
    );
    vendor.on("/echo", Reply::json(200, json!({"ok": true})));
    still_serving(&client).await;
    client.close().await;
}

/// A call that allocates far more than a component's arena (256 KiB, `obol-sdk`'s allocator)
/// goes on in the component's system allocator: 6,000 charges, 0.5 MB from the vendor,
/// several MB as parsed values, come back whole.
#[tokio::test]
async fn a_call_past_the_components_arena_is_served_whole() {
    const CHARGES: usize = 6_000;
    let vendor = MockVendor::start().await;
    let charges: Vec<_> = (0..CHARGES)
        .map(|n| json!({"id": format!("ch_{n}"), "object": "charge", "amount": n, "currency": "usd", "status": "succeeded"}))
        .collect();
    let body = json!({"object": "list", "has_more": false, "data": charges.clone()});
    assert!(body.to_string().len() > 500_000, "about twice the arena");
    vendor.on("/v1/charges", Reply::json(200, body));
    let gateway = GatewayProcess::start(&GatewayConfig::new(&vendor.base_url()));
    let client = McpClient::connect(&gateway.url, TOKEN).await;
    let result = client
        .call("stripe.charges.list", json!({"limit": 100}))
        .await
        .unwrap();
    assert_eq!(result.is_error, Some(false), "{result:?}");
    let listed = &result.structured_content.as_ref().unwrap()["data"];
    assert_eq!(listed.as_array().map(Vec::len), Some(CHARGES));
    assert!(
        listed == &json!(charges),
        "every charge, as the vendor sent it"
    );
    still_serving(&client).await;
}

/// A host that limits address space (64 GiB here, below the ~4 GiB each of the pool's 128
/// memories reserves for guard pages) still serves guests, bounds-checked, and a guest that
/// reaches past its memory's cap still traps.
#[tokio::test]
async fn under_an_address_space_limit_guests_run_bounds_checked_and_contained() {
    let vendor = MockVendor::start().await;
    let mut config = GatewayConfig::new(&vendor.base_url());
    config.address_space = Some(64 << 30);
    let gateway = GatewayProcess::start(&config);
    assert!(
        gateway.log().contains("bounds-checked instead"),
        "{}",
        gateway.log()
    );
    let client = McpClient::connect(&gateway.url, TOKEN).await;
    still_serving(&client).await;
    let (code, kind, message) = error_type(&client, "hostile.bomb").await;
    assert_eq!((code, kind.as_str()), (-32019, "component_failed"));
    assert!(message.contains("memory limit"), "{message}");
    stray_read_traps(&client).await;
    still_serving(&client).await;
    client.close().await;
}

/// Guests run inline on the gateway's async workers (ADR-0049), one per core here: two guests
/// spinning to their deadline must still let the other calls through, each waiting at most a
/// few epoch ticks, not the spinners' whole deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_hostile_calls_do_not_starve_others() {
    let vendor = MockVendor::start().await;
    let gateway = GatewayProcess::start(&GatewayConfig::new(&vendor.base_url()));
    let spinner = std::sync::Arc::new(McpClient::connect(&gateway.url, TOKEN).await);
    let client = McpClient::connect(&gateway.url, TOKEN).await;
    still_serving(&client).await;
    let spins: Vec<_> = (0..2)
        .map(|_| {
            let spinner = std::sync::Arc::clone(&spinner);
            tokio::spawn(async move { error_type(&spinner, "hostile.spin").await })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(50)).await;
    // Normal calls back to back while both spinners hold a worker (deadline 500 ms).
    let window = Instant::now();
    let mut latencies = Vec::new();
    while window.elapsed() < Duration::from_millis(300) {
        let started = Instant::now();
        still_serving(&client).await;
        latencies.push(started.elapsed());
    }
    for spin in spins {
        let (_, kind, message) = spin.await.unwrap();
        assert_eq!(kind, "component_failed", "{message}");
        assert!(message.contains("deadline"), "{message}");
    }
    latencies.sort();
    eprintln!("normal calls beside two spinning guests: {latencies:?}");
    // Without yielding, the first call would wait for a spinner's deadline (~450 ms). The
    // bounds leave room for a debug build beside other tests on two cores.
    assert!(
        latencies.len() >= 2,
        "only {} normal calls in 300 ms beside two spinners: {latencies:?}",
        latencies.len()
    );
    assert!(
        latencies[latencies.len() - 1] < Duration::from_millis(300),
        "spinning guests held up a normal call: {latencies:?}"
    );
}

#[test]
fn obol_check_prints_a_manifest_and_refuses_each_misfit_specifically() {
    let (code, out, err) = run_obol(&["check", guests::PAYMENTS]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("stripe.create_refund") && out.contains("stripe.charges.list"),
        "{out}"
    );
    // The whole EffectSpec: statuses per class, the binding with its header, the digest.
    assert!(
        out.contains("propagation:   header:Idempotency-Key")
            || out.contains("propagation:   header:idempotency-key"),
        "{out}"
    );
    assert!(out.contains("statuses:      accepted 200-299"), "{out}");
    assert!(out.contains("retryable 429"), "{out}");
    assert!(out.contains("signature: none"), "{out}");
    let digest = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(
        std::fs::read(guests::PAYMENTS).unwrap(),
    ));
    assert!(out.contains(&format!("sha256:   {digest}")), "{out}");

    let expected = [
        ("dotted-name", "contains a dot"),
        ("empty-name", "name is empty"),
        ("duplicate-tool", "declared twice"),
        ("bad-schema", "not a valid JSON Schema"),
        ("overlap", "is both"),
        ("reserved-prefix", "reserved for the gateway"),
        ("reserved-tool", "reserved for the gateway"),
    ];
    for (misfit, path) in guests::MISFITS {
        let (code, _, err) = run_obol(&["check", path]);
        let wanted = expected.iter().find(|(m, _)| *m == misfit).unwrap().1;
        assert_eq!(code, 2, "{misfit}: {err}");
        assert!(err.contains(wanted), "{misfit}: {err}");
    }

    let (code, _, err) = run_obol(&["check", "/nonexistent.wasm"]);
    assert_ne!(code, 0);
    assert!(err.contains("/nonexistent.wasm"), "{err}");

    // The same report as JSON.
    let (code, out, err) = run_obol(&["check", "--json", guests::PAYMENTS]);
    assert_eq!(code, 0, "{err}");
    let report: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(report["sha256"], json!(digest));
    assert_eq!(report["signature"], serde_json::Value::Null);
    let refund = report["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "stripe.create_refund")
        .unwrap();
    assert_eq!(refund["statuses"]["accepted"], json!(["200-299"]));
    assert!(
        refund["propagation"]
            .as_str()
            .unwrap()
            .eq_ignore_ascii_case("header:idempotency-key"),
        "{refund}"
    );
}

/// `obol completions bash` is a script bash loads, completing `obol`'s real subcommands.
#[test]
fn shell_completions_load_in_bash() {
    let (code, script, err) = run_obol(&["completions", "bash"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        script.contains("connectors") && script.contains("completions"),
        "{script}"
    );
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("obol.bash");
    std::fs::write(&file, script).unwrap();
    let loaded = std::process::Command::new("bash")
        .arg("-c")
        .arg(format!("source {file:?} && complete -p obol"))
        .output()
        .unwrap();
    let registered = String::from_utf8_lossy(&loaded.stdout);
    assert!(registered.contains("-F _obol obol"), "{registered}");
}

#[test]
fn a_configured_misfit_stops_startup_with_its_reason() {
    let mut config = GatewayConfig::new("http://127.0.0.1:9");
    config.components.push(guests::MISFITS[0].1.into());
    let refused = std::panic::catch_unwind(|| GatewayProcess::start(&config));
    let message = match refused {
        Ok(_) => panic!("the gateway started with a misfit component"),
        Err(panic) => panic.downcast_ref::<String>().cloned().unwrap_or_default(),
    };
    assert!(message.contains("did not start"), "{message}");
    assert!(message.contains("contains a dot"), "{message}");
}

/// A startup error is printed once: an error whose message already carries its cause's is
/// not followed by that cause again.
#[test]
fn a_startup_error_is_printed_once() {
    let dir = tempfile::tempdir().unwrap();
    let broken_toml = dir.path().join("broken.toml");
    std::fs::write(&broken_toml, "[gateway\n").unwrap();
    let not_wasm = dir.path().join("not-a-component.wasm");
    std::fs::write(&not_wasm, b"\0asm but not really").unwrap();
    let bad_component = dir.path().join("bad-component.toml");
    std::fs::write(
        &bad_component,
        format!(
            "[connectors]\ncomponents = [{:?}]\n",
            not_wasm.to_str().unwrap()
        ),
    )
    .unwrap();
    for (config, message) in [
        (&broken_toml, "unclosed table"),
        (&bad_component, "not a valid connector component"),
    ] {
        let (code, _, err) = run_obol(&["serve", "--config", config.to_str().unwrap()]);
        assert_ne!(code, 0, "{err}");
        assert_eq!(err.matches(message).count(), 1, "{err}");
    }
}

/// A guest pool larger than the host's memory mappings allow is refused at start, by the
/// setting's name and the host's limit. It used to fail deep in the engine ("failed to
/// protect stack guard page: Cannot allocate memory") with neither, or (a little smaller)
/// start and fail calls once enough slots were in use.
#[test]
fn a_pool_beyond_the_hosts_mappings_is_refused_by_name() {
    let limit: u64 = std::fs::read_to_string("/proc/sys/vm/max_map_count")
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    // Every call slot takes at least a stack and its guard page: two mappings.
    let slots = (limit / 2 + 1).min(u64::from(u32::MAX));
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("obol.toml");
    std::fs::write(
        &config,
        format!(
            "[runtime]\nmax_concurrent_calls = {slots}\n[store]\npath = {:?}\n",
            dir.path().join("store.redb").to_str().unwrap()
        ),
    )
    .unwrap();
    let (code, _, err) = run_obol(&[
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--config",
        config.to_str().unwrap(),
    ]);
    assert_ne!(code, 0, "{err}");
    assert!(
        err.contains(&format!("max_concurrent_calls = {slots}"))
            && err.contains(&format!("vm.max_map_count is {limit}")),
        "{err}"
    );
}

#[tokio::test]
async fn a_broken_hot_loaded_component_is_reported_and_skipped() {
    let vendor = MockVendor::start().await;
    let mut config = GatewayConfig::new(&vendor.base_url());
    config.connectors_dir = true;
    let gateway = GatewayProcess::start(&config);
    std::fs::copy(
        guests::MISFITS[3].1,
        gateway.connectors_dir().join("bad.wasm"),
    )
    .unwrap();
    std::fs::write(gateway.connectors_dir().join("garbage.wasm"), b"not wasm").unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while !(gateway.log().contains("bad.wasm") && gateway.log().contains("garbage.wasm")) {
        assert!(Instant::now() < deadline, "no report: {}", gateway.log());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        gateway.log().contains("not a valid JSON Schema"),
        "{}",
        gateway.log()
    );
    let client = McpClient::connect(&gateway.url, TOKEN).await;
    still_serving(&client).await;
    client.close().await;
}

#[tokio::test]
async fn a_restart_loads_compiled_components_from_the_cache() {
    let vendor = MockVendor::start().await;
    let config = GatewayConfig::new(&vendor.base_url());
    let first = GatewayProcess::start(&config);
    assert_eq!(
        first.log().matches("compiled a component").count(),
        3,
        "{}",
        first.log()
    );
    // Compiling at start shows its progress.
    assert!(first.log().contains(" of 3 ready in "), "{}", first.log());
    let dir = first.kill();
    let second = GatewayProcess::start_in(&config, dir);
    let log = second.log();
    assert_eq!(
        log.matches("loaded a component from the compile cache")
            .count(),
        3,
        "{log}"
    );
    assert_eq!(log.matches("compiled a component").count(), 0, "{log}");
    let client = McpClient::connect(&second.url, TOKEN).await;
    still_serving(&client).await;
}

/// Found while checking error messages: `obol serve --config obol.toml` (a config in the
/// working directory) failed to open the store ("obol.redb.journal: No such file").
#[test]
fn a_config_in_the_working_directory_serves() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("obol.toml"),
        "[connectors]\ncomponents = [\"bundled:stripe\"]\n[[workspaces]]\nid = \"w\"\n",
    )
    .unwrap();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_obol"))
        .args(["serve", "--config", "obol.toml", "--listen", "127.0.0.1:0"])
        .current_dir(dir.path())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(child.stdout.take().unwrap()),
        &mut line,
    )
    .unwrap();
    let _ = child.kill();
    let output = child.wait_with_output().unwrap();
    assert!(
        line.starts_with("obol listening on"),
        "{line}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(dir.path().join("obol.redb").is_file());
}
