//! The sweeper: settles slots whose holder died and that nobody asks about again.
//!
//! A client that let the gateway mint its key never learned it, so no retry comes to notice a
//! dead holder; without the sweeper its slot would stay reserved (embedded) or expire
//! silently (Redis), and an effect that may have happened would have no receipt. The stores
//! index every reserved attempt's lease; this task reads the expired ones and settles them
//! through the one settle phase, exactly as a same-key caller would (a record written before
//! claims named their holder is settled with what its slot names). Several gateways sweeping
//! one Redis race harmlessly: settling is a compare-and-set.

use std::sync::Arc;
use std::time::Duration;

use super::Services;
use super::settle::{self, Settlement};
use crate::clock::now_ms;
use crate::store::{ApprovalBasis, ClaimKey, EvidenceClass, Holder};

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
    for (slot, record) in expired {
        let Some(key) = ClaimKey::from_slot(&slot) else {
            tracing::error!("the sweeper skips a lease whose slot does not parse");
            continue;
        };
        // Records written before claims named their holder are settled with what the slot
        // itself says.
        let fallback = unrecorded_holder(&key);
        if settle::settle(
            &services.store,
            &key,
            &record,
            Settlement::DeadHolder,
            Some(&fallback),
        )
        .await
        .is_ok()
        {
            settled += 1;
        }
    }
    settled
}

/// The facts of a call whose claim predates holder records: only what its slot names.
fn unrecorded_holder(key: &ClaimKey) -> Holder {
    Holder {
        workspace: key.workspace.clone(),
        connection: key.connection.label().to_owned(),
        tool: key.tool.clone(),
        idempotency_key: key.key.to_string(),
        key_hash: String::new(),
        key_name: "(not recorded before 0.2)".into(),
        publication: None,
        policies: Vec::new(),
        approval: ApprovalBasis::NotRequired,
        evidence: EvidenceClass::GatewayObserved,
        route: Default::default(),
        capability: None,
        trace_id: None,
    }
}
