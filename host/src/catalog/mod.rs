//! Connectors, their tools, and the namespaced catalog a workspace sees.
//!
//! A [`Catalog`] is an immutable snapshot: every loaded component, and for each workspace the
//! tools its connections expose, named `connector.tool`. Hot reload builds a new snapshot and
//! swaps it in whole, so a call never sees half of a reload.

mod capability;
mod names;
mod sources;
pub mod trust;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use serde_json::value::RawValue;

use crate::config::{ConnectionConfig, ConnectionKind, UpstreamFailure, WorkspaceConfig};
use crate::error::ObolError;
use crate::policy::{KeyHash, Policies, Verdict, VirtualKey};
use crate::runtime::Guest;

pub use capability::{
    Capability, CapabilitySpec, Declared, Mapping, PREFIX as CAPABILITY_PREFIX, Provider,
    ProviderSpec,
};
pub use names::ToolName;
pub use obol_runtime::manifest::{
    BodyRule, Broker, ConnectorName, EffectSpec, HOST_OWNED_HEADERS, JsonPointer, Manifest,
    ManifestError, Propagation, RouteKind, Schema, StatusClass, StatusClasses, ToolSpec,
    classify_body,
};
pub use sources::{BUNDLED, Loader, Origin, SourceError, load_connector, signature_path};

/// A component that loaded and whose manifest is valid.
#[derive(Debug)]
pub struct Connector {
    pub manifest: Manifest,
    pub guest: Arc<Guest>,
    /// Why the gateway trusted it (`[connectors.trust]`).
    pub provenance: trust::Provenance,
}

/// One callable tool of one workspace: the tool, what serves it and the connection it runs
/// on.
#[derive(Debug)]
pub struct Route {
    pub name: ToolName,
    pub served_by: ServedBy,
    pub connection: Arc<ConnectionConfig>,
    /// The tool as `tools/list` shows it, rendered once per snapshot.
    pub listing: Box<RawValue>,
}

/// The two connector kinds a route can reach.
#[derive(Debug)]
pub enum ServedBy {
    Component {
        connector: Arc<Connector>,
        tool_index: usize,
    },
    /// A remote MCP server's tool, as the gateway derived it from the upstream's listing.
    Upstream { id: UpstreamId, tool: Arc<ToolSpec> },
    /// A tool the gateway answers itself (`progressive`).
    Gateway(Arc<ToolSpec>),
    /// A capability: its card, and the providers it resolves to.
    Capability {
        card: Arc<ToolSpec>,
        capability: Arc<Capability>,
    },
}

impl Route {
    pub fn tool(&self) -> &ToolSpec {
        match &self.served_by {
            ServedBy::Component {
                connector,
                tool_index,
            } => &connector.manifest.tools[*tool_index],
            ServedBy::Upstream { tool, .. }
            | ServedBy::Gateway(tool)
            | ServedBy::Capability { card: tool, .. } => tool,
        }
    }

    /// The capability this route is, if it is one.
    pub fn capability(&self) -> Option<&Arc<Capability>> {
        match &self.served_by {
            ServedBy::Capability { capability, .. } => Some(capability),
            _ => None,
        }
    }
}

/// An upstream connection, by workspace (connection ids are unique only inside one).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct UpstreamId {
    pub workspace: String,
    pub connection: String,
}

/// What the catalog builds from, per upstream.
#[derive(Debug, Clone, Default)]
pub struct Listed {
    /// The last tools read (none before the first good listing).
    pub tools: Option<Arc<Vec<Arc<ToolSpec>>>>,
    pub down: bool,
}

pub type Snapshot = HashMap<UpstreamId, Listed>;

/// What one workspace can reach, by namespaced name (sorted, so listings are stable).
#[derive(Debug, Default)]
pub struct WorkspaceCatalog {
    pub routes: BTreeMap<String, Arc<Route>>,
    /// `search_tools`' index over every route (entry `i` is the route named `entries[i]`);
    /// a key only ever sees the hits its view allows.
    search: crate::progressive::search::Index,
    /// Upstreams that could not be listed, in a `fail_closed` workspace: its listing fails.
    pub unavailable: Vec<String>,
}

