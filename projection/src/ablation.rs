//! Ablation bases (SWAN Appendix, projection ablations / Table 3): random orthogonal,
//! identity (no rotation), layer-shuffle, head-shuffle and KV-shuffle — plus the data-free
//! rotations of quantized KV caches (Walsh–Hadamard, its value half, its sign-randomized
//! draws, and its rounding-sized perturbations as a probe) — all returned as a [`ProjectionSet`] so every evaluation tool runs on them
//! unchanged.
//!
//! Every ablation is still orthogonal, hence still lossless before pruning (Appendix A.1);
//! only the energy compaction that makes magnitude pruning work is lost. Randomness comes
//! from `ChaCha8Rng` seeded with the given seed (stable across platforms and releases), and
//! the seed is recorded in the set's [`BasisKind`].

use nalgebra::DMatrix;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::StandardNormal;

use crate::basis::Basis;
use crate::dims::{ModelDims, Stream};
use crate::error::{Error, Result};
use crate::mat::Mat;
use crate::set::{BasisKind, ProjectionSet, Provenance};

/// A Haar-random `d × d` orthogonal matrix: QR of a Gaussian matrix drawn from `rng`, with
/// `Q`'s columns multiplied by `sign(R_ii)` (so the distribution is uniform over O(d)).
fn random_orthogonal_from(d: usize, rng: &mut ChaCha8Rng) -> Mat {
    let g = DMatrix::<f64>::from_fn(d, d, |_, _| rng.sample(StandardNormal));
    let qr = g.qr();
    let (q, r) = (qr.q(), qr.r());
    Mat::from_fn(d, d, |i, j| {
        let s = if r[(j, j)] < 0.0 { -1.0 } else { 1.0 };
        (s * q[(i, j)]) as f32
    })
}

/// A seeded Haar-random `d × d` orthogonal matrix (columns = basis vectors).
///
/// # Examples
/// ```
/// let p = projection::random_orthogonal(16, 42);
/// assert!(p.orthogonality_error() < 1e-5);
/// assert_eq!(p, projection::random_orthogonal(16, 42));
/// ```
pub fn random_orthogonal(d: usize, seed: u64) -> Mat {
    random_orthogonal_from(d, &mut ChaCha8Rng::seed_from_u64(seed))
}

/// The normalized `d × d` Walsh–Hadamard matrix (Sylvester order): entry `(i, j)` is
/// `(−1)^popcount(i & j) / √d`. Symmetric and orthogonal, so it is its own inverse; it
/// spreads every coordinate over all others, which evens out the outlier channels that
/// make per-block quantization of keys and values lossy.
///
/// # Errors
/// [`Error::InvalidDims`] when `d` is not a power of two.
///
/// # Examples
/// ```
/// let h = projection::hadamard(4)?;
/// assert_eq!(h.row(1), &[0.5, -0.5, 0.5, -0.5]);
/// assert!(h.orthogonality_error() < 1e-6);
/// # Ok::<(), projection::Error>(())
/// ```
pub fn hadamard(d: usize) -> Result<Mat> {
    if !d.is_power_of_two() {
        return Err(Error::InvalidDims {
            reason: format!("a Hadamard basis needs a power-of-two head_dim, got {d}"),
        });
    }
    let s = 1.0 / (d as f32).sqrt();
    Ok(Mat::from_fn(d, d, |i, j| if (i & j).count_ones() % 2 == 0 { s } else { -s }))
}

/// The angle (radians) of each plane rotation [`ProjectionSet::jittered_hadamard`] turns
/// the Walsh–Hadamard bases by: `10⁻⁵`, so a stored coordinate moves by at most `10⁻⁵` of
/// its vector's norm — float-rounding-sized, far below any quantizer's step.
pub const JITTER_ANGLE: f64 = 1e-5;

/// Block size of the Walsh–Hadamard blocks [`ProjectionSet::hadamard`] rotates values with.
pub const HADAMARD_V_BLOCK: usize = 64;

