//! The sandbox: wasmtime engine, compile cache, per-call limits, and the rules a component's
//! manifest must pass ([`manifest`]).
//!
//! Its own crate, depending on nothing of the gateway: the boundary between running
//! components and everything else (ADR-0051). A connector author's tests reach it through the
//! `obol` binary (`obol harness`, ADR-0056).
//!
//! *Architecture Invariant:* a component gets nothing but the `log` import. Every other import
//! it declares (the WASI interfaces Rust's standard library links against) is defined as a trap,
//! so a guest has no network, filesystem, environment, clock or randomness to reach for.
//!
//! Each tool call runs in a fresh `Store` instantiated from a pre-linked [`InstancePre`]: no
//! state survives between tool calls, a memory cap bounds every instance, and an epoch
//! deadline stops a guest that does not return. A call's `interpret` runs in the instance its
//! `prepare` ran in while the pool has room to keep it across the vendor's reply ([`Warm`],
//! ADR-0064); otherwise in a fresh one.
//!
//! Guest calls run inline on the calling task (ADR-0049): no thread hand-off per call. A guest
//! yields to the executor at every epoch tick, so one that spins shares its worker with the
//! gateway's other calls until its deadline instead of taking the worker.

mod cache;
mod legacy;
pub mod manifest;

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use std::sync::atomic::AtomicU64;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use wasmtime::component::{Component, HasSelf, Linker};
use wasmtime::{
    Config, Engine, InstanceAllocationStrategy, PoolingAllocationConfig, ResourceLimiter, Store,
    Trap, UpdateDeadline,
};

pub use cache::CompileCache;

/// Limits applied to every guest call.
#[derive(Debug, Clone)]
pub struct RuntimeConfig {
    pub memory_limit_bytes: usize,
    pub call_deadline: Duration,
    pub max_output_bytes: usize,
    /// Where compiled components are cached, keyed by their sha256.
    pub cache_dir: Option<PathBuf>,
    /// How many guest calls may run at once (each holds one pooled instance slot).
    pub max_concurrent_calls: u32,
}

impl Default for RuntimeConfig {
    /// The documented defaults; the config file overrides them field by field.
    fn default() -> RuntimeConfig {
        RuntimeConfig {
            memory_limit_bytes: 64 << 20,
            call_deadline: Duration::from_secs(2),
            max_output_bytes: 4 << 20,
            cache_dir: None,
            max_concurrent_calls: 64,
        }
    }
}

/// Bindings generated from the current contract; components built against an older released
/// one are translated to these types at the runtime's boundary (`legacy`).
pub mod wit {
    wasmtime::component::bindgen!({
        path: "../../wit/since_v0.2.0",
        world: "connector",
        // Inline on the caller's task, yielding at every epoch tick (ADR-0049). `manifest`
        // stays synchronous: it runs once, at load, off any request.
        exports: { "prepare": async, "interpret": async },
    });
    pub use self::obol::connector::types::{
        BodyRule, BrokerKind, Content, EffectSpec, Header, Image, Method, OutcomeClass,
        Propagation, RouteKind, StatusRange, Tool,
    };

    impl<T: Send + 'static> ConnectorPre<T> {
        /// `instantiate_async` without its second type check. `ConnectorPre::new` ran, at
        /// load, the same check of the same function types that bindgen's `load` runs again
        /// on every instance (about 5 k instructions an instance); the only part of the types
        /// an instance adds is its own resources, and this contract has none. That check is
        /// also what tells a 0.2.0 component from a 0.1.0 one in `Runtime::load`, so the
        /// 0.1.0 component's test fails if it ever stops running.
        pub async fn instantiate_checked_at_load(
            &self,
            mut store: impl wasmtime::AsContextMut<Data = T>,
        ) -> wasmtime::Result<Connector> {
            let mut store = store.as_context_mut();
            let instance = self.instance_pre.instantiate_async(&mut store).await?;
            let mut export = |index: &wasmtime::component::ComponentExportIndex| {
                instance.get_func(&mut store, index).ok_or_else(|| {
                    wasmtime::format_err!("host: an export index from load is not on its instance")
                })
            };
            Ok(Connector {
                manifest: export(&self.indices.manifest)?,
                prepare: export(&self.indices.prepare)?,
                interpret: export(&self.indices.interpret)?,
            })
        }
    }
}

