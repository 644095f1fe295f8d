//! Authorize: the verdict becomes what this call may do — go ahead, or wait for a human — and
//! an approval token is bound to the call it approves.

use super::Answer;
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
    pub admission: Admission,
    /// Who is calling, under which decision: recorded with the claim.
    pub holder: Holder,
    /// The redacted arguments an approver sees (empty unless approval is required).
    pub summary: Vec<String>,
}

impl Routed {
    pub fn authorize(self) -> Result<Authorized, Answer> {
        match self.admission() {
            Ok((admission, approval)) => Ok(self.authorized(admission, approval)),
            Err(error) => Err(self.parsed.refuse(error)),
        }
    }

    fn admission(&self) -> Result<(Admission, ApprovalBasis), ObolError> {
        let tool = self.route.tool();
        let arguments = serde_json::Value::Object(self.parsed.arguments.clone());
        // Arguments are checked by the host against the declared schema, so a component only
        // ever sees arguments its own schema admits.
        let violations = tool.input_schema.violations(&arguments);
        if !violations.is_empty() {
            return Err(ObolError::InvalidArguments(violations.join("; ")));
        }
        // A token approves one call: its tool, under the key it was held with. A different key
        // is denied rather than reconciled (spec/idempotency.md, "Approval binds the key").
        if let Some(grant) = &self.parsed.grant {
            if grant.tool != self.route.name.as_str() {
                return Err(ObolError::ApprovalMismatch(
                    "the token approves another tool",
                ));
            }
            if grant.idempotency_key != self.parsed.idempotency_key {
                return Err(ObolError::ApprovalMismatch(
                    "the Idempotency-Key differs from the approved call's",
                ));
            }
        }
        Ok(match self.verdict.approval {
            ApprovalRule::Required => (Admission::NeedsApproval, ApprovalBasis::Required),
            ApprovalRule::Waived => (Admission::Proceed, ApprovalBasis::Waived),
            ApprovalRule::NotRequired => (Admission::Proceed, ApprovalBasis::NotRequired),
        })
    }

    fn authorized(self, admission: Admission, approval: ApprovalBasis) -> Authorized {
        let tool = self.route.tool();
        let summary = match admission {
            Admission::NeedsApproval => {
                approvals::summarize(&serde_json::Value::Object(self.parsed.arguments.clone()))
            }
            Admission::Proceed => Vec::new(),
        };
        let holder = Holder {
            workspace: self.caller.workspace.clone(),
            connection: self.route.connection.id.clone(),
            tool: self.route.name.as_str().to_owned(),
            idempotency_key: self.parsed.idempotency_key.to_string(),
            key_hash: self.caller.hash.to_string(),
            key_name: self.caller.name.clone(),
            publication: self.verdict.publication,
            policies: self.verdict.policies.clone(),
            approval,
            route: tool.effect.route,
            evidence: match tool.effect.route {
                // The gateway read the upstream MCP server's answer itself.
                RouteKind::Native | RouteKind::Mcp => EvidenceClass::GatewayObserved,
                RouteKind::Federated => EvidenceClass::Untrusted,
            },
        };
        Authorized {
            routed: self,
            admission,
            holder,
            summary,
        }
    }
}
