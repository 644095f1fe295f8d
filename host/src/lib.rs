//! Obol: one MCP endpoint in front of many WebAssembly connectors.
//!
//! The modules, in the order a `tools/call` meets them:
//!
//! - [`mcp`]: the `/mcp` Streamable HTTP transport, sessions, JSON-RPC dispatch.
//! - [`policy`]: virtual keys and what each may list and call.
//! - [`approvals`]: tickets, signed tokens and owner tokens for held destructive calls.
//! - [`catalog`]: connectors, their validated manifests, `connector.tool` names, snapshots.
//! - [`progressive`]: `search_tools` and `call_tool`, what keys in progressive mode list.
//! - [`capability`]: the router that resolves a `cap.*` call to one provider, and the circuit
//!   breaker it reads.
//! - [`idempotency`]: idempotency keys, canonical request hashes, exact numbers.
//! - [`invoke`]: the invocation lifecycle: one short driver of typed phases, a file per phase.
//! - [`runtime`]: the wasmtime sandbox a connector's `prepare` and `interpret` run in.
//! - [`outbound`]: the one place a request leaves the gateway for a vendor.
//! - [`broker`]: what the host knows of each catalog broker (retries off, its record id).
//! - [`upstream`]: remote MCP servers: the rmcp session pool, tools cache, health, and
//!   ADR-0045's outcome rules.
//! - [`store`]: claims, attempt reservations, receipts and audit, embedded or on Redis.
//! - [`error`]: the one error enum and its rendering to JSON-RPC codes and HTTP statuses.
//!
//! Around them: [`config`] (the operator's file), [`gateway`] (shared state, hot reload),
//! [`server`] (startup, background tasks, the HTTP server), [`admin`] (keys and publications
//! managed at runtime), [`http`] (the REST routes: receipts, approvals; the owner's inbox
//! page), [`clock`] (the one clock), [`allocator`] (the binary's, by block size) and
//! [`sandbox`] (a local stand-in vendor for trying Obol offline).

pub mod admin;
pub mod allocator;
pub mod approvals;
pub mod broker;
pub mod capability;
pub mod catalog;
pub mod clock;
pub mod config;
mod digest;
pub mod error;
#[cfg(feature = "test-util")]
pub mod failpoint;
pub mod gateway;
pub mod harness;
pub mod hotload;
pub mod http;
pub mod idempotency;
pub mod idle;
pub mod invoke;
pub mod listener;
pub mod mcp;
pub mod metrics;
pub mod names;
pub mod outbound;
pub mod policy;
pub mod progressive;
#[cfg(test)]
mod properties;
pub mod sandbox;
pub mod scaffold;
pub mod server;
pub mod store;
pub mod telemetry;
pub mod upstream;

/// The sandbox is its own crate (`host/runtime`, ADR-0051).
pub use obol_runtime as runtime;
