//! Test a connector component the way the gateway will run it.
//!
//! ```ignore
//! // connectors/acme/tests/component.rs
//! let harness = obol_harness::build_this_crate!();
//! assert_eq!(harness.manifest().name.as_str(), "acme");
//! let request = harness.prepare("widgets.list", json!({"limit": 5})).unwrap();
//! assert_eq!(request.url, "http://vendor.test/v1/widgets?limit=5");
//! let output = harness.interpret("widgets.list", 200, br#"{"data": []}"#).unwrap();
//! ```
//!
//! [`Harness::build`] compiles the crate for `wasm32-wasip2`; loading applies the gateway's own
//! manifest validation, sandbox and limits (`obol-runtime`, the crate the gateway runs
//! components with), so a component that passes here loads in `obol`.
//!
//! Within one test binary the crate is built and compiled once: every test shares the
//! component, and compiled code is cached on disk by the component's sha256, so the tests of
//! an unchanged crate skip both cargo's work and Cranelift's.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex, OnceLock};

use obol_runtime::manifest::{Manifest, StatusClass, ToolSpec, classify_body};
use obol_runtime::{Guest, GuestFailure, Runtime, RuntimeConfig, wit};
use serde_json::Value;

pub use obol_runtime::wit::{InterpretError, Method, OutboundRequest, PrepareError, ToolOutput};

/// The base URL `prepare` is given unless a test sets another.
pub const BASE_URL: &str = "http://vendor.test";

/// Builds the calling crate and loads it: `obol_harness::build_this_crate!()`.
#[macro_export]
macro_rules! build_this_crate {
    () => {
        $crate::Harness::build(env!("CARGO_MANIFEST_DIR"), env!("CARGO_PKG_NAME"))
    };
}

/// A component that compiled, linked and whose manifest the gateway accepts.
struct Component {
    guest: Guest,
    manifest: Manifest,
}

/// A loaded component plus the connection facts its calls see.
pub struct Harness {
    runtime: Arc<Runtime>,
    component: Arc<Component>,
    executor: tokio::runtime::Runtime,
    pub base_url: String,
    pub settings: Vec<(String, String)>,
}

impl Harness {
    /// Compiles the crate at `manifest_dir` to a component and loads it. Panics with cargo's
    /// or the loader's message on failure: this is a test helper.
    pub fn build(manifest_dir: &str, package: &str) -> Harness {
        // Tests run in parallel threads: the first one builds, the others wait for its file.
        static BUILT: OnceLock<Mutex<HashMap<PathBuf, PathBuf>>> = OnceLock::new();
        let mut built = BUILT
            .get_or_init(Mutex::default)
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let wasm = built
            .entry(PathBuf::from(manifest_dir))
            .or_insert_with(|| build_component(manifest_dir, package))
            .clone();
        drop(built);
        Harness::load(&wasm)
    }

    /// Loads an already built component.
    pub fn load(path: &Path) -> Harness {
        let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let runtime = shared_runtime();
        // One compile per distinct component per test binary, whatever the number of tests.
        static LOADED: OnceLock<Mutex<HashMap<Vec<u8>, Arc<Component>>>> = OnceLock::new();
        let mut loaded = LOADED
            .get_or_init(Mutex::default)
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let component = match loaded.get(&bytes) {
            Some(component) => Arc::clone(component),
            None => {
                let component = Arc::new(load_component(&runtime, path, &bytes));
                loaded.insert(bytes, Arc::clone(&component));
                component
            }
        };
        drop(loaded);
        Harness {
            runtime,
            component,
            executor: tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .build()
                .expect("a tokio runtime"),
            base_url: BASE_URL.into(),
            settings: Vec::new(),
        }
    }

    /// How the gateway would classify an answer to `tool`: by the tool's declared status
    /// classes, then its body rules (contract 0.2.0). The component is not asked.
    pub fn classify(&self, tool: &str, status: u16, body: &[u8]) -> StatusClass {
        let spec = self.tool(tool);
        let effect = &spec.effect;
        classify_body(&effect.body_rules, effect.statuses.classify(status), body)
    }

    /// A tool of the manifest, by the name the component knows it by.
    fn tool(&self, name: &str) -> &ToolSpec {
        self.manifest()
            .tools
            .iter()
            .find(|t| t.upstream_name == name)
            .unwrap_or_else(|| panic!("the manifest has no tool {name:?}"))
    }

    /// The validated manifest, exactly as the gateway sees it.
    pub fn manifest(&self) -> &Manifest {
        &self.component.manifest
    }

