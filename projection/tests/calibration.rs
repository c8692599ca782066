//! Calibration accumulators (SWAN §4): GQA grouping and weighting against a rank-one
//! reference, streaming = one-shot, merge/parallel = sequential, deterministic finish.

mod common;

use common::gaussian;
use projection::reference::accumulate_naive;
use projection::{
    CalibrationConfig, Calibrator, LayerActivations, ModelDims, Stream, Weighting,
    calibrate_parallel,
};

fn close(a: &[f64], b: &[f64], tol: f64) -> bool {
    a.iter().zip(b).all(|(x, y)| (x - y).abs() <= tol * (1.0 + y.abs()))
}

/// Reference QK moment of kv-head `j`: rank-one updates of its group's queries and its key.
fn reference_moment(
    dims: ModelDims,
    n: usize,
    q_side: &[f32],
    kv_side: &[f32],
    j: usize,
    w: (f64, f64),
) -> Vec<f64> {
    let (d, nq, nkv, g) = (dims.head_dim(), dims.q_heads(), dims.kv_heads(), dims.group());
    let mut m = vec![0.0; d * d];
    for t in 0..n {
        for h in j * g..(j + 1) * g {
            accumulate_naive(&mut m, d, &q_side[(t * nq + h) * d..][..d], w.0).unwrap();
        }
        accumulate_naive(&mut m, d, &kv_side[(t * nkv + j) * d..][..d], w.1).unwrap();
    }
    m
}

#[test]
fn gqa_groups_and_weightings_match_rank_one_reference() {
    let dims = ModelDims::new(2, 8, 2, 16).unwrap();
    let n = 37;
    let q = gaussian(n * 8 * 16, 1.0, 1);
    let k = gaussian(n * 2 * 16, 3.0, 2);
    let weightings = [
        Weighting::Balanced,
        Weighting::Stacked,
        Weighting::Custom { query_side: 0.0, kv_side: 2.0 },
    ];
    for wt in weightings {
        let cfg = CalibrationConfig { qk: wt, vo: Weighting::Stacked };
        let mut cal = Calibrator::new(dims, cfg).unwrap();
        cal.observe_qk(1, n, &q, &k).unwrap();
        cal.observe_vo(1, n, &k, &q).unwrap();
        for j in 0..2 {
            let want = reference_moment(dims, n, &q, &k, j, wt.weights(4));
            assert!(
                close(cal.moment(Stream::Qk, 1, j).unwrap().matrix(), &want, 1e-9),
                "{wt:?} kv {j}"
            );
            let want_vo = reference_moment(dims, n, &q, &k, j, (1.0, 1.0));
            assert!(close(cal.moment(Stream::Vo, 1, j).unwrap().matrix(), &want_vo, 1e-9));
            let c = cal.counts(Stream::Qk, 1, j).unwrap();
            assert_eq!((c.tokens, c.vectors), (n as u64, 5 * n as u64));
        }
        assert_eq!(cal.counts(Stream::Qk, 0, 0).unwrap().tokens, 0);
    }
}

#[test]
fn balanced_default_gives_keys_half_the_say() {
    let (q, kv) = Weighting::default().weights(4);
    assert_eq!(4.0 * q, kv);
    assert_eq!(CalibrationConfig::default().vo, Weighting::Balanced);
}

fn feed(cal: &mut Calibrator, chunk: &(usize, Vec<f32>, Vec<f32>)) -> projection::Result<()> {
    let (n, q, kv) = chunk;
    for layer in 0..cal.dims().layers() {
        let acts = LayerActivations { n_tokens: *n, queries: q, keys: kv, values: kv, attn_out: q };
        cal.observe_layer(layer, &acts)?;
    }
    Ok(())
}

