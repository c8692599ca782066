//! [`HybridCache`]: SWAN's hybrid KV cache for one (layer, kv-head).
//!
//! SWAN (method section, hybrid KV-cache and Algorithm 1): the `b` most recent key/value
//! rows stay dense in a ring buffer; appending to a full buffer evicts its oldest row,
//! which is pruned to its top-k magnitudes and appended to the CSR sparse history.
//! Token order is: sparse rows (oldest tokens) first, then the buffer rows.
//!
//! One cache type, [`Hybrid`], holds its history in any [`RowStore`]: [`HybridCache`] is
//! the CSR form (the paper's index lists), [`CodedHybridCache`] the coded rows of
//! [`crate::coded`] (bitmask or list indices, f16/bf16/fp8/int8/int4 values).

use super::buffer::DenseBuffer;
use super::history::SparseHistory;
use super::input::{check_limits, sanitize_into, scan};
use super::{CodedHybridView, HybridConfig, HybridView, NonFinitePolicy, RowStore, WholeRowStore};
use crate::coded::{CodedStore, CodedView, IndexCode, ValueCode};
use crate::csr::{CsrStore, CsrView};
use crate::decoded::Side;
use crate::kivi::{KiviRows, KiviView};
use crate::memory::MemoryReport;
use crate::quant::{DenseCodec, QuantRows, QuantView};
use crate::turbo::{TurboQjlRows, TurboQjlView, TurboRows, TurboView};
use crate::{Error, Result, SparseIndex, Value};

/// Hybrid cache of one (layer, kv-head): sparse history in two [`RowStore`]s `S` (keys,
/// values), dense buffer in [`crate::ring::DenseRing<D>`] (`D`: dense buffer format,
/// typically `f32`, `f16` or `bf16`).
///
/// Appends are all-or-nothing: on error the cache is unchanged. Steady-state appends do
/// not allocate beyond the sparse stores' amortized growth (see [`Hybrid::reserve`]).
#[derive(Clone, Debug)]
pub struct Hybrid<S, D> {
    cfg: HybridConfig,
    sparse: SparseHistory<S>,
    buffer: DenseBuffer<D>,
    /// Sanitized copies of input rows (only used under [`NonFinitePolicy::Zero`]).
    staged_key: Vec<f32>,
    staged_value: Vec<f32>,
}

/// `row` itself, or its sanitized copy in `scratch` when it holds non-finite elements.
fn stage<'a>(row: &'a [f32], dirty: bool, scratch: &'a mut Vec<f32>) -> &'a [f32] {
    if dirty {
        sanitize_into(row, scratch);
        scratch
    } else {
        row
    }
}

/// The rows of an (older, newer) buffer pair in token order.
fn buffer_rows<'a, D>((a, b): (&'a [D], &'a [D]), d: usize) -> impl Iterator<Item = &'a [D]> {
    a.chunks_exact(d).chain(b.chunks_exact(d))
}

/// The CSR hybrid cache (`I`: `u8`/`u16` indices, `V`: sparse value format, `D`: buffer).
pub type HybridCache<I, V, D> = Hybrid<CsrStore<I, V>, D>;

/// A buffered dense quantized cache: the `b` newest rows exact in `D`, every older row kept
/// whole in the codec `C` (`q8_0` / `q4_0` blocks or scaled fp8) — the recent-token buffer
/// of KIVI and of the quantized caches compared with SWAN, over the same buffer logic as
/// SWAN's sparse rows. Its config keeps every component (`k = head_dim`).
///
/// # Examples
/// ```
/// use kv_sparse::hybrid::{HybridConfig, QuantHybridCache};
/// use kv_sparse::quant::{Int4Blocks, QuantRows};
/// let cfg = HybridConfig::lossless(32, 2).for_store::<QuantRows<Int4Blocks>>();
/// let mut cache = QuantHybridCache::<Int4Blocks, half::f16>::new(cfg)?;
/// for t in 0..5 {
///     cache.append(&[t as f32; 32], &[1.0; 32])?;
/// }
/// assert_eq!((cache.sparse_len(), cache.buffer_len()), (3, 2));
/// let (keys, _) = cache.history();
/// assert_eq!(keys.num_rows(), 3);
/// assert_eq!(cache.memory().held_bytes(), 2 * 3 * 18 + 2 * 2 * 32 * 2); // q4_0 rows + f16 buffer
/// assert!(QuantHybridCache::<Int4Blocks, half::f16>::new(HybridConfig::new(32, 2, 16)).is_err());
/// # Ok::<(), kv_sparse::Error>(())
/// ```
pub type QuantHybridCache<C, D> = Hybrid<QuantRows<C>, D>;