/// The contract a component was built against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Contract {
    V0_1,
    V0_2,
}

impl Contract {
    pub fn label(self) -> &'static str {
        match self {
            Contract::V0_1 => "obol:connector@0.1.0",
            Contract::V0_2 => "obol:connector@0.2.0",
        }
    }
}

/// A component linked for its contract version.
enum Pre {
    Current(wit::ConnectorPre<GuestState>),
    V0_1(legacy::ConnectorPre<GuestState>),
}

/// An instance, for one call.
enum Instance {
    Current(wit::Connector),
    V0_1(legacy::Connector),
}

/// How often the epoch advances: deadlines are rounded up to it, and a guest that runs longer
/// than one tick yields its worker to other tasks at each.
const EPOCH_TICK: Duration = Duration::from_millis(2);
/// Guest log lines are truncated to this length and limited in number per call, so a
/// component cannot flood the operator's logs.
const MAX_LOG_LINE: usize = 1024;
const MAX_LOG_LINES_PER_CALL: u32 = 32;

/// Why a guest call did not produce a value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GuestFailure {
    #[error("exceeded its {0} ms deadline")]
    Deadline(u128),
    #[error("exceeded its memory limit of {0} MiB")]
    Memory(usize),
    #[error("trapped: {0}")]
    Trap(String),
    #[error("all {0} guest slots are busy")]
    Busy(u32),
}

/// Why a component could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("not a valid connector component: {0}")]
    Compile(String),
    #[error(
        "the component implements neither obol:connector@0.2.0 nor obol:connector@0.1.0: {0}{hint}",
        hint = export_hint(.0)
    )]
    Contract(String),
    #[error("the component cannot load: {0}")]
    Refused(String),
    #[error("the component's manifest() failed: {0}")]
    Manifest(GuestFailure),
}

/// What to do about a missing export: a connector crate exports its functions with the SDK's
/// macro, and one without it builds a component that exports nothing.
fn export_hint(message: &str) -> &'static str {
    match message.contains("no export") {
        true => {
            " (a connector crate ends with `obol_sdk::export!(YourConnector);`, which exports its functions)"
        }
        false => "",
    }
}

/// A compiled, pre-linked component, ready to be instantiated per call.
pub struct Guest {
    pre: Pre,
    /// sha256 of the component's bytes, hex.
    pub digest: String,
    pub contract: Contract,
    /// The runtime's count of compiled components alive, which this one leaves when dropped.
    alive: Arc<AtomicUsize>,
}

impl Drop for Guest {
    fn drop(&mut self) {
        self.alive.fetch_sub(1, Ordering::Relaxed);
    }
}

impl std::fmt::Debug for Guest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Guest")
            .field("digest", &self.digest)
            .finish()
    }
}

/// The per-call store data.
pub struct GuestState {
    limits: MemoryLimit,
    connector: Arc<str>,
    log_lines: u32,
    /// Keeps the epoch ticking while this guest's store lives.
    _ticking: Ticking,
}

/// A memory limiter that remembers whether it refused a growth, so that the trap that
/// follows (the guest's allocator aborts) can be reported as what it is.
struct MemoryLimit {
    max_bytes: usize,
    refused: AtomicBool,
}

impl ResourceLimiter for MemoryLimit {
    fn memory_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        let allowed = desired <= self.max_bytes;
        if !allowed {
            self.refused.store(true, Ordering::Relaxed);
        }
        Ok(allowed)
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        Ok(desired <= 100_000)
    }
}

impl legacy::obol::connector::log::Host for GuestState {
    fn log(&mut self, level: legacy::obol::connector::log::Level, message: String) {
        use legacy::obol::connector::log::Level as Old;
        use wit::obol::connector::log::{Host, Level};
        let level = match level {
            Old::Debug => Level::Debug,
            Old::Info => Level::Info,
            Old::Warn => Level::Warn,
        };
        Host::log(self, level, message);
    }
}

