//! A component's manifest, checked once at load time.
//!
//! The raw manifest is whatever the guest returned. [`Manifest::validate`] turns it into values
//! that are valid by construction (a [`ConnectorName`] has no dot, a [`StatusClasses`] has no
//! overlap, every schema compiles), so nothing on the call path re-checks them.

use std::collections::HashSet;
use std::fmt;
use std::ops::RangeInclusive;
use std::sync::Arc;

use http::HeaderName;
use serde_json::Value;

use crate::wit;

/// Connector prefixes and tool names that belong to the gateway itself.
const RESERVED_PREFIXES: [&str; 1] = ["cap"];
const RESERVED_TOOLS: [&str; 3] = ["search_tools", "call_tool", "find_capability"];

/// Why a component was refused. Each variant names the offending item.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ManifestError {
    #[error("the connector name is empty")]
    EmptyName,
    #[error("connector name {0:?} contains a dot; the first dot separates connector and tool")]
    DottedName(String),
    #[error("connector name {0:?} is not a lowercase identifier ([a-z0-9_-], at most 64)")]
    InvalidName(String),
    #[error("connector name {0:?} is reserved for the gateway")]
    ReservedPrefix(String),
    #[error("tool name {0:?} is reserved for the gateway")]
    ReservedTool(String),
    #[error("a tool has an empty name")]
    EmptyToolName,
    #[error("tool {0:?} is declared twice")]
    DuplicateTool(String),
    #[error("tool {tool:?}: {which} is not a valid JSON Schema: {reason}")]
    InvalidSchema {
        tool: String,
        which: &'static str,
        reason: String,
    },
    #[error("tool {tool:?}: status {status} is both {first} and {second}")]
    OverlappingStatuses {
        tool: String,
        status: u16,
        first: &'static str,
        second: &'static str,
    },
    #[error("tool {tool:?}: status range {first}..={last} is empty or outside 100..=599")]
    InvalidStatusRange { tool: String, first: u16, last: u16 },
    #[error("tool {tool:?}: propagation {reason}")]
    InvalidPropagation { tool: String, reason: String },
    /// A broker builds the vendor request on a federated route, so the gateway cannot put
    /// its key anywhere; declaring otherwise would let the gateway resend on a promise no
    /// one keeps (spec/idempotency.md, "Propagating the key to the vendor").
    #[error(
        "tool {0:?} is federated: its propagation must be none (a broker, not the gateway, builds the vendor request)"
    )]
    FederatedPropagation(String),
    #[error("tool {tool:?}: body rule {index}: {reason}")]
    InvalidBodyRule {
        tool: String,
        index: usize,
        reason: String,
    },
}

/// A connector prefix: non-empty, no dot, lowercase identifier characters.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ConnectorName(Arc<str>);

