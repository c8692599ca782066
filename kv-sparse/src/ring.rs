//! [`DenseRing`]: the fixed-size dense buffer of the most recent K or V rows.
//!
//! SWAN (method section, hybrid KV-cache and Algorithm 1): new key/value vectors are kept
//! dense in a buffer of `b` rows; when it is full, the oldest row is evicted, pruned and
//! moved to the sparse history. The ring is allocated once (`b · d_h` elements) and never
//! grows, so steady-state pushes do not allocate. `b = 0` is allowed: every pushed row
//! passes straight through as "evicted".

use crate::memory::MemoryReport;
use crate::{Error, Result, Value};

/// Ring buffer of up to `capacity` dense rows of `head_dim` elements stored as `D`.
#[derive(Clone)]
pub struct DenseRing<D> {
    head_dim: usize,
    capacity: usize,
    data: Vec<D>,
    /// Slot of the oldest row.
    head: usize,
    len: usize,
}

impl<D> std::fmt::Debug for DenseRing<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DenseRing")
            .field("head_dim", &self.head_dim)
            .field("len", &self.len)
            .field("capacity", &self.capacity)
            .field("format", &std::any::type_name::<D>())
            .finish()
    }
}

impl<D: Value> DenseRing<D> {
    /// An empty ring of `capacity` rows (allocated now; `capacity = 0` allowed).
    ///
    /// # Panics
    /// When `head_dim · capacity` overflows `usize` or the allocation fails, like
    /// `Vec::with_capacity` ([`crate::hybrid::HybridConfig`] validates this up front).
    ///
    /// # Examples
    /// ```
    /// use kv_sparse::ring::DenseRing;
    /// let mut ring = DenseRing::<f32>::new(2, 2);
    /// let mut evicted = Vec::new();
    /// assert!(!ring.push(&[1.0, 1.0], &mut evicted)?);
    /// assert!(!ring.push(&[2.0, 2.0], &mut evicted)?);
    /// assert!(ring.push(&[3.0, 3.0], &mut evicted)?); // full: evicts the oldest
    /// assert_eq!(evicted, [1.0, 1.0]);
    /// assert_eq!(ring.as_slices(), (&[2.0, 2.0][..], &[3.0, 3.0][..]));
    /// # Ok::<(), kv_sparse::Error>(())
    /// ```
    pub fn new(head_dim: usize, capacity: usize) -> Self {
        Self::with_allocated(head_dim, capacity, capacity)
    }

    /// An empty ring of `capacity` rows with storage for only `rows` of them allocated now;
    /// the rest is allocated as rows arrive. For rings whose capacity comes from untrusted
    /// input (a cache file), so memory follows the rows actually held.
    ///
    /// # Panics
    /// As [`DenseRing::new`], for `head_dim · min(rows, capacity)`.
    pub(crate) fn with_allocated(head_dim: usize, capacity: usize, rows: usize) -> Self {
        let elements =
            head_dim.checked_mul(rows.min(capacity)).expect("DenseRing::new: size overflows");
        Self { head_dim, capacity, data: vec![D::default(); elements], head: 0, len: 0 }
    }

    /// Makes sure slot `slot` is allocated (only grows rings built by
    /// [`DenseRing::with_allocated`]: slots are filled in order until the ring first wraps,
    /// so the next slot is always the first unallocated one). Grows geometrically.
    fn allocate_slot(&mut self, slot: usize) {
        let d = self.head_dim;
        if (slot + 1) * d > self.data.len() {
            let rows = (self.data.len() / d.max(1) * 2).clamp(slot + 1, self.capacity);
            self.data.reserve_exact(rows * d - self.data.len());
            self.data.resize(rows * d, D::default());
        }
    }

    /// Pushes a row (encoded as `D`). When the ring is full, the oldest row is first
    /// decoded into `evicted` and `true` is returned; with capacity 0 the pushed row
    /// itself is returned in `evicted` unchanged. Returns `false` when nothing was evicted.
    ///
    /// # Errors
    /// [`Error::LengthMismatch`] when `row.len() != head_dim` (ring unchanged).
    pub fn push(&mut self, row: &[f32], evicted: &mut Vec<f32>) -> Result<bool> {
        if row.len() != self.head_dim {
            return Err(Error::LengthMismatch {
                op: "DenseRing::push",
                what: "row",
                expected: self.head_dim,
                got: row.len(),
            });
        }
        if self.capacity == 0 {
            evicted.clear();
            evicted.extend_from_slice(row);
            return Ok(true);
        }
        let full = self.is_full();
        if full {
            self.oldest_into(evicted);
        }
        self.push_within_capacity(row);
        Ok(full)
    }

