//! Remote MCP servers as connectors (issue 11; ADR-0045).
//!
//! [`Upstreams`] is the pool: one rmcp client session per connection and credential
//! fingerprint (a rotated credential gets a new session), a 45-second tools cache per entry
//! that the upstream's `notifications/tools/list_changed` invalidates, and the [`health`] of
//! each upstream. Which tools a workspace shows is the catalog's business: the pool hands it
//! a [`Snapshot`] and says when something changed.

pub mod effect;
pub mod health;
pub mod keyed;
pub mod session;
pub mod tools;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use serde_json::{Map, Value};
use sha2::{Digest, Sha256};
use tokio::sync::mpsc;

use crate::catalog::ToolSpec;
pub use crate::catalog::{Listed, Snapshot, UpstreamId};
use crate::config::{ConnectionConfig, ConnectionKind, McpUpstream, OutboundConfig};
use effect::Observed;
use health::{Flip, Health};
use session::{Answer, Dial, Session};

pub use crate::config::PROTOCOL_VERSIONS;

/// How long a tools listing is served from the cache.
pub const TOOLS_TTL: Duration = Duration::from_secs(45);
/// Pages of `tools/list` followed before the listing is refused.
pub const MAX_PAGES: usize = 50;
/// Tools one upstream may list.
pub const MAX_TOOLS: usize = 2000;

/// Why the pool wants the catalog rebuilt.
#[derive(Debug, Clone)]
pub enum Signal {
    /// An upstream said its tools changed: list it again.
    ListChanged(UpstreamId),
    /// An upstream went down or came up on a call.
    Flipped(UpstreamId),
}

#[derive(Debug, Clone)]
struct Limits {
    call_deadline: Duration,
    list_deadline: Duration,
    max_response_bytes: usize,
}

/// Which upstreams a listing pass reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Staleness {
    /// Those whose cached tools are past their TTL (or invalidated).
    Stale,
    /// Those health says are down (the probe), whatever their cache says.
    Down,
}

/// One pool entry.
#[derive(Debug, Default)]
struct Entry {
    session: tokio::sync::Mutex<Option<Arc<Session>>>,
    cache: Mutex<Cache>,
    /// One listing at a time per upstream; the others wait for it and read its result.
    refreshing: tokio::sync::Mutex<()>,
    /// A `list_changed` is waiting to be handled: further ones add nothing (an upstream that
    /// floods them costs one queued signal, not one each).
    changed_pending: AtomicBool,
}

#[derive(Debug, Default)]
struct Cache {
    tools: Option<Arc<Vec<Arc<ToolSpec>>>>,
    /// A digest of the tools, to tell whether a listing changed anything.
    digest: Option<[u8; 32]>,
    /// When the cache must be read again (`None`: now).
    fresh_until: Option<Instant>,
    /// Bumped by every `list_changed`: a listing that overlapped one is not fresh.
    generation: u64,
}

/// The pool of upstream sessions.
pub struct Upstreams {
    http: reqwest::Client,
    limits: Limits,
    entries: Mutex<HashMap<UpstreamId, Arc<Entry>>>,
    pub health: Health,
    signals: mpsc::UnboundedSender<Signal>,
}

impl std::fmt::Debug for Upstreams {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Upstreams").finish_non_exhaustive()
    }
}

/// An upstream connection as the pool needs it.
#[derive(Debug, Clone, Copy)]
pub struct Target<'a> {
    pub id: &'a UpstreamId,
    pub connection: &'a ConnectionConfig,
    pub upstream: &'a McpUpstream,
}

impl<'a> Target<'a> {
    /// The MCP upstreams among a workspace's connections.
    pub fn of(id: &'a UpstreamId, connection: &'a ConnectionConfig) -> Option<Target<'a>> {
        match &connection.kind {
            ConnectionKind::Mcp(upstream) => Some(Target {
                id,
                connection,
                upstream,
            }),
            ConnectionKind::Component { .. } | ConnectionKind::Virtual => None,
        }
    }
}

impl Upstreams {
    pub fn new(
        config: &OutboundConfig,
    ) -> anyhow::Result<(Upstreams, mpsc::UnboundedReceiver<Signal>)> {
        let (signals, receiver) = mpsc::unbounded_channel();
        let upstreams = Upstreams {
            http: crate::outbound::streaming_client(config)?,
            limits: Limits {
                call_deadline: config.request_timeout,
                list_deadline: config.upstream_list_timeout,
                max_response_bytes: config.max_response_bytes,
            },
            entries: Mutex::default(),
            health: Health::default(),
            signals,
        };
        Ok((upstreams, receiver))
    }

