//! Magnitude top-k selection cost per row (SWAN's pruning step), against copying the row
//! (the floor of any selection: it must read every element) in the same run.
//!
//! Run: `cargo bench -p kv-sparse --bench topk`

use std::time::Duration;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use kv_sparse::topk::top_k_magnitude;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const ROWS: usize = 256;

fn bench_topk(c: &mut Criterion) {
    for head_dim in [64usize, 128] {
        let mut rng = StdRng::seed_from_u64(7);
        let data: Vec<f32> = (0..ROWS * head_dim).map(|_| rng.random_range(-4.0f32..4.0)).collect();
        let mut group = c.benchmark_group(format!("topk/d{head_dim}"));
        group.throughput(Throughput::Elements(ROWS as u64));
        group
            .sample_size(30)
            .measurement_time(Duration::from_secs(2))
            .warm_up_time(Duration::from_secs(1));
        let mut copy = vec![0.0f32; head_dim];
        group.bench_function("copy_row", |b| {
            b.iter(|| {
                for row in data.chunks_exact(head_dim) {
                    copy.copy_from_slice(std::hint::black_box(row));
                    std::hint::black_box(&copy);
                }
            })
        });
        let mut out = Vec::with_capacity(head_dim);
        for k in [16usize, 32, 64] {
            group.bench_with_input(BenchmarkId::new("top_k", k), &k, |b, &k| {
                b.iter(|| {
                    for row in data.chunks_exact(head_dim) {
                        top_k_magnitude(std::hint::black_box(row), k, &mut out).unwrap();
                        std::hint::black_box(&out);
                    }
                })
            });
        }
        group.finish();
    }
}

criterion_group!(benches, bench_topk);
criterion_main!(benches);
