//! The dispatch seam: the three operations the lifecycle asks of a connector kind.
//!
//! * `prepare` — once, before the claim: the request this call would send. Its non-secret
//!   facts (connection, connector version, method, origin, upstream tool) are pinned in the
//!   claim's fingerprint.
//! * `send` — once per reserved attempt: one request, whose outcome the host classifies.
//! * `render` — once, after the host classified the outcome: the MCP result.
//!
//! Classification, retries, receipts and the final write live above the seam and are written
//! once for every kind. Today's kind is a WebAssembly [`component`]; being *federated* (a
//! broker in between) is a property of a route, not a kind.

pub mod component;

use std::sync::Arc;

use serde_json::Value;

use super::authorize::Authorized;
use super::{Answer, Services};
use crate::catalog::{Route, StatusClass};
use crate::error::ObolError;
use crate::idempotency::RequestHash;
use crate::outbound::{AttemptOutcome, VendorReply};
use crate::store::{ClaimKey, ConnectionSegment, Pin};

/// A request ready to be sent, one variant per connector kind.
#[derive(Debug, Clone)]
pub enum Request {
    Component(component::Request),
}

/// A call that is authorized and prepared: everything its claim pins and its attempts send.
#[derive(Debug)]
pub struct Planned {
    pub authorized: Authorized,
    pub request: Request,
    pub pin: Pin,
    pub claim_key: ClaimKey,
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
pub async fn prepare(services: &Services, authorized: Authorized) -> Result<Planned, Answer> {
    match plan(services, &authorized).await {
        Ok((request, pin, claim_key)) => Ok(Planned {
            authorized,
            request,
            pin,
            claim_key,
        }),
        Err(error) => Err(authorized.routed.parsed.refuse(error)),
    }
}

async fn plan(
    services: &Services,
    authorized: &Authorized,
) -> Result<(Request, Pin, ClaimKey), ObolError> {
    let routed = &authorized.routed;
    let route = &routed.route;
    let arguments = Value::Object(routed.parsed.arguments.clone());
    let key = &routed.parsed.idempotency_key;
    let (request, facts) = component::prepare(services, route, &arguments, key).await?;
    let pin = Pin::new(
        RequestHash::of_arguments(&arguments),
        route.tool().effect.propagation.pinned(),
        // The connection is part of the destination: an approval or a claim for one vendor
        // account can never be spent on another, even with the same origin.
        format!(
            "{} {}@{} {}",
            route.connection.id,
            route.connector.manifest.name,
            route.connector.manifest.version,
            facts
        ),
    );
    // An approval for one destination or one set of arguments cannot be spent on another.
    if let Some(grant) = &routed.parsed.grant
        && (grant.request_hash != pin.request_hash || grant.destination != pin.fingerprint)
    {
        return Err(ObolError::IdempotencyConflict);
    }
    let claim_key = ClaimKey {
        workspace: routed.caller.workspace.clone(),
        connection: ConnectionSegment::Resolved(route.connection.id.clone()),
        tool: route.name.as_str().to_owned(),
        key: key.clone(),
    };
    Ok((Request::Component(request), pin, claim_key))
}

/// Sends one attempt.
pub async fn send(services: &Services, request: &Request) -> AttemptOutcome {
    match request {
        Request::Component(request) => component::send(services, request).await,
    }
}

/// Renders the vendor's reply as the MCP result, after the host classified its status.
pub async fn render(
    services: &Services,
    route: &Route,
    class: StatusClass,
    reply: VendorReply,
) -> Result<Value, ObolError> {
    component::render(services, route, class, reply).await
}
