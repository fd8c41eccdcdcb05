//! The guest's allocator: power-of-two size classes with one free list each, carved from
//! memory obtained by `memory.grow`.
//!
//! Why this and not dlmalloc: a plugin's allocations are few and repetitive (the host's input
//! buffer, reused across slabs and regrown rarely; a config parse per slab), so exact-size
//! reuse from a free list is all it needs. It is ~100 lines with no dependency (nothing for
//! the nested wasm build to download), never moves or coalesces, and is deterministic, which
//! replay relies on. The cost is up to 2x internal waste on odd sizes, acceptable under the
//! host's 64 MiB memory limit.
//!
//! The logic is generic over [`Grow`] so native tests drive it over an ordinary buffer.

// Natively only the tests use it; the wasm32 build installs it as the global allocator.
#![cfg_attr(
    not(all(target_arch = "wasm32", feature = "global-allocator")),
    allow(dead_code)
)]

use core::alloc::Layout;
use core::ptr;

/// Size in bytes of a Wasm page (the unit of `memory.grow`, from the Wasm spec).
pub(crate) const PAGE_BYTES: usize = 65_536;
/// Smallest block in bytes: room for the free list's next pointer, and the ABI's 8-byte
/// alignment of `narad_alloc`.
const MIN_BLOCK_BYTES: usize = 8;
/// Number of size classes: 8 B (2^3) up to 2 GiB (2^31), past any memory a wasm32 host allows.
const CLASSES: usize = 29;

/// Source of fresh memory.
pub(crate) trait Grow {
    /// Adds `pages` pages; returns the address of the first new byte, or `None` when refused.
    fn grow(&mut self, pages: usize) -> Option<usize>;
}

/// The allocator state.
pub(crate) struct Heap<G> {
    /// Head of each class's free list (0 = empty); the next pointer is stored in the block.
    free: [usize; CLASSES],
    /// Next unused address of the current run of grown memory.
    bump: usize,
    /// End of the current run.
    end: usize,
    grow: G,
}

/// The class index and block size for `layout`, or `None` when it cannot be served.
fn class_of(layout: Layout) -> Option<(usize, usize)> {
    if layout.align() > PAGE_BYTES {
        return None;
    }
    let size = layout
        .size()
        .max(layout.align())
        .max(MIN_BLOCK_BYTES)
        .checked_next_power_of_two()?;
    let class = (size.trailing_zeros() - MIN_BLOCK_BYTES.trailing_zeros()) as usize;
    (class < CLASSES).then_some((class, size))
}

impl<G: Grow> Heap<G> {
    pub(crate) const fn new(grow: G) -> Self {
        Self {
            free: [0; CLASSES],
            bump: 0,
            end: 0,
            grow,
        }
    }

    /// A block for `layout`, or null when memory cannot grow.
    pub(crate) fn alloc(&mut self, layout: Layout) -> *mut u8 {
        let Some((class, size)) = class_of(layout) else {
            return ptr::null_mut();
        };
        let head = self.free[class];
        if head != 0 {
            // SAFETY: `head` is a block of this class that `dealloc` put on the list and
            // whose first word holds the next pointer; blocks are at least 8-aligned.
            self.free[class] = unsafe { (head as *const usize).read() };
            return head as *mut u8;
        }
        // A block of size s is aligned to min(s, page), which covers any align <= s.
        let align = size.min(PAGE_BYTES);
        let mut start = (self.bump + align - 1) & !(align - 1);
        if start.checked_add(size).is_none_or(|e| e > self.end) {
            let pages = size.div_ceil(PAGE_BYTES) + 1;
            let Some(base) = self.grow.grow(pages) else {
                return ptr::null_mut();
            };
            if base != self.end {
                // Someone else grew memory in between: start a new run.
                self.bump = base;
            }
            self.end = base + pages * PAGE_BYTES;
            start = (self.bump + align - 1) & !(align - 1);
            if start + size > self.end {
                return ptr::null_mut();
            }
        }
        self.bump = start + size;
        start as *mut u8
    }

    /// Returns a block to its class's free list.
    ///
    /// # Safety
    /// `p` must come from [`Self::alloc`] with the same `layout`, and not be freed twice.
    pub(crate) unsafe fn dealloc(&mut self, p: *mut u8, layout: Layout) {
        let Some((class, _)) = class_of(layout) else {
            return;
        };
        if p.is_null() {
            return;
        }
        // SAFETY: the caller promises `p` is a live block of this class (>= 8 bytes, 8-aligned).
        unsafe { (p as *mut usize).write(self.free[class]) };
        self.free[class] = p as usize;
    }
}

#[cfg(all(target_arch = "wasm32", feature = "global-allocator"))]
mod global {
    //! The global allocator of a wasm32 plugin.
    use core::alloc::{GlobalAlloc, Layout};
    use core::cell::UnsafeCell;