impl ConnectorName {
    pub fn parse(name: &str) -> Result<ConnectorName, ManifestError> {
        if name.is_empty() {
            return Err(ManifestError::EmptyName);
        }
        if name.contains('.') {
            return Err(ManifestError::DottedName(name.to_owned()));
        }
        let valid_chars = name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-');
        if !valid_chars || name.len() > 64 {
            return Err(ManifestError::InvalidName(name.to_owned()));
        }
        if RESERVED_PREFIXES.contains(&name) || RESERVED_TOOLS.contains(&name) {
            return Err(ManifestError::ReservedPrefix(name.to_owned()));
        }
        Ok(ConnectorName(name.into()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for ConnectorName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RouteKind {
    #[default]
    Native,
    Federated,
    /// A tool of a remote MCP server (ADR-0045).
    Mcp,
    /// A tool the gateway answers itself from its catalog (`search_tools`).
    Gateway,
    /// A capability (`cap.NAME`), before it resolves to a provider.
    Capability,
}

impl RouteKind {
    /// As Cedar's `resource.route` and receipts name it.
    pub fn label(self) -> &'static str {
        match self {
            RouteKind::Native => "native",
            RouteKind::Federated => "federated",
            RouteKind::Mcp => "mcp",
            RouteKind::Gateway => "gateway",
            RouteKind::Capability => "capability",
        }
    }
}

/// The catalog broker a federated tool runs through. How its retries are turned off and where
/// its record of a call is read belong to the host (`config::BrokerProfile`), never the guest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Broker {
    Nango,
    Composio,
}

impl Broker {
    pub fn label(self) -> &'static str {
        match self {
            Broker::Nango => "nango",
            Broker::Composio => "composio",
        }
    }
}

/// Reclassifies an answer the status calls accepted, by a field of its JSON body.
#[derive(Debug, Clone)]
pub struct BodyRule {
    /// An RFC 6901 pointer into the body.
    pub pointer: String,
    pub equals: Value,
    pub class: StatusClass,
}

impl BodyRule {
    fn new(tool: &str, index: usize, raw: &wit::BodyRule) -> Result<BodyRule, ManifestError> {
        let invalid = |reason: String| ManifestError::InvalidBodyRule {
            tool: tool.to_owned(),
            index,
            reason,
        };
        let pointer = JsonPointer::parse(&raw.pointer).map_err(invalid)?;
        let equals = serde_json::from_str(&raw.equals)
            .map_err(|e| invalid(format!("equals is not JSON: {e}")))?;
        Ok(BodyRule {
            pointer: pointer.as_str().to_owned(),
            equals,
            class: match raw.class {
                wit::OutcomeClass::Accepted => StatusClass::Accepted,
                wit::OutcomeClass::DefinitelyRejected => StatusClass::DefinitelyRejected,
                wit::OutcomeClass::Retryable => StatusClass::Retryable,
                wit::OutcomeClass::Unknown => StatusClass::Unknown,
            },
        })
    }
}

/// Applies the body rules to an answer whose status is accepted: the first rule whose field
/// holds exactly its value decides. Declarative: the guest is not asked.
pub fn classify_body(rules: &[BodyRule], class: StatusClass, body: &[u8]) -> StatusClass {
    if class != StatusClass::Accepted || rules.is_empty() {
        return class;
    }
    let Ok(json) = serde_json::from_slice::<Value>(body) else {
        return class;
    };
    rules
        .iter()
        .find(|rule| json.pointer(&rule.pointer) == Some(&rule.equals))
        .map_or(class, |rule| rule.class)
}

/// How a vendor status is classified. Anything no class claims is `Unknown`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StatusClass {
    Accepted,
    DefinitelyRejected,
    Retryable,
    Unknown,
}

/// The three declared status classes, proven disjoint at load time.
#[derive(Debug, Clone)]
pub struct StatusClasses {
    accepted: Vec<RangeInclusive<u16>>,
    definitely_rejected: Vec<RangeInclusive<u16>>,
    retryable: Vec<RangeInclusive<u16>>,
}

impl StatusClasses {
    /// No HTTP status is final: for tools whose outcome is not read from a vendor status
    /// (an MCP upstream's are classified by ADR-0045's table instead).
    pub fn none() -> StatusClasses {
        StatusClasses {
            accepted: Vec::new(),
            definitely_rejected: Vec::new(),
            retryable: Vec::new(),
        }
    }

    /// Each class that names a status, with its ranges (`200-299`, `429`); a status none of
    /// them names is unknown.
    pub fn classes(&self) -> Vec<(&'static str, Vec<String>)> {
        [
            ("accepted", &self.accepted),
            ("definitely_rejected", &self.definitely_rejected),
            ("retryable", &self.retryable),
        ]
        .into_iter()
        .filter(|(_, list)| !list.is_empty())
        .map(|(name, list)| {
            let ranges = list
                .iter()
                .map(|r| match r.start() == r.end() {
                    true => r.start().to_string(),
                    false => format!("{}-{}", r.start(), r.end()),
                })
                .collect();
            (name, ranges)
        })
        .collect()
    }

