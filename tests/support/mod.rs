//! What every end-to-end test needs: a real `obol` process, a mock vendor on loopback that
//! counts what it receives, and real MCP clients.

#![allow(dead_code)]

pub mod broker;
pub mod browser;
pub mod client;
pub mod everything;
pub mod gateway;
pub mod redis;
pub mod upstream;
pub mod vendor;

pub use client::{McpClient, RawMcp};
pub use gateway::{GatewayConfig, GatewayProcess};
pub use redis::{RedisCluster, RedisServer};
pub use upstream::MockUpstream;
pub use vendor::{MockVendor, Reply};

/// The token of the key most tests use, and the secret its connections carry.
pub const TOKEN: &str = "obk_test_owner";
pub const SECRET: &str = "sk_test_ThisMustNeverLeakOutsideTheOutboundHop";

/// Paths of the guest components built by the host's build script.
pub mod guests {
    pub const PAYMENTS: &str = env!("OBOL_GUEST_PAYMENTS");
    pub const PAYMENTS_NEXT: &str = env!("OBOL_GUEST_PAYMENTS_NEXT");
    pub const TRACKER: &str = env!("OBOL_GUEST_TRACKER");
    /// The tracker at version `0.2.0-next`: its text answers end `[tracker 0.2.0-next]`.
    pub const TRACKER_NEXT: &str = env!("OBOL_GUEST_TRACKER_NEXT");
    pub const HOSTILE: &str = env!("OBOL_GUEST_HOSTILE");
    pub const NANGO: &str = env!("OBOL_GUEST_NANGO");
    pub const COMPOSIO: &str = env!("OBOL_GUEST_COMPOSIO");
    pub const MISFITS: [(&str, &str); 7] = [
        ("dotted-name", env!("OBOL_GUEST_MISFIT_DOTTED_NAME")),
        ("empty-name", env!("OBOL_GUEST_MISFIT_EMPTY_NAME")),
        ("duplicate-tool", env!("OBOL_GUEST_MISFIT_DUPLICATE_TOOL")),
        ("bad-schema", env!("OBOL_GUEST_MISFIT_BAD_SCHEMA")),
        ("overlap", env!("OBOL_GUEST_MISFIT_OVERLAP")),
        ("reserved-prefix", env!("OBOL_GUEST_MISFIT_RESERVED_PREFIX")),
        ("reserved-tool", env!("OBOL_GUEST_MISFIT_RESERVED_TOOL")),
    ];
}

/// `sha256:<hex>` of a token, as the config wants it.
pub fn key_hash(token: &str) -> String {
    obol::policy::KeyHash::of_token(token).to_string()
}
