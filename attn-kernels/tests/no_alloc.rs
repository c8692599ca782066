//! The steady-state decode path allocates nothing: after one warm-up call with a shape,
//! further calls (any kernel, any thread) make zero heap allocations; after
//! `CpuAttention::reserve`, neither do calls over a cache that grows row by row (a decode
//! loop).
//!
//! The counter sees every thread of the process, so this binary has no test harness
//! (`harness = false`): libtest reports a finished test from its main thread while the next
//! one runs, and those allocations would land in the next test's count. `main` runs the
//! checks one after another on one thread.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use attn_kernels::{
    AttnConfig, CpuAttention, DecodeAttention, DenseKv, EncodedAttention, GatheredKv,
    GatheredSparseAttention, GatheredSparseKv, Isa, QuantKv, SparseSlab, synth,
};
use half::f16;
use kv_sparse::coded::{Bitmask, CodedStore, Int8Values};
use kv_sparse::fp8::Fp8E4M3;
use kv_sparse::hybrid::{CodedHybridCache, HybridCache, HybridConfig};
use kv_sparse::quant::{Int4Blocks, QuantRows};

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

fn main() {
    let checks: [(&str, fn()); 2] = [
        ("decode_steps_after_warm_up_do_not_allocate", decode_steps_after_warm_up_do_not_allocate),
        (
            "a_growing_cache_does_not_allocate_after_reserve",
            a_growing_cache_does_not_allocate_after_reserve,
        ),
    ];
    for (name, check) in checks {
        check();
        println!("test {name} ... ok");
    }
}

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
    let coded: Vec<CodedHybridCache<Bitmask, Int8Values, f16>> = (0..2)
        .map(|h| {
            let hc = HybridConfig::new(64, 16, 32).for_store::<CodedStore<Bitmask, Int8Values>>();
            let mut c = CodedHybridCache::new(hc).unwrap();
            c.extend(&synth::values(2000 * 64, h), &synth::values(2000 * 64, h + 9)).unwrap();
            c
        })
        .collect();
    let quant_rows = |seed| {
        let mut r = QuantRows::<Int4Blocks>::new(64).unwrap();
        r.push(&synth::values(2500 * 64, seed)).unwrap();
        r
    };
    let quant: Vec<(QuantRows<Int4Blocks>, QuantRows<Int4Blocks>)> =
        (0..2).map(|h| (quant_rows(2 * h), quant_rows(2 * h + 1))).collect();
    let quant: Vec<QuantKv<'_, Int4Blocks>> =
        quant.iter().map(|(k, v)| QuantKv::new(k.view(), v.view())).collect();
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
            attn.coded_hybrid(&cfg, &q, &coded, &mut out).unwrap();
            attn.quantized(&cfg, &q, &quant, &mut out).unwrap();
        };
        step(&mut attn); // warm-up: buffers grow to their final size
        let before = ALLOCATIONS.load(Ordering::SeqCst);
        for _ in 0..5 {
            step(&mut attn);
        }
        let allocated = ALLOCATIONS.load(Ordering::SeqCst) - before;
        assert_eq!(allocated, 0, "{isa}: {allocated} allocations in 30 steady-state calls");
    }
}

fn a_growing_cache_does_not_allocate_after_reserve() {
    let (d, k, n_max) = (64, 16, 2000);
    let cfg = AttnConfig::new(8, 2, d).unwrap();
    let rows: Vec<f16> = synth::dense_rows(n_max, d, 5);
    let slab = synth::sparse_slab(n_max, d, k, 0.5, 6).unwrap();
    let slab = SparseSlab::new(&slab, k, 0.5);
    // Dense rows at even positions, sparse rows at odd ones: disjoint, each ascending.
    let even: Vec<u32> = (0..n_max as u32).map(|i| 2 * i).collect();
    let odd: Vec<u32> = (0..n_max as u32).map(|i| 2 * i + 1).collect();
    let q = synth::values(cfg.q_len(), 7);
    let mut out = vec![0.0; cfg.q_len()];
    let mut weights = vec![0.0; 4 * n_max];
    for isa in Isa::available() {
        let mut attn =
            CpuAttention::new(2).unwrap().with_isa(isa).unwrap().with_split_rows(700).unwrap();
        attn.reserve(&cfg, 2 * n_max);
        let mut step = |attn: &mut CpuAttention, n: usize| {
            let dense = [GatheredKv::new(d, &even[..n], &rows[..n * d], &rows[..n * d]); 2];
            let sparse = [GatheredSparseKv::new(d, &odd[..n], slab, slab); 2];
            let w = Some(&mut weights[..4 * n]);
            attn.gathered_sparse(&cfg, &q, &dense, &sparse, &mut out, w).unwrap();
            attn.gathered(&cfg, &q, &dense, &mut out, Some(&mut weights[..2 * n])).unwrap();
        };
        // One call on the smallest cache: the calling thread's one-time set-up (its
        // `Thread` handle, made the first time it waits for the pool) is not the kernels'.
        step(&mut attn, 1);
        let before = ALLOCATIONS.load(Ordering::SeqCst);
        for n in (2..=n_max).step_by(37) {
            step(&mut attn, n);
        }
        let allocated = ALLOCATIONS.load(Ordering::SeqCst) - before;
        assert_eq!(allocated, 0, "{isa}: {allocated} allocations while the cache grew");
    }
}
