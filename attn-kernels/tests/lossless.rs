//! Lossless mode: with every component kept (`k = d_h`) and `f32` storage, SWAN's sparse
//! and hybrid attention equal dense attention over the same rows (within
//! `accuracy::LOSSLESS_RELATIVE` of the output's magnitude) — on every engine, every GQA
//! layout, any buffer size.

mod common;

use attn_kernels::accuracy::LOSSLESS_RELATIVE;
use attn_kernels::{AttnConfig, DecodeAttention, DenseKv, Reference, SparseKv, synth};
use common::{LAYOUTS, engines};
use kv_sparse::csr::CsrStore;
use kv_sparse::hybrid::{HybridCache, HybridConfig};

fn assert_lossless(got: &[f32], dense: &[f32], what: &str) {
    let scale = dense.iter().fold(0.0f32, |a, x| a.max(x.abs()));
    let err = got.iter().zip(dense).fold(0.0f32, |a, (x, y)| a.max((x - y).abs()));
    assert!(
        err <= LOSSLESS_RELATIVE * scale,
        "{what}: |sparse − dense| = {err:e} > 1e-6 · {scale}"
    );
}

/// Keys and values of each kv-head (`len` rows of `d`), plain f32.
fn rows(kv_heads: usize, len: usize, d: usize, seed: u64) -> Vec<(Vec<f32>, Vec<f32>)> {
    (0..kv_heads as u64)
        .map(|h| (synth::values(len * d, seed + 2 * h), synth::values(len * d, seed + 2 * h + 1)))
        .collect()
}

fn dense_out(cfg: &AttnConfig, q: &[f32], data: &[(Vec<f32>, Vec<f32>)]) -> Vec<f32> {
    let d = cfg.head_dim();
    let kv: Vec<DenseKv<'_, f32>> = data.iter().map(|(k, v)| DenseKv::new(d, k, v)).collect();
    let mut out = vec![0.0; cfg.q_len()];
    Reference.dense(cfg, q, &kv, &mut out).unwrap();
    out
}

#[test]
fn hybrid_with_k_equal_head_dim_is_dense_attention() {
    let (len, d) = (300, 64);
    for (i, &layout) in LAYOUTS.iter().enumerate() {
        for b in [0, 1, 16, 300] {
            let cfg = AttnConfig::new(layout.0, layout.1, d).unwrap();
            let data = rows(layout.1, len, d, 10 * i as u64);
            let q = synth::values(cfg.q_len(), 5);
            let want = dense_out(&cfg, &q, &data);
            let caches: Vec<HybridCache<u8, f32, f32>> = data
                .iter()
                .map(|(k, v)| {
                    let mut c = HybridCache::new(HybridConfig::lossless(d, b)).unwrap();
                    c.extend(k, v).unwrap();
                    c
                })
                .collect();
            for (name, mut e) in engines() {
                let mut got = vec![0.0; cfg.q_len()];
                e.hybrid(&cfg, &q, &caches, &mut got).unwrap();
                assert_lossless(&got, &want, &format!("{name} {layout:?} b={b}"));
                let kv: Vec<DenseKv<'_, f32>> =
                    data.iter().map(|(k, v)| DenseKv::new(d, k, v)).collect();
                e.dense(&cfg, &q, &kv, &mut got).unwrap();
                assert_lossless(&got, &want, &format!("{name} {layout:?} dense"));
            }
        }
    }
}

#[test]
fn sparse_with_k_equal_head_dim_is_dense_attention() {
    let (len, d) = (257, 128);
    for &layout in &LAYOUTS {
        let cfg = AttnConfig::new(layout.0, layout.1, d).unwrap();
        let data = rows(layout.1, len, d, 77);
        let q = synth::values(cfg.q_len(), 6);
        let want = dense_out(&cfg, &q, &data);
        let stores: Vec<(CsrStore<u8, f32>, CsrStore<u8, f32>)> = data
            .iter()
            .map(|(k, v)| {
                let (mut ks, mut vs) = (CsrStore::new(d).unwrap(), CsrStore::new(d).unwrap());
                for (kr, vr) in k.chunks_exact(d).zip(v.chunks_exact(d)) {
                    ks.push_dense(kr, d).unwrap();
                    vs.push_dense(vr, d).unwrap();
                }
                (ks, vs)
            })
            .collect();
        let kv: Vec<SparseKv<'_, u8, f32>> =
            stores.iter().map(|(k, v)| SparseKv::new(k.view(), v.view())).collect();
        for (name, mut e) in engines() {
            let mut got = vec![0.0; cfg.q_len()];
            e.sparse(&cfg, &q, &kv, &mut got).unwrap();
            assert_lossless(&got, &want, &format!("{name} {layout:?}"));
        }
    }
}