impl wit::obol::connector::log::Host for GuestState {
    fn log(&mut self, level: wit::obol::connector::log::Level, message: String) {
        use wit::obol::connector::log::Level;
        self.log_lines += 1;
        if self.log_lines > MAX_LOG_LINES_PER_CALL {
            return;
        }
        let mut message = message;
        if message.len() > MAX_LOG_LINE {
            let mut cut = MAX_LOG_LINE;
            while !message.is_char_boundary(cut) {
                cut -= 1;
            }
            message.truncate(cut);
            message.push('…');
        }
        // Escaped, so a component cannot forge log lines with newlines or terminal escapes.
        let connector = &*self.connector;
        let message = message.escape_debug().to_string();
        match level {
            Level::Debug => tracing::debug!(target: "obol::guest", connector, "{message}"),
            Level::Info => tracing::info!(target: "obol::guest", connector, "{message}"),
            Level::Warn => tracing::warn!(target: "obol::guest", connector, "{message}"),
        }
    }
}

/// Dirty bytes of a slot's linear memory kept resident between calls (zeroed in place): a
/// Rust guest's stack top and small heap fit. RSS grows by at most this per pooled memory
/// (`max_concurrent_calls` × 2) and `KEEP_RESIDENT_TABLE` per pooled table (× 4), and only
/// by pages guests actually wrote.
const KEEP_RESIDENT_MEMORY: usize = 1 << 20;
/// A component's tables are a few KiB; this covers them with room.
const KEEP_RESIDENT_TABLE: usize = 64 << 10;

/// Whether slots can be reset in place safely: PAGEMAP_SCAN (Linux 6.7+) finds the dirty
/// pages, but a page swapped out is not "present" and would be neither zeroed nor released,
/// so the next guest in that slot, of any connector, could read it back. In place only on a
/// host without swap when the gateway starts (`/proc/swaps` lists none) and with the ioctl;
/// otherwise every slot is decommitted with `madvise`, as wasmtime does by default.
fn resets_in_place() -> bool {
    let no_swap = std::fs::read_to_string("/proc/swaps")
        .is_ok_and(|swaps| swaps.lines().skip(1).all(|line| line.trim().is_empty()));
    no_swap && wasmtime::PoolingAllocationConfig::is_pagemap_scan_available()
}

/// How a guest's loads and stores are kept inside its linear memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemoryGuard {
    /// Each pooled memory reserves the 4 GiB a 32-bit index can reach, plus guard pages: an
    /// access outside the memory faults and traps, and the compiled code checks nothing.
    /// About 4 GiB of address space (not memory) per pooled memory: `max_concurrent_calls`
    /// × 2 of them.
    GuardPages,
    /// Each pooled memory reserves only the memory cap, and compiled code checks the bounds
    /// of every access (guests run ~10 % slower): where the host limits address space.
    BoundsChecks,
}

/// Address space a pooled memory reserves beyond its cap under [`MemoryGuard::BoundsChecks`].
const BOUNDS_CHECKED_GUARD: u64 = 64 << 10;

/// The engine, its instance pool sized for `max_concurrent_calls` (the pool's address space
/// is reserved here, so a host that refuses it fails here).
fn engine(limits: &RuntimeConfig, guard: MemoryGuard) -> anyhow::Result<Engine> {
    let mut pool = PoolingAllocationConfig::default();
    // Each in-flight guest call holds one instance; the semaphore in `Runtime` never lets
    // more calls in than the pool has slots.
    let instances = limits.max_concurrent_calls.max(1);
    pool.total_component_instances(instances)
        .total_core_instances(instances * 4)
        .total_memories(instances * 2)
        .total_tables(instances * 4)
        // A guest call runs on a fiber whose stack comes from the pool.
        .total_stacks(instances)
        .max_memory_size(limits.memory_limit_bytes);
    if resets_in_place() {
        // Resetting a slot with `madvise` flushed every core's TLB after each call (IPIs
        // were 13 % of the gateway's CPU at c=32). With PAGEMAP_SCAN only the pages a
        // guest dirtied are zeroed with memset (one ioctl, no page-table change) while
        // they are under these sizes; a larger working set (a memory bomb) is zeroed up
        // to the size and decommitted beyond it.
        pool.pagemap_scan(wasmtime::Enabled::Yes)
            .linear_memory_keep_resident(KEEP_RESIDENT_MEMORY)
            .table_keep_resident(KEEP_RESIDENT_TABLE);
    }
    let mut config = Config::new();
    config
        .wasm_component_model(true)
        .epoch_interruption(true)
        .allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
    // For profiling a connector (docs/performance.md): wasmtime writes /tmp/perf-<pid>.map,
    // which perf (and a reader of a callgrind profile's bare addresses) uses to name the
    // guest's compiled functions. Off unless asked for: the file is readable by every local
    // user, gives away where the code sits in memory, grows with every component loaded and
    // is never removed.
    if std::env::var("OBOL_WASM_PERFMAP").is_ok_and(|value| value == "1") {
        config.profiler(wasmtime::ProfilingStrategy::PerfMap);
    }
    match guard {
        // wasmtime's defaults: a 4 GiB reservation (or the cap, if larger) and its guards.
        MemoryGuard::GuardPages => {
            config.memory_reservation((4u64 << 30).max(limits.memory_limit_bytes as u64))
        }
        MemoryGuard::BoundsChecks => config
            .memory_reservation(limits.memory_limit_bytes as u64)
            .memory_guard_size(BOUNDS_CHECKED_GUARD),
    };
    Engine::new(&config).map_err(|e| anyhow::anyhow!("{e:#}"))
}

