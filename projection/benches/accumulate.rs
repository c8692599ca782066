//! Calibration throughput (SWAN §4): tokens/s through every layer of a model, and per-layer
//! vectors/s of the GEMM accumulator against the rank-one reference loop in the same run.
//!
//! `cargo bench -p kvtide-projection --bench accumulate`

use std::hint::black_box;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use projection::reference::accumulate_naive;
use projection::{CalibrationConfig, Calibrator, LayerActivations};

mod support;
use support::{LLAMA, SMOL, Shape, gaussian};

const TOKENS: usize = 64;

struct Acts {
    q: Vec<f32>,
    kv: Vec<f32>,
}

impl Acts {
    fn new(s: &Shape) -> Self {
        let d = s.head_dim;
        Self { q: gaussian(TOKENS * s.q_heads * d, 1), kv: gaussian(TOKENS * s.kv_heads * d, 2) }
    }

    fn layer(&self) -> LayerActivations<'_> {
        LayerActivations {
            n_tokens: TOKENS,
            queries: &self.q,
            keys: &self.kv,
            values: &self.kv,
            attn_out: &self.q,
        }
    }
}

/// The rank-one baseline for one layer: the same vectors and weights, one update at a time.
fn naive_layer(s: &Shape, acts: &Acts, sums: &mut [Vec<f64>]) {
    let (d, g) = (s.head_dim, s.q_heads / s.kv_heads);
    let wq = 1.0 / g as f64;
    for (j, pair) in sums.chunks_mut(2).enumerate() {
        for m in pair.iter_mut() {
            for t in 0..TOKENS {
                let q = &acts.q[(t * s.q_heads + j * g) * d..][..g * d];
                accumulate_naive(m, d, q, wq).unwrap();
                accumulate_naive(m, d, &acts.kv[(t * s.kv_heads + j) * d..][..d], 1.0).unwrap();
            }
        }
    }
}

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("accumulate");
    group
        .sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3));
    for s in [SMOL, LLAMA] {
        let acts = Acts::new(&s);
        let mut cal = Calibrator::new(s.dims(), CalibrationConfig::default()).unwrap();
        group.throughput(Throughput::Elements(TOKENS as u64));
        group.bench_function(BenchmarkId::new("model_tokens", s.name), |b| {
            b.iter(|| {
                for layer in 0..s.layers {
                    cal.observe_layer(layer, black_box(&acts.layer())).unwrap();
                }
            })
        });
        let vectors = TOKENS * s.kv_heads * (s.q_heads / s.kv_heads + 1) * 2;
        group.throughput(Throughput::Elements(vectors as u64));
        group.bench_function(BenchmarkId::new("layer_vectors_gemm", s.name), |b| {
            b.iter(|| cal.observe_layer(0, black_box(&acts.layer())).unwrap())
        });
        let mut sums = vec![vec![0.0f64; s.head_dim * s.head_dim]; 2 * s.kv_heads];
        group.bench_function(BenchmarkId::new("layer_vectors_naive_rank1", s.name), |b| {
            b.iter(|| naive_layer(&s, black_box(&acts), &mut sums))
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
