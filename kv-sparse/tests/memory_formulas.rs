//! Memory accounting checked exactly against SWAN's formulas (`3k+2`, `2k+2`, `2·d_h`),
//! the compute break-even length against a direct FLOP count (Appendix A.2), and the
//! memory break-even `k` against the paper's "retain fewer than 66%".

use half::f16;
use kv_sparse::csr::CsrStore;
use kv_sparse::fp8::Fp8E4M3;
use kv_sparse::hybrid::{HybridCache, HybridConfig, MultiHeadCache};
use kv_sparse::memory::{break_even_len, dense_row_bytes, max_k_saving_memory, sparse_row_bytes};
use kv_sparse::ring::DenseRing;
use kv_sparse::{SparseIndex, Value, ValueFormat};

fn row(t: usize, d: usize) -> Vec<f32> {
    (0..d).map(|i| ((t * 13 + i * 7) % 29) as f32 - 14.0).collect()
}

fn store_bytes<I: SparseIndex, V: Value>(d: usize, k: usize, rows: usize, rpb: usize) {
    let mut s = CsrStore::<I, V>::with_block_rows(d, rpb).unwrap();
    for t in 0..rows {
        s.push_dense(&row(t, d), k).unwrap();
    }
    let m = s.memory();
    let per_row = sparse_row_bytes(k, V::FORMAT, I::BYTES);
    assert_eq!(m.sparse_formula_bytes(), rows * per_row, "{} k={k}", V::FORMAT);
    assert_eq!(m.value_bytes, rows * k * V::FORMAT.bytes());
    assert_eq!(m.index_bytes, rows * k * I::BYTES);
    assert_eq!(m.offset_bytes, rows * 2);
    assert_eq!(m.block_header_bytes, rows.div_ceil(rpb) * 8);
    assert_eq!(m.held_bytes(), rows * per_row + rows.div_ceil(rpb) * 8);
    assert_eq!(m.dense_bytes, 0);
}

#[test]
fn sparse_rows_cost_exactly_the_paper_formulas() {
    for k in [0, 1, 16, 32, 64, 128] {
        store_bytes::<u8, f16>(128, k, 37, 16);
        assert_eq!(sparse_row_bytes(k, ValueFormat::F16, 1), 3 * k + 2);
        store_bytes::<u8, half::bf16>(128, k, 37, 16);
        store_bytes::<u8, Fp8E4M3>(128, k, 37, 16);
        assert_eq!(sparse_row_bytes(k, ValueFormat::Fp8E4M3, 1), 2 * k + 2);
        store_bytes::<u8, f32>(128, k, 5, 256);
        store_bytes::<u16, f16>(128, k, 5, 3);
        assert_eq!(sparse_row_bytes(k, ValueFormat::F16, 2), 4 * k + 2);
    }
    assert_eq!(dense_row_bytes(128, ValueFormat::F16), 2 * 128);
    // The paper's compression ratio (3k+2)/256 for d_h = 128.
    assert_eq!(sparse_row_bytes(64, ValueFormat::F16, 1) as f64 / 256.0, 194.0 / 256.0);
}

#[test]
fn dense_ring_costs_two_d_per_f16_row() {
    let mut ring = DenseRing::<f16>::new(128, 4);
    let mut ev = Vec::new();
    for t in 0..3 {
        ring.push(&row(t, 128), &mut ev).unwrap();
    }
    let m = ring.memory();
    assert_eq!(m.dense_bytes, 3 * dense_row_bytes(128, ValueFormat::F16));
    assert_eq!(m.dense_bytes, 3 * 2 * 128);
    assert_eq!(m.capacity_slack_bytes, 2 * 128);
}

