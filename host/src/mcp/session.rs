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
/// A key holds at most this many sessions, so no key can grow the table without bound.
const PER_KEY_LIMIT: usize = 256;
/// At the limit, a session unused this long gives its place to a new one (and answers 404 if
/// it comes back); when none has been idle that long, the new session is refused.
const EVICTABLE_AFTER: Duration = Duration::from_secs(10 * 60);

/// A key holds [`PER_KEY_LIMIT`] sessions, all used within [`EVICTABLE_AFTER`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionLimit;

/// Live sessions. Lookups check the owning key, so a session id presented with another
/// key (another workspace's, in particular) is indistinguishable from one that never existed.
#[derive(Debug, Default)]
pub struct Sessions {
    live: Mutex<HashMap<SessionId, Session>>,
}

impl Sessions {
    pub fn open(
        &self,
        key: KeyHash,
        protocol_version: &'static str,
    ) -> Result<SessionId, SessionLimit> {
        let id = SessionId::mint();
        let now = Instant::now();
        let session = Session {
            key,
            protocol_version,
            last_used: now,
        };
        let mut live = self.live.lock().expect("sessions lock");
        live.retain(|_, s| now.duration_since(s.last_used) < IDLE_LIMIT);
        let owned: Vec<(SessionId, Instant)> = live
            .iter()
            .filter(|(_, s)| s.key == key)
            .map(|(id, s)| (id.clone(), s.last_used))
            .collect();
        if owned.len() >= PER_KEY_LIMIT {
            // Never a busy session: only one idle past the threshold gives way.
            let (oldest, used) = owned
                .iter()
                .min_by_key(|(_, used)| *used)
                .expect("at the limit, the key has sessions");
            if now.duration_since(*used) < EVICTABLE_AFTER {
                return Err(SessionLimit);
            }
            tracing::debug!(session = %oldest.redacted(), "an idle session gives way to a new one");
            live.remove(oldest);
        }
        live.insert(id.clone(), session);
        Ok(id)
    }

    /// Makes a session look unused for `by` (tests of idleness).
    #[cfg(test)]
    fn age(&self, id: &SessionId, by: Duration) {
        let mut live = self.live.lock().expect("sessions lock");
        if let Some(session) = live.get_mut(id) {
            session.last_used -= by;
        }
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

    /// Ends every session whose key `ended` says is gone; returns their ids.
    pub fn close_where(&self, ended: impl Fn(&KeyHash) -> bool) -> Vec<SessionId> {
        let mut live = self.live.lock().expect("sessions lock");
        let closed: Vec<SessionId> = live
            .iter()
            .filter(|(_, session)| ended(&session.key))
            .map(|(id, _)| id.clone())
            .collect();
        for id in &closed {
            live.remove(id);
        }
        closed
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
        let id = sessions.open(owner, "2025-11-25").unwrap();
        assert!(sessions.get(&id, owner).is_some());
        assert!(sessions.get(&id, other).is_none());
        assert!(!sessions.close(&id, other));
        assert!(sessions.close(&id, owner));
        assert!(sessions.get(&id, owner).is_none());
    }

    #[test]
    fn a_key_cannot_grow_the_table_and_never_loses_a_busy_session() {
        let sessions = Sessions::default();
        let key = KeyHash::of_token("a");
        let first = sessions.open(key, "2025-11-25").unwrap();
        for _ in 1..PER_KEY_LIMIT {
            sessions.open(key, "2025-11-25").unwrap();
        }
        // Every session in use: the next is refused, none is lost.
        assert_eq!(sessions.open(key, "2025-11-25"), Err(SessionLimit));
        assert_eq!(sessions.len(), PER_KEY_LIMIT);
        assert!(sessions.get(&first, key).is_some());
        // Another key is not affected.
        assert!(sessions.open(KeyHash::of_token("b"), "2025-11-25").is_ok());
        // One idle past the threshold gives way, and is unknown from then on.
        sessions.age(&first, EVICTABLE_AFTER);
        assert!(sessions.open(key, "2025-11-25").is_ok());
        assert!(sessions.get(&first, key).is_none());
        assert_eq!(sessions.open(key, "2025-11-25"), Err(SessionLimit));
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
