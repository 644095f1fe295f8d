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
//! manifest validation, sandbox and limits, so a component that passes here loads in `obol`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use obol::catalog::{Connector, Manifest, load_connector};
use obol::config::RuntimeConfig;
use obol::runtime::{GuestFailure, Runtime, wit};
use serde_json::Value;

pub use obol::runtime::wit::{InterpretError, Method, OutboundRequest, PrepareError, ToolOutput};

/// The base URL `prepare` is given unless a test sets another.
pub const BASE_URL: &str = "http://vendor.test";

/// Builds the calling crate and loads it: `obol_harness::build_this_crate!()`.
#[macro_export]
macro_rules! build_this_crate {
    () => {
        $crate::Harness::build(env!("CARGO_MANIFEST_DIR"), env!("CARGO_PKG_NAME"))
    };
}

/// A loaded component plus the connection facts its calls see.
pub struct Harness {
    runtime: Arc<Runtime>,
    connector: Connector,
    executor: tokio::runtime::Runtime,
    pub base_url: String,
    pub settings: Vec<(String, String)>,
}

impl Harness {
    /// Compiles the crate at `manifest_dir` to a component and loads it. Panics with cargo's
    /// or the loader's message on failure: this is a test helper.
    pub fn build(manifest_dir: &str, package: &str) -> Harness {
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
        Harness::load(&wasm)
    }

    /// Loads an already built component.
    pub fn load(path: &Path) -> Harness {
        let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let runtime = Arc::new(
            Runtime::new(RuntimeConfig {
                max_concurrent_calls: 4,
                ..RuntimeConfig::default()
            })
            .expect("a wasmtime engine"),
        );
        let connector = load_connector(&runtime, &path.display().to_string(), &bytes)
            .unwrap_or_else(|e| panic!("the gateway would refuse this component: {e}"));
        Harness {
            runtime,
            connector,
            executor: tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a tokio runtime"),
            base_url: BASE_URL.into(),
            settings: Vec::new(),
        }
    }

    /// How the gateway would classify an answer to `tool`: by the tool's declared status
    /// classes, then its body rules (contract 0.2.0). The component is not asked.
    pub fn classify(&self, tool: &str, status: u16, body: &[u8]) -> obol::catalog::StatusClass {
        let spec = self.tool(tool);
        let effect = &spec.effect;
        obol::catalog::classify_body(&effect.body_rules, effect.statuses.classify(status), body)
    }

    /// A tool of the manifest, by the name the component knows it by.
    fn tool(&self, name: &str) -> &obol::catalog::ToolSpec {
        self.manifest()
            .tools
            .iter()
            .find(|t| t.upstream_name == name)
            .unwrap_or_else(|| panic!("the manifest has no tool {name:?}"))
    }

    /// The validated manifest, exactly as the gateway sees it.
    pub fn manifest(&self) -> &Manifest {
        &self.connector.manifest
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
            &self.connector.guest,
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
            &self.connector.guest,
            name,
            tool,
            response,
        )))?;
        let spec = self.tool(tool);
        if let Some(schema) = &spec.effect.output_schema
            && self.classify(tool, status, body) == obol::catalog::StatusClass::Accepted
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
        let answer = self.executor.block_on(async {
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
