//! The claim-key layout a store was written with, and the cutover between layouts
//! (spec/idempotency.md, the capability-scope note; ADR-0044, ADR-0047).
//!
//! Layout 2 claims a capability call under the literal segment `cap`; layout 1 (gateways
//! before ADR-0044) claimed it under the connection it resolved to. The two address different
//! slots for one logical call, so a layout-2 gateway must never admit traffic beside records or
//! gateways of layout 1: a retry would find no slot and dispatch a second effect.
//!
//! * The store records its layout (a registry marker). A store with claims and no marker was
//!   written by an older gateway: it counts as layout 1.
//! * Every gateway registers itself with a heartbeat (id, version, layout); a registration is
//!   live for [`REGISTERED_FOR`] after its last beat.
//! * A gateway admits traffic only when the store is of its layout and no live registration
//!   is of another. `obol store migrate` performs the cutover: it refuses while a layout-1
//!   capability record or a gateway of another layout is live, naming what to drain, and then
//!   writes the marker. It never deletes a record: deleting a live one could redispatch an
//!   effect that already happened.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{ClaimKey, ConnectionSegment, Registry, Store, StoreError};

/// The layout this gateway writes.
pub const CURRENT: u32 = 2;
/// Capability calls claimed under their resolved connection.
pub const LEGACY: u32 = 1;
/// How often a gateway renews its registration.
pub const HEARTBEAT: Duration = Duration::from_secs(5);
/// How long a registration counts after its last beat.
pub const REGISTERED_FOR: Duration = Duration::from_secs(15);

/// The registry record that names the store's layout.
const MARKER: &str = "claims";

/// One gateway, as it registers itself.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Registration {
    pub id: String,
    pub version: String,
    pub layout: u32,
    pub last_seen_ms: u64,
}

impl Registration {
    /// This process, with a fresh id.
    pub fn this_gateway() -> Registration {
        let mut bytes = [0u8; 8];
        getrandom::fill(&mut bytes).expect("the OS random source is available");
        Registration {
            id: format!("gw_{}", hex::encode(bytes)),
            version: env!("CARGO_PKG_VERSION").to_owned(),
            layout: CURRENT,
            last_seen_ms: 0,
        }
    }
}

/// Why a gateway of this layout may not admit traffic, or the store may not be migrated yet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// Claims and no marker: written by a gateway before layout 2. Drain, then migrate.
    Unmigrated,
    /// Live capability records of layout 1, which a layout-2 retry would not find.
    LegacyRecords(Vec<ClaimKey>),
    /// Gateways of another layout are registered (beat within [`REGISTERED_FOR`]).
    OtherGateways(Vec<Registration>),
    /// The store was migrated to a layout this gateway does not know.
    Newer(u32),
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::Unmigrated => write!(
                f,
                "the store holds capability claims written before key layout {CURRENT} (no layout marker): stop the older gateways, then run `obol store migrate`, which names what to drain"
            ),
            Refusal::LegacyRecords(slots) => {
                write!(
                    f,
                    "{} capability record(s) of key layout {LEGACY} are live; drain them (let their calls finish and their retention pass) before the cutover:",
                    slots.len()
                )?;
                for slot in slots.iter().take(20) {
                    write!(
                        f,
                        " [workspace {} connection {} tool {}]",
                        slot.workspace,
                        slot.connection.label(),
                        slot.tool
                    )?;
                }
                Ok(())
            }
            Refusal::OtherGateways(gateways) => {
                write!(
                    f,
                    "gateways of another key layout are still registered; stop them first:"
                )?;
                for gateway in gateways {
                    // Read from the store: escaped, whatever they hold.
                    write!(
                        f,
                        " [{} version {} layout {}]",
                        crate::names::shown(&gateway.id),
                        crate::names::shown(&gateway.version),
                        gateway.layout
                    )?;
                }
                Ok(())
            }
            Refusal::Newer(layout) => write!(
                f,
                "the store was migrated to key layout {layout}, newer than this gateway's {CURRENT}; upgrade this gateway"
            ),
        }
    }
}

