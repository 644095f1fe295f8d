//! Capabilities as the catalog holds them (ADR-0047): one tool, `cap.NAME`, that the operator
//! routes across providers.
//!
//! A capability is declared with a card (description, input schema) and its providers: tools
//! of the workspace, each with a declarative argument mapping, a priority and an environment.
//! [`CapabilitySpec`] is what the operator writes (config or admin API); [`Declared`] is it
//! checked on its own; [`super::Catalog::build`] checks each mapping against its provider's
//! schema, and `crate::capability::router` picks a provider for each new call.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::{JsonPointer, Route, Schema, ToolName};
use crate::error::ObolError;
use crate::policy::Environment;

/// The connector part of every capability's name.
pub const PREFIX: &str = "cap";

/// A capability as the operator writes it (`[[workspaces.capabilities]]`, or the body of
/// `PUT /v1/admin/capabilities/{workspace}/{name}`).
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct CapabilitySpec {
    /// `cap.NAME`.
    pub name: String,
    pub description: String,
    pub input_schema: Value,
    /// The environment the capability itself belongs to (the deployment's by default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub environment: Option<String>,
    pub providers: Vec<ProviderSpec>,
}

/// One provider of a capability.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ProviderSpec {
    /// A tool of the workspace, by its namespaced name.
    pub tool: String,
    /// Lower is tried first; equal priorities keep the declared order.
    #[serde(default)]
    pub priority: u32,
    /// The environment the provider serves (its connection's by default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub environment: Option<String>,
    /// Provider field ← capability argument. Each side is a top-level name or a JSON
    /// Pointer (`/amount/value`): renames and moves.
    #[serde(default)]
    pub map: BTreeMap<String, String>,
    /// Provider field ← a constant.
    #[serde(default)]
    pub set: BTreeMap<String, Value>,
}

/// A capability in a snapshot: its providers that exist and whose mapping fits their schema,
/// tried in this order (priority, then as declared).
#[derive(Debug)]
pub struct Capability {
    pub providers: Vec<Provider>,
}

#[derive(Debug)]
pub struct Provider {
    pub route: Arc<Route>,
    pub mapping: Mapping,
    pub priority: u32,
    pub environment: Environment,
}

/// A capability checked on its own (before any provider's schema is known).
#[derive(Debug)]
pub struct Declared {
    pub name: ToolName,
    pub description: String,
    pub input_schema: Schema,
    pub environment: Environment,
    pub providers: Vec<DeclaredProvider>,
}

#[derive(Debug)]
pub struct DeclaredProvider {
    pub tool: ToolName,
    pub priority: u32,
    pub environment: Option<Environment>,
    pub mapping: Mapping,
}

impl CapabilitySpec {
    /// Checks everything that does not depend on the providers' schemas: the name, the card's
    /// schema, each mapping's pointers and that every capability field a mapping reads is one
    /// the card declares. `default_environment` is the deployment's.
    pub fn parse(&self, default_environment: Environment) -> Result<Declared, String> {
        let name = ToolName::parse(&self.name)
            .filter(|name| name.connector() == PREFIX)
            .ok_or_else(|| {
                format!(
                    "capability {:?}: a capability is named cap.NAME",
                    crate::names::shown(&self.name)
                )
            })?;
        crate::names::check("capability name", name.upstream())
            .map_err(|e| format!("capability {name}: {e}"))?;
        let context = |problem: String| format!("capability {name}: {problem}");
        let input_schema = Schema::from_value(name.as_str(), "input", self.input_schema.clone())
            .map_err(|e| context(e.to_string()))?;
        let environment = match &self.environment {
            None => default_environment,
            Some(text) => Environment::parse(text).map_err(context)?,
        };
        if self.providers.is_empty() {
            return Err(context("it needs at least one provider".into()));
        }
        let mut providers: Vec<DeclaredProvider> = Vec::new();
        for provider in &self.providers {
            let tool = ToolName::parse(&provider.tool)
                .filter(|tool| tool.connector() != PREFIX)
                .ok_or_else(|| {
                    context(format!(
                        "provider {:?} is not a connector tool (connector.tool)",
                        crate::names::shown(&provider.tool)
                    ))
                })?;
            if providers.iter().any(|p| p.tool == tool) {
                return Err(context(format!("provider {tool} is listed twice")));
            }
            let in_provider = |problem: String| context(format!("provider {tool}: {problem}"));
            let environment = provider
                .environment
                .as_deref()
                .map(Environment::parse)
                .transpose()
                .map_err(in_provider)?;
            let mapping = Mapping::parse(&provider.map, &provider.set).map_err(in_provider)?;
            for (_, source) in &mapping.moves {
                if property(&input_schema.source, source).is_none() {
                    return Err(in_provider(format!(
                        "map reads {}, which the capability's input schema does not declare",
                        source.as_str()
                    )));
                }
            }
            providers.push(DeclaredProvider {
                tool,
                priority: provider.priority,
                environment,
                mapping,
            });
        }
        Ok(Declared {
            name,
            description: self.description.clone(),
            input_schema,
            environment,
            providers,
        })
    }
}

