//! A real `obol serve` process on an ephemeral port, configured per test.

use std::fmt::Write as _;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::{SECRET, TOKEN, guests, key_hash};

/// A key for the generated config.
#[derive(Debug, Clone)]
pub struct Key {
    pub token: String,
    pub workspace: String,
    pub allowed_tools: Vec<String>,
    pub environment: String,
    pub scopes: Vec<String>,
    pub filter: Option<String>,
    /// The policy publication to pin (`None`: latest).
    pub policy: Option<String>,
    /// `full` or `progressive` (`None`: the default, full).
    pub tools_mode: Option<String>,
}

impl Key {
    pub fn new(token: &str, workspace: &str, allowed: &[&str]) -> Key {
        Key {
            token: token.into(),
            workspace: workspace.into(),
            allowed_tools: allowed.iter().map(|s| s.to_string()).collect(),
            environment: "dev".into(),
            scopes: vec!["mcp".into(), "receipts".into()],
            filter: None,
            policy: None,
            tools_mode: None,
        }
    }

    /// A key in progressive mode (`search_tools` and `call_tool`).
    pub fn progressive(token: &str, workspace: &str, allowed: &[&str]) -> Key {
        Key {
            tools_mode: Some("progressive".into()),
            ..Key::new(token, workspace, allowed)
        }
    }
}

/// Builds an `obol.toml` for one test.
#[derive(Debug, Clone)]
pub struct GatewayConfig {
    pub components: Vec<String>,
    pub connectors_dir: bool,
    pub vendor: String,
    pub keys: Vec<Key>,
    pub extra: String,
    pub allowed_origins: Option<Vec<String>>,
    /// Environment for the gateway process (e.g. `OBOL_FAILPOINTS`).
    pub env: Vec<(String, String)>,
    /// `[store]` settings; the embedded file in the test's directory by default.
    pub store: Option<String>,
    /// The environment the gateway serves (`dev` by default).
    pub environment: Option<String>,
    /// Workspaces to freeze.
    pub frozen: Vec<String>,
    /// The environment of the `acme` connections (the gateway's by default).
    pub connection_environment: Option<String>,
    /// Cedar publications of workspace `acme`: (number, policy text).
    pub publications: Vec<(u32, String)>,
    /// The token of `acme`'s owner, who approves held calls in the inbox.
    pub owner: Option<String>,
    /// More `[server]` settings (listener limits), one per line.
    pub server: String,
    /// The gateway's open-file limit (`prlimit --nofile`), for tests that run it out.
    pub open_files: Option<u64>,
    /// The gateway's address-space limit in bytes (`prlimit --as`).
    pub address_space: Option<u64>,
    /// More settings of workspace `acme` (e.g. `upstream_failure`), one per line.
    pub acme_settings: String,
    /// More connections of workspace `acme` (TOML `[[workspaces.connections]]` tables).
    pub acme_connections: String,
}

impl GatewayConfig {
    /// Both first-party connectors and the hostile one, in workspace `acme` (plus an empty
    /// workspace `globex`), all pointed at `vendor`; the owner key may call everything.
    pub fn new(vendor: &str) -> GatewayConfig {
        GatewayConfig {
            components: vec![
                guests::PAYMENTS.into(),
                guests::TRACKER.into(),
                guests::HOSTILE.into(),
            ],
            connectors_dir: false,
            vendor: vendor.to_owned(),
            keys: vec![
                Key::new(TOKEN, "acme", &["*"]),
                Key::new("obk_test_globex", "globex", &["*"]),
            ],
            extra: String::new(),
            allowed_origins: None,
            env: Vec::new(),
            store: None,
            environment: None,
            frozen: Vec::new(),
            connection_environment: None,
            publications: Vec::new(),
            owner: None,
            server: String::new(),
            open_files: None,
            address_space: None,
            acme_settings: String::new(),
            acme_connections: String::new(),
        }
    }

