//! Calibration: streaming, mergeable per-(layer, kv-head) accumulators for `P_QK` and `P_VO`.
//!
//! SWAN §4 ("projection matrices"): one basis per (layer, kv-head) for the *joint*
//! distribution of RoPE'd queries and keys (QK), and one for values and attention outputs
//! (VO). Under GQA the `group` query heads that share kv-head `j` (heads `j·group ..
//! (j+1)·group`, Hugging Face `repeat_kv` order) all feed kv-head `j`'s accumulators.
//!
//! Activation layouts (row-major f32, exactly what a decoder produces per layer):
//! * queries after RoPE:          `[n_tokens, q_heads, head_dim]`
//! * keys after RoPE:             `[n_tokens, kv_heads, head_dim]`
//! * values:                      `[n_tokens, kv_heads, head_dim]`
//! * attention outputs (pre-`W_O`): `[n_tokens, q_heads, head_dim]`
//!
//! Calibration can run in chunks or on threads: each [`Calibrator`] is independent and
//! [`Calibrator::merge`] adds another's sums ([`calibrate_parallel`] does both).

use serde::{Deserialize, Serialize};

use crate::basis::Basis;
use crate::dims::{ModelDims, Site, Stream};
use crate::error::{Error, Result, check_finite, check_product};
use crate::mat::Mat;
use crate::moment::{RowBlock, SecondMoment, check_weight};
use crate::set::{BasisKind, HeadCounts, ProjectionSet, Provenance};

/// How the query-side vectors (queries, or attention outputs) and the kv-side vector (key,
/// or value) of one token are weighted in a kv-head's stacked second moment.
///
/// The default is [`Weighting::Balanced`]: each of the `group` query-side vectors gets
/// weight `1/group` and the kv-side vector weight 1, so per token the query heads *as a
/// population* and the shared key/value count equally. Why: the key/value is what SWAN
/// stores and prunes, while queries/outputs decide which of its coordinates matter; plain
/// stacking would give the stored vector only `1/(group+1)` of the say under GQA (1/5 for
/// Llama-3.1-8B) merely because there are more query heads. For MHA (`group = 1`) the two
/// coincide with the paper's stacked construction.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub enum Weighting {
    /// Query-side vectors `1/group` each, kv-side vector 1 (default; see the type docs).
    #[default]
    Balanced,
    /// Every vector weight 1 (the paper's literal "stacked" joint distribution).
    Stacked,
    /// Explicit per-vector weights (finite, ≥ 0, not both 0).
    Custom {
        /// Weight of each query (QK) or attention output (VO).
        query_side: f64,
        /// Weight of the key (QK) or value (VO).
        kv_side: f64,
    },
}

impl Weighting {
    /// `(query_side, kv_side)` per-vector weights for GQA group size `group`.
    ///
    /// # Examples
    /// ```
    /// use projection::Weighting;
    /// assert_eq!(Weighting::Balanced.weights(4), (0.25, 1.0));
    /// assert_eq!(Weighting::Stacked.weights(4), (1.0, 1.0));
    /// ```
    pub fn weights(self, group: usize) -> (f64, f64) {
        match self {
            Weighting::Balanced => (1.0 / group.max(1) as f64, 1.0),
            Weighting::Stacked => (1.0, 1.0),
            Weighting::Custom { query_side, kv_side } => (query_side, kv_side),
        }
    }

    fn validate(self) -> Result<()> {
        let (q, kv) = self.weights(1);
        check_weight("Weighting", "query_side", q)?;
        check_weight("Weighting", "kv_side", kv)?;
        if q + kv > 0.0 {
            Ok(())
        } else {
            Err(Error::InvalidWeight { op: "Weighting", what: "query_side + kv_side", value: 0.0 })
        }
    }
}

/// Weightings for the two streams (both [`Weighting::Balanced`] by default).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CalibrationConfig {
    /// Queries vs keys in the QK moment.
    pub qk: Weighting,
    /// Attention outputs vs values in the VO moment.
    pub vo: Weighting,
}

impl CalibrationConfig {
    /// The weighting of `stream`.
    pub const fn weighting(&self, stream: Stream) -> Weighting {
        match stream {
            Stream::Qk => self.qk,
            Stream::Vo => self.vo,
        }
    }
}

