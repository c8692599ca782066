//! `swan`: SWAN's hybrid cache (`papers/swan.txt`, method section and Algorithm 1).
//!
//! Keys arrive RoPE'd and are rotated here by `P_QK` (it cannot be absorbed: RoPE is
//! position-dependent); values arrive already rotated (`Ŵ_V = W_V·P_VO` is absorbed into the
//! model, see [`crate::llama::Llama::absorb_vo`]). Each (layer, kv-head) keeps the last `b`
//! rows dense and every older row as its top-`k` magnitude components in CSR form
//! (`kv-sparse`); attention runs directly on the sparse rows with one softmax over history
//! and buffer (`attn-kernels` hybrid kernel). The output is in the rotated value basis, which
//! the absorbed `Ŵ_O` maps back.
//!
//! Rows are stored in the encoding the config names: the paper's `u8` index lists with
//! f32/f16/bf16/fp8 values (CSR rows), or coded rows (`kv-sparse::coded`) — a `d_h`-bit mask
//! instead of the list, and/or int8 / int4 values with one scale per row — which are
//! smaller once `k > d_h/8`.
//!
//! Keys are pruned by SWAN's magnitude rule, or (`select=query`) by magnitude weighted with
//! the queries' energy along each basis vector (`|k̂_j|·√E[q̂_j²]`, from the calibrated
//! basis): a component's expected share of a score rather than its size alone.
//!
//! With `norm=eigen` ([`ComponentNorm`]) each head stores its components (buffer and sparse
//! rows) divided by power-of-two scales from their calibrated energies, so that one row scale
//! (int8/int4 rows) fits small components as well as large ones; queries and outputs are
//! scaled back exactly.
//!
//! With `sink=N` ([`SwanConfig::sink`]) the first `N` positions of every head are kept in
//! `f32` beside the buffer and never evicted: the attention sink, which every later query
//! attends and whose sparse rounding every window would share (not a part of the paper's
//! method; measured by the frontier study).
//!
//! Lossless setting: `k_key = k_value = head_dim` with f32 values and buffer — any
//! orthogonal basis then reproduces dense attention to float rounding, whichever selection
//! and component scaling.

use std::sync::Arc;

use attn_kernels::{
    AttnConfig, CpuAttention, DecodeAttention, EncodedAttention, PrefixedCodedHybrid,
    PrefixedHybrid, WithSink,
};
use kv_sparse::coded::{CodedStore, IndexCode, ValueCode, ValueKind, coded_row_bytes};
use kv_sparse::csr::CsrStore;
use kv_sparse::hybrid::{Hybrid, HybridConfig, MultiHead, RowStore};
use kv_sparse::memory::sparse_row_bytes;
use kv_sparse::persist::{CacheImage, MappedCache};
use kv_sparse::{Value, ValueFormat};
use projection::ProjectionSet;

use super::sink::SinkRows;
use super::{CacheBytes, CacheShape, KvCache, LayerKv, StepQkv};
use crate::error::{Result, invalid};

/// How sparse fp8 values are scaled (`kv-sparse`'s per-head `fp8_scale`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Fp8Scale {
    /// No scale (1.0).
    None,
    /// Per (layer, kv-head, keys|values): the power of two that maps the prompt's largest
    /// magnitude just below 448 (computed at prefill; 1.0 for heads decoded without one).
    Auto,
}

/// How a SWAN row names its kept components.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SwanIndex {
    /// One `u8` per kept component (the paper's encoding; `head_dim ≤ 256`).
    #[default]
    List,
    /// A `head_dim`-bit mask (`⌈d_h/8⌉` bytes whatever `k`).
    Bitmask,
}

impl std::fmt::Display for SwanIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            SwanIndex::List => "list",
            SwanIndex::Bitmask => "bitmask",
        })
    }
}

/// Which components of an evicted key a SWAN cache keeps.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum KeySelect {
    /// The `k` largest `|k̂_j|` (the paper's rule).
    #[default]
    Magnitude,
    /// The `k` largest `|k̂_j|·√E[q̂_j²]`, with the queries' energies the calibrated basis
    /// carries ([`projection::Basis::query_energy`]).
    Query,
}

impl std::fmt::Display for KeySelect {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            KeySelect::Magnitude => "magnitude",
            KeySelect::Query => "query",
        })
    }
}

/// Whether a SWAN cache scales each basis component before storing it.
///
/// In a calibrated basis the components' magnitudes fall steeply with their eigenvalue, so
/// one row scale (int8/int4 values) spends its range on the first few components and rounds
/// the rest coarsely. With [`ComponentNorm::Eigen`] each head stores
/// `x_j / c_j`, `c_j` the power of two nearest `√(λ_j / mean λ)` (clamped to `2^±6`): for
/// keys `λ_j` is the keys' own mean energy along basis vector `j` (recovered from the joint
/// query/key eigenvalue and the queries' energy the calibrated basis stores; the joint
/// eigenvalue where those are missing), for values the VO eigenvalue. The query is
/// multiplied by `c` before scoring and the output by the values' `c` after, which is exact
/// in floating point (powers of two), so attention is unchanged up to the storage code's
/// rounding. Components are still selected
/// by their original magnitudes (the cache passes `c` as selection weights).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ComponentNorm {
    /// Components stored as they are (the paper's setting).
    #[default]
    None,
    /// Components divided by power-of-two scales from their calibrated energies.
    Eigen,
}

impl std::fmt::Display for ComponentNorm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ComponentNorm::None => "none",
            ComponentNorm::Eigen => "eigen",
        })
    }
}