/// The block-diagonal `d × d` matrix of normalized `block × block` Walsh–Hadamard blocks
/// ([`hadamard`] of `block` on the diagonal, zero elsewhere): orthogonal and symmetric, its
/// own inverse, mixing each run of `block` coordinates only. With `block = d` it is
/// [`hadamard`]`(d)`.
///
/// # Errors
/// [`Error::InvalidDims`] when `block` is not a power of two or does not divide `d`.
///
/// # Examples
/// ```
/// let h = projection::hadamard_blocks(8, 4)?;
/// assert_eq!(h.row(5), &[0.0, 0.0, 0.0, 0.0, 0.5, -0.5, 0.5, -0.5]);
/// assert!(h.orthogonality_error() < 1e-6);
/// assert!(projection::hadamard_blocks(12, 8).is_err());
/// # Ok::<(), projection::Error>(())
/// ```
pub fn hadamard_blocks(d: usize, block: usize) -> Result<Mat> {
    if block == 0 || !d.is_multiple_of(block) {
        return Err(Error::InvalidDims {
            reason: format!("Hadamard blocks of {block} do not tile head_dim {d}"),
        });
    }
    let h = hadamard(block)?;
    Ok(Mat::from_fn(
        d,
        d,
        |i, j| {
            if i / block == j / block { h.row(i % block)[j % block] } else { 0.0 }
        },
    ))
}

/// A uniformly random cyclic permutation of `0..n` (Sattolo's algorithm): no element stays
/// in place when `n >= 2`, so a shuffle ablation never keeps a head's own basis.
fn cyclic_permutation(n: usize, rng: &mut ChaCha8Rng) -> Vec<usize> {
    let mut p: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        let j = rng.random_range(0..i);
        p.swap(i, j);
    }
    p
}

fn synthetic(
    dims: ModelDims,
    model: &str,
    kind: BasisKind,
    mut make: impl FnMut(Stream) -> Mat,
) -> Result<ProjectionSet> {
    let mut qk = Vec::with_capacity(dims.sites());
    let mut vo = Vec::with_capacity(dims.sites());
    for _ in 0..dims.sites() {
        qk.push(Basis::new(make(Stream::Qk))?);
        vo.push(Basis::new(make(Stream::Vo))?);
    }
    let provenance =
        Provenance { model: model.to_owned(), calibration_tokens: 0, kind, config: None };
    ProjectionSet::from_parts(dims, qk, vo, None, provenance)
}

/// llama.cpp's two rotation matrices for `head_dim` `d`: the full-size Walsh–Hadamard
/// matrix (q/k) and its [`HADAMARD_V_BLOCK`]-blocks (v/o; the full matrix when `d` is
/// smaller).
fn walsh_hadamard_streams(d: usize) -> Result<(Mat, Mat)> {
    Ok((hadamard(d)?, hadamard_blocks(d, HADAMARD_V_BLOCK.min(d))?))
}

/// [`ProjectionSet::hadamard`] (`keys`: q/k by the full-size matrix) or its value half
/// [`ProjectionSet::hadamard_values`] (q/k unrotated); either needs a power-of-two
/// `head_dim`.
fn walsh_hadamard_set(dims: ModelDims, model: &str, keys: bool) -> Result<ProjectionSet> {
    let d = dims.head_dim();
    let (full, vo) = walsh_hadamard_streams(d)?;
    let (kind, qk) = if keys {
        (BasisKind::Hadamard, full)
    } else {
        (BasisKind::HadamardValues, Mat::identity(d))
    };
    synthetic(dims, model, kind, |s| match s {
        Stream::Qk => qk.clone(),
        Stream::Vo => vo.clone(),
    })
}

/// llama.cpp's two Walsh–Hadamard matrices with the rows of each v/o basis (and of each q/k
/// basis when `keys`) multiplied by random signs drawn from one `ChaCha8Rng` seeded with
/// `seed`, site by site in layer-major order (QK then VO per head).
fn sign_flipped_hadamard(
    dims: ModelDims,
    model: &str,
    kind: BasisKind,
    seed: u64,
    keys: bool,
) -> Result<ProjectionSet> {
    let d = dims.head_dim();
    let (full, vo) = walsh_hadamard_streams(d)?;
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    synthetic(dims, model, kind, |s| {
        let h = match s {
            Stream::Qk if !keys => return full.clone(),
            Stream::Qk => &full,
            Stream::Vo => &vo,
        };
        let signs: Vec<f32> =
            (0..d).map(|_| if rng.random::<bool>() { 1.0 } else { -1.0 }).collect();
        Mat::from_fn(d, d, |i, j| signs[i] * h.row(i)[j])
    })
}

impl ProjectionSet {
    /// The identity set (no rotation): SWAN's pruning applied in the model's own coordinates.
    ///
    /// # Errors
    /// Only if assembling the set fails (not for valid `dims`).
    ///
    /// # Examples
    /// ```
    /// use projection::{BasisKind, ModelDims, ProjectionSet};
    /// let set = ProjectionSet::identity(ModelDims::new(2, 4, 2, 8)?, "toy")?;
    /// assert_eq!(set.kind(), BasisKind::Identity);
    /// # Ok::<(), projection::Error>(())
    /// ```
    pub fn identity(dims: ModelDims, model: &str) -> Result<Self> {
        let d = dims.head_dim();
        synthetic(dims, model, BasisKind::Identity, |_| Mat::identity(d))
    }

