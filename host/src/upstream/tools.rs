//! An upstream's `tools/list` entries as the gateway's tools: size-capped, checked, and given
//! the EffectSpec ADR-0045 derives (destructive unless proven otherwise, propagation
//! `unsupported`, outcomes by the MCP table).

use std::collections::HashMap;
use std::sync::Arc;

use rmcp::model::Tool;
use serde_json::Value;

use super::effect::{self, ReadOnlyHint};
use crate::catalog::{EffectSpec, Propagation, RouteKind, Schema, StatusClasses, ToolSpec};
use crate::config::McpUpstream;

/// The longest upstream tool name kept (the namespaced name adds the prefix and a dot).
pub const MAX_NAME: usize = 128;
/// Descriptions are cut to this many bytes (at a character boundary).
pub const MAX_DESCRIPTION: usize = 4096;
/// An input or output schema larger than this, serialized, drops the tool.
pub const MAX_SCHEMA: usize = 64 * 1024;

/// The usable tools of one listing, and what was left out and why (for the log).
#[derive(Debug, Default)]
pub struct Admitted {
    pub tools: Vec<Arc<ToolSpec>>,
    pub dropped: Vec<String>,
}

/// Checks every listed tool. Two tools of one name both go: the gateway cannot tell which
/// one a call would reach, and shadowing one silently would misroute calls.
pub fn admit(upstream: &McpUpstream, listed: Vec<Tool>) -> Admitted {
    let mut counts: HashMap<String, usize> = HashMap::new();
    for tool in &listed {
        *counts.entry(tool.name.to_string()).or_default() += 1;
    }
    let mut admitted = Admitted::default();
    for tool in listed {
        let name = tool.name.to_string();
        if counts[&name] > 1 {
            admitted.dropped.push(format!(
                "{:?} is listed more than once (all copies left out)",
                shown(&name)
            ));
            continue;
        }
        match spec(upstream, tool) {
            Ok(spec) => admitted.tools.push(Arc::new(spec)),
            Err(reason) => admitted
                .dropped
                .push(format!("{:?}: {reason}", shown(&name))),
        }
    }
    admitted
        .tools
        .sort_by(|a, b| a.upstream_name.cmp(&b.upstream_name));
    admitted
}

/// A name from an upstream, bounded for a log line.
fn shown(name: &str) -> String {
    name.chars().take(64).collect()
}

fn spec(upstream: &McpUpstream, tool: Tool) -> Result<ToolSpec, String> {
    let name = tool.name.to_string();
    if name.is_empty() || name.len() > MAX_NAME {
        return Err(format!("a tool name must have 1 to {MAX_NAME} bytes"));
    }
    if name.chars().any(|c| c.is_control() || c.is_whitespace()) {
        return Err("a tool name must not hold spaces or control characters".into());
    }
    let input = Value::Object((*tool.input_schema).clone());
    let output = tool
        .output_schema
        .as_ref()
        .map(|schema| Value::Object((**schema).clone()));
    for schema in std::iter::once(&input).chain(output.as_ref()) {
        if serde_json::to_string(schema).map_or(usize::MAX, |text| text.len()) > MAX_SCHEMA {
            return Err(format!("a schema exceeds {MAX_SCHEMA} bytes"));
        }
    }
    let input_schema =
        Schema::from_value(&name, "inputSchema", input).map_err(|e| e.to_string())?;
    let output_schema = output
        .map(|schema| Schema::from_value(&name, "outputSchema", schema))
        .transpose()
        .map_err(|e| e.to_string())?;
    let hint = match tool.annotations.as_ref().and_then(|a| a.read_only_hint) {
        Some(true) => ReadOnlyHint::ReadOnly,
        _ => ReadOnlyHint::NotSaid,
    };
    let operator = upstream.tools.get(&name);
    let declared = operator
        .and_then(|tool| tool.declared)
        .unwrap_or(effect::Declared::Nothing);
    let propagation = match operator.and_then(|tool| tool.idempotency_header.clone()) {
        Some(header) => Propagation::Header(header),
        None => Propagation::Unsupported,
    };
    let mut description = tool.description.map(|d| d.to_string()).unwrap_or_default();
    if description.len() > MAX_DESCRIPTION {
        let mut end = MAX_DESCRIPTION;
        while !description.is_char_boundary(end) {
            end -= 1;
        }
        description.truncate(end);
    }
    Ok(ToolSpec {
        upstream_name: name,
        description,
        input_schema,
        effect: EffectSpec {
            route: RouteKind::Mcp,
            broker: None,
            destructive: effect::destructive(declared, hint, upstream.annotations),
            statuses: StatusClasses::none(),
            propagation,
            output_schema,
            body_rules: Vec::new(),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::UpstreamToolConfig;
    use crate::upstream::effect::{Annotations, Declared};

    fn upstream(annotations: Annotations) -> McpUpstream {
        McpUpstream {
            url: crate::config::UpstreamUrl::parse("http://127.0.0.1:1/mcp").unwrap(),
            prefix: "up".into(),
            annotations,
            tools: [(
                "declared".to_owned(),
                UpstreamToolConfig {
                    declared: Some(Declared::ReadOnly),
                    ..Default::default()
                },
            )]
            .into(),
            protocol_version: None,
        }
    }

    fn tool(name: &str, read_only: Option<bool>) -> Tool {
        let mut value = serde_json::json!({
            "name": name,
            "description": "d".repeat(10_000),
            "inputSchema": {"type": "object"},
        });
        if let Some(hint) = read_only {
            value["annotations"] = serde_json::json!({ "readOnlyHint": hint });
        }
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn an_unannotated_tool_is_destructive_and_hints_count_only_when_trusted() {
        let listed = vec![
            tool("plain", None),
            tool("hinted", Some(true)),
            tool("declared", None),
        ];
        let destructive = |admitted: &Admitted, name: &str| {
            admitted
                .tools
                .iter()
                .find(|t| t.upstream_name == name)
                .unwrap()
                .effect
                .destructive
        };
        let untrusted = admit(&upstream(Annotations::Untrusted), listed.clone());
        assert!(destructive(&untrusted, "plain"));
        assert!(destructive(&untrusted, "hinted"));
        assert!(!destructive(&untrusted, "declared"));
        let trusted = admit(&upstream(Annotations::Trusted), listed);
        assert!(destructive(&trusted, "plain"));
        assert!(!destructive(&trusted, "hinted"));
        for spec in &trusted.tools {
            assert_eq!(spec.effect.route, RouteKind::Mcp);
            assert_eq!(spec.effect.propagation, Propagation::Unsupported);
            assert_eq!(spec.description.len(), MAX_DESCRIPTION);
        }
    }

    #[test]
    fn duplicates_and_bad_names_are_left_out_with_a_reason() {
        let listed = vec![
            tool("twice", None),
            tool("twice", None),
            tool("has space", None),
            tool(&"x".repeat(MAX_NAME + 1), None),
            tool("dotted.name", None),
        ];
        let admitted = admit(&upstream(Annotations::Untrusted), listed);
        let names: Vec<_> = admitted.tools.iter().map(|t| &t.upstream_name).collect();
        assert_eq!(names, ["dotted.name"]);
        assert_eq!(admitted.dropped.len(), 4, "{:?}", admitted.dropped);
    }
}
