//! [`RowStore`]: what the hybrid cache needs from its sparse history's storage, so the one
//! cache logic (SWAN Algorithm 1: buffer, evict, prune, append) serves every row encoding —
//! CSR rows ([`CsrStore`], the paper's `u8`/`u16` indices with per-element values) and
//! coded rows ([`CodedStore`]: index lists or bitmasks with f16/bf16/fp8/int8/int4 values)
//! and dense quantized rows ([`QuantRows`]: every component in `q8_0` / `q4_0` blocks or
//! scaled fp8, the history of a buffered quantized cache such as KIVI's fp16 residual over
//! quantized tokens, arXiv 2402.02750 §3.3).

use crate::coded::{CodedStore, IndexCode, ValueCode};
use crate::csr::{CsrStore, check_rows_per_block, default_rows_per_block};
use crate::decoded::Side;
use crate::index::check_head_dim;
use crate::kivi::KiviRows;
use crate::memory::MemoryReport;
use crate::quant::{DenseCodec, QuantRows};
use crate::turbo::{TurboQjlRows, TurboRows};
use crate::value::check_overflow;
use crate::{Error, Result, SparseIndex, Value};

mod private {
    /// Seals [`super::RowStore`].
    pub trait Sealed {}
    impl<I, V> Sealed for crate::csr::CsrStore<I, V> {}
    impl<X, Y> Sealed for crate::coded::CodedStore<X, Y> {}
    impl<C> Sealed for crate::quant::QuantRows<C> {}
    impl<const B: usize> Sealed for crate::kivi::KiviRows<B> {}
    impl<const B: usize> Sealed for crate::turbo::TurboRows<B> {}
    impl<const B: usize> Sealed for crate::turbo::TurboQjlRows<B> {}
}

/// Storage of one side (keys or values) of a hybrid cache's history. Sealed: [`CsrStore`],
/// [`CodedStore`], [`QuantRows`], [`KiviRows`] and [`TurboRows`].
pub trait RowStore: private::Sealed + Clone + std::fmt::Debug + Send + Sync + 'static {
    /// Default rows per block for `head_dim`.
    fn default_rows_per_block(head_dim: usize) -> usize;

    /// Checks the parts of a config this storage constrains: `head_dim` for the index
    /// type, rows per block, and each `k`.
    ///
    /// # Errors
    /// [`Error::HeadDimOutOfRange`], [`Error::RowsPerBlockOutOfRange`], [`Error::KTooLarge`],
    /// [`Error::OddK`].
    fn check_config(
        op: &'static str,
        head_dim: usize,
        rows_per_block: usize,
        ks: [usize; 2],
    ) -> Result<()>;

    /// Checks that a row whose largest magnitude is `max_abs` encodes finitely.
    ///
    /// # Errors
    /// [`Error::Overflow`] / [`Error::ScaleOverflow`].
    fn check_overflow(op: &'static str, max_abs: f32) -> Result<()>;

    /// An empty store.
    ///
    /// # Errors
    /// As [`RowStore::check_config`].
    fn empty(head_dim: usize, rows_per_block: usize) -> Result<Self>;

    /// An empty store for one side of a history (keys or values): [`RowStore::empty`]
    /// unless the format codes the two sides differently (KIVI).
    ///
    /// # Errors
    /// As [`RowStore::check_config`].
    fn empty_side(side: Side, head_dim: usize, rows_per_block: usize) -> Result<Self> {
        let _ = side;
        Self::empty(head_dim, rows_per_block)
    }

    /// Prunes `x` to its top-`k` magnitudes and appends it (all-or-nothing).
    ///
    /// # Errors
    /// The store's input errors.
    fn push_dense(&mut self, x: &[f32], k: usize) -> Result<()>;

    /// Appends a row given as strictly ascending `indices` and their values
    /// (all-or-nothing).
    ///
    /// # Errors
    /// The store's input errors.
    fn push_sparse(&mut self, indices: &[usize], values: &[f32]) -> Result<()>;

    /// Rows held.
    fn len(&self) -> usize;

    /// True when no row is held.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Elements of the dense vectors.
    fn head_dim(&self) -> usize;

    /// Keeps the first `rows` rows.
    fn truncate(&mut self, rows: usize);

    /// Reserves room for `rows` more rows with `nnz` kept entries in total.
    fn reserve(&mut self, rows: usize, nnz: usize);

    /// Bytes held.
    fn memory(&self) -> MemoryReport;
}

fn check_ks(op: &'static str, head_dim: usize, ks: [usize; 2]) -> Result<()> {
    for k in ks {
        if k > head_dim {
            return Err(Error::KTooLarge { op, k, head_dim });
        }
    }
    Ok(())
}

