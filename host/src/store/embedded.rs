//! The embedded backend: one redb file, durable across restarts.
//!
//! Writes are group-committed by a leader: the writer that finds no commit under way makes
//! the queued operations, up to [`MAX_BATCH_BYTES`] of them, durable with one fsync of the
//! journal (`journal.rs`; a write larger than a whole half of it by a checkpoint), answers
//! them, then applies them to redb, on its own thread, then does the same for whatever queued
//! meanwhile (a blocking-pool thread takes over after two rounds). Each caller serialises its
//! own journal entry before queueing it, so the leader, whom every write waits for, only
//! joins them. Durability is never relaxed: a caller's write is acknowledged only after the
//! fsync that covers it, but concurrent callers share that fsync instead of paying one each,
//! and a lone write pays no thread hand-off (ADR-0049).
//!
//! Claims, transitions and refusals are answered before they are applied, from the claims
//! table and the writes before them in the batch, by the rule applying them follows
//! ([`decide`]); applying them must then give the same answers, or the store stops taking
//! writes. A caller that led its own write leaves the apply to its lane's next idle moment,
//! after its call has gone on to the vendor or its client; whatever the store does next
//! (answer another batch, commit for a reader, checkpoint, close) applies it first (ADR-0078).
//!
//! The batches are applied to one open redb transaction that is committed only when a reader
//! needs to see them, every few hundred writes, or at the next checkpoint, not once per
//! batch: a redb commit (a new
//! root for every table written, dirty pages written out) cost more than applying the writes
//! (ADR-0053). Readers ask the leader to commit it first (`Work::Publish`) whenever it holds
//! acknowledged writes, so every read sees every acknowledged write.
//!
//! A checkpoint (redb's durable commit, tens of milliseconds) runs on a thread of its own
//! while the leader goes on journaling: the journal is two halves of one file, and a
//! checkpoint switches halves as it begins. A batch journaled meanwhile is answered from the
//! claims the checkpoint began with and what the batches before it wrote, by the same rule
//! applying it uses, and is applied after the durable commit returns, a few batches a round
//! beside the new ones, which are answered so until none is left (ADR-0072). Work that
//! cannot be answered so ([`Work::answerable_during_checkpoint`]) waits for the commit to
//! return before it is queued, so that the writes queued after it go on.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use redb::{AccessGuard, Database, Durability, ReadableDatabase, ReadableTable, TableDefinition};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use tokio::sync::oneshot;

use super::journal::Journal;

use super::{
    Claim, ClaimKey, ClaimRecord, Receipt, RecordHead, Registry, RegistryWrite, StoreError,
};
use crate::approvals::{ApprovalId, Decided, Decision, Ticket, TicketStatus};

const CLAIMS: TableDefinition<&str, &[u8]> = TableDefinition::new("claims");
const RECEIPTS: TableDefinition<&str, &[u8]> = TableDefinition::new("receipts");
/// `{workspace}\0{finalized_at_ms:020}\0{id}` → (), for newest-first listing.
const RECEIPT_INDEX: TableDefinition<&str, ()> = TableDefinition::new("receipt_index");
const AUDIT: TableDefinition<u64, &[u8]> = TableDefinition::new("audit");
/// `{registry}\0{name}` → the record's JSON.
const REGISTRY: TableDefinition<&str, &str> = TableDefinition::new("registry");
const TICKETS: TableDefinition<&str, &[u8]> = TableDefinition::new("approval_tickets");
/// `{workspace}\0{created_at_ms:020}\0{id}` → (), for the inbox's newest-first listing.
const TICKET_INDEX: TableDefinition<&str, ()> = TableDefinition::new("approval_index");
/// Slot → lease end (ms) of every claim with an attempt reserved: what the sweeper reads to
/// find dead holders without walking every claim. Written as the claim's own transaction
/// commits, and only if the lease is still held then ([`Tables::close`]).
const LEASES: TableDefinition<&str, u64> = TableDefinition::new("leases");
/// `{since_ms:020}\0{kind}\0{key}` → (): when each removable record's retention started
/// (`c` a finalized claim by slot, `r` a receipt by `{workspace}\0{id}`, `t` a ticket by id),
/// so compaction reads a prefix of one table instead of walking everything.
const EXPIRY: TableDefinition<&str, ()> = TableDefinition::new("expiry");

/// `"applied"` → the last journal record a committed transaction holds. Written once, as the
/// pending transaction commits ([`Pending::commit`]), so it commits or is lost with the writes
/// it covers; per batch, only the last insert before a commit counted (two a call at c=1).
const JOURNAL_STATE: TableDefinition<&str, u64> = TableDefinition::new("journal_state");

/// The most of the file redb keeps in memory, unless `[store] cache_mib` says otherwise. The
/// RSS grows by up to this much while the file grows past it. 8 MiB holds the pages the
/// writes at the B-trees' ends keep touching: against 64 MiB it took 76-80 MiB off a loaded
/// gateway's RSS for the same rate with minted keys and 1.3-1.4 % less with scattered
/// client-chosen ones (ADR-0073).
pub const DEFAULT_CACHE_BYTES: usize = 8 << 20;

/// The most operations one group commit takes.
const MAX_BATCH: usize = 256;
/// The most journal bytes one group commit takes (a first write alone may be larger): a
/// quarter of a journal half, so that a batch always fits the half a checkpoint switches to.
const MAX_BATCH_BYTES: usize = JOURNAL_BYTES as usize / 4;
/// How many group commits a caller alone leads on its own thread before a blocking-pool
/// thread takes over the rest of the queue.
const INLINE_ROUNDS: usize = 2;
/// The size on disk of each of the journal's two halves; a checkpoint switches halves when the
/// active one is half full.
const JOURNAL_BYTES: u64 = 8 << 20;
/// Why the store refuses writes after a commit of the pending transaction began and never
/// returned (a panic inside it): what the transaction held is only in the journal.
const UNFINISHED_COMMIT: &str = "a commit of journaled writes did not finish";
/// How many writes the pending transaction holds before it is committed (without an fsync),
/// checked after each batch is applied, so it may hold up to `MAX_BATCH - 1` more: its dirty pages stay
/// in memory until then, about 5 KiB per call's writes.
const PUBLISH_AFTER: usize = 512;
/// The longest the journal goes without a checkpoint while writes arrive: what a restart may
/// have to apply again.
const CHECKPOINT_EVERY: std::time::Duration = std::time::Duration::from_secs(1);
/// How many of the batches a checkpoint deferred the leader applies a round once its commit
/// has returned, beside the round's own batch. Applied all at once, they held every write for
/// 1.8 ms p50 after each commit at c=32 (docs/performance-log.md); more than one a round, so the
/// backlog shrinks while writes keep arriving.
const DEFERRED_PER_ROUND: usize = 4;

#[derive(Clone)]
pub struct EmbeddedStore {
    inner: Arc<Owner>,
    retention: std::time::Duration,
}

/// What every handle of one store shares: the store, held strongly by the handles alone
/// (and by a blocking-pool leader while it leads). The last handle's drop closes the store
/// on its own thread, so the file can be opened again as soon as it returns: an apply left
/// for a lane's idle moment ([`Inner::apply_when_idle`]) holds the store only while it holds
/// [`Inner::idle`], which the drop waits for.
struct Owner(Option<Arc<Inner>>);

impl Owner {
    fn inner(&self) -> &Arc<Inner> {
        self.0.as_ref().expect("taken only by its drop")
    }
}

impl std::ops::Deref for Owner {
    type Target = Inner;

    fn deref(&self) -> &Inner {
        self.inner()
    }
}

impl Drop for Owner {
    fn drop(&mut self) {
        if let Some(inner) = self.0.take() {
            let idle = Arc::clone(&inner.idle);
            let _held = idle.lock().unwrap_or_else(PoisonError::into_inner);
            drop(inner);
        }
    }
}

impl std::fmt::Debug for EmbeddedStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmbeddedStore").finish_non_exhaustive()
    }
}

struct Inner {
    /// Shared with a checkpoint's thread.
    db: Arc<Database>,
    queue: Mutex<Queue>,
    /// Locked by the leader only, so never contended.
    writer: Mutex<Writer>,
    /// Whether the writer holds acknowledged writes that readers cannot see yet, applied to
    /// its pending transaction or not yet. Set before a journaled batch's callers are answered;
    /// cleared after the commit that covers it.
    unpublished: AtomicBool,
    syncs: AtomicU64,
    /// Callers waiting for an answer from [`EmbeddedStore::ask`].
    waiting: AtomicUsize,
    /// Shared with a checkpoint's thread.
    committing: Arc<Committing>,
    /// Held by an apply left for a lane's idle moment while it holds the store ([`Owner`]).
    idle: Arc<Mutex<()>>,
    /// Held by the next idle apply, once it holds the store, until the test sends or drops
    /// its end.
    #[cfg(test)]
    idle_gate: Mutex<Option<std::sync::mpsc::Receiver<()>>>,
}

/// Whether a checkpoint's durable commit is running. Work the leader could not answer while
/// it runs waits here before it is queued: queued, it would make the leader wait for the
/// commit, and every write queued behind it with the leader.
#[derive(Default)]
struct Committing {
    running: AtomicBool,
    returned: tokio::sync::Notify,
}

impl Committing {
    /// Marks a commit running until the returned guard is dropped, by its thread once the
    /// commit returns, or with the thread if it panics or cannot be spawned.
    fn begin(self: &Arc<Self>) -> CommitRunning {
        self.running.store(true, Ordering::Release);
        CommitRunning(Arc::clone(self))
    }

    /// Returns once the commit running now, if one is, has returned. Not until none runs:
    /// under steady writes the next may begin before this caller is polled again, and such a
    /// caller would wait checkpoint after checkpoint. One that slips into the next makes the
    /// leader wait for it, as it must.
    async fn returned(&self) {
        // Created before the check: `notify_waiters` wakes every `Notified` made before it,
        // polled or not, and nothing else wakes it.
        let returned = self.returned.notified();
        if self.running.load(Ordering::Acquire) {
            returned.await;
        }
    }
}

/// A running checkpoint's mark, cleared when dropped.
struct CommitRunning(Arc<Committing>);

impl Drop for CommitRunning {
    fn drop(&mut self) {
        self.0.running.store(false, Ordering::Release);
        self.0.returned.notify_waiters();
    }
}

/// What the leader keeps between group commits.
struct Writer {
    journals: Journals,
    /// The last journal record's sequence.
    sequence: u64,
    /// The last sequence made durable in redb itself (known once a running checkpoint is
    /// finished).
    checkpointed: u64,
    /// The checkpoint whose durable commit is running, or whose deferred batches are not all
    /// applied yet, if there is one.
    in_flight: Option<InFlight>,
    /// The last batch, when it was answered before it was applied (no checkpoint running): its
    /// callers go on while it is applied, by a blocking-pool leader right after answering, by
    /// a lane's idle moment after a caller led it ([`Inner::apply_when_idle`]), and in any
    /// case before anything else is answered, committed or checkpointed.
    unapplied: Option<Deferred>,
    last_checkpoint: std::time::Instant,
    /// Set when the journal failed and could not be started over, a journaled batch could
    /// not be answered or applied (or, applied after a checkpoint, got other answers than it
    /// was given), or a checkpoint's commit failed: the store refuses writes from then on,
    /// since what is on disk (or in `pending`) is no longer known.
    broken: Option<String>,
    /// The transaction every batch since the last commit was applied in.
    pending: Option<Pending>,
    /// The thread each batch was journaled on, for the tests of who commits.
    #[cfg(test)]
    journaled_on: Vec<std::thread::ThreadId>,
    /// Where the next batch panics, for the tests of the guards around applying and committing.
    #[cfg(test)]
    panic_at: Option<PanicAt>,
    /// Held by the next checkpoint's thread until the test sends or drops its end.
    #[cfg(test)]
    checkpoint_gate: Option<std::sync::mpsc::Receiver<()>>,
    /// Makes the leader begin a checkpoint after its next batch.
    #[cfg(test)]
    checkpoint_now: bool,
}

/// The journal's two halves, in one file (ADR-0072). Appends go to the active half. A
/// checkpoint switches halves as it begins, so what is journaled while its durable commit runs
/// lands in the half that commit does not cover; the other half is started over only at the
/// next switch, which waits for that commit to return.
struct Journals {
    halves: [Journal; 2],
    active: usize,
}

impl Journals {
    /// Opens both halves of `path`, with the records each holds (an earlier store's one
    /// journal is the first half, as it lies in the file).
    fn open(path: &Path) -> std::io::Result<(Journals, Vec<super::journal::Record>)> {
        let (first, mut records) = Journal::open_at(path, 0, JOURNAL_BYTES)?;
        let (second, more) = Journal::open_at(path, JOURNAL_BYTES, JOURNAL_BYTES)?;
        records.extend(more);
        records.sort_by_key(|record| record.sequence);
        let journals = Journals {
            halves: [first, second],
            active: 0,
        };
        Ok((journals, records))
    }

    fn active(&mut self) -> &mut Journal {
        &mut self.halves[self.active]
    }

    /// Starts the other half over and appends there from now on. Every record it held must be
    /// durable in redb.
    fn switch(&mut self) -> std::io::Result<()> {
        let other = 1 - self.active;
        self.halves[other].restart()?;
        self.active = other;
        Ok(())
    }

    /// Starts both halves over, once every record in them is durable in redb.
    fn restart(&mut self) -> std::io::Result<()> {
        self.halves[1 - self.active].restart()?;
        self.halves[self.active].restart()
    }
}

/// A checkpoint whose durable commit runs on its own thread, and the batches journaled since
/// it began: answered, and waiting to be applied once it returns (redb takes one write
/// transaction at a time). After it returns, the leader applies them a few a round
/// ([`DEFERRED_PER_ROUND`]) and goes on answering new batches as it did meanwhile, until none
/// is left; a batch it cannot answer so (a reader's, say) has them all applied first.
struct InFlight {
    /// The last record the commit makes durable in redb.
    through: u64,
    /// The durable commit's thread, until it has returned and been joined.
    commit: Option<std::thread::JoinHandle<Result<(), StoreError>>>,
    /// The claims table as the commit found it: every write through `through`.
    claims: redb::ReadOnlyTable<&'static str, &'static [u8]>,
    /// The record each claim or transition answered since wrote, by slot.
    written: HashMap<String, Vec<u8>>,
    /// Oldest first, as they were journaled and must be applied.
    deferred: VecDeque<Deferred>,
}

/// A batch journaled and answered before it was applied (during a checkpoint, or as the last
/// batch: [`Writer::unapplied`]), with the answers it was given, which applying it must give.
struct Deferred {
    sequence: u64,
    writes: Vec<Journaled>,
    answered: Vec<Result<Applied, StoreError>>,
}

impl InFlight {
    /// Answers a batch as applying it after the checkpoint will: each write's record read
    /// from what the batches before it wrote, or else from the claims the checkpoint began
    /// with, and [`decide`]d as [`apply`] decides.
    fn answer(
        &mut self,
        writes: &[&Journaled],
    ) -> Result<Vec<Result<Applied, StoreError>>, StoreError> {
        let InFlight {
            claims, written, ..
        } = self;
        answer_ahead(writes, written, |slot| claims.get(slot).map_err(failed))
    }
}

/// The records a batch answered before it is applied writes, by slot: what a later write to
/// the same slot is decided on. Kept across batches while a checkpoint runs ([`InFlight`]);
/// borrowed from the batch for [`Writer::unapplied`], which is applied before the next.
trait Written<'w> {
    fn record(&self, slot: &str) -> Option<&[u8]>;
    fn wrote(&mut self, slot: &'w str, record: &'w [u8]);
}

impl<'w> Written<'w> for HashMap<String, Vec<u8>> {
    fn record(&self, slot: &str) -> Option<&[u8]> {
        self.get(slot).map(Vec::as_slice)
    }

    fn wrote(&mut self, slot: &'w str, record: &'w [u8]) {
        self.insert(slot.to_owned(), record.to_vec());
    }
}

impl<'w> Written<'w> for HashMap<&'w str, &'w [u8]> {
    fn record(&self, slot: &str) -> Option<&[u8]> {
        self.get(slot).copied()
    }

    fn wrote(&mut self, slot: &'w str, record: &'w [u8]) {
        self.insert(slot, record);
    }
}

/// Answers a batch as applying it will: each write's record read from what the writes
/// before it wrote (`written`), or else from the claims table as `stored` finds it, and
/// [`decide`]d as [`apply`] decides.
fn answer_ahead<'w, 'g>(
    writes: &[&'w Journaled],
    written: &mut impl Written<'w>,
    mut stored: impl FnMut(&str) -> Result<Option<AccessGuard<'g, &'static [u8]>>, StoreError>,
) -> Result<Vec<Result<Applied, StoreError>>, StoreError> {
    let mut answers = Vec::with_capacity(writes.len());
    for journaled in writes {
        let write = &journaled.write;
        let decision = match write.slot() {
            None => decide(write, None),
            Some(slot) => match written.record(slot) {
                Some(record) => decide(write, Some(record)),
                None => decide(write, stored(slot)?.as_ref().map(AccessGuard::value)),
            },
        };
        answers.push(match decision {
            Verdict::Writes(answer, _) => {
                if let (Some(slot), Some(record)) = (write.slot(), write.record()) {
                    written.wrote(slot, record);
                }
                Ok(answer)
            }
            Verdict::Answers(answer) => answer,
        });
    }
    Ok(answers)
}

/// A step of a batch a test makes panic.
#[cfg(test)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PanicAt {
    /// After the batch is journaled, before it is applied.
    Apply,
    /// Inside the commit of the pending transaction.
    Publish,
}

#[cfg(test)]
impl Writer {
    fn panic_if_at(&mut self, step: PanicAt) {
        if self.panic_at.take_if(|at| *at == step).is_some() {
            panic!("a panic the test injected at {step:?}");
        }
    }
}

