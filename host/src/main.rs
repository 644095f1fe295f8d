//! The `obol` command: `serve`, `check`, `upstreams`, `receipts`,
//! `keys hash|mint|create|list|revoke`, `policies publish|list`, `approvals keygen`,
//! `connectors list|add|replace|remove|keygen|sign|verify`, `store migrate`, `completions`,
//! and the hidden `harness` that `obol-harness` runs components in.

use std::io::Read;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use obol::catalog::load_connector;
use obol::config::{Config, RuntimeConfig};
use obol::policy::KeyHash;
use obol::runtime::Runtime;

/// Small blocks from mimalloc, large ones (bodies and their buffers) from the system's
/// allocator, so the hot path allocates cheaply and a crowd of large uploads is handed back
/// at once (ADR-0070).
#[global_allocator]
static ALLOCATOR: obol::allocator::BySize = obol::allocator::BySize;

#[derive(Parser)]
#[command(
    name = "obol",
    version,
    about = "An MCP gateway for WebAssembly connectors"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Log lines as text (the default) or as one JSON object per line (`timestamp`, `level`,
    /// `target`, `fields`).
    #[arg(
        long,
        global = true,
        value_enum,
        env = "OBOL_LOG_FORMAT",
        default_value = "text"
    )]
    log_format: LogFormat,
    /// Print what a read command found as JSON (`check`, `upstreams`; the admin API's
    /// commands always answer JSON).
    #[arg(long, global = true)]
    json: bool,
}

/// How a read command prints what it found.
#[derive(Clone, Copy)]
enum Output {
    Text,
    Json,
}

impl Output {
    fn of(json: bool) -> Output {
        match json {
            true => Output::Json,
            false => Output::Text,
        }
    }
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand)]
enum Command {
    /// Run the gateway.
    Serve {
        /// The configuration file.
        #[arg(long, default_value = "examples/obol.toml")]
        config: PathBuf,
        /// Listen here instead of the configured address (port 0 picks a free port).
        #[arg(long)]
        listen: Option<SocketAddr>,
    },
    /// Validate a connector component and print its digest, contract, signature and every
    /// tool's EffectSpec.
    Check {
        /// The component (.wasm) to check; its signature is COMPONENT.minisig.
        component: PathBuf,
        /// Check the signature against this config's `[connectors.trust]`.
        #[arg(long)]
        config: Option<PathBuf>,
    },
    /// Serve one component to `obol-harness` (a connector's `cargo test`): JSON lines on
    /// stdin and stdout, the calls run as `obol serve` runs them (ADR-0056).
    #[command(hide = true)]
    Harness {
        /// The harness protocol the caller speaks; any other than this obol's is refused.
        #[arg(long)]
        protocol: u32,
        /// Cache compiled components here, by sha256.
        #[arg(long)]
        cache: Option<PathBuf>,
        /// The component (.wasm).
        component: PathBuf,
    },
    /// Connect to every MCP upstream of a config and show each tool with the EffectSpec Obol
    /// derives for it: what will be held, hidden or retried, before any call.
    Upstreams {
        /// The configuration file.
        #[arg(long, default_value = "examples/obol.toml")]
        config: PathBuf,
    },
    /// Read receipts from a running gateway, as the workspace owner.
    Receipts {
        /// The gateway's base URL.
        #[arg(long, default_value = "http://127.0.0.1:8780")]
        url: String,
        /// A key of the workspace (or set OBOL_KEY).
        #[arg(long, env = "OBOL_KEY", hide_env_values = true)]
        key: String,
        /// How many of the newest receipts to list.
        #[arg(long, default_value_t = 20)]
        limit: usize,
        /// Show one receipt instead of listing.
        id: Option<String>,
    },
    /// Start something new: `obol new connector NAME`.
    New {
        #[command(subcommand)]
        command: NewCommand,
    },
    /// Print a shell completion script: `source <(obol completions bash)`, or write it where
    /// your shell loads completions from.
    Completions { shell: clap_complete::Shell },
    /// Manage virtual keys.
    Keys {
        #[command(subcommand)]
        command: KeysCommand,
    },
    /// Hot-loaded connector components of a running gateway (kept in its connectors
    /// directory, so they survive a restart).
    Connectors {
        #[command(subcommand)]
        command: ConnectorsCommand,
    },
    /// Cedar policy publications.
    Policies {
        #[command(subcommand)]
        command: PoliciesCommand,
    },
    /// Approval token keys.
    Approvals {
        #[command(subcommand)]
        command: ApprovalsCommand,
    },
    /// The state store.
    Store {
        #[command(subcommand)]
        command: StoreCommand,
    },
}

