//! The running gateway's shared state: keys, the catalog snapshot, sessions, the lifecycle's
//! services, and how they are rebuilt (hot reload, registry refreshes). `server` runs it.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::{Arc, RwLock};

use tokio::sync::broadcast;

use crate::approvals::{ApprovalDesk, Owners};
use crate::catalog::{Catalog, Loader};
use crate::config::{Config, WorkspaceConfig};
use crate::error::ObolError;
use crate::invoke::Services;
use crate::mcp::{SessionId, Sessions};
use crate::outbound::Outbound;
use crate::policy::{Environment, KeyHash, KeyTable, Scope, VirtualKey};
use crate::runtime::Runtime;
use crate::store::Store;
pub use crate::upstream::Staleness;
use crate::upstream::{Signal, Target, UpstreamId, Upstreams};

/// Something every open GET stream may need to hear about.
#[derive(Debug, Clone)]
pub enum Event {
    CatalogChanged,
    SessionClosed(SessionId),
}

pub struct Gateway {
    /// Config keys plus the admin API's live ones; swapped whole when the registry changes.
    keys: RwLock<Arc<KeyTable>>,
    pub sessions: Sessions,
    pub services: Arc<Services>,
    pub approvals: ApprovalDesk,
    catalog: RwLock<Arc<Catalog>>,
    pub(crate) loader: Loader,
    /// The config's workspaces, with the registry's publications added.
    workspaces: RwLock<Arc<Vec<WorkspaceConfig>>>,
    /// What the config file says, before the registry adds to it.
    config_keys: Vec<VirtualKey>,
    config_workspaces: Vec<WorkspaceConfig>,
    /// The sha256 of the admin token; `None` disables the admin API.
    pub admin: Option<KeyHash>,
    /// Serialises everything that rebuilds keys or the catalog (registry refreshes, reloads):
    /// each reads the newest state inside it, so an older read can never be swapped in last.
    /// It guards what the gateway has seen of the registry, which is never un-seen.
    rebuild: tokio::sync::Mutex<crate::admin::Seen>,
    /// `Host` values the inbox and the admin API answer to: the public URL's authority and
    /// loopback on the bound port. Anything else (a DNS-rebinding page) is refused.
    hosts: Vec<String>,
    allowed_origins: Vec<String>,
    events: broadcast::Sender<Event>,
    environment: Environment,
    frozen: HashSet<String>,
    /// Open `subscriptions/listen` streams (MCP 2026-07-28), per key.
    pub listens: crate::mcp::listens::Listens,
    /// This gateway as it registers itself in the store (`store::layout`).
    pub registration: crate::store::layout::Registration,
    /// Whether the store's key layout lets this gateway admit traffic (re-checked on every
    /// heartbeat); closed until the first check passed.
    layout: std::sync::atomic::AtomicBool,
    /// What the upstream pool tells the gateway; `server` takes it to run the upstream loop.
    signals: std::sync::Mutex<Option<tokio::sync::mpsc::UnboundedReceiver<Signal>>>,
}

impl std::fmt::Debug for Gateway {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gateway").finish_non_exhaustive()
    }
}

