//! Route: the name to a route this key may call, with the policy verdict that allows it.
//! Every way of not finding one is the same `Unknown tool`; the owner learns the real reason
//! from a refusal receipt.

use std::sync::Arc;

use serde_json::Value;

use super::parse::Parsed;
use super::{Answer, Services};
use crate::catalog::{Catalog, Route, ToolName};
use crate::clock::now_ms;
use crate::error::ObolError;
use crate::policy::{Verdict, VirtualKey};
use crate::progressive::{self, Synthetic};

/// A call with its route and the verdict that admitted it.
#[derive(Debug)]
pub struct Routed {
    pub parsed: Parsed,
    pub route: Arc<Route>,
    pub verdict: Verdict,
    pub caller: Caller,
}

/// The virtual key that made the call, as the claim and the receipt name it.
#[derive(Debug, Clone)]
pub struct Caller {
    pub workspace: String,
    pub name: String,
    pub hash: crate::policy::KeyHash,
}

impl Parsed {
    pub fn route(
        self,
        services: &Services,
        catalog: &Catalog,
        key: &VirtualKey,
    ) -> Result<Routed, Answer> {
        self.find(catalog, key).map_err(|parsed| {
            record_refusal(services, catalog, key, &parsed);
            parsed.refuse(ObolError::UnknownTool)
        })
    }

    /// The route, or the call back when the key has none by that name (for any reason).
    fn find(self, catalog: &Catalog, key: &VirtualKey) -> Result<Routed, Parsed> {
        let Some((route, verdict)) = route(catalog, key, &self.name) else {
            return Err(self);
        };
        Ok(Routed {
            parsed: self,
            route,
            verdict,
            caller: Caller {
                workspace: key.workspace.clone(),
                name: key.name.clone(),
                hash: key.hash,
            },
        })
    }
}

/// The lifecycle up to authorization, without its side effects (refusal receipts): what a
/// call of this key would be admitted as. The progressive property compares it across modes.
#[cfg(test)]
pub(crate) fn admit(
    catalog: &Catalog,
    key: &VirtualKey,
    request: super::CallRequest,
) -> Result<super::authorize::Authorized, Answer> {
    let parsed = super::parse::parse(request, key.tools_mode)?;
    let routed = parsed
        .find(catalog, key)
        .map_err(|parsed| parsed.refuse(ObolError::UnknownTool))?;
    assert!(
        routed.route.capability().is_none(),
        "admit does not route capabilities"
    );
    super::resolve::Resolved {
        routed,
        capability: None,
    }
    .authorize()
}

/// Finds the route for a name the key may call, with the policy verdict that allowed it.
/// `None` covers every reason alike. Reads the key's cached view of the snapshot, the same
/// one `tools/list` renders.
pub fn route(catalog: &Catalog, key: &VirtualKey, name: &str) -> Option<(Arc<Route>, Verdict)> {
    let view = catalog.view(key);
    if let Some(synthetic) = Synthetic::listed(name, key.tools_mode, view.capabilities) {
        // Listed by the key's mode, not by policy: the gateway's own read-only tools.
        let verdict = Verdict {
            publication: None,
            allowed: true,
            policies: Vec::new(),
            approval: crate::policy::ApprovalRule::NotRequired,
        };
        return Some((Arc::clone(synthetic.route()), verdict));
    }
    let parsed = ToolName::parse(name)?;
    let route = catalog.route(&key.workspace, parsed.as_str())?;
    let verdict = view.verdicts.get(parsed.as_str())?.clone();
    Some((Arc::clone(route), verdict))
}

/// Refusal receipts are written at most [`RefusalBudget::PER_MINUTE`] times a minute per key,
/// so a key sending junk names cannot grow the store or push real receipts out of listings;
/// beyond that, one log line per minute counts them.
#[derive(Debug, Default)]
pub struct RefusalBudget {
    spent: std::sync::Mutex<std::collections::HashMap<crate::policy::KeyHash, (u64, u32)>>,
}

