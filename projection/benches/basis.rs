//! Full basis computation (SWAN §4): eigen-decomposition of every (layer, kv-head, stream)
//! moment of a whole model, on one thread and on all cores (same-run ratio).
//!
//! `cargo bench -p kvtide-projection --bench basis`

use std::hint::black_box;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use projection::{CalibrationConfig, Calibrator, LayerActivations};

mod support;
use support::{LLAMA, SMOL, Shape, gaussian};

/// A calibrator whose every moment is full rank (head_dim tokens per layer).
fn filled(s: &Shape) -> Calibrator {
    let (n, d) = (s.head_dim, s.head_dim);
    let mut cal = Calibrator::new(s.dims(), CalibrationConfig::default()).unwrap();
    for layer in 0..s.layers {
        let q = gaussian(n * s.q_heads * d, 10 + layer as u64);
        let kv = gaussian(n * s.kv_heads * d, 1000 + layer as u64);
        let acts =
            LayerActivations { n_tokens: n, queries: &q, keys: &kv, values: &kv, attn_out: &q };
        cal.observe_layer(layer, &acts).unwrap();
    }
    cal
}

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("basis");
    group
        .sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(5));
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    for s in [SMOL, LLAMA] {
        let cal = filled(&s);
        group.bench_function(BenchmarkId::new("finish_1_thread", s.name), |b| {
            b.iter(|| black_box(cal.finish_with_threads(s.name, 1).unwrap()))
        });
        group.bench_function(BenchmarkId::new(format!("finish_{threads}_threads"), s.name), |b| {
            b.iter(|| black_box(cal.finish_with_threads(s.name, threads).unwrap()))
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
