//! What the gateway is doing, for Prometheus: `GET /metrics` on the admin routes (admin token),
//! in the OpenMetrics text format.
//!
//! Every label value comes from a fixed set or from the operator's own configuration
//! (connection and tool names of the catalog): never a key, a session id, an argument, a URL
//! or anything else a client sent. A JSON-RPC method is mapped to [`RpcMethod`], anything
//! else is `unknown`; a tool name the catalog does not know is `unknown` too, so a client
//! cannot mint label values (or series) by sending names.

use std::sync::Arc;
use std::time::Duration;

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Metric, Registry};

use crate::catalog::Catalog;
use crate::error::ObolError;
use crate::runtime::GuestFailure;
use crate::store::OutcomeClass;

/// The JSON-RPC methods that get a label of their own.
#[derive(Debug, Clone, Copy, Hash, PartialEq, Eq)]
pub enum RpcMethod {
    Initialize,
    Ping,
    ToolsList,
    ToolsCall,
    ServerDiscover,
    SubscriptionsListen,
    PromptsList,
    PromptsGet,
    ResourcesList,
    ResourcesRead,
    ResourcesTemplatesList,
    Unknown,
}

impl RpcMethod {
    const ALL: [RpcMethod; 11] = [
        RpcMethod::Initialize,
        RpcMethod::Ping,
        RpcMethod::ToolsList,
        RpcMethod::ToolsCall,
        RpcMethod::ServerDiscover,
        RpcMethod::SubscriptionsListen,
        RpcMethod::PromptsList,
        RpcMethod::PromptsGet,
        RpcMethod::ResourcesList,
        RpcMethod::ResourcesRead,
        RpcMethod::ResourcesTemplatesList,
    ];

    /// The label of a method as the client spelled it.
    pub fn of(method: &str) -> RpcMethod {
        RpcMethod::ALL
            .into_iter()
            .find(|known| known.as_str() == method)
            .unwrap_or(RpcMethod::Unknown)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            RpcMethod::Initialize => "initialize",
            RpcMethod::Ping => "ping",
            RpcMethod::ToolsList => "tools/list",
            RpcMethod::ToolsCall => "tools/call",
            RpcMethod::ServerDiscover => "server/discover",
            RpcMethod::SubscriptionsListen => "subscriptions/listen",
            RpcMethod::PromptsList => "prompts/list",
            RpcMethod::PromptsGet => "prompts/get",
            RpcMethod::ResourcesList => "resources/list",
            RpcMethod::ResourcesRead => "resources/read",
            RpcMethod::ResourcesTemplatesList => "resources/templates/list",
            RpcMethod::Unknown => "unknown",
        }
    }
}

impl EncodeLabelValue for RpcMethod {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        std::fmt::Write::write_str(encoder, self.as_str())
    }
}

/// The lifecycle phases that are timed.
#[derive(Debug, Clone, Copy, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum Phase {
    claim,
    dispatch,
    finalize,
}

/// How a guest call failed.
#[derive(Debug, Clone, Copy, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
enum Fault {
    deadline,
    memory,
    trap,
    busy,
}

/// What a claim found that was not a fresh slot.
#[derive(Debug, Clone, Copy, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
enum Found {
    replayed,
    conflict,
    not_ready,
}

/// What became of an approval.
#[derive(Debug, Clone, Copy, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum ApprovalState {
    held,
    approved,
    denied,
    expired,
}

/// Whether a reload of the connector directory changed the catalog.
#[derive(Debug, Clone, Copy, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum Reload {
    changed,
    unchanged,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct MethodLabels {
    method: RpcMethod,
}

/// Where a tool call's result came from.
#[derive(Debug, Clone, Copy)]
pub enum ResultSource {
    /// This call's own outcome, just recorded.
    Recorded(OutcomeClass),
    /// The recorded outcome of an earlier call with the same key.
    Replayed(OutcomeClass),
    /// Made by the gateway, not by a vendor's answer (arguments refused as a tool error).
    Gateway,
}

