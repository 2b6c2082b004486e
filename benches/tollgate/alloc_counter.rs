//! A global allocator that counts heap growth while a measurement asks it to: criterion measures
//! time, not bytes, and the memory table needs bytes.
//!
//! Counting is off except inside [`measure_heap_growth`], so the timed benchmarks pay one load of
//! a flag per allocation and nothing else (and their hot paths do not allocate at all).

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};

/// The system allocator, counting.
pub(crate) struct CountingAllocator;

static COUNTING: AtomicBool = AtomicBool::new(false);
/// Net bytes requested while counting (allocations minus deallocations).
static REQUESTED_BYTES: AtomicI64 = AtomicI64::new(0);
/// Net bytes glibc would hold for those requests, by its chunk rule (see [`chunk_bytes`]).
static CHUNK_BYTES: AtomicI64 = AtomicI64::new(0);
/// Net number of live allocations made while counting.
static ALLOCATIONS: AtomicI64 = AtomicI64::new(0);

/// What `work` left on the heap.
#[derive(Debug, Clone, Copy)]
pub(crate) struct HeapGrowth {
    /// Bytes asked of the allocator.
    pub(crate) requested_bytes: i64,
    /// The same, with glibc's per-allocation header and rounding: closer to what the process
    /// pays, and fair to designs that allocate once per client rather than inline.
    pub(crate) chunk_bytes: i64,
    /// Live allocations.
    pub(crate) allocations: i64,
}

/// Runs `work` with counting on, and returns how much more heap is live after it than before.
/// Allocations freed inside `work` cancel out. Not reentrant: one measurement at a time.
pub(crate) fn measure_heap_growth(work: impl FnOnce()) -> HeapGrowth {
    // Relaxed throughout: the counters are read on this thread after `work` returns, and the
    // benchmark allocates on this thread only while counting.
    REQUESTED_BYTES.store(0, Ordering::Relaxed);
    CHUNK_BYTES.store(0, Ordering::Relaxed);
    ALLOCATIONS.store(0, Ordering::Relaxed);
    COUNTING.store(true, Ordering::Relaxed);
    work();
    COUNTING.store(false, Ordering::Relaxed);
    HeapGrowth {
        requested_bytes: REQUESTED_BYTES.load(Ordering::Relaxed),
        chunk_bytes: CHUNK_BYTES.load(Ordering::Relaxed),
        allocations: ALLOCATIONS.load(Ordering::Relaxed),
    }
}

/// The bytes glibc's malloc holds for a request of `size`: an 8-byte header, rounded up to 16
/// bytes, at least 32; above the 128 KiB mmap threshold, whole 4 KiB pages. (An over-aligned
/// request is carved out of a larger chunk whose surplus goes back to the free lists, so
/// alignment adds nothing that stays held.)
fn chunk_bytes(size: usize) -> i64 {
    const MMAP_THRESHOLD: usize = 128 * 1024;
    const PAGE: usize = 4096;
    let chunk = if size >= MMAP_THRESHOLD {
        (size + 16).next_multiple_of(PAGE)
    } else {
        (size + 8).next_multiple_of(16).max(32)
    };
    chunk as i64
}

#[inline]
fn record(old_size: usize, new_size: usize, allocations: i64) {
    // Relaxed: see `measure_heap_growth`.
    if !COUNTING.load(Ordering::Relaxed) {
        return;
    }
    let old_chunk = if old_size == 0 {
        0
    } else {
        chunk_bytes(old_size)
    };
    let new_chunk = if new_size == 0 {
        0
    } else {
        chunk_bytes(new_size)
    };
    REQUESTED_BYTES.fetch_add(new_size as i64 - old_size as i64, Ordering::Relaxed);
    CHUNK_BYTES.fetch_add(new_chunk - old_chunk, Ordering::Relaxed);
    ALLOCATIONS.fetch_add(allocations, Ordering::Relaxed);
}

// The crate denies unsafe code; a global allocator cannot be written without it. The counting
// itself is safe code on atomics: it never allocates, so it cannot recurse into the allocator.
#[allow(unsafe_code)]
// SAFETY: every method hands its arguments unchanged to `System`, which implements
// `GlobalAlloc` correctly, and returns `System`'s result unchanged; the counting neither reads
// nor writes the memory. So each method keeps exactly `System`'s guarantees.
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller guarantees `alloc`'s contract (a non-zero size), and `layout` is
        // passed on unchanged.
        let pointer = unsafe { System.alloc(layout) };
        if !pointer.is_null() {
            record(0, layout.size(), 1);
        }
        pointer
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as in `alloc`.
        let pointer = unsafe { System.alloc_zeroed(layout) };
        if !pointer.is_null() {
            record(0, layout.size(), 1);
        }
        pointer
    }

    unsafe fn dealloc(&self, pointer: *mut u8, layout: Layout) {
        // SAFETY: the caller guarantees that `pointer` came from this allocator with `layout`;
        // every allocation of this allocator is `System`'s, made with the same layout.
        unsafe { System.dealloc(pointer, layout) };
        record(layout.size(), 0, -1);
    }

    unsafe fn realloc(&self, pointer: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller guarantees `realloc`'s contract (`pointer` from this allocator with
        // `layout`, a valid non-zero `new_size`); as in `dealloc`, that is `System`'s contract.
        let moved = unsafe { System.realloc(pointer, layout, new_size) };
        if !moved.is_null() {
            record(layout.size(), new_size, 0);
        }
        moved
    }
}
