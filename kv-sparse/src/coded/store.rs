//! [`CodedStore`] (owned, growable), [`CodedView`] (borrowed, what kernels read) and
//! [`CodedRow`] (one row) of SWAN rows in any [`IndexCode`] × [`ValueCode`] encoding.
//!
//! Rows are paged like CSR rows (SWAN method section, "Memory footprint"): a u64 byte base
//! per block of `rows_per_block` rows and a u16 byte offset per row relative to its block;
//! the rows' bytes are contiguous, so a view is three slices.

use std::marker::PhantomData;

use super::{IndexCode, ValueCode};
use crate::index::{MAX_HEAD_DIM, check_ascending};
use crate::memory::MemoryReport;
use crate::topk::top_k_magnitude;
use crate::value::check_finite;
use crate::{Error, Result};

/// Largest byte count of one block (row offsets are u16).
const MAX_BLOCK_BYTES: usize = u16::MAX as usize;

/// Bytes of the largest row (`k = head_dim`).
fn max_row_bytes<X: IndexCode, Y: ValueCode>(head_dim: usize) -> usize {
    X::bytes(head_dim, head_dim) + Y::bytes(head_dim)
}

fn check_head_dim<X: IndexCode>(op: &'static str, head_dim: usize) -> Result<()> {
    let max = X::MAX_HEAD_DIM.min(MAX_HEAD_DIM);
    if head_dim == 0 || head_dim > max {
        return Err(Error::HeadDimOutOfRange { op, head_dim, max });
    }
    Ok(())
}

/// The `k` a row of `len` bytes holds, or `None` when its length fits no `k`.
fn row_k<X: IndexCode, Y: ValueCode>(len: usize, head_dim: usize) -> Option<usize> {
    let rest = len.checked_sub(X::fixed_bytes(head_dim))?;
    Y::k_for(rest, X::ENTRY_BYTES).filter(|&k| k <= head_dim)
}

/// Owned store of coded rows (see the [module docs](super)).
pub struct CodedStore<X, Y> {
    head_dim: usize,
    rows_per_block: usize,
    block_bases: Vec<u64>,
    offsets: Vec<u16>,
    bytes: Vec<u8>,
    /// Kept entries over all rows, and rows keeping at least one.
    entries: usize,
    nonempty: usize,
    scratch: Vec<usize>,
    gathered: Vec<f32>,
    codes: PhantomData<fn() -> (X, Y)>,
}

impl<X, Y> Clone for CodedStore<X, Y> {
    fn clone(&self) -> Self {
        Self {
            head_dim: self.head_dim,
            rows_per_block: self.rows_per_block,
            block_bases: self.block_bases.clone(),
            offsets: self.offsets.clone(),
            bytes: self.bytes.clone(),
            entries: self.entries,
            nonempty: self.nonempty,
            scratch: self.scratch.clone(),
            gathered: self.gathered.clone(),
            codes: PhantomData,
        }
    }
}

impl<X, Y> std::fmt::Debug for CodedStore<X, Y> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CodedStore")
            .field("head_dim", &self.head_dim)
            .field("rows", &self.offsets.len())
            .field("index", &std::any::type_name::<X>())
            .field("value", &std::any::type_name::<Y>())
            .finish()
    }
}

impl<X: IndexCode, Y: ValueCode> CodedStore<X, Y> {
    /// Largest `rows_per_block` for `head_dim` (a block of full rows stays ≤ 65 535 bytes).
    pub fn max_rows_per_block(head_dim: usize) -> usize {
        MAX_BLOCK_BYTES / max_row_bytes::<X, Y>(head_dim).max(1)
    }

    /// Default `rows_per_block`: 256, or fewer where [`CodedStore::max_rows_per_block`]
    /// requires.
    pub fn default_rows_per_block(head_dim: usize) -> usize {
        Self::max_rows_per_block(head_dim).min(256)
    }

