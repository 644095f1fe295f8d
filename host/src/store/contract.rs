//! The behaviour every backend must have, as one suite both backends run: the embedded one in
//! this crate's unit tests, Redis in the end-to-end tests against a real `redis-server`.

#![cfg(any(test, feature = "test-util"))]

use super::*;
use crate::clock::now_ms;
use crate::idempotency::{IdempotencyKey, RequestHash};

pub fn key(n: u32) -> ClaimKey {
    ClaimKey {
        workspace: "acme".into(),
        connection: ConnectionSegment::Resolved("stripe-main".into()),
        tool: "stripe.create_refund".into(),
        key: IdempotencyKey::parse(&format!("idt_contract{n:08}{}", now_ms())).unwrap(),
    }
}

fn holder() -> Holder {
    Holder {
        workspace: "acme".into(),
        connection: "stripe-main".into(),
        tool: "stripe.create_refund".into(),
        idempotency_key: "idt_contract".into(),
        key_hash: "sha256:00".into(),
        key_name: "agent".into(),
        publication: None,
        policies: Vec::new(),
        approval: ApprovalBasis::NotRequired,
        evidence: EvidenceClass::GatewayObserved,
        route: Default::default(),
        capability: None,
        trace_id: None,
    }
}

pub fn record() -> ClaimRecord {
    record_leased_until(now_ms() + 30_000)
}

pub fn record_leased_until(lease_until_ms: u64) -> ClaimRecord {
    ClaimRecord::open(
        Pin::new(
            RequestHash::of_arguments(&serde_json::json!({"charge": "ch_1"})),
            PinnedBinding::Header("idempotency-key".into()),
            "fp".into(),
        ),
        holder(),
        Opening::Reserved { lease_until_ms },
        format!("rcp_contract{}", now_ms()),
        KeySource::Supplied,
        now_ms(),
    )
}

pub fn receipt(record: &ClaimRecord, claim: &ClaimKey) -> Receipt {
    Receipt {
        capability: None,
        trace_id: None,
        id: record.receipt_id.clone(),
        workspace: claim.workspace.clone(),
        idempotency_key: claim.key.to_string(),
        key_source: KeySource::Supplied,
        tool: claim.tool.clone(),
        connection: "stripe-main".into(),
        request_hash: record.pin.request_hash.clone(),
        fingerprint: record.pin.fingerprint.clone(),
        connector_version: None,
        attempt_count: record.attempts,
        outcome: OutcomeClass::Accepted,
        vendor_status: Some(200),
        evidence: EvidenceClass::GatewayObserved,
        route: Default::default(),
        broker_record_id: None,
        verification: Verification::Verified,
        note: None,
        policy_publication: None,
        matched_policies: Vec::new(),
        approval_id: None,
        key_name: None,
        refusal: false,
        created_at_ms: record.created_at_ms,
        finalized_at_ms: now_ms(),
    }
}

/// Runs every contract check against `store`.
pub async fn run(store: &Store) {
    // First: it needs a store that has never held a claim.
    a_legacy_layout_is_refused_and_nothing_is_deleted(store).await;
    claims_are_created_once(store).await;
    transitions_compare_and_set(store).await;
    finalize_stores_the_receipt(store).await;
    a_large_result_is_stored_whole(store).await;
    concurrent_claims_have_one_winner(store).await;
    keys_are_independent(store).await;
    tickets_are_written_once_and_decided_once(store).await;
    registry_inserts_once_and_puts_always(store).await;
    expired_leases_are_found_until_settled(store).await;
    records_of_the_previous_release_are_kept(store).await;
}

