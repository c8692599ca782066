//! Every optimized kernel × value format × GQA ratio × edge case against the reference,
//! within the tolerances of `attn_kernels::accuracy` (SWAN's sparse and hybrid decode,
//! dense baseline, WnW's gathered decode with anchor weights).

mod common;

use attn_kernels::accuracy::Kernel;
use attn_kernels::{DecodeAttention, DenseKv, GatheredKv, Reference, SparseKv, synth};
use common::{LAYOUTS, assert_close, cfg, csr_bound, dense_bound, engines};
use half::{bf16, f16};
use kv_sparse::fp8::Fp8E4M3;
use kv_sparse::hybrid::{HybridCache, HybridConfig};
use kv_sparse::{SparseIndex, Value};

/// Dense caches of `rows` rows per kv-head, the ring split after `split` rows.
fn dense_case<D: Value>(layout: (usize, usize), d: usize, rows: usize, split: usize, seed: u64) {
    let cfg = cfg(layout, d);
    let data: Vec<(Vec<D>, Vec<D>)> = (0..layout.1 as u64)
        .map(|h| {
            (synth::dense_rows(rows, d, seed + 2 * h), synth::dense_rows(rows, d, seed + 2 * h + 1))
        })
        .collect();
    let kv: Vec<DenseKv<'_, D>> = data
        .iter()
        .map(|(k, v)| DenseKv {
            head_dim: d,
            keys: k.split_at(split * d),
            values: v.split_at(split * d),
        })
        .collect();
    let bound = data.iter().map(|(_, v)| dense_bound(&[v])).fold(0.0, f32::max);
    let q = synth::values(cfg.q_len(), seed + 99);
    let mut want = vec![0.0; cfg.q_len()];
    Reference.dense(&cfg, &q, &kv, &mut want).unwrap();
    for (name, mut e) in engines() {
        let mut got = vec![f32::NAN; cfg.q_len()];
        e.dense(&cfg, &q, &kv, &mut got).unwrap();
        let what = format!("{name} {layout:?} d={d} rows={rows}");
        assert_close(Kernel::Dense, D::FORMAT, &got, &want, bound, &what);
    }
}

/// Runs `$f::<T>(args)` for every value format.
macro_rules! for_each_format {
    ($f:ident($($arg:expr),* $(,)?)) => {{
        $f::<f32>($($arg),*);
        $f::<f16>($($arg),*);
        $f::<bf16>($($arg),*);
        $f::<Fp8E4M3>($($arg),*);
    }};
}

#[test]
fn dense_every_format_layout_and_length() {
    for (i, &layout) in LAYOUTS.iter().enumerate() {
        let seed = 100 * i as u64;
        // (d, rows, ring split): L = 1, a contiguous cache, a ring split mid-way, d % 8 ≠ 0.
        for (j, (d, rows, split)) in
            [(64, 1, 0), (64, 100, 100), (128, 77, 30), (24, 33, 5)].into_iter().enumerate()
        {
            for_each_format!(dense_case(layout, d, rows, split, seed + j as u64));
        }
    }
    for d in [1, 5, 8, 17] {
        dense_case::<f16>((4, 2), d, 40, 13, d as u64);
    }
}

/// CSR caches with `k_key`/`k_value` kept components and non-trivial scales.
fn sparse_case<I: SparseIndex, V: Value>(
    layout: (usize, usize),
    d: usize,
    rows: usize,
    k: (usize, usize),
    seed: u64,
) {
    let cfg = cfg(layout, d);
    let stores: Vec<_> = (0..layout.1 as u64)
        .map(|h| {
            let ks = synth::csr_store::<I, V>(d, rows, k.0, seed + 2 * h).unwrap();
            let vs = synth::csr_store::<I, V>(d, rows, k.1, seed + 2 * h + 1).unwrap();
            (ks, vs)
        })
        .collect();
    let kv: Vec<SparseKv<'_, I, V>> = stores
        .iter()
        .map(|(ks, vs)| SparseKv {
            keys: ks.view(),
            values: vs.view(),
            key_scale: 0.75,
            value_scale: 1.5,
        })
        .collect();
    let bound = kv.iter().map(|c| csr_bound(&c.values, c.value_scale)).fold(0.0, f32::max);
    let q = synth::values(cfg.q_len(), seed + 99);
    let mut want = vec![0.0; cfg.q_len()];
    Reference.sparse(&cfg, &q, &kv, &mut want).unwrap();
    for (name, mut e) in engines() {
        let mut got = vec![f32::NAN; cfg.q_len()];
        e.sparse(&cfg, &q, &kv, &mut got).unwrap();
        let what = format!("{name} {layout:?} d={d} rows={rows} k={k:?}");
        assert_close(Kernel::Sparse, V::FORMAT, &got, &want, bound, &what);
    }
}

