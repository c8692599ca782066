//! Steady-state appends (buffer full, every append evicts, prunes and encodes a row) must
//! not allocate once the sparse stores have room: the scratch rows are reused. Counted
//! per thread with a global allocator wrapper (the test harness allocates on its own
//! threads meanwhile).

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use half::f16;
use kv_sparse::fp8::Fp8E4M3;
use kv_sparse::hybrid::{HybridCache, HybridConfig, NonFinitePolicy};

struct Counting;

thread_local! {
    static ALLOCATIONS: Cell<usize> = const { Cell::new(0) };
}

fn count() {
    // `try_with`: during thread teardown the slot may be gone; those frees don't matter.
    let _ = ALLOCATIONS.try_with(|c| c.set(c.get() + 1));
}

fn allocations() -> usize {
    ALLOCATIONS.with(Cell::get)
}

// SAFETY: every method forwards to `System` with the caller's arguments unchanged, so
// `System`'s guarantees carry over; the counter has no effect on the returned memory.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count();
        // SAFETY: same contract as our caller's (non-zero-size `layout`).
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` was allocated by `System` with `layout` (we forward every alloc).
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count();
        // SAFETY: `ptr`/`layout` come from `System` via this wrapper; caller's contract.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

#[test]
fn steady_state_appends_do_not_allocate() {
    let d = 128;
    let rows: Vec<Vec<f32>> =
        (0..64).map(|t| (0..d).map(|i| ((t * 7 + i * 13) % 31) as f32 - 15.0).collect()).collect();
    let cfg = HybridConfig { non_finite: NonFinitePolicy::Zero, ..HybridConfig::new(d, 16, 32) };
    let mut cache = HybridCache::<u8, Fp8E4M3, f16>::new(cfg).unwrap();
    cache.reserve(2000);
    for r in rows.iter().take(20) {
        cache.append(r, r).unwrap(); // fills the buffer, warms the scratch
    }
    let mut dirty = rows[3].clone();
    dirty[5] = f32::NAN; // exercises the sanitizing path too
    let before = allocations();
    for t in 0..1000 {
        let r = if t % 10 == 0 { &dirty } else { &rows[t % rows.len()] };
        cache.append(r, r).unwrap();
    }
    let after = allocations();
    assert_eq!(after - before, 0, "allocations during 1000 steady-state appends");
    assert_eq!(cache.sparse_len(), 1020 - 16);
}