    /// Runs `prepare` after the gateway's own input-schema check.
    pub fn prepare(&self, tool: &str, arguments: Value) -> Result<OutboundRequest, PrepareError> {
        let spec = self.tool(tool);
        let violations = spec.input_schema.violations(&arguments);
        if !violations.is_empty() {
            return Err(PrepareError::InvalidArguments(format!(
                "rejected by the input schema before the component: {}",
                violations.join("; ")
            )));
        }
        let facts = wit::ConnectionFacts {
            base_url: self.base_url.clone(),
            settings: self.settings.clone(),
        };
        let name = self.manifest().name.as_str();
        trapless(self.executor.block_on(self.runtime.prepare(
            &self.component.guest,
            name,
            tool,
            arguments.to_string(),
            facts,
        )))
    }

    /// Feeds a canned vendor response to `interpret`, and checks what it returns as the
    /// gateway does: an answer the tool's status classes accept must carry structured output
    /// that matches the tool's own output schema (a panic names the failing field: the
    /// gateway would answer every such call `output_schema_violation`).
    pub fn interpret(
        &self,
        tool: &str,
        status: u16,
        body: &[u8],
    ) -> Result<ToolOutput, InterpretError> {
        let response = wit::VendorResponse {
            status,
            headers: vec![wit::Header {
                name: "content-type".into(),
                value: "application/json".into(),
            }],
            body: body.to_vec(),
        };
        let name = self.manifest().name.as_str();
        let output = trapless(self.executor.block_on(self.runtime.interpret(
            &self.component.guest,
            name,
            tool,
            response,
        )))?;
        let spec = self.tool(tool);
        if let Some(schema) = &spec.effect.output_schema
            && self.classify(tool, status, body) == StatusClass::Accepted
        {
            let structured = output
                .structured
                .as_deref()
                .map(|text| {
                    serde_json::from_str::<Value>(text).unwrap_or_else(|e| {
                        panic!("{tool}: the structured output is not JSON ({e})")
                    })
                })
                .unwrap_or_else(|| {
                    panic!(
                        "{tool}: an accepted answer has no structured output, but the tool declares an output schema"
                    )
                });
            let violations = schema.violations_in(&structured, "the output");
            assert!(
                violations.is_empty(),
                "{tool}: the connector's structured output breaks its own output schema: {}",
                violations.join("; ")
            );
        }
        Ok(output)
    }
}

/// One vendor exchange, recorded once from the real vendor and replayed in tests: the answer
/// `interpret` is fed. Stored as JSON; nothing secret is kept (see [`Harness::record`]).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Fixture {
    pub tool: String,
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

/// Response headers never written to a fixture: they carry credentials or sessions.
#[cfg(feature = "record")]
fn secret_header(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    [
        "authorization",
        "cookie",
        "set-cookie",
        "token",
        "secret",
        "key",
        "session",
    ]
    .iter()
    .any(|word| name.contains(word))
}

impl Harness {
    /// Sends what `prepare` builds for `tool` to the real vendor at [`Harness::base_url`]
    /// (with `credential` as one request header, as the gateway would add it), writes the
    /// answer to `fixture`, and returns it. Secrets stay out of the file: headers that carry
    /// credentials or sessions are dropped, and the credential's value is replaced wherever
    /// the answer repeats it. Run it once (an ignored test, or behind an env var), commit
    /// the fixture, and [`Harness::replay`] it in every run after.
    ///
    /// Needs the harness's `record` feature (`features = ["record"]`): the HTTP client it
    /// sends with is a build that replaying does not need.
    #[cfg(feature = "record")]
    pub fn record(
        &self,
        tool: &str,
        arguments: Value,
        credential: Option<(&str, &str)>,
        fixture: &Path,
    ) -> Fixture {
        let request = self
            .prepare(tool, arguments)
            .unwrap_or_else(|e| panic!("{tool}: prepare refused the arguments: {e:?}"));
        let method = match request.method {
            wit::Method::Get => reqwest::Method::GET,
            wit::Method::Post => reqwest::Method::POST,
            wit::Method::Put => reqwest::Method::PUT,
            wit::Method::Patch => reqwest::Method::PATCH,
            wit::Method::Delete => reqwest::Method::DELETE,
        };
        // The harness's own executor has no I/O driver (replay needs none).
        let network = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a tokio runtime");
        let answer = network.block_on(async {
            let mut sent = reqwest::Client::new().request(method, &request.url);
            for header in &request.headers {
                sent = sent.header(&header.name, &header.value);
            }
            if let Some((name, value)) = credential {
                sent = sent.header(name, value);
            }
            if let Some(body) = request.body {
                sent = sent.body(body);
            }
            let answer = sent
                .send()
                .await
                .unwrap_or_else(|e| panic!("{tool}: the vendor did not answer: {e}"));
            let status = answer.status().as_u16();
            let headers: Vec<(String, String)> = answer
                .headers()
                .iter()
                .filter(|(name, _)| !secret_header(name.as_str()))
                .map(|(name, value)| {
                    (
                        name.to_string(),
                        value.to_str().unwrap_or_default().to_owned(),
                    )
                })
                .collect();
            let body = answer.text().await.unwrap_or_default();
            (status, headers, body)
        });
        let (status, headers, mut body) = answer;
        if let Some((_, value)) = credential
            && !value.is_empty()
        {
            body = body.replace(value, "[redacted]");
        }
        let recorded = Fixture {
            tool: tool.to_owned(),
            status,
            headers,
            body,
        };
        let text = serde_json::to_string_pretty(&recorded).expect("plain data");
        if let Some(dir) = fixture.parent() {
            std::fs::create_dir_all(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        }
        std::fs::write(fixture, text).unwrap_or_else(|e| panic!("{}: {e}", fixture.display()));
        recorded
    }

    /// Feeds a recorded exchange to `interpret`, with the same checks as
    /// [`Harness::interpret`].
    pub fn replay(&self, fixture: &Path) -> Result<ToolOutput, InterpretError> {
        let text = std::fs::read_to_string(fixture).unwrap_or_else(|e| {
            panic!(
                "{}: {e} (record it once with Harness::record against the vendor)",
                fixture.display()
            )
        });
        let recorded: Fixture = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("{}: not a fixture: {e}", fixture.display()));
        self.interpret(&recorded.tool, recorded.status, recorded.body.as_bytes())
    }
}

