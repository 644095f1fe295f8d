//! The official MCP conformance suite (`@modelcontextprotocol/conformance`, pinned in
//! `.ci/test`) against a real gateway, for 2026-07-28 and for 2025-11-25.
//!
//! The suite takes only a URL, and the gateway admits no request without a key, so it runs
//! through a loopback proxy that adds `Authorization: Bearer <test key>` and passes every
//! other header (`Host` and `Origin` included) unchanged: the DNS-rebinding checks see the
//! gateway's own answers. Checks that need the suite's fixture tools (named `test_*`, which a
//! gateway whose tools are namespaced `connector.tool` cannot have) are listed, with the
//! reason, in `tests/conformance/expected-failures.yml` and in `docs/transport.md`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Command;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::Response;
use futures_util::TryStreamExt;

use crate::support::gateway::Key;
use crate::support::{GatewayConfig, GatewayProcess, MockVendor};

/// The proxy's key. It may call the two stripe tools, so that the first tool listed
/// (`stripe.charges.list`) is one the header scenario can call with no arguments, as the
/// suite's fixture server's first tool can.
const PROXY_KEY: &str = "obk_conformance";

/// A loopback proxy to `target` that adds the test key and changes nothing else.
async fn authorizing_proxy(target: String) -> SocketAddr {
    async fn forward(
        State(target): State<(String, reqwest::Client)>,
        request: Request,
    ) -> Response {
        let (target, http) = target;
        let (parts, body) = request.into_parts();
        let url = format!(
            "{target}{}",
            parts.uri.path_and_query().map_or("/", |p| p.as_str())
        );
        let body = axum::body::to_bytes(body, 16 << 20)
            .await
            .unwrap_or_default();
        let mut outbound = http.request(parts.method.clone(), url).body(body);
        for (name, value) in &parts.headers {
            if name != "content-length" {
                outbound = outbound.header(name, value);
            }
        }
        outbound = outbound.header("authorization", format!("Bearer {PROXY_KEY}"));
        let answer = match outbound.send().await {
            Ok(answer) => answer,
            Err(_) => {
                return Response::builder().status(502).body(Body::empty()).unwrap();
            }
        };
        let mut response = Response::builder().status(answer.status());
        for (name, value) in answer.headers() {
            response = response.header(name, value);
        }
        let stream = answer.bytes_stream().map_err(std::io::Error::other);
        response.body(Body::from_stream(stream)).unwrap()
    }
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let app = axum::Router::new()
        .fallback(forward)
        .with_state((target, http));
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    address
}

/// The suite's entry point and the Node that runs it (`.ci/test` installs both).
fn suite() -> (PathBuf, PathBuf) {
    let entry = std::env::var_os("OBOL_CONFORMANCE")
        .map(PathBuf::from)
        .expect("OBOL_CONFORMANCE: the conformance suite's dist/index.js (run .ci/test)");
    let node = std::env::var_os("OBOL_NODE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("node"));
    (entry, node)
}

/// Runs one scenario; panics with the suite's output unless every check passed (or is a
/// listed expected failure).
async fn scenario(url: &str, name: &str, version: &str) -> String {
    let (entry, node) = suite();
    let expected = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/conformance/expected-failures.yml");
    let url = url.to_owned();
    let (scenario, spec) = (name.to_owned(), version.to_owned());
    let output = tokio::task::spawn_blocking(move || {
        Command::new(node)
            .env("NO_COLOR", "1")
            .arg(entry)
            .args(["server", "--url", &url, "--scenario", &scenario])
            .args(["--spec-version", &spec])
            .arg("--expected-failures")
            .arg(expected)
            .output()
            .expect("the conformance suite runs")
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(output.status.success(), "{stdout}\n{stderr}");
    // A scenario that does not apply at this version exits 0 having checked nothing.
    assert!(
        stdout.contains("SUCCESS"),
        "{name} checked nothing:\n{stdout}"
    );
    println!("{name} @ {version}:\n{stdout}");
    stdout
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_conformance_suite_passes() {
    let vendor = MockVendor::start().await;
    let mut config = GatewayConfig::new(&vendor.base_url());
    config.keys.push(Key::new(PROXY_KEY, "acme", &["stripe.*"]));
    let gateway = GatewayProcess::start(&config);
    let target = gateway.url.trim_end_matches("/mcp").to_owned();
    let proxy = authorizing_proxy(target).await;
    let url = format!("http://127.0.0.1:{}/mcp", proxy.port());
    for name in [
        "server-stateless",
        "tools-list",
        "dns-rebinding-protection",
        "caching",
        "http-header-validation",
    ] {
        scenario(&url, name, "2026-07-28").await;
    }
    for name in [
        "server-initialize",
        "ping",
        "tools-list",
        "server-session-lifecycle",
        "dns-rebinding-protection",
    ] {
        scenario(&url, name, "2025-11-25").await;
    }
}