/// The key-layout cutover (`layout`) on a fresh store: claims without a marker are the legacy
/// layout, refused; the scan finds every capability slot of both layouts and nothing else;
/// migration refuses while a layout-1 capability record is live, names it, and deletes
/// nothing.
async fn a_legacy_layout_is_refused_and_nothing_is_deleted(store: &Store) {
    use super::layout::{self, Check, LEGACY, Refusal, Registration};
    let now = now_ms();
    assert_eq!(layout::written(store).await.unwrap(), None);
    assert!(!store.holds_claims().await.unwrap());
    let legacy = ClaimKey {
        tool: "cap.refund".into(),
        ..key(50)
    };
    let current = ClaimKey {
        connection: ConnectionSegment::Capability,
        tool: "cap.refund".into(),
        ..key(51)
    };
    store.claim(&legacy, &record()).await.unwrap();
    assert_eq!(layout::written(store).await.unwrap(), Some(LEGACY));
    let me = Registration::this_gateway();
    let admitted = layout::admit(store, &me, now).await;
    assert!(
        matches!(admitted, Err(Check::Refused(Refusal::Unmigrated))),
        "{admitted:?}"
    );
    store.claim(&key(52), &record()).await.unwrap();
    store.claim(&current, &record()).await.unwrap();
    let mut found = store.capability_slots().await.unwrap();
    found.sort_by_key(|k| k.slot());
    let mut expected = vec![legacy.clone(), current.clone()];
    expected.sort_by_key(|k| k.slot());
    assert_eq!(found, expected);
    match layout::migrate(store, now).await {
        Err(Check::Refused(Refusal::LegacyRecords(slots))) => {
            assert_eq!(slots, vec![legacy.clone()]);
            let said = Refusal::LegacyRecords(slots).to_string();
            assert!(
                said.contains("stripe-main") && said.contains("cap.refund"),
                "{said}"
            );
        }
        other => panic!("{other:?}"),
    }
    // Nothing was deleted, and the store is still of the legacy layout.
    assert!(store.get(&legacy).await.unwrap().is_some());
    assert_eq!(layout::written(store).await.unwrap(), Some(LEGACY));
}

/// A record as 0.1 wrote it (no holder; the attempt named in the state) round-trips through
/// the backend and keeps its meaning.
async fn records_of_the_previous_release_are_kept(store: &Store) {
    let k = key(30);
    let old: ClaimRecord = serde_json::from_value(serde_json::json!({
        "version": 2,
        "pin": {"request_hash": "ab", "binding": "header:idempotency-key", "fingerprint": "f"},
        "state": {"state": "finalized",
                  "outcome": {"class": "unknown", "vendor_status": null, "response": {"Err": {"code": -32034}}}},
        "attempts": 1, "lease_until_ms": 5, "receipt_id": "rcp_old", "key_supplied": true,
        "created_at_ms": 1
    }))
    .unwrap();
    assert!(old.holder.is_none() && old.pin.binding.is_vendor_binding());
    assert_eq!(store.claim(&k, &old).await.unwrap(), Claim::Acquired);
    let read = store.get(&k).await.unwrap().unwrap();
    assert_eq!(read, old);
    let ClaimState::Finalized { outcome } = &read.state else {
        panic!("{read:?}");
    };
    assert_eq!(outcome.class, OutcomeClass::Unknown);
    // Resent under a vendor binding: the next attempt is counted on top of the old one.
    let resent = read.reserve_next(holder(), now_ms() + 30_000);
    assert!(store.transition(&k, &read, &resent).await.unwrap());
    assert_eq!(store.get(&k).await.unwrap().unwrap().attempts, 2);
}

/// The sweeper's index: a reserved attempt whose lease ended is reported, with its holder,
/// until the claim leaves `Reserved`; a live one and a finalized one are not.
async fn expired_leases_are_found_until_settled(store: &Store) {
    let (dead_key, live_key) = (key(20), key(21));
    let dead = record_leased_until(now_ms().saturating_sub(1));
    let live = record();
    store.claim(&dead_key, &dead).await.unwrap();
    store.claim(&live_key, &live).await.unwrap();
    let found = store.expired_leases(now_ms(), 10_000).await.unwrap();
    assert!(
        found.contains(&(dead_key.slot(), dead.clone())),
        "{found:?}"
    );
    assert!(!found.iter().any(|(slot, _)| *slot == live_key.slot()));
    assert_eq!(
        ClaimKey::from_slot(&dead_key.slot()),
        Some(dead_key.clone())
    );
    let settled = dead.finalize(StoredOutcome {
        class: OutcomeClass::Unknown,
        vendor_status: None,
        response: Err(serde_json::json!({"code": -32000})),
    });
    let receipt = receipt(&settled, &dead_key);
    assert!(
        store
            .finalize(&dead_key, &dead, &settled, &receipt)
            .await
            .unwrap()
    );
    let found = store.expired_leases(now_ms(), 10_000).await.unwrap();
    assert!(
        !found.iter().any(|(slot, _)| *slot == dead_key.slot()),
        "{found:?}"
    );
}