/// The hybrid cache over coded rows (`X`: index list or bitmask, `Y`: value code, `D`:
/// buffer).
///
/// # Examples
/// ```
/// use kv_sparse::coded::{Bitmask, Int8Values};
/// use kv_sparse::hybrid::{CodedHybridCache, HybridConfig};
/// let cfg = HybridConfig::new(16, 2, 8).for_store::<kv_sparse::coded::CodedStore<Bitmask, Int8Values>>();
/// let mut cache = CodedHybridCache::<Bitmask, Int8Values, half::f16>::new(cfg)?;
/// for t in 0..5 {
///     cache.append(&[t as f32; 16], &[1.0; 16])?;
/// }
/// assert_eq!((cache.sparse_len(), cache.buffer_len()), (3, 2));
/// let mut k = [0.0; 16];
/// cache.view().key_into(1, &mut k)?;
/// assert_eq!(k.iter().filter(|&&x| x != 0.0).count(), 8); // top 8 of a constant row
/// # Ok::<(), kv_sparse::Error>(())
/// ```
pub type CodedHybridCache<X, Y, D> = Hybrid<CodedStore<X, Y>, D>;

impl<S: RowStore, D: Value> Hybrid<S, D> {
    /// An empty cache.
    ///
    /// # Errors
    /// Any error of [`HybridConfig::validate`].
    ///
    /// # Examples
    /// ```
    /// use kv_sparse::hybrid::{HybridCache, HybridConfig};
    /// use half::f16;
    /// let mut cache = HybridCache::<u8, f16, f16>::new(HybridConfig::new(4, 1, 2))?;
    /// cache.append(&[1.0, -3.0, 0.5, 2.0], &[0.1, 0.2, 0.3, 0.4])?;
    /// cache.append(&[0.0; 4], &[0.0; 4])?; // evicts the first row into the sparse history
    /// assert_eq!((cache.sparse_len(), cache.buffer_len()), (1, 1));
    /// assert_eq!(cache.view().sparse_keys.row(0).unwrap().indices, &[1, 3]);
    /// # Ok::<(), kv_sparse::Error>(())
    /// ```
    pub fn new(cfg: HybridConfig) -> Result<Self> {
        cfg.validate_store::<S, D>()?;
        let store = |side| S::empty_side(side, cfg.head_dim, cfg.rows_per_block);
        Ok(Self::from_stores(cfg, store(Side::Keys)?, store(Side::Values)?, cfg.buffer))
    }

    /// A cache over the given histories whose buffer has storage for `buffer_rows` rows
    /// allocated up front (the rest as rows arrive).
    fn from_stores(cfg: HybridConfig, keys: S, values: S, buffer_rows: usize) -> Self {
        let sparse = SparseHistory::new(keys, values, (cfg.k_key, cfg.k_value), cfg.scales());
        Self {
            cfg,
            sparse,
            buffer: DenseBuffer::new(cfg.head_dim, cfg.buffer, buffer_rows),
            staged_key: Vec::with_capacity(cfg.head_dim),
            staged_value: Vec::with_capacity(cfg.head_dim),
        }
    }

    /// A cache over copied histories whose buffer takes the given rows in token order.
    fn rebuilt(
        cfg: HybridConfig,
        keys: S,
        values: S,
        buffer_keys: (&[D], &[D]),
        buffer_values: (&[D], &[D]),
        buffer_len: usize,
    ) -> Self {
        // Allocate the buffer for the rows the view holds, not its capacity: `cfg` may come
        // from an untrusted file claiming a huge buffer (memory follows the rows held).
        let mut cache = Self::from_stores(cfg, keys, values, buffer_len);
        let d = cfg.head_dim;
        for (k, v) in buffer_rows(buffer_keys, d).zip(buffer_rows(buffer_values, d)) {
            cache.buffer.keys.push_raw(k);
            cache.buffer.values.push_raw(v);
        }
        cache
    }

