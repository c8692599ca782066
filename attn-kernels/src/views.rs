//! Borrowed inputs of the decode kernels, one per kv-head: dense rows ([`DenseKv`]), CSR
//! rows ([`SparseKv`]), SWAN's hybrid cache (method section; any [`HybridSource`], e.g.
//! `kv-sparse`'s `HybridView` or `HybridCache`) and WnW's resident-position lists (§2.3;
//! [`GatheredKv`], with SWAN fp8 rows in [`GatheredSparseKv`] or rows of per-row codes —
//! TurboQuant-style, per-token groups — in [`GatheredCodedKv`]).
//!
//! All are plain borrowed slices (row-major, `head_dim` elements per row), so in-memory,
//! memory-mapped and tiered stores hand their bytes over without copying; the kernels
//! validate them ([`crate::Error`]) before reading a row.

use kv_sparse::coded::{CodedView, IndexCode, ValueCode};
use kv_sparse::csr::CsrView;
use kv_sparse::decoded::{DecodeRows, RowCodes};
use kv_sparse::hybrid::{CodedHybridCache, CodedHybridView, HybridCache, HybridView};
use kv_sparse::quant::{DenseCodec, QuantView};
use kv_sparse::{SparseIndex, Value};

/// Dense keys and values of one kv-head, in token order: each side is an
/// `(older, newer)` pair of row-major slices (a ring buffer's two halves; use an empty
/// `newer` for a contiguous cache). Keys and values may split at different rows.
#[derive(Debug)]
pub struct DenseKv<'a, D> {
    /// Elements per row.
    pub head_dim: usize,
    /// Key rows: `older` then `newer`.
    pub keys: (&'a [D], &'a [D]),
    /// Value rows: `older` then `newer`.
    pub values: (&'a [D], &'a [D]),
}

impl<D> Clone for DenseKv<'_, D> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<D> Copy for DenseKv<'_, D> {}

impl<'a, D: Value> DenseKv<'a, D> {
    /// A contiguous cache: `keys` and `values` each hold `rows · head_dim` elements.
    ///
    /// # Examples
    /// ```
    /// let k = [1.0f32, 0.0, 0.0, 1.0];
    /// let kv = attn_kernels::DenseKv::new(2, &k, &k);
    /// assert_eq!(kv.num_rows(), 2);
    /// ```
    pub fn new(head_dim: usize, keys: &'a [D], values: &'a [D]) -> Self {
        Self { head_dim, keys: (keys, &[]), values: (values, &[]) }
    }

    /// Key rows (whole rows only; validation reports ragged slices).
    pub fn num_rows(&self) -> usize {
        (self.keys.0.len() + self.keys.1.len()).checked_div(self.head_dim).unwrap_or(0)
    }
}

/// CSR keys and values of one kv-head (`kv-sparse` views: in-memory or mapped), with the
/// per-head scales that multiply decoded keys / values (fp8 scaling; 1.0 otherwise).
#[derive(Debug)]
pub struct SparseKv<'a, I, V> {
    /// Sparse key rows.
    pub keys: CsrView<'a, I, V>,
    /// Sparse value rows (same number of rows as `keys`; `k` may differ).
    pub values: CsrView<'a, I, V>,
    /// Multiplies every decoded key value.
    pub key_scale: f32,
    /// Multiplies every decoded value value.
    pub value_scale: f32,
}

impl<I, V> Clone for SparseKv<'_, I, V> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<I, V> Copy for SparseKv<'_, I, V> {}

impl<'a, I: SparseIndex, V: Value> SparseKv<'a, I, V> {
    /// Unscaled keys and values.
    pub fn new(keys: CsrView<'a, I, V>, values: CsrView<'a, I, V>) -> Self {
        Self { keys, values, key_scale: 1.0, value_scale: 1.0 }
    }

    /// Rows (tokens).
    pub fn num_rows(&self) -> usize {
        self.keys.num_rows()
    }
}

/// Sparse key and value rows older than a hybrid view's own history (see
/// [`HybridSource::history_prefix`]).
pub type HistoryPrefix<'a, I, V> = (CsrView<'a, I, V>, CsrView<'a, I, V>);

/// Coded key and value rows older than a coded hybrid view's own history (see
/// [`CodedHybridSource::history_prefix`]).
pub type CodedHistoryPrefix<'a, X, Y> = (CodedView<'a, X, Y>, CodedView<'a, X, Y>);