    /// An empty store with [`CodedStore::default_rows_per_block`] rows per block.
    ///
    /// # Errors
    /// [`Error::HeadDimOutOfRange`] (0, or above what the index code names).
    ///
    /// # Examples
    /// ```
    /// use kv_sparse::coded::{Bitmask, CodedStore, Int8Values};
    /// let mut s = CodedStore::<Bitmask, Int8Values>::new(16)?;
    /// s.push_dense(&[0.0, 3.0, 0.0, -1.0, 0.5, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 2.0, 0.0], 2)?;
    /// let mut dense = [0.0; 16];
    /// s.view().row(0).unwrap().scatter_into(&mut dense)?;
    /// assert!((dense[1] - 3.0).abs() < 0.02 && (dense[14] - 2.0).abs() < 0.02); // int8 steps of 3/127
    /// assert_eq!(dense[3], 0.0); // pruned
    /// assert_eq!(s.memory().sparse_formula_bytes(), 2 + 2 + 2 + 2); // mask + 2 codes + scale + offset
    /// # Ok::<(), kv_sparse::Error>(())
    /// ```
    pub fn new(head_dim: usize) -> Result<Self> {
        check_head_dim::<X>("CodedStore::new", head_dim)?;
        Self::with_block_rows(head_dim, Self::default_rows_per_block(head_dim))
    }

    /// An empty store with an explicit number of rows per block.
    ///
    /// # Errors
    /// As [`CodedStore::new`], plus [`Error::RowsPerBlockOutOfRange`].
    pub fn with_block_rows(head_dim: usize, rows_per_block: usize) -> Result<Self> {
        const OP: &str = "CodedStore::with_block_rows";
        check_head_dim::<X>(OP, head_dim)?;
        let max = Self::max_rows_per_block(head_dim);
        if rows_per_block == 0 || rows_per_block > max {
            return Err(Error::RowsPerBlockOutOfRange { op: OP, rows_per_block, head_dim, max });
        }
        Ok(Self {
            head_dim,
            rows_per_block,
            block_bases: Vec::new(),
            offsets: Vec::new(),
            bytes: Vec::new(),
            entries: 0,
            nonempty: 0,
            scratch: Vec::with_capacity(head_dim),
            gathered: Vec::with_capacity(head_dim),
            codes: PhantomData,
        })
    }

    /// An owned copy of a view's rows (e.g. a view of a mapped file, to keep appending to a
    /// persisted prefix). The three arrays are copied as they are.
    pub fn from_view(view: CodedView<'_, X, Y>) -> Self {
        let (mut entries, mut nonempty) = (0, 0);
        for row in view.rows() {
            let k = row.k();
            entries += k;
            nonempty += usize::from(k > 0);
        }
        Self {
            head_dim: view.head_dim,
            rows_per_block: view.rows_per_block,
            block_bases: view.block_bases.to_vec(),
            offsets: view.offsets.to_vec(),
            bytes: view.bytes.to_vec(),
            entries,
            nonempty,
            scratch: Vec::with_capacity(view.head_dim),
            gathered: Vec::with_capacity(view.head_dim),
            codes: PhantomData,
        }
    }

    /// Prunes `x` to its `k` largest magnitudes (ties → lower index) and appends the row.
    ///
    /// # Errors
    /// [`Error::LengthMismatch`], [`Error::KTooLarge`], [`Error::OddK`], [`Error::NonFinite`],
    /// [`Error::ScaleOverflow`]. Unchanged on error.
    pub fn push_dense(&mut self, x: &[f32], k: usize) -> Result<()> {
        const OP: &str = "CodedStore::push_dense";
        if x.len() != self.head_dim {
            let (expected, got) = (self.head_dim, x.len());
            return Err(Error::LengthMismatch { op: OP, what: "x", expected, got });
        }
        if k > self.head_dim {
            return Err(Error::KTooLarge { op: OP, k, head_dim: self.head_dim });
        }
        Y::check_k(OP, k)?;
        let max = check_finite(OP, x)?;
        if k > 0 {
            check_overflow::<Y>(OP, max)?;
        }
        let mut scratch = std::mem::take(&mut self.scratch);
        top_k_magnitude(x, k, &mut scratch)?;
        self.gathered.clear();
        self.gathered.extend(scratch.iter().map(|&i| x[i]));
        let gathered = std::mem::take(&mut self.gathered);
        self.append_row(&scratch, &gathered);
        (self.scratch, self.gathered) = (scratch, gathered);
        Ok(())
    }