    /// Appends one token's key and value rows. When the buffer is full its oldest row is
    /// pruned into the sparse history (with `b = 0` the new row is pruned directly).
    ///
    /// # Errors
    /// [`Error::LengthMismatch`] when a row's length is not `head_dim`;
    /// [`Error::NonFinite`] for NaN/±∞ under [`NonFinitePolicy::Error`];
    /// [`Error::Overflow`] when a value does not fit the dense or sparse format.
    /// The cache is unchanged on error.
    pub fn append(&mut self, k: &[f32], v: &[f32]) -> Result<()> {
        self.check_input(["HybridCache::append: key", "HybridCache::append: value"], k, v, 1)?;
        self.append_checked(k, v)
    }

    /// [`Hybrid::append`] after [`Hybrid::check_input`] succeeded.
    pub(crate) fn append_checked(&mut self, k: &[f32], v: &[f32]) -> Result<()> {
        let zero = self.cfg.non_finite == NonFinitePolicy::Zero;
        let k = stage(k, zero && !k.iter().all(|x| x.is_finite()), &mut self.staged_key);
        let v = stage(v, zero && !v.iter().all(|x| x.is_finite()), &mut self.staged_value);
        self.buffer.push(k, v, &mut self.sparse)
    }

    /// Bulk insert of `n` tokens (a prefill): `keys` and `values` are `n × head_dim`
    /// row-major. Same result as `n` calls to [`Hybrid::append`] — the last `b` rows
    /// stay dense — but validated up front (all-or-nothing) and with storage reserved once.
    ///
    /// # Errors
    /// As [`Hybrid::append`]; [`Error::LengthMismatch`] when the lengths are not equal
    /// multiples of `head_dim` (a non-finite position counts across the flattened rows).
    ///
    /// # Examples
    /// ```
    /// use kv_sparse::hybrid::{HybridCache, HybridConfig};
    /// let mut cache = HybridCache::<u8, f32, f32>::new(HybridConfig::new(2, 2, 1))?;
    /// cache.extend(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[0.0; 6])?; // 3 tokens
    /// assert_eq!((cache.sparse_len(), cache.buffer_len()), (1, 2));
    /// # Ok::<(), kv_sparse::Error>(())
    /// ```
    pub fn extend(&mut self, keys: &[f32], values: &[f32]) -> Result<()> {
        const OPS: [&str; 2] = ["HybridCache::extend: keys", "HybridCache::extend: values"];
        let d = self.cfg.head_dim;
        let n = keys.len() / d;
        if !keys.len().is_multiple_of(d) {
            let (expected, got) = (n * d, keys.len());
            let what = "keys (not a multiple of head_dim)";
            return Err(Error::LengthMismatch { op: OPS[0], what, expected, got });
        }
        self.check_input(OPS, keys, values, n)?;
        self.extend_checked(keys, values)
    }

    /// [`Hybrid::extend`] after [`Hybrid::check_input`] succeeded for these rows
    /// (whole rows of `head_dim`; finite or allowed by the non-finite policy; within the
    /// storage limits): nothing is checked again.
    pub(crate) fn extend_checked(&mut self, keys: &[f32], values: &[f32]) -> Result<()> {
        let d = self.cfg.head_dim;
        let n = keys.len() / d;
        let spill = (self.buffer.len() + n).saturating_sub(self.cfg.buffer);
        self.sparse.reserve(spill);
        let from_buffer = spill.min(self.buffer.len());
        for _ in 0..from_buffer {
            self.buffer.spill_oldest(&mut self.sparse)?;
        }
        let zero = self.cfg.non_finite == NonFinitePolicy::Zero;
        for (r, (k, v)) in keys.chunks_exact(d).zip(values.chunks_exact(d)).enumerate() {
            let k = stage(k, zero, &mut self.staged_key);
            let v = stage(v, zero, &mut self.staged_value);
            if r < spill - from_buffer {
                self.buffer.spill_through(k, v, &mut self.sparse)?;
            } else {
                self.buffer.push_within_capacity(k, v);
            }
        }
        Ok(())
    }