    fn new(tool: &str, spec: &wit::EffectSpec) -> Result<StatusClasses, ManifestError> {
        let ranges = |list: &[wit::StatusRange]| {
            list.iter()
                .map(|r| {
                    if r.first > r.last || r.first < 100 || r.last > 599 {
                        Err(ManifestError::InvalidStatusRange {
                            tool: tool.to_owned(),
                            first: r.first,
                            last: r.last,
                        })
                    } else {
                        Ok(r.first..=r.last)
                    }
                })
                .collect::<Result<Vec<_>, _>>()
        };
        let classes = StatusClasses {
            accepted: ranges(&spec.accepted)?,
            definitely_rejected: ranges(&spec.definitely_rejected)?,
            retryable: ranges(&spec.retryable)?,
        };
        for status in 100..=599u16 {
            let claims: Vec<&'static str> = [
                ("accepted", &classes.accepted),
                ("definitely_rejected", &classes.definitely_rejected),
                ("retryable", &classes.retryable),
            ]
            .into_iter()
            .filter(|(_, class)| class.iter().any(|r| r.contains(&status)))
            .map(|(name, _)| name)
            .collect();
            if let [first, second, ..] = claims[..] {
                return Err(ManifestError::OverlappingStatuses {
                    tool: tool.to_owned(),
                    status,
                    first,
                    second,
                });
            }
        }
        Ok(classes)
    }

    /// Classifies a vendor status. Declarative: the guest's opinion of the response is not
    /// consulted, and a status no class names is `Unknown`, never success.
    pub fn classify(&self, status: u16) -> StatusClass {
        let within = |class: &[RangeInclusive<u16>]| class.iter().any(|r| r.contains(&status));
        if within(&self.accepted) {
            StatusClass::Accepted
        } else if within(&self.definitely_rejected) {
            StatusClass::DefinitelyRejected
        } else if within(&self.retryable) {
            StatusClass::Retryable
        } else {
            StatusClass::Unknown
        }
    }
}

/// A JSON Pointer (RFC 6901) naming where the key goes in a JSON request body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JsonPointer(String);

impl JsonPointer {
    pub fn parse(text: &str) -> Result<JsonPointer, String> {
        if !text.starts_with('/') || text.len() < 2 {
            return Err(format!(
                "body field {text:?} is not a JSON Pointer like \"/idempotency_key\""
            ));
        }
        Ok(JsonPointer(text.to_owned()))
    }

    /// Sets the field, creating intermediate objects. Fails when the body is not a JSON object
    /// along the path.
    pub fn set(&self, body: &mut Value, value: Value) -> Result<(), String> {
        let segments = self.segments();
        let (last, parents) = segments.split_last().expect("a pointer has a segment");
        let mut node = body;
        for segment in parents {
            let object = node
                .as_object_mut()
                .ok_or_else(|| format!("request body at {segment:?} is not an object"))?;
            node = object
                .entry(segment.clone())
                .or_insert_with(|| Value::Object(Default::default()));
        }
        let object = node
            .as_object_mut()
            .ok_or("request body is not a JSON object")?;
        object.insert(last.clone(), value);
        Ok(())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The reference tokens, unescaped (`~1` is `/`, `~0` is `~`).
    pub fn segments(&self) -> Vec<String> {
        self.0[1..]
            .split('/')
            .map(|s| s.replace("~1", "/").replace("~0", "~"))
            .collect()
    }

    /// The value the pointer names in `value`, if there is one.
    pub fn get<'v>(&self, value: &'v Value) -> Option<&'v Value> {
        value.pointer(&self.0)
    }
}

/// Headers only the host may set. A guest that sets one is refused, not silently corrected:
/// it is either buggy or trying to smuggle something past the gateway.
pub const HOST_OWNED_HEADERS: [&str; 9] = [
    "authorization",
    "proxy-authorization",
    "cookie",
    "host",
    "content-length",
    "transfer-encoding",
    "connection",
    "upgrade",
    "x-obol-upstream-authorization",
];

/// Whether and how the idempotency key reaches the vendor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Propagation {
    None,
    /// The vendor cannot deduplicate; a write through this tool may repeat at the vendor.
    Unsupported,
    Header(HeaderName),
    BodyField(JsonPointer),
}

