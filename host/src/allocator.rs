//! The `obol` binary's memory allocator: mimalloc, without transparent huge pages and with
//! freed memory returned at once.
//!
//! A call allocates and frees many small objects across the runtime's worker threads and the
//! store's writer; glibc's malloc spent about 14 % of the gateway's CPU at concurrency 32.
//! Measured against glibc in the same runs (docs/performance.md), mimalloc takes 5–17 % off
//! the embedded-store gateway's CPU per call. At its defaults, though, it kept what compiling
//! the components at start-up used: an idle gateway with one connector held 112 MiB instead
//! of 46, in huge pages (it asks the kernel for them on its arenas) and in pages it returns
//! only after 1 to 10 seconds. Built without the huge-page request (`no_thp`) and with no
//! purge delay, the idle gateway holds 44 MiB. An operator's `MIMALLOC_PURGE_DELAY` still wins.
//!
//! Only the binary installs the allocator (`main.rs`); a program that links the library keeps
//! its own.

pub use mimalloc::MiMalloc;

/// mimalloc 3's number for the purge delay (`mi_option_e` in `mimalloc.h`); the crate names
/// only version 2's numbers. The test below checks it against the linked library's default.
const PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// Returns freed memory to the system at once; call it first thing in `main`, before any
/// thread starts.
pub fn tune() {
    // SAFETY: `mi_option_set_default` stores a value in mimalloc's option table unless the
    // environment set it; it is not thread safe, hence before any other thread exists.
    #[allow(unsafe_code)]
    unsafe {
        libmimalloc_sys::mi_option_set_default(PURGE_DELAY, 0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The number names the option meant: the linked mimalloc reports version 3's default
    /// purge delay (1,000 ms) for it. A mimalloc that renumbers its options fails here, not
    /// silently in production.
    #[test]
    fn the_option_number_names_the_purge_delay() {
        // SAFETY: reading an option is a lookup in mimalloc's table; nothing set it in this
        // test process (`tune` is only called by the binary).
        #[allow(unsafe_code)]
        let delay = unsafe { libmimalloc_sys::mi_option_get(PURGE_DELAY) };
        assert_eq!(delay, 1000);
    }
}
