//! Open `subscriptions/listen` streams (MCP 2026-07-28), counted per key: a key holds at most
//! as many as it may hold sessions, and one more is refused with `session_limit`, the answer a
//! session-era client gets at its cap. A stream's [`Slot`] gives its place back when the
//! stream ends, however it ends.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::policy::KeyHash;

/// Streams one key may hold open.
pub const PER_KEY_LIMIT: usize = 256;

#[derive(Debug, Default)]
pub struct Listens {
    open: Arc<Mutex<HashMap<KeyHash, usize>>>,
}

/// One open stream's place; dropped with the stream.
#[derive(Debug)]
pub struct Slot {
    key: KeyHash,
    open: Arc<Mutex<HashMap<KeyHash, usize>>>,
}

impl Listens {
    /// A place for one more stream of `key`, unless it holds [`PER_KEY_LIMIT`] already.
    pub fn take(&self, key: KeyHash) -> Option<Slot> {
        let mut open = self.open.lock().expect("listens lock");
        let count = open.entry(key).or_default();
        if *count >= PER_KEY_LIMIT {
            return None;
        }
        *count += 1;
        Some(Slot {
            key,
            open: Arc::clone(&self.open),
        })
    }

    /// How many streams `key` holds open.
    pub fn held(&self, key: &KeyHash) -> usize {
        self.open
            .lock()
            .expect("listens lock")
            .get(key)
            .copied()
            .unwrap_or(0)
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut open = self.open.lock().expect("listens lock");
        if let Some(count) = open.get_mut(&self.key) {
            *count -= 1;
            if *count == 0 {
                open.remove(&self.key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_holds_at_most_the_limit_and_a_closed_stream_gives_its_place_back() {
        let listens = Listens::default();
        let key = KeyHash::of_token("k");
        let mut slots: Vec<Slot> = (0..PER_KEY_LIMIT)
            .map(|_| listens.take(key).unwrap())
            .collect();
        assert!(listens.take(key).is_none());
        // Another key is not affected.
        assert!(listens.take(KeyHash::of_token("other")).is_some());
        drop(slots.pop());
        assert_eq!(listens.held(&key), PER_KEY_LIMIT - 1);
        assert!(listens.take(key).is_some());
    }
}
