//! The per-step API the decoder drives through a WnW decode step (§2.3: append, layer views,
//! anchor weights, end_step, recall worker) stays simple and does not allocate once warmed
//! up — with SWAN sparse rows attended in place by `attn-kernels`' gathered dense + sparse
//! kernel through [`kv_tiered::GatheredLists`] too. A counting global allocator checks it.

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

use attn_kernels::{AttnConfig, CpuAttention, GatheredSparseAttention};
use common::Model;
use kv_sparse::ValueFormat;
use kv_tiered::policy::{WnwConfig, WnwPolicy};
use kv_tiered::{
    AudioLayout, GatheredLists, HeadRoles, RetentionSchedule, Role, RowLayout, StoreConfig,
    TieredStore,
};

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

/// The counter sees every thread: the tests of this binary run one at a time.
fn serial() -> MutexGuard<'static, ()> {
    static SERIAL: Mutex<()> = Mutex::new(());
    SERIAL.lock().unwrap_or_else(PoisonError::into_inner)
}

#[test]
fn decode_steps_do_not_allocate() {
    let _serial = serial();
    let layout = AudioLayout::new(220, 10..210, 5, 10).unwrap();
    let m = Model::random(1, 2, 4, 2, 8, layout);
    let roles: Vec<Role> = (0..m.heads()).map(|h| [Role::Anchor, Role::Tidal][h % 2]).collect();
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

/// The decode step of a store with SWAN sparse rows: attention over the layer views through
/// reused [`GatheredLists`] and the gathered dense + sparse kernel, its softmax weights fed
/// back as the anchor signal, `end_step` recalling sparse segments.
#[test]
fn sparse_row_decode_steps_with_the_kernel_do_not_allocate() {
    let _serial = serial();
    let layout = AudioLayout::new(220, 10..210, 5, 10).unwrap();
    let (d, group) = (16, 2);
    let m = Model::random(3, 2, 4, group, d, layout);
    let roles: Vec<Role> =
        (0..m.heads()).map(|h| [Role::Anchor, Role::Tidal, Role::Fixed][h % 3]).collect();
    let hr = HeadRoles::from_roles(m.layers, m.kv_heads, &roles).unwrap();
    let sched = RetentionSchedule::uniform(&hr, 0.2).unwrap();
    let policy = WnwPolicy::new(hr, sched, layout, WnwConfig::default()).unwrap();
    let steps = 300;
    let rows = RowLayout::with_sparse(d, ValueFormat::F32, 6, 4);
    let config = StoreConfig { rows, ..m.config(steps) };
    let mut store = TieredStore::prefill_host(config, Box::new(policy), &m.kv, &m.scores).unwrap();
    let cfg = AttnConfig::new(m.q_heads, m.kv_heads, d).unwrap();
    let mut cpu = CpuAttention::new(2).unwrap();
    cpu.reserve(&cfg, layout.seq_len() + steps);
    let mut lists = GatheredLists::<f32>::with_capacity(m.kv_heads);
    let mut weights = Vec::with_capacity(m.kv_heads * (layout.seq_len() + steps));
    let row = vec![0.5f32; m.kv_heads * d];
    let mut q = vec![0.0f32; m.q_heads * d];
    let mut out = vec![0.0f32; m.q_heads * d];
    let mut sparse_rows = 0;
    let mut step = |store: &mut TieredStore, s: usize| {
        for l in 0..m.layers {
            store.append(l, &row, &row).unwrap();
            // A query that moves its attention along the audio from step to step.
            let focus = (s * 7 + l * 3) % layout.audio_len();
            q.iter_mut().enumerate().for_each(|(i, x)| *x = ((i + focus) % 5) as f32 - 2.0);
            let view = store.layer_view(l).unwrap();
            view.with_gathered_parts(&mut lists, |dense, sparse| {
                sparse_rows += sparse.iter().map(|p| p.num_rows()).sum::<usize>();
                let n = dense.iter().map(|p| p.num_rows()).sum::<usize>()
                    + sparse.iter().map(|p| p.num_rows()).sum::<usize>();
                weights.resize(n, 0.0);
                cpu.gathered_sparse(&cfg, &q, dense, sparse, &mut out, Some(&mut weights))
            })
            .unwrap()
            .unwrap();
            drop(view);
            store.add_gathered_weights(l, &weights).unwrap();
        }
        store.end_step().unwrap();
    };
    for s in 0..100 {
        step(&mut store, s); // warm-up: free lists, residency lists, arenas reach steady size
    }
    store.sync().unwrap();
    std::thread::sleep(std::time::Duration::from_millis(50));
    let (before, recalls) = (ALLOCS.load(Ordering::Relaxed), store.run_metrics().recalls);
    for s in 100..steps {
        step(&mut store, s);
    }
    store.sync().unwrap();
    let allocs = ALLOCS.load(Ordering::Relaxed) - before;
    assert!(store.run_metrics().recalls > recalls, "recalls happened in the measured steps");
    assert!(sparse_rows > 0, "sparse rows were attended");
    assert_eq!(allocs, 0, "allocations during {} steady-state steps", steps - 100);
}