    /// The data-free rotation of a quantized KV cache, as llama.cpp applies it: keys (with
    /// queries) by the normalized Walsh–Hadamard matrix of size `head_dim` ([`hadamard`]),
    /// values (with `W_O`) by blocks of [`HADAMARD_V_BLOCK`] ([`hadamard_blocks`]; the whole
    /// head when `head_dim` is smaller), for every layer and kv-head. At `head_dim` ≤ 64 both
    /// streams get the same full-size matrix.
    ///
    /// # Errors
    /// [`Error::InvalidDims`] when `head_dim` is not a power of two.
    ///
    /// # Examples
    /// ```
    /// use projection::{ModelDims, ProjectionSet};
    /// let set = ProjectionSet::hadamard(ModelDims::new(1, 2, 1, 8)?, "toy")?;
    /// assert!(set.max_orthogonality_error() < 1e-6);
    /// assert!(ProjectionSet::hadamard(ModelDims::new(1, 2, 1, 12)?, "toy").is_err());
    /// # Ok::<(), projection::Error>(())
    /// ```
    pub fn hadamard(dims: ModelDims, model: &str) -> Result<Self> {
        walsh_hadamard_set(dims, model, true)
    }

    /// The value half of [`ProjectionSet::hadamard`]: `P_QK = I`, `P_VO` the
    /// [`HADAMARD_V_BLOCK`]-blocks Walsh–Hadamard matrix ([`BasisKind::HadamardValues`]).
    ///
    /// # Errors
    /// [`Error::InvalidDims`] when `head_dim` is not a power of two.
    ///
    /// # Examples
    /// ```
    /// use projection::{BasisKind, ModelDims, ProjectionSet, Stream};
    /// let set = ProjectionSet::hadamard_values(ModelDims::new(1, 2, 1, 128)?, "toy")?;
    /// assert_eq!(set.kind(), BasisKind::HadamardValues);
    /// let full = ProjectionSet::hadamard(ModelDims::new(1, 2, 1, 128)?, "toy")?;
    /// assert_eq!(set.basis(Stream::Vo, 0, 0)?, full.basis(Stream::Vo, 0, 0)?);
    /// assert_eq!(set.basis(Stream::Qk, 0, 0)?.matrix().row(1)[1], 1.0);
    /// assert!(ProjectionSet::hadamard_values(ModelDims::new(1, 2, 1, 96)?, "toy").is_err());
    /// # Ok::<(), projection::Error>(())
    /// ```
    pub fn hadamard_values(dims: ModelDims, model: &str) -> Result<Self> {
        walsh_hadamard_set(dims, model, false)
    }

    /// The randomized form of [`ProjectionSet::hadamard`] ([`BasisKind::SignedHadamard`]):
    /// every (layer, kv-head, stream) gets the same Walsh–Hadamard matrix as there (full size
    /// on q/k, [`HADAMARD_V_BLOCK`]-blocks on v/o) with its rows multiplied by independent
    /// random signs (`P = D·H`), drawn in layer-major order (QK then VO per head) from one
    /// `ChaCha8Rng` seeded with `seed`. Each draw is as orthogonal as `H` and spreads every
    /// coordinate over the whole block as `H` does; only the sign pattern differs.
    ///
    /// # Errors
    /// [`Error::InvalidDims`] when `head_dim` is not a power of two.
    ///
    /// # Examples
    /// ```
    /// use projection::{BasisKind, ModelDims, ProjectionSet};
    /// let dims = ModelDims::new(2, 4, 2, 8)?;
    /// let a = ProjectionSet::signed_hadamard(dims, "toy", 3)?;
    /// assert_eq!(a.kind(), BasisKind::SignedHadamard { seed: 3 });
    /// assert_eq!(a, ProjectionSet::signed_hadamard(dims, "toy", 3)?);
    /// assert!(a.max_orthogonality_error() < 1e-6);
    /// assert!(ProjectionSet::signed_hadamard(ModelDims::new(1, 2, 1, 12)?, "toy", 3).is_err());
    /// # Ok::<(), projection::Error>(())
    /// ```
    pub fn signed_hadamard(dims: ModelDims, model: &str, seed: u64) -> Result<Self> {
        sign_flipped_hadamard(dims, model, BasisKind::SignedHadamard { seed }, seed, true)
    }