    use super::{Grow, Heap, PAGE_BYTES};

    /// `memory.grow` on memory 0.
    pub(crate) struct MemoryGrow;

    impl Grow for MemoryGrow {
        fn grow(&mut self, pages: usize) -> Option<usize> {
            let old = core::arch::wasm32::memory_grow(0, pages);
            (old != usize::MAX).then(|| old * PAGE_BYTES)
        }
    }

    pub(crate) struct WasmHeap(UnsafeCell<Heap<MemoryGrow>>);

    // SAFETY: a plugin instance runs on one thread: the host builds no shared memory and the
    // crate refuses to build with the `atomics` target feature below.
    unsafe impl Sync for WasmHeap {}

    #[cfg(target_feature = "atomics")]
    compile_error!("narad-guest's allocator is single-threaded; build without `atomics`");

    unsafe impl GlobalAlloc for WasmHeap {
        unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
            // SAFETY: single-threaded (see `Sync` above) and not re-entered.
            unsafe { (*self.0.get()).alloc(layout) }
        }

        unsafe fn dealloc(&self, p: *mut u8, layout: Layout) {
            // SAFETY: single-threaded; `p`/`layout` come from `alloc` per GlobalAlloc's contract.
            unsafe { (*self.0.get()).dealloc(p, layout) }
        }
    }

    #[global_allocator]
    static HEAP: WasmHeap = WasmHeap(UnsafeCell::new(Heap::new(MemoryGrow)));
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // a failed unwrap in a test is a failed test
mod tests {
    extern crate std;
    use std::vec::Vec;

    use super::*;

    /// Hands out pages of a fixed buffer, like `memory.grow` up to a limit.
    struct Pages {
        base: usize,
        used: usize,
        limit: usize,
        _buf: Vec<u64>,
    }

    impl Pages {
        fn new(pages: usize) -> Self {
            let buf = std::vec![0u64; (pages + 1) * PAGE_BYTES / 8];
            let base = (buf.as_ptr() as usize + PAGE_BYTES - 1) & !(PAGE_BYTES - 1);
            Self {
                base,
                used: 0,
                limit: pages,
                _buf: buf,
            }
        }
    }

    impl Grow for Pages {
        fn grow(&mut self, pages: usize) -> Option<usize> {
            if self.used + pages > self.limit {
                return None;
            }
            let at = self.base + self.used * PAGE_BYTES;
            self.used += pages;
            Some(at)
        }
    }

    #[test]
    fn blocks_are_aligned_and_do_not_overlap() {
        let mut heap = Heap::new(Pages::new(64));
        let mut blocks = Vec::new();
        for (size, align) in [
            (1, 1),
            (8, 8),
            (13, 4),
            (100, 16),
            (4096, 4096),
            (70_000, 8),
        ] {
            let l = Layout::from_size_align(size, align).unwrap();
            let p = heap.alloc(l) as usize;
            assert_ne!(p, 0);
            assert_eq!(p % align.max(8), 0, "size {size} align {align}");
            blocks.push((p, size));
        }
        blocks.sort();
        for w in blocks.windows(2) {
            assert!(w[0].0 + w[0].1 <= w[1].0, "{w:?} overlap");
        }
    }

    #[test]
    fn a_freed_block_is_reused_for_the_same_class() {
        let mut heap = Heap::new(Pages::new(8));
        let l = Layout::from_size_align(300, 8).unwrap();
        let a = heap.alloc(l);
        unsafe { heap.dealloc(a, l) };
        let b = heap.alloc(Layout::from_size_align(400, 8).unwrap()); // same 512-byte class
        assert_eq!(a, b);
        assert_eq!(heap.grow.used, 2, "no second grow for a reused block");
    }

    #[test]
    fn exhaustion_returns_null_instead_of_panicking() {
        let mut heap = Heap::new(Pages::new(4));
        let big = Layout::from_size_align(8 * PAGE_BYTES, 8).unwrap();
        assert!(heap.alloc(big).is_null());
        let huge_align = Layout::from_size_align(8, 2 * PAGE_BYTES).unwrap();
        assert!(heap.alloc(huge_align).is_null());
        // Small allocations still work after a refused big one.
        assert!(!heap.alloc(Layout::from_size_align(8, 8).unwrap()).is_null());
    }

    #[test]
    fn repeated_alloc_free_cycles_do_not_grow_memory() {
        let mut heap = Heap::new(Pages::new(16));
        let l = Layout::from_size_align(200_000, 8).unwrap();
        for _ in 0..1000 {
            let p = heap.alloc(l);
            assert!(!p.is_null());
            unsafe { heap.dealloc(p, l) };
        }
        assert!(heap.grow.used <= 6, "used {} pages", heap.grow.used);
    }
}
