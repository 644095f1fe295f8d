//! An in-memory store with the same atomic semantics and no durability. Compiled only with
//! `test-util`: the benchmark uses it to show what durability costs. Never shipped.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use super::{Claim, ClaimKey, ClaimRecord, Receipt, Registry, RegistryWrite, StoreError};
use crate::approvals::{ApprovalId, Decided, Decision, Ticket, TicketStatus};

#[derive(Debug, Clone, Default)]
pub struct VolatileStore {
    state: Arc<Mutex<State>>,
}

#[derive(Debug, Default)]
struct State {
    claims: HashMap<String, ClaimRecord>,
    receipts: HashMap<(String, String), Receipt>,
    tickets: HashMap<ApprovalId, Ticket>,
    registry: BTreeMap<(&'static str, String), String>,
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
        let Some(current) = state.claims.get(&slot) else {
            return Err(super::gone(&slot));
        };
        if next.version != expected.version + 1 {
            return Err(super::version_step(expected.version, next.version));
        }
        if current.version != expected.version {
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

    pub async fn expired_leases(
        &self,
        now_ms: u64,
        limit: usize,
    ) -> Result<Vec<(String, ClaimRecord)>, StoreError> {
        let state = self.state.lock().expect("store lock");
        Ok(state
            .claims
            .iter()
            .filter(|(_, record)| record.holder_died(now_ms))
            .take(limit)
            .map(|(slot, record)| (slot.clone(), record.clone()))
            .collect())
    }

    pub async fn slots_matching(&self, glob: &str) -> Result<Vec<String>, StoreError> {
        Ok(self
            .state
            .lock()
            .expect("store lock")
            .claims
            .keys()
            .filter(|slot| super::glob_matches(glob, slot))
            .cloned()
            .collect())
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

    pub async fn record_refusal(&self, receipt: &Receipt) -> Result<(), StoreError> {
        let mut state = self.state.lock().expect("store lock");
        state.receipts.insert(
            (receipt.workspace.clone(), receipt.id.clone()),
            receipt.clone(),
        );
        Ok(())
    }

    pub async fn put_ticket(&self, ticket: &Ticket) -> Result<(), StoreError> {
        let mut state = self.state.lock().expect("store lock");
        state
            .tickets
            .entry(ticket.id.clone())
            .or_insert_with(|| ticket.clone());
        Ok(())
    }

    pub async fn ticket(&self, id: &ApprovalId) -> Result<Option<Ticket>, StoreError> {
        Ok(self
            .state
            .lock()
            .expect("store lock")
            .tickets
            .get(id)
            .cloned())
    }

    pub async fn tickets(&self, workspace: &str, limit: usize) -> Result<Vec<Ticket>, StoreError> {
        let state = self.state.lock().expect("store lock");
        let mut found: Vec<Ticket> = state
            .tickets
            .values()
            .filter(|t| t.workspace == workspace)
            .cloned()
            .collect();
        found.sort_by_key(|t| std::cmp::Reverse(t.created_at_ms));
        found.truncate(limit);
        Ok(found)
    }

    pub async fn decide_ticket(
        &self,
        id: &ApprovalId,
        decision: Decision,
        at_ms: u64,
    ) -> Result<Decided, StoreError> {
        let mut state = self.state.lock().expect("store lock");
        Ok(match state.tickets.get(id).cloned() {
            None => Decided::Missing,
            Some(ticket) if ticket.status != TicketStatus::Pending => {
                Decided::Already(Box::new(ticket))
            }
            Some(ticket) => {
                let next = super::decided(ticket, decision, at_ms);
                state.tickets.insert(id.clone(), next.clone());
                Decided::Now(Box::new(next))
            }
        })
    }

    pub async fn registry_write(
        &self,
        registry: Registry,
        name: &str,
        value: &str,
        mode: RegistryWrite,
    ) -> Result<bool, StoreError> {
        let mut state = self.state.lock().expect("store lock");
        let key = (registry.as_str(), name.to_owned());
        if mode == RegistryWrite::InsertOnly && state.registry.contains_key(&key) {
            return Ok(false);
        }
        state.registry.insert(key, value.to_owned());
        Ok(true)
    }

    pub async fn registry(
        &self,
        registry: Registry,
    ) -> Result<BTreeMap<String, String>, StoreError> {
        let state = self.state.lock().expect("store lock");
        Ok(state
            .registry
            .iter()
            .filter(|((kind, _), _)| *kind == registry.as_str())
            .map(|((_, name), value)| (name.clone(), value.clone()))
            .collect())
    }
}