    /// Writes `row` (already length-checked) as the newest row, overwriting the oldest
    /// one when full. No-op for capacity 0.
    pub(crate) fn push_within_capacity(&mut self, row: &[f32]) {
        if self.capacity == 0 {
            return;
        }
        let slot = (self.head + self.len) % self.capacity;
        self.allocate_slot(slot);
        let d = self.head_dim;
        D::encode_into(row, &mut self.data[slot * d..(slot + 1) * d]);
        self.advance_tail();
    }

    /// Writes an already-encoded row (length `head_dim`) as the newest row (see
    /// [`DenseRing::push_within_capacity`]).
    pub(crate) fn push_raw(&mut self, row: &[D]) {
        if self.capacity == 0 {
            return;
        }
        let slot = (self.head + self.len) % self.capacity;
        self.allocate_slot(slot);
        let d = self.head_dim;
        self.data[slot * d..(slot + 1) * d].copy_from_slice(row);
        self.advance_tail();
    }

    fn advance_tail(&mut self) {
        if self.len == self.capacity {
            self.head = (self.head + 1) % self.capacity;
        } else {
            self.len += 1;
        }
    }

    /// Decodes the oldest row into `out`; `false` (and `out` untouched) when empty.
    pub fn oldest_into(&self, out: &mut Vec<f32>) -> bool {
        match self.row(0) {
            Some(row) => {
                out.resize(row.len(), 0.0);
                D::decode_into(row, out);
                true
            }
            None => false,
        }
    }

    /// Drops the oldest row; `false` when empty.
    pub fn pop_oldest(&mut self) -> bool {
        if self.len == 0 {
            return false;
        }
        self.head = (self.head + 1) % self.capacity;
        self.len -= 1;
        true
    }

    /// Number of rows held.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when no rows are held.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// True when the next push evicts.
    pub fn is_full(&self) -> bool {
        self.len == self.capacity
    }

    /// Maximum number of rows.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Elements per row.
    pub fn head_dim(&self) -> usize {
        self.head_dim
    }

    /// Row `i` in token order (0 = oldest), or `None` when out of range.
    pub fn row(&self, i: usize) -> Option<&[D]> {
        if i >= self.len {
            return None;
        }
        let slot = (self.head + i) % self.capacity;
        Some(&self.data[slot * self.head_dim..(slot + 1) * self.head_dim])
    }

    /// The rows in token order as two contiguous row-major slices `(older, newer)`; the
    /// second is empty unless the ring wraps.
    pub fn as_slices(&self) -> (&[D], &[D]) {
        let d = self.head_dim;
        let first = self.len.min(self.capacity - self.head);
        let older = &self.data[self.head * d..(self.head + first) * d];
        let newer = &self.data[..(self.len - first) * d];
        (older, newer)
    }

    /// Removes all rows.
    pub fn clear(&mut self) {
        self.head = 0;
        self.len = 0;
    }

    /// Bytes held: filled rows as `dense_bytes`, allocated empty slots as capacity slack.
    pub fn memory(&self) -> MemoryReport {
        let dense_bytes = self.len * self.head_dim * D::FORMAT.bytes();
        MemoryReport {
            dense_bytes,
            capacity_slack_bytes: self.data.capacity() * D::FORMAT.bytes() - dense_bytes,
            ..MemoryReport::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_capacity_passes_rows_through() {
        let mut ring = DenseRing::<half::f16>::new(2, 0);
        let mut ev = Vec::new();
        assert!(ring.push(&[1.1, 2.2], &mut ev).unwrap());
        assert_eq!(ev, [1.1, 2.2]);
        assert_eq!(ring.as_slices(), (&[][..], &[][..]));
        assert!(ring.is_empty() && ring.is_full());
    }

    #[test]
    fn wrap_and_pop_keep_token_order() {
        let mut ring = DenseRing::<f32>::new(1, 3);
        let mut ev = Vec::new();
        for x in 0..5 {
            ring.push(&[x as f32], &mut ev).unwrap();
        }
        assert_eq!(ring.as_slices(), (&[2.0][..], &[3.0, 4.0][..]));
        assert!(ring.pop_oldest());
        assert_eq!(ring.as_slices(), (&[3.0, 4.0][..], &[][..]));
        assert_eq!(ring.row(1), Some(&[4.0][..]));
        assert!(ring.push(&[1.0, 2.0], &mut ev).is_err());
    }
}
