//! The server: opens the store, builds the [`Gateway`], starts its background tasks (hot
//! reload, registry polling, the dead-holder sweeper) and serves every router until the
//! process is stopped.

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::TcpListener;

use crate::config::{Config, RedisTarget, StoreBackend, StoreConfig};
use crate::gateway::Gateway;
use crate::store::{EmbeddedStore, RedisStore, Store};
use crate::{http, mcp};

/// Opens the configured store: Redis when a URL is configured, the embedded file otherwise.
pub async fn open_store(config: &StoreConfig) -> anyhow::Result<Store> {
    Ok(match &config.backend {
        StoreBackend::Embedded(path) => {
            tracing::info!(path = %path.display(), "using the embedded store");
            Store::Embedded(
                EmbeddedStore::open_with_cache(path, config.cache_bytes)?
                    .with_retention(config.retention),
            )
        }
        StoreBackend::Redis(target) => {
            let store = match target {
                RedisTarget::Node(url) => RedisStore::connect(url).await?,
                RedisTarget::Cluster(nodes) => RedisStore::connect_cluster(nodes).await?,
            }
            .with_retention(config.retention)
            .with_replicas(config.redis_replicas, config.redis_replica_timeout)
            .await?;
            tracing::info!("using the Redis store");
            Store::Redis(store)
        }
        #[cfg(feature = "test-util")]
        StoreBackend::Volatile => {
            tracing::warn!("using a volatile in-memory store: nothing survives a restart");
            Store::Volatile(crate::store::VolatileStore::default())
        }
    })
}

/// Runs the gateway on `listener` until the process is stopped.
pub async fn serve(config: Config, listener: TcpListener) -> anyhow::Result<()> {
    let store = open_store(&config.store).await?;
    let address: SocketAddr = listener.local_addr()?;
    let gateway = Arc::new(tokio::task::block_in_place(|| {
        Gateway::new(&config, store, address)
    })?);
    if let Some(dir) = &config.connectors_dir {
        crate::hotload::watch(Arc::clone(&gateway), dir, config.reload_interval)?;
    }
    // Keys and publications made through the admin API, before the first request. With a
    // shared store, other gateways' changes arrive by polling.
    gateway.refresh_registry().await?;
    // Traffic is admitted only under this gateway's claim-key layout; the heartbeat keeps
    // this gateway registered and re-decides (`store::layout`).
    let decided = gateway.check_layout().await;
    let beating = Arc::clone(&gateway);
    tokio::spawn(async move {
        // Undecided (the store could not be read): ask again soon, then at the beat.
        let mut decided = decided;
        loop {
            let pause = if decided {
                crate::store::layout::HEARTBEAT
            } else {
                std::time::Duration::from_millis(250)
            };
            tokio::time::sleep(pause).await;
            decided = beating.check_layout().await;
        }
    });
    // Every MCP upstream is listed before the first request (each under its deadline; one that
    // does not answer is down, and probed in the background).
    gateway
        .list_upstreams(None, crate::gateway::Staleness::Stale)
        .await;
    tokio::spawn(Arc::clone(&gateway).run_upstreams());
    let warming = Arc::clone(&gateway);
    tokio::task::spawn_blocking(move || warming.warm_views());
    if matches!(gateway.services.store, Store::Redis(_)) {
        let poller = Arc::clone(&gateway);
        tokio::spawn(async move {
            let mut ticks = tokio::time::interval(crate::admin::REGISTRY_POLL);
            loop {
                ticks.tick().await;
                // A Redis restarted (or failed over) with unsafe settings is refused again.
                if let Store::Redis(redis) = &poller.services.store {
                    redis.recheck_durability().await;
                }
                match poller.refresh_registry().await {
                    Ok(()) => {
                        let warming = Arc::clone(&poller);
                        let _ = tokio::task::spawn_blocking(move || warming.warm_views()).await;
                    }
                    Err(error) => {
                        tracing::warn!("could not read the key and policy registry: {error}")
                    }
                }
            }
        });
    }
    // What is past the retention is removed in the background (Redis keys expire by themselves).
    if matches!(gateway.services.store, Store::Embedded(_)) {
        let store = gateway.services.store.clone();
        tokio::spawn(async move {
            let mut ticks = tokio::time::interval(std::time::Duration::from_secs(600));
            loop {
                ticks.tick().await;
                match store.compact(crate::clock::now_ms()).await {
                    Ok(0) => {}
                    Ok(removed) => tracing::info!(removed, "compacted records past the retention"),
                    Err(error) => tracing::warn!("compaction failed: {error}"),
                }
            }
        });
    }
    // Dead holders nobody asks about again are settled with a receipt (`invoke::sweeper`).
    tokio::spawn(crate::invoke::sweeper::run(Arc::clone(&gateway.services)));
    let app = mcp::router(Arc::clone(&gateway))
        .merge(crate::admin::router(Arc::clone(&gateway)))
        .merge(http::router(Arc::clone(&gateway)))
        .merge(http::inbox::router(Arc::clone(&gateway)))
        .merge(http::console::router(Arc::clone(&gateway)));
    if let Some(hint) = crate::idle::IdleCores::read().hint() {
        tracing::info!("{hint}");
    }
    let catalog = gateway.catalog();
    tracing::info!(
        %address,
        connectors = catalog.connectors.len(),
        "obol is serving /mcp"
    );
    // Tests and scripts read this line to learn the port.
    println!("obol listening on http://{address}/mcp");
    let limits = config.limits.clone().fitted_to_descriptors();
    // Calls whose clients hung up still run to their final write, and outcomes whose final
    // write failed get one more try, before the process ends: at most one lease.
    let owned = gateway.services.owned.drain(gateway.services.lease);
    let lease = gateway.services.lease;
    crate::listener::serve(listener, app, limits, stop_signal(), lease, owned)
        .await
        .map_err(|error| {
            anyhow::anyhow!("cannot start the threads that serve connections: {error}")
        })
}

/// Ctrl-C, or SIGTERM (what a container runtime or systemd sends).
async fn stop_signal() {
    let mut terminate =
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(terminate) => terminate,
            Err(error) => {
                tracing::warn!("cannot listen for SIGTERM ({error}); stopping on Ctrl-C only");
                let _ = tokio::signal::ctrl_c().await;
                return;
            }
        };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = terminate.recv() => {}
    }
    tracing::info!("stopping: no new requests; waiting for calls in flight");
}