/// The layout the store says it has: its marker, or for a store without one, the legacy
/// layout if it holds claims (`None`: an empty store, of no layout yet).
pub async fn written(store: &Store) -> Result<Option<u32>, StoreError> {
    let registry = store.registry(Registry::Layout).await?;
    if let Some(marker) = registry.get(MARKER) {
        return marker
            .parse()
            .map(Some)
            .map_err(|_| StoreError(format!("the layout marker {marker:?} is not a number")));
    }
    Ok(store.holds_claims().await?.then_some(LEGACY))
}

/// Renews `me`'s registration and decides whether it may admit traffic. An empty store is
/// marked with this layout on the way. Only what is read decides: a registration or a marker
/// that cannot be written yet (a replica that has not acknowledged it) is retried on the next
/// beat, and admitting meanwhile is safe, since a call's own claim needs the same writes.
pub async fn admit(store: &Store, me: &Registration, now_ms: u64) -> Result<(), Check> {
    if let Err(error) = register(store, me, now_ms).await {
        tracing::warn!("could not renew this gateway's registration: {error}");
    }
    match written(store).await.map_err(Check::Store)? {
        None => {
            if let Err(error) = mark(store).await {
                tracing::warn!("could not mark the empty store with its key layout: {error}");
            }
        }
        Some(CURRENT) => {}
        // Claims and no marker. Only capability records are spelled differently in the two
        // layouts: a store without any was never written under the old scope, and is marked
        // (so an upgrade from a release before capabilities needs no migration).
        Some(LEGACY) => {
            if !store
                .capability_slots()
                .await
                .map_err(Check::Store)?
                .is_empty()
            {
                return Err(Check::Refused(Refusal::Unmigrated));
            }
            match mark(store).await {
                Ok(()) => tracing::info!(
                    "the store holds no capability records: marked with key layout {CURRENT}"
                ),
                Err(error) => tracing::warn!("could not mark the store's key layout: {error}"),
            }
        }
        Some(newer) => return Err(Check::Refused(Refusal::Newer(newer))),
    }
    let others = other_layouts(store, now_ms).await.map_err(Check::Store)?;
    if !others.is_empty() {
        return Err(Check::Refused(Refusal::OtherGateways(others)));
    }
    Ok(())
}

/// The cutover: refuses while layout-1 capability records or gateways of another layout are
/// live; otherwise marks the store with this layout. Deletes nothing.
pub async fn migrate(store: &Store, now_ms: u64) -> Result<Migrated, Check> {
    let before = written(store).await.map_err(Check::Store)?;
    if let Some(newer) = before.filter(|layout| *layout > CURRENT) {
        return Err(Check::Refused(Refusal::Newer(newer)));
    }
    let legacy: Vec<ClaimKey> = store
        .capability_slots()
        .await
        .map_err(Check::Store)?
        .into_iter()
        .filter(|slot| matches!(slot.connection, ConnectionSegment::Resolved(_)))
        .collect();
    if !legacy.is_empty() {
        return Err(Check::Refused(Refusal::LegacyRecords(legacy)));
    }
    let others = other_layouts(store, now_ms).await.map_err(Check::Store)?;
    if !others.is_empty() {
        return Err(Check::Refused(Refusal::OtherGateways(others)));
    }
    mark(store).await.map_err(Check::Store)?;
    Ok(Migrated { from: before })
}

/// What `migrate` did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Migrated {
    /// The layout before (`None`: an empty store).
    pub from: Option<u32>,
}

/// Why a check did not pass: the rules, or the store could not be read.
#[derive(Debug)]
pub enum Check {
    Refused(Refusal),
    Store(StoreError),
}

impl std::fmt::Display for Check {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Check::Refused(refusal) => refusal.fmt(f),
            Check::Store(error) => write!(f, "the store could not be read: {error}"),
        }
    }
}