impl Gateway {
    /// Builds the gateway: compiles every configured component (failing on any that does not
    /// load, since the operator named it) and the first catalog snapshot. `address` is where
    /// it listens (the inbox's address unless `[approvals] public_url` says otherwise).
    pub fn new(config: &Config, store: Store, address: SocketAddr) -> anyhow::Result<Gateway> {
        let runtime = Arc::new(Runtime::new(config.runtime.clone())?);
        let loader = Loader::new(
            Arc::clone(&runtime),
            config.components.clone(),
            config.connectors_dir.clone(),
            config.trust.clone(),
        );
        loader.load_configured()?;
        let (connectors, problems) = loader.load_all();
        let (upstreams, signals) = Upstreams::new(&config.outbound)?;
        // Upstreams are listed once the gateway runs (`list_upstreams`).
        let catalog = Catalog::build(connectors, &config.workspaces, &Default::default());
        for problem in problems.iter().chain(&catalog.problems) {
            tracing::warn!("{problem}");
        }
        let (events, _) = broadcast::channel(64);
        let public_url = config
            .approvals
            .public_url
            .clone()
            .unwrap_or_else(|| format!("http://{address}"));
        Ok(Gateway {
            keys: RwLock::new(Arc::new(KeyTable::new(config.keys.iter().cloned()))),
            sessions: Sessions::default(),
            services: Arc::new(Services {
                runtime,
                outbound: Outbound::new(&config.outbound)?,
                upstreams: Arc::new(upstreams),
                breakers: crate::capability::breaker::Breakers::new(config.breaker),
                store,
                lease: config.store.lease,
                inbox_base: public_url.clone(),
                refusals: Default::default(),
                owned: Default::default(),
                metrics: Default::default(),
            }),
            approvals: ApprovalDesk {
                keyring: Arc::clone(&config.approvals.keyring),
                owners: Owners::new(
                    config
                        .workspaces
                        .iter()
                        .filter_map(|w| w.owner.map(|hash| (hash, w.id.clone()))),
                ),
                public_url: public_url.clone(),
            },
            catalog: RwLock::new(Arc::new(catalog)),
            loader,
            workspaces: RwLock::new(Arc::new(config.workspaces.clone())),
            config_keys: config.keys.clone(),
            config_workspaces: config.workspaces.clone(),
            admin: config.admin,
            rebuild: tokio::sync::Mutex::new(Default::default()),
            hosts: {
                let port = address.port();
                let mut hosts = vec![
                    format!("127.0.0.1:{port}"),
                    format!("localhost:{port}"),
                    format!("[::1]:{port}"),
                ];
                if let Ok(url) = reqwest::Url::parse(&public_url)
                    && let Some(host) = url.host_str()
                {
                    hosts.push(match url.port() {
                        Some(port) => format!("{host}:{port}"),
                        None => host.to_owned(),
                    });
                }
                hosts
            },
            allowed_origins: config.allowed_origins.clone(),
            events,
            environment: config.environment,
            registration: crate::store::layout::Registration::this_gateway(),
            listens: Default::default(),
            layout: std::sync::atomic::AtomicBool::new(false),
            signals: std::sync::Mutex::new(Some(signals)),
            frozen: config
                .workspaces
                .iter()
                .filter(|w| w.frozen)
                .map(|w| w.id.clone())
                .collect(),
        })
    }

    /// Every check that precedes an endpoint, in order: credentials (401), environment,
    /// freeze and scope (403). `authorization` is the raw `Authorization` header value.
    pub fn admit(
        &self,
        authorization: Option<&str>,
        scope: Scope,
    ) -> Result<Arc<VirtualKey>, ObolError> {
        let authorization =
            authorization.ok_or(ObolError::Unauthenticated("no Authorization header"))?;
        let token = crate::policy::bearer_token(authorization).ok_or(
            ObolError::Unauthenticated("the Authorization header must be \"Bearer <key>\""),
        )?;
        let key = self
            .keys()
            .authenticate(token)
            .ok_or(ObolError::Unauthenticated("unknown key"))?;
        // Only an authenticated caller learns that this gateway is not admitting traffic.
        if !self.layout.load(std::sync::atomic::Ordering::Acquire) {
            return Err(ObolError::LayoutMismatch);
        }
        if key.environment != self.environment {
            return Err(ObolError::EnvironmentMismatch {
                served: self.environment.as_str(),
                key: key.environment.as_str(),
            });
        }
        if self.frozen.contains(&key.workspace) {
            return Err(ObolError::Frozen);
        }
        if !key.has_scope(scope) {
            return Err(ObolError::ScopeDenied(scope.as_str()));
        }
        Ok(key)
    }

    pub fn keys(&self) -> Arc<KeyTable> {
        Arc::clone(&self.keys.read().expect("keys lock"))
    }

    /// The keys the config file defines (the admin API cannot revoke those).
    pub fn config_keys(&self) -> &[VirtualKey] {
        &self.config_keys
    }

