//! Virtual keys: bearer tokens known only by their hash.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use sha2::{Digest, Sha256};

use super::{PolicyPin, ToolFilter, ToolGlob};

/// A deployment environment. A gateway serves one; a key and a tool belong to one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Environment {
    Dev,
    Staging,
    Prod,
}

impl Environment {
    pub fn parse(name: &str) -> Result<Environment, String> {
        match name {
            "dev" => Ok(Environment::Dev),
            "staging" => Ok(Environment::Staging),
            "prod" => Ok(Environment::Prod),
            other => Err(format!(
                "unknown environment {other:?} (expected dev, staging or prod)"
            )),
        }
    }

    pub fn as_str(&self) -> &'static str {
        match self {
            Environment::Dev => "dev",
            Environment::Staging => "staging",
            Environment::Prod => "prod",
        }
    }
}

/// What a key may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Scope {
    /// The `/mcp` endpoint.
    Mcp,
    /// Reading the workspace's receipts.
    Receipts,
    /// Fetching approval tokens.
    Approvals,
    /// The route API.
    Route,
}

impl Scope {
    pub fn parse(name: &str) -> Result<Scope, String> {
        match name {
            "mcp" => Ok(Scope::Mcp),
            "receipts" => Ok(Scope::Receipts),
            "approvals" => Ok(Scope::Approvals),
            "route" => Ok(Scope::Route),
            other => Err(format!(
                "unknown scope {other:?} (expected mcp, receipts, approvals or route)"
            )),
        }
    }

    pub fn as_str(&self) -> &'static str {
        match self {
            Scope::Mcp => "mcp",
            Scope::Receipts => "receipts",
            Scope::Approvals => "approvals",
            Scope::Route => "route",
        }
    }
}

/// The sha256 of a key's token. The token itself is never stored or logged.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct KeyHash([u8; 32]);

/// The token of an `Authorization: Bearer <token>` value. The scheme is case-insensitive
/// (RFC 9110 §11.1); one space, then a token without spaces.
pub fn bearer_token(authorization: &str) -> Option<&str> {
    let (scheme, token) = authorization.split_once(' ')?;
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty() && !token.contains(' '))
        .then_some(token)
}

impl KeyHash {
    pub fn of_token(token: &str) -> KeyHash {
        KeyHash(Sha256::digest(token.as_bytes()).into())
    }

    /// Parses the config form `sha256:<64 hex digits>`.
    pub fn parse(text: &str) -> Result<KeyHash, String> {
        let hex_digits = text
            .strip_prefix("sha256:")
            .ok_or("a key hash starts with \"sha256:\" (see `obol keys hash`)")?;
        let mut bytes = [0u8; 32];
        hex::decode_to_slice(hex_digits, &mut bytes)
            .map_err(|_| "a key hash is \"sha256:\" and 64 hex digits".to_string())?;
        Ok(KeyHash(bytes))
    }
}

impl fmt::Display for KeyHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        crate::digest::write_sha256(&self.0, f)
    }
}

impl fmt::Debug for KeyHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Short enough to correlate in logs, too short to be a lookup handle.
        write!(f, "KeyHash({}…)", &hex::encode(self.0)[..8])
    }
}

/// An authenticated caller. `config` parses these from `[[keys]]` and from the admin API's
/// key specs (`KeySpec::parse`).
#[derive(Debug, Clone)]
pub struct VirtualKey {
    pub name: String,
    pub hash: KeyHash,
    pub workspace: String,
    pub environment: Environment,
    pub allowed_tools: Vec<ToolGlob>,
    pub scopes: Vec<Scope>,
    pub filter: Option<ToolFilter>,
    /// The policy publication the key evaluates under.
    pub policy: PolicyPin,
    pub tools_mode: ToolsMode,
    /// Capability → connection id: the provider its new calls go to first, when eligible.
    pub capability_pins: std::collections::BTreeMap<String, String>,
}

/// What a key's `tools/list` shows (spec/mcp-gateway.md, "Progressive tools").
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum ToolsMode {
    /// Every tool the key may call.
    #[default]
    Full,
    /// Only `search_tools` and `call_tool`; the tools are found by searching. What the key
    /// may call is the same as in full mode.
    Progressive,
}

impl ToolsMode {
    pub fn parse(name: &str) -> Result<ToolsMode, String> {
        match name {
            "full" => Ok(ToolsMode::Full),
            "progressive" => Ok(ToolsMode::Progressive),
            other => Err(format!(
                "unknown tools_mode {other:?} (expected \"full\" or \"progressive\")"
            )),
        }
    }
}

impl VirtualKey {
    pub fn has_scope(&self, scope: Scope) -> bool {
        self.scopes.contains(&scope)
    }
}

/// Every configured key, looked up by the hash of a presented token.
#[derive(Debug, Default)]
pub struct KeyTable {
    by_hash: HashMap<KeyHash, Arc<VirtualKey>>,
}

impl KeyTable {
    /// A table of `keys`; of two keys with one hash, the later wins.
    pub fn new(keys: impl IntoIterator<Item = VirtualKey>) -> KeyTable {
        let by_hash = keys
            .into_iter()
            .map(|key| (key.hash, Arc::new(key)))
            .collect();
        KeyTable { by_hash }
    }

    pub fn all(&self) -> impl Iterator<Item = &Arc<VirtualKey>> {
        self.by_hash.values()
    }

    /// Whether a key with this hash is live in the table.
    pub fn knows(&self, hash: &KeyHash) -> bool {
        self.by_hash.contains_key(hash)
    }

    pub fn authenticate(&self, token: &str) -> Option<Arc<VirtualKey>> {
        self.by_hash.get(&KeyHash::of_token(token)).cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bearer_scheme_ignores_case() {
        for value in ["Bearer abc", "bearer abc", "BEARER abc", "bEaReR abc"] {
            assert_eq!(bearer_token(value), Some("abc"), "{value}");
        }
        for value in [
            "Bearer",
            "Bearer ",
            "Bearer a b",
            "Basic abc",
            "Bearerabc",
            "Bearer  abc",
        ] {
            assert_eq!(bearer_token(value), None, "{value}");
        }
    }

    #[test]
    fn hash_round_trips_through_its_config_form() {
        let hash = KeyHash::of_token("obk_example");
        assert_eq!(KeyHash::parse(&hash.to_string()).unwrap(), hash);
        assert!(KeyHash::parse("md5:abc").is_err());
        assert!(KeyHash::parse("sha256:zz").is_err());
        assert!(!format!("{hash:?}").contains(&hash.to_string()[7..]));
    }
}
