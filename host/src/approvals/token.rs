//! Approval tokens: the owner's decision on one ticket, signed by the gateway with ed25519.
//!
//! Wire form: `oat1.<key id>.<payload>.<signature>`, both base64url without padding; the
//! signature covers `oat1.<key id>.<payload>`. The key id picks the verifying key, so a
//! rotation is: add the new key as the signer, keep the old one as a verifier while tokens
//! signed under it may still be in flight (at most [`super::TICKET_TTL`]), then retire it.
//! Verifiers need only public keys.

use std::collections::HashMap;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ed25519_dalek::{Signature, Signer, SigningKey, VerifyingKey};
use serde::{Deserialize, Serialize};

use super::{ApprovalId, Decision, Ticket};
use crate::idempotency::IdempotencyKey;

const PREFIX: &str = "oat1";

/// A key id: 1 to 32 characters of `[A-Za-z0-9_-]`.
fn valid_key_id(id: &str) -> bool {
    (1..=32).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// The signed payload. Short field names: it travels in a header. It names no key: a
/// token can be seen in transit (a proxy's log), and a key's hash is enough to test guesses of
/// a hand-chosen token offline. The key is checked against the ticket, on the server.
/// (Tokens of earlier releases carry `kh`; it is ignored.)
#[derive(Debug, Serialize, Deserialize)]
struct Payload {
    aid: String,
    ws: String,
    tool: String,
    idk: String,
    rh: String,
    dst: String,
    dec: Decision,
    exp: u64,
}

/// A verified token: the owner's decision on exactly this call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApprovalGrant {
    pub approval_id: ApprovalId,
    pub workspace: String,
    pub tool: String,
    pub idempotency_key: IdempotencyKey,
    pub request_hash: String,
    pub destination: String,
    pub decision: Decision,
    pub expires_at_ms: u64,
}

/// Why a token was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    #[error("the approval token is malformed")]
    Malformed,
    #[error("the approval token is signed with a key this gateway does not accept")]
    UnknownKey,
    #[error("the approval token's signature does not verify")]
    BadSignature,
    #[error("the approval has expired")]
    Expired,
}

/// The signing key and every key that still verifies.
pub struct Keyring {
    signer_id: String,
    signer: SigningKey,
    verifiers: HashMap<String, VerifyingKey>,
}

