//! Proptest strategies for orthonormal bases, model geometries and whole [`ProjectionSet`]s,
//! exported behind the `proptest` feature so users can property-test their own runtimes
//! against SWAN's lossless rotation (§4 "projection matrices", Appendix A.1: an orthogonal
//! `P_QK` keeps every score `q̂·k̂ = q·k`, an orthogonal `P_VO` keeps every layer output).
//!
//! Bases come in every kind the crate produces: identity, signed permutations (exact in
//! f32), Haar-random orthogonal matrices and calibrated eigen-bases (of anisotropic Gaussian
//! activations, so eigenvalues are distinct), and sets are also drawn as the Table 3
//! ablations of those. Random data is drawn from a seed, so a failing case is reproducible
//! from its printed seed; shapes shrink towards the smallest model.
//!
//! ```
//! use projection::strategies::{model_dims, projection_set};
//! use proptest::collection::vec;
//! use proptest::prelude::*;
//! use proptest::test_runner::TestRunner;
//!
//! // Any GQA geometry (MHA, GQA, MQA), any kind of set, one decode token's q and k.
//! let cases = model_dims(1..=2, 1..=3, 1..=3, 1..=16).prop_flat_map(|dims| {
//!     let (q, k) = (dims.q_heads() * dims.head_dim(), dims.kv_heads() * dims.head_dim());
//!     (projection_set(dims), vec(-1.0f32..1.0, q), vec(-1.0f32..1.0, k))
//! });
//! TestRunner::default().run(&cases, |(set, q, k)| {
//!     let dims = set.dims();
//!     let d = dims.head_dim();
//!     let dot = |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f32>();
//!     let (mut q_hat, mut k_hat) = (vec![0.0; q.len()], vec![0.0; k.len()]);
//!     for layer in 0..dims.layers() {
//!         set.rotate_qk_into(layer, 1, &q, &k, &mut q_hat, &mut k_hat).unwrap();
//!         for h in 0..dims.q_heads() {
//!             let kv = dims.kv_of(h);
//!             let (qh, kh) = (&q[h * d..][..d], &k[kv * d..][..d]);
//!             let rotated = dot(&q_hat[h * d..][..d], &k_hat[kv * d..][..d]);
//!             // Lemma 1: the score survives the rotation (to f32 rounding).
//!             let tol = 1e-5 * (1.0 + dot(qh, qh).sqrt() * dot(kh, kh).sqrt());
//!             prop_assert!((rotated - dot(qh, kh)).abs() <= tol);
//!         }
//!     }
//!     Ok(())
//! }).unwrap();
//! ```

use std::ops::RangeInclusive;

use proptest::prelude::*;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::StandardNormal;

use crate::ablation::random_orthogonal;
use crate::basis::Basis;
use crate::calibrate::{CalibrationConfig, Calibrator, LayerActivations};
use crate::dims::ModelDims;
use crate::mat::Mat;
use crate::set::{BasisKind, ProjectionSet};

/// Model name recorded in the provenance of every generated set.
pub const MODEL: &str = "proptest";

/// A `d × d` signed permutation matrix (exactly orthogonal in f32).
///
/// # Examples
/// ```
/// use projection::strategies::signed_permutation;
/// use proptest::strategy::{Strategy, ValueTree};
/// use proptest::test_runner::TestRunner;
/// let p = signed_permutation(5).new_tree(&mut TestRunner::default()).unwrap().current();
/// assert_eq!(p.orthogonality_error(), 0.0);
/// ```
pub fn signed_permutation(d: usize) -> impl Strategy<Value = Mat> {
    let order = Just((0..d).collect::<Vec<usize>>()).prop_shuffle();
    (order, proptest::collection::vec(any::<bool>(), d)).prop_map(move |(order, negative)| {
        Mat::from_fn(d, d, |i, j| match (order[j] == i, negative[j]) {
            (true, true) => -1.0,
            (true, false) => 1.0,
            (false, _) => 0.0,
        })
    })
}

/// A `d × d` orthonormal matrix (columns = basis vectors): the identity, a signed
/// permutation or a Haar-random orthogonal matrix from a seed. Every draw has
/// [`Mat::orthogonality_error`] far below [`crate::ORTHOGONALITY_TOLERANCE`].
///
/// # Examples
/// ```
/// use projection::strategies::orthonormal_basis;
/// use proptest::test_runner::TestRunner;
/// TestRunner::default().run(&orthonormal_basis(12), |p| {
///     proptest::prop_assert!(p.orthogonality_error() < 1e-5);
///     Ok(())
/// }).unwrap();
/// ```
pub fn orthonormal_basis(d: usize) -> impl Strategy<Value = Mat> {
    prop_oneof![
        1 => Just(Mat::identity(d)),
        2 => signed_permutation(d),
        5 => any::<u64>().prop_map(move |seed| random_orthogonal(d, seed)),
    ]
}

/// An [`orthonormal_basis`] wrapped as a [`Basis`] (no eigenvalues).
pub fn basis(d: usize) -> impl Strategy<Value = Basis> {
    orthonormal_basis(d).prop_map(|m| Basis::new(m).expect("a finite square matrix is a basis"))
}

