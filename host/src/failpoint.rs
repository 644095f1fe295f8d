//! Failpoints for crash and failure tests. Compiled only with the `test-util` feature, so the
//! shipped binary has none. Activated by name through `OBOL_FAILPOINTS` (comma-separated):
//! `NAME` fires every time, `NAME=N` only the first N times in this process.

use std::collections::HashMap;
use std::sync::Mutex;

/// Whether the named failpoint fires now.
pub fn active(name: &str) -> bool {
    // Read once: the tests set the variable when they start the process, and the hot path
    // asks on every call (reading the environment takes a lock and allocates).
    static LIST: std::sync::OnceLock<Vec<(String, Option<u64>)>> = std::sync::OnceLock::new();
    let list = LIST.get_or_init(|| {
        std::env::var("OBOL_FAILPOINTS")
            .unwrap_or_default()
            .split(',')
            .map(str::trim)
            .filter(|item| !item.is_empty())
            .filter_map(|item| match item.split_once('=') {
                // `NAME=N` with an N that does not parse names no failpoint.
                Some((point, times)) => Some((point.to_owned(), Some(times.parse().ok()?))),
                None => Some((item.to_owned(), None)),
            })
            .collect()
    });
    for (point, times) in list {
        if point != name {
            continue;
        }
        let Some(times) = times else {
            return true;
        };
        static FIRED: Mutex<Option<HashMap<String, u64>>> = Mutex::new(None);
        let mut fired = FIRED.lock().expect("failpoint counts");
        let count = fired
            .get_or_insert_with(HashMap::new)
            .entry(name.to_owned())
            .or_insert(0);
        *count += 1;
        return *count <= *times;
    }
    false
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

static WALL_CLOCK_STEP_MS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// How far a test stepped the wall clock this process reads (see [`step_wall_clock_ms`]).
pub fn wall_clock_step_ms() -> u64 {
    WALL_CLOCK_STEP_MS.load(std::sync::atomic::Ordering::Relaxed)
}

/// Steps the wall clock this process reads forward by `ms`, as NTP or an operator could.
pub fn step_wall_clock_ms(ms: u64) {
    WALL_CLOCK_STEP_MS.fetch_add(ms, std::sync::atomic::Ordering::Relaxed);
}
