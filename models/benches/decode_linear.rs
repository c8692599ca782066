//! Criterion bench of the decode step's linear layers: libtorch's `linear` (the baseline,
//! measured in the same run) against `models::llama::linear::linear` (the `gemm` crate's
//! matrix–vector kernel for one row, libtorch with the weight as the left operand for more) for 1, 4, 8 and 16 rows over eight layers of SmolLM2-135M-shaped weights (`q|k|v`
//! 960 × 576, `o` 576 × 576, `gate|up` 3072 × 576, `down` 576 × 1536: 113 MB, more than the
//! last-level cache, so every step streams its weights from memory as a real decode does).
//! `Throughput::Bytes` is the weight bytes one step reads, so criterion reports bandwidth.
//! For one row, `models_linear_pool` splits every product's output rows among the threads of
//! a pool of all cores (`linear_on`, as the decode step does on its cache's attention pool).
//! `output_layer` measures a batched decode step's output layer the same three ways.
//!
//! `cargo bench -p models --bench decode_linear`; `LINEAR_BENCH_QUICK=1` for a short run.

use std::time::Duration;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use tch::{Device, Kind, Tensor};

const LAYERS: usize = 8;
const SHAPES: [(i64, i64); 4] = [(960, 576), (576, 576), (3072, 576), (576, 1536)];

fn weights() -> Vec<Tensor> {
    tch::manual_seed(3);
    (0..LAYERS)
        .flat_map(|_| SHAPES)
        .map(|(out, inner)| Tensor::randn([out, inner], (Kind::Float, Device::Cpu)))
        .collect()
}

fn decode_linear(c: &mut Criterion) {
    let quick = std::env::var_os("LINEAR_BENCH_QUICK").is_some();
    let ws = weights();
    let bytes: usize = ws.iter().map(|w| w.numel() * 4).sum();
    let mut g = c.benchmark_group("decode_linear");
    g.throughput(Throughput::Bytes(bytes as u64));
    if quick {
        g.sample_size(10).measurement_time(Duration::from_secs(1));
    }
    let _guard = tch::no_grad_guard();
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let pool = attn_kernels::ThreadPool::new(cores).expect("thread pool");
    for rows in [1i64, 4, 8, 16] {
        let xs: Vec<Tensor> = SHAPES
            .iter()
            .map(|&(_, inner)| Tensor::randn([rows, inner], (Kind::Float, Device::Cpu)))
            .collect();
        let input = |i: usize| &xs[i % SHAPES.len()];
        g.bench_with_input(BenchmarkId::new("libtorch", rows), &rows, |b, _| {
            b.iter(|| {
                for (i, w) in ws.iter().enumerate() {
                    drop(std::hint::black_box(input(i).linear(w, None::<Tensor>)));
                }
            })
        });
        g.bench_with_input(BenchmarkId::new("models_linear", rows), &rows, |b, _| {
            b.iter(|| {
                for (i, w) in ws.iter().enumerate() {
                    let y = models::llama::linear::linear(input(i), w, None, "bench").unwrap();
                    drop(std::hint::black_box(y));
                }
            })
        });
        if rows == 1 {
            g.bench_with_input(BenchmarkId::new("models_linear_pool", rows), &rows, |b, _| {
                b.iter(|| {
                    for (i, w) in ws.iter().enumerate() {
                        let x = input(i);
                        let y = models::llama::linear::linear_on(Some(&pool), x, w, None, "bench")
                            .unwrap();
                        drop(std::hint::black_box(y));
                    }
                })
            });
        }
    }
    g.finish();
}

/// The output layer of a batched decode step: SmolLM2's `[49 152, 576]` head (113 MB) for
/// 1–64 rows, libtorch's `linear` against `linear` alone and split on a pool of all cores.
fn output_layer(c: &mut Criterion) {
    let quick = std::env::var_os("LINEAR_BENCH_QUICK").is_some();
    tch::manual_seed(5);
    let w = Tensor::randn([49_152, 576], (Kind::Float, Device::Cpu));
    let mut g = c.benchmark_group("output_layer");
    g.throughput(Throughput::Bytes((w.numel() * 4) as u64));
    if quick {
        g.sample_size(10).measurement_time(Duration::from_secs(1));
    }
    let _guard = tch::no_grad_guard();
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let pool = attn_kernels::ThreadPool::new(cores).expect("thread pool");
    for rows in [1i64, 4, 8, 16, 64] {
        let x = Tensor::randn([rows, 576], (Kind::Float, Device::Cpu));
        g.bench_with_input(BenchmarkId::new("libtorch", rows), &rows, |b, _| {
            b.iter(|| drop(std::hint::black_box(x.linear(&w, None::<Tensor>))))
        });
        g.bench_with_input(BenchmarkId::new("models_linear", rows), &rows, |b, _| {
            b.iter(|| {
                let y = models::llama::linear::linear(&x, &w, None, "bench").unwrap();
                drop(std::hint::black_box(y));
            })
        });
        g.bench_with_input(BenchmarkId::new("models_linear_pool", rows), &rows, |b, _| {
            b.iter(|| {
                let y =
                    models::llama::linear::linear_on(Some(&pool), &x, &w, None, "bench").unwrap();
                drop(std::hint::black_box(y));
            })
        });
    }
    g.finish();
}

criterion_group!(benches, decode_linear, output_layer);
criterion_main!(benches);