    /// [`ProjectionSet::hadamard`] with only the value side sign-randomized
    /// ([`BasisKind::SignedHadamardValues`]): every q/k basis is the plain `head_dim`
    /// Walsh–Hadamard matrix, every v/o basis the [`HADAMARD_V_BLOCK`]-blocks matrix with its
    /// rows multiplied by independent random signs (`P = D·H`), drawn in layer-major order
    /// from one `ChaCha8Rng` seeded with `seed`. Keys rotate exactly as under
    /// [`ProjectionSet::hadamard`]; quantized value rows round differently per draw.
    ///
    /// # Errors
    /// [`Error::InvalidDims`] when `head_dim` is not a power of two.
    ///
    /// # Examples
    /// ```
    /// use projection::{ModelDims, ProjectionSet};
    /// let dims = ModelDims::new(2, 4, 2, 128)?;
    /// let plain = ProjectionSet::hadamard(dims, "toy")?;
    /// let a = ProjectionSet::signed_hadamard_values(dims, "toy", 3)?;
    /// assert_eq!(a.qk(1, 1)?, plain.qk(1, 1)?);
    /// assert_ne!(a.vo(1, 1)?, plain.vo(1, 1)?);
    /// assert!(a.max_orthogonality_error() < 1e-6);
    /// # Ok::<(), projection::Error>(())
    /// ```
    pub fn signed_hadamard_values(dims: ModelDims, model: &str, seed: u64) -> Result<Self> {
        sign_flipped_hadamard(dims, model, BasisKind::SignedHadamardValues { seed }, seed, false)
    }

    /// [`ProjectionSet::hadamard`] with every basis turned by a rounding-sized rotation
    /// ([`BasisKind::HadamardJitter`]): `P = H·G`, where `G` rotates `d/2` disjoint random
    /// coordinate pairs by ±[`JITTER_ANGLE`] each (pairs and signs drawn in layer-major
    /// order, QK then VO per head, from one `ChaCha8Rng` seeded with `seed`; built in `f64`,
    /// stored in `f32`). A stored coordinate moves by at most `JITTER_ANGLE` times the
    /// vector's norm: the size of the differences two implementations' float rounding leaves
    /// in the same keys, so a quantized cache's cost over these draws shows how far such
    /// differences alone move it.
    ///
    /// # Errors
    /// [`Error::InvalidDims`] when `head_dim` is not a power of two.
    ///
    /// # Examples
    /// ```
    /// use projection::{ModelDims, ProjectionSet};
    /// let dims = ModelDims::new(1, 2, 1, 64)?;
    /// let h = ProjectionSet::hadamard(dims, "toy")?;
    /// let j = ProjectionSet::jittered_hadamard(dims, "toy", 1)?;
    /// let (a, b) = (h.qk(0, 0)?.as_slice(), j.qk(0, 0)?.as_slice());
    /// let moved = a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max);
    /// assert!(moved > 0.0 && moved < 1e-5);
    /// assert!(j.max_orthogonality_error() < 1e-6);
    /// # Ok::<(), projection::Error>(())
    /// ```
    pub fn jittered_hadamard(dims: ModelDims, model: &str, seed: u64) -> Result<Self> {
        let d = dims.head_dim();
        let (full, vo) = walsh_hadamard_streams(d)?;
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let (c, s) = (JITTER_ANGLE.cos(), JITTER_ANGLE.sin());
        synthetic(dims, model, BasisKind::HadamardJitter { seed }, |stream| {
            let h = match stream {
                Stream::Qk => &full,
                Stream::Vo => &vo,
            };
            let mut p: Vec<f64> = h.as_slice().iter().map(|&x| f64::from(x)).collect();
            let mut order: Vec<usize> = (0..d).collect();
            order.shuffle(&mut rng);
            for pair in order.chunks_exact(2) {
                let (a, b) = (pair[0], pair[1]);
                let s = if rng.random::<bool>() { s } else { -s };
                for row in p.chunks_exact_mut(d) {
                    let (x, y) = (row[a], row[b]);
                    row[a] = c * x + s * y;
                    row[b] = c * y - s * x;
                }
            }
            Mat::from_fn(d, d, |i, j| p[i * d + j] as f32)
        })
    }

