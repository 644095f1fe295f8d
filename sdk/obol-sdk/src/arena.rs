//! A connector's allocator: its instance's first allocations come from a bump arena, the
//! rest from the system allocator (wasi-libc's dlmalloc).
//!
//! The host runs every call in a fresh instance and resets its memory afterwards, so the
//! bookkeeping a general allocator does to reuse freed memory is work thrown away with the
//! instance: dlmalloc and Rust's shims over it were 27.4 k of the 80.2 k instructions the
//! payments connector's own code took a call (callgrind, ADR-0077). Here an allocation moves
//! a cursor, and a free gives the space back only when it is the newest block, which is how a
//! growing buffer (a `String` or `Vec` being written) and a short-lived temporary behave; a
//! block in the middle stays spent until the instance goes.
//!
//! The arena is a fixed static, so it is part of the memory the component starts with: no
//! `memory.grow` (an `mprotect` of the host's pooled memory) to set it up. It bounds what a
//! busy instance can waste: a block larger than an eighth of the arena (or growing past it),
//! and every allocation once the arena is full, go to the system allocator, which frees and
//! reuses as before.
//!
//! On by default (the `arena` feature) for `wasm32` builds; a connector with a global
//! allocator of its own turns it off with `default-features = false`. Components have a
//! single thread, which is what makes the unsynchronised cursor sound: an [`Arena`] is `Sync`
//! (and can be the global allocator) only on `wasm32` without atomics.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::{Cell, UnsafeCell};

/// A bump arena of `N` bytes in front of the system allocator (see the module's
/// documentation).
pub struct Arena<const N: usize> {
    space: UnsafeCell<Space<N>>,
    /// The offset of the first free byte of `space`.
    cursor: Cell<usize>,
}

#[repr(C, align(16))]
struct Space<const N: usize>([u8; N]);

// SAFETY: compiled only where a program has one thread (wasm32 without atomics), so no two
// accesses to the cursor or the space can race.
#[cfg(all(target_arch = "wasm32", not(target_feature = "atomics")))]
unsafe impl<const N: usize> Sync for Arena<N> {}

impl<const N: usize> Arena<N> {
    /// Blocks above this (in size or alignment) go to the system allocator, and a block that
    /// grows past it moves there: one large buffer would otherwise fill the arena and leave
    /// the call's many small blocks to dlmalloc.
    const LARGE: usize = N / 8;

    /// An empty arena (all zero bytes: a static one costs the component no data).
    pub const fn new() -> Arena<N> {
        Arena {
            space: UnsafeCell::new(Space([0; N])),
            cursor: Cell::new(0),
        }
    }

    fn start(&self) -> *mut u8 {
        self.space.get().cast::<u8>()
    }

    /// The arena's offset of `ptr`, if the arena holds it.
    fn offset_of(&self, ptr: *mut u8) -> Option<usize> {
        ptr.addr()
            .checked_sub(self.start().addr())
            .filter(|&at| at < N)
    }

    /// A block of `layout` from the arena, if it fits.
    fn bump(&self, layout: Layout) -> Option<*mut u8> {
        if layout.size() > Self::LARGE || layout.align() > Self::LARGE {
            return None;
        }
        let base = self.start().addr();
        // Aligned as an address, not as an offset: the space itself is aligned to 16 only.
        let at = (base + self.cursor.get()).checked_next_multiple_of(layout.align())? - base;
        let end = at.checked_add(layout.size()).filter(|&end| end <= N)?;
        self.cursor.set(end);
        Some(self.start().wrapping_add(at))
    }
}

impl<const N: usize> Default for Arena<N> {
    fn default() -> Arena<N> {
        Arena::new()
    }
}