/// The knobs of a SWAN cache.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SwanConfig {
    /// Kept key components per sparse row.
    pub k_key: usize,
    /// Kept value components per sparse row.
    pub k_value: usize,
    /// Dense buffer rows `b`.
    pub buffer: usize,
    /// Index encoding of sparse rows.
    pub index: SwanIndex,
    /// Sparse value code: a float format, or int8 / int4 with one f16 scale per row.
    pub value: ValueKind,
    /// Dense buffer format (`D`).
    pub buffer_format: ValueFormat,
    /// fp8 scaling (ignored for 16/32-bit values).
    pub fp8_scale: Fp8Scale,
    /// How evicted keys are pruned.
    pub key_select: KeySelect,
    /// Whether components are scaled before storage.
    pub norm: ComponentNorm,
    /// Positions kept in `f32` before everything else, never evicted (`0`: none).
    pub sink: usize,
}

impl SwanConfig {
    /// The lossless setting: every component kept, f32 values and buffer.
    pub fn lossless(head_dim: usize, buffer: usize) -> Self {
        Self {
            k_key: head_dim,
            k_value: head_dim,
            buffer,
            index: SwanIndex::List,
            value: ValueKind::Elems(ValueFormat::F32),
            buffer_format: ValueFormat::F32,
            fp8_scale: Fp8Scale::None,
            key_select: KeySelect::Magnitude,
            norm: ComponentNorm::None,
            sink: 0,
        }
    }

    fn hybrid<S: RowStore>(&self, head_dim: usize, scale: Option<(f32, f32)>) -> HybridConfig {
        HybridConfig {
            k_key: self.k_key,
            k_value: self.k_value,
            fp8_scale: scale,
            ..HybridConfig::new(head_dim, self.buffer, 0).for_store::<S>()
        }
    }

    /// Whether sparse values get a per-head fp8 scale fitted at prefill.
    pub fn scaled_fp8(&self) -> bool {
        self.value == ValueKind::Elems(ValueFormat::Fp8E4M3) && self.fp8_scale == Fp8Scale::Auto
    }

    /// Bytes of one sparse token (key row + value row, offsets included, block bases
    /// excluded) for heads of `head_dim`: the per-encoding formula.
    ///
    /// # Examples
    /// ```
    /// use kv_sparse::coded::ValueKind;
    /// use models::cache::{SwanConfig, SwanIndex};
    /// let mut c = SwanConfig::lossless(64, 128);
    /// (c.k_key, c.k_value, c.index, c.value) = (32, 32, SwanIndex::Bitmask, ValueKind::Int8);
    /// assert_eq!(c.sparse_token_bytes(64), 2 * (8 + 32 + 2 + 2));
    /// ```
    pub fn sparse_token_bytes(&self, head_dim: usize) -> usize {
        use kv_sparse::coded::{Bitmask, Int4Values, Int8Values, List};
        let row = |k: usize| match (self.index, self.value) {
            (SwanIndex::List, ValueKind::Elems(f)) => sparse_row_bytes(k, f, 1),
            (SwanIndex::List, ValueKind::Int8) => {
                coded_row_bytes::<List<u8>, Int8Values>(k, head_dim)
            }
            (SwanIndex::List, ValueKind::Int4) => {
                coded_row_bytes::<List<u8>, Int4Values>(k, head_dim)
            }
            (SwanIndex::Bitmask, ValueKind::Elems(f)) => head_dim.div_ceil(8) + k * f.bytes() + 2,
            (SwanIndex::Bitmask, ValueKind::Int8) => {
                coded_row_bytes::<Bitmask, Int8Values>(k, head_dim)
            }
            (SwanIndex::Bitmask, ValueKind::Int4) => {
                coded_row_bytes::<Bitmask, Int4Values>(k, head_dim)
            }
            _ => 0,
        };
        row(self.k_key) + row(self.k_value)
    }
}

/// The first `rows` sparse rows of every head of a reopened cache file, which the cache
/// attends where they are mapped.
#[derive(Clone, Copy, Debug)]
pub struct MappedHistory<'f> {
    /// The validated file.
    pub file: &'f MappedCache,
    /// Rows of each head's sparse history read from the file.
    pub rows: usize,
}

/// A sparse row storage the SWAN cache can attend over: CSR rows through the hybrid
/// kernel, coded rows through the coded-hybrid kernel.
pub trait SwanRows: RowStore {
    /// The (index, value) encoding this storage implements.
    const ENCODING: (SwanIndex, ValueKind);

    /// The persisted-cache image of `heads` (`layers × kv_heads`, layer-major), each
    /// head's history continuing `mapped`'s rows when given (rows borrowed, not copied).
    ///
    /// # Errors
    /// kv-sparse's shape and format errors.
    fn image<'a, D: Value>(
        layers: usize,
        kv_heads: usize,
        heads: &'a [Hybrid<Self, D>],
        mapped: Option<MappedHistory<'a>>,
    ) -> kv_sparse::Result<CacheImage<'a>>;

    /// One head of a validated file as an owned cache holding the rows after the first
    /// `skip` of its sparse history, and its buffer.
    ///
    /// # Errors
    /// [`kv_sparse::Error::FormatMismatch`] for a file of another layout or formats;
    /// [`kv_sparse::Error::OutOfRange`] when `skip` exceeds the head's history.
    fn load<D: Value>(
        file: &MappedCache,
        layer: usize,
        kv_head: usize,
        skip: usize,
    ) -> kv_sparse::Result<Hybrid<Self, D>>;

    /// Rows in the sparse history of one head of a validated file, and the bytes of the
    /// first `rows` of them (block bases, offsets, indices or masks, values, scales).
    ///
    /// # Errors
    /// As [`SwanRows::load`].
    fn file_history<D: Value>(
        file: &MappedCache,
        layer: usize,
        kv_head: usize,
        rows: usize,
    ) -> kv_sparse::Result<(usize, usize)>;

    /// One decode step of a layer over its kv-heads' caches, each continuing the mapped
    /// history when given.
    ///
    /// # Errors
    /// Kernel errors; kv-sparse's errors reading the file.
    ///
    /// `sink` holds each head's `f32` sink rows (keys, values), attended first; empty when
    /// the cache keeps none.
    #[allow(clippy::too_many_arguments)]
    fn attend<D: Value>(
        kernel: &mut CpuAttention,
        cfg: &AttnConfig,
        q: &[f32],
        heads: &[Hybrid<Self, D>],
        mapped: Option<(MappedHistory<'_>, usize)>,
        sink: &[(&[f32], &[f32])],
        out: &mut [f32],
    ) -> attn_kernels::Result<()>;
}