    /// Renews this gateway's registration and decides again whether the store's key layout
    /// lets it admit traffic; says so in the log when that changes. A store that cannot be
    /// read decides nothing: the gate stays as it was (closed until a first decision), and
    /// the next beat asks again. Returns whether the question was decided.
    pub async fn check_layout(&self) -> bool {
        use crate::store::layout::Check;
        use std::sync::atomic::Ordering;
        let verdict = crate::store::layout::admit(
            &self.services.store,
            &self.registration,
            crate::clock::now_ms(),
        )
        .await;
        let open = match &verdict {
            Ok(()) => true,
            Err(Check::Refused(_)) => false,
            Err(Check::Store(error)) => {
                tracing::warn!("could not read the store's key layout: {error}");
                return false;
            }
        };
        let was = self.layout.swap(open, Ordering::AcqRel);
        match verdict {
            Ok(()) if !was => tracing::info!(
                gateway = %self.registration.id,
                layout = crate::store::layout::CURRENT,
                "the store's key layout is this gateway's; admitting traffic"
            ),
            Ok(()) => {}
            Err(check) => {
                tracing::error!(gateway = %self.registration.id, "admitting no traffic: {check}")
            }
        }
        true
    }

    /// How long a key's tool list may be reused (`ttlMs`, MCP 2026-07-28): no longer than the
    /// catalog can go without changing. A watched connector directory, keys and publications
    /// made at runtime (the admin API, or other gateways on a shared Redis) can change it at
    /// any moment: the registry poll's period; an MCP upstream's tools at the tools cache's
    /// age. With none of these, a static config: five minutes. Changes inside the window
    /// reach `subscriptions/listen` streams at once.
    pub fn list_ttl_ms(&self, workspace: &str) -> u64 {
        let mut ttl = std::time::Duration::from_secs(300);
        if self.loader.dir().is_some()
            || self.admin.is_some()
            || matches!(self.services.store, crate::store::Store::Redis(_))
        {
            ttl = ttl.min(crate::admin::REGISTRY_POLL);
        }
        let upstreams = self
            .workspaces()
            .iter()
            .filter(|w| w.id == workspace)
            .flat_map(|w| w.connections.iter())
            .any(|c| matches!(c.kind, crate::config::ConnectionKind::Mcp(_)));
        if upstreams {
            ttl = ttl.min(crate::upstream::TOOLS_TTL);
        }
        ttl.as_millis() as u64
    }

    /// The environment this deployment serves.
    pub fn environment(&self) -> crate::policy::Environment {
        self.environment
    }

    pub fn config_workspaces(&self) -> &[WorkspaceConfig] {
        &self.config_workspaces
    }

    fn workspaces(&self) -> Arc<Vec<WorkspaceConfig>> {
        Arc::clone(&self.workspaces.read().expect("workspaces lock"))
    }

    /// Reads the registry (keys and publications made through the admin API) and swaps in
    /// what changed: the key table always, the catalog when a publication was added (sessions
    /// then hear `tools/list_changed`, since what a key sees may have changed).
    pub async fn refresh_registry(&self) -> Result<(), crate::store::StoreError> {
        let mut seen = self.rebuild.lock().await;
        let records = crate::admin::Records::read(&self.services.store).await?;
        seen.remember(&records);
        let keys = self
            .config_keys
            .iter()
            .cloned()
            .chain(seen.live_keys(&records, &self.config_workspaces));
        let table = Arc::new(KeyTable::new(keys));
        *self.keys.write().expect("keys lock") = Arc::clone(&table);
        // A revoked key's sessions end now, and with them its open streams: every later
        // request would be refused anyway, but a stream never asks again.
        for id in self.sessions.close_where(|key| !table.knows(key)) {
            tracing::info!(session = %id.redacted(), "session ended: its key was revoked");
            let _ = self.events.send(Event::SessionClosed(id));
        }

        let mut workspaces = self.config_workspaces.clone();
        for workspace in &mut workspaces {
            workspace
                .publications
                .extend(seen.publications(&workspace.id));
            for spec in records.capabilities(&workspace.id) {
                match spec.parse(self.environment) {
                    Ok(declared) => workspace.capabilities.push(Arc::new(declared)),
                    Err(problem) => tracing::warn!("registry capability ignored: {problem}"),
                }
            }
        }
        // What a rebuild would change: the publications, and every capability as declared.
        let signature = |w: &[WorkspaceConfig]| {
            (
                w.iter().map(|w| w.publications.len()).sum::<usize>(),
                w.iter()
                    .flat_map(|w| w.capabilities.iter().map(|c| format!("{c:?}")))
                    .collect::<Vec<_>>(),
            )
        };
        if signature(&workspaces) != signature(&self.workspaces()) {
            let workspaces = Arc::new(workspaces);
            *self.workspaces.write().expect("workspaces lock") = Arc::clone(&workspaces);
            let connectors = self.catalog().connectors.values().cloned().collect();
            let next = self.build_catalog(connectors, &workspaces);
            *self.catalog.write().expect("catalog lock") = Arc::new(next);
            tracing::info!("policy publications changed; notifying sessions");
            let _ = self.events.send(Event::CatalogChanged);
        }
        Ok(())
    }