impl Propagation {
    fn new(tool: &str, raw: &wit::Propagation) -> Result<Propagation, ManifestError> {
        let invalid = |reason: String| ManifestError::InvalidPropagation {
            tool: tool.to_owned(),
            reason,
        };
        Ok(match raw {
            wit::Propagation::None => Propagation::None,
            wit::Propagation::Unsupported => Propagation::Unsupported,
            wit::Propagation::Header(name) => {
                let header = HeaderName::from_bytes(name.as_bytes())
                    .map_err(|_| invalid(format!("header {name:?} is not a valid header name")))?;
                if HOST_OWNED_HEADERS.contains(&header.as_str()) {
                    return Err(invalid(format!(
                        "header {name:?} belongs to the gateway and cannot carry the key"
                    )));
                }
                Propagation::Header(header)
            }
            wit::Propagation::BodyField(pointer) => {
                Propagation::BodyField(JsonPointer::parse(pointer).map_err(invalid)?)
            }
        })
    }

    /// A header or body-field propagation is a vendor idempotency binding: the vendor
    /// deduplicates on the key it receives.
    pub fn is_binding(&self) -> bool {
        matches!(self, Propagation::Header(_) | Propagation::BodyField(_))
    }

    pub fn label(&self) -> &'static str {
        match self {
            Propagation::None => "none",
            Propagation::Unsupported => "unsupported",
            Propagation::Header(_) => "header",
            Propagation::BodyField(_) => "body_field",
        }
    }
}

/// A compiled JSON Schema with its source kept for listing.
#[derive(Clone)]
pub struct Schema {
    pub source: Value,
    validator: jsonschema::Validator,
}

impl fmt::Debug for Schema {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Schema")
            .field("source", &self.source)
            .finish()
    }
}

impl Schema {
    fn compile(tool: &str, which: &'static str, text: &str) -> Result<Schema, ManifestError> {
        let invalid = |reason: String| ManifestError::InvalidSchema {
            tool: tool.to_owned(),
            which,
            reason,
        };
        let source: Value =
            serde_json::from_str(text).map_err(|e| invalid(format!("not JSON: {e}")))?;
        Schema::from_value(tool, which, source)
    }

    /// Compiles a schema already parsed (an upstream's, from its `tools/list`).
    pub fn from_value(
        tool: &str,
        which: &'static str,
        source: Value,
    ) -> Result<Schema, ManifestError> {
        let invalid = |reason: String| ManifestError::InvalidSchema {
            tool: tool.to_owned(),
            which,
            reason,
        };
        if !source.is_object() {
            return Err(invalid("a schema must be a JSON object".into()));
        }
        let validator = jsonschema::validator_for(&source).map_err(|e| invalid(e.to_string()))?;
        Ok(Schema { source, validator })
    }

    pub fn is_valid(&self, instance: &Value) -> bool {
        self.validator.is_valid(instance)
    }

    /// Up to three violations, each naming where and which rule of the schema, for the agent
    /// that sent the value. Never the value itself: arguments can be secrets, and an 8 MiB
    /// argument must not come back as an 8 MiB error. Names from the request (a path, an
    /// unexpected property) are cut to 64 characters.
    pub fn violations(&self, instance: &Value) -> Vec<String> {
        self.violations_in(instance, "the arguments")
    }

