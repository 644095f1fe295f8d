//! MCP sessions: unguessable ids bound to the key that opened them.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::policy::KeyHash;

/// An `Mcp-Session-Id`: `mcs_` followed by 32 random bytes in hex. Session ids are bearer
/// credentials, so `Debug` and `Display` show only the last four characters.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct SessionId(Arc<str>);

impl SessionId {
    fn mint() -> SessionId {
        let mut bytes = [0u8; 32];
        getrandom::fill(&mut bytes).expect("the OS random source is available");
        SessionId(format!("mcs_{}", hex::encode(bytes)).into())
    }

    /// Parses a presented id. Anything that is not exactly our shape is simply unknown.
    pub fn parse(text: &str) -> Option<SessionId> {
        let hex_part = text.strip_prefix("mcs_")?;
        (hex_part.len() == 64 && hex_part.bytes().all(|b| b.is_ascii_hexdigit()))
            .then(|| SessionId(text.into()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The only form of a session id that may reach a log line.
    pub fn redacted(&self) -> String {
        format!("…{}", &self.0[self.0.len() - 4..])
    }
}

impl fmt::Debug for SessionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SessionId({})", self.redacted())
    }
}

/// What a session remembers.
#[derive(Debug, Clone)]
pub struct Session {
    pub key: KeyHash,
    pub protocol_version: &'static str,
    last_used: Instant,
}

/// Sessions unused this long are forgotten.
const IDLE_LIMIT: Duration = Duration::from_secs(24 * 3600);
/// A key holds at most this many sessions; opening another forgets its least recently used,
/// so no key can grow the table without bound.
const PER_KEY_LIMIT: usize = 256;

/// Live sessions. Lookups check the owning key, so a session id presented with another
/// key (another workspace's, in particular) is indistinguishable from one that never existed.
#[derive(Debug, Default)]
pub struct Sessions {
    live: Mutex<HashMap<SessionId, Session>>,
}

impl Sessions {
    pub fn open(&self, key: KeyHash, protocol_version: &'static str) -> SessionId {
        let id = SessionId::mint();
        let now = Instant::now();
        let session = Session {
            key,
            protocol_version,
            last_used: now,
        };
        let mut live = self.live.lock().expect("sessions lock");
        live.retain(|_, s| now.duration_since(s.last_used) < IDLE_LIMIT);
        let mut owned: Vec<(SessionId, Instant)> = live
            .iter()
            .filter(|(_, s)| s.key == key)
            .map(|(id, s)| (id.clone(), s.last_used))
            .collect();
        if owned.len() >= PER_KEY_LIMIT {
            owned.sort_by_key(|(_, used)| *used);
            for (old, _) in owned.iter().take(owned.len() + 1 - PER_KEY_LIMIT) {
                live.remove(old);
            }
        }
        live.insert(id.clone(), session);
        id
    }

    pub fn get(&self, id: &SessionId, key: KeyHash) -> Option<Session> {
        let mut live = self.live.lock().expect("sessions lock");
        let session = live.get_mut(id).filter(|s| s.key == key)?;
        if session.last_used.elapsed() >= IDLE_LIMIT {
            live.remove(id);
            return None;
        }
        session.last_used = Instant::now();
        Some(session.clone())
    }

    /// Ends a session; `false` when there was no such session for this key.
    pub fn close(&self, id: &SessionId, key: KeyHash) -> bool {
        let mut live = self.live.lock().expect("sessions lock");
        match live.get(id) {
            Some(session) if session.key == key => live.remove(id).is_some(),
            _ => false,
        }
    }

    pub fn len(&self) -> usize {
        self.live.lock().expect("sessions lock").len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sessions_answer_only_to_their_key() {
        let sessions = Sessions::default();
        let owner = KeyHash::of_token("a");
        let other = KeyHash::of_token("b");
        let id = sessions.open(owner, "2025-11-25");
        assert!(sessions.get(&id, owner).is_some());
        assert!(sessions.get(&id, other).is_none());
        assert!(!sessions.close(&id, other));
        assert!(sessions.close(&id, owner));
        assert!(sessions.get(&id, owner).is_none());
    }

    #[test]
    fn a_key_cannot_grow_the_table_without_bound() {
        let sessions = Sessions::default();
        let key = KeyHash::of_token("a");
        let first = sessions.open(key, "2025-11-25");
        for _ in 0..PER_KEY_LIMIT {
            sessions.open(key, "2025-11-25");
        }
        assert_eq!(sessions.len(), PER_KEY_LIMIT);
        assert!(
            sessions.get(&first, key).is_none(),
            "the least recently used is forgotten"
        );
    }

    #[test]
    fn ids_are_unguessable_and_redacted() {
        let a = SessionId::mint();
        let b = SessionId::mint();
        assert_ne!(a, b);
        assert!(SessionId::parse(a.as_str()).is_some());
        assert!(SessionId::parse("mcs_123").is_none());
        let shown = format!("{a:?}");
        assert!(!shown.contains(&a.as_str()[4..60]), "{shown}");
        assert!(shown.contains(&a.as_str()[64..]), "{shown}");
    }
}
