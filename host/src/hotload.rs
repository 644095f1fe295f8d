//! Hot-loading: the connectors directory is watched, and the admin API adds, replaces and
//! removes components there.
//!
//! The directory is the one place hot-loaded components live, whoever put them there (an
//! operator's `cp`, a deploy tool, `obol connectors add`), so a restart serves what was
//! served before it. Every change rebuilds the catalog off the async workers and swaps the
//! snapshot atomically: a call keeps the snapshot (and so the component version) it started
//! with, and a version no snapshot holds any more is dropped with its last call.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::catalog::{Connector, ConnectorName, Origin, signature_path};
use crate::error::ObolError;
use crate::gateway::Gateway;

/// A burst of file events (a copy writes in many chunks) is one change once the directory
/// has been quiet this long.
const QUIET: Duration = Duration::from_millis(50);
/// A directory that never goes quiet (a writer that never stops) still reloads this often.
const MOST_DEFERRED: Duration = Duration::from_secs(1);

/// Watches `dir` and rebuilds the catalog after each change; with `poll`, also on that
/// interval (for file systems that do not deliver events, such as some network mounts).
pub fn watch(gateway: Arc<Gateway>, dir: &Path, poll: Option<Duration>) -> anyhow::Result<()> {
    use notify::Watcher;
    std::fs::create_dir_all(dir).map_err(|e| anyhow::anyhow!("{}: {e}", dir.display()))?;
    let (changed, mut changes) = tokio::sync::mpsc::channel::<()>(1);
    let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        let relevant = match event {
            // Reading a component (the reload itself) is not a change.
            Ok(event) => !matches!(event.kind, notify::EventKind::Access(_)),
            // A lost event (queue overflow): reload to be sure.
            Err(_) => true,
        };
        if relevant {
            // Full means a reload is already due: the change is coalesced into it.
            let _ = changed.try_send(());
        }
    })
    .map_err(|e| anyhow::anyhow!("watching {}: {e}", dir.display()))?;
    watcher
        .watch(dir, notify::RecursiveMode::NonRecursive)
        .map_err(|e| anyhow::anyhow!("watching {}: {e}", dir.display()))?;
    tracing::info!(dir = %dir.display(), "watching the connectors directory");
    tokio::spawn(async move {
        // The watcher stops when dropped: it lives as long as this task.
        let _watcher = watcher;
        let mut ticks = poll.map(tokio::time::interval);
        loop {
            let woken = match ticks.as_mut() {
                Some(ticks) => tokio::select! {
                    woken = changes.recv() => woken,
                    _ = ticks.tick() => Some(()),
                },
                None => changes.recv().await,
            };
            if woken.is_none() {
                return;
            }
            settle(&mut changes).await;
            reload(&gateway).await;
        }
    });
    Ok(())
}

/// Waits until no event has arrived for [`QUIET`], at most [`MOST_DEFERRED`].
async fn settle(changes: &mut tokio::sync::mpsc::Receiver<()>) {
    let started = Instant::now();
    while started.elapsed() < MOST_DEFERRED {
        match tokio::time::timeout(QUIET, changes.recv()).await {
            Ok(Some(())) => continue,
            Ok(None) | Err(_) => return,
        }
    }
}

/// Rebuilds the catalog from every source, off the async workers; returns whether it changed.
async fn reload(gateway: &Arc<Gateway>) -> bool {
    let gateway = Arc::clone(gateway);
    on_the_loader_thread(move || {
        let changed = gateway.reload();
        if changed {
            gateway.warm_views();
        }
        changed
    })
    .await
    .unwrap_or(false)
}

type Job = Box<dyn FnOnce() + Send>;

/// Runs `job` on the one thread that compiles and rebuilds catalogs. Not the blocking pool:
/// there each swap ran on whichever short-lived thread was free, and the allocator's
/// per-thread arenas kept what those threads freed (RSS +0.27 MiB per swap at c=32).
async fn on_the_loader_thread<T: Send + 'static>(
    job: impl FnOnce() -> T + Send + 'static,
) -> Option<T> {
    static LOADER: std::sync::OnceLock<std::sync::Mutex<std::sync::mpsc::Sender<Job>>> =
        std::sync::OnceLock::new();
    let sender = LOADER.get_or_init(|| {
        let (sender, jobs) = std::sync::mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name("obol-loader".into())
            .spawn(move || {
                for job in jobs {
                    // A job that panics must not take hot-loading down with it.
                    if std::panic::catch_unwind(std::panic::AssertUnwindSafe(job)).is_err() {
                        tracing::error!("a component load or catalog rebuild panicked");
                    }
                }
            })
            .expect("spawn the loader thread");
        std::sync::Mutex::new(sender)
    });
    let (done, result) = tokio::sync::oneshot::channel();
    let job: Job = Box::new(move || {
        let _ = done.send(job());
    });
    sender.lock().expect("loader lock").send(job).ok()?;
    result.await.ok()
}

