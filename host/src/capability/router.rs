//! The router: which provider a new `cap.*` call goes to, and why.
//!
//! A key's pin for the capability first, then the operator's priority (ties in declared
//! order). Only providers the key can reach are candidates at all (its view: prefilter and
//! Cedar on the provider tool), and of those a provider is passed over when it serves another
//! environment than the key's, or its connection's breaker is open, or (an MCP upstream) it is
//! down. The decision is recorded before authorization; it never runs for a slot that exists.

use serde::{Deserialize, Serialize};

use crate::catalog::{Capability, Provider, Route};
use crate::policy::VirtualKey;

/// A routing decision, as receipts, tickets and `POST /v1/route` show it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Decision {
    pub capability: String,
    /// The provider tool.
    pub provider: String,
    pub connection: String,
    pub why: Chosen,
    /// Providers tried first and why they were not taken.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub passed_over: Vec<PassedOver>,
    /// Who decided for this call: the router, or (a retry or a resume) the slot, which keeps
    /// the router's first decision, `why` and `passed_over` included.
    #[serde(default)]
    pub source: Source,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Source {
    #[default]
    Router,
    Slot,
}

/// Why the provider was chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Chosen {
    /// The key pins this capability to the provider's connection.
    Pinned,
    /// The first eligible provider by the operator's priority.
    Priority,
    /// Its breaker's cooldown is over and this call is the probe.
    Probe,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PassedOver {
    pub provider: String,
    pub connection: String,
    pub why: Skipped,
    /// When an open breaker lets a probe through.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub until_ms: Option<u64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Skipped {
    OtherEnvironment,
    CircuitOpen,
    UpstreamDown,
}

/// Whether a provider's connection can take a new call now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Availability {
    Available,
    /// Available as the breaker's probe.
    Probe,
    CircuitOpen {
        until_ms: u64,
    },
    UpstreamDown,
}

/// No provider the key can reach is eligible now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NoEligible {
    pub passed_over: Vec<PassedOver>,
}

/// Picks the provider. `reachable` says whether the key's view has a provider tool;
/// `availability` is asked of candidates in order until one is taken (it may claim the
/// breaker's probe, so it is asked only of the provider it would return).
pub fn route(
    name: &str,
    capability: &Capability,
    key: &VirtualKey,
    reachable: impl Fn(&Route) -> bool,
    mut availability: impl FnMut(&Provider) -> Availability,
) -> Result<(usize, Decision), NoEligible> {
    let pin = key.capability_pins.get(name);
    let pinned = |provider: &Provider| pin.is_some_and(|c| *c == provider.route.connection.id);
    let candidates = capability
        .providers
        .iter()
        .enumerate()
        .filter(|(_, provider)| reachable(&provider.route));
    // The pinned provider first; the rest keep the catalog's order (priority, declared).
    let ordered = candidates
        .clone()
        .filter(|(_, p)| pinned(p))
        .chain(candidates.filter(|(_, p)| !pinned(p)));
    let mut passed_over = Vec::new();
    for (index, provider) in ordered {
        let skip = |why, until_ms| PassedOver {
            provider: provider.route.name.to_string(),
            connection: provider.route.connection.id.clone(),
            why,
            until_ms,
        };
        if provider.environment != key.environment {
            passed_over.push(skip(Skipped::OtherEnvironment, None));
            continue;
        }
        let why = match availability(provider) {
            Availability::Available if pinned(provider) => Chosen::Pinned,
            Availability::Available => Chosen::Priority,
            Availability::Probe => Chosen::Probe,
            Availability::CircuitOpen { until_ms } => {
                passed_over.push(skip(Skipped::CircuitOpen, Some(until_ms)));
                continue;
            }
            Availability::UpstreamDown => {
                passed_over.push(skip(Skipped::UpstreamDown, None));
                continue;
            }
        };
        return Ok((
            index,
            Decision {
                capability: name.to_owned(),
                provider: provider.route.name.to_string(),
                connection: provider.route.connection.id.clone(),
                why,
                passed_over,
                source: Source::Router,
            },
        ));
    }
    Err(NoEligible { passed_over })
}