/// Head `h`'s sink rows in `sink`, empty when there are none.
fn sink_of<'a>(sink: &[(&'a [f32], &'a [f32])], h: usize) -> (&'a [f32], &'a [f32]) {
    sink.get(h).copied().unwrap_or((&[], &[]))
}

/// Bytes of block bases, offsets and row data of a borrowed history.
fn table_bytes(bases: &[u64], offsets: &[u16]) -> usize {
    std::mem::size_of_val(bases) + std::mem::size_of_val(offsets)
}

impl<V: Value> SwanRows for CsrStore<u8, V> {
    const ENCODING: (SwanIndex, ValueKind) = (SwanIndex::List, ValueKind::Elems(V::FORMAT));

    fn image<'a, D: Value>(
        layers: usize,
        kv_heads: usize,
        heads: &'a [Hybrid<Self, D>],
        mapped: Option<MappedHistory<'a>>,
    ) -> kv_sparse::Result<CacheImage<'a>> {
        let mut views = Vec::with_capacity(heads.len());
        for (slot, h) in heads.iter().enumerate() {
            let older = match mapped {
                Some(m) => {
                    let v = m.file.view::<u8, V, D>(slot / kv_heads, slot % kv_heads)?;
                    Some((v.sparse_keys.first_rows(m.rows), v.sparse_values.first_rows(m.rows)))
                }
                None => None,
            };
            views.push((*h.config(), older, h.view()));
        }
        CacheImage::csr_continued(layers, kv_heads, &views)
    }

    fn load<D: Value>(
        file: &MappedCache,
        layer: usize,
        kv_head: usize,
        skip: usize,
    ) -> kv_sparse::Result<Hybrid<Self, D>> {
        let view = file.view::<u8, V, D>(layer, kv_head)?;
        Hybrid::<Self, D>::from_view_after(file.config(layer, kv_head)?, view, skip)
    }

    fn file_history<D: Value>(
        file: &MappedCache,
        layer: usize,
        kv_head: usize,
        rows: usize,
    ) -> kv_sparse::Result<(usize, usize)> {
        let v = file.view::<u8, V, D>(layer, kv_head)?;
        let bytes = [v.sparse_keys.first_rows(rows), v.sparse_values.first_rows(rows)]
            .iter()
            .map(|c| {
                table_bytes(c.block_bases(), c.offsets())
                    + std::mem::size_of_val(c.indices())
                    + std::mem::size_of_val(c.values())
            })
            .sum();
        Ok((v.sparse_len(), bytes))
    }

    fn attend<D: Value>(
        kernel: &mut CpuAttention,
        cfg: &AttnConfig,
        q: &[f32],
        heads: &[Hybrid<Self, D>],
        mapped: Option<(MappedHistory<'_>, usize)>,
        sink: &[(&[f32], &[f32])],
        out: &mut [f32],
    ) -> attn_kernels::Result<()> {
        let Some((m, layer)) = mapped else {
            if sink.is_empty() {
                return kernel.hybrid(cfg, q, heads, out);
            }
            let with: Vec<_> = heads
                .iter()
                .enumerate()
                .map(|(h, c)| WithSink { sink: sink_of(sink, h), head: c.view() })
                .collect();
            return kernel.hybrid(cfg, q, &with, out);
        };
        let mut split = Vec::with_capacity(heads.len());
        for (h, c) in heads.iter().enumerate() {
            let v = m.file.view::<u8, V, D>(layer, h)?;
            let prefix = (v.sparse_keys.first_rows(m.rows), v.sparse_values.first_rows(m.rows));
            let head = PrefixedHybrid { prefix, view: c.view() };
            split.push(WithSink { sink: sink_of(sink, h), head });
        }
        kernel.hybrid(cfg, q, &split, out)
    }
}

impl<X: IndexCode, Y: ValueCode> SwanRows for CodedStore<X, Y> {
    const ENCODING: (SwanIndex, ValueKind) = (
        match X::KIND {
            kv_sparse::coded::IndexKind::Bitmask => SwanIndex::Bitmask,
            _ => SwanIndex::List,
        },
        Y::KIND,
    );

