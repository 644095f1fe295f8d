//! The admin API: keys and policy publications managed while the gateway runs.
//!
//! Authenticated with the admin token (`[admin] token_hash`), never with a virtual key:
//!
//! * `POST /v1/admin/keys` — create a key from a JSON key spec (as in `[[keys]]`, without
//!   `hash`); the gateway mints the token and answers it once. Only its hash is stored.
//! * `GET /v1/admin/keys` — every key, from the config and from the API, without hashes.
//! * `DELETE /v1/admin/keys/{name}` — revoke an API key at once (a config key is revoked by
//!   removing it from the config).
//! * `POST /v1/admin/workspaces/{id}/publications` — publish Cedar policies (the body, as
//!   text) as the workspace's next number. Publications are immutable; keys pinned to
//!   `latest` move to it on their next request, without a restart.
//! * `GET /v1/admin/workspaces/{id}/publications` — the numbers and where each came from.
//! * `PUT /v1/admin/keys/{name}/capability_pins` — an API key's pins, replaced whole
//!   (`{"cap.refund": "stripe-eu"}`): new calls of a pinned capability go to that connection's
//!   provider first. Retries of earlier calls keep the route their slot recorded.
//! * `PUT /v1/admin/workspaces/{id}/capabilities/{name}` — declare or replace a capability
//!   (the body as in `[[workspaces.capabilities]]`, in JSON); `DELETE` the same path removes
//!   it; `GET /v1/admin/workspaces/{id}/capabilities` lists them with where each came from.
//!
//! Records live in the store's registry, so they survive restarts and, on Redis, reach every
//! gateway within [`REGISTRY_POLL`]. Refusals are [`ObolError`]s, rendered like every other
//! REST answer (`docs/errors.md`).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get};
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::clock::now_ms;
use crate::config::{KeySpec, WorkspaceConfig};
use crate::error::ObolError;
use crate::gateway::Gateway;
use crate::http::store_unavailable;
use crate::policy::{KeyHash, Publication, VirtualKey};
use crate::store::{Registry, Store, StoreError};

/// How often a gateway on a shared store re-reads the registry: the longest a revoked key
/// keeps working on another gateway.
pub const REGISTRY_POLL: Duration = Duration::from_secs(2);

/// A key created through the API, as stored.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StoredKey {
    pub spec: KeySpec,
    pub created_at_ms: u64,
    pub revoked_at_ms: Option<u64>,
}

/// A publication made through the API, as stored.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StoredPublication {
    pub workspace: String,
    pub number: u32,
    pub policies: String,
    pub published_at_ms: u64,
}

/// A capability declared through the API, as stored (`removed_at_ms` once deleted: the
/// registry keeps every record).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StoredCapability {
    pub workspace: String,
    pub spec: crate::catalog::CapabilitySpec,
    pub updated_at_ms: u64,
    pub removed_at_ms: Option<u64>,
}

/// What this gateway has seen of the registry, kept across refreshes: a revocation or a
/// publication, once seen, is never un-seen because a later read lacks it (a store that lost
/// writes in a failover must not bring a revoked key back or take a publication away).
#[derive(Debug, Default)]
pub struct Seen {
    revoked: std::collections::HashSet<String>,
    publications: std::collections::BTreeMap<(String, u32), Arc<Publication>>,
}

impl Seen {
    /// Adds what `records` say; warns about what they no longer say.
    pub fn remember(&mut self, records: &Records) {
        let revoked_now: std::collections::HashSet<&str> = records
            .keys
            .iter()
            .filter(|k| k.revoked_at_ms.is_some())
            .map(|k| k.spec.hash.as_str())
            .collect();
        if self
            .revoked
            .iter()
            .any(|hash| !revoked_now.contains(hash.as_str()))
        {
            tracing::error!(
                "the registry lost a key revocation this gateway had seen; the key stays revoked"
            );
        }
        self.revoked
            .extend(revoked_now.into_iter().map(str::to_owned));
        let mut listed = std::collections::HashSet::new();
        for stored in &records.publications {
            listed.insert((stored.workspace.clone(), stored.number));
            if let Ok(publication) = Publication::parse(stored.number, &stored.policies) {
                self.publications
                    .entry((stored.workspace.clone(), stored.number))
                    .or_insert_with(|| Arc::new(publication));
            }
        }
        if self.publications.keys().any(|seen| !listed.contains(seen)) {
            tracing::error!(
                "the registry lost a policy publication this gateway had seen; it stays published"
            );
        }
    }