impl RefusalBudget {
    pub const PER_MINUTE: u32 = 60;

    fn take(&self, key: &VirtualKey) -> bool {
        let minute = now_ms() / 60_000;
        let mut spent = self.spent.lock().expect("refusal budget");
        if spent.len() > 10_000 {
            spent.retain(|_, (m, _)| *m == minute);
        }
        let entry = spent.entry(key.hash).or_insert((minute, 0));
        if entry.0 != minute {
            *entry = (minute, 0);
        }
        entry.1 += 1;
        if entry.1 == Self::PER_MINUTE + 1 {
            tracing::warn!(key = %key.name, "more than {} refused calls this minute; not recording receipts for the rest of it", Self::PER_MINUTE);
        }
        entry.1 <= Self::PER_MINUTE
    }
}

/// Records why a call was answered `Unknown tool`, for the owner. The client's answer is the
/// same bytes whatever the reason; the receipt is written in the background so that the
/// answer does not wait on it either.
fn record_refusal(services: &Services, catalog: &Catalog, key: &VirtualKey, parsed: &Parsed) {
    let (name, arguments) = (parsed.name.as_str(), &parsed.arguments);
    if !services.refusals.take(key) {
        return;
    }
    // The name is the client's: keep a bounded prefix of it.
    let shown: String = name.chars().take(200).collect();
    let mut connection = None;
    let mut verdict = None;
    let mut decision = None;
    let reason = match ToolName::parse(name) {
        None if name == progressive::SEARCH_TOOLS || name == progressive::CALL_TOOL => {
            "search_tools and call_tool are tools of progressive mode only".to_owned()
        }
        None if name == progressive::FIND_CAPABILITY => {
            "find_capability is a tool of full mode only, for keys that see a capability".to_owned()
        }
        None => "the tool name is malformed".to_owned(),
        Some(parsed) => match catalog.route(&key.workspace, parsed.as_str()) {
            None => {
                let exists = catalog.connectors.iter().any(|(connector, loaded)| {
                    connector.as_str() == parsed.connector()
                        && loaded
                            .manifest
                            .tools
                            .iter()
                            .any(|t| t.upstream_name == parsed.upstream())
                });
                if exists {
                    "no connection of the workspace routes this connector".to_owned()
                } else {
                    "no loaded connector has this tool".to_owned()
                }
            }
            Some(route) => {
                connection = Some(route.connection.id.clone());
                // A capability refused for this key still shows the provider the router
                // would have picked among those the key can reach.
                if let Some(capability) = route.capability() {
                    decision = super::resolve::would_route(
                        services,
                        catalog,
                        key,
                        route.name.as_str(),
                        capability,
                    )
                    .ok()
                    .map(|(_, decision)| decision);
                }
                match crate::policy::prefilter_refusal(key, route) {
                    Some(rule) => format!("hidden by the prefilter: {rule}"),
                    None => {
                        let decided = catalog.policies.decide(
                            key,
                            route,
                            crate::policy::ApprovalQuestion::NotAsked,
                        );
                        let reason = match decided.publication {
                            _ if decided.allowed && route.capability().is_some() => {
                                "the key can reach none of the capability's providers".to_owned()
                            }
                            Some(number) => format!("denied by Cedar publication {number}"),
                            None => {
                                "the key is pinned to a publication that does not exist".to_owned()
                            }
                        };
                        verdict = Some(decided);
                        reason
                    }
                }
            }
        },
    };
    let mut receipt = super::receipt::refused(
        key,
        &shown,
        connection.as_deref(),
        &Value::Object(arguments.clone()),
        reason,
        verdict.as_ref(),
    );
    receipt.capability = decision;
    receipt.trace_id = parsed.trace_id.as_ref().map(|t| t.as_str().to_owned());
    let store = services.store.clone();
    tokio::spawn(async move {
        if let Err(error) = store.record_refusal(&receipt).await {
            tracing::warn!(receipt = %receipt.id, "could not record a refusal: {error}");
        }
    });
}