#[derive(Subcommand)]
enum StoreCommand {
    /// Cut the store over to this gateway's claim-key layout (2: capability calls claim under
    /// `cap`). Refuses, naming them, while capability records of the older layout or gateways
    /// of another layout are live; deletes nothing. Run it with the older gateways stopped
    /// (an embedded store must not be open in a running gateway).
    Migrate {
        /// The configuration file.
        #[arg(long, default_value = "examples/obol.toml")]
        config: PathBuf,
    },
}

#[derive(Subcommand)]
enum ApprovalsCommand {
    /// Write a new ed25519 signing key to FILE (mode 0600) and print its public key, for
    /// `[approvals] signing_key` and, after a rotation, `verify_keys`.
    Keygen { file: PathBuf },
}

#[derive(Subcommand)]
enum KeysCommand {
    /// Print the `sha256:…` form of a key's token for the config (reads stdin without TOKEN).
    Hash { token: Option<String> },
    /// Make a new 256-bit token and print it with its hash: a virtual key's (`obk_`), a
    /// workspace owner's (`obo_`) or the admin API's (`oba_`).
    Mint {
        #[arg(long, value_enum, default_value = "key")]
        kind: TokenKind,
    },
    /// Create a key on a running gateway; prints its token (shown once).
    Create {
        #[command(flatten)]
        admin: AdminArgs,
        #[arg(long)]
        name: String,
        #[arg(long)]
        workspace: String,
        #[arg(long, default_value = "dev")]
        environment: String,
        /// An `allowed_tools` glob (repeat for more).
        #[arg(long = "allow", required = true)]
        allowed_tools: Vec<String>,
        /// A scope: mcp, receipts, approvals, route (repeat for more; default mcp).
        #[arg(long = "scope")]
        scopes: Vec<String>,
        /// A CEL filter over `tool` and `key`.
        #[arg(long)]
        filter: Option<String>,
        /// The policy publication to pin: `latest` (default) or a number.
        #[arg(long)]
        policy: Option<String>,
    },
    /// List every key of a running gateway (never hashes or tokens).
    List {
        #[command(flatten)]
        admin: AdminArgs,
    },
    /// Revoke a key created through the admin API; it stops working at once.
    Revoke {
        #[command(flatten)]
        admin: AdminArgs,
        name: String,
    },
}

#[derive(Subcommand)]
enum NewCommand {
    /// An out-of-tree connector crate that builds and tests on first try: a read tool and a
    /// write tool with an Idempotency-Key binding, harness tests, a stand-in vendor and an
    /// obol.toml that serves it.
    Connector {
        /// The connector's name (lowercase letters, digits, `-`, `_`): its tools' prefix.
        name: String,
        /// Where to create it (default: ./NAME).
        #[arg(long)]
        path: Option<PathBuf>,
        /// Take obol-sdk and obol-harness from this Obol checkout (default: the one this
        /// obol was built from, when it is still there).
        #[arg(long, conflicts_with = "git")]
        obol: Option<PathBuf>,
        /// Take them from this git repository instead.
        #[arg(long)]
        git: Option<String>,
    },
}