/// How a capability's arguments become one provider's: moves (renames are moves of a
/// top-level field) and constants. Nothing else passes through: a provider receives exactly
/// what its mapping produces.
#[derive(Debug, Clone)]
pub struct Mapping {
    /// (provider field, capability field).
    pub moves: Vec<(JsonPointer, JsonPointer)>,
    /// (provider field, value).
    pub constants: Vec<(JsonPointer, Value)>,
}

impl Mapping {
    fn parse(
        map: &BTreeMap<String, String>,
        set: &BTreeMap<String, Value>,
    ) -> Result<Mapping, String> {
        let moves = map
            .iter()
            .map(|(to, from)| Ok((field(to)?, field(from)?)))
            .collect::<Result<Vec<_>, String>>()?;
        let constants = set
            .iter()
            .map(|(to, value)| Ok((field(to)?, value.clone())))
            .collect::<Result<Vec<_>, String>>()?;
        let targets: Vec<&str> = moves
            .iter()
            .map(|(to, _)| to.as_str())
            .chain(constants.iter().map(|(to, _)| to.as_str()))
            .collect();
        // A field written twice, or inside another written field (`/a` and `/a/b`).
        for (i, a) in targets.iter().enumerate() {
            for b in &targets[i + 1..] {
                let inside = |outer: &str, inner: &str| {
                    inner
                        .strip_prefix(outer)
                        .is_some_and(|rest| rest.starts_with('/'))
                };
                if a == b || inside(a, b) || inside(b, a) {
                    return Err(format!("{a} and {b} are written twice"));
                }
            }
        }
        Ok(Mapping { moves, constants })
    }

    /// Every provider field this mapping can write.
    pub fn targets(&self) -> impl Iterator<Item = &JsonPointer> {
        self.moves
            .iter()
            .map(|(to, _)| to)
            .chain(self.constants.iter().map(|(to, _)| to))
    }

    /// The provider's arguments for a capability's. A capability field that is absent is not
    /// written (the provider's schema then decides whether that is acceptable).
    pub fn apply(&self, arguments: &Map<String, Value>) -> Result<Map<String, Value>, ObolError> {
        let source = Value::Object(arguments.clone());
        let mut out = Value::Object(Map::new());
        let write = |out: &mut Value, to: &JsonPointer, value: Value| {
            to.set(out, value).map_err(|problem| {
                ObolError::InvalidArguments(format!("the capability's mapping failed: {problem}"))
            })
        };
        for (to, from) in &self.moves {
            if let Some(value) = from.get(&source) {
                write(&mut out, to, value.clone())?;
            }
        }
        for (to, value) in &self.constants {
            write(&mut out, to, value.clone())?;
        }
        match out {
            Value::Object(map) => Ok(map),
            _ => Err(ObolError::Internal),
        }
    }

    /// Checks the mapping against both schemas: every field it writes is declared by the
    /// provider, every field the provider requires is always written (a move only from a
    /// field the capability requires), and each constant is valid where it goes.
    pub fn check(&self, capability: &Value, provider: &Value) -> Result<(), String> {
        for to in self.targets() {
            if property(provider, to).is_none() {
                return Err(format!(
                    "it writes {}, which the provider's input schema does not declare",
                    to.as_str()
                ));
            }
        }
        for (to, value) in &self.constants {
            let schema = property(provider, to).expect("checked above");
            if let Ok(validator) = jsonschema::validator_for(schema)
                && !validator.is_valid(value)
            {
                return Err(format!(
                    "the constant for {} does not match the provider's schema",
                    to.as_str()
                ));
            }
        }
        for required in required_fields(provider) {
            let always = self.constants.iter().any(|(to, _)| to.as_str() == required)
                || self
                    .moves
                    .iter()
                    .any(|(to, from)| to.as_str() == required && is_required(capability, from));
            if !always {
                return Err(format!(
                    "the provider requires {required}, which the mapping does not always write (map it from a field the capability requires, or set it)"
                ));
            }
        }
        Ok(())
    }
}

/// A side of a mapping: a JSON Pointer, or a top-level field name (its pointer).
fn field(text: &str) -> Result<JsonPointer, String> {
    if text.starts_with('/') {
        JsonPointer::parse(text)
    } else if text.is_empty() {
        Err("an empty field name".into())
    } else {
        JsonPointer::parse(&format!("/{}", text.replace('~', "~0").replace('/', "~1")))
    }
}

/// The subschema a schema declares for the field at `pointer` (through `properties`).
fn property<'s>(schema: &'s Value, pointer: &JsonPointer) -> Option<&'s Value> {
    let mut node = schema;
    for segment in pointer.segments() {
        node = node.get("properties")?.get(&segment)?;
    }
    Some(node)
}

