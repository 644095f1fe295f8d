//! Where components come from: bundled first-party connectors, configured paths, and every
//! `.wasm` in the connectors directory (hot-loaded).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use super::trust::{Provenance, Trust, TrustError};
use super::{Connector, Manifest, ManifestError};
use crate::config::ComponentSource;
use crate::runtime::{LoadError, Runtime};

/// The first-party connectors compiled into the binary by `build.rs`, by connector name.
pub const BUNDLED: &[(&str, &[u8])] = &[
    ("stripe", include_bytes!(env!("OBOL_GUEST_PAYMENTS"))),
    ("tracker", include_bytes!(env!("OBOL_GUEST_TRACKER"))),
    ("nango", include_bytes!(env!("OBOL_GUEST_NANGO"))),
    ("composio", include_bytes!(env!("OBOL_GUEST_COMPOSIO"))),
];

#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    #[error("{path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("no bundled connector is named {0:?} (bundled: stripe, tracker)")]
    UnknownBundled(String),
    #[error("{origin}: {source}")]
    Load { origin: String, source: LoadError },
    #[error("{origin}: invalid manifest: {source}")]
    Manifest {
        origin: String,
        source: ManifestError,
    },
    #[error("{origin}: refused: {source}")]
    Untrusted { origin: String, source: TrustError },
}

/// Where a served component came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// Compiled into the binary (`bundled:NAME`).
    Bundled,
    /// A path the config file names.
    Configured,
    /// A file in the watched directory.
    Directory(PathBuf),
}

/// Loads components, remembering what it loaded by digest so a reload recompiles nothing
/// that did not change, and by origin so a broken replacement keeps the last good version.
pub struct Loader {
    runtime: Arc<Runtime>,
    sources: Vec<ComponentSource>,
    dir: Option<PathBuf>,
    trust: Option<Trust>,
    /// By digest and provenance: the same bytes trusted another way are another entry.
    by_digest: Mutex<HashMap<String, Arc<Connector>>>,
    last_good: Mutex<HashMap<String, Arc<Connector>>>,
}

impl std::fmt::Debug for Loader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Loader")
            .field("sources", &self.sources)
            .field("dir", &self.dir)
            .finish()
    }
}

impl Loader {
    pub fn new(
        runtime: Arc<Runtime>,
        sources: Vec<ComponentSource>,
        dir: Option<PathBuf>,
        trust: Option<Trust>,
    ) -> Loader {
        Loader {
            runtime,
            sources,
            dir,
            trust,
            by_digest: Mutex::default(),
            last_good: Mutex::default(),
        }
    }

    /// Loads the configured sources; any failure is fatal, since the operator named them.
    pub fn load_configured(&self) -> Result<Vec<Arc<Connector>>, SourceError> {
        self.load_each(&self.sources)
            .into_iter()
            .map(|(_, loaded)| loaded)
            .collect()
    }

    /// Loads each source, by origin, with a progress line for each that took an operator's
    /// wait (compiling at start, a new version); what was loaded before is silent.
    fn load_each(
        &self,
        sources: &[ComponentSource],
    ) -> Vec<(String, Result<Arc<Connector>, SourceError>)> {
        let total = sources.len();
        let mut loaded = Vec::with_capacity(total);
        for (done, source) in sources.iter().enumerate() {
            let started = std::time::Instant::now();
            let result = self.load_source(source);
            let took = started.elapsed();
            if took >= std::time::Duration::from_millis(100) {
                tracing::info!(
                    "component {} of {total} ready in {} ms: {}",
                    done + 1,
                    took.as_millis(),
                    origin_of(source)
                );
            }
            loaded.push((origin_of(source), result));
        }
        loaded
    }

    /// Loads everything for a (re)build of the catalog. Failures are reported, not fatal: a
    /// component that loaded before stays as it was.
    pub fn load_all(&self) -> (Vec<Arc<Connector>>, Vec<String>) {
        let mut connectors = Vec::new();
        let mut problems = Vec::new();
        let mut sources = self.sources.clone();
        if let Some(dir) = &self.dir {
            match wasm_files(dir) {
                Ok(paths) => sources.extend(paths.into_iter().map(ComponentSource::Path)),
                Err(error) => problems.push(format!("{}: {error}", dir.display())),
            }
        }
        let origins = self.load_each(&sources);
        let mut last_good = self.last_good.lock().expect("loader lock");
        // A source that is gone (a removed file) is forgotten, so its version can be dropped.
        last_good.retain(|origin, _| origins.iter().any(|(seen, _)| seen == origin));
        for (origin, result) in origins {
            match result {
                Ok(connector) => {
                    last_good.insert(origin, Arc::clone(&connector));
                    connectors.push(connector);
                }
                Err(error) => {
                    problems.push(error.to_string());
                    if let Some(previous) = last_good.get(&origin) {
                        connectors.push(Arc::clone(previous));
                    }
                }
            }
        }
        // Compiled versions nothing serves any more are released (a call still running on one
        // holds it until it ends); flipping back to one loads it from the compile cache.
        self.by_digest
            .lock()
            .expect("loader lock")
            .retain(|_, loaded| connectors.iter().any(|c| Arc::ptr_eq(c, loaded)));
        (connectors, problems)
    }