/// Anything that lends a `kv-sparse` hybrid view of one kv-head: the view itself, or a
/// `HybridCache` (so a layer's `&[HybridCache]` from `MultiHeadCache::layer` goes straight
/// into [`crate::DecodeAttention::hybrid`] without collecting views).
pub trait HybridSource<I, V, D>: Sync {
    /// The borrowed view the kernels read.
    fn hybrid_view(&self) -> HybridView<'_, I, V, D>;

    /// Sparse key and value rows older than the view's own sparse history, attended first
    /// in the same softmax and scaled by the view's `value_scale`: e.g. the history of a
    /// reopened cache read where it is mapped, while the rows evicted since grow in memory.
    /// `None` (the default) for a single history.
    fn history_prefix(&self) -> Option<HistoryPrefix<'_, I, V>> {
        None
    }

    /// `f32` key and value rows (row-major, `head_dim` wide) attended before everything
    /// else in the same softmax, unscaled: positions a cache keeps in full whatever it does
    /// with the rest (the attention sink). Empty (the default) for none.
    fn sink_rows(&self) -> (&[f32], &[f32]) {
        (&[], &[])
    }
}

impl<I: SparseIndex, V: Value, D: Value> HybridSource<I, V, D> for HybridView<'_, I, V, D> {
    fn hybrid_view(&self) -> HybridView<'_, I, V, D> {
        *self
    }
}

impl<I: SparseIndex, V: Value, D: Value> HybridSource<I, V, D> for HybridCache<I, V, D> {
    fn hybrid_view(&self) -> HybridView<'_, I, V, D> {
        self.view()
    }
}

/// A hybrid view whose sparse history continues older rows held elsewhere: `prefix`
/// (keys, values) are the oldest tokens, then `view`'s sparse rows and buffer, all in one
/// softmax with `view`'s scales. This is how a cache reopened from a mapped file attends
/// the file's history where it lies while the rows evicted since grow in memory.
///
/// The CPU kernels give bit-for-bit the output of one contiguous history when the
/// prefix holds whole tiles and whole CSR blocks
/// ([`crate::CpuAttention::exact_prefix_rows`]: their tiles then break where a
/// contiguous history's do); otherwise the output differs by float rounding only.
///
/// # Examples
/// ```
/// use attn_kernels::{AttnConfig, CpuAttention, DecodeAttention, PrefixedHybrid};
/// use kv_sparse::hybrid::{HybridCache, HybridConfig};
/// let d = 4;
/// let mut whole = HybridCache::<u8, f32, f32>::new(HybridConfig::new(d, 1, d))?;
/// for t in 0..5 {
///     whole.append(&[t as f32, 1.0, -1.0, 0.5], &[1.0, t as f32, 0.0, 2.0])?;
/// }
/// // The same history split after its first 2 rows: those stay in `whole`'s store.
/// let view = whole.view();
/// let cfg = *whole.config();
/// let rest = HybridCache::from_view_after(cfg, view, 2)?;
/// let split = PrefixedHybrid {
///     prefix: (view.sparse_keys.first_rows(2), view.sparse_values.first_rows(2)),
///     view: rest.view(),
/// };
/// let attn = AttnConfig::new(1, 1, d)?;
/// let q = [0.3, -0.2, 0.5, 1.0];
/// let (mut a, mut b) = ([0.0; 4], [0.0; 4]);
/// let mut kernel = CpuAttention::new(1)?;
/// kernel.hybrid(&attn, &q, &[whole.view()], &mut a)?;
/// kernel.hybrid(&attn, &q, &[split], &mut b)?;
/// assert!(a.iter().zip(&b).all(|(x, y)| (x - y).abs() < 1e-6));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct PrefixedHybrid<'a, I, V, D> {
    /// The oldest sparse key and value rows.
    pub prefix: HistoryPrefix<'a, I, V>,
    /// The rows after them: sparse history, then buffer.
    pub view: HybridView<'a, I, V, D>,
}

impl<I, V, D> Clone for PrefixedHybrid<'_, I, V, D> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<I, V, D> Copy for PrefixedHybrid<'_, I, V, D> {}

impl<I: SparseIndex, V: Value, D: Value> HybridSource<I, V, D> for PrefixedHybrid<'_, I, V, D> {
    fn hybrid_view(&self) -> HybridView<'_, I, V, D> {
        self.view
    }

    fn history_prefix(&self) -> Option<HistoryPrefix<'_, I, V>> {
        Some(self.prefix)
    }
}

/// A coded hybrid view whose sparse history continues older coded rows held elsewhere
/// (see [`PrefixedHybrid`]; coded tiles do not end at blocks, so a prefix of whole tiles
/// already attends bit for bit as the contiguous history).
#[derive(Debug)]
pub struct PrefixedCodedHybrid<'a, X, Y, D> {
    /// The oldest sparse key and value rows.
    pub prefix: CodedHistoryPrefix<'a, X, Y>,
    /// The rows after them: sparse history, then buffer.
    pub view: CodedHybridView<'a, X, Y, D>,
}