self_cell::self_cell!(
    /// A redb transaction and the tables its batches opened in it. The tables stay open until
    /// it commits: opening one costs about as much as a call's write to it, and a batch of one
    /// write opened five (ADR-0062).
    struct OpenTransaction {
        owner: redb::WriteTransaction,
        #[not_covariant]
        dependent: Tables,
    }
);

/// An open redb transaction holding journaled writes: seen by no reader until committed.
struct Pending {
    txn: OpenTransaction,
    /// How many writes it holds, to bound the dirty pages it keeps in memory.
    writes: usize,
    /// The last journal record applied in it (the writer's sequence), if any: a write too
    /// large for the journal is applied in a transaction of its own, which holds none.
    through: Option<u64>,
}

impl Pending {
    /// Commits it with `durability`, marked as holding every journal record through
    /// [`Pending::through`].
    fn commit(mut self, durability: Durability) -> Result<(), StoreError> {
        self.txn
            .with_dependent_mut(|_, tables| tables.close(self.through))?;
        let mut txn = self.txn.into_owner();
        txn.set_durability(durability).map_err(failed)?;
        txn.commit().map_err(failed)
    }
}

impl Pending {
    /// Answers a batch from the claims table as the transaction holds it, every batch before
    /// it applied.
    fn answer(
        &mut self,
        writes: &[&Journaled],
    ) -> Result<Vec<Result<Applied, StoreError>>, StoreError> {
        self.txn.with_dependent_mut(|_, tables| {
            let txn = tables.txn;
            let claims: &redb::Table<&str, &[u8]> = opened(&mut tables.claims, txn, CLAIMS)?;
            answer_ahead(writes, &mut HashMap::<&str, &[u8]>::new(), |slot| {
                claims.get(slot).map_err(failed)
            })
        })
    }
}

impl Writer {
    /// The pending transaction, begun if there is none.
    fn pending(&mut self, db: &Database) -> Result<&mut Pending, StoreError> {
        if self.pending.is_none() {
            let mut txn = db.begin_write().map_err(failed)?;
            // Durable in the journal already; redb's own fsync waits for the checkpoint.
            txn.set_durability(Durability::None).map_err(failed)?;
            self.pending = Some(Pending {
                txn: OpenTransaction::new(txn, |txn| Tables::of(txn)),
                writes: 0,
                through: None,
            });
        }
        Ok(self.pending.as_mut().expect("begun above"))
    }
}

/// Where a leader runs, which decides what it leaves to others.
#[derive(Clone, Copy)]
enum Seat {
    /// A caller's own thread (a lane's, in the gateway): it leads this many rounds, and
    /// leaves the apply of the last batch it answered to the lane's next idle moment.
    Caller(usize),
    /// A lane's idle moment, which applies what a caller left it, then leads what queued
    /// meanwhile as a caller would: this many rounds.
    Idle(usize),
    /// A blocking-pool thread, which leads until the queue is empty.
    Pool,
}

impl Seat {
    /// How many batches it leads before a blocking-pool thread takes over; without a bound
    /// on a blocking-pool thread.
    fn rounds(self) -> Option<usize> {
        match self {
            Seat::Caller(rounds) | Seat::Idle(rounds) => Some(rounds),
            Seat::Pool => None,
        }
    }
}

/// The writes waiting for a commit, and whether a leader is committing.
#[derive(Default)]
struct Queue {
    ops: Vec<Op>,
    leading: bool,
}

/// A write as it is journaled and applied: the caller's inputs and nothing else, so that
/// applying a journaled batch again after a crash computes what the first application did.
#[derive(Serialize, Deserialize)]
enum Write {
    Claim {
        slot: String,
        record: RecordJson,
        lease: Option<u64>,
    },
    Transition {
        slot: String,
        expected_version: u64,
        next_version: u64,
        next: RecordJson,
        lease: Option<u64>,
        /// When `next` is finalized: the time its retention counts from.
        finalized_since: Option<u64>,
        receipt: Option<Box<RenderedReceipt>>,
    },
    /// A receipt without a claim: a refused call.
    Refusal {
        receipt: Box<RenderedReceipt>,
    },
    PutTicket {
        ticket: Box<Ticket>,
    },
    DecideTicket {
        id: ApprovalId,
        decision: Decision,
        at_ms: u64,
    },
    /// Removes up to `limit` records whose retention started before `horizon_ms`.
    Compact {
        horizon_ms: u64,
        limit: usize,
    },
    Registry {
        key: String,
        value: String,
        mode: RegistryWrite,
    },
}

/// Where a write's answer goes.
enum Reply {
    Claim(oneshot::Sender<Result<Claim, StoreError>>),
    Done(oneshot::Sender<Result<bool, StoreError>>),
    Put(oneshot::Sender<Result<(), StoreError>>),
    Decided(oneshot::Sender<Result<Decided, StoreError>>),
    Compacted(oneshot::Sender<Result<usize, StoreError>>),
    Published(oneshot::Sender<Result<(), StoreError>>),
}

/// What a queued operation asks of the leader.
enum Work {
    Write(Box<Journaled>),
    /// Commit the pending transaction, so that a reader sees every acknowledged write.
    Publish,
}

/// A write with its journal entry rendered by its caller: the leader, which every write
/// waits for, joins the entries of a batch instead of serialising them.
struct Journaled {
    write: Write,
    entry: Vec<u8>,
}

impl Journaled {
    fn of(write: Write) -> Result<Journaled, StoreError> {
        let mut entry = Vec::with_capacity(write.rendered_len() + ENTRY_OVERHEAD);
        serde_json::to_writer(&mut entry, &write).map_err(failed)?;
        Ok(Journaled { write, entry })
    }
}

/// Room for a journal entry's own fields beside the JSON it carries already rendered: its
/// entry is then written in the one allocation, not regrown (and copied) as it fills.
const ENTRY_OVERHEAD: usize = 256;

impl Write {
    /// The claim a claim or a transition reads and writes.
    fn slot(&self) -> Option<&str> {
        match self {
            Write::Claim { slot, .. } | Write::Transition { slot, .. } => Some(slot.as_str()),
            _ => None,
        }
    }

    /// The record a claim or a transition writes, if [`decide`] lets it.
    fn record(&self) -> Option<&[u8]> {
        match self {
            Write::Claim { record, .. } => Some(record.bytes()),
            Write::Transition { next, .. } => Some(next.bytes()),
            _ => None,
        }
    }

    /// The bytes of the already rendered JSON this write carries (its record, its receipt).
    fn rendered_len(&self) -> usize {
        match self {
            Write::Claim { record, .. } => record.bytes().len(),
            Write::Transition { next, receipt, .. } => {
                next.bytes().len() + receipt.as_ref().map_or(0, |r| r.receipt.get().len())
            }
            Write::Refusal { receipt } => receipt.receipt.get().len(),
            _ => 0,
        }
    }
}

/// A claim record's JSON, as the claims table stores it. Journaled as itself rather than as
/// a string holding it, which escaped every quote again on the leader's path (ADR-0058);
/// journals written before that hold the string, and recovery reads both.
struct RecordJson(Box<RawValue>);

impl RecordJson {
    fn of(record: &ClaimRecord) -> Result<RecordJson, StoreError> {
        serde_json::value::to_raw_value(record)
            .map(RecordJson)
            .map_err(failed)
    }

    fn bytes(&self) -> &[u8] {
        self.0.get().as_bytes()
    }
}

impl Serialize for RecordJson {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for RecordJson {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        let raw = Box::<RawValue>::deserialize(deserializer)?;
        if !raw.get().starts_with('"') {
            return Ok(RecordJson(raw));
        }
        // The earlier journal format: the record as a JSON string.
        let text: String = serde_json::from_str(raw.get()).map_err(D::Error::custom)?;
        RawValue::from_string(text)
            .map(RecordJson)
            .map_err(D::Error::custom)
    }
}

/// A receipt as the receipts table and the audit log store it, and its keys: serialised once,
/// by its caller, and journaled as those same bytes (the JSON of the [`Receipt`], so recovery
/// reads it back as one and renders it again).
struct RenderedReceipt {
    /// `{workspace}\0{id}`, its key in the receipts table.
    id_key: String,
    finalized_at_ms: u64,
    receipt: Box<RawValue>,
    audit: Vec<u8>,
}

impl RenderedReceipt {
    fn of(receipt: &Receipt) -> Result<RenderedReceipt, StoreError> {
        Ok(RenderedReceipt {
            id_key: [receipt.workspace.as_str(), receipt.id.as_str()].join("\0"),
            finalized_at_ms: receipt.finalized_at_ms,
            receipt: serde_json::value::to_raw_value(receipt).map_err(failed)?,
            audit: serde_json::to_vec(&super::AuditEvent::of(receipt)).map_err(failed)?,
        })
    }
}

impl Serialize for RenderedReceipt {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.receipt.serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for RenderedReceipt {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        let receipt = Receipt::deserialize(deserializer)?;
        RenderedReceipt::of(&receipt).map_err(D::Error::custom)
    }
}

impl Work {
    fn write(write: Write) -> Result<Work, StoreError> {
        Journaled::of(write).map(|journaled| Work::Write(Box::new(journaled)))
    }

    /// A claim, a transition or a refusal, whose answer depends on the claims table alone.
    /// Anything else (a reader's publish, tickets, the registry, compaction) waits for a
    /// running checkpoint.
    fn answerable_during_checkpoint(&self) -> bool {
        matches!(
            self,
            Work::Write(journaled) if matches!(
                journaled.write,
                Write::Claim { .. } | Write::Transition { .. } | Write::Refusal { .. }
            )
        )
    }
}

/// A queued operation and its caller.
struct Op {
    work: Work,
    reply: Reply,
}

fn failed(error: impl std::fmt::Display) -> StoreError {
    StoreError(error.to_string())
}

impl EmbeddedStore {
    pub fn open(path: &Path) -> Result<EmbeddedStore, StoreError> {
        EmbeddedStore::open_with_cache(path, DEFAULT_CACHE_BYTES)
    }

    pub fn open_with_cache(path: &Path, cache_bytes: usize) -> Result<EmbeddedStore, StoreError> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(failed)?;
        }
        let db = redb::Builder::new()
            .set_cache_size(cache_bytes)
            .create(path)
            .map_err(|e| failed(format!("{}: {e}", path.display())))?;
        // Create the tables once so readers never race their creation.
        let txn = db.begin_write().map_err(failed)?;
        txn.open_table(CLAIMS).map_err(failed)?;
        txn.open_table(RECEIPTS).map_err(failed)?;
        txn.open_table(RECEIPT_INDEX).map_err(failed)?;
        txn.open_table(AUDIT).map_err(failed)?;
        txn.open_table(TICKETS).map_err(failed)?;
        txn.open_table(TICKET_INDEX).map_err(failed)?;
        txn.open_table(REGISTRY).map_err(failed)?;
        txn.open_table(LEASES).map_err(failed)?;
        txn.open_table(EXPIRY).map_err(failed)?;
        let applied = txn
            .open_table(JOURNAL_STATE)
            .map_err(failed)?
            .get("applied")
            .map_err(failed)?
            .map_or(0, |seq| seq.value());
        backfill_leases(&txn)?;
        backfill_expiry(&txn)?;
        txn.commit().map_err(failed)?;
        let writer = recover(&db, &journal_path(path), applied)?;
        Ok(EmbeddedStore {
            inner: Arc::new(Owner(Some(Arc::new(Inner {
                db: Arc::new(db),
                queue: Mutex::default(),
                writer: Mutex::new(writer),
                unpublished: AtomicBool::new(false),
                syncs: AtomicU64::new(0),
                waiting: AtomicUsize::new(0),
                committing: Arc::default(),
                idle: Arc::default(),
                #[cfg(test)]
                idle_gate: Mutex::default(),
            })))),
            retention: super::DEFAULT_RETENTION,
        })
    }

    pub async fn claim(&self, key: &ClaimKey, record: &ClaimRecord) -> Result<Claim, StoreError> {
        let lease = record.reserved_lease();
        self.ask(
            Work::write(Write::Claim {
                slot: key.slot(),
                record: RecordJson::of(record)?,
                lease,
            })?,
            Reply::Claim,
        )
        .await
    }

    pub async fn transition(
        &self,
        key: &ClaimKey,
        expected: &ClaimRecord,
        next: &ClaimRecord,
        receipt: Option<&Receipt>,
    ) -> Result<bool, StoreError> {
        let lease = next.reserved_lease();
        let finalized_since = matches!(next.state, super::ClaimState::Finalized { .. })
            .then_some(next.lease_until_ms);
        let next_version = next.version;
        let next = RecordJson::of(next)?;
        self.ask(
            Work::write(Write::Transition {
                slot: key.slot(),
                expected_version: expected.version,
                next_version,
                next,
                lease,
                finalized_since,
                receipt: receipt
                    .map(|receipt| RenderedReceipt::of(receipt).map(Box::new))
                    .transpose()?,
            })?,
            Reply::Done,
        )
        .await
    }

    pub async fn record_refusal(&self, receipt: &Receipt) -> Result<(), StoreError> {
        self.ask(
            Work::write(Write::Refusal {
                receipt: Box::new(RenderedReceipt::of(receipt)?),
            })?,
            Reply::Done,
        )
        .await
        .map(|_| ())
    }

    /// How long finalized claims, receipts, audit records and expired tickets are kept.
    pub fn with_retention(mut self, retention: std::time::Duration) -> EmbeddedStore {
        self.retention = retention;
        self
    }

    /// Removes what is past the retention, a small batch per group commit, so claims queued
    /// meanwhile are never held up for more than one batch.
    pub async fn compact(&self, now_ms: u64) -> Result<usize, StoreError> {
        const BATCH: usize = 500;
        let horizon_ms = now_ms.saturating_sub(self.retention.as_millis() as u64);
        let mut removed = 0;
        loop {
            let done = self
                .ask(
                    Work::write(Write::Compact {
                        horizon_ms,
                        limit: BATCH,
                    })?,
                    Reply::Compacted,
                )
                .await?;
            removed += done;
            if done < BATCH {
                return Ok(removed);
            }
        }
    }

    pub async fn put_ticket(&self, ticket: &Ticket) -> Result<(), StoreError> {
        // Already there (the common repeat): no write, no fsync.
        if self.ticket(&ticket.id).await?.is_some() {
            return Ok(());
        }
        self.ask(
            Work::write(Write::PutTicket {
                ticket: Box::new(ticket.clone()),
            })?,
            Reply::Put,
        )
        .await
    }

    pub async fn decide_ticket(
        &self,
        id: &ApprovalId,
        decision: Decision,
        at_ms: u64,
    ) -> Result<Decided, StoreError> {
        self.ask(
            Work::write(Write::DecideTicket {
                id: id.clone(),
                decision,
                at_ms,
            })?,
            Reply::Decided,
        )
        .await
    }

    pub async fn registry_write(
        &self,
        registry: Registry,
        name: &str,
        value: &str,
        mode: RegistryWrite,
    ) -> Result<bool, StoreError> {
        self.ask(
            Work::write(Write::Registry {
                key: format!("{}\0{name}", registry.as_str()),
                value: value.to_owned(),
                mode,
            })?,
            Reply::Done,
        )
        .await
    }

    pub async fn registry(
        &self,
        registry: Registry,
    ) -> Result<BTreeMap<String, String>, StoreError> {
        self.visible().await?;
        let txn = self.inner.db.begin_read().map_err(failed)?;
        let table = txn.open_table(REGISTRY).map_err(failed)?;
        let (start, end) = (
            format!("{}\0", registry.as_str()),
            format!("{}\u{1}", registry.as_str()),
        );
        let mut out = BTreeMap::new();
        for entry in table.range(start.as_str()..end.as_str()).map_err(failed)? {
            let (key, value) = entry.map_err(failed)?;
            let name = key.value()[start.len()..].to_owned();
            out.insert(name, value.value().to_owned());
        }
        Ok(out)
    }

    pub async fn ticket(&self, id: &ApprovalId) -> Result<Option<Ticket>, StoreError> {
        self.visible().await?;
        read_json(&self.inner.db, TICKETS, id.as_str())
    }

    pub async fn tickets(&self, workspace: &str, limit: usize) -> Result<Vec<Ticket>, StoreError> {
        self.visible().await?;
        newest(
            &self.inner.db,
            TICKET_INDEX,
            TICKETS,
            workspace,
            limit,
            |id| id.to_owned(),
        )
    }

    /// Queues an operation and waits for its answer, given after the commit that covers it.
    /// If no commit is under way, this caller leads. Alone (no other call waiting for the
    /// store), it commits the queue itself, on this thread: the fsync blocks the thread for its
    /// ~0.1 ms like any CPU work would, and nothing waits for a hand-off. Otherwise a
    /// blocking-pool thread commits (ADR-0059). A second writer meanwhile queues and waits
    /// without blocking. Work the leader cannot answer while a checkpoint's commit runs
    /// waits for it first ([`Committing`]).
    async fn ask<T>(
        &self,
        work: Work,
        reply: impl FnOnce(oneshot::Sender<Result<T, StoreError>>) -> Reply,
    ) -> Result<T, StoreError> {
        if !work.answerable_during_checkpoint() {
            self.inner.committing.returned().await;
        }
        let (sender, answer) = oneshot::channel();
        let _waiting = Waiting::count(&self.inner.waiting);
        let lead = {
            let mut queue = self.inner.lock();
            queue.ops.push(Op {
                work,
                reply: reply(sender),
            });
            !std::mem::replace(&mut queue.leading, true)
        };
        if lead {
            self.inner
                .inner()
                .lead(Seat::Caller(self.inner.inline_rounds()));
        }
        answer
            .await
            .map_err(|_| failed("the store's commit failed before it answered"))?
    }

    /// Makes every acknowledged write visible to readers: commits the pending transaction if
    /// it holds any. Every read starts here.
    async fn visible(&self) -> Result<(), StoreError> {
        // Acquire pairs with the leader's Release: a `false` read here comes after the commit
        // that covered every write answered before it.
        if !self.inner.unpublished.load(Ordering::Acquire) {
            return Ok(());
        }
        self.ask(Work::Publish, Reply::Published).await
    }

    /// Every slot matching `glob` (`store::glob_matches`).
    pub async fn slots_matching(&self, glob: &str) -> Result<Vec<String>, StoreError> {
        self.visible().await?;
        let txn = self.inner.db.begin_read().map_err(failed)?;
        let claims = txn.open_table(CLAIMS).map_err(failed)?;
        let mut out = Vec::new();
        for entry in claims.iter().map_err(failed)? {
            let (slot, _) = entry.map_err(failed)?;
            if super::glob_matches(glob, slot.value()) {
                out.push(slot.value().to_owned());
            }
        }
        Ok(out)
    }

    pub async fn holds_claims(&self) -> Result<bool, StoreError> {
        self.visible().await?;
        let txn = self.inner.db.begin_read().map_err(failed)?;
        let claims = txn.open_table(CLAIMS).map_err(failed)?;
        Ok(claims.first().map_err(failed)?.is_some())
    }

    pub async fn get(&self, key: &ClaimKey) -> Result<Option<ClaimRecord>, StoreError> {
        self.visible().await?;
        read_json(&self.inner.db, CLAIMS, &key.slot())
    }

    pub async fn expired_leases(
        &self,
        now_ms: u64,
        limit: usize,
    ) -> Result<Vec<(String, ClaimRecord)>, StoreError> {
        self.visible().await?;
        let txn = self.inner.db.begin_read().map_err(failed)?;
        let leases = txn.open_table(LEASES).map_err(failed)?;
        let claims = txn.open_table(CLAIMS).map_err(failed)?;
        let mut out = Vec::new();
        for entry in leases.iter().map_err(failed)? {
            let (slot, until) = entry.map_err(failed)?;
            if until.value() > now_ms {
                continue;
            }
            if let Some(bytes) = claims.get(slot.value()).map_err(failed)? {
                match serde_json::from_slice(bytes.value()) {
                    Ok(record) => out.push((slot.value().to_owned(), record)),
                    // One unreadable record must not stop the sweep of every other.
                    Err(error) => {
                        tracing::error!("the sweeper skips a claim that does not decode: {error}")
                    }
                }
            }
            if out.len() >= limit {
                break;
            }
        }
        Ok(out)
    }

    pub async fn receipt(&self, workspace: &str, id: &str) -> Result<Option<Receipt>, StoreError> {
        self.visible().await?;
        read_json(&self.inner.db, RECEIPTS, &format!("{workspace}\0{id}"))
    }

    pub async fn receipts(
        &self,
        workspace: &str,
        limit: usize,
    ) -> Result<Vec<Receipt>, StoreError> {
        self.visible().await?;
        newest(
            &self.inner.db,
            RECEIPT_INDEX,
            RECEIPTS,
            workspace,
            limit,
            |id| format!("{workspace}\0{id}"),
        )
    }

    pub fn syncs(&self) -> u64 {
        self.inner.syncs.load(Ordering::Relaxed)
    }
}

