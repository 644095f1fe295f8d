//! Idempotency keys and canonical request hashes.
//!
//! An [`IdempotencyKey`] is `idt_` followed by 16 to 128 characters of `[A-Za-z0-9_-]`
//! (`docs/idempotency.md`). A client may supply one in the `Idempotency-Key` header; otherwise
//! the gateway mints one. A [`RequestHash`] is the sha256 of the arguments in canonical JSON
//! (RFC 8785), so key order and whitespace never make two identical calls look different.

mod canonical;

use std::fmt;

use sha2::{Digest, Sha256};

pub use canonical::canonical_json;

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

    /// A fresh key with 192 random bits.
    pub fn mint() -> IdempotencyKey {
        let mut bytes = [0u8; 24];
        getrandom::fill(&mut bytes).expect("the OS random source is available");
        IdempotencyKey(format!("{PREFIX}{}", hex::encode(bytes)))
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
        write!(f, "sha256:{}", hex::encode(self.0))
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
