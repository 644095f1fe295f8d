//! What `obol-harness` and `obol harness` say to each other (ADR-0056).
//!
//! The harness starts `obol harness --protocol 1 COMPONENT.wasm`; the gateway loads the
//! component with its own loader and answers one line: [`Reply::Loaded`], [`Reply::Refused`],
//! or [`Reply::Unsupported`] (every later protocol keeps these three). After that each line the harness writes is one [`Request`] and each
//! line the gateway writes back is its [`Reply`]: JSON, one object per line, in order. The
//! gateway exits when its input closes.
//!
//! The shapes mirror the WIT contract's records (`wit/since_v0.2.0`), so a test reads what
//! the gateway would read from the component.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The protocol this crate speaks; `obol harness` refuses any other.
pub const VERSION: u32 = 1;

/// One call into the loaded component.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Request {
    /// The gateway's input-schema check, then the component's `prepare`.
    Prepare {
        tool: String,
        arguments: Value,
        base_url: String,
        settings: Vec<(String, String)>,
    },
    /// The component's `interpret` of a vendor answer, then the gateway's checks of what it
    /// returned. The headers are read as an HTTP answer's and reach the component by the
    /// gateway's rule (the SDK's `VendorResponse` states it).
    Interpret {
        tool: String,
        status: u16,
        headers: Vec<Header>,
        body: Vec<u8>,
    },
    /// How the gateway classifies an answer: the tool's status classes, then its body rules.
    Classify {
        tool: String,
        status: u16,
        body: Vec<u8>,
    },
}

/// The gateway's answer to the start or to one [`Request`].
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Reply {
    /// The component compiled, linked, and its manifest passed the gateway's validation.
    Loaded(Manifest),
    /// The gateway would refuse to load the component; why, as `obol serve` says it.
    Refused(String),
    /// This obol speaks another protocol than the harness asked for.
    Unsupported {
        speaks: u32,
        asked: u32,
    },
    Prepared(Result<OutboundRequest, PrepareError>),
    Interpreted(Result<ToolOutput, InterpretError>),
    /// The gateway would refuse the output `interpret` returned, in every such call: over the
    /// output cap, structured output that is not JSON, or structured output that breaks the
    /// tool's own output schema (each failing field named). The output itself is not sent.
    OutputRefused(String),
    Classified(StatusClass),
    /// The component trapped, ran past its deadline or its memory limit.
    Failed(String),
    /// The request names nothing the component has (a tool), carries a header no HTTP
    /// answer could, or is not a request.
    Misused(String),
}

/// A manifest as the gateway validated it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Manifest {
    pub name: String,
    pub version: String,
    /// The WIT contract the component implements, e.g. `obol:connector@0.2.0`.
    pub contract: String,
    /// sha256 of the component's bytes, hex.
    pub sha256: String,
    pub tools: Vec<Tool>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Tool {
    /// The unprefixed name the component knows the tool by.
    pub upstream_name: String,
    pub description: String,
    pub input_schema: Value,
    pub effect: Effect,
}

/// Everything the gateway enforces on a tool's behalf.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Effect {
    pub route: RouteKind,
    /// The broker of a federated route.
    pub broker: Option<Broker>,
    pub destructive: bool,
    /// What the listing's `readOnlyHint` says: no effect the gateway has to guard.
    pub read_only: bool,
    /// Status ranges per class (`accepted`, `definitely_rejected`, `retryable`), e.g.
    /// `["200-299"]`; a status in none is `unknown`.
    pub statuses: BTreeMap<String, Vec<String>>,
    pub propagation: Propagation,
    pub output_schema: Option<Value>,
    /// Checked in order on accepted answers: `(pointer, equals, class)`.
    pub body_rules: Vec<(String, Value, StatusClass)>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RouteKind {
    Native,
    Federated,
    Mcp,
    Gateway,
    Capability,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Broker {
    Nango,
    Composio,
}

/// Whether and how the idempotency key reaches the vendor.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Propagation {
    None,
    Unsupported,
    Header(String),
    BodyField(String),
}

impl Propagation {
    /// The vendor deduplicates on the key it receives (a header or a body field).
    pub fn is_binding(&self) -> bool {
        matches!(self, Propagation::Header(_) | Propagation::BodyField(_))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StatusClass {
    Accepted,
    DefinitelyRejected,
    Retryable,
    Unknown,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Method {
    Get,
    Post,
    Put,
    Patch,
    Delete,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Header {
    pub name: String,
    pub value: String,
}

/// The request `prepare` built, for the gateway to send (it adds credentials and the key).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutboundRequest {
    pub method: Method,
    pub url: String,
    pub headers: Vec<Header>,
    pub body: Option<Vec<u8>>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PrepareError {
    /// The arguments do not describe a valid call (the gateway's input schema or the
    /// component said so); the message is shown to the agent.
    InvalidArguments(String),
    UnknownTool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum InterpretError {
    MalformedResponse(String),
    UnknownTool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Image {
    pub mime_type: String,
    pub data: Vec<u8>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Content {
    Text(String),
    Image(Image),
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolOutput {
    pub content: Vec<Content>,
    /// Structured output as JSON text, as the component returned it.
    pub structured: Option<String>,
}