/// One JSON record by key.
fn read_json<T: serde::de::DeserializeOwned>(
    db: &Database,
    table: TableDefinition<&str, &[u8]>,
    key: &str,
) -> Result<Option<T>, StoreError> {
    let txn = db.begin_read().map_err(failed)?;
    let table = txn.open_table(table).map_err(failed)?;
    let found = table.get(key).map_err(failed)?;
    found
        .map(|bytes| serde_json::from_slice(bytes.value()).map_err(failed))
        .transpose()
}

/// The newest `limit` records of a workspace: walks `index` (`{workspace}\0{time}\0{id}`)
/// backwards and reads each id's record from `records` under `key_of(id)`.
fn newest<T: serde::de::DeserializeOwned>(
    db: &Database,
    index: TableDefinition<&str, ()>,
    records: TableDefinition<&str, &[u8]>,
    workspace: &str,
    limit: usize,
    key_of: impl Fn(&str) -> String,
) -> Result<Vec<T>, StoreError> {
    let txn = db.begin_read().map_err(failed)?;
    let index = txn.open_table(index).map_err(failed)?;
    let records = txn.open_table(records).map_err(failed)?;
    let (start, end) = (format!("{workspace}\0"), format!("{workspace}\u{1}"));
    let mut out = Vec::new();
    for entry in index
        .range(start.as_str()..end.as_str())
        .map_err(failed)?
        .rev()
        .take(limit)
    {
        let (key, _) = entry.map_err(failed)?;
        let id = key
            .value()
            .rsplit('\0')
            .next()
            .unwrap_or_default()
            .to_owned();
        if let Some(bytes) = records.get(key_of(&id).as_str()).map_err(failed)? {
            out.push(serde_json::from_slice(bytes.value()).map_err(failed)?);
        }
    }
    Ok(out)
}

/// Files written before the lease index existed: every reserved claim gets its entry, once
/// (a registry marker says it was done), so the sweeper finds their dead holders too.
fn backfill_leases(txn: &redb::WriteTransaction) -> Result<(), StoreError> {
    const MARKER: &str = "meta\0lease-index";
    let mut registry = txn.open_table(REGISTRY).map_err(failed)?;
    if registry.get(MARKER).map_err(failed)?.is_some() {
        return Ok(());
    }
    let claims = txn.open_table(CLAIMS).map_err(failed)?;
    let mut leases = txn.open_table(LEASES).map_err(failed)?;
    for entry in claims.iter().map_err(failed)? {
        let (slot, bytes) = entry.map_err(failed)?;
        if let Ok(record) = serde_json::from_slice::<ClaimRecord>(bytes.value())
            && let Some(until) = record.reserved_lease()
        {
            leases.insert(slot.value(), until).map_err(failed)?;
        }
    }
    registry.insert(MARKER, "done").map_err(failed)?;
    Ok(())
}

/// `{since_ms:020}\0{kind}\0{key}`, built in place: a call writes two, and `format!`'s
/// padded integer was most of their cost.
fn expiry_key(since_ms: u64, kind: char, key: &str) -> String {
    let mut expiry = String::with_capacity(PADDED + 2 + kind.len_utf8() + key.len());
    super::push_decimal(&mut expiry, since_ms, PADDED);
    expiry.push('\0');
    expiry.push(kind);
    expiry.push('\0');
    expiry.push_str(key);
    expiry
}

/// The digits of a time in a key, zero-padded so keys sort by it: every `u64` fits in twenty.
const PADDED: usize = 20;

/// The tables compaction removes from.
struct Removal<'a, 't> {
    expiry: &'a mut redb::Table<'t, &'static str, ()>,
    claims: &'a mut redb::Table<'t, &'static str, &'static [u8]>,
    receipts: &'a mut redb::Table<'t, &'static str, &'static [u8]>,
    index: &'a mut redb::Table<'t, &'static str, ()>,
    tickets: &'a mut redb::Table<'t, &'static str, &'static [u8]>,
    ticket_index: &'a mut redb::Table<'t, &'static str, ()>,
    audit: &'a mut redb::Table<'t, u64, &'static [u8]>,
}

/// An audit record's time, the one field compaction reads of it.
#[derive(Deserialize)]
struct AuditTime {
    at_ms: u64,
}

/// Removes up to `limit` records whose retention started before `horizon_ms`: finalized
/// claims, receipts (with their listing entry), expired tickets (with theirs) and audit
/// records. A claim that is no longer finalized, and a ticket still pending, stay.
fn compact(horizon_ms: u64, limit: usize, tables: &mut Removal) -> Result<usize, StoreError> {
    let end = format!("{horizon_ms:020}");
    let due: Vec<String> = tables
        .expiry
        .range(..end.as_str())
        .map_err(failed)?
        .take(limit)
        .map(|entry| entry.map(|(key, _)| key.value().to_owned()))
        .collect::<Result<_, _>>()
        .map_err(failed)?;
    let mut removed = 0;
    for entry in &due {
        tables.expiry.remove(entry.as_str()).map_err(failed)?;
        let mut parts = entry.splitn(3, '\0');
        let (Some(since), Some(kind), Some(key)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        match kind {
            "c" => {
                let finalized = tables
                    .claims
                    .get(key)
                    .map_err(failed)?
                    .and_then(|bytes| RecordHead::read(bytes.value()).ok())
                    .is_some_and(|head| head.is_finalized());
                if finalized {
                    tables.claims.remove(key).map_err(failed)?;
                }
            }
            "r" => {
                tables.receipts.remove(key).map_err(failed)?;
                if let Some((workspace, id)) = key.split_once('\0') {
                    let order = format!("{workspace}\0{since}\0{id}");
                    tables.index.remove(order.as_str()).map_err(failed)?;
                }
            }
            "t" => {
                let ticket = tables
                    .tickets
                    .get(key)
                    .map_err(failed)?
                    .and_then(|bytes| serde_json::from_slice::<Ticket>(bytes.value()).ok());
                if let Some(ticket) = ticket {
                    let order = format!(
                        "{}\0{:020}\0{}",
                        ticket.workspace, ticket.created_at_ms, ticket.id
                    );
                    tables.ticket_index.remove(order.as_str()).map_err(failed)?;
                }
                tables.tickets.remove(key).map_err(failed)?;
            }
            _ => continue,
        }
        removed += 1;
    }
    // Audit records are in write order: the oldest first, up to the batch size.
    let mut old_audit = Vec::new();
    for entry in tables.audit.iter().map_err(failed)?.take(limit) {
        let (seq, bytes) = entry.map_err(failed)?;
        let at_ms =
            serde_json::from_slice::<AuditTime>(bytes.value()).map_or(0, |event| event.at_ms);
        if at_ms >= horizon_ms {
            break;
        }
        old_audit.push(seq.value());
    }
    for seq in &old_audit {
        tables.audit.remove(*seq).map_err(failed)?;
    }
    Ok(removed + old_audit.len())
}

/// Files written before the expiry index existed: every finalized claim, receipt and ticket
/// gets its entry, once.
fn backfill_expiry(txn: &redb::WriteTransaction) -> Result<(), StoreError> {
    const MARKER: &str = "meta\0expiry-index";
    let mut registry = txn.open_table(REGISTRY).map_err(failed)?;
    if registry.get(MARKER).map_err(failed)?.is_some() {
        return Ok(());
    }
    let mut expiry = txn.open_table(EXPIRY).map_err(failed)?;
    let claims = txn.open_table(CLAIMS).map_err(failed)?;
    for entry in claims.iter().map_err(failed)? {
        let (slot, bytes) = entry.map_err(failed)?;
        if let Ok(head) = RecordHead::read(bytes.value())
            && head.is_finalized()
        {
            expiry
                .insert(
                    expiry_key(head.lease_until_ms, 'c', slot.value()).as_str(),
                    (),
                )
                .map_err(failed)?;
        }
    }
    let receipts = txn.open_table(RECEIPTS).map_err(failed)?;
    for entry in receipts.iter().map_err(failed)? {
        let (key, bytes) = entry.map_err(failed)?;
        if let Ok(receipt) = serde_json::from_slice::<Receipt>(bytes.value()) {
            expiry
                .insert(
                    expiry_key(receipt.finalized_at_ms, 'r', key.value()).as_str(),
                    (),
                )
                .map_err(failed)?;
        }
    }
    let tickets = txn.open_table(TICKETS).map_err(failed)?;
    for entry in tickets.iter().map_err(failed)? {
        let (id, bytes) = entry.map_err(failed)?;
        if let Ok(ticket) = serde_json::from_slice::<Ticket>(bytes.value()) {
            expiry
                .insert(
                    expiry_key(ticket.expires_at_ms, 't', id.value()).as_str(),
                    (),
                )
                .map_err(failed)?;
        }
    }
    registry.insert(MARKER, "done").map_err(failed)?;
    Ok(())
}

/// A stored claim that does not decode fails its own operation, never the batch.
fn undecodable(slot: &str, error: serde_json::Error) -> StoreError {
    tracing::error!(slot = %slot.chars().take(64).collect::<String>(), "a stored claim does not decode: {error}");
    failed(format!("a stored claim does not decode: {error}"))
}

/// One JSON record by key, inside a write transaction.
fn json_in<T: serde::de::DeserializeOwned>(
    table: &redb::Table<&str, &[u8]>,
    key: &str,
) -> Result<Option<T>, StoreError> {
    table
        .get(key)
        .map_err(failed)?
        .map(|bytes| serde_json::from_slice(bytes.value()).map_err(failed))
        .transpose()
}

/// A receipt's key in the listing index, `{workspace}\0{finalized_at_ms:020}\0{id}`, from
/// its key in the receipts table.
fn receipt_order(id_key: &str, finalized_at_ms: u64) -> String {
    let (workspace, id) = id_key.split_once('\0').unwrap_or((id_key, ""));
    let mut order = String::with_capacity(id_key.len() + PADDED + 2);
    order.push_str(workspace);
    order.push('\0');
    super::push_decimal(&mut order, finalized_at_ms, PADDED);
    order.push('\0');
    order.push_str(id);
    order
}

/// Stores a receipt, lists it (newest first) and appends its audit record.
fn write_receipt(tables: &mut Tables<'_>, receipt: &RenderedReceipt) -> Result<(), StoreError> {
    let Tables {
        txn,
        receipts,
        index,
        expiry,
        audit,
        next_audit,
        ..
    } = tables;
    let receipts = opened(receipts, txn, RECEIPTS)?;
    let index = opened(index, txn, RECEIPT_INDEX)?;
    let expiry = opened(expiry, txn, EXPIRY)?;
    let audit = opened(audit, txn, AUDIT)?;
    let id_key = &receipt.id_key;
    // A redispatched call finalizes its receipt again: keep one listing entry, at its newest
    // time. The insert hands back the receipt it replaces, so a first receipt (nearly every
    // one) costs one walk of the table, not a lookup and then an insert.
    let previous = receipts
        .insert(id_key.as_str(), receipt.receipt.get().as_bytes())
        .map_err(failed)?
        .map(|old| serde_json::from_slice::<Receipt>(old.value()));
    if let Some(Ok(previous)) = previous {
        index
            .remove(receipt_order(id_key, previous.finalized_at_ms).as_str())
            .map_err(failed)?;
        expiry
            .remove(expiry_key(previous.finalized_at_ms, 'r', id_key).as_str())
            .map_err(failed)?;
    }
    expiry
        .insert(
            expiry_key(receipt.finalized_at_ms, 'r', id_key).as_str(),
            (),
        )
        .map_err(failed)?;
    index
        .insert(receipt_order(id_key, receipt.finalized_at_ms).as_str(), ())
        .map_err(failed)?;
    let sequence = audit_sequence(audit, next_audit)?;
    audit
        .insert(*sequence, receipt.audit.as_slice())
        .map_err(failed)?;
    *sequence += 1;
    Ok(())
}

/// The tables a batch writes, each opened when a write first needs it. Opening a table looks
/// it up and, when it is dropped, writes its root back: a claim needs two of the nine, and at
/// c=1 a batch is one write, so opening all nine was 4 % of the gateway's CPU.
struct Tables<'t> {
    txn: &'t redb::WriteTransaction,
    claims: Option<redb::Table<'t, &'static str, &'static [u8]>>,
    receipts: Option<redb::Table<'t, &'static str, &'static [u8]>>,
    index: Option<redb::Table<'t, &'static str, ()>>,
    audit: Option<redb::Table<'t, u64, &'static [u8]>>,
    tickets: Option<redb::Table<'t, &'static str, &'static [u8]>>,
    ticket_index: Option<redb::Table<'t, &'static str, ()>>,
    registry: Option<redb::Table<'t, &'static str, &'static str>>,
    leases: Option<redb::Table<'t, &'static str, u64>>,
    expiry: Option<redb::Table<'t, &'static str, ()>>,
    journal_state: Option<redb::Table<'t, &'static str, u64>>,
    /// The next audit record's sequence, read from the table when a batch first writes one.
    next_audit: Option<u64>,
    /// The leases written since the transaction began, by slot: written to [`LEASES`] as it
    /// commits ([`Tables::close`]). A call's lease is taken at its claim and dropped at its
    /// finalize, most often within one transaction, and then never reaches the table: two of
    /// the twelve B-tree writes and reads a call made.
    held_leases: HashMap<String, HeldLease>,
}

/// A lease the pending transaction holds in memory, not yet in [`LEASES`].
struct HeldLease {
    until: u64,
    row: LeaseRow,
}

/// Whether [`LEASES`] may hold a row for the slot, written by an earlier transaction.
#[derive(Clone, Copy)]
enum LeaseRow {
    /// The slot was claimed in this transaction: it had no claim, so it had no lease.
    Absent,
    MayExist,
}

