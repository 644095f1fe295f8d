//! Request bodies: one process-wide budget for the bytes being read or held, and a deadline
//! and minimum rate for reading them.
//!
//! Every request's body is wrapped ([`guard`]) before a handler sees it. Its bytes are charged
//! to the budget as they arrive, and released when the request's handler is done. A body that
//! would overdraw the budget is refused (`overloaded`, retryable) instead of buffered, at once
//! if its announced length does not fit; one that arrives too slowly is cut off
//! (`request_timeout`). Bodies over 64 KiB may fill only seven eighths of the budget, so a
//! crowd of large or stalled uploads leaves room for ordinary calls. One connection holds at
//! most one request body at a time (HTTP/1.1), so its own bound is the body cap plus
//! `[server] max_header_bytes`.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes, HttpBody};
use axum::extract::{Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::Response;
use hyper::body::{Frame, SizeHint};
use tokio::time::Instant;

use crate::error::ObolError;

/// How long a body may take before the minimum rate applies.
const GRACE: Duration = Duration::from_secs(5);

#[derive(Debug, Clone)]
pub struct BodyLimits {
    /// Request bytes read or held at once, over all requests.
    pub budget_bytes: usize,
    /// A body must be read within this, whatever its size.
    pub read_timeout: Duration,
    /// After the first 5 s, a body must arrive at least this fast on average (bytes/s).
    pub min_bytes_per_s: u64,
}

impl Default for BodyLimits {
    fn default() -> BodyLimits {
        BodyLimits {
            budget_bytes: 64 << 20,
            read_timeout: Duration::from_secs(30),
            min_bytes_per_s: 4096,
        }
    }
}

/// A body larger than this is large: it may not take the budget's last eighth.
const SMALL_BODY: usize = 64 << 10;

/// The bytes every request body together may hold.
pub struct Budget {
    used: AtomicUsize,
    limits: BodyLimits,
}

impl Budget {
    pub fn new(limits: &BodyLimits) -> Budget {
        Budget {
            used: AtomicUsize::new(0),
            limits: limits.clone(),
        }
    }

    /// What a body of `size` bytes may use of the budget at most.
    fn ceiling(&self, size: usize) -> usize {
        let total = self.limits.budget_bytes;
        if size > SMALL_BODY {
            total - total / 8
        } else {
            total
        }
    }

    /// Whether a body of `size` bytes would fit now (nothing is charged).
    fn fits(&self, size: usize) -> bool {
        self.used.load(Ordering::Relaxed) + size <= self.ceiling(size)
    }

    /// Charges `bytes` more of a body that will then hold `size`.
    fn take(&self, bytes: usize, size: usize) -> Result<(), Refusal> {
        let ceiling = self.ceiling(size);
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                (used + bytes <= ceiling).then_some(used + bytes)
            })
            .map(|_| ())
            .map_err(|_| Refusal::Overloaded)
    }

    fn give_back(&self, bytes: usize) {
        self.used.fetch_sub(bytes, Ordering::AcqRel);
    }
}

/// Why a request body was not read to its end.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("request bodies being read fill the gateway's budget")]
    Overloaded,
    #[error("the request body arrived too slowly")]
    TooSlow,
}

impl Refusal {
    pub fn to_obol_error(self) -> ObolError {
        match self {
            Refusal::Overloaded => ObolError::BodyBudgetFull,
            Refusal::TooSlow => ObolError::RequestTimeout,
        }
    }

    /// The refusal behind a body read error, if it was one.
    pub fn of(error: &(dyn std::error::Error + 'static)) -> Option<Refusal> {
        let mut cause = Some(error);
        while let Some(error) = cause {
            if let Some(refusal) = error.downcast_ref::<Refusal>() {
                return Some(*refusal);
            }
            cause = error.source();
        }
        None
    }
}

/// What one request holds of the budget (given back when the request is done), and whether
/// its body was refused.
struct Charge {
    budget: Arc<Budget>,
    held: AtomicUsize,
    refused: OnceLock<Refusal>,
}

impl Charge {
    fn new(budget: &Arc<Budget>) -> Charge {
        Charge {
            budget: Arc::clone(budget),
            held: AtomicUsize::new(0),
            refused: OnceLock::new(),
        }
    }