/// The engine and everything shared by all components.
pub struct Runtime {
    engine: Engine,
    linker: Linker<GuestState>,
    cache: Option<CompileCache>,
    limits: RuntimeConfig,
    slots: Arc<Semaphore>,
    /// Free slots below which a prepared instance is not kept for its `interpret`: kept ones
    /// wait on vendors, and the guests that run meanwhile need slots of their own.
    keep_while_free: usize,
    /// Slots whose spent instance waits to be reset ([`Runtime::retire`]): taken, but free
    /// within the lane's next turn, so `prepare` counts them as free when it decides to keep.
    retiring: Arc<AtomicUsize>,
    /// Compiled components alive (`Guest`s): what hot swaps must not pile up.
    alive: Arc<AtomicUsize>,
    /// Instances made for calls, since start.
    instances: AtomicU64,
    memory_guard: MemoryGuard,
    ticker: EpochTicker,
}

/// Counts a spent instance in [`Runtime`]'s `retiring` until it is dropped.
struct Retiring(Arc<AtomicUsize>);

impl Retiring {
    fn count(retiring: &Arc<AtomicUsize>) -> Retiring {
        retiring.fetch_add(1, Ordering::Relaxed);
        Retiring(Arc::clone(retiring))
    }
}

impl Drop for Retiring {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The instance a call's `prepare` ran in, kept (with its pool slot) for the same call's
/// `interpret`: one instantiation and one slot reset a call instead of two (ADR-0064).
pub struct Warm {
    store: Store<GuestState>,
    instance: Instance,
    /// The component it is an instance of: `interpret` takes it only for the same one.
    digest: String,
    _slot: OwnedSemaphorePermit,
}

impl std::fmt::Debug for Warm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Warm")
            .field("digest", &self.digest)
            .finish()
    }
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime")
            .field("limits", &self.limits)
            .finish()
    }
}

/// Memory mappings a call slot can take: its fiber stack and that stack's guard page (two,
/// from the start), then the memories and tables a call makes accessible (at most five per
/// slot measured at c=32), rounded up.
const MAPPINGS_PER_SLOT: u64 = 8;
/// Mappings the rest of the process takes: libraries, thread stacks, malloc arenas, the store.
const MAPPINGS_BESIDE_THE_POOL: u64 = 1_000;

/// Refuses a pool that the host's memory mappings (`vm.max_map_count`) cannot hold: the
/// engine would fail to create it, or calls would fail once enough slots were in use. A host
/// without `/proc/sys/vm/max_map_count` is not checked.
fn check_mappings(slots: u32) -> anyhow::Result<()> {
    let Some(limit) = std::fs::read_to_string("/proc/sys/vm/max_map_count")
        .ok()
        .and_then(|text| text.trim().parse::<u64>().ok())
    else {
        return Ok(());
    };
    let needed = u64::from(slots) * MAPPINGS_PER_SLOT + MAPPINGS_BESIDE_THE_POOL;
    if needed <= limit {
        return Ok(());
    }
    let most = limit.saturating_sub(MAPPINGS_BESIDE_THE_POOL) / MAPPINGS_PER_SLOT;
    let remedy = if most == 0 {
        "too few for even one call slot: raise vm.max_map_count".to_owned()
    } else {
        format!("set max_concurrent_calls to at most {most}, or raise vm.max_map_count")
    };
    anyhow::bail!(
        "[runtime] max_concurrent_calls = {slots} needs about {needed} memory mappings \
         ({MAPPINGS_PER_SLOT} a call slot) and this host's vm.max_map_count is {limit}: {remedy}"
    )
}

