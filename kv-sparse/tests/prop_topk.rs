//! Properties of pruning (SWAN's magnitude top-k): the kept set is exactly the k largest
//! magnitudes with ties to the lower index, and a dense query's dot product with a sparse
//! row equals its dot product with the pruned dense row.

use kv_sparse::csr::{CsrStore, CsrView};
use kv_sparse::fp8::Fp8E4M3;
use kv_sparse::strategies::{dense_row, sparse_row, value};
use kv_sparse::topk::top_k_magnitude;
use proptest::prelude::*;

/// Reference: sort by (|x| descending, index ascending), take k, sort ascending.
fn reference_top_k(x: &[f32], k: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..x.len()).collect();
    order.sort_by(|&a, &b| x[b].abs().total_cmp(&x[a].abs()).then(a.cmp(&b)));
    let mut kept = order[..k].to_vec();
    kept.sort_unstable();
    kept
}

fn row_and_k() -> impl Strategy<Value = (Vec<f32>, usize)> {
    (1usize..=96).prop_flat_map(|d| (dense_row(d), 0..=d))
}

proptest! {
    #[test]
    fn top_k_keeps_exactly_the_k_largest_magnitudes((x, k) in row_and_k()) {
        let mut out = Vec::new();
        top_k_magnitude(&x, k, &mut out).unwrap();
        prop_assert_eq!(&out, &reference_top_k(&x, k));
        let kept_min = out.iter().map(|&i| x[i].abs()).fold(f32::INFINITY, f32::min);
        let dropped_max = (0..x.len()).filter(|i| !out.contains(i)).map(|i| x[i].abs()).fold(0.0, f32::max);
        prop_assert!(out.is_empty() || kept_min >= dropped_max);
        prop_assert!(out.windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn sparse_dot_equals_pruned_dense_dot((x, k) in row_and_k(), seed in any::<u64>()) {
        let d = x.len();
        let q: Vec<f32> = (0..d).map(|i| ((seed >> (i % 60)) & 0xff) as f32 / 16.0 - 8.0).collect();
        let mut store = CsrStore::<u8, f32>::new(d).unwrap();
        store.push_dense(&x, k).unwrap();
        let mut pruned = vec![0.0; d];
        store.to_dense_row(0, &mut pruned).unwrap();
        let kept = reference_top_k(&x, k);
        for i in 0..d {
            prop_assert_eq!(pruned[i], if kept.contains(&i) { x[i] } else { 0.0 });
        }
        let dense: f32 = q.iter().zip(&pruned).map(|(a, b)| a * b).sum();
        prop_assert_eq!(store.row(0).unwrap().dot(&q).unwrap(), dense);
    }

    #[test]
    fn rows_of_any_k_and_truncation_keep_the_csr_invariants(
        rows in prop::collection::vec(sparse_row(40), 0..60),
        rpb in 1usize..6,
        keep in 0usize..70,
    ) {
        let mut store = CsrStore::<u8, Fp8E4M3>::with_block_rows(40, rpb).unwrap();
        for (idx, vals) in &rows {
            store.push_sparse(idx, vals).unwrap();
        }
        store.truncate(keep);
        let n = keep.min(rows.len());
        prop_assert_eq!(store.len(), n);
        let v = store.view();
        let checked = CsrView::<u8, Fp8E4M3>::from_parts(40, rpb, v.block_bases(), v.offsets(), v.indices(), v.values());
        prop_assert!(checked.is_ok());
        prop_assert_eq!(v.rows().count(), n);
        prop_assert_eq!(v.blocks().map(|b| b.num_rows()).sum::<usize>(), n);
        for (t, row) in v.rows().enumerate() {
            let want: Vec<u8> = rows[t].0.iter().map(|&i| i as u8).collect();
            prop_assert_eq!(row.indices, &want[..]);
            let vals: Vec<Fp8E4M3> = rows[t].1.iter().map(|&x| Fp8E4M3::from_f32(x)).collect();
            prop_assert_eq!(row.values, &vals[..]);
        }
    }

    #[test]
    fn fp8_is_monotone_and_accurate(a in value(), b in value()) {
        let (lo, hi) = if a <= b { (a, b) } else { (b, a) };
        prop_assert!(Fp8E4M3::from_f32(lo).to_f32() <= Fp8E4M3::from_f32(hi).to_f32());
        let x = a.clamp(-448.0, 448.0);
        let err = (Fp8E4M3::from_f32(x).to_f32() - x).abs();
        // Half a unit in the last place: 2^-4 relative for normals, 2^-10 absolute below.
        prop_assert!(err <= (x.abs() / 16.0).max(2f32.powi(-10)), "{} -> err {}", x, err);
    }
}
