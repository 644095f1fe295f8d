//! Failpoints for crash and failure tests. Compiled only with the `test-util` feature, so the
//! shipped binary has none. Activated by name through `OBOL_FAILPOINTS` (comma-separated).

/// Whether the named failpoint is active in this process.
pub fn active(name: &str) -> bool {
    std::env::var("OBOL_FAILPOINTS")
        .map(|list| list.split(',').any(|item| item.trim() == name))
        .unwrap_or(false)
}

/// How far `OBOL_CLOCK_OFFSET_MS` runs this process's clock ahead (read once), so a test can
/// restart the gateway "a day later".
pub fn clock_offset_ms() -> u64 {
    static OFFSET: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *OFFSET.get_or_init(|| {
        std::env::var("OBOL_CLOCK_OFFSET_MS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    })
}