    /// Independent Haar-random orthogonal bases for every (layer, kv-head, stream), drawn in
    /// layer-major order (QK then VO per head) from one `ChaCha8Rng` seeded with `seed`.
    ///
    /// # Errors
    /// Only if assembling the set fails (not for valid `dims`).
    ///
    /// # Examples
    /// ```
    /// use projection::{ModelDims, ProjectionSet};
    /// let dims = ModelDims::new(2, 4, 2, 8)?;
    /// let a = ProjectionSet::random(dims, "toy", 1)?;
    /// assert_eq!(a, ProjectionSet::random(dims, "toy", 1)?);
    /// assert!(a.max_orthogonality_error() < 1e-5);
    /// # Ok::<(), projection::Error>(())
    /// ```
    pub fn random(dims: ModelDims, model: &str, seed: u64) -> Result<Self> {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let d = dims.head_dim();
        synthetic(dims, model, BasisKind::Random { seed }, |_| random_orthogonal_from(d, &mut rng))
    }

    /// Moves every layer's bases (both streams, all heads) to another layer along a seeded
    /// cyclic permutation: layer `l` receives the bases of layer `π(l) ≠ l`.
    ///
    /// # Errors
    /// [`Error::AblationNotApplicable`] for a one-layer model.
    ///
    /// # Examples
    /// ```
    /// use projection::{BasisKind, ModelDims, ProjectionSet};
    /// let set = ProjectionSet::random(ModelDims::new(3, 2, 1, 4)?, "toy", 0)?;
    /// let shuffled = set.layer_shuffle(9)?;
    /// assert_eq!(shuffled.kind(), BasisKind::LayerShuffle { seed: 9 });
    /// assert_ne!(shuffled.qk(0, 0)?, set.qk(0, 0)?);
    /// # Ok::<(), projection::Error>(())
    /// ```
    pub fn layer_shuffle(&self, seed: u64) -> Result<Self> {
        let kind = BasisKind::LayerShuffle { seed };
        let (layers, kv) = (self.dims().layers(), self.dims().kv_heads());
        if layers < 2 {
            return Err(not_applicable(kind, "the model has one layer"));
        }
        let perm = cyclic_permutation(layers, &mut ChaCha8Rng::seed_from_u64(seed));
        self.permuted(kind, |site| perm[site / kv] * kv + site % kv)
    }

    /// Within each layer, moves kv-head bases (both streams) to other kv-heads along a seeded
    /// cyclic permutation per layer.
    ///
    /// # Errors
    /// [`Error::AblationNotApplicable`] for a model with one kv-head per layer.
    ///
    /// # Examples
    /// ```
    /// use projection::{ModelDims, ProjectionSet};
    /// let set = ProjectionSet::random(ModelDims::new(1, 4, 2, 4)?, "toy", 0)?;
    /// let shuffled = set.head_shuffle(3)?;
    /// assert_eq!(shuffled.vo(0, 0)?, set.vo(0, 1)?); // two heads: the only cycle swaps them
    /// assert!(ProjectionSet::random(ModelDims::new(1, 4, 1, 4)?, "toy", 0)?.head_shuffle(3).is_err());
    /// # Ok::<(), projection::Error>(())
    /// ```
    pub fn head_shuffle(&self, seed: u64) -> Result<Self> {
        let kind = BasisKind::HeadShuffle { seed };
        let (layers, kv) = (self.dims().layers(), self.dims().kv_heads());
        if kv < 2 {
            return Err(not_applicable(kind, "the model has one kv-head per layer"));
        }
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let perms: Vec<Vec<usize>> =
            (0..layers).map(|_| cyclic_permutation(kv, &mut rng)).collect();
        self.permuted(kind, |site| (site / kv) * kv + perms[site / kv][site % kv])
    }

    /// Swaps the subspaces: `P_QK ↔ P_VO` at every (layer, kv-head).
    ///
    /// # Errors
    /// Only if assembling the set fails.
    ///
    /// # Examples
    /// ```
    /// use projection::{ModelDims, ProjectionSet};
    /// let set = ProjectionSet::random(ModelDims::new(1, 2, 1, 4)?, "toy", 5)?;
    /// let swapped = set.kv_shuffle()?;
    /// assert_eq!(swapped.qk(0, 0)?, set.vo(0, 0)?);
    /// # Ok::<(), projection::Error>(())
    /// ```
    pub fn kv_shuffle(&self) -> Result<Self> {
        let strip = |s: Stream| -> Vec<Basis> {
            self.bases(s).iter().map(|b| b.clone().without_eigenvalues()).collect()
        };
        let counts = self.all_counts().map(<[_]>::to_vec);
        let provenance = Provenance { kind: BasisKind::KvShuffle, ..self.provenance().clone() };
        ProjectionSet::from_parts(
            self.dims(),
            strip(Stream::Vo),
            strip(Stream::Qk),
            counts,
            provenance,
        )
    }

