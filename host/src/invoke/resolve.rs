//! Resolve: a capability call becomes the call of one provider (ADR-0047). Any other call
//! passes through unchanged.
//!
//! A new call asks the router. A call whose slot already exists (a retry, a resume) takes the
//! route the slot recorded and never asks the router, so failover cannot happen inside an
//! idempotency slot: only a call under a new key reaches the next provider. From here on the
//! decision is part of the call, recorded in its holder, receipt and ticket whatever
//! authorization then decides.

use std::sync::Arc;

use serde_json::{Map, Value};

use super::route::Routed;
use super::{Answer, Services};
use crate::capability::router::{self, Availability, Decision, Source};
use crate::catalog::{Capability, Catalog, Provider, Route, ServedBy};
use crate::clock::now_ms;
use crate::error::ObolError;
use crate::policy::{Verdict, VirtualKey};
use crate::store::{ClaimKey, ConnectionSegment};

/// A call with the route it will be sent on: for a capability, its provider's, with the
/// arguments mapped for it.
#[derive(Debug)]
pub struct Resolved {
    pub routed: Routed,
    pub capability: Option<Resolution>,
}

/// How a capability call resolved.
#[derive(Debug)]
pub struct Resolution {
    /// The capability's own route (its card) and the verdict that lets the key call it.
    pub route: Arc<Route>,
    pub verdict: Verdict,
    pub decision: Decision,
    /// The arguments as the client sent them: the slot's request hash is theirs, so a retry
    /// matches whatever provider the call resolved to.
    pub arguments: Map<String, Value>,
}

impl Resolved {
    /// The tool the client called: what approvals and tickets name.
    pub fn called(&self) -> &str {
        match &self.capability {
            Some(resolution) => resolution.route.name.as_str(),
            None => self.routed.route.name.as_str(),
        }
    }
}

impl Routed {
    pub async fn resolve(
        self,
        services: &Services,
        catalog: &Catalog,
        key: &VirtualKey,
    ) -> Result<Resolved, Answer> {
        let Some(capability) = self.route.capability().cloned() else {
            return Ok(Resolved {
                routed: self,
                capability: None,
            });
        };
        match resolution(&self, services, catalog, key, &capability).await {
            Ok((provider, decision)) => self.onto(catalog, key, &capability, provider, decision),
            Err(error) => Err(self.parsed.refuse(error)),
        }
    }

    /// The call, moved onto its provider.
    fn onto(
        self,
        catalog: &Catalog,
        key: &VirtualKey,
        capability: &Capability,
        index: usize,
        decision: Decision,
    ) -> Result<Resolved, Answer> {
        let provider = &capability.providers[index];
        let arguments = match provider.mapping.apply(&self.parsed.arguments) {
            Ok(arguments) => arguments,
            Err(error) => return Err(self.parsed.refuse(error)),
        };
        let Some(verdict) = catalog
            .view(key)
            .verdicts
            .get(provider.route.name.as_str())
            .cloned()
        else {
            return Err(self.parsed.refuse(ObolError::Internal));
        };
        let Routed {
            mut parsed,
            route,
            verdict: capability_verdict,
            caller,
        } = self;
        let client_arguments = std::mem::replace(&mut parsed.arguments, arguments);
        Ok(Resolved {
            routed: Routed {
                parsed,
                route: Arc::clone(&provider.route),
                verdict,
                caller,
            },
            capability: Some(Resolution {
                route,
                verdict: capability_verdict,
                decision,
                arguments: client_arguments,
            }),
        })
    }
}

/// The provider a capability call goes to: its slot's recorded one, else the router's pick.
async fn resolution(
    routed: &Routed,
    services: &Services,
    catalog: &Catalog,
    key: &VirtualKey,
    capability: &Capability,
) -> Result<(usize, Decision), ObolError> {
    let name = routed.route.name.as_str();
    // The card is the client's contract: its arguments are checked against it before any
    // mapping reads them.
    let violations = routed
        .route
        .tool()
        .input_schema
        .violations(&Value::Object(routed.parsed.arguments.clone()));
    if !violations.is_empty() {
        return Err(ObolError::InvalidArguments(violations.join("; ")));
    }
    let slot = ClaimKey {
        workspace: routed.caller.workspace.clone(),
        connection: ConnectionSegment::Capability,
        tool: name.to_owned(),
        key: routed.parsed.idempotency_key.clone(),
    };
    // A key minted for this call (no header, no approval) names no slot that could exist:
    // only a client's key, or an approved call's, can be a retry.
    let fresh = routed.parsed.key_source == crate::store::KeySource::Minted
        && routed.parsed.grant.is_none();
    let existing = match fresh {
        true => None,
        false => services.store.get(&slot).await.map_err(|error| {
            tracing::warn!("could not read a capability's slot, nothing sent: {error}");
            ObolError::StoreUnavailable
        })?,
    };
    let view = catalog.view(key);
    if let Some(record) = existing {
        // The slot keeps its route. If that provider is gone, or this key can no longer reach
        // it, the call conflicts: sending it elsewhere would be a second effect.
        let recorded = record.holder.as_ref().and_then(|h| h.capability.as_ref());
        let index = recorded.and_then(|recorded| {
            capability.providers.iter().position(|p| {
                p.route.name.as_str() == recorded.provider
                    && p.route.connection.id == recorded.connection
                    && view.verdicts.contains_key(p.route.name.as_str())
            })
        });
        return match (index, recorded) {
            (Some(index), Some(recorded)) => Ok((
                index,
                Decision {
                    source: Source::Slot,
                    ..recorded.clone()
                },
            )),
            _ => Err(ObolError::IdempotencyConflict),
        };
    }
    let workspace = &routed.caller.workspace;
    let now = now_ms();
    router::route(
        name,
        capability,
        key,
        |route| view.verdicts.contains_key(route.name.as_str()),
        |provider| availability(services, workspace, provider, now, Probing::Take),
    )
    .map_err(|_| ObolError::NoEligibleRoute {
        capability: name.to_owned(),
    })
}

