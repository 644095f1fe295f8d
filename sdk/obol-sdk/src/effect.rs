//! What a tool does, in the terms the host enforces: statuses, propagation, route, destructive.
//!
//! The host classifies every vendor response from these declarations alone (never from the
//! component's opinion), so they are typed values rather than strings: a status class is a
//! [`Status`], propagation is a [`Propagation`].

use std::fmt;

/// An inclusive range of HTTP status codes; a single code is a range of one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Status {
    first: u16,
    last: u16,
}

impl Status {
    /// Every 2xx status.
    pub const SUCCESS: Status = Status::range(200, 299);
    /// Every 4xx status.
    pub const CLIENT_ERROR: Status = Status::range(400, 499);
    /// Every 5xx status.
    pub const SERVER_ERROR: Status = Status::range(500, 599);

    /// Exactly one status code, e.g. `Status::code(409)`.
    pub const fn code(code: u16) -> Status {
        Status {
            first: code,
            last: code,
        }
    }

    /// The inclusive range `first..=last`, e.g. `Status::range(200, 299)`.
    ///
    /// # Panics
    /// When `first > last`; in a `const` this is a compile error.
    pub const fn range(first: u16, last: u16) -> Status {
        assert!(first <= last, "a status range must not be empty");
        Status { first, last }
    }

    pub const fn first(self) -> u16 {
        self.first
    }

    pub const fn last(self) -> u16 {
        self.last
    }

    pub const fn contains(self, code: u16) -> bool {
        self.first <= code && code <= self.last
    }

    /// This range with `codes` cut out, as the fewest ranges that remain:
    /// `Status::CLIENT_ERROR.except(&[408, 429])` is 400-407, 409-428, 430-499.
    pub fn except(self, codes: &[u16]) -> Vec<Status> {
        let mut cut: Vec<u16> = codes
            .iter()
            .copied()
            .filter(|&code| self.contains(code))
            .collect();
        cut.sort_unstable();
        cut.dedup();
        let mut remaining = Vec::with_capacity(cut.len() + 1);
        // Counting in u32 keeps `code + 1` from wrapping when u16::MAX itself is cut.
        let mut next = u32::from(self.first);
        for code in cut.into_iter().map(u32::from) {
            if code > next {
                remaining.push(Status::range(next as u16, (code - 1) as u16));
            }
            next = code + 1;
        }
        if next <= u32::from(self.last) {
            remaining.push(Status::range(next as u16, self.last));
        }
        remaining
    }

    const fn overlaps(self, other: Status) -> bool {
        self.first <= other.last && other.first <= self.last
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.first == self.last {
            write!(f, "{}", self.first)
        } else {
            write!(f, "{}-{}", self.first, self.last)
        }
    }
}

/// Whether and how the host's idempotency key reaches the vendor.
///
/// Names are `&'static str` because they are fixed by the vendor's API, not by a call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Propagation {
    /// The key is not sent: a read, or a route where the host does not build the request.
    None,
    /// An honest "the vendor cannot deduplicate": a write the vendor may repeat.
    /// Policy may deny such tools for production writes.
    Unsupported,
    /// The host sets this request header (e.g. `Idempotency-Key`) to the key.
    Header(&'static str),
    /// The host sets this field of the JSON body, an RFC 6901 pointer such as
    /// `/idempotency_key`, to the key.
    BodyField(&'static str),
}

/// The catalog brokers the host has a profile for. The host, not the component, turns the
/// broker's retries off on every call and reads its record of the call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Broker {
    Nango,
    Composio,
}

/// Where the call runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    /// The gateway sends the request itself and observes the outcome.
    Native,
    /// A catalog broker runs the call; the gateway does not observe it. Its propagation must
    /// be [`Propagation::None`] (the broker builds the vendor request).
    Federated(Broker),
}

/// An outcome class, as a [`BodyRule`] assigns it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    Accepted,
    DefinitelyRejected,
    Retryable,
    Unknown,
}

