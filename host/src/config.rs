//! The operator's configuration file (`obol.toml`), parsed into values that are valid by
//! construction: a config that loads describes a gateway that can start.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;

use crate::policy::{
    Environment, KeyHash, PolicyPin, Publication, Scope, ToolFilter, ToolGlob, ToolsMode,
    VirtualKey,
};

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: {source}")]
    Syntax {
        path: PathBuf,
        source: Box<toml::de::Error>,
    },
    #[error("{0}")]
    Invalid(String),
}

/// The whole gateway configuration.
#[derive(Debug, Clone)]
pub struct Config {
    pub listen: SocketAddr,
    /// The environment this deployment serves; keys of another environment are refused.
    pub environment: Environment,
    /// Browser origins allowed to call `/mcp`; requests without an `Origin` header (non-browser
    /// clients) are always accepted.
    pub allowed_origins: Vec<String>,
    /// What each connection may hold, and for how long (`[server]`).
    pub limits: crate::listener::Limits,
    pub runtime: RuntimeConfig,
    pub components: Vec<ComponentSource>,
    pub connectors_dir: Option<PathBuf>,
    pub reload_interval: Option<Duration>,
    /// `[connectors.trust]`: which components may load (`None`: all of them).
    pub trust: Option<crate::catalog::trust::Trust>,
    pub outbound: OutboundConfig,
    pub workspaces: Vec<WorkspaceConfig>,
    /// The `[[keys]]`, parsed into the keys the gateway authenticates.
    pub keys: Vec<VirtualKey>,
    /// Serve the bundled sandbox vendor on this address (the README's offline demo).
    pub sandbox: Option<SocketAddr>,
    pub store: StoreConfig,
    pub approvals: ApprovalsConfig,
    /// The sha256 of the admin API's bearer token; `None` disables the admin API.
    pub admin: Option<KeyHash>,
    /// When a capability provider's breaker opens (`[routing]`).
    pub breaker: crate::capability::breaker::BreakerPolicy,
}

/// Approval tokens and the inbox.
#[derive(Debug, Clone)]
pub struct ApprovalsConfig {
    /// Signs new tokens and verifies current and not-yet-retired ones.
    pub keyring: Arc<crate::approvals::Keyring>,
    /// The gateway's address as a browser reaches it; `inbox_url` is built from it. `None`:
    /// the address the gateway listens on.
    pub public_url: Option<String>,
}

/// Where claims, receipts and the audit log live.
#[derive(Debug, Clone)]
pub struct StoreConfig {
    pub backend: StoreBackend,
    /// How long a holder may keep a claim in flight before another call may treat it as
    /// dead (finalize it `unknown`, or take it over when nothing was sent).
    pub lease: Duration,
    /// How long finalized claims, receipts, audit records and expired tickets are kept (both
    /// backends; at least 25 h, longer than an approval ticket lives).
    pub retention: Duration,
    /// Redis only: how many replicas must acknowledge each write (`WAIT`), and for how long
    /// the gateway waits for them before it fails the call closed.
    pub redis_replicas: u32,
    pub redis_replica_timeout: Duration,
    /// Embedded only: the most of the file kept in memory.
    pub cache_bytes: usize,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreBackend {
    /// A single durable file (the default): `obol.redb` next to the config.
    Embedded(PathBuf),
    /// Redis, for several gateways sharing state.
    Redis(RedisTarget),
    /// In memory, no durability (`volatile = true`): benchmarks only; not in shipped builds.
    #[cfg(feature = "test-util")]
    Volatile,
}

/// Which Redis the store uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RedisTarget {
    /// One server (`redis_url`), with or without replicas.
    Node(String),
    /// A Redis Cluster, by some of its nodes (`redis_cluster`); the rest are discovered.
    Cluster(Vec<String>),
}

/// Limits applied to every guest call (defined beside the sandbox that applies them).
pub use obol_runtime::RuntimeConfig;

#[derive(Debug, Clone)]
pub struct OutboundConfig {
    pub connect_timeout: Duration,
    pub request_timeout: Duration,
    pub max_response_bytes: usize,
    /// How long one MCP upstream's `tools/list` (every page) may take.
    pub upstream_list_timeout: Duration,
}

/// Where a component's bytes come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ComponentSource {
    /// One of the first-party connectors compiled into the binary (`bundled:stripe`).
    Bundled(String),
    Path(PathBuf),
}

#[derive(Debug, Clone)]
pub struct WorkspaceConfig {
    pub id: String,
    /// A frozen workspace refuses every call.
    pub frozen: bool,
    /// The sha256 of the owner's token: the owner approves held calls in the inbox.
    pub owner: Option<KeyHash>,
    pub connections: Vec<ConnectionConfig>,
    /// Cedar policy publications, immutable and numbered.
    pub publications: Vec<Arc<Publication>>,
    /// What a listing does when an MCP upstream does not answer (`upstream_failure`).
    pub upstream_failure: UpstreamFailure,
    /// Capabilities (`cap.NAME`), from the config and the admin API.
    pub capabilities: Vec<Arc<crate::catalog::Declared>>,
}

/// What `tools/list` does when one of the workspace's MCP upstreams cannot be listed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum UpstreamFailure {
    /// The upstream's tools are left out (and answer `Unknown tool`) until it answers again.
    #[default]
    Skip,
    /// The listing fails with a retryable error until every upstream answers.
    FailClosed,
}

/// A connector bound to a vendor account inside a workspace.
#[derive(Debug, Clone)]
pub struct ConnectionConfig {
    pub id: String,
    /// The environment the connection's tools belong to (the deployment's by default).
    pub environment: Environment,
    pub kind: ConnectionKind,
    pub secret: Option<SecretRef>,
    /// How long the vendor deduplicates on the idempotency key it receives (Stripe: 24 h).
    /// After it, a same-key retry of an `unknown` call replays instead of resending: a resend
    /// the vendor no longer recognises would be a second effect.
    pub idempotency_window: Duration,
}

/// What serves a connection's tools.
#[derive(Debug, Clone)]
pub enum ConnectionKind {
    /// A WebAssembly component, whose manifest name is also the tool prefix.
    Component {
        connector: String,
        base_url: BaseUrl,
        settings: BTreeMap<String, String>,
        /// The catalog broker this connection goes through (`broker`, `retry_off`): required
        /// for the component's federated tools, which run only through their own broker.
        broker: Option<Box<crate::broker::Profile>>,
    },
    /// A remote Streamable HTTP MCP server (`kind = "mcp"`).
    Mcp(Arc<McpUpstream>),
    /// The gateway itself, serving its own tools (`search_tools`). Never configured.
    Virtual,
}

/// A remote MCP server and what the operator says about its tools (ADR-0045).
#[derive(Debug)]
pub struct McpUpstream {
    pub url: UpstreamUrl,
    /// The tool prefix: `prefix.upstream_tool`.
    pub prefix: String,
    /// Whether the upstream's `readOnlyHint` may make a tool non-destructive.
    pub annotations: Annotations,
    /// Per-tool declarations, by the upstream's unprefixed name.
    pub tools: BTreeMap<String, UpstreamToolConfig>,
    /// The protocol version offered in `initialize` (the upstream may answer an older one).
    pub protocol_version: Option<String>,
}

