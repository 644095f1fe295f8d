//! Idempotency keys and canonical request hashes.
//!
//! An [`IdempotencyKey`] is `idt_` followed by 16 to 128 characters of `[A-Za-z0-9_-]`
//! (`docs/idempotency.md`). A client may supply one in the `Idempotency-Key` header; otherwise
//! the gateway mints one. A [`RequestHash`] is the sha256 of the arguments in canonical JSON
//! (RFC 8785), so key order and whitespace never make two identical calls look different.
//! Arguments holding a number no double carries exactly are refused ([`exact_numbers`]), so
//! two calls whose numbers differ never hash alike.

mod canonical;
mod numbers;

use std::fmt;

use sha2::{Digest, Sha256};

pub use canonical::canonical_json;
pub use numbers::{InexactNumber, exact_numbers, exact_numbers_at};

const PREFIX: &str = "idt_";
const MIN_BODY: usize = 16;
const MAX_BODY: usize = 128;

/// A valid idempotency key; holding one proves it is well-formed.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct IdempotencyKey(String);

/// Why a presented key was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    #[error("an idempotency key starts with \"idt_\"")]
    MissingPrefix,
    #[error("an idempotency key has 16 to 128 characters after \"idt_\"")]
    Length,
    #[error("an idempotency key uses only A-Z, a-z, 0-9, '_' and '-' after \"idt_\"")]
    Charset,
}

impl IdempotencyKey {
    pub fn parse(text: &str) -> Result<IdempotencyKey, KeyError> {
        let body = text.strip_prefix(PREFIX).ok_or(KeyError::MissingPrefix)?;
        if !(MIN_BODY..=MAX_BODY).contains(&body.len()) {
            return Err(KeyError::Length);
        }
        if !body
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
        {
            return Err(KeyError::Charset);
        }
        Ok(IdempotencyKey(text.to_owned()))
    }

    /// A fresh key: the time in milliseconds and 192 random bits, so that minted keys sort
    /// by when they were made.
    pub fn mint() -> IdempotencyKey {
        IdempotencyKey(crate::clock::time_ordered_id::<24>(PREFIX))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "IdempotencyKey({})", self.0)
    }
}

/// sha256 of the canonical JSON of a call's arguments.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct RequestHash([u8; 32]);

impl RequestHash {
    pub fn of_arguments(arguments: &serde_json::Value) -> RequestHash {
        RequestHash(Sha256::digest(canonical_json(arguments).as_bytes()).into())
    }
}

impl fmt::Display for RequestHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        crate::digest::write_sha256(&self.0, f)
    }
}