    /// The API keys that are not revoked (by the registry now, or as seen before) and still
    /// valid against the config's workspaces.
    pub fn live_keys(&self, records: &Records, workspaces: &[WorkspaceConfig]) -> Vec<VirtualKey> {
        records
            .live_keys(workspaces)
            .into_iter()
            .filter(|key| !self.revoked.contains(&key.hash.to_string()))
            .collect()
    }

    /// Every API publication of `workspace` this gateway has seen.
    pub fn publications(&self, workspace: &str) -> Vec<Arc<Publication>> {
        self.publications
            .iter()
            .filter(|((seen_in, _), _)| seen_in == workspace)
            .map(|(_, publication)| Arc::clone(publication))
            .collect()
    }
}

/// The registry, read whole.
#[derive(Debug, Default)]
pub struct Records {
    keys: Vec<StoredKey>,
    publications: Vec<StoredPublication>,
    capabilities: Vec<StoredCapability>,
}

impl Records {
    pub async fn read(store: &Store) -> Result<Records, StoreError> {
        let unreadable = |registry: &str, name: &str, problem: serde_json::Error| {
            tracing::warn!(
                "registry {registry}: record {name:?} does not parse ({problem}); ignored"
            );
        };
        let mut records = Records::default();
        for (name, text) in store.registry(Registry::Keys).await? {
            match serde_json::from_str(&text) {
                Ok(key) => records.keys.push(key),
                Err(problem) => unreadable("keys", &name, problem),
            }
        }
        for (name, text) in store.registry(Registry::Publications).await? {
            match serde_json::from_str(&text) {
                Ok(publication) => records.publications.push(publication),
                Err(problem) => unreadable("publications", &name, problem),
            }
        }
        for (name, text) in store.registry(Registry::Capabilities).await? {
            match serde_json::from_str(&text) {
                Ok(capability) => records.capabilities.push(capability),
                Err(problem) => unreadable("capabilities", &name, problem),
            }
        }
        Ok(records)
    }

    /// The workspace's API capabilities that are not removed, as specs (each was checked
    /// when it was stored; the catalog reports a provider that no longer fits).
    pub fn capabilities(&self, workspace: &str) -> Vec<&crate::catalog::CapabilitySpec> {
        self.capabilities
            .iter()
            .filter(|c| c.workspace == workspace && c.removed_at_ms.is_none())
            .map(|c| &c.spec)
            .collect()
    }

    /// The API keys that are not revoked and still valid against the config's workspaces.
    pub fn live_keys(&self, workspaces: &[WorkspaceConfig]) -> Vec<VirtualKey> {
        self.keys
            .iter()
            .filter(|k| k.revoked_at_ms.is_none())
            .filter_map(|k| match k.spec.clone().parse(workspaces) {
                Ok(key) => Some(key),
                Err(problem) => {
                    tracing::warn!(
                        "registry key {:?} is no longer valid: {problem}",
                        k.spec.name
                    );
                    None
                }
            })
            .collect()
    }

    /// The workspace's API publications, parsed (each was checked when it was published).
    pub fn publications(&self, workspace: &str) -> Vec<Arc<Publication>> {
        self.publications
            .iter()
            .filter(|p| p.workspace == workspace)
            .filter_map(|p| Publication::parse(p.number, &p.policies).ok().map(Arc::new))
            .collect()
    }
}

pub fn router(gateway: Arc<Gateway>) -> Router {
    Router::new()
        .route("/v1/admin/keys", get(list_keys).post(create_key))
        .route("/v1/admin/keys/{name}", delete(revoke_key))
        .route(
            "/v1/admin/keys/{name}/capability_pins",
            axum::routing::put(set_pins),
        )
        .route(
            "/v1/admin/workspaces/{id}/capabilities",
            get(list_capabilities),
        )
        .route(
            "/v1/admin/workspaces/{id}/capabilities/{name}",
            axum::routing::put(put_capability).delete(remove_capability),
        )
        .route(
            "/v1/admin/workspaces/{id}/publications",
            get(list_publications).post(publish),
        )
        .route("/metrics", get(metrics))
        .route(
            "/v1/admin/connectors",
            get(list_connectors).post(add_connector),
        )
        .route(
            "/v1/admin/connectors/{name}",
            axum::routing::put(replace_connector).delete(remove_connector),
        )
        .with_state(gateway)
}

