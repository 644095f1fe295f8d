//! The prefilter: the first of the checks a tool must pass to be listed and called.

use super::{ApprovalQuestion, Environment, Policies, Verdict, VirtualKey};
use crate::catalog::Route;

/// The full visibility decision: the prefilter, then Cedar under the key's publication.
/// `None` means hidden (listing skips it; calling answers `Unknown tool`).
pub fn decide(key: &VirtualKey, route: &Route, policies: &Policies) -> Option<Verdict> {
    if !prefilter(key, route) {
        return None;
    }
    // A destructive production call waits for a human unless a policy waives it (ADR-0006).
    let question =
        if route.tool().effect.destructive && route.connection.environment == Environment::Prod {
            ApprovalQuestion::Ask
        } else {
            ApprovalQuestion::NotAsked
        };
    let verdict = policies.decide(key, route, question);
    verdict.allowed.then_some(verdict)
}

/// Whether `key` may see (and so call) the tool behind `route`.
pub fn prefilter(key: &VirtualKey, route: &Route) -> bool {
    prefilter_refusal(key, route).is_none()
}

/// Which prefilter rule hides the tool behind `route` from `key`, if one does. All must hold
/// for a tool to be visible:
///
/// 1. the namespaced name matches one of the key's `allowed_tools` globs;
/// 2. the tool's environment (its connection's) is the key's;
/// 3. in prod, a destructive tool is visible only to a key that names it verbatim, never
///    through a glob — a wildcard must not silently grant a destructive production tool;
/// 4. the key's own CEL filter, if any, holds.
///
/// The answer is for the owner's receipt; the caller only ever sees `Unknown tool`.
pub fn prefilter_refusal(key: &VirtualKey, route: &Route) -> Option<&'static str> {
    let name = route.name.as_str();
    let tool = route.tool();
    if !key.allowed_tools.iter().any(|glob| glob.matches(name)) {
        return Some("no allowed_tools glob of the key matches the tool");
    }
    if route.connection.environment != key.environment {
        return Some("the tool belongs to another environment than the key");
    }
    if key.environment == Environment::Prod
        && tool.effect.destructive
        && !key
            .allowed_tools
            .iter()
            .any(|glob| glob.is_verbatim() && glob.matches(name))
    {
        return Some("a destructive prod tool must be named verbatim in allowed_tools");
    }
    match &key.filter {
        Some(filter) if !filter.admits(key, route) => Some("the key's CEL filter hides the tool"),
        _ => None,
    }
}