    /// Runs `obol serve` on this config, which it must refuse: returns what it said on stderr
    /// (panics if it starts serving or is still running after 15 s).
    pub fn refused(&self) -> String {
        let dir = tempfile::tempdir().unwrap();
        let config_path = dir.path().join("obol.toml");
        std::fs::write(&config_path, self.render(dir.path())).unwrap();
        let log = dir.path().join("refused.log");
        let mut child = Command::new(env!("CARGO_BIN_EXE_obol"))
            .arg("serve")
            .arg("--config")
            .arg(&config_path)
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(15);
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            if std::time::Instant::now() > deadline {
                let _ = child.kill();
                panic!("the gateway did not refuse its config");
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        assert!(!status.success(), "the gateway exited successfully");
        std::fs::read_to_string(&log).unwrap_or_default()
    }

    pub fn with_key(mut self, token: &str, workspace: &str, allowed: &[&str]) -> GatewayConfig {
        self.keys.push(Key::new(token, workspace, allowed));
        self
    }

    fn render(&self, dir: &Path) -> String {
        let mut toml = String::new();
        writeln!(toml, "[server]\nlisten = \"127.0.0.1:0\"\n{}", self.server).unwrap();
        if let Some(environment) = &self.environment {
            writeln!(toml, "environment = {environment:?}").unwrap();
        }
        if let Some(origins) = &self.allowed_origins {
            writeln!(toml, "allowed_origins = {origins:?}").unwrap();
        }
        writeln!(
            toml,
            "[runtime]\ncall_deadline_ms = 500\nmemory_limit_mib = 32\ncache_dir = {:?}",
            dir.join("cache")
        )
        .unwrap();
        writeln!(
            toml,
            "[outbound]\nrequest_timeout_ms = 1500\nmax_response_kib = 1024"
        )
        .unwrap();
        writeln!(toml, "[connectors]\ncomponents = {:?}", self.components).unwrap();
        if self.connectors_dir {
            writeln!(toml, "dir = {:?}", dir.join("connectors.d")).unwrap();
        }
        std::fs::write(dir.join("secret.txt"), SECRET).unwrap();
        writeln!(
            toml,
            "[[workspaces]]\nid = \"acme\"\nfrozen = {}",
            self.frozen.iter().any(|w| w == "acme")
        )
        .unwrap();
        if let Some(owner) = &self.owner {
            writeln!(toml, "owner = \"{}\"", key_hash(owner)).unwrap();
        }
        toml.push_str(&self.acme_settings);
        toml.push('\n');
        for (id, connector, secret) in [
            ("stripe-main", "stripe", true),
            ("tracker-main", "tracker", false),
            ("hostile-main", "hostile", true),
        ] {
            writeln!(
                toml,
                "[[workspaces.connections]]\nid = \"{id}\"\nconnector = \"{connector}\"\nbase_url = \"{}\"",
                self.vendor
            )
            .unwrap();
            if let Some(environment) = &self.connection_environment {
                writeln!(toml, "environment = {environment:?}").unwrap();
            }
            if secret {
                writeln!(
                    toml,
                    "[workspaces.connections.secret]\nfile = {:?}\nscheme = \"Bearer\"",
                    dir.join("secret.txt")
                )
                .unwrap();
            }
            if connector == "tracker" {
                writeln!(
                    toml,
                    "[workspaces.connections.settings]\nowner = \"acme\"\nrepo = \"app\""
                )
                .unwrap();
            }
        }
        toml.push_str(&self.acme_connections);
        toml.push('\n');
        for (number, policies) in &self.publications {
            writeln!(
                toml,
                "[[workspaces.publications]]\nnumber = {number}\npolicies = {policies:?}"
            )
            .unwrap();
        }
        writeln!(
            toml,
            "[[workspaces]]\nid = \"globex\"\nfrozen = {}",
            self.frozen.iter().any(|w| w == "globex")
        )
        .unwrap();
        for (index, key) in self.keys.iter().enumerate() {
            writeln!(
                toml,
                "[[keys]]\nname = \"key-{index}\"\nhash = \"{}\"\nworkspace = \"{}\"\nenvironment = {:?}\nallowed_tools = {:?}\nscopes = {:?}",
                key_hash(&key.token),
                key.workspace,
                key.environment,
                key.allowed_tools,
                key.scopes
            )
            .unwrap();
            if let Some(filter) = &key.filter {
                writeln!(toml, "filter = {filter:?}").unwrap();
            }
            if let Some(policy) = &key.policy {
                writeln!(toml, "policy = {policy:?}").unwrap();
            }
            if let Some(mode) = &key.tools_mode {
                writeln!(toml, "tools_mode = {mode:?}").unwrap();
            }
        }
        match &self.store {
            Some(store) => writeln!(toml, "[store]\n{store}").unwrap(),
            None => writeln!(toml, "[store]\npath = {:?}", dir.join("obol.redb")).unwrap(),
        }
        // Redis needs a shared approval signing key; tests that do not care get one per
        // directory.
        let redis = self
            .store
            .as_deref()
            .is_some_and(|s| s.contains("redis_url") || s.contains("redis_cluster"));
        if redis && !self.extra.contains("[approvals]") {
            let key = dir.join("approval.key");
            std::fs::write(
                &key,
                hex::encode(obol::approvals::token::generate_signing_key().to_bytes()),
            )
            .unwrap();
            writeln!(
                toml,
                "[approvals]\nsigning_key = {{ id = \"test\", file = {key:?} }}"
            )
            .unwrap();
        }
        toml.push_str(&self.extra);
        toml
    }
}

static LOGS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// A running gateway. Killed on drop.
pub struct GatewayProcess {
    child: Child,
    pub url: String,
    pub dir: tempfile::TempDir,
    log: PathBuf,
}

impl GatewayProcess {
    pub fn start(config: &GatewayConfig) -> GatewayProcess {
        Self::start_in(config, tempfile::tempdir().unwrap())
    }

