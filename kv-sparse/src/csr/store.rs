//! [`CsrStore`]: the owned, growable CSR store of pruned rows.
//!
//! SWAN (method section, Algorithm 1): an evicted dense vector is pruned to its top-k
//! magnitudes and appended to the sparse history. [`CsrStore::push_dense`] is that step;
//! rows may keep different `k` (e.g. rows pushed with [`CsrStore::push_sparse`]).

use super::{CsrView, SparseRow, check_rows_per_block, default_rows_per_block};
use crate::index::{check_ascending, check_head_dim};
use crate::memory::MemoryReport;
use crate::topk::top_k_magnitude;
use crate::value::{check_finite, check_overflow};
use crate::{Error, Result, SparseIndex, Value};

/// Owned store of sparse rows in paged blocks (see the [module docs](super)).
///
/// Appends reuse an internal scratch buffer: once the arrays have grown (or after
/// [`CsrStore::reserve`]) pushing a row does not allocate.
#[derive(Clone)]
pub struct CsrStore<I, V> {
    head_dim: usize,
    rows_per_block: usize,
    block_bases: Vec<u64>,
    offsets: Vec<u16>,
    indices: Vec<I>,
    values: Vec<V>,
    /// Top-k indices of the row being pushed.
    scratch: Vec<usize>,
    /// The kept values of the row being pushed, gathered for bulk encoding.
    gathered: Vec<f32>,
}

impl<I, V> std::fmt::Debug for CsrStore<I, V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CsrStore")
            .field("head_dim", &self.head_dim)
            .field("rows", &self.offsets.len())
            .field("nnz", &self.indices.len())
            .field("index", &std::any::type_name::<I>())
            .field("value", &std::any::type_name::<V>())
            .finish()
    }
}

impl<I: SparseIndex, V: Value> CsrStore<I, V> {
    /// An empty store for vectors of `head_dim` elements, with
    /// [`default_rows_per_block`] rows per block.
    ///
    /// # Errors
    /// [`Error::HeadDimOutOfRange`] when `head_dim` is 0, above `I::MAX_HEAD_DIM` (256 for
    /// `u8`) or above 65 535.
    ///
    /// # Examples
    /// ```
    /// use kv_sparse::csr::CsrStore;
    /// let mut s = CsrStore::<u8, half::f16>::new(4)?;
    /// s.push_dense(&[0.1, -5.0, 2.0, 0.0], 2)?;
    /// assert_eq!(s.row(0).unwrap().indices, &[1, 2]);
    /// assert!(CsrStore::<u8, half::f16>::new(300).is_err()); // needs u16 indices
    /// # Ok::<(), kv_sparse::Error>(())
    /// ```
    pub fn new(head_dim: usize) -> Result<Self> {
        check_head_dim::<I>("CsrStore::new", head_dim)?;
        Self::with_block_rows(head_dim, default_rows_per_block(head_dim))
    }

    /// An empty store with an explicit number of rows per block.
    ///
    /// # Errors
    /// As [`CsrStore::new`], plus [`Error::RowsPerBlockOutOfRange`] when `rows_per_block`
    /// is 0 or above [`super::max_rows_per_block`]`(head_dim)`.
    pub fn with_block_rows(head_dim: usize, rows_per_block: usize) -> Result<Self> {
        const OP: &str = "CsrStore::with_block_rows";
        check_head_dim::<I>(OP, head_dim)?;
        check_rows_per_block(OP, head_dim, rows_per_block)?;
        Ok(Self {
            head_dim,
            rows_per_block,
            block_bases: Vec::new(),
            offsets: Vec::new(),
            indices: Vec::new(),
            values: Vec::new(),
            scratch: Vec::with_capacity(head_dim),
            gathered: Vec::with_capacity(head_dim),
        })
    }

    /// A store holding a copy of `view`'s rows (e.g. to keep appending to a mapped cache).
    pub fn from_view(view: CsrView<'_, I, V>) -> Self {
        Self {
            head_dim: view.head_dim(),
            rows_per_block: view.rows_per_block(),
            block_bases: view.block_bases().to_vec(),
            offsets: view.offsets().to_vec(),
            indices: view.indices().to_vec(),
            values: view.values().to_vec(),
            scratch: Vec::with_capacity(view.head_dim()),
            gathered: Vec::with_capacity(view.head_dim()),
        }
    }