fn sparse_edge_cases<V: Value>(layout: (usize, usize), seed: u64) {
    // (d, rows, (k_key, k_value)): L = 1 with k = d, k = 0 keys, mixed k, k = 0 values.
    for (j, (d, rows, k)) in
        [(64, 1, (64, 64)), (64, 45, (0, 32)), (128, 70, (64, 16)), (32, 33, (32, 0))]
            .into_iter()
            .enumerate()
    {
        sparse_case::<u8, V>(layout, d, rows, k, seed + j as u64);
    }
}

#[test]
fn sparse_every_format_layout_and_k() {
    for (i, &layout) in LAYOUTS.iter().enumerate() {
        let seed = 1000 + 100 * i as u64;
        for_each_format!(sparse_edge_cases(layout, seed));
        sparse_case::<u16, f16>(layout, 300, 20, (150, 37), seed + 50);
        sparse_case::<u16, Fp8E4M3>(layout, 260, 9, (260, 1), seed + 51);
    }
}

/// Hybrid caches: `len` tokens, the last `b` dense, sparse blocks of 7 rows.
fn hybrid_case<I: SparseIndex, V: Value, D: Value>(
    layout: (usize, usize),
    d: usize,
    len: usize,
    b: usize,
    k: (usize, usize),
    seed: u64,
) {
    let cfg = cfg(layout, d);
    let hc = HybridConfig {
        k_key: k.0,
        k_value: k.1,
        rows_per_block: 7,
        ..HybridConfig::new(d, b, k.0)
    };
    let caches: Vec<HybridCache<I, V, D>> = (0..layout.1 as u64)
        .map(|h| synth::hybrid_cache_with(hc, len, seed + h).unwrap())
        .collect();
    let bound = caches
        .iter()
        .map(|c| {
            let v = c.view();
            csr_bound(&v.sparse_values, v.value_scale.1)
                .max(dense_bound(&[v.buffer_values.0, v.buffer_values.1]))
        })
        .fold(0.0, f32::max);
    let q = synth::values(cfg.q_len(), seed + 99);
    let mut want = vec![0.0; cfg.q_len()];
    Reference.hybrid(&cfg, &q, &caches, &mut want).unwrap();
    for (name, mut e) in engines() {
        let mut got = vec![f32::NAN; cfg.q_len()];
        e.hybrid(&cfg, &q, &caches, &mut got).unwrap();
        let what = format!("{name} {layout:?} d={d} len={len} b={b} k={k:?}");
        assert_close(Kernel::Hybrid, V::FORMAT, &got, &want, bound, &what);
    }
}

/// Hybrid edge cases for sparse values `V` over a dense buffer `D`.
fn hybrid_edge_cases<V: Value, D: Value>(layout: (usize, usize), seed: u64) {
    hybrid_case::<u8, V, D>(layout, 128, 150, 16, (64, 64), seed); // typical
    hybrid_case::<u8, V, D>(layout, 64, 60, 0, (32, 48), seed + 1); // b = 0
    hybrid_case::<u8, V, D>(layout, 64, 5, 8, (16, 16), seed + 2); // L = 0 sparse
    hybrid_case::<u8, V, D>(layout, 32, 1, 0, (32, 32), seed + 3); // L = 1, k = d
    hybrid_case::<u8, V, D>(layout, 64, 40, 1, (0, 0), seed + 4); // k = 0
    hybrid_case::<u8, V, D>(layout, 24, 30, 30, (12, 12), seed + 5); // L = 0 sparse, buffer full
}

#[test]
fn hybrid_every_format_layout_and_edge() {
    for (i, &layout) in LAYOUTS.iter().enumerate() {
        let seed = 2000 + 100 * i as u64;
        hybrid_edge_cases::<f32, f32>(layout, seed);
        hybrid_edge_cases::<f16, f16>(layout, seed + 10);
        hybrid_edge_cases::<bf16, bf16>(layout, seed + 20);
        hybrid_edge_cases::<Fp8E4M3, f16>(layout, seed + 30);
        hybrid_edge_cases::<Fp8E4M3, bf16>(layout, seed + 40);
    }
    hybrid_case::<u16, f16, f32>((8, 2), 260, 30, 4, (100, 260), 77);
}

