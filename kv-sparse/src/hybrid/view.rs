//! [`HybridView`]: everything a decode kernel reads from one hybrid cache, borrowed.
//!
//! SWAN (method section): the query attends over `[sparse history; dense buffer]` with a
//! single softmax; the sparse part is read as CSR rows, the buffer as dense rows. The
//! same view comes from an in-memory [`super::HybridCache`] and from a mapped file.

use crate::coded::{CodedView, IndexCode, ValueCode};
use crate::csr::CsrView;
use crate::{Error, Result, SparseIndex, Value};

/// Borrowed view of one hybrid cache. Token order: sparse rows `0..sparse_len` are the
/// oldest tokens, then the buffer rows (`buffer_keys.0` then `buffer_keys.1`, each
/// row-major with `head_dim` elements per row).
pub struct HybridView<'a, I, V, D> {
    /// Elements per key/value vector.
    pub head_dim: usize,
    /// Sparse key history.
    pub sparse_keys: CsrView<'a, I, V>,
    /// Sparse value history (same number of rows as `sparse_keys`).
    pub sparse_values: CsrView<'a, I, V>,
    /// Dense buffer keys in token order, as (older, newer) row-major slices.
    pub buffer_keys: (&'a [D], &'a [D]),
    /// Dense buffer values in token order, as (older, newer) row-major slices.
    pub buffer_values: (&'a [D], &'a [D]),
    /// Multiply decoded sparse keys / values by these (1.0 unless a scale is set).
    pub value_scale: (f32, f32),
}

impl<I, V, D> Clone for HybridView<'_, I, V, D> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<I, V, D> Copy for HybridView<'_, I, V, D> {}

impl<I, V, D> std::fmt::Debug for HybridView<'_, I, V, D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HybridView")
            .field("head_dim", &self.head_dim)
            .field("sparse_keys", &self.sparse_keys)
            .field("sparse_values", &self.sparse_values)
            .field("buffer_rows", &rows_of(self.buffer_keys, self.head_dim))
            .field("value_scale", &self.value_scale)
            .finish()
    }
}

fn rows_of<D>((a, b): (&[D], &[D]), head_dim: usize) -> usize {
    (a.len() + b.len()).checked_div(head_dim).unwrap_or(0)
}

impl<'a, I: SparseIndex, V: Value, D: Value> HybridView<'a, I, V, D> {
    /// Tokens in the view.
    pub fn len(&self) -> usize {
        self.sparse_len() + self.buffer_len()
    }

    /// True when the view holds no tokens.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Tokens in the sparse history.
    pub fn sparse_len(&self) -> usize {
        self.sparse_keys.num_rows()
    }

    /// Tokens in the dense buffer.
    pub fn buffer_len(&self) -> usize {
        rows_of(self.buffer_keys, self.head_dim)
    }

