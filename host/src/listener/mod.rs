//! The one HTTP listener every endpoint shares (`/mcp`, REST, inbox, admin), and its defences
//! against clients that hold resources without using them.
//!
//! * A cap on open connections. At the cap a new connection takes the place of the one that
//!   uses its place least (idle longest, then the slowest to send a request head); only when
//!   every connection is being served is the new one refused (503, `Retry-After`). So idle
//!   and slow clients can fill the cap, and a normal call is still answered.
//! * An idle timeout between requests, and a header-read timeout from a request's first byte
//!   to the end of its head; a head larger than the header limit is refused (431).
//! * [`body`]: a process-wide budget for request bytes being read or held, and a deadline and
//!   minimum rate for reading a body.
//!
//! Each connection is a small state machine ([`Phase`]) fed by the bytes it reads and the
//! requests it serves; a watchdog closes it when its phase has lasted too long.

pub mod body;
pub mod failures;
pub mod lanes;

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::{Body, Bytes, HttpBody};
use axum::http::{Request, Response, header};
use hyper::body::{Frame, Incoming, SizeHint};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;

use crate::error::ObolError;

/// What every connection may hold, and for how long (`[server]` in the config).
#[derive(Debug, Clone)]
pub struct Limits {
    /// Open connections at most; at the cap, idle and slow ones give way to new ones.
    pub max_connections: usize,
    /// From a request's first byte to the end of its head.
    pub header_read_timeout: Duration,
    /// Between requests on a kept-alive connection (and before the first).
    pub idle_timeout: Duration,
    /// The largest request head (request line and headers) read.
    pub max_header_bytes: usize,
    pub body: body::BodyLimits,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_connections: 512,
            header_read_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            max_header_bytes: 32 << 10,
            body: body::BodyLimits::default(),
        }
    }
}

impl Limits {
    /// The cap, lowered to fit the process's file-descriptor limit (with room for the store,
    /// the outbound pool, the logs and each lane's reactor), so the cap is what runs out first.
    pub fn fitted_to_descriptors(mut self) -> Limits {
        let reserved = 64 + lanes::DESCRIPTORS_PER_LANE * lanes::count() as u64;
        let soft = rustix::process::getrlimit(rustix::process::Resource::Nofile)
            .current
            .unwrap_or(u64::MAX);
        let room = soft.saturating_sub(reserved).max(16);
        if (self.max_connections as u64) > room {
            tracing::warn!(
                configured = self.max_connections,
                descriptors = soft,
                "lowering [server] max_connections to fit the open-file limit"
            );
            self.max_connections = room as usize;
        }
        self
    }
}

/// Where a connection is, as its watchdog sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// No request in progress since `since` (just accepted, or its last response ended).
    Idle { since: Instant },
    /// The first bytes of a request arrived at `since`; its head is not complete yet.
    ReadingHead { since: Instant },
    /// Requests being answered: their bodies read, their responses written.
    Serving { requests: u32 },
}

impl Phase {
    fn bytes_arrived(self, now: Instant) -> Phase {
        match self {
            Phase::Idle { .. } => Phase::ReadingHead { since: now },
            other => other,
        }
    }

    fn request_started(self) -> Phase {
        match self {
            Phase::Serving { requests } => Phase::Serving {
                requests: requests + 1,
            },
            _ => Phase::Serving { requests: 1 },
        }
    }

    fn response_ended(self, now: Instant) -> Phase {
        match self {
            Phase::Serving { requests } if requests > 1 => Phase::Serving {
                requests: requests - 1,
            },
            _ => Phase::Idle { since: now },
        }
    }

    /// Why the connection must close now, if it must.
    fn overdue(self, now: Instant, limits: &Limits) -> Option<&'static str> {
        match self {
            Phase::Idle { since } if now - since >= limits.idle_timeout => Some("idle"),
            Phase::ReadingHead { since } if now - since >= limits.header_read_timeout => {
                Some("request head too slow")
            }
            _ => None,
        }
    }

    /// Which connection gives way at the cap: idle ones first, then slow heads, the longest
    /// waiting first. One being served never does.
    fn eviction_rank(self) -> Option<(u8, Instant)> {
        match self {
            Phase::Idle { since } => Some((0, since)),
            Phase::ReadingHead { since } => Some((1, since)),
            Phase::Serving { .. } => None,
        }
    }
}