    /// Checks `rows` rows of keys and values (flattened) without changing anything:
    /// lengths, the non-finite policy and overflow limits. Checking the largest magnitude
    /// is exact because rounding and scaling are monotone.
    pub(crate) fn check_input(
        &self,
        ops: [&'static str; 2],
        k: &[f32],
        v: &[f32],
        rows: usize,
    ) -> Result<()> {
        let expected = rows * self.cfg.head_dim;
        for (op, what, got) in [(ops[0], "keys", k.len()), (ops[1], "values", v.len())] {
            if got != expected {
                return Err(Error::LengthMismatch { op, what, expected, got });
            }
        }
        let buffered = self.cfg.buffer > 0;
        let (sk, sv) = self.cfg.scales();
        let (kmax, _) = scan(self.cfg.non_finite, ops[0], k)?;
        let (vmax, _) = scan(self.cfg.non_finite, ops[1], v)?;
        check_limits::<S, D>(ops[0], kmax, buffered, self.cfg.k_key > 0, sk)?;
        check_limits::<S, D>(ops[1], vmax, buffered, self.cfg.k_value > 0, sv)
    }

    /// Reserves sparse storage for `rows` more evicted tokens.
    pub fn reserve(&mut self, rows: usize) {
        self.sparse.reserve(rows);
    }

    /// Removes all tokens (keeps allocations).
    pub fn clear(&mut self) {
        self.sparse.clear();
        self.buffer.clear();
    }

    /// Selects evicted keys by weighted magnitude: each keeps the `k_key` components with
    /// the largest `|x_j|·w_j` (stored unweighted); `None` restores SWAN's plain magnitude
    /// rule. With `w_j = √E[q̂_j²]` (the queries' energy along basis vector `j`,
    /// `projection::Basis::query_energy`) that keeps the components with the largest expected
    /// share of a score. Rows already stored are untouched, and the weights are a write-time
    /// policy, not stored data: a cache rebuilt from a view or file selects by magnitude until
    /// they are set again. At `k_key = head_dim` (and `k_key = 0`) the weights change nothing.
    ///
    /// # Errors
    /// [`Error::LengthMismatch`] unless `head_dim` weights; [`Error::NonFinite`] for NaN/∞;
    /// [`Error::InvalidWeight`] for a negative weight or all zeros. Unchanged on error.
    ///
    /// # Examples
    /// ```
    /// use kv_sparse::hybrid::{HybridCache, HybridConfig};
    /// let mut cache = HybridCache::<u8, f32, f32>::new(HybridConfig::new(4, 0, 2))?;
    /// cache.set_key_weights(Some(&[1.0, 0.1, 1.0, 1.0]))?;
    /// cache.append(&[1.0, 3.0, 2.0, 0.5], &[1.0; 4])?;
    /// // |x|·w = (1, 0.3, 2, 0.5): components 0 and 2 are kept, with their own values.
    /// let row = cache.view().sparse_keys.row(0).unwrap();
    /// assert_eq!((row.indices, row.values), (&[0u8, 2][..], &[1.0f32, 2.0][..]));
    /// assert!(cache.set_key_weights(Some(&[1.0, -1.0, 1.0, 1.0])).is_err());
    /// # Ok::<(), kv_sparse::Error>(())
    /// ```
    pub fn set_key_weights(&mut self, weights: Option<&[f32]>) -> Result<()> {
        self.sparse.set_key_weights(weights)
    }

    /// The key-selection weights (normalised to a largest weight of 1), if set.
    pub fn key_weights(&self) -> Option<&[f32]> {
        self.sparse.key_weights()
    }

    /// Selects evicted values by weighted magnitude, as [`Self::set_key_weights`] does keys:
    /// each keeps the `k_value` components with the largest `|x_j|·w_j` (stored unweighted).
    /// A cache that stores rows divided by per-component scales `c_j` passes `w = c` so that
    /// the kept components are those of largest original magnitude. Rows already stored are
    /// untouched; a write-time policy, not stored data. At `k_value = head_dim` (and 0) the
    /// weights change nothing.
    ///
    /// # Errors
    /// As [`Self::set_key_weights`]. Unchanged on error.
    ///
    /// # Examples
    /// ```
    /// use kv_sparse::hybrid::{HybridCache, HybridConfig};
    /// let mut cache = HybridCache::<u8, f32, f32>::new(HybridConfig::new(4, 0, 2))?;
    /// cache.set_value_weights(Some(&[1.0, 0.1, 1.0, 1.0]))?;
    /// cache.append(&[1.0; 4], &[1.0, 3.0, 2.0, 0.5])?;
    /// let row = cache.view().sparse_values.row(0).unwrap();
    /// assert_eq!((row.indices, row.values), (&[0u8, 2][..], &[1.0f32, 2.0][..]));
    /// # Ok::<(), kv_sparse::Error>(())
    /// ```
    pub fn set_value_weights(&mut self, weights: Option<&[f32]>) -> Result<()> {
        self.sparse.set_value_weights(weights)
    }

    /// The value-selection weights (normalised to a largest weight of 1), if set.
    pub fn value_weights(&self) -> Option<&[f32]> {
        self.sparse.value_weights()
    }

    /// The configuration.
    pub fn config(&self) -> &HybridConfig {
        &self.cfg
    }

    /// Elements per key/value vector.
    pub fn head_dim(&self) -> usize {
        self.cfg.head_dim
    }

    /// Tokens held (sparse + buffered).
    pub fn len(&self) -> usize {
        self.sparse.len() + self.buffer.len()
    }

    /// True when no tokens are held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Tokens in the sparse history (the oldest ones).
    pub fn sparse_len(&self) -> usize {
        self.sparse.len()
    }

    /// Tokens in the dense buffer (the newest ones).
    pub fn buffer_len(&self) -> usize {
        self.buffer.len()
    }

    /// The buffered keys in token order as a ring's (older, newer) halves, row-major.
    pub fn buffer_keys(&self) -> (&[D], &[D]) {
        self.buffer.keys.as_slices()
    }

    /// The buffered values, laid out as [`Hybrid::buffer_keys`].
    pub fn buffer_values(&self) -> (&[D], &[D]) {
        self.buffer.values.as_slices()
    }

    /// Bytes held, split by role (see [`MemoryReport`]).
    pub fn memory(&self) -> MemoryReport {
        let staged = (self.staged_key.capacity() + self.staged_value.capacity()) * 4;
        let staged = MemoryReport { capacity_slack_bytes: staged, ..MemoryReport::default() };
        self.sparse.memory() + self.buffer.memory() + staged
    }
}

impl<I: SparseIndex, V: Value, D: Value> HybridCache<I, V, D> {
    /// Rebuilds an owned cache from a view with config `cfg` (e.g. a view of a mapped file,
    /// to keep appending to a persisted prefix). The rows are copied; buffer storage is
    /// allocated for the rows the view holds and grows as rows are appended (up to
    /// `cfg.buffer`), so a huge claimed capacity costs nothing until it is used.
    ///
    /// # Errors
    /// [`Error::ShapeMismatch`] when the view does not fit `cfg` (head_dim, rows per block,
    /// scales, key/value row counts, buffer capacity); any [`HybridConfig::validate`] error.
    pub fn from_view(cfg: HybridConfig, view: HybridView<'_, I, V, D>) -> Result<Self> {
        const OP: &str = "HybridCache::from_view";
        view.check_shape(OP)?;
        let rpb = [view.sparse_keys.rows_per_block(), view.sparse_values.rows_per_block()];
        let shape = (view.head_dim, rpb, view.buffer_len(), view.value_scale);
        check_rebuild::<CsrStore<I, V>, D>(OP, &cfg, shape)?;
        let (k, v) =
            (CsrStore::from_view(view.sparse_keys), CsrStore::from_view(view.sparse_values));
        Ok(Self::rebuilt(cfg, k, v, view.buffer_keys, view.buffer_values, view.buffer_len()))
    }