/// An immutable snapshot of everything loaded.
#[derive(Debug, Default)]
pub struct Catalog {
    pub connectors: BTreeMap<ConnectorName, Arc<Connector>>,
    /// The policy publications this snapshot evaluates.
    pub policies: Policies,
    pub workspaces: HashMap<String, WorkspaceCatalog>,
    /// Problems found while building this snapshot, for the operator.
    pub problems: Vec<String>,
    /// Each key's view of this snapshot, computed on first use. A snapshot and its
    /// publications are immutable, so a view never goes stale; a reload builds a new
    /// snapshot with an empty cache.
    views: Mutex<HashMap<KeyHash, Arc<KeyView>>>,
}

/// What one key sees in a snapshot: its `tools/list` answer and the verdict for each visible
/// tool. Listing and calling both read it, so they cannot disagree.
#[derive(Debug)]
pub struct KeyView {
    pub listing: String,
    pub verdicts: HashMap<String, Verdict>,
    /// Whether the key can see a capability (then `find_capability` is its tool too).
    pub capabilities: crate::progressive::Visible,
    /// For each entry of the workspace's search index, whether the key may see it.
    searchable: Vec<bool>,
}

impl Catalog {
    pub fn build(
        connectors: Vec<Arc<Connector>>,
        workspaces: &[WorkspaceConfig],
        upstreams: &Snapshot,
    ) -> Catalog {
        let mut catalog = Catalog::default();
        for connector in connectors {
            let name = connector.manifest.name.clone();
            if catalog.connectors.contains_key(&name) {
                catalog.problems.push(format!(
                    "connector {name:?} is provided by two components; keeping the first ({})",
                    catalog.connectors[&name].guest.digest
                ));
                continue;
            }
            catalog.connectors.insert(name, connector);
        }
        for workspace in workspaces {
            for publication in &workspace.publications {
                catalog.policies.add(&workspace.id, Arc::clone(publication));
            }
            let mut routes = BTreeMap::new();
            let mut unavailable = Vec::new();
            for connection in &workspace.connections {
                let connection = Arc::new(connection.clone());
                let connector = match &connection.kind {
                    ConnectionKind::Component { connector, .. } => connector,
                    ConnectionKind::Virtual => continue,
                    ConnectionKind::Mcp(upstream) => {
                        let id = UpstreamId {
                            workspace: workspace.id.clone(),
                            connection: connection.id.clone(),
                        };
                        let listed = upstreams.get(&id).cloned().unwrap_or_default();
                        let tools = match (listed.down, workspace.upstream_failure) {
                            (false, _) => listed.tools,
                            (true, UpstreamFailure::Skip) => None,
                            // Calls still reach the last tools read; the listing says why
                            // it cannot be answered.
                            (true, UpstreamFailure::FailClosed) => {
                                unavailable.push(connection.id.clone());
                                listed.tools
                            }
                        };
                        let prefix = ConnectorName::parse(&upstream.prefix)
                            .expect("the config checked the prefix");
                        for tool in tools.iter().flat_map(|tools| tools.iter()) {
                            let name = ToolName::new(&prefix, &tool.upstream_name);
                            let listing = render_listing(&name, tool);
                            routes.insert(
                                name.as_str().to_owned(),
                                Arc::new(Route {
                                    name,
                                    served_by: ServedBy::Upstream {
                                        id: id.clone(),
                                        tool: Arc::clone(tool),
                                    },
                                    connection: Arc::clone(&connection),
                                    listing,
                                }),
                            );
                        }
                        continue;
                    }
                };
                let Some(connector) = ConnectorName::parse(connector)
                    .ok()
                    .and_then(|name| catalog.connectors.get(&name))
                else {
                    catalog.problems.push(format!(
                        "workspace {:?}: connection {:?} names connector {:?}, which is not loaded",
                        workspace.id, connection.id, connector
                    ));
                    continue;
                };
                let broker = match &connection.kind {
                    ConnectionKind::Component { broker, .. } => broker.as_deref(),
                    ConnectionKind::Mcp(_) | ConnectionKind::Virtual => None,
                };
                for (tool_index, tool) in connector.manifest.tools.iter().enumerate() {
                    let name = ToolName::new(&connector.manifest.name, &tool.upstream_name);
                    // A federated tool runs only through its own broker, whose retries the
                    // host knows how to turn off; anything else is refused, not guessed.
                    if let Some(declared) = tool.effect.broker
                        && broker.is_none_or(|profile| profile.broker != declared)
                    {
                        catalog.problems.push(format!(
                            "workspace {:?}: tool {name} is federated through {}, but connection {:?} names {}; the tool is refused (set broker = {:?} on the connection)",
                            workspace.id,
                            declared.label(),
                            connection.id,
                            broker.map_or("no broker".to_owned(), |p| format!("broker {}", p.broker.label())),
                            declared.label(),
                        ));
                        continue;
                    }
                    let listing = render_listing(&name, tool);
                    routes.insert(
                        name.as_str().to_owned(),
                        Arc::new(Route {
                            name,
                            served_by: ServedBy::Component {
                                connector: Arc::clone(connector),
                                tool_index,
                            },
                            connection: Arc::clone(&connection),
                            listing,
                        }),
                    );
                }
            }
            for declared in &workspace.capabilities {
                let route =
                    capability_route(&workspace.id, declared, &routes, &mut catalog.problems);
                routes.insert(declared.name.as_str().to_owned(), route);
            }
            let search = crate::progressive::search::Index::build(
                routes
                    .values()
                    .map(|route| crate::progressive::search::Entry {
                        name: route.name.as_str().to_owned(),
                        description: route.tool().description.clone(),
                    })
                    .collect(),
            );
            catalog.workspaces.insert(
                workspace.id.clone(),
                WorkspaceCatalog {
                    routes,
                    search,
                    unavailable,
                },
            );
        }
        catalog
    }

