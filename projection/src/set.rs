//! `ProjectionSet`: every `P_QK[layer][kv_head]` and `P_VO[layer][kv_head]` of one model,
//! with provenance, sample counts and the kind of basis (calibrated or an ablation).
//!
//! SWAN §4 keeps distinct bases per layer, per kv-head and per subspace (QK vs VO); the
//! Table 3 ablations replace them with random / identity / shuffled ones, so every kind is
//! the same type and every downstream tool (rotation, absorption, evaluation) accepts any.

use std::fmt;
use std::str::FromStr;

use crate::basis::Basis;
use crate::calibrate::{CalibrationConfig, SampleCounts};
use crate::dims::{ModelDims, Site, Stream};
use crate::error::{Error, Result, check_len};
use crate::mat::Mat;

/// Largest entry-wise `|PᵀP − I|` a basis may have to be accepted into a set (built or
/// loaded). Our own bases stay far below it (≈1e-7 in f32); the slack admits matrices
/// produced elsewhere and rounded to f32.
pub const ORTHOGONALITY_TOLERANCE: f64 = 1e-4;

/// Where a set's bases come from: calibrated (SWAN §4) or one of the Table 3 ablations.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BasisKind {
    /// Eigen-bases of calibration data.
    Calibrated,
    /// Haar-random orthogonal matrices (QR of a seeded Gaussian).
    Random {
        /// ChaCha8 seed.
        seed: u64,
    },
    /// No rotation (`P = I`).
    Identity,
    /// The data-free rotation quantized KV caches use, as llama.cpp applies it whenever its
    /// KV cache is quantized: the normalized Walsh–Hadamard matrix of size `head_dim` (a power
    /// of two) for q/k, and 64 × 64 Walsh–Hadamard blocks for v/o (the same full matrix
    /// when `head_dim` ≤ 64).
    Hadamard,
    /// The value half of [`BasisKind::Hadamard`] alone: q/k stay unrotated (`P_QK = I`), v/o
    /// by 64 × 64 Walsh–Hadamard blocks. For models whose keys quantize better in their own
    /// basis (Gemma 3's QK-normed keys lose more at int4 once spread by a rotation).
    HadamardValues,
    /// A randomized Walsh–Hadamard rotation: each basis is [`BasisKind::Hadamard`]'s matrix
    /// with its rows multiplied by seeded random signs (`P = D·H`, `D = diag(±1)`, so
    /// `x̂ = (x·D)·H`: flip each coordinate's sign, then mix), drawn anew for every layer,
    /// kv-head and stream. Its draws share the Hadamard structure (every entry `±1/√d`,
    /// 64-blocks on v/o) and differ only in the sign pattern, so their spread tells the
    /// structure's cost from one pattern's.
    SignedHadamard {
        /// ChaCha8 seed of the signs.
        seed: u64,
    },
    /// [`BasisKind::Hadamard`] with only the value side redrawn: q/k keep the plain
    /// Walsh–Hadamard matrix, each v/o basis is its 64 × 64 blocks with rows multiplied by
    /// seeded random signs (as [`BasisKind::SignedHadamard`] draws them). The keys a cache
    /// stores are exactly the plain rotation's, while every quantized value row rounds
    /// differently: its draws measure how far another value rounding alone — which changes
    /// every later layer's keys — moves a quantized cache's cost.
    SignedHadamardValues {
        /// ChaCha8 seed of the value signs.
        seed: u64,
    },
    /// [`BasisKind::Hadamard`]'s bases turned by a rounding-sized rotation: every basis is
    /// `H·G` with `G` seeded Givens rotations by ±[`crate::JITTER_ANGLE`] in `d/2` random
    /// coordinate planes, so each stored coordinate moves by about `10⁻⁵` of the vector's
    /// size — the order of what another implementation's summation order changes. Not a
    /// rotation to use but a probe: the spread of a quantized cache's cost over its draws is
    /// how far float-rounding-level differences alone move it.
    HadamardJitter {
        /// ChaCha8 seed of the planes and their signs.
        seed: u64,
    },
    /// Calibrated bases moved to other layers (cyclic permutation of layers).
    LayerShuffle {
        /// ChaCha8 seed of the permutation.
        seed: u64,
    },
    /// Calibrated bases moved to other kv-heads of the same layer.
    HeadShuffle {
        /// ChaCha8 seed of the permutations.
        seed: u64,
    },
    /// `P_QK` and `P_VO` swapped.
    KvShuffle,
}