/// One served component, as the admin API lists it.
#[derive(Debug, Serialize)]
pub struct Listed {
    pub name: String,
    pub version: String,
    pub digest: String,
    pub contract: &'static str,
    /// `bundled`, `configured` (a path in the config) or `directory` (hot-loaded: the admin
    /// API manages these).
    pub source: &'static str,
    /// How the gateway trusted it (`bundled`, `pinned`, `signed` with the publisher and key
    /// id, or `unchecked` without `[connectors.trust]`).
    pub provenance: crate::catalog::trust::Provenance,
    pub tools: Vec<String>,
}

/// Every component the current snapshot serves.
pub fn list(gateway: &Gateway) -> Vec<Listed> {
    let catalog = gateway.catalog();
    catalog
        .connectors
        .values()
        .map(|connector| Listed {
            name: connector.manifest.name.to_string(),
            version: connector.manifest.version.clone(),
            digest: connector.guest.digest.clone(),
            contract: connector.guest.contract.label(),
            source: match gateway.loader.origin_of(connector) {
                Some(Origin::Bundled) => "bundled",
                Some(Origin::Configured) => "configured",
                Some(Origin::Directory(_)) | None => "directory",
            },
            provenance: connector.provenance.clone(),
            tools: connector
                .manifest
                .tools
                .iter()
                .map(|tool| tool.upstream_name.clone())
                .collect(),
        })
        .collect()
}

/// Admin changes to the directory, one at a time: each reads what is served, writes, and
/// checks what the next snapshot serves.
static CHANGES: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// What an upload means to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Upload {
    /// A connector the gateway does not serve yet.
    Add,
    /// A new version of a connector the directory holds.
    Replace,
}

/// What an upload or a removal did.
#[derive(Debug, Serialize)]
pub struct Installed {
    pub name: String,
    pub version: String,
    pub digest: String,
    /// The version it replaced, when it replaced one.
    pub replaced: Option<String>,
    /// From file write to the new snapshot serving it.
    pub swap_ms: u64,
}

/// Validates `bytes` as a component (trusted, then compiled off the async workers), writes it
/// and its detached `signature` to the directory, and swaps it in. Refused with the reason,
/// changing nothing, when `[connectors.trust]` does not admit it, it does not compile or
/// validate, is not what `expected` names, or the snapshot would not serve it (a tool name
/// another connector already has); the serving version stays.
pub async fn install(
    gateway: &Arc<Gateway>,
    upload: Upload,
    expected: Option<ConnectorName>,
    bytes: Vec<u8>,
    signature: Option<String>,
) -> Result<Installed, ObolError> {
    let dir = directory(gateway)?;
    let _one_at_a_time = CHANGES.lock().await;
    if let (Upload::Replace, Some(expected)) = (upload, &expected)
        && served(gateway, expected).is_none()
    {
        return Err(ObolError::NotFound("connector"));
    }
    let loader_gateway = Arc::clone(gateway);
    let signature_text = signature.clone();
    let (connector, bytes) = on_the_loader_thread(move || {
        let origin = "the uploaded component";
        let loader = &loader_gateway.loader;
        let connector = loader
            .admit(origin, &bytes, signature_text.as_deref())
            .and_then(|provenance| loader.load_bytes(origin, &bytes, provenance));
        (connector, bytes)
    })
    .await
    .ok_or(ObolError::Internal)?;
    let connector = connector.map_err(|error| ObolError::InvalidAdminRequest(error.to_string()))?;
    let name = connector.manifest.name.clone();
    if let Some(expected) = &expected
        && *expected != name
    {
        return Err(ObolError::InvalidAdminRequest(format!(
            "the component is the connector \"{name}\", not \"{expected}\""
        )));
    }
    let current = served(gateway, &name);
    let target = match (upload, &current) {
        (Upload::Add, Some(_)) => {
            return Err(ObolError::Conflict(
                "a connector of this name is served; replace it instead",
            ));
        }
        (Upload::Replace, None) => return Err(ObolError::NotFound("connector")),
        (_, Some((_, Origin::Bundled | Origin::Configured))) => {
            return Err(ObolError::Conflict(
                "this connector is named in the config file; change it there",
            ));
        }
        (Upload::Replace, Some((_, Origin::Directory(path)))) => path.clone(),
        (Upload::Add, None) => {
            let target = dir.join(format!("{name}.wasm"));
            // The file name is the connector's, but the file may hold another connector.
            if gateway.loader.keeps(&target) {
                return Err(ObolError::Conflict(
                    "the directory's file of this name holds another connector",
                ));
            }
            target
        }
    };
    let signature_file = signature_path(&target);
    let started = Instant::now();
    // Read and written, fsyncs included, on the loader thread: not on the lane that serves
    // this request beside other calls.
    let files = (target.clone(), signature_file.clone());
    let (previous, previous_signature) = on_the_loader_thread(move || {
        let (target, signature_file) = files;
        let previous = std::fs::read(&target).ok();
        let previous_signature = std::fs::read(&signature_file).ok();
        // The signature first: the component is never beside another one's signature for
        // longer than it takes to rename it in.
        match &signature {
            Some(text) => write_atomically(&signature_file, text.as_bytes()),
            None => remove_if_present(&signature_file),
        }
        .and_then(|()| write_atomically(&target, &bytes))
        .map(|()| (previous, previous_signature))
    })
    .await
    .ok_or(ObolError::Internal)?
    .map_err(|error| {
        tracing::warn!("writing {}: {error}", target.display());
        ObolError::Internal
    })?;
    reload(gateway).await;
    let serving = served(gateway, &name)
        .is_some_and(|(serving, _)| serving.guest.digest == connector.guest.digest);
    if !serving {
        // The snapshot refused it: put back what was there, and say why.
        let quoted = format!("\"{name}\"");
        let why = gateway
            .catalog()
            .problems
            .iter()
            .find(|problem| problem.contains(&quoted))
            .cloned()
            .unwrap_or_else(|| "the catalog did not take it".into());
        on_the_loader_thread(move || {
            let _ = match &previous_signature {
                Some(previous) => write_atomically(&signature_file, previous),
                None => remove_if_present(&signature_file),
            };
            let _ = match &previous {
                Some(previous) => write_atomically(&target, previous),
                None => std::fs::remove_file(&target),
            };
        })
        .await;
        reload(gateway).await;
        return Err(ObolError::InvalidAdminRequest(why));
    }
    let swap_ms = started.elapsed().as_millis() as u64;
    tracing::info!(connector = %name, version = %connector.manifest.version, digest = %connector.guest.digest, swap_ms, "component installed through the admin API");
    Ok(Installed {
        name: name.to_string(),
        version: connector.manifest.version.clone(),
        digest: connector.guest.digest.clone(),
        replaced: current.map(|(old, _)| old.manifest.version.clone()),
        swap_ms,
    })
}