    /// Builds the ablation named by `kind` from this set (shuffles) or from its dimensions
    /// and model name (identity, random).
    ///
    /// # Errors
    /// [`Error::AblationNotApplicable`] for [`BasisKind::Calibrated`] (not an ablation) and
    /// for shuffles the model's shape makes a no-op.
    ///
    /// # Examples
    /// ```
    /// use projection::{BasisKind, ModelDims, ProjectionSet};
    /// let set = ProjectionSet::identity(ModelDims::new(2, 2, 2, 4)?, "toy")?;
    /// let kind: BasisKind = "random:7".parse()?;
    /// assert_eq!(set.ablation(kind)?.kind(), kind);
    /// # Ok::<(), projection::Error>(())
    /// ```
    pub fn ablation(&self, kind: BasisKind) -> Result<Self> {
        let model = self.provenance().model.as_str();
        match kind {
            BasisKind::Calibrated => Err(not_applicable(kind, "calibrated is not an ablation")),
            BasisKind::Random { seed } => Self::random(self.dims(), model, seed),
            BasisKind::Identity => Self::identity(self.dims(), model),
            BasisKind::Hadamard => Self::hadamard(self.dims(), model),
            BasisKind::HadamardValues => Self::hadamard_values(self.dims(), model),
            BasisKind::SignedHadamard { seed } => Self::signed_hadamard(self.dims(), model, seed),
            BasisKind::SignedHadamardValues { seed } => {
                Self::signed_hadamard_values(self.dims(), model, seed)
            }
            BasisKind::HadamardJitter { seed } => Self::jittered_hadamard(self.dims(), model, seed),
            BasisKind::LayerShuffle { seed } => self.layer_shuffle(seed),
            BasisKind::HeadShuffle { seed } => self.head_shuffle(seed),
            BasisKind::KvShuffle => self.kv_shuffle(),
        }
    }

    /// New set whose site `s` (layer-major index) holds this set's bases from `source(s)`,
    /// without eigenvalues (they describe the source head's data, not the new one's).
    fn permuted(&self, kind: BasisKind, source: impl Fn(usize) -> usize) -> Result<Self> {
        let take = |s: Stream| -> Vec<Basis> {
            let bases = self.bases(s);
            (0..bases.len()).map(|i| bases[source(i)].clone().without_eigenvalues()).collect()
        };
        let counts = self.all_counts().map(<[_]>::to_vec);
        let provenance = Provenance { kind, ..self.provenance().clone() };
        ProjectionSet::from_parts(
            self.dims(),
            take(Stream::Qk),
            take(Stream::Vo),
            counts,
            provenance,
        )
    }
}