impl<'t> Tables<'t> {
    fn of(txn: &'t redb::WriteTransaction) -> Tables<'t> {
        Tables {
            txn,
            claims: None,
            receipts: None,
            index: None,
            audit: None,
            tickets: None,
            ticket_index: None,
            registry: None,
            leases: None,
            expiry: None,
            journal_state: None,
            next_audit: None,
            held_leases: HashMap::new(),
        }
    }

    /// The lease of a slot claimed in this transaction.
    fn lease_claimed(&mut self, slot: &str, until: u64) {
        let held = HeldLease {
            until,
            row: LeaseRow::Absent,
        };
        self.held_leases.insert(slot.to_owned(), held);
    }

    /// A transition's lease: renewed until `until`, or dropped with `None`.
    fn lease_moved(&mut self, slot: &str, until: Option<u64>) -> Result<(), StoreError> {
        match until {
            Some(until) => match self.held_leases.get_mut(slot) {
                Some(held) => held.until = until,
                None => {
                    let held = HeldLease {
                        until,
                        row: LeaseRow::MayExist,
                    };
                    self.held_leases.insert(slot.to_owned(), held);
                }
            },
            None => {
                let row = self
                    .held_leases
                    .remove(slot)
                    .map_or(LeaseRow::MayExist, |held| held.row);
                if let LeaseRow::MayExist = row {
                    opened(&mut self.leases, self.txn, LEASES)?
                        .remove(slot)
                        .map_err(failed)?;
                }
            }
        }
        Ok(())
    }

    /// Writes what the transaction holds in memory before it commits: the leases still held,
    /// and the last journal record it applied (`through`), so that the mark commits or is
    /// lost with the writes it covers.
    fn close(&mut self, through: Option<u64>) -> Result<(), StoreError> {
        if !self.held_leases.is_empty() {
            let leases = opened(&mut self.leases, self.txn, LEASES)?;
            for (slot, held) in self.held_leases.drain() {
                leases.insert(slot.as_str(), held.until).map_err(failed)?;
            }
        }
        if let Some(sequence) = through {
            opened(&mut self.journal_state, self.txn, JOURNAL_STATE)?
                .insert("applied", sequence)
                .map_err(failed)?;
        }
        Ok(())
    }
}

/// The sequence the next audit record takes: one past the newest, read once per batch.
fn audit_sequence<'n>(
    audit: &redb::Table<'_, u64, &'static [u8]>,
    next: &'n mut Option<u64>,
) -> Result<&'n mut u64, StoreError> {
    if next.is_none() {
        let newest = audit.last().map_err(failed)?.map(|(seq, _)| seq.value());
        *next = Some(newest.map_or(0, |seq| seq + 1));
    }
    Ok(next.as_mut().expect("read above"))
}

/// The table in `slot`, opened in `txn` if it is not yet.
fn opened<'s, 't, K: redb::Key + 'static, V: redb::Value + 'static>(
    slot: &'s mut Option<redb::Table<'t, K, V>>,
    txn: &'t redb::WriteTransaction,
    definition: TableDefinition<K, V>,
) -> Result<&'s mut redb::Table<'t, K, V>, StoreError> {
    if slot.is_none() {
        *slot = Some(txn.open_table(definition).map_err(failed)?);
    }
    Ok(slot.as_mut().expect("opened above"))
}

impl Inner {
    /// How many rounds a leader on a lane leads before a blocking-pool thread takes over:
    /// [`INLINE_ROUNDS`] with one call waiting for the store, none with more, since an fsync
    /// on the lane would hold every call it serves (at c=32 that cost 8-16 % of the embedded
    /// store's calls per second).
    fn inline_rounds(&self) -> usize {
        if self.waiting.load(Ordering::Relaxed) > 1 {
            0
        } else {
            INLINE_ROUNDS
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Queue> {
        // The queue is a list and a flag, consistent after every statement: a panic elsewhere
        // while it was held leaves nothing half-written.
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The leader's loop: batch, journal once (one fsync), answer everyone in the batch, apply
    /// it; again until the queue is empty, then step down. A caller leads at most `rounds`
    /// batches on its own thread ([`INLINE_ROUNDS`] when alone, none when other calls wait):
    /// if writes keep arriving, a blocking-pool thread takes over, so neither the caller nor
    /// its lane waits behind other calls' writes for long. A caller's thread leaves the apply
    /// of the last batch it answered to its lane's next idle moment, so that its own call goes
    /// on first.
    fn lead(self: &Arc<Self>, seat: Seat) {
        let leadership = Leadership(self);
        let mut writer = self.writer.lock().unwrap_or_else(PoisonError::into_inner);
        let mut done = 0;
        loop {
            let batch: Vec<Op> = {
                let mut queue = self.lock();
                if queue.ops.is_empty() {
                    if writer.unapplied.is_some() {
                        if let Seat::Caller(_) = seat
                            && let Ok(runtime) = tokio::runtime::Handle::try_current()
                        {
                            queue.leading = false;
                            drop(queue);
                            drop(writer);
                            std::mem::forget(leadership);
                            let (inner, idle) = (Arc::downgrade(self), Arc::clone(&self.idle));
                            runtime.spawn(async move {
                                // Behind what the caller's call wakes as it goes on (its
                                // request to the vendor, its answer to the client).
                                tokio::task::yield_now().await;
                                // Held elsewhere: another lane's idle moment, which leads or
                                // finds a leader that applies it first, or the store closing.
                                let _held = match idle.try_lock() {
                                    Ok(held) => held,
                                    Err(std::sync::TryLockError::Poisoned(held)) => {
                                        held.into_inner()
                                    }
                                    Err(std::sync::TryLockError::WouldBlock) => return,
                                };
                                if let Some(inner) = inner.upgrade() {
                                    inner.apply_when_idle();
                                }
                            });
                            return;
                        }
                        drop(queue);
                        // A failure leaves the store broken; the next write says so.
                        let _ = self.apply_unapplied(&mut writer);
                        let _ = self.tend_checkpoint(&mut writer);
                        continue;
                    }
                    queue.leading = false;
                    std::mem::forget(leadership);
                    return;
                }
                if seat.rounds().is_some_and(|rounds| done >= rounds)
                    && let Ok(runtime) = tokio::runtime::Handle::try_current()
                {
                    // Still leading: the blocking thread carries on where this one stops.
                    drop(queue);
                    drop(writer);
                    std::mem::forget(leadership);
                    let inner = Arc::clone(self);
                    runtime.spawn_blocking(move || inner.lead(Seat::Pool));
                    return;
                }
                let take = batch_len(&queue.ops);
                queue.ops.drain(..take).collect()
            };
            done += 1;
            let (works, replies): (Vec<Work>, Vec<Reply>) =
                batch.into_iter().map(|op| (op.work, op.reply)).unzip();
            match self.commit(&mut writer, works) {
                Ok(results) => {
                    for (reply, result) in replies.into_iter().zip(results) {
                        answer(reply, result);
                    }
                }
                // Refused before anything was journaled, or journaled and then not applied or
                // committed (then the store is broken and says so; see `commit`).
                Err(error) => {
                    for reply in replies {
                        answer(reply, Err(error.clone()));
                    }
                }
            }
            // A failure leaves the store broken; the next write says so. A caller leaves the
            // apply to its lane's idle moment unless a checkpoint is due, which needs it first.
            if matches!(seat, Seat::Pool)
                || (writer.unapplied.is_some() && checkpoint_due(&mut writer))
            {
                let _ = self.apply_unapplied(&mut writer);
            }
            if writer.unapplied.is_none() {
                let _ = self.tend_checkpoint(&mut writer);
            }
        }
    }

    /// Applies the batch a caller answered and left for its lane's idle moment, unless a
    /// leader since has (each applies it before its own batch), then leads what queued
    /// meanwhile as a caller would: on the lane when one call waits, else from a
    /// blocking-pool thread. (Handed to one, the store would outlive a drop of its last
    /// handle while that thread finished.)
    fn apply_when_idle(self: &Arc<Self>) {
        #[cfg(test)]
        if let Some(gate) = self.idle_gate.lock().unwrap().take() {
            let _ = gate.recv();
        }
        let lead = !std::mem::replace(&mut self.lock().leading, true);
        if lead {
            self.lead(Seat::Idle(self.inline_rounds()));
        }
    }

    /// Applies [`Writer::unapplied`], if there is one, and commits the pending transaction
    /// once it holds [`PUBLISH_AFTER`] writes. A failure leaves the store refusing writes.
    fn apply_unapplied(&self, writer: &mut Writer) -> Result<(), StoreError> {
        if let Some(batch) = writer.unapplied.take() {
            apply_batch(&self.db, writer, batch)?;
            if writer
                .pending
                .as_ref()
                .is_some_and(|pending| pending.writes >= PUBLISH_AFTER)
            {
                self.publish(writer)?;
            }
        }
        Ok(())
    }

    /// Applies a few of the batches deferred by a checkpoint whose commit has returned (ending
    /// it once none is left), and begins one when the active half of the journal is half full
    /// or the last one is [`CHECKPOINT_EVERY`] old.
    fn tend_checkpoint(&self, writer: &mut Writer) -> Result<(), StoreError> {
        if writer.broken.is_some() {
            return Ok(());
        }
        if let Some(in_flight) = &writer.in_flight {
            if in_flight
                .commit
                .as_ref()
                .is_some_and(|commit| !commit.is_finished())
            {
                return Ok(());
            }
            apply_deferred(&self.db, writer, DEFERRED_PER_ROUND)?;
            if writer.in_flight.is_some() {
                // The next begins once this one's batches are all applied.
                return Ok(());
            }
        }
        if checkpoint_due(writer) {
            #[cfg(test)]
            {
                writer.checkpoint_now = false;
            }
            self.begin_checkpoint(writer)?;
        }
        Ok(())
    }

    /// Applies the last batch if it is still unapplied, journals this batch's writes (one
    /// fsync), then answers a batch of claims, transitions and refusals from the claims table
    /// and keeps it to be applied once its callers have their answers: as
    /// [`Writer::unapplied`], or while a checkpoint runs or its deferred batches wait, after
    /// them ([`InFlight`]). Any other batch is applied to the pending transaction before it
    /// is answered (during a checkpoint, after waiting for its commit and applying what it
    /// deferred), which is then committed, without an fsync, if a reader in the batch asked to
    /// see its writes or it holds [`PUBLISH_AFTER`] writes.
    fn commit(
        &self,
        writer: &mut Writer,
        works: Vec<Work>,
    ) -> Result<Vec<Result<Applied, StoreError>>, StoreError> {
        if let Some(why) = &writer.broken {
            return Err(failed(format!(
                "the store's journal failed ({why}); restart the gateway"
            )));
        }
        self.apply_unapplied(writer)?;
        let answerable = works.iter().all(Work::answerable_during_checkpoint);
        if writer.in_flight.is_some() && !answerable {
            finish_checkpoint(&self.db, writer)?;
        }
        let publish = works.iter().any(|work| matches!(work, Work::Publish));
        let writes: Vec<&Journaled> = works
            .iter()
            .filter_map(|work| match work {
                Work::Write(journaled) => Some(journaled.as_ref()),
                Work::Publish => None,
            })
            .collect();
        let mut applied = Vec::new().into_iter();
        if !writes.is_empty() {
            let payload = journal_payload(&writes);
            if !writer.journals.active().holds(payload.len()) {
                // Larger than a whole half (one write: a batch is bounded below it).
                self.checkpoint(writer)?;
                let applied = self.commit_durably(writer, writes)?;
                return Ok(answers(&works, applied.into_iter()));
            }
            if !writer.journals.active().fits(payload.len()) {
                // Make room: a checkpoint switches to the other half, which the one before it
                // made redundant (waited for first, if it still runs). A batch that cannot be
                // answered meanwhile waits for this one too.
                if answerable {
                    finish_checkpoint(&self.db, writer)?;
                    self.begin_checkpoint(writer)?;
                } else {
                    self.checkpoint(writer)?;
                }
            }
            let sequence = writer.sequence + 1;
            if let Err(error) = writer.journals.active().append(sequence, &payload) {
                // The record may be on disk in part or whole: start a new generation so it is
                // never applied, after making everything before it durable in redb.
                if let Err(again) = self.checkpoint(writer) {
                    writer.broken = Some(format!("{error}; then {again}"));
                }
                return Err(failed(format!("the store's journal: {error}")));
            }
            self.syncs.fetch_add(1, Ordering::Relaxed);
            #[cfg(test)]
            writer.journaled_on.push(std::thread::current().id());
            writer.sequence = sequence;
            // Journaled: from here the batch must reach redb or the store must stop, since a
            // later commit of the pending transaction would mark it, or a later record, applied.
            // Armed before, and disarmed after, so that a panic while answering or applying it
            // leaves the store refusing writes.
            writer.broken = Some("a journaled batch was not applied".into());
            #[cfg(test)]
            writer.panic_if_at(PanicAt::Apply);
            // Claims, transitions and refusals are answered now, from the claims table, and
            // applied once their callers have their answers: during a checkpoint after it
            // ([`InFlight`]), else right after ([`Writer::unapplied`]). An answer that cannot
            // be read leaves the store refusing writes, as an apply that fails does.
            let answered = match writer.in_flight.as_mut() {
                Some(in_flight) => Some(in_flight.answer(&writes)),
                None if answerable => Some(
                    writer
                        .pending(&self.db)
                        .and_then(|pending| pending.answer(&writes)),
                ),
                None => None,
            };
            match answered {
                None => {}
                Some(Err(error)) => {
                    writer.broken = Some(error.to_string());
                    return Err(failed(format!(
                        "the store journaled a write but could not answer it ({error}); restart the gateway"
                    )));
                }
                Some(Ok(answered)) => {
                    drop(writes);
                    let batch = Deferred {
                        sequence,
                        writes: works
                            .into_iter()
                            .filter_map(|work| match work {
                                // Its entry is on disk: only the write is applied.
                                Work::Write(journaled) => Some(Journaled {
                                    entry: Vec::new(),
                                    ..*journaled
                                }),
                                Work::Publish => None,
                            })
                            .collect(),
                        answered: answered.clone(),
                    };
                    match writer.in_flight.as_mut() {
                        Some(in_flight) => in_flight.deferred.push_back(batch),
                        None => writer.unapplied = Some(batch),
                    }
                    writer.broken = None;
                    // Before the answers: a reader they reach asks for the batch first.
                    self.unpublished.store(true, Ordering::Release);
                    return Ok(answered);
                }
            }
            let pending = writer.pending(&self.db)?;
            pending.writes += writes.len();
            let results = pending
                .txn
                .with_dependent_mut(|_, tables| apply(tables, writes.into_iter()));
            match results {
                Ok(results) => {
                    pending.through = Some(sequence);
                    writer.broken = None;
                    applied = results.into_iter();
                }
                Err(error) => {
                    writer.pending = None;
                    writer.broken = Some(error.to_string());
                    return Err(failed(format!(
                        "the store journaled a write but could not apply it ({error}); restart the gateway"
                    )));
                }
            }
            self.unpublished.store(true, Ordering::Release);
        }
        let full = writer
            .pending
            .as_ref()
            .is_some_and(|pending| pending.writes >= PUBLISH_AFTER);
        if full || publish {
            self.publish(writer)?;
        }
        Ok(answers(&works, applied))
    }

    /// Applies writes the journal cannot hold and makes them durable in redb itself, by a
    /// durable commit of their own (a few fsyncs, where the journal's append is one; other
    /// writes wait meanwhile). Called right after a checkpoint: nothing is pending, and the
    /// journal, started over, holds nothing a crash would apply again.
    fn commit_durably(
        &self,
        writer: &mut Writer,
        writes: Vec<&Journaled>,
    ) -> Result<Vec<Result<Applied, StoreError>>, StoreError> {
        debug_assert!(writer.pending.is_none(), "a checkpoint came just before");
        writer.pending(&self.db)?;
        // Armed while applying and committing, as for a journaled batch: a panic part-way
        // leaves a transaction that holds part of it.
        writer.broken = Some(UNFINISHED_COMMIT.into());
        let mut pending = writer.pending.take().expect("begun above");
        let results = pending
            .txn
            .with_dependent_mut(|_, tables| apply(tables, writes.into_iter()));
        let results = match results {
            Ok(results) => results,
            // Nothing of it was journaled, committed or answered, and everything before it
            // is durable: dropping the transaction loses nothing acknowledged.
            Err(error) => {
                writer.broken = None;
                return Err(error);
            }
        };
        self.syncs.fetch_add(1, Ordering::Relaxed);
        if let Err(StoreError(error)) = pending.commit(Durability::Immediate) {
            // A failed durable commit may have reached the disk in part or whole: what it
            // held is unknown to this process, so the store stops taking writes.
            writer.broken = Some(error.clone());
            return Err(failed(format!(
                "the store could not commit a write too large for its journal ({error}); restart the gateway"
            )));
        }
        writer.broken = None;
        Ok(results)
    }

    /// Commits the pending transaction without an fsync: its writes are in the journal.
    fn publish(&self, writer: &mut Writer) -> Result<(), StoreError> {
        apply_answered(&self.db, writer)?;
        if let Some(pending) = writer.pending.take() {
            // Armed until the commit returns, as around an apply: a panic inside it would
            // otherwise let the next batch begin from a state without these writes.
            writer.broken = Some(UNFINISHED_COMMIT.into());
            #[cfg(test)]
            writer.panic_if_at(PanicAt::Publish);
            if let Err(StoreError(error)) = pending.commit(Durability::None) {
                // Journaled but not in redb: the outcome of what it held is unknown to this
                // process (a restart would apply it, a checkpoint would drop it), so the
                // store stops taking writes and its callers fail closed.
                writer.broken = Some(error.clone());
                return Err(failed(format!(
                    "the store journaled writes but could not commit them ({error}); restart the gateway"
                )));
            }
            writer.broken = None;
        }
        self.unpublished.store(false, Ordering::Release);
        Ok(())
    }

    /// Begins a checkpoint, after the running one: commits what is pending (marked applied
    /// through the last record), switches the journal's halves, and leaves redb's durable
    /// commit to a thread of its own, where it makes every write so far durable while the
    /// leader goes on ([`InFlight`]). A failure leaves the store refusing writes.
    fn begin_checkpoint(&self, writer: &mut Writer) -> Result<(), StoreError> {
        // One at a time: a second would drop the batches the first deferred.
        finish_checkpoint(&self.db, writer)?;
        self.publish(writer)?;
        let claims = match self.db.begin_read() {
            Ok(txn) => txn.open_table(CLAIMS).map_err(failed),
            Err(error) => Err(failed(error)),
        };
        let begun = claims.and_then(|claims| {
            writer.journals.switch().map_err(failed)?;
            Ok(claims)
        });
        let claims = match begun {
            Ok(claims) => claims,
            Err(error) => {
                writer.broken = Some(error.to_string());
                return Err(error);
            }
        };
        self.syncs.fetch_add(1, Ordering::Relaxed);
        let db = Arc::clone(&self.db);
        #[cfg(test)]
        let gate = writer.checkpoint_gate.take();
        let running = self.committing.begin();
        let spawned = std::thread::Builder::new()
            .name("obol-checkpoint".into())
            .spawn(move || {
                let _running = running;
                #[cfg(test)]
                if let Some(gate) = gate {
                    let _ = gate.recv();
                }
                durable_commit(&db)
            });
        match spawned {
            Ok(commit) => {
                writer.in_flight = Some(InFlight {
                    through: writer.sequence,
                    commit: Some(commit),
                    claims,
                    written: HashMap::new(),
                    deferred: VecDeque::new(),
                });
            }
            // No thread to be had: the commit runs here, and writes wait for it.
            Err(_) => {
                if let Err(error) = durable_commit(&self.db) {
                    writer.broken = Some(error.to_string());
                    return Err(error);
                }
                writer.checkpointed = writer.sequence;
                writer.last_checkpoint = std::time::Instant::now();
            }
        }
        Ok(())
    }

    /// A checkpoint here and now, after the running one: every write durable in redb, both
    /// halves of the journal started over. A failure leaves the store refusing writes: it may
    /// have dropped the pending transaction, whose writes only the journal then holds.
    fn checkpoint(&self, writer: &mut Writer) -> Result<(), StoreError> {
        self.syncs.fetch_add(1, Ordering::Relaxed);
        match checkpoint(&self.db, writer) {
            Ok(()) => {
                self.unpublished.store(false, Ordering::Release);
                Ok(())
            }
            Err(error) => {
                writer.broken = Some(error.to_string());
                Err(error)
            }
        }
    }
}

impl Drop for Inner {
    /// Waits for a running checkpoint and commits what is pending, so that redb's close
    /// makes it durable, as it does every non-durable commit: a clean shutdown leaves nothing
    /// for the journal to apply again.
    fn drop(&mut self) {
        let writer = self
            .writer
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner);
        if writer.broken.is_some() {
            // Its thread holds the database open: joined, so a reopen finds it closed.
            if let Some(commit) = writer
                .in_flight
                .take()
                .and_then(|in_flight| in_flight.commit)
            {
                let _ = commit.join();
            }
            return;
        }
        let closed =
            finish_checkpoint(&self.db, writer).and_then(|()| match writer.pending.take() {
                Some(pending) => pending.commit(Durability::None),
                None => Ok(()),
            });
        if let Err(error) = closed {
            tracing::error!("the store could not commit its last writes at close: {error}");
        }
    }
}

/// How many of the queue's first operations the next group commit takes: at most
/// [`MAX_BATCH`], and no write past [`MAX_BATCH_BYTES`] of journal entries unless it is
/// the first.
fn batch_len(ops: &[Op]) -> usize {
    let mut bytes = 0;
    let mut take = 0;
    for op in ops.iter().take(MAX_BATCH) {
        if let Work::Write(journaled) = &op.work {
            bytes += journaled.entry.len() + 1;
            if take > 0 && bytes > MAX_BATCH_BYTES {
                break;
            }
        }
        take += 1;
    }
    take
}

/// Each operation's answer, in the batch's order: a write's from `applied`, in turn.
fn answers(
    works: &[Work],
    mut applied: impl Iterator<Item = Result<Applied, StoreError>>,
) -> Vec<Result<Applied, StoreError>> {
    works
        .iter()
        .map(|work| match work {
            Work::Write(_) => applied
                .next()
                .unwrap_or_else(|| Err(failed("a write without a result"))),
            Work::Publish => Ok(Applied::Published),
        })
        .collect()
}

/// A batch's journal record: its writes as one JSON array, the bytes `serde_json::to_vec`
/// of the `Vec<Write>` would give (recovery reads it back as one).
fn journal_payload(writes: &[&Journaled]) -> Vec<u8> {
    let length = writes.iter().map(|j| j.entry.len() + 1).sum::<usize>() + 1;
    let mut payload = Vec::with_capacity(length);
    payload.push(b'[');
    for (i, journaled) in writes.iter().enumerate() {
        if i > 0 {
            payload.push(b',');
        }
        payload.extend_from_slice(&journaled.entry);
    }
    payload.push(b']');
    payload
}

/// `<store file>.journal`, beside the redb file.
fn journal_path(path: &Path) -> std::path::PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(".journal");
    name.into()
}

/// Makes every write applied so far durable in redb itself (after the running checkpoint,
/// and the batches it deferred), then starts both halves of the journal over.
fn checkpoint(db: &Database, writer: &mut Writer) -> Result<(), StoreError> {
    finish_checkpoint(db, writer)?;
    // Armed until the commit returns (see `Inner::publish`); a failure leaves it set.
    let before = writer.broken.replace(UNFINISHED_COMMIT.into());
    match writer.pending.take() {
        Some(pending) => pending.commit(Durability::Immediate)?,
        None => durable_commit(db)?,
    }
    writer.broken = before;
    writer.journals.restart().map_err(failed)?;
    writer.checkpointed = writer.sequence;
    writer.last_checkpoint = std::time::Instant::now();
    Ok(())
}

/// A durable commit of nothing: it persists the non-durable commits before it. Without a
/// pending transaction, the last commit marked everything journaled so far.
fn durable_commit(db: &Database) -> Result<(), StoreError> {
    let txn = db.begin_write().map_err(failed)?;
    txn.commit().map_err(failed)
}

/// Applies the last batch if it was answered before it was applied, then waits for the
/// running checkpoint's durable commit, if there is one, and applies every batch it deferred,
/// in order (there is never both).
fn finish_checkpoint(db: &Database, writer: &mut Writer) -> Result<(), StoreError> {
    apply_answered(db, writer)?;
    apply_deferred(db, writer, usize::MAX)
}

/// Whether the next checkpoint is due: the active half of the journal is half full, or the
/// last checkpoint is [`CHECKPOINT_EVERY`] old and writes came since.
fn checkpoint_due(writer: &mut Writer) -> bool {
    #[cfg(test)]
    if writer.checkpoint_now {
        return true;
    }
    writer.journals.active().wants_checkpoint()
        || (writer.sequence > writer.checkpointed
            && writer.last_checkpoint.elapsed() >= CHECKPOINT_EVERY)
}

/// Applies [`Writer::unapplied`], if there is one.
fn apply_answered(db: &Database, writer: &mut Writer) -> Result<(), StoreError> {
    match writer.unapplied.take() {
        Some(batch) => apply_batch(db, writer, batch),
        None => Ok(()),
    }
}

/// Waits for the running checkpoint's durable commit, if it has not been joined yet, then
/// applies up to `most` of the batches it deferred, oldest first, to the pending transaction,
/// each of which must give the answers it was given; the checkpoint ends with its last batch.
/// A failure leaves the store refusing writes; its journal holds them.
fn apply_deferred(db: &Database, writer: &mut Writer, most: usize) -> Result<(), StoreError> {
    let Some(in_flight) = writer.in_flight.as_mut() else {
        return Ok(());
    };
    if let Some(commit) = in_flight.commit.take() {
        let through = in_flight.through;
        let committed = commit
            .join()
            .unwrap_or_else(|_| Err(failed("its thread panicked")));
        if let Err(error) = committed {
            writer.in_flight = None;
            writer.broken = Some(error.to_string());
            return Err(failed(format!(
                "the store's checkpoint failed ({error}); restart the gateway"
            )));
        }
        writer.checkpointed = through;
        writer.last_checkpoint = std::time::Instant::now();
    }
    for _ in 0..most {
        let Some(batch) = writer
            .in_flight
            .as_mut()
            .and_then(|in_flight| in_flight.deferred.pop_front())
        else {
            break;
        };
        if let Err(error) = apply_batch(db, writer, batch) {
            writer.in_flight = None;
            return Err(error);
        }
    }
    if writer
        .in_flight
        .as_ref()
        .is_some_and(|in_flight| in_flight.deferred.is_empty())
    {
        writer.in_flight = None;
    }
    Ok(())
}

/// Applies a batch answered before it was applied to the pending transaction, which must
/// give the answers it was given. A failure leaves the store refusing writes; its journal
/// holds them.
fn apply_batch(db: &Database, writer: &mut Writer, batch: Deferred) -> Result<(), StoreError> {
    // Armed as around any apply of a journaled batch.
    writer.broken = Some("a journaled batch was not applied".into());
    let pending = writer.pending(db)?;
    pending.writes += batch.writes.len();
    let results = pending
        .txn
        .with_dependent_mut(|_, tables| apply(tables, batch.writes.iter()));
    let why = match results {
        Ok(results) if results == batch.answered => {
            pending.through = Some(batch.sequence);
            writer.broken = None;
            return Ok(());
        }
        Ok(_) => "its writes were answered otherwise before they were applied".to_owned(),
        Err(error) => error.to_string(),
    };
    writer.pending = None;
    writer.broken = Some(why.clone());
    Err(failed(format!(
        "the store journaled a write but could not apply it ({why}); restart the gateway"
    )))
}

/// Opens the journal and applies again, in order, every record redb does not have (written
/// before a crash since the last checkpoint), then checkpoints.
fn recover(db: &Database, path: &Path, applied: u64) -> Result<Writer, StoreError> {
    if applied > 0 && !path.exists() {
        return Err(failed(format!(
            "{} is missing, and the store has journaled writes: restore it with the store file \
             it belongs to",
            path.display()
        )));
    }
    let (journals, records) =
        Journals::open(path).map_err(|e| failed(format!("{}: {e}", path.display())))?;
    let mut writer = Writer {
        journals,
        sequence: applied,
        checkpointed: applied,
        in_flight: None,
        unapplied: None,
        last_checkpoint: std::time::Instant::now(),
        broken: None,
        pending: None,
        #[cfg(test)]
        journaled_on: Vec::new(),
        #[cfg(test)]
        panic_at: None,
        #[cfg(test)]
        checkpoint_gate: None,
        #[cfg(test)]
        checkpoint_now: false,
    };
    for record in records {
        if record.sequence <= applied {
            continue;
        }
        if record.sequence != writer.sequence + 1 {
            return Err(failed(format!(
                "{}: record {} follows {} (the journal and the store file are not a pair)",
                path.display(),
                record.sequence,
                writer.sequence
            )));
        }
        let writes: Vec<Write> = serde_json::from_slice(&record.payload).map_err(|e| {
            failed(format!(
                "{}: record {} does not decode: {e}",
                path.display(),
                record.sequence
            ))
        })?;
        let writes = writes
            .into_iter()
            .map(Journaled::of)
            .collect::<Result<Vec<_>, _>>()?;
        let mut txn = db.begin_write().map_err(failed)?;
        txn.set_durability(Durability::None).map_err(failed)?;
        {
            let mut tables = Tables::of(&txn);
            apply(&mut tables, writes.iter())?;
            tables.close(Some(record.sequence))?;
        }
        txn.commit().map_err(failed)?;
        writer.sequence = record.sequence;
    }
    checkpoint(db, &mut writer)?;
    Ok(writer)
}

/// Counts a caller as waiting for the store until it has its answer, however its future ends.
struct Waiting<'a>(&'a AtomicUsize);

