//! Property tests of the parsers that read untrusted input: generated inputs by the thousand,
//! each property comparing the parser with an independent computation, or checking that
//! whatever comes in gets a typed answer and no panic.
//!
//! `PROPTEST_CASES` sets the cases per property (default 4,096 here, about 40,000 in the normal
//! run); a longer run: `PROPTEST_CASES=200000 cargo nextest run -p obol -E 'test(properties)'`.

use proptest::prelude::*;
use serde_json::{Map, Value};

use crate::approvals::ApprovalId;
use crate::idempotency::{IdempotencyKey, RequestHash};
use crate::mcp::SessionId;
use crate::policy::{ToolGlob, bearer_token};

pub fn config() -> ProptestConfig {
    ProptestConfig {
        cases: std::env::var("PROPTEST_CASES")
            .ok()
            .and_then(|cases| cases.parse().ok())
            .unwrap_or(4096),
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// JSON values a client could send, numbers included (finite doubles, the full i64 range).
pub fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        (-1e300f64..1e300).prop_map(Value::from),
        ".{0,12}".prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 64, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::btree_map(".{0,8}", inner, 0..6)
                .prop_map(|map| Value::Object(map.into_iter().collect::<Map<_, _>>())),
        ]
    })
}

/// An independent glob matcher: the textbook recursion, memoised.
fn glob_oracle(pattern: &[u8], text: &[u8]) -> bool {
    fn go(p: &[u8], t: &[u8], memo: &mut std::collections::HashMap<(usize, usize), bool>) -> bool {
        let key = (p.len(), t.len());
        if let Some(&known) = memo.get(&key) {
            return known;
        }
        let answer = match (p.first(), t.first()) {
            (None, None) => true,
            (None, Some(_)) => false,
            (Some(b'*'), _) => go(&p[1..], t, memo) || (!t.is_empty() && go(p, &t[1..], memo)),
            (Some(_), None) => false,
            (Some(b'?'), Some(_)) => go(&p[1..], &t[1..], memo),
            (Some(c), Some(d)) => c == d && go(&p[1..], &t[1..], memo),
        };
        memo.insert(key, answer);
        answer
    }
    go(pattern, text, &mut Default::default())
}

/// `value` as JSON text with every object's keys in reverse order (serde_json writes them
/// sorted): the same document to a reader that ignores key order.
fn reversed_keys(value: &Value) -> String {
    match value {
        Value::Object(map) => {
            let fields: Vec<String> = map
                .iter()
                .rev()
                .map(|(k, v)| format!("{}:{}", Value::String(k.clone()), reversed_keys(v)))
                .collect();
            format!("{{{}}}", fields.join(","))
        }
        Value::Array(items) => format!(
            "[{}]",
            items
                .iter()
                .map(reversed_keys)
                .collect::<Vec<_>>()
                .join(",")
        ),
        other => other.to_string(),
    }
}

proptest! {
    #![proptest_config(config())]

    /// The request hash does not depend on key order, and survives a serialize-parse trip.
    #[test]
    fn properties_request_hash_ignores_key_order(value in json_value()) {
        let arguments = Value::Object(match value {
            Value::Object(map) => map,
            other => [("v".to_owned(), other)].into_iter().collect(),
        });
        let reread: Value = serde_json::from_str(&reversed_keys(&arguments)).unwrap();
        prop_assert_eq!(RequestHash::of_arguments(&arguments), RequestHash::of_arguments(&reread));
        let round: Value = serde_json::from_str(&arguments.to_string()).unwrap();
        prop_assert_eq!(RequestHash::of_arguments(&arguments), RequestHash::of_arguments(&round));
    }

    /// Two arguments that differ hash apart (no collisions among generated pairs).
    #[test]
    fn properties_request_hash_tells_arguments_apart(a in json_value(), b in json_value()) {
        let wrap = |v: Value| Value::Object([("v".to_owned(), v)].into_iter().collect());
        let (a, b) = (wrap(a), wrap(b));
        prop_assert_eq!(a == b, RequestHash::of_arguments(&a) == RequestHash::of_arguments(&b));
    }

    /// The glob matcher agrees with the textbook recursion on every pattern and name.
    #[test]
    fn properties_globs_match_as_the_oracle(pattern in "[ab.*?]{1,10}", name in "[ab.]{0,12}") {
        let glob = ToolGlob::parse(&pattern).unwrap();
        prop_assert_eq!(glob.matches(&name), glob_oracle(pattern.as_bytes(), name.as_bytes()));
    }

    /// Header values of every shape: a typed answer, never a panic; what is accepted reads
    /// back as it was written.
    #[test]
    fn properties_header_parsers_take_anything(text in "\\PC{0,80}|[ -~]{0,80}") {
        if let Ok(key) = IdempotencyKey::parse(&text) {
            prop_assert_eq!(key.as_str(), text.as_str());
        }
        if let Some(id) = ApprovalId::parse(&text) {
            prop_assert_eq!(id.as_str(), text.as_str());
        }
        if let Some(id) = SessionId::parse(&text) {
            prop_assert_eq!(id.as_str(), text.as_str());
        }
        if let Some(token) = bearer_token(&text) {
            prop_assert!(text.ends_with(token) && !token.contains(' ') && !token.is_empty());
        }
        if crate::names::check("key", &text).is_ok() {
            prop_assert!(text.len() <= 64 && text.is_ascii());
        }
        let _ = crate::policy::Scope::parse(&text);
        // Approval tokens: genuine ones only; anything else a typed refusal.
        let ring = crate::approvals::Keyring::ephemeral();
        prop_assert!(ring.verify(&text, 0).is_err());
    }

    /// An Idempotency-Key is accepted exactly when it is `idt_` and 16 to 128 of
    /// `[A-Za-z0-9_-]`: the parser against the rule written out.
    #[test]
    fn properties_idempotency_keys_follow_their_rule(body in "[A-Za-z0-9_ .é-]{0,140}") {
        let key = format!("idt_{body}");
        let by_rule = (16..=128).contains(&body.len())
            && body.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
        prop_assert_eq!(IdempotencyKey::parse(&key).is_ok(), by_rule, "{}", key);
    }
}
