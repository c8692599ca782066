//! Properties of the dense ring and eviction order (SWAN Algorithm 1): after any sequence
//! of appends the tokens come back in order — evicted rows leave oldest first and the
//! buffer holds the newest — and a bulk prefill equals the same appends one by one.

use half::f16;
use kv_sparse::fp8::Fp8E4M3;
use kv_sparse::hybrid::{HybridCache, HybridView};
use kv_sparse::ring::DenseRing;
use kv_sparse::strategies::{cache_case, dense_rows};
use kv_sparse::{SparseIndex, Value};
use proptest::prelude::*;

fn decoded<I: SparseIndex, V: Value, D: Value>(v: HybridView<'_, I, V, D>) -> Vec<Vec<u32>> {
    let mut rows = Vec::new();
    let mut out = vec![0.0; v.head_dim];
    for t in 0..v.len() {
        v.key_into(t, &mut out).unwrap();
        rows.push(out.iter().map(|x| x.to_bits()).collect());
        v.value_into(t, &mut out).unwrap();
        rows.push(out.iter().map(|x| x.to_bits()).collect());
    }
    rows
}

proptest! {
    #[test]
    fn ring_returns_rows_in_token_order(
        (d, cap, (n, flat)) in (1usize..12, 0usize..9)
            .prop_flat_map(|(d, cap)| (Just(d), Just(cap), dense_rows(d, 0..30))),
    ) {
        let mut ring = DenseRing::<f16>::new(d, cap);
        let mut evicted = Vec::new();
        let mut out_order = Vec::new();
        let enc = |r: &[f32]| -> Vec<f16> { r.iter().map(|&x| f16::from_f32(x)).collect() };
        for r in flat.chunks_exact(d) {
            if ring.push(r, &mut evicted).unwrap() {
                out_order.push(evicted.clone());
            }
        }
        let inputs: Vec<&[f32]> = flat.chunks_exact(d).collect();
        let spilled = n.saturating_sub(cap);
        prop_assert_eq!(out_order.len(), spilled);
        for (t, ev) in out_order.iter().enumerate() {
            let want: Vec<f32> = if cap == 0 { inputs[t].to_vec() } else { enc(inputs[t]).iter().map(|x| x.to_f32()).collect() };
            prop_assert_eq!(ev, &want, "evicted #{}", t);
        }
        let (a, b) = ring.as_slices();
        let held: Vec<f16> = a.iter().chain(b).copied().collect();
        let want: Vec<f16> = inputs[spilled..].iter().flat_map(|r| enc(r)).collect();
        prop_assert_eq!(held, want);
    }

    #[test]
    fn extend_equals_appends_at_any_split(case in cache_case(24, 30), split in 0usize..31) {
        let split = split.min(case.rows());
        let d = case.cfg.head_dim;
        let one_by_one = case.build::<u8, Fp8E4M3, f16>().unwrap();
        let mut bulk = HybridCache::<u8, Fp8E4M3, f16>::new(case.cfg).unwrap();
        bulk.extend(&case.keys[..split * d], &case.values[..split * d]).unwrap();
        bulk.extend(&case.keys[split * d..], &case.values[split * d..]).unwrap();
        prop_assert_eq!(bulk.sparse_len(), one_by_one.sparse_len());
        prop_assert_eq!(decoded(bulk.view()), decoded(one_by_one.view()));
        prop_assert_eq!(bulk.memory().held_bytes(), one_by_one.memory().held_bytes());
    }
}