/// One connection's phase, shared by its reader, its service and its watchdog.
struct Watch {
    phase: Mutex<Phase>,
    evicted: Notify,
}

impl Watch {
    fn update(&self, step: impl FnOnce(Phase) -> Phase) {
        let mut phase = self.phase.lock().expect("phase lock");
        *phase = step(*phase);
    }

    fn phase(&self) -> Phase {
        *self.phase.lock().expect("phase lock")
    }
}

/// The open connections, for the cap.
#[derive(Default)]
struct Connections {
    open: Mutex<HashMap<u64, Arc<Watch>>>,
    next_id: AtomicU64,
}

impl Connections {
    /// A place for a new connection: a free one, or the place of the connection that uses its
    /// place least (it is told to close). `None` when every connection is being served.
    fn admit(&self, max: usize) -> Option<(u64, Arc<Watch>)> {
        let mut open = self.open.lock().expect("connections lock");
        if open.len() >= max {
            let victim = open
                .iter()
                .filter_map(|(id, watch)| watch.phase().eviction_rank().map(|rank| (rank, *id)))
                .min()
                .map(|(_, id)| id)?;
            if let Some(watch) = open.remove(&victim) {
                watch.evicted.notify_one();
            }
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let watch = Arc::new(Watch {
            phase: Mutex::new(Phase::Idle {
                since: Instant::now(),
            }),
            evicted: Notify::new(),
        });
        open.insert(id, Arc::clone(&watch));
        Some((id, watch))
    }

    fn close(&self, id: u64) {
        self.open.lock().expect("connections lock").remove(&id);
    }

    fn count(&self) -> usize {
        self.open.lock().expect("connections lock").len()
    }
}

/// Gives a connection's place back however its task ends: served, panicked, or cancelled
/// with its lane.
struct Place {
    connections: Arc<Connections>,
    id: u64,
}

impl Drop for Place {
    fn drop(&mut self) {
        self.connections.close(self.id);
    }
}

/// Serves `app` on `listener` until `stop` resolves, then lets requests in flight finish (at
/// most `drain`), runs `afterwards` (work the requests started that must still run on the
/// lanes), stops the lanes and returns. Connections are served on [`lanes`], one thread each;
/// failing to start them is the only error. Dropping this future before it returns stops the
/// lanes at once, cancelling what runs on them: the server runs it to its end.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: Limits,
    stop: impl Future<Output = ()>,
    drain: Duration,
    afterwards: impl Future<Output = ()>,
) -> std::io::Result<()> {
    let lanes = lanes::Lanes::start()?;
    let limits = Arc::new(limits);
    let connections = Arc::new(Connections::default());
    let (stopping, stopped) = tokio::sync::watch::channel(false);
    // The outer layer first: a source out of failures is refused before its body is read.
    let app = app
        .layer(axum::middleware::from_fn_with_state(
            Arc::new(body::Budget::new(&limits.body)),
            body::guard,
        ))
        .layer(axum::middleware::from_fn_with_state(
            Arc::new(failures::Failures::default()),
            failures::limit,
        ));
    tokio::pin!(stop);
    let mut descriptor_warning = Instant::now() - Duration::from_secs(60);
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = &mut stop => break,
        };
        let (stream, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(error) => {
                // Out of descriptors (or a transient network error): back off instead of
                // spinning, and say so at most once a minute.
                if descriptor_warning.elapsed() >= Duration::from_secs(60) {
                    tracing::warn!("cannot accept connections: {error}");
                    descriptor_warning = Instant::now();
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        match connections.admit(limits.max_connections) {
            Some((id, watch)) => {
                // Taken off this runtime's reactor; its lane registers it with its own.
                let stream = match stream.into_std() {
                    Ok(stream) => stream,
                    Err(error) => {
                        tracing::debug!("cannot hand a connection to a lane: {error}");
                        connections.close(id);
                        continue;
                    }
                };
                let connection = Connection {
                    peer,
                    app: app.clone(),
                    limits: Arc::clone(&limits),
                    watch,
                    stopped: stopped.clone(),
                };
                let place = Place {
                    connections: Arc::clone(&connections),
                    id,
                };
                lanes.serve(async move {
                    let _place = place;
                    match TcpStream::from_std(stream) {
                        Ok(stream) => connection.run(stream).await,
                        Err(error) => tracing::debug!("a lane cannot take a connection: {error}"),
                    }
                });
            }
            None => {
                tokio::spawn(refuse(stream));
            }
        }
    }
    let _ = stopping.send(true);
    let deadline = Instant::now() + drain;
    while connections.count() > 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    afterwards.await;
    lanes.stop().await;
    Ok(())
}

/// Every connection is being served: the newcomer is told to come back, not left hanging.
async fn refuse(mut stream: TcpStream) {
    let _ = stream
        .write_all(
            b"HTTP/1.1 503 Service Unavailable\r\nretry-after: 1\r\nconnection: close\r\ncontent-length: 0\r\n\r\n",
        )
        .await;
    let _ = stream.shutdown().await;
}

struct Connection {
    peer: SocketAddr,
    app: Router,
    limits: Arc<Limits>,
    watch: Arc<Watch>,
    stopped: tokio::sync::watch::Receiver<bool>,
}

impl Connection {
    async fn run(mut self, stream: TcpStream) {
        let io = TokioIo::new(Tracked {
            inner: stream,
            watch: Arc::clone(&self.watch),
        });
        let service = Service {
            peer: self.peer,
            app: TowerToHyperService::new(self.app.clone()),
            watch: Arc::clone(&self.watch),
        };
        let mut builder = hyper::server::conn::http1::Builder::new();
        builder
            .timer(TokioTimer::new())
            // The watchdog times heads and idleness; hyper's own timer would start at idle.
            .header_read_timeout(None)
            .max_buf_size(self.limits.max_header_bytes.max(8192))
            .max_headers(100)
            .keep_alive(true);
        let connection = builder.serve_connection(io, service);
        tokio::pin!(connection);
        let mut ticks = tokio::time::interval(Duration::from_millis(250));
        let mut stopping = false;
        loop {
            tokio::select! {
                _ = connection.as_mut() => return,
                () = self.watch.evicted.notified() => {
                    tracing::debug!("closing a connection to make room for a new one");
                    return;
                }
                changed = self.stopped.changed(), if !stopping => {
                    stopping = true;
                    if changed.is_ok() {
                        connection.as_mut().graceful_shutdown();
                    }
                }
                _ = ticks.tick() => {
                    if let Some(why) = self.watch.phase().overdue(Instant::now(), &self.limits) {
                        tracing::debug!("closing a connection: {why}");
                        return;
                    }
                }
            }
        }
    }
}

/// The app, telling the connection's watch when a request starts and when its response ends.
#[derive(Clone)]
struct Service {
    peer: SocketAddr,
    app: TowerToHyperService<Router>,
    watch: Arc<Watch>,
}

impl hyper::service::Service<Request<Incoming>> for Service {
    type Response = Response<Finished>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Finished>, Infallible>> + Send>>;

    fn call(&self, mut request: Request<Incoming>) -> Self::Future {
        self.watch.update(Phase::request_started);
        request.extensions_mut().insert(failures::Peer(self.peer));
        if let Err(error) = strict_head(&request) {
            let watch = Arc::clone(&self.watch);
            return Box::pin(async move {
                Ok(error.to_rest_response().map(|inner| Finished {
                    inner,
                    watch: Some(watch),
                }))
            });
        }
        let answered = self.app.call(request);
        let watch = Arc::clone(&self.watch);
        Box::pin(async move {
            let response = answered.await?;
            Ok(response.map(|inner| Finished {
                inner,
                watch: Some(watch),
            }))
        })
    }
}

/// What every endpoint refuses about a request's target and `Host`, before any handler: a
/// `Host` given twice (which one would a proxy have routed by?), and an absolute-form target
/// that names another host than `Host` (endpoints check `Host`, so the two must agree).
fn strict_head(request: &Request<Incoming>) -> Result<(), ObolError> {
    let mut hosts = request.headers().get_all(header::HOST).iter();
    let host = hosts.next();
    if hosts.next().is_some() {
        return Err(ObolError::MalformedHeader {
            header: "host",
            reason: "given twice",
        });
    }
    if let Some(target) = request.uri().authority() {
        let agrees = host
            .and_then(|host| host.to_str().ok())
            .is_some_and(|host| host.eq_ignore_ascii_case(target.as_str()));
        if !agrees {
            return Err(ObolError::MalformedHeader {
                header: "host",
                reason: "does not name the request target's host",
            });
        }
    }
    Ok(())
}

/// A response body that tells the watch when it is done (written out, or dropped).
struct Finished {
    inner: Body,
    watch: Option<Arc<Watch>>,
}

impl Drop for Finished {
    fn drop(&mut self) {
        if let Some(watch) = self.watch.take() {
            watch.update(|phase| phase.response_ended(Instant::now()));
        }
    }
}

impl HttpBody for Finished {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.get_mut().inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// The socket, telling the watch when bytes arrive.
struct Tracked {
    inner: TcpStream,
    watch: Arc<Watch>,
}

impl AsyncRead for Tracked {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let read = Pin::new(&mut this.inner).poll_read(cx, buf);
        if buf.filled().len() > before {
            this.watch
                .update(|phase| phase.bytes_arrived(Instant::now()));
        }
        read
    }
}

impl AsyncWrite for Tracked {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_connection_moves_through_its_phases() {
        let limits = Limits::default();
        let start = Instant::now();
        let idle = Phase::Idle { since: start };
        assert_eq!(idle.overdue(start, &limits), None);
        assert_eq!(
            idle.overdue(start + limits.idle_timeout, &limits),
            Some("idle")
        );
        let head = idle.bytes_arrived(start + Duration::from_secs(1));
        assert_eq!(
            head,
            Phase::ReadingHead {
                since: start + Duration::from_secs(1)
            }
        );
        // More bytes of the same head do not restart its clock.
        assert_eq!(head.bytes_arrived(start + Duration::from_secs(5)), head);
        assert_eq!(
            head.overdue(
                start + Duration::from_secs(1) + limits.header_read_timeout,
                &limits
            ),
            Some("request head too slow")
        );
        let serving = head.request_started();
        assert_eq!(
            serving.overdue(start + Duration::from_secs(3600), &limits),
            None
        );
        assert_eq!(serving.eviction_rank(), None);
        let two = serving.request_started();
        assert_eq!(two.response_ended(start), serving);
        let later = start + Duration::from_secs(9);
        assert_eq!(serving.response_ended(later), Phase::Idle { since: later });
    }

    #[test]
    fn idle_connections_give_way_before_slow_ones_and_busy_ones_never() {
        let connections = Connections::default();
        let (busy, busy_watch) = connections.admit(2).unwrap();
        busy_watch.update(Phase::request_started);
        let (slow, slow_watch) = connections.admit(2).unwrap();
        slow_watch.update(|phase| phase.bytes_arrived(Instant::now()));
        // At the cap: the slow head gives way (the busy connection never does).
        let (_, newcomer) = connections.admit(2).unwrap();
        let open: Vec<u64> = connections.open.lock().unwrap().keys().copied().collect();
        assert!(open.contains(&busy) && !open.contains(&slow), "{open:?}");
        // The newcomer is idle: it gives way next.
        let (_, _) = connections.admit(2).unwrap();
        assert_eq!(connections.count(), 2);
        drop(newcomer);
        // Every connection busy: the next one is refused.
        for watch in connections.open.lock().unwrap().values() {
            watch.update(Phase::request_started);
        }
        assert!(connections.admit(2).is_none());
    }
}
