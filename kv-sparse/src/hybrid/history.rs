//! The sparse history of one hybrid cache: key and value [`CsrStore`]s filled in lockstep.
//!
//! SWAN (method section, Algorithm 1): an evicted key is pruned to `k_key` components and
//! its value to `k_value` components; both rows join the sparse history together, so the
//! two stores always hold the same number of rows. A push is all-or-nothing. The stores
//! are any [`RowStore`] (CSR or coded rows).
//!
//! Keys may be selected by weighted magnitude instead: with per-component weights `w` an
//! evicted key keeps the `k_key` components with the largest `|x_j|·w_j` (their values
//! unweighted). With `w_j = √E[q̂_j²]` that ranks components by their expected share of a
//! score `q̂·k̂` — the query-aware channel selection of ThinK (Xu et al., 2024) applied per
//! token — where SWAN's rule ranks by `|x_j|` alone. Values may be given weights the same
//! way: a cache that stores its rows divided by per-component scales `c` (so that one row
//! scale fits every component) selects by `|x_j/c_j|·c_j`, the original magnitudes.

use super::RowStore;
use crate::memory::MemoryReport;
use crate::topk::top_k_magnitude;
use crate::{Error, Result};

/// Key and value stores plus the scale and scratch used to fill them.
#[derive(Clone, Debug)]
pub(crate) struct SparseHistory<S> {
    pub(crate) keys: S,
    pub(crate) values: S,
    k_key: usize,
    k_value: usize,
    scale: (f32, f32),
    scaled: Vec<f32>,
    /// Key-selection weights, largest 1 (`None`: plain magnitude).
    key_weights: Option<Vec<f32>>,
    /// Value-selection weights, largest 1 (`None`: plain magnitude).
    value_weights: Option<Vec<f32>>,
    /// Selected components (weighted selection only).
    selected: Vec<usize>,
}

impl<S: RowStore> SparseHistory<S> {
    pub(crate) fn new(keys: S, values: S, k: (usize, usize), scale: (f32, f32)) -> Self {
        let scaled = Vec::with_capacity(keys.head_dim());
        Self {
            keys,
            values,
            k_key: k.0,
            k_value: k.1,
            scale,
            scaled,
            key_weights: None,
            value_weights: None,
            selected: Vec::new(),
        }
    }

    /// Sets (or clears) the key-selection weights; see the module docs.
    ///
    /// # Errors
    /// As [`checked_weights`]. Unchanged on error.
    pub(crate) fn set_key_weights(&mut self, weights: Option<&[f32]>) -> Result<()> {
        self.key_weights =
            checked_weights("Hybrid::set_key_weights", self.keys.head_dim(), weights)?;
        self.selected.reserve(self.keys.head_dim());
        Ok(())
    }

    /// Sets (or clears) the value-selection weights; see the module docs.
    ///
    /// # Errors
    /// As [`checked_weights`]. Unchanged on error.
    pub(crate) fn set_value_weights(&mut self, weights: Option<&[f32]>) -> Result<()> {
        self.value_weights =
            checked_weights("Hybrid::set_value_weights", self.values.head_dim(), weights)?;
        self.selected.reserve(self.values.head_dim());
        Ok(())
    }

    /// The key-selection weights (normalised to a largest weight of 1), if set.
    pub(crate) fn key_weights(&self) -> Option<&[f32]> {
        self.key_weights.as_deref()
    }

    /// The value-selection weights (normalised to a largest weight of 1), if set.
    pub(crate) fn value_weights(&self) -> Option<&[f32]> {
        self.value_weights.as_deref()
    }

    /// Prunes and appends one (key, value) pair; on error neither store changes.
    pub(crate) fn push(&mut self, k: &[f32], v: &[f32]) -> Result<()> {
        let rows = self.keys.len();
        let scratch = (&mut self.scaled, &mut self.selected);
        push_row(
            &mut self.keys,
            k,
            (self.k_key, self.scale.0),
            self.key_weights.as_deref(),
            scratch,
        )?;
        let scratch = (&mut self.scaled, &mut self.selected);
        let pushed = push_row(
            &mut self.values,
            v,
            (self.k_value, self.scale.1),
            self.value_weights.as_deref(),
            scratch,
        );
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

/// Validated selection weights of a `d`-wide store, normalised to a largest weight of 1
/// (so `|x|·w` never overflows where `x` did not); `None` stays `None`.
///
/// # Errors
/// [`Error::LengthMismatch`] unless `d` weights; [`Error::NonFinite`] for NaN/∞;
/// [`Error::InvalidWeight`] for a negative weight or all zeros.
fn checked_weights(
    op: &'static str,
    d: usize,
    weights: Option<&[f32]>,
) -> Result<Option<Vec<f32>>> {
    let Some(w) = weights else { return Ok(None) };
    if w.len() != d {
        return Err(Error::LengthMismatch { op, what: "weights", expected: d, got: w.len() });
    }
    if let Some((position, &value)) = w.iter().enumerate().find(|(_, x)| !x.is_finite()) {
        return Err(Error::NonFinite { op, position, value });
    }
    if let Some((position, &value)) = w.iter().enumerate().find(|(_, x)| **x < 0.0) {
        return Err(Error::InvalidWeight { op, position, value });
    }
    let max = w.iter().fold(0f32, |m, &x| m.max(x));
    if max <= 0.0 {
        return Err(Error::InvalidWeight { op, position: 0, value: w[0] });
    }
    Ok(Some(w.iter().map(|&x| x / max).collect()))
}

/// Pushes one row: by weighted magnitude when weights are set and `0 < k < head_dim`,
/// else by plain magnitude.
fn push_row<S: RowStore>(
    store: &mut S,
    row: &[f32],
    (k, scale): (usize, f32),
    weights: Option<&[f32]>,
    (scaled, selected): (&mut Vec<f32>, &mut Vec<usize>),
) -> Result<()> {
    match weights {
        Some(w) if k > 0 && k < w.len() => {
            push_weighted(store, row, (k, scale), w, (scaled, selected))
        }
        _ => push_scaled(store, row, k, scale, scaled),
    }
}

/// Pushes `row / scale` pruned to the `k` entries with the largest `|row_j|·w_j` (the
/// values unweighted), for `0 < k < head_dim`.
fn push_weighted<S: RowStore>(
    store: &mut S,
    row: &[f32],
    (k, scale): (usize, f32),
    w: &[f32],
    (scratch, selected): (&mut Vec<f32>, &mut Vec<usize>),
) -> Result<()> {
    scratch.clear();
    scratch.extend(row.iter().zip(w).map(|(&x, &w)| x * w));
    top_k_magnitude(scratch, k, selected)?;
    scratch.clear();
    scratch.extend(selected.iter().map(|&j| if scale == 1.0 { row[j] } else { row[j] / scale }));
    store.push_sparse(selected, scratch)
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