// SAFETY: every block handed out is `layout.size()` bytes at `layout.align()`, inside the
// space and below the cursor (so no later block overlaps it until it is freed), or comes from
// `System`, to which only its own blocks are returned (told apart by address).
unsafe impl<const N: usize> GlobalAlloc for Arena<N> {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        match self.bump(layout) {
            Some(block) => block,
            // SAFETY: the caller's layout, as `GlobalAlloc::alloc` requires.
            None => unsafe { System.alloc(layout) },
        }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        match self.bump(layout) {
            Some(block) => {
                // SAFETY: the block is `layout.size()` bytes the caller now owns. (Freed
                // blocks are reused, so arena memory is not known to be zero.)
                unsafe { block.write_bytes(0, layout.size()) };
                block
            }
            // SAFETY: as in `alloc`.
            None => unsafe { System.alloc_zeroed(layout) },
        }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        match self.offset_of(ptr) {
            // The newest block's space is reused; any other stays spent.
            Some(at) if at + layout.size() == self.cursor.get() => self.cursor.set(at),
            Some(_) => {}
            // SAFETY: not the arena's, so `System` allocated it with this layout.
            None => unsafe { System.dealloc(ptr, layout) },
        }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let Some(at) = self.offset_of(ptr) else {
            // SAFETY: `System`'s block, with the caller's arguments.
            return unsafe { System.realloc(ptr, layout, new_size) };
        };
        let newest = at + layout.size() == self.cursor.get();
        if newest && new_size <= Self::LARGE && at + new_size <= N {
            // Grown or shrunk where it is: the common case of a buffer being written.
            self.cursor.set(at + new_size);
            return ptr;
        }
        if new_size <= layout.size() {
            return ptr;
        }
        // SAFETY: `GlobalAlloc::realloc` requires `new_size`, rounded up to the alignment, not
        // to overflow `isize`, so the layout is valid.
        let moved_layout = unsafe { Layout::from_size_align_unchecked(new_size, layout.align()) };
        // SAFETY: a nonzero size (larger than the old one).
        let moved = unsafe { self.alloc(moved_layout) };
        if !moved.is_null() {
            // SAFETY: both blocks are at least `layout.size()` long and distinct (the new one
            // lies above the cursor or in `System`'s memory); the old one is then released.
            unsafe {
                std::ptr::copy_nonoverlapping(ptr, moved, layout.size());
                self.dealloc(ptr, layout);
            }
        }
        moved
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A small arena, so that a sequence fills it and goes on in `System`.
    type Small = Arena<4096>;

    #[derive(Debug, Clone)]
    enum Op {
        Alloc {
            size: usize,
            align: usize,
            zeroed: bool,
        },
        Free(usize),
        Realloc(usize, usize),
    }

    fn op() -> impl Strategy<Value = Op> {
        let align = prop::sample::select(vec![1usize, 2, 4, 8, 16, 64, 256]);
        prop_oneof![
            (1usize..700, align, any::<bool>()).prop_map(|(size, align, zeroed)| Op::Alloc {
                size,
                align,
                zeroed
            }),
            any::<usize>().prop_map(Op::Free),
            (any::<usize>(), 1usize..1500).prop_map(|(at, size)| Op::Realloc(at, size)),
        ]
    }

    /// A live block and the byte every one of its bytes was last set to.
    struct Block {
        ptr: *mut u8,
        layout: Layout,
        fill: u8,
    }

    fn bytes(block: &Block) -> &[u8] {
        // SAFETY: a live block of `layout.size()` bytes.
        unsafe { std::slice::from_raw_parts(block.ptr, block.layout.size()) }
    }

    fn fill(block: &mut Block, byte: u8) {
        // SAFETY: as in `bytes`.
        unsafe { block.ptr.write_bytes(byte, block.layout.size()) };
        block.fill = byte;
    }

    proptest! {
        /// Against the bytes each block was last given: every live block keeps its own,
        /// whatever was allocated, freed or moved around it, is aligned as asked, and
        /// overlaps no other; a reallocated block keeps its first bytes.
        #[test]
        fn blocks_keep_their_bytes_and_never_overlap(ops in prop::collection::vec(op(), 1..200)) {
            // Two arenas side by side: their starts differ by 16 modulo 64, so at least one is
            // not aligned to 64 and a block aligned by offset instead of address shows.
            let arenas = Box::new([Small::new(), Small::new()]);
            for arena in arenas.iter() {
                run(arena, &ops)?;
            }
        }
    }