    fn image<'a, D: Value>(
        layers: usize,
        kv_heads: usize,
        heads: &'a [Hybrid<Self, D>],
        mapped: Option<MappedHistory<'a>>,
    ) -> kv_sparse::Result<CacheImage<'a>> {
        let mut views = Vec::with_capacity(heads.len());
        for (slot, h) in heads.iter().enumerate() {
            let older = match mapped {
                Some(m) => {
                    let v = m.file.coded_view::<X, Y, D>(slot / kv_heads, slot % kv_heads)?;
                    Some((v.sparse_keys.first_rows(m.rows), v.sparse_values.first_rows(m.rows)))
                }
                None => None,
            };
            views.push((*h.config(), older, h.view()));
        }
        CacheImage::coded_continued(layers, kv_heads, &views)
    }

    fn load<D: Value>(
        file: &MappedCache,
        layer: usize,
        kv_head: usize,
        skip: usize,
    ) -> kv_sparse::Result<Hybrid<Self, D>> {
        let view = file.coded_view::<X, Y, D>(layer, kv_head)?;
        Hybrid::<Self, D>::from_view_after(file.config(layer, kv_head)?, view, skip)
    }

    fn file_history<D: Value>(
        file: &MappedCache,
        layer: usize,
        kv_head: usize,
        rows: usize,
    ) -> kv_sparse::Result<(usize, usize)> {
        let v = file.coded_view::<X, Y, D>(layer, kv_head)?;
        let bytes = [v.sparse_keys.first_rows(rows), v.sparse_values.first_rows(rows)]
            .iter()
            .map(|c| table_bytes(c.block_bases(), c.offsets()) + c.bytes().len())
            .sum();
        Ok((v.sparse_len(), bytes))
    }

    fn attend<D: Value>(
        kernel: &mut CpuAttention,
        cfg: &AttnConfig,
        q: &[f32],
        heads: &[Hybrid<Self, D>],
        mapped: Option<(MappedHistory<'_>, usize)>,
        sink: &[(&[f32], &[f32])],
        out: &mut [f32],
    ) -> attn_kernels::Result<()> {
        let Some((m, layer)) = mapped else {
            if sink.is_empty() {
                return kernel.coded_hybrid(cfg, q, heads, out);
            }
            let with: Vec<_> = heads
                .iter()
                .enumerate()
                .map(|(h, c)| WithSink { sink: sink_of(sink, h), head: c.view() })
                .collect();
            return kernel.coded_hybrid(cfg, q, &with, out);
        };
        let mut split = Vec::with_capacity(heads.len());
        for (h, c) in heads.iter().enumerate() {
            let v = m.file.coded_view::<X, Y, D>(layer, h)?;
            let prefix = (v.sparse_keys.first_rows(m.rows), v.sparse_values.first_rows(m.rows));
            let head = PrefixedCodedHybrid { prefix, view: c.view() };
            split.push(WithSink { sink: sink_of(sink, h), head });
        }
        kernel.coded_hybrid(cfg, q, &split, out)
    }
}

/// A reopened file a SWAN cache reads the oldest history rows of every head from.
struct Reopened {
    file: Arc<MappedCache>,
    /// Rows of each head's sparse history read from the file.
    rows: usize,
    /// Their bytes over all heads (block tables, indices or masks, values, scales).
    bytes: usize,
}

/// Power-of-two component scales of every (layer, kv-head) ([`ComponentNorm::Eigen`]).
struct ComponentScales {
    /// Elements per head.
    d: usize,
    /// Kv-heads per layer.
    kv_heads: usize,
    /// Key scales `c_j`, `[layers, kv_heads, d]`.
    keys: Vec<f32>,
    /// Value scales `c_j`, `[layers, kv_heads, d]`.
    values: Vec<f32>,
}

impl ComponentScales {
    /// Largest `|log2 c_j|`: stored components grow by at most `2^6`.
    const MAX_EXPONENT: f64 = 6.0;

    /// The scales of `set`'s QK and VO bases: from the keys' own energy along each QK basis
    /// vector where the basis carries the queries' ([`key_energy`]), else from the joint
    /// eigenvalues; from the joint eigenvalues for VO.
    ///
    /// # Errors
    /// [`crate::Error::InvalidInput`] when a basis carries no eigenvalues (a data-free basis
    /// or an ablation); projection errors for a set of other dimensions.
    fn new(set: &ProjectionSet, layers: usize, kv_heads: usize, d: usize) -> Result<Self> {
        let mut out = Self { d, kv_heads, keys: Vec::new(), values: Vec::new() };
        let missing = || {
            invalid(
                "swan cache",
                format!(
                    "norm=eigen needs the basis' eigenvalues, which this {} basis does not \
                     carry (use a calibrated basis)",
                    set.provenance().kind
                ),
            )
        };
        for layer in 0..layers {
            for h in 0..kv_heads {
                let qk = set.basis(projection::Stream::Qk, layer, h)?;
                let ev = qk.eigenvalues().ok_or_else(missing)?;
                match key_energy(set, qk) {
                    Some(energy) => out.keys.extend(Self::pow2(&energy)),
                    None => out.keys.extend(Self::pow2(ev)),
                }
                let vo = set.basis(projection::Stream::Vo, layer, h)?;
                out.values.extend(Self::pow2(vo.eigenvalues().ok_or_else(missing)?));
            }
        }
        Ok(out)
    }

    /// `2^round(log2 √(λ_j / mean λ))`, the exponent clamped to `±MAX_EXPONENT`; all 1 when
    /// the eigenvalues carry no energy.
    fn pow2(eigenvalues: &[f64]) -> Vec<f32> {
        let mean = eigenvalues.iter().map(|l| l.max(0.0)).sum::<f64>() / eigenvalues.len() as f64;
        eigenvalues
            .iter()
            .map(move |&l| {
                if !(mean > 0.0 && mean.is_finite()) {
                    return 1.0;
                }
                let e = (0.5 * (l.max(0.0) / mean).log2()).round();
                let e = e.clamp(-Self::MAX_EXPONENT, Self::MAX_EXPONENT);
                2f64.powi(e as i32) as f32
            })
            .collect()
    }