    /// Buffered key row `j` (0 = oldest buffered), or `None`.
    pub fn buffer_key(&self, j: usize) -> Option<&'a [D]> {
        buffer_row(self.buffer_keys, self.head_dim, j)
    }

    /// Buffered value row `j` (0 = oldest buffered), or `None`.
    pub fn buffer_value(&self, j: usize) -> Option<&'a [D]> {
        buffer_row(self.buffer_values, self.head_dim, j)
    }

    /// Decodes the key of token `i` into `out` (sparse rows scattered and scaled, buffer
    /// rows decoded). A reference for kernels and tests.
    ///
    /// # Errors
    /// [`Error::OutOfRange`] when `i >= len`; [`Error::LengthMismatch`] when
    /// `out.len() != head_dim`.
    pub fn key_into(&self, i: usize, out: &mut [f32]) -> Result<()> {
        self.decode_into(i, out, self.sparse_keys, self.buffer_keys, self.value_scale.0)
    }

    /// Decodes the value of token `i` into `out` (see [`HybridView::key_into`]).
    ///
    /// # Errors
    /// As [`HybridView::key_into`].
    pub fn value_into(&self, i: usize, out: &mut [f32]) -> Result<()> {
        self.decode_into(i, out, self.sparse_values, self.buffer_values, self.value_scale.1)
    }

    fn decode_into(
        &self,
        i: usize,
        out: &mut [f32],
        sparse: CsrView<'a, I, V>,
        buffer: (&'a [D], &'a [D]),
        scale: f32,
    ) -> Result<()> {
        const OP: &str = "HybridView::decode";
        if out.len() != self.head_dim {
            let (expected, got) = (self.head_dim, out.len());
            return Err(Error::LengthMismatch { op: OP, what: "out", expected, got });
        }
        if let Some(row) = sparse.row(i) {
            row.scatter_into(out)?;
            if scale != 1.0 {
                out.iter_mut().for_each(|x| *x *= scale);
            }
            return Ok(());
        }
        let j = i - sparse.num_rows();
        let row = buffer_row(buffer, self.head_dim, j).ok_or(Error::OutOfRange {
            op: OP,
            what: "token",
            index: i,
            len: self.len(),
        })?;
        out.iter_mut().zip(row).for_each(|(o, d)| *o = d.to_f32());
        Ok(())
    }

    /// Checks that the parts agree: same head_dim everywhere, equal key/value row counts,
    /// buffers made of whole rows.
    pub(crate) fn check_shape(&self, op: &'static str) -> Result<()> {
        let d = self.head_dim;
        let bufs = [self.buffer_keys, self.buffer_values];
        let checks = [
            ("sparse key head_dim", d, self.sparse_keys.head_dim()),
            ("sparse value head_dim", d, self.sparse_values.head_dim()),
            ("sparse value rows", self.sparse_len(), self.sparse_values.num_rows()),
            ("buffer value rows", self.buffer_len(), rows_of(self.buffer_values, d)),
            ("buffer key elements", self.buffer_len() * d, bufs[0].0.len() + bufs[0].1.len()),
            ("buffer value elements", self.buffer_len() * d, bufs[1].0.len() + bufs[1].1.len()),
        ];
        for (what, expected, got) in checks {
            if expected != got {
                return Err(Error::ShapeMismatch { op, what, expected, got });
            }
        }
        Ok(())
    }
}

fn buffer_row<'a, D>((a, b): (&'a [D], &'a [D]), head_dim: usize, j: usize) -> Option<&'a [D]> {
    let in_a = a.len().checked_div(head_dim).unwrap_or(0);
    let (slice, r) = if j < in_a { (a, j) } else { (b, j - in_a) };
    slice.get(r * head_dim..(r + 1) * head_dim)
}

/// Borrowed view of one coded hybrid cache ([`super::CodedHybridCache`]): the same token
/// order as [`HybridView`], sparse rows in a [`CodedView`].
pub struct CodedHybridView<'a, X, Y, D> {
    /// Elements per key/value vector.
    pub head_dim: usize,
    /// Sparse key history.
    pub sparse_keys: CodedView<'a, X, Y>,
    /// Sparse value history (same number of rows as `sparse_keys`).
    pub sparse_values: CodedView<'a, X, Y>,
    /// Dense buffer keys in token order, as (older, newer) row-major slices.
    pub buffer_keys: (&'a [D], &'a [D]),
    /// Dense buffer values in token order, as (older, newer) row-major slices.
    pub buffer_values: (&'a [D], &'a [D]),
    /// Multiply decoded sparse keys / values by these (1.0 unless a per-head scale is set).
    pub value_scale: (f32, f32),
}

impl<X, Y, D> Clone for CodedHybridView<'_, X, Y, D> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<X, Y, D> Copy for CodedHybridView<'_, X, Y, D> {}

impl<X, Y, D> std::fmt::Debug for CodedHybridView<'_, X, Y, D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CodedHybridView")
            .field("head_dim", &self.head_dim)
            .field("sparse_keys", &self.sparse_keys)
            .field("buffer_rows", &rows_of(self.buffer_keys, self.head_dim))
            .finish()
    }
}

