//! The exported strategies (`projection::strategies`) as a user would use them: every drawn
//! basis is orthonormal, every drawn set fits its geometry and survives persistence, and
//! rotating with it is lossless before pruning (SWAN Appendix A.1: Lemma 1 for scores at
//! decode and prefill sizes, and the value/output round trip behind Lemma 2).

use projection::strategies::{any_projection_set, model_dims, orthonormal_basis, projection_set};
use projection::{GEMM_MIN_ROWS, ORTHOGONALITY_TOLERANCE, ProjectionSet};
use proptest::collection::vec;
use proptest::prelude::*;

fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

fn norm(a: &[f32]) -> f32 {
    dot(a, a).sqrt()
}

/// A set with `n` tokens of queries and keys in `[-1, 1]`.
fn set_and_qk(n: usize) -> impl Strategy<Value = (ProjectionSet, Vec<f32>, Vec<f32>)> {
    model_dims(1..=2, 1..=3, 1..=4, 1..=24).prop_flat_map(move |dims| {
        let d = dims.head_dim();
        (
            projection_set(dims),
            vec(-1.0f32..1.0, n * dims.q_heads() * d),
            vec(-1.0f32..1.0, n * dims.kv_heads() * d),
        )
    })
}

/// Lemma 1 at every (token, q-head) of `layer`: `q̂·k̂ = q·k` to f32 rounding.
fn assert_scores_kept(
    set: &ProjectionSet,
    layer: usize,
    n: usize,
    q: &[f32],
    k: &[f32],
) -> Result<(), TestCaseError> {
    let dims = set.dims();
    let (d, nq, nkv) = (dims.head_dim(), dims.q_heads(), dims.kv_heads());
    let (mut qh, mut kh) = (vec![0.0; q.len()], vec![0.0; k.len()]);
    set.rotate_queries_into(layer, n, q, &mut qh).unwrap();
    set.rotate_keys_into(layer, n, k, &mut kh).unwrap();
    for t in 0..n {
        for h in 0..nq {
            let qi = (t * nq + h) * d;
            let ki = (t * nkv + dims.kv_of(h)) * d;
            let (a, b) = (&q[qi..qi + d], &k[ki..ki + d]);
            let tol = 2e-5 * (1.0 + norm(a) * norm(b));
            let got = dot(&qh[qi..qi + d], &kh[ki..ki + d]);
            prop_assert!((got - dot(a, b)).abs() <= tol, "token {t} head {h}");
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn bases_are_orthonormal(p in (1usize..=48).prop_flat_map(orthonormal_basis)) {
        prop_assert!(p.orthogonality_error() < 1e-5);
        prop_assert!(p.orthogonality_error() < ORTHOGONALITY_TOLERANCE);
    }

    #[test]
    fn sets_fit_their_dims_and_round_trip(set in any_projection_set()) {
        let dims = set.dims();
        prop_assert!(set.check_compatible(&dims, Some("proptest")).is_ok());
        prop_assert!(set.max_orthogonality_error() < 1e-5);
        prop_assert_eq!(ProjectionSet::from_bytes(&set.to_bytes().unwrap()).unwrap(), set);
    }

    #[test]
    fn decode_rotation_keeps_scores((set, q, k) in set_and_qk(1)) {
        for layer in 0..set.dims().layers() {
            assert_scores_kept(&set, layer, 1, &q, &k)?;
        }
    }

    #[test]
    fn prefill_rotation_keeps_scores((set, q, k) in set_and_qk(GEMM_MIN_ROWS + 3)) {
        assert_scores_kept(&set, set.dims().layers() - 1, GEMM_MIN_ROWS + 3, &q, &k)?;
    }

    #[test]
    fn values_rotate_and_outputs_rotate_back(
        (set, v) in any_projection_set().prop_flat_map(|set| {
            let dims = set.dims();
            let len = dims.kv_heads() * dims.head_dim();
            (Just(set), vec(-1.0f32..1.0, len))
        })
    ) {
        // One decode token whose every q-head attends to its kv-head's value alone: the
        // output is the value, and P_VO then P_VOᵀ must give it back.
        let dims = set.dims();
        let d = dims.head_dim();
        let mut v_hat = vec![0.0; v.len()];
        set.rotate_values_into(0, 1, &v, &mut v_hat).unwrap();
        let o_hat: Vec<f32> = (0..dims.q_heads())
            .flat_map(|h| v_hat[dims.kv_of(h) * d..][..d].to_vec())
            .collect();
        let mut o = vec![0.0; o_hat.len()];
        set.unrotate_outputs_into(0, 1, &o_hat, &mut o).unwrap();
        for h in 0..dims.q_heads() {
            let want = &v[dims.kv_of(h) * d..][..d];
            for (a, b) in o[h * d..][..d].iter().zip(want) {
                prop_assert!((a - b).abs() <= 1e-5 * (1.0 + norm(want)));
            }
        }
    }
}