fn not_applicable(kind: BasisKind, reason: &str) -> Error {
    Error::AblationNotApplicable { kind: kind.to_string(), reason: reason.to_owned() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sattolo_is_a_derangement() {
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        for n in 2..12 {
            let p = cyclic_permutation(n, &mut rng);
            let mut sorted = p.clone();
            sorted.sort_unstable();
            assert_eq!(sorted, (0..n).collect::<Vec<_>>());
            assert!(p.iter().enumerate().all(|(i, &x)| i != x), "{p:?}");
        }
    }

    #[test]
    fn random_bases_differ_per_site_and_seed() {
        let dims = ModelDims::new(2, 2, 1, 8).unwrap();
        let a = ProjectionSet::random(dims, "m", 3).unwrap();
        let b = ProjectionSet::random(dims, "m", 4).unwrap();
        assert_ne!(a.qk(0, 0).unwrap(), a.vo(0, 0).unwrap());
        assert_ne!(a.qk(0, 0).unwrap(), a.qk(1, 0).unwrap());
        assert_ne!(a.qk(0, 0).unwrap(), b.qk(0, 0).unwrap());
    }

    /// llama.cpp's rotation: keys by the full-size matrix, values by 64 × 64 blocks, so at
    /// head_dim 256 a value coordinate mixes with its own 64-run only; at 64 and below both
    /// streams are the same full matrix.
    #[test]
    fn hadamard_sets_rotate_values_in_blocks_of_64() {
        let dims = ModelDims::new(2, 4, 2, 256).unwrap();
        let set = ProjectionSet::hadamard(dims, "m").unwrap();
        let (qk, vo) = (set.qk(1, 1).unwrap(), set.vo(1, 1).unwrap());
        assert_eq!(qk, &hadamard(256).unwrap());
        assert!(qk.row(0).iter().all(|&x| (x - 1.0 / 16.0).abs() < 1e-7));
        let row = vo.row(70);
        assert!(row[..64].iter().chain(&row[128..]).all(|&x| x == 0.0));
        assert!(row[64..128].iter().all(|&x| (x.abs() - 1.0 / 8.0).abs() < 1e-7));
        assert!(vo.orthogonality_error() < 1e-6);
        assert_eq!(vo, &hadamard_blocks(256, 64).unwrap());
        for d in [8, 64] {
            let set = ProjectionSet::hadamard(ModelDims::new(1, 2, 1, d).unwrap(), "m").unwrap();
            assert_eq!(set.qk(0, 0).unwrap(), set.vo(0, 0).unwrap());
            assert_eq!(set.vo(0, 0).unwrap(), &hadamard(d).unwrap());
        }
        assert_eq!(hadamard_blocks(64, 64).unwrap(), hadamard(64).unwrap());
        assert!(hadamard_blocks(64, 0).is_err());
        assert!(hadamard_blocks(64, 24).is_err());
    }

    /// A sign-randomized draw is `D·H` with `H` llama.cpp's matrix of each stream: every
    /// row of `P` is `H`'s row or its negation, signs differ between sites, streams and
    /// seeds, and the rotation of a vector is `H` applied to the sign-flipped vector.
    #[test]
    fn signed_hadamard_sets_flip_the_rows_of_each_streams_matrix() {
        let dims = ModelDims::new(2, 4, 2, 256).unwrap();
        let (h, hv) = (hadamard(256).unwrap(), hadamard_blocks(256, 64).unwrap());
        let a = ProjectionSet::signed_hadamard(dims, "m", 1).unwrap();
        let b = ProjectionSet::signed_hadamard(dims, "m", 2).unwrap();
        let signs = |p: &Mat, h: &Mat| -> Vec<f32> {
            (0..256)
                .map(|i| {
                    let (r, hr) = (p.row(i), h.row(i));
                    let s = if r == hr { 1.0 } else { -1.0 };
                    assert!(r.iter().zip(hr).all(|(x, y)| *x == s * y), "row {i} is ±H's");
                    s
                })
                .collect()
        };
        let mut seen = Vec::new();
        for set in [&a, &b] {
            for (layer, head) in [(0, 0), (0, 1), (1, 0), (1, 1)] {
                let qk = signs(set.qk(layer, head).unwrap(), &h);
                let vo = signs(set.vo(layer, head).unwrap(), &hv);
                for s in [qk, vo] {
                    let flipped = s.iter().filter(|&&x| x < 0.0).count();
                    assert!((64..192).contains(&flipped), "about half the signs: {flipped}");
                    assert!(!seen.contains(&s), "a sign pattern repeats");
                    seen.push(s);
                }
            }
        }
        assert!(a.max_orthogonality_error() < 1e-6);
        // x·P = (x·D)·H: the Hadamard transform of the sign-flipped vector.
        let p = a.qk(1, 0).unwrap();
        let s = signs(p, &h);
        let x: Vec<f32> = (0..256).map(|i| ((i * 37) % 11) as f32 - 5.0).collect();
        for j in [0, 7, 255] {
            let via_p: f32 = (0..256).map(|i| x[i] * p.row(i)[j]).sum();
            let via_h: f32 = (0..256).map(|i| x[i] * s[i] * h.row(i)[j]).sum();
            assert!((via_p - via_h).abs() < 1e-5);
        }
        assert_eq!(a.ablation(BasisKind::SignedHadamard { seed: 1 }).unwrap(), a);
        assert_eq!("hadamard-signs:2".parse::<BasisKind>().unwrap(), b.kind());
        assert_eq!(b.kind().to_string(), "hadamard-signs:2");
    }

    /// A value-sign draw keeps every q/k basis the plain Walsh–Hadamard matrix and makes
    /// every v/o basis the 64-blocks matrix with ±1 row signs, patterns differing between
    /// sites and seeds.
    #[test]
    fn value_signed_hadamard_sets_flip_only_the_value_rows() {
        let dims = ModelDims::new(2, 4, 2, 256).unwrap();
        let (h, hv) = (hadamard(256).unwrap(), hadamard_blocks(256, 64).unwrap());
        let a = ProjectionSet::signed_hadamard_values(dims, "m", 1).unwrap();
        let b = ProjectionSet::signed_hadamard_values(dims, "m", 2).unwrap();
        let mut seen: Vec<Vec<bool>> = Vec::new();
        for set in [&a, &b] {
            for (layer, head) in [(0, 0), (0, 1), (1, 0), (1, 1)] {
                assert_eq!(set.qk(layer, head).unwrap(), &h, "keys keep the plain rotation");
                let p = set.vo(layer, head).unwrap();
                let flips: Vec<bool> = (0..256)
                    .map(|i| {
                        let (r, hr) = (p.row(i), hv.row(i));
                        let flip = r != hr;
                        assert!(r.iter().zip(hr).all(|(x, y)| *x == if flip { -y } else { *y }));
                        flip
                    })
                    .collect();
                let n = flips.iter().filter(|&&f| f).count();
                assert!((64..192).contains(&n), "about half the signs: {n}");
                assert!(!seen.contains(&flips), "a sign pattern repeats");
                seen.push(flips);
            }
        }
        assert!(a.max_orthogonality_error() < 1e-6);
        assert_eq!(a.ablation(BasisKind::SignedHadamardValues { seed: 1 }).unwrap(), a);
        assert_eq!("hadamard-value-signs:2".parse::<BasisKind>().unwrap(), b.kind());
        assert_eq!(b.kind().to_string(), "hadamard-value-signs:2");
        assert!(!b.kind().needs_calibration());
    }

    /// A jittered draw is `H·G`: every column pair `(a, b)` of `G`'s planes is `H`'s pair
    /// turned by ±1e-5 rad, each column in exactly one plane, and the rotation moves a
    /// vector's coordinates by at most 1e-5 of its norm.
    #[test]
    fn jittered_hadamard_sets_turn_each_column_pair_by_the_jitter_angle() {
        let dims = ModelDims::new(2, 4, 2, 256).unwrap();
        let (h, hv) = (hadamard(256).unwrap(), hadamard_blocks(256, 64).unwrap());
        let a = ProjectionSet::jittered_hadamard(dims, "m", 1).unwrap();
        assert_eq!(a, ProjectionSet::jittered_hadamard(dims, "m", 1).unwrap());
        assert!(a.max_orthogonality_error() < 1e-6);
        let b = ProjectionSet::jittered_hadamard(dims, "m", 2).unwrap();
        assert_ne!(a.qk(0, 0).unwrap(), b.qk(0, 0).unwrap());
        assert_ne!(a.qk(0, 0).unwrap(), a.qk(1, 0).unwrap());
        for (p, h) in [(a.qk(1, 1).unwrap(), &h), (a.vo(0, 1).unwrap(), &hv)] {
            // Column j of P is cos·H_j ± sin·H_partner(j): find each column's partner.
            let (ph, hh) = (p.transpose(), h.transpose());
            let mut partners = vec![usize::MAX; 256];
            for (j, partner) in partners.iter_mut().enumerate() {
                let diff: Vec<f64> =
                    ph.row(j).iter().zip(hh.row(j)).map(|(x, y)| f64::from(x - y)).collect();
                let k = (0..256)
                    .filter(|&k| k != j)
                    .min_by(|&k, &l| {
                        let fit = |k: usize| {
                            let s: f64 =
                                diff.iter().zip(hh.row(k)).map(|(d, y)| d * f64::from(*y)).sum();
                            diff.iter()
                                .zip(hh.row(k))
                                .map(|(d, y)| (d - s * f64::from(*y)).powi(2))
                                .sum::<f64>()
                        };
                        fit(k).total_cmp(&fit(l))
                    })
                    .unwrap();
                let turn: f64 = diff.iter().zip(hh.row(k)).map(|(d, y)| d * f64::from(*y)).sum();
                assert!((turn.abs() - JITTER_ANGLE).abs() < 1e-7, "column {j}: {turn}");
                *partner = k;
            }
            assert!((0..256).all(|j| partners[partners[j]] == j), "planes are disjoint pairs");
        }
        let x: Vec<f32> = (0..256).map(|i| ((i * 37) % 11) as f32 - 5.0).collect();
        let norm = x.iter().map(|v| v * v).sum::<f32>().sqrt();
        let (p, hq) = (a.qk(0, 1).unwrap(), &h);
        for j in 0..256 {
            let via_p: f32 = (0..256).map(|i| x[i] * p.row(i)[j]).sum();
            let via_h: f32 = (0..256).map(|i| x[i] * hq.row(i)[j]).sum();
            assert!((via_p - via_h).abs() <= 1.1e-5 * norm, "coordinate {j}");
        }
        assert_eq!(a.ablation(BasisKind::HadamardJitter { seed: 1 }).unwrap(), a);
        assert_eq!(b.kind().to_string(), "hadamard-jitter:2");
        assert!(!b.kind().needs_calibration());
    }
}