    /// Rebuilds an owned cache from a view's sparse rows from `skip` on and its buffer,
    /// for a cache whose first `skip` history rows stay where the view reads them (e.g. a
    /// mapped file attended as the history prefix of the rebuilt cache). The rows are
    /// copied as stored; checks as [`HybridCache::from_view`].
    ///
    /// # Errors
    /// As [`HybridCache::from_view`]; [`Error::OutOfRange`] when `skip` exceeds the
    /// view's sparse rows.
    pub fn from_view_after(
        cfg: HybridConfig,
        view: HybridView<'_, I, V, D>,
        skip: usize,
    ) -> Result<Self> {
        const OP: &str = "HybridCache::from_view_after";
        view.check_shape(OP)?;
        let rpb = [view.sparse_keys.rows_per_block(), view.sparse_values.rows_per_block()];
        let shape = (view.head_dim, rpb, view.buffer_len(), view.value_scale);
        check_rebuild::<CsrStore<I, V>, D>(OP, &cfg, shape)?;
        check_skip(OP, skip, view.sparse_len())?;
        let copy = |rows: CsrView<'_, I, V>| -> Result<CsrStore<I, V>> {
            let mut store = CsrStore::with_block_rows(cfg.head_dim, cfg.rows_per_block)?;
            rows.rows().skip(skip).try_for_each(|row| store.push_row(row))?;
            Ok(store)
        };
        let (k, v) = (copy(view.sparse_keys)?, copy(view.sparse_values)?);
        Ok(Self::rebuilt(cfg, k, v, view.buffer_keys, view.buffer_values, view.buffer_len()))
    }