impl Runtime {
    pub fn new(limits: RuntimeConfig) -> anyhow::Result<Runtime> {
        let instances = limits.max_concurrent_calls.max(1);
        check_mappings(instances)?;
        // Guard pages first; a host that refuses their address space gets bounds checks.
        let (engine, memory_guard) = match engine(&limits, MemoryGuard::GuardPages) {
            Ok(engine) => (engine, MemoryGuard::GuardPages),
            Err(refused) => {
                tracing::warn!(
                    "the host refused 4 GiB of address space per guest memory ({refused}); \
                     guest memory accesses are bounds-checked instead, which makes guests slower"
                );
                let engine = engine(&limits, MemoryGuard::BoundsChecks)?;
                (engine, MemoryGuard::BoundsChecks)
            }
        };
        let mut linker = Linker::new(&engine);
        wit::obol::connector::log::add_to_linker::<GuestState, HasSelf<GuestState>>(
            &mut linker,
            |state| state,
        )
        .map_err(|e| anyhow::anyhow!("{e}"))?;
        legacy::obol::connector::log::add_to_linker::<GuestState, HasSelf<GuestState>>(
            &mut linker,
            |state| state,
        )
        .map_err(|e| anyhow::anyhow!("{e}"))?;
        let cache = limits.cache_dir.clone().map(CompileCache::new);
        Ok(Runtime {
            ticker: EpochTicker::start(engine.clone()),
            engine,
            linker,
            cache,
            slots: Arc::new(Semaphore::new(instances as usize)),
            keep_while_free: (instances as usize).div_ceil(4),
            retiring: Arc::new(AtomicUsize::new(0)),
            alive: Arc::default(),
            instances: AtomicU64::new(0),
            memory_guard,
            limits,
        })
    }

    pub fn limits(&self) -> &RuntimeConfig {
        &self.limits
    }

    /// How guests' memory accesses are contained on this host.
    pub fn memory_guard(&self) -> MemoryGuard {
        self.memory_guard
    }

    /// How many compiled component versions are in memory: every one a snapshot serves, and
    /// a replaced one until its last call ends.
    pub fn components_in_memory(&self) -> usize {
        self.alive.load(Ordering::Relaxed)
    }

    /// Instance slots free now. A spent instance's slot counts as taken until it is reset
    /// (tests read it).
    pub fn free_slots(&self) -> usize {
        self.slots.available_permits()
    }

    /// How many instances calls have made since start: one a component call when its
    /// `prepare`'s instance is kept for its `interpret`, two when not.
    pub fn instances_made(&self) -> u64 {
        self.instances.load(Ordering::Relaxed)
    }

    /// Compiles (or loads from the cache) and links a component, and asks it for its manifest.
    pub fn load(&self, bytes: &[u8]) -> Result<(Guest, wit::Manifest), LoadError> {
        let digest = hex::encode(Sha256::digest(bytes));
        let component = match &self.cache {
            Some(cache) => cache.get_or_compile(&self.engine, &digest, bytes),
            None => Component::new(&self.engine, bytes).map_err(|e| format!("{e:#}")),
        }
        .map_err(LoadError::Compile)?;
        let mut linker = self.linker.clone();
        linker
            .define_unknown_imports_as_traps(&component)
            .map_err(|e| LoadError::Contract(format!("{e:#}")))?;
        let linked = linker
            .instantiate_pre(&component)
            .map_err(|e| LoadError::Contract(format!("{e:#}")))?;
        // The newest contract first; a component exports one world's functions or the other's.
        let (pre, contract) = match wit::ConnectorPre::new(linked.clone()) {
            Ok(pre) => (Pre::Current(pre), Contract::V0_2),
            Err(current) => match legacy::ConnectorPre::new(linked) {
                Ok(pre) => (Pre::V0_1(pre), Contract::V0_1),
                Err(_) => return Err(LoadError::Contract(format!("{current:#}"))),
            },
        };
        self.alive.fetch_add(1, Ordering::Relaxed);
        let guest = Guest {
            pre,
            digest,
            contract,
            alive: Arc::clone(&self.alive),
        };
        let manifest = self
            .call_blocking(&guest, "loading", |instance, store| {
                Ok(match instance {
                    Instance::Current(connector) => Ok(connector.call_manifest(store)?),
                    Instance::V0_1(connector) => legacy::manifest(connector.call_manifest(store)?),
                })
            })
            .map_err(LoadError::Manifest)?
            .map_err(LoadError::Refused)?;
        Ok((guest, manifest))
    }

