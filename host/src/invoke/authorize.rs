//! Authorize: the verdict becomes what this call may do — go ahead, or wait for a human — and
//! an approval token is bound to the call it approves. A capability call is authorized as the
//! provider it resolved to (its schema, its destructiveness, its approval rule), and only
//! after Cedar allowed the capability itself (its route's verdict).

use super::Answer;
use super::resolve::{Resolution, Resolved};
use super::route::Routed;
use crate::approvals;
use crate::catalog::RouteKind;
use crate::error::ObolError;
use crate::policy::ApprovalRule;
use crate::store::{ApprovalBasis, EvidenceClass, Holder};

/// What policy lets this call do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// It may be sent without a human.
    Proceed,
    /// It must be held for the workspace owner, unless it carries an approval for this slot.
    NeedsApproval,
}

/// A call policy admitted, with the facts its claim will pin.
#[derive(Debug)]
pub struct Authorized {
    pub routed: Routed,
    /// How a capability call resolved (`routed` is then its provider's call).
    pub capability: Option<Resolution>,
    pub admission: Admission,
    /// Who is calling, under which decision: recorded with the claim.
    pub holder: Holder,
    /// The redacted arguments an approver sees (empty unless approval is required).
    pub summary: Vec<String>,
}

impl Resolved {
    pub fn authorize(self) -> Result<Authorized, Answer> {
        match self.admission() {
            Ok((admission, approval)) => Ok(self.authorized(admission, approval)),
            Err(error) => Err(self.routed.parsed.refuse(error)),
        }
    }

    fn admission(&self) -> Result<(Admission, ApprovalBasis), ObolError> {
        let Resolved { routed, .. } = self;
        let tool = routed.route.tool();
        let arguments = serde_json::Value::Object(routed.parsed.arguments.clone());
        // Arguments are checked by the host against the declared schema, so a component only
        // ever sees arguments its own schema admits.
        let violations = tool.input_schema.violations(&arguments);
        if !violations.is_empty() {
            return Err(ObolError::InvalidArguments(violations.join("; ")));
        }
        // A token approves one call: its tool, under the key it was held with. A different key
        // is denied rather than reconciled (spec/idempotency.md, "Approval binds the key").
        if let Some(grant) = &routed.parsed.grant {
            if grant.tool != self.called() {
                return Err(ObolError::ApprovalMismatch(
                    "the token approves another tool",
                ));
            }
            if grant.idempotency_key != routed.parsed.idempotency_key {
                return Err(ObolError::ApprovalMismatch(
                    "the Idempotency-Key differs from the approved call's",
                ));
            }
        }
        Ok(match routed.verdict.approval {
            ApprovalRule::Required => (Admission::NeedsApproval, ApprovalBasis::Required),
            ApprovalRule::Waived => (Admission::Proceed, ApprovalBasis::Waived),
            ApprovalRule::NotRequired => (Admission::Proceed, ApprovalBasis::NotRequired),
        })
    }

    fn authorized(self, admission: Admission, approval: ApprovalBasis) -> Authorized {
        let called = self.called().to_owned();
        let Resolved { routed, capability } = self;
        let tool = routed.route.tool();
        let summary = match admission {
            Admission::NeedsApproval => {
                approvals::summarize(&serde_json::Value::Object(routed.parsed.arguments.clone()))
            }
            Admission::Proceed => Vec::new(),
        };
        // Both decisions are the call's: the capability's policies, then the provider's.
        let policies = capability
            .iter()
            .flat_map(|c| c.verdict.policies.iter())
            .chain(&routed.verdict.policies)
            .cloned()
            .collect();
        let holder = Holder {
            workspace: routed.caller.workspace.clone(),
            connection: routed.route.connection.id.clone(),
            tool: called,
            idempotency_key: routed.parsed.idempotency_key.to_string(),
            key_hash: routed.caller.hash.to_string(),
            key_name: routed.caller.name.clone(),
            publication: routed.verdict.publication,
            policies,
            approval,
            route: tool.effect.route,
            evidence: match tool.effect.route {
                // The gateway read the upstream MCP server's answer itself, or made it.
                // (A capability is never the route a call is sent on: it resolved first.)
                RouteKind::Native | RouteKind::Mcp | RouteKind::Gateway | RouteKind::Capability => {
                    EvidenceClass::GatewayObserved
                }
                RouteKind::Federated => EvidenceClass::Untrusted,
            },
            capability: capability.as_ref().map(|c| c.decision.clone()),
            trace_id: routed
                .parsed
                .trace_id
                .as_ref()
                .map(|t| t.as_str().to_owned()),
        };
        Authorized {
            routed,
            capability,
            admission,
            holder,
            summary,
        }
    }
}
