//! Operator-written CEL filters that narrow what a key sees.

use std::fmt;
use std::sync::Arc;

use super::VirtualKey;
use crate::catalog::Route;

/// A compiled CEL expression over `tool` (`name`, `connector`, `upstream`, `destructive`,
/// `environment`, `route`, `propagation`) and `key` (`name`, `workspace`, `environment`).
/// A tool is visible only when it evaluates to `true`; an error or a non-boolean hides it
/// (a broken filter fails closed).
#[derive(Clone)]
pub struct ToolFilter {
    source: Arc<str>,
    program: Arc<cel::Program>,
}

impl fmt::Debug for ToolFilter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ToolFilter({:?})", self.source)
    }
}

impl ToolFilter {
    pub fn compile(source: &str) -> Result<ToolFilter, String> {
        let program = cel::Program::compile(source)
            .map_err(|e| format!("filter {source:?} does not parse: {e}"))?;
        Ok(ToolFilter {
            source: source.into(),
            program: Arc::new(program),
        })
    }

    pub fn admits(&self, key: &VirtualKey, route: &Route) -> bool {
        let tool = route.tool();
        let mut context = cel::Context::default();
        let tool_value = serde_json::json!({
            "name": route.name.as_str(),
            "connector": route.name.connector(),
            "upstream": route.name.upstream(),
            "destructive": tool.effect.destructive,
            "environment": route.connection.environment.as_str(),
            "route": tool.effect.route,
            "propagation": tool.effect.propagation.label(),
        });
        let key_value = serde_json::json!({
            "name": key.name,
            "workspace": key.workspace,
            "environment": key.environment.as_str(),
        });
        let (Ok(tool_value), Ok(key_value)) = (cel::to_value(tool_value), cel::to_value(key_value))
        else {
            return false;
        };
        context.add_variable_from_value("tool", tool_value);
        context.add_variable_from_value("key", key_value);
        matches!(self.program.execute(&context), Ok(cel::Value::Bool(true)))
    }
}