impl<'a> Waiting<'a> {
    fn count(waiting: &'a AtomicUsize) -> Waiting<'a> {
        waiting.fetch_add(1, Ordering::Relaxed);
        Waiting(waiting)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Steps a leader that panicked down, failing what was queued (dropping an operation drops
/// its reply, which its caller reads as an error) so that no writer waits for a leader that
/// is gone.
struct Leadership<'a>(&'a Inner);

impl Drop for Leadership<'_> {
    fn drop(&mut self) {
        let mut queue = self.0.lock();
        queue.ops.clear();
        queue.leading = false;
    }
}

/// Sends one operation's result to its caller.
fn answer(reply: Reply, result: Result<Applied, StoreError>) {
    let mismatch = || failed("an operation got another kind's result");
    match reply {
        Reply::Claim(reply) => {
            let _ = reply.send(result.and_then(|applied| match applied {
                Applied::Claim(claim) => Ok(*claim),
                _ => Err(mismatch()),
            }));
        }
        Reply::Done(reply) => {
            let _ = reply.send(result.and_then(|applied| match applied {
                Applied::Transition(done) => Ok(done),
                _ => Err(mismatch()),
            }));
        }
        Reply::Put(reply) => {
            let _ = reply.send(result.and_then(|applied| match applied {
                Applied::PutTicket => Ok(()),
                _ => Err(mismatch()),
            }));
        }
        Reply::Compacted(reply) => {
            let _ = reply.send(result.and_then(|applied| match applied {
                Applied::Compacted(removed) => Ok(removed),
                _ => Err(mismatch()),
            }));
        }
        Reply::Decided(reply) => {
            let _ = reply.send(result.and_then(|applied| match applied {
                Applied::DecideTicket(decided) => Ok(decided),
                _ => Err(mismatch()),
            }));
        }
        Reply::Published(reply) => {
            let _ = reply.send(result.and_then(|applied| match applied {
                Applied::Published => Ok(()),
                _ => Err(mismatch()),
            }));
        }
    }
}

#[derive(Clone, PartialEq)]
enum Applied {
    Claim(Box<Claim>),
    Transition(bool),
    PutTicket,
    DecideTicket(Decided),
    Compacted(usize),
    Published,
}

/// What a claim, a transition or a refusal does, given the record its slot holds: decided here
/// alone, for [`apply`] and for the answers given while a checkpoint runs ([`InFlight`]).
enum Verdict {
    /// Writes: the answer, and for a transition the head of the record it replaces.
    Writes(Applied, Option<RecordHead>),
    /// Leaves the store as it is.
    Answers(Result<Applied, StoreError>),
}

fn decide(write: &Write, found: Option<&[u8]>) -> Verdict {
    match write {
        Write::Claim { slot, .. } => match found.map(serde_json::from_slice::<ClaimRecord>) {
            None => Verdict::Writes(Applied::Claim(Box::new(Claim::Acquired)), None),
            Some(Ok(record)) => Verdict::Answers(Ok(Applied::Claim(Box::new(Claim::Existing(
                Box::new(record),
            ))))),
            Some(Err(error)) => Verdict::Answers(Err(undecodable(slot, error))),
        },
        Write::Transition {
            slot,
            expected_version,
            next_version,
            ..
        } => match found.map(RecordHead::read) {
            None => Verdict::Answers(Err(super::gone(slot))),
            Some(Err(error)) => Verdict::Answers(Err(undecodable(slot, error))),
            Some(Ok(_)) if *next_version != expected_version + 1 => {
                Verdict::Answers(Err(super::version_step(*expected_version, *next_version)))
            }
            Some(Ok(current)) if current.version == *expected_version => {
                Verdict::Writes(Applied::Transition(true), Some(current))
            }
            Some(Ok(_)) => Verdict::Answers(Ok(Applied::Transition(false))),
        },
        Write::Refusal { .. } => Verdict::Writes(Applied::Transition(true), None),
        _ => Verdict::Answers(Err(failed("a write the claims table does not decide"))),
    }
}

/// Applies the batch in one transaction. An operation the store refuses (a record that does
/// not decode, a version that does not step by one, a claim that is gone) fails alone; only a
/// storage error fails the batch.
fn apply<'a>(
    tables: &mut Tables,
    batch: impl ExactSizeIterator<Item = &'a Journaled>,
) -> Result<Vec<Result<Applied, StoreError>>, StoreError> {
    // Read again by each batch, as when every batch opened its tables: a replay after a
    // crash, which applies each batch on its own, numbers the audit records alike.
    tables.next_audit = None;
    let txn = tables.txn;
    let mut results = Vec::with_capacity(batch.len());
    {
        for journaled in batch {
            match &journaled.write {
                Write::Claim {
                    slot,
                    record,
                    lease,
                } => {
                    let claims = opened(&mut tables.claims, txn, CLAIMS)?;
                    let decision = {
                        let found = claims.get(slot.as_str()).map_err(failed)?;
                        decide(&journaled.write, found.as_ref().map(|bytes| bytes.value()))
                    };
                    match decision {
                        Verdict::Answers(answer) => results.push(answer),
                        Verdict::Writes(answer, _) => {
                            claims
                                .insert(slot.as_str(), record.bytes())
                                .map_err(failed)?;
                            if let Some(until) = lease {
                                tables.lease_claimed(slot, *until);
                            }
                            results.push(Ok(answer));
                        }
                    }
                }
                Write::Transition {
                    slot,
                    next,
                    lease,
                    finalized_since,
                    receipt,
                    ..
                } => {
                    let claims = opened(&mut tables.claims, txn, CLAIMS)?;
                    let decision = {
                        let found = claims.get(slot.as_str()).map_err(failed)?;
                        decide(&journaled.write, found.as_ref().map(|bytes| bytes.value()))
                    };
                    let (answer, current) = match decision {
                        Verdict::Answers(answer) => {
                            results.push(answer);
                            continue;
                        }
                        Verdict::Writes(answer, current) => (answer, current),
                    };
                    if let Some(current) = current {
                        claims.insert(slot.as_str(), next.bytes()).map_err(failed)?;
                        // A finalized claim's retention counts from its last lease; a
                        // redispatch takes it out of the count until it is final again.
                        let expiry = opened(&mut tables.expiry, txn, EXPIRY)?;
                        if current.is_finalized() {
                            expiry
                                .remove(expiry_key(current.lease_until_ms, 'c', slot).as_str())
                                .map_err(failed)?;
                        }
                        if let Some(since) = finalized_since {
                            expiry
                                .insert(expiry_key(*since, 'c', slot).as_str(), ())
                                .map_err(failed)?;
                        }
                        tables.lease_moved(slot, *lease)?;
                        if let Some(rendered) = receipt {
                            write_receipt(tables, rendered)?;
                        }
                    }
                    results.push(Ok(answer));
                }
                Write::Refusal { receipt } => {
                    let answer = match decide(&journaled.write, None) {
                        Verdict::Writes(answer, _) => {
                            write_receipt(tables, receipt)?;
                            Ok(answer)
                        }
                        Verdict::Answers(answer) => answer,
                    };
                    results.push(answer);
                }
                Write::PutTicket { ticket } => {
                    let Tables {
                        tickets,
                        ticket_index,
                        expiry,
                        ..
                    } = tables;
                    let tickets = opened(tickets, txn, TICKETS)?;
                    if tickets.get(ticket.id.as_str()).map_err(failed)?.is_none() {
                        let bytes = serde_json::to_vec(ticket).map_err(failed)?;
                        tickets
                            .insert(ticket.id.as_str(), bytes.as_slice())
                            .map_err(failed)?;
                        let order = format!(
                            "{}\0{:020}\0{}",
                            ticket.workspace, ticket.created_at_ms, ticket.id
                        );
                        opened(ticket_index, txn, TICKET_INDEX)?
                            .insert(order.as_str(), ())
                            .map_err(failed)?;
                        opened(expiry, txn, EXPIRY)?
                            .insert(
                                expiry_key(ticket.expires_at_ms, 't', ticket.id.as_str()).as_str(),
                                (),
                            )
                            .map_err(failed)?;
                    }
                    results.push(Ok(Applied::PutTicket));
                }
                Write::Compact { horizon_ms, limit } => {
                    let Tables {
                        claims,
                        receipts,
                        index,
                        audit,
                        tickets,
                        ticket_index,
                        expiry,
                        next_audit,
                        ..
                    } = tables;
                    let audit = opened(audit, txn, AUDIT)?;
                    // Read before anything is removed, as when every batch read it first: a
                    // compaction does not change the numbers the batch's later receipts take.
                    audit_sequence(audit, next_audit)?;
                    let removed = compact(
                        *horizon_ms,
                        *limit,
                        &mut Removal {
                            expiry: opened(expiry, txn, EXPIRY)?,
                            claims: opened(claims, txn, CLAIMS)?,
                            receipts: opened(receipts, txn, RECEIPTS)?,
                            index: opened(index, txn, RECEIPT_INDEX)?,
                            tickets: opened(tickets, txn, TICKETS)?,
                            ticket_index: opened(ticket_index, txn, TICKET_INDEX)?,
                            audit,
                        },
                    )?;
                    results.push(Ok(Applied::Compacted(removed)));
                }
                Write::DecideTicket {
                    id,
                    decision,
                    at_ms,
                } => {
                    let tickets = opened(&mut tables.tickets, txn, TICKETS)?;
                    let current: Result<Option<Ticket>, StoreError> = json_in(tickets, id.as_str());
                    let outcome = match current {
                        Err(error) => Err(error),
                        Ok(None) => Ok(Decided::Missing),
                        Ok(Some(ticket)) if ticket.status != TicketStatus::Pending => {
                            Ok(Decided::Already(Box::new(ticket)))
                        }
                        Ok(Some(ticket)) => {
                            let next = super::decided(ticket, *decision, *at_ms);
                            let bytes = serde_json::to_vec(&next).map_err(failed)?;
                            tickets
                                .insert(id.as_str(), bytes.as_slice())
                                .map_err(failed)?;
                            Ok(Decided::Now(Box::new(next)))
                        }
                    };
                    results.push(outcome.map(Applied::DecideTicket));
                }
                Write::Registry { key, value, mode } => {
                    let registry = opened(&mut tables.registry, txn, REGISTRY)?;
                    let write = *mode == RegistryWrite::Overwrite
                        || registry.get(key.as_str()).map_err(failed)?.is_none();
                    if write {
                        registry
                            .insert(key.as_str(), value.as_str())
                            .map_err(failed)?;
                    }
                    results.push(Ok(Applied::Transition(write)));
                }
            }
        }
    }
    Ok(results)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::idempotency::IdempotencyKey;
    use crate::store::ConnectionSegment;

    proptest::proptest! {
        #![proptest_config(crate::properties::config())]

        /// Expiry and listing keys are spelled as the `format!` that first wrote them: files
        /// already hold them, and a removal must find the key an insert made.
        #[test]
        fn expiry_and_listing_keys_are_spelled_as_before(
            since in proptest::prelude::any::<u64>(),
            kind in proptest::sample::select(vec!['c', 'r', 't']),
            workspace in "[a-z0-9._-]{1,12}",
            id in "[a-zA-Z0-9_\\x00-]{0,30}",
        ) {
            proptest::prop_assert_eq!(
                expiry_key(since, kind, &id),
                format!("{since:020}\0{kind}\0{id}")
            );
            let id_key = format!("{workspace}\0{id}");
            proptest::prop_assert_eq!(
                receipt_order(&id_key, since),
                format!("{workspace}\0{since:020}\0{id}")
            );
        }
    }

    fn key(tag: &str) -> ClaimKey {
        ClaimKey {
            workspace: "acme".into(),
            connection: ConnectionSegment::Resolved("c".into()),
            tool: "t.x".into(),
            key: IdempotencyKey::parse(&format!("idt_embedded_test_{tag}")).unwrap(),
        }
    }

    /// A crash between checkpoints: what is on disk is the last durable redb commit and the
    /// journal. Reopened from a copy of exactly that, every acknowledged write is back.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn writes_after_the_last_checkpoint_come_back_from_the_journal() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.redb");
        let store = EmbeddedStore::open(&path).unwrap();
        let record: ClaimRecord = serde_json::from_value(serde_json::json!({
            "version": 1, "pin": {"request_hash": "h", "binding": "none", "fingerprint": "f"},
            "state": {"state": "claimed"}, "attempts": 0, "lease_until_ms": 0,
            "receipt_id": "rcp_j", "key_supplied": true, "created_at_ms": 0
        }))
        .unwrap();
        let keys: Vec<ClaimKey> = (0..5).map(|n| key(&format!("journal{n:04}"))).collect();
        for k in &keys {
            assert!(matches!(store.claim(k, &record).await, Ok(Claim::Acquired)));
        }
        assert!(
            store.inner.writer.lock().unwrap().checkpointed < 5,
            "the test needs writes the last checkpoint does not hold"
        );
        let crashed = tempfile::tempdir().unwrap();
        let copy = crashed.path().join("s.redb");
        std::fs::copy(&path, &copy).unwrap();
        std::fs::copy(journal_path(&path), journal_path(&copy)).unwrap();
        drop(store);
        let reopened = EmbeddedStore::open(&copy).unwrap();
        for k in &keys {
            assert_eq!(reopened.get(k).await.unwrap(), Some(record.clone()));
        }
        // Applied again exactly once: a second reopen changes nothing.
        drop(reopened);
        let again = EmbeddedStore::open(&copy).unwrap();
        assert!(matches!(
            again.claim(&keys[0], &record).await,
            Ok(Claim::Existing(_))
        ));
    }

