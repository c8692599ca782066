//! CSR storage of pruned K/V vectors in paged blocks of rows.
//!
//! SWAN ("Memory footprint" paragraph of the method section) stores each pruned vector in
//! Compressed Sparse Row form: its `k` kept values, their indices, and a 2-byte offset.
//! A 2-byte offset can only address 65 535 entries, so rows are grouped into fixed-size
//! blocks ("pages") of `rows_per_block` rows, each block carrying a u64 base (its first
//! entry's absolute position) and every row a u16 offset relative to its block. The
//! arrays of all blocks are contiguous, so a view is four slices — zero-copy for
//! memory-mapped files and a single upload for a device.
//!
//! * [`SparseRow`] — one row, borrowed.
//! * [`BlockView`] — one block, borrowed.
//! * [`CsrView`] — a whole store, borrowed (in-memory or mapped).
//! * [`CsrStore`] — the owned, growable store.

mod row;
mod store;
mod view;

pub use row::{BlockView, SparseRow};
pub use store::CsrStore;
pub use view::CsrView;

use crate::{Error, Result};

/// Largest number of stored entries in one block (row offsets are u16).
pub const MAX_BLOCK_NNZ: usize = u16::MAX as usize;

/// Largest `rows_per_block` for `head_dim`: `65535 / head_dim`, so that a block of full
/// rows never exceeds [`MAX_BLOCK_NNZ`] entries.
///
/// # Examples
/// ```
/// assert_eq!(kv_sparse::csr::max_rows_per_block(128), 511);
/// ```
pub const fn max_rows_per_block(head_dim: usize) -> usize {
    match MAX_BLOCK_NNZ.checked_div(head_dim) {
        Some(max) => max,
        None => 0,
    }
}

/// Default `rows_per_block`: 256 rows, or fewer where [`max_rows_per_block`] requires.
///
/// # Examples
/// ```
/// assert_eq!(kv_sparse::csr::default_rows_per_block(128), 256);
/// assert_eq!(kv_sparse::csr::default_rows_per_block(4096), 15);
/// ```
pub const fn default_rows_per_block(head_dim: usize) -> usize {
    let max = max_rows_per_block(head_dim);
    if max < 256 { max } else { 256 }
}

/// Validates `rows_per_block` against `head_dim` (callers validate `head_dim` first).
pub(crate) fn check_rows_per_block(
    op: &'static str,
    head_dim: usize,
    rows_per_block: usize,
) -> Result<()> {
    let max = max_rows_per_block(head_dim);
    if rows_per_block == 0 || rows_per_block > max {
        return Err(Error::RowsPerBlockOutOfRange { op, rows_per_block, head_dim, max });
    }
    Ok(())
}
