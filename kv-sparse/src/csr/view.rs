//! [`CsrView`]: a borrowed view of a whole CSR store — what kernels read.
//!
//! The same view type is produced by an in-memory [`super::CsrStore`] and by a
//! memory-mapped cache file, so SWAN's sparse-history kernels (method section, hybrid
//! attention over `[sparse history; dense buffer]`) run on either unchanged.

use super::{BlockView, MAX_BLOCK_NNZ, SparseRow, check_rows_per_block};
use crate::index::check_head_dim;
use crate::{Error, Result, SparseIndex, Value};

/// Borrowed view of a CSR store: rows in token order, grouped in blocks of
/// `rows_per_block` rows.
///
/// Invariants (checked by [`CsrView::from_parts`], kept by [`super::CsrStore`]): every
/// row's indices are strictly ascending and below `head_dim`, every value decodes to a
/// finite number, every block holds at most 65 535 entries.
pub struct CsrView<'a, I, V> {
    head_dim: usize,
    rows_per_block: usize,
    block_bases: &'a [u64],
    offsets: &'a [u16],
    indices: &'a [I],
    values: &'a [V],
}

impl<I, V> Clone for CsrView<'_, I, V> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<I, V> Copy for CsrView<'_, I, V> {}

impl<I, V> std::fmt::Debug for CsrView<'_, I, V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CsrView")
            .field("head_dim", &self.head_dim)
            .field("rows", &self.offsets.len())
            .field("nnz", &self.indices.len())
            .field("rows_per_block", &self.rows_per_block)
            .finish()
    }
}

impl<'a, I: SparseIndex, V: Value> CsrView<'a, I, V> {
    /// Builds a view from parts that already satisfy the invariants (crate-internal).
    pub(crate) fn from_parts_unchecked(
        head_dim: usize,
        rows_per_block: usize,
        block_bases: &'a [u64],
        offsets: &'a [u16],
        indices: &'a [I],
        values: &'a [V],
    ) -> Self {
        Self { head_dim, rows_per_block, block_bases, offsets, indices, values }
    }

    /// Builds a view from raw CSR arrays (e.g. produced by another process or device),
    /// checking every invariant: `block_bases` has one entry per block starting at 0 and
    /// non-decreasing; `offsets` has one entry per row, 0 for a block's first row and
    /// non-decreasing within the block; every block holds ≤ 65 535 entries; indices are
    /// strictly ascending per row and below `head_dim`; values are finite.
    ///
    /// # Errors
    /// [`Error::HeadDimOutOfRange`], [`Error::RowsPerBlockOutOfRange`], or
    /// [`Error::InvalidCsr`] naming the first broken invariant.
    ///
    /// # Examples
    /// ```
    /// use kv_sparse::csr::CsrView;
    /// let v = CsrView::<u8, f32>::from_parts(4, 2, &[0, 3], &[0, 1, 0], &[2, 0, 3, 1], &[1.0; 4])?;
    /// assert_eq!(v.row(1).unwrap().indices, &[0, 3]);
    /// assert!(CsrView::<u8, f32>::from_parts(4, 2, &[0], &[0], &[4], &[1.0]).is_err());
    /// # Ok::<(), kv_sparse::Error>(())
    /// ```
    pub fn from_parts(
        head_dim: usize,
        rows_per_block: usize,
        block_bases: &'a [u64],
        offsets: &'a [u16],
        indices: &'a [I],
        values: &'a [V],
    ) -> Result<Self> {
        const OP: &str = "CsrView::from_parts";
        check_head_dim::<I>(OP, head_dim)?;
        check_rows_per_block(OP, head_dim, rows_per_block)?;
        if indices.len() != values.len() {
            return Err(invalid(format!("{} indices but {} values", indices.len(), values.len())));
        }
        let blocks = offsets.len().div_ceil(rows_per_block);
        if block_bases.len() != blocks {
            return Err(invalid(format!(
                "{} block bases for {} rows in blocks of {rows_per_block} (expected {blocks})",
                block_bases.len(),
                offsets.len()
            )));
        }
        let view = Self { head_dim, rows_per_block, block_bases, offsets, indices, values };
        for b in 0..blocks {
            view.check_block(b)?;
        }
        view.check_entries()?;
        Ok(view)
    }

    /// Checks block `b`'s base, extent and row offsets.
    fn check_block(&self, b: usize) -> Result<()> {
        let nnz = self.indices.len() as u64;
        let base = self.block_bases[b];
        if b == 0 && base != 0 {
            return Err(invalid(format!("block 0 base is {base}, expected 0")));
        }
        let end = self.block_bases.get(b + 1).copied().unwrap_or(nnz);
        if base > end || end > nnz {
            return Err(invalid(format!("block {b} spans {base}..{end} of {nnz} entries")));
        }
        let len = end - base;
        if len > MAX_BLOCK_NNZ as u64 {
            return Err(invalid(format!("block {b} holds {len} > {MAX_BLOCK_NNZ} entries")));
        }
        let rows = self.block_rows(b);
        let offsets = &self.offsets[rows.clone()];
        if offsets.first() != Some(&0) {
            return Err(invalid(format!("block {b} first row offset is not 0")));
        }
        let mut prev = 0u16;
        for (r, &o) in offsets.iter().enumerate() {
            if o < prev || u64::from(o) > len {
                return Err(invalid(format!(
                    "row {} offset {o} out of order or past its block's {len} entries",
                    rows.start + r
                )));
            }
            prev = o;
        }
        Ok(())
    }