/// The largest component the admin API accepts (the bundled ones are a few hundred KiB).
const MAX_COMPONENT_BYTES: usize = 32 << 20;

async fn list_connectors(State(gateway): State<Arc<Gateway>>, headers: HeaderMap) -> Response {
    if let Err(refused) = authorize(&gateway, &headers) {
        return *refused;
    }
    axum::Json(json!({ "connectors": crate::hotload::list(&gateway) })).into_response()
}

/// `POST /v1/admin/connectors`, the component's bytes as the body: a connector not served yet.
async fn add_connector(
    State(gateway): State<Arc<Gateway>>,
    headers: HeaderMap,
    body: axum::body::Body,
) -> Response {
    if let Err(refused) = authorize(&gateway, &headers) {
        return *refused;
    }
    let body = match component_body(body).await {
        Ok(body) => body,
        Err(refused) => return *refused,
    };
    let signature = match uploaded_signature(&headers) {
        Ok(signature) => signature,
        Err(refused) => return *refused,
    };
    let upload = crate::hotload::Upload::Add;
    installed(crate::hotload::install(&gateway, upload, None, body.to_vec(), signature).await)
}

/// `PUT /v1/admin/connectors/{name}`: a new version of a hot-loaded connector.
async fn replace_connector(
    State(gateway): State<Arc<Gateway>>,
    headers: HeaderMap,
    Path(name): Path<String>,
    body: axum::body::Body,
) -> Response {
    if let Err(refused) = authorize(&gateway, &headers) {
        return *refused;
    }
    let body = match component_body(body).await {
        Ok(body) => body,
        Err(refused) => return *refused,
    };
    let Ok(name) = crate::catalog::ConnectorName::parse(&name) else {
        return ObolError::NotFound("connector").to_rest_response();
    };
    let signature = match uploaded_signature(&headers) {
        Ok(signature) => signature,
        Err(refused) => return *refused,
    };
    let upload = crate::hotload::Upload::Replace;
    installed(crate::hotload::install(&gateway, upload, Some(name), body.to_vec(), signature).await)
}

async fn remove_connector(
    State(gateway): State<Arc<Gateway>>,
    headers: HeaderMap,
    Path(name): Path<String>,
) -> Response {
    if let Err(refused) = authorize(&gateway, &headers) {
        return *refused;
    }
    let Ok(name) = crate::catalog::ConnectorName::parse(&name) else {
        return ObolError::NotFound("connector").to_rest_response();
    };
    installed(crate::hotload::remove(&gateway, &name).await)
}

/// An upload's body, read only once the admin token was checked (an anonymous client cannot
/// make the gateway buffer 32 MiB), and at most that.
async fn component_body(body: axum::body::Body) -> Result<axum::body::Bytes, Box<Response>> {
    axum::body::to_bytes(body, MAX_COMPONENT_BYTES)
        .await
        .map_err(|_| {
            Box::new(invalid(format!(
                "a component is at most {} MiB",
                MAX_COMPONENT_BYTES >> 20
            )))
        })
}

/// An upload's detached signature: the `.minisig` file's text, base64 in `Obol-Signature`.
fn uploaded_signature(headers: &HeaderMap) -> Result<Option<String>, Box<Response>> {
    use base64::Engine;
    let Some(value) = crate::mcp::single_header(headers, "obol-signature")
        .map_err(|_| Box::new(invalid("send one Obol-Signature header")))?
    else {
        return Ok(None);
    };
    base64::engine::general_purpose::STANDARD
        .decode(value.trim())
        .ok()
        .and_then(|bytes| String::from_utf8(bytes).ok())
        .map(Some)
        .ok_or_else(|| {
            Box::new(invalid(
                "Obol-Signature is the .minisig file's text, base64-encoded",
            ))
        })
}