/// Whether the field at `pointer` is present in every instance the schema admits: required
/// at each level down.
fn is_required(schema: &Value, pointer: &JsonPointer) -> bool {
    let mut node = schema;
    for segment in pointer.segments() {
        let required = node
            .get("required")
            .and_then(Value::as_array)
            .is_some_and(|r| r.iter().any(|f| f.as_str() == Some(segment.as_str())));
        match (
            required,
            node.get("properties").and_then(|p| p.get(&segment)),
        ) {
            (true, Some(next)) => node = next,
            _ => return false,
        }
    }
    true
}

/// The top-level fields a schema requires, as pointers.
fn required_fields(schema: &Value) -> Vec<String> {
    schema
        .get("required")
        .and_then(Value::as_array)
        .map(|r| {
            r.iter()
                .filter_map(Value::as_str)
                .map(|f| format!("/{}", f.replace('~', "~0").replace('/', "~1")))
                .collect()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn spec(map: &[(&str, &str)], set: &[(&str, Value)]) -> CapabilitySpec {
        CapabilitySpec {
            name: "cap.refund".into(),
            description: "Refund a payment".into(),
            input_schema: json!({
                "type": "object",
                "properties": {
                    "payment": {"type": "string"},
                    "amount": {"type": "object", "properties": {"value": {"type": "integer"}}, "required": ["value"]},
                    "note": {"type": "string"},
                },
                "required": ["payment", "amount"],
            }),
            environment: None,
            providers: vec![ProviderSpec {
                tool: "stripe.create_refund".into(),
                priority: 1,
                environment: None,
                map: map
                    .iter()
                    .map(|(a, b)| (a.to_string(), b.to_string()))
                    .collect(),
                set: set
                    .iter()
                    .map(|(a, b)| (a.to_string(), b.clone()))
                    .collect(),
            }],
        }
    }

    fn provider_schema() -> Value {
        json!({
            "type": "object",
            "properties": {
                "charge": {"type": "string"},
                "amount": {"type": "integer"},
                "reason": {"type": "string", "enum": ["duplicate", "requested_by_customer"]},
                "memo": {"type": "string"},
            },
            "required": ["charge", "amount"],
        })
    }

    #[test]
    fn a_mapping_renames_moves_and_sets() {
        let declared = spec(
            &[
                ("charge", "payment"),
                ("amount", "/amount/value"),
                ("memo", "note"),
            ],
            &[("reason", json!("requested_by_customer"))],
        )
        .parse(Environment::Dev)
        .unwrap();
        let mapping = &declared.providers[0].mapping;
        mapping
            .check(&declared.input_schema.source, &provider_schema())
            .unwrap();
        let args = json!({"payment": "ch_1", "amount": {"value": 500}});
        let out = mapping.apply(args.as_object().unwrap()).unwrap();
        // An absent optional field is not written; nothing unmapped passes through.
        assert_eq!(
            Value::Object(out),
            json!({"charge": "ch_1", "amount": 500, "reason": "requested_by_customer"})
        );
    }

    #[test]
    fn a_mapping_that_cannot_satisfy_the_provider_is_refused_with_the_reason() {
        let check = |map: &[(&str, &str)], set: &[(&str, Value)]| {
            let declared = spec(map, set).parse(Environment::Dev)?;
            declared.providers[0]
                .mapping
                .check(&declared.input_schema.source, &provider_schema())
        };
        let err = check(&[("charge", "payment")], &[]).unwrap_err();
        assert!(err.contains("requires /amount"), "{err}");
        // A required provider field fed from an optional capability field.
        let err = check(&[("charge", "note"), ("amount", "/amount/value")], &[]).unwrap_err();
        assert!(err.contains("requires /charge"), "{err}");
        let err = check(
            &[
                ("charge", "payment"),
                ("amount", "/amount/value"),
                ("currency", "note"),
            ],
            &[],
        )
        .unwrap_err();
        assert!(err.contains("writes /currency"), "{err}");
        let err = check(
            &[("charge", "payment"), ("amount", "/amount/value")],
            &[("reason", json!("because"))],
        )
        .unwrap_err();
        assert!(err.contains("constant for /reason"), "{err}");
        // A source the card does not declare is refused before any provider is known.
        let err = check(&[("charge", "payment_id")], &[]).unwrap_err();
        assert!(err.contains("reads /payment_id"), "{err}");
        let err = check(&[("charge", "payment")], &[("charge", json!("x"))]).unwrap_err();
        assert!(err.contains("written twice"), "{err}");
        // Nested targets, with a sibling that sorts between them.
        let err = check(
            &[("/amount", "/amount/value"), ("/amount/x", "payment")],
            &[("/amount-y", json!(1))],
        )
        .unwrap_err();
        assert!(err.contains("written twice"), "{err}");
    }

    #[test]
    fn names_are_checked() {
        let mut bad = spec(&[("charge", "payment"), ("amount", "/amount/value")], &[]);
        bad.name = "refund".into();
        assert!(
            bad.parse(Environment::Dev)
                .unwrap_err()
                .contains("cap.NAME")
        );
        bad.name = "cap.refund".into();
        bad.providers[0].tool = "cap.other".into();
        assert!(
            bad.parse(Environment::Dev)
                .unwrap_err()
                .contains("not a connector tool")
        );
    }
}
