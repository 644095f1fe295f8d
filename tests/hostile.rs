//! Hostile and clumsy clients against the real binary (issue 10): every abuse is bounded, and
//! a well-behaved client is served during and after it, with nothing reaching the vendor.

use std::time::{Duration, Instant};

use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::support::{GatewayConfig, GatewayProcess, McpClient, MockVendor, RawMcp, TOKEN};

fn address(gateway: &GatewayProcess) -> String {
    gateway
        .url
        .trim_start_matches("http://")
        .trim_end_matches("/mcp")
        .to_owned()
}

/// A normal client's call: a new session, a tool call, an answer.
async fn served(gateway: &GatewayProcess) -> Duration {
    let started = Instant::now();
    let client = McpClient::connect(&gateway.url, TOKEN).await;
    let done = client
        .call("tracker.issues.create", json!({"title": "normal"}))
        .await
        .unwrap_or_else(|e| panic!("a normal call was not served: {e:?}\n{}", gateway.log()));
    assert_eq!(done.is_error, Some(false));
    started.elapsed()
}

/// Whether the gateway closed `stream` (EOF or reset) within `within`.
async fn closed_by_gateway(stream: &mut TcpStream, within: Duration) -> bool {
    let mut buffer = [0u8; 4096];
    let deadline = tokio::time::Instant::now() + within;
    loop {
        match tokio::time::timeout_at(deadline, stream.read(&mut buffer)).await {
            Err(_) => return false,
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            // A 503 or 408 before the close.
            Ok(Ok(_)) => continue,
        }
    }
}

