//! The prefilter: the first of the checks a tool must pass to be listed and called.

use super::{Environment, Policies, Verdict, VirtualKey};
use crate::catalog::Route;

/// The full visibility decision: the prefilter, then Cedar under the key's publication.
/// `None` means hidden (listing skips it; calling answers `Unknown tool`).
pub fn decide(key: &VirtualKey, route: &Route, policies: &Policies) -> Option<Verdict> {
    if !prefilter(key, route) {
        return None;
    }
    // A destructive production call waits for a human unless a policy waives it (ADR-0006).
    let needs_approval =
        route.tool().effect.destructive && route.connection.environment == Environment::Prod;
    let verdict = policies.decide(key, route, needs_approval);
    verdict.allowed.then_some(verdict)
}

/// Whether `key` may see (and so call) the tool behind `route`. All must hold:
///
/// 1. the namespaced name matches one of the key's `allowed_tools` globs;
/// 2. the tool's environment (its connection's) is the key's;
/// 3. in prod, a destructive tool is visible only to a key that names it verbatim, never
///    through a glob — a wildcard must not silently grant a destructive production tool;
/// 4. the key's own CEL filter, if any, holds.
pub fn prefilter(key: &VirtualKey, route: &Route) -> bool {
    let name = route.name.as_str();
    let tool = route.tool();
    if !key.allowed_tools.iter().any(|glob| glob.matches(name)) {
        return false;
    }
    if route.connection.environment != key.environment {
        return false;
    }
    if key.environment == Environment::Prod
        && tool.effect.destructive
        && !key
            .allowed_tools
            .iter()
            .any(|glob| glob.is_verbatim() && glob.matches(name))
    {
        return false;
    }
    match &key.filter {
        Some(filter) => filter.admits(key, route),
        None => true,
    }
}
