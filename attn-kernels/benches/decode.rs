//! Criterion benches of one decode step of a 32 q-head / 8 kv-head layer: our dense f16
//! kernel (the baseline, measured in the same run) and SWAN's hybrid kernel (b = 128 dense
//! rows, the rest sparse) with f16 and fp8 values, over d_h ∈ {64, 128},
//! L ∈ {1k, 4k, 16k, 32k} and k ∈ {d/4, d/2, 3d/4}. `Throughput::Bytes` is the cache bytes
//! each step reads, so criterion reports bandwidth.
//!
//! `cargo bench -p attn-kernels --bench decode` (single-threaded); set
//! `ATTN_BENCH_THREADS=2` for two threads, `ATTN_BENCH_QUICK=1` for a short smoke run.
//! `kvtide bench-attn` measures the same grid plus libtorch and memory bandwidth in one
//! process and prints ratios.

mod common;

use std::time::Duration;

use attn_kernels::{CpuAttention, DecodeAttention, synth};
use common::{BUFFER, KV_HEADS, Q_HEADS};
use criterion::{Criterion, criterion_group, criterion_main};
use half::f16;
use kv_sparse::fp8::Fp8E4M3;
use kv_sparse::hybrid::HybridCache;
use kv_sparse::{SparseIndex, Value};

fn grid() -> (Vec<usize>, Vec<usize>) {
    if common::quick() {
        (vec![64], vec![1024])
    } else {
        (vec![64, 128], vec![1024, 4096, 16384, 32768])
    }
}

fn hybrid_bench<I: SparseIndex, V: Value>(
    c: &mut Criterion,
    attn: &mut CpuAttention,
    (d, len, k): (usize, usize, usize),
    q: &[f32],
    label: &str,
) {
    let cfg = common::layout(d);
    let caches: Vec<HybridCache<I, V, f16>> = (0..KV_HEADS as u64)
        .map(|h| synth::hybrid_cache(d, BUFFER, k, len, h).expect("cache"))
        .collect();
    let bytes: usize = caches.iter().map(|c| c.memory().held_bytes()).sum();
    let mut out = vec![0.0; cfg.q_len()];
    common::time_step(c, format!("hybrid_{label}_d{d}_k{k}"), len, bytes, || {
        attn.hybrid(&cfg, q, &caches, &mut out).expect("decode")
    });
}

fn decode(c: &mut Criterion) {
    let mut attn = common::attention();
    let (dims, lens) = grid();
    for d in dims {
        let q = synth::values(Q_HEADS * d, 1);
        for &len in &lens {
            common::dense_f16(c, &mut attn, (d, len), &q, 0, "");
            for k in [d / 4, d / 2, 3 * d / 4] {
                hybrid_bench::<u8, f16>(c, &mut attn, (d, len, k), &q, "f16");
                hybrid_bench::<u8, Fp8E4M3>(c, &mut attn, (d, len, k), &q, "fp8");
            }
        }
    }
}

fn config() -> Criterion {
    common::config(20, Duration::from_millis(500), Duration::from_secs(2))
}

criterion_group! {
    name = benches;
    config = config();
    targets = decode
}
criterion_main!(benches);
