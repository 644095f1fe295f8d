//! The gateway's clock: milliseconds since the Unix epoch.
//!
//! The wall clock is read once per process and advanced by the monotonic clock from then on,
//! so a wall-clock step while the gateway runs (NTP, an operator) cannot end a live lease
//! early, stretch a deadline or reorder receipts. (Linux's monotonic clock follows NTP's rate
//! corrections, only not its steps, so it keeps pace with the wall clock.) Leases shared
//! between gateways are judged on the store's clock instead (`docs/operations.md`).
//!
//! One function, so that test builds can run every deadline, lease and expiry ahead together
//! (`OBOL_CLOCK_OFFSET_MS`) and a test can see a day pass without waiting for it.

use std::sync::OnceLock;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch, on this process's monotonic timeline.
pub fn now_ms() -> u64 {
    static ANCHOR: OnceLock<(u64, Instant)> = OnceLock::new();
    let (wall_ms, at) = *ANCHOR.get_or_init(|| (wall_ms(), Instant::now()));
    let now = wall_ms + at.elapsed().as_millis() as u64;
    #[cfg(feature = "test-util")]
    let now = now + crate::failpoint::clock_offset_ms();
    now
}

fn wall_ms() -> u64 {
    let wall = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    #[cfg(feature = "test-util")]
    let wall = wall + crate::failpoint::wall_clock_step_ms();
    wall
}

#[cfg(all(test, feature = "test-util"))]
mod tests {
    use super::*;

    /// A wall-clock step a minute forward while the process runs moves no lease: the clock
    /// keeps its monotonic pace.
    #[test]
    fn a_wall_clock_step_does_not_move_the_clock() {
        let before = now_ms();
        crate::failpoint::step_wall_clock_ms(60_000);
        let after = now_ms();
        assert!(
            after >= before && after - before < 1_000,
            "{before} → {after}"
        );
        let (a, b) = (now_ms(), now_ms());
        assert!(b >= a);
        assert!(wall_ms() >= after + 59_000, "the wall clock did step");
    }
}