    fn keys(&self, layer: usize, h: usize) -> &[f32] {
        let at = (layer * self.kv_heads + h) * self.d;
        &self.keys[at..at + self.d]
    }

    fn values(&self, layer: usize, h: usize) -> &[f32] {
        let at = (layer * self.kv_heads + h) * self.d;
        &self.values[at..at + self.d]
    }
}

/// The keys' own mean energy `E[k̂_j²]` along each vector of a calibrated QK basis: its
/// eigenvalue is the weighted mean `λ_j = (g·w_q·E[q̂_j²] + w_k·E[k̂_j²]) / (g·w_q + w_k)` of
/// the `g` query heads' and the key's energies (the calibration's weighting, per vector), and
/// the basis carries `E[q̂_j²]`. `None` without query energies or a recorded weighting.
fn key_energy(set: &ProjectionSet, basis: &projection::Basis) -> Option<Vec<f64>> {
    let (ev, queries) = (basis.eigenvalues()?, basis.query_energy()?);
    let config = set.provenance().config?;
    let g = set.dims().q_heads() / set.dims().kv_heads();
    let (wq, wk) = config.weighting(projection::Stream::Qk).weights(g);
    let gq = g as f64 * wq;
    (wk > 0.0).then(|| {
        ev.iter().zip(queries).map(|(l, q)| (((gq + wk) * l - gq * q) / wk).max(0.0)).collect()
    })
}

/// Divides each `c.len()`-wide row of `rows` by `c` (exact: powers of two).
fn divide_rows(rows: &mut [f32], c: &[f32]) {
    for row in rows.chunks_exact_mut(c.len()) {
        for (x, s) in row.iter_mut().zip(c) {
            *x /= s;
        }
    }
}

/// Multiplies each `c.len()`-wide row of `rows` by `c` (exact: powers of two).
fn multiply_rows(rows: &mut [f32], c: &[f32]) {
    for row in rows.chunks_exact_mut(c.len()) {
        for (x, s) in row.iter_mut().zip(c) {
            *x *= s;
        }
    }
}

/// SWAN's hybrid cache for a whole model (sparse rows in `S`, buffer `D`).
pub struct SwanCache<S: SwanRows, D: Value> {
    shape: CacheShape,
    cfg: SwanConfig,
    kernel: CpuAttention,
    set: Arc<ProjectionSet>,
    caches: MultiHead<S, D>,
    /// The reopened file whose rows precede `caches`' own histories, if any.
    reopened: Option<Reopened>,
    q_rot: Vec<f32>,
    k_rot: Vec<f32>,
    prefill_rot: Vec<f32>,
    /// Component scales (`norm=eigen`), if any.
    norm: Option<ComponentScales>,
    /// Scaled values of one step or prefill (`norm=eigen` only).
    v_scaled: Vec<f32>,
    /// The first positions of every head, in `f32` as stored (rotated, scaled).
    sink: SinkRows,
}

impl<S: SwanRows, D: Value> SwanCache<S, D> {
    /// An empty cache rotating with `set` (which must match `shape`), attention on
    /// `threads` threads.
    ///
    /// # Errors
    /// [`crate::Error::InvalidInput`] if `set` was built for other dimensions or the formats
    /// differ from `S`/`D`; [`crate::Error::Sparse`] for an invalid `k` or buffer;
    /// [`crate::Error::Attention`] for a bad layout or thread count.
    pub fn new(
        shape: CacheShape,
        cfg: SwanConfig,
        set: Arc<ProjectionSet>,
        threads: usize,
    ) -> Result<Self> {
        shape.check_projection("swan cache", set.dims())?;
        if ((cfg.index, cfg.value), cfg.buffer_format) != (S::ENCODING, D::FORMAT) {
            return Err(invalid(
                "swan cache",
                format!("config formats {:?} do not match the cache type", cfg),
            ));
        }
        let caches = MultiHead::new(
            shape.layers,
            shape.kv_heads(),
            cfg.hybrid::<S>(shape.head_dim(), None),
        )?;
        let norm = match cfg.norm {
            ComponentNorm::None => None,
            ComponentNorm::Eigen => {
                Some(ComponentScales::new(&set, shape.layers, shape.kv_heads(), shape.head_dim())?)
            }
        };
        let mut cache = Self {
            shape,
            cfg,
            kernel: CpuAttention::new(threads)?,
            set,
            caches,
            reopened: None,
            q_rot: vec![0.0; shape.q_heads() * shape.head_dim()],
            k_rot: vec![0.0; shape.kv_heads() * shape.head_dim()],
            prefill_rot: Vec::new(),
            norm,
            v_scaled: Vec::new(),
            sink: SinkRows::new(shape.layers * shape.kv_heads()),
        };
        cache.sink.positions = cfg.sink;
        for layer in 0..shape.layers {
            for h in 0..shape.kv_heads() {
                cache.select_components(layer, h)?;
            }
        }
        Ok(cache)
    }