#[derive(Subcommand)]
enum ConnectorsCommand {
    /// Every component the gateway serves: name, version, digest, where it came from, tools.
    List {
        #[command(flatten)]
        admin: AdminArgs,
    },
    /// Upload a connector the gateway does not serve yet, with COMPONENT.minisig when there
    /// is one. It is checked and compiled first; one that does not load is refused with the
    /// reason.
    Add {
        #[command(flatten)]
        admin: AdminArgs,
        component: PathBuf,
    },
    /// Upload a new version of a hot-loaded connector, with COMPONENT.minisig when there is
    /// one. Calls in flight finish on the old version; a version that does not load is
    /// refused and the old one keeps serving.
    Replace {
        #[command(flatten)]
        admin: AdminArgs,
        name: String,
        component: PathBuf,
    },
    /// Remove a hot-loaded connector; its tools disappear from the next listing.
    Remove {
        #[command(flatten)]
        admin: AdminArgs,
        name: String,
    },
    /// Make a publisher key pair: the secret key goes to SECRET_KEY (mode 0600, minisign's
    /// format, unencrypted), the public key is printed for `[connectors.trust]`.
    Keygen { secret_key: PathBuf },
    /// Sign a component: writes COMPONENT.minisig (minisign's format; `minisign -V` checks it).
    Sign {
        #[arg(long)]
        secret_key: PathBuf,
        component: PathBuf,
    },
    /// Check COMPONENT.minisig against a publisher's public key (the base64 line or a .pub
    /// file). Exits 1 unless it verifies.
    Verify {
        #[arg(long)]
        public_key: String,
        component: PathBuf,
    },
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum TokenKind {
    Key,
    Owner,
    Admin,
}

impl TokenKind {
    fn prefix(self) -> &'static str {
        match self {
            TokenKind::Key => "obk_",
            TokenKind::Owner => "obo_",
            TokenKind::Admin => "oba_",
        }
    }
}

#[derive(clap::Args)]
struct AdminArgs {
    /// The gateway's base URL.
    #[arg(long, default_value = "http://127.0.0.1:8780")]
    url: String,
    /// The admin token (or set OBOL_ADMIN_TOKEN).
    #[arg(long, env = "OBOL_ADMIN_TOKEN", hide_env_values = true)]
    admin_token: String,
}

#[derive(Subcommand)]
enum PoliciesCommand {
    /// Publish a Cedar file as the workspace's next publication, without a restart.
    Publish {
        #[command(flatten)]
        admin: AdminArgs,
        #[arg(long)]
        workspace: String,
        file: PathBuf,
    },
    /// List a workspace's publications.
    List {
        #[command(flatten)]
        admin: AdminArgs,
        #[arg(long)]
        workspace: String,
    },
}

enum Body {
    None,
    Json(serde_json::Value),
    Text(String),
    /// A component and its detached signature's text.
    Wasm(Vec<u8>, Option<String>),
}

