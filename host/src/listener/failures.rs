//! Failed authentication, limited per source address and per endpoint.
//!
//! Every source address has a token bucket per endpoint family (`/mcp`, the REST routes, the
//! inbox, the admin API): a refused credential (a `401` answer to a request that presented
//! one) takes a token; an empty bucket answers `429` with `Retry-After`, credentials right or
//! wrong, until a token has come back. Buckets refill at [`REFILL`]: ten guesses, then one
//! every six seconds, so guessing a key costs time, and another address (a well-behaved
//! client) is never affected. Failures are logged once a minute per endpoint with their count,
//! never a line each.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{Request, State};
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::Response;

use crate::error::ObolError;

/// Failures a source may make at once before it must wait.
const BURST: f64 = 10.0;
/// How often a source gets a failure back.
const REFILL: Duration = Duration::from_secs(6);
/// Buckets kept at most; beyond, full (harmless) buckets are dropped first.
const MAX_SOURCES: usize = 10_000;
const LOG_WINDOW: Duration = Duration::from_secs(60);

/// The peer of a request's connection, put on every request by the listener.
#[derive(Debug, Clone, Copy)]
pub struct Peer(pub SocketAddr);

/// The endpoint families a source is limited on separately.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Endpoint {
    Mcp,
    Inbox,
    Admin,
    Rest,
}

impl Endpoint {
    fn of(path: &str) -> Endpoint {
        if path == "/mcp" {
            Endpoint::Mcp
        } else if path.starts_with("/inbox") || path.starts_with("/console") {
            // The pages a person signs in to share one budget.
            Endpoint::Inbox
        } else if path.starts_with("/v1/admin") || path == "/metrics" {
            Endpoint::Admin
        } else {
            Endpoint::Rest
        }
    }

