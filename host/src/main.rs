//! The `obol` command: `serve`, `check`, `receipts`, `keys hash`.

use std::io::Read;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use obol::catalog::load_connector;
use obol::config::{Config, RuntimeConfig};
use obol::policy::KeyHash;
use obol::runtime::Runtime;

#[derive(Parser)]
#[command(
    name = "obol",
    version,
    about = "An MCP gateway for WebAssembly connectors"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
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
    /// Validate a connector component and print its manifest.
    Check {
        /// The component (.wasm) to check.
        component: PathBuf,
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
    /// Manage virtual keys.
    Keys {
        #[command(subcommand)]
        command: KeysCommand,
    },
}

#[derive(Subcommand)]
enum KeysCommand {
    /// Print the `sha256:…` form of a key's token for the config (reads stdin without TOKEN).
    Hash { token: Option<String> },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("OBOL_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    match run(cli.command) {
        Ok(code) => code,
        Err(error) => {
            eprintln!("obol: {error:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(command: Command) -> anyhow::Result<ExitCode> {
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
                obol::gateway::serve(config, listener).await
            })?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Check { component } => {
            let bytes = std::fs::read(&component)
                .map_err(|e| anyhow::anyhow!("{}: {e}", component.display()))?;
            let runtime = Runtime::new(RuntimeConfig {
                max_concurrent_calls: 1,
                ..RuntimeConfig::default()
            })?;
            match load_connector(&runtime, &component.display().to_string(), &bytes) {
                Ok(connector) => {
                    let m = &connector.manifest;
                    println!(
                        "{} {} (sha256 {})",
                        m.name, m.version, connector.guest.digest
                    );
                    for tool in &m.tools {
                        let e = &tool.effect;
                        println!(
                            "  {}.{}  route={:?} destructive={} propagation={} output_schema={}",
                            m.name,
                            tool.upstream_name,
                            e.route,
                            e.destructive,
                            e.propagation.label(),
                            e.output_schema.is_some()
                        );
                    }
                    Ok(ExitCode::SUCCESS)
                }
                Err(error) => {
                    eprintln!("obol check: {error}");
                    Ok(ExitCode::from(2))
                }
            }
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