/// Whether the router's pick of a provider whose breaker admits a probe takes that probe (a
/// call), or only reports it (`POST /v1/route`, which dispatches nothing).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Probing {
    Take,
    Report,
}

/// Whether a provider's connection takes new calls now.
pub fn availability(
    services: &Services,
    workspace: &str,
    provider: &Provider,
    now: u64,
    probing: Probing,
) -> Availability {
    if let ServedBy::Upstream { id, .. } = &provider.route.served_by
        && services.upstreams.health.is_down(id)
    {
        return Availability::UpstreamDown;
    }
    let connection = (workspace.to_owned(), provider.route.connection.id.clone());
    match services.breakers.admission(&connection, now) {
        crate::capability::breaker::Admission::Closed => Availability::Available,
        crate::capability::breaker::Admission::Open { until_ms } => {
            Availability::CircuitOpen { until_ms }
        }
        crate::capability::breaker::Admission::Probe => {
            if probing == Probing::Report || services.breakers.take_probe(&connection, now) {
                Availability::Probe
            } else {
                // Another call took the probe: open until its outcome, or its cooldown.
                match services.breakers.admission(&connection, now) {
                    crate::capability::breaker::Admission::Open { until_ms } => {
                        Availability::CircuitOpen { until_ms }
                    }
                    _ => Availability::CircuitOpen { until_ms: now },
                }
            }
        }
    }
}

/// The router's pick for a new call of `capability` by `key` now, over the providers the key
/// can reach, taking no breaker's probe: for previews, and for the owner's receipt of a call
/// refused before it was routed.
pub fn would_route(
    services: &Services,
    catalog: &Catalog,
    key: &VirtualKey,
    name: &str,
    capability: &Capability,
) -> Result<(usize, Decision), router::NoEligible> {
    let view = catalog.view(key);
    let now = now_ms();
    router::route(
        name,
        capability,
        key,
        |route| view.verdicts.contains_key(route.name.as_str()),
        |provider| availability(services, &key.workspace, provider, now, Probing::Report),
    )
}

/// What a new call of `capability` with `arguments` would be routed to now, without sending
/// anything or taking a breaker's probe (`POST /v1/route`, `find_capability`). A capability
/// the key cannot see is refused with the same words as one that does not exist.
pub fn preview(
    services: &Services,
    catalog: &Catalog,
    key: &VirtualKey,
    capability: &str,
    arguments: &Map<String, Value>,
) -> Result<Value, ObolError> {
    let unknown = || {
        ObolError::InvalidArguments(format!(
            "there is no capability {}",
            crate::names::shown(capability)
        ))
    };
    let view = catalog.view(key);
    let route = catalog
        .route(&key.workspace, capability)
        .filter(|route| view.verdicts.contains_key(route.name.as_str()))
        .ok_or_else(unknown)?;
    let providers = route.capability().ok_or_else(unknown)?;
    let violations = route
        .tool()
        .input_schema
        .violations(&Value::Object(arguments.clone()));
    if !violations.is_empty() {
        return Err(ObolError::InvalidArguments(violations.join("; ")));
    }
    let (index, decision) =
        would_route(services, catalog, key, capability, providers).map_err(|_| {
            ObolError::NoEligibleRoute {
                capability: capability.to_owned(),
            }
        })?;
    let provider = &providers.providers[index];
    // The mapping must apply; what it produces is not shown (an operator's constants are
    // not the key's to read).
    provider.mapping.apply(arguments)?;
    let mut answer = serde_json::to_value(&decision).map_err(|_| ObolError::Internal)?;
    answer["destructive"] = Value::Bool(provider.route.tool().effect.destructive);
    Ok(answer)
}