    /// Checks every row's indices and every value (after the structure is valid).
    fn check_entries(&self) -> Result<()> {
        for (i, row) in self.rows().enumerate() {
            let mut next_min = 0usize;
            for idx in row.indices.iter().map(|x| x.to_usize()) {
                if idx < next_min || idx >= self.head_dim {
                    return Err(invalid(format!(
                        "row {i}: index {idx} not strictly ascending or not below head_dim {}",
                        self.head_dim
                    )));
                }
                next_min = idx + 1;
            }
        }
        if let Some(p) = self.values.iter().position(|v| !v.to_f32().is_finite()) {
            return Err(invalid(format!("value at entry {p} is not finite")));
        }
        Ok(())
    }

    fn block_rows(&self, b: usize) -> std::ops::Range<usize> {
        let start = b * self.rows_per_block;
        start..(start + self.rows_per_block).min(self.offsets.len())
    }

    /// Dimension of the dense vectors the rows came from.
    pub fn head_dim(&self) -> usize {
        self.head_dim
    }

    /// Number of rows (tokens).
    pub fn num_rows(&self) -> usize {
        self.offsets.len()
    }

    /// True when the view holds no rows.
    pub fn is_empty(&self) -> bool {
        self.offsets.is_empty()
    }

    /// Total stored entries over all rows.
    pub fn nnz(&self) -> usize {
        self.indices.len()
    }

    /// Rows per block (the last block may hold fewer).
    pub fn rows_per_block(&self) -> usize {
        self.rows_per_block
    }

    /// Number of blocks.
    pub fn num_blocks(&self) -> usize {
        self.block_bases.len()
    }

    /// Block `b`, or `None` when out of range.
    pub fn block(&self, b: usize) -> Option<BlockView<'a, I, V>> {
        let base = *self.block_bases.get(b)?;
        let end = self.block_bases.get(b + 1).map_or(self.indices.len(), |&e| e as usize);
        let entries = base as usize..end;
        Some(BlockView {
            base,
            offsets: &self.offsets[self.block_rows(b)],
            indices: &self.indices[entries.clone()],
            values: &self.values[entries],
        })
    }

    /// The blocks in token order.
    pub fn blocks(&self) -> impl ExactSizeIterator<Item = BlockView<'a, I, V>> + Clone + 'a {
        let view = *self;
        (0..view.num_blocks()).map(move |b| view.block(b).expect("block index in range"))
    }

    /// Row `i` (token order), or `None` when out of range.
    pub fn row(&self, i: usize) -> Option<SparseRow<'a, I, V>> {
        if i >= self.offsets.len() {
            return None;
        }
        let b = i / self.rows_per_block;
        let base = self.block_bases[b] as usize;
        let start = base + usize::from(self.offsets[i]);
        let last_in_block =
            (i + 1).is_multiple_of(self.rows_per_block) || i + 1 == self.offsets.len();
        let end = if last_in_block {
            self.block_bases.get(b + 1).map_or(self.indices.len(), |&e| e as usize)
        } else {
            base + usize::from(self.offsets[i + 1])
        };
        Some(SparseRow { indices: &self.indices[start..end], values: &self.values[start..end] })
    }

    /// All rows in token order.
    pub fn rows(&self) -> impl ExactSizeIterator<Item = SparseRow<'a, I, V>> + Clone + 'a {
        let view = *self;
        (0..view.num_rows()).map(move |i| view.row(i).expect("row index in range"))
    }

    /// The view of its first `rows` rows (all of them when `rows ≥ num_rows`), still
    /// borrowed: e.g. the older part of a history attended where it is stored.
    ///
    /// # Examples
    /// ```
    /// use kv_sparse::csr::CsrView;
    /// let v = CsrView::<u8, f32>::from_parts(4, 2, &[0, 3], &[0, 1, 0], &[2, 0, 3, 1], &[1.0; 4])?;
    /// let head = v.first_rows(2);
    /// assert_eq!((head.num_rows(), head.nnz()), (2, 3));
    /// assert_eq!(head.row(1).unwrap().indices, &[0, 3]);
    /// # Ok::<(), kv_sparse::Error>(())
    /// ```
    pub fn first_rows(&self, rows: usize) -> Self {
        let rows = rows.min(self.num_rows());
        let end = match self.offsets.get(rows) {
            Some(&o) => self.block_bases[rows / self.rows_per_block] as usize + usize::from(o),
            None => self.indices.len(),
        };
        Self {
            block_bases: &self.block_bases[..rows.div_ceil(self.rows_per_block)],
            offsets: &self.offsets[..rows],
            indices: &self.indices[..end],
            values: &self.values[..end],
            ..*self
        }
    }

    /// Raw per-block bases (absolute entry offsets), for device uploads.
    pub fn block_bases(&self) -> &'a [u64] {
        self.block_bases
    }

    /// Raw per-row offsets (relative to each row's block), for device uploads.
    pub fn offsets(&self) -> &'a [u16] {
        self.offsets
    }

    /// All indices, concatenated in row order.
    pub fn indices(&self) -> &'a [I] {
        self.indices
    }

    /// All values, concatenated in row order.
    pub fn values(&self) -> &'a [V] {
        self.values
    }
}

fn invalid(reason: String) -> Error {
    Error::InvalidCsr { op: "CsrView::from_parts", reason }
}