    /// Gives head (`layer`, `h`) the component selection of the config: with
    /// [`KeySelect::Query`], key weights `√E[q̂_j²]` from the basis' query energies; with
    /// [`ComponentNorm::Eigen`], the component scales as weights (times those), so that rows
    /// stored divided by them keep the components of largest original magnitude.
    ///
    /// # Errors
    /// [`crate::Error::InvalidInput`] when the basis carries no query energies (an ablation,
    /// a data-free basis, or a file calibrated before they were stored) or they are all 0.
    fn select_components(&mut self, layer: usize, h: usize) -> Result<()> {
        let mut keys = None;
        if self.cfg.key_select == KeySelect::Query {
            let basis = self.set.basis(projection::Stream::Qk, layer, h)?;
            let energy = basis.query_energy().ok_or_else(|| {
                invalid(
                    "swan cache",
                    format!(
                        "select=query needs the queries' energy per basis vector, which this {} \
                         basis does not carry (calibrate it again with `kvtide calibrate`)",
                        self.set.provenance().kind
                    ),
                )
            })?;
            keys = Some(energy.iter().map(|&e| e.sqrt() as f32).collect::<Vec<f32>>());
        }
        let mut values = None;
        if let Some(n) = &self.norm {
            let c = n.keys(layer, h);
            keys = Some(match keys {
                Some(w) => w.iter().zip(c).map(|(w, c)| w * c).collect(),
                None => c.to_vec(),
            });
            values = Some(n.values(layer, h).to_vec());
        }
        if keys.is_none() && values.is_none() {
            return Ok(());
        }
        let head = self
            .caches
            .head_mut(layer, h)
            .ok_or_else(|| invalid("swan cache", "head out of range"))?;
        head.set_key_weights(keys.as_deref())?;
        head.set_value_weights(values.as_deref())?;
        Ok(())
    }

    /// Stores a prefill of `tokens` positions of `layer` — rotated keys in `prefill_rot`,
    /// `values` as stored, both `[kv_heads, tokens, d]`: positions still inside the sink to
    /// it, the others to the hybrid caches. Nothing is stored on error.
    fn store_prefill(&mut self, layer: usize, tokens: usize, values: &[f32]) -> Result<()> {
        let (d, kv_heads) = (self.shape.head_dim(), self.shape.kv_heads());
        let first = layer * kv_heads;
        let to_sink = self.sink.takes(first, tokens, d);
        if to_sink == 0 {
            return Ok(self.caches.extend_layer(layer, &self.prefill_rot, values)?);
        }
        let n = tokens * d;
        let (split, rest) = (to_sink * d, (tokens - to_sink) * d);
        let (mut keys, mut vals) = (Vec::with_capacity(kv_heads * rest), Vec::new());
        vals.reserve(kv_heads * rest);
        for h in 0..kv_heads {
            let (k, v) = (&self.prefill_rot[h * n..(h + 1) * n], &values[h * n..(h + 1) * n]);
            SinkRows::check("swan prefill", &k[..split], &v[..split])?;
            keys.extend_from_slice(&k[split..]);
            vals.extend_from_slice(&v[split..]);
        }
        if rest > 0 {
            self.caches.extend_layer(layer, &keys, &vals)?;
        }
        for h in 0..kv_heads {
            let (k, v) = (&self.prefill_rot[h * n..h * n + split], &values[h * n..h * n + split]);
            self.sink.push(first + h, k, v);
        }
        Ok(())
    }

    /// The reopened file's rows this cache attends where they are mapped, if any.
    fn mapped(&self) -> Option<MappedHistory<'_>> {
        self.reopened.as_ref().map(|r| MappedHistory { file: &r.file, rows: r.rows })
    }

    /// Replaces the empty caches of `layer` by ones whose fp8 scales fit the rotated keys
    /// in `prefill_rot` and `values` (as stored: both `[kv_heads, tokens, d]`).
    fn rescale(&mut self, layer: usize, values: &[f32]) -> Result<()> {
        if self.reopened.is_some() {
            return Err(invalid("swan prefill", "the cache continues a reopened file"));
        }
        let n = values.len() / self.shape.kv_heads();
        for h in 0..self.shape.kv_heads() {
            let max = |x: &[f32]| x.iter().fold(0f32, |m, v| m.max(v.abs()));
            let ks = kv_sparse::fp8::scale_for_max_abs(max(&self.prefill_rot[h * n..(h + 1) * n]))?;
            let vs = kv_sparse::fp8::scale_for_max_abs(max(&values[h * n..(h + 1) * n]))?;
            let head = self
                .caches
                .head_mut(layer, h)
                .ok_or_else(|| invalid("swan prefill", "head out of range"))?;
            if !head.is_empty() {
                return Err(invalid("swan prefill", format!("layer {layer} already holds tokens")));
            }
            *head = Hybrid::new(self.cfg.hybrid::<S>(self.shape.head_dim(), Some((ks, vs))))?;
            self.select_components(layer, h)?;
        }
        Ok(())
    }
}

impl<S: SwanRows, D: Value> KvCache for SwanCache<S, D> {
    fn thread_pool(&self) -> Option<&attn_kernels::ThreadPool> {
        Some(self.kernel.pool())
    }

    fn int8_keys(&self) -> bool {
        S::ENCODING.1 == kv_sparse::coded::ValueKind::Int8
    }

    fn set_query_precision(&mut self, precision: attn_kernels::QueryPrecision) -> Result<()> {
        if precision == attn_kernels::QueryPrecision::Int8 && !self.int8_keys() {
            return Err(super::no_int8_keys(&self.label()));
        }
        Ok(self.kernel.set_query_precision(precision)?)
    }