    /// Runs `ops` on `arena`, checking every live block after each.
    fn run(arena: &Small, ops: &[Op]) -> Result<(), TestCaseError> {
        let mut live: Vec<Block> = Vec::new();
        for (n, op) in ops.iter().cloned().enumerate() {
            let byte = (n % 251) as u8 + 1;
            match op {
                Op::Alloc {
                    size,
                    align,
                    zeroed,
                } => {
                    let layout = Layout::from_size_align(size, align).unwrap();
                    // SAFETY: a nonzero size.
                    let ptr = unsafe {
                        if zeroed {
                            arena.alloc_zeroed(layout)
                        } else {
                            arena.alloc(layout)
                        }
                    };
                    prop_assert!(!ptr.is_null());
                    let mut block = Block {
                        ptr,
                        layout,
                        fill: 0,
                    };
                    if zeroed {
                        prop_assert!(bytes(&block).iter().all(|&b| b == 0));
                    }
                    fill(&mut block, byte);
                    live.push(block);
                }
                Op::Free(at) if !live.is_empty() => {
                    let block = live.swap_remove(at % live.len());
                    // SAFETY: a live block with its own layout.
                    unsafe { arena.dealloc(block.ptr, block.layout) };
                }
                Op::Realloc(at, size) if !live.is_empty() => {
                    let at = at % live.len();
                    let old = &live[at];
                    let kept = old.layout.size().min(size);
                    let was = old.fill;
                    // SAFETY: a live block with its own layout, and a nonzero size.
                    let ptr = unsafe { arena.realloc(old.ptr, old.layout, size) };
                    prop_assert!(!ptr.is_null());
                    let layout = Layout::from_size_align(size, old.layout.align()).unwrap();
                    let mut block = Block {
                        ptr,
                        layout,
                        fill: was,
                    };
                    prop_assert!(bytes(&block)[..kept].iter().all(|&b| b == was));
                    fill(&mut block, byte);
                    live[at] = block;
                }
                Op::Free(_) | Op::Realloc(..) => {}
            }
            for block in &live {
                prop_assert_eq!(block.ptr.addr() % block.layout.align(), 0);
                prop_assert!(bytes(block).iter().all(|&b| b == block.fill));
                // An arena block lies inside the arena and is small enough for it.
                if let Some(at) = arena.offset_of(block.ptr) {
                    prop_assert!(at + block.layout.size() <= 4096);
                    prop_assert!(block.layout.size() <= Small::LARGE);
                }
            }
            let mut spans: Vec<(usize, usize)> = live
                .iter()
                .map(|b| (b.ptr.addr(), b.ptr.addr() + b.layout.size()))
                .collect();
            spans.sort_unstable();
            prop_assert!(spans.windows(2).all(|pair| pair[0].1 <= pair[1].0));
        }
        for block in live {
            // SAFETY: as in `Op::Free`.
            unsafe { arena.dealloc(block.ptr, block.layout) };
        }
        Ok(())
    }

    #[test]
    fn the_newest_block_is_reused_and_grows_in_place() {
        let arena = Box::new(Small::new());
        let small = Layout::from_size_align(100, 8).unwrap();
        // SAFETY: nonzero sizes; each block is freed with its own layout.
        unsafe {
            let first = arena.alloc(small);
            assert!(
                arena.offset_of(first).is_some(),
                "a small block comes from the arena"
            );
            arena.dealloc(first, small);
            let again = arena.alloc(small);
            assert_eq!(again, first, "the newest block's space is reused");
            let grown = arena.realloc(again, small, 400);
            assert_eq!(grown, first, "the newest block grows where it is");
            let large = Layout::from_size_align(Small::LARGE + 1, 8).unwrap();
            let elsewhere = arena.alloc(large);
            assert!(
                arena.offset_of(elsewhere).is_none(),
                "a large block goes to System"
            );
            arena.dealloc(elsewhere, large);
            arena.dealloc(grown, Layout::from_size_align(400, 8).unwrap());
            assert_eq!(arena.cursor.get(), 0);
        }
    }
}
