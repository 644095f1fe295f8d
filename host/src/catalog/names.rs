//! `connector.tool` names (ADR-0015): split on the first dot, neither side empty.

use std::fmt;
use std::sync::Arc;

use super::ConnectorName;

/// A namespaced tool name. The connector part never contains a dot; the tool part may
/// (`stripe.charges.list` is connector `stripe`, upstream tool `charges.list`).
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct ToolName {
    full: Arc<str>,
    /// Where the connector part ends and the upstream part starts (both 0 for the gateway's
    /// own tools, which have no connector).
    connector_end: usize,
    upstream_start: usize,
}

impl ToolName {
    pub fn new(connector: &ConnectorName, upstream: &str) -> ToolName {
        let full: Arc<str> = format!("{connector}.{upstream}").into();
        let dot = connector.as_str().len();
        ToolName {
            full,
            connector_end: dot,
            upstream_start: dot + 1,
        }
    }

    /// A tool the gateway answers itself (`search_tools`): no connector, no dot. Never the
    /// result of [`ToolName::parse`], so no client name can reach one by accident.
    pub fn gateway(name: &str) -> ToolName {
        ToolName {
            full: name.into(),
            connector_end: 0,
            upstream_start: 0,
        }
    }

    /// Splits on the first dot. `None` when there is no dot or either side is empty.
    pub fn parse(name: &str) -> Option<ToolName> {
        let dot = name.find('.')?;
        if dot == 0 || dot + 1 == name.len() {
            return None;
        }
        Some(ToolName {
            full: name.into(),
            connector_end: dot,
            upstream_start: dot + 1,
        })
    }

    pub fn connector(&self) -> &str {
        &self.full[..self.connector_end]
    }

    /// What reaches the component: the name without its prefix.
    pub fn upstream(&self) -> &str {
        &self.full[self.upstream_start..]
    }

    pub fn as_str(&self) -> &str {
        &self.full
    }
}

impl fmt::Display for ToolName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.full)
    }
}

impl fmt::Debug for ToolName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", &*self.full)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_on_the_first_dot() {
        let name = ToolName::parse("stripe.charges.list").unwrap();
        assert_eq!(
            (name.connector(), name.upstream()),
            ("stripe", "charges.list")
        );
        let name = ToolName::parse("stripe.create_refund").unwrap();
        assert_eq!(
            (name.connector(), name.upstream()),
            ("stripe", "create_refund")
        );
        for malformed in ["", "stripe", ".create_refund", "stripe.", "."] {
            assert!(ToolName::parse(malformed).is_none(), "{malformed:?}");
        }
    }

    #[test]
    fn built_names_split_back_into_their_parts() {
        let connector = ConnectorName::parse("stripe").unwrap();
        let name = ToolName::new(&connector, "charges.list");
        assert_eq!(name.as_str(), "stripe.charges.list");
        assert_eq!(ToolName::parse(name.as_str()).unwrap(), name);
    }
}
