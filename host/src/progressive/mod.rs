//! Progressive tools (spec/mcp-gateway.md, "Progressive tools"): keys in progressive mode see
//! `search_tools` and `call_tool` instead of every tool. This module holds the search index
//! and its ranking; the listing and the call boundary build on it (issue 12).

pub mod search;