impl std::fmt::Debug for Keyring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Keyring")
            .field("signer_id", &self.signer_id)
            .field("verifiers", &self.verifiers.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

impl Keyring {
    /// `signer` signs new tokens; `verifiers` (public keys by id) also verify, alongside the
    /// signer's own public key.
    pub fn new(
        signer_id: &str,
        signer: SigningKey,
        verifiers: impl IntoIterator<Item = (String, VerifyingKey)>,
    ) -> Result<Keyring, String> {
        if !valid_key_id(signer_id) {
            return Err(format!(
                "approval key id {signer_id:?} must be 1 to 32 characters of A-Z a-z 0-9 _ -"
            ));
        }
        let mut all = HashMap::new();
        for (id, key) in verifiers {
            if !valid_key_id(&id) {
                return Err(format!(
                    "approval key id {id:?} must be 1 to 32 characters of A-Z a-z 0-9 _ -"
                ));
            }
            all.insert(id, key);
        }
        if all.contains_key(signer_id) {
            return Err(format!(
                "approval key id {signer_id:?} is both the signer and a verifier"
            ));
        }
        all.insert(signer_id.to_owned(), signer.verifying_key());
        Ok(Keyring {
            signer_id: signer_id.to_owned(),
            signer,
            verifiers: all,
        })
    }

    /// A keyring with a fresh key that lives as long as the process (the zero-config default:
    /// tokens do not survive a restart, and are re-issued by the approvals endpoint).
    pub fn ephemeral() -> Keyring {
        Keyring::new("ephemeral", generate_signing_key(), []).expect("a literal key id")
    }

    pub fn signer_id(&self) -> &str {
        &self.signer_id
    }

    /// Signs the owner's decision on `ticket`. Valid until the ticket expires.
    pub fn sign(&self, ticket: &Ticket, decision: Decision) -> String {
        let payload = Payload {
            aid: ticket.id.to_string(),
            ws: ticket.workspace.clone(),
            tool: ticket.tool.clone(),
            idk: ticket.idempotency_key.clone(),
            rh: ticket.request_hash.clone(),
            dst: ticket.destination.clone(),
            dec: decision,
            exp: ticket.expires_at_ms,
        };
        self.seal(PREFIX, &payload)
    }

    /// `<prefix>.<key id>.<payload>.<signature>`: the prefix separates uses (approval tokens,
    /// owner sessions), so one kind can never be presented as the other.
    pub fn seal(&self, prefix: &str, payload: &impl Serialize) -> String {
        let body = URL_SAFE_NO_PAD.encode(serde_json::to_vec(payload).expect("plain data"));
        let signed = format!("{prefix}.{}.{body}", self.signer_id);
        let signature = self.signer.sign(signed.as_bytes());
        format!("{signed}.{}", URL_SAFE_NO_PAD.encode(signature.to_bytes()))
    }

    /// The payload of a sealed value, if its prefix is `prefix` and its signature verifies
    /// under an accepted key.
    pub fn open<T: serde::de::DeserializeOwned>(
        &self,
        prefix: &str,
        sealed: &str,
    ) -> Result<T, TokenError> {
        let (signed, signature) = sealed.rsplit_once('.').ok_or(TokenError::Malformed)?;
        let mut parts = signed.splitn(3, '.');
        let (Some(kind), Some(key_id), Some(body)) = (parts.next(), parts.next(), parts.next())
        else {
            return Err(TokenError::Malformed);
        };
        if kind != prefix {
            return Err(TokenError::Malformed);
        }
        let key = self.verifiers.get(key_id).ok_or(TokenError::UnknownKey)?;
        let signature: [u8; 64] = URL_SAFE_NO_PAD
            .decode(signature)
            .ok()
            .and_then(|bytes| bytes.try_into().ok())
            .ok_or(TokenError::Malformed)?;
        key.verify_strict(signed.as_bytes(), &Signature::from_bytes(&signature))
            .map_err(|_| TokenError::BadSignature)?;
        URL_SAFE_NO_PAD
            .decode(body)
            .ok()
            .and_then(|bytes| serde_json::from_slice(&bytes).ok())
            .ok_or(TokenError::Malformed)
    }

    /// Checks the signature first, then expiry: an expired token is reported as expired only
    /// when it is genuine.
    pub fn verify(&self, token: &str, now_ms: u64) -> Result<ApprovalGrant, TokenError> {
        let payload: Payload = self.open(PREFIX, token)?;
        if now_ms >= payload.exp {
            return Err(TokenError::Expired);
        }
        Ok(ApprovalGrant {
            approval_id: ApprovalId::parse(&payload.aid).ok_or(TokenError::Malformed)?,
            workspace: payload.ws,
            tool: payload.tool,
            idempotency_key: IdempotencyKey::parse(&payload.idk)
                .map_err(|_| TokenError::Malformed)?,
            request_hash: payload.rh,
            destination: payload.dst,
            decision: payload.dec,
            expires_at_ms: payload.exp,
        })
    }
}

/// A new signing key from the OS random source.
pub fn generate_signing_key() -> SigningKey {
    let mut seed = [0u8; 32];
    getrandom::fill(&mut seed).expect("the OS random source is available");
    SigningKey::from_bytes(&seed)
}

/// Parses a signing key file: 64 hex digits (the 32-byte seed), surrounding whitespace ignored.
pub fn parse_signing_key(text: &str) -> Result<SigningKey, String> {
    let mut seed = [0u8; 32];
    hex::decode_to_slice(text.trim(), &mut seed)
        .map_err(|_| "an approval signing key file holds 64 hex digits".to_owned())?;
    Ok(SigningKey::from_bytes(&seed))
}

/// Parses a public key: 64 hex digits.
pub fn parse_verifying_key(text: &str) -> Result<VerifyingKey, String> {
    let mut bytes = [0u8; 32];
    hex::decode_to_slice(text.trim(), &mut bytes)
        .map_err(|_| "an approval public key is 64 hex digits".to_owned())?;
    VerifyingKey::from_bytes(&bytes).map_err(|_| "not an ed25519 public key".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::approvals::TicketStatus;

    fn ticket(expires_at_ms: u64) -> Ticket {
        Ticket {
            capability: None,
            id: ApprovalId::mint(),
            workspace: "acme".into(),
            key_name: "agent".into(),
            key_hash: "sha256:00".into(),
            tool: "stripe.create_refund".into(),
            connection: "stripe-live".into(),
            idempotency_key: "idt_0123456789abcdef".into(),
            request_hash: "rh".into(),
            destination: "dst".into(),
            summary: vec![],
            policy_publication: None,
            policies: vec![],
            created_at_ms: 0,
            expires_at_ms,
            status: TicketStatus::Pending,
        }
    }

    /// A token seen in transit must not hand out the key's hash (enough to test guesses of a
    /// hand-chosen token offline).
    #[test]
    fn a_token_names_no_key() {
        let ring = Keyring::ephemeral();
        let mut t = ticket(2_000);
        t.key_hash = format!("sha256:{}", "ab".repeat(32));
        let token = ring.sign(&t, Decision::Approved);
        let body = token.split('.').nth(2).unwrap();
        let payload = String::from_utf8(URL_SAFE_NO_PAD.decode(body).unwrap()).unwrap();
        assert!(!payload.contains("abab"), "{payload}");
        assert!(!payload.contains("\"kh\""), "{payload}");
    }

    #[test]
    fn a_token_verifies_and_carries_the_held_call() {
        let ring = Keyring::ephemeral();
        let t = ticket(2_000);
        let grant = ring
            .verify(&ring.sign(&t, Decision::Approved), 1_000)
            .unwrap();
        assert_eq!(grant.approval_id, t.id);
        assert_eq!(grant.idempotency_key.as_str(), t.idempotency_key);
        assert_eq!(grant.decision, Decision::Approved);
        assert_eq!(
            ring.verify(&ring.sign(&t, Decision::Approved), 2_000),
            Err(TokenError::Expired)
        );
    }

    #[test]
    fn tampering_and_foreign_keys_are_refused() {
        let ring = Keyring::ephemeral();
        let token = ring.sign(&ticket(u64::MAX), Decision::Denied);
        // Flip the decision inside the payload, keep the signature.
        let (head, signature) = token.rsplit_once('.').unwrap();
        let (prefix, body) = head.rsplit_once('.').unwrap();
        let mut payload: serde_json::Value =
            serde_json::from_slice(&URL_SAFE_NO_PAD.decode(body).unwrap()).unwrap();
        payload["dec"] = "approved".into();
        let forged = format!(
            "{prefix}.{}.{signature}",
            URL_SAFE_NO_PAD.encode(payload.to_string())
        );
        assert_eq!(ring.verify(&forged, 0), Err(TokenError::BadSignature));
        // Same key id, another key.
        let impostor = Keyring::ephemeral();
        assert_eq!(
            impostor.verify(&token, 0),
            Err(TokenError::BadSignature),
            "a key id is a name, not a credential"
        );
        assert_eq!(ring.verify("oat1.nope", 0), Err(TokenError::Malformed));
        assert_eq!(ring.verify("garbage", 0), Err(TokenError::Malformed));
    }

    #[test]
    fn rotation_keeps_the_previous_key_until_it_is_retired() {
        let old_key = generate_signing_key();
        let old = Keyring::new("k1", old_key.clone(), []).unwrap();
        let token = old.sign(&ticket(u64::MAX), Decision::Approved);
        let overlap = Keyring::new(
            "k2",
            generate_signing_key(),
            [("k1".to_owned(), old_key.verifying_key())],
        )
        .unwrap();
        assert!(overlap.verify(&token, 0).is_ok());
        let retired = Keyring::new("k2", generate_signing_key(), []).unwrap();
        assert_eq!(retired.verify(&token, 0), Err(TokenError::UnknownKey));
    }
}