async fn registry_inserts_once_and_puts_always(store: &Store) {
    let name = format!("acme/{}", now_ms());
    assert!(
        store
            .registry_insert(Registry::Publications, &name, "one")
            .await
            .unwrap()
    );
    assert!(
        !store
            .registry_insert(Registry::Publications, &name, "two")
            .await
            .unwrap()
    );
    store
        .registry_put(Registry::Keys, &name, "a")
        .await
        .unwrap();
    store
        .registry_put(Registry::Keys, &name, "b")
        .await
        .unwrap();
    assert_eq!(
        store
            .registry(Registry::Publications)
            .await
            .unwrap()
            .get(&name),
        Some(&"one".to_owned())
    );
    assert_eq!(
        store.registry(Registry::Keys).await.unwrap().get(&name),
        Some(&"b".to_owned())
    );
}

fn ticket(workspace: &str, created_at_ms: u64) -> crate::approvals::Ticket {
    use crate::approvals::{ApprovalId, Ticket, TicketStatus};
    Ticket {
        capability: None,
        id: ApprovalId::mint(),
        workspace: workspace.into(),
        key_name: "agent".into(),
        key_hash: "sha256:00".into(),
        tool: "stripe.create_refund".into(),
        connection: "stripe-live".into(),
        idempotency_key: "idt_contract000000000".into(),
        request_hash: "rh".into(),
        destination: "dst".into(),
        summary: vec!["amount = 5".into()],
        policy_publication: None,
        policies: vec![],
        created_at_ms,
        expires_at_ms: created_at_ms + 86_400_000,
        status: TicketStatus::Pending,
    }
}

async fn tickets_are_written_once_and_decided_once(store: &Store) {
    use crate::approvals::{Decided, Decision, TicketStatus};
    let workspace = format!("tickets{}", now_ms());
    let (first, second) = (
        ticket(&workspace, now_ms()),
        ticket(&workspace, now_ms() + 1),
    );
    store.put_ticket(&first).await.unwrap();
    store.put_ticket(&second).await.unwrap();
    // A repeated write never replaces a ticket (nor its decision).
    let mut rewritten = first.clone();
    rewritten.summary = vec!["changed".into()];
    store.put_ticket(&rewritten).await.unwrap();
    assert_eq!(store.ticket(&first.id).await.unwrap(), Some(first.clone()));
    let listed = store.tickets(&workspace, 10).await.unwrap();
    assert_eq!(listed, vec![second.clone(), first.clone()], "newest first");
    assert!(store.tickets("elsewhere", 10).await.unwrap().is_empty());

    let Decided::Now(approved) = store
        .decide_ticket(&first.id, Decision::Approved, 7)
        .await
        .unwrap()
    else {
        panic!("a pending ticket is decided");
    };
    assert_eq!(approved.status, TicketStatus::Approved { at_ms: 7 });
    // The second decision loses, whatever it says.
    assert_eq!(
        store
            .decide_ticket(&first.id, Decision::Denied, 8)
            .await
            .unwrap(),
        Decided::Already(approved.clone())
    );
    assert_eq!(
        store.ticket(&first.id).await.unwrap().as_ref(),
        Some(&*approved)
    );
    let missing = crate::approvals::ApprovalId::mint();
    assert_eq!(
        store
            .decide_ticket(&missing, Decision::Denied, 9)
            .await
            .unwrap(),
        Decided::Missing
    );
}

async fn claims_are_created_once(store: &Store) {
    let (k, r) = (key(1), record());
    assert_eq!(store.claim(&k, &r).await.unwrap(), Claim::Acquired);
    let mut other = r.clone();
    other.pin = super::Rendered::new(super::Pin {
        request_hash: "different".into(),
        ..(*r.pin).clone()
    });
    assert_eq!(
        store.claim(&k, &other).await.unwrap(),
        Claim::Existing(Box::new(r.clone()))
    );
    assert_eq!(store.get(&k).await.unwrap(), Some(r));
}