    /// The route for a namespaced name in a workspace, if there is one.
    pub fn route(&self, workspace: &str, name: &str) -> Option<&Arc<Route>> {
        self.workspaces.get(workspace)?.routes.get(name)
    }

    /// The key's view of this snapshot (cached per key).
    pub fn view(&self, key: &VirtualKey) -> Arc<KeyView> {
        if let Some(view) = self.views.lock().expect("views lock").get(&key.hash) {
            return Arc::clone(view);
        }
        let view = Arc::new(self.compute_view(key));
        self.views
            .lock()
            .expect("views lock")
            .insert(key.hash, Arc::clone(&view));
        view
    }

    /// Up to `limit` tools of the key's view that best match `query` (`search_tools`). Only
    /// tools the key may call are ranked at all, so a hidden tool can neither show nor move
    /// the others.
    pub fn search(&self, key: &VirtualKey, query: &str, limit: usize) -> Vec<Arc<Route>> {
        let Some(workspace) = self.workspaces.get(&key.workspace) else {
            return Vec::new();
        };
        let view = self.view(key);
        let index = &workspace.search;
        index
            .search(query, |id| view.searchable[id], limit)
            .into_iter()
            .filter_map(|id| workspace.routes.get(&index.entry(id).name).cloned())
            .collect()
    }

    /// The `tools/list` result for a key, as JSON text. In progressive mode, the two tools
    /// that find and call the rest (whatever the upstreams' state: `search_tools` reports
    /// that); in full mode the key's view, refused while a `fail_closed` workspace has an
    /// upstream it cannot list.
    pub fn listing(&self, key: &VirtualKey) -> Result<String, ObolError> {
        if key.tools_mode == crate::policy::ToolsMode::Progressive {
            return Ok(crate::progressive::progressive_listing().to_owned());
        }
        self.available(&key.workspace)?;
        Ok(self.view(key).listing.clone())
    }

    /// Refuses while a `fail_closed` workspace has an upstream it cannot list: an answer
    /// built from the catalog would silently leave its tools out.
    pub fn available(&self, workspace: &str) -> Result<(), ObolError> {
        match self
            .workspaces
            .get(workspace)
            .and_then(|w| w.unavailable.first())
        {
            Some(connection) => Err(ObolError::UpstreamUnavailable {
                connection: connection.clone(),
            }),
            None => Ok(()),
        }
    }

