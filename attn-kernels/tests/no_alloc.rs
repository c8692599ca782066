//! The steady-state decode path allocates nothing: after one warm-up call with a shape,
//! further calls (any kernel, any thread) make zero heap allocations.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use attn_kernels::{
    AttnConfig, CpuAttention, DecodeAttention, DenseKv, GatheredKv, GatheredSparseAttention,
    GatheredSparseKv, Isa, SparseSlab, synth,
};
use half::f16;
use kv_sparse::fp8::Fp8E4M3;
use kv_sparse::hybrid::HybridCache;

/// Counts every allocation of the process (all threads).
struct Counting;

static ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards every call unchanged to the system allocator; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::SeqCst);
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::SeqCst);
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

#[test]
fn decode_steps_after_warm_up_do_not_allocate() {
    let cfg = AttnConfig::new(12, 2, 64).unwrap();
    let caches: Vec<HybridCache<u8, Fp8E4M3, f16>> =
        (0..2).map(|h| synth::hybrid_cache(64, 16, 32, 5000, h).unwrap()).collect();
    let rows: Vec<f16> = synth::dense_rows(3000, 64, 3);
    let dense = [DenseKv::new(64, &rows, &rows), DenseKv::new(64, &rows, &rows)];
    let positions: Vec<u32> = (0..3000).collect();
    let gathered = [GatheredKv::new(64, &positions, &rows, &rows); 2];
    let slab = synth::sparse_slab(4000, 64, 32, 1.0, 4).unwrap();
    let slab = SparseSlab::new(&slab, 32, 1.0);
    let sparse_pos: Vec<u32> = (3000..7000).collect();
    let sparse = [GatheredSparseKv::new(64, &sparse_pos, slab, slab); 2];
    let q = synth::values(cfg.q_len(), 1);
    let mut out = vec![0.0; cfg.q_len()];
    let mut weights = vec![0.0; 6000];
    let mut mixed_weights = vec![0.0; 14000];
    for isa in Isa::available() {
        let mut attn =
            CpuAttention::new(2).unwrap().with_isa(isa).unwrap().with_split_rows(700).unwrap();
        let mut step = |attn: &mut CpuAttention| {
            attn.hybrid(&cfg, &q, &caches, &mut out).unwrap();
            attn.dense(&cfg, &q, &dense, &mut out).unwrap();
            attn.gathered(&cfg, &q, &gathered, &mut out, Some(&mut weights)).unwrap();
            let w = Some(&mut mixed_weights[..]);
            attn.gathered_sparse(&cfg, &q, &gathered, &sparse, &mut out, w).unwrap();
        };
        step(&mut attn); // warm-up: buffers grow to their final size
        let before = ALLOCATIONS.load(Ordering::SeqCst);
        for _ in 0..5 {
            step(&mut attn);
        }
        let allocated = ALLOCATIONS.load(Ordering::SeqCst) - before;
        assert_eq!(allocated, 0, "{isa}: {allocated} allocations in 20 steady-state calls");
    }
}