/// One admin API request; prints the JSON answer, exits 1 unless it succeeded.
fn admin_call(
    admin: &AdminArgs,
    method: reqwest::Method,
    path: &str,
    body: Body,
) -> anyhow::Result<ExitCode> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let (status, answer) = runtime.block_on(async {
        let mut request = reqwest::Client::new()
            .request(method, format!("{}{path}", admin.url.trim_end_matches('/')))
            .bearer_auth(&admin.admin_token);
        request = match body {
            Body::None => request,
            Body::Json(value) => request
                .header("content-type", "application/json")
                .body(value.to_string()),
            Body::Text(text) => request.header("content-type", "text/plain").body(text),
            Body::Wasm(bytes, signature) => {
                use base64::Engine;
                if let Some(signature) = signature {
                    let encoded = base64::engine::general_purpose::STANDARD.encode(signature);
                    request = request.header("obol-signature", encoded);
                }
                request
                    .header("content-type", "application/wasm")
                    .body(bytes)
            }
        };
        let response = request.send().await?;
        let status = response.status();
        let answer: serde_json::Value = response.json().await?;
        anyhow::Ok((status, answer))
    })?;
    println!("{}", serde_json::to_string_pretty(&answer)?);
    Ok(if status.is_success() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// What `obol check` says of a component: digest, contract, signature (and, with a config,
/// whether its `[connectors.trust]` admits it), and every tool's whole EffectSpec.
fn check_report(
    connector: &obol::catalog::Connector,
    bytes: &[u8],
    signature: Option<&str>,
    config: Option<PathBuf>,
) -> anyhow::Result<serde_json::Value> {
    use obol::catalog::trust::{Provenance, signature_key_id, trusted_comment};
    use serde_json::json;
    let digest = &connector.guest.digest;
    let signed = signature.map(
        |text| match (signature_key_id(text), trusted_comment(text)) {
            (Ok(key_id), Ok(comment)) => json!({ "key_id": key_id, "trusted_comment": comment }),
            (Err(error), _) | (_, Err(error)) => json!({ "unreadable": error.to_string() }),
        },
    );
    let trust = match config {
        None => None,
        Some(path) => Some(match &Config::load(&path)?.trust {
            None => "the config has no [connectors.trust]: it would load unchecked".to_owned(),
            Some(trust) => match trust.admit(bytes, digest, signature) {
                Ok(Provenance::Signed { publisher, .. }) => {
                    format!("signed by {publisher}: trusted")
                }
                Ok(Provenance::Pinned) => "pinned by sha256: trusted".to_owned(),
                Ok(other) => format!("{other:?}"),
                Err(error) => format!("REFUSED: {error}"),
            },
        }),
    };
    let m = &connector.manifest;
    let tools: Vec<serde_json::Value> = m
        .tools
        .iter()
        .map(|tool| {
            let e = &tool.effect;
            let route = match e.broker {
                Some(broker) => format!("federated({})", broker.label()),
                None => e.route.label().to_owned(),
            };
            let statuses: serde_json::Map<String, serde_json::Value> = e
                .statuses
                .classes()
                .into_iter()
                .map(|(class, ranges)| (class.to_owned(), json!(ranges)))
                .collect();
            json!({
                "name": format!("{}.{}", m.name, tool.upstream_name),
                "route": route,
                "destructive": e.destructive,
                "statuses": statuses,
                "propagation": String::from(obol::store::PinnedBinding::from(&e.propagation)),
                "output_schema": e.output_schema.is_some(),
                "body_rules": e.body_rules.len(),
            })
        })
        .collect();
    Ok(json!({
        "name": m.name.as_str(),
        "version": m.version,
        "sha256": digest,
        "contract": connector.guest.contract.label(),
        "signature": signed,
        "trust": trust,
        "tools": tools,
    }))
}

/// `obol check`'s text: the report, one fact per line.
fn print_check(report: &serde_json::Value) {
    let text = |value: &serde_json::Value| match value {
        serde_json::Value::String(text) => text.clone(),
        other => other.to_string(),
    };
    println!("{} {}", text(&report["name"]), text(&report["version"]));
    println!("  sha256:   {}", text(&report["sha256"]));
    println!("  contract: {}", text(&report["contract"]));
    let signature = &report["signature"];
    match (
        signature["key_id"].as_str(),
        signature["unreadable"].as_str(),
    ) {
        (Some(key_id), _) => println!(
            "  signature: key id {key_id} ({})",
            text(&signature["trusted_comment"])
        ),
        (None, Some(why)) => println!("  signature: unreadable: {why}"),
        (None, None) => println!("  signature: none"),
    }
    if let Some(trust) = report["trust"].as_str() {
        println!("  trust:    {trust}");
    }
    for tool in report["tools"].as_array().into_iter().flatten() {
        let statuses: Vec<String> = tool["statuses"]
            .as_object()
            .into_iter()
            .flatten()
            .map(|(class, ranges)| {
                let ranges: Vec<String> =
                    ranges.as_array().into_iter().flatten().map(text).collect();
                format!("{class} {}", ranges.join(", "))
            })
            .collect();
        println!("  {}", text(&tool["name"]));
        println!("    route:         {}", text(&tool["route"]));
        println!("    destructive:   {}", text(&tool["destructive"]));
        println!("    statuses:      {}", statuses.join("; "));
        println!("    propagation:   {}", text(&tool["propagation"]));
        println!("    output_schema: {}", text(&tool["output_schema"]));
        println!("    body_rules:    {}", text(&tool["body_rules"]));
    }
}

/// Writes a new secret file, readable by its owner only; never over an existing one.
fn write_secret(path: &std::path::Path, text: &str) -> anyhow::Result<()> {
    use std::io::Write;
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let mut out = options
        .open(path)
        .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    out.write_all(text.as_bytes())?;
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let colours = std::io::IsTerminal::is_terminal(&std::io::stderr());
    use tracing_subscriber::layer::Layer;
    use tracing_subscriber::util::SubscriberInitExt;
    let filter = tracing_subscriber::EnvFilter::try_from_env("OBOL_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // Both formats write through the one escaping writer; JSON escapes control characters in
    // its strings itself, so the writer only ever sees them in text lines.
    let output = match cli.log_format {
        LogFormat::Text => tracing_subscriber::fmt::layer()
            .with_writer(move || obol::names::LogWriter::new(std::io::stderr(), colours))
            .with_ansi(colours)
            .boxed(),
        LogFormat::Json => tracing_subscriber::fmt::layer()
            .json()
            .with_writer(|| obol::names::LogWriter::new(std::io::stderr(), false))
            .boxed(),
    };
    // Spans to an OpenTelemetry collector, when the build has `otlp` and the endpoint is set.
    #[cfg(feature = "otlp")]
    let (exporter, _exporting) = match obol::telemetry::otlp_layer() {
        Ok(Some((layer, exporting))) => (Some(layer), Some(exporting)),
        Ok(None) => (None, None),
        Err(error) => {
            eprintln!("obol: OTLP export: {}", one_line(&error));
            return ExitCode::FAILURE;
        }
    };
    #[cfg(not(feature = "otlp"))]
    let exporter: Option<Box<dyn Layer<_> + Send + Sync>> = None;
    obol::telemetry::subscriber(
        output.with_filter(obol::telemetry::log_filter(filter)),
        exporter,
    )
    .init();
    match run(cli.command, Output::of(cli.json)) {
        Ok(code) => code,
        Err(error) => {
            eprintln!("obol: {}", one_line(&error));
            ExitCode::FAILURE
        }
    }
}

/// An error and its causes on one line, each said once: many errors already carry their
/// cause's message in their own (`"{path}: {source}"`), and anyhow's `{:#}` would repeat it.
fn one_line(error: &anyhow::Error) -> String {
    let mut line = error.to_string();
    for cause in error.chain().skip(1) {
        let said = cause.to_string();
        if !line.contains(&said) {
            line.push_str(": ");
            line.push_str(&said);
        }
    }
    line
}

/// `obol upstreams`: lists each upstream as the gateway would at start, and prints what it
/// derived. Exits 1 when an upstream could not be listed (the reason is on stderr).
async fn show_upstreams(config: &Config, output: Output) -> anyhow::Result<ExitCode> {
    use obol::upstream::{Target, UpstreamId, Upstreams};
    use serde_json::json;
    let (upstreams, _signals) = Upstreams::new(&config.outbound)?;
    let mut found = Vec::new();
    for workspace in &config.workspaces {
        for connection in &workspace.connections {
            let id = UpstreamId {
                workspace: workspace.id.clone(),
                connection: connection.id.clone(),
            };
            let Some(target) = Target::of(&id, connection) else {
                continue;
            };
            upstreams
                .refresh(target, obol::upstream::Staleness::Stale)
                .await;
            let version = upstreams.protocol_version(&id).await;
            let listed = upstreams.snapshot().remove(&id).unwrap_or_default();
            let prefix = &target.upstream.prefix;
            let tools: Vec<serde_json::Value> = listed
                .tools
                .iter()
                .flat_map(|tools| tools.iter())
                .filter(|_| !listed.down)
                .map(|tool| {
                    let effect = &tool.effect;
                    let errors = match target.upstream.tools.get(&tool.upstream_name) {
                        Some(declared)
                            if declared.error_results
                                == obol::config::ErrorResults::AreRejections =>
                        {
                            "rejected"
                        }
                        _ => "may_have_acted",
                    };
                    let safety = match (effect.destructive, connection.environment) {
                        (true, obol::policy::Environment::Prod) => {
                            "destructive: held for approval, hidden from glob keys"
                        }
                        (true, _) => "destructive (held in prod)",
                        (false, _) => "read-only",
                    };
                    json!({
                        "name": format!("{prefix}.{}", tool.upstream_name),
                        "safety": safety,
                        "destructive": effect.destructive,
                        "propagation": effect.propagation.label(),
                        "is_error": errors,
                        "output_schema": effect.output_schema.is_some(),
                    })
                })
                .collect();
            found.push(json!({
                "workspace": workspace.id,
                "connection": connection.id,
                "prefix": prefix,
                "environment": connection.environment.as_str(),
                "protocol": version.filter(|_| listed.tools.is_some() && !listed.down),
                "up": listed.tools.is_some() && !listed.down,
                "tools": tools,
            }));
        }
    }
    match output {
        Output::Json => println!("{}", serde_json::to_string_pretty(&found)?),
        Output::Text => {
            for upstream in &found {
                let state = match upstream["protocol"].as_str() {
                    Some(version) => format!("protocol {version}"),
                    None => "DOWN: not listed (see the log line above)".to_owned(),
                };
                println!(
                    "{}/{} (prefix {}, {}): {state}",
                    upstream["workspace"].as_str().unwrap_or_default(),
                    upstream["connection"].as_str().unwrap_or_default(),
                    upstream["prefix"].as_str().unwrap_or_default(),
                    upstream["environment"].as_str().unwrap_or_default(),
                );
                for tool in upstream["tools"].as_array().into_iter().flatten() {
                    println!(
                        "  {}  {}; route=mcp propagation={} (never resent after a send) is_error={} output_schema={}",
                        tool["name"].as_str().unwrap_or_default(),
                        tool["safety"].as_str().unwrap_or_default(),
                        tool["propagation"].as_str().unwrap_or_default(),
                        tool["is_error"].as_str().unwrap_or_default(),
                        tool["output_schema"],
                    );
                }
            }
        }
    }
    let all_up = found.iter().all(|upstream| upstream["up"] == json!(true));
    Ok(if all_up {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

fn run(command: Command, output: Output) -> anyhow::Result<ExitCode> {
    match command {
        Command::Serve { config, listen } => {
            let mut config = Config::load(&config)?;
            if let Some(listen) = listen {
                config.listen = listen;
            }
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()?;
            runtime.block_on(async {
                if let Some(address) = config.sandbox {
                    let bound = obol::sandbox::spawn(address).await?;
                    eprintln!("sandbox vendor on http://{bound}");
                }
                let listener = tokio::net::TcpListener::bind(config.listen).await?;
                obol::server::serve(config, listener).await
            })?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Check { component, config } => {
            let bytes = std::fs::read(&component)
                .map_err(|e| anyhow::anyhow!("{}: {e}", component.display()))?;
            let signature = std::fs::read_to_string(obol::catalog::signature_path(&component)).ok();
            let runtime = Runtime::new(RuntimeConfig {
                max_concurrent_calls: 1,
                ..RuntimeConfig::default()
            })?;
            let connector = match load_connector(&runtime, &component.display().to_string(), &bytes)
            {
                Ok(connector) => connector,
                Err(error) => {
                    eprintln!("obol check: {error}");
                    return Ok(ExitCode::from(2));
                }
            };
            let report = check_report(&connector, &bytes, signature.as_deref(), config)?;
            match output {
                Output::Json => println!("{}", serde_json::to_string_pretty(&report)?),
                Output::Text => print_check(&report),
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Harness {
            protocol,
            cache,
            component,
        } => obol::harness::serve(protocol, cache, &component),
        Command::Store {
            command: StoreCommand::Migrate { config },
        } => {
            let config = Config::load(&config)?;
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            runtime.block_on(async {
                // Progress on stderr, the answer on stdout.
                eprintln!("obol store migrate: opening the store");
                let store = obol::server::open_store(&config.store).await?;
                eprintln!(
                    "obol store migrate: checking for older capability records and live gateways of another layout"
                );
                match obol::store::layout::migrate(&store, obol::clock::now_ms()).await {
                    Ok(migrated) => {
                        println!(
                            "{}",
                            serde_json::json!({
                                "migrated": true,
                                "from": migrated.from,
                                "layout": obol::store::layout::CURRENT,
                            })
                        );
                        Ok(ExitCode::SUCCESS)
                    }
                    Err(check) => {
                        println!(
                            "{}",
                            serde_json::json!({ "migrated": false, "why": check.to_string() })
                        );
                        Ok(ExitCode::FAILURE)
                    }
                }
            })
        }
        Command::New {
            command:
                NewCommand::Connector {
                    name,
                    path,
                    obol,
                    git,
                },
        } => {
            use obol::scaffold::Dependencies;
            let dependencies = match (git, obol) {
                (Some(url), _) => Dependencies::Git(url),
                (None, Some(root)) => Dependencies::Checkout(std::path::absolute(root)?),
                (None, None) => {
                    // This binary's own checkout, when it was built from one that still exists.
                    let built_from = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/.."));
                    if !built_from.join("sdk/obol-sdk/Cargo.toml").is_file() {
                        anyhow::bail!(
                            "no Obol checkout to take obol-sdk from: pass --obol PATH (a checkout) or --git URL"
                        );
                    }
                    Dependencies::Checkout(std::fs::canonicalize(built_from)?)
                }
            };
            let dir = path.unwrap_or_else(|| PathBuf::from(&name));
            let created = obol::scaffold::create(&name, &dir, &dependencies)?;
            for file in &created.files {
                println!("created {}", file.display());
            }
            println!(
                "\nnext:\n  cd {}\n  cargo test                                      # builds the component, runs it in the harness\n  cargo build --release --target wasm32-wasip2\n  obol check target/wasm32-wasip2/release/{}.wasm\n  python3 mock_vendor.py &   obol serve --config obol.toml",
                created.dir.display(),
                name.replace('-', "_")
            );
            Ok(ExitCode::SUCCESS)
        }
        Command::Completions { shell } => {
            use clap::CommandFactory;
            clap_complete::generate(shell, &mut Cli::command(), "obol", &mut std::io::stdout());
            Ok(ExitCode::SUCCESS)
        }
        Command::Upstreams { config } => {
            let config = Config::load(&config)?;
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            runtime.block_on(show_upstreams(&config, output))
        }
        Command::Receipts {
            url,
            key,
            limit,
            id,
        } => {
            let path = match &id {
                Some(id) => format!("/v1/receipts/{id}"),
                None => format!("/v1/receipts?limit={limit}"),
            };
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            let (status, body) = runtime.block_on(async {
                let response = reqwest::Client::new()
                    .get(format!("{}{path}", url.trim_end_matches('/')))
                    .bearer_auth(&key)
                    .send()
                    .await?;
                let status = response.status();
                let body: serde_json::Value = response.json().await?;
                anyhow::Ok((status, body))
            })?;
            println!("{}", serde_json::to_string_pretty(&body)?);
            Ok(if status.is_success() {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            })
        }
        Command::Approvals {
            command: ApprovalsCommand::Keygen { file },
        } => {
            let key = obol::approvals::token::generate_signing_key();
            write_secret(&file, &format!("{}\n", hex::encode(key.to_bytes())))?;
            println!(
                "public_key = \"{}\"",
                hex::encode(key.verifying_key().to_bytes())
            );
            Ok(ExitCode::SUCCESS)
        }
        Command::Keys {
            command:
                KeysCommand::Create {
                    admin,
                    name,
                    workspace,
                    environment,
                    allowed_tools,
                    scopes,
                    filter,
                    policy,
                },
        } => {
            let mut spec = serde_json::json!({
                "name": name, "workspace": workspace, "environment": environment,
                "allowed_tools": allowed_tools,
            });
            if !scopes.is_empty() {
                spec["scopes"] = serde_json::json!(scopes);
            }
            if let Some(filter) = filter {
                spec["filter"] = filter.into();
            }
            if let Some(policy) = policy {
                spec["policy"] = policy.into();
            }
            admin_call(
                &admin,
                reqwest::Method::POST,
                "/v1/admin/keys",
                Body::Json(spec),
            )
        }
        Command::Keys {
            command: KeysCommand::List { admin },
        } => admin_call(&admin, reqwest::Method::GET, "/v1/admin/keys", Body::None),
        Command::Keys {
            command: KeysCommand::Revoke { admin, name },
        } => admin_call(
            &admin,
            reqwest::Method::DELETE,
            &format!("/v1/admin/keys/{name}"),
            Body::None,
        ),
        Command::Connectors { command } => {
            let read = |path: &PathBuf| {
                std::fs::read(path).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))
            };
            // The component and, when it has one, its detached signature.
            let upload = |path: &PathBuf| -> anyhow::Result<Body> {
                let signature_file = obol::catalog::signature_path(path);
                let signature = match std::fs::read_to_string(&signature_file) {
                    Ok(text) => Some(text),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
                    Err(e) => anyhow::bail!("{}: {e}", signature_file.display()),
                };
                Ok(Body::Wasm(read(path)?, signature))
            };
            match command {
                ConnectorsCommand::Keygen { secret_key } => {
                    let (secret, public) =
                        obol::catalog::trust::keygen().map_err(|e| anyhow::anyhow!(e))?;
                    write_secret(&secret_key, &secret)?;
                    println!("public key: {public}");
                    println!(
                        "[connectors.trust]\npublishers = [{{ name = \"PUBLISHER\", key = \"{public}\" }}]"
                    );
                    Ok(ExitCode::SUCCESS)
                }
                ConnectorsCommand::Sign {
                    secret_key,
                    component,
                } => {
                    let secret = std::fs::read_to_string(&secret_key)
                        .map_err(|e| anyhow::anyhow!("{}: {e}", secret_key.display()))?;
                    let name = component
                        .file_name()
                        .map(|n| n.to_string_lossy().into_owned())
                        .unwrap_or_default();
                    let signature = obol::catalog::trust::sign(&secret, &read(&component)?, &name)
                        .map_err(|e| anyhow::anyhow!(e))?;
                    let path = obol::catalog::signature_path(&component);
                    std::fs::write(&path, signature)
                        .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
                    println!("{}", path.display());
                    Ok(ExitCode::SUCCESS)
                }
                ConnectorsCommand::Verify {
                    public_key,
                    component,
                } => {
                    use obol::catalog::trust::{Publisher, Trust, trusted_comment};
                    let key = std::fs::read_to_string(&public_key).unwrap_or(public_key);
                    let publisher =
                        Publisher::parse("the given key", &key).map_err(|e| anyhow::anyhow!(e))?;
                    let path = obol::catalog::signature_path(&component);
                    let signature = std::fs::read_to_string(&path)
                        .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
                    let bytes = read(&component)?;
                    let digest = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(&bytes));
                    let trust = Trust::new(vec![publisher.clone()], Default::default());
                    match trust.admit(&bytes, &digest, Some(&signature)) {
                        Ok(_) => {
                            println!(
                                "verified: signed by key id {} ({})",
                                publisher.key_id(),
                                trusted_comment(&signature).unwrap_or_default()
                            );
                            Ok(ExitCode::SUCCESS)
                        }
                        Err(error) => {
                            eprintln!("obol connectors verify: {}: {error}", component.display());
                            Ok(ExitCode::from(1))
                        }
                    }
                }
                ConnectorsCommand::List { admin } => admin_call(
                    &admin,
                    reqwest::Method::GET,
                    "/v1/admin/connectors",
                    Body::None,
                ),
                ConnectorsCommand::Add { admin, component } => admin_call(
                    &admin,
                    reqwest::Method::POST,
                    "/v1/admin/connectors",
                    upload(&component)?,
                ),
                ConnectorsCommand::Replace {
                    admin,
                    name,
                    component,
                } => admin_call(
                    &admin,
                    reqwest::Method::PUT,
                    &format!("/v1/admin/connectors/{name}"),
                    upload(&component)?,
                ),
                ConnectorsCommand::Remove { admin, name } => admin_call(
                    &admin,
                    reqwest::Method::DELETE,
                    &format!("/v1/admin/connectors/{name}"),
                    Body::None,
                ),
            }
        }
        Command::Policies {
            command:
                PoliciesCommand::Publish {
                    admin,
                    workspace,
                    file,
                },
        } => {
            let text = std::fs::read_to_string(&file)
                .map_err(|e| anyhow::anyhow!("{}: {e}", file.display()))?;
            admin_call(
                &admin,
                reqwest::Method::POST,
                &format!("/v1/admin/workspaces/{workspace}/publications"),
                Body::Text(text),
            )
        }
        Command::Policies {
            command: PoliciesCommand::List { admin, workspace },
        } => admin_call(
            &admin,
            reqwest::Method::GET,
            &format!("/v1/admin/workspaces/{workspace}/publications"),
            Body::None,
        ),
        Command::Keys {
            command: KeysCommand::Mint { kind },
        } => {
            let mut bytes = [0u8; 32];
            getrandom::fill(&mut bytes).expect("the OS random source is available");
            let token = format!("{}{}", kind.prefix(), hex::encode(bytes));
            println!("token: {token}\nhash:  {}", KeyHash::of_token(&token));
            Ok(ExitCode::SUCCESS)
        }
        Command::Keys {
            command: KeysCommand::Hash { token },
        } => {
            let token = match token {
                Some(token) => token,
                None => {
                    let mut text = String::new();
                    std::io::stdin().read_to_string(&mut text)?;
                    text.trim().to_owned()
                }
            };
            println!("{}", KeyHash::of_token(&token));
            Ok(ExitCode::SUCCESS)
        }
    }
}