fn installed(result: Result<crate::hotload::Installed, ObolError>) -> Response {
    match result {
        Ok(installed) => axum::Json(installed).into_response(),
        Err(error) => error.to_rest_response(),
    }
}

/// `GET /metrics`: Prometheus, in the OpenMetrics text format (crate::metrics).
async fn metrics(State(gateway): State<Arc<Gateway>>, headers: HeaderMap) -> Response {
    if let Err(refused) = authorize(&gateway, &headers) {
        return *refused;
    }
    let services = &gateway.services;
    let text = services.metrics.render(
        &services.upstreams.health_report(),
        services.runtime.components_in_memory(),
    );
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        text,
    )
        .into_response()
}

/// The admin token, compared by hash. Refusals name no detail beyond the cause.
fn authorize(gateway: &Gateway, headers: &HeaderMap) -> Result<(), Box<Response>> {
    if !gateway.host_allowed(headers) {
        return Err(Box::new(ObolError::ForeignHost.to_rest_response()));
    }
    let Some(admin) = gateway.admin else {
        return Err(Box::new(ObolError::AdminDisabled.to_rest_response()));
    };
    let presented = crate::mcp::single_header(headers, header::AUTHORIZATION.as_str())
        .ok()
        .flatten()
        .and_then(crate::policy::bearer_token);
    if presented.map(KeyHash::of_token) != Some(admin) {
        let refused =
            ObolError::Unauthenticated("the admin API needs Authorization: Bearer <admin token>");
        return Err(Box::new(refused.to_rest_response()));
    }
    Ok(())
}

fn invalid(message: impl Into<String>) -> Response {
    ObolError::InvalidAdminRequest(message.into()).to_rest_response()
}

/// `obk_` and 192 random bits.
fn mint_token() -> String {
    let mut bytes = [0u8; 24];
    getrandom::fill(&mut bytes).expect("the OS random source is available");
    format!("obk_{}", hex::encode(bytes))
}

async fn create_key(
    State(gateway): State<Arc<Gateway>>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    if let Err(refused) = authorize(&gateway, &headers) {
        return *refused;
    }
    let mut spec: KeySpec = match serde_json::from_slice(&body) {
        Ok(spec) => spec,
        Err(e) => return invalid(format!("the body is not a key spec: {e}")),
    };
    if !spec.hash.is_empty() {
        return invalid("the gateway mints the token; leave `hash` out");
    }
    let token = mint_token();
    spec.hash = KeyHash::of_token(&token).to_string();
    let key = match spec.clone().parse(gateway.config_workspaces()) {
        Ok(key) => key,
        Err(problem) => return invalid(problem),
    };
    if gateway.config_keys().iter().any(|k| k.name == key.name) {
        return ObolError::Conflict("a key with this name exists").to_rest_response();
    }
    let record = StoredKey {
        spec,
        created_at_ms: now_ms(),
        revoked_at_ms: None,
    };
    let text = serde_json::to_string(&record).expect("plain data");
    match gateway
        .services
        .store
        .registry_insert(Registry::Keys, &key.name, &text)
        .await
    {
        Ok(true) => {}
        Ok(false) => {
            let taken = "a key with this name exists (revoked names are not reused)";
            return ObolError::Conflict(taken).to_rest_response();
        }
        Err(cause) => return store_unavailable("storing a key", &cause),
    }
    if let Err(cause) = gateway.refresh_registry().await {
        return store_unavailable("re-reading the registry after creating a key", &cause);
    }
    tracing::info!(key = %key.name, workspace = %key.workspace, "key created through the admin API");
    (
        StatusCode::CREATED,
        axum::Json(json!({
            "name": key.name,
            "token": token,
            "note": "the token is shown once; only its hash is stored",
        })),
    )
        .into_response()
}

async fn list_keys(State(gateway): State<Arc<Gateway>>, headers: HeaderMap) -> Response {
    if let Err(refused) = authorize(&gateway, &headers) {
        return *refused;
    }
    match keys_listing(&gateway).await {
        Ok(keys) => axum::Json(json!({ "keys": keys })).into_response(),
        Err(cause) => store_unavailable("listing keys", &cause),
    }
}

