//! Component trust: which components an operator lets load.
//!
//! With `[connectors.trust]`, every component but the bundled ones must be pinned by its
//! sha256 or carry a detached signature, by a publisher key the operator lists, over its
//! bytes. Signatures are minisign's (Ed25519 over the BLAKE2b-512 prehash of the file, with a
//! signed "trusted comment"): made and checked offline, by `obol connectors sign|verify` or by
//! the `minisign` tool itself, in `FILE.wasm.minisig` beside the component. Without the table,
//! every component loads, and a signature is only reported.

use std::collections::HashSet;
use std::io::Cursor;

use serde::Serialize;

/// What the operator trusts. `None` in the config: everything loads.
#[derive(Debug, Clone)]
pub struct Trust {
    publishers: Vec<Publisher>,
    /// `sha256:<hex>` of components allowed whoever signed them.
    pinned: HashSet<String>,
}

/// A publisher key the operator trusts, under the name the operator gave it.
#[derive(Clone)]
pub struct Publisher {
    pub name: String,
    key: minisign::PublicKey,
}

impl std::fmt::Debug for Publisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Publisher")
            .field("name", &self.name)
            .field("key_id", &key_id(self.key.keynum()))
            .finish()
    }
}

impl Publisher {
    /// A publisher from its minisign public key: the base64 line (`RW…`) or the whole `.pub`
    /// file's text.
    pub fn parse(name: &str, key: &str) -> Result<Publisher, String> {
        let line = key
            .lines()
            .map(str::trim)
            .rfind(|line| !line.is_empty() && !line.starts_with("untrusted comment:"))
            .unwrap_or_default();
        let key = minisign::PublicKey::from_base64(line)
            .map_err(|e| format!("publisher {name:?}: not a minisign public key ({e})"))?;
        Ok(Publisher {
            name: name.to_owned(),
            key,
        })
    }

    pub fn key_id(&self) -> String {
        key_id(self.key.keynum())
    }
}

/// How a loaded component came to be trusted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "trust", rename_all = "snake_case")]
pub enum Provenance {
    /// Compiled into the gateway.
    Bundled,
    /// Its sha256 is pinned in the config.
    Pinned,
    /// Signed by a trusted publisher.
    Signed { publisher: String, key_id: String },
    /// Loaded without a trust policy (no `[connectors.trust]`).
    Unchecked,
}

impl Provenance {
    pub fn signer(&self) -> Option<&str> {
        match self {
            Provenance::Signed { publisher, .. } => Some(publisher),
            _ => None,
        }
    }
}

/// Why a component was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TrustError {
    #[error(
        "not signed (no .minisig beside it) and its sha256 is not pinned in [connectors.trust]"
    )]
    Unsigned,
    #[error("its signature is not a minisign signature: {0}")]
    Unreadable(String),
    #[error("signed by key id {0}, which no publisher in [connectors.trust] has")]
    UnknownKey(String),
    #[error(
        "its signature by {0} does not match its bytes: the component was changed after it was signed"
    )]
    Tampered(String),
}

impl Trust {
    pub fn new(publishers: Vec<Publisher>, pinned: HashSet<String>) -> Trust {
        Trust { publishers, pinned }
    }

    /// Decides whether a component of `bytes` (sha256 `digest`), with its detached
    /// `signature` text if it has one, may load.
    pub fn admit(
        &self,
        bytes: &[u8],
        digest: &str,
        signature: Option<&str>,
    ) -> Result<Provenance, TrustError> {
        let signed = signature.map(|text| self.signed_by(bytes, text));
        if let Some(Ok(Some(provenance))) = signed {
            return Ok(provenance);
        }
        // A pin names these exact bytes: whatever is beside them, they are what was trusted.
        if self.pinned.contains(&format!("sha256:{digest}")) {
            return Ok(Provenance::Pinned);
        }
        match (signed, signature) {
            (Some(Err(error)), _) => Err(error),
            (Some(Ok(_)), Some(text)) => Err(TrustError::UnknownKey(signature_key_id(text)?)),
            _ => Err(TrustError::Unsigned),
        }
    }

    /// The publisher whose key made `signature` over `bytes`; `None` when no publisher's key
    /// id matches it.
    fn signed_by(&self, bytes: &[u8], signature: &str) -> Result<Option<Provenance>, TrustError> {
        let signature = parse_signature(signature)?;
        let Some(publisher) = self
            .publishers
            .iter()
            .find(|p| p.key.keynum() == signature.keynum())
        else {
            return Ok(None);
        };
        minisign::verify(
            &publisher.key,
            &signature,
            Cursor::new(bytes),
            true,
            false,
            false,
        )
        .map_err(|_| TrustError::Tampered(publisher.name.clone()))?;
        Ok(Some(Provenance::Signed {
            publisher: publisher.name.clone(),
            key_id: publisher.key_id(),
        }))
    }
}