impl<I: SparseIndex, V: Value> RowStore for CsrStore<I, V> {
    fn default_rows_per_block(head_dim: usize) -> usize {
        default_rows_per_block(head_dim)
    }

    fn check_config(
        op: &'static str,
        head_dim: usize,
        rows_per_block: usize,
        ks: [usize; 2],
    ) -> Result<()> {
        check_head_dim::<I>(op, head_dim)?;
        check_ks(op, head_dim, ks)?;
        check_rows_per_block(op, head_dim, rows_per_block)
    }

    fn check_overflow(op: &'static str, max_abs: f32) -> Result<()> {
        check_overflow::<V>(op, max_abs)
    }

    fn empty(head_dim: usize, rows_per_block: usize) -> Result<Self> {
        CsrStore::with_block_rows(head_dim, rows_per_block)
    }

    fn push_dense(&mut self, x: &[f32], k: usize) -> Result<()> {
        CsrStore::push_dense(self, x, k)
    }

    fn push_sparse(&mut self, indices: &[usize], values: &[f32]) -> Result<()> {
        CsrStore::push_sparse(self, indices, values)
    }

    fn len(&self) -> usize {
        CsrStore::len(self)
    }

    fn head_dim(&self) -> usize {
        CsrStore::head_dim(self)
    }

    fn truncate(&mut self, rows: usize) {
        CsrStore::truncate(self, rows);
    }

    fn reserve(&mut self, rows: usize, nnz: usize) {
        CsrStore::reserve(self, rows, nnz);
    }

    fn memory(&self) -> MemoryReport {
        CsrStore::memory(self)
    }
}

impl<X: IndexCode, Y: ValueCode> RowStore for CodedStore<X, Y> {
    fn default_rows_per_block(head_dim: usize) -> usize {
        CodedStore::<X, Y>::default_rows_per_block(head_dim)
    }

    fn check_config(
        op: &'static str,
        head_dim: usize,
        rows_per_block: usize,
        ks: [usize; 2],
    ) -> Result<()> {
        let max = X::MAX_HEAD_DIM.min(crate::MAX_HEAD_DIM);
        if head_dim == 0 || head_dim > max {
            return Err(Error::HeadDimOutOfRange { op, head_dim, max });
        }
        check_ks(op, head_dim, ks)?;
        for k in ks {
            Y::check_k(op, k)?;
        }
        let max = CodedStore::<X, Y>::max_rows_per_block(head_dim);
        if rows_per_block == 0 || rows_per_block > max {
            return Err(Error::RowsPerBlockOutOfRange { op, rows_per_block, head_dim, max });
        }
        Ok(())
    }

    fn check_overflow(op: &'static str, max_abs: f32) -> Result<()> {
        if max_abs >= Y::OVERFLOW_AT {
            return Err(Error::ScaleOverflow {
                op,
                format: Y::KIND.to_string(),
                value: max_abs,
                limit: Y::OVERFLOW_AT,
            });
        }
        Ok(())
    }

    fn empty(head_dim: usize, rows_per_block: usize) -> Result<Self> {
        CodedStore::with_block_rows(head_dim, rows_per_block)
    }

    fn push_dense(&mut self, x: &[f32], k: usize) -> Result<()> {
        CodedStore::push_dense(self, x, k)
    }

    fn push_sparse(&mut self, indices: &[usize], values: &[f32]) -> Result<()> {
        CodedStore::push_sparse(self, indices, values)
    }

    fn len(&self) -> usize {
        CodedStore::len(self)
    }

    fn head_dim(&self) -> usize {
        CodedStore::head_dim(self)
    }

    fn truncate(&mut self, rows: usize) {
        CodedStore::truncate(self, rows);
    }

    fn reserve(&mut self, rows: usize, nnz: usize) {
        CodedStore::reserve(self, rows, nnz);
    }

    fn memory(&self) -> MemoryReport {
        CodedStore::memory(self)
    }
}