impl<'a, X: IndexCode, Y: ValueCode, D: Value> CodedHybridView<'a, X, Y, D> {
    /// Checks that the parts agree with each other (as [`HybridView`]'s shape check).
    pub(crate) fn check_shape(&self, op: &'static str) -> Result<()> {
        let d = self.head_dim;
        let bufs = [self.buffer_keys, self.buffer_values];
        let checks = [
            ("sparse key head_dim", d, self.sparse_keys.head_dim()),
            ("sparse value head_dim", d, self.sparse_values.head_dim()),
            ("sparse value rows", self.sparse_len(), self.sparse_values.num_rows()),
            ("buffer value rows", self.buffer_len(), rows_of(self.buffer_values, d)),
            ("buffer key elements", self.buffer_len() * d, bufs[0].0.len() + bufs[0].1.len()),
            ("buffer value elements", self.buffer_len() * d, bufs[1].0.len() + bufs[1].1.len()),
        ];
        for (what, expected, got) in checks {
            if expected != got {
                return Err(Error::ShapeMismatch { op, what, expected, got });
            }
        }
        Ok(())
    }

    /// Tokens in the view.
    pub fn len(&self) -> usize {
        self.sparse_len() + self.buffer_len()
    }

    /// True when the view holds no tokens.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Tokens in the sparse history.
    pub fn sparse_len(&self) -> usize {
        self.sparse_keys.num_rows()
    }

    /// Tokens in the dense buffer.
    pub fn buffer_len(&self) -> usize {
        rows_of(self.buffer_keys, self.head_dim)
    }

    /// Buffered key row `j` (0 = oldest buffered), or `None`.
    pub fn buffer_key(&self, j: usize) -> Option<&'a [D]> {
        buffer_row(self.buffer_keys, self.head_dim, j)
    }

    /// Buffered value row `j` (0 = oldest buffered), or `None`.
    pub fn buffer_value(&self, j: usize) -> Option<&'a [D]> {
        buffer_row(self.buffer_values, self.head_dim, j)
    }

    /// Decodes the key of token `i` into `out` (sparse rows expanded and scaled, buffer
    /// rows converted).
    ///
    /// # Errors
    /// [`Error::OutOfRange`] when `i >= len`; [`Error::LengthMismatch`] for `out`.
    pub fn key_into(&self, i: usize, out: &mut [f32]) -> Result<()> {
        self.decode_into(i, out, self.sparse_keys, self.buffer_keys, self.value_scale.0)
    }

    /// Decodes the value of token `i` into `out` (see [`CodedHybridView::key_into`]).
    ///
    /// # Errors
    /// As [`CodedHybridView::key_into`].
    pub fn value_into(&self, i: usize, out: &mut [f32]) -> Result<()> {
        self.decode_into(i, out, self.sparse_values, self.buffer_values, self.value_scale.1)
    }

    fn decode_into(
        &self,
        i: usize,
        out: &mut [f32],
        sparse: CodedView<'a, X, Y>,
        buffer: (&'a [D], &'a [D]),
        scale: f32,
    ) -> Result<()> {
        const OP: &str = "CodedHybridView::decode";
        if out.len() != self.head_dim {
            let (expected, got) = (self.head_dim, out.len());
            return Err(Error::LengthMismatch { op: OP, what: "out", expected, got });
        }
        if let Some(row) = sparse.row(i) {
            row.expand(out);
            if scale != 1.0 {
                out.iter_mut().for_each(|x| *x *= scale);
            }
            return Ok(());
        }
        let j = i - sparse.num_rows();
        let row = buffer_row(buffer, self.head_dim, j).ok_or(Error::OutOfRange {
            op: OP,
            what: "token",
            index: i,
            len: self.len(),
        })?;
        out.iter_mut().zip(row).for_each(|(o, d)| *o = d.to_f32());
        Ok(())
    }
}
