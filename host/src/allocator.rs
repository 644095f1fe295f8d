//! The `obol` binary's allocator: mimalloc for small blocks, the system's for large ones
//! (ADR-0070).
//!
//! A call makes some 320 small allocations and as many frees; on glibc they were about a sixth
//! of the gateway's CPU. mimalloc makes them cheaper, but it keeps freed memory for a while
//! before handing it back, and under a crowd of large uploads that held the gateway's RSS some
//! 40 MiB higher (ADR-0069). Request bodies, response bodies and the buffers they are read
//! into are the blocks that are large, so they go to the system's allocator, which gives a
//! large block back as glibc always has. Everything under 64 KiB is mimalloc's.
//!
//! Only the binary installs it (`main.rs`); a program that links the library keeps its own.

use std::alloc::{GlobalAlloc, Layout, System};

use mimalloc::MiMalloc;

/// The size from which a block is the system allocator's. Every block a call allocates on
/// its way (headers, JSON values, records, small bodies) is below it; the read buffers of a
/// large body and the body itself grow past it.
const LARGE: usize = 64 << 10;

/// Routes each block by its size, so a block is freed and resized by the allocator that gave
/// it: a `Layout` passed to `dealloc` or `realloc` is the one the block was allocated with.
#[derive(Debug, Clone, Copy, Default)]
pub struct BySize;

/// Which allocator a block of `size` bytes belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Owner {
    Small,
    Large,
}

impl Owner {
    fn of(size: usize) -> Owner {
        if size >= LARGE {
            Owner::Large
        } else {
            Owner::Small
        }
    }

    /// The allocator that gave the block at `ptr`, asked of mimalloc itself. glibc ignores the
    /// size a block is freed with, so a library that frees with another size than it allocated
    /// used to be harmless; here it would reach the wrong allocator. Debug builds, which the
    /// end-to-end tests run, check every free and resize against this.
    #[allow(unsafe_code)]
    fn of_block(ptr: *mut u8) -> Owner {
        unsafe extern "C" {
            /// mimalloc's own "is this in my arenas" (linked with the crate).
            fn mi_is_in_heap_region(p: *const std::ffi::c_void) -> bool;
        }
        // SAFETY: a lookup of an address in mimalloc's page map; it reads no block.
        if unsafe { mi_is_in_heap_region(ptr.cast()) } {
            Owner::Small
        } else {
            Owner::Large
        }
    }
}

#[allow(unsafe_code)]
unsafe extern "C" {
    // mimalloc's unaligned entry points (linked with the crate, whose `MiMalloc` calls only
    // the aligned ones).
    fn mi_malloc(size: usize) -> *mut std::ffi::c_void;
    fn mi_zalloc(size: usize) -> *mut std::ffi::c_void;
    fn mi_realloc(p: *mut std::ffi::c_void, size: usize) -> *mut std::ffi::c_void;
}

/// The alignment every block of mimalloc's has: its size classes are whole words.
const WORD: usize = std::mem::size_of::<usize>();

/// Whether a block needs no more than mimalloc's word alignment, as nearly all do (strings,
/// vectors, most structs), and so takes its plain entry points. The aligned ones, which
/// `MiMalloc` always calls, take a block from the size's page only if one is at hand there;
/// when the page's free list is used up (at each refill) they go the slow way, which for a
/// size class that is not a power of two (48, 80, 96 bytes...) pads the request first: 34 of
/// a call's ~310 allocations, at ~240 instructions each against ~13 (callgrind).
fn word_aligned(layout: Layout) -> bool {
    layout.align() <= WORD
}

// SAFETY: each method forwards to the allocator that owns the block by `Owner::of` of its
// size, which `GlobalAlloc`'s contract fixes: `dealloc` and `realloc` receive the layout the
// block was allocated (or last reallocated) with. mimalloc's plain entry points return blocks
// aligned to a word, which `word_aligned` layouts ask no more than; `mi_free` frees blocks of
// either kind, and a block keeps its kind, since its alignment never changes.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for BySize {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract is passed on unchanged.
        unsafe {
            match Owner::of(layout.size()) {
                Owner::Small if word_aligned(layout) => mi_malloc(layout.size()).cast(),
                Owner::Small => MiMalloc.alloc(layout),
                Owner::Large => System.alloc(layout),
            }
        }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as `alloc`.
        unsafe {
            match Owner::of(layout.size()) {
                Owner::Small if word_aligned(layout) => mi_zalloc(layout.size()).cast(),
                Owner::Small => MiMalloc.alloc_zeroed(layout),
                Owner::Large => System.alloc_zeroed(layout),
            }
        }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        debug_assert_eq!(Owner::of_block(ptr), Owner::of(layout.size()), "{layout:?}");
        // SAFETY: `layout` is the block's own, so `Owner::of` names the allocator that gave it.
        unsafe {
            match Owner::of(layout.size()) {
                Owner::Small => MiMalloc.dealloc(ptr, layout),
                Owner::Large => System.dealloc(ptr, layout),
            }
        }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let from = Owner::of(layout.size());
        let to = Owner::of(new_size);
        debug_assert_eq!(Owner::of_block(ptr), from, "{layout:?}");
        // SAFETY: the same owner resizes its own block; across owners, the new block is
        // allocated from the new owner, the smaller size copied into it, and the old block
        // freed from its owner only after the copy (and not at all if the new allocation
        // failed, as `realloc`'s contract requires).
        unsafe {
            match (from, to) {
                (Owner::Small, Owner::Small) if word_aligned(layout) => {
                    mi_realloc(ptr.cast(), new_size).cast()
                }
                (Owner::Small, Owner::Small) => MiMalloc.realloc(ptr, layout, new_size),
                (Owner::Large, Owner::Large) => System.realloc(ptr, layout, new_size),
                _ => {
                    let new_layout = Layout::from_size_align_unchecked(new_size, layout.align());
                    let moved = self.alloc(new_layout);
                    if !moved.is_null() {
                        std::ptr::copy_nonoverlapping(ptr, moved, layout.size().min(new_size));
                        self.dealloc(ptr, layout);
                    }
                    moved
                }
            }
        }
    }
}