    /// Appends a row given as strictly ascending `indices` (each `< head_dim`) and values.
    ///
    /// # Errors
    /// [`Error::LengthMismatch`], [`Error::InvalidSparseIndex`], [`Error::OddK`],
    /// [`Error::NonFinite`], [`Error::ScaleOverflow`]. Unchanged on error.
    pub fn push_sparse(&mut self, indices: &[usize], values: &[f32]) -> Result<()> {
        const OP: &str = "CodedStore::push_sparse";
        if indices.len() != values.len() {
            let (expected, got) = (indices.len(), values.len());
            return Err(Error::LengthMismatch { op: OP, what: "values", expected, got });
        }
        check_ascending(OP, indices.iter().copied(), self.head_dim)?;
        Y::check_k(OP, indices.len())?;
        let max = check_finite(OP, values)?;
        if !values.is_empty() {
            check_overflow::<Y>(OP, max)?;
        }
        self.append_row(indices, values);
        Ok(())
    }

    /// Appends a row of another store or view of the same encoding as it is encoded (no
    /// re-quantization: the codes and the row scale are copied).
    ///
    /// # Errors
    /// [`Error::ShapeMismatch`] when the row's head_dim differs from the store's.
    pub fn push_row(&mut self, row: CodedRow<'_, X, Y>) -> Result<()> {
        if row.head_dim != self.head_dim {
            let (expected, got) = (self.head_dim, row.head_dim);
            return Err(Error::ShapeMismatch {
                op: "CodedStore::push_row",
                what: "head_dim",
                expected,
                got,
            });
        }
        let (len, k) = (self.bytes.len(), row.k());
        if self.offsets.len().is_multiple_of(self.rows_per_block) {
            self.block_bases.push(len as u64);
        }
        let base = *self.block_bases.last().expect("a block was just ensured") as usize;
        // A row of this encoding and head_dim is at most the largest row's bytes, and
        // rows_per_block · that ≤ 65535, so a row start always fits u16.
        self.offsets.push((len - base) as u16);
        self.bytes.extend_from_slice(row.bytes);
        self.entries += k;
        self.nonempty += usize::from(k > 0);
        Ok(())
    }

    fn append_row(&mut self, indices: &[usize], values: &[f32]) {
        let (d, k) = (self.head_dim, indices.len());
        let len = self.bytes.len();
        if self.offsets.len().is_multiple_of(self.rows_per_block) {
            self.block_bases.push(len as u64);
        }
        let base = *self.block_bases.last().expect("a block was just ensured") as usize;
        // rows_per_block · max row bytes ≤ 65535, so a row start always fits u16.
        self.offsets.push((len - base) as u16);
        let (ib, vb) = (X::bytes(k, d), Y::bytes(k));
        self.bytes.resize(len + ib + vb, 0);
        let (index_part, value_part) = self.bytes[len..].split_at_mut(ib);
        X::encode(indices, d, index_part);
        Y::encode(values, value_part);
        self.entries += k;
        self.nonempty += usize::from(k > 0);
    }

    /// Rows held.
    pub fn len(&self) -> usize {
        self.offsets.len()
    }

    /// True when no row is held.
    pub fn is_empty(&self) -> bool {
        self.offsets.is_empty()
    }

    /// Elements of the dense vectors.
    pub fn head_dim(&self) -> usize {
        self.head_dim
    }

    /// Rows per block.
    pub fn rows_per_block(&self) -> usize {
        self.rows_per_block
    }

    /// Kept entries over all rows.
    pub fn nnz(&self) -> usize {
        self.entries
    }

    /// Keeps the first `rows` rows.
    pub fn truncate(&mut self, rows: usize) {
        if rows >= self.len() {
            return;
        }
        let view = self.view();
        let (mut gone, mut gone_rows) = (0, 0);
        for r in rows..self.len() {
            let k = view.row(r).map_or(0, |row| row.k());
            gone += k;
            gone_rows += usize::from(k > 0);
        }
        let block = rows / self.rows_per_block;
        let end = self.block_bases[block] as usize + usize::from(self.offsets[rows]);
        self.offsets.truncate(rows);
        self.block_bases.truncate(rows.div_ceil(self.rows_per_block));
        self.bytes.truncate(end);
        self.entries -= gone;
        self.nonempty -= gone_rows;
    }

    /// Removes every row (keeps the allocations).
    pub fn clear(&mut self) {
        self.truncate(0);
    }