/// Idle connections beyond the cap, and connections dripping a request head, under an
/// open-file limit they would exhaust: a normal call is still answered, heads that never end
/// are cut off at the header-read timeout, idle connections at the idle timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_and_slow_connections_cannot_crowd_out_a_call() {
    let vendor = MockVendor::start().await;
    let mut config = GatewayConfig::new(&vendor.base_url());
    config.open_files = Some(256);
    config.server =
        "max_connections = 100\nheader_read_timeout_ms = 2000\nidle_timeout_ms = 4000".into();
    let gateway = GatewayProcess::start(&config);
    let address = address(&gateway);

    // 300 idle connections: three times the cap, more than the descriptors left.
    let mut idle = Vec::new();
    for _ in 0..300 {
        idle.push(TcpStream::connect(&address).await.unwrap());
    }
    // 20 connections that send a request head one header line at a time, forever.
    let mut dripping = Vec::new();
    for _ in 0..20 {
        let mut stream = TcpStream::connect(&address).await.unwrap();
        stream
            .write_all(b"POST /mcp HTTP/1.1\r\nhost: 127.0.0.1\r\n")
            .await
            .unwrap();
        dripping.push(stream);
    }
    let drip = tokio::spawn(async move {
        let started = Instant::now();
        let mut cut = vec![None; dripping.len()];
        while started.elapsed() < Duration::from_secs(6) {
            for (n, stream) in dripping.iter_mut().enumerate() {
                if cut[n].is_none() && stream.write_all(b"x-drip: 1\r\n").await.is_err() {
                    cut[n] = Some(started.elapsed());
                }
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        for (n, stream) in dripping.iter_mut().enumerate() {
            if cut[n].is_none() && closed_by_gateway(stream, Duration::from_millis(10)).await {
                cut[n] = Some(started.elapsed());
            }
        }
        cut
    });

    let first = served(&gateway).await;
    let cut = drip.await.unwrap();
    assert!(
        cut.iter().all(Option::is_some),
        "a request head that never ends was kept: {cut:?}"
    );
    assert!(
        cut.iter()
            .flatten()
            .all(|after| *after < Duration::from_secs(5)),
        "{cut:?}"
    );

    // The idle connections: those that gave way to newer ones are closed already; the rest
    // are closed at the idle timeout.
    let mut open_after_timeout = 0;
    for stream in &mut idle {
        if !closed_by_gateway(stream, Duration::from_secs(5)).await {
            open_after_timeout += 1;
        }
    }
    assert_eq!(
        open_after_timeout, 0,
        "idle connections outlived the idle timeout"
    );
    let after = served(&gateway).await;
    assert!(
        !gateway.log().contains("cannot accept"),
        "{}",
        gateway.log()
    );
    assert_eq!(
        vendor.count("/repos/acme/app/issues"),
        2,
        "only the normal calls"
    );
    println!("normal call under abuse: {first:?}; after: {after:?}");
}

/// With the default limits (but a shorter body-read timeout), 100 uploads that announce 8 MiB
/// and send all but the last byte, and 500 connections sending endless header lines: the
/// gateway buffers no more than its body budget (refusing the rest with `overloaded` before
/// buffering them), cuts the uploads it took off at the body-read timeout and the heads at the
/// header limit, keeps its memory under 256 MiB, and answers a normal call meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_uploads_cannot_exhaust_memory() {
    let vendor = MockVendor::start().await;
    let mut config = GatewayConfig::new(&vendor.base_url());
    config.server = "body_read_timeout_ms = 4000".into();
    let gateway = GatewayProcess::start(&config);
    let address = address(&gateway);
    let before = gateway.peak_rss_mib();

    const BODY: usize = 8 << 20;
    let heads: Vec<_> = (0..500)
        .map(|_| {
            let address = address.clone();
            tokio::spawn(async move {
                let Ok(mut stream) = TcpStream::connect(&address).await else {
                    return;
                };
                let _ = stream.write_all(b"GET /mcp HTTP/1.1\r\n").await;
                let line = format!("x-flood: {}\r\n", "h".repeat(1000));
                for _ in 0..10_000 {
                    if stream.write_all(line.as_bytes()).await.is_err() {
                        return;
                    }
                }
            })
        })
        .collect();
    let uploads: Vec<_> = (0..100)
        .map(|_| {
            let address = address.clone();
            tokio::spawn(async move {
                let stream = TcpStream::connect(&address).await.unwrap();
                let (mut reader, mut writer) = stream.into_split();
                let head = format!(
                    "POST /mcp HTTP/1.1\r\nhost: {address}\r\nauthorization: Bearer {TOKEN}\r\naccept: application/json, text/event-stream\r\ncontent-type: application/json\r\ncontent-length: {BODY}\r\n\r\n"
                );
                // All but the last byte, as fast as the gateway takes them; the last byte never
                // comes.
                let sending = tokio::spawn(async move {
                    let _ = writer.write_all(head.as_bytes()).await;
                    let chunk = vec![b' '; 64 << 10];
                    let mut sent = 0;
                    while sent < BODY - 1 {
                        let n = chunk.len().min(BODY - 1 - sent);
                        if writer.write_all(&chunk[..n]).await.is_err() {
                            break;
                        }
                        sent += n;
                    }
                    tokio::time::sleep(Duration::from_secs(30)).await;
                    drop(writer);
                });
                // Whatever the gateway answers, it answers within the body-read timeout.
                let mut answer = Vec::new();
                let _ = tokio::time::timeout(
                    Duration::from_secs(10),
                    reader.read_to_end(&mut answer),
                )
                .await;
                sending.abort();
                String::from_utf8_lossy(&answer).into_owned()
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let during = served(&gateway).await;
    let mut overloaded = 0;
    let mut timed_out = 0;
    for upload in uploads {
        let answer = upload.await.unwrap();
        if answer.contains("\"type\":\"overloaded\"") {
            overloaded += 1;
        } else if answer.starts_with("HTTP/1.1 408") && answer.contains("request_timeout") {
            timed_out += 1;
        } else {
            panic!("an upload got {answer:?}");
        }
    }
    for head in heads {
        head.await.unwrap();
    }
    let peak = gateway.peak_rss_mib();
    let after = served(&gateway).await;
    println!(
        "100 stalled 8 MiB uploads + 500 header floods: {overloaded} refused overloaded, {timed_out} cut off; peak RSS {peak} MiB (at start {before} MiB); normal call during {during:?}, after {after:?}"
    );
    // 64 MiB less the eighth kept for small bodies holds seven 8 MiB bodies at most.
    assert!(
        timed_out <= 7 && overloaded >= 93,
        "{overloaded} / {timed_out}"
    );
    assert!(peak < 256, "peak RSS {peak} MiB");
    assert_eq!(
        vendor.count("/repos/acme/app/issues"),
        2,
        "only the normal calls"
    );
}

/// `request` sent as is on a fresh connection; the whole answer (it asks to close).
async fn raw_http(address: &str, request: &str) -> String {
    let mut stream = TcpStream::connect(address).await.unwrap();
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut answer))
        .await
        .expect("the gateway answers and closes")
        .unwrap();
    String::from_utf8_lossy(&answer).into_owned()
}

/// HTTP strictness: a request whose host is ambiguous is refused before any endpoint sees
/// it, and host names compare without regard to case.
#[tokio::test]
async fn ambiguous_hosts_are_refused_and_host_names_ignore_case() {
    let vendor = MockVendor::start().await;
    let gateway = GatewayProcess::start(&GatewayConfig::new(&vendor.base_url()));
    let address = address(&gateway);
    let port = address.rsplit(':').next().unwrap();

    // Two Host headers, the good one first.
    let twice = raw_http(
        &address,
        &format!("GET /inbox HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\nhost: evil.example\r\nconnection: close\r\n\r\n"),
    )
    .await;
    assert!(twice.starts_with("HTTP/1.1 400"), "{twice}");
    assert!(twice.contains("malformed_header"), "{twice}");
    // An absolute-form target naming another host than Host.
    let elsewhere = raw_http(
        &address,
        &format!("GET http://evil.example/inbox HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\nconnection: close\r\n\r\n"),
    )
    .await;
    assert!(elsewhere.starts_with("HTTP/1.1 400"), "{elsewhere}");
    // The same target naming this gateway, and a host in capitals: the inbox answers (its
    // sign-in page), where a foreign host gets 421.
    for request in [
        format!(
            "GET http://127.0.0.1:{port}/inbox HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\nconnection: close\r\n\r\n"
        ),
        format!("GET /inbox HTTP/1.1\r\nhost: LOCALHOST:{port}\r\nconnection: close\r\n\r\n"),
    ] {
        let answer = raw_http(&address, &request).await;
        assert!(
            answer.starts_with("HTTP/1.1 200") || answer.starts_with("HTTP/1.1 401"),
            "{request}: {answer}"
        );
    }
    let foreign = raw_http(
        &address,
        "GET /inbox HTTP/1.1\r\nhost: evil.example\r\nconnection: close\r\n\r\n",
    )
    .await;
    assert!(foreign.starts_with("HTTP/1.1 421"), "{foreign}");
}

/// A JSON object that repeats a key is an invalid request (the request hash assumes unique
/// keys), and nothing is sent; invalid arguments are named, never echoed, so an error stays
/// small and a secret stays out of it.
#[tokio::test]
async fn repeated_keys_are_refused_and_arguments_never_echoed() {
    let vendor = MockVendor::start().await;
    let gateway = GatewayProcess::start(&GatewayConfig::new(&vendor.base_url()));
    let raw = RawMcp::new(&gateway.url);
    let (session, _) = raw.initialize(TOKEN, "2025-11-25").await;
    let body = r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"stripe.create_refund","arguments":{"charge":"ch_1","amount":1,"amount":100000}}}"#;
    let repeated = raw.post(Some(TOKEN), Some(&session), body, &[]).await;
    assert_eq!(repeated.error_code(), -32600, "{:?}", repeated.message());

    let client = McpClient::connect(&gateway.url, TOKEN).await;
    let secret = format!("sk_live_{}", "S".repeat(1 << 20));
    let (message, data) = client
        .call_refused(
            "stripe.create_refund",
            json!({"charge": "ch_1", "amount": secret}),
        )
        .await;
    assert!(!data.to_string().contains("sk_live"), "{data}");
    assert!(!message.contains("sk_live"), "{message}");
    assert!(
        message.len() + data.to_string().len() < 4096,
        "an error of {} bytes",
        message.len()
    );
    assert!(message.contains("/amount"), "{message}");
    assert!(vendor.seen().is_empty());
}