/// How much data one (layer, kv-head, stream) accumulator saw.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct SampleCounts {
    /// Tokens observed.
    pub tokens: u64,
    /// Vectors folded in (`tokens · (group + 1)`).
    pub vectors: u64,
    /// Sum of their weights.
    pub weight: f64,
}

/// One layer's activations for [`Calibrator::observe_layer`] (layouts in the module docs).
#[derive(Clone, Copy, Debug)]
pub struct LayerActivations<'a> {
    /// Number of tokens in this chunk.
    pub n_tokens: usize,
    /// `[n_tokens, q_heads, head_dim]`, after RoPE.
    pub queries: &'a [f32],
    /// `[n_tokens, kv_heads, head_dim]`, after RoPE.
    pub keys: &'a [f32],
    /// `[n_tokens, kv_heads, head_dim]`.
    pub values: &'a [f32],
    /// `[n_tokens, q_heads, head_dim]`: per-head attention outputs before `W_O`.
    pub attn_out: &'a [f32],
}

/// Streaming calibration state for a whole model: one f64 [`SecondMoment`] per
/// (stream, layer, kv-head), plus the queries' own moment per (layer, kv-head) — the QK
/// bases carry the queries' energy along each basis vector
/// ([`crate::Basis::query_energy`]).
#[derive(Clone, Debug)]
pub struct Calibrator {
    dims: ModelDims,
    config: CalibrationConfig,
    /// Indexed `[stream.index() * sites + site]`.
    moments: Vec<SecondMoment>,
    /// The queries alone (weight 1 each), indexed by site.
    query_moments: Vec<SecondMoment>,
    tokens: Vec<u64>,
    scratch: Vec<f64>,
}

impl Calibrator {
    /// An empty calibrator for a model.
    ///
    /// # Errors
    /// [`Error::InvalidWeight`] if a custom weighting is negative, non-finite or all zero.
    ///
    /// # Examples
    /// ```
    /// use projection::{CalibrationConfig, Calibrator, ModelDims};
    /// let cal = Calibrator::new(ModelDims::new(30, 9, 3, 64)?, CalibrationConfig::default())?;
    /// assert_eq!(cal.calibration_tokens(), 0);
    /// # Ok::<(), projection::Error>(())
    /// ```
    pub fn new(dims: ModelDims, config: CalibrationConfig) -> Result<Self> {
        config.qk.validate()?;
        config.vo.validate()?;
        let n = 2 * dims.sites();
        Ok(Self {
            dims,
            config,
            moments: vec![SecondMoment::new(dims.head_dim()); n],
            query_moments: vec![SecondMoment::new(dims.head_dim()); dims.sites()],
            tokens: vec![0; n],
            scratch: Vec::new(),
        })
    }

    /// The model dimensions.
    pub const fn dims(&self) -> ModelDims {
        self.dims
    }

    /// The weighting configuration.
    pub const fn config(&self) -> CalibrationConfig {
        self.config
    }

    fn slot(&self, stream: Stream, layer: usize, kv_head: usize) -> usize {
        stream.index() * self.dims.sites() + self.dims.site_index(layer, kv_head)
    }

    /// Folds one layer's RoPE'd queries `[n_tokens, q_heads, d]` and keys
    /// `[n_tokens, kv_heads, d]` into the QK moments of every kv-head of `layer`.
    ///
    /// # Errors
    /// [`Error::OutOfRange`] for a bad layer, [`Error::Shape`] for wrong lengths,
    /// [`Error::NonFinite`] for NaN/∞; on error nothing is added.
    ///
    /// # Examples
    /// ```
    /// use projection::{CalibrationConfig, Calibrator, ModelDims, Stream};
    /// let mut cal = Calibrator::new(ModelDims::new(1, 2, 1, 2)?, CalibrationConfig::default())?;
    /// cal.observe_qk(0, 1, &[1.0, 0.0, 0.0, 1.0], &[1.0, 1.0])?;
    /// assert_eq!(cal.counts(Stream::Qk, 0, 0)?.vectors, 3);
    /// assert!(cal.observe_qk(0, 1, &[f32::NAN, 0.0, 0.0, 1.0], &[1.0, 1.0]).is_err());
    /// # Ok::<(), projection::Error>(())
    /// ```
    pub fn observe_qk(
        &mut self,
        layer: usize,
        n_tokens: usize,
        queries: &[f32],
        keys: &[f32],
    ) -> Result<()> {
        self.observe(Stream::Qk, layer, n_tokens, ("queries", queries), ("keys", keys))
    }