    /// [`Schema::violations`], calling the instance as a whole `whole`.
    pub fn violations_in(&self, instance: &Value, whole: &str) -> Vec<String> {
        use jsonschema::error::ValidationErrorKind as Kind;
        self.validator
            .iter_errors(instance)
            .take(3)
            .map(|e| {
                let at = e.instance_path().to_string();
                let at = if at.is_empty() {
                    whole.to_owned()
                } else {
                    bounded(&at)
                };
                let rule = match e.kind() {
                    Kind::Required { property } => format!(
                        "lack the required property `{}`",
                        bounded(property.as_str().unwrap_or_default())
                    ),
                    Kind::AdditionalProperties { unexpected } => format!(
                        "have properties the schema does not allow: {}",
                        unexpected
                            .iter()
                            .take(5)
                            .map(|name| format!("`{}`", bounded(name)))
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                    kind => format!(
                        "break the schema's `{}` rule at {}",
                        kind.keyword(),
                        e.schema_path()
                    ),
                };
                format!("{at}: {rule}")
            })
            .collect()
    }
}

/// A name taken from a request, cut to 64 characters for an error message.
fn bounded(name: &str) -> String {
    const MAX: usize = 64;
    match name.char_indices().nth(MAX) {
        Some((at, _)) => format!("{}…", &name[..at]),
        None => name.to_owned(),
    }
}

/// Everything the host enforces on a tool's behalf.
#[derive(Debug)]
pub struct EffectSpec {
    pub route: RouteKind,
    /// The broker of a federated route (`None` on every other route).
    pub broker: Option<Broker>,
    pub destructive: bool,
    pub statuses: StatusClasses,
    pub propagation: Propagation,
    pub output_schema: Option<Schema>,
    /// Checked, in order, on answers whose status is accepted.
    pub body_rules: Vec<BodyRule>,
}

impl EffectSpec {
    /// Whether the tool has no effect: the gateway sends the request itself (native), there
    /// is nothing for the vendor to deduplicate (propagation `none`), and it is not
    /// destructive. A federated tool's propagation is `none` because the broker builds the
    /// request, so it may still write.
    pub fn read_only(&self) -> bool {
        self.route == RouteKind::Native
            && self.propagation == Propagation::None
            && !self.destructive
    }

    /// Why the gateway refuses an answer's structured output, if it does: a tool with an
    /// output schema must return structured output matching it on every accepted answer. The
    /// schema describes a successful result, so an answer of any other class passes.
    pub fn output_fault(
        &self,
        class: StatusClass,
        structured: Option<&Value>,
    ) -> Option<OutputFault> {
        let schema = self.output_schema.as_ref()?;
        if class != StatusClass::Accepted {
            return None;
        }
        match structured {
            None => Some(OutputFault::Missing),
            Some(value) if schema.is_valid(value) => None,
            Some(value) => Some(OutputFault::Broken(
                schema.violations_in(value, "the output"),
            )),
        }
    }
}

/// How structured output breaks its tool's output schema: the connector's mistake, not the
/// vendor's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OutputFault {
    #[error("an accepted answer has no structured output, but the tool declares an output schema")]
    Missing,
    #[error("the connector's structured output breaks its own output schema: {}", .0.join("; "))]
    Broken(Vec<String>),
}

#[derive(Debug)]
pub struct ToolSpec {
    /// The unprefixed name the component knows the tool by.
    pub upstream_name: String,
    pub description: String,
    pub input_schema: Schema,
    pub effect: EffectSpec,
}

#[derive(Debug)]
pub struct Manifest {
    pub name: ConnectorName,
    pub version: String,
    pub tools: Vec<ToolSpec>,
}

