//! Weighted selection (`Hybrid::set_key_weights`, `Hybrid::set_value_weights`): an evicted
//! key (value) keeps the `k_key` (`k_value`) components with the largest `|x_j|·w_j`, stored
//! unweighted. Checked against a sorting
//! reference on CSR and coded rows; all-equal weights are SWAN's magnitude rule bit for bit;
//! at `k = head_dim` any weights leave the lossless setting exact; bad weights are typed
//! errors that change nothing.

use half::f16;
use kv_sparse::Error;
use kv_sparse::coded::{Bitmask, CodedStore, Elems};
use kv_sparse::hybrid::{CodedHybridCache, HybridCache, HybridConfig};
use proptest::prelude::*;

/// The reference: indices of the `k` largest `|x_j|·ŵ_j` (ties → lower index), ascending,
/// with `ŵ = w / max w` as the cache normalises them.
fn reference(x: &[f32], w: &[f32], k: usize) -> Vec<usize> {
    let max = w.iter().fold(0f32, |m, &v| m.max(v));
    let key = |j: usize| (x[j] * (w[j] / max)).abs();
    let mut order: Vec<usize> = (0..x.len()).collect();
    order.sort_by(|&a, &b| key(b).total_cmp(&key(a)).then(a.cmp(&b)));
    let mut kept = order[..k].to_vec();
    kept.sort_unstable();
    kept
}

fn rows_and_weights(d: usize) -> impl Strategy<Value = (Vec<Vec<f32>>, Vec<f32>, usize)> {
    let row = prop::collection::vec(-8.0f32..8.0, d);
    (
        prop::collection::vec(row, 1..12),
        prop::collection::vec(0.0f32..4.0, d)
            .prop_filter("not all zero", |w| w.iter().any(|&x| x > 0.0)),
        0..=d,
    )
}