    /// Runs `prepare` inline on the caller's task. A request comes with the instance it was
    /// prepared in, kept for the call's `interpret` while the pool has room for it.
    pub async fn prepare(
        &self,
        guest: &Guest,
        connector: &str,
        tool: &str,
        arguments: String,
        facts: wit::ConnectionFacts,
    ) -> Result<Result<(wit::OutboundRequest, Option<Warm>), wit::PrepareError>, GuestFailure> {
        let slot = self.slot().await?;
        let (mut store, instance) = self.instantiate(guest, connector).await?;
        let outcome = match &instance {
            Instance::Current(c) => c.call_prepare(&mut store, tool, &arguments, &facts).await,
            Instance::V0_1(c) => c
                .call_prepare(&mut store, tool, &arguments, &legacy::facts(&facts))
                .await
                .map(legacy::prepared),
        };
        let prepared = outcome.map_err(|error| self.classify_failure(&store, &error))?;
        // Checked after `prepare`: under a burst, the slots other calls took meanwhile count.
        let free = self.slots.available_permits() + self.retiring.load(Ordering::Relaxed);
        let keep = free >= self.keep_while_free;
        let warm = match &prepared {
            Ok(_) if keep => Some(Warm {
                store,
                instance,
                digest: guest.digest.clone(),
                _slot: slot,
            }),
            _ => {
                self.retire(store, slot);
                None
            }
        };
        Ok(prepared.map(|request| (request, warm)))
    }

    /// Runs `interpret` inline on the caller's task, in the instance `prepare` kept when
    /// there is one (of this component), else in a fresh one.
    pub async fn interpret(
        &self,
        guest: &Guest,
        connector: &str,
        tool: &str,
        response: wit::VendorResponse,
        warm: Option<Warm>,
    ) -> Result<Result<wit::ToolOutput, wit::InterpretError>, GuestFailure> {
        // The slot is bound first so that it is dropped last, after the store, should this
        // future be dropped mid-guest.
        let (slot, mut store, instance) = match warm {
            Some(warm) if warm.digest == guest.digest => {
                let Warm {
                    mut store,
                    instance,
                    _slot: slot,
                    ..
                } = warm;
                // A deadline and a log budget of its own, as a fresh instance has.
                self.arm(&mut store);
                store.data_mut().log_lines = 0;
                (slot, store, instance)
            }
            _ => {
                let slot = self.slot().await?;
                let (store, instance) = self.instantiate(guest, connector).await?;
                (slot, store, instance)
            }
        };
        let outcome = match instance {
            Instance::Current(c) => c.call_interpret(&mut store, tool, &response).await,
            Instance::V0_1(c) => c
                .call_interpret(&mut store, tool, &legacy::response(&response))
                .await
                .map(legacy::output),
        };
        let outcome = outcome.map_err(|error| self.classify_failure(&store, &error));
        self.retire(store, slot);
        outcome
    }

    /// Resets a spent instance's pool slot, and gives the slot back, off the call's path: in
    /// a task that runs once the lane runs out of ready work or at its periodic I/O poll.
    /// When the call's final write completes inline (the embedded store's lone write) that
    /// is after its answer is handed to the connection; when the write waits on the store,
    /// while it waits. Dropping the store resets the slot in place, a `PAGEMAP_SCAN` of its
    /// memory (8 µs p50 at c=1 on a 2.4 GHz host) and its dirtied pages cleared. The store is dropped before the permit, so the pool never hands
    /// out a slot not yet reset.
    fn retire(&self, store: Store<GuestState>, slot: OwnedSemaphorePermit) {
        let Ok(lane) = tokio::runtime::Handle::try_current() else {
            return drop((store, slot));
        };
        // One value, dropped in its fields' order even if the lane drops the task unpolled.
        // Uncounted before the permit returns: the keep rule may briefly see one slot too
        // few, never one too many.
        let spent = (store, Retiring::count(&self.retiring), slot);
        lane.spawn(async move {
            tokio::task::yield_now().await;
            drop(spent);
        });
    }