/// Reclassifies an answer whose status is accepted by a field of its JSON body, e.g. a broker
/// that answers 200 with `"successful": false`. The first matching rule decides; the host
/// applies it, the component is never asked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BodyRule {
    /// An RFC 6901 pointer, e.g. `/successful`.
    pub pointer: &'static str,
    /// The JSON value (as text) the field must hold exactly, e.g. `false`.
    pub equals: &'static str,
    pub outcome: Outcome,
}

/// What a tool does, as far as the host must know to act on its behalf.
///
/// Start from [`EffectSpec::read`] or [`EffectSpec::write`] and adjust. Every status left out
/// of the three classes is *unknown* to the host, and unknown never becomes success, so it is
/// safe to leave an ambiguous status out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EffectSpec {
    pub route: Route,
    /// The call changes or deletes something that cannot simply be undone.
    pub destructive: bool,
    /// Statuses that mean the vendor accepted the request.
    pub accepted: Vec<Status>,
    /// Statuses that prove the vendor did not and will not act on the request.
    pub definitely_rejected: Vec<Status>,
    /// Statuses after which the vendor invites a retry.
    pub retryable: Vec<Status>,
    pub propagation: Propagation,
    /// Checked in order on answers whose status is accepted.
    pub body_rules: Vec<BodyRule>,
}

/// 4xx statuses that do *not* prove the vendor left the request alone: a timeout (408) or a
/// conflict (409, e.g. "the same idempotency key is in flight") may follow an effect, 425 asks
/// for a replay, and 429 is retryable rather than final.
const AMBIGUOUS_CLIENT_ERRORS: [u16; 4] = [408, 409, 425, 429];

/// Statuses that explicitly invite a retry: rate limited and temporarily unavailable.
const INVITES_RETRY: [Status; 2] = [Status::code(429), Status::code(503)];

impl EffectSpec {
    /// A native read: not destructive; accepted 2xx; definitely rejected 4xx except
    /// 408/409/425/429; retryable 429 and 503; propagation [`Propagation::None`].
    pub fn read() -> EffectSpec {
        EffectSpec {
            route: Route::Native,
            destructive: false,
            accepted: vec![Status::SUCCESS],
            definitely_rejected: Status::CLIENT_ERROR.except(&AMBIGUOUS_CLIENT_ERRORS),
            retryable: INVITES_RETRY.to_vec(),
            propagation: Propagation::None,
            body_rules: Vec::new(),
        }
    }

    /// A native, non-destructive write with the same status classes as [`EffectSpec::read`]
    /// and propagation [`Propagation::Unsupported`]: the honest default until you declare how
    /// the vendor deduplicates ([`EffectSpec::propagation`]). Other 5xx stay unknown, because a
    /// write that failed with 500 may still have happened. Add [`EffectSpec::destructive`]
    /// when the effect cannot simply be undone.
    pub fn write() -> EffectSpec {
        EffectSpec {
            propagation: Propagation::Unsupported,
            ..EffectSpec::read()
        }
    }

    /// Marks the effect as one that cannot simply be undone (refunds, deletions, ...).
    pub fn destructive(mut self) -> EffectSpec {
        self.destructive = true;
        self
    }

    pub fn route(mut self, route: Route) -> EffectSpec {
        self.route = route;
        self
    }

    /// Replaces the accepted statuses.
    pub fn accepted(mut self, statuses: impl IntoIterator<Item = Status>) -> EffectSpec {
        self.accepted = statuses.into_iter().collect();
        self
    }

    /// Replaces the definitely-rejected statuses.
    pub fn definitely_rejected(mut self, statuses: impl IntoIterator<Item = Status>) -> EffectSpec {
        self.definitely_rejected = statuses.into_iter().collect();
        self
    }

    /// Replaces the retryable statuses.
    pub fn retryable(mut self, statuses: impl IntoIterator<Item = Status>) -> EffectSpec {
        self.retryable = statuses.into_iter().collect();
        self
    }

    pub fn propagation(mut self, propagation: Propagation) -> EffectSpec {
        self.propagation = propagation;
        self
    }

    /// Adds a rule that reclassifies an accepted answer when `pointer` holds `equals` (JSON).
    pub fn body_rule(
        mut self,
        pointer: &'static str,
        equals: &'static str,
        outcome: Outcome,
    ) -> EffectSpec {
        self.body_rules.push(BodyRule {
            pointer,
            equals,
            outcome,
        });
        self
    }