    /// Whether the last load kept a connector from `path` (a file that loads, or a broken one
    /// whose last good version still serves).
    pub fn keeps(&self, path: &Path) -> bool {
        let origin = path.display().to_string();
        self.last_good
            .lock()
            .expect("loader lock")
            .contains_key(&origin)
    }

    /// The watched directory, when there is one.
    pub fn dir(&self) -> Option<&Path> {
        self.dir.as_deref()
    }

    /// Where a connector the last load kept came from (that very one: two files may hold the
    /// same bytes).
    pub fn origin_of(&self, connector: &Arc<Connector>) -> Option<Origin> {
        let last_good = self.last_good.lock().expect("loader lock");
        let (origin, _) = last_good
            .iter()
            .find(|(_, kept)| Arc::ptr_eq(kept, connector))?;
        let configured = self
            .sources
            .iter()
            .find(|source| origin_of(source) == *origin);
        Some(match configured {
            Some(ComponentSource::Bundled(_)) => Origin::Bundled,
            Some(ComponentSource::Path(_)) => Origin::Configured,
            None => Origin::Directory(PathBuf::from(origin)),
        })
    }

    fn load_source(&self, source: &ComponentSource) -> Result<Arc<Connector>, SourceError> {
        let origin = origin_of(source);
        match source {
            ComponentSource::Bundled(name) => {
                let (_, bytes) = BUNDLED
                    .iter()
                    .find(|(bundled, _)| bundled == name)
                    .ok_or_else(|| SourceError::UnknownBundled(name.clone()))?;
                self.load_bytes(&origin, bytes, Provenance::Bundled)
            }
            ComponentSource::Path(path) => {
                let read = |path: &Path| {
                    std::fs::read(path).map_err(|source| SourceError::Read {
                        path: path.to_owned(),
                        source,
                    })
                };
                let bytes = read(path)?;
                let signature = match read(&signature_path(path)) {
                    Ok(text) => Some(String::from_utf8_lossy(&text).into_owned()),
                    Err(SourceError::Read { source, .. })
                        if source.kind() == std::io::ErrorKind::NotFound =>
                    {
                        None
                    }
                    Err(error) => return Err(error),
                };
                let provenance = self.admit(&origin, &bytes, signature.as_deref())?;
                self.load_bytes(&origin, &bytes, provenance)
            }
        }
    }

    /// Whether `[connectors.trust]` lets a component of `bytes` load, with its detached
    /// signature if it has one. Without the table, everything does.
    pub fn admit(
        &self,
        origin: &str,
        bytes: &[u8],
        signature: Option<&str>,
    ) -> Result<Provenance, SourceError> {
        match &self.trust {
            None => Ok(Provenance::Unchecked),
            Some(trust) => trust
                .admit(bytes, &sha256_hex(bytes), signature)
                .map_err(|source| SourceError::Untrusted {
                    origin: origin.to_owned(),
                    source,
                }),
        }
    }

    /// Compiles and validates a component already admitted as `provenance`.
    pub fn load_bytes(
        &self,
        origin: &str,
        bytes: &[u8],
        provenance: Provenance,
    ) -> Result<Arc<Connector>, SourceError> {
        let key = format!("{} {provenance:?}", sha256_hex(bytes));
        if let Some(loaded) = self.by_digest.lock().expect("loader lock").get(&key) {
            return Ok(Arc::clone(loaded));
        }
        let mut connector = load_connector(&self.runtime, origin, bytes)?;
        connector.provenance = provenance;
        let connector = Arc::new(connector);
        self.by_digest
            .lock()
            .expect("loader lock")
            .insert(key, Arc::clone(&connector));
        Ok(connector)
    }
}

/// Compiles, links and validates one component.
pub fn load_connector(
    runtime: &Runtime,
    origin: &str,
    bytes: &[u8],
) -> Result<Connector, SourceError> {
    let (guest, raw) = runtime.load(bytes).map_err(|source| SourceError::Load {
        origin: origin.to_owned(),
        source,
    })?;
    let manifest = Manifest::validate(raw).map_err(|source| SourceError::Manifest {
        origin: origin.to_owned(),
        source,
    })?;
    Ok(Connector {
        manifest,
        guest: Arc::new(guest),
        provenance: Provenance::Unchecked,
    })
}

/// Where a component's detached signature lives: `NAME.wasm.minisig`, as minisign writes it.
pub fn signature_path(component: &Path) -> PathBuf {
    let mut name = component.as_os_str().to_owned();
    name.push(".minisig");
    PathBuf::from(name)
}

fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(bytes))
}

fn origin_of(source: &ComponentSource) -> String {
    match source {
        ComponentSource::Bundled(name) => format!("bundled:{name}"),
        ComponentSource::Path(path) => path.display().to_string(),
    }
}

fn wasm_files(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)?
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|path| path.extension().is_some_and(|ext| ext == "wasm") && path.is_file())
        .collect();
    paths.sort();
    Ok(paths)
}
