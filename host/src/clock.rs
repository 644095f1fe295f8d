//! The gateway's clock: milliseconds since the Unix epoch.
//!
//! One function, so that test builds can run every deadline, lease and expiry ahead together
//! (`OBOL_CLOCK_OFFSET_MS`) and a test can see a day pass without waiting for it.

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> u64 {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    #[cfg(feature = "test-util")]
    let now = now + crate::failpoint::clock_offset_ms();
    now
}