    /// Starts a gateway in `dir`, reusing whatever state (store file, cache) it holds: a
    /// restart after a crash.
    pub fn start_in(config: &GatewayConfig, dir: tempfile::TempDir) -> GatewayProcess {
        std::fs::create_dir_all(dir.path().join("connectors.d")).unwrap();
        let config_path = dir.path().join("obol.toml");
        std::fs::write(&config_path, config.render(dir.path())).unwrap();
        let log = dir.path().join(format!(
            "gateway-{}.log",
            std::process::id() as u64 * 1000
                + LOGS.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ));
        // Resource limits go through util-linux's `prlimit`, which execs the gateway with them.
        let limits: Vec<String> = [
            config.open_files.map(|n| format!("--nofile={n}:{n}")),
            config.address_space.map(|n| format!("--as={n}:{n}")),
        ]
        .into_iter()
        .flatten()
        .collect();
        let mut command = match limits.is_empty() {
            true => Command::new(env!("CARGO_BIN_EXE_obol")),
            false => {
                let mut prlimit = Command::new("prlimit");
                prlimit
                    .args(&limits)
                    .arg("--")
                    .arg(env!("CARGO_BIN_EXE_obol"));
                prlimit
            }
        };
        let mut child = command
            .arg("serve")
            .arg("--config")
            .arg(&config_path)
            .env("OBOL_LOG", "debug")
            .envs(config.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line).unwrap();
        let url = line
            .trim()
            .strip_prefix("obol listening on ")
            .unwrap_or_else(|| {
                panic!(
                    "the gateway did not start: {:?}\n{}",
                    line,
                    std::fs::read_to_string(&log).unwrap_or_default()
                )
            })
            .to_owned();
        GatewayProcess {
            child,
            url,
            dir,
            log,
        }
    }

    /// The gateway's peak resident memory so far, in MiB (`VmHWM`).
    pub fn peak_rss_mib(&self) -> u64 {
        self.status_kib("VmHWM:") / 1024
    }

    /// The gateway's resident memory now, in MiB (`VmRSS`).
    pub fn rss_mib(&self) -> f64 {
        self.status_kib("VmRSS:") as f64 / 1024.0
    }

    /// How many times the gateway's thread named `name` has gone to sleep and been woken so
    /// far (`voluntary_ctxt_switches` of its `/proc` task).
    pub fn thread_wakeups(&self, name: &str) -> u64 {
        let tasks = format!("/proc/{}/task", self.child.id());
        std::fs::read_dir(tasks)
            .unwrap()
            .filter_map(|task| {
                let task = task.ok()?.path();
                let comm = std::fs::read_to_string(task.join("comm")).ok()?;
                (comm.trim() == name).then(|| std::fs::read_to_string(task.join("status")).ok())?
            })
            .find_map(|status| {
                status.lines().find_map(|line| {
                    line.strip_prefix("voluntary_ctxt_switches:")?
                        .trim()
                        .parse()
                        .ok()
                })
            })
            .unwrap_or_else(|| panic!("no thread named {name}"))
    }

    fn status_kib(&self, field: &str) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        status
            .lines()
            .find_map(|line| line.strip_prefix(field))
            .and_then(|value| value.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap()
    }

    /// Everything the gateway logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits until the gateway has logged `needle` (e.g. that it reached a failpoint); panics
    /// with the log after 10 s.
    pub async fn wait_for_log(&self, needle: &str) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while !self.log().contains(needle) {
            assert!(tokio::time::Instant::now() < deadline, "{}", self.log());
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub fn connectors_dir(&self) -> PathBuf {
        self.dir.path().join("connectors.d")
    }

    /// Waits for the process to exit by itself (for configs that must be refused).
    pub fn wait_exit(mut self, timeout: Duration) -> Option<i32> {
        let deadline = std::time::Instant::now() + timeout;
        while std::time::Instant::now() < deadline {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status.code();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }
}

impl GatewayProcess {
    /// SIGKILL: no shutdown, no flush; returns the directory so a new process can reuse it.
    pub fn kill(mut self) -> tempfile::TempDir {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let placeholder = tempfile::tempdir().unwrap();
        std::mem::replace(&mut self.dir, placeholder)
    }
}

impl Drop for GatewayProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs `obol` with arguments and returns (exit code, stdout, stderr).
pub fn run_obol(args: &[&str]) -> (i32, String, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_obol"))
        .args(args)
        .output()
        .unwrap();
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}
