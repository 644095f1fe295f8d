//! The dispatch seam: the three operations the lifecycle asks of a connector kind.
//!
//! * `prepare` — once, before the claim: the request this call would send. Its non-secret
//!   facts (connection, connector version, method, origin, upstream tool) are pinned in the
//!   claim's fingerprint.
//! * `send` — once per reserved attempt: one request, whose outcome the host classifies.
//! * `render` — once, after the host classified the outcome: the MCP result.
//!
//! Retries, receipts and the final write live above the seam and are written once for every
//! kind; each kind's attempt is classified by the host's rules for that kind (a component's by
//! its declared status classes, an upstream's by ADR-0045's table) before anything renders.
//! The kinds are a WebAssembly [`component`] and a remote MCP [`upstream`]; being *federated*
//! (a broker in between) is a property of a component's route, not a kind.

pub mod component;
pub mod gateway;
pub mod upstream;

use std::sync::Arc;

use serde_json::Value;

use super::authorize::Authorized;
use super::{Answer, Services};
use crate::catalog::{Catalog, Route, ServedBy, StatusClass};
use crate::error::ObolError;
use crate::idempotency::RequestHash;
use crate::outbound::{AttemptOutcome, VendorReply};
use crate::policy::VirtualKey;
use crate::runtime::Warm;
use crate::store::{ClaimKey, ConnectionSegment, Pin};

/// A request ready to be sent, one variant per connector kind.
#[derive(Debug, Clone)]
pub enum Request {
    Component(component::Request),
    Upstream(upstream::Request),
    Gateway(gateway::Request),
}

/// One attempt, classified by the host.
#[derive(Debug)]
pub enum Outcome {
    /// Provably nothing reached the vendor or upstream.
    NotSent,
    /// The request may have arrived; no answer was read.
    SentNoReply,
    /// The answer was larger than the cap.
    TooLarge {
        class: StatusClass,
    },
    Replied {
        reply: Reply,
        class: StatusClass,
    },
}

impl Outcome {
    /// What the attempt says of its connection's health: it could not be reached, did not
    /// answer, or answered retryable; or it answered. The gateway's own answers say nothing.
    pub fn signal(&self) -> Option<crate::capability::breaker::Signal> {
        use crate::capability::breaker::Signal;
        Some(match self {
            Outcome::Replied {
                reply: Reply::Gateway(_),
                ..
            } => return None,
            Outcome::NotSent | Outcome::SentNoReply => Signal::Failed,
            Outcome::Replied {
                class: StatusClass::Retryable,
                ..
            } => Signal::Failed,
            Outcome::Replied { .. } | Outcome::TooLarge { .. } => Signal::Answered,
        })
    }
}

/// What came back, for the kind that renders it.
#[derive(Debug)]
pub enum Reply {
    Vendor(VendorReply),
    Upstream(crate::upstream::session::Answer),
    /// The gateway's own answer (`search_tools`).
    Gateway(Value),
}

impl Reply {
    /// The HTTP status the receipt records, when there was one.
    pub fn status(&self) -> Option<u16> {
        match self {
            Reply::Vendor(reply) => Some(reply.status),
            Reply::Upstream(crate::upstream::session::Answer::Status(status)) => Some(*status),
            Reply::Upstream(_) | Reply::Gateway(_) => None,
        }
    }
}

/// A call that is authorized and prepared: everything its claim pins and its attempts send.
#[derive(Debug)]
pub struct Planned {
    pub authorized: Authorized,
    pub request: Request,
    pub pin: Pin,
    pub claim_key: ClaimKey,
    /// The instance a component's `prepare` ran in, when the runtime kept it for the call's
    /// `interpret` (ADR-0064). Dropped, with its pool slot, when the call ends another way.
    pub warm: Option<Warm>,
}

impl Planned {
    pub fn route(&self) -> &Arc<Route> {
        &self.authorized.routed.route
    }

    pub fn identity(&self) -> super::ClaimIdentity {
        super::ClaimIdentity {
            key: self.claim_key.key.clone(),
            receipt_id: None,
        }
    }
}

/// Prepares the request and pins what it would do. Nothing is written and nothing is sent,
/// so every failure here leaves no trace but the error.
pub async fn prepare(
    services: &Services,
    catalog: &Catalog,
    key: &VirtualKey,
    authorized: Authorized,
) -> Result<Box<Planned>, Answer> {
    match plan(services, catalog, key, &authorized).await {
        // Boxed once here: every later phase moves it on, as a pointer instead of 1.6 KB.
        Ok((request, pin, claim_key, warm)) => Ok(Box::new(Planned {
            authorized,
            request,
            pin,
            claim_key,
            warm,
        })),
        Err(error) => Err(authorized.routed.parsed.refuse(error)),
    }
}