    /// The sparse key store.
    pub fn sparse_keys(&self) -> &CsrStore<I, V> {
        &self.sparse.keys
    }

    /// The sparse value store.
    pub fn sparse_values(&self) -> &CsrStore<I, V> {
        &self.sparse.values
    }

    /// Everything a decode kernel reads, borrowed.
    pub fn view(&self) -> HybridView<'_, I, V, D> {
        HybridView {
            head_dim: self.cfg.head_dim,
            sparse_keys: self.sparse.keys.view(),
            sparse_values: self.sparse.values.view(),
            buffer_keys: self.buffer.keys.as_slices(),
            buffer_values: self.buffer.values.as_slices(),
            value_scale: self.cfg.scales(),
        }
    }
}

impl<X: IndexCode, Y: ValueCode, D: Value> CodedHybridCache<X, Y, D> {
    /// Rebuilds an owned cache from a coded view with config `cfg` (see
    /// [`HybridCache::from_view`]: rows copied, buffer storage sized to the rows held).
    ///
    /// # Errors
    /// As [`HybridCache::from_view`].
    pub fn from_view(cfg: HybridConfig, view: CodedHybridView<'_, X, Y, D>) -> Result<Self> {
        const OP: &str = "CodedHybridCache::from_view";
        view.check_shape(OP)?;
        let rpb = [view.sparse_keys.rows_per_block(), view.sparse_values.rows_per_block()];
        let shape = (view.head_dim, rpb, view.buffer_len(), view.value_scale);
        check_rebuild::<CodedStore<X, Y>, D>(OP, &cfg, shape)?;
        let k = CodedStore::from_view(view.sparse_keys);
        let v = CodedStore::from_view(view.sparse_values);
        Ok(Self::rebuilt(cfg, k, v, view.buffer_keys, view.buffer_values, view.buffer_len()))
    }

    /// Rebuilds an owned cache from a coded view's sparse rows from `skip` on and its
    /// buffer (see [`HybridCache::from_view_after`]).
    ///
    /// # Errors
    /// As [`HybridCache::from_view_after`].
    pub fn from_view_after(
        cfg: HybridConfig,
        view: CodedHybridView<'_, X, Y, D>,
        skip: usize,
    ) -> Result<Self> {
        const OP: &str = "CodedHybridCache::from_view_after";
        view.check_shape(OP)?;
        let rpb = [view.sparse_keys.rows_per_block(), view.sparse_values.rows_per_block()];
        let shape = (view.head_dim, rpb, view.buffer_len(), view.value_scale);
        check_rebuild::<CodedStore<X, Y>, D>(OP, &cfg, shape)?;
        check_skip(OP, skip, view.sparse_len())?;
        let copy = |rows: CodedView<'_, X, Y>| -> Result<CodedStore<X, Y>> {
            let mut store = CodedStore::with_block_rows(cfg.head_dim, cfg.rows_per_block)?;
            rows.rows().skip(skip).try_for_each(|row| store.push_row(row))?;
            Ok(store)
        };
        let (k, v) = (copy(view.sparse_keys)?, copy(view.sparse_values)?);
        Ok(Self::rebuilt(cfg, k, v, view.buffer_keys, view.buffer_values, view.buffer_len()))
    }

    /// The sparse key store.
    pub fn sparse_keys(&self) -> &CodedStore<X, Y> {
        &self.sparse.keys
    }

    /// The sparse value store.
    pub fn sparse_values(&self) -> &CodedStore<X, Y> {
        &self.sparse.values
    }

    /// Everything a decode kernel reads, borrowed.
    pub fn view(&self) -> CodedHybridView<'_, X, Y, D> {
        CodedHybridView {
            head_dim: self.cfg.head_dim,
            sparse_keys: self.sparse.keys.view(),
            sparse_values: self.sparse.values.view(),
            buffer_keys: self.buffer.keys.as_slices(),
            buffer_values: self.buffer.values.as_slices(),
            value_scale: self.cfg.scales(),
        }
    }
}

impl<C: DenseCodec, D: Value> QuantHybridCache<C, D> {
    /// The quantized history rows (keys, values), oldest first.
    pub fn history(&self) -> (QuantView<'_, C>, QuantView<'_, C>) {
        (self.sparse.keys.view(), self.sparse.values.view())
    }
}

