//! Borrowed views of one sparse row ([`SparseRow`]) and one block of rows ([`BlockView`]).
//!
//! These are what a SWAN decode kernel walks (method section, "sparse-dense product"):
//! for each row, `Σ q[idx]·val` over its kept entries, no decompression.

use crate::{Error, Result, SparseIndex, Value};

/// One sparse row: `k` (index, value) pairs, indices strictly ascending and below the
/// head dimension.
pub struct SparseRow<'a, I, V> {
    /// Indices of the kept components, strictly ascending.
    pub indices: &'a [I],
    /// Stored values, one per index.
    pub values: &'a [V],
}

impl<I, V> Clone for SparseRow<'_, I, V> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<I, V> Copy for SparseRow<'_, I, V> {}

impl<I: std::fmt::Debug, V: std::fmt::Debug> std::fmt::Debug for SparseRow<'_, I, V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SparseRow")
            .field("indices", &self.indices)
            .field("values", &self.values)
            .finish()
    }
}

impl<'a, I: SparseIndex, V: Value> SparseRow<'a, I, V> {
    /// Number of kept entries (`k` of this row).
    pub fn len(&self) -> usize {
        self.indices.len()
    }

    /// True when the row keeps no entries.
    pub fn is_empty(&self) -> bool {
        self.indices.is_empty()
    }

    /// `(index, decoded value)` pairs in ascending index order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = (usize, f32)> + 'a {
        let (indices, values) = (self.indices, self.values);
        indices.iter().zip(values).map(|(i, v)| (i.to_usize(), v.to_f32()))
    }

    /// `Σ q[idx]·value` over the kept entries: the dot product of a dense query with the
    /// row (unscaled; multiply by the view's scale where one is set).
    ///
    /// # Errors
    /// [`Error::LengthMismatch`] when `q` is too short for the row's largest index.
    pub fn dot(&self, q: &[f32]) -> Result<f32> {
        self.check_dense_len("SparseRow::dot", q.len())?;
        Ok(self.iter().map(|(i, v)| q[i] * v).sum())
    }

    /// Writes the dense form into `out`: zeros, then the kept values at their indices.
    ///
    /// # Errors
    /// [`Error::LengthMismatch`] when `out` is too short for the row's largest index.
    pub fn scatter_into(&self, out: &mut [f32]) -> Result<()> {
        self.check_dense_len("SparseRow::scatter_into", out.len())?;
        out.fill(0.0);
        for (i, v) in self.iter() {
            out[i] = v;
        }
        Ok(())
    }

    fn check_dense_len(&self, op: &'static str, len: usize) -> Result<()> {
        match self.indices.last() {
            Some(last) if last.to_usize() >= len => Err(Error::LengthMismatch {
                op,
                what: "dense vector",
                expected: last.to_usize() + 1,
                got: len,
            }),
            _ => Ok(()),
        }
    }
}

/// One block of consecutive rows. `offsets[r]` is the start of row `r` inside
/// `indices`/`values` (relative to the block); row `r` ends at `offsets[r + 1]`, or at
/// `indices.len()` for the last row. `base` is the absolute position of the block's first
/// entry in the whole store.
pub struct BlockView<'a, I, V> {
    /// Absolute entry offset of this block's first entry.
    pub base: u64,
    /// Start of each row, relative to the block.
    pub offsets: &'a [u16],
    /// Indices of all rows of the block.
    pub indices: &'a [I],
    /// Values of all rows of the block.
    pub values: &'a [V],
}

impl<I, V> Clone for BlockView<'_, I, V> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<I, V> Copy for BlockView<'_, I, V> {}

impl<I: std::fmt::Debug, V: std::fmt::Debug> std::fmt::Debug for BlockView<'_, I, V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BlockView")
            .field("base", &self.base)
            .field("offsets", &self.offsets)
            .field("nnz", &self.indices.len())
            .finish()
    }
}

impl<'a, I, V> BlockView<'a, I, V> {
    /// Number of rows in the block.
    pub fn num_rows(&self) -> usize {
        self.offsets.len()
    }

    /// Row `r` of the block.
    ///
    /// # Panics
    /// When `r >= self.num_rows()` (like slice indexing); see [`BlockView::get`].
    pub fn row(&self, r: usize) -> SparseRow<'a, I, V> {
        self.get(r).expect("BlockView::row: row index out of range")
    }

    /// Row `r` of the block, or `None` when out of range.
    pub fn get(&self, r: usize) -> Option<SparseRow<'a, I, V>> {
        let start = usize::from(*self.offsets.get(r)?);
        let end = self.offsets.get(r + 1).map_or(self.indices.len(), |&o| usize::from(o));
        Some(SparseRow { indices: &self.indices[start..end], values: &self.values[start..end] })
    }

    /// The rows of the block, in order.
    pub fn rows(&self) -> impl ExactSizeIterator<Item = SparseRow<'a, I, V>> + 'a
    where
        I: 'a,
        V: 'a,
    {
        let block = *self;
        (0..block.num_rows()).map(move |r| block.row(r))
    }
}
