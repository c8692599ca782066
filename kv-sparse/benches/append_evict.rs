//! Append + evict throughput of the hybrid cache (SWAN Algorithm 1: every append to a full
//! dense buffer evicts, prunes to top-k and encodes the oldest row) against plain dense
//! `Vec<f16>` append, measured side by side in the same run.
//!
//! Per iteration: 1024 tokens (one key and one value row each) are appended to a cache
//! whose buffer of 128 rows is already full, so every append evicts. Allocations are
//! kept between iterations (`clear` keeps capacity) for both the cache and the baseline.
//! Throughput is reported as rows (tokens) per second and input bytes (f32 K+V) per second.
//!
//! Run: `cargo bench -p kv-sparse --bench append_evict`

use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use half::f16;
use half::slice::HalfFloatSliceExt;
use kv_sparse::Value;
use kv_sparse::fp8::Fp8E4M3;
use kv_sparse::hybrid::{HybridCache, HybridConfig};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const TOKENS: usize = 1024;
const BUFFER: usize = 128;

/// Deterministic pseudo-activations: roughly Gaussian-shaped values of mixed magnitude.
fn rows(head_dim: usize, seed: u64) -> Vec<f32> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..(TOKENS + BUFFER) * head_dim)
        .map(|_| (0..4).map(|_| rng.random_range(-1.0f32..1.0)).sum::<f32>() * 2.0)
        .collect()
}

/// Baseline: a dense f16 KV cache that appends rows to two `Vec`s (with `half`'s bulk,
/// F16C-accelerated conversion — the fastest plain dense append).
fn dense_append(keys: &[f32], values: &[f32], head_dim: usize, iters: u64) -> Duration {
    let mut k_cache: Vec<f16> = Vec::with_capacity(keys.len());
    let mut v_cache: Vec<f16> = Vec::with_capacity(values.len());
    let mut total = Duration::ZERO;
    for _ in 0..iters {
        k_cache.clear();
        v_cache.clear();
        let start = Instant::now();
        for (k, v) in keys.chunks_exact(head_dim).zip(values.chunks_exact(head_dim)).take(TOKENS) {
            let start = k_cache.len();
            k_cache.resize(start + head_dim, f16::ZERO);
            v_cache.resize(start + head_dim, f16::ZERO);
            k_cache[start..].convert_from_f32_slice(k);
            v_cache[start..].convert_from_f32_slice(v);
        }
        total += start.elapsed();
        std::hint::black_box((&k_cache, &v_cache));
    }
    total
}

/// SWAN: append to a hybrid cache whose buffer is full, so every append evicts.
fn hybrid_append<V: Value>(
    keys: &[f32],
    values: &[f32],
    head_dim: usize,
    k: usize,
    iters: u64,
) -> Duration {
    let mut cache = HybridCache::<u8, V, f16>::new(HybridConfig::new(head_dim, BUFFER, k)).unwrap();
    cache.reserve(TOKENS + BUFFER);
    let d = head_dim;
    let mut total = Duration::ZERO;
    for _ in 0..iters {
        cache.clear();
        cache.extend(&keys[..BUFFER * d], &values[..BUFFER * d]).unwrap();
        let start = Instant::now();
        for (kr, vr) in keys[BUFFER * d..].chunks_exact(d).zip(values[BUFFER * d..].chunks_exact(d))
        {
            cache.append(kr, vr).unwrap();
        }
        total += start.elapsed();
        std::hint::black_box(cache.view());
    }
    total
}

fn bench_append_evict(c: &mut Criterion) {
    for head_dim in [64usize, 128] {
        let keys = rows(head_dim, 1);
        let values = rows(head_dim, 2);
        let mut group = c.benchmark_group(format!("append_evict/d{head_dim}"));
        group.throughput(Throughput::ElementsAndBytes {
            elements: TOKENS as u64,
            bytes: (TOKENS * 2 * head_dim * 4) as u64,
        });
        group
            .sample_size(30)
            .measurement_time(Duration::from_secs(3))
            .warm_up_time(Duration::from_secs(1));
        group.bench_function("dense_vec_f16", |b| {
            b.iter_custom(|iters| dense_append(&keys, &values, head_dim, iters))
        });
        for k in [16usize, 32, 64] {
            group.bench_with_input(BenchmarkId::new("swan_f16", k), &k, |b, &k| {
                b.iter_custom(|iters| hybrid_append::<f16>(&keys, &values, head_dim, k, iters))
            });
            group.bench_with_input(BenchmarkId::new("swan_fp8", k), &k, |b, &k| {
                b.iter_custom(|iters| hybrid_append::<Fp8E4M3>(&keys, &values, head_dim, k, iters))
            });
        }
        group.finish();
    }
}

criterion_group!(benches, bench_append_evict);
criterion_main!(benches);
