//! The `/mcp` wire: every row of `docs/transport.md`'s status matrix.

use std::time::Duration;

use futures_util::StreamExt;
use serde_json::json;

use crate::support::{GatewayConfig, GatewayProcess, MockVendor, RawMcp, TOKEN};

async fn gateway() -> (GatewayProcess, RawMcp) {
    let vendor = MockVendor::start().await;
    let gateway = GatewayProcess::start(&GatewayConfig::new(&vendor.base_url()));
    let raw = RawMcp::new(&gateway.url);
    (gateway, raw)
}

const PING: &str = r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#;

/// Every response is SSE with MCP-Protocol-Version, and a pre-MCP error carries the envelope.
fn assert_error(
    response: &crate::support::client::RawResponse,
    status: u16,
    code: i64,
    kind: &str,
) {
    assert_eq!(response.status, status, "{response:?}");
    assert_eq!(
        response.header("content-type"),
        Some("text/event-stream"),
        "{response:?}"
    );
    assert!(
        response.header("mcp-protocol-version").is_some(),
        "{response:?}"
    );
    assert_eq!(response.error_code(), code, "{response:?}");
    assert_eq!(response.error_type(), kind, "{response:?}");
    let data = &response.message()["error"]["data"];
    assert!(
        data["message"].is_string() && data["retryable"].is_boolean(),
        "{data}"
    );
}

#[tokio::test]
async fn status_matrix_before_the_mcp_server() {
    let (_gateway, raw) = gateway().await;
    let (session, _) = raw.initialize(TOKEN, "2025-11-25").await;

    // 401: no key, an unknown key, a malformed header.
    let r = raw.post(None, Some(&session), PING, &[]).await;
    assert_error(&r, 401, -32001, "unauthenticated");
    assert!(r.header("www-authenticate").is_some());
    let r = raw.post(Some("obk_nope"), Some(&session), PING, &[]).await;
    assert_error(&r, 401, -32001, "unauthenticated");
    let r = raw
        .post(
            None,
            Some(&session),
            PING,
            &[("authorization", "Basic dXNlcjpwYXNz")],
        )
        .await;
    assert_error(&r, 401, -32001, "unauthenticated");

    // 406: the client does not accept SSE.
    let r = raw
        .post(
            Some(TOKEN),
            Some(&session),
            PING,
            &[("accept", "application/json")],
        )
        .await;
    assert_error(&r, 406, -32004, "not_acceptable");

    // 415: not JSON.
    let r = raw
        .post(
            Some(TOKEN),
            Some(&session),
            PING,
            &[("content-type", "text/plain")],
        )
        .await;
    assert_error(&r, 415, -32005, "unsupported_media_type");

    // 403: a browser origin outside the loopback default; loopback origins pass.
    let r = raw
        .post(
            Some(TOKEN),
            Some(&session),
            PING,
            &[("origin", "https://evil.example")],
        )
        .await;
    assert_error(&r, 403, -32002, "origin_not_allowed");
    let r = raw
        .post(
            Some(TOKEN),
            Some(&session),
            PING,
            &[("origin", "http://localhost:3000")],
        )
        .await;
    assert_eq!(r.status, 200, "{r:?}");

    // 400: no session; 404: a session that does not exist.
    let r = raw.post(Some(TOKEN), None, PING, &[]).await;
    assert_error(&r, 400, -32008, "session_required");
    let fake = format!("mcs_{}", "0".repeat(64));
    let r = raw.post(Some(TOKEN), Some(&fake), PING, &[]).await;
    assert_error(&r, 404, -32010, "unknown_session");

    // 400: a header that must be single, given twice; two Authorization headers are 401.
    let bearer = format!("Bearer {TOKEN}");
    let common = [
        ("accept", "text/event-stream"),
        ("content-type", "application/json"),
    ];
    let twice = raw
        .post_exact(
            &[
                &[
                    ("authorization", bearer.as_str()),
                    ("mcp-session-id", session.as_str()),
                    ("mcp-session-id", session.as_str()),
                ][..],
                &common[..],
            ]
            .concat(),
            PING,
        )
        .await;
    assert_error(&twice, 400, -32009, "malformed_header");
    let two_keys = raw
        .post_exact(
            &[
                &[
                    ("authorization", bearer.as_str()),
                    ("authorization", "Bearer obk_other"),
                    ("mcp-session-id", session.as_str()),
                ][..],
                &common[..],
            ]
            .concat(),
            PING,
        )
        .await;
    assert_error(&two_keys, 401, -32001, "unauthenticated");

    // 405: a method the endpoint does not have.
    let put = raw
        .http
        .put(&raw.url)
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(put.status(), 405);
    assert_eq!(put.headers()["allow"], "GET, POST, DELETE");

    // 400: an unsupported protocol version header.
    let r = raw
        .post(
            Some(TOKEN),
            Some(&session),
            PING,
            &[("mcp-protocol-version", "1999-01-01")],
        )
        .await;
    assert_error(&r, 400, -32007, "unsupported_protocol_version");
}

