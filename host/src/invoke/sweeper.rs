//! The sweeper: settles slots whose holder died and that nobody asks about again.
//!
//! A client that let the gateway mint its key never learned it, so no retry comes to notice a
//! dead holder; without the sweeper its slot would stay reserved (embedded) or expire
//! silently (Redis), and an effect that may have happened would have no receipt. The stores
//! index every reserved attempt's lease; this task reads the expired ones and settles them
//! through the one settle phase, exactly as a same-key caller would. Several gateways
//! sweeping one Redis race harmlessly: settling is a compare-and-set.

use std::sync::Arc;
use std::time::Duration;

use super::Services;
use super::settle::{self, Settlement};
use crate::clock::now_ms;

/// How often the lease index is read.
pub const INTERVAL: Duration = Duration::from_secs(1);

/// The most slots settled per sweep.
const BATCH: usize = 100;

/// Sweeps until the process ends.
pub async fn run(services: Arc<Services>) {
    let mut ticks = tokio::time::interval(INTERVAL);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        sweep(&services).await;
    }
}

/// Settles every expired lease the store reports now; returns how many it settled.
pub async fn sweep(services: &Services) -> usize {
    let expired = match services.store.expired_leases(now_ms(), BATCH).await {
        Ok(expired) => expired,
        Err(error) => {
            tracing::warn!("the sweeper could not read expired leases: {error}");
            return 0;
        }
    };
    let mut settled = 0;
    for record in expired {
        // Records written before claims named their holder are settled by the next same-key
        // call instead, which can supply the facts.
        let Some(key) = record.holder.as_ref().and_then(|holder| holder.claim_key()) else {
            continue;
        };
        if settle::settle(&services.store, &key, &record, Settlement::DeadHolder, None)
            .await
            .is_ok()
        {
            settled += 1;
        }
    }
    settled
}