/// Gathered rows: a slab of `slab` rows, `rows` of them resident (every third slot order
/// scrambled), with and without a slot table; weights compared too.
fn gathered_case<D: Value>(layout: (usize, usize), d: usize, slab: usize, rows: usize, seed: u64) {
    let cfg = cfg(layout, d);
    let keys: Vec<D> = synth::dense_rows(slab, d, seed);
    let values: Vec<D> = synth::dense_rows(slab, d, seed + 1);
    let positions: Vec<u32> = (0..rows as u32).map(|i| 3 * i + (i % 2)).collect();
    let slots: Vec<u32> = (0..rows as u32).map(|i| (i * 7 + 3) % slab as u32).collect();
    let heads: Vec<GatheredKv<'_, D>> = (0..layout.1)
        .map(|h| {
            if h % 2 == 0 {
                GatheredKv::with_slots(d, &positions, &slots, &keys, &values)
            } else {
                GatheredKv::new(d, &positions, &keys, &values)
            }
        })
        .collect();
    let bound = dense_bound(&[&values]);
    let q = synth::values(cfg.q_len(), seed + 99);
    let (mut want, mut want_w) = (vec![0.0; cfg.q_len()], vec![0.0; rows * layout.1]);
    Reference.gathered(&cfg, &q, &heads, &mut want, Some(&mut want_w)).unwrap();
    let tol_w = attn_kernels::accuracy::tolerance(Kernel::Gathered, D::FORMAT).weights;
    for (name, mut e) in engines() {
        let (mut got, mut got_w) = (vec![f32::NAN; cfg.q_len()], vec![f32::NAN; rows * layout.1]);
        e.gathered(&cfg, &q, &heads, &mut got, Some(&mut got_w)).unwrap();
        let what = format!("{name} {layout:?} d={d} rows={rows}");
        assert_close(Kernel::Gathered, D::FORMAT, &got, &want, bound, &what);
        for (a, b) in got_w.iter().zip(&want_w) {
            assert!((a - b).abs() <= tol_w, "{what}: weight {a} vs {b}");
        }
        let mut plain = vec![f32::NAN; cfg.q_len()];
        e.gathered(&cfg, &q, &heads, &mut plain, None).unwrap();
        assert_eq!(plain, got, "{what}: weights must not change the output");
    }
    let group = cfg.group_size() as f32;
    for per_head in want_w.chunks(rows) {
        let total: f32 = per_head.iter().sum();
        assert!((total - group).abs() < 1e-4, "weights of a kv-head sum to its group size");
    }
}

fn gathered_edge_cases<D: Value>(layout: (usize, usize), seed: u64) {
    gathered_case::<D>(layout, 32, 1, 1, seed); // L = 1
    gathered_case::<D>(layout, 64, 120, 100, seed + 1);
    gathered_case::<D>(layout, 24, 50, 50, seed + 2);
}

#[test]
fn gathered_every_format_layout_with_weights() {
    for (i, &layout) in LAYOUTS.iter().enumerate() {
        for_each_format!(gathered_edge_cases(layout, 3000 + 100 * i as u64));
    }
}

#[test]
fn output_is_independent_of_thread_count() {
    let cfg = cfg((8, 2), 64);
    let caches: Vec<HybridCache<u8, Fp8E4M3, f16>> =
        (0..2).map(|h| synth::hybrid_cache(64, 16, 32, 3000, h).unwrap()).collect();
    let q = synth::values(cfg.q_len(), 5);
    let outputs: Vec<Vec<f32>> = (1..=3)
        .map(|t| {
            let mut e = attn_kernels::CpuAttention::new(t).unwrap().with_split_rows(256).unwrap();
            let mut out = vec![0.0; cfg.q_len()];
            e.hybrid(&cfg, &q, &caches, &mut out).unwrap();
            out
        })
        .collect();
    assert_eq!(outputs[0], outputs[1]);
    assert_eq!(outputs[0], outputs[2]);
}

#[test]
fn custom_scale_matches_reference() {
    let cfg = cfg((4, 2), 32).with_scale(0.9).unwrap();
    let k: Vec<f16> = synth::dense_rows(50, 32, 1);
    let kv = [DenseKv::new(32, &k, &k), DenseKv::new(32, &k, &k)];
    let q = synth::values(cfg.q_len(), 2);
    let (mut want, mut got) = (vec![0.0; cfg.q_len()], vec![0.0; cfg.q_len()]);
    Reference.dense(&cfg, &q, &kv, &mut want).unwrap();
    for (name, mut e) in engines() {
        e.dense(&cfg, &q, &kv, &mut got).unwrap();
        assert_close(
            Kernel::Dense,
            kv_sparse::ValueFormat::F16,
            &got,
            &want,
            dense_bound(&[&k]),
            &name,
        );
    }
}

#[test]
fn long_cache_stays_within_tolerance() {
    // 20k rows: many tiles, many items, a long online-softmax chain; larger logits.
    let cfg = cfg((4, 1), 128).with_scale(0.25).unwrap();
    let caches: Vec<HybridCache<u8, Fp8E4M3, f16>> =
        vec![synth::hybrid_cache(128, 128, 64, 20_000, 9).unwrap()];
    let q = synth::values(cfg.q_len(), 3);
    let mut want = vec![0.0; cfg.q_len()];
    Reference.hybrid(&cfg, &q, &caches, &mut want).unwrap();
    let v = caches[0].view();
    let bound =
        csr_bound(&v.sparse_values, 1.0).max(dense_bound(&[v.buffer_values.0, v.buffer_values.1]));
    for (name, mut e) in engines() {
        let mut got = vec![0.0; cfg.q_len()];
        e.hybrid(&cfg, &q, &caches, &mut got).unwrap();
        assert_close(Kernel::Hybrid, kv_sparse::ValueFormat::Fp8E4M3, &got, &want, bound, &name);
    }
}