#[tokio::test]
async fn malformed_json_rpc_is_answered_as_json_rpc() {
    let (_gateway, raw) = gateway().await;
    let (session, _) = raw.initialize(TOKEN, "2025-11-25").await;
    let r = raw
        .post(Some(TOKEN), Some(&session), "{not json", &[])
        .await;
    assert_eq!((r.status, r.error_code()), (400, -32700), "{r:?}");
    assert_eq!(r.message()["id"], json!(null));
    for invalid in [
        r#"[{"jsonrpc":"2.0","id":1,"method":"ping"}]"#,
        r#"{"jsonrpc":"1.0","id":1,"method":"ping"}"#,
        r#"{"jsonrpc":"2.0","id":{"x":1},"method":"ping"}"#,
        r#"{"jsonrpc":"2.0","id":1}"#,
        r#""just a string""#,
    ] {
        let r = raw.post(Some(TOKEN), Some(&session), invalid, &[]).await;
        assert_eq!(
            (r.status, r.error_code()),
            (400, -32600),
            "{invalid}: {r:?}"
        );
    }
    let r = raw
        .request(TOKEN, &session, 9, "resources/list", json!({}))
        .await;
    assert_eq!((r.status, r.error_code()), (200, -32601), "{r:?}");
    assert_eq!(r.message()["id"], json!(9));
}

#[tokio::test]
async fn oversized_bodies_are_refused_before_they_are_read() {
    let (_gateway, raw) = gateway().await;
    let (session, _) = raw.initialize(TOKEN, "2025-11-25").await;
    // Declared too large: answered from the headers alone, before a byte of body is sent.
    let address = raw
        .url
        .trim_start_matches("http://")
        .trim_end_matches("/mcp")
        .to_owned();
    let mut socket = tokio::net::TcpStream::connect(&address).await.unwrap();
    let head = format!(
        "POST /mcp HTTP/1.1\r\nhost: {address}\r\nauthorization: Bearer {TOKEN}\r\nmcp-session-id: {session}\r\n\
         accept: text/event-stream\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        9 * 1024 * 1024
    );
    tokio::io::AsyncWriteExt::write_all(&mut socket, head.as_bytes())
        .await
        .unwrap();
    let mut answer = vec![0u8; 4096];
    let read = tokio::time::timeout(
        Duration::from_secs(5),
        tokio::io::AsyncReadExt::read(&mut socket, &mut answer),
    )
    .await
    .expect("the gateway waited for a body it should refuse")
    .unwrap();
    let answer = String::from_utf8_lossy(&answer[..read]).to_string();
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    assert!(answer.contains("payload_too_large"), "{answer}");

    // Chunked, with no length: refused once the stream passes 8 MiB, while the client is
    // still sending (the remaining 56 MiB are never read).
    let chunks =
        futures_util::stream::iter((0..64).map(|_| Ok::<_, std::io::Error>(vec![b' '; 1 << 20])));
    let response = raw
        .http
        .post(&raw.url)
        .header("authorization", format!("Bearer {TOKEN}"))
        .header("mcp-session-id", &session)
        .header("accept", "text/event-stream")
        .header("content-type", "application/json")
        .body(reqwest::Body::wrap_stream(chunks))
        .send()
        .await;
    // The server may answer and close before the client finishes sending; either way the
    // request was refused, never buffered whole.
    if let Ok(response) = response {
        let r = crate::support::client::read(response).await;
        assert_error(&r, 413, -32006, "payload_too_large");
    }
    // The gateway is unharmed.
    let r = raw.request(TOKEN, &session, 2, "ping", json!({})).await;
    assert_eq!(r.status, 200);
}

#[tokio::test]
async fn protocol_versions_are_negotiated() {
    let (_gateway, raw) = gateway().await;
    for version in ["2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25"] {
        let (session, r) = raw.initialize(TOKEN, version).await;
        assert_eq!(r.message()["result"]["protocolVersion"], json!(version));
        assert_eq!(r.header("mcp-protocol-version"), Some(version));
        assert!(
            session.starts_with("mcs_") && session.len() > 40,
            "{session}"
        );
        // Later responses in the session carry the negotiated version.
        let ping = raw.request(TOKEN, &session, 2, "ping", json!({})).await;
        assert_eq!(ping.header("mcp-protocol-version"), Some(version));
        assert_eq!(ping.message()["result"], json!({}));
    }
    for unknown in ["2026-07-28", "1.0", ""] {
        let (_, r) = raw.initialize(TOKEN, unknown).await;
        assert_eq!(
            r.message()["result"]["protocolVersion"],
            json!("2025-11-25"),
            "{unknown}"
        );
    }
}