proptest! {
    #[test]
    fn csr_rows_keep_the_largest_weighted_components((rows, w, k) in rows_and_weights(24)) {
        let mut cache = HybridCache::<u8, f32, f32>::new(HybridConfig::new(24, 0, k)).unwrap();
        cache.set_key_weights(Some(&w)).unwrap();
        for r in &rows {
            cache.append(r, r).unwrap();
        }
        let view = cache.view();
        for (t, r) in rows.iter().enumerate() {
            let row = view.sparse_keys.row(t).unwrap();
            let got: Vec<usize> = row.indices.iter().map(|&i| usize::from(i)).collect();
            prop_assert_eq!(&got, &reference(r, &w, k), "row {}", t);
            let want: Vec<f32> = got.iter().map(|&j| r[j]).collect();
            prop_assert_eq!(row.values, &want[..]);
            // Values are selected by magnitude as before.
            let v = view.sparse_values.row(t).unwrap();
            let plain: Vec<usize> = v.indices.iter().map(|&i| usize::from(i)).collect();
            prop_assert_eq!(plain, reference(r, &[1.0; 24], k));
        }
    }

    #[test]
    fn values_keep_their_own_weighted_components((rows, w, k) in rows_and_weights(24), wk in prop::collection::vec(0.5f32..2.0, 24)) {
        let mut cache = HybridCache::<u8, f32, f32>::new(HybridConfig::new(24, 0, k)).unwrap();
        cache.set_key_weights(Some(&wk)).unwrap();
        cache.set_value_weights(Some(&w)).unwrap();
        for r in &rows {
            let v: Vec<f32> = r.iter().rev().copied().collect();
            cache.append(r, &v).unwrap();
        }
        let view = cache.view();
        for (t, r) in rows.iter().enumerate() {
            let v: Vec<f32> = r.iter().rev().copied().collect();
            let row = view.sparse_values.row(t).unwrap();
            let got: Vec<usize> = row.indices.iter().map(|&i| usize::from(i)).collect();
            prop_assert_eq!(&got, &reference(&v, &w, k), "row {}", t);
            let want: Vec<f32> = got.iter().map(|&j| v[j]).collect();
            prop_assert_eq!(row.values, &want[..]);
            let keys = view.sparse_keys.row(t).unwrap();
            let kept: Vec<usize> = keys.indices.iter().map(|&i| usize::from(i)).collect();
            prop_assert_eq!(kept, reference(r, &wk, k), "keys of row {}", t);
        }
    }

    #[test]
    fn coded_rows_keep_the_largest_weighted_components((rows, w, k) in rows_and_weights(32)) {
        type Rows = CodedStore<Bitmask, Elems<f16>>;
        let cfg = HybridConfig::new(32, 1, k).for_store::<Rows>();
        let mut cache = CodedHybridCache::<Bitmask, Elems<f16>, f16>::new(cfg).unwrap();
        cache.set_key_weights(Some(&w)).unwrap();
        for r in &rows {
            cache.append(r, r).unwrap();
        }
        let view = cache.view();
        let mut out = vec![0.0; 32];
        for (t, r) in rows.iter().enumerate().take(rows.len() - 1) {
            view.key_into(t, &mut out).unwrap();
            // Evicted rows leave an f16 buffer: selection sees their f16 rounding.
            let r: Vec<f32> = r.iter().map(|&x| f16::from_f32(x).to_f32()).collect();
            let kept = reference(&r, &w, k);
            for j in 0..32 {
                let want: f32 = if kept.contains(&j) { f16::from_f32(r[j]).to_f32() } else { 0.0 };
                prop_assert_eq!(out[j].to_bits(), want.to_bits(), "row {} component {}", t, j);
            }
        }
    }

    #[test]
    fn equal_weights_are_the_magnitude_rule((rows, _w, k) in rows_and_weights(16), c in 0.01f32..100.0) {
        let mut plain = HybridCache::<u8, f32, f32>::new(HybridConfig::new(16, 2, k)).unwrap();
        let mut weighted = plain.clone();
        weighted.set_key_weights(Some(&[c; 16])).unwrap();
        weighted.set_value_weights(Some(&[c; 16])).unwrap();
        for r in &rows {
            plain.append(r, r).unwrap();
            weighted.append(r, r).unwrap();
        }
        prop_assert_eq!(plain.sparse_len(), weighted.sparse_len());
        for t in 0..plain.sparse_len() {
            let (a, b) = (plain.view().sparse_keys.row(t).unwrap(), weighted.view().sparse_keys.row(t).unwrap());
            prop_assert_eq!((a.indices, a.values), (b.indices, b.values));
            let (a, b) = (plain.view().sparse_values.row(t).unwrap(), weighted.view().sparse_values.row(t).unwrap());
            prop_assert_eq!((a.indices, a.values), (b.indices, b.values));
        }
    }

    #[test]
    fn any_weights_at_k_equal_head_dim_stay_lossless((rows, w, _k) in rows_and_weights(16)) {
        let mut cache = HybridCache::<u8, f32, f32>::new(HybridConfig::lossless(16, 1)).unwrap();
        cache.set_key_weights(Some(&w)).unwrap();
        cache.set_value_weights(Some(&w)).unwrap();
        for r in &rows {
            cache.append(r, r).unwrap();
        }
        let mut out = vec![0.0; 16];
        for (t, r) in rows.iter().enumerate() {
            cache.view().key_into(t, &mut out).unwrap();
            prop_assert_eq!(&out, r);
            cache.view().value_into(t, &mut out).unwrap();
            prop_assert_eq!(&out, r);
        }
    }
}

#[test]
fn bad_weights_are_typed_errors_and_change_nothing() {
    let mut cache = HybridCache::<u8, f32, f32>::new(HybridConfig::new(4, 0, 2)).unwrap();
    cache.set_key_weights(Some(&[1.0, 2.0, 3.0, 4.0])).unwrap();
    let before = cache.key_weights().unwrap().to_vec();
    assert_eq!(before, [0.25, 0.5, 0.75, 1.0]);
    let cases: [&[f32]; 5] = [
        &[1.0, 2.0, 3.0],
        &[1.0, f32::NAN, 1.0, 1.0],
        &[1.0, f32::INFINITY, 1.0, 1.0],
        &[1.0, -0.5, 1.0, 1.0],
        &[0.0; 4],
    ];
    for w in cases {
        let err = cache.set_key_weights(Some(w)).unwrap_err();
        assert!(
            matches!(
                err,
                Error::LengthMismatch { .. }
                    | Error::NonFinite { .. }
                    | Error::InvalidWeight { .. }
            ),
            "{w:?}: {err}"
        );
        assert_eq!(cache.key_weights().unwrap(), &before[..], "{w:?} changed the weights");
    }
    cache.set_key_weights(None).unwrap();
    assert!(cache.key_weights().is_none());
    cache.set_value_weights(Some(&[4.0, 2.0, 2.0, 1.0])).unwrap();
    for w in cases {
        assert!(cache.set_value_weights(Some(w)).is_err(), "{w:?}");
        assert_eq!(cache.value_weights().unwrap(), &[1.0, 0.5, 0.5, 0.25], "{w:?} changed them");
    }
}