/// Removes a hot-loaded connector: its file goes, and its tools with the next snapshot.
pub async fn remove(gateway: &Arc<Gateway>, name: &ConnectorName) -> Result<Installed, ObolError> {
    directory(gateway)?;
    let _one_at_a_time = CHANGES.lock().await;
    let (connector, path) = match served(gateway, name) {
        None => return Err(ObolError::NotFound("connector")),
        Some((_, Origin::Bundled | Origin::Configured)) => {
            return Err(ObolError::Conflict(
                "this connector is named in the config file; change it there",
            ));
        }
        Some((connector, Origin::Directory(path))) => (connector, path),
    };
    let started = Instant::now();
    let mut path = path;
    // Another file of the directory may provide the same connector (the first in name order
    // serves): it would serve next, so it goes too.
    for _ in 0..64 {
        std::fs::remove_file(&path)
            .and_then(|()| remove_if_present(&signature_path(&path)))
            .map_err(|error| {
                tracing::warn!("removing {}: {error}", path.display());
                ObolError::Internal
            })?;
        reload(gateway).await;
        match served(gateway, name) {
            Some((_, Origin::Directory(next))) => path = next,
            _ => break,
        }
    }
    tracing::info!(connector = %name, "component removed through the admin API");
    Ok(Installed {
        name: name.to_string(),
        version: connector.manifest.version.clone(),
        digest: connector.guest.digest.clone(),
        replaced: Some(connector.manifest.version.clone()),
        swap_ms: started.elapsed().as_millis() as u64,
    })
}

fn directory(gateway: &Gateway) -> Result<PathBuf, ObolError> {
    gateway.loader.dir().map(Path::to_owned).ok_or_else(|| {
        ObolError::InvalidAdminRequest(
            "this gateway has no connectors directory ([connectors] dir); uploaded components are kept there".into(),
        )
    })
}

/// The component serving `name` in the current snapshot, and where it came from.
fn served(gateway: &Gateway, name: &ConnectorName) -> Option<(Arc<Connector>, Origin)> {
    let connector = gateway.catalog().connectors.get(name).cloned()?;
    let origin = gateway.loader.origin_of(&connector)?;
    Some((connector, origin))
}

fn remove_if_present(path: &Path) -> std::io::Result<()> {
    match std::fs::remove_file(path) {
        Err(error) if error.kind() != std::io::ErrorKind::NotFound => Err(error),
        _ => Ok(()),
    }
}

/// Writes beside the target and renames over it, so a reader (this gateway's watcher, or a
/// crash) sees the old file or the new one, never half of one.
fn write_atomically(target: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let dir = target.parent().unwrap_or(Path::new("."));
    let file_name = target.file_name().unwrap_or_default().to_string_lossy();
    // A dot-file with another extension (the directory scan skips it), of a name no other
    // writer (another gateway sharing the directory) can be using.
    let mut unique = [0u8; 8];
    getrandom::fill(&mut unique).expect("the OS random source is available");
    let staged = dir.join(format!(".{file_name}.{}.partial", hex::encode(unique)));
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&staged)?;
    file.write_all(bytes)?;
    file.sync_all()?;
    std::fs::rename(&staged, target)?;
    std::fs::File::open(dir)?.sync_all()
}