/// The protocol versions the gateway speaks to MCP upstreams, newest first.
pub const PROTOCOL_VERSIONS: [&str; 5] = [
    "2026-07-28",
    "2025-11-25",
    "2025-06-18",
    "2025-03-26",
    "2024-11-05",
];

/// What the operator says of a tool's `isError: true` results (`rejected_on_error`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ErrorResults {
    /// MCP puts partial failures there too: the call may have acted.
    #[default]
    MayHaveActed,
    /// The operator knows this tool's errors are refusals before any effect.
    AreRejections,
}

/// Whether the operator trusts this connection's annotations (`trusted_annotations`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Annotations {
    #[default]
    Untrusted,
    Trusted,
}

/// What the operator declared of a tool in config, if anything.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Declared {
    Destructive,
    ReadOnly,
    Nothing,
}

/// The operator's word on one upstream tool.
#[derive(Debug, Clone, Default)]
pub struct UpstreamToolConfig {
    pub declared: Option<Declared>,
    pub error_results: ErrorResults,
    /// The header the upstream deduplicates this tool's calls on (`idempotency_header`):
    /// the key goes there, and a retryable answer may then be sent once more.
    pub idempotency_header: Option<axum::http::HeaderName>,
}

/// An upstream's URL. It may carry a secret in its query, so it never prints.
#[derive(Clone, PartialEq, Eq)]
pub struct UpstreamUrl(reqwest::Url);

impl UpstreamUrl {
    pub fn parse(text: &str) -> Result<UpstreamUrl, String> {
        // The error never repeats the text: it may hold a token.
        let url = reqwest::Url::parse(text).map_err(|e| format!("url is not a URL ({e})"))?;
        if !matches!(url.scheme(), "http" | "https") || url.host().is_none() {
            return Err("url must be http:// or https:// with a host".into());
        }
        if !url.username().is_empty() || url.password().is_some() {
            return Err("url must not carry credentials; use a secret reference".into());
        }
        Ok(UpstreamUrl(url))
    }

    pub fn as_str(&self) -> &str {
        self.0.as_str()
    }

    /// `scheme://host:port`: what may be shown of it.
    pub fn origin(&self) -> String {
        self.0.origin().ascii_serialization()
    }
}

impl std::fmt::Debug for UpstreamUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "UpstreamUrl({}/…)", self.origin())
    }
}

impl ConnectionConfig {
    /// The first part of every tool name this connection serves.
    pub fn prefix(&self) -> &str {
        self.kind.prefix()
    }
}

impl ConnectionKind {
    fn prefix(&self) -> &str {
        match self {
            ConnectionKind::Component { connector, .. } => connector,
            ConnectionKind::Mcp(upstream) => &upstream.prefix,
            ConnectionKind::Virtual => "",
        }
    }
}

/// The vendor deduplication window assumed when a connection names none (Stripe's).
pub const DEFAULT_IDEMPOTENCY_WINDOW: Duration = Duration::from_secs(24 * 3600);

/// Where a connection's vendor credential lives. The value itself is read only by the
/// outbound hop and never stored in the config.
#[derive(Debug, Clone)]
pub struct SecretRef {
    pub source: SecretSource,
    /// The header that carries the credential, `Authorization` by default.
    pub header: String,
    /// Prepended to the value with a space, e.g. `Bearer`.
    pub scheme: Option<String>,
}

#[derive(Debug, Clone)]
pub enum SecretSource {
    Env(String),
    File(PathBuf),
}

/// A parsed `scheme://host[:port][/path]` with no user info, query or fragment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BaseUrl {
    url: reqwest::Url,
}

impl BaseUrl {
    pub fn parse(text: &str) -> Result<BaseUrl, String> {
        let url = reqwest::Url::parse(text).map_err(|e| format!("{text:?} is not a URL: {e}"))?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(format!("{text:?} must be http or https"));
        }
        if url.host().is_none() {
            return Err(format!("{text:?} has no host"));
        }
        if !url.username().is_empty() || url.password().is_some() {
            return Err(format!(
                "base_url must not carry credentials; use a secret reference ({})",
                url.host_str().unwrap_or_default()
            ));
        }
        if url.query().is_some() || url.fragment().is_some() {
            return Err(format!("{text:?} must not have a query or fragment"));
        }
        Ok(BaseUrl { url })
    }

    pub fn as_str(&self) -> &str {
        self.url.as_str().trim_end_matches('/')
    }

    pub fn origin(&self) -> reqwest::Url {
        let mut origin = self.url.clone();
        origin.set_path("/");
        origin
    }

    pub fn url(&self) -> &reqwest::Url {
        &self.url
    }

    /// Parses `text`, a URL a connector built for a request. A path on this base's origin
    /// (`scheme://host[:port]` exactly as the base writes it, then a `/` that no `/` or `\`
    /// follows, and no tab or line break) is parsed against the base, whose host is not parsed again (its IDNA pass was
    /// most of a URL's parse); anything else is parsed whole. Either way the result is the
    /// URL `text` names.
    pub fn parse_request_url(&self, text: &str) -> Result<reqwest::Url, url::ParseError> {
        // The base has no query or fragment: its text is its origin, then its path.
        let base = self.url.as_str();
        let origin = &base[..base.len() - self.url.path().len()];
        match text.strip_prefix(origin) {
            // After the origin's `/`, another `/` or a `\` would start a new authority, and the
            // parser drops tabs and line breaks first (`/\t/` is `//`).
            Some(path)
                if path.starts_with('/')
                    && !path[1..].starts_with(['/', '\\'])
                    && !path.contains(['\t', '\n', '\r']) =>
            {
                self.url.join(path)
            }
            _ => reqwest::Url::parse(text),
        }
    }
}

// --- The file format. Private: everything above is what the rest of the gateway sees. -------

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    server: ServerFile,
    #[serde(default)]
    runtime: RuntimeFile,
    #[serde(default)]
    outbound: OutboundFile,
    #[serde(default)]
    connectors: ConnectorsFile,
    #[serde(default)]
    sandbox: Option<SandboxFile>,
    #[serde(default)]
    workspaces: Vec<WorkspaceFile>,
    #[serde(default)]
    keys: Vec<KeySpec>,
    #[serde(default)]
    store: StoreFile,
    #[serde(default)]
    approvals: ApprovalsFile,
    #[serde(default)]
    admin: AdminFile,
    #[serde(default)]
    routing: RoutingFile,
}