    /// Every upstream the pool has met, as (workspace, connection, up), for the metrics.
    pub fn health_report(&self) -> Vec<(Arc<str>, Arc<str>, bool)> {
        let ids: Vec<UpstreamId> = self
            .entries
            .lock()
            .expect("entries lock")
            .keys()
            .cloned()
            .collect();
        ids.into_iter()
            .map(|id| {
                let up = !self.health.is_down(&id);
                (id.workspace.into(), id.connection.into(), up)
            })
            .collect()
    }

    fn entry(&self, id: &UpstreamId) -> Arc<Entry> {
        Arc::clone(
            self.entries
                .lock()
                .expect("entries lock")
                .entry(id.clone())
                .or_default(),
        )
    }

    /// What the catalog shows of each upstream now.
    pub fn snapshot(&self) -> Snapshot {
        self.entries
            .lock()
            .expect("entries lock")
            .iter()
            .map(|(id, entry)| {
                let tools = entry.cache.lock().expect("cache lock").tools.clone();
                let down = self.health.is_down(id);
                (id.clone(), Listed { tools, down })
            })
            .collect()
    }

    /// Whether the upstream's tools must be read again before a listing is answered.
    pub fn stale(&self, id: &UpstreamId) -> bool {
        let entry = self.entry(id);
        let cache = entry.cache.lock().expect("cache lock");
        cache
            .fresh_until
            .is_none_or(|until| until <= Instant::now())
    }

    /// Reads the upstream's tools unless another listing just did. Returns whether what the
    /// catalog shows of it changed (its tools, or whether it is down).
    pub async fn refresh(&self, target: Target<'_>, which: Staleness) -> bool {
        let entry = self.entry(target.id);
        let _flight = entry.refreshing.lock().await;
        if which == Staleness::Stale && !self.stale(target.id) {
            return false;
        }
        entry.changed_pending.store(false, Ordering::SeqCst);
        let generation = entry.cache.lock().expect("cache lock").generation;
        let listed =
            tokio::time::timeout(self.limits.list_deadline, self.list(&entry, target)).await;
        let connection = &target.id.connection;
        match listed {
            Ok(Ok(listed)) => {
                let digest = digest(&listed);
                let same = entry.cache.lock().expect("cache lock").digest == Some(digest);
                // An unchanged listing is not compiled (or logged) again.
                let admitted = (!same).then(|| tools::admit(target.upstream, listed));
                for dropped in admitted.iter().flat_map(|a| &a.dropped) {
                    tracing::warn!(%connection, "upstream tool left out: {dropped}");
                }
                let changed = {
                    let mut cache = entry.cache.lock().expect("cache lock");
                    if let Some(admitted) = admitted {
                        cache.tools = Some(Arc::new(admitted.tools));
                        cache.digest = Some(digest);
                    }
                    // A list_changed during the listing may not be in it: read again.
                    cache.fresh_until =
                        (cache.generation == generation).then(|| Instant::now() + TOOLS_TTL);
                    !same
                };
                let flip = self.health.answered(target.id);
                if flip == Flip::CameUp {
                    tracing::info!(%connection, "upstream answers again; its tools are back");
                }
                changed || flip != Flip::Unchanged
            }
            failed => {
                let reason = match failed {
                    Ok(Err(reason)) => reason,
                    _ => format!(
                        "no listing within {} ms",
                        self.limits.list_deadline.as_millis()
                    ),
                };
                // Read again no sooner than the probe would.
                entry.cache.lock().expect("cache lock").fresh_until =
                    Some(Instant::now() + PROBE_INTERVAL);
                let went_down = self.health.listing_failed(target.id) == Flip::WentDown;
                // Once per outage, not once per probe.
                if went_down {
                    tracing::warn!(%connection, "could not list the upstream's tools; it is down until it answers: {reason}");
                } else {
                    tracing::debug!(%connection, "the upstream still cannot be listed: {reason}");
                }
                went_down
            }
        }
    }

    /// One listing, on a new session if the old one expired.
    async fn list(
        &self,
        entry: &Arc<Entry>,
        target: Target<'_>,
    ) -> Result<Vec<rmcp::model::Tool>, String> {
        for _ in 0..2 {
            let session = self
                .session(entry, target)
                .await
                .map_err(|e| e.to_string())?;
            match session.list_tools(MAX_PAGES, MAX_TOOLS).await {
                Err(reason) if session::expired(&reason) => {
                    forget(entry, &session).await;
                }
                other => return other,
            }
        }
        Err("the upstream expired two sessions in a row".into())
    }