impl BasisKind {
    /// Stable lowercase name used in files and on the command line.
    pub const fn name(&self) -> &'static str {
        match self {
            BasisKind::Calibrated => "calibrated",
            BasisKind::Random { .. } => "random",
            BasisKind::Identity => "identity",
            BasisKind::Hadamard => "hadamard",
            BasisKind::HadamardValues => "hadamard-v",
            BasisKind::SignedHadamard { .. } => "hadamard-signs",
            BasisKind::SignedHadamardValues { .. } => "hadamard-value-signs",
            BasisKind::HadamardJitter { .. } => "hadamard-jitter",
            BasisKind::LayerShuffle { .. } => "layer-shuffle",
            BasisKind::HeadShuffle { .. } => "head-shuffle",
            BasisKind::KvShuffle => "kv-shuffle",
        }
    }

    /// The seed of seeded kinds.
    pub const fn seed(&self) -> Option<u64> {
        match self {
            BasisKind::Random { seed }
            | BasisKind::SignedHadamard { seed }
            | BasisKind::SignedHadamardValues { seed }
            | BasisKind::HadamardJitter { seed }
            | BasisKind::LayerShuffle { seed }
            | BasisKind::HeadShuffle { seed } => Some(*seed),
            _ => None,
        }
    }

    /// Whether the kind is made from a calibrated set (the calibrated bases or a shuffle of
    /// them), rather than built from the model's dimensions alone (identity, random, the
    /// Walsh–Hadamard kinds).
    ///
    /// # Examples
    /// ```
    /// use projection::BasisKind;
    /// assert!(BasisKind::KvShuffle.needs_calibration());
    /// assert!(!BasisKind::SignedHadamard { seed: 1 }.needs_calibration());
    /// ```
    pub const fn needs_calibration(&self) -> bool {
        matches!(
            self,
            BasisKind::Calibrated
                | BasisKind::LayerShuffle { .. }
                | BasisKind::HeadShuffle { .. }
                | BasisKind::KvShuffle
        )
    }

    /// Rebuilds a kind from [`BasisKind::name`] and [`BasisKind::seed`].
    ///
    /// # Errors
    /// [`Error::Format`] for an unknown name, or a seeded kind without a seed.
    ///
    /// # Examples
    /// ```
    /// use projection::BasisKind;
    /// assert_eq!(BasisKind::from_name("random", Some(7))?, BasisKind::Random { seed: 7 });
    /// assert!(BasisKind::from_name("random", None).is_err());
    /// let v = BasisKind::HadamardValues;
    /// assert_eq!(BasisKind::from_name(v.name(), v.seed())?, v); // "hadamard-v"
    /// # Ok::<(), projection::Error>(())
    /// ```
    pub fn from_name(name: &str, seed: Option<u64>) -> Result<Self> {
        let need = |f: fn(u64) -> BasisKind| {
            seed.map(f).ok_or_else(|| Error::Format { reason: format!("kind {name} needs a seed") })
        };
        match name {
            "calibrated" => Ok(BasisKind::Calibrated),
            "identity" => Ok(BasisKind::Identity),
            "hadamard" => Ok(BasisKind::Hadamard),
            "hadamard-v" => Ok(BasisKind::HadamardValues),
            "kv-shuffle" => Ok(BasisKind::KvShuffle),
            "random" => need(|seed| BasisKind::Random { seed }),
            "hadamard-signs" => need(|seed| BasisKind::SignedHadamard { seed }),
            "hadamard-value-signs" => need(|seed| BasisKind::SignedHadamardValues { seed }),
            "hadamard-jitter" => need(|seed| BasisKind::HadamardJitter { seed }),
            "layer-shuffle" => need(|seed| BasisKind::LayerShuffle { seed }),
            "head-shuffle" => need(|seed| BasisKind::HeadShuffle { seed }),
            _ => Err(Error::Format { reason: format!("unknown basis kind {name:?}") }),
        }
    }
}

