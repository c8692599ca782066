//! The sparse history of one hybrid cache: key and value [`CsrStore`]s filled in lockstep.
//!
//! SWAN (method section, Algorithm 1): an evicted key is pruned to `k_key` components and
//! its value to `k_value` components; both rows join the sparse history together, so the
//! two stores always hold the same number of rows. A push is all-or-nothing. The stores
//! are any [`RowStore`] (CSR or coded rows).

use super::RowStore;
use crate::Result;
use crate::memory::MemoryReport;

/// Key and value stores plus the scale and scratch used to fill them.
#[derive(Clone, Debug)]
pub(crate) struct SparseHistory<S> {
    pub(crate) keys: S,
    pub(crate) values: S,
    k_key: usize,
    k_value: usize,
    scale: (f32, f32),
    scaled: Vec<f32>,
}

impl<S: RowStore> SparseHistory<S> {
    pub(crate) fn new(keys: S, values: S, k: (usize, usize), scale: (f32, f32)) -> Self {
        let scaled = Vec::with_capacity(keys.head_dim());
        Self { keys, values, k_key: k.0, k_value: k.1, scale, scaled }
    }

    /// Prunes and appends one (key, value) pair; on error neither store changes.
    pub(crate) fn push(&mut self, k: &[f32], v: &[f32]) -> Result<()> {
        let rows = self.keys.len();
        push_scaled(&mut self.keys, k, self.k_key, self.scale.0, &mut self.scaled)?;
        let pushed = push_scaled(&mut self.values, v, self.k_value, self.scale.1, &mut self.scaled);
        if pushed.is_err() {
            self.keys.truncate(rows);
        }
        pushed
    }

    pub(crate) fn len(&self) -> usize {
        self.keys.len()
    }

    pub(crate) fn reserve(&mut self, rows: usize) {
        self.keys.reserve(rows, rows * self.k_key);
        self.values.reserve(rows, rows * self.k_value);
    }

    pub(crate) fn clear(&mut self) {
        self.keys.truncate(0);
        self.values.truncate(0);
    }

    pub(crate) fn memory(&self) -> MemoryReport {
        let scratch = MemoryReport {
            capacity_slack_bytes: self.scaled.capacity() * std::mem::size_of::<f32>(),
            ..MemoryReport::default()
        };
        self.keys.memory() + self.values.memory() + scratch
    }
}

/// Pushes `row / scale` (or `row` itself when the scale is 1) pruned to `k` entries.
/// With `k = 0` nothing is kept and the row is pushed unscaled: a finite row divided by a
/// small scale may overflow to ∞, which the store would refuse although it keeps nothing.
fn push_scaled<S: RowStore>(
    store: &mut S,
    row: &[f32],
    k: usize,
    scale: f32,
    scaled: &mut Vec<f32>,
) -> Result<()> {
    if scale == 1.0 || k == 0 {
        return store.push_dense(row, k);
    }
    scaled.clear();
    scaled.extend(row.iter().map(|&x| x / scale));
    store.push_dense(scaled, k)
}