async fn plan(
    services: &Services,
    catalog: &Catalog,
    key: &VirtualKey,
    authorized: &Authorized,
) -> Result<(Request, Pin, ClaimKey, Option<Warm>), ObolError> {
    let routed = &authorized.routed;
    let route = &routed.route;
    let arguments = Value::Object(routed.parsed.arguments.clone());
    let idempotency_key = &routed.parsed.idempotency_key;
    let (request, destination, version, warm) = match &route.served_by {
        ServedBy::Component { connector, .. } => {
            let (request, facts, warm) =
                component::prepare(services, route, &arguments, idempotency_key).await?;
            let destination = [connector.manifest.name.as_str(), &facts].join(" ");
            let version = Some(connector.manifest.version.as_str());
            (Request::Component(request), destination, version, warm)
        }
        ServedBy::Upstream { id, .. } => {
            let (request, facts) =
                upstream::prepare(route, id, &routed.parsed.arguments, idempotency_key)?;
            (Request::Upstream(request), facts, None, None)
        }
        ServedBy::Gateway(_) => {
            let (request, facts) =
                gateway::prepare(services, catalog, key, route, &routed.parsed.arguments)?;
            (Request::Gateway(request), facts, None, None)
        }
        // Resolved to a provider before authorization; never sent as itself.
        ServedBy::Capability { .. } => return Err(ObolError::Internal),
    };
    let capability = authorized.capability.as_ref();
    // A capability call's slot is the capability's, whatever it resolved to (ADR-0044): the
    // client's arguments are its request hash, and the provider joins the destination.
    let (hashed, destination) = match capability {
        // The mapped arguments' hash too: an approval is for what the provider receives,
        // which a changed mapping would change.
        Some(resolution) => (
            Value::Object(resolution.arguments.clone()),
            format!(
                "{} {} mapped:{} {destination}",
                route.name,
                route.connection.id,
                RequestHash::of_arguments(&arguments)
            ),
        ),
        // The connection is part of the destination: an approval or a claim for one vendor
        // account can never be spent on another, even with the same origin.
        None => (
            arguments,
            [route.connection.id.as_str(), &destination].join(" "),
        ),
    };
    let pin = Pin::new(
        RequestHash::of_arguments(&hashed),
        crate::store::PinnedBinding::from(&route.tool().effect.propagation),
        destination,
    );
    let pin = match version {
        Some(version) => pin.prepared_by(version),
        None => pin,
    };
    // An approval for one destination or one set of arguments cannot be spent on another.
    if let Some(grant) = &routed.parsed.grant
        && (grant.request_hash != pin.request_hash
            || crate::store::destination_of(&grant.destination) != pin.fingerprint)
    {
        return Err(ObolError::IdempotencyConflict);
    }
    let (connection, tool) = match (capability, &route.served_by) {
        (Some(resolution), _) => (
            ConnectionSegment::Capability,
            resolution.route.name.as_str(),
        ),
        (None, ServedBy::Gateway(_)) => (ConnectionSegment::Gateway, route.name.as_str()),
        (None, _) => (
            ConnectionSegment::Resolved(route.connection.id.clone()),
            route.name.as_str(),
        ),
    };
    let claim_key = ClaimKey {
        workspace: routed.caller.workspace.clone(),
        connection,
        tool: tool.to_owned(),
        key: idempotency_key.clone(),
    };
    Ok((request, pin, claim_key, warm))
}

/// Sends one attempt and classifies what the host saw.
pub async fn send(services: &Services, planned: &Planned) -> Outcome {
    match &planned.request {
        Request::Component(request) => {
            let statuses = &planned.route().tool().effect.statuses;
            match component::send(services, request).await {
                AttemptOutcome::NotSent => Outcome::NotSent,
                AttemptOutcome::SentNoReply => Outcome::SentNoReply,
                AttemptOutcome::TooLarge { status } => Outcome::TooLarge {
                    class: statuses.classify(status),
                },
                AttemptOutcome::Responded(reply) => {
                    let effect = &planned.route().tool().effect;
                    let by_status = statuses.classify(reply.status);
                    Outcome::Replied {
                        class: crate::catalog::classify_body(
                            &effect.body_rules,
                            by_status,
                            &reply.body,
                        ),
                        reply: Reply::Vendor(reply),
                    }
                }
            }
        }
        // Boxed: an MCP round trip's future is kilobytes large, and inline it made every
        // component call's future that large too (ADR-0061).
        Request::Upstream(request) => Box::pin(upstream::send(services, request)).await,
        Request::Gateway(request) => gateway::send(request),
    }
}