impl fmt::Display for BasisKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.seed() {
            Some(seed) => write!(f, "{}:{seed}", self.name()),
            None => f.write_str(self.name()),
        }
    }
}

/// Parses `name` or `name:seed` (seed defaults to 0), e.g. `random:42`, `hadamard-signs:3`,
/// `kv-shuffle`.
impl FromStr for BasisKind {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        let (name, seed) = match s.split_once(':') {
            Some((n, seed)) => {
                let seed = seed
                    .parse()
                    .map_err(|_| Error::Format { reason: format!("bad seed in {s:?}") })?;
                (n, Some(seed))
            }
            None => (s, None),
        };
        let seeded = matches!(
            name,
            "random"
                | "hadamard-signs"
                | "hadamard-value-signs"
                | "hadamard-jitter"
                | "layer-shuffle"
                | "head-shuffle"
        );
        Self::from_name(name, if seeded { seed.or(Some(0)) } else { seed })
    }
}

/// Where a set comes from.
#[derive(Clone, Debug, PartialEq)]
pub struct Provenance {
    /// Model identifier (e.g. `SmolLM2-135M-Instruct`), checked on load when asked.
    pub model: String,
    /// Tokens every calibrated accumulator saw (0 for identity / random sets).
    pub calibration_tokens: u64,
    /// Calibrated or which ablation.
    pub kind: BasisKind,
    /// Weighting used for calibration (`None` when not calibrated from data).
    pub config: Option<CalibrationConfig>,
}

/// Calibration sample counts of one (layer, kv-head).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct HeadCounts {
    /// QK accumulator counts.
    pub qk: SampleCounts,
    /// VO accumulator counts.
    pub vo: SampleCounts,
}

/// All SWAN bases of a model: `P_QK[layer][kv_head]` and `P_VO[layer][kv_head]`, each a
/// `head_dim × head_dim` [`Mat`] with basis vectors as columns (`x̂ = x·P`).
#[derive(Clone, Debug, PartialEq)]
pub struct ProjectionSet {
    dims: ModelDims,
    qk: Vec<Basis>,
    vo: Vec<Basis>,
    counts: Option<Vec<HeadCounts>>,
    provenance: Provenance,
}

impl ProjectionSet {
    /// Assembles and validates a set. `qk`/`vo` are layer-major (`index = layer · kv_heads +
    /// kv_head`); `counts`, if given, likewise.
    ///
    /// # Errors
    /// [`Error::Shape`] for wrong counts or basis sizes; [`Error::NotOrthogonal`] if a basis
    /// exceeds [`ORTHOGONALITY_TOLERANCE`]; [`Error::Mismatch`] if only some bases of a
    /// stream carry eigenvalues.
    ///
    /// # Examples
    /// ```
    /// use projection::{Basis, BasisKind, Mat, ModelDims, ProjectionSet, Provenance};
    /// let dims = ModelDims::new(1, 2, 1, 2)?;
    /// let eye = || Basis::new(Mat::identity(2));
    /// let prov = Provenance { model: "toy".into(), calibration_tokens: 0, kind: BasisKind::Identity, config: None };
    /// let set = ProjectionSet::from_parts(dims, vec![eye()?], vec![eye()?], None, prov)?;
    /// assert_eq!(set.max_orthogonality_error(), 0.0);
    /// # Ok::<(), projection::Error>(())
    /// ```
    pub fn from_parts(
        dims: ModelDims,
        qk: Vec<Basis>,
        vo: Vec<Basis>,
        counts: Option<Vec<HeadCounts>>,
        provenance: Provenance,
    ) -> Result<Self> {
        const OP: &str = "ProjectionSet::from_parts";
        check_len(OP, "qk bases", dims.sites(), qk.len())?;
        check_len(OP, "vo bases", dims.sites(), vo.len())?;
        if let Some(c) = &counts {
            check_len(OP, "counts", dims.sites(), c.len())?;
        }
        let set = Self { dims, qk, vo, counts, provenance };
        for stream in Stream::ALL {
            set.validate_stream(OP, stream)?;
        }
        Ok(set)
    }

