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