    /// Prunes the dense vector `x` to its `k` largest magnitudes (ties → lower index) and
    /// appends the result as one row.
    ///
    /// # Errors
    /// [`Error::LengthMismatch`] when `x.len() != head_dim`; [`Error::KTooLarge`] when
    /// `k > head_dim`; [`Error::NonFinite`] for NaN/±∞ in `x`; [`Error::Overflow`] when a
    /// kept value does not fit `V`. The store is unchanged on error.
    ///
    /// # Examples
    /// ```
    /// let mut s = kv_sparse::csr::CsrStore::<u8, f32>::new(3)?;
    /// s.push_dense(&[1.0, -4.0, 2.0], 2)?;
    /// let mut dense = [0.0; 3];
    /// s.to_dense_row(0, &mut dense)?;
    /// assert_eq!(dense, [0.0, -4.0, 2.0]);
    /// # Ok::<(), kv_sparse::Error>(())
    /// ```
    pub fn push_dense(&mut self, x: &[f32], k: usize) -> Result<()> {
        const OP: &str = "CsrStore::push_dense";
        self.check_len(OP, "x", x.len())?;
        if k > self.head_dim {
            return Err(Error::KTooLarge { op: OP, k, head_dim: self.head_dim });
        }
        let max_abs = check_finite(OP, x)?;
        if k > 0 {
            check_overflow::<V>(OP, max_abs)?;
        }
        top_k_magnitude(x, k, &mut self.scratch)?;
        self.gathered.clear();
        self.gathered.extend(self.scratch.iter().map(|&i| x[i]));
        self.begin_row();
        self.indices.extend(self.scratch.iter().map(|&i| I::from_usize(i)));
        let start = self.values.len();
        self.values.resize(start + k, V::default());
        V::encode_into(&self.gathered, &mut self.values[start..]);
        Ok(())
    }

    /// Appends a row given as strictly ascending `indices` (each `< head_dim`) and their
    /// values.
    ///
    /// # Errors
    /// [`Error::LengthMismatch`] when the slices differ in length;
    /// [`Error::InvalidSparseIndex`] for an index not ascending or not below `head_dim`;
    /// [`Error::NonFinite`] / [`Error::Overflow`] for values. Unchanged on error.
    ///
    /// # Examples
    /// ```
    /// let mut s = kv_sparse::csr::CsrStore::<u16, f32>::new(1000)?;
    /// s.push_sparse(&[3, 999], &[0.5, -1.0])?;
    /// assert!(s.push_sparse(&[5, 5], &[1.0, 1.0]).is_err());
    /// # Ok::<(), kv_sparse::Error>(())
    /// ```
    pub fn push_sparse(&mut self, indices: &[usize], values: &[f32]) -> Result<()> {
        const OP: &str = "CsrStore::push_sparse";
        if indices.len() != values.len() {
            return Err(Error::LengthMismatch {
                op: OP,
                what: "values",
                expected: indices.len(),
                got: values.len(),
            });
        }
        self.check_indices(OP, indices)?;
        let max_abs = check_finite(OP, values)?;
        if !values.is_empty() {
            check_overflow::<V>(OP, max_abs)?;
        }
        self.begin_row();
        self.indices.extend(indices.iter().map(|&i| I::from_usize(i)));
        let start = self.values.len();
        self.values.resize(start + values.len(), V::default());
        V::encode_into(values, &mut self.values[start..]);
        Ok(())
    }

    /// Appends a row of another store or view as it is stored (values copied, not
    /// re-encoded).
    ///
    /// # Errors
    /// [`Error::LengthMismatch`] when the row holds more values than indices or the
    /// reverse; [`Error::InvalidSparseIndex`] for an index not ascending or not below
    /// `head_dim`; [`Error::NonFinite`] for a value that is not finite. Unchanged on error.
    pub fn push_row(&mut self, row: SparseRow<'_, I, V>) -> Result<()> {
        const OP: &str = "CsrStore::push_row";
        if row.indices.len() != row.values.len() {
            let (expected, got) = (row.indices.len(), row.values.len());
            return Err(Error::LengthMismatch { op: OP, what: "values", expected, got });
        }
        check_ascending(OP, row.indices.iter().map(|i| i.to_usize()), self.head_dim)?;
        if let Some((position, v)) =
            row.values.iter().map(|v| v.to_f32()).enumerate().find(|(_, v)| !v.is_finite())
        {
            return Err(Error::NonFinite { op: OP, position, value: v });
        }
        self.begin_row();
        self.indices.extend_from_slice(row.indices);
        self.values.extend_from_slice(row.values);
        Ok(())
    }

    fn check_indices(&self, op: &'static str, indices: &[usize]) -> Result<()> {
        check_ascending(op, indices.iter().copied(), self.head_dim)
    }

