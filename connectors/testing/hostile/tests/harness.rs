//! The harness applies the gateway's call-time checks to a component's own tests: structured
//! output that breaks the tool's own output schema fails the author's `cargo test`, naming the
//! field, instead of failing every call once deployed (issue 16).

#[test]
fn output_that_matches_the_schema_passes() {
    let harness = obol_harness::build_this_crate!();
    let output = harness
        .interpret("relay", 200, br#"{"number": 7, "title": "ok"}"#)
        .unwrap();
    assert!(output.structured.is_some());
}

#[test]
#[should_panic(
    expected = "relay: the connector's structured output breaks its own output schema: /number"
)]
fn output_that_breaks_the_tools_own_schema_fails_the_authors_test() {
    let harness = obol_harness::build_this_crate!();
    let _ = harness.interpret("relay", 200, br#"{"number": 1.5, "title": "off"}"#);
}

#[test]
fn an_answer_the_tool_does_not_accept_is_not_held_to_the_schema() {
    let harness = obol_harness::build_this_crate!();
    // 404 is definitely rejected: an error's body is not expected to match.
    harness
        .interpret("relay", 404, br#"{"message": "not found"}"#)
        .unwrap();
}

/// The gateway caps a component's output (4 MiB by default); 8 MiB of text fails the author's
/// test with the gateway's reason instead of every call once deployed.
#[test]
#[should_panic(expected = "flood: the connector's output exceeds 4194304 bytes")]
fn output_over_the_gateways_cap_fails_the_authors_test() {
    let harness = obol_harness::build_this_crate!();
    let _ = harness.interpret("flood", 200, b"{}");
}

/// A component that never returns is stopped at the gateway's deadline, and the test says so.
#[test]
#[should_panic(expected = "the component exceeded its 2000 ms deadline")]
fn a_prepare_that_never_returns_is_stopped_at_the_deadline() {
    let harness = obol_harness::build_this_crate!();
    let _ = harness.prepare("spin", obol_sdk::serde_json::json!({}));
}

/// Record a vendor exchange once, then replay it with no vendor: the fixture keeps the
/// answer and nothing secret (issue 16).
#[test]
fn an_exchange_is_recorded_without_its_secrets_and_replayed_without_the_vendor() {
    use std::io::{Read, Write};
    const TOKEN: &str = "sk_test_CanaryNeverInAFixture";
    const CREDENTIAL: &str = "Bearer sk_test_CanaryNeverInAFixture";
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let vendor = std::thread::spawn(move || {
        let (mut stream, _) = listener.accept().unwrap();
        let mut request = vec![0u8; 8192];
        let n = stream.read(&mut request).unwrap();
        let request = String::from_utf8_lossy(&request[..n]).to_ascii_lowercase();
        // Its charset is not the body's: the fixture keeps the bytes a call would pass on.
        let body = format!(
            r#"{{"number": 7, "title": "recorded", "note": "café", "echo": "{CREDENTIAL}", "hint": "invalid {TOKEN}"}}"#
        );
        let answer = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json; charset=iso-8859-1\r\nset-cookie: session=s3cr3t\r\nx-api-key: k3y\r\nx-next-page: 3\r\nx-echo: {CREDENTIAL}\r\nx-hint: invalid {TOKEN}\r\nx-note: caf\u{e9}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        );
        stream.write_all(answer.as_bytes()).unwrap();
        request
    });
    let mut harness = obol_harness::build_this_crate!();
    harness.base_url = format!("http://127.0.0.1:{port}");
    let fixture = std::env::temp_dir().join(format!("obol-fixture-{}.json", std::process::id()));
    let recorded = harness.record(
        "relay",
        obol_sdk::serde_json::json!({}),
        Some(("authorization", CREDENTIAL)),
        &fixture,
    );
    let request = vendor.join().unwrap();
    assert!(request.starts_with("get /relay"), "{request}");
    assert!(
        request.contains("sk_test_canarynever"),
        "the credential was sent"
    );
    assert_eq!(recorded.status, 200);

    let text = std::fs::read_to_string(&fixture).unwrap();
    for secret in ["sk_test_CanaryNeverInAFixture", "s3cr3t", "k3y"] {
        assert!(!text.contains(secret), "{secret} in the fixture: {text}");
    }
    // No vendor now: the fixture answers.
    let output = harness.replay(&fixture).unwrap();
    let structured: obol_sdk::serde_json::Value =
        obol_sdk::serde_json::from_str(output.structured.as_deref().unwrap()).unwrap();
    assert_eq!(structured["title"], "recorded");
    assert_eq!(
        structured["note"], "caf\u{e9}",
        "the body's bytes, not transcoded"
    );

    // The recorded headers reach the component as a call's would: `peek` shows them.
    let mut as_peek: obol_sdk::serde_json::Value = obol_sdk::serde_json::from_str(&text).unwrap();
    as_peek["tool"] = "peek".into();
    std::fs::write(&fixture, as_peek.to_string()).unwrap();
    let output = harness.replay(&fixture);
    let _ = std::fs::remove_file(&fixture);
    let (headers, body) = peeked(output.unwrap());
    let written = as_peek["body"].as_str().unwrap();
    assert_eq!(body, written);
    assert_eq!(
        headers,
        [
            "content-type: application/json; charset=iso-8859-1".to_owned(),
            "x-next-page: 3".to_owned(),
            "x-echo: [redacted]".to_owned(),
            "x-hint: invalid [redacted]".to_owned(),
            format!("content-length: {}", written.len()),
        ],
        "no cookie, no header named for a key, no value that is not visible ASCII, no \
         hop-by-hop header; the credential redacted and the length the body's as written"
    );
}

/// `peek`'s text: the headers its `interpret` saw, one a line, then the body.
fn peeked(output: obol_harness::ToolOutput) -> (Vec<String>, String) {
    let Some(obol_harness::Content::Text(seen)) = output.content.into_iter().next() else {
        panic!("peek answers with text");
    };
    let (headers, body) = seen
        .split_once("\n\n")
        .expect("peek's text: its headers, a blank line, the body");
    (
        headers.lines().map(str::to_owned).collect(),
        body.to_owned(),
    )
}

/// A replay gives the component the headers the vendor sent, as a call would: a connector
/// that reads a cursor or a content type from them is tested on what it will get.
#[test]
fn a_replay_feeds_the_component_the_recorded_headers() {
    let harness = obol_harness::build_this_crate!();
    let fixture = std::env::temp_dir().join(format!("obol-headers-{}.json", std::process::id()));
    let recorded = obol_sdk::serde_json::json!({
        "tool": "peek",
        "status": 200,
        "headers": [
            ["Content-Type", "text/csv"],
            ["link", "<http://vendor.test/items?page=3>; rel=\"next\""],
            ["x-rate-limit-remaining", " 99\t"],
            ["Link", "<http://vendor.test/items?page=1>; rel=\"first\""],
            ["set-cookie", "session=s3cr3t"],
            ["connection", "keep-alive"],
            ["keep-alive", "timeout=5"],
            ["transfer-encoding", "chunked"],
            ["x-note", "caf\u{e9}"]
        ],
        "body": "id,total\n1,500\n"
    });
    std::fs::write(&fixture, recorded.to_string()).unwrap();
    let output = harness.replay(&fixture);
    let _ = std::fs::remove_file(&fixture);
    let (headers, body) = peeked(output.unwrap());
    assert_eq!(
        headers,
        [
            "content-type: text/csv",
            r#"link: <http://vendor.test/items?page=3>; rel="next""#,
            r#"link: <http://vendor.test/items?page=1>; rel="first""#,
            "x-rate-limit-remaining: 99",
        ],
        "as a call gets them: names in lower case, a name's values together, values trimmed, \
         no cookie, no hop-by-hop header, no value that is not visible ASCII"
    );
    assert_eq!(body, "id,total\n1,500\n");
}

/// Headers written by hand that no HTTP answer could carry fail the test that wrote them,
/// saying which.
#[test]
#[should_panic(expected = "\"x note\" is not an HTTP header name")]
fn a_header_name_no_answer_could_carry_fails_the_test() {
    let harness = obol_harness::build_this_crate!();
    let _ = harness.interpret_with_headers("peek", 200, &[("x note", "1")], b"");
}

#[test]
#[should_panic(expected = "the value of \"x-note\" holds a character no HTTP header value can")]
fn a_header_value_no_answer_could_carry_fails_the_test() {
    let harness = obol_harness::build_this_crate!();
    let _ = harness.interpret_with_headers("peek", 200, &[("x-note", "a\nb")], b"");
}

#[test]
#[should_panic(
    expected = "101 headers: the gateway's HTTP client refuses an answer with more than 100"
)]
fn more_headers_than_an_answer_may_carry_fail_the_test() {
    let harness = obol_harness::build_this_crate!();
    let names: Vec<String> = (0..101).map(|n| format!("x-h{n}")).collect();
    let headers: Vec<(&str, &str)> = names.iter().map(|name| (name.as_str(), "1")).collect();
    let _ = harness.interpret_with_headers("peek", 200, &headers, b"");
}
