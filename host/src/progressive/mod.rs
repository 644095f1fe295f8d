//! Progressive tools (spec/mcp-gateway.md, "Progressive tools"): a key in progressive mode
//! lists `search_tools` and `call_tool` instead of every tool.
//!
//! Neither adds a way to decide permissions. `call_tool` is unwrapped when the call is parsed
//! into the plain call of the tool it names, which then runs the whole lifecycle as if called
//! directly (same slot, same policy). `search_tools` ranks only over the key's view, and is
//! answered by the gateway through the same call boundary as any tool: claim, replay, receipt.
//! Each synthetic tool is callable exactly where it is listed; everywhere else its name is an
//! unknown tool like any other.

pub mod search;

use std::sync::{Arc, LazyLock};

use serde_json::{Map, Value, json};

use crate::catalog::{
    EffectSpec, Propagation, Route, RouteKind, Schema, ServedBy, StatusClasses, ToolName, ToolSpec,
};
use crate::config::{ConnectionConfig, ConnectionKind};
use crate::error::ObolError;
use crate::policy::{Environment, ToolsMode};

pub const SEARCH_TOOLS: &str = "search_tools";
pub const CALL_TOOL: &str = "call_tool";
pub const FIND_CAPABILITY: &str = "find_capability";

/// The most hits one `search_tools` answer carries.
pub const SEARCH_LIMIT: usize = 20;
/// Longer queries are refused: nothing useful is that long, and ranking cost grows with it.
pub const QUERY_LIMIT: usize = 512;

/// A tool the gateway answers itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Synthetic {
    SearchTools,
    FindCapability,
}

impl Synthetic {
    /// The synthetic tool `name` names for a key in `mode`, if that mode lists it.
    /// `find_capability` is listed in full mode only, and only where the key can see a
    /// capability (`capabilities`).
    pub fn listed(name: &str, mode: ToolsMode, capabilities: Visible) -> Option<Synthetic> {
        match (name, mode, capabilities) {
            (SEARCH_TOOLS, ToolsMode::Progressive, _) => Some(Synthetic::SearchTools),
            (FIND_CAPABILITY, ToolsMode::Full, Visible::Some) => Some(Synthetic::FindCapability),
            _ => None,
        }
    }

    pub fn route(self) -> &'static Arc<Route> {
        match self {
            Synthetic::SearchTools => &TOOLS.search_tools,
            Synthetic::FindCapability => &TOOLS.find_capability,
        }
    }
}

/// Whether a key can see any capability (`find_capability` is listed only then).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Visible {
    None,
    Some,
}

/// The `tools/list` answer of every progressive key.
pub fn progressive_listing() -> &'static str {
    &TOOLS.progressive_listing
}

/// `find_capability`'s listing entry, for full-mode keys that can see a capability.
pub fn find_capability_listing() -> &'static str {
    TOOLS.find_capability.listing.get()
}

/// `call_tool(name, arguments)` as the plain call it stands for.
pub fn unwrap_call_tool(
    mut arguments: Map<String, Value>,
) -> Result<(String, Map<String, Value>), ObolError> {
    let invalid = |why: &str| Err(ObolError::InvalidArguments(format!("call_tool: {why}")));
    let name = match arguments.remove("name") {
        Some(Value::String(name)) => name,
        Some(_) => return invalid("name must be a string"),
        None => {
            return invalid("name is required (the tool's full name, as search_tools gives it)");
        }
    };
    let inner = match arguments.remove("arguments") {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(inner)) => inner,
        Some(_) => return invalid("arguments must be an object"),
    };
    if let Some(other) = arguments.keys().next() {
        let shown: String = other.chars().take(64).collect();
        return invalid(&format!(
            "unexpected property {shown:?} (call_tool takes name and arguments)"
        ));
    }
    Ok((name, inner))
}

/// `search_tools`' arguments, read. The input schema has already admitted them.
#[derive(Debug)]
pub struct SearchQuery {
    pub query: String,
    pub limit: usize,
}