async fn transitions_compare_and_set(store: &Store) {
    let (k, r) = (key(2), record());
    store.claim(&k, &r).await.unwrap();
    let next = r.reserve_next(holder(), now_ms() + 30_000);
    assert_eq!((next.version, next.attempts), (2, 2));
    assert!(store.transition(&k, &r, &next).await.unwrap());
    // The same expectation again is stale: exactly one of two racers wins.
    assert!(!store.transition(&k, &r, &next).await.unwrap());
    assert_eq!(store.get(&k).await.unwrap(), Some(next.clone()));
    // No record is not a lost race: it is an error (a fresh claim would send again).
    assert!(store.transition(&key(99), &r, &next).await.is_err());
    // A transition that does not step the version by one is refused, whatever is stored.
    let current = store.get(&k).await.unwrap().unwrap();
    let mut skipping = current.renew(now_ms());
    skipping.version += 1;
    assert!(store.transition(&k, &current, &skipping).await.is_err());
    assert_eq!(store.get(&k).await.unwrap(), Some(current));
}

async fn finalize_stores_the_receipt(store: &Store) {
    let (k, r) = (key(3), record());
    store.claim(&k, &r).await.unwrap();
    let done = r.finalize(StoredOutcome {
        class: OutcomeClass::Accepted,
        vendor_status: Some(200),
        response: Ok(ResultJson::of(
            &serde_json::json!({"content": [], "isError": false}),
        )),
    });
    let receipt = receipt(&r, &k);
    assert!(store.finalize(&k, &r, &done, &receipt).await.unwrap());
    assert_eq!(store.get(&k).await.unwrap(), Some(done.clone()));
    assert_eq!(
        store.receipt("acme", &receipt.id).await.unwrap(),
        Some(receipt.clone())
    );
    assert_eq!(store.receipt("globex", &receipt.id).await.unwrap(), None);
    let listed = store.receipts("acme", 100).await.unwrap();
    assert!(listed.iter().any(|r| r.id == receipt.id));
    // A redispatched call finalizes its receipt again: still one receipt in the listing.
    let again = done.renew(now_ms());
    let mut later = receipt.clone();
    later.attempt_count = 2;
    later.finalized_at_ms += 5;
    assert!(store.finalize(&k, &done, &again, &later).await.unwrap());
    let listed = store.receipts("acme", 1000).await.unwrap();
    assert_eq!(listed.iter().filter(|r| r.id == receipt.id).count(), 1);
    assert_eq!(
        store.receipt("acme", &receipt.id).await.unwrap(),
        Some(later)
    );
    // A stale finalize writes no receipt.
    let mut stale = receipt.clone();
    stale.id = format!("{}x", receipt.id);
    let stale_next = r.finalize(StoredOutcome {
        class: OutcomeClass::Accepted,
        vendor_status: Some(200),
        response: Ok(ResultJson::of(&serde_json::json!({}))),
    });
    assert!(!store.finalize(&k, &r, &stale_next, &stale).await.unwrap());
    assert_eq!(store.receipt("acme", &stale.id).await.unwrap(), None);
}

/// A result of a few MiB, which JSON escaping can grow several-fold (a control character
/// becomes six bytes), is recorded and read back whole: larger than the embedded store's
/// journal, which once refused it, and the call's outcome with it.
async fn a_large_result_is_stored_whole(store: &Store) {
    let (k, r) = (key(31), record());
    store.claim(&k, &r).await.unwrap();
    let text = "\u{1}".repeat(2 << 20);
    let done = r.finalize(StoredOutcome {
        class: OutcomeClass::Accepted,
        vendor_status: Some(200),
        response: Ok(ResultJson::of(&serde_json::json!({
            "content": [{"type": "text", "text": text}],
            "isError": false,
        }))),
    });
    let receipt = receipt(&r, &k);
    assert!(store.finalize(&k, &r, &done, &receipt).await.unwrap());
    assert_eq!(store.get(&k).await.unwrap(), Some(done));
    assert_eq!(
        store.receipt("acme", &receipt.id).await.unwrap(),
        Some(receipt)
    );
}