    /// Sends one `tools/call`. What the host observed decides the outcome; the answer is only
    /// relayed. Opening a session and the call share one deadline (`request_timeout_ms`), as
    /// a native attempt's connect and response do, so an attempt never outlives its lease's
    /// share.
    pub async fn call(
        &self,
        target: Target<'_>,
        name: &str,
        arguments: Map<String, Value>,
        key: Option<keyed::IdempotencyHeader>,
    ) -> (Observed, Answer) {
        let deadline = tokio::time::Instant::now() + self.limits.call_deadline;
        let entry = self.entry(target.id);
        let opened = tokio::time::timeout_at(deadline, self.session(&entry, target)).await;
        let session = match opened {
            Ok(Ok(session)) => session,
            failed => {
                let why = match failed {
                    Ok(Err(error)) => error.to_string(),
                    _ => "no session within the request deadline".to_owned(),
                };
                tracing::warn!(connection = %target.id.connection, "no upstream session, nothing sent: {why}");
                self.flipped(target.id, self.health.call_unreachable(target.id));
                return (Observed::NotSent, Answer::Nothing);
            }
        };
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        let (observed, answer) = session.call(name, arguments, key, left).await;
        match observed {
            Observed::SessionExpired => {
                tracing::info!(connection = %target.id.connection, "the upstream session expired; the next attempt opens a new one");
                forget(&entry, &session).await;
            }
            Observed::NotSent => {
                self.flipped(target.id, self.health.call_unreachable(target.id));
            }
            _ => self.flipped(target.id, self.health.answered(target.id)),
        }
        (observed, answer)
    }

    fn flipped(&self, id: &UpstreamId, flip: Flip) {
        if flip != Flip::Unchanged {
            tracing::warn!(connection = %id.connection, "upstream {}", match flip {
                Flip::WentDown => "went down: its tools are left out until it answers again",
                _ => "answers again",
            });
            let _ = self.signals.send(Signal::Flipped(id.clone()));
        }
    }

    /// The entry's session, opened (or reopened for a rotated credential) when needed.
    async fn session(
        &self,
        entry: &Arc<Entry>,
        target: Target<'_>,
    ) -> Result<Arc<Session>, session::DialError> {
        let credential = match &target.connection.secret {
            None => None,
            Some(secret) => Some(
                crate::outbound::credential_header(secret)
                    .map_err(|_| session::DialError::Credential)?,
            ),
        };
        let fingerprint: [u8; 32] = match &credential {
            None => [0; 32],
            Some((name, value)) => Sha256::new()
                .chain_update(name.as_str())
                .chain_update([0])
                .chain_update(value.as_bytes())
                .finalize()
                .into(),
        };
        let mut slot = entry.session.lock().await;
        if let Some(session) = slot.as_ref()
            && session.fingerprint == fingerprint
            && !session.is_closed()
        {
            return Ok(Arc::clone(session));
        }
        let on_change = {
            let weak: Weak<Entry> = Arc::downgrade(entry);
            let signals = self.signals.clone();
            let id = target.id.clone();
            Arc::new(move || {
                if let Some(entry) = weak.upgrade() {
                    {
                        let mut cache = entry.cache.lock().expect("cache lock");
                        cache.fresh_until = None;
                        cache.generation += 1;
                    }
                    if !entry.changed_pending.swap(true, Ordering::SeqCst) {
                        let _ = signals.send(Signal::ListChanged(id.clone()));
                    }
                }
            })
        };
        let session = Session::open(Dial {
            http: self.http.clone(),
            url: target.upstream.url.as_str(),
            credential,
            fingerprint,
            offered_version: target.upstream.protocol_version.as_deref(),
            max_response_bytes: self.limits.max_response_bytes,
            on_change,
        })
        .await?;
        tracing::info!(
            connection = %target.id.connection,
            protocol_version = %session.protocol_version,
            "opened an upstream MCP session"
        );
        let session = Arc::new(session);
        *slot = Some(Arc::clone(&session));
        Ok(session)
    }

    /// The protocol version each open session speaks, for the operator.
    pub async fn protocol_version(&self, id: &UpstreamId) -> Option<String> {
        let entry = self.entry(id);
        let slot = entry.session.lock().await;
        slot.as_ref().map(|s| s.protocol_version.clone())
    }
}

/// How often down upstreams are listed again in the background.
pub const PROBE_INTERVAL: Duration = Duration::from_secs(5);

/// Drops a session that failed, unless another task already replaced it.
async fn forget(entry: &Entry, session: &Arc<Session>) {
    let mut slot = entry.session.lock().await;
    if slot.as_ref().is_some_and(|s| Arc::ptr_eq(s, session)) {
        *slot = None;
    }
}

fn digest(tools: &[rmcp::model::Tool]) -> [u8; 32] {
    let mut hasher = Sha256::new();
    for tool in tools {
        hasher.update(serde_json::to_vec(tool).unwrap_or_default());
        hasher.update([0]);
    }
    hasher.finalize().into()
}
