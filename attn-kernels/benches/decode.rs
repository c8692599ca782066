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

use std::time::Duration;

use attn_kernels::{AttnConfig, CpuAttention, DecodeAttention, DenseKv, synth};
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use half::f16;
use kv_sparse::fp8::Fp8E4M3;
use kv_sparse::hybrid::HybridCache;
use kv_sparse::{SparseIndex, Value};

const Q_HEADS: usize = 32;
const KV_HEADS: usize = 8;
const BUFFER: usize = 128;

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|s| s.parse().ok()).unwrap_or(default)
}

fn quick() -> bool {
    std::env::var_os("ATTN_BENCH_QUICK").is_some()
}

fn grid() -> (Vec<usize>, Vec<usize>) {
    if quick() { (vec![64], vec![1024]) } else { (vec![64, 128], vec![1024, 4096, 16384, 32768]) }
}

fn hybrid_bench<I: SparseIndex, V: Value>(
    c: &mut Criterion,
    attn: &mut CpuAttention,
    (d, len, k): (usize, usize, usize),
    q: &[f32],
    label: &str,
) {
    let cfg = AttnConfig::new(Q_HEADS, KV_HEADS, d).expect("layout");
    let caches: Vec<HybridCache<I, V, f16>> = (0..KV_HEADS as u64)
        .map(|h| synth::hybrid_cache(d, BUFFER, k, len, h).expect("cache"))
        .collect();
    let bytes: usize = caches.iter().map(|c| c.memory().held_bytes()).sum();
    let mut out = vec![0.0; cfg.q_len()];
    let mut g = c.benchmark_group(format!("hybrid_{label}_d{d}_k{k}"));
    g.throughput(Throughput::Bytes(bytes as u64));
    g.bench_with_input(BenchmarkId::from_parameter(len), &len, |b, _| {
        b.iter(|| attn.hybrid(&cfg, q, &caches, &mut out).expect("decode"))
    });
    g.finish();
}

fn dense_bench(c: &mut Criterion, attn: &mut CpuAttention, d: usize, len: usize, q: &[f32]) {
    let cfg = AttnConfig::new(Q_HEADS, KV_HEADS, d).expect("layout");
    let data: Vec<(Vec<f16>, Vec<f16>)> = (0..KV_HEADS as u64)
        .map(|h| (synth::dense_rows(len, d, 2 * h), synth::dense_rows(len, d, 2 * h + 1)))
        .collect();
    let kv: Vec<DenseKv<'_, f16>> = data.iter().map(|(k, v)| DenseKv::new(d, k, v)).collect();
    let mut out = vec![0.0; cfg.q_len()];
    let mut g = c.benchmark_group(format!("dense_f16_d{d}"));
    g.throughput(Throughput::Bytes((2 * KV_HEADS * len * d * 2) as u64));
    g.bench_with_input(BenchmarkId::from_parameter(len), &len, |b, _| {
        b.iter(|| attn.dense(&cfg, q, &kv, &mut out).expect("decode"))
    });
    g.finish();
}

fn decode(c: &mut Criterion) {
    let threads = env_usize("ATTN_BENCH_THREADS", 1);
    let mut attn = CpuAttention::new(threads).expect("thread pool");
    let (dims, lens) = grid();
    for d in dims {
        let q = synth::values(Q_HEADS * d, 1);
        for &len in &lens {
            dense_bench(c, &mut attn, d, len, &q);
            for k in [d / 4, d / 2, 3 * d / 4] {
                hybrid_bench::<u8, f16>(c, &mut attn, (d, len, k), &q, "f16");
                hybrid_bench::<u8, Fp8E4M3>(c, &mut attn, (d, len, k), &q, "fp8");
            }
        }
    }
}

fn config() -> Criterion {
    let c = Criterion::default().configure_from_args();
    if quick() {
        c.sample_size(10)
            .warm_up_time(Duration::from_millis(100))
            .measurement_time(Duration::from_millis(300))
    } else {
        c.sample_size(20)
            .warm_up_time(Duration::from_millis(500))
            .measurement_time(Duration::from_secs(2))
    }
}

criterion_group! {
    name = benches;
    config = config();
    targets = decode
}
criterion_main!(benches);