    fn validate_stream(&self, op: &'static str, stream: Stream) -> Result<()> {
        let bases = self.bases(stream);
        for (i, b) in bases.iter().enumerate() {
            let site = self.site(stream, i);
            check_len(op, "basis dim", self.dims.head_dim(), b.dim())?;
            let error = b.matrix().orthogonality_error();
            if error.is_nan() || error > ORTHOGONALITY_TOLERANCE {
                let tolerance = ORTHOGONALITY_TOLERANCE;
                return Err(Error::NotOrthogonal { op, site, error, tolerance });
            }
        }
        let with = bases.iter().filter(|b| b.eigenvalues().is_some()).count();
        let energies = bases.iter().filter(|b| b.query_energy().is_some()).count();
        for (what, with) in
            [("bases with eigenvalues", with), ("bases with query energies", energies)]
        {
            if with != 0 && with != bases.len() {
                return Err(Error::Mismatch {
                    op,
                    what,
                    expected: format!("0 or {}", bases.len()),
                    got: with.to_string(),
                });
            }
        }
        Ok(())
    }

    fn site(&self, stream: Stream, index: usize) -> Site {
        let kv = self.dims.kv_heads();
        Site { layer: index / kv, kv_head: index % kv, stream }
    }

    /// Model dimensions the set was built for.
    pub const fn dims(&self) -> ModelDims {
        self.dims
    }

    /// Head dimension `d_h`.
    pub const fn head_dim(&self) -> usize {
        self.dims.head_dim()
    }

    /// Model name, token count, kind and weighting.
    pub const fn provenance(&self) -> &Provenance {
        &self.provenance
    }

    /// Calibrated or which ablation.
    pub const fn kind(&self) -> BasisKind {
        self.provenance.kind
    }

    /// All bases of a stream, layer-major.
    pub(crate) fn bases(&self, stream: Stream) -> &[Basis] {
        match stream {
            Stream::Qk => &self.qk,
            Stream::Vo => &self.vo,
        }
    }

    /// The kv-head bases of one layer of a stream (`kv_heads` entries).
    pub(crate) fn layer_bases(&self, stream: Stream, layer: usize) -> &[Basis] {
        let kv = self.dims.kv_heads();
        &self.bases(stream)[layer * kv..(layer + 1) * kv]
    }

    /// Per-head calibration counts, layer-major (`None` for synthetic sets).
    pub(crate) fn all_counts(&self) -> Option<&[HeadCounts]> {
        self.counts.as_deref()
    }

    /// The basis of one (stream, layer, kv-head).
    ///
    /// # Errors
    /// [`Error::OutOfRange`] for a bad layer or kv-head.
    ///
    /// # Examples
    /// ```
    /// use projection::{ModelDims, ProjectionSet, Stream};
    /// let set = ProjectionSet::identity(ModelDims::new(2, 4, 2, 8)?, "toy")?;
    /// assert_eq!(set.basis(Stream::Qk, 1, 1)?.dim(), 8);
    /// assert!(set.basis(Stream::Qk, 2, 0).is_err());
    /// # Ok::<(), projection::Error>(())
    /// ```
    pub fn basis(&self, stream: Stream, layer: usize, kv_head: usize) -> Result<&Basis> {
        self.dims.check_layer("ProjectionSet::basis", layer)?;
        self.dims.check_kv_head("ProjectionSet::basis", kv_head)?;
        Ok(&self.bases(stream)[self.dims.site_index(layer, kv_head)])
    }

    /// `P_QK` of (layer, kv-head).
    ///
    /// # Errors
    /// [`Error::OutOfRange`] for a bad layer or kv-head.
    ///
    /// # Examples
    /// ```
    /// use projection::{Mat, ModelDims, ProjectionSet};
    /// let set = ProjectionSet::identity(ModelDims::new(1, 2, 1, 4)?, "toy")?;
    /// assert_eq!(set.qk(0, 0)?, &Mat::identity(4));
    /// # Ok::<(), projection::Error>(())
    /// ```
    pub fn qk(&self, layer: usize, kv_head: usize) -> Result<&Mat> {
        Ok(self.basis(Stream::Qk, layer, kv_head)?.matrix())
    }