async fn concurrent_claims_have_one_winner(store: &Store) {
    let k = key(4);
    let r = record();
    let racers: Vec<_> = (0..50)
        .map(|_| {
            let (store, k, r) = (store.clone(), k.clone(), r.clone());
            tokio::spawn(async move { store.claim(&k, &r).await.unwrap() })
        })
        .collect();
    let mut winners = 0;
    for racer in racers {
        if racer.await.unwrap() == Claim::Acquired {
            winners += 1;
        }
    }
    assert_eq!(winners, 1);
}

async fn keys_are_independent(store: &Store) {
    let base = key(5);
    let r = record();
    assert_eq!(store.claim(&base, &r).await.unwrap(), Claim::Acquired);
    let mut other_workspace = base.clone();
    other_workspace.workspace = "globex".into();
    let mut other_tool = base.clone();
    other_tool.tool = "stripe.charges.list".into();
    let mut other_connection = base.clone();
    other_connection.connection = ConnectionSegment::Resolved("stripe-eu".into());
    let mut capability = base.clone();
    capability.connection = ConnectionSegment::Capability;
    for k in [other_workspace, other_tool, other_connection, capability] {
        assert_eq!(store.claim(&k, &r).await.unwrap(), Claim::Acquired, "{k:?}");
    }
}

/// One retention on both backends: run against a store built with a one-second retention.
/// Finalized claims, their receipts and expired tickets are gone once it has passed (Redis by
/// TTL, embedded by compaction); a pending ticket stays.
pub async fn retention_is_one_policy(store: &Store) {
    let k = key(40);
    // Its lease has ended: a finalized claim's retention counts from its last lease's end.
    let r = record_leased_until(now_ms().saturating_sub(1));
    store.claim(&k, &r).await.unwrap();
    let done = r.finalize(StoredOutcome {
        class: OutcomeClass::Accepted,
        vendor_status: Some(200),
        response: Ok(ResultJson::of(&serde_json::json!({}))),
    });
    let mut old_receipt = receipt(&done, &k);
    old_receipt.finalized_at_ms = now_ms();
    assert!(store.finalize(&k, &r, &done, &old_receipt).await.unwrap());
    let workspace = format!("retention{}", now_ms());
    let mut expired = ticket(&workspace, now_ms().saturating_sub(86_400_000));
    expired.expires_at_ms = now_ms();
    let pending = ticket(&workspace, now_ms());
    store.put_ticket(&expired).await.unwrap();
    store.put_ticket(&pending).await.unwrap();
    std::thread::sleep(std::time::Duration::from_millis(1500));
    store.compact(now_ms() + 1000).await.unwrap();
    assert_eq!(
        store.get(&k).await.unwrap(),
        None,
        "a finalized claim outlived the retention"
    );
    assert_eq!(store.receipt("acme", &old_receipt.id).await.unwrap(), None);
    assert!(
        !store
            .receipts("acme", 10_000)
            .await
            .unwrap()
            .iter()
            .any(|listed| listed.id == old_receipt.id)
    );
    assert_eq!(store.ticket(&expired.id).await.unwrap(), None);
    assert_eq!(store.ticket(&pending.id).await.unwrap(), Some(pending));
}

#[cfg(test)]
mod tests {
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_embedded_store_keeps_the_contract_and_survives_reopening() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("obol.redb");
        let store = super::Store::Embedded(super::EmbeddedStore::open(&path).unwrap());
        super::run(&store).await;
        super::run(&super::Store::Volatile(super::VolatileStore::default())).await;
        let k = super::key(7);
        let r = super::record();
        store.claim(&k, &r).await.unwrap();
        let syncs = store.syncs();
        assert!(syncs > 0);
        drop(store);
        // Durable: a new process (here: a new handle) sees the claim.
        std::thread::sleep(std::time::Duration::from_millis(50));
        let reopened = super::Store::Embedded(super::EmbeddedStore::open(&path).unwrap());
        assert_eq!(reopened.get(&k).await.unwrap(), Some(r));
        drop(reopened);
        let short = super::Store::Embedded(
            super::EmbeddedStore::open(&dir.path().join("short.redb"))
                .unwrap()
                .with_retention(std::time::Duration::from_secs(1)),
        );
        super::retention_is_one_policy(&short).await;
    }
}