impl<X, Y, D> Clone for PrefixedCodedHybrid<'_, X, Y, D> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<X, Y, D> Copy for PrefixedCodedHybrid<'_, X, Y, D> {}

impl<X: IndexCode, Y: ValueCode, D: Value> CodedHybridSource<X, Y, D>
    for PrefixedCodedHybrid<'_, X, Y, D>
{
    fn coded_view(&self) -> CodedHybridView<'_, X, Y, D> {
        self.view
    }

    fn history_prefix(&self) -> Option<CodedHistoryPrefix<'_, X, Y>> {
        Some(self.prefix)
    }
}

/// A hybrid or coded hybrid source whose first positions are kept in full: `sink` holds
/// their `f32` key and value rows (row-major, `head_dim` wide, unscaled), attended before
/// `head`'s rows — its history prefix, sparse history and buffer — under one softmax.
/// A SWAN cache that keeps the attention sink out of its sparse rows lends its heads so.
///
/// # Examples
/// ```
/// use attn_kernels::{AttnConfig, CpuAttention, DecodeAttention, DenseKv, WithSink};
/// use kv_sparse::hybrid::{HybridCache, HybridConfig};
/// let d = 4;
/// let (k0, v0) = ([1.0f32, 0.5, -0.5, 2.0], [3.0f32, -1.0, 0.0, 1.0]);
/// let mut rest = HybridCache::<u8, f32, f32>::new(HybridConfig::new(d, 2, d))?;
/// let mut keys = k0.to_vec();
/// let mut values = v0.to_vec();
/// for t in 1..5 {
///     let (k, v) = ([t as f32, 1.0, -1.0, 0.5], [1.0, t as f32, 0.0, 2.0]);
///     rest.append(&k, &v)?;
///     keys.extend(k);
///     values.extend(v);
/// }
/// // Lossless rows (k = d, f32): the sink plus the rest attend as one dense head.
/// let head = WithSink { sink: (&k0[..], &v0[..]), head: rest.view() };
/// let attn = AttnConfig::new(1, 1, d)?;
/// let q = [0.3, -0.2, 0.5, 1.0];
/// let (mut a, mut b) = ([0.0; 4], [0.0; 4]);
/// let mut kernel = CpuAttention::new(1)?;
/// kernel.hybrid(&attn, &q, &[head], &mut a)?;
/// kernel.dense(&attn, &q, &[DenseKv::new(d, &keys, &values)], &mut b)?;
/// assert!(a.iter().zip(&b).all(|(x, y)| (x - y).abs() < 1e-5));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, Debug)]
pub struct WithSink<'a, H> {
    /// The kept positions' `f32` key and value rows.
    pub sink: (&'a [f32], &'a [f32]),
    /// The rows after them.
    pub head: H,
}

impl<I, V, D, H: HybridSource<I, V, D>> HybridSource<I, V, D> for WithSink<'_, H> {
    fn hybrid_view(&self) -> HybridView<'_, I, V, D> {
        self.head.hybrid_view()
    }

    fn history_prefix(&self) -> Option<HistoryPrefix<'_, I, V>> {
        self.head.history_prefix()
    }

    fn sink_rows(&self) -> (&[f32], &[f32]) {
        self.sink
    }
}

impl<X, Y, D, H: CodedHybridSource<X, Y, D>> CodedHybridSource<X, Y, D> for WithSink<'_, H> {
    fn coded_view(&self) -> CodedHybridView<'_, X, Y, D> {
        self.head.coded_view()
    }

    fn history_prefix(&self) -> Option<CodedHistoryPrefix<'_, X, Y>> {
        self.head.history_prefix()
    }

    fn sink_rows(&self) -> (&[f32], &[f32]) {
        self.sink
    }
}

/// The resident rows of one kv-head in a tiered store (WnW §2.3): a strictly ascending list
/// of absolute token positions and, for each, a key and a value row in a row-major *slab*.
///
/// Row `i` (position `positions[i]`) lives at slab row `slots[i]`, or at slab row `i` when
/// `slots` is `None` (a compact copy). A store that recycles slab rows as segments come and
/// go passes its slab and its slot table as they are — nothing is copied.
#[derive(Debug)]
pub struct GatheredKv<'a, D> {
    /// Elements per row.
    pub head_dim: usize,
    /// Absolute token positions of the resident rows, strictly ascending.
    pub positions: &'a [u32],
    /// Slab rows holding each resident row (`None`: row `i` is slab row `i`).
    pub slots: Option<&'a [u32]>,
    /// Key slab, row-major.
    pub keys: &'a [D],
    /// Value slab, row-major (same number of rows as `keys`).
    pub values: &'a [D],
}