#[test]
fn chunked_merged_and_parallel_calibration_equal_one_pass() {
    let dims = ModelDims::new(3, 6, 3, 8).unwrap();
    let cfg = CalibrationConfig::default();
    let chunks: Vec<(usize, Vec<f32>, Vec<f32>)> = (0..7)
        .map(|i| {
            let n = 3 + i * 5;
            (n, gaussian(n * 6 * 8, 1.0, 10 + i as u64), gaussian(n * 3 * 8, 2.0, 50 + i as u64))
        })
        .collect();
    let mut one_pass = Calibrator::new(dims, cfg).unwrap();
    let all_n: usize = chunks.iter().map(|c| c.0).sum();
    let all_q: Vec<f32> = chunks.iter().flat_map(|c| c.1.clone()).collect();
    let all_kv: Vec<f32> = chunks.iter().flat_map(|c| c.2.clone()).collect();
    feed(&mut one_pass, &(all_n, all_q, all_kv)).unwrap();

    let mut merged = Calibrator::new(dims, cfg).unwrap();
    for c in &chunks {
        let mut part = Calibrator::new(dims, cfg).unwrap();
        feed(&mut part, c).unwrap();
        merged.merge(&part).unwrap();
    }
    let parallel = calibrate_parallel(dims, cfg, &chunks, 3, feed).unwrap();
    for stream in Stream::ALL {
        for (l, j) in [(0, 0), (1, 2), (2, 1)] {
            let want = one_pass.moment(stream, l, j).unwrap().matrix();
            assert!(close(merged.moment(stream, l, j).unwrap().matrix(), want, 1e-12));
            assert!(close(parallel.moment(stream, l, j).unwrap().matrix(), want, 1e-12));
            assert_eq!(
                parallel.counts(stream, l, j).unwrap(),
                merged.counts(stream, l, j).unwrap()
            );
        }
    }
    assert_eq!(parallel.calibration_tokens(), all_n as u64);
    let a = parallel.finish_with_threads("m", 1).unwrap();
    let b = parallel.finish_with_threads("m", 4).unwrap();
    assert_eq!(a, b, "finish must not depend on the thread count");
    assert_eq!(a.provenance().calibration_tokens, all_n as u64);
    assert_eq!(a.provenance().config, Some(cfg));
    let counts = a.counts(2, 1).unwrap().unwrap();
    assert_eq!(counts.qk.tokens, all_n as u64);
    assert_eq!(counts.vo.vectors, 3 * all_n as u64);
}

#[test]
fn parallel_errors_surface_and_mismatched_merges_fail() {
    let dims = ModelDims::new(1, 2, 1, 4).unwrap();
    let cfg = CalibrationConfig::default();
    let items = vec![1usize, 2, 3];
    let err = calibrate_parallel(dims, cfg, &items, 2, |cal, &n| {
        let q = vec![f32::NAN; n * 2 * 4];
        cal.observe_qk(0, n, &q, &vec![0.0; n * 4])
    });
    assert!(matches!(err, Err(projection::Error::NonFinite { .. })));
    let mut a = Calibrator::new(dims, cfg).unwrap();
    let other_dims = Calibrator::new(ModelDims::new(1, 2, 1, 8).unwrap(), cfg).unwrap();
    assert!(matches!(a.merge(&other_dims), Err(projection::Error::Mismatch { what: "dims", .. })));
    let other_cfg =
        Calibrator::new(dims, CalibrationConfig { qk: Weighting::Stacked, ..cfg }).unwrap();
    assert!(matches!(a.merge(&other_cfg), Err(projection::Error::Mismatch { what: "config", .. })));
}

#[test]
fn qk_bases_carry_the_queries_energy_along_each_basis_vector() {
    let dims = ModelDims::new(2, 8, 2, 16).unwrap();
    let n = 41;
    let q = gaussian(n * 8 * 16, 1.0, 3);
    let k = gaussian(n * 2 * 16, 3.0, 4);
    // Any weighting of the joint moment: the query energy is the queries' own mean.
    for wt in [Weighting::Balanced, Weighting::Custom { query_side: 0.0, kv_side: 1.0 }] {
        let cfg = CalibrationConfig { qk: wt, vo: Weighting::Balanced };
        let mut cal = Calibrator::new(dims, cfg).unwrap();
        for layer in 0..2 {
            cal.observe_qk(layer, n, &q, &k).unwrap();
            cal.observe_vo(layer, n, &k, &q).unwrap();
        }
        let set = cal.finish_with_threads("m", 2).unwrap();
        for j in 0..2 {
            let basis = set.basis(Stream::Qk, 1, j).unwrap();
            let energy = basis.query_energy().expect("calibrated QK bases carry query energy");
            // Reference: project every query of the group on every basis vector.
            let p = basis.matrix();
            let (d, g) = (16, 4);
            for (col, &e) in energy.iter().enumerate() {
                let pc = p.column(col);
                let mut sum = 0.0f64;
                for t in 0..n {
                    for h in j * g..(j + 1) * g {
                        let x = &q[(t * 8 + h) * d..][..d];
                        let dot: f64 =
                            x.iter().zip(&pc).map(|(a, b)| f64::from(*a) * f64::from(*b)).sum();
                        sum += dot * dot;
                    }
                }
                let want = sum / (n * g) as f64;
                assert!(
                    (e - want).abs() <= 1e-6 * want.max(1.0),
                    "{wt:?} kv {j} col {col}: {e} vs {want}"
                );
            }
            assert!(set.basis(Stream::Vo, 1, j).unwrap().query_energy().is_none());
        }
    }
}
