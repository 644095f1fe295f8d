//! Failpoints for crash and failure tests. Compiled only with the `test-util` feature, so the
//! shipped binary has none. Activated by name through `OBOL_FAILPOINTS` (comma-separated).

/// Whether the named failpoint is active in this process.
pub fn active(name: &str) -> bool {
    std::env::var("OBOL_FAILPOINTS")
        .map(|list| list.split(',').any(|item| item.trim() == name))
        .unwrap_or(false)
}