    /// Decides every key's view of the current snapshot, so that no agent's first
    /// `tools/list` after a start, reload or publication pays for evaluating every tool.
    /// Blocking (CPU-bound): run it off the async workers.
    pub fn warm_views(&self) {
        let catalog = self.catalog();
        let keys = self.keys();
        let started = std::time::Instant::now();
        let mut warmed = 0;
        for key in keys.all() {
            // Without publications a view is the prefilter alone: cheap on first use.
            if catalog.policies.has_workspace(&key.workspace) {
                catalog.view(key);
                warmed += 1;
            }
        }
        if warmed > 0 {
            tracing::debug!(keys = warmed, elapsed = ?started.elapsed(), "decided each key's view ahead of its first listing");
        }
    }

    /// The current snapshot; a call keeps the one it started with.
    pub fn catalog(&self) -> Arc<Catalog> {
        Arc::clone(&self.catalog.read().expect("catalog lock"))
    }

    /// Rebuilds the catalog from every source and swaps it in when something changed.
    /// Returns whether it changed. Blocking: call it off the async workers.
    pub fn reload(&self) -> bool {
        let _rebuilding = self.rebuild.blocking_lock();
        let (connectors, problems) = self.loader.load_all();
        let next = self.build_catalog(connectors, &self.workspaces());
        for problem in problems.iter().chain(&next.problems) {
            tracing::warn!("reload: {problem}");
        }
        let changed = next.fingerprint() != self.catalog().fingerprint();
        self.services.metrics.reload(
            match changed {
                true => crate::metrics::Reload::changed,
                false => crate::metrics::Reload::unchanged,
            },
            problems.len(),
        );
        if changed {
            *self.catalog.write().expect("catalog lock") = Arc::new(next);
            tracing::info!("catalog changed; notifying sessions");
            let _ = self.events.send(Event::CatalogChanged);
        }
        changed
    }

    pub fn subscribe(&self) -> broadcast::Receiver<Event> {
        self.events.subscribe()
    }

    pub fn close_session(&self, id: &SessionId, key: KeyHash) -> bool {
        let closed = self.sessions.close(id, key);
        if closed {
            let _ = self.events.send(Event::SessionClosed(id.clone()));
        }
        closed
    }

    fn build_catalog(
        &self,
        connectors: Vec<Arc<crate::catalog::Connector>>,
        workspaces: &[WorkspaceConfig],
    ) -> Catalog {
        Catalog::build(connectors, workspaces, &self.services.upstreams.snapshot())
    }

    /// `tools/list` for a key: the workspace's upstreams whose cached tools are older than
    /// their TTL are listed again first (concurrently), then the current snapshot answers.
    pub async fn list_tools(&self, key: &VirtualKey) -> Result<String, ObolError> {
        self.list_upstreams(Some(&key.workspace), Staleness::Stale)
            .await;
        self.catalog().listing(key)
    }

    /// Lists upstreams (of one workspace, or all) concurrently, each under its own deadline,
    /// and swaps in a new catalog when what they show changed; sessions then hear
    /// `tools/list_changed`.
    pub async fn list_upstreams(&self, workspace: Option<&str>, which: Staleness) {
        let workspaces = self.workspaces();
        let ids: Vec<(UpstreamId, &crate::config::ConnectionConfig)> = workspaces
            .iter()
            .filter(|w| workspace.is_none_or(|id| w.id == id))
            .flat_map(|w| {
                w.connections.iter().map(|c| {
                    let id = UpstreamId {
                        workspace: w.id.clone(),
                        connection: c.id.clone(),
                    };
                    (id, c)
                })
            })
            .collect();
        let upstreams = &self.services.upstreams;
        let due: Vec<Target<'_>> = ids
            .iter()
            .filter_map(|(id, connection)| Target::of(id, connection))
            .filter(|target| match which {
                Staleness::Stale => upstreams.stale(target.id),
                Staleness::Down => upstreams.health.is_down(target.id),
            })
            .collect();
        if due.is_empty() {
            return;
        }
        let changed =
            futures_util::future::join_all(due.into_iter().map(|t| upstreams.refresh(t, which)))
                .await
                .into_iter()
                .any(|changed| changed);
        if changed {
            self.upstreams_changed().await;
        }
    }