    /// Decides every tool of the key's workspace once, and joins the visible tools' listings
    /// (rendered when the snapshot was built; never re-serialized per request).
    fn compute_view(&self, key: &VirtualKey) -> KeyView {
        let mut listing = String::from("{\"tools\":[");
        let mut verdicts = HashMap::new();
        let mut capabilities = crate::progressive::Visible::None;
        let mut searchable = Vec::new();
        if let Some(workspace) = self.workspaces.get(&key.workspace) {
            // Tools first: a capability is visible only with a provider the key can reach.
            let (tools, caps): (Vec<_>, Vec<_>) = workspace
                .routes
                .iter()
                .partition(|(_, route)| route.capability().is_none());
            for (name, route) in tools.into_iter().chain(caps) {
                if let Some(capability) = route.capability()
                    && !capability
                        .providers
                        .iter()
                        .any(|p| verdicts.contains_key(p.route.name.as_str()))
                {
                    continue;
                }
                if let Some(verdict) = crate::policy::decide(key, route, &self.policies) {
                    if !listing.ends_with('[') {
                        listing.push(',');
                    }
                    listing.push_str(route.listing.get());
                    verdicts.insert(name.clone(), verdict);
                    if route.capability().is_some() {
                        capabilities = crate::progressive::Visible::Some;
                    }
                }
            }
            // The index holds the routes in this order.
            searchable = workspace
                .routes
                .keys()
                .map(|name| verdicts.contains_key(name))
                .collect();
        }
        if capabilities == crate::progressive::Visible::Some {
            listing.push(',');
            listing.push_str(crate::progressive::find_capability_listing());
        }
        listing.push_str("]}");
        KeyView {
            listing,
            verdicts,
            capabilities,
            searchable,
        }
    }

    /// A digest of the components loaded, to tell whether a reload changed anything
    /// (upstreams say so themselves).
    pub fn fingerprint(&self) -> Vec<(String, String)> {
        let mut seen: Vec<(String, String)> = self
            .connectors
            .values()
            .map(|c| (c.manifest.name.to_string(), c.guest.digest.clone()))
            .collect();
        seen.sort();
        seen
    }
}

/// A capability's route: its card as a tool, and the providers of `routes` its mapping fits.
/// A provider that is not a tool of the workspace, or whose mapping does not fit its schema,
/// is left out and reported.
fn capability_route(
    workspace: &str,
    declared: &Declared,
    routes: &BTreeMap<String, Arc<Route>>,
    problems: &mut Vec<String>,
) -> Arc<Route> {
    let mut providers = Vec::new();
    for provider in &declared.providers {
        let Some(route) = routes.get(provider.tool.as_str()) else {
            problems.push(format!(
                "workspace {workspace:?}: capability {}: provider {} is not a tool of the workspace (yet); it is left out",
                declared.name, provider.tool
            ));
            continue;
        };
        if let Err(problem) = provider.mapping.check(
            &declared.input_schema.source,
            &route.tool().input_schema.source,
        ) {
            problems.push(format!(
                "workspace {workspace:?}: capability {}: provider {}: {problem}; it is left out",
                declared.name, provider.tool
            ));
            continue;
        }
        providers.push(Provider {
            route: Arc::clone(route),
            mapping: provider.mapping.clone(),
            priority: provider.priority,
            environment: provider.environment.unwrap_or(route.connection.environment),
        });
    }
    // Stable: equal priorities keep the declared order.
    providers.sort_by_key(|p| p.priority);
    let card = ToolSpec {
        upstream_name: declared.name.upstream().to_owned(),
        description: declared.description.clone(),
        input_schema: declared.input_schema.clone(),
        effect: EffectSpec {
            route: RouteKind::Capability,
            broker: None,
            // As destructive as the most destructive provider it may resolve to; each call is
            // judged on the provider it does resolve to.
            destructive: providers.iter().any(|p| p.route.tool().effect.destructive),
            statuses: StatusClasses::none(),
            propagation: Propagation::None,
            output_schema: None,
            body_rules: Vec::new(),
        },
    };
    let listing = render_listing(&declared.name, &card);
    Arc::new(Route {
        name: declared.name.clone(),
        served_by: ServedBy::Capability {
            card: Arc::new(card),
            capability: Arc::new(Capability { providers }),
        },
        connection: Arc::new(ConnectionConfig {
            id: CAPABILITY_PREFIX.to_owned(),
            environment: declared.environment,
            kind: ConnectionKind::Virtual,
            secret: None,
            idempotency_window: std::time::Duration::ZERO,
        }),
        listing,
    })
}

fn render_listing(name: &ToolName, tool: &ToolSpec) -> Box<RawValue> {
    let effect = &tool.effect;
    let mut listing = serde_json::json!({
        "name": name.as_str(),
        "description": tool.description,
        "inputSchema": tool.input_schema.source,
        "annotations": {
            "readOnlyHint": effect.read_only(),
            "destructiveHint": effect.destructive,
            "openWorldHint": true,
        },
    });
    if let Some(schema) = &effect.output_schema {
        listing["outputSchema"] = schema.source.clone();
    }
    RawValue::from_string(listing.to_string()).expect("serde_json renders valid JSON")
}