/// The [`RowStore`] methods every whole-row code store shares: whole rows checked and pushed
/// through the store's own `push` (sparse rows scattered into zeros first), overflow checked
/// against the format's limit, the rest delegated to the store's inherent methods of the
/// same names.
macro_rules! whole_row_methods {
    ($store:literal, $limit:expr, $format:expr) => {
        fn check_overflow(op: &'static str, max_abs: f32) -> Result<()> {
            if max_abs >= $limit {
                let (format, limit) = ($format, $limit);
                return Err(Error::ScaleOverflow { op, format, value: max_abs, limit });
            }
            Ok(())
        }

        fn push_dense(&mut self, x: &[f32], k: usize) -> Result<()> {
            check_whole_row(concat!($store, "::push_dense"), self.head_dim(), x, k)?;
            self.push(x)
        }

        fn push_sparse(&mut self, indices: &[usize], values: &[f32]) -> Result<()> {
            let op = concat!($store, "::push_sparse");
            self.push(&scattered(op, self.head_dim(), indices, values)?)
        }

        fn len(&self) -> usize {
            Self::len(self)
        }

        fn head_dim(&self) -> usize {
            Self::head_dim(self)
        }

        fn truncate(&mut self, rows: usize) {
            Self::truncate(self, rows);
        }

        fn reserve(&mut self, rows: usize, _nnz: usize) {
            Self::reserve(self, rows);
        }

        fn memory(&self) -> MemoryReport {
            Self::memory(self)
        }
    };
}

/// Dense quantized rows as a history: every component of an evicted row is kept (`k` must be
/// `head_dim`), encoded by the codec `C`. Rows per block are not a notion of this storage:
/// any positive value is accepted and ignored.
impl<C: DenseCodec> RowStore for QuantRows<C> {
    fn default_rows_per_block(_head_dim: usize) -> usize {
        1
    }

    fn check_config(
        op: &'static str,
        head_dim: usize,
        rows_per_block: usize,
        ks: [usize; 2],
    ) -> Result<()> {
        C::check_head_dim(op, head_dim)?;
        check_full_rows(op, head_dim, ks)?;
        if rows_per_block == 0 {
            return Err(Error::RowsPerBlockOutOfRange { op, rows_per_block, head_dim, max: 1 });
        }
        Ok(())
    }

    fn empty(head_dim: usize, _rows_per_block: usize) -> Result<Self> {
        QuantRows::new(head_dim)
    }

    whole_row_methods!("QuantRows", C::OVERFLOW_AT, C::FORMAT.to_string());
}

/// Every component of a row must be kept by a dense coded history.
fn check_full_rows(op: &'static str, head_dim: usize, ks: [usize; 2]) -> Result<()> {
    for k in ks {
        if k > head_dim {
            return Err(Error::KTooLarge { op, k, head_dim });
        }
        if k != head_dim {
            return Err(Error::PartialDenseRow { op, k, head_dim });
        }
    }
    Ok(())
}

/// Checks a row pushed whole into a dense coded history: every component kept, one row.
fn check_whole_row(op: &'static str, head_dim: usize, x: &[f32], k: usize) -> Result<()> {
    check_full_rows(op, head_dim, [k, k])?;
    if x.len() != head_dim {
        return Err(Error::LengthMismatch { op, what: "row", expected: head_dim, got: x.len() });
    }
    Ok(())
}

/// A whole row from `(index, value)` entries (zeros elsewhere), checked as a sparse row.
fn scattered(op: &'static str, d: usize, indices: &[usize], values: &[f32]) -> Result<Vec<f32>> {
    if indices.len() != values.len() {
        let (expected, got) = (indices.len(), values.len());
        return Err(Error::LengthMismatch { op, what: "values", expected, got });
    }
    let mut row = vec![0.0f32; d];
    for (n, (&i, &x)) in indices.iter().zip(values).enumerate() {
        let reason = if i >= d {
            "not below head_dim"
        } else if n > 0 && i <= indices[n - 1] {
            "not strictly ascending"
        } else {
            ""
        };
        if !reason.is_empty() {
            return Err(Error::InvalidSparseIndex { op, position: n, index: i, reason });
        }
        row[i] = x;
    }
    Ok(row)
}

/// KIVI rows as a history: every component kept; `rows_per_block` is the group (tokens per
/// key group, channels per value group); the side decides the grouping.
impl<const B: usize> RowStore for KiviRows<B> {
    fn default_rows_per_block(_head_dim: usize) -> usize {
        32
    }

    fn check_config(
        op: &'static str,
        head_dim: usize,
        rows_per_block: usize,
        ks: [usize; 2],
    ) -> Result<()> {
        crate::kivi::check_layout(op, B, head_dim, rows_per_block)?;
        check_full_rows(op, head_dim, ks)
    }

    fn empty(head_dim: usize, rows_per_block: usize) -> Result<Self> {
        KiviRows::new(Side::Keys, head_dim, rows_per_block)
    }

    fn empty_side(side: Side, head_dim: usize, rows_per_block: usize) -> Result<Self> {
        KiviRows::new(side, head_dim, rows_per_block)
    }