    /// A checkpoint's durable commit (tens of milliseconds) holds no write: while it runs,
    /// claims and transitions are journaled and answered as the store would answer them
    /// after it, a crash meanwhile keeps them all, and readers see them once it returns.
    /// Before, every write waited for it: at c=32, 30-35 ms every 0.27 s.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn writes_during_a_checkpoint_are_answered_before_it_returns() {
        use crate::store::{OutcomeClass, ResultJson, StoredOutcome};
        let ten_seconds = std::time::Duration::from_secs(10);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.redb");
        let store = EmbeddedStore::open(&path).unwrap();
        let record = claimed("rcp_c");
        let done = record.finalize(StoredOutcome {
            class: OutcomeClass::Accepted,
            vendor_status: Some(200),
            response: Ok(ResultJson::of(
                &serde_json::json!({"content": [], "isError": false}),
            )),
        });
        let (before, first, during) = (key("ckpt0001"), key("ckpt0002"), key("ckpt0003"));
        assert_eq!(store.claim(&before, &record).await, Ok(Claim::Acquired));
        let release = hold_next_checkpoint(&store);
        // The batch after which the checkpoint begins, its commit held at the gate.
        assert_eq!(store.claim(&first, &record).await, Ok(Claim::Acquired));
        assert!(store.inner.writer.lock().unwrap().in_flight.is_some());

        // Answered from the claims the checkpoint began with, and from the batches since.
        let answers = tokio::time::timeout(ten_seconds, async {
            (
                store.claim(&during, &record).await,
                store.claim(&before, &done).await,
                store.claim(&during, &done).await,
                store.transition(&during, &record, &done, None).await,
                store.transition(&during, &record, &done, None).await,
                store
                    .transition(&key("ckpt0404"), &record, &done, None)
                    .await,
            )
        })
        .await
        .expect("writes answered while the checkpoint's commit is held");
        assert_eq!(answers.0, Ok(Claim::Acquired));
        assert_eq!(answers.1, Ok(Claim::Existing(Box::new(record.clone()))));
        assert_eq!(answers.2, Ok(Claim::Existing(Box::new(record.clone()))));
        assert_eq!(
            answers.3,
            Ok(true),
            "the transition from the version it found"
        );
        assert_eq!(
            answers.4,
            Ok(false),
            "a second one finds the version it wrote"
        );
        assert!(answers.5.is_err(), "a transition of no claim is refused");
        {
            let writer = store.inner.writer.lock().unwrap();
            let in_flight = writer.in_flight.as_ref().expect("still held at the gate");
            assert_eq!(
                in_flight.deferred.len(),
                6,
                "one batch each, none applied yet"
            );
        }

        // A crash while the commit is held: the journal's two halves hold every answer.
        let crashed = tempfile::tempdir().unwrap();
        let copy = crash_copy(&store, &path, crashed.path());
        let reopened = EmbeddedStore::open(&copy).unwrap();
        for (k, expected) in [(&before, &record), (&first, &record), (&during, &done)] {
            assert_eq!(reopened.get(k).await.unwrap().as_ref(), Some(expected));
        }
        drop(reopened);

