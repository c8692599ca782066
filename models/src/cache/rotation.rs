//! [`QkRotation`]: the query/key half of a basis change, shared by every cache that stores
//! rotated keys — the SWAN basis (`papers/swan.txt`, method section: `q̂ = q·P_QK`,
//! `k̂ = k·P_QK`, which cannot be absorbed because RoPE is position-dependent) and the
//! data-free Walsh–Hadamard rotation quantized dense caches use. Values need no step here:
//! their basis `P_VO` is absorbed into `W_V`/`W_O` by [`crate::llama::Llama::absorb_vo`].

use std::sync::Arc;

use projection::ProjectionSet;

use super::{CacheShape, LayerKv, StepQkv};
use crate::error::Result;

/// Rotates each step's q and k, and each prefill block's keys, by a set's `P_QK`, into
/// buffers it owns (no allocation after the first prefill of the longest block).
pub(crate) struct QkRotation {
    set: Arc<ProjectionSet>,
    q: Vec<f32>,
    k: Vec<f32>,
    prefill: Vec<f32>,
}

impl QkRotation {
    /// A rotation by `set`, which must fit `shape`.
    pub(crate) fn new(
        op: &'static str,
        shape: CacheShape,
        set: Arc<ProjectionSet>,
    ) -> Result<Self> {
        shape.check_projection(op, set.dims())?;
        Ok(Self {
            set,
            q: vec![0.0; shape.q_heads() * shape.head_dim()],
            k: vec![0.0; shape.kv_heads() * shape.head_dim()],
            prefill: Vec::new(),
        })
    }

    /// The set rotating q and k.
    pub(crate) fn set(&self) -> &ProjectionSet {
        &self.set
    }

    /// `step` with q and k rotated (v passes through: already in the absorbed basis).
    pub(crate) fn step<'a>(&'a mut self, layer: usize, step: StepQkv<'a>) -> Result<StepQkv<'a>> {
        self.set.rotate_qk_into(layer, 1, step.q, step.k, &mut self.q, &mut self.k)?;
        Ok(StepQkv { q: &self.q, k: &self.k, v: step.v })
    }

    /// `kv` with its keys rotated head by head (`[kv_heads][tokens][head_dim]`).
    pub(crate) fn prefill<'a>(
        &'a mut self,
        layer: usize,
        shape: &CacheShape,
        kv: LayerKv<'a>,
    ) -> Result<LayerKv<'a>> {
        let n = kv.tokens * shape.head_dim();
        self.prefill.resize(kv.keys.len(), 0.0);
        for h in 0..shape.kv_heads() {
            let p = self.set.qk(layer, h)?;
            let range = h * n..(h + 1) * n;
            projection::rotate_rows(&kv.keys[range.clone()], p, &mut self.prefill[range])?;
        }
        Ok(LayerKv { keys: &self.prefill, values: kv.values, tokens: kv.tokens })
    }
}