    fn label(&self) -> String {
        let c = &self.cfg;
        let scale = if c.scaled_fp8() { " scaled" } else { "" };
        let index = if c.index == SwanIndex::Bitmask { " bitmask" } else { "" };
        let select = if c.key_select == KeySelect::Query { " select=query" } else { "" };
        let norm = if c.norm == ComponentNorm::Eigen { " norm=eigen" } else { "" };
        format!(
            "swan k={}/{}{index} {}{scale} b={} ({}) basis={}{select}{norm}{}{}",
            c.k_key,
            c.k_value,
            c.value,
            c.buffer,
            D::FORMAT,
            self.set.provenance().kind,
            self.sink.label(),
            super::queries_label(&self.kernel),
        )
    }

    fn shape(&self) -> CacheShape {
        self.shape
    }

    fn len(&self) -> usize {
        let mapped = self.reopened.as_ref().map_or(0, |r| r.rows);
        let last = self.shape.layers - 1;
        let sink = self.sink.held(last * self.shape.kv_heads(), self.shape.head_dim());
        self.caches.layer_len(last).unwrap_or(0) + mapped + sink
    }

    fn reserve(&mut self, tokens: usize) -> Result<()> {
        for l in 0..self.shape.layers {
            for h in 0..self.shape.kv_heads() {
                if let Some(c) = self.caches.head_mut(l, h) {
                    c.reserve(tokens);
                }
            }
        }
        Ok(())
    }

    fn prefill(&mut self, layer: usize, kv: LayerKv<'_>) -> Result<()> {
        self.shape.check_prefill(layer, &kv)?;
        let (d, n) = (self.shape.head_dim(), kv.tokens * self.shape.head_dim());
        self.prefill_rot.resize(kv.keys.len(), 0.0);
        for h in 0..self.shape.kv_heads() {
            let p = self.set.qk(layer, h)?;
            projection::rotate_rows(
                &kv.keys[h * n..(h + 1) * n],
                p,
                &mut self.prefill_rot[h * n..(h + 1) * n],
            )?;
        }
        let mut scaled = std::mem::take(&mut self.v_scaled);
        if let Some(c) = &self.norm {
            scaled.clear();
            scaled.extend_from_slice(kv.values);
            for h in 0..self.shape.kv_heads() {
                divide_rows(&mut self.prefill_rot[h * n..(h + 1) * n], c.keys(layer, h));
                divide_rows(&mut scaled[h * n..(h + 1) * n], c.values(layer, h));
            }
        }
        let values = if self.norm.is_some() { &scaled[..] } else { kv.values };
        let stored = match self.cfg.scaled_fp8() {
            true => self.rescale(layer, values),
            false => Ok(()),
        };
        debug_assert_eq!(self.prefill_rot.len() % d, 0);
        let stored = stored.and_then(|()| self.store_prefill(layer, kv.tokens, values));
        self.v_scaled = scaled;
        stored
    }

    fn decode(&mut self, layer: usize, step: StepQkv<'_>, out: &mut [f32]) -> Result<()> {
        self.shape.check_step(layer, &step, out)?;
        self.set.rotate_qk_into(layer, 1, step.q, step.k, &mut self.q_rot, &mut self.k_rot)?;
        let (d, kv_heads) = (self.shape.head_dim(), self.shape.kv_heads());
        let group = self.shape.q_heads() / kv_heads;
        if let Some(c) = &self.norm {
            self.v_scaled.clear();
            self.v_scaled.extend_from_slice(step.v);
            for h in 0..kv_heads {
                divide_rows(&mut self.k_rot[h * d..(h + 1) * d], c.keys(layer, h));
                divide_rows(&mut self.v_scaled[h * d..(h + 1) * d], c.values(layer, h));
                let queries = &mut self.q_rot[h * group * d..(h + 1) * group * d];
                multiply_rows(queries, c.keys(layer, h));
            }
        }
        let values = if self.norm.is_some() { &self.v_scaled[..] } else { step.v };
        let first = layer * kv_heads;
        if self.sink.takes(first, 1, d) == 1 {
            SinkRows::check("swan decode", &self.k_rot, values)?;
            for h in 0..kv_heads {
                let row = h * d..(h + 1) * d;
                self.sink.push(first + h, &self.k_rot[row.clone()], &values[row]);
            }
        } else {
            self.caches.append_token(layer, &self.k_rot, values)?;
        }
        let heads =
            self.caches.layer(layer).ok_or_else(|| invalid("swan decode", "layer out of range"))?;
        let mapped =
            self.reopened.as_ref().map(|r| (MappedHistory { file: &r.file, rows: r.rows }, layer));
        let sink: Vec<(&[f32], &[f32])> = match self.sink.positions {
            0 => Vec::new(),
            _ => (first..first + kv_heads).map(|s| self.sink.all(s)).collect(),
        };
        S::attend(&mut self.kernel, &self.shape.attn, &self.q_rot, heads, mapped, &sink, out)?;
        if let Some(c) = &self.norm {
            for h in 0..kv_heads {
                multiply_rows(&mut out[h * group * d..(h + 1) * group * d], c.values(layer, h));
            }
        }
        Ok(())
    }

    fn stats(&self) -> Vec<(&'static str, f64)> {
        let d = self.shape.head_dim();
        let (s, c) = (&self.shape, &self.cfg);
        let plain = super::Footprint::plain(s, c.sparse_token_bytes(d) as f64);
        let buffered = plain.with_buffer(s, c.buffer, 2 * d * c.buffer_format.bytes());
        buffered.with_sink(s, self.sink.positions).stats()
    }

    /// The rows read from a reopened file count as resident: attention reads them every
    /// step (from the page cache).
    fn bytes(&self) -> CacheBytes {
        let mapped = self.reopened.as_ref().map_or(0, |r| r.bytes);
        let held = self.caches.memory().held_bytes() + self.sink.held_bytes();
        CacheBytes { resident: held + mapped, offloaded: 0 }
    }