impl Manifest {
    pub fn validate(raw: wit::Manifest) -> Result<Manifest, ManifestError> {
        let name = ConnectorName::parse(&raw.name)?;
        let mut seen = HashSet::new();
        let mut tools = Vec::with_capacity(raw.tools.len());
        for tool in raw.tools {
            if tool.name.is_empty() {
                return Err(ManifestError::EmptyToolName);
            }
            if RESERVED_TOOLS.contains(&tool.name.as_str()) {
                return Err(ManifestError::ReservedTool(tool.name));
            }
            if !seen.insert(tool.name.clone()) {
                return Err(ManifestError::DuplicateTool(tool.name));
            }
            let input_schema = Schema::compile(&tool.name, "input_schema", &tool.input_schema)?;
            let output_schema = tool
                .effect
                .output_schema
                .as_deref()
                .map(|text| Schema::compile(&tool.name, "output_schema", text))
                .transpose()?;
            let (route, broker) = match tool.effect.route {
                wit::RouteKind::Native => (RouteKind::Native, None),
                wit::RouteKind::Federated(wit::BrokerKind::Nango) => {
                    (RouteKind::Federated, Some(Broker::Nango))
                }
                wit::RouteKind::Federated(wit::BrokerKind::Composio) => {
                    (RouteKind::Federated, Some(Broker::Composio))
                }
            };
            let body_rules = tool
                .effect
                .body_rules
                .iter()
                .enumerate()
                .map(|(index, rule)| BodyRule::new(&tool.name, index, rule))
                .collect::<Result<Vec<_>, _>>()?;
            let effect = EffectSpec {
                route,
                broker,
                destructive: tool.effect.destructive,
                statuses: StatusClasses::new(&tool.name, &tool.effect)?,
                propagation: Propagation::new(&tool.name, &tool.effect.propagation)?,
                output_schema,
                body_rules,
            };
            if effect.route == RouteKind::Federated && effect.propagation != Propagation::None {
                return Err(ManifestError::FederatedPropagation(tool.name));
            }
            tools.push(ToolSpec {
                upstream_name: tool.name,
                description: tool.description,
                input_schema,
                effect,
            });
        }
        Ok(Manifest {
            name,
            version: raw.version,
            tools,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn effect() -> wit::EffectSpec {
        wit::EffectSpec {
            route: wit::RouteKind::Native,
            destructive: false,
            accepted: vec![wit::StatusRange {
                first: 200,
                last: 299,
            }],
            definitely_rejected: vec![wit::StatusRange {
                first: 400,
                last: 404,
            }],
            retryable: vec![wit::StatusRange {
                first: 503,
                last: 503,
            }],
            propagation: wit::Propagation::Header("Idempotency-Key".into()),
            output_schema: None,
            body_rules: Vec::new(),
        }
    }

    fn tool(name: &str) -> wit::Tool {
        wit::Tool {
            name: name.into(),
            description: "d".into(),
            input_schema: r#"{"type":"object"}"#.into(),
            effect: effect(),
        }
    }

    fn manifest(name: &str, tools: Vec<wit::Tool>) -> wit::Manifest {
        wit::Manifest {
            name: name.into(),
            version: "1.0.0".into(),
            tools,
        }
    }

    #[test]
    fn each_broken_manifest_gets_its_own_error() {
        let cases: Vec<(wit::Manifest, ManifestError)> = vec![
            (manifest("", vec![]), ManifestError::EmptyName),
            (
                manifest("str.ipe", vec![]),
                ManifestError::DottedName("str.ipe".into()),
            ),
            (
                manifest("cap", vec![]),
                ManifestError::ReservedPrefix("cap".into()),
            ),
            (
                manifest("x", vec![tool("call_tool")]),
                ManifestError::ReservedTool("call_tool".into()),
            ),
            (
                manifest("x", vec![tool("a.b"), tool("a.b")]),
                ManifestError::DuplicateTool("a.b".into()),
            ),
        ];
        for (raw, expected) in cases {
            assert_eq!(Manifest::validate(raw).unwrap_err(), expected);
        }
    }

    #[test]
    fn overlapping_status_classes_are_refused() {
        let mut bad = tool("t");
        bad.effect.retryable.push(wit::StatusRange {
            first: 404,
            last: 410,
        });
        let err = Manifest::validate(manifest("x", vec![bad])).unwrap_err();
        assert_eq!(
            err,
            ManifestError::OverlappingStatuses {
                tool: "t".into(),
                status: 404,
                first: "definitely_rejected",
                second: "retryable"
            }
        );
    }

    #[test]
    fn invalid_schemas_are_refused() {
        let mut bad = tool("t");
        bad.input_schema = r#"{"type": 12}"#.into();
        assert!(matches!(
            Manifest::validate(manifest("x", vec![bad])),
            Err(ManifestError::InvalidSchema {
                which: "input_schema",
                ..
            })
        ));
        let mut bad = tool("t");
        bad.effect.output_schema = Some("not json".into());
        assert!(matches!(
            Manifest::validate(manifest("x", vec![bad])),
            Err(ManifestError::InvalidSchema {
                which: "output_schema",
                ..
            })
        ));
    }

    /// A broker builds the vendor request on a federated route: a binding there would be a
    /// promise the gateway cannot keep (and would license resends).
    #[test]
    fn a_federated_tool_must_not_propagate_the_key() {
        for propagation in [
            wit::Propagation::Header("idempotency-key".into()),
            wit::Propagation::BodyField("/key".into()),
            wit::Propagation::Unsupported,
        ] {
            let mut federated = tool("t");
            federated.effect.route = wit::RouteKind::Federated(wit::BrokerKind::Nango);
            federated.effect.propagation = propagation;
            assert_eq!(
                Manifest::validate(manifest("x", vec![federated])).unwrap_err(),
                ManifestError::FederatedPropagation("t".into())
            );
        }
        let mut federated = tool("t");
        federated.effect.route = wit::RouteKind::Federated(wit::BrokerKind::Nango);
        federated.effect.propagation = wit::Propagation::None;
        assert!(Manifest::validate(manifest("x", vec![federated])).is_ok());
    }

    #[test]
    fn statuses_classify_declaratively() {
        let m = Manifest::validate(manifest("x", vec![tool("t")])).unwrap();
        let statuses = &m.tools[0].effect.statuses;
        assert_eq!(statuses.classify(201), StatusClass::Accepted);
        assert_eq!(statuses.classify(404), StatusClass::DefinitelyRejected);
        assert_eq!(statuses.classify(503), StatusClass::Retryable);
        assert_eq!(statuses.classify(500), StatusClass::Unknown);
        assert_eq!(statuses.classify(302), StatusClass::Unknown);
    }

    #[test]
    fn body_field_pointer_sets_nested_fields() {
        let pointer = JsonPointer::parse("/meta/idempotency_key").unwrap();
        let mut body = serde_json::json!({"amount": 1});
        pointer.set(&mut body, "idt_x".into()).unwrap();
        assert_eq!(
            body,
            serde_json::json!({"amount": 1, "meta": {"idempotency_key": "idt_x"}})
        );
        assert!(
            pointer
                .set(&mut serde_json::json!([1]), "k".into())
                .is_err()
        );
        assert!(JsonPointer::parse("idempotency_key").is_err());
    }

    fn proptest_config() -> proptest::test_runner::Config {
        proptest::test_runner::Config {
            cases: std::env::var("PROPTEST_CASES")
                .ok()
                .and_then(|cases| cases.parse().ok())
                .unwrap_or(4096),
            failure_persistence: None,
            ..proptest::test_runner::Config::default()
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest_config())]

        /// Any manifest a component could return: validated, or refused with a typed error,
        /// never a panic; an accepted one has a well-formed connector name and unique tools.
        #[test]
        fn properties_any_manifest_gets_a_typed_answer(
            name in "[a-z.]{0,6}|\\PC{0,12}",
            tools in proptest::collection::vec(
                ("[a-z_.]{0,6}|\\PC{0,8}", "\\{\"type\":\"object\"\\}|\\PC{0,24}", 0u16..1000, 0u16..1000),
                0..4,
            ),
        ) {
            let tools = tools
                .into_iter()
                .map(|(name, schema, first, last)| {
                    let mut t = tool(&name);
                    t.input_schema = schema;
                    t.effect.retryable.push(wit::StatusRange { first, last });
                    t
                })
                .collect();
            if let Ok(valid) = Manifest::validate(manifest(&name, tools)) {
                proptest::prop_assert!(ConnectorName::parse(valid.name.as_str()).is_ok());
                let mut names: Vec<&str> = valid.tools.iter().map(|t| t.upstream_name.as_str()).collect();
                let before = names.len();
                names.sort_unstable();
                names.dedup();
                proptest::prop_assert_eq!(names.len(), before);
            }
        }
    }
}
