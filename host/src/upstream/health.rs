//! Whether each upstream is up, decided in one place from what listings, calls and the
//! background probe saw. The catalog leaves a down upstream's tools out (or fails the
//! listing, by the workspace's `upstream_failure`), so every flip is a catalog change.

use std::collections::HashMap;
use std::sync::Mutex;

use super::UpstreamId;

/// Consecutive unreachable calls that take an upstream down. One failed listing does: the
/// gateway cannot show tools it cannot read.
pub const CALL_FAILURES_TO_DOWN: u32 = 3;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Up { failures: u32 },
    Down,
}

/// A transition, for the caller to act on (rebuild the catalog, tell sessions).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flip {
    WentDown,
    CameUp,
    Unchanged,
}

#[derive(Debug, Default)]
pub struct Health {
    states: Mutex<HashMap<UpstreamId, State>>,
}

impl Health {
    /// A listing could not be read.
    pub fn listing_failed(&self, id: &UpstreamId) -> Flip {
        self.set(id, |_| State::Down)
    }

    /// A call could not reach the upstream (nothing was sent).
    pub fn call_unreachable(&self, id: &UpstreamId) -> Flip {
        self.set(id, |state| match state {
            State::Up { failures } if failures + 1 < CALL_FAILURES_TO_DOWN => State::Up {
                failures: failures + 1,
            },
            _ => State::Down,
        })
    }

    /// The upstream answered something (a listing, a result, even an error).
    pub fn answered(&self, id: &UpstreamId) -> Flip {
        self.set(id, |_| State::Up { failures: 0 })
    }

    pub fn is_down(&self, id: &UpstreamId) -> bool {
        self.states.lock().expect("health lock").get(id) == Some(&State::Down)
    }

    /// Every upstream currently down, for the probe.
    pub fn down(&self) -> Vec<UpstreamId> {
        self.states
            .lock()
            .expect("health lock")
            .iter()
            .filter(|(_, state)| **state == State::Down)
            .map(|(id, _)| id.clone())
            .collect()
    }

    fn set(&self, id: &UpstreamId, next: impl FnOnce(State) -> State) -> Flip {
        let mut states = self.states.lock().expect("health lock");
        let before = states.get(id).copied().unwrap_or(State::Up { failures: 0 });
        let after = next(before);
        states.insert(id.clone(), after);
        match (before, after) {
            (State::Up { .. }, State::Down) => Flip::WentDown,
            (State::Down, State::Up { .. }) => Flip::CameUp,
            _ => Flip::Unchanged,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_take_an_upstream_down_only_after_consecutive_failures() {
        let health = Health::default();
        let id = UpstreamId {
            workspace: "w".into(),
            connection: "c".into(),
        };
        for _ in 1..CALL_FAILURES_TO_DOWN {
            assert_eq!(health.call_unreachable(&id), Flip::Unchanged);
        }
        assert_eq!(health.answered(&id), Flip::Unchanged);
        for _ in 1..CALL_FAILURES_TO_DOWN {
            health.call_unreachable(&id);
        }
        assert_eq!(health.call_unreachable(&id), Flip::WentDown);
        assert!(health.is_down(&id));
        assert_eq!(health.down(), vec![id.clone()]);
        assert_eq!(health.listing_failed(&id), Flip::Unchanged);
        assert_eq!(health.answered(&id), Flip::CameUp);
        assert_eq!(health.listing_failed(&id), Flip::WentDown);
    }
}