    /// Reserves room for `rows` more rows keeping `nnz` entries in total.
    pub fn reserve(&mut self, rows: usize, nnz: usize) {
        self.offsets.reserve(rows);
        self.block_bases.reserve(rows.div_ceil(self.rows_per_block) + 1);
        let per_row = X::fixed_bytes(self.head_dim) + Y::SCALE_BYTES;
        self.bytes.reserve(rows * per_row + nnz * X::ENTRY_BYTES + Y::code_bytes(nnz) + rows);
    }

    /// Borrowed view of every row.
    pub fn view(&self) -> CodedView<'_, X, Y> {
        CodedView {
            head_dim: self.head_dim,
            rows_per_block: self.rows_per_block,
            block_bases: &self.block_bases,
            offsets: &self.offsets,
            bytes: &self.bytes,
            codes: PhantomData,
        }
    }

    /// Bytes held, split by role: index parts (lists or masks), value codes, row scales,
    /// offsets and block bases.
    pub fn memory(&self) -> MemoryReport {
        let rows = self.len();
        let index_bytes = rows * X::fixed_bytes(self.head_dim) + self.entries * X::ENTRY_BYTES;
        let scale_bytes = self.nonempty * Y::SCALE_BYTES;
        let value_bytes = self.bytes.len() - index_bytes - scale_bytes;
        let slack = (self.bytes.capacity() - self.bytes.len())
            + (self.offsets.capacity() - rows) * 2
            + (self.block_bases.capacity() - self.block_bases.len()) * 8
            + self.scratch.capacity() * size_of::<usize>()
            + self.gathered.capacity() * size_of::<f32>();
        MemoryReport {
            value_bytes,
            index_bytes,
            scale_bytes,
            offset_bytes: rows * 2,
            block_header_bytes: self.block_bases.len() * 8,
            dense_bytes: 0,
            capacity_slack_bytes: slack,
        }
    }
}

fn check_overflow<Y: ValueCode>(op: &'static str, max: f32) -> Result<()> {
    if max >= Y::OVERFLOW_AT {
        return Err(Error::ScaleOverflow {
            op,
            format: Y::KIND.to_string(),
            value: max,
            limit: Y::OVERFLOW_AT,
        });
    }
    Ok(())
}

/// Borrowed coded rows in token order (in-memory or from an untrusted source via
/// [`CodedView::from_parts`]).
pub struct CodedView<'a, X, Y> {
    head_dim: usize,
    rows_per_block: usize,
    block_bases: &'a [u64],
    offsets: &'a [u16],
    bytes: &'a [u8],
    codes: PhantomData<fn() -> (X, Y)>,
}

impl<X, Y> Clone for CodedView<'_, X, Y> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<X, Y> Copy for CodedView<'_, X, Y> {}

impl<X, Y> std::fmt::Debug for CodedView<'_, X, Y> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CodedView")
            .field("head_dim", &self.head_dim)
            .field("rows", &self.offsets.len())
            .field("bytes", &self.bytes.len())
            .finish()
    }
}