    /// Folds one layer's values `[n_tokens, kv_heads, d]` and per-head attention outputs
    /// `[n_tokens, q_heads, d]` into the VO moments of every kv-head of `layer`.
    ///
    /// # Errors
    /// As [`Calibrator::observe_qk`].
    ///
    /// # Examples
    /// ```
    /// use projection::{CalibrationConfig, Calibrator, ModelDims, Stream};
    /// let mut cal = Calibrator::new(ModelDims::new(1, 2, 1, 2)?, CalibrationConfig::default())?;
    /// cal.observe_vo(0, 1, &[1.0, 1.0], &[1.0, 0.0, 0.0, 1.0])?;
    /// assert_eq!(cal.counts(Stream::Vo, 0, 0)?.tokens, 1);
    /// # Ok::<(), projection::Error>(())
    /// ```
    pub fn observe_vo(
        &mut self,
        layer: usize,
        n_tokens: usize,
        values: &[f32],
        attn_out: &[f32],
    ) -> Result<()> {
        self.observe(Stream::Vo, layer, n_tokens, ("attn_out", attn_out), ("values", values))
    }

    /// [`Calibrator::observe_qk`] and [`Calibrator::observe_vo`] for one layer at once.
    /// Everything is validated before anything is added.
    ///
    /// # Errors
    /// As [`Calibrator::observe_qk`].
    ///
    /// # Examples
    /// ```
    /// use projection::{CalibrationConfig, Calibrator, LayerActivations, ModelDims};
    /// let mut cal = Calibrator::new(ModelDims::new(1, 2, 1, 2)?, CalibrationConfig::default())?;
    /// let (q, kv) = ([0.5f32, 1.0, -1.0, 0.25], [1.0f32, -2.0]);
    /// cal.observe_layer(0, &LayerActivations { n_tokens: 1, queries: &q, keys: &kv, values: &kv, attn_out: &q })?;
    /// let set = cal.finish("toy")?;
    /// assert_eq!(set.provenance().calibration_tokens, 1);
    /// # Ok::<(), projection::Error>(())
    /// ```
    pub fn observe_layer(&mut self, layer: usize, acts: &LayerActivations<'_>) -> Result<()> {
        let n = acts.n_tokens;
        self.validate(Stream::Qk, layer, n, ("queries", acts.queries), ("keys", acts.keys))?;
        self.validate(Stream::Vo, layer, n, ("attn_out", acts.attn_out), ("values", acts.values))?;
        self.observe(Stream::Qk, layer, n, ("queries", acts.queries), ("keys", acts.keys))?;
        self.observe(Stream::Vo, layer, n, ("attn_out", acts.attn_out), ("values", acts.values))
    }