    fn as_str(self) -> &'static str {
        match self {
            Endpoint::Mcp => "/mcp",
            Endpoint::Inbox => "the inbox and console",
            Endpoint::Admin => "the admin API",
            Endpoint::Rest => "the REST routes",
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

impl Bucket {
    fn full(now: Instant) -> Bucket {
        Bucket {
            tokens: BURST,
            at: now,
        }
    }

    fn refilled(self, now: Instant) -> Bucket {
        let earned = (now - self.at).as_secs_f64() / REFILL.as_secs_f64();
        Bucket {
            tokens: (self.tokens + earned).min(BURST),
            at: now,
        }
    }

    /// How long until the bucket holds a token again; zero when it holds one.
    fn wait(self) -> Duration {
        REFILL.mul_f64((1.0 - self.tokens).max(0.0))
    }
}

/// The failures counted in the current log window of an endpoint.
#[derive(Debug)]
struct Window {
    started: Instant,
    failures: u64,
}

#[derive(Default)]
pub struct Failures {
    buckets: Mutex<HashMap<(IpAddr, Endpoint), Bucket>>,
    windows: Mutex<HashMap<Endpoint, Window>>,
}

impl Failures {
    /// `Err(wait)` when `source` has no failure left on `endpoint`.
    fn check(&self, source: IpAddr, endpoint: Endpoint, now: Instant) -> Result<(), Duration> {
        let buckets = self.buckets.lock().expect("buckets lock");
        match buckets.get(&(source, endpoint)) {
            Some(bucket) => match bucket.refilled(now).wait() {
                Duration::ZERO => Ok(()),
                wait => Err(wait),
            },
            None => Ok(()),
        }
    }

    fn record(&self, source: IpAddr, endpoint: Endpoint, now: Instant) {
        {
            let mut buckets = self.buckets.lock().expect("buckets lock");
            if buckets.len() >= MAX_SOURCES && !buckets.contains_key(&(source, endpoint)) {
                buckets.retain(|_, bucket| bucket.refilled(now).tokens < BURST);
            }
            if buckets.len() < MAX_SOURCES || buckets.contains_key(&(source, endpoint)) {
                let bucket = buckets
                    .entry((source, endpoint))
                    .or_insert_with(|| Bucket::full(now));
                let mut refilled = bucket.refilled(now);
                refilled.tokens -= 1.0;
                *bucket = refilled;
            }
        }
        let mut windows = self.windows.lock().expect("windows lock");
        let window = windows.entry(endpoint).or_insert(Window {
            started: now,
            failures: 0,
        });
        if now - window.started >= LOG_WINDOW {
            if window.failures > 1 {
                tracing::warn!(
                    failures = window.failures,
                    "failed authentications on {} in the last minute",
                    endpoint.as_str()
                );
            }
            *window = Window {
                started: now,
                failures: 0,
            };
        }
        window.failures += 1;
        if window.failures == 1 {
            tracing::warn!(
                "a failed authentication on {}; further ones are counted and logged once a minute",
                endpoint.as_str()
            );
        }
    }
}

/// Whether a request presented a credential: a bearer token, an owner session cookie, or the
/// inbox's or console's sign-in form. A request without one that is refused is a clumsy
/// client, not a guess.
fn presents_credentials(request: &Request) -> bool {
    let headers = request.headers();
    headers.contains_key(header::AUTHORIZATION)
        || headers
            .get_all(header::COOKIE)
            .iter()
            .any(|cookie| cookie.as_bytes().windows(11).any(|w| w == b"obol_owner="))
        || (request.method() == Method::POST
            && matches!(request.uri().path(), "/inbox/login" | "/console/login"))
}

/// Refuses a source with no failure left; counts the request's refused credential.
pub async fn limit(
    State(failures): State<Arc<Failures>>,
    request: Request,
    next: Next,
) -> Response {
    let Some(Peer(peer)) = request.extensions().get::<Peer>().copied() else {
        return next.run(request).await;
    };
    let endpoint = Endpoint::of(request.uri().path());
    if let Err(wait) = failures.check(peer.ip(), endpoint, Instant::now()) {
        let retry_after = wait.as_secs().max(1);
        let error = ObolError::RateLimited { retry_after };
        let mut response = match endpoint {
            Endpoint::Mcp => crate::mcp::transport_refusal(&error, request.headers()),
            _ => error.to_rest_response(),
        };
        response.headers_mut().insert(
            header::RETRY_AFTER,
            HeaderValue::from_str(&retry_after.to_string()).expect("digits"),
        );
        return response;
    }
    let counted = presents_credentials(&request);
    let response = next.run(request).await;
    if counted && response.status() == StatusCode::UNAUTHORIZED {
        failures.record(peer.ip(), endpoint, Instant::now());
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ten_failures_then_one_every_six_seconds_per_source_and_endpoint() {
        let failures = Failures::default();
        let (attacker, bystander): (IpAddr, IpAddr) =
            ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
        let start = Instant::now();
        for _ in 0..10 {
            assert_eq!(failures.check(attacker, Endpoint::Rest, start), Ok(()));
            failures.record(attacker, Endpoint::Rest, start);
        }
        let wait = failures.check(attacker, Endpoint::Rest, start).unwrap_err();
        assert!(wait > Duration::from_secs(5) && wait <= REFILL, "{wait:?}");
        // Another endpoint and another source are untouched.
        assert_eq!(failures.check(attacker, Endpoint::Mcp, start), Ok(()));
        assert_eq!(failures.check(bystander, Endpoint::Rest, start), Ok(()));
        // Six seconds later, one more guess.
        let later = start + REFILL;
        assert_eq!(failures.check(attacker, Endpoint::Rest, later), Ok(()));
        failures.record(attacker, Endpoint::Rest, later);
        assert!(failures.check(attacker, Endpoint::Rest, later).is_err());
    }

    #[test]
    fn endpoints_are_told_apart_by_path() {
        assert_eq!(Endpoint::of("/mcp"), Endpoint::Mcp);
        assert_eq!(Endpoint::of("/inbox/login"), Endpoint::Inbox);
        assert_eq!(Endpoint::of("/console/login"), Endpoint::Inbox);
        assert_eq!(Endpoint::of("/v1/admin/keys"), Endpoint::Admin);
        // Wrong admin tokens against /metrics share the admin API's budget.
        assert_eq!(Endpoint::of("/metrics"), Endpoint::Admin);
        assert_eq!(Endpoint::of("/v1/receipts"), Endpoint::Rest);
    }
}