impl<'a, X: IndexCode, Y: ValueCode> CodedView<'a, X, Y> {
    /// A view of raw parts, checking every invariant: blocks and offsets as in
    /// [`crate::csr::CsrView::from_parts`] (in bytes), every row's length fitting a `k`,
    /// indices ascending and below `head_dim`, mask popcounts equal to the stored count,
    /// row scales finite and non-zero, values finite, `k` even for 4-bit values.
    ///
    /// # Errors
    /// [`Error::HeadDimOutOfRange`], [`Error::RowsPerBlockOutOfRange`], [`Error::InvalidCsr`]
    /// for structure, [`Error::MaskCountMismatch`], [`Error::InvalidSparseIndex`],
    /// [`Error::InvalidRowScale`], [`Error::NonFinite`], [`Error::OddK`] for rows.
    pub fn from_parts(
        head_dim: usize,
        rows_per_block: usize,
        block_bases: &'a [u64],
        offsets: &'a [u16],
        bytes: &'a [u8],
    ) -> Result<Self> {
        const OP: &str = "CodedView::from_parts";
        check_head_dim::<X>(OP, head_dim)?;
        let max = CodedStore::<X, Y>::max_rows_per_block(head_dim);
        if rows_per_block == 0 || rows_per_block > max {
            return Err(Error::RowsPerBlockOutOfRange { op: OP, rows_per_block, head_dim, max });
        }
        let invalid = |reason: String| Error::InvalidCsr { op: OP, reason };
        let blocks = offsets.len().div_ceil(rows_per_block);
        if block_bases.len() != blocks {
            return Err(invalid(format!(
                "{} block bases for {} rows of {rows_per_block}",
                block_bases.len(),
                offsets.len()
            )));
        }
        let view =
            Self { head_dim, rows_per_block, block_bases, offsets, bytes, codes: PhantomData };
        for b in 0..blocks {
            let start = block_bases[b] as usize;
            let end = block_bases.get(b + 1).map_or(bytes.len(), |&e| e as usize);
            if (b == 0 && start != 0) || end < start || end > bytes.len() {
                return Err(invalid(format!("block {b} spans bytes {start}..{end}")));
            }
            if end - start > MAX_BLOCK_BYTES {
                return Err(invalid(format!("block {b} holds {} bytes", end - start)));
            }
            let rows = b * rows_per_block..((b + 1) * rows_per_block).min(offsets.len());
            let mut prev = 0usize;
            for r in rows.clone() {
                let o = usize::from(offsets[r]);
                if (r == rows.start && o != 0) || o < prev || start + o > end {
                    return Err(invalid(format!("row {r} offset {o} out of order")));
                }
                prev = o;
            }
        }
        for r in 0..offsets.len() {
            let row = view.row_bytes(r);
            let k = row_k::<X, Y>(row.len(), head_dim).ok_or_else(|| {
                invalid(format!("row {r}: {} bytes fit no count of kept values", row.len()))
            })?;
            Y::check_k(OP, k)?;
            let (index_part, value_part) = row.split_at(X::bytes(k, head_dim));
            X::check(OP, r, index_part, k, head_dim)?;
            Y::check(OP, r, value_part, k)?;
        }
        Ok(view)
    }

    /// A view of parts [`CodedView::from_parts`] has already accepted (nothing is checked).
    pub(crate) fn from_parts_unchecked(
        head_dim: usize,
        rows_per_block: usize,
        block_bases: &'a [u64],
        offsets: &'a [u16],
        bytes: &'a [u8],
    ) -> Self {
        Self { head_dim, rows_per_block, block_bases, offsets, bytes, codes: PhantomData }
    }

    fn row_bytes(&self, i: usize) -> &'a [u8] {
        let b = i / self.rows_per_block;
        let base = self.block_bases[b] as usize;
        let start = base + usize::from(self.offsets[i]);
        let last_in_block =
            (i + 1).is_multiple_of(self.rows_per_block) || i + 1 == self.offsets.len();
        let end = if last_in_block {
            self.block_bases.get(b + 1).map_or(self.bytes.len(), |&e| e as usize)
        } else {
            base + usize::from(self.offsets[i + 1])
        };
        &self.bytes[start..end]
    }

    /// Row `i`, or `None`.
    pub fn row(&self, i: usize) -> Option<CodedRow<'a, X, Y>> {
        (i < self.offsets.len()).then(|| CodedRow {
            head_dim: self.head_dim,
            bytes: self.row_bytes(i),
            codes: PhantomData,
        })
    }

    /// Rows in token order.
    pub fn rows(&self) -> impl ExactSizeIterator<Item = CodedRow<'a, X, Y>> + Clone + 'a {
        let view = *self;
        (0..view.num_rows()).map(move |i| view.row(i).expect("row index in range"))
    }

    /// Elements of the dense vectors.
    pub fn head_dim(&self) -> usize {
        self.head_dim
    }

    /// Rows (tokens).
    pub fn num_rows(&self) -> usize {
        self.offsets.len()
    }

    /// True when the view holds no rows.
    pub fn is_empty(&self) -> bool {
        self.offsets.is_empty()
    }

    /// Rows per block.
    pub fn rows_per_block(&self) -> usize {
        self.rows_per_block
    }

    /// The view of its first `rows` rows (all of them when `rows ≥ num_rows`), still
    /// borrowed (see [`crate::csr::CsrView::first_rows`]).
    pub fn first_rows(&self, rows: usize) -> Self {
        let rows = rows.min(self.num_rows());
        let end = match self.offsets.get(rows) {
            Some(&o) => self.block_bases[rows / self.rows_per_block] as usize + usize::from(o),
            None => self.bytes.len(),
        };
        Self {
            block_bases: &self.block_bases[..rows.div_ceil(self.rows_per_block)],
            offsets: &self.offsets[..rows],
            bytes: &self.bytes[..end],
            ..*self
        }
    }

    /// Raw per-block byte bases.
    pub fn block_bases(&self) -> &'a [u64] {
        self.block_bases
    }

    /// Raw per-row byte offsets, relative to each row's block.
    pub fn offsets(&self) -> &'a [u16] {
        self.offsets
    }

    /// Every row's bytes, concatenated.
    pub fn bytes(&self) -> &'a [u8] {
        self.bytes
    }
}