#[tokio::test]
async fn server_discover_is_method_not_found_only_in_the_handshake_era() {
    let (_gateway, raw) = gateway().await;
    // A handshake-era `server/discover` (no 2026 header, no 2026 `_meta`) is what it was
    // before the revision existed: -32601 in an SSE 200.
    let body = json!({"jsonrpc": "2.0", "id": 0, "method": "server/discover", "params": {}});
    let r = raw
        .post(
            Some(TOKEN),
            None,
            &body.to_string(),
            &[("mcp-protocol-version", "2025-11-25")],
        )
        .await;
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-type"), Some("text/event-stream"));
    assert_eq!(r.error_code(), -32601);
    assert_eq!(r.message()["id"], json!(0));
    // With 2026 `_meta`, it is a 2026 request, checked as one (here: no client capabilities).
    let body = json!({"jsonrpc": "2.0", "id": 0, "method": "server/discover",
        "params": {"_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28"}}});
    let r = raw
        .post(
            Some(TOKEN),
            None,
            &body.to_string(),
            &[("mcp-protocol-version", "2025-11-25")],
        )
        .await;
    assert_eq!(r.status, 400);
    assert_eq!(r.header("content-type"), Some("application/json"));
    let answer: serde_json::Value = serde_json::from_str(&r.body).unwrap();
    assert_eq!(answer["error"]["code"], json!(-32602));
}

#[tokio::test]
async fn notifications_are_accepted_and_delete_ends_the_session() {
    let (_gateway, raw) = gateway().await;
    let (session, _) = raw.initialize(TOKEN, "2025-11-25").await;
    let note = r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#;
    let r = raw.post(Some(TOKEN), Some(&session), note, &[]).await;
    assert_eq!(r.status, 202);
    assert_eq!(r.body, "");
    assert_eq!(r.header("mcp-protocol-version"), Some("2025-11-25"));

    let deleted = raw
        .http
        .delete(&raw.url)
        .header("authorization", format!("Bearer {TOKEN}"))
        .header("mcp-session-id", &session)
        .send()
        .await
        .unwrap();
    assert_eq!(deleted.status(), 200);
    let r = raw.request(TOKEN, &session, 3, "ping", json!({})).await;
    assert_eq!(r.status, 404);
}

#[tokio::test]
async fn a_session_presented_by_another_workspace_looks_unknown() {
    let (_gateway, raw) = gateway().await;
    let (session, _) = raw.initialize(TOKEN, "2025-11-25").await;
    let foreign = raw
        .request("obk_test_globex", &session, 5, "tools/list", json!({}))
        .await;
    let fake = format!("mcs_{}", "a".repeat(64));
    let unknown = raw
        .request("obk_test_globex", &fake, 5, "tools/list", json!({}))
        .await;
    assert_eq!(foreign.status, 404);
    assert_eq!(foreign.body, unknown.body);
    assert_eq!(foreign.status, unknown.status);
}

#[tokio::test]
async fn the_get_stream_announces_catalog_changes() {
    let vendor = MockVendor::start().await;
    let mut config = GatewayConfig::new(&vendor.base_url());
    config.components = vec![crate::support::guests::PAYMENTS.into()];
    config.connectors_dir = true;
    let gateway = GatewayProcess::start(&config);
    let raw = RawMcp::new(&gateway.url);
    let (session, _) = raw.initialize(TOKEN, "2025-11-25").await;

    let stream = raw
        .http
        .get(&raw.url)
        .header("authorization", format!("Bearer {TOKEN}"))
        .header("mcp-session-id", &session)
        .header("accept", "text/event-stream")
        .send()
        .await
        .unwrap();
    assert_eq!(stream.status(), 200);
    assert_eq!(stream.headers()["content-type"], "text/event-stream");
    let mut events = stream.bytes_stream();

    // Hot-load the tracker connector by dropping it into the watched directory.
    let listed = raw
        .request(TOKEN, &session, 1, "tools/list", json!({}))
        .await;
    assert!(!listed.body.contains("tracker."));
    std::fs::copy(
        crate::support::guests::TRACKER,
        gateway.connectors_dir().join("tracker.wasm"),
    )
    .unwrap();

    let mut received = String::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while !received.contains("notifications/tools/list_changed") {
        let chunk = tokio::time::timeout_at(deadline, events.next())
            .await
            .expect("no tools/list_changed within 20 s")
            .unwrap()
            .unwrap();
        received.push_str(&String::from_utf8_lossy(&chunk));
    }
    let listed = raw
        .request(TOKEN, &session, 2, "tools/list", json!({}))
        .await;
    assert!(
        listed.body.contains("tracker.issues.get"),
        "{}",
        listed.body
    );
}