        // A reader waits for the commit, then sees the deferred batches applied.
        let read = tokio::spawn({
            let (store, during) = (store.clone(), during.clone());
            async move { store.get(&during).await }
        });
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        assert!(!read.is_finished(), "a read waits for the deferred batches");
        release.send(()).unwrap();
        assert_eq!(
            tokio::time::timeout(ten_seconds, read)
                .await
                .unwrap()
                .unwrap()
                .unwrap(),
            Some(done.clone())
        );
        let writer = store.inner.writer.lock().unwrap();
        assert!(writer.in_flight.is_none() && writer.broken.is_none());
        assert_eq!(
            writer.checkpointed, 2,
            "the checkpoint covered the batches before it"
        );
    }

    /// A reader (the sweeper reads every second) and a registry write (a gateway's heartbeat)
    /// that arrive while a checkpoint's commit runs wait for it without holding the claims
    /// queued after them; then each sees, or is applied after, everything answered meanwhile.
    /// Before, the leader took them into its batch and waited for the commit, and every
    /// write behind them waited with it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn work_that_waits_for_a_checkpoint_does_not_hold_the_writes_after_it() {
        let ten_seconds = std::time::Duration::from_secs(10);
        let dir = tempfile::tempdir().unwrap();
        let store = EmbeddedStore::open(&dir.path().join("s.redb")).unwrap();
        let record = claimed("rcp_w");
        let release = hold_next_checkpoint(&store);
        assert_eq!(
            store.claim(&key("wait0001"), &record).await,
            Ok(Claim::Acquired)
        );
        assert!(store.inner.writer.lock().unwrap().in_flight.is_some());
        // Answered during the checkpoint: a reader must see it, so it waits for the commit.
        assert_eq!(
            store.claim(&key("wait0002"), &record).await,
            Ok(Claim::Acquired)
        );

        let read = tokio::spawn({
            let store = store.clone();
            async move { store.get(&key("wait0002")).await }
        });
        let heartbeat = tokio::spawn({
            let store = store.clone();
            async move {
                store
                    .registry_write(Registry::Keys, "beat", "1", RegistryWrite::Overwrite)
                    .await
            }
        });
        // Long enough for both to be queued, as they were before (then the leader took them
        // and waited for the commit, and the claims below timed out).
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        let after = tokio::time::timeout(std::time::Duration::from_secs(2), async {
            (
                store.claim(&key("wait0003"), &record).await,
                store.claim(&key("wait0004"), &record).await,
            )
        })
        .await
        .expect(
            "claims queued after a reader and a registry write are answered during the checkpoint",
        );
        assert_eq!(after, (Ok(Claim::Acquired), Ok(Claim::Acquired)));
        assert!(!read.is_finished() && !heartbeat.is_finished());
        assert_eq!(
            deferred_batches(&store),
            Some(3),
            "answered during the checkpoint, applied after it"
        );

        release.send(()).unwrap();
        let (read, heartbeat) = tokio::time::timeout(ten_seconds, async {
            (read.await.unwrap(), heartbeat.await.unwrap())
        })
        .await
        .expect("both go on once the commit returns");
        assert_eq!(
            read,
            Ok(Some(record.clone())),
            "the reader sees the claim answered meanwhile"
        );
        assert_eq!(
            store.get(&key("wait0004")).await,
            Ok(Some(record.clone())),
            "and the claims answered while it waited"
        );
        assert_eq!(heartbeat, Ok(true));
        assert_eq!(
            store
                .registry(Registry::Keys)
                .await
                .unwrap()
                .get("beat")
                .map(String::as_str),
            Some("1")
        );
        let writer = store.inner.writer.lock().unwrap();
        assert!(writer.in_flight.is_none() && writer.broken.is_none());
    }

    /// Once a checkpoint's commit has returned, each round applies a few of the batches it
    /// deferred beside its own, answering its own as it did during the commit, until none is
    /// left or a reader needs them all. Before, the first round after the commit applied every
    /// one of them before its own: at c=32 that held every write for 1.8 ms p50 after each
    /// commit.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_batches_a_checkpoint_deferred_are_applied_a_few_a_round() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.redb");
        let store = EmbeddedStore::open(&path).unwrap();
        let record = claimed("rcp_d");
        let slot = |i: usize| key(&format!("drain{i:03}"));
        let release = hold_next_checkpoint(&store);
        assert_eq!(store.claim(&slot(0), &record).await, Ok(Claim::Acquired));
        let during = 20;
        for i in 1..=during {
            assert_eq!(store.claim(&slot(i), &record).await, Ok(Claim::Acquired));
        }
        assert_eq!(deferred_batches(&store), Some(during));

        release.send(()).unwrap();
        commit_returned(&store).await;
        assert_eq!(
            store.claim(&slot(during + 1), &record).await,
            Ok(Claim::Acquired)
        );
        assert_eq!(
            deferred_batches(&store),
            Some(during + 1 - DEFERRED_PER_ROUND),
            "the round's own batch answered and kept behind the rest, a few of them applied"
        );
        assert_eq!(
            store.claim(&slot(2), &record).await,
            Ok(Claim::Existing(Box::new(record.clone()))),
            "answered from the snapshot and the writes since, applied or not"
        );
        assert_eq!(
            deferred_batches(&store),
            Some(during + 2 - 2 * DEFERRED_PER_ROUND),
            "fewer left every round"
        );

        // A crash part-way: the journal still holds what is not applied.
        let crashed = tempfile::tempdir().unwrap();
        let copy = crash_copy(&store, &path, crashed.path());
        let reopened = EmbeddedStore::open(&copy).unwrap();
        for i in 0..=during + 1 {
            assert_eq!(reopened.get(&slot(i)).await, Ok(Some(record.clone())));
        }
        drop(reopened);

        // A reader has the rest applied first, and sees the newest.
        assert_eq!(store.get(&slot(during + 1)).await, Ok(Some(record.clone())));
        let writer = store.inner.writer.lock().unwrap();
        assert!(writer.in_flight.is_none() && writer.broken.is_none());
        assert_eq!(
            writer.checkpointed, 1,
            "the checkpoint covered the batch before it"
        );
    }

    /// Two independent computations of a sequence of claims and transitions: one store
    /// applies every write as it comes; the other answers some while a checkpoint's commit is
    /// held (from its snapshot and the writes since) and applies them after. The answers, and
    /// what each store holds at the end, are the same.
    #[test]
    fn answers_given_during_a_checkpoint_are_those_applying_gives() {
        use proptest::prelude::*;
        fn version(v: u64) -> ClaimRecord {
            let mut record = claimed("rcp_p");
            record.version = v;
            record
        }
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        // (key, 0 claims at version 1 / 1 steps from `v` / 2 skips a version, v)
        let op = (0..3usize, 0..3u8, 1..4u64);
        async fn answer(store: &EmbeddedStore, k: &ClaimKey, kind: u8, v: u64) -> String {
            match kind {
                0 => format!("{:?}", store.claim(k, &version(1)).await),
                1 => format!(
                    "{:?}",
                    store
                        .transition(k, &version(v), &version(v + 1), None)
                        .await
                ),
                _ => format!(
                    "{:?}",
                    store
                        .transition(k, &version(v), &version(v + 2), None)
                        .await
                ),
            }
        }
        proptest!(ProptestConfig::with_cases(24), |(ops in proptest::collection::vec(op.clone(), 1..16), at in 0..16usize, after in proptest::collection::vec(op, 0..12))| {
            let outcome = runtime.block_on(async {
                let dir = tempfile::tempdir().unwrap();
                let plain = EmbeddedStore::open(&dir.path().join("plain.redb")).unwrap();
                let held = EmbeddedStore::open(&dir.path().join("held.redb")).unwrap();
                let mut release = None;
                let mut answers = (Vec::new(), Vec::new());
                for (n, (k, kind, v)) in ops.iter().enumerate() {
                    if n == at.min(ops.len() - 1) {
                        release = Some(hold_next_checkpoint(&held));
                    }
                    let k = key(&format!("prop{k:04}"));
                    for (store, out) in [(&plain, &mut answers.0), (&held, &mut answers.1)] {
                        out.push(answer(store, &k, *kind, *v).await);
                    }
                }
                let deferred = deferred_batches(&held).unwrap_or(0);
                drop(release.take());
                // Once the commit has returned, answered while the deferred batches are applied
                // a few a round.
                commit_returned(&held).await;
                for (k, kind, v) in &after {
                    let k = key(&format!("prop{k:04}"));
                    for (store, out) in [(&plain, &mut answers.0), (&held, &mut answers.1)] {
                        out.push(answer(store, &k, *kind, *v).await);
                    }
                }
                let mut held_at_end = (Vec::new(), Vec::new());
                for k in 0..3 {
                    let k = key(&format!("prop{k:04}"));
                    held_at_end.0.push(plain.get(&k).await.unwrap());
                    held_at_end.1.push(held.get(&k).await.unwrap());
                }
                (answers, held_at_end, deferred)
            });
            let ((plain, held), (plain_end, held_end), deferred) = outcome;
            prop_assert_eq!(plain, held);
            prop_assert_eq!(plain_end, held_end);
            // Every write after the batch the checkpoint began after was answered during it.
            prop_assert_eq!(deferred + at.min(ops.len() - 1) + 1, ops.len());
        });
    }

    /// A journal write that fails while a checkpoint's commit is held waits for that commit,
    /// then makes every write before it durable and starts both halves over: the writes
    /// answered during the checkpoint are kept, the refused one is not, and writes go on.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_journal_write_refused_during_a_checkpoint_keeps_the_writes_before_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.redb");
        let store = EmbeddedStore::open(&path).unwrap();
        let record = claimed("rcp_f");
        let keys: Vec<ClaimKey> = (0..4).map(|n| key(&format!("refused{n}"))).collect();
        let release = hold_next_checkpoint(&store);
        assert_eq!(store.claim(&keys[0], &record).await, Ok(Claim::Acquired));
        assert_eq!(store.claim(&keys[1], &record).await, Ok(Claim::Acquired));
        assert!(store.inner.writer.lock().unwrap().in_flight.is_some());
        refuse_next_append(&store);
        let refused = tokio::spawn({
            let (store, k, record) = (store.clone(), keys[2].clone(), record.clone());
            async move { store.claim(&k, &record).await }
        });
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        assert!(!refused.is_finished(), "it waits for the held commit");
        release.send(()).unwrap();
        assert!(refused.await.unwrap().is_err());
        for k in &keys[2..] {
            assert_eq!(store.claim(k, &record).await, Ok(Claim::Acquired));
        }
        let crashed = tempfile::tempdir().unwrap();
        let copy = crash_copy(&store, &path, crashed.path());
        let reopened = EmbeddedStore::open(&copy).unwrap();
        for k in &keys {
            assert_eq!(reopened.get(k).await.unwrap(), Some(record.clone()));
        }
    }

    /// Writes answered during a checkpoint that fill the half it switched to wait for it, then
    /// switch back: the next checkpoint begins in the half the first made redundant, and a
    /// crash's copy keeps every write.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn writes_that_fill_a_half_during_a_checkpoint_wait_for_it_and_switch_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.redb");
        let store = EmbeddedStore::open(&path).unwrap();
        // About 1 MiB of journal each: nine do not fit one half.
        let record = claimed(&"r".repeat(1 << 20));
        let keys: Vec<ClaimKey> = (0..10).map(|n| key(&format!("fill{n:04}"))).collect();
        let release = hold_next_checkpoint(&store);
        assert_eq!(store.claim(&keys[0], &record).await, Ok(Claim::Acquired));
        let active = store.inner.writer.lock().unwrap().journals.active;
        let mut answered = 0;
        for k in &keys[1..] {
            let fits = store
                .inner
                .writer
                .lock()
                .unwrap()
                .journals
                .active()
                .fits((1 << 20) + 2048);
            let claim = tokio::spawn({
                let (store, k, record) = (store.clone(), k.clone(), record.clone());
                async move { store.claim(&k, &record).await }
            });
            if !fits {
                // The half is full: this write waits for the held commit.
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                assert!(!claim.is_finished(), "it waits for the held commit");
                release.send(()).unwrap();
                assert_eq!(claim.await.unwrap(), Ok(Claim::Acquired));
                break;
            }
            assert_eq!(claim.await.unwrap(), Ok(Claim::Acquired));
            answered += 1;
        }
        assert_eq!(answered, 7, "seven fit the half the checkpoint switched to");
        {
            let writer = store.inner.writer.lock().unwrap();
            assert_ne!(writer.journals.active, active, "switched back");
            assert!(writer.broken.is_none());
        }
        for k in &keys[answered + 2..] {
            assert_eq!(store.claim(k, &record).await, Ok(Claim::Acquired));
        }
        let crashed = tempfile::tempdir().unwrap();
        let copy = crash_copy(&store, &path, crashed.path());
        let reopened = EmbeddedStore::open(&copy).unwrap();
        for k in &keys {
            assert_eq!(reopened.get(k).await.unwrap(), Some(record.clone()));
        }
    }

    /// A journal file of an earlier version holds one 8 MiB journal: it is read as the first
    /// half, its records newer than the store's mark are applied on open, and the file grows
    /// by the second half.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_journal_file_of_one_journal_is_read_as_the_first_half() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.redb");
        let store = EmbeddedStore::open(&path).unwrap();
        let record = claimed("rcp_one");
        assert_eq!(
            store.claim(&key("onejournal"), &record).await,
            Ok(Claim::Acquired)
        );
        let crashed = tempfile::tempdir().unwrap();
        let copy = crash_copy(&store, &path, crashed.path());
        let journal = std::fs::OpenOptions::new()
            .write(true)
            .open(journal_path(&copy))
            .unwrap();
        journal.set_len(JOURNAL_BYTES).unwrap();
        drop(journal);
        let reopened = EmbeddedStore::open(&copy).unwrap();
        assert_eq!(
            reopened.get(&key("onejournal")).await.unwrap(),
            Some(record)
        );
        let length = std::fs::metadata(journal_path(&copy)).unwrap().len();
        assert_eq!(length, 2 * JOURNAL_BYTES);
    }

    /// The journal's mark is written as the pending transaction commits, not with each batch:
    /// a reader's commit and the close's each leave it at the last record they hold, so a
    /// reopen applies none of them again.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn each_commit_marks_the_journal_records_it_holds_applied() {
        fn applied(db: &Database) -> Option<u64> {
            db.begin_read()
                .unwrap()
                .open_table(JOURNAL_STATE)
                .unwrap()
                .get("applied")
                .unwrap()
                .map(|sequence| sequence.value())
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.redb");
        let store = EmbeddedStore::open(&path).unwrap();
        let record = claimed("rcp_mark");
        for n in 0..3 {
            store
                .claim(&key(&format!("mark{n:04}")), &record)
                .await
                .unwrap();
        }
        assert!(store.get(&key("mark0000")).await.unwrap().is_some());
        assert_eq!(applied(&store.inner.db), Some(3), "the reader's commit");
        for n in 3..5 {
            store
                .claim(&key(&format!("mark{n:04}")), &record)
                .await
                .unwrap();
        }
        assert_eq!(store.inner.writer.lock().unwrap().sequence, 5);
        drop(store);
        assert_eq!(
            applied(&Database::open(&path).unwrap()),
            Some(5),
            "the close's commit"
        );
    }

    /// Callers serialise their own writes; the leader joins them. What it journals must be
    /// what recovery reads back: the batch serialised as one `Vec<Write>`.
    #[test]
    fn a_batch_is_journaled_as_the_array_of_its_writes() {
        use crate::store::contract;
        let claimed = claimed("rcp_a \"quoted\" \u{e9}");
        let record = || RecordJson::of(&claimed).unwrap();
        let (k, r) = (contract::key(1), contract::record());
        let receipt = || Box::new(RenderedReceipt::of(&contract::receipt(&r, &k)).unwrap());
        let writes = vec![
            Write::Transition {
                slot: k.slot(),
                expected_version: 1,
                next_version: 2,
                next: record(),
                lease: None,
                finalized_since: Some(5),
                receipt: Some(receipt()),
            },
            Write::Refusal { receipt: receipt() },
            Write::Claim {
                slot: key("batch0001").slot(),
                record: record(),
                lease: Some(7),
            },
            Write::Compact {
                horizon_ms: 3,
                limit: 10,
            },
            Write::Registry {
                key: "r\0n".into(),
                value: "{\"a\":[1,2]}".into(),
                mode: RegistryWrite::Overwrite,
            },
        ];
        let whole = serde_json::to_vec(&writes).unwrap();
        let works: Vec<Work> = writes
            .into_iter()
            .map(|write| Work::write(write).unwrap())
            .collect();
        let journaled: Vec<&Journaled> = works
            .iter()
            .map(|work| match work {
                Work::Write(journaled) => journaled.as_ref(),
                Work::Publish => unreachable!(),
            })
            .collect();
        let payload = journal_payload(&journaled);
        assert_eq!(String::from_utf8(payload.clone()), String::from_utf8(whole));
        let read: Vec<Write> = serde_json::from_slice(&payload).unwrap();
        assert!(
            matches!(&read[2], Write::Claim { record: r, .. } if r.bytes() == record().bytes())
        );
        let alone = journal_payload(&journaled[..1]);
        assert_eq!(
            alone,
            serde_json::to_vec(&[&journaled[0].write]).unwrap(),
            "a batch of one is an array of one"
        );
    }

    fn claimed(receipt_id: &str) -> ClaimRecord {
        serde_json::from_value(serde_json::json!({
            "version": 1, "pin": {"request_hash": "h", "binding": "none", "fingerprint": "f"},
            "state": {"state": "claimed"}, "attempts": 0, "lease_until_ms": 0,
            "receipt_id": receipt_id, "key_supplied": true, "created_at_ms": 0
        }))
        .unwrap()
    }

    /// Whether the writer holds a batch it answered and has not applied.
    fn unapplied(store: &EmbeddedStore) -> bool {
        store.inner.writer.lock().unwrap().unapplied.is_some()
    }

    /// A write alone is answered once it is journaled, and applied at its lane's next idle
    /// moment, after its caller has gone on. Until then the next write to its slot finds it
    /// (applied first), a reader sees it, and the store's close applies it.
    #[tokio::test(flavor = "current_thread")]
    async fn a_write_is_answered_before_it_is_applied_and_applied_when_the_lane_is_idle() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.redb");
        let store = EmbeddedStore::open(&path).unwrap();
        // No checkpoint falls due (one would apply the batch on the caller's thread).
        store.inner.writer.lock().unwrap().last_checkpoint =
            std::time::Instant::now() + std::time::Duration::from_secs(3600);
        let applied_writes = || {
            let writer = store.inner.writer.lock().unwrap();
            writer.pending.as_ref().map_or(0, |pending| pending.writes)
        };
        let record = claimed("rcp_ahead");
        let [first, second, last] = ["ahead0001", "ahead0002", "ahead0003"].map(key);
        assert!(matches!(
            store.claim(&first, &record).await,
            Ok(Claim::Acquired)
        ));
        assert_eq!(applied_writes(), 0, "answered before it was applied");
        assert!(unapplied(&store));
        for _ in 0..100 {
            if applied_writes() == 1 {
                break;
            }
            tokio::task::yield_now().await;
        }
        assert_eq!(applied_writes(), 1, "applied once the lane was idle");
        assert!(!unapplied(&store));
        assert!(matches!(
            store.claim(&second, &record).await,
            Ok(Claim::Acquired)
        ));
        assert!(unapplied(&store));
        assert!(
            matches!(store.claim(&second, &record).await, Ok(Claim::Existing(found)) if *found == record),
            "a second claim finds the first, answered and not yet applied"
        );
        assert_eq!(store.get(&second).await.unwrap(), Some(record.clone()));
        assert!(matches!(
            store.claim(&last, &record).await,
            Ok(Claim::Acquired)
        ));
        assert!(unapplied(&store), "the close has a batch to apply");
        let sequence = store.inner.writer.lock().unwrap().sequence;
        drop(store);
        let db = Database::open(&path).unwrap();
        let mark = db
            .begin_read()
            .unwrap()
            .open_table(JOURNAL_STATE)
            .unwrap()
            .get("applied")
            .unwrap()
            .map(|applied| applied.value());
        assert_eq!(
            mark,
            Some(sequence),
            "the close applied and committed the last batch"
        );
        drop(db);
        let reopened = EmbeddedStore::open(&path).unwrap();
        for k in [&first, &second, &last] {
            assert_eq!(reopened.get(k).await.unwrap(), Some(record.clone()));
        }
    }

    /// Dropped while its lane's idle apply holds it on another thread, the store waits for
    /// that apply and is closed when the drop returns: the file opens again at once, with the
    /// write in it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_store_dropped_during_its_idle_apply_is_closed_when_the_drop_returns() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.redb");
        let store = EmbeddedStore::open(&path).unwrap();
        store.inner.writer.lock().unwrap().last_checkpoint =
            std::time::Instant::now() + std::time::Duration::from_secs(3600);
        let (release, gate) = std::sync::mpsc::channel();
        *store.inner.idle_gate.lock().unwrap() = Some(gate);
        let record = claimed("rcp_close");
        let k = key("close0001");
        assert!(matches!(
            store.claim(&k, &record).await,
            Ok(Claim::Acquired)
        ));
        let started = std::time::Instant::now();
        while Arc::strong_count(store.inner.inner()) < 2 {
            assert!(
                started.elapsed() < std::time::Duration::from_secs(10),
                "no idle apply"
            );
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        let dropping = std::thread::spawn(move || drop(store));
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(!dropping.is_finished(), "the drop waits for the idle apply");
        drop(release);
        dropping.join().unwrap();
        let reopened = EmbeddedStore::open(&path).unwrap();
        assert_eq!(reopened.get(&k).await.unwrap(), Some(record));
    }

    /// Two claims of one key in one batch, answered before the batch is applied: the first
    /// acquires, the second finds it, as applying them decides.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn claims_of_one_key_in_one_batch_are_answered_as_applying_them_decides() {
        let dir = tempfile::tempdir().unwrap();
        let store = EmbeddedStore::open(&dir.path().join("s.redb")).unwrap();
        let record = claimed("rcp_batch");
        let k = key("batch0001");
        let held = store.inner.writer.lock().unwrap();
        let claims: Vec<_> = (0..2)
            .map(|_| {
                let (store, k, record) = (store.clone(), k.clone(), record.clone());
                tokio::spawn(async move { store.claim(&k, &record).await })
            })
            .collect();
        while store.inner.lock().ops.len() < 2 {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        drop(held);
        let mut acquired = 0;
        for claim in claims {
            match claim.await.unwrap() {
                Ok(Claim::Acquired) => acquired += 1,
                Ok(Claim::Existing(found)) => assert_eq!(*found, record),
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(acquired, 1);
        assert_eq!(store.inner.writer.lock().unwrap().sequence, 1, "one batch");
        assert_eq!(store.get(&k).await.unwrap(), Some(record));
    }

    /// A batch costs no redb commit: a claim sits in the pending transaction, unseen by
    /// redb's readers, until a reader of the store asks for it, and then it is there.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn writes_wait_in_one_transaction_until_a_reader_asks() {
        let dir = tempfile::tempdir().unwrap();
        let store = EmbeddedStore::open(&dir.path().join("s.redb")).unwrap();
        let (first, second) = (key("pending0001"), key("pending0002"));
        let record = claimed("rcp_p");
        store.claim(&first, &record).await.unwrap();
        store.claim(&second, &record).await.unwrap();
        let committed = |k: &ClaimKey| {
            read_json::<ClaimRecord>(&store.inner.db, CLAIMS, &k.slot())
                .unwrap()
                .is_some()
        };
        assert!(!committed(&first) && !committed(&second));
        assert_eq!(store.get(&second).await.unwrap(), Some(record.clone()));
        assert!(committed(&first) && committed(&second));
    }

    /// A batch the journal refuses never reaches redb; the writes acknowledged before it,
    /// pending in redb, survive it and a crash after it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_write_the_journal_refuses_leaves_the_writes_before_it_and_nothing_else() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.redb");
        let store = EmbeddedStore::open(&path).unwrap();
        let (before, after) = (key("refused0001"), key("refused0002"));
        let record = claimed("rcp_r");
        store.claim(&before, &record).await.unwrap();
        refuse_next_append(&store);
        let refused = store
            .registry_write(Registry::Keys, "huge", "refused", RegistryWrite::Overwrite)
            .await
            .unwrap_err();
        assert!(refused.0.contains("the test refused"), "{refused:?}");
        assert!(matches!(
            store.claim(&after, &record).await,
            Ok(Claim::Acquired)
        ));
        let crashed = tempfile::tempdir().unwrap();
        let copy = crash_copy(&store, &path, crashed.path());
        for reopened in [store, EmbeddedStore::open(&copy).unwrap()] {
            assert!(
                !reopened
                    .registry(Registry::Keys)
                    .await
                    .unwrap()
                    .contains_key("huge")
            );
            assert_eq!(reopened.get(&before).await.unwrap(), Some(record.clone()));
            assert_eq!(reopened.get(&after).await.unwrap(), Some(record.clone()));
        }
    }

    /// Writes queued together whose entries add up to more than the journal holds are each
    /// committed and survive a crash. Joined into one record, the journal refused it, and
    /// every write in it failed: at c=32, a batch of calls with results of a few hundred
    /// kilobytes each.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn writes_larger_together_than_the_journal_are_each_committed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.redb");
        let store = EmbeddedStore::open(&path).unwrap();
        let value = "x".repeat(JOURNAL_BYTES as usize / 3 + 4096);
        // The second fills the journal past half, and a checkpoint follows; the third is in
        // the journal only, and a crash's copy applies it again.
        let names: Vec<String> = (0..3).map(|n| format!("large{n}")).collect();
        // The leader waits for the writer while the three queue, then takes them together.
        let leader = store.inner.writer.lock().unwrap();
        let writes: Vec<_> = names
            .iter()
            .map(|name| {
                let (store, name, value) = (store.clone(), name.clone(), value.clone());
                tokio::spawn(async move {
                    store
                        .registry_write(Registry::Keys, &name, &value, RegistryWrite::Overwrite)
                        .await
                })
            })
            .collect();
        while store.inner.lock().ops.len() < names.len() {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        drop(leader);
        for write in writes {
            write.await.unwrap().unwrap();
        }
        let crashed = tempfile::tempdir().unwrap();
        let copy = crash_copy(&store, &path, crashed.path());
        // Each batch took the journal's path (one fsync), not a durable commit of its own:
        // the third in the half the checkpoint after the second switched to.
        let (_, journaled) = Journals::open(&journal_path(&copy)).unwrap();
        let sequences: Vec<u64> = journaled.iter().map(|record| record.sequence).collect();
        assert_eq!(sequences, [1, 2, 3], "each write is in the journal");
        for (reopened, which) in [
            (store, "the store"),
            (EmbeddedStore::open(&copy).unwrap(), "a crash's copy"),
        ] {
            let registry = reopened.registry(Registry::Keys).await.unwrap();
            for name in &names {
                let kept = registry.get(name);
                assert!(
                    kept == Some(&value),
                    "{which}: {name} is {:?} bytes",
                    kept.map(String::len)
                );
            }
        }
    }

    /// A write larger than the whole journal is made durable in redb itself, between the
    /// writes before and after it, and a crash after its answer keeps all three. The journal
    /// refused it before: a tool result of more than 8 MiB as JSON could never be recorded.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_write_larger_than_the_journal_is_made_durable_without_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.redb");
        let store = EmbeddedStore::open(&path).unwrap();
        let (before, after) = (key("outsized01"), key("outsized02"));
        let record = claimed("rcp_o");
        store.claim(&before, &record).await.unwrap();
        let huge = "x".repeat(JOURNAL_BYTES as usize + 1);
        store
            .registry_write(Registry::Keys, "huge", &huge, RegistryWrite::Overwrite)
            .await
            .unwrap();
        assert!(matches!(
            store.claim(&after, &record).await,
            Ok(Claim::Acquired)
        ));
        let crashed = tempfile::tempdir().unwrap();
        let copy = crash_copy(&store, &path, crashed.path());
        for reopened in [store, EmbeddedStore::open(&copy).unwrap()] {
            let registry = reopened.registry(Registry::Keys).await.unwrap();
            assert!(registry.get("huge") == Some(&huge));
            assert_eq!(reopened.get(&before).await.unwrap(), Some(record.clone()));
            assert_eq!(reopened.get(&after).await.unwrap(), Some(record.clone()));
        }
    }

    /// A finalize applied again from the journal after a crash writes the audit record it
    /// wrote the first time: applying a journaled write reads no clock.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_finalize_applied_again_writes_the_same_audit_record() {
        use crate::store::contract;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.redb");
        let store = EmbeddedStore::open(&path).unwrap();
        let (k, r) = (contract::key(1), contract::record());
        store.claim(&k, &r).await.unwrap();
        let done = r.finalize(crate::store::StoredOutcome {
            class: crate::store::OutcomeClass::Accepted,
            vendor_status: Some(200),
            response: Ok(crate::store::ResultJson::of(
                &serde_json::json!({"content": [], "isError": false}),
            )),
        });
        let receipt = contract::receipt(&r, &k);
        assert!(
            store
                .transition(&k, &r, &done, Some(&receipt))
                .await
                .unwrap()
        );
        let crashed = tempfile::tempdir().unwrap();
        let copy = crashed.path().join("s.redb");
        std::fs::copy(&path, &copy).unwrap();
        std::fs::copy(journal_path(&path), journal_path(&copy)).unwrap();
        let audit = |db: &Database| -> Vec<Vec<u8>> {
            let txn = db.begin_read().unwrap();
            let table = txn.open_table(AUDIT).unwrap();
            table
                .iter()
                .unwrap()
                .map(|entry| entry.unwrap().1.value().to_vec())
                .collect()
        };
        store.get(&k).await.unwrap();
        let first = audit(&store.inner.db);
        assert_eq!(first.len(), 1);
        std::thread::sleep(std::time::Duration::from_millis(5));
        let reopened = EmbeddedStore::open(&copy).unwrap();
        assert_eq!(audit(&reopened.inner.db), first);
    }

    /// A panic after a batch is journaled (before it is applied, or inside the commit of the
    /// pending transaction) leaves the store refusing writes instead of going on from a state
    /// that lacks what the journal holds; a restart applies the journal, so every write that
    /// was journaled is there, the refused ones are not, and writes are taken again.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_panic_in_a_commit_stops_writes_until_a_restart_recovers_the_journal() {
        for step in [PanicAt::Apply, PanicAt::Publish] {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("s.redb");
            let store = EmbeddedStore::open(&path).unwrap();
            let record = claimed("rcp_p");
            let [before, during, refused, after] =
                ["panic0001", "panic0002", "panic0003", "panic0004"].map(key);
            store.claim(&before, &record).await.unwrap();
            // Publish: the claim sits journaled and applied in the pending transaction, and the
            // read that asks for it runs the commit that panics.
            let doomed = match step {
                PanicAt::Apply => during.clone(),
                PanicAt::Publish => {
                    store.claim(&during, &record).await.unwrap();
                    refused.clone()
                }
            };
            store.inner.writer.lock().unwrap().panic_at = Some(step);
            let (panicking, doomed_record) = (store.clone(), record.clone());
            let outcome = tokio::spawn(async move {
                match step {
                    PanicAt::Apply => panicking.claim(&doomed, &doomed_record).await.map(|_| ()),
                    PanicAt::Publish => panicking.get(&doomed).await.map(|_| ()),
                }
            })
            .await;
            assert!(
                outcome.as_ref().map_or(true, Result::is_err),
                "{step:?}: the panicking batch was answered as done: {outcome:?}"
            );
            let error = store.claim(&refused, &record).await.unwrap_err();
            assert!(
                error.0.contains("restart the gateway"),
                "{step:?}: {error:?}"
            );
            drop(store);
            let reopened = EmbeddedStore::open(&path).unwrap();
            assert_eq!(reopened.get(&before).await.unwrap(), Some(record.clone()));
            assert_eq!(
                reopened.get(&during).await.unwrap(),
                Some(record.clone()),
                "{step:?}: a journaled claim was lost"
            );
            assert_eq!(reopened.get(&refused).await.unwrap(), None, "{step:?}");
            assert!(matches!(
                reopened.claim(&after, &record).await,
                Ok(Claim::Acquired)
            ));
        }
    }

    /// A store file whose journal went missing refuses to open rather than silently losing
    /// what the journal held since the last checkpoint.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_store_without_its_journal_refuses_to_open() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.redb");
        let store = EmbeddedStore::open(&path).unwrap();
        let record: ClaimRecord = serde_json::from_value(serde_json::json!({
            "version": 1, "pin": {"request_hash": "h", "binding": "none", "fingerprint": "f"},
            "state": {"state": "claimed"}, "attempts": 0, "lease_until_ms": 0,
            "receipt_id": "rcp_m", "key_supplied": true, "created_at_ms": 0
        }))
        .unwrap();
        store.claim(&key("missing001"), &record).await.unwrap();
        drop(store);
        std::fs::remove_file(journal_path(&path)).unwrap();
        let error = EmbeddedStore::open(&path).unwrap_err();
        assert!(error.0.contains("is missing"), "{error:?}");
    }

    /// One stored record that does not decode fails the operations on it, and only those:
    /// claims and finalizes of other slots in the same group commit go through.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_record_that_does_not_decode_fails_alone() {
        let dir = tempfile::tempdir().unwrap();
        let store = EmbeddedStore::open(&dir.path().join("s.redb")).unwrap();
        let broken = key("broken0001");
        {
            let txn = store.inner.db.begin_write().unwrap();
            txn.open_table(CLAIMS)
                .unwrap()
                .insert(broken.slot().as_str(), b"{not json".as_slice())
                .unwrap();
            txn.commit().unwrap();
        }
        let record: ClaimRecord = serde_json::from_value(serde_json::json!({
            "version": 1, "pin": {"request_hash": "h", "binding": "none", "fingerprint": "f"},
            "state": {"state": "claimed"}, "attempts": 0, "lease_until_ms": 0,
            "receipt_id": "rcp_e", "key_supplied": true, "created_at_ms": 0
        }))
        .unwrap();
        let next = record.renew(1);
        let healthy: Vec<ClaimKey> = (0..20).map(|n| key(&format!("healthy{n:04}"))).collect();
        let (broken_claim, broken_transition, healthy_claims) = tokio::join!(
            store.claim(&broken, &record),
            store.transition(&broken, &record, &next, None),
            futures_join(healthy.iter().map(|k| store.claim(k, &record)))
        );
        assert!(broken_claim.is_err());
        assert!(broken_transition.is_err());
        for claimed in healthy_claims {
            assert_eq!(claimed.unwrap(), Claim::Acquired);
        }
    }

    /// The leader's journal entry carries a claim record as the JSON the claims table stores,
    /// not as a string escaping it again.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_claim_is_journaled_as_its_own_json() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.redb");
        let store = EmbeddedStore::open(&path).unwrap();
        let record = claimed("rcp_raw \"quoted\"");
        assert!(matches!(
            store.claim(&key("raw00001"), &record).await,
            Ok(Claim::Acquired)
        ));
        let copy = dir.path().join("copy.journal");
        std::fs::copy(journal_path(&path), &copy).unwrap();
        let (_, records) = Journal::open(&copy, JOURNAL_BYTES).unwrap();
        let entry = String::from_utf8(records.last().unwrap().payload.clone()).unwrap();
        assert!(
            entry.contains(&serde_json::to_string(&record).unwrap()),
            "{entry}"
        );
    }

    /// Journals written before records were journaled as JSON (a string holding it) are
    /// still applied on open: a gateway upgraded after a crash loses nothing.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_journal_of_the_earlier_format_is_applied_on_open() {
        use crate::store::contract;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.redb");
        drop(EmbeddedStore::open(&path).unwrap());
        let (k, r) = (contract::key(1), contract::record());
        let done = r.finalize(crate::store::StoredOutcome {
            class: crate::store::OutcomeClass::Accepted,
            vendor_status: Some(200),
            response: Ok(crate::store::ResultJson::of(
                &serde_json::json!({"content": [], "isError": false}),
            )),
        });
        let receipt = contract::receipt(&r, &k);
        let earlier = [
            serde_json::json!([{"Claim": {
                "slot": k.slot(),
                "record": serde_json::to_string(&r).unwrap(),
                "lease": null,
            }}]),
            serde_json::json!([{"Transition": {
                "slot": k.slot(),
                "expected_version": r.version,
                "next_version": done.version,
                "next": serde_json::to_string(&done).unwrap(),
                "lease": null,
                "finalized_since": done.lease_until_ms,
                "receipt": receipt,
            }}]),
        ];
        {
            let (mut journal, records) =
                Journal::open(&journal_path(&path), JOURNAL_BYTES).unwrap();
            assert!(records.is_empty());
            for (sequence, entry) in (1..).zip(&earlier) {
                journal
                    .append(sequence, &serde_json::to_vec(entry).unwrap())
                    .unwrap();
            }
        }
        let store = EmbeddedStore::open(&path).unwrap();
        assert_eq!(store.get(&k).await.unwrap(), Some(done));
        assert_eq!(
            store
                .receipt(&receipt.workspace, &receipt.id)
                .await
                .unwrap(),
            Some(receipt)
        );
    }

    /// A write alone is committed on its caller's thread (a lane's, in the gateway): no
    /// hand-off to wait for. With another call waiting for the store, the commit goes to a
    /// blocking-pool thread, so its fsync does not hold the lane's other calls.
    #[test]
    fn a_commit_leaves_the_callers_thread_when_other_calls_wait() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let store = EmbeddedStore::open(&dir.path().join("s.redb")).unwrap();
        let record = claimed("rcp_lane");
        let here = std::thread::current().id();
        let journaled_on = || store.inner.writer.lock().unwrap().journaled_on.clone();
        runtime
            .block_on(store.claim(&key("lane0001"), &record))
            .unwrap();
        assert_eq!(journaled_on(), vec![here], "alone: committed inline");
        let other = Waiting::count(&store.inner.waiting);
        runtime
            .block_on(store.claim(&key("lane0002"), &record))
            .unwrap();
        drop(other);
        let threads = journaled_on();
        assert_eq!(threads.len(), 2);
        assert_ne!(
            threads[1], here,
            "with another call waiting: committed off the lane"
        );
    }

    /// Makes the leader begin a checkpoint after its next batch, whose commit then waits
    /// until the returned sender sends or is dropped.
    fn hold_next_checkpoint(store: &EmbeddedStore) -> std::sync::mpsc::Sender<()> {
        let (release, gate) = std::sync::mpsc::channel();
        let mut writer = store.inner.writer.lock().unwrap();
        // Applied here, not by the lane's idle moment, which would begin the checkpoint
        // after the batch before.
        store.inner.apply_unapplied(&mut writer).unwrap();
        writer.checkpoint_gate = Some(gate);
        writer.checkpoint_now = true;
        release
    }

    /// How many batches the running checkpoint has answered and not yet applied (once its
    /// commit has returned, the leader applies them a few a round).
    fn deferred_batches(store: &EmbeddedStore) -> Option<usize> {
        let writer = store.inner.writer.lock().unwrap();
        writer
            .in_flight
            .as_ref()
            .map(|in_flight| in_flight.deferred.len())
    }

    /// Waits until the running checkpoint's commit has returned (its thread finished, not
    /// yet joined by the leader).
    async fn commit_returned(store: &EmbeddedStore) {
        let returned = || {
            store
                .inner
                .writer
                .lock()
                .unwrap()
                .in_flight
                .as_ref()
                .is_none_or(|in_flight| {
                    in_flight
                        .commit
                        .as_ref()
                        .is_none_or(std::thread::JoinHandle::is_finished)
                })
        };
        tokio::time::timeout(std::time::Duration::from_secs(10), async {
            while !returned() {
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            }
        })
        .await
        .expect("the checkpoint's commit returns once released");
    }

    /// Makes the next journal append fail, as a full disk would.
    fn refuse_next_append(store: &EmbeddedStore) {
        store
            .inner
            .writer
            .lock()
            .unwrap()
            .journals
            .active()
            .refuse_next = true;
    }

    /// Leases are held in the pending transaction and reach the leases table as it commits:
    /// the sweeper, live and after a crash that left them only in the journal, finds the dead
    /// holder still reserved, and neither a lease taken and dropped before any commit nor one
    /// dropped after a commit took it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_sweeper_finds_exactly_the_reserved_leases_however_commits_fall() {
        use crate::store::contract::{receipt, record_leased_until};
        use crate::store::{OutcomeClass, StoredOutcome};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.redb");
        let store = EmbeddedStore::open(&path).unwrap();
        let dead = record_leased_until(1);
        let settle = |k: &ClaimKey| {
            let settled = dead.finalize(StoredOutcome {
                class: OutcomeClass::Unknown,
                vendor_status: None,
                response: Err(serde_json::json!({"code": -32000})),
            });
            let receipt = receipt(&settled, k);
            (settled, receipt)
        };
        let (held, dropped, across, renewed) =
            (key("held"), key("dropped"), key("across"), key("renewed"));
        // `across` is committed (a read publishes) before it is finalized.
        store.claim(&across, &dead).await.unwrap();
        assert!(store.get(&across).await.unwrap().is_some());
        for k in [&held, &dropped, &renewed] {
            store.claim(k, &dead).await.unwrap();
        }
        for k in [&dropped, &across] {
            let (settled, receipt) = settle(k);
            assert!(
                store
                    .transition(k, &dead, &settled, Some(&receipt))
                    .await
                    .unwrap()
            );
        }
        // Renewed past now in the transaction that claimed it: not dead.
        let live = dead.renew(u64::MAX / 2);
        assert!(
            store
                .transition(&renewed, &dead, &live, None)
                .await
                .unwrap()
        );
        assert_eq!(
            store.inner.writer.lock().unwrap().checkpointed,
            0,
            "the test needs every write after the last checkpoint"
        );
        let crashed = tempfile::tempdir().unwrap();
        let copy = crash_copy(&store, &path, crashed.path());
        let reopened = EmbeddedStore::open(&copy).unwrap();
        for store in [&store, &reopened] {
            let found: Vec<String> = store
                .expired_leases(crate::clock::now_ms(), 100)
                .await
                .unwrap()
                .into_iter()
                .map(|(slot, _)| slot)
                .collect();
            assert_eq!(found, vec![held.slot()]);
        }
    }

    /// What a crash would leave of `store` (its file and journal at `path`), copied into
    /// `dir`. Taken while no commit is under way: the leader checkpoints after answering, and
    /// a copy of the two files made meanwhile could pair a store file from before its
    /// checkpoint with a journal from after, which no crash leaves.
    fn crash_copy(store: &EmbeddedStore, path: &Path, dir: &Path) -> std::path::PathBuf {
        let _idle = store.inner.writer.lock().unwrap();
        let copy = dir.join("s.redb");
        std::fs::copy(path, &copy).unwrap();
        std::fs::copy(journal_path(path), journal_path(&copy)).unwrap();
        copy
    }

    async fn futures_join<F: std::future::Future>(
        futures: impl Iterator<Item = F>,
    ) -> Vec<F::Output> {
        let handles: Vec<_> = futures.collect();
        let mut out = Vec::new();
        for f in handles {
            out.push(f.await);
        }
        out
    }
}
