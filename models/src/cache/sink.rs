//! `sink`: the first positions of a quantized cache kept in `f32` — the attention sink, the
//! one row whose rounding every later query and every window shares — as the dense
//! quantized cache ([`super::QuantCache`]) and its ring ([`super::QuantWindowCache`]) hold
//! them. A baseline setting of the frontier study (not a part of either paper's method).

use std::ops::Range;

use crate::error::{Result, invalid};

/// The sink rows of every (layer, kv-head) of one cache.
pub(crate) struct SinkRows {
    /// Positions kept (`0`: none).
    pub(crate) positions: usize,
    /// `keys[layer * kv_heads + h]`: row `p` (position `p`) at `p · head_dim`, row-major.
    pub(crate) keys: Vec<Vec<f32>>,
    /// The values, laid out as `keys`.
    pub(crate) values: Vec<Vec<f32>>,
}

impl SinkRows {
    /// No sink, room for `heads` (layer, kv-head) slots.
    pub(crate) fn new(heads: usize) -> Self {
        Self { positions: 0, keys: vec![Vec::new(); heads], values: vec![Vec::new(); heads] }
    }

    /// ` sink=N` for a cache's label, or nothing without a sink.
    pub(crate) fn label(&self) -> String {
        if self.positions > 0 { format!(" sink={}", self.positions) } else { String::new() }
    }

    /// Bytes the rows hold (f32 keys and values).
    pub(crate) fn held_bytes(&self) -> usize {
        self.keys.iter().chain(&self.values).map(|r| 4 * r.len()).sum()
    }

    /// Positions slot `slot` holds.
    pub(crate) fn held(&self, slot: usize, head_dim: usize) -> usize {
        self.keys[slot].len() / head_dim.max(1)
    }

    /// How many of the next `tokens` positions of the layer whose first slot is `first` go
    /// to the sink (the same for every head of a layer, which all hold the same positions).
    pub(crate) fn takes(&self, first: usize, tokens: usize, head_dim: usize) -> usize {
        self.positions.saturating_sub(self.held(first, head_dim)).min(tokens)
    }

    /// Refuses sink rows (keys, values) holding a NaN or an infinity.
    pub(crate) fn check(op: &'static str, keys: &[f32], values: &[f32]) -> Result<()> {
        match keys.iter().chain(values).find(|x| !x.is_finite()) {
            Some(x) => Err(invalid(op, format!("non-finite sink element {x}"))),
            None => Ok(()),
        }
    }

    /// Appends checked rows (keys, values) to slot `slot`.
    pub(crate) fn push(&mut self, slot: usize, keys: &[f32], values: &[f32]) {
        self.keys[slot].extend_from_slice(keys);
        self.values[slot].extend_from_slice(values);
    }

    /// Every position slot `slot` holds: its keys and values.
    pub(crate) fn all(&self, slot: usize) -> (&[f32], &[f32]) {
        (&self.keys[slot], &self.values[slot])
    }

    /// Keys and values of positions `range` in slot `slot` (rows of `head_dim`).
    pub(crate) fn rows(
        &self,
        slot: usize,
        range: Range<usize>,
        head_dim: usize,
    ) -> (&[f32], &[f32]) {
        let span = range.start * head_dim..range.end * head_dim;
        (&self.keys[slot][span.clone()], &self.values[slot][span])
    }
}
