//! Remote MCP servers as connectors (issue 11; ADR-0045). This module holds the rules that
//! decide what a tool behind an upstream is and what an attempt to call it proved; the
//! transport, the pool and the catalog merge build on them.

pub mod effect;