/// Every key, from the config and the admin API: names, workspaces, scopes and globs, never
/// a hash.
pub async fn keys_listing(gateway: &Gateway) -> Result<Vec<serde_json::Value>, StoreError> {
    let stored = gateway.services.store.registry(Registry::Keys).await?;
    let describe = |spec: &KeySpec, source: &str, revoked_at_ms: Option<u64>| {
        json!({
            "name": spec.name,
            "workspace": spec.workspace,
            "environment": spec.environment,
            "allowed_tools": spec.allowed_tools,
            "scopes": spec.scopes.clone().unwrap_or_else(|| vec!["mcp".into()]),
            "policy": spec.policy.clone().unwrap_or_else(|| "latest".into()),
            "source": source,
            "revoked_at_ms": revoked_at_ms,
        })
    };
    let mut keys: Vec<serde_json::Value> = gateway
        .config_keys()
        .iter()
        .map(|k| {
            json!({
                "name": k.name,
                "workspace": k.workspace,
                "environment": k.environment.as_str(),
                "allowed_tools": k.allowed_tools.iter().map(|g| g.as_str()).collect::<Vec<_>>(),
                "scopes": k.scopes.iter().map(|s| s.as_str()).collect::<Vec<_>>(),
                "source": "config",
                "revoked_at_ms": null,
            })
        })
        .collect();
    for text in stored.values() {
        if let Ok(record) = serde_json::from_str::<StoredKey>(text) {
            keys.push(describe(&record.spec, "admin", record.revoked_at_ms));
        }
    }
    Ok(keys)
}

async fn revoke_key(
    State(gateway): State<Arc<Gateway>>,
    headers: HeaderMap,
    Path(name): Path<String>,
) -> Response {
    if let Err(refused) = authorize(&gateway, &headers) {
        return *refused;
    }
    if gateway.config_keys().iter().any(|k| k.name == name) {
        return ObolError::DefinedInConfig.to_rest_response();
    }
    let store = &gateway.services.store;
    let stored = match store.registry(Registry::Keys).await {
        Ok(stored) => stored,
        Err(cause) => return store_unavailable("reading keys to revoke one", &cause),
    };
    let Some(mut record) = stored
        .get(&name)
        .and_then(|text| serde_json::from_str::<StoredKey>(text).ok())
    else {
        return ObolError::NotFound("key").to_rest_response();
    };
    let revoked_at_ms = *record.revoked_at_ms.get_or_insert_with(now_ms);
    let text = serde_json::to_string(&record).expect("plain data");
    if let Err(cause) = store.registry_put(Registry::Keys, &name, &text).await {
        return store_unavailable("storing a revocation", &cause);
    }
    if let Err(cause) = gateway.refresh_registry().await {
        return store_unavailable("re-reading the registry after a revocation", &cause);
    }
    tracing::info!(key = %name, "key revoked through the admin API");
    axum::Json(json!({ "name": name, "revoked_at_ms": revoked_at_ms })).into_response()
}

fn configured<'g>(
    gateway: &'g Gateway,
    workspace: &str,
) -> Result<&'g WorkspaceConfig, Box<Response>> {
    gateway
        .config_workspaces()
        .iter()
        .find(|w| w.id == workspace)
        .ok_or_else(|| Box::new(ObolError::NotFound("workspace").to_rest_response()))
}

/// The admin token, then the configured workspace the path names.
fn workspace_admin<'g>(
    gateway: &'g Gateway,
    headers: &HeaderMap,
    workspace: &str,
) -> Result<&'g WorkspaceConfig, Box<Response>> {
    authorize(gateway, headers)?;
    configured(gateway, workspace)
}

/// The registry name of a publication: sorts by workspace, then number.
fn publication_name(workspace: &str, number: u32) -> String {
    format!("{workspace}/{number:010}")
}