/// Rows keeping at most this many values are expanded through a stack buffer
/// ([`CodedRow::expand`]); every head size up to 256 takes that path.
pub const EXPAND_ON_STACK: usize = 256;

/// One coded row, borrowed.
pub struct CodedRow<'a, X, Y> {
    head_dim: usize,
    bytes: &'a [u8],
    codes: PhantomData<fn() -> (X, Y)>,
}

impl<X, Y> Clone for CodedRow<'_, X, Y> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<X, Y> Copy for CodedRow<'_, X, Y> {}

impl<'a, X: IndexCode, Y: ValueCode> CodedRow<'a, X, Y> {
    /// Kept entries (implied by the row's length; 0 for a malformed length, which only
    /// unchecked data can have).
    pub fn k(&self) -> usize {
        row_k::<X, Y>(self.bytes.len(), self.head_dim).unwrap_or(0)
    }

    /// The row's bytes (index part, then value part).
    pub fn bytes(&self) -> &'a [u8] {
        self.bytes
    }

    /// Writes the dense form into `out` (`head_dim` elements): zeros, and the kept values
    /// at their indices (unscaled: multiply by the per-head scale where one is set).
    ///
    /// # Errors
    /// [`Error::LengthMismatch`] when `out.len() != head_dim`.
    pub fn scatter_into(&self, out: &mut [f32]) -> Result<()> {
        if out.len() != self.head_dim {
            let (expected, got) = (self.head_dim, out.len());
            return Err(Error::LengthMismatch {
                op: "CodedRow::scatter_into",
                what: "out",
                expected,
                got,
            });
        }
        self.expand(out);
        Ok(())
    }

    /// [`CodedRow::scatter_into`] without the length check (`out.len() == head_dim`). Rows
    /// keeping at most [`EXPAND_ON_STACK`] values decode them into a stack buffer, zero `out`
    /// in one pass and place each value at its index in ascending order (a mask read 64 bits
    /// at a time). Longer rows decode into `out[..k]` and move the values to their indices
    /// from the last one down (index `j` of an ascending list is at least `j`, so nothing
    /// unread is overwritten), zeros filling the gaps. Both give the same `out`.
    pub fn expand(&self, out: &mut [f32]) {
        let (d, k) = (self.head_dim, self.k());
        let (index_part, value_part) = self.bytes.split_at(X::bytes(k, d));
        if k <= EXPAND_ON_STACK {
            let mut values = [0.0f32; EXPAND_ON_STACK];
            Y::decode(value_part, &mut values[..k]);
            out[..d].fill(0.0);
            X::for_each(index_part, k, |j, i| out[i] = values[j]);
            return;
        }
        Y::decode(value_part, &mut out[..k]);
        let mut end = d;
        X::for_each_rev(index_part, k, |j, i| {
            let v = out[j];
            out[i + 1..end].fill(0.0);
            out[i] = v;
            end = i;
        });
        out[..end].fill(0.0);
    }

    /// `(index, value)` pairs in ascending index order (allocates; for references and tests).
    pub fn entries(&self) -> Vec<(usize, f32)> {
        let mut dense = vec![0.0; self.head_dim];
        let (d, k) = (self.head_dim, self.k());
        let mut idx = vec![0; k];
        X::for_each_rev(&self.bytes[..X::bytes(k, d)], k, |j, i| idx[j] = i);
        self.expand(&mut dense);
        idx.into_iter().map(|i| (i, dense[i])).collect()
    }
}

#[cfg(test)]
mod tests {
    use half::f16;

    use super::*;
    use crate::coded::{Bitmask, Elems, Int4Values, Int8Values, List, coded_row_bytes};
    use crate::fp8::Fp8E4M3;

    fn row(d: usize, seed: usize) -> Vec<f32> {
        (0..d).map(|i| ((i * 37 + seed * 11) % 23) as f32 - 11.0).collect()
    }