impl<D> Clone for GatheredKv<'_, D> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<D> Copy for GatheredKv<'_, D> {}

impl<'a, D: Value> GatheredKv<'a, D> {
    /// Compact rows: row `i` of `keys`/`values` is position `positions[i]`.
    ///
    /// # Examples
    /// ```
    /// let k = [0.5f32; 6];
    /// let g = attn_kernels::GatheredKv::new(2, &[3, 7, 9], &k, &k);
    /// assert_eq!(g.num_rows(), 3);
    /// assert_eq!(g.slab_row(1), 1);
    /// ```
    pub fn new(head_dim: usize, positions: &'a [u32], keys: &'a [D], values: &'a [D]) -> Self {
        Self { head_dim, positions, slots: None, keys, values }
    }

    /// Rows in a shared slab: row `i` is slab row `slots[i]`.
    ///
    /// # Examples
    /// ```
    /// let slab = [0.0f32; 8]; // 4 slab rows of 2
    /// let g = attn_kernels::GatheredKv::with_slots(2, &[10, 11], &[3, 0], &slab, &slab);
    /// assert_eq!(g.slab_row(0), 3);
    /// ```
    pub fn with_slots(
        head_dim: usize,
        positions: &'a [u32],
        slots: &'a [u32],
        keys: &'a [D],
        values: &'a [D],
    ) -> Self {
        Self { head_dim, positions, slots: Some(slots), keys, values }
    }

    /// Resident rows.
    pub fn num_rows(&self) -> usize {
        self.positions.len()
    }

    /// Slab row of resident row `i` (`i < num_rows()`; validated slots only).
    pub fn slab_row(&self, i: usize) -> usize {
        self.slots.map_or(i, |s| s[i] as usize)
    }
}

/// A slab of fixed-width sparse rows as WnW's tiered store keeps SWAN rows (`kv-tiered`'s
/// `RowCodec::SparseFp8`): row `r` is `bytes[r·2k .. (r+1)·2k]`, its `k` kept dimensions as
/// `u8` indices followed by their `k` fp8 E4M3FN codes; decoded values are `code · scale`.
///
/// Indices must be `< head_dim` (what every SWAN encoder writes); an entry with a larger
/// index contributes nothing (its query component and output are taken as 0).
#[derive(Clone, Copy, Debug)]
pub struct SparseSlab<'a> {
    /// Rows of `2k` bytes each.
    pub bytes: &'a [u8],
    /// Kept dimensions per row (`0 ≤ k ≤ head_dim ≤ 256`).
    pub k: usize,
    /// Multiplies every decoded value.
    pub scale: f32,
}

impl<'a> SparseSlab<'a> {
    /// A slab of `2k`-byte rows scaled by `scale`.
    ///
    /// # Examples
    /// ```
    /// // Two rows of k = 1: (dim 3, 1.0) and (dim 0, 2.0) in fp8 E4M3FN.
    /// let bytes = [3u8, 0x38, 0, 0x40];
    /// let s = attn_kernels::SparseSlab::new(&bytes, 1, 1.0);
    /// assert_eq!(s.num_rows(), Some(2));
    /// ```
    pub fn new(bytes: &'a [u8], k: usize, scale: f32) -> Self {
        Self { bytes, k, scale }
    }

    /// Bytes per row (`2k`).
    pub fn row_bytes(&self) -> usize {
        2 * self.k
    }

    /// Rows in the slab; `None` when `k = 0` (empty rows: any slot is valid).
    pub fn num_rows(&self) -> Option<usize> {
        self.bytes.len().checked_div(self.row_bytes())
    }
}

/// The resident *sparse* rows of one kv-head in a tiered store: SWAN rows recalled by the
/// WnW store (`papers/wnw.txt` §2.3 with `papers/swan.txt`'s CSR rows), attended where they
/// lie — no row is densified. Like [`GatheredKv`], a strictly ascending position list and,
/// per position, a slab row (`slots[i]`, or `i` when `slots` is `None`), here in two
/// [`SparseSlab`]s (keys and values, each with its own `k` and scale).
#[derive(Clone, Copy, Debug)]
pub struct GatheredSparseKv<'a> {
    /// Elements of a decoded row (`≤ 256`, the reach of a `u8` index).
    pub head_dim: usize,
    /// Absolute token positions of the resident sparse rows, strictly ascending.
    pub positions: &'a [u32],
    /// Slab rows holding each resident row (`None`: row `i` is slab row `i`).
    pub slots: Option<&'a [u32]>,
    /// Sparse key rows.
    pub keys: SparseSlab<'a>,
    /// Sparse value rows (same number of slab rows as `keys` unless one side has `k = 0`).
    pub values: SparseSlab<'a>,
}