    whole_row_methods!("KiviRows", crate::kivi::OVERFLOW_AT, format!("kivi{B}"));
}

/// TurboQuant-style rows as a history: every component kept; no blocks (any positive
/// `rows_per_block` is accepted and ignored).
impl<const B: usize> RowStore for TurboRows<B> {
    fn default_rows_per_block(_head_dim: usize) -> usize {
        1
    }

    fn check_config(
        op: &'static str,
        head_dim: usize,
        rows_per_block: usize,
        ks: [usize; 2],
    ) -> Result<()> {
        crate::turbo::check_layout(op, B, head_dim)?;
        check_full_rows(op, head_dim, ks)?;
        if rows_per_block == 0 {
            return Err(Error::RowsPerBlockOutOfRange { op, rows_per_block, head_dim, max: 1 });
        }
        Ok(())
    }

    fn empty(head_dim: usize, _rows_per_block: usize) -> Result<Self> {
        TurboRows::new(head_dim)
    }

    whole_row_methods!("TurboRows", crate::turbo::OVERFLOW_AT, format!("turbo{B}"));
}

/// The history format of a hybrid cache whose history keeps every component of a row
/// ([`WholeRowStore`]): what a persisted file names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum HistoryFormat {
    /// Dense quantized rows ([`QuantRows`]).
    Quant(crate::quant::DenseFormat),
    /// KIVI codes at `bits` bits ([`KiviRows`]).
    Kivi {
        /// 2 or 4.
        bits: usize,
    },
    /// TurboQuant-style codes at `bits` bits ([`TurboRows`]).
    Turbo {
        /// 2, 3 or 4.
        bits: usize,
    },
    /// TurboQuant's inner-product keys at `bits` bits (`bits − 1` of codes plus the QJL
    /// sign sketch) and MSE values at `bits` bits ([`TurboQjlRows`]).
    TurboQjl {
        /// 2, 3 or 4.
        bits: usize,
    },
}

impl std::fmt::Display for HistoryFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HistoryFormat::Quant(format) => write!(f, "{format} rows"),
            HistoryFormat::Kivi { bits } => write!(f, "kivi{bits}"),
            HistoryFormat::Turbo { bits } => write!(f, "turbo{bits}"),
            HistoryFormat::TurboQjl { bits } => write!(f, "turbo{bits} qjl"),
        }
    }
}

impl HistoryFormat {
    /// Rows held by `bytes` coded bytes of one side (`rows_per_block` the KIVI group),
    /// `None` when they are not whole units.
    pub fn coded_rows(
        &self,
        side: Side,
        head_dim: usize,
        rows_per_block: usize,
        bytes: usize,
    ) -> Option<usize> {
        // Each store's own unit formula (bits outside a family's set hold no rows).
        let (d, g) = (head_dim, rows_per_block);
        let (unit, rows) = match *self {
            HistoryFormat::Quant(format) => (format.row_bytes(d), 1),
            HistoryFormat::Kivi { bits: 2 } => KiviRows::<2>::unit(side, d, g),
            HistoryFormat::Kivi { bits: 4 } => KiviRows::<4>::unit(side, d, g),
            HistoryFormat::Turbo { bits: 2 } => (TurboRows::<2>::row_bytes(d), 1),
            HistoryFormat::Turbo { bits: 3 } => (TurboRows::<3>::row_bytes(d), 1),
            HistoryFormat::Turbo { bits: 4 } => (TurboRows::<4>::row_bytes(d), 1),
            HistoryFormat::TurboQjl { bits: 2 } => (TurboQjlRows::<2>::row_bytes(side, d), 1),
            HistoryFormat::TurboQjl { bits: 3 } => (TurboQjlRows::<3>::row_bytes(side, d), 1),
            HistoryFormat::TurboQjl { bits: 4 } => (TurboQjlRows::<4>::row_bytes(side, d), 1),
            _ => return None,
        };
        (unit > 0 && bytes.is_multiple_of(unit)).then(|| bytes / unit * rows)
    }
}

/// A history that keeps every component of a row in codes of whole rows — dense quantized
/// rows, KIVI, TurboQuant-style — as [`crate::persist`] writes and reads it: its format,
/// its coded bytes and (KIVI keys) the rows waiting uncoded in f16, and the way back.
pub trait WholeRowStore: RowStore {
    /// The format a persisted file names.
    const HISTORY: HistoryFormat;

    /// The coded bytes, as held.
    fn coded_bytes(&self) -> &[u8];