    fn check_round_trip<X: IndexCode, Y: ValueCode>(d: usize, k: usize, tol: f32) {
        let mut s = CodedStore::<X, Y>::new(d).unwrap();
        for seed in 0..5 {
            s.push_dense(&row(d, seed), k).unwrap();
        }
        let mut csr = crate::csr::CsrStore::<u16, f32>::new(d).unwrap();
        let view = s.view();
        let checked = CodedView::<X, Y>::from_parts(
            d,
            view.rows_per_block(),
            view.block_bases(),
            view.offsets(),
            view.bytes(),
        )
        .unwrap();
        for seed in 0..5 {
            csr.push_dense(&row(d, seed), k).unwrap();
            let (mut a, mut b) = (vec![0.0; d], vec![0.0; d]);
            checked.row(seed).unwrap().scatter_into(&mut a).unwrap();
            csr.to_dense_row(seed, &mut b).unwrap();
            for (x, y) in a.iter().zip(&b) {
                assert!((x - y).abs() <= tol, "{:?} {:?}: {x} vs {y}", X::KIND, Y::KIND);
            }
            assert_eq!(checked.row(seed).unwrap().k(), k);
        }
        let m = s.memory();
        assert_eq!(m.sparse_formula_bytes(), 5 * coded_row_bytes::<X, Y>(k, d));
    }

    #[test]
    fn every_encoding_keeps_the_top_k() {
        for d in [8, 13, 64] {
            for k in [0, 2, (d / 2) & !1, d & !1] {
                check_round_trip::<List<u8>, Elems<f32>>(d, k, 0.0);
                check_round_trip::<Bitmask, Elems<f32>>(d, k, 0.0);
                check_round_trip::<Bitmask, Elems<f16>>(d, k, 0.0);
                check_round_trip::<List<u16>, Elems<Fp8E4M3>>(d, k, 0.5);
                check_round_trip::<Bitmask, Int8Values>(d, k, 11.0 / 127.0);
                check_round_trip::<List<u8>, Int8Values>(d, k, 11.0 / 127.0);
                check_round_trip::<Bitmask, Int4Values>(d, k, 11.0 / 7.0);
                check_round_trip::<List<u8>, Int4Values>(d, k, 11.0 / 7.0);
            }
        }
    }

    #[test]
    fn rows_longer_than_the_stack_buffer_expand_alike() {
        // k ≤ EXPAND_ON_STACK goes through the stack buffer, longer rows expand in place.
        for d in [200, 300, 520] {
            for k in [2, 254, 256, 258, d & !1] {
                let k = k.min(d & !1);
                check_round_trip::<Bitmask, Elems<f32>>(d, k, 0.0);
                check_round_trip::<List<u16>, Elems<f32>>(d, k, 0.0);
                check_round_trip::<Bitmask, Int8Values>(d, k, 11.0 / 127.0);
                check_round_trip::<Bitmask, Int4Values>(d, k, 11.0 / 7.0);
                check_round_trip::<List<u16>, Int4Values>(d, k, 11.0 / 7.0);
            }
        }
    }

    #[test]
    fn ascending_and_descending_walks_agree() {
        for d in [1, 7, 8, 9, 63, 64, 65, 130, 256, 300] {
            for seed in 0..20u64 {
                let mut mask = vec![0u8; Bitmask::fixed_bytes(d)];
                let mut list = Vec::new();
                for i in 0..d {
                    if (i as u64 * 2_654_435_761 + seed * 40_503).rotate_left(7).is_multiple_of(3) {
                        mask[i / 8] |= 1 << (i % 8);
                        list.push(i);
                    }
                }
                let k = list.len();
                let (mut up, mut down) = (Vec::new(), Vec::new());
                Bitmask::for_each(&mask, k, |j, i| up.push((j, i)));
                Bitmask::for_each_rev(&mask, k, |j, i| down.push((j, i)));
                down.reverse();
                let expected: Vec<(usize, usize)> = list.iter().copied().enumerate().collect();
                assert_eq!(up, expected, "d {d} seed {seed}");
                assert_eq!(down, expected, "d {d} seed {seed}");
                let mut bytes = vec![0u8; 2 * k];
                List::<u16>::encode(&list, d, &mut bytes);
                let mut from_list = Vec::new();
                List::<u16>::for_each(&bytes, k, |j, i| from_list.push((j, i)));
                assert_eq!(from_list, expected);
            }
        }
    }