impl fmt::Debug for RequestHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RequestHash({self})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn keys_have_one_documented_shape() {
        assert!(IdempotencyKey::parse("idt_0123456789abcdef").is_ok());
        assert!(IdempotencyKey::parse(&format!("idt_{}", "a".repeat(128))).is_ok());
        assert_eq!(
            IdempotencyKey::parse("0123456789abcdef0"),
            Err(KeyError::MissingPrefix)
        );
        assert_eq!(IdempotencyKey::parse("idt_short"), Err(KeyError::Length));
        assert_eq!(
            IdempotencyKey::parse(&format!("idt_{}", "a".repeat(129))),
            Err(KeyError::Length)
        );
        assert_eq!(
            IdempotencyKey::parse("idt_0123456789abcdef "),
            Err(KeyError::Charset)
        );
        assert_eq!(
            IdempotencyKey::parse("idt_0123456789abcdé"),
            Err(KeyError::Charset)
        );
        let minted = IdempotencyKey::mint();
        assert_eq!(IdempotencyKey::parse(minted.as_str()), Ok(minted.clone()));
        assert_ne!(minted, IdempotencyKey::mint());
    }

    fn hash(text: &str) -> RequestHash {
        RequestHash::of_arguments(&serde_json::from_str(text).unwrap())
    }

    #[test]
    fn two_to_the_53_plus_one_is_refused_not_hashed_like_two_to_the_53() {
        assert_eq!(exact_numbers(r#"{"amount": 9007199254740992}"#), Ok(()));
        for near in [
            r#"{"amount": 9007199254740993}"#,
            r#"{"amount": 9007199254740993.0}"#,
            r#"{"amount": 9.007199254740993e15}"#,
        ] {
            let error = exact_numbers(near).unwrap_err();
            assert_eq!(error.pointer(), "/amount", "{near}");
            assert!(!error.to_string().contains("900719925474099"));
        }
        // What the refusal prevents: as a fraction or exponent the neighbour has already been
        // rounded by the parser and would replay the other call's result.
        assert_eq!(
            hash(r#"{"amount": 9007199254740993.0}"#),
            hash(r#"{"amount": 9007199254740992}"#)
        );
        assert_eq!(
            hash(r#"{"amount": 1.00000000000000000001}"#),
            hash(r#"{"amount": 1}"#)
        );
        assert!(exact_numbers(r#"{"amount": 1.00000000000000000001}"#).is_err());
        // Held as an integer it is still hashed exactly, never like its rounded neighbour.
        assert_ne!(
            hash(r#"{"amount": 9007199254740993}"#),
            hash(r#"{"amount": 9007199254740992}"#)
        );
    }

    #[test]
    fn near_equal_accepted_numbers_conflict_rather_than_collide() {
        for (a, b) in [
            ("0.1", "0.2"),
            ("0.1", "0.10000000000000002"),
            ("1", "1.0000000000000002"),
            ("9007199254740992", "9007199254740994"),
            ("9007199254740991", "9007199254740992"),
            ("-9007199254740992", "-9007199254740991"),
            ("5e-324", "1e-323"),
            ("0", "5e-324"),
            ("1e21", "1.0000000000000001e21"),
            ("1.7976931348623157e308", "1.7976931348623155e308"),
            ("333333333.3333333", "333333333.3333334"),
        ] {
            let (a, b) = (format!(r#"{{"n": {a}}}"#), format!(r#"{{"n": {b}}}"#));
            assert_eq!(exact_numbers(&a), Ok(()), "{a}");
            assert_eq!(exact_numbers(&b), Ok(()), "{b}");
            assert_ne!(hash(&a), hash(&b), "{a} vs {b}");
        }
    }

    #[test]
    fn one_value_hashes_alike_however_it_is_written() {
        for spellings in [
            &["100", "1e2", "1E+2", "1E2", "10e1", "100.0", "1000e-1"][..],
            &["0", "-0", "0.0", "-0.0", "0e5", "-0E-5"],
            &["4.5", "4.50", "45e-1", "0.45e1"],
            &["0.002", "2e-3", "2E-3", "0.0020"],
            &["1e21", "1E21", "1000000000000000000000", "1e+21"],
            // serde_json holds the first as a u64 and the others as doubles.
            &[
                "9223372036854776000",
                "9.223372036854776e18",
                "9223372036854776000.0",
            ],
            &["18446744073709552000", "1.8446744073709552e19"],
        ] {
            let first = format!(r#"{{"n": {}}}"#, spellings[0]);
            for spelling in spellings {
                let text = format!(r#"{{"n": {spelling}}}"#);
                assert_eq!(exact_numbers(&text), Ok(()), "{text}");
                assert_eq!(hash(&text), hash(&first), "{text}");
            }
        }
    }

    /// For every accepted number, the canonical text denotes exactly the value the client
    /// wrote: the hash is exact. That needs serde_json to parse to the nearest double (its
    /// `float_roundtrip` feature; its default fast path is often one ulp off).
    #[test]
    fn canonical_text_keeps_the_value_of_every_accepted_number() {
        let value_of = |literal: &str| numbers::Decimal::of_literal(literal).unwrap();
        let mut literals: Vec<String> = [
            "5.357830195732913e-76",
            "9.643915712060552e-234",
            "0.1",
            "123456789012345678",
            "9007199254740994",
            "1e23",
            "-0.0000033333333333333333",
        ]
        .map(String::from)
        .to_vec();
        let mut state: u64 = 0x2545_F491_4F6C_DD1D;
        for _ in 0..20_000 {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let f = f64::from_bits(state);
            if f.is_finite() {
                literals.push(format!("{f:e}"));
                literals.push(format!("{f}"));
            }
            literals.push((state >> (state % 64)).to_string());
        }
        for literal in &literals {
            let parsed: serde_json::Value = serde_json::from_str(literal).unwrap();
            let nearest: f64 = literal.parse().unwrap();
            assert_eq!(
                parsed.as_f64().unwrap().to_bits(),
                nearest.to_bits(),
                "serde_json parses {literal} to its nearest double"
            );
            if numbers::is_exact(literal) {
                let canonical = canonical_json(&parsed);
                assert_eq!(value_of(&canonical), value_of(literal), "{literal}");
                if nearest != 0.0 {
                    assert_eq!(canonical.starts_with('-'), literal.starts_with('-'));
                }
            }
        }
    }

    #[test]
    fn key_order_and_whitespace_do_not_change_the_hash() {
        let a: serde_json::Value =
            serde_json::from_str(r#"{"b": [1, {"y":2,"x":1}], "a": "s"}"#).unwrap();
        let b: serde_json::Value =
            serde_json::from_str(r#"{ "a":"s","b":[1,{"x":1,"y":2}] }"#).unwrap();
        assert_eq!(RequestHash::of_arguments(&a), RequestHash::of_arguments(&b));
        let c = json!({"a": "s", "b": [1, {"x": 1, "y": 3}]});
        assert_ne!(RequestHash::of_arguments(&a), RequestHash::of_arguments(&c));
    }
}