    /// Charges `bytes` more, the body then holding `size`.
    fn take(&self, bytes: usize, size: usize) -> Result<(), Refusal> {
        self.budget.take(bytes, size)?;
        self.held.fetch_add(bytes, Ordering::AcqRel);
        Ok(())
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        self.budget.give_back(*self.held.get_mut());
    }
}

/// Wraps every request body. A REST route whose body was refused answers with the refusal
/// (its extractor would say only that the body could not be read); `/mcp` renders the
/// refusal itself, in JSON-RPC.
pub async fn guard(State(budget): State<Arc<Budget>>, request: Request, next: Next) -> Response {
    let charge = Arc::new(Charge::new(&budget));
    let announced = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.parse::<usize>().ok());
    let renders_its_own = request.uri().path() == "/mcp";
    let (parts, inner) = request.into_parts();
    let paced = Paced {
        inner,
        budget: Arc::clone(&budget),
        charge: Arc::clone(&charge),
        announced,
        checked: false,
        received: 0,
        started: Instant::now(),
        timer: Box::pin(tokio::time::sleep(Duration::ZERO)),
    };
    let response = next.run(Request::from_parts(parts, Body::new(paced))).await;
    match charge.refused.get() {
        Some(refusal) if !renders_its_own => refusal.to_obol_error().to_rest_response(),
        _ => response,
    }
}

/// A request body, charged to the budget and held to a deadline and a minimum rate.
struct Paced {
    inner: Body,
    budget: Arc<Budget>,
    charge: Arc<Charge>,
    announced: Option<usize>,
    /// Whether the announced length was checked against the budget (at the first read).
    checked: bool,
    received: u64,
    started: Instant,
    timer: Pin<Box<tokio::time::Sleep>>,
}

impl Paced {
    /// When the body counts as too slow if nothing more arrives: its whole deadline, or
    /// sooner once its average rate falls under the minimum.
    fn deadline(&self) -> Instant {
        let limits = &self.budget.limits;
        let by_rate =
            Duration::from_secs_f64(self.received as f64 / limits.min_bytes_per_s.max(1) as f64);
        self.started + limits.read_timeout.min(GRACE.max(by_rate))
    }

    fn refuse(&mut self, refusal: Refusal) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let _ = self.charge.refused.set(refusal);
        Poll::Ready(Some(Err(axum::Error::new(refusal))))
    }
}