    #[test]
    fn bitmask_rows_cost_the_formula() {
        // d_h/8 + k + 2 scale bytes + the 2-byte offset.
        assert_eq!(coded_row_bytes::<Bitmask, Int8Values>(32, 64), 64 / 8 + 32 + 2 + 2);
        assert_eq!(coded_row_bytes::<Bitmask, Int4Values>(32, 64), 64 / 8 + 16 + 2 + 2);
        assert_eq!(coded_row_bytes::<Bitmask, Elems<Fp8E4M3>>(64, 128), 16 + 64 + 2);
        assert_eq!(coded_row_bytes::<List<u8>, Elems<f16>>(32, 64), 3 * 32 + 2);
    }

    #[test]
    fn lossless_setting_is_bit_exact() {
        let d = 24;
        let mut s = CodedStore::<Bitmask, Elems<f32>>::new(d).unwrap();
        let x: Vec<f32> = (0..d).map(|i| (i as f32 * 0.37).sin()).collect();
        s.push_dense(&x, d).unwrap();
        let mut y = vec![0.0; d];
        s.view().row(0).unwrap().scatter_into(&mut y).unwrap();
        assert_eq!(x, y);
    }

    #[test]
    fn bad_rows_are_typed_errors() {
        let d = 16;
        let mut s = CodedStore::<Bitmask, Int8Values>::new(d).unwrap();
        s.push_dense(&row(d, 1), 4).unwrap();
        let v = s.view();
        let parts = |bytes: &[u8]| {
            CodedView::<Bitmask, Int8Values>::from_parts(
                d,
                v.rows_per_block(),
                v.block_bases(),
                v.offsets(),
                bytes,
            )
            .map(|_| ())
        };
        let mut b2 = v.bytes().to_vec();
        b2[0] |= 0xff;
        b2[1] |= 0xff;
        assert!(matches!(parts(&b2), Err(Error::MaskCountMismatch { .. })));
        let mut b3 = v.bytes().to_vec();
        b3[2..4].copy_from_slice(&f16::ZERO.to_le_bytes());
        assert!(matches!(parts(&b3), Err(Error::InvalidRowScale { .. })));
        b3[2..4].copy_from_slice(&f16::NAN.to_le_bytes());
        assert!(matches!(parts(&b3), Err(Error::InvalidRowScale { .. })));
        b3[2..4].copy_from_slice(&f16::INFINITY.to_le_bytes());
        assert!(matches!(parts(&b3), Err(Error::InvalidRowScale { .. })));
        assert!(parts(&v.bytes()[..5]).is_err());
        let mut s4 = CodedStore::<Bitmask, Int4Values>::new(d).unwrap();
        assert!(matches!(s4.push_dense(&row(d, 2), 3), Err(Error::OddK { k: 3, .. })));
        assert!(s4.is_empty());
        assert!(matches!(s4.push_dense(&row(d, 2), 17), Err(Error::KTooLarge { .. })));
        let mut nan = row(d, 3);
        nan[4] = f32::NAN;
        assert!(matches!(s4.push_dense(&nan, 2), Err(Error::NonFinite { .. })));
        assert!(CodedStore::<List<u8>, Int8Values>::new(300).is_err());
        assert!(CodedStore::<Bitmask, Int8Values>::new(300).is_ok());
    }

    #[test]
    fn truncate_restores_the_accounting() {
        let d = 32;
        let mut s = CodedStore::<List<u8>, Int4Values>::with_block_rows(d, 3).unwrap();
        for seed in 0..7 {
            s.push_dense(&row(d, seed), 2 * (seed % 3)).unwrap();
        }
        let before = {
            let mut t = CodedStore::<List<u8>, Int4Values>::with_block_rows(d, 3).unwrap();
            for seed in 0..4 {
                t.push_dense(&row(d, seed), 2 * (seed % 3)).unwrap();
            }
            t.memory()
        };
        s.truncate(4);
        let m = s.memory();
        assert_eq!(
            (m.value_bytes, m.index_bytes, m.scale_bytes, m.offset_bytes, m.block_header_bytes),
            (
                before.value_bytes,
                before.index_bytes,
                before.scale_bytes,
                before.offset_bytes,
                before.block_header_bytes
            )
        );
    }
}