    /// Rows waiting uncoded in f16, row-major (KIVI keys; empty otherwise).
    fn waiting_rows(&self) -> &[half::f16] {
        &[]
    }

    /// One side rebuilt from its coded bytes and waiting rows, checked as untrusted input.
    ///
    /// # Errors
    /// The store's layout errors; [`Error::Corrupt`] for bytes that are not whole rows or
    /// hold a non-finite or zero scale; waiting rows for a store that keeps none.
    fn from_parts(
        side: Side,
        head_dim: usize,
        rows_per_block: usize,
        bytes: &[u8],
        waiting: &[half::f16],
    ) -> Result<Self>;
}

/// Whole-row stores without waiting rows refuse them.
fn no_waiting(what: &str, waiting: &[half::f16]) -> Result<()> {
    if waiting.is_empty() {
        return Ok(());
    }
    Err(Error::Corrupt { reason: format!("{} waiting elements for {what}", waiting.len()) })
}

impl<C: DenseCodec> WholeRowStore for QuantRows<C> {
    const HISTORY: HistoryFormat = HistoryFormat::Quant(C::FORMAT);

    fn coded_bytes(&self) -> &[u8] {
        self.view().bytes()
    }

    fn from_parts(
        _side: Side,
        head_dim: usize,
        _rows_per_block: usize,
        bytes: &[u8],
        waiting: &[half::f16],
    ) -> Result<Self> {
        no_waiting("quantized rows", waiting)?;
        let view = crate::quant::QuantView::<C>::from_bytes(head_dim, bytes)?;
        Ok(QuantRows::from_view(view))
    }
}

impl<const B: usize> WholeRowStore for KiviRows<B> {
    const HISTORY: HistoryFormat = HistoryFormat::Kivi { bits: B };

    fn coded_bytes(&self) -> &[u8] {
        KiviRows::coded_bytes(self)
    }

    fn waiting_rows(&self) -> &[half::f16] {
        KiviRows::waiting_rows(self)
    }

    fn from_parts(
        side: Side,
        head_dim: usize,
        rows_per_block: usize,
        bytes: &[u8],
        waiting: &[half::f16],
    ) -> Result<Self> {
        KiviRows::from_parts(side, head_dim, rows_per_block, bytes, waiting)
    }
}

impl<const B: usize> WholeRowStore for TurboRows<B> {
    const HISTORY: HistoryFormat = HistoryFormat::Turbo { bits: B };

    fn coded_bytes(&self) -> &[u8] {
        TurboRows::bytes(self)
    }

    fn from_parts(
        _side: Side,
        head_dim: usize,
        _rows_per_block: usize,
        bytes: &[u8],
        waiting: &[half::f16],
    ) -> Result<Self> {
        no_waiting("turbo rows", waiting)?;
        TurboRows::from_bytes(head_dim, bytes)
    }
}

/// TurboQuant's inner-product keys (QJL sketch) and MSE values as a history: every
/// component kept; no blocks; the side decides the code.
impl<const B: usize> RowStore for TurboQjlRows<B> {
    fn default_rows_per_block(_head_dim: usize) -> usize {
        1
    }

    fn check_config(
        op: &'static str,
        head_dim: usize,
        rows_per_block: usize,
        ks: [usize; 2],
    ) -> Result<()> {
        crate::turbo::check_qjl_layout(op, B, head_dim)?;
        check_full_rows(op, head_dim, ks)?;
        if rows_per_block == 0 {
            return Err(Error::RowsPerBlockOutOfRange { op, rows_per_block, head_dim, max: 1 });
        }
        Ok(())
    }

    fn empty(head_dim: usize, _rows_per_block: usize) -> Result<Self> {
        TurboQjlRows::new(Side::Keys, head_dim)
    }

    fn empty_side(side: Side, head_dim: usize, _rows_per_block: usize) -> Result<Self> {
        TurboQjlRows::new(side, head_dim)
    }

    whole_row_methods!("TurboQjlRows", crate::turbo::OVERFLOW_AT, format!("turbo{B} qjl"));
}

impl<const B: usize> WholeRowStore for TurboQjlRows<B> {
    const HISTORY: HistoryFormat = HistoryFormat::TurboQjl { bits: B };

    fn coded_bytes(&self) -> &[u8] {
        TurboQjlRows::bytes(self)
    }

    fn from_parts(
        side: Side,
        head_dim: usize,
        _rows_per_block: usize,
        bytes: &[u8],
        waiting: &[half::f16],
    ) -> Result<Self> {
        no_waiting("turbo qjl rows", waiting)?;
        TurboQjlRows::from_bytes(side, head_dim, bytes)
    }
}
