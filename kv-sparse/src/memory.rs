//! Exact memory accounting and the paper's cost formulas.
//!
//! SWAN ("Memory footprint" paragraph): a sparse vector with `k` kept components costs
//! `k·(sizeof value + sizeof index) + 2` bytes — `3k+2` with 16-bit values and u8 indices,
//! `2k+2` with fp8 values — against `2·d_h` for a dense f16 vector. SWAN ("Computational
//! complexity", Appendix A.2) also gives the decode-step FLOP break-even length
//! `L > b + d_h²/(d_h − k)`. [`MemoryReport`] counts the bytes a cache really holds, split
//! the same way, plus what the paper's formula omits (one u64 base per block of rows) and
//! the allocated-but-unused capacity, reported separately.

use std::iter::Sum;
use std::ops::{Add, AddAssign};

use crate::ValueFormat;

/// Bytes held by a cache, split by role.
///
/// `value_bytes + index_bytes + offset_bytes` of a sparse store whose rows all keep `k`
/// entries is exactly `rows · sparse_row_bytes(k, ..)`, the paper's formula.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryReport {
    /// Stored sparse values.
    pub value_bytes: usize,
    /// Stored sparse indices.
    pub index_bytes: usize,
    /// Stored quantization scales (per row of integer-coded sparse values, per block or
    /// row of dense quantized rows).
    pub scale_bytes: usize,
    /// The 2-byte per-row offsets.
    pub offset_bytes: usize,
    /// One u64 base per block of rows (paging overhead beyond the paper's formula).
    pub block_header_bytes: usize,
    /// Dense buffer rows currently held (keys and values).
    pub dense_bytes: usize,
    /// Allocated but not holding cache data: unused vector capacity, empty ring slots and
    /// reusable scratch. Not part of [`MemoryReport::held_bytes`].
    pub capacity_slack_bytes: usize,
}

impl MemoryReport {
    /// Bytes of cache data: everything except capacity slack.
    ///
    /// # Examples
    /// ```
    /// let r = kv_sparse::memory::MemoryReport { value_bytes: 10, capacity_slack_bytes: 5,
    ///                                           ..Default::default() };
    /// assert_eq!(r.held_bytes(), 10);
    /// assert_eq!(r.allocated_bytes(), 15);
    /// ```
    pub fn held_bytes(&self) -> usize {
        self.value_bytes
            + self.index_bytes
            + self.scale_bytes
            + self.offset_bytes
            + self.block_header_bytes
            + self.dense_bytes
    }

    /// Everything allocated: held bytes plus capacity slack.
    pub fn allocated_bytes(&self) -> usize {
        self.held_bytes() + self.capacity_slack_bytes
    }

    /// Bytes of the sparse part in the paper's accounting (values + indices + offsets),
    /// plus the per-row scales of integer-coded rows (0 for CSR rows).
    pub fn sparse_formula_bytes(&self) -> usize {
        self.value_bytes + self.index_bytes + self.scale_bytes + self.offset_bytes
    }
}

impl Add for MemoryReport {
    type Output = MemoryReport;
    fn add(mut self, rhs: MemoryReport) -> MemoryReport {
        self += rhs;
        self
    }
}

impl AddAssign for MemoryReport {
    fn add_assign(&mut self, rhs: MemoryReport) {
        self.value_bytes += rhs.value_bytes;
        self.index_bytes += rhs.index_bytes;
        self.scale_bytes += rhs.scale_bytes;
        self.offset_bytes += rhs.offset_bytes;
        self.block_header_bytes += rhs.block_header_bytes;
        self.dense_bytes += rhs.dense_bytes;
        self.capacity_slack_bytes += rhs.capacity_slack_bytes;
    }
}

impl Sum for MemoryReport {
    fn sum<It: Iterator<Item = MemoryReport>>(iter: It) -> MemoryReport {
        iter.fold(MemoryReport::default(), Add::add)
    }
}

/// Bytes of one sparse vector with `k` kept entries: `(value + index bytes)·k + 2`
/// (the 2-byte row offset). `3k+2` for 16-bit values with u8 indices, `2k+2` for fp8.
///
/// # Examples
/// ```
/// use kv_sparse::{memory::sparse_row_bytes, ValueFormat};
/// assert_eq!(sparse_row_bytes(64, ValueFormat::F16, 1), 3 * 64 + 2);
/// assert_eq!(sparse_row_bytes(64, ValueFormat::Fp8E4M3, 1), 2 * 64 + 2);
/// ```
pub fn sparse_row_bytes(k: usize, value: ValueFormat, index_bytes: usize) -> usize {
    (value.bytes() + index_bytes) * k + 2
}

/// Bytes of one dense vector: `head_dim · sizeof(format)` (`2·d_h` for f16).
///
/// # Examples
/// ```
/// use kv_sparse::{memory::dense_row_bytes, ValueFormat};
/// assert_eq!(dense_row_bytes(128, ValueFormat::F16), 256);
/// ```
pub fn dense_row_bytes(head_dim: usize, format: ValueFormat) -> usize {
    head_dim * format.bytes()
}

/// The decode-step compute break-even length `b + d_h²/(d_h − k)` (SWAN, Appendix A.2):
/// SWAN needs fewer FLOPs than dense attention once the sequence length exceeds it.
/// `None` when `k ≥ head_dim` (no per-token saving, never breaks even).
///
/// # Examples
/// ```
/// // d_h = 128, b = 128, k = 64: 128 + 16384 / 64 = 384 tokens.
/// assert_eq!(kv_sparse::memory::break_even_len(128, 128, 64), Some(384.0));
/// assert_eq!(kv_sparse::memory::break_even_len(128, 0, 128), None);
/// ```
pub fn break_even_len(head_dim: usize, buffer: usize, k: usize) -> Option<f64> {
    if k >= head_dim {
        return None;
    }
    let d = head_dim as f64;
    Some(buffer as f64 + d * d / (d - k as f64))
}

/// The largest `k` whose sparse row is strictly smaller than a dense row of `head_dim`
/// elements in `dense` format (`None` if even `k = 0` is not): the memory break-even that
/// SWAN's Figure 2(a) discusses ("retain fewer than 66%" for f16 at `d_h = 128`).
///
/// # Examples
/// ```
/// use kv_sparse::{memory::max_k_saving_memory, ValueFormat};
/// // 3k + 2 < 256  <=>  k ≤ 84 (65.6% of 128)
/// assert_eq!(max_k_saving_memory(128, ValueFormat::F16, 1, ValueFormat::F16), Some(84));
/// ```
pub fn max_k_saving_memory(
    head_dim: usize,
    value: ValueFormat,
    index_bytes: usize,
    dense: ValueFormat,
) -> Option<usize> {
    let dense_bytes = dense_row_bytes(head_dim, dense);
    if dense_bytes <= 2 {
        return None;
    }
    let k = (dense_bytes - 3) / (value.bytes() + index_bytes);
    Some(k.min(head_dim))
}
