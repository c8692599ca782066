//! Index element types of sparse rows: the sealed [`SparseIndex`] trait for `u8` and `u16`.
//!
//! SWAN ("Memory footprint" paragraph) stores indices of kept components as 8-bit integers
//! because `d_h ≤ 256`; wider heads need 16-bit indices. The index type is a type parameter
//! (`u8` or `u16`), so the choice costs no runtime branch in hot loops.

use std::fmt;

use crate::value::sealed;

/// An index element of a sparse row (`u8` for `head_dim ≤ 256`, `u16` above).
///
/// Sealed: implemented for `u8` and `u16` only.
pub trait SparseIndex:
    sealed::Sealed + Copy + Default + Send + Sync + Eq + fmt::Debug + 'static
{
    /// One past the largest representable index: `u8` → 256, `u16` → 65536
    /// (head dimensions are further limited to 65 535 everywhere).
    const MAX_HEAD_DIM: usize;
    /// Bytes per index.
    const BYTES: usize;
    /// Converts from `usize`; the caller guarantees `i < MAX_HEAD_DIM` (checked in debug).
    fn from_usize(i: usize) -> Self;
    /// Converts to `usize`.
    fn to_usize(self) -> usize;
}

impl SparseIndex for u8 {
    const MAX_HEAD_DIM: usize = 256;
    const BYTES: usize = 1;
    #[inline(always)]
    fn from_usize(i: usize) -> Self {
        debug_assert!(i < Self::MAX_HEAD_DIM);
        i as u8
    }
    #[inline(always)]
    fn to_usize(self) -> usize {
        self as usize
    }
}

impl SparseIndex for u16 {
    const MAX_HEAD_DIM: usize = 65536;
    const BYTES: usize = 2;
    #[inline(always)]
    fn from_usize(i: usize) -> Self {
        debug_assert!(i < Self::MAX_HEAD_DIM);
        i as u16
    }
    #[inline(always)]
    fn to_usize(self) -> usize {
        self as usize
    }
}

/// Largest head dimension supported by any cache (offsets and file fields are 16-bit).
pub const MAX_HEAD_DIM: usize = 65535;

/// Validates `head_dim` for index type `I`: `1 ≤ head_dim ≤ min(I::MAX_HEAD_DIM, 65535)`.
pub(crate) fn check_head_dim<I: SparseIndex>(
    op: &'static str,
    head_dim: usize,
) -> crate::Result<()> {
    let max = I::MAX_HEAD_DIM.min(MAX_HEAD_DIM);
    if head_dim == 0 || head_dim > max {
        return Err(crate::Error::HeadDimOutOfRange { op, head_dim, max });
    }
    Ok(())
}

/// Reinterprets a slice of indices as bytes (e.g. for a device upload).
///
/// # Examples
/// ```
/// assert_eq!(kv_sparse::index_bytes(&[1u16, 2]), &[1, 0, 2, 0]);
/// ```
pub fn index_bytes<I: SparseIndex>(indices: &[I]) -> &[u8] {
    bytemuck::cast_slice(indices)
}

/// Checks that `indices` are strictly ascending and below `head_dim` (the invariant of every
/// sparse row, whatever its encoding).
///
/// # Errors
/// [`crate::Error::InvalidSparseIndex`] naming the first offending position.
pub(crate) fn check_ascending(
    op: &'static str,
    indices: impl IntoIterator<Item = usize>,
    head_dim: usize,
) -> crate::Result<()> {
    let mut next_min = 0;
    for (position, index) in indices.into_iter().enumerate() {
        let reason = if index >= head_dim {
            "not below head_dim"
        } else if index < next_min {
            "not strictly ascending"
        } else {
            next_min = index + 1;
            continue;
        };
        return Err(crate::Error::InvalidSparseIndex { op, position, index, reason });
    }
    Ok(())
}