/// Runs `cargo build --release --target wasm32-wasip2` for the crate and returns the `.wasm`
/// it made: the file the author ships.
fn build_component(manifest_dir: &str, package: &str) -> PathBuf {
    let target_dir = guest_target_dir();
    let status = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .args([
            "build",
            "--release",
            "--target",
            "wasm32-wasip2",
            "--manifest-path",
        ])
        .arg(Path::new(manifest_dir).join("Cargo.toml"))
        .arg("--target-dir")
        .arg(&target_dir)
        .env_remove("CARGO_TARGET_DIR")
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .env_remove("RUSTFLAGS")
        .status()
        .expect("run cargo");
    assert!(
        status.success(),
        "building {package} for wasm32-wasip2 failed"
    );
    let wasm = target_dir
        .join("wasm32-wasip2/release")
        .join(format!("{}.wasm", package.replace('-', "_")));
    assert!(
        wasm.is_file(),
        "cargo built {package} but made no {}: a connector crate needs\n\n    [lib]\n    crate-type = [\"cdylib\", \"rlib\"]\n\nin its Cargo.toml (cdylib is the component the gateway loads)",
        wasm.display()
    );
    wasm
}

/// Compiles, links and validates a component as the gateway's loader does.
fn load_component(runtime: &Runtime, path: &Path, bytes: &[u8]) -> Component {
    let refused = |reason: String| -> ! {
        panic!(
            "the gateway would refuse this component: {}: {reason}",
            path.display()
        )
    };
    let (guest, raw) = runtime
        .load(bytes)
        .unwrap_or_else(|e| refused(e.to_string()));
    let manifest =
        Manifest::validate(raw).unwrap_or_else(|e| refused(format!("invalid manifest: {e}")));
    Component { guest, manifest }
}

/// One engine for every test of the binary, with the gateway's default limits and a compile
/// cache beside the built components.
fn shared_runtime() -> Arc<Runtime> {
    static RUNTIME: OnceLock<Arc<Runtime>> = OnceLock::new();
    let runtime = RUNTIME.get_or_init(|| {
        Arc::new(
            Runtime::new(RuntimeConfig {
                // Tests run in parallel; each guest call holds a slot for its duration.
                max_concurrent_calls: 16,
                cache_dir: Some(guest_target_dir().join("obol-harness-cache")),
                ..RuntimeConfig::default()
            })
            .expect("a wasmtime engine"),
        )
    });
    Arc::clone(runtime)
}

/// In a connector's own tests a trap is a bug to see, not a value to assert on.
fn trapless<T, E>(outcome: Result<Result<T, E>, GuestFailure>) -> Result<T, E> {
    outcome.unwrap_or_else(|failure| panic!("the component {failure}"))
}

/// The test binary's own target directory: the component the harness builds and tests is
/// `<target>/wasm32-wasip2/release/NAME.wasm`, the very file `cargo build --release --target
/// wasm32-wasip2` makes for the author to ship (cargo holds no lock on it while tests run).
/// `OBOL_GUEST_TARGET_DIR` overrides it.
fn guest_target_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("OBOL_GUEST_TARGET_DIR") {
        return dir.into();
    }
    // <target>/<profile>/deps/<test binary>
    let exe = std::env::current_exe().expect("the test binary's path");
    exe.ancestors()
        .nth(3)
        .map(Path::to_owned)
        .unwrap_or_else(|| std::env::temp_dir().join("obol-guests"))
}