    fn projection(&self) -> Option<&ProjectionSet> {
        Some(&self.set)
    }

    fn image(&self) -> Result<CacheImage<'_>> {
        if self.sink.positions > 0 {
            return Err(crate::Error::NotPersistable { op: "save cache", cache: self.label() });
        }
        let (layers, kv) = (self.shape.layers, self.shape.kv_heads());
        Ok(S::image(layers, kv, self.caches.heads(), self.mapped())?)
    }

    /// Keeps `file` and attends each head's sparse history where it is mapped: only the
    /// buffer rows and the last few history rows (fewer than a tile or CSR block — what
    /// [`CpuAttention::exact_prefix_rows`] leaves, so that attention over the split
    /// history is bit for bit that over one contiguous history) are copied into the
    /// owned stores that decoding appends to. Every head is validated before the cache
    /// changes.
    fn load_image(&mut self, file: &Arc<MappedCache>) -> Result<()> {
        const OP: &str = "swan cache load";
        if self.sink.positions > 0 {
            return Err(crate::Error::NotPersistable { op: "load cache", cache: self.label() });
        }
        let (s, d) = (self.shape, self.shape.head_dim());
        file.check_shape(s.layers, s.kv_heads(), d)?;
        super::persist::common_tokens(OP, file)?;
        // Every head on every attention thread at once; the loop below then reads checked heads.
        file.validate_all_on(self.kernel.threads())?;
        let (rows, _) = S::file_history::<D>(file, 0, 0, 0)?;
        let want = self.cfg.hybrid::<S>(d, None);
        let skip = CpuAttention::exact_prefix_rows(rows, want.rows_per_block);
        let (mut heads, mut bytes) = (Vec::with_capacity(s.layers * s.kv_heads()), 0);
        for slot in 0..s.layers * s.kv_heads() {
            let (l, h) = (slot / s.kv_heads(), slot % s.kv_heads());
            let (got_rows, b) = S::file_history::<D>(file, l, h, skip)?;
            if got_rows != rows {
                return Err(invalid(
                    OP,
                    format!("head {slot} holds {got_rows} history rows, head 0 {rows}"),
                ));
            }
            let head = S::load::<D>(file, l, h, skip)?;
            let got = *head.config();
            let scale = if self.cfg.scaled_fp8() { got.fp8_scale } else { None };
            let want = self.cfg.hybrid::<S>(d, scale);
            if got != want {
                return Err(invalid(
                    OP,
                    format!("head {slot} was written with {got:?}, this cache uses {want:?}"),
                ));
            }
            heads.push(head);
            bytes += b;
        }
        let previous = std::mem::replace(
            &mut self.caches,
            MultiHead::from_heads(s.layers, s.kv_heads(), heads)?,
        );
        // The selection weights are a write-time policy, not part of the file.
        for slot in 0..s.layers * s.kv_heads() {
            if let Err(e) = self.select_components(slot / s.kv_heads(), slot % s.kv_heads()) {
                self.caches = previous;
                return Err(e);
            }
        }
        self.reopened = (skip > 0).then(|| Reopened { file: Arc::clone(file), rows: skip, bytes });
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use projection::{CalibrationConfig, Calibrator, ModelDims, Stream, Weighting};

    /// The keys' energy recovered from a joint eigenvalue and the queries' energy equals the
    /// keys' mean squared projection on each basis vector, for each weighting.
    #[test]
    fn key_energy_is_the_keys_own_energy_along_each_basis_vector() {
        let (q_heads, kv_heads, d, n) = (4, 2, 8, 40);
        let dims = ModelDims::new(1, q_heads, kv_heads, d).unwrap();
        let val = |i: usize, s: f32| (i as f32 * 0.37 + s).sin() * (1 + i % d) as f32;
        let queries: Vec<f32> = (0..n * q_heads * d).map(|i| val(i, 0.3)).collect();
        let keys: Vec<f32> = (0..n * kv_heads * d).map(|i| 0.5 * val(i, 1.7)).collect();
        let values: Vec<f32> = (0..n * kv_heads * d).map(|i| val(i, 2.9)).collect();
        let outs: Vec<f32> = (0..n * q_heads * d).map(|i| val(i, 4.1)).collect();
        for qk in [
            Weighting::Balanced,
            Weighting::Stacked,
            Weighting::Custom { query_side: 0.3, kv_side: 2.0 },
        ] {
            let config = CalibrationConfig { qk, vo: Weighting::Balanced };
            let mut cal = Calibrator::new(dims, config).unwrap();
            cal.observe_qk(0, n, &queries, &keys).unwrap();
            cal.observe_vo(0, n, &values, &outs).unwrap();
            let set = cal.finish("test").unwrap();
            for h in 0..kv_heads {
                let basis = set.basis(Stream::Qk, 0, h).unwrap();
                let got = key_energy(&set, basis).unwrap();
                let p = basis.matrix();
                for (j, g) in got.iter().enumerate() {
                    let col = p.column(j);
                    let want = (0..n)
                        .map(|t| {
                            let k = &keys[(t * kv_heads + h) * d..][..d];
                            let x: f64 = k.iter().zip(&col).map(|(a, b)| (a * b) as f64).sum();
                            x * x
                        })
                        .sum::<f64>()
                        / n as f64;
                    assert!(
                        (g - want).abs() <= 1e-4 * want.max(1.0),
                        "{qk:?} head {h} j {j}: {g} vs {want}"
                    );
                }
            }
        }
    }
}
