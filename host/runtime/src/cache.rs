//! Compiled components on disk, keyed by the sha256 of their bytes, so a restart skips
//! Cranelift.

use std::path::PathBuf;

use wasmtime::Engine;
use wasmtime::component::Component;

#[derive(Debug)]
pub struct CompileCache {
    dir: PathBuf,
}

impl CompileCache {
    pub fn new(dir: PathBuf) -> CompileCache {
        CompileCache { dir }
    }

    /// Returns the cached artifact for `digest`, or compiles `bytes` and caches the result.
    /// A cache that cannot be read or written only costs a compile; it never fails a load.
    pub fn get_or_compile(
        &self,
        engine: &Engine,
        digest: &str,
        bytes: &[u8],
    ) -> Result<Component, String> {
        // Artifacts are only valid for the engine configuration that produced them; wasmtime
        // checks its version and settings on deserialize, and the hash keeps
        // differently-configured gateways sharing a directory from evicting each other.
        let mut engine_id = std::collections::hash_map::DefaultHasher::new();
        std::hash::Hash::hash(&engine.precompile_compatibility_hash(), &mut engine_id);
        let engine_id = std::hash::Hasher::finish(&engine_id);
        let path = self.dir.join(format!("{digest}-{engine_id:016x}.cwasm"));
        if path.exists() {
            // SAFETY: `deserialize_file` trusts the file to be an artifact produced by
            // `Component::serialize` of a compatible engine; wasmtime verifies the header,
            // version and engine settings, but not the machine code itself. The file is
            // written only by `store` below (atomically, via rename) into a directory the
            // operator gives to the gateway alone; `docs/operations.md` says so. A corrupt
            // or foreign file is therefore the same threat as a replaced gateway binary.
            #[allow(unsafe_code)]
            match unsafe { Component::deserialize_file(engine, &path) } {
                Ok(component) => {
                    tracing::debug!(digest, "loaded a component from the compile cache");
                    return Ok(component);
                }
                Err(error) => {
                    tracing::warn!(path = %path.display(), "ignoring unusable compile cache entry: {error}");
                }
            }
        }
        let started = std::time::Instant::now();
        let component = Component::new(engine, bytes).map_err(|e| format!("{e:#}"))?;
        tracing::debug!(
            digest,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "compiled a component"
        );
        if let Err(error) = self.store(&path, &component) {
            tracing::warn!(dir = %self.dir.display(), "cannot write the compile cache: {error}");
        }
        Ok(component)
    }

    fn store(&self, path: &std::path::Path, component: &Component) -> Result<(), String> {
        let bytes = component.serialize().map_err(|e| e.to_string())?;
        std::fs::create_dir_all(&self.dir).map_err(|e| e.to_string())?;
        // Unique per writer: two threads of one process (a connector's parallel tests) may
        // compile the same component at once, and must not write into each other's file.
        static WRITERS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let writer = WRITERS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let partial = path.with_extension(format!("tmp{}-{writer}", std::process::id()));
        std::fs::write(&partial, bytes).map_err(|e| e.to_string())?;
        std::fs::rename(&partial, path).map_err(|e| e.to_string())
    }
}