impl<const B: usize, D: Value> Hybrid<KiviRows<B>, D> {
    /// The KIVI history rows (keys, values), oldest first; keys of an incomplete group
    /// last, exact in f16.
    pub fn history(&self) -> (KiviView<'_>, KiviView<'_>) {
        (self.sparse.keys.view(), self.sparse.values.view())
    }
}

impl<const B: usize, D: Value> Hybrid<TurboQjlRows<B>, D> {
    /// The history rows (QJL-sketched keys, MSE values), oldest first.
    pub fn history(&self) -> (TurboQjlView<'_>, TurboQjlView<'_>) {
        (self.sparse.keys.view(), self.sparse.values.view())
    }
}

impl<const B: usize, D: Value> Hybrid<TurboRows<B>, D> {
    /// The TurboQuant-style history rows (keys, values), oldest first.
    pub fn history(&self) -> (TurboView<'_>, TurboView<'_>) {
        (self.sparse.keys.view(), self.sparse.values.view())
    }
}

impl<S: WholeRowStore, D: Value> Hybrid<S, D> {
    /// The history's key and value stores (rows older than the buffer, oldest first).
    pub fn history_stores(&self) -> (&S, &S) {
        (&self.sparse.keys, &self.sparse.values)
    }

    /// A cache rebuilt from its history stores and its buffer rows in token order (as a
    /// persisted file holds them), checked against `cfg`.
    ///
    /// # Errors
    /// Config errors; [`Error::ShapeMismatch`] when a store's head_dim, the key and value
    /// row counts or the buffer rows do not fit `cfg`; [`Error::LengthMismatch`] for buffer
    /// slices that are not whole rows.
    pub fn from_history(
        cfg: HybridConfig,
        (keys, values): (S, S),
        buffer_keys: &[D],
        buffer_values: &[D],
    ) -> Result<Self> {
        const OP: &str = "Hybrid::from_history";
        let d = cfg.head_dim;
        let rows = buffer_keys.len() / d.max(1);
        if !buffer_keys.len().is_multiple_of(d.max(1)) || buffer_values.len() != buffer_keys.len() {
            let (expected, got) = (rows * d, buffer_values.len());
            return Err(Error::LengthMismatch { op: OP, what: "buffer rows", expected, got });
        }
        let shape = (keys.head_dim(), [cfg.rows_per_block; 2], rows, cfg.scales());
        check_rebuild::<S, D>(OP, &cfg, shape)?;
        let checks =
            [("value head_dim", d, values.head_dim()), ("value rows", keys.len(), values.len())];
        for (what, expected, got) in checks {
            if expected != got {
                return Err(Error::ShapeMismatch { op: OP, what, expected, got });
            }
        }
        Ok(Self::rebuilt(cfg, keys, values, (buffer_keys, &[]), (buffer_values, &[]), rows))
    }
}

/// `skip` history rows must lie within the view's `rows`.
fn check_skip(op: &'static str, skip: usize, rows: usize) -> Result<()> {
    if skip > rows {
        return Err(Error::OutOfRange { op, what: "skipped history rows", index: skip, len: rows });
    }
    Ok(())
}

/// Checks a view's (head_dim, rows per block of keys and values, buffer rows, scales)
/// against the config a cache is rebuilt with.
fn check_rebuild<S: RowStore, D: Value>(
    op: &'static str,
    cfg: &HybridConfig,
    (head_dim, rows_per_block, buffer_len, scales): (usize, [usize; 2], usize, (f32, f32)),
) -> Result<()> {
    cfg.validate_store::<S, D>()?;
    let checks = [
        ("head_dim", cfg.head_dim, head_dim),
        ("key rows_per_block", cfg.rows_per_block, rows_per_block[0]),
        ("value rows_per_block", cfg.rows_per_block, rows_per_block[1]),
    ];
    for (what, expected, got) in checks {
        if expected != got {
            return Err(Error::ShapeMismatch { op, what, expected, got });
        }
    }
    if buffer_len > cfg.buffer {
        let (expected, got) = (cfg.buffer, buffer_len);
        return Err(Error::ShapeMismatch { op, what: "buffer rows", expected, got });
    }
    if scales != cfg.scales() {
        return Err(Error::ScaleMismatch { op, expected: cfg.scales(), got: scales });
    }
    Ok(())
}
