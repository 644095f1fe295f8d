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

/// An id that sorts by when it was made: `prefix`, [`now_ms`] as 12 hex digits, then
/// `RANDOM_BYTES` from the OS in hex. A B-tree keyed by such ids takes each new one at the end
/// of its range instead of at a random leaf, so a call's writes dirty the same few pages as
/// the calls before it (ADR-0054). Written into one string of its final size: a call mints
/// two, and `format!` with `hex::encode` took 6.3 k instructions a call for them (1.8 k now).
pub fn time_ordered_id<const RANDOM_BYTES: usize>(prefix: &str) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let random = os_random::<RANDOM_BYTES>();
    let mut id = String::with_capacity(prefix.len() + 12 + 2 * RANDOM_BYTES);
    id.push_str(prefix);
    let ms = now_ms() & 0xffff_ffff_ffff;
    for shift in (0..12).rev() {
        id.push(char::from(HEX[(ms >> (4 * shift)) as usize & 0xf]));
    }
    for byte in random {
        id.push(char::from(HEX[usize::from(byte >> 4)]));
        id.push(char::from(HEX[usize::from(byte & 0xf)]));
    }
    id
}

/// `N` bytes from the OS's random source, taken from a buffer each thread refills 1 KiB at a
/// time: a call mints two ids, and a `getrandom` system call for each was two of the dozen a
/// call makes. Each byte is handed out once and zeroed as it is.
fn os_random<const N: usize>() -> [u8; N] {
    const POOL: usize = 1024;
    const { assert!(N <= POOL) };
    thread_local! {
        static UNUSED: std::cell::RefCell<([u8; POOL], usize)> =
            const { std::cell::RefCell::new(([0; POOL], POOL)) };
    }
    UNUSED.with_borrow_mut(|(pool, used)| {
        if POOL - *used < N {
            getrandom::fill(pool).expect("the OS random source is available");
            *used = 0;
        }
        let taken = &mut pool[*used..*used + N];
        let mut bytes = [0u8; N];
        bytes.copy_from_slice(taken);
        taken.fill(0);
        *used += N;
        bytes
    })
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

    /// Minted keys and receipt ids made a millisecond apart sort in the order they were made,
    /// and a burst made within one millisecond never repeats itself.
    #[test]
    fn minted_ids_sort_by_when_they_were_made_and_never_repeat() {
        let (mut keys, mut receipts) = (Vec::new(), Vec::new());
        for _ in 0..10 {
            keys.push(crate::idempotency::IdempotencyKey::mint().to_string());
            receipts.push(crate::invoke::receipt::new_id());
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        for made in [keys, receipts] {
            let mut sorted = made.clone();
            sorted.sort();
            assert_eq!(sorted, made);
        }
        let burst: std::collections::HashSet<String> = (0..10_000)
            .map(|_| crate::idempotency::IdempotencyKey::mint().to_string())
            .collect();
        assert_eq!(burst.len(), 10_000);
        for key in burst.iter().take(3) {
            assert!(
                crate::idempotency::IdempotencyKey::parse(key).is_ok(),
                "{key}"
            );
        }
    }

    /// An id reads back as its prefix, the clock when it was made (12 hex digits) and as
    /// many random bytes as asked for, in lowercase hex.
    #[test]
    fn an_id_is_its_prefix_its_time_and_its_random_bytes_in_hex() {
        let before = now_ms();
        let id = time_ordered_id::<16>("rcp_");
        let after = now_ms();
        let rest = id.strip_prefix("rcp_").unwrap();
        assert_eq!(rest.len(), 12 + 32, "{id}");
        let made = u64::from_str_radix(&rest[..12], 16).unwrap();
        assert!((before..=after).contains(&made), "{before} {made} {after}");
        let random = hex::decode(&rest[12..]).unwrap();
        assert_eq!(random.len(), 16);
        assert_eq!(
            hex::encode(&random),
            rest[12..],
            "lowercase, two digits a byte"
        );
        let ids: std::collections::HashSet<String> =
            (0..1_000).map(|_| time_ordered_id::<16>("")).collect();
        assert_eq!(ids.len(), 1_000);
    }

    /// Ids minted together on several threads, thousands within each millisecond and across
    /// many refills of each thread's random bytes, never repeat: no byte is handed out twice.
    #[test]
    fn ids_minted_on_many_threads_at_once_never_repeat() {
        let threads: Vec<_> = (0..4)
            .map(|_| {
                std::thread::spawn(|| {
                    (0..5_000)
                        .map(|_| time_ordered_id::<16>(""))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        let ids: std::collections::HashSet<String> = threads
            .into_iter()
            .flat_map(|thread| thread.join().unwrap())
            .collect();
        assert_eq!(ids.len(), 20_000);
        let randoms: std::collections::HashSet<&str> = ids.iter().map(|id| &id[12..]).collect();
        assert_eq!(randoms.len(), 20_000, "random parts repeat across ids");
    }

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