#[test]
fn hybrid_cache_holds_exactly_sparse_plus_dense() {
    let (d, b, kk, kv, rpb) = (64, 8, 20, 12, 32);
    let cfg = HybridConfig { k_value: kv, rows_per_block: rpb, ..HybridConfig::new(d, b, kk) };
    let mut cache = HybridCache::<u8, Fp8E4M3, f16>::new(cfg).unwrap();
    let n = 100;
    for t in 0..n {
        cache.append(&row(t, d), &row(t + 1, d)).unwrap();
    }
    let sparse = n - b;
    let m = cache.memory();
    let formula = sparse * (2 * kk + 2) + sparse * (2 * kv + 2);
    assert_eq!(m.sparse_formula_bytes(), formula);
    assert_eq!(m.block_header_bytes, 2 * sparse.div_ceil(rpb) * 8);
    assert_eq!(m.dense_bytes, 2 * b * 2 * d);
    assert_eq!(m.held_bytes(), formula + 2 * sparse.div_ceil(rpb) * 8 + 2 * b * 2 * d);
    assert!(m.allocated_bytes() >= m.held_bytes());
    // A multi-head container is the sum of its heads.
    let mut multi = MultiHeadCache::<u8, Fp8E4M3, f16>::new(2, 3, cfg).unwrap();
    for t in 0..n {
        for layer in 0..2 {
            let k: Vec<f32> = (0..3).flat_map(|_| row(t, d)).collect();
            let v: Vec<f32> = (0..3).flat_map(|_| row(t + 1, d)).collect();
            multi.append_token(layer, &k, &v).unwrap();
        }
    }
    assert_eq!(multi.memory().held_bytes(), 6 * m.held_bytes());
}

#[test]
fn capacity_slack_is_reported_separately() {
    let mut s = CsrStore::<u8, f16>::new(64).unwrap();
    s.push_dense(&row(0, 64), 8).unwrap();
    let before = s.memory();
    s.reserve(1000, 8000);
    let after = s.memory();
    assert_eq!(after.held_bytes(), before.held_bytes());
    assert!(after.capacity_slack_bytes >= before.capacity_slack_bytes + 8000 * 3 + 1000 * 2);
    s.shrink_to_fit();
    // Only the reusable scratch (top-k indices and gathered values, one usize and one f32
    // per dimension) remains as slack.
    assert_eq!(s.memory().capacity_slack_bytes, 64 * (std::mem::size_of::<usize>() + 4));
}

/// FLOPs of one decode step for one head (SWAN Appendix A.2).
fn flops_dense(l: u64, d: u64) -> u64 {
    4 * l * d
}

fn flops_swan(l: u64, d: u64, b: u64, k: u64) -> u64 {
    4 * d * d + 4 * (l - b) * k + 4 * b * d
}

#[test]
fn break_even_length_matches_a_direct_flop_count() {
    for d in [32u64, 64, 128] {
        for b in [0u64, 16, 128] {
            for k in [1u64, d / 4, d / 2, d - 1] {
                let be = break_even_len(d as usize, b as usize, k as usize).unwrap();
                // First integer length where SWAN is strictly cheaper.
                let first = (b..10_000_000).find(|&l| flops_swan(l, d, b, k) < flops_dense(l, d));
                let first = first.unwrap();
                assert!((first as f64) > be && ((first - 1) as f64) <= be, "d={d} b={b} k={k}");
            }
            assert_eq!(break_even_len(d as usize, b as usize, d as usize), None);
        }
    }
}

#[test]
fn memory_break_even_k_matches_the_paper() {
    // "we must prune over 34% of dimensions (retain fewer than 66%)" for f16, d_h = 128.
    let k = max_k_saving_memory(128, ValueFormat::F16, 1, ValueFormat::F16).unwrap();
    assert_eq!(k, 84);
    assert!(sparse_row_bytes(k, ValueFormat::F16, 1) < dense_row_bytes(128, ValueFormat::F16));
    assert!(sparse_row_bytes(k + 1, ValueFormat::F16, 1) >= dense_row_bytes(128, ValueFormat::F16));
    assert!((k as f64 / 128.0) < 0.66);
    // fp8 values: 2k + 2 < 256 -> k <= 126.
    assert_eq!(max_k_saving_memory(128, ValueFormat::Fp8E4M3, 1, ValueFormat::F16), Some(126));
}