impl HttpBody for Paced {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let this = self.get_mut();
        if let Some(refusal) = this.charge.refused.get() {
            return Poll::Ready(Some(Err(axum::Error::new(*refusal))));
        }
        // A body announced larger than what is left is refused before a byte of it is read.
        if !this.checked {
            this.checked = true;
            if let Some(announced) = this.announced
                && !this.budget.fits(announced)
            {
                return this.refuse(Refusal::Overloaded);
            }
        }
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                let bytes = frame.data_ref().map_or(0, Bytes::len);
                this.received += bytes as u64;
                if let Err(refusal) = this.charge.take(bytes, this.received as usize) {
                    return this.refuse(refusal);
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Pending => {
                let deadline = this.deadline();
                if Instant::now() >= deadline {
                    return this.refuse(Refusal::TooSlow);
                }
                this.timer.as_mut().reset(deadline);
                if this.timer.as_mut().poll(cx).is_ready() {
                    return this.refuse(Refusal::TooSlow);
                }
                Poll::Pending
            }
            other => other,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn paced(budget: &Arc<Budget>, body: Body, announced: Option<usize>) -> (Paced, Arc<Charge>) {
        let charge = Arc::new(Charge::new(budget));
        let paced = Paced {
            inner: body,
            budget: Arc::clone(budget),
            charge: Arc::clone(&charge),
            checked: false,
            announced,
            received: 0,
            started: Instant::now(),
            timer: Box::pin(tokio::time::sleep(Duration::ZERO)),
        };
        (paced, charge)
    }

    async fn read(body: Paced) -> Result<Vec<u8>, Option<Refusal>> {
        axum::body::to_bytes(Body::new(body), usize::MAX)
            .await
            .map(|all| all.to_vec())
            .map_err(|error| Refusal::of(&error))
    }

    #[tokio::test]
    async fn bodies_share_one_budget_and_give_it_back() {
        const KIB: usize = 1 << 10;
        let budget = Arc::new(Budget::new(&BodyLimits {
            budget_bytes: 800 * KIB,
            ..BodyLimits::default()
        }));
        let (first, held) = paced(&budget, Body::from(vec![b'a'; 600 * KIB]), Some(600 * KIB));
        assert_eq!(read(first).await.unwrap().len(), 600 * KIB);
        // The first request still holds its bytes: a second announcing 600 KiB is refused
        // unread.
        let (second, refused) = paced(&budget, Body::from(vec![b'b'; 600 * KIB]), Some(600 * KIB));
        assert_eq!(read(second).await, Err(Some(Refusal::Overloaded)));
        assert_eq!(refused.refused.get(), Some(&Refusal::Overloaded));
        // Large bodies leave the last eighth (100 KiB) to small ones: a 150 KiB body that
        // did not announce its length is refused as it arrives, a 64 KiB one passes.
        let (large, _) = paced(&budget, Body::from(vec![b'c'; 150 * KIB]), None);
        assert_eq!(read(large).await, Err(Some(Refusal::Overloaded)));
        let (small, _) = paced(&budget, Body::from(vec![b'd'; 64 * KIB]), None);
        assert_eq!(read(small).await.unwrap().len(), 64 * KIB);
        drop(held);
        assert_eq!(
            budget.used.load(Ordering::Relaxed),
            0,
            "everything given back"
        );
        let (third, _) = paced(&budget, Body::from(vec![b'e'; 700 * KIB]), None);
        assert_eq!(read(third).await.unwrap().len(), 700 * KIB);
    }

    #[tokio::test]
    async fn a_body_that_stalls_is_cut_off() {
        let budget = Arc::new(Budget::new(&BodyLimits {
            read_timeout: Duration::from_millis(600),
            ..BodyLimits::default()
        }));
        let (sender, stream) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(1);
        let (paced, _) = paced(&budget, Body::from_stream(tokio_stream_of(stream)), None);
        let started = Instant::now();
        let reading = tokio::spawn(read(paced));
        sender.send(Ok(Bytes::from(vec![0; 2000]))).await.unwrap();
        // Nothing more comes: the body is refused at its deadline, not left waiting.
        assert_eq!(reading.await.unwrap(), Err(Some(Refusal::TooSlow)));
        let waited = started.elapsed();
        assert!(
            waited >= Duration::from_millis(550) && waited < Duration::from_secs(3),
            "{waited:?}"
        );
        drop(sender);
    }

    #[tokio::test]
    async fn the_minimum_rate_applies_after_the_grace() {
        let budget = Arc::new(Budget::new(&BodyLimits {
            read_timeout: Duration::from_secs(30),
            min_bytes_per_s: 1000,
            ..BodyLimits::default()
        }));
        let (mut body, _) = paced(&budget, Body::empty(), None);
        let started = body.started;
        // Under 5,000 bytes the grace decides; above, the rate (20,000 bytes: 20 s).
        assert_eq!(body.deadline(), started + GRACE);
        body.received = 20_000;
        assert_eq!(body.deadline(), started + Duration::from_secs(20));
        // However fast, never past the read timeout.
        body.received = 10_000_000;
        assert_eq!(body.deadline(), started + Duration::from_secs(30));
    }

    fn tokio_stream_of(
        mut receiver: tokio::sync::mpsc::Receiver<Result<Bytes, std::io::Error>>,
    ) -> impl futures_util::Stream<Item = Result<Bytes, std::io::Error>> {
        futures_util::stream::poll_fn(move |cx| receiver.poll_recv(cx))
    }
}
