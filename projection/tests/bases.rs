//! Properties of the bases themselves (SWAN §4 projection matrices, Table 3 ablations):
//! orthogonality in f32, descending eigenvalues with canonical signs, and — the reason the
//! method works — on data with a known low-rank structure the calibrated basis packs more
//! energy into its first k coordinates than the identity or a random basis.

mod common;

use std::cell::Cell;

use common::gaussian;
use projection::{
    CalibrationConfig, Calibrator, Mat, ModelDims, ProjectionSet, SecondMoment, Site, Stream,
    random_orthogonal,
};
use proptest::prelude::*;
use proptest::test_runner::TestRunner;

const SITE: Site = Site { layer: 0, kv_head: 0, stream: Stream::Qk };

/// `n` vectors of dimension `d` that live (up to `noise`) in a random `r`-dim subspace with
/// decaying scales, so the optimal leading-`r` basis is known to hold ~all energy.
fn low_rank(n: usize, d: usize, r: usize, noise: f32, seed: u64) -> Vec<f32> {
    let frame = random_orthogonal(d, seed);
    let z = gaussian(n * r, 1.0, seed + 1);
    let eps = gaussian(n * d, noise, seed + 2);
    let mut x = eps;
    for t in 0..n {
        for c in 0..r {
            let a = z[t * r + c] * (1.0 + (r - c) as f32);
            for i in 0..d {
                x[t * d + i] += a * frame[(i, c)];
            }
        }
    }
    x
}

#[test]
fn calibrated_bases_are_orthogonal_in_f32() {
    let mut runner = TestRunner::new(common::config(256));
    let worst = Cell::new(0.0f64);
    let strategy = (1usize..=160, 1usize..=4, 0usize..3, any::<u64>());
    runner
        .run(&strategy, |(d, rank_div, scale_pick, seed)| {
            // Full-rank, rank-deficient (fewer samples than d) and degenerate data at
            // several magnitudes.
            let n = (d / rank_div).max(1);
            let scale = [1e-3f32, 1.0, 1e3][scale_pick];
            let x = gaussian(n * d, scale, seed % 1_000_000);
            let mut m = SecondMoment::new(d);
            m.add_vectors(&x, 1.0).unwrap();
            m.add_vectors(&x[..d], 5.0).unwrap(); // a repeated direction
            let b = m.eigen_basis(SITE).unwrap();
            let e = b.matrix().orthogonality_error();
            worst.set(worst.get().max(e));
            prop_assert!(e < 1e-5, "‖PᵀP − I‖∞ = {e:e} at d {d}, n {n}");
            let l = b.eigenvalues().unwrap();
            prop_assert!(l.windows(2).all(|w| w[0] >= w[1]), "eigenvalues not descending");
            for j in 0..d {
                let col = b.matrix().column(j);
                let big =
                    col.iter().copied().fold(0.0f32, |a, x| if x.abs() > a.abs() { x } else { a });
                prop_assert!(big > 0.0, "column {j} has a negative largest component");
            }
            let curve = b.energy_curve().unwrap();
            prop_assert!(curve.windows(2).all(|w| w[0] <= w[1] + 1e-12));
            prop_assert!((curve[d - 1] - 1.0).abs() < 1e-9);
            Ok(())
        })
        .unwrap();
    eprintln!("calibrated bases: max entry-wise ‖PᵀP − I‖ = {:.3e}", worst.get());
}

#[test]
fn random_and_model_sized_bases_are_orthogonal_in_f32() {
    let mut worst = 0.0f64;
    for d in [1usize, 2, 3, 17, 64, 128, 256] {
        for seed in 0..3 {
            worst = worst.max(random_orthogonal(d, seed).orthogonality_error());
        }
    }
    for (dims, name) in [((30, 9, 3, 64), "smol"), ((4, 32, 8, 128), "llama")] {
        let dims = ModelDims::new(dims.0, dims.1, dims.2, dims.3).unwrap();
        let set = ProjectionSet::random(dims, name, 11).unwrap();
        worst = worst.max(set.max_orthogonality_error());
        for stream in Stream::ALL {
            let b = set.basis(stream, 1, 2).unwrap();
            assert!(b.eigenvalues().is_none());
        }
    }
    eprintln!("random bases (d ≤ 256): max entry-wise ‖PᵀP − I‖ = {worst:.3e}");
    assert!(worst < 1e-5);
}

#[test]
fn calibrated_basis_captures_more_energy_than_identity_and_random() {
    let mut runner = TestRunner::new(common::config(64));
    let strategy =
        (prop::sample::select(vec![16usize, 32, 64]), 1usize..=4, 1usize..=3, any::<u64>());
    runner
        .run(&strategy, |(d, r, group, seed)| {
            let seed = seed % 1_000_000;
            let dims = ModelDims::new(1, group, 1, d).unwrap();
            let n = 4 * d;
            // Queries and keys share one low-rank subspace (as RoPE'd q/k of a head do).
            let q = low_rank(n * group, d, r, 0.01, seed);
            let k = low_rank(n, d, r, 0.01, seed);
            let mut cal = Calibrator::new(dims, CalibrationConfig::default()).unwrap();
            cal.observe_qk(0, n, &q, &k).unwrap();
            cal.observe_vo(0, n, &k, &q).unwrap();
            let set = cal.finish_with_threads("low-rank", 1).unwrap();
            let calibrated = cal.captured_energy(Stream::Qk, 0, 0, set.qk(0, 0).unwrap()).unwrap();
            let stored = set.energy_curve(Stream::Qk, 0, 0).unwrap().unwrap();
            let identity = cal.captured_energy(Stream::Qk, 0, 0, &Mat::identity(d)).unwrap();
            let random = cal
                .captured_energy(Stream::Qk, 0, 0, &random_orthogonal(d, seed ^ 0x5eed))
                .unwrap();
            for kk in 0..d {
                prop_assert!((calibrated[kk] - stored[kk]).abs() < 1e-6, "curve mismatch at {kk}");
                prop_assert!(
                    calibrated[kk] >= identity[kk] - 1e-6,
                    "identity beats eigen at k={}",
                    kk + 1
                );
                prop_assert!(
                    calibrated[kk] >= random[kk] - 1e-6,
                    "random beats eigen at k={}",
                    kk + 1
                );
            }
            let at_r = r - 1;
            prop_assert!(calibrated[at_r] > 0.99, "eigen keeps {} in {r} dims", calibrated[at_r]);
            prop_assert!(
                calibrated[at_r] > identity[at_r] + 0.1,
                "identity {} vs {}",
                identity[at_r],
                calibrated[at_r]
            );
            prop_assert!(
                calibrated[at_r] > random[at_r] + 0.1,
                "random {} vs {}",
                random[at_r],
                calibrated[at_r]
            );
            prop_assert!(set.basis(Stream::Qk, 0, 0).unwrap().dims_for_energy(0.99) <= Some(r));
            Ok(())
        })
        .unwrap();
}

#[test]
fn same_data_gives_bit_identical_bases() {
    let x = low_rank(200, 24, 3, 0.1, 5);
    let mut a = SecondMoment::new(24);
    a.add_vectors(&x, 1.0).unwrap();
    let mut flipped = SecondMoment::new(24);
    let neg: Vec<f32> = x.iter().map(|v| -v).collect();
    flipped.add_vectors(&neg, 1.0).unwrap(); // same second moment, so the same basis
    assert_eq!(a.eigen_basis(SITE).unwrap(), a.eigen_basis(SITE).unwrap());
    assert_eq!(a.eigen_basis(SITE).unwrap(), flipped.eigen_basis(SITE).unwrap());
}