impl<'a> GatheredSparseKv<'a> {
    /// Rows `i` of the slabs for `positions[i]` (a compact copy).
    ///
    /// # Examples
    /// ```
    /// use attn_kernels::{GatheredSparseKv, SparseSlab};
    /// let bytes = [3u8, 0x38, 0, 0x40];
    /// let slab = SparseSlab::new(&bytes, 1, 1.0);
    /// let g = GatheredSparseKv::new(4, &[10, 12], slab, slab);
    /// assert_eq!((g.num_rows(), g.slab_row(1)), (2, 1));
    /// ```
    pub fn new(
        head_dim: usize,
        positions: &'a [u32],
        keys: SparseSlab<'a>,
        values: SparseSlab<'a>,
    ) -> Self {
        Self { head_dim, positions, slots: None, keys, values }
    }

    /// Rows in shared slabs: resident row `i` is slab row `slots[i]`.
    pub fn with_slots(
        head_dim: usize,
        positions: &'a [u32],
        slots: &'a [u32],
        keys: SparseSlab<'a>,
        values: SparseSlab<'a>,
    ) -> Self {
        Self { head_dim, positions, slots: Some(slots), keys, values }
    }

    /// No sparse rows (a kv-head whose resident rows are all dense).
    pub fn empty(head_dim: usize) -> Self {
        let none = SparseSlab::new(&[], 0, 1.0);
        Self::new(head_dim, &[], none, none)
    }

    /// Resident sparse rows.
    pub fn num_rows(&self) -> usize {
        self.positions.len()
    }

    /// Slab row of resident row `i` (`i < num_rows()`; validated slots only).
    pub fn slab_row(&self, i: usize) -> usize {
        self.slots.map_or(i, |s| s[i] as usize)
    }
}

/// The resident *coded* rows of one kv-head in a tiered store: rows of a code layout whose
/// rows stand alone ([`RowCodes::row_bytes`] is `Some`: the TurboQuant-style codebook rows,
/// with or without the QJL key sketch, and per-token channel-group rows), recalled by the
/// WnW store and read where they lie. Like [`GatheredSparseKv`], a strictly ascending
/// position list and, per position, a slab row (`slots[i]`, or `i` without `slots`), in
/// two layouts over the slabs' bytes (keys and values).
#[derive(Clone, Copy, Debug)]
pub struct GatheredCodedKv<'a> {
    /// Elements of a decoded row.
    pub head_dim: usize,
    /// Absolute token positions of the resident coded rows, strictly ascending.
    pub positions: &'a [u32],
    /// Slab rows holding each resident row (`None`: row `i` is slab row `i`).
    pub slots: Option<&'a [u32]>,
    /// Key rows (their layout over the key slab).
    pub keys: RowCodes<'a>,
    /// Value rows (their layout over the value slab, as many slab rows as `keys`).
    pub values: RowCodes<'a>,
}

impl<'a> GatheredCodedKv<'a> {
    /// Resident row `i` in slab row `slots[i]`.
    ///
    /// # Examples
    /// ```
    /// use attn_kernels::GatheredCodedKv;
    /// use kv_sparse::decoded::RowCodes;
    /// let levels = kv_sparse::turbo::codebook(8, 2);
    /// let bytes = [0u8; 2 * 4]; // two rows of an f16 norm and eight 2-bit codes
    /// let rows = RowCodes::Codebook { bits: 2, levels: &levels, bytes: &bytes };
    /// let g = GatheredCodedKv::with_slots(8, &[3, 9], &[1, 0], rows, rows);
    /// assert_eq!((g.num_rows(), g.slab_row(0)), (2, 1));
    /// ```
    pub fn with_slots(
        head_dim: usize,
        positions: &'a [u32],
        slots: &'a [u32],
        keys: RowCodes<'a>,
        values: RowCodes<'a>,
    ) -> Self {
        Self { head_dim, positions, slots: Some(slots), keys, values }
    }

    /// No coded rows (a kv-head whose resident rows are all dense).
    pub fn empty(head_dim: usize) -> Self {
        let none = RowCodes::ChannelGroups { bits: 8, group: 1, bytes: &[] };
        Self { head_dim, positions: &[], slots: None, keys: none, values: none }
    }

    /// Resident coded rows.
    pub fn num_rows(&self) -> usize {
        self.positions.len()
    }