/// Valid [`ModelDims`]: `layers`, `kv_heads`, query heads per kv-head (`group`) and
/// `head_dim` drawn from the given ranges (values of 0 are skipped). `group = 1` is MHA,
/// `kv_heads = 1` with `group > 1` is MQA, anything else GQA.
///
/// # Examples
/// ```
/// use projection::strategies::model_dims;
/// use proptest::test_runner::TestRunner;
/// TestRunner::default().run(&model_dims(1..=3, 1..=4, 1..=4, 1..=64), |dims| {
///     proptest::prop_assert_eq!(dims.q_heads() % dims.kv_heads(), 0);
///     Ok(())
/// }).unwrap();
/// ```
pub fn model_dims(
    layers: RangeInclusive<usize>,
    kv_heads: RangeInclusive<usize>,
    group: RangeInclusive<usize>,
    head_dim: RangeInclusive<usize>,
) -> impl Strategy<Value = ModelDims> {
    (layers, kv_heads, group, head_dim)
        .prop_filter_map("every count must be at least 1", |(layers, kv, group, d)| {
            ModelDims::new(layers, kv * group, kv, d).ok()
        })
}

/// A calibrated set for `dims`: eigen-bases of the second moments of seeded, anisotropic
/// Gaussian activations (every dimension its own scale, so eigenvalues are distinct).
///
/// # Examples
/// ```
/// use projection::{BasisKind, ModelDims, strategies::calibrated_set};
/// let set = calibrated_set(ModelDims::new(2, 4, 2, 8)?, 7)?;
/// assert_eq!(set.kind(), BasisKind::Calibrated);
/// assert!(set.max_orthogonality_error() < 1e-5);
/// # Ok::<(), projection::Error>(())
/// ```
///
/// # Errors
/// Only if calibration fails (not for valid `dims`).
pub fn calibrated_set(dims: ModelDims, seed: u64) -> crate::Result<ProjectionSet> {
    let (d, nq, nkv) = (dims.head_dim(), dims.q_heads(), dims.kv_heads());
    let n = 2 * d + 4;
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let scales: Vec<f32> = (0..d).map(|_| rng.random_range(0.1f32..3.0)).collect();
    let mut rows = |heads: usize| -> Vec<f32> {
        (0..n * heads * d).map(|i| scales[i % d] * rng.sample::<f32, _>(StandardNormal)).collect()
    };
    let mut cal = Calibrator::new(dims, CalibrationConfig::default())?;
    for layer in 0..dims.layers() {
        let (q, k, v, o) = (rows(nq), rows(nkv), rows(nkv), rows(nq));
        let acts =
            LayerActivations { n_tokens: n, queries: &q, keys: &k, values: &v, attn_out: &o };
        cal.observe_layer(layer, &acts)?;
    }
    cal.finish_with_threads(MODEL, 1)
}

/// A whole [`ProjectionSet`] for `dims`, of any kind: identity, Haar-random, calibrated, or
/// one of the Table 3 ablations (layer-, head- or KV-shuffle) of a random or calibrated set
/// (an ablation the geometry does not allow, e.g. a layer shuffle of a one-layer model,
/// leaves the set as it was). Every set passes [`ProjectionSet::from_parts`]'s validation
/// and fits `dims` ([`ProjectionSet::check_compatible`]).
///
/// # Examples
/// ```
/// use projection::{ModelDims, strategies::projection_set};
/// use proptest::test_runner::TestRunner;
/// let dims = ModelDims::new(2, 6, 2, 8)?;
/// TestRunner::default().run(&projection_set(dims), |set| {
///     proptest::prop_assert!(set.check_compatible(&dims, Some("proptest")).is_ok());
///     Ok(())
/// }).unwrap();
/// # Ok::<(), projection::Error>(())
/// ```
pub fn projection_set(dims: ModelDims) -> impl Strategy<Value = ProjectionSet> {
    let base = prop_oneof![
        1 => Just(ProjectionSet::identity(dims, MODEL).expect("valid dims")),
        3 => any::<u64>().prop_map(move |seed| {
            ProjectionSet::random(dims, MODEL, seed).expect("valid dims")
        }),
        3 => any::<u64>().prop_map(move |seed| calibrated_set(dims, seed).expect("valid dims")),
    ];
    let ablation = prop_oneof![
        4 => Just(None),
        1 => Just(Some(BasisKind::KvShuffle)),
        1 => any::<u64>().prop_map(|seed| Some(BasisKind::LayerShuffle { seed })),
        1 => any::<u64>().prop_map(|seed| Some(BasisKind::HeadShuffle { seed })),
    ];
    (base, ablation).prop_map(|(set, ablation)| match ablation {
        Some(kind) if set.kind() != BasisKind::Identity => set.ablation(kind).unwrap_or(set),
        _ => set,
    })
}

/// A geometry from [`model_dims`] and a [`projection_set`] for it, for tests that do not
/// care about the exact shape: up to 3 layers, 4 kv-heads, groups of 4 and `head_dim` 32.
pub fn any_projection_set() -> impl Strategy<Value = ProjectionSet> {
    model_dims(1..=3, 1..=4, 1..=4, 1..=32).prop_flat_map(projection_set)
}
