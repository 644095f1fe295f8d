//! Parse: the call's name, arguments and effective idempotency key, checked before anything
//! else looks at them.

use serde_json::{Map, Value};

use super::{Answer, CallRequest, ClaimIdentity};
use crate::approvals::ApprovalGrant;
use crate::error::ObolError;
use crate::idempotency::IdempotencyKey;
use crate::policy::ToolsMode;
use crate::progressive;
use crate::store::KeySource;

/// A well-formed `tools/call`.
#[derive(Debug)]
pub struct Parsed {
    pub name: String,
    pub arguments: Map<String, Value>,
    /// The key every answer names: the client's, else the approved call's, else a new one.
    pub idempotency_key: IdempotencyKey,
    /// Whether the client named the key or the gateway minted it (receipts say which).
    pub key_source: KeySource,
    pub grant: Option<ApprovalGrant>,
    pub trace_id: Option<crate::mcp::trace::TraceId>,
}

impl Parsed {
    pub fn identity(&self) -> ClaimIdentity {
        ClaimIdentity {
            key: self.idempotency_key.clone(),
            receipt_id: None,
        }
    }

    /// The answer for a call refused before its claim: the error, and the effective key.
    pub fn refuse(&self, error: ObolError) -> Answer {
        Answer::refused(error, Some(self.identity()))
    }
}

/// Reads the params. The effective key is decided first, so that even a refusal names it.
/// A progressive key's `call_tool(name, arguments)` is read as the plain call of `name`: from
/// here on nothing can tell the two apart, so both claim one slot and pass one policy.
pub fn parse(request: CallRequest, mode: ToolsMode) -> Result<Parsed, Answer> {
    let CallRequest {
        mut params,
        exactness,
        idempotency_key,
        approval,
        trace_id,
    } = request;
    let key_source = match &idempotency_key {
        Some(_) => KeySource::Supplied,
        None => KeySource::Minted,
    };
    let idempotency_key = idempotency_key
        .or_else(|| approval.as_ref().map(|g| g.idempotency_key.clone()))
        .unwrap_or_else(IdempotencyKey::mint);
    let identity = ClaimIdentity {
        key: idempotency_key.clone(),
        receipt_id: None,
    };
    let refuse = |error| Err(Answer::refused(error, Some(identity.clone())));
    let name = match params.remove("name") {
        Some(Value::String(name)) => name,
        // A name that is not a string cannot name a tool; answer as for any unknown tool.
        Some(_) => return refuse(ObolError::UnknownTool),
        None => return refuse(ObolError::InvalidParams("tools/call needs a name".into())),
    };
    let arguments = match params.remove("arguments") {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(arguments)) => arguments,
        Some(_) => {
            return refuse(ObolError::InvalidParams(
                "tools/call arguments must be an object".into(),
            ));
        }
    };
    let (name, arguments) = match (mode, name.as_str()) {
        (ToolsMode::Progressive, progressive::CALL_TOOL) => {
            match progressive::unwrap_call_tool(arguments) {
                Ok(inner) => inner,
                Err(error) => return refuse(error),
            }
        }
        _ => (name, arguments),
    };
    if let Err(inexact) = exactness {
        return refuse(ObolError::InvalidArguments(inexact.to_string()));
    }
    Ok(Parsed {
        name,
        arguments,
        idempotency_key,
        key_source,
        grant: approval,
        trace_id,
    })
}