    /// Rebuilds the catalog with the pool's current view of every upstream.
    pub async fn upstreams_changed(&self) {
        let _rebuilding = self.rebuild.lock().await;
        let connectors = self.catalog().connectors.values().cloned().collect();
        let next = self.build_catalog(connectors, &self.workspaces());
        *self.catalog.write().expect("catalog lock") = Arc::new(next);
        tracing::info!("upstream tools changed; notifying sessions");
        let _ = self.events.send(Event::CatalogChanged);
    }

    /// Runs what the pool asks for: lists an upstream that said its tools changed, rebuilds
    /// when one went down or came up on a call, and probes the down ones every
    /// [`crate::upstream::PROBE_INTERVAL`]. Returns when the gateway is dropped.
    pub async fn run_upstreams(self: Arc<Self>) {
        let Some(mut signals) = self.signals.lock().expect("signals lock").take() else {
            return;
        };
        let mut probe = tokio::time::interval(crate::upstream::PROBE_INTERVAL);
        probe.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                signal = signals.recv() => match signal {
                    None => return,
                    Some(Signal::ListChanged(id)) => {
                        self.list_upstreams(Some(&id.workspace), Staleness::Stale).await;
                    }
                    Some(Signal::Flipped(_)) => self.upstreams_changed().await,
                },
                _ = probe.tick() => self.list_upstreams(None, Staleness::Down).await,
            }
        }
    }

    /// Whether a request's `Host` is one this gateway answers to (inbox and admin API).
    pub fn host_allowed(&self, headers: &axum::http::HeaderMap) -> bool {
        headers
            .get(axum::http::header::HOST)
            .and_then(|h| h.to_str().ok())
            .is_some_and(|host| one_of(host, &self.hosts))
    }

    /// A browser's form post names its page's origin: it must be this gateway's, by its
    /// listen address or by `[approvals] public_url` (so a proxy that rewrites `Host` does
    /// not break the inbox). A post without `Origin` is not a browser's cross-site post.
    pub fn same_origin(&self, headers: &axum::http::HeaderMap) -> bool {
        let Some(origin) = headers.get(axum::http::header::ORIGIN) else {
            return true;
        };
        origin
            .to_str()
            .ok()
            .and_then(|origin| origin.split_once("://"))
            .is_some_and(|(_, authority)| one_of(authority, &self.hosts))
    }

    /// Browsers may call `/mcp` only from an allowed origin; loopback origins are allowed
    /// unless the operator lists origins explicitly.
    pub fn origin_allowed(&self, origin: &str) -> bool {
        if !self.allowed_origins.is_empty() {
            return self.allowed_origins.iter().any(|allowed| allowed == origin);
        }
        let Ok(url) = reqwest::Url::parse(origin) else {
            return false;
        };
        matches!(url.scheme(), "http" | "https")
            && matches!(
                url.host(),
                Some(url::Host::Domain("localhost"))
                    | Some(url::Host::Ipv4(std::net::Ipv4Addr::LOCALHOST))
                    | Some(url::Host::Ipv6(std::net::Ipv6Addr::LOCALHOST))
            )
    }
}

/// Whether `host` is one of `hosts`. Host names are case-insensitive (RFC 3986).
fn one_of(host: &str, hosts: &[String]) -> bool {
    hosts
        .iter()
        .any(|allowed| allowed.eq_ignore_ascii_case(host))
}

#[cfg(test)]
mod tests {
    #[test]
    fn hosts_match_whatever_their_case() {
        let hosts = vec!["127.0.0.1:8780".to_owned(), "localhost:8780".to_owned()];
        assert!(super::one_of("LOCALHOST:8780", &hosts));
        assert!(super::one_of("127.0.0.1:8780", &hosts));
        assert!(!super::one_of("evil.example", &hosts));
        assert!(!super::one_of("localhost:8781", &hosts));
    }
}