    /// Waits for one of the pool's instance slots, at most one deadline. A slot is held for
    /// a guest call, or for a kept instance while its call waits on the vendor, which only
    /// happens while a quarter of the pool is free or waiting for its reset, and then until
    /// its lane has reset it (the lane's next turn, [`Runtime::retire`]): a longer wait means
    /// the gateway is
    /// overloaded, and the caller gets a retryable answer instead of queueing without bound
    /// behind guests spinning to their deadline.
    async fn slot(&self) -> Result<OwnedSemaphorePermit, GuestFailure> {
        if let Ok(permit) = Arc::clone(&self.slots).try_acquire_owned() {
            return Ok(permit);
        }
        tokio::time::timeout(
            self.limits.call_deadline,
            Arc::clone(&self.slots).acquire_owned(),
        )
        .await
        .ok()
        .and_then(Result::ok)
        .ok_or(GuestFailure::Busy(self.limits.max_concurrent_calls))
    }

    /// A fresh store and instance for one call. The deadline counts from here.
    async fn instantiate(
        &self,
        guest: &Guest,
        connector: &str,
    ) -> Result<(Store<GuestState>, Instance), GuestFailure> {
        let mut store = self.store(connector.into());
        self.arm(&mut store);
        self.instances.fetch_add(1, Ordering::Relaxed);
        let instance = match &guest.pre {
            Pre::Current(pre) => pre
                .instantiate_checked_at_load(&mut store)
                .await
                .map(Instance::Current),
            // Off the measured path: 0.1.0 components keep bindgen's per-instance check.
            Pre::V0_1(pre) => pre.instantiate_async(&mut store).await.map(Instance::V0_1),
        };
        match instance {
            Ok(instance) => Ok((store, instance)),
            Err(error) => Err(self.classify_failure(&store, &error)),
        }
    }

    /// Starts a guest call's deadline: at every epoch tick before it the guest yields to the
    /// executor, at the first tick past it the guest traps.
    fn arm(&self, store: &mut Store<GuestState>) {
        let deadline = Instant::now() + self.limits.call_deadline;
        store.set_epoch_deadline(1);
        store.epoch_deadline_callback(move |_| {
            Ok(if Instant::now() >= deadline {
                UpdateDeadline::Interrupt
            } else {
                // Tokio's own yield: the task goes to the back of the run queue. A plain wake
                // from inside the poll would put it in the worker's next-task slot and run
                // the guest again before the calls waiting behind it (seen: 165 ms per normal
                // call beside two spinners, against the 2 ms tick).
                UpdateDeadline::YieldCustom(1, Box::pin(tokio::task::yield_now()))
            })
        });
    }

    /// Runs `body` synchronously on this thread (loading only: no request waits on it).
    fn call_blocking<R>(
        &self,
        guest: &Guest,
        connector: &str,
        body: impl FnOnce(Instance, &mut Store<GuestState>) -> wasmtime::Result<R>,
    ) -> Result<R, GuestFailure> {
        let mut store = self.store(connector.into());
        let ticks = self
            .limits
            .call_deadline
            .as_nanos()
            .div_ceil(EPOCH_TICK.as_nanos());
        store.set_epoch_deadline(u64::try_from(ticks).unwrap_or(u64::MAX).max(1));
        store.epoch_deadline_trap();
        let outcome = match &guest.pre {
            Pre::Current(pre) => pre.instantiate(&mut store).map(Instance::Current),
            Pre::V0_1(pre) => pre.instantiate(&mut store).map(Instance::V0_1),
        }
        .and_then(|instance| body(instance, &mut store));
        outcome.map_err(|error| self.classify_failure(&store, &error))
    }