async fn publish(
    State(gateway): State<Arc<Gateway>>,
    headers: HeaderMap,
    Path(workspace): Path<String>,
    body: String,
) -> Response {
    let config = match workspace_admin(&gateway, &headers, &workspace) {
        Ok(config) => config,
        Err(refused) => return *refused,
    };
    let store = &gateway.services.store;
    // The next number after every existing one; a concurrent publisher that took it first
    // makes us try the one after.
    for _ in 0..8 {
        let records = match Records::read(store).await {
            Ok(records) => records,
            Err(cause) => return store_unavailable("reading publications to publish", &cause),
        };
        let number = config
            .publications
            .iter()
            .map(|p| p.number)
            .chain(records.publications(&workspace).iter().map(|p| p.number))
            .max()
            .map_or(1, |n| n + 1);
        if let Err(problem) = Publication::parse(number, &body) {
            return invalid(problem);
        }
        let record = StoredPublication {
            workspace: workspace.clone(),
            number,
            policies: body.clone(),
            published_at_ms: now_ms(),
        };
        let text = serde_json::to_string(&record).expect("plain data");
        match store
            .registry_insert(
                Registry::Publications,
                &publication_name(&workspace, number),
                &text,
            )
            .await
        {
            Ok(true) => {
                if let Err(cause) = gateway.refresh_registry().await {
                    return store_unavailable(
                        "re-reading the registry after a publication",
                        &cause,
                    );
                }
                let warming = Arc::clone(&gateway);
                tokio::task::spawn_blocking(move || warming.warm_views());
                tracing::info!(
                    workspace,
                    number,
                    "policies published through the admin API"
                );
                return (
                    StatusCode::CREATED,
                    axum::Json(json!({ "workspace": workspace, "number": number })),
                )
                    .into_response();
            }
            Ok(false) => continue,
            Err(cause) => return store_unavailable("storing a publication", &cause),
        }
    }
    ObolError::Conflict("publications are being made concurrently; try again").to_rest_response()
}

async fn list_publications(
    State(gateway): State<Arc<Gateway>>,
    headers: HeaderMap,
    Path(workspace): Path<String>,
) -> Response {
    let config = match workspace_admin(&gateway, &headers, &workspace) {
        Ok(config) => config,
        Err(refused) => return *refused,
    };
    let records = match Records::read(&gateway.services.store).await {
        Ok(records) => records,
        Err(cause) => return store_unavailable("listing publications", &cause),
    };
    let mut numbers: BTreeMap<u32, &str> = config
        .publications
        .iter()
        .map(|p| (p.number, "config"))
        .collect();
    for publication in records.publications(&workspace) {
        numbers.entry(publication.number).or_insert("admin");
    }
    let publications: Vec<_> = numbers
        .into_iter()
        .map(|(number, source)| json!({ "number": number, "source": source }))
        .collect();
    axum::Json(json!({ "workspace": workspace, "publications": publications })).into_response()
}

async fn set_pins(
    State(gateway): State<Arc<Gateway>>,
    headers: HeaderMap,
    Path(name): Path<String>,
    body: axum::body::Bytes,
) -> Response {
    if let Err(refused) = authorize(&gateway, &headers) {
        return *refused;
    }
    if gateway.config_keys().iter().any(|k| k.name == name) {
        return ObolError::DefinedInConfig.to_rest_response();
    }
    let pins: BTreeMap<String, String> = match serde_json::from_slice(&body) {
        Ok(pins) => pins,
        Err(e) => {
            return invalid(format!(
                "the body is an object of capability → connection id: {e}"
            ));
        }
    };
    let store = &gateway.services.store;
    let stored = match store.registry(Registry::Keys).await {
        Ok(stored) => stored,
        Err(cause) => return store_unavailable("reading keys to pin one", &cause),
    };
    let Some(mut record) = stored
        .get(&name)
        .and_then(|text| serde_json::from_str::<StoredKey>(text).ok())
        .filter(|record| record.revoked_at_ms.is_none())
    else {
        return ObolError::NotFound("key").to_rest_response();
    };
    record.spec.capability_pins = pins;
    if let Err(problem) = record.spec.clone().parse(gateway.config_workspaces()) {
        return invalid(problem);
    }
    let text = serde_json::to_string(&record).expect("plain data");
    if let Err(cause) = store.registry_put(Registry::Keys, &name, &text).await {
        return store_unavailable("storing a key's pins", &cause);
    }
    if let Err(cause) = gateway.refresh_registry().await {
        return store_unavailable("re-reading the registry after pinning", &cause);
    }
    tracing::info!(key = %name, "capability pins changed through the admin API");
    axum::Json(json!({ "name": name, "capability_pins": record.spec.capability_pins }))
        .into_response()
}