/// A tool call as the metrics (and the call's trace span) name it: nothing a client chose.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CallLabels {
    pub connection: String,
    pub tool: String,
    /// The outcome class of a result (`accepted`, `definitely_rejected`, `unknown`), or the
    /// error's type (`not_ready`, `store_unavailable`, …; `error` for the plain JSON-RPC ones).
    pub outcome: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ConnectionLabels {
    connection: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PhaseLabels {
    phase: Phase,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FaultLabels {
    connection: String,
    fault: Fault,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FoundLabels {
    found: Found,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ApprovalLabels {
    state: ApprovalState,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct UpstreamLabels {
    workspace: String,
    connection: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReloadLabels {
    result: Reload,
}

/// The gateway's metrics. Cheap to update from any task; rendered on scrape.
pub struct Metrics {
    registry: Registry,
    requests: Family<MethodLabels, Counter>,
    tool_calls: Family<CallLabels, Counter>,
    attempts: Family<ConnectionLabels, Counter>,
    phases: Family<PhaseLabels, Histogram>,
    claims: Family<FoundLabels, Counter>,
    approvals: Family<ApprovalLabels, Counter>,
    guest_faults: Family<FaultLabels, Counter>,
    upstream_up: Family<UpstreamLabels, Gauge>,
    store_errors: Counter,
    reloads: Family<ReloadLabels, Counter>,
    load_failures: Counter,
    components_in_memory: Gauge,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Default for Metrics {
    fn default() -> Metrics {
        let mut registry = Registry::with_prefix("obol");
        let r = &mut registry;
        let requests = registered(
            r,
            "requests",
            "JSON-RPC requests (not notifications) by method (unrecognised methods: unknown)",
            Family::default(),
        );
        let tool_calls = registered(
            r,
            "tool_calls",
            "Tool calls that passed the transport, session and header checks, by connection, tool and outcome",
            Family::default(),
        );
        let attempts = registered(
            r,
            "attempts",
            "Attempts that may have reached a vendor or upstream (not those provably unsent)",
            Family::default(),
        );
        let phases = registered(
            r,
            "phase_seconds",
            "Time spent in each lifecycle phase of a tool call",
            Family::new_with_constructor(phase_histogram as fn() -> Histogram),
        );
        let claims = registered(
            r,
            "claims_found",
            "Tool calls answered with a replay, idempotency_conflict or not_ready",
            Family::default(),
        );
        let approvals = registered(
            r,
            "approvals",
            "Calls answered approval_required (held), and the owners' decisions",
            Family::default(),
        );
        let guest_faults = registered(
            r,
            "guest_faults",
            "Component calls that failed: deadline, memory, trap, busy (no free slot)",
            Family::default(),
        );
        let upstream_up = registered(
            r,
            "upstream_up",
            "Whether each MCP upstream answers (1) or is down (0)",
            Family::default(),
        );
        let store_errors = registered(
            r,
            "store_errors",
            "Tool calls answered store_unavailable, and outcomes left to record later",
            Counter::default(),
        );
        let reloads = registered(
            r,
            "catalog_reloads",
            "Reloads of the watched connector directory, by whether the catalog changed",
            Family::default(),
        );
        let load_failures = registered(
            r,
            "component_load_failures",
            "Problems met by each reload (a refused component, an unreadable directory); a component that stays broken counts on every reload",
            Counter::default(),
        );
        let components_in_memory = registered(
            r,
            "components_in_memory",
            "Compiled component versions held in memory: the ones served, and replaced ones until their last call ends",
            Gauge::default(),
        );
        Metrics {
            components_in_memory,
            registry,
            requests,
            tool_calls,
            attempts,
            phases,
            claims,
            approvals,
            guest_faults,
            upstream_up,
            store_errors,
            reloads,
            load_failures,
        }
    }
}

/// 100 µs to ~6.5 s, doubling.
fn phase_histogram() -> Histogram {
    Histogram::new(exponential_buckets(1e-4, 2.0, 17))
}

/// Registers `metric` and hands back the handle that updates it.
fn registered<M: Metric + Clone>(registry: &mut Registry, name: &str, help: &str, metric: M) -> M {
    registry.register(name, help, metric.clone());
    metric
}

impl Metrics {
    pub fn request(&self, method: &str) {
        self.requests
            .get_or_create(&MethodLabels {
                method: RpcMethod::of(method),
            })
            .inc();
    }

    /// One answered tool call. `name` is the tool the client named; only a name the
    /// catalog routes in `workspace` becomes a label.
    pub fn tool_call(
        &self,
        catalog: &Catalog,
        workspace: &str,
        name: Option<&str>,
        result: Result<ResultSource, &ObolError>,
    ) -> CallLabels {
        let (connection, tool) = name
            .and_then(|name| catalog.route(workspace, name))
            .map_or_else(
                || ("unknown".to_owned(), "unknown".to_owned()),
                |route| (route.connection.id.clone(), route.name.as_str().to_owned()),
            );
        let outcome = match result {
            Ok(source) => {
                let class = match source {
                    ResultSource::Recorded(class) => class,
                    ResultSource::Replayed(class) => {
                        self.found(Found::replayed);
                        class
                    }
                    ResultSource::Gateway => return self.count(connection, tool, "result"),
                };
                match class {
                    OutcomeClass::Accepted => "accepted",
                    OutcomeClass::DefinitelyRejected => "definitely_rejected",
                    OutcomeClass::Unknown => "unknown",
                }
            }
            Err(error) => {
                match error {
                    ObolError::IdempotencyConflict => self.found(Found::conflict),
                    ObolError::NotReady => self.found(Found::not_ready),
                    ObolError::ApprovalRequired(_) => self.approval(ApprovalState::held),
                    ObolError::ApprovalExpired => self.approval(ApprovalState::expired),
                    ObolError::StoreUnavailable => self.store_error(),
                    _ => {}
                }
                error.wire().kind.unwrap_or("error")
            }
        };
        self.count(connection, tool, outcome)
    }

    fn count(&self, connection: String, tool: String, outcome: &'static str) -> CallLabels {
        let labels = CallLabels {
            connection,
            tool,
            outcome,
        };
        self.tool_calls.get_or_create(&labels).inc();
        labels
    }

    pub fn attempt(&self, connection: &str) {
        self.attempts
            .get_or_create(&ConnectionLabels {
                connection: connection.to_owned(),
            })
            .inc();
    }

    pub fn phase(&self, phase: Phase, took: Duration) {
        self.phases
            .get_or_create(&PhaseLabels { phase })
            .observe(took.as_secs_f64());
    }

    fn found(&self, found: Found) {
        self.claims.get_or_create(&FoundLabels { found }).inc();
    }

    pub fn approval(&self, state: ApprovalState) {
        self.approvals
            .get_or_create(&ApprovalLabels { state })
            .inc();
    }

    pub fn guest_fault(&self, connection: &str, failure: &GuestFailure) {
        let fault = match failure {
            GuestFailure::Deadline(_) => Fault::deadline,
            GuestFailure::Memory(_) => Fault::memory,
            GuestFailure::Trap(_) => Fault::trap,
            GuestFailure::Busy(_) => Fault::busy,
        };
        self.guest_faults
            .get_or_create(&FaultLabels {
                connection: connection.to_owned(),
                fault,
            })
            .inc();
    }

    pub fn store_error(&self) {
        self.store_errors.inc();
    }

    pub fn reload(&self, result: Reload, problems: usize) {
        self.reloads.get_or_create(&ReloadLabels { result }).inc();
        self.load_failures.inc_by(problems as u64);
    }

    /// The text a scrape gets, with each upstream's health read now.
    pub fn render(
        &self,
        upstreams: &[(Arc<str>, Arc<str>, bool)],
        components_in_memory: usize,
    ) -> String {
        self.components_in_memory
            .set(i64::try_from(components_in_memory).unwrap_or(i64::MAX));
        // A connection removed since the last scrape leaves no series behind.
        self.upstream_up.clear();
        for (workspace, connection, up) in upstreams {
            self.upstream_up
                .get_or_create(&UpstreamLabels {
                    workspace: workspace.to_string(),
                    connection: connection.to_string(),
                })
                .set(i64::from(*up));
        }
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &self.registry)
            .expect("writing to a String cannot fail");
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn approvals_are_counted_by_state_and_expiry_too() {
        let metrics = Metrics::default();
        let catalog = crate::catalog::Catalog::default();
        metrics.tool_call(&catalog, "acme", None, Err(&ObolError::ApprovalExpired));
        metrics.tool_call(&catalog, "acme", None, Err(&ObolError::ApprovalExpired));
        metrics.approval(ApprovalState::approved);
        let text = metrics.render(&[], 0);
        assert!(
            text.contains(r#"obol_approvals_total{state="expired"} 2"#),
            "{text}"
        );
        assert!(
            text.contains(r#"obol_approvals_total{state="approved"} 1"#),
            "{text}"
        );
    }

    #[test]
    fn a_method_outside_the_allowlist_is_unknown() {
        let metrics = Metrics::default();
        metrics.request("tools/call");
        metrics.request("tools/call");
        metrics.request("x-secret-method-sk_live_123");
        metrics.request("TOOLS/CALL");
        let text = metrics.render(&[], 0);
        assert!(
            text.contains(r#"obol_requests_total{method="tools/call"} 2"#),
            "{text}"
        );
        assert!(
            text.contains(r#"obol_requests_total{method="unknown"} 2"#),
            "{text}"
        );
        assert!(!text.contains("secret"), "{text}");
        assert!(!text.contains("TOOLS"), "{text}");
    }

    #[test]
    fn every_allowlisted_method_reads_back_as_itself() {
        for method in RpcMethod::ALL {
            assert_eq!(RpcMethod::of(method.as_str()), method);
        }
    }
}