    fn validate(
        &self,
        stream: Stream,
        layer: usize,
        n_tokens: usize,
        (q_name, q_side): (&'static str, &[f32]),
        (kv_name, kv_side): (&'static str, &[f32]),
    ) -> Result<()> {
        let op = match stream {
            Stream::Qk => "Calibrator::observe_qk",
            Stream::Vo => "Calibrator::observe_vo",
        };
        let d = &self.dims;
        d.check_layer(op, layer)?;
        check_product(op, q_name, &[n_tokens, d.q_heads(), d.head_dim()], q_side.len())?;
        check_product(op, kv_name, &[n_tokens, d.kv_heads(), d.head_dim()], kv_side.len())?;
        check_finite(op, q_name, q_side)?;
        check_finite(op, kv_name, kv_side)
    }

    fn observe(
        &mut self,
        stream: Stream,
        layer: usize,
        n_tokens: usize,
        q_side: (&'static str, &[f32]),
        kv_side: (&'static str, &[f32]),
    ) -> Result<()> {
        self.validate(stream, layer, n_tokens, q_side, kv_side)?;
        let (dims, hd, g) = (self.dims, self.dims.head_dim(), self.dims.group());
        let (wq, wkv) = self.config.weighting(stream).weights(g);
        for j in 0..dims.kv_heads() {
            let blocks = [
                RowBlock {
                    data: q_side.1,
                    offset: j * g * hd,
                    stride: dims.q_heads() * hd,
                    rows: n_tokens,
                    run: g,
                    weight: wq,
                },
                RowBlock {
                    data: kv_side.1,
                    offset: j * hd,
                    stride: dims.kv_heads() * hd,
                    rows: n_tokens,
                    run: 1,
                    weight: wkv,
                },
            ];
            let slot = self.slot(stream, layer, j);
            self.moments[slot].add_blocks(&blocks, &mut self.scratch);
            if stream == Stream::Qk {
                let queries = RowBlock { weight: 1.0, ..blocks[0] };
                let site = self.dims.site_index(layer, j);
                self.query_moments[site].add_blocks(&[queries], &mut self.scratch);
            }
            self.tokens[slot] += n_tokens as u64;
        }
        Ok(())
    }

    /// Adds another calibrator's sums (disjoint data, e.g. another chunk or thread).
    ///
    /// # Errors
    /// [`Error::Mismatch`] if the dimensions or weightings differ.
    ///
    /// # Examples
    /// ```
    /// use projection::{CalibrationConfig, Calibrator, ModelDims, Stream};
    /// let dims = ModelDims::new(1, 1, 1, 2)?;
    /// let mut a = Calibrator::new(dims, CalibrationConfig::default())?;
    /// let mut b = a.clone();
    /// a.observe_qk(0, 1, &[1.0, 0.0], &[1.0, 0.0])?;
    /// b.observe_qk(0, 2, &[0.0, 1.0, 0.0, 1.0], &[0.0, 1.0, 0.0, 1.0])?;
    /// a.merge(&b)?;
    /// assert_eq!(a.counts(Stream::Qk, 0, 0)?.tokens, 3);
    /// # Ok::<(), projection::Error>(())
    /// ```
    pub fn merge(&mut self, other: &Calibrator) -> Result<()> {
        let mismatch = |what, expected: String, got: String| {
            Err(Error::Mismatch { op: "Calibrator::merge", what, expected, got })
        };
        if self.dims != other.dims {
            return mismatch("dims", self.dims.to_string(), other.dims.to_string());
        }
        if self.config != other.config {
            return mismatch("config", format!("{:?}", self.config), format!("{:?}", other.config));
        }
        for (a, b) in self.moments.iter_mut().zip(&other.moments) {
            a.merge(b)?;
        }
        for (a, b) in self.query_moments.iter_mut().zip(&other.query_moments) {
            a.merge(b)?;
        }
        self.tokens.iter_mut().zip(&other.tokens).for_each(|(a, b)| *a += b);
        Ok(())
    }

    /// The accumulator of one (stream, layer, kv-head).
    ///
    /// # Errors
    /// [`Error::OutOfRange`] for a bad layer or kv-head.
    ///
    /// # Examples
    /// ```
    /// use projection::{CalibrationConfig, Calibrator, ModelDims, Stream};
    /// let cal = Calibrator::new(ModelDims::new(2, 2, 1, 4)?, CalibrationConfig::default())?;
    /// assert_eq!(cal.moment(Stream::Vo, 1, 0)?.dim(), 4);
    /// assert!(cal.moment(Stream::Vo, 2, 0).is_err());
    /// # Ok::<(), projection::Error>(())
    /// ```
    pub fn moment(&self, stream: Stream, layer: usize, kv_head: usize) -> Result<&SecondMoment> {
        self.dims.check_layer("Calibrator::moment", layer)?;
        self.dims.check_kv_head("Calibrator::moment", kv_head)?;
        Ok(&self.moments[self.slot(stream, layer, kv_head)])
    }

    /// Sample counts of one (stream, layer, kv-head).
    ///
    /// # Errors
    /// [`Error::OutOfRange`] for a bad layer or kv-head.
    ///
    /// # Examples
    /// ```
    /// use projection::{CalibrationConfig, Calibrator, ModelDims, Stream};
    /// let cal = Calibrator::new(ModelDims::new(1, 1, 1, 4)?, CalibrationConfig::default())?;
    /// assert_eq!(cal.counts(Stream::Qk, 0, 0)?.tokens, 0);
    /// # Ok::<(), projection::Error>(())
    /// ```
    pub fn counts(&self, stream: Stream, layer: usize, kv_head: usize) -> Result<SampleCounts> {
        let m = self.moment(stream, layer, kv_head)?;
        let tokens = self.tokens[self.slot(stream, layer, kv_head)];
        Ok(SampleCounts { tokens, vectors: m.vectors(), weight: m.total_weight() })
    }

    /// Tokens every accumulator has seen (the minimum over all of them).
    pub fn calibration_tokens(&self) -> u64 {
        self.tokens.iter().copied().min().unwrap_or(0)
    }

    /// Energy curve of an arbitrary `basis` on one position's calibration data (see
    /// [`SecondMoment::captured_energy`]): compares calibrated, identity and random bases.
    ///
    /// # Errors
    /// [`Error::OutOfRange`] for a bad position, [`Error::Shape`] for a wrong-sized basis.
    ///
    /// # Examples
    /// ```
    /// use projection::{CalibrationConfig, Calibrator, Mat, ModelDims, Stream};
    /// let mut cal = Calibrator::new(ModelDims::new(1, 1, 1, 2)?, CalibrationConfig::default())?;
    /// cal.observe_qk(0, 1, &[0.0, 2.0], &[0.0, 1.0])?;
    /// let e = cal.captured_energy(Stream::Qk, 0, 0, &Mat::identity(2))?;
    /// assert_eq!(e, vec![0.0, 1.0]);
    /// # Ok::<(), projection::Error>(())
    /// ```
    pub fn captured_energy(
        &self,
        stream: Stream,
        layer: usize,
        kv_head: usize,
        basis: &Mat,
    ) -> Result<Vec<f64>> {
        self.moment(stream, layer, kv_head)?.captured_energy(basis)
    }

    /// Eigen-bases for every position, using all available cores
    /// ([`Calibrator::finish_with_threads`]); the result does not depend on the thread count.
    ///
    /// # Errors
    /// As [`Calibrator::finish_with_threads`].
    ///
    /// # Examples
    /// See [`Calibrator::observe_layer`].
    pub fn finish(&self, model: &str) -> Result<ProjectionSet> {
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        self.finish_with_threads(model, threads)
    }

    /// Eigen-decomposes every (layer, kv-head, stream) moment on up to `threads` threads and
    /// returns a calibrated [`ProjectionSet`] tagged with `model`.
    ///
    /// # Errors
    /// [`Error::NoSamples`] naming the first position (layer-major, QK before VO) that saw no
    /// data; [`Error::ZeroEnergy`] / [`Error::EigenFailed`] from [`SecondMoment::eigen_basis`].
    ///
    /// # Examples
    /// ```
    /// use projection::{CalibrationConfig, Calibrator, Error, ModelDims};
    /// let cal = Calibrator::new(ModelDims::new(1, 1, 1, 2)?, CalibrationConfig::default())?;
    /// assert!(matches!(cal.finish_with_threads("toy", 1), Err(Error::NoSamples { .. })));
    /// # Ok::<(), projection::Error>(())
    /// ```
    pub fn finish_with_threads(&self, model: &str, threads: usize) -> Result<ProjectionSet> {
        let sites = self.all_sites();
        if let Some(&site) = sites.iter().find(|s| self.tokens[self.slot_of(**s)] == 0) {
            return Err(Error::NoSamples { site, tokens: 0, weight: 0.0 });
        }
        let bases = self.bases_parallel(&sites, threads.max(1))?;
        let (qk, vo) = bases.split_at(self.dims.sites());
        let counts = (0..self.dims.sites())
            .map(|s| {
                let (l, j) = (s / self.dims.kv_heads(), s % self.dims.kv_heads());
                Ok(HeadCounts {
                    qk: self.counts(Stream::Qk, l, j)?,
                    vo: self.counts(Stream::Vo, l, j)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let provenance = Provenance {
            model: model.to_owned(),
            calibration_tokens: self.calibration_tokens(),
            kind: BasisKind::Calibrated,
            config: Some(self.config),
        };
        ProjectionSet::from_parts(self.dims, qk.to_vec(), vo.to_vec(), Some(counts), provenance)
    }

    /// Every position, stream-major (all QK sites, then all VO sites), layer-major inside.
    fn all_sites(&self) -> Vec<Site> {
        let (layers, kv) = (self.dims.layers(), self.dims.kv_heads());
        Stream::ALL
            .iter()
            .flat_map(|&stream| {
                (0..layers).flat_map(move |layer| {
                    (0..kv).map(move |kv_head| Site { layer, kv_head, stream })
                })
            })
            .collect()
    }

    fn slot_of(&self, s: Site) -> usize {
        self.slot(s.stream, s.layer, s.kv_head)
    }

    /// The eigen-basis of one position; a QK basis also carries the queries' energy along
    /// each of its vectors.
    fn basis_of(&self, s: Site) -> Result<Basis> {
        let basis = self.moments[self.slot_of(s)].eigen_basis(s)?;
        if s.stream != Stream::Qk {
            return Ok(basis);
        }
        let queries = &self.query_moments[self.dims.site_index(s.layer, s.kv_head)];
        let energy = queries.column_energy(basis.matrix())?;
        basis.with_query_energy(energy)
    }

    fn bases_parallel(&self, sites: &[Site], threads: usize) -> Result<Vec<Basis>> {
        let chunk = sites.len().div_ceil(threads).max(1);
        let results: Vec<Result<Vec<Basis>>> = std::thread::scope(|scope| {
            let handles: Vec<_> = sites
                .chunks(chunk)
                .map(|part| {
                    scope.spawn(move || {
                        part.iter().map(|&s| self.basis_of(s)).collect::<Result<Vec<_>>>()
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
                .collect()
        });
        let mut out = Vec::with_capacity(sites.len());
        for r in results {
            out.extend(r?);
        }
        Ok(out)
    }
}

/// Calibrates over `items` on `threads` scoped threads: the items are split into contiguous
/// chunks, each thread feeds its chunk to a fresh [`Calibrator`] with `feed`, and the
/// per-thread calibrators are merged in chunk order (so the result is deterministic for a
/// given thread count, and equal to a sequential pass up to f64 summation order).
///
/// # Errors
/// The first error (in chunk order) returned by `feed`, or by [`Calibrator::new`].
///
/// # Examples
/// ```
/// use projection::{calibrate_parallel, CalibrationConfig, ModelDims, Stream};
/// let dims = ModelDims::new(1, 1, 1, 2)?;
/// let chunks = vec![vec![1.0f32, 0.0], vec![0.0, 1.0], vec![1.0, 1.0]];
/// let cal = calibrate_parallel(dims, CalibrationConfig::default(), &chunks, 2, |cal, x| {
///     cal.observe_qk(0, 1, x, x)
/// })?;
/// assert_eq!(cal.counts(Stream::Qk, 0, 0)?.tokens, 3);
/// # Ok::<(), projection::Error>(())
/// ```
pub fn calibrate_parallel<T, F>(
    dims: ModelDims,
    config: CalibrationConfig,
    items: &[T],
    threads: usize,
    feed: F,
) -> Result<Calibrator>
where
    T: Sync,
    F: Fn(&mut Calibrator, &T) -> Result<()> + Sync,
{
    let base = Calibrator::new(dims, config)?;
    let chunk = items.len().div_ceil(threads.max(1)).max(1);
    let feed = &feed;
    let parts: Vec<Result<Calibrator>> = std::thread::scope(|scope| {
        let handles: Vec<_> = items
            .chunks(chunk)
            .map(|part| {
                let mut cal = base.clone();
                scope.spawn(move || {
                    part.iter().try_for_each(|item| feed(&mut cal, item))?;
                    Ok(cal)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect()
    });
    let mut total = base;
    for part in parts {
        total.merge(&part?)?;
    }
    Ok(total)
}