/// A federated call's broker record id, read by the host where the connection's broker
/// profile says it is (never from the component).
pub fn broker_record(route: &Route, reply: &Reply) -> Option<String> {
    let Reply::Vendor(reply) = reply else {
        return None;
    };
    if route.tool().effect.route != crate::catalog::RouteKind::Federated {
        return None;
    }
    let crate::config::ConnectionKind::Component {
        broker: Some(profile),
        ..
    } = &route.connection.kind
    else {
        return None;
    };
    let headers: Vec<(String, String)> = reply
        .headers
        .iter()
        .map(|h| (h.name.clone(), h.value.clone()))
        .collect();
    profile.record_id(&headers, &reply.body)
}

/// Renders the reply as the MCP result, after the host classified it.
pub async fn render(
    services: &Services,
    route: &Route,
    class: StatusClass,
    reply: Reply,
    warm: Option<Warm>,
) -> Result<CallResult, ObolError> {
    match reply {
        Reply::Vendor(reply) => component::render(services, route, class, reply, warm).await,
        Reply::Upstream(answer) => upstream::render(services, route, class, answer),
        Reply::Gateway(answer) => gateway::render(route, class, answer),
    }
}

/// A tool's `CallToolResult` as its connector kind rendered it, before the gateway's `_meta`.
/// Typed rather than built as a JSON object: it is written out once, with `_meta`, when the
/// call finishes (`finalize`), and a map built here would be filled, then walked and dropped.
#[derive(Debug)]
pub struct CallResult {
    content: Vec<Value>,
    is_error: bool,
    structured: Option<Value>,
}

impl CallResult {
    /// A result whose only content is the gateway's text about an answer that carried no
    /// result (an upstream's JSON-RPC error or bare HTTP status); whether the tool acted is
    /// the outcome class's to say.
    pub fn failed(text: String) -> CallResult {
        CallResult {
            content: vec![serde_json::json!({ "type": "text", "text": text })],
            is_error: true,
            structured: None,
        }
    }

    /// The result as the client is sent it, with `meta` as its `_meta`.
    pub fn written<M: serde::Serialize>(&self, meta: &M) -> crate::store::ResultJson {
        #[derive(serde::Serialize)]
        struct Written<'a, M> {
            content: &'a [Value],
            #[serde(rename = "isError")]
            is_error: bool,
            #[serde(rename = "structuredContent", skip_serializing_if = "Option::is_none")]
            structured: Option<&'a Value>,
            #[serde(rename = "_meta")]
            meta: &'a M,
        }
        crate::store::ResultJson::of(&Written {
            content: &self.content,
            is_error: self.is_error,
            structured: self.structured.as_ref(),
            meta,
        })
    }
}

/// The `CallToolResult` of a classified call: `isError` is the host's (anything but accepted),
/// and accepted structured output must match the tool's output schema. The schema describes a
/// successful result (an error's body is not expected to match), and a violation reveals
/// nothing of the response.
fn tool_result(
    route: &Route,
    class: StatusClass,
    content: Vec<Value>,
    structured: Option<Value>,
) -> Result<CallResult, ObolError> {
    if route
        .tool()
        .effect
        .output_fault(class, structured.as_ref())
        .is_some()
    {
        tracing::warn!(tool = %route.name, "structured output violates the tool's output schema");
        return Err(ObolError::OutputSchemaViolation);
    }
    if nests_too_deep(&content, structured.as_ref()) {
        tracing::warn!(tool = %route.name, "the result nests deeper than {MAX_RESULT_DEPTH} levels");
        return Err(ObolError::ResultTooDeep {
            limit: MAX_RESULT_DEPTH,
        });
    }
    Ok(CallResult {
        content,
        is_error: class != StatusClass::Accepted,
        structured,
    })
}

/// The deepest a tool's result may nest, the result object itself counting as one. The claim
/// record holds the result inside four levels of its own (the journal's entry wraps that in
/// three more), and serde_json reads at most 127 nested levels: a deeper result would be
/// answered once and then leave its record unreadable, so a retry under the same key could
/// neither replay it nor resend, and a journal holding it could not be read back after a
/// crash. The `_meta` added later sits beside the result's own fields, a few levels deep.
const MAX_RESULT_DEPTH: usize = 100;

/// Whether a result of `content` and `structured` would nest deeper than [`MAX_RESULT_DEPTH`]:
/// `structuredContent` sits one level inside the result, each content item two (in the
/// `content` array).
fn nests_too_deep(content: &[Value], structured: Option<&Value>) -> bool {
    content
        .iter()
        .any(|item| nests_deeper_than(item, MAX_RESULT_DEPTH - 2))
        || structured.is_some_and(|value| nests_deeper_than(value, MAX_RESULT_DEPTH - 1))
}