    /// Problems the host would refuse at load: statuses outside 100-599, classes that share a
    /// status (a status must mean exactly one thing), a federated route that propagates the
    /// key, and body rules whose pointer or value does not parse.
    pub fn problems(&self) -> Vec<String> {
        let classes = [
            ("accepted", &self.accepted),
            ("definitely_rejected", &self.definitely_rejected),
            ("retryable", &self.retryable),
        ];
        let mut problems = Vec::new();
        for (class, statuses) in classes {
            for status in statuses.iter().filter(|s| s.first < 100 || s.last > 599) {
                problems.push(format!("{class} status {status} is outside 100-599"));
            }
        }
        for (index, (class, statuses)) in classes.iter().enumerate() {
            for (other_class, other_statuses) in &classes[index + 1..] {
                for status in statuses.iter() {
                    for other in other_statuses.iter().filter(|o| status.overlaps(**o)) {
                        problems.push(format!("{class} {status} overlaps {other_class} {other}"));
                    }
                }
            }
        }
        if matches!(self.route, Route::Federated(_)) && self.propagation != Propagation::None {
            problems.push(
                "a federated route's propagation must be None: the broker builds the vendor request"
                    .into(),
            );
        }
        for (index, rule) in self.body_rules.iter().enumerate() {
            if !(rule.pointer.is_empty() || rule.pointer.starts_with('/')) {
                problems.push(format!("body rule {index}: the pointer must start with /"));
            }
            if serde_json::from_str::<serde_json::Value>(rule.equals).is_err() {
                problems.push(format!("body rule {index}: equals is not JSON"));
            }
        }
        problems
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn covers(statuses: &[Status], code: u16) -> bool {
        statuses.iter().any(|s| s.contains(code))
    }

    #[test]
    fn except_splits_a_range_into_the_fewest_pieces() {
        assert_eq!(
            Status::CLIENT_ERROR.except(&[429, 408, 409, 425, 408, 302]),
            vec![
                Status::range(400, 407),
                Status::range(410, 424),
                Status::range(426, 428),
                Status::range(430, 499),
            ]
        );
        assert_eq!(
            Status::range(400, 402).except(&[400, 402]),
            vec![Status::code(401)]
        );
        assert_eq!(Status::code(409).except(&[409]), vec![]);
        assert_eq!(Status::range(0, 1).except(&[0]), vec![Status::code(1)]);
        assert_eq!(
            Status::range(65534, u16::MAX).except(&[u16::MAX]),
            vec![Status::code(65534)]
        );
    }

    #[test]
    fn read_classifies_like_the_documented_default() {
        let read = EffectSpec::read();
        assert!(!read.destructive);
        assert_eq!(read.route, Route::Native);
        assert_eq!(read.propagation, Propagation::None);
        assert!(covers(&read.accepted, 204));
        for ambiguous in [408, 409, 425, 429] {
            assert!(!covers(&read.definitely_rejected, ambiguous), "{ambiguous}");
        }
        assert!(covers(&read.definitely_rejected, 404));
        assert!(covers(&read.retryable, 429) && covers(&read.retryable, 503));
        assert!(!covers(&read.retryable, 500));
        assert!(read.problems().is_empty(), "{:?}", read.problems());
    }

    #[test]
    fn write_differs_from_read_only_in_propagation() {
        let write = EffectSpec::write();
        assert_eq!(write.propagation, Propagation::Unsupported);
        assert_eq!(
            EffectSpec {
                propagation: Propagation::None,
                ..write.clone()
            },
            EffectSpec::read()
        );
        assert!(write.destructive().destructive);
    }

    #[test]
    fn overlapping_classes_are_reported() {
        let spec = EffectSpec::write()
            .definitely_rejected([Status::range(250, 260), Status::code(600)])
            .retryable([Status::code(429)]);
        let problems = spec.problems();
        assert_eq!(problems.len(), 2, "{problems:?}");
        assert!(problems[0].contains("600"));
        assert!(problems[1].contains("accepted 200-299 overlaps definitely_rejected 250-260"));
    }
}