    /// Slab row of resident row `i` (`i < num_rows()`; validated slots only).
    pub fn slab_row(&self, i: usize) -> usize {
        self.slots.map_or(i, |s| s[i] as usize)
    }
}

/// Dense quantized keys and values of one kv-head (`kv-sparse`'s int8 / int4 blocks or
/// scaled fp8 rows), in token order — the dense baselines of the frontier study. Keys are
/// encoded by `K` and values by `V` (by default the same codec; `QuantKv<Int8Blocks,
/// Int4Blocks>` is llama.cpp's `-ctk q8_0 -ctv q4_0`). The rows may lie in two parts:
/// `prefix` (e.g. a reopened file's mapped rows), then `keys` / `values` (the rows appended
/// since); the kernels read row by row, so the output is bit for bit that of the rows in
/// one part.
#[derive(Debug)]
pub struct QuantKv<'a, K, V = K> {
    /// Key rows (after the prefix's).
    pub keys: QuantView<'a, K>,
    /// Value rows (same number of rows as `keys`).
    pub values: QuantView<'a, V>,
    /// Older key and value rows before `keys` / `values`, or `None`.
    pub prefix: Option<(QuantView<'a, K>, QuantView<'a, V>)>,
    /// Rows kept in `f32` before every quantized row — the first positions of the sequence
    /// (the attention sink), row-major `head_dim`-wide keys and values; empty for none.
    pub sink: (&'a [f32], &'a [f32]),
    /// The newest rows kept exact in a float format after every quantized row — a buffered
    /// cache's recent-token buffer (KIVI's fp16 residual, SWAN's dense buffer); `None` for
    /// none.
    pub buffer: Option<RecentRows<'a>>,
}