    /// `P_VO` of (layer, kv-head).
    ///
    /// # Errors
    /// [`Error::OutOfRange`] for a bad layer or kv-head.
    ///
    /// # Examples
    /// ```
    /// use projection::{Mat, ModelDims, ProjectionSet};
    /// let set = ProjectionSet::identity(ModelDims::new(1, 2, 1, 4)?, "toy")?;
    /// assert_eq!(set.vo(0, 0)?, &Mat::identity(4));
    /// # Ok::<(), projection::Error>(())
    /// ```
    pub fn vo(&self, layer: usize, kv_head: usize) -> Result<&Mat> {
        Ok(self.basis(Stream::Vo, layer, kv_head)?.matrix())
    }

    /// Calibration counts of (layer, kv-head); `None` for identity / random sets.
    ///
    /// # Errors
    /// [`Error::OutOfRange`] for a bad layer or kv-head.
    ///
    /// # Examples
    /// ```
    /// use projection::{ModelDims, ProjectionSet};
    /// let set = ProjectionSet::identity(ModelDims::new(1, 2, 1, 4)?, "toy")?;
    /// assert!(set.counts(0, 0)?.is_none());
    /// # Ok::<(), projection::Error>(())
    /// ```
    pub fn counts(&self, layer: usize, kv_head: usize) -> Result<Option<HeadCounts>> {
        self.dims.check_layer("ProjectionSet::counts", layer)?;
        self.dims.check_kv_head("ProjectionSet::counts", kv_head)?;
        Ok(self.counts.as_ref().map(|c| c[self.dims.site_index(layer, kv_head)]))
    }

    /// Explained-energy curve of one basis (see [`Basis::energy_curve`]); `None` unless the
    /// set is calibrated.
    ///
    /// # Errors
    /// [`Error::OutOfRange`] for a bad layer or kv-head.
    ///
    /// # Examples
    /// ```
    /// use projection::{ModelDims, ProjectionSet, Stream};
    /// let set = ProjectionSet::identity(ModelDims::new(1, 2, 1, 4)?, "toy")?;
    /// assert!(set.energy_curve(Stream::Vo, 0, 0)?.is_none());
    /// # Ok::<(), projection::Error>(())
    /// ```
    pub fn energy_curve(
        &self,
        stream: Stream,
        layer: usize,
        kv_head: usize,
    ) -> Result<Option<Vec<f64>>> {
        Ok(self.basis(stream, layer, kv_head)?.energy_curve())
    }

    /// Largest entry-wise `|PᵀP − I|` over every basis of the set.
    pub fn max_orthogonality_error(&self) -> f64 {
        self.qk.iter().chain(&self.vo).map(|b| b.matrix().orthogonality_error()).fold(0.0, f64::max)
    }

    /// Checks that the set fits a model: same layers, q-heads, kv-heads and head_dim, and —
    /// if `model` is given — the same model name.
    ///
    /// # Errors
    /// [`Error::Mismatch`] naming the first differing field, expected = the model's value.
    ///
    /// # Examples
    /// ```
    /// use projection::{Error, ModelDims, ProjectionSet};
    /// let set = ProjectionSet::identity(ModelDims::new(30, 9, 3, 64)?, "SmolLM2-135M")?;
    /// set.check_compatible(&ModelDims::new(30, 9, 3, 64)?, Some("SmolLM2-135M"))?;
    /// let llama = ModelDims::new(32, 32, 8, 128)?;
    /// assert!(matches!(set.check_compatible(&llama, None), Err(Error::Mismatch { what: "layers", .. })));
    /// # Ok::<(), projection::Error>(())
    /// ```
    pub fn check_compatible(&self, dims: &ModelDims, model: Option<&str>) -> Result<()> {
        let fields = [
            ("layers", dims.layers(), self.dims.layers()),
            ("q_heads", dims.q_heads(), self.dims.q_heads()),
            ("kv_heads", dims.kv_heads(), self.dims.kv_heads()),
            ("head_dim", dims.head_dim(), self.dims.head_dim()),
        ];
        let op = "ProjectionSet::check_compatible";
        for (what, expected, got) in fields {
            if expected != got {
                let (expected, got) = (expected.to_string(), got.to_string());
                return Err(Error::Mismatch { op, what, expected, got });
            }
        }
        match model {
            Some(m) if m != self.provenance.model => Err(Error::Mismatch {
                op,
                what: "model",
                expected: m.to_owned(),
                got: self.provenance.model.clone(),
            }),
            _ => Ok(()),
        }
    }
}