/// `[routing]`: the circuit breaker capability providers are routed by.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RoutingFile {
    /// Consecutive failed attempts (unreachable, no answer, retryable status) that open it.
    breaker_failures: Option<u32>,
    /// How long it stays open before one call probes the provider again.
    breaker_cooldown_ms: Option<u64>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct AdminFile {
    /// `sha256:<hex>` of the admin token (`obol keys hash TOKEN`).
    token_hash: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct ApprovalsFile {
    /// The key new tokens are signed with (`obol approvals keygen` makes one).
    signing_key: Option<SigningKeyFile>,
    /// Public keys that still verify: the previous signer during a rotation.
    #[serde(default)]
    verify_keys: Vec<VerifyKeyFile>,
    public_url: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SigningKeyFile {
    id: String,
    /// A file holding the 32-byte seed as 64 hex digits.
    file: PathBuf,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct VerifyKeyFile {
    id: String,
    /// 64 hex digits.
    public_key: String,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct StoreFile {
    #[cfg(feature = "test-util")]
    #[serde(default)]
    volatile: bool,
    path: Option<PathBuf>,
    redis_url: Option<String>,
    redis_cluster: Option<Vec<String>>,
    lease_ms: Option<u64>,
    retention_hours: Option<u64>,
    #[serde(default)]
    redis_replicas: u32,
    redis_replica_timeout_ms: Option<u64>,
    cache_mib: Option<usize>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ServerFile {
    #[serde(default = "default_listen")]
    listen: SocketAddr,
    environment: Option<String>,
    #[serde(default)]
    allowed_origins: Option<Vec<String>>,
    max_connections: Option<usize>,
    header_read_timeout_ms: Option<u64>,
    idle_timeout_ms: Option<u64>,
    max_header_bytes: Option<usize>,
    body_budget_mib: Option<usize>,
    body_read_timeout_ms: Option<u64>,
    min_body_bytes_per_s: Option<u64>,
}

impl Default for ServerFile {
    fn default() -> Self {
        ServerFile {
            listen: default_listen(),
            environment: None,
            allowed_origins: None,
            max_connections: None,
            header_read_timeout_ms: None,
            idle_timeout_ms: None,
            max_header_bytes: None,
            body_budget_mib: None,
            body_read_timeout_ms: None,
            min_body_bytes_per_s: None,
        }
    }
}

impl ServerFile {
    /// The listener's limits: the defaults, with what the file sets.
    fn limits(&self) -> Result<crate::listener::Limits, ConfigError> {
        let invalid = ConfigError::Invalid;
        let defaults = crate::listener::Limits::default();
        let ms = Duration::from_millis;
        let limits = crate::listener::Limits {
            max_connections: self.max_connections.unwrap_or(defaults.max_connections),
            header_read_timeout: self
                .header_read_timeout_ms
                .map_or(defaults.header_read_timeout, ms),
            idle_timeout: self.idle_timeout_ms.map_or(defaults.idle_timeout, ms),
            max_header_bytes: self.max_header_bytes.unwrap_or(defaults.max_header_bytes),
            body: crate::listener::body::BodyLimits {
                budget_bytes: self
                    .body_budget_mib
                    .map_or(defaults.body.budget_bytes, |mib| mib << 20),
                read_timeout: self
                    .body_read_timeout_ms
                    .map_or(defaults.body.read_timeout, ms),
                min_bytes_per_s: self
                    .min_body_bytes_per_s
                    .unwrap_or(defaults.body.min_bytes_per_s),
            },
        };
        if limits.max_connections < 2 {
            return Err(invalid(
                "[server] max_connections must be at least 2".into(),
            ));
        }
        if limits.max_header_bytes < 8192 {
            return Err(invalid(
                "[server] max_header_bytes must be at least 8192".into(),
            ));
        }
        if limits.body.budget_bytes < crate::mcp::MAX_BODY_BYTES {
            return Err(invalid(format!(
                "[server] body_budget_mib must hold at least one largest body ({} MiB)",
                crate::mcp::MAX_BODY_BYTES >> 20
            )));
        }
        if [
            limits.header_read_timeout,
            limits.idle_timeout,
            limits.body.read_timeout,
        ]
        .contains(&Duration::ZERO)
        {
            return Err(invalid("[server] timeouts must be above zero".into()));
        }
        Ok(limits)
    }
}

fn default_listen() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 8780))
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RuntimeFile {
    memory_limit_mib: Option<usize>,
    call_deadline_ms: Option<u64>,
    max_output_kib: Option<usize>,
    cache_dir: Option<PathBuf>,
    max_concurrent_calls: Option<u32>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct OutboundFile {
    connect_timeout_ms: Option<u64>,
    request_timeout_ms: Option<u64>,
    max_response_kib: Option<usize>,
    upstream_list_timeout_ms: Option<u64>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct ConnectorsFile {
    #[serde(default)]
    components: Vec<String>,
    dir: Option<PathBuf>,
    reload_interval_ms: Option<u64>,
    trust: Option<TrustFile>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TrustFile {
    #[serde(default)]
    publishers: Vec<PublisherFile>,
    #[serde(default)]
    pinned: Vec<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PublisherFile {
    name: String,
    /// The minisign public key's base64 line.
    key: Option<String>,
    /// Or the minisign `.pub` file.
    key_file: Option<PathBuf>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SandboxFile {
    listen: SocketAddr,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct WorkspaceFile {
    id: String,
    #[serde(default)]
    frozen: bool,
    /// `sha256:<hex>` of the owner's token (`obol keys hash TOKEN`).
    owner: Option<String>,
    #[serde(default)]
    connections: Vec<ConnectionFile>,
    #[serde(default)]
    publications: Vec<PublicationFile>,
    /// `skip` (default) or `fail_closed`.
    upstream_failure: Option<String>,
    #[serde(default)]
    capabilities: Vec<crate::catalog::CapabilitySpec>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PublicationFile {
    number: u32,
    /// Cedar policy text, or `file` naming a `.cedar` file.
    policies: Option<String>,
    file: Option<PathBuf>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ConnectionFile {
    id: String,
    /// `component` (default) or `mcp`.
    kind: Option<String>,
    connector: Option<String>,
    environment: Option<String>,
    base_url: Option<String>,
    #[serde(default)]
    settings: BTreeMap<String, String>,
    secret: Option<SecretFile>,
    idempotency_window_hours: Option<u64>,
    // `kind = "mcp"` only.
    url: Option<String>,
    prefix: Option<String>,
    #[serde(default)]
    trusted_annotations: bool,
    protocol_version: Option<String>,
    #[serde(default)]
    tools: BTreeMap<String, UpstreamToolFile>,
    // Component connections to a catalog broker.
    broker: Option<String>,
    retry_off: Option<RetryOffFile>,
}

/// An explicit retry-off directive: a header, or a field of the JSON body (`value` is JSON).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RetryOffFile {
    header: Option<String>,
    body_field: Option<String>,
    value: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct UpstreamToolFile {
    destructive: Option<bool>,
    #[serde(default)]
    rejected_on_error: bool,
    idempotency_header: Option<String>,
}

/// The header an upstream tool's key travels in: not one the gateway, MCP's transport or the
/// credential already uses.
fn upstream_key_header(
    connection: &str,
    tool: &str,
    header: &str,
    credential: &str,
) -> Result<axum::http::HeaderName, String> {
    let refused = |why: &str| {
        format!("connection {connection:?}: tool {tool:?}: idempotency_header {header:?} {why}")
    };
    let name = axum::http::HeaderName::from_bytes(header.as_bytes())
        .map_err(|_| refused("is not a header name"))?;
    const TRANSPORT: [&str; 5] = [
        "mcp-session-id",
        "mcp-protocol-version",
        "accept",
        "content-type",
        "last-event-id",
    ];
    if crate::catalog::HOST_OWNED_HEADERS.contains(&name.as_str())
        || TRANSPORT.contains(&name.as_str())
        || name.as_str().eq_ignore_ascii_case(credential)
    {
        return Err(refused(
            "belongs to the gateway, the transport or the credential",
        ));
    }
    Ok(name)
}

/// Names no prefix may take: they would read as the gateway's own.
const RESERVED_PREFIXES: [&str; 4] = ["obol", "mcp", "search_tools", "call_tool"];

impl ConnectionFile {
    /// The header the connection's credential travels in (`Authorization` by default).
    fn credential_header(&self) -> &str {
        self.secret
            .as_ref()
            .and_then(|s| s.header.as_deref())
            .unwrap_or("authorization")
    }

    /// The broker profile: the built-in one of `broker`, with `retry_off` replacing its
    /// directive when given.
    fn broker_profile(&self) -> Result<Option<Box<crate::broker::Profile>>, String> {
        use crate::broker::{Profile, RetryOff};
        use crate::catalog::Broker;
        let id = &self.id;
        let broker = match (self.broker.as_deref(), &self.retry_off) {
            (None, None) => return Ok(None),
            (None, Some(_)) => {
                return Err(format!(
                    "connection {id:?}: retry_off needs the broker it applies to (broker = \"nango\" or \"composio\")"
                ));
            }
            (Some("nango"), _) => Broker::Nango,
            (Some("composio"), _) => Broker::Composio,
            (Some(other), _) => {
                return Err(format!(
                    "connection {id:?}: broker {other:?} is not one of \"nango\" or \"composio\""
                ));
            }
        };
        let mut profile = Profile::builtin(broker);
        if let Some(directive) = &self.retry_off {
            profile.retry_off = match (&directive.header, &directive.body_field) {
                (Some(name), None) => RetryOff::Header {
                    name: {
                        let header = axum::http::HeaderName::from_bytes(name.as_bytes())
                            .map_err(|_| {
                                format!("connection {id:?}: retry_off header {name:?} is not a header name")
                            })?;
                        // The directive is applied last: it must not replace the credential or
                        // a header the gateway owns.
                        let credential = self.credential_header();
                        if crate::catalog::HOST_OWNED_HEADERS.contains(&header.as_str())
                            || header.as_str().eq_ignore_ascii_case(credential)
                            || header == axum::http::header::CONTENT_LENGTH
                            || header == axum::http::header::CONTENT_TYPE
                        {
                            return Err(format!(
                                "connection {id:?}: retry_off header {name:?} belongs to the gateway or the credential"
                            ));
                        }
                        header
                    },
                    value: axum::http::HeaderValue::from_str(&directive.value).map_err(|_| {
                        format!("connection {id:?}: retry_off value is not a header value")
                    })?,
                },
                (None, Some(pointer)) => RetryOff::BodyField {
                    pointer: crate::catalog::JsonPointer::parse(pointer)
                        .map_err(|e| format!("connection {id:?}: retry_off {e}"))?,
                    value: serde_json::from_str(&directive.value).map_err(|e| {
                        format!("connection {id:?}: retry_off value is not JSON ({e})")
                    })?,
                },
                _ => {
                    return Err(format!(
                        "connection {id:?}: retry_off names exactly one of `header` or `body_field`"
                    ));
                }
            };
        }
        Ok(Some(Box::new(profile)))
    }

    /// Parses what serves the connection; `id` is already checked.
    fn kind(&mut self) -> Result<ConnectionKind, String> {
        let id = &self.id;
        match self.kind.as_deref() {
            None | Some("component") => {
                if self.url.is_some()
                    || self.prefix.is_some()
                    || !self.tools.is_empty()
                    || self.trusted_annotations
                    || self.protocol_version.is_some()
                {
                    return Err(format!(
                        "connection {id:?}: url, prefix, tools, trusted_annotations and protocol_version belong to kind = \"mcp\""
                    ));
                }
                let connector = self.connector.take().ok_or_else(|| {
                    format!("connection {id:?}: a component connection names its connector")
                })?;
                crate::names::check("connector", &connector)?;
                let base_url = self.base_url.as_deref().ok_or_else(|| {
                    format!("connection {id:?}: a component connection names its base_url")
                })?;
                let base_url = BaseUrl::parse(base_url)
                    .map_err(|e| format!("connection {id:?}: base_url {e}"))?;
                let broker = self.broker_profile()?;
                Ok(ConnectionKind::Component {
                    connector,
                    base_url,
                    settings: std::mem::take(&mut self.settings),
                    broker,
                })
            }
            Some("mcp") => {
                if self.connector.is_some()
                    || self.base_url.is_some()
                    || !self.settings.is_empty()
                    || self.broker.is_some()
                    || self.retry_off.is_some()
                    || self.idempotency_window_hours.is_some()
                {
                    return Err(format!(
                        "connection {id:?}: connector, base_url, settings, broker, retry_off and idempotency_window_hours belong to component connections; an mcp connection names url and prefix"
                    ));
                }
                let url = self
                    .url
                    .as_deref()
                    .ok_or_else(|| format!("connection {id:?}: an mcp connection names its url"))?;
                let url = UpstreamUrl::parse(url).map_err(|e| format!("connection {id:?}: {e}"))?;
                let prefix = self.prefix.take().ok_or_else(|| {
                    format!("connection {id:?}: an mcp connection names its tool prefix")
                })?;
                crate::catalog::ConnectorName::parse(&prefix)
                    .map_err(|e| format!("connection {id:?}: prefix {prefix:?}: {e}"))?;
                if RESERVED_PREFIXES.contains(&prefix.as_str()) {
                    return Err(format!("connection {id:?}: prefix {prefix:?} is reserved"));
                }
                if let Some(version) = &self.protocol_version
                    && !PROTOCOL_VERSIONS.contains(&version.as_str())
                {
                    return Err(format!(
                        "connection {id:?}: protocol_version {version:?} is not one of {:?}",
                        PROTOCOL_VERSIONS
                    ));
                }
                let credential = self.credential_header().to_owned();
                let tools = std::mem::take(&mut self.tools)
                    .into_iter()
                    .map(|(name, tool)| {
                        let idempotency_header = tool
                            .idempotency_header
                            .as_deref()
                            .map(|header| upstream_key_header(id, &name, header, &credential))
                            .transpose()?;
                        let declared = tool.destructive.map(|destructive| match destructive {
                            true => Declared::Destructive,
                            false => Declared::ReadOnly,
                        });
                        let error_results = match tool.rejected_on_error {
                            true => ErrorResults::AreRejections,
                            false => ErrorResults::MayHaveActed,
                        };
                        Ok((
                            name,
                            UpstreamToolConfig {
                                declared,
                                error_results,
                                idempotency_header,
                            },
                        ))
                    })
                    .collect::<Result<_, String>>()?;
                Ok(ConnectionKind::Mcp(Arc::new(McpUpstream {
                    url,
                    prefix,
                    annotations: match self.trusted_annotations {
                        true => Annotations::Trusted,
                        false => Annotations::Untrusted,
                    },
                    tools,
                    protocol_version: self.protocol_version.take(),
                })))
            }
            Some(other) => Err(format!(
                "connection {id:?}: kind {other:?} is not one of \"component\" or \"mcp\""
            )),
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SecretFile {
    env: Option<String>,
    file: Option<PathBuf>,
    header: Option<String>,
    scheme: Option<String>,
}

/// A key as an operator writes it, in `[[keys]]` or to the admin API.
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct KeySpec {
    pub name: String,
    /// `sha256:<hex>` of the key's token; `obol keys hash TOKEN` prints it. (The admin API
    /// mints the token and fills this in.)
    #[serde(default)]
    pub hash: String,
    pub workspace: String,
    pub environment: String,
    #[serde(default)]
    pub allowed_tools: Vec<String>,
    #[serde(default)]
    pub tools_mode: Option<String>,
    /// What the key may use: `mcp` (default), `receipts`, `approvals`, `route`.
    pub scopes: Option<Vec<String>>,
    /// A CEL expression over `tool` and `key` that must hold for a tool to be visible.
    pub filter: Option<String>,
    /// The policy publication to evaluate: `"latest"` (default) or a number.
    pub policy: Option<String>,
    /// Capability → the connection id its calls go to first (`{"cap.refund" = "stripe-eu"}`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub capability_pins: BTreeMap<String, String>,
}

impl KeySpec {
    /// Parses one key, from the config file or the admin API (one set of rules), into the
    /// key the gateway authenticates. `workspaces` are the config's: a key names one of them.
    pub fn parse(self, workspaces: &[WorkspaceConfig]) -> Result<VirtualKey, String> {
        crate::names::check("key name", &self.name)?;
        let hash = KeyHash::parse(&self.hash).map_err(|e| format!("key {:?}: {e}", self.name))?;
        if !workspaces.iter().any(|w| w.id == self.workspace) {
            return Err(format!(
                "key {:?} names unknown workspace {:?}",
                self.name, self.workspace
            ));
        }
        let tools_mode = self
            .tools_mode
            .as_deref()
            .map(ToolsMode::parse)
            .transpose()
            .map_err(|e| format!("key {:?}: {e}", self.name))?
            .unwrap_or_default();
        let allowed_tools = self
            .allowed_tools
            .iter()
            .map(|g| ToolGlob::parse(g))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| format!("key {:?}: {e}", self.name))?;
        let key_environment = Environment::parse(&self.environment)
            .map_err(|e| format!("key {:?}: {e}", self.name))?;
        let scopes = match &self.scopes {
            None => vec![Scope::Mcp],
            Some(names) => names
                .iter()
                .map(|n| Scope::parse(n))
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| format!("key {:?}: {e}", self.name))?,
        };
        let filter = self
            .filter
            .as_deref()
            .map(ToolFilter::compile)
            .transpose()
            .map_err(|e| format!("key {:?}: {e}", self.name))?;
        let policy = self
            .policy
            .as_deref()
            .map(PolicyPin::parse)
            .transpose()
            .map_err(|e| format!("key {:?}: {e}", self.name))?
            .unwrap_or(PolicyPin::Latest);
        for (capability, connection) in &self.capability_pins {
            crate::catalog::ToolName::parse(capability)
                .filter(|name| name.connector() == crate::catalog::CAPABILITY_PREFIX)
                .ok_or_else(|| {
                    format!(
                        "key {:?}: capability_pins names {}, which is not a capability (cap.NAME)",
                        self.name,
                        crate::names::shown(capability)
                    )
                })?;
            crate::names::check("connection id", connection)
                .map_err(|e| format!("key {:?}: capability_pins: {e}", self.name))?;
        }
        Ok(VirtualKey {
            name: self.name,
            hash,
            workspace: self.workspace,
            environment: key_environment,
            allowed_tools,
            scopes,
            filter,
            policy,
            tools_mode,
            capability_pins: self.capability_pins,
        })
    }
}

impl Config {
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        // `obol.toml` has the empty path as its parent: relative paths are the working
        // directory's then, and an empty one names no directory to open (the store's
        // journal failed on it).
        let base = match path.parent() {
            Some(parent) if !parent.as_os_str().is_empty() => parent,
            _ => Path::new("."),
        };
        Config::parse(&text, base).map_err(|e| match e {
            ConfigError::Syntax { source, .. } => ConfigError::Syntax {
                path: path.to_owned(),
                source,
            },
            other => other,
        })
    }

    /// Parses a config; relative paths are resolved against `base`.
    pub fn parse(text: &str, base: &Path) -> Result<Config, ConfigError> {
        let file: File = toml::from_str(text).map_err(|source| ConfigError::Syntax {
            path: PathBuf::new(),
            source: Box::new(source),
        })?;
        let invalid = |message: String| ConfigError::Invalid(message);
        let resolve = |p: &Path| {
            if p.is_absolute() {
                p.to_owned()
            } else {
                base.join(p)
            }
        };

        let components = file
            .connectors
            .components
            .iter()
            .map(|entry| match entry.strip_prefix("bundled:") {
                Some(name) => Ok(ComponentSource::Bundled(name.to_owned())),
                None if entry.is_empty() => Err(invalid("an empty component path".into())),
                None => Ok(ComponentSource::Path(resolve(Path::new(entry)))),
            })
            .collect::<Result<Vec<_>, _>>()?;

        let environment = match &file.server.environment {
            None => Environment::Dev,
            Some(name) => Environment::parse(name).map_err(|e| invalid(format!("[server] {e}")))?,
        };
        let mut workspaces = Vec::new();
        for workspace in file.workspaces {
            crate::names::check("workspace id", &workspace.id).map_err(invalid)?;
            if workspaces
                .iter()
                .any(|w: &WorkspaceConfig| w.id == workspace.id)
            {
                return Err(invalid(format!(
                    "workspace {:?} is defined twice",
                    workspace.id
                )));
            }
            let mut connections: Vec<ConnectionConfig> = Vec::new();
            for mut connection in workspace.connections {
                crate::names::check("connection id", &connection.id).map_err(invalid)?;
                let kind = connection.kind().map_err(invalid)?;
                let prefix = kind.prefix();
                if prefix == crate::catalog::CAPABILITY_PREFIX {
                    return Err(invalid(format!(
                        "workspace {:?}: connection {:?}: the prefix \"cap\" is reserved for capabilities (cap.NAME)",
                        workspace.id, connection.id
                    )));
                }
                // One connection per prefix in a workspace (a component's prefix is its
                // connector's name), so every tool name says which connection serves it.
                if let Some(existing) = connections
                    .iter()
                    .find(|c| c.prefix() == prefix || c.id == connection.id)
                {
                    return Err(invalid(format!(
                        "workspace {:?}: connections {:?} and {:?} clash (ids and tool prefixes must be unique in a workspace)",
                        workspace.id, existing.id, connection.id
                    )));
                }
                let secret = connection
                    .secret
                    .map(|s| {
                        let source = match (s.env, s.file) {
                            (Some(var), None) => SecretSource::Env(var),
                            (None, Some(path)) => SecretSource::File(resolve(&path)),
                            _ => {
                                return Err(invalid(format!(
                                    "connection {:?}: a secret names exactly one of `env` or `file`",
                                    connection.id
                                )));
                            }
                        };
                        Ok(SecretRef {
                            source,
                            header: s.header.unwrap_or_else(|| "Authorization".into()),
                            scheme: s.scheme,
                        })
                    })
                    .transpose()?;
                let connection_environment = match &connection.environment {
                    None => environment,
                    Some(name) => Environment::parse(name)
                        .map_err(|e| invalid(format!("connection {:?}: {e}", connection.id)))?,
                };
                let idempotency_window = match connection.idempotency_window_hours {
                    None => DEFAULT_IDEMPOTENCY_WINDOW,
                    Some(0) => {
                        return Err(invalid(format!(
                            "connection {:?}: idempotency_window_hours must be at least 1",
                            connection.id
                        )));
                    }
                    Some(hours) => Duration::from_secs(hours * 3600),
                };
                connections.push(ConnectionConfig {
                    id: connection.id,
                    environment: connection_environment,
                    kind,
                    secret,
                    idempotency_window,
                });
            }
            let mut publications: Vec<Arc<Publication>> = Vec::new();
            for publication in workspace.publications {
                let text = match (publication.policies, publication.file) {
                    (Some(text), None) => text,
                    (None, Some(path)) => std::fs::read_to_string(resolve(&path))
                        .map_err(|e| invalid(format!("{}: {e}", path.display())))?,
                    _ => {
                        return Err(invalid(format!(
                            "workspace {:?}: a publication names exactly one of `policies` or `file`",
                            workspace.id
                        )));
                    }
                };
                if publications.iter().any(|p| p.number == publication.number) {
                    return Err(invalid(format!(
                        "workspace {:?}: publication {} is defined twice",
                        workspace.id, publication.number
                    )));
                }
                let parsed = Publication::parse(publication.number, &text)
                    .map_err(|e| invalid(format!("workspace {:?}: {e}", workspace.id)))?;
                publications.push(Arc::new(parsed));
            }
            let owner = workspace
                .owner
                .as_deref()
                .map(KeyHash::parse)
                .transpose()
                .map_err(|e| invalid(format!("workspace {:?}: owner: {e}", workspace.id)))?;
            let upstream_failure = match workspace.upstream_failure.as_deref() {
                None | Some("skip") => UpstreamFailure::Skip,
                Some("fail_closed") => UpstreamFailure::FailClosed,
                Some(other) => {
                    return Err(invalid(format!(
                        "workspace {:?}: upstream_failure {other:?} is not one of \"skip\" or \"fail_closed\"",
                        workspace.id
                    )));
                }
            };
            let mut capabilities: Vec<Arc<crate::catalog::Declared>> = Vec::new();
            for spec in &workspace.capabilities {
                let declared = spec
                    .parse(environment)
                    .map_err(|e| invalid(format!("workspace {:?}: {e}", workspace.id)))?;
                if capabilities.iter().any(|c| c.name == declared.name) {
                    return Err(invalid(format!(
                        "workspace {:?}: capability {} is declared twice",
                        workspace.id, declared.name
                    )));
                }
                capabilities.push(Arc::new(declared));
            }
            workspaces.push(WorkspaceConfig {
                id: workspace.id,
                frozen: workspace.frozen,
                owner,
                connections,
                publications,
                upstream_failure,
                capabilities,
            });
        }

        let mut keys: Vec<VirtualKey> = Vec::new();
        for key in file.keys {
            let key = key.parse(&workspaces).map_err(invalid)?;
            if keys
                .iter()
                .any(|k| k.hash == key.hash || k.name == key.name)
            {
                return Err(invalid(format!(
                    "key {:?} repeats another key's name or hash",
                    key.name
                )));
            }
            keys.push(key);
        }

        let approvals = {
            use crate::approvals::{Keyring, token};
            let verifiers = file
                .approvals
                .verify_keys
                .iter()
                .map(|k| {
                    token::parse_verifying_key(&k.public_key)
                        .map(|key| (k.id.clone(), key))
                        .map_err(|e| invalid(format!("[approvals] verify key {:?}: {e}", k.id)))
                })
                .collect::<Result<Vec<_>, _>>()?;
            let keyring = match &file.approvals.signing_key {
                None if verifiers.is_empty() => Keyring::ephemeral(),
                None => {
                    return Err(invalid(
                        "[approvals] verify_keys need a signing_key beside them".into(),
                    ));
                }
                Some(signer) => {
                    let path = resolve(&signer.file);
                    let text = std::fs::read_to_string(&path).map_err(|e| {
                        invalid(format!("[approvals] signing key {}: {e}", path.display()))
                    })?;
                    let key = token::parse_signing_key(&text).map_err(|e| {
                        invalid(format!("[approvals] signing key {}: {e}", path.display()))
                    })?;
                    Keyring::new(&signer.id, key, verifiers)
                        .map_err(|e| invalid(format!("[approvals] {e}")))?
                }
            };
            let public_url = file.approvals.public_url.clone();
            if let Some(url) = &public_url
                && !(url.starts_with("http://") || url.starts_with("https://"))
            {
                return Err(invalid(
                    "[approvals] public_url must start with http:// or https://".into(),
                ));
            }
            ApprovalsConfig {
                keyring: Arc::new(keyring),
                public_url,
            }
        };

        let ms = Duration::from_millis;
        #[cfg(feature = "test-util")]
        let volatile = file.store.volatile;
        let is_redis_url = |url: &str| url.starts_with("redis://") || url.starts_with("rediss://");
        let (path, url, cluster) = (
            file.store.path,
            file.store.redis_url,
            file.store.redis_cluster,
        );
        if usize::from(path.is_some()) + usize::from(url.is_some()) + usize::from(cluster.is_some())
            > 1
        {
            return Err(invalid(
                "[store] names one of `path` (embedded), `redis_url` (one Redis server) or `redis_cluster` (a Redis Cluster), not several".into(),
            ));
        }
        let backend = match (path, url, cluster) {
            (_, Some(url), _) if !is_redis_url(&url) => {
                return Err(invalid(
                    "[store] redis_url must start with redis:// or rediss://".into(),
                ));
            }
            (_, Some(url), _) => StoreBackend::Redis(RedisTarget::Node(url)),
            (_, _, Some(nodes)) if nodes.is_empty() || !nodes.iter().all(|n| is_redis_url(n)) => {
                return Err(invalid(
                    "[store] redis_cluster lists at least one node, each redis://host:port or rediss://host:port".into(),
                ));
            }
            (_, _, Some(nodes)) => StoreBackend::Redis(RedisTarget::Cluster(nodes)),
            (Some(path), None, None) => StoreBackend::Embedded(resolve(&path)),
            (None, None, None) => StoreBackend::Embedded(resolve(Path::new("obol.redb"))),
        };
        #[cfg(feature = "test-util")]
        let backend = if volatile {
            StoreBackend::Volatile
        } else {
            backend
        };
        // Gateways sharing Redis share held calls: a token or an owner session issued by one
        // must verify on the others, which a per-process key cannot do.
        if matches!(backend, StoreBackend::Redis(_)) && file.approvals.signing_key.is_none() {
            return Err(invalid(
                "[approvals] signing_key is required with a Redis store: every gateway sharing the store must verify the same approval tokens (make one with `obol approvals keygen FILE`)".into(),
            ));
        }
        let request_timeout = ms(file.outbound.request_timeout_ms.unwrap_or(30_000));
        let runtime_defaults = RuntimeConfig::default();
        let call_deadline = file
            .runtime
            .call_deadline_ms
            .map(ms)
            .unwrap_or(runtime_defaults.call_deadline);
        // Long enough for two attempts and two guest calls, so a live holder never looks dead.
        let default_lease = 2 * (request_timeout + call_deadline) + Duration::from_secs(5);
        let config = Config {
            listen: file.server.listen,
            environment,
            limits: file.server.limits()?,
            allowed_origins: file.server.allowed_origins.unwrap_or_default(),
            runtime: RuntimeConfig {
                memory_limit_bytes: file
                    .runtime
                    .memory_limit_mib
                    .map_or(runtime_defaults.memory_limit_bytes, |mib| mib << 20),
                call_deadline,
                max_output_bytes: file
                    .runtime
                    .max_output_kib
                    .map_or(runtime_defaults.max_output_bytes, |kib| kib << 10),
                cache_dir: file.runtime.cache_dir.map(|p| resolve(&p)),
                max_concurrent_calls: file
                    .runtime
                    .max_concurrent_calls
                    .unwrap_or(runtime_defaults.max_concurrent_calls),
            },
            components,
            connectors_dir: file.connectors.dir.map(|p| resolve(&p)),
            reload_interval: match file.connectors.reload_interval_ms {
                Some(0) => {
                    return Err(invalid(
                        "[connectors] reload_interval_ms must be at least 1 (or absent: the directory is watched)".into(),
                    ));
                }
                interval => interval.map(ms),
            },
            trust: match file.connectors.trust {
                None => None,
                Some(trust) => Some(parse_trust(trust, &resolve).map_err(invalid)?),
            },
            outbound: OutboundConfig {
                connect_timeout: ms(file.outbound.connect_timeout_ms.unwrap_or(5_000)),
                request_timeout,
                max_response_bytes: file.outbound.max_response_kib.unwrap_or(4 * 1024) << 10,
                upstream_list_timeout: match file.outbound.upstream_list_timeout_ms {
                    None => ms(5_000),
                    Some(0) => {
                        return Err(invalid(
                            "[outbound] upstream_list_timeout_ms must be at least 1".into(),
                        ));
                    }
                    Some(timeout) => ms(timeout),
                },
            },
            workspaces,
            keys,
            breaker: {
                let defaults = crate::capability::breaker::BreakerPolicy::default();
                crate::capability::breaker::BreakerPolicy {
                    failures: match file.routing.breaker_failures {
                        Some(0) => {
                            return Err(invalid(
                                "[routing] breaker_failures must be at least 1".into(),
                            ));
                        }
                        Some(failures) => failures,
                        None => defaults.failures,
                    },
                    cooldown: file
                        .routing
                        .breaker_cooldown_ms
                        .map_or(defaults.cooldown, ms),
                }
            },
            sandbox: file.sandbox.map(|s| s.listen),
            approvals,
            admin: file
                .admin
                .token_hash
                .as_deref()
                .map(KeyHash::parse)
                .transpose()
                .map_err(|e| invalid(format!("[admin] token_hash: {e}")))?,
            store: StoreConfig {
                backend,
                lease: match file.store.lease_ms.map(ms) {
                    None => default_lease,
                    // A lease shorter than a holder's worst case would let a same-key call
                    // declare a live call dead.
                    Some(lease) if lease < 2 * (request_timeout + call_deadline) => {
                        return Err(invalid(format!(
                            "[store] lease_ms must be at least twice (request_timeout_ms + call_deadline_ms) = {} ms",
                            (2 * (request_timeout + call_deadline)).as_millis()
                        )));
                    }
                    Some(lease) => lease,
                },
                retention: match file.store.retention_hours {
                    None => crate::store::DEFAULT_RETENTION,
                    Some(hours) if hours < 25 => {
                        return Err(invalid(
                            "[store] retention_hours must be at least 25: a held call's slot and ticket live 24 h".into(),
                        ));
                    }
                    Some(hours) => Duration::from_secs(hours * 3600),
                },
                redis_replicas: file.store.redis_replicas,
                redis_replica_timeout: Duration::from_millis(
                    file.store.redis_replica_timeout_ms.unwrap_or(500),
                ),
                cache_bytes: match file.store.cache_mib {
                    None => crate::store::DEFAULT_CACHE_BYTES,
                    Some(0) => return Err(invalid("[store] cache_mib must be at least 1".into())),
                    Some(mib) if mib > 1 << 20 => {
                        return Err(invalid(
                            "[store] cache_mib is at most 1048576 (1 TiB)".into(),
                        ));
                    }
                    Some(mib) => mib << 20,
                },
            },
        };
        config.check_credentials()?;
        Ok(config)
    }
}

/// `[connectors.trust]`: publisher keys (inline or from their `.pub` file) and pinned digests.
fn parse_trust(
    file: TrustFile,
    resolve: &dyn Fn(&Path) -> PathBuf,
) -> Result<crate::catalog::trust::Trust, String> {
    use crate::catalog::trust::{Publisher, Trust};
    if file.publishers.is_empty() && file.pinned.is_empty() {
        return Err(
            "[connectors.trust] names no publisher and pins nothing: every component but the bundled ones would be refused".into(),
        );
    }
    let mut publishers = Vec::new();
    for publisher in file.publishers {
        let key = match (publisher.key, publisher.key_file) {
            (Some(key), None) => key,
            (None, Some(path)) => {
                let path = resolve(&path);
                std::fs::read_to_string(&path).map_err(|e| {
                    format!(
                        "[connectors.trust] publisher {:?}: {}: {e}",
                        publisher.name,
                        path.display()
                    )
                })?
            }
            _ => {
                return Err(format!(
                    "[connectors.trust] publisher {:?} needs exactly one of key and key_file",
                    publisher.name
                ));
            }
        };
        publishers.push(
            Publisher::parse(&publisher.name, &key)
                .map_err(|e| format!("[connectors.trust] {e}"))?,
        );
    }
    let mut pinned = std::collections::HashSet::new();
    for pin in file.pinned {
        let digest = pin
            .strip_prefix("sha256:")
            .unwrap_or_default()
            .to_ascii_lowercase();
        if digest.len() != 64 || !digest.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(format!(
                "[connectors.trust] pinned entries are sha256:<64 hex digits> (what obol check prints), not {:?}",
                pin.chars().take(80).collect::<String>()
            ));
        }
        pinned.insert(format!("sha256:{digest}"));
    }
    Ok(Trust::new(publishers, pinned))
}

/// The README's demo credentials: whoever reads the README holds them.
const DEMO_TOKENS: [&str; 3] = ["obk_local_example", "obo_local_owner", "oba_local_admin"];

impl Config {
    /// Refuses credentials that would let one secret act as another, or that anyone could
    /// guess: every key, owner and admin hash distinct (a key reused as the owner token would
    /// let the agent approve its own calls), and the README's demo credentials only on a
    /// gateway that listens on loopback.
    fn check_credentials(&self) -> Result<(), ConfigError> {
        let mut seen: Vec<(KeyHash, String)> = Vec::new();
        let held = self
            .keys
            .iter()
            .map(|key| (key.hash, format!("key {:?}", key.name)))
            .chain(self.workspaces.iter().filter_map(|w| {
                w.owner
                    .map(|hash| (hash, format!("the owner of workspace {:?}", w.id)))
            }))
            .chain(self.admin.map(|hash| (hash, "the admin token".to_owned())));
        for (hash, holder) in held {
            if let Some((_, first)) = seen.iter().find(|(other, _)| *other == hash) {
                return Err(ConfigError::Invalid(format!(
                    "{first} and {holder} have the same token; every key, owner and admin token must be its own (`obol keys mint` makes one)"
                )));
            }
            seen.push((hash, holder));
        }
        if !self.listen.ip().is_loopback() {
            let demo: Vec<&str> = DEMO_TOKENS
                .into_iter()
                .filter(|token| {
                    seen.iter()
                        .any(|(hash, _)| *hash == KeyHash::of_token(token))
                })
                .collect();
            if !demo.is_empty() {
                return Err(ConfigError::Invalid(format!(
                    "the README's demo credentials ({}) are accepted only when [server] listen is a loopback address; mint real ones with `obol keys mint`",
                    demo.join(", ")
                )));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Config, String> {
        Config::parse(text, Path::new("/etc/obol")).map_err(|e| e.to_string())
    }

    const KEY: &str = "sha256:2c26b46b68ffc68ff99b453c1d30413413422d706483bfa0f98a5e886266e7ae";

    /// A request URL parsed against its base is the URL parsed whole, for every combination
    /// of a few tricky pieces after several origins: the shortcut never changes which host a
    /// request goes to (the egress check reads it) nor anything else about it.
    #[test]
    fn a_request_url_parsed_against_its_base_is_the_url_parsed_whole() {
        let bases = [
            "http://127.0.0.1:4242",
            "http://127.0.0.1:4242/api",
            "https://api.example.com",
            "https://api.example.com/v2/",
            "http://[::1]:8080/x",
            "https://b\u{fc}cher.example",
        ];
        let pieces = [
            "/",
            "//",
            "\\",
            "\\\\",
            "evil.com",
            "@evil.com",
            ":4243",
            "..",
            "%2f",
            "?q=1",
            "#f",
            "x",
            " ",
            "\t",
            "\u{e9}",
            ":",
            "7",
            ".evil",
        ];
        let mut checked = 0;
        for base in bases {
            let base = BaseUrl::parse(base).unwrap();
            let text = base.url().as_str();
            let origin = &text[..text.len() - base.url().path().len()];
            let prefixes = [
                origin.to_owned(),
                origin.to_uppercase(),
                format!("{origin}:80"),
            ];
            for prefix in &prefixes {
                for a in pieces {
                    for b in pieces {
                        for c in pieces {
                            let text = format!("{prefix}{a}{b}{c}");
                            let shortcut = base.parse_request_url(&text).map(|u| u.to_string());
                            let whole = reqwest::Url::parse(&text).map(|u| u.to_string());
                            assert_eq!(shortcut, whole, "{text:?} on {:?}", base.url().as_str());
                            checked += 1;
                        }
                    }
                }
            }
        }
        assert_eq!(checked, 6 * 3 * 18 * 18 * 18);
    }

    /// The README's `obol serve` runs on this file.
    #[test]
    fn the_example_config_loads() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/obol.toml");
        let config = Config::load(&path).unwrap();
        assert!(config.admin.is_some());
        assert!(config.workspaces[0].owner.is_some());
        assert_eq!(config.keys.len(), 1);
    }

    #[test]
    fn tools_mode_is_parsed_and_an_unknown_mode_is_refused() {
        let key = |mode: &str| {
            parse(&format!(
                r#"
                [[workspaces]]
                id = "acme"
                [[keys]]
                name = "k"
                hash = "{KEY}"
                workspace = "acme"
                environment = "dev"
                tools_mode = "{mode}"
                "#
            ))
        };
        let config = key("progressive").unwrap();
        assert_eq!(config.keys[0].tools_mode, ToolsMode::Progressive);
        assert_eq!(key("full").unwrap().keys[0].tools_mode, ToolsMode::Full);
        let err = key("lazy").unwrap_err();
        assert!(
            err.contains("key \"k\": unknown tools_mode \"lazy\""),
            "{err}"
        );
    }

    #[test]
    fn a_base_url_with_credentials_is_refused_without_echoing_them() {
        let err = parse(
            r#"
            [[workspaces]]
            id = "acme"
            [[workspaces.connections]]
            id = "c"
            connector = "stripe"
            base_url = "https://user:hunter2@api.example.com"
            "#,
        )
        .unwrap_err();
        assert!(err.contains("must not carry credentials"), "{err}");
        assert!(!err.contains("hunter2"), "{err}");
    }

    #[test]
    fn unknown_fields_and_workspaces_are_errors() {
        assert!(parse("[server]\nlisten = \"127.0.0.1:1\"\nbogus = 1").is_err());
        let err = parse(&format!(
            "[[keys]]\nname = \"k\"\nhash = \"{KEY}\"\nworkspace = \"nope\"\nenvironment = \"dev\""
        ))
        .unwrap_err();
        assert!(err.contains("unknown workspace"), "{err}");
    }

    #[test]
    fn credentials_are_distinct_and_demo_ones_stay_on_loopback() {
        let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples");
        let example = std::fs::read_to_string(examples.join("obol.toml")).unwrap();
        let at = |text: &str| Config::parse(text, &examples).map_err(|e| e.to_string());
        assert!(at(&example).is_ok());
        let public = example.replace("listen = \"127.0.0.1:8780\"", "listen = \"0.0.0.0:8780\"");
        assert_ne!(public, example);
        let err = at(&public).unwrap_err();
        assert!(
            err.contains("obk_local_example") && err.contains("loopback"),
            "{err}"
        );
        let reused = format!(
            "[admin]\ntoken_hash = \"{KEY}\"\n[[workspaces]]\nid = \"acme\"\n[[keys]]\nname = \"k\"\nhash = \"{KEY}\"\nworkspace = \"acme\"\nenvironment = \"dev\""
        );
        let err = parse(&reused).unwrap_err();
        assert!(
            err.contains("same token") && !err.contains("sha256"),
            "{err}"
        );
    }

    #[test]
    fn a_store_names_one_backend() {
        let dir = tempfile::tempdir().unwrap();
        let key = dir.path().join("approval.key");
        let seed = crate::approvals::token::generate_signing_key().to_bytes();
        std::fs::write(&key, hex::encode(seed)).unwrap();
        let signed = format!("[approvals]\nsigning_key = {{ id = \"k1\", file = {key:?} }}\n");
        let config = parse(&format!(
            "{signed}[store]\nredis_cluster = [\"redis://10.0.0.1:6379/\", \"redis://10.0.0.2:6379/\"]"
        ))
        .unwrap();
        assert_eq!(
            config.store.backend,
            StoreBackend::Redis(RedisTarget::Cluster(vec![
                "redis://10.0.0.1:6379/".into(),
                "redis://10.0.0.2:6379/".into()
            ]))
        );
        let err = parse(&format!(
            "{signed}[store]\nredis_url = \"redis://a/\"\nredis_cluster = [\"redis://b/\"]"
        ))
        .unwrap_err();
        assert!(err.contains("not several"), "{err}");
        let err = parse(&format!("{signed}[store]\nredis_cluster = []")).unwrap_err();
        assert!(err.contains("at least one node"), "{err}");
        let err = parse(&format!("{signed}[store]\nredis_cluster = [\"http://b/\"]")).unwrap_err();
        assert!(err.contains("redis://host:port"), "{err}");
    }

    #[test]
    fn relative_paths_resolve_against_the_config_file() {
        let config = parse("[connectors]\ncomponents = [\"x.wasm\", \"bundled:stripe\"]").unwrap();
        assert_eq!(
            config.components,
            vec![
                ComponentSource::Path(PathBuf::from("/etc/obol/x.wasm")),
                ComponentSource::Bundled("stripe".into()),
            ]
        );
    }
}
