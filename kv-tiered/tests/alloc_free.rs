//! The per-step API the decoder drives through a WnW decode step (§2.3: append, layer views,
//! anchor weights, end_step, recall worker) stays simple and does not allocate once warmed
//! up. A counting global allocator checks it.

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use common::Model;
use kv_tiered::AudioLayout;
use kv_tiered::policy::WnwConfig;

struct Counting;

static ALLOCS: AtomicUsize = AtomicUsize::new(0);

// SAFETY: delegates every call to the system allocator unchanged; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `System.alloc` with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

#[test]
fn decode_steps_do_not_allocate() {
    let layout = AudioLayout::new(220, 10..210, 5, 10).unwrap();
    let m = Model::random(1, 2, 4, 2, 8, layout);
    let roles: Vec<kv_tiered::Role> =
        (0..m.heads()).map(|h| [kv_tiered::Role::Anchor, kv_tiered::Role::Tidal][h % 2]).collect();
    let steps = 400;
    let mut store = m.wnw_store(&roles, 0.2, WnwConfig::default(), steps);
    let row = vec![0.5f32; m.kv_heads * m.head_dim];
    let mut w = vec![0.0f32; 200];
    let mut step = |store: &mut kv_tiered::TieredStore, s: usize| {
        for l in 0..m.layers {
            store.append(l, &row, &row).unwrap();
            let view = store.layer_view(l).unwrap();
            let resident: usize = (0..m.kv_heads).map(|k| view.head(k).unwrap().len()).sum();
            assert!(resident > 0);
        }
        w.iter_mut()
            .enumerate()
            .for_each(|(i, x)| *x = if i / 10 == (s * 3) % 20 { 1.0 } else { 0.01 });
        store.add_audio_weights(&w).unwrap();
        store.end_step().unwrap();
    };
    for s in 0..100 {
        step(&mut store, s); // warm-up: free lists, residency lists, arenas reach steady size
    }
    store.sync().unwrap();
    // Let the recall worker run dry and block once: crossbeam allocates its per-thread
    // context and the receiver-list slot the first time a thread blocks on a channel, a
    // one-time cost that under CPU load can otherwise land inside the measured window.
    std::thread::sleep(std::time::Duration::from_millis(50));
    let before = ALLOCS.load(Ordering::Relaxed);
    for s in 100..steps {
        step(&mut store, s);
    }
    store.sync().unwrap();
    let allocs = ALLOCS.load(Ordering::Relaxed) - before;
    assert!(store.run_metrics().recalls > 100, "recalls happened");
    assert_eq!(allocs, 0, "allocations during {} steady-state steps", steps - 100);
}