async fn register(store: &Store, me: &Registration, now_ms: u64) -> Result<(), StoreError> {
    let beat = Registration {
        last_seen_ms: now_ms,
        ..me.clone()
    };
    let text = serde_json::to_string(&beat).expect("plain data");
    store
        .registry_put(Registry::Gateways, &beat.id, &text)
        .await
}

async fn mark(store: &Store) -> Result<(), StoreError> {
    store
        .registry_put(Registry::Layout, MARKER, &CURRENT.to_string())
        .await
}

/// Live registrations of another layout.
async fn other_layouts(store: &Store, now_ms: u64) -> Result<Vec<Registration>, StoreError> {
    let live_since = now_ms.saturating_sub(REGISTERED_FOR.as_millis() as u64);
    Ok(store
        .registry(Registry::Gateways)
        .await?
        .values()
        .filter_map(|text| serde_json::from_str::<Registration>(text).ok())
        .filter(|gateway| gateway.layout != CURRENT && gateway.last_seen_ms >= live_since)
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::EmbeddedStore;

    fn fresh() -> (tempfile::TempDir, Store) {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::Embedded(EmbeddedStore::open(&dir.path().join("s.redb")).unwrap());
        (dir, store)
    }

    async fn register_other(store: &Store, layout: u32, last_seen_ms: u64) {
        let other = Registration {
            id: "gw_old".into(),
            version: "0.1.0".into(),
            layout,
            last_seen_ms,
        };
        store
            .registry_put(
                Registry::Gateways,
                &other.id,
                &serde_json::to_string(&other).unwrap(),
            )
            .await
            .unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_empty_store_takes_this_layout_and_other_layouts_hold_traffic_while_they_beat() {
        let (_dir, store) = fresh();
        let me = Registration::this_gateway();
        let now = 1_000_000;
        admit(&store, &me, now).await.unwrap();
        assert_eq!(written(&store).await.unwrap(), Some(CURRENT));
        // This gateway is registered.
        let registered = store.registry(Registry::Gateways).await.unwrap();
        assert!(registered.contains_key(&me.id));

        // A gateway of the old layout that beat 10 s ago holds traffic, and migration too.
        register_other(&store, LEGACY, now - 10_000).await;
        let refused = admit(&store, &me, now).await.unwrap_err();
        assert!(refused.to_string().contains("gw_old"), "{refused}");
        assert!(matches!(
            migrate(&store, now).await,
            Err(Check::Refused(Refusal::OtherGateways(_)))
        ));
        // Once its registration is stale, traffic is admitted again.
        register_other(&store, LEGACY, now - REGISTERED_FOR.as_millis() as u64 - 1).await;
        admit(&store, &me, now).await.unwrap();
        assert_eq!(
            migrate(&store, now).await.unwrap(),
            Migrated {
                from: Some(CURRENT)
            }
        );
    }

    /// A store written before the marker existed, with no capability record in it (every
    /// store of a release before capabilities): nothing is spelled differently, so it is
    /// marked and admitted without a migration.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn claims_without_capability_records_need_no_migration() {
        let (_dir, store) = fresh();
        let native = crate::store::contract::key(1);
        store
            .claim(&native, &crate::store::contract::record())
            .await
            .unwrap();
        assert_eq!(written(&store).await.unwrap(), Some(LEGACY));
        admit(&store, &Registration::this_gateway(), 1)
            .await
            .unwrap();
        assert_eq!(written(&store).await.unwrap(), Some(CURRENT));
        assert!(store.get(&native).await.unwrap().is_some());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_newer_layout_is_refused() {
        let (_dir, store) = fresh();
        store
            .registry_put(Registry::Layout, MARKER, "3")
            .await
            .unwrap();
        let me = Registration::this_gateway();
        assert!(matches!(
            admit(&store, &me, 1).await,
            Err(Check::Refused(Refusal::Newer(3)))
        ));
        assert!(matches!(
            migrate(&store, 1).await,
            Err(Check::Refused(Refusal::Newer(3)))
        ));
    }
}