    fn check_len(&self, op: &'static str, what: &'static str, got: usize) -> Result<()> {
        if got != self.head_dim {
            return Err(Error::LengthMismatch { op, what, expected: self.head_dim, got });
        }
        Ok(())
    }

    /// Opens a new row at the current end (starting a new block when the last is full).
    fn begin_row(&mut self) {
        let nnz = self.indices.len();
        if self.offsets.len().is_multiple_of(self.rows_per_block) {
            self.block_bases.push(nnz as u64);
        }
        let base = *self.block_bases.last().expect("a block was just ensured") as usize;
        // rows_per_block · head_dim ≤ 65535, so a row start always fits u16.
        self.offsets.push((nnz - base) as u16);
    }

    /// Number of rows.
    pub fn len(&self) -> usize {
        self.offsets.len()
    }

    /// True when no rows are stored.
    pub fn is_empty(&self) -> bool {
        self.offsets.is_empty()
    }

    /// Dimension of the dense vectors.
    pub fn head_dim(&self) -> usize {
        self.head_dim
    }

    /// Rows per block.
    pub fn rows_per_block(&self) -> usize {
        self.rows_per_block
    }

    /// Total stored entries.
    pub fn nnz(&self) -> usize {
        self.indices.len()
    }

    /// Keeps the first `rows` rows (no-op when `rows >= len`).
    pub fn truncate(&mut self, rows: usize) {
        if rows >= self.len() {
            return;
        }
        // Entry position where row `rows` starts: its block base plus its offset.
        let block = rows / self.rows_per_block;
        let end = self.block_bases[block] as usize + usize::from(self.offsets[rows]);
        self.offsets.truncate(rows);
        self.block_bases.truncate(rows.div_ceil(self.rows_per_block));
        self.indices.truncate(end);
        self.values.truncate(end);
    }

    /// Removes all rows (keeps the allocations).
    pub fn clear(&mut self) {
        self.truncate(0);
    }

    /// Reserves room for `rows` more rows holding `nnz` more entries in total.
    pub fn reserve(&mut self, rows: usize, nnz: usize) {
        self.offsets.reserve(rows);
        self.block_bases.reserve(rows.div_ceil(self.rows_per_block) + 1);
        self.indices.reserve(nnz);
        self.values.reserve(nnz);
    }

    /// Releases unused capacity.
    pub fn shrink_to_fit(&mut self) {
        self.offsets.shrink_to_fit();
        self.block_bases.shrink_to_fit();
        self.indices.shrink_to_fit();
        self.values.shrink_to_fit();
    }

    /// Borrowed view of all rows.
    pub fn view(&self) -> CsrView<'_, I, V> {
        CsrView::from_parts_unchecked(
            self.head_dim,
            self.rows_per_block,
            &self.block_bases,
            &self.offsets,
            &self.indices,
            &self.values,
        )
    }

    /// Row `i`, or `None` when out of range.
    pub fn row(&self, i: usize) -> Option<SparseRow<'_, I, V>> {
        self.view().row(i)
    }

    /// Decodes row `i` into the dense `out` (zeros at pruned positions).
    ///
    /// # Errors
    /// [`Error::OutOfRange`] when `i >= len`; [`Error::LengthMismatch`] when
    /// `out.len() != head_dim`.
    pub fn to_dense_row(&self, i: usize, out: &mut [f32]) -> Result<()> {
        const OP: &str = "CsrStore::to_dense_row";
        self.check_len(OP, "out", out.len())?;
        let row = self.row(i).ok_or(Error::OutOfRange {
            op: OP,
            what: "row",
            index: i,
            len: self.len(),
        })?;
        row.scatter_into(out)
    }

    /// Bytes held, split by role (see [`MemoryReport`]).
    pub fn memory(&self) -> MemoryReport {
        let (nnz, rows, blocks) = (self.nnz(), self.len(), self.block_bases.len());
        let slack = (self.values.capacity() - nnz) * V::FORMAT.bytes()
            + (self.indices.capacity() - nnz) * I::BYTES
            + (self.offsets.capacity() - rows) * 2
            + (self.block_bases.capacity() - blocks) * 8
            + self.scratch.capacity() * std::mem::size_of::<usize>()
            + self.gathered.capacity() * std::mem::size_of::<f32>();
        MemoryReport {
            value_bytes: nnz * V::FORMAT.bytes(),
            index_bytes: nnz * I::BYTES,
            scale_bytes: 0,
            offset_bytes: rows * 2,
            block_header_bytes: blocks * 8,
            dense_bytes: 0,
            capacity_slack_bytes: slack,
        }
    }
}
