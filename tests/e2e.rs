//! End-to-end tests: the real `obol` binary, real MCP clients, mock vendors on loopback.
//!
//! One test binary (linked once) with a module per concern:
//!
//! - `transport`: the `/mcp` HTTP status matrix, sessions, SSE, protocol negotiation.
//! - `tools`: listing and calling through rmcp's client; namespacing; key globs; credentials.
//! - `sandboxing`: hostile components and refused manifests.
//! - `python_client`: the official Python `mcp` SDK against the gateway.
//! - `admin`: keys and publications managed on a running gateway (`obol keys`, `obol policies`).
//! - `approvals`: held destructive calls, the owner's inbox (in headless Chromium), tokens.
//! - `lifecycle`: attempt accounting over every path, hang-ups, unrecorded outcomes, key echo.
//! - `brokers`: federated connectors (Nango- and Composio-shaped) through a mock broker; the
//!   host's retry-off directive, evidence classes; contract 0.1.0 components.
//! - `capabilities`: `cap.*` routed across a component and an MCP upstream provider: breaker
//!   failover for new keys, recorded routes for retries, pins, visibility, `POST /v1/route`.
//! - `progressive`: progressive mode (`search_tools`, `call_tool`) through rmcp's client.
//! - `scaffold`: `obol new connector` outside this repository: it builds, passes its own
//!   tests, `obol check` accepts it and a gateway serves it.
//! - `stateless`: MCP 2026-07-28 without sessions: `server/discover`, the revision's header
//!   checks and codes, caching hints, `subscriptions/listen`, rmcp in discover mode.
//! - `console`: the operator console in headless Chromium: an owner's charts, receipts and
//!   pending approvals; the admin's connectors and keys pages, which an owner may not see.
//! - `conformance`: the official `@modelcontextprotocol/conformance` suite against a gateway.
//! - `redaction`: a scenario of every kind of call, an approval, errors and a hot-load with
//!   canary secrets everywhere they can enter, and none in the JSON log, metrics, errors or
//!   receipts.
//! - `hotload`: components added, replaced and removed on a running gateway (the watched
//!   directory, the admin API, `obol connectors`), a retry across versions, 100 swaps under
//!   load, signed and pinned components (`[connectors.trust]`, interoperating with minisign).
//! - `telemetry`: OpenTelemetry export (the `otlp` feature) to an OTLP/HTTP receiver on
//!   loopback: a tool call's spans continue the client's trace and carry nothing secret.
//! - `upstreams`: remote MCP servers (`kind = "mcp"`): a misbehaving mock and the official
//!   reference server, through the same lifecycle.

mod support;

mod admin;
mod approvals;
mod brokers;
mod capabilities;
mod conformance;
mod console;
mod hostile;
mod hotload;
mod idempotency;
mod lifecycle;
mod policy;
mod progressive;
mod python_client;
mod redaction;
mod redis_store;
mod sandboxing;
mod scaffold;
mod stateless;
mod telemetry;
mod tools;
mod transport;
mod upstreams;
