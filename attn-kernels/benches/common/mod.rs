//! What the attention criterion benches share: the layer shape (32 q-heads / 8 kv-heads,
//! b = 128 dense rows in the hybrid caches), the environment knobs (`ATTN_BENCH_THREADS`,
//! `ATTN_BENCH_QUICK`), the dense f16 baseline every bench measures in the same run, one
//! timed decode step per group, and the criterion configuration.

use std::time::Duration;

use attn_kernels::{AttnConfig, CpuAttention, DecodeAttention, DenseKv, synth};
use criterion::{BenchmarkId, Criterion, Throughput};
use half::f16;

/// Query heads of the benched layer.
pub const Q_HEADS: usize = 32;
/// Key/value heads of the benched layer.
pub const KV_HEADS: usize = 8;
/// Dense buffer rows `b` of the hybrid caches.
pub const BUFFER: usize = 128;

/// Whether `ATTN_BENCH_QUICK` asks for a short smoke run.
pub fn quick() -> bool {
    std::env::var_os("ATTN_BENCH_QUICK").is_some()
}

/// The kernels' thread pool, sized by `ATTN_BENCH_THREADS` (default 1).
pub fn attention() -> CpuAttention {
    let threads =
        std::env::var("ATTN_BENCH_THREADS").ok().and_then(|s| s.parse().ok()).unwrap_or(1);
    CpuAttention::new(threads).expect("thread pool")
}

/// The layer at head dimension `d`.
pub fn layout(d: usize) -> AttnConfig {
    AttnConfig::new(Q_HEADS, KV_HEADS, d).expect("layout")
}

/// Keys and values of kv-head `h`: `len × d` standard-normal values each, from seeds
/// `2h + seed` and `2h + seed + 1`.
pub fn keys_values(len: usize, d: usize, h: u64, seed: u64) -> (Vec<f32>, Vec<f32>) {
    (synth::values(len * d, 2 * h + seed), synth::values(len * d, 2 * h + seed + 1))
}

/// Times `step` as group `group`, parameter `len`, with `bytes` read per call.
pub fn time_step(
    c: &mut Criterion,
    group: String,
    len: usize,
    bytes: usize,
    mut step: impl FnMut(),
) {
    let mut g = c.benchmark_group(group);
    g.throughput(Throughput::Bytes(bytes as u64));
    g.bench_with_input(BenchmarkId::from_parameter(len), &len, |b, _| b.iter(&mut step));
    g.finish();
}

/// The baseline: our dense f16 kernel over `len` rows per kv-head (data from
/// [`keys_values`] with `seed`), group `dense_f16{suffix}_d{d}`.
pub fn dense_f16(
    c: &mut Criterion,
    attn: &mut CpuAttention,
    (d, len): (usize, usize),
    q: &[f32],
    seed: u64,
    suffix: &str,
) {
    let cfg = layout(d);
    let half = |x: &[f32]| -> Vec<f16> { x.iter().map(|&x| f16::from_f32(x)).collect() };
    let data: Vec<(Vec<f16>, Vec<f16>)> = (0..KV_HEADS as u64)
        .map(|h| {
            let (k, v) = keys_values(len, d, h, seed);
            (half(&k), half(&v))
        })
        .collect();
    let kv: Vec<DenseKv<'_, f16>> = data.iter().map(|(k, v)| DenseKv::new(d, k, v)).collect();
    let mut out = vec![0.0; cfg.q_len()];
    let bytes = 2 * KV_HEADS * len * d * 2;
    time_step(c, format!("dense_f16{suffix}_d{d}"), len, bytes, || {
        attn.dense(&cfg, q, &kv, &mut out).expect("decode")
    });
}

/// The smoke run's settings when [`quick`], else `samples` samples a point with `warm_up`
/// and `measure` seconds.
pub fn config(samples: usize, warm_up: Duration, measure: Duration) -> Criterion {
    let c = Criterion::default().configure_from_args();
    if quick() {
        c.sample_size(10)
            .warm_up_time(Duration::from_millis(100))
            .measurement_time(Duration::from_millis(300))
    } else {
        c.sample_size(samples).warm_up_time(warm_up).measurement_time(measure)
    }
}