impl SearchQuery {
    pub fn parse(arguments: &Map<String, Value>) -> Result<SearchQuery, ObolError> {
        let query = arguments
            .get("query")
            .and_then(Value::as_str)
            .ok_or_else(|| ObolError::InvalidArguments("search_tools: query is required".into()))?;
        let limit = arguments
            .get("limit")
            .and_then(Value::as_u64)
            .map_or(SEARCH_LIMIT, |limit| (limit as usize).min(SEARCH_LIMIT));
        Ok(SearchQuery {
            query: query.to_owned(),
            limit,
        })
    }
}

/// One hit of `search_tools`: what a model needs to call it.
pub fn hit(route: &Route) -> Value {
    let tool = route.tool();
    json!({
        "name": route.name.as_str(),
        "description": tool.description,
        "inputSchema": tool.input_schema.source,
        "destructive": tool.effect.destructive,
    })
}

struct Tools {
    search_tools: Arc<Route>,
    find_capability: Arc<Route>,
    progressive_listing: String,
}

static TOOLS: LazyLock<Tools> = LazyLock::new(|| {
    let search_tools = synthetic_route(
        SEARCH_TOOLS,
        "Find the tools you can call. Give a few words of what you want to do (or a connector's \
         name); the answer lists up to 20 tools, best first, each with its name, description and \
         input schema. Call one with call_tool.",
        json!({
            "type": "object",
            "properties": {
                "query": {"type": "string", "minLength": 1, "maxLength": QUERY_LIMIT},
                "limit": {"type": "integer", "minimum": 1, "maximum": SEARCH_LIMIT},
            },
            "required": ["query"],
            "additionalProperties": false,
        }),
    );
    let find_capability = synthetic_route(
        FIND_CAPABILITY,
        "Tell which provider a capability (a cap.* tool) would route these arguments to now, \
         and why, without calling it.",
        json!({
            "type": "object",
            "properties": {
                "capability": {"type": "string", "minLength": 1, "maxLength": 128},
                "arguments": {"type": "object"},
            },
            "required": ["capability"],
            "additionalProperties": false,
        }),
    );
    let call_tool = json!({
        "name": CALL_TOOL,
        "description": "Call a tool that search_tools found, by its full name, with its arguments.",
        "inputSchema": {
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "arguments": {"type": "object"},
            },
            "required": ["name"],
            "additionalProperties": false,
        },
        "annotations": {"openWorldHint": true},
    });
    let progressive_listing = format!("{{\"tools\":[{},{call_tool}]}}", search_tools.listing.get());
    Tools {
        search_tools,
        find_capability,
        progressive_listing,
    }
});

fn synthetic_route(name: &str, description: &str, schema: Value) -> Arc<Route> {
    let tool = ToolSpec {
        upstream_name: name.to_owned(),
        description: description.to_owned(),
        input_schema: Schema::from_value(name, "input", schema).expect("a valid schema"),
        effect: EffectSpec {
            route: RouteKind::Gateway,
            broker: None,
            destructive: false,
            statuses: StatusClasses::none(),
            propagation: Propagation::None,
            output_schema: None,
            body_rules: Vec::new(),
        },
    };
    let listing = json!({
        "name": name,
        "description": tool.description,
        "inputSchema": tool.input_schema.source,
        "annotations": {"readOnlyHint": true, "destructiveHint": false, "openWorldHint": false},
    });
    Arc::new(Route {
        name: ToolName::gateway(name),
        served_by: ServedBy::Gateway(Arc::new(tool)),
        connection: Arc::new(ConnectionConfig {
            id: "obol".to_owned(),
            environment: Environment::Dev,
            kind: ConnectionKind::Virtual,
            secret: None,
            idempotency_window: std::time::Duration::ZERO,
        }),
        listing: serde_json::value::RawValue::from_string(listing.to_string()).expect("valid JSON"),
    })
}