/// The registry name of a capability.
fn capability_name(workspace: &str, name: &str) -> String {
    format!("{workspace}/{name}")
}

async fn put_capability(
    State(gateway): State<Arc<Gateway>>,
    headers: HeaderMap,
    Path((workspace, name)): Path<(String, String)>,
    body: axum::body::Bytes,
) -> Response {
    let config = match workspace_admin(&gateway, &headers, &workspace) {
        Ok(config) => config,
        Err(refused) => return *refused,
    };
    let spec: crate::catalog::CapabilitySpec = match serde_json::from_slice(&body) {
        Ok(spec) => spec,
        Err(e) => return invalid(format!("the body is not a capability: {e}")),
    };
    if spec.name != name {
        return invalid("the body's name differs from the path's");
    }
    if let Err(problem) = spec.parse(gateway.environment()) {
        return invalid(problem);
    }
    if config.capabilities.iter().any(|c| c.name.as_str() == name) {
        return ObolError::Conflict("this capability is declared in the config file")
            .to_rest_response();
    }
    let record = StoredCapability {
        workspace: workspace.clone(),
        spec,
        updated_at_ms: now_ms(),
        removed_at_ms: None,
    };
    store_capability(&gateway, &record, "stored").await
}

async fn remove_capability(
    State(gateway): State<Arc<Gateway>>,
    headers: HeaderMap,
    Path((workspace, name)): Path<(String, String)>,
) -> Response {
    if let Err(refused) = workspace_admin(&gateway, &headers, &workspace) {
        return *refused;
    }
    let records = match Records::read(&gateway.services.store).await {
        Ok(records) => records,
        Err(cause) => return store_unavailable("reading capabilities", &cause),
    };
    let Some(spec) = records
        .capabilities(&workspace)
        .into_iter()
        .find(|spec| spec.name == name)
        .cloned()
    else {
        return ObolError::NotFound("capability").to_rest_response();
    };
    let now = now_ms();
    let record = StoredCapability {
        workspace,
        spec,
        updated_at_ms: now,
        removed_at_ms: Some(now),
    };
    store_capability(&gateway, &record, "removed").await
}

async fn store_capability(gateway: &Gateway, record: &StoredCapability, done: &str) -> Response {
    let text = serde_json::to_string(record).expect("plain data");
    let name = capability_name(&record.workspace, &record.spec.name);
    if let Err(cause) = gateway
        .services
        .store
        .registry_put(Registry::Capabilities, &name, &text)
        .await
    {
        return store_unavailable("storing a capability", &cause);
    }
    if let Err(cause) = gateway.refresh_registry().await {
        return store_unavailable("re-reading the registry after a capability", &cause);
    }
    tracing::info!(workspace = %record.workspace, capability = %record.spec.name, "capability {done} through the admin API");
    axum::Json(json!({
        "workspace": record.workspace,
        "name": record.spec.name,
        "status": done,
    }))
    .into_response()
}

async fn list_capabilities(
    State(gateway): State<Arc<Gateway>>,
    headers: HeaderMap,
    Path(workspace): Path<String>,
) -> Response {
    let config = match workspace_admin(&gateway, &headers, &workspace) {
        Ok(config) => config,
        Err(refused) => return *refused,
    };
    let records = match Records::read(&gateway.services.store).await {
        Ok(records) => records,
        Err(cause) => return store_unavailable("listing capabilities", &cause),
    };
    // What the current snapshot made of each: the providers that fit, in routing order.
    let catalog = gateway.catalog();
    let providers = |name: &str| -> Vec<String> {
        catalog
            .route(&workspace, name)
            .and_then(|route| route.capability())
            .map(|c| {
                c.providers
                    .iter()
                    .map(|p| p.route.name.to_string())
                    .collect()
            })
            .unwrap_or_default()
    };
    let capabilities: Vec<_> = config
        .capabilities
        .iter()
        .map(|c| (c.name.to_string(), "config"))
        .chain(
            records
                .capabilities(&workspace)
                .into_iter()
                .map(|spec| (spec.name.clone(), "admin")),
        )
        .map(|(name, source)| {
            json!({ "name": name, "source": source, "providers": providers(&name) })
        })
        .collect();
    axum::Json(json!({ "workspace": workspace, "capabilities": capabilities })).into_response()
}