/// Whether `value` nests arrays and objects more than `limit` deep (a scalar is 0 deep).
fn nests_deeper_than(value: &Value, limit: usize) -> bool {
    // Only reached with limit > 0: `||` stops at a container when the limit is spent.
    let deeper = |child: &Value| nests_deeper_than(child, limit - 1);
    match value {
        Value::Array(items) => limit == 0 || items.iter().any(deeper),
        Value::Object(fields) => limit == 0 || fields.values().any(deeper),
        _ => false,
    }
}

/// Crash tests stop the gateway at a named point (`OBOL_FAILPOINTS`); only the `test-util`
/// build has failpoints.
async fn failpoint(name: &str) {
    #[cfg(feature = "test-util")]
    if crate::failpoint::active(name) {
        tracing::warn!("failpoint {name}: hanging");
        std::future::pending::<()>().await;
    }
    let _ = name;
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::{CallResult, MAX_RESULT_DEPTH, nests_deeper_than, nests_too_deep};

    #[test]
    fn depth_counts_arrays_and_objects_not_scalars() {
        assert!(!nests_deeper_than(&json!("deep"), 0));
        assert!(nests_deeper_than(&json!([]), 0));
        assert!(!nests_deeper_than(&json!([]), 1));
        let three = json!({"a": [1, {"b": null}], "c": 2});
        assert!(!nests_deeper_than(&three, 3));
        assert!(nests_deeper_than(&three, 2));
    }

    /// `depth` levels of arrays and objects, alternating, around a number.
    fn nested(depth: usize) -> Value {
        (0..depth).fold(json!(1), |inner, level| match level % 2 {
            0 => json!([inner]),
            _ => json!({ "a": inner }),
        })
    }

    /// The depth rule applied to a result's parts agrees with the same rule applied to the
    /// whole result as it is written out, at and around the limit, with one content item or
    /// several (only the last one deep) or none.
    #[test]
    fn a_results_parts_are_as_deep_as_the_result_they_make() {
        let contents = |depth: usize| {
            [
                vec![nested(depth)],
                vec![json!("text"), json!({ "type": "text" }), nested(depth)],
            ]
        };
        let mut cases = Vec::new();
        for content_depth in 94..=101 {
            for content in contents(content_depth).into_iter().chain([Vec::new()]) {
                for structured in (95..=102).map(|depth| Some(nested(depth))).chain([None]) {
                    cases.push((content.clone(), structured));
                }
            }
        }
        let mut refused = 0;
        for (content, structured) in cases {
            let result = CallResult {
                content,
                is_error: false,
                structured,
            };
            let whole: Value = serde_json::from_str(result.written(&json!({})).text()).unwrap();
            let too_deep = nests_too_deep(&result.content, result.structured.as_ref());
            assert_eq!(
                too_deep,
                nests_deeper_than(&whole, MAX_RESULT_DEPTH),
                "{result:?}"
            );
            refused += usize::from(too_deep);
        }
        assert!(refused > 0);
        assert!(!nests_too_deep(&[nested(98)], Some(&nested(99))));
        assert!(!nests_too_deep(&[], None));
        assert!(nests_too_deep(&[json!(1), nested(99)], None));
        assert!(nests_too_deep(&[], Some(&nested(100))));
    }

    /// A finished record's result is compared as text after a store read renders it again
    /// through a `Value` (a Redis reply lost in flight): written out from the typed result,
    /// it must read back as the same text.
    #[test]
    fn a_written_result_reads_back_as_the_same_text() {
        let result = CallResult {
            content: vec![json!({ "type": "text", "text": "2 charge(s)" })],
            is_error: false,
            structured: Some(
                json!({ "has_more": false, "data": [{ "id": "ch_1", "amount": 1.5 }] }),
            ),
        };
        let written = result.written(&json!({ "obol": { "replayed": false, "attempt_count": 1 } }));
        let stored = serde_json::to_string(&written).unwrap();
        let read: crate::store::ResultJson = serde_json::from_str(&stored).unwrap();
        assert_eq!(read, written, "{stored}");
    }

    #[test]
    fn a_result_is_written_with_its_meta_and_without_absent_structured_output() {
        let meta = json!({ "obol": { "replayed": false } });
        let failed: Value =
            serde_json::from_str(CallResult::failed("no".into()).written(&meta).text()).unwrap();
        assert_eq!(
            failed,
            json!({
                "content": [{ "type": "text", "text": "no" }],
                "isError": true,
                "_meta": { "obol": { "replayed": false } },
            })
        );
        let answered = CallResult {
            content: Vec::new(),
            is_error: false,
            structured: Some(json!({ "id": "ch_1" })),
        };
        let answered: Value = serde_json::from_str(answered.written(&meta).text()).unwrap();
        assert_eq!(answered["structuredContent"], json!({ "id": "ch_1" }));
        assert_eq!(answered["isError"], json!(false));
    }
}
