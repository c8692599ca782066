//! Runtime rotation by `P_QK` after RoPE (SWAN §4, Appendix A.2's `4·d_h²` term): the tuned
//! row kernel, SGEMM and the automatic choice against the naive triple loop, all in one run;
//! plus a whole decode token (all q- and k-heads of one layer) for both model shapes: the
//! separate query and key calls (`tuned`) against the fused call that rotates each GQA
//! group's queries and key in one pass over `P_QK` (`fused_qk`).
//!
//! `cargo bench -p kvtide-projection --bench rotate`

use std::hint::black_box;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use projection::reference::rotate_rows_naive;
use projection::{Direction, ProjectionSet, RotationKernel, random_orthogonal, rotate_rows_with};

mod support;
use support::{LLAMA, SMOL, gaussian};

fn rows(c: &mut Criterion) {
    let mut group = c.benchmark_group("rotate_rows");
    group
        .sample_size(20)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1));
    for d in [64usize, 128] {
        let p = random_orthogonal(d, 1);
        for n in [1usize, 4, 8, 16, 64, 512] {
            let x = gaussian(n * d, 2);
            let mut out = vec![0.0f32; n * d];
            group.throughput(Throughput::Elements(n as u64));
            let id = |name: &str| BenchmarkId::new(name.to_owned(), format!("d{d}/n{n}"));
            group.bench_function(id("naive"), |b| {
                b.iter(|| rotate_rows_naive(black_box(&x), &p, &mut out).unwrap())
            });
            for (name, k) in [
                ("row_kernel", RotationKernel::Rows),
                ("gemm", RotationKernel::Gemm),
                ("auto", RotationKernel::Auto),
            ] {
                group.bench_function(id(name), |b| {
                    b.iter(|| {
                        rotate_rows_with(k, Direction::Forward, black_box(&x), &p, &mut out)
                            .unwrap()
                    })
                });
            }
        }
    }
    group.finish();
}

fn decode_token(c: &mut Criterion) {
    let mut group = c.benchmark_group("rotate_decode_token");
    group
        .sample_size(20)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1));
    for s in [SMOL, LLAMA] {
        let set = ProjectionSet::random(s.dims(), s.name, 3).unwrap();
        let d = s.head_dim;
        let q = gaussian(s.q_heads * d, 4);
        let k = gaussian(s.kv_heads * d, 5);
        let (mut qo, mut ko) = (vec![0.0f32; q.len()], vec![0.0f32; k.len()]);
        group.throughput(Throughput::Elements((s.q_heads + s.kv_heads) as u64));
        group.bench_function(BenchmarkId::new("tuned", s.name), |b| {
            b.iter(|| {
                set.rotate_queries_into(0, 1, black_box(&q), &mut qo).unwrap();
                set.rotate_keys_into(0, 1, black_box(&k), &mut ko).unwrap();
            })
        });
        group.bench_function(BenchmarkId::new("fused_qk", s.name), |b| {
            b.iter(|| {
                set.rotate_qk_into(0, 1, black_box(&q), black_box(&k), &mut qo, &mut ko).unwrap()
            })
        });
        group.bench_function(BenchmarkId::new("naive", s.name), |b| {
            b.iter(|| {
                for h in 0..s.q_heads {
                    let p = set.qk(0, h / (s.q_heads / s.kv_heads)).unwrap();
                    rotate_rows_naive(black_box(&q[h * d..][..d]), p, &mut qo[h * d..][..d])
                        .unwrap();
                }
                for j in 0..s.kv_heads {
                    let p = set.qk(0, j).unwrap();
                    rotate_rows_naive(black_box(&k[j * d..][..d]), p, &mut ko[j * d..][..d])
                        .unwrap();
                }
            })
        });
    }
    group.finish();
}

criterion_group!(benches, rows, decode_token);
criterion_main!(benches);