#[cfg(test)]
#[allow(unsafe_code)]
mod tests {
    use super::*;

    fn mimallocs(ptr: *mut u8) -> bool {
        Owner::of_block(ptr) == Owner::Small
    }

    fn filled(size: usize, seed: u8) -> Vec<u8> {
        (0..size)
            .map(|i| (i as u8).wrapping_mul(31) ^ seed)
            .collect()
    }

    /// Every alignment a `Layout` may ask for is kept, on both of mimalloc's paths (a word or
    /// less, and more), for sizes around its size classes, when allocated, zeroed and resized.
    #[test]
    fn every_block_has_the_alignment_it_asked_for() {
        let sizes = (1..=160).chain([255, 256, 257, 1000, 4095, 4096, 10_000, LARGE - 1]);
        for size in sizes {
            for align in [1, 2, 4, 8, 16, 32, 64, 128, 4096] {
                let layout = Layout::from_size_align(size, align).unwrap();
                // SAFETY: non-zero layouts; each block resized and freed with its current one.
                unsafe {
                    let block = BySize.alloc(layout);
                    assert_eq!(block as usize % align, 0, "{layout:?}");
                    let grown = BySize.realloc(block, layout, size + 24);
                    assert_eq!(grown as usize % align, 0, "{layout:?} grown by 24");
                    BySize.dealloc(grown, Layout::from_size_align(size + 24, align).unwrap());
                    let zeroed = BySize.alloc_zeroed(layout);
                    assert_eq!(zeroed as usize % align, 0, "{layout:?} zeroed");
                    BySize.dealloc(zeroed, layout);
                }
            }
        }
    }

    #[test]
    fn small_blocks_are_mimallocs_and_large_ones_the_systems() {
        for (size, mimalloc) in [
            (1, true),
            (LARGE - 1, true),
            (LARGE, false),
            (8 << 20, false),
        ] {
            let layout = Layout::from_size_align(size, 8).unwrap();
            // SAFETY: a non-zero layout, freed with the same layout.
            unsafe {
                let block = BySize.alloc(layout);
                assert!(!block.is_null());
                assert_eq!(mimallocs(block), mimalloc, "a block of {size} bytes");
                BySize.dealloc(block, layout);
                let zeroed = BySize.alloc_zeroed(layout);
                assert_eq!(
                    mimallocs(zeroed),
                    mimalloc,
                    "a zeroed block of {size} bytes"
                );
                assert!(
                    std::slice::from_raw_parts(zeroed, size)
                        .iter()
                        .all(|&b| b == 0)
                );
                BySize.dealloc(zeroed, layout);
            }
        }
    }

    /// A block grown and shrunk across `LARGE` changes owner and keeps its bytes; the sizes
    /// are the interesting ones around the edge and well past it, in both directions.
    #[test]
    fn a_block_resized_across_the_edge_moves_with_its_bytes() {
        let sizes = [
            100,
            LARGE - 1,
            LARGE,
            LARGE + 1,
            3 * LARGE,
            LARGE - 8,
            17,
            1 << 20,
            5,
        ];
        for align in [1, 8, 64, 4096] {
            let mut layout = Layout::from_size_align(sizes[0], align).unwrap();
            let expected = filled(sizes[0], align as u8);
            // SAFETY: every block is written within its size and resized or freed with the
            // layout it has at that moment.
            unsafe {
                let mut block = BySize.alloc(layout);
                assert!(!block.is_null());
                std::ptr::copy_nonoverlapping(expected.as_ptr(), block, sizes[0]);
                let mut expected = expected;
                for (round, &size) in sizes.iter().enumerate().skip(1) {
                    block = BySize.realloc(block, layout, size);
                    assert!(!block.is_null());
                    assert_eq!(block as usize % align, 0, "alignment {align} kept");
                    assert_eq!(
                        mimallocs(block),
                        size < LARGE,
                        "owner after resizing to {size}"
                    );
                    let kept = expected.len().min(size);
                    assert_eq!(
                        std::slice::from_raw_parts(block, kept),
                        &expected[..kept],
                        "the first {kept} bytes survive resizing to {size} (align {align})"
                    );
                    // New bytes for the next round, so a stale copy cannot pass.
                    expected = filled(size, round as u8 ^ align as u8);
                    std::ptr::copy_nonoverlapping(expected.as_ptr(), block, size);
                    layout = Layout::from_size_align(size, align).unwrap();
                }
                BySize.dealloc(block, layout);
            }
        }
    }
}