/// The recent-token buffer of a buffered quantized kv-head: dense rows in `f32`, `f16` or
/// `bf16`, in token order (a ring's `(older, newer)` halves), attended after the quantized
/// rows under the same softmax.
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
pub enum RecentRows<'a> {
    /// `f32` rows.
    F32(DenseKv<'a, f32>),
    /// `f16` rows.
    F16(DenseKv<'a, half::f16>),
    /// `bf16` rows.
    Bf16(DenseKv<'a, half::bf16>),
}

impl RecentRows<'_> {
    /// Key rows held (the values' count is checked by the kernels).
    pub fn num_rows(&self) -> usize {
        match self {
            RecentRows::F32(kv) => kv.num_rows(),
            RecentRows::F16(kv) => kv.num_rows(),
            RecentRows::Bf16(kv) => kv.num_rows(),
        }
    }

    /// Elements per row.
    pub fn head_dim(&self) -> usize {
        match self {
            RecentRows::F32(kv) => kv.head_dim,
            RecentRows::F16(kv) => kv.head_dim,
            RecentRows::Bf16(kv) => kv.head_dim,
        }
    }
}

mod recent_sealed {
    /// Seals [`super::RecentFormat`].
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for half::f16 {}
    impl Sealed for half::bf16 {}
}

/// A float format a recent-token buffer may hold (`f32`, `f16`, `bf16`). Sealed.
pub trait RecentFormat: Value + recent_sealed::Sealed {
    /// `kv` as the buffer of a [`QuantKv`].
    fn recent(kv: DenseKv<'_, Self>) -> RecentRows<'_>;
}

impl RecentFormat for f32 {
    fn recent(kv: DenseKv<'_, f32>) -> RecentRows<'_> {
        RecentRows::F32(kv)
    }
}

impl RecentFormat for half::f16 {
    fn recent(kv: DenseKv<'_, half::f16>) -> RecentRows<'_> {
        RecentRows::F16(kv)
    }
}

impl RecentFormat for half::bf16 {
    fn recent(kv: DenseKv<'_, half::bf16>) -> RecentRows<'_> {
        RecentRows::Bf16(kv)
    }
}

impl<K, V> Clone for QuantKv<'_, K, V> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<K, V> Copy for QuantKv<'_, K, V> {}

impl<'a, K: DenseCodec, V: DenseCodec> QuantKv<'a, K, V> {
    /// Keys and values of one kv-head.
    pub fn new(keys: QuantView<'a, K>, values: QuantView<'a, V>) -> Self {
        Self { keys, values, prefix: None, sink: (&[], &[]), buffer: None }
    }

    /// The same rows after `keys` / `values` kept in `f32` (row-major, `head_dim` wide):
    /// attended first, under the same softmax.
    ///
    /// # Examples
    /// ```
    /// use attn_kernels::{AttnConfig, CpuAttention, EncodedAttention, QuantKv};
    /// use kv_sparse::quant::{Int4Blocks, QuantRows};
    /// let d = 32;
    /// let (mut k, mut v) = (QuantRows::<Int4Blocks>::new(d)?, QuantRows::<Int4Blocks>::new(d)?);
    /// k.push(&[0.1; 32])?;
    /// v.push(&[2.0; 32])?;
    /// let (sink_k, sink_v) = (vec![0.1f32; 32], vec![1.0f32; 32]);
    /// let kv = QuantKv::new(k.view(), v.view()).with_sink(&sink_k, &sink_v);
    /// assert_eq!((kv.num_rows(), kv.sink_rows(d)), (2, 1));
    /// let mut out = [0.0; 32];
    /// CpuAttention::new(1)?.quantized(&AttnConfig::new(1, 1, d)?, &[0.0; 32], &[kv], &mut out)?;
    /// assert!(out.iter().all(|&x| (x - 1.5).abs() < 1e-3)); // equal scores: the mean
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[must_use]
    pub fn with_sink(self, keys: &'a [f32], values: &'a [f32]) -> Self {
        Self { sink: (keys, values), ..self }
    }

    /// Rows of `head_dim` the sink holds.
    pub fn sink_rows(&self, head_dim: usize) -> usize {
        self.sink.0.len() / head_dim.max(1)
    }

    /// The same rows followed by a recent-token buffer of dense rows (`keys` and `values`
    /// each a ring's `(older, newer)` halves, row-major, `head_dim` wide): attended after
    /// every quantized row, under the same softmax.
    ///
    /// # Examples
    /// ```
    /// use attn_kernels::{AttnConfig, CpuAttention, EncodedAttention, QuantKv};
    /// use kv_sparse::quant::{Int4Blocks, QuantRows};
    /// let d = 32;
    /// let (mut k, mut v) = (QuantRows::<Int4Blocks>::new(d)?, QuantRows::<Int4Blocks>::new(d)?);
    /// k.push(&[0.1; 32])?;
    /// v.push(&[2.0; 32])?;
    /// let recent = (vec![0.1f32; 32], vec![1.0f32; 32]);
    /// let kv = QuantKv::new(k.view(), v.view()).with_buffer((&recent.0, &[]), (&recent.1, &[]));
    /// assert_eq!((kv.num_rows(), kv.buffer_rows()), (2, 1));
    /// let mut out = [0.0; 32];
    /// CpuAttention::new(1)?.quantized(&AttnConfig::new(1, 1, d)?, &[0.0; 32], &[kv], &mut out)?;
    /// assert!(out.iter().all(|&x| (x - 1.5).abs() < 1e-3)); // equal scores: the mean
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[must_use]
    pub fn with_buffer<D: RecentFormat>(
        self,
        keys: (&'a [D], &'a [D]),
        values: (&'a [D], &'a [D]),
    ) -> Self {
        let head_dim = self.keys.head_dim();
        Self { buffer: Some(D::recent(DenseKv { head_dim, keys, values })), ..self }
    }

    /// Rows the recent-token buffer holds (0 without one).
    pub fn buffer_rows(&self) -> usize {
        self.buffer.map_or(0, |b| b.num_rows())
    }

    /// Keys and values of one kv-head after older rows `prefix` (keys, values) held
    /// elsewhere.
    pub fn continuing(
        prefix: (QuantView<'a, K>, QuantView<'a, V>),
        keys: QuantView<'a, K>,
        values: QuantView<'a, V>,
    ) -> Self {
        Self { keys, values, prefix: Some(prefix), sink: (&[], &[]), buffer: None }
    }

    /// Key rows: the sink's, the prefix's, the own and the buffer's.
    pub fn num_rows(&self) -> usize {
        self.sink_rows(self.keys.head_dim()) + self.quantized_rows() + self.buffer_rows()
    }

    /// Quantized key rows (the prefix's included, the sink's not).
    pub fn quantized_rows(&self) -> usize {
        self.keys.num_rows() + self.prefix.map_or(0, |(k, _)| k.num_rows())
    }

    /// Quantized key and value row `j` (prefix rows first; sink rows not counted), or
    /// `None` past the end.
    pub fn row(&self, j: usize) -> Option<(&'a [u8], &'a [u8])> {
        let before = self.prefix.map_or(0, |(k, _)| k.num_rows());
        match self.prefix {
            Some((k, v)) if j < before => k.row(j).zip(v.row(j)),
            _ => self.keys.row(j - before).zip(self.values.row(j - before)),
        }
    }
}

/// A kv-head whose history rows are codes read through row decoders ([`DecodeRows`]: KIVI's
/// grouped 2/4-bit rows, the TurboQuant-style unit-vector codes), in token order: `f32`
/// sink rows, the coded rows (keys and values, equally many), then the recent-token buffer,
/// all under one softmax.
///
/// # Examples
/// ```
/// use attn_kernels::{AttnConfig, CpuAttention, DecodedKv, EncodedAttention};
/// use kv_sparse::turbo::TurboRows;
/// let d = 32;
/// let (mut k, mut v) = (TurboRows::<4>::new(d)?, TurboRows::<4>::new(d)?);
/// k.push(&[0.5; 32])?;
/// v.push(&[2.0; 32])?;
/// let recent = (vec![0.5f32; 32], vec![1.0f32; 32]);
/// let kv = DecodedKv::new(k.view(), v.view()).with_buffer((&recent.0, &[]), (&recent.1, &[]));
/// let mut out = [0.0; 32];
/// CpuAttention::new(1)?.decoded(&AttnConfig::new(1, 1, d)?, &[0.0; 32], &[kv], &mut out)?;
/// // Equal scores: the mean of the buffered value and the 4-bit coded one (within its code).
/// assert!(out.iter().all(|&x| (x - 1.5).abs() < 0.2));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, Debug)]
pub struct DecodedKv<'a, K, V = K> {
    /// Key rows.
    pub keys: K,
    /// Value rows (as many as `keys`).
    pub values: V,
    /// Rows kept in `f32` before the coded ones (keys, values; row-major); empty for none.
    pub sink: (&'a [f32], &'a [f32]),
    /// The newest rows, exact, after the coded ones; `None` for none.
    pub buffer: Option<RecentRows<'a>>,
}

impl<'a, K: DecodeRows, V: DecodeRows> DecodedKv<'a, K, V> {
    /// Coded keys and values of one kv-head, no sink, no buffer.
    pub fn new(keys: K, values: V) -> Self {
        Self { keys, values, sink: (&[], &[]), buffer: None }
    }

    /// The same rows after `f32` sink rows (row-major, `head_dim` wide).
    #[must_use]
    pub fn with_sink(self, keys: &'a [f32], values: &'a [f32]) -> Self {
        Self { sink: (keys, values), ..self }
    }

    /// The same rows followed by a recent-token buffer (each side a ring's `(older, newer)`
    /// halves, row-major).
    #[must_use]
    pub fn with_buffer<D: RecentFormat>(
        self,
        keys: (&'a [D], &'a [D]),
        values: (&'a [D], &'a [D]),
    ) -> Self {
        let head_dim = self.keys.head_dim();
        Self { buffer: Some(D::recent(DenseKv { head_dim, keys, values })), ..self }
    }

    /// Rows of `head_dim` the sink holds.
    pub fn sink_rows(&self) -> usize {
        self.sink.0.len() / self.keys.head_dim().max(1)
    }

    /// Rows the recent-token buffer holds.
    pub fn buffer_rows(&self) -> usize {
        self.buffer.map_or(0, |b| b.num_rows())
    }

    /// Every row: the sink's, the coded ones and the buffer's.
    pub fn num_rows(&self) -> usize {
        self.sink_rows() + self.keys.num_rows() + self.buffer_rows()
    }
}

/// Anything that lends a coded hybrid view of one kv-head: the view itself or a
/// `CodedHybridCache` (a layer's caches go to [`crate::EncodedAttention::coded_hybrid`]
/// as they are).
pub trait CodedHybridSource<X, Y, D>: Sync {
    /// The borrowed view the kernels read.
    fn coded_view(&self) -> CodedHybridView<'_, X, Y, D>;

    /// Coded key and value rows older than the view's own sparse history, attended first
    /// (see [`HybridSource::history_prefix`]). `None` (the default) for a single history.
    fn history_prefix(&self) -> Option<CodedHistoryPrefix<'_, X, Y>> {
        None
    }

    /// `f32` rows attended before everything else (see [`HybridSource::sink_rows`]).
    /// Empty (the default) for none.
    fn sink_rows(&self) -> (&[f32], &[f32]) {
        (&[], &[])
    }
}

impl<X: IndexCode, Y: ValueCode, D: Value> CodedHybridSource<X, Y, D>
    for CodedHybridView<'_, X, Y, D>
{
    fn coded_view(&self) -> CodedHybridView<'_, X, Y, D> {
        *self
    }
}

impl<X: IndexCode, Y: ValueCode, D: Value> CodedHybridSource<X, Y, D>
    for CodedHybridCache<X, Y, D>
{
    fn coded_view(&self) -> CodedHybridView<'_, X, Y, D> {
        self.view()
    }
}
