//! The circuit breaker the router reads: per connection, fed by the outcome of every attempt.
//! It extends what `upstream::health` does for listings (an upstream that cannot be listed is
//! down) to calls of every kind: consecutive transport failures or retryable statuses open the
//! breaker for a cooldown; after it, one call is let through as a probe, and its outcome
//! closes the breaker or opens it again.
//!
//! The breaker only ever steers *new* calls of a capability: a same-key retry or a resume
//! uses its slot's recorded route whatever the breaker says (ADR-0047).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

/// When a breaker opens, and for how long.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BreakerPolicy {
    /// Consecutive failed attempts that open it.
    pub failures: u32,
    pub cooldown: Duration,
}

impl Default for BreakerPolicy {
    fn default() -> BreakerPolicy {
        BreakerPolicy {
            failures: 3,
            cooldown: Duration::from_secs(30),
        }
    }
}

/// What one attempt told about its connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    /// It answered with a final status (accepted or rejected: the vendor is there).
    Answered,
    /// It could not be reached, did not answer, or answered with a retryable status.
    Failed,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Closed {
        failures: u32,
    },
    Open {
        until_ms: u64,
    },
    /// One probe was let through at `since_ms`; others wait for its outcome (or for another
    /// cooldown, should the probe never report).
    Probing {
        since_ms: u64,
    },
}

/// What the router may do with a connection now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    Closed,
    /// The cooldown is over: this call may be the probe.
    Probe,
    Open {
        until_ms: u64,
    },
}

/// A connection, by workspace.
pub type ConnectionKey = (String, String);

#[derive(Debug, Default)]
pub struct Breakers {
    policy: BreakerPolicy,
    states: Mutex<HashMap<ConnectionKey, State>>,
}

impl Breakers {
    pub fn new(policy: BreakerPolicy) -> Breakers {
        Breakers {
            policy,
            states: Mutex::default(),
        }
    }

    /// Whether `connection` may take a new call now (read-only: the router asks this of
    /// every provider it considers, and [`Breakers::take_probe`] of the one it picks).
    pub fn admission(&self, connection: &ConnectionKey, now_ms: u64) -> Admission {
        let cooldown = self.policy.cooldown.as_millis() as u64;
        match self.states.lock().expect("breakers").get(connection) {
            None | Some(State::Closed { .. }) => Admission::Closed,
            Some(State::Open { until_ms }) if now_ms < *until_ms => Admission::Open {
                until_ms: *until_ms,
            },
            Some(State::Probing { since_ms }) if now_ms < since_ms + cooldown => Admission::Open {
                until_ms: since_ms + cooldown,
            },
            Some(_) => Admission::Probe,
        }
    }

    /// The router picked a connection whose breaker admits a probe: no other call is let
    /// through until the probe's outcome is known. `false` if another call took the probe
    /// first.
    pub fn take_probe(&self, connection: &ConnectionKey, now_ms: u64) -> bool {
        let cooldown = self.policy.cooldown.as_millis() as u64;
        let mut states = self.states.lock().expect("breakers");
        let state = states
            .entry(connection.clone())
            .or_insert(State::Closed { failures: 0 });
        let free = match *state {
            State::Closed { .. } => return true,
            State::Open { until_ms } => now_ms >= until_ms,
            State::Probing { since_ms } => now_ms >= since_ms + cooldown,
        };
        if free {
            *state = State::Probing { since_ms: now_ms };
        }
        free
    }

    /// Records an attempt's outcome.
    pub fn record(&self, connection: &ConnectionKey, signal: Signal, now_ms: u64) {
        let mut states = self.states.lock().expect("breakers");
        if signal == Signal::Answered && !states.contains_key(connection) {
            // The common case, a healthy connection, stays out of the map.
            return;
        }
        let state = states
            .entry(connection.clone())
            .or_insert(State::Closed { failures: 0 });
        let open = State::Open {
            until_ms: now_ms + self.policy.cooldown.as_millis() as u64,
        };
        *state = match (signal, *state) {
            (Signal::Answered, _) => State::Closed { failures: 0 },
            (Signal::Failed, State::Closed { failures }) if failures + 1 < self.policy.failures => {
                State::Closed {
                    failures: failures + 1,
                }
            }
            // A failed probe, or one failure too many: open (again) for a full cooldown.
            (Signal::Failed, State::Closed { .. } | State::Probing { .. }) => open,
            // Calls routed before it opened may still report: they do not extend it.
            (Signal::Failed, State::Open { until_ms }) => State::Open { until_ms },
        };
        if *state == (State::Closed { failures: 0 }) {
            states.remove(connection);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> ConnectionKey {
        ("w".into(), "c".into())
    }

    #[test]
    fn consecutive_failures_open_it_for_a_cooldown_and_one_probe_closes_it() {
        let breakers = Breakers::new(BreakerPolicy {
            failures: 2,
            cooldown: Duration::from_millis(1000),
        });
        let c = key();
        breakers.record(&c, Signal::Failed, 0);
        breakers.record(&c, Signal::Answered, 1);
        breakers.record(&c, Signal::Failed, 2);
        assert_eq!(
            breakers.admission(&c, 3),
            Admission::Closed,
            "not consecutive"
        );
        breakers.record(&c, Signal::Failed, 10);
        assert_eq!(
            breakers.admission(&c, 11),
            Admission::Open { until_ms: 1010 }
        );
        // A late report from before it opened does not extend it.
        breakers.record(&c, Signal::Failed, 500);
        assert_eq!(
            breakers.admission(&c, 1009),
            Admission::Open { until_ms: 1010 }
        );
        assert_eq!(breakers.admission(&c, 1010), Admission::Probe);
        assert!(breakers.take_probe(&c, 1010));
        // One probe at a time.
        assert!(!breakers.take_probe(&c, 1011));
        assert_eq!(
            breakers.admission(&c, 1011),
            Admission::Open { until_ms: 2010 }
        );
        breakers.record(&c, Signal::Answered, 1020);
        assert_eq!(breakers.admission(&c, 1021), Admission::Closed);
    }

    #[test]
    fn a_failed_probe_opens_it_again_and_a_lost_probe_frees_after_a_cooldown() {
        let breakers = Breakers::new(BreakerPolicy {
            failures: 1,
            cooldown: Duration::from_millis(100),
        });
        let c = key();
        breakers.record(&c, Signal::Failed, 0);
        assert!(breakers.take_probe(&c, 100));
        breakers.record(&c, Signal::Failed, 150);
        assert_eq!(
            breakers.admission(&c, 151),
            Admission::Open { until_ms: 250 }
        );
        assert!(breakers.take_probe(&c, 250));
        // The probe never reports: after another cooldown, another probe.
        assert_eq!(
            breakers.admission(&c, 349),
            Admission::Open { until_ms: 350 }
        );
        assert!(breakers.take_probe(&c, 350));
    }
}