fn parse_signature(text: &str) -> Result<minisign::SignatureBox, TrustError> {
    minisign::SignatureBox::from_string(text).map_err(|e| TrustError::Unreadable(e.to_string()))
}

/// The key id a signature names, as minisign prints it.
pub fn signature_key_id(text: &str) -> Result<String, TrustError> {
    Ok(key_id(parse_signature(text)?.keynum()))
}

/// The trusted (signed) comment of a signature.
pub fn trusted_comment(text: &str) -> Result<String, TrustError> {
    parse_signature(text)?
        .trusted_comment()
        .map_err(|e| TrustError::Unreadable(e.to_string()))
}

/// A key id as minisign prints it: the 8-byte key number, little-endian, in hex.
fn key_id(keynum: &[u8]) -> String {
    let mut bytes = [0u8; 8];
    let n = keynum.len().min(8);
    bytes[..n].copy_from_slice(&keynum[..n]);
    format!("{:016X}", u64::from_le_bytes(bytes))
}

/// A new unencrypted key pair: (the secret key file's text, the public key's base64 line).
pub fn keygen() -> Result<(String, String), String> {
    let minisign::KeyPair { pk, sk } =
        minisign::KeyPair::generate_unencrypted_keypair().map_err(|e| e.to_string())?;
    let secret = sk
        .to_box(Some("obol connector publisher secret key"))
        .map_err(|e| e.to_string())?
        .to_string();
    Ok((secret, pk.to_base64()))
}

/// Signs `bytes` with the secret key file's text; returns the `.minisig` text. The trusted
/// comment names the component's sha256 and file name.
pub fn sign(secret_key: &str, bytes: &[u8], file_name: &str) -> Result<String, String> {
    let secret = minisign::SecretKeyBox::from_string(secret_key)
        .and_then(|sk| sk.into_unencrypted_secret_key())
        .map_err(|e| format!("not an unencrypted minisign secret key: {e}"))?;
    let public = minisign::PublicKey::from_secret_key(&secret).map_err(|e| e.to_string())?;
    let digest = {
        use sha2::Digest;
        hex::encode(sha2::Sha256::digest(bytes))
    };
    let comment = format!("obol component sha256:{digest} file:{file_name}");
    let signature = minisign::sign(
        Some(&public),
        &secret,
        Cursor::new(bytes),
        Some(&comment),
        None,
    )
    .map_err(|e| e.to_string())?;
    Ok(signature.into_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn publisher(name: &str) -> (Publisher, String) {
        let (secret, public) = keygen().unwrap();
        (Publisher::parse(name, &public).unwrap(), secret)
    }

    #[test]
    fn only_a_trusted_key_over_these_bytes_admits_a_component() {
        let (acme, acme_secret) = publisher("acme");
        let (_, stranger_secret) = publisher("stranger");
        let trust = Trust::new(vec![acme.clone()], HashSet::new());
        let bytes = b"\0asm component bytes";
        let signed = sign(&acme_secret, bytes, "c.wasm").unwrap();
        assert_eq!(
            trust.admit(bytes, "d", Some(&signed)),
            Ok(Provenance::Signed {
                publisher: "acme".into(),
                key_id: acme.key_id()
            })
        );
        assert_eq!(trust.admit(bytes, "d", None), Err(TrustError::Unsigned));
        let tampered = b"\0asm component bytez";
        assert_eq!(
            trust.admit(tampered, "d", Some(&signed)),
            Err(TrustError::Tampered("acme".into()))
        );
        let foreign = sign(&stranger_secret, bytes, "c.wasm").unwrap();
        assert!(matches!(
            trust.admit(bytes, "d", Some(&foreign)),
            Err(TrustError::UnknownKey(_))
        ));
        assert!(matches!(
            trust.admit(bytes, "d", Some("not a signature")),
            Err(TrustError::Unreadable(_))
        ));
        // A pin admits the digest it names, signed or not.
        let pinned = Trust::new(vec![], HashSet::from(["sha256:d".to_owned()]));
        assert_eq!(pinned.admit(bytes, "d", None), Ok(Provenance::Pinned));
        assert_eq!(pinned.admit(bytes, "e", None), Err(TrustError::Unsigned));
        assert!(trusted_comment(&signed).unwrap().contains("file:c.wasm"));
    }

    #[test]
    fn a_public_key_reads_from_its_line_or_its_file() {
        let (_, public) = keygen().unwrap();
        let file = format!("untrusted comment: minisign public key\n{public}\n");
        let from_line = Publisher::parse("a", &public).unwrap();
        let from_file = Publisher::parse("a", &file).unwrap();
        assert_eq!(from_line.key_id(), from_file.key_id());
        assert!(Publisher::parse("a", "RWnotakey").is_err());
    }
}