    /// A store with the per-call memory cap.
    fn store(&self, connector: Arc<str>) -> Store<GuestState> {
        let state = GuestState {
            limits: MemoryLimit {
                max_bytes: self.limits.memory_limit_bytes,
                refused: AtomicBool::new(false),
            },
            connector,
            log_lines: 0,
            _ticking: self.ticker.ticking(),
        };
        let mut store = Store::new(&self.engine, state);
        store.limiter(|state| &mut state.limits);
        store
    }

    fn classify_failure(&self, store: &Store<GuestState>, error: &wasmtime::Error) -> GuestFailure {
        if store.data().limits.refused.load(Ordering::Relaxed) {
            return GuestFailure::Memory(self.limits.memory_limit_bytes >> 20);
        }
        match error.downcast_ref::<Trap>() {
            Some(Trap::Interrupt) => GuestFailure::Deadline(self.limits.call_deadline.as_millis()),
            Some(trap) => GuestFailure::Trap(trap.to_string()),
            None => GuestFailure::Trap(format!("{error}")),
        }
    }
}

/// How long the epoch keeps ticking after the last guest's store is gone: under load it never
/// stops (no wake-up on a call's path), and an idle gateway does not wake every tick.
const IDLE_AFTER: Duration = Duration::from_secs(1);

/// Advances the engine's epoch on a dedicated thread while guests run, and for
/// [`IDLE_AFTER`] after the last one; then the thread parks until a guest's store is made.
/// Dropping it stops the thread.
struct EpochTicker {
    shared: Arc<TickerShared>,
    thread: std::thread::Thread,
}

#[derive(Debug)]
struct TickerShared {
    stop: AtomicBool,
    /// Guest stores alive.
    guests: AtomicUsize,
    /// The thread is parked or about to park; whoever sees it set wakes it.
    parked: AtomicBool,
}

/// One guest store's hold on the ticker.
#[derive(Debug)]
struct Ticking {
    shared: Arc<TickerShared>,
}

impl EpochTicker {
    fn start(engine: Engine) -> EpochTicker {
        let shared = Arc::new(TickerShared {
            stop: AtomicBool::new(false),
            guests: AtomicUsize::new(0),
            parked: AtomicBool::new(false),
        });
        let state = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("obol-epoch".into())
            .spawn(move || {
                let mut idle_since = Instant::now();
                while !state.stop.load(Ordering::SeqCst) {
                    std::thread::sleep(EPOCH_TICK);
                    engine.increment_epoch();
                    if state.guests.load(Ordering::SeqCst) > 0 {
                        idle_since = Instant::now();
                    } else if idle_since.elapsed() >= IDLE_AFTER {
                        // Announce the park before the last look at the count: a guest that
                        // arrives after that look sees the flag and unparks (a wake before
                        // `park` makes it return at once).
                        state.parked.store(true, Ordering::SeqCst);
                        if state.guests.load(Ordering::SeqCst) == 0
                            && !state.stop.load(Ordering::SeqCst)
                        {
                            std::thread::park();
                        }
                        state.parked.store(false, Ordering::SeqCst);
                        idle_since = Instant::now();
                    }
                }
            })
            .expect("spawn the epoch thread")
            .thread()
            .clone();
        EpochTicker { shared, thread }
    }

    /// Keeps the epoch advancing until the returned hold is dropped.
    fn ticking(&self) -> Ticking {
        self.shared.guests.fetch_add(1, Ordering::SeqCst);
        if self.shared.parked.load(Ordering::SeqCst) {
            self.thread.unpark();
        }
        Ticking {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl Drop for Ticking {
    fn drop(&mut self) {
        self.shared.guests.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Drop for EpochTicker {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        self.thread.unpark();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_component_that_exports_nothing_is_told_about_the_sdks_macro() {
        let missing = LoadError::Contract("no export `interpret` found".into());
        assert!(
            missing.to_string().contains("obol_sdk::export!"),
            "{missing}"
        );
        let other = LoadError::Contract("a type mismatch".into());
        assert!(!other.to_string().contains("export!"), "{other}");
    }

    /// Where the host grants the address space, guests' code carries no bounds checks.
    #[test]
    fn an_unlimited_host_contains_guests_with_guard_pages() {
        let runtime = Runtime::new(RuntimeConfig::default()).unwrap();
        assert_eq!(runtime.memory_guard(), MemoryGuard::GuardPages);
    }
}
