//! The connector's self-description: its name, version and tools.

use std::collections::HashSet;
use std::fmt;

use serde_json::{Value, json};

use crate::effect::EffectSpec;

/// One tool: its upstream name, what it does, the arguments it takes and its effect.
///
/// ```
/// use obol_sdk::{EffectSpec, Tool};
/// use serde_json::json;
///
/// let tool = Tool::new("charges.list", EffectSpec::read())
///     .description("List recent charges.")
///     .input_schema(json!({"type": "object", "properties": {"limit": {"type": "integer"}}}))
///     .output_schema(json!({"type": "object"}));
/// assert_eq!(tool.name, "charges.list");
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct Tool {
    /// The upstream name; it may contain dots (`charges.list`).
    pub name: String,
    pub description: String,
    /// JSON Schema of the arguments; the host validates every call against it.
    pub input_schema: Value,
    pub effect: EffectSpec,
    /// JSON Schema of the structured output; the host validates the output against it.
    pub output_schema: Option<Value>,
}

impl Tool {
    /// A tool taking any JSON object, with no description yet. The effect is required here
    /// because no default is safe: a forgotten `destructive` would skip approvals.
    pub fn new(name: impl Into<String>, effect: EffectSpec) -> Tool {
        Tool {
            name: name.into(),
            description: String::new(),
            input_schema: json!({"type": "object"}),
            effect,
            output_schema: None,
        }
    }

    /// What the tool does, written for the agent choosing it.
    pub fn description(mut self, description: impl Into<String>) -> Tool {
        self.description = description.into();
        self
    }

    pub fn input_schema(mut self, schema: Value) -> Tool {
        self.input_schema = schema;
        self
    }

    pub fn output_schema(mut self, schema: Value) -> Tool {
        self.output_schema = Some(schema);
        self
    }
}

/// The connector's description, returned once when the host loads the component.
#[derive(Clone, Debug, PartialEq)]
pub struct Manifest {
    /// The prefix in `connector.tool`: non-empty, without a dot.
    pub name: String,
    pub version: String,
    pub tools: Vec<Tool>,
}

impl Manifest {
    /// An empty manifest; pass `env!("CARGO_PKG_VERSION")` as the version.
    pub fn new(name: impl Into<String>, version: impl Into<String>) -> Manifest {
        Manifest {
            name: name.into(),
            version: version.into(),
            tools: Vec::new(),
        }
    }

    pub fn tool(mut self, tool: Tool) -> Manifest {
        self.tools.push(tool);
        self
    }

    /// Checks what the host checks at load, so a connector's unit tests catch it first:
    /// the name, unique non-empty tool names, schemas that are JSON objects, and
    /// [`EffectSpec::problems`]. The host stays the authority; it may refuse more.
    pub fn check(&self) -> Result<(), ManifestError> {
        let mut problems = Vec::new();
        if self.name.is_empty() || self.name.contains('.') {
            problems.push(format!(
                "connector name {:?} must be non-empty and contain no dot",
                self.name
            ));
        }
        let mut seen = HashSet::new();
        for tool in &self.tools {
            if tool.name.is_empty() {
                problems.push("a tool has an empty name".to_owned());
            } else if !seen.insert(tool.name.as_str()) {
                problems.push(format!("tool {:?} is declared twice", tool.name));
            }
            let schemas = [Some(&tool.input_schema), tool.output_schema.as_ref()];
            for schema in schemas.into_iter().flatten() {
                if let Some(problem) = schema_problem(schema) {
                    problems.push(format!("tool {:?}: {problem}", tool.name));
                }
            }
            for problem in tool.effect.problems() {
                problems.push(format!("tool {:?}: {problem}", tool.name));
            }
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(ManifestError { problems })
        }
    }
}

/// A shallow check that catches the usual slips, not a JSON Schema meta-validation.
fn schema_problem(schema: &Value) -> Option<String> {
    let Some(object) = schema.as_object() else {
        return Some("a schema must be a JSON object".to_owned());
    };
    match object.get("type") {
        None | Some(Value::String(_)) => None,
        Some(Value::Array(types)) if types.iter().all(Value::is_string) => None,
        Some(other) => Some(format!(
            "schema \"type\" must be a string or a list of strings, not {other}"
        )),
    }
}

/// Everything [`Manifest::check`] found wrong.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ManifestError {
    pub problems: Vec<String>,
}

impl fmt::Display for ManifestError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid manifest: {}", self.problems.join("; "))
    }
}

impl std::error::Error for ManifestError {}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::effect::Status;

    fn manifest() -> Manifest {
        Manifest::new("stripe", "1.0.0")
            .tool(Tool::new("charges.list", EffectSpec::read()).description("List charges."))
    }

    #[test]
    fn tool_builder_fills_every_field() {
        let tool = Tool::new("x", EffectSpec::write())
            .description("d")
            .input_schema(json!({"type": "object", "required": ["a"]}))
            .output_schema(json!({"type": "object"}));
        assert_eq!(tool.description, "d");
        assert_eq!(tool.input_schema["required"], json!(["a"]));
        assert_eq!(tool.output_schema, Some(json!({"type": "object"})));
        assert_eq!(
            Tool::new("y", EffectSpec::read()).input_schema,
            json!({"type": "object"})
        );
    }

    #[test]
    fn a_sound_manifest_passes() {
        assert_eq!(manifest().check(), Ok(()));
    }

    #[test]
    fn every_problem_is_reported() {
        let mut broken = manifest()
            .tool(Tool::new("charges.list", EffectSpec::read()))
            .tool(Tool::new("", EffectSpec::read()).input_schema(json!({"type": 12})))
            .tool(Tool::new(
                "overlap",
                EffectSpec::read().definitely_rejected([Status::range(250, 260)]),
            ));
        broken.name = "str.ipe".to_owned();
        let problems = broken.check().unwrap_err().problems;
        assert_eq!(problems.len(), 5, "{problems:?}");
        assert!(problems[0].contains("no dot"));
        assert!(problems[1].contains("declared twice"));
        assert!(problems[2].contains("empty name"));
        assert!(problems[3].contains("\"type\" must be a string"));
        assert!(problems[4].contains("overlaps"));
    }
}
