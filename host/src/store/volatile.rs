//! An in-memory store with the same atomic semantics and no durability. Compiled only with
//! `test-util`: the benchmark uses it to show what durability costs. Never shipped.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::{Claim, ClaimKey, ClaimRecord, Receipt, StoreError};

#[derive(Debug, Clone, Default)]
pub struct VolatileStore {
    state: Arc<Mutex<State>>,
}

#[derive(Debug, Default)]
struct State {
    claims: HashMap<String, ClaimRecord>,
    receipts: HashMap<(String, String), Receipt>,
}

impl VolatileStore {
    pub async fn claim(&self, key: &ClaimKey, record: &ClaimRecord) -> Result<Claim, StoreError> {
        let mut state = self.state.lock().expect("store lock");
        match state.claims.get(&key.slot()) {
            Some(existing) => Ok(Claim::Existing(Box::new(existing.clone()))),
            None => {
                state.claims.insert(key.slot(), record.clone());
                Ok(Claim::Acquired)
            }
        }
    }

    pub async fn transition(
        &self,
        key: &ClaimKey,
        expected: &ClaimRecord,
        next: &ClaimRecord,
        receipt: Option<&Receipt>,
    ) -> Result<bool, StoreError> {
        let mut state = self.state.lock().expect("store lock");
        let slot = key.slot();
        if state.claims.get(&slot).map(|c| c.version) != Some(expected.version) {
            return Ok(false);
        }
        state.claims.insert(slot, next.clone());
        if let Some(receipt) = receipt {
            state.receipts.insert(
                (receipt.workspace.clone(), receipt.id.clone()),
                receipt.clone(),
            );
        }
        Ok(true)
    }

    pub async fn get(&self, key: &ClaimKey) -> Result<Option<ClaimRecord>, StoreError> {
        Ok(self
            .state
            .lock()
            .expect("store lock")
            .claims
            .get(&key.slot())
            .cloned())
    }

    pub async fn receipt(&self, workspace: &str, id: &str) -> Result<Option<Receipt>, StoreError> {
        let state = self.state.lock().expect("store lock");
        Ok(state
            .receipts
            .get(&(workspace.to_owned(), id.to_owned()))
            .cloned())
    }

    pub async fn receipts(
        &self,
        workspace: &str,
        limit: usize,
    ) -> Result<Vec<Receipt>, StoreError> {
        let state = self.state.lock().expect("store lock");
        let mut found: Vec<Receipt> = state
            .receipts
            .values()
            .filter(|r| r.workspace == workspace)
            .cloned()
            .collect();
        found.sort_by_key(|r| std::cmp::Reverse(r.finalized_at_ms));
        found.truncate(limit);
        Ok(found)
    }
}