/// Guessing credentials: a source address gets ten failures per endpoint, then one every
/// 6 s, answered 429 with `Retry-After` whatever it presents; another address is served as
/// ever, and a thousand failures make two log lines, not a thousand.
#[tokio::test]
async fn guessing_credentials_is_slowed_per_source_and_logged_once() {
    let vendor = MockVendor::start().await;
    let gateway = GatewayProcess::start(&GatewayConfig::new(&vendor.base_url()));
    let address = address(&gateway);
    // Loopback has every 127.x address: the attacker is 127.0.0.2.
    let attacker = reqwest::Client::builder()
        .local_address("127.0.0.2".parse::<std::net::IpAddr>().unwrap())
        .build()
        .unwrap();
    let receipts = format!("http://{address}/v1/receipts");
    let (mut refused, mut limited) = (0, 0);
    for n in 0..1000 {
        let response = attacker
            .get(&receipts)
            .header("authorization", format!("Bearer obk_guess_{n}"))
            .send()
            .await
            .unwrap();
        match response.status().as_u16() {
            401 => refused += 1,
            429 => {
                limited += 1;
                let wait: u64 = response.headers()["retry-after"]
                    .to_str()
                    .unwrap()
                    .parse()
                    .unwrap();
                assert!((1..=6).contains(&wait), "{wait}");
            }
            other => panic!("a guess got {other}"),
        }
    }
    assert_eq!((refused, limited), (10, 990));
    // The right key from the guessing address waits too: the guesses are what is slowed.
    let right = attacker
        .get(&receipts)
        .header("authorization", format!("bearer {TOKEN}"))
        .send()
        .await
        .unwrap();
    assert_eq!(right.status().as_u16(), 429);
    let body: serde_json::Value = right.json().await.unwrap();
    assert_eq!(body["error"]["type"], json!("rate_limited"), "{body}");
    // Another endpoint of the same address is limited on its own; /mcp answers in JSON-RPC.
    for n in 0..11 {
        let response = attacker
            .post(&gateway.url)
            .header("authorization", format!("Bearer obk_guess_{n}"))
            .header("accept", "application/json, text/event-stream")
            .header("content-type", "application/json")
            .body(r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#)
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        let text = response.text().await.unwrap();
        match n {
            0..10 => assert_eq!(status, 401, "{text}"),
            _ => {
                assert_eq!(status, 429, "{text}");
                assert!(
                    text.contains("\"code\":-32000") && text.contains("rate_limited"),
                    "{text}"
                );
            }
        }
    }
    // Another address (the well-behaved client, on 127.0.0.1): served as ever, Bearer in any
    // case.
    let ours = reqwest::Client::new()
        .get(&receipts)
        .header("authorization", format!("BEARER {TOKEN}"))
        .send()
        .await
        .unwrap();
    assert_eq!(ours.status().as_u16(), 200);
    served(&gateway).await;
    let lines = gateway
        .log()
        .lines()
        .filter(|line| line.contains("failed authentication"))
        .count();
    assert!(lines <= 2, "{lines} log lines for 1,011 failures");
    assert!(
        vendor
            .seen()
            .iter()
            .all(|seen| seen.path == "/repos/acme/app/issues")
    );
}

/// A key at its session limit: the 257th `initialize` is refused (retryable), and every
/// session it holds still answers.
#[tokio::test]
async fn a_key_at_its_session_limit_is_refused_and_loses_no_session() {
    let vendor = MockVendor::start().await;
    let gateway = GatewayProcess::start(&GatewayConfig::new(&vendor.base_url()));
    let raw = RawMcp::new(&gateway.url);
    let mut sessions = Vec::new();
    for _ in 0..256 {
        let (session, _) = raw.initialize(TOKEN, "2025-11-25").await;
        assert!(session.starts_with("mcs_"));
        sessions.push(session);
    }
    let (refused, answer) = raw.initialize(TOKEN, "2025-11-25").await;
    assert!(refused.is_empty());
    assert_eq!(answer.error_code(), -32000);
    assert_eq!(answer.error_type(), "session_limit");
    for session in [&sessions[0], &sessions[255]] {
        let pong = raw.request(TOKEN, session, 2, "ping", json!({})).await;
        assert_eq!(pong.status, 200, "{:?}", pong.message());
        assert!(pong.message()["result"].is_object(), "{:?}", pong.message());
    }
    // Another key is not affected.
    assert!(
        !raw.initialize("obk_test_globex", "2025-11-25")
            .await
            .0
            .is_empty()
    );
}

/// The README's demo credentials work only on loopback: the example config told to listen on
/// every interface is refused at start, naming them; `obol keys mint` makes real ones.
#[test]
fn demo_credentials_are_refused_off_loopback() {
    let examples = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples");
    let text = std::fs::read_to_string(examples.join("obol.toml"))
        .unwrap()
        .replace("listen = \"127.0.0.1:8780\"", "listen = \"0.0.0.0:0\"");
    // Beside the example, so its relative paths still resolve.
    let config = examples.join(format!("public-{}.toml", std::process::id()));
    std::fs::write(&config, text).unwrap();
    let (code, _, stderr) =
        crate::support::gateway::run_obol(&["serve", "--config", config.to_str().unwrap()]);
    std::fs::remove_file(&config).unwrap();
    assert_ne!(code, 0);
    assert!(
        stderr.contains("obk_local_example") && stderr.contains("loopback"),
        "{stderr}"
    );
    let (code, minted, _) = crate::support::gateway::run_obol(&["keys", "mint", "--kind", "admin"]);
    assert_eq!(code, 0);
    let token = minted
        .lines()
        .find_map(|line| line.strip_prefix("token: "))
        .unwrap();
    assert!(
        token.starts_with("oba_") && token.len() == 4 + 64,
        "{minted}"
    );
    let hash = minted
        .lines()
        .find_map(|line| line.strip_prefix("hash:"))
        .unwrap()
        .trim();
    assert_eq!(hash, crate::support::key_hash(token));
}
