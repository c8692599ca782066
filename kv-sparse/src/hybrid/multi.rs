//! [`MultiHeadCache`]: the hybrid caches of a whole model, `[layer][kv_head]`.
//!
//! SWAN applies its hybrid cache per layer and per KV head (method section; with GQA the
//! cache is per KV head, shared by its query-head group). This container routes one
//! token's concatenated per-head rows to the right caches, all-or-nothing per layer.

use super::{Hybrid, HybridCache, HybridConfig, HybridView, RowStore};
use crate::coded::CodedStore;
use crate::csr::CsrStore;
use crate::memory::MemoryReport;
use crate::{Error, Result, SparseIndex, Value};

/// `num_layers × kv_heads` hybrid caches sharing one head dimension, over any
/// [`RowStore`] `S`.
#[derive(Clone, Debug)]
pub struct MultiHead<S, D> {
    num_layers: usize,
    kv_heads: usize,
    head_dim: usize,
    /// Layer-major: `heads[layer * kv_heads + h]`.
    heads: Vec<Hybrid<S, D>>,
}

/// The CSR form: [`HybridCache`]s of `u8`/`u16` indices and `V` values.
pub type MultiHeadCache<I, V, D> = MultiHead<CsrStore<I, V>, D>;

/// The coded form: [`super::CodedHybridCache`]s of `X` indices and `Y` values.
pub type CodedMultiHeadCache<X, Y, D> = MultiHead<CodedStore<X, Y>, D>;

impl<S: RowStore, D: Value> MultiHead<S, D> {
    /// `num_layers × kv_heads` empty caches with the same config.
    ///
    /// # Errors
    /// [`Error::ShapeMismatch`] when a count is 0; any [`HybridConfig::validate`] error.
    ///
    /// # Examples
    /// ```
    /// use kv_sparse::hybrid::{HybridConfig, MultiHeadCache};
    /// let mut cache = MultiHeadCache::<u8, half::f16, half::f16>::new(2, 3, HybridConfig::new(4, 8, 2))?;
    /// cache.append_token(0, &[1.0; 12], &[0.5; 12])?; // 3 kv heads × head_dim 4
    /// assert_eq!(cache.layer_len(0)?, 1);
    /// # Ok::<(), kv_sparse::Error>(())
    /// ```
    pub fn new(num_layers: usize, kv_heads: usize, cfg: HybridConfig) -> Result<Self> {
        cfg.validate_store::<S, D>()?;
        check_nonzero("MultiHeadCache::new", num_layers, kv_heads)?;
        let heads =
            (0..num_layers * kv_heads).map(|_| Hybrid::new(cfg)).collect::<Result<Vec<_>>>()?;
        Ok(Self { num_layers, kv_heads, head_dim: cfg.head_dim, heads })
    }

    /// Builds a container from per-head caches (layer-major, e.g. with per-layer `k`).
    ///
    /// # Errors
    /// [`Error::ShapeMismatch`] when a count is 0, `heads.len()` is not
    /// `num_layers · kv_heads`, or head dimensions differ.
    pub fn from_heads(
        num_layers: usize,
        kv_heads: usize,
        heads: Vec<Hybrid<S, D>>,
    ) -> Result<Self> {
        const OP: &str = "MultiHeadCache::from_heads";
        check_nonzero(OP, num_layers, kv_heads)?;
        let expected = num_layers * kv_heads;
        if heads.len() != expected {
            let got = heads.len();
            return Err(Error::ShapeMismatch { op: OP, what: "number of heads", expected, got });
        }
        let head_dim = heads[0].head_dim();
        if let Some(h) = heads.iter().find(|h| h.head_dim() != head_dim) {
            let got = h.head_dim();
            return Err(Error::ShapeMismatch { op: OP, what: "head_dim", expected: head_dim, got });
        }
        Ok(Self { num_layers, kv_heads, head_dim, heads })
    }

    /// Appends one token to every KV head of `layer`: `k` and `v` are the heads' rows
    /// concatenated (`kv_heads × head_dim`). All heads are checked before any changes.
    ///
    /// # Errors
    /// [`Error::OutOfRange`] for a bad layer; [`Error::LengthMismatch`]; any error of
    /// [`Hybrid::append`]. The layer is unchanged on error.
    pub fn append_token(&mut self, layer: usize, k: &[f32], v: &[f32]) -> Result<()> {
        const OPS: [&str; 2] =
            ["MultiHeadCache::append_token: key", "MultiHeadCache::append_token: value"];
        self.check_layer_input(OPS, layer, k, v, self.head_dim)?;
        let d = self.head_dim;
        let heads = self.layer_mut(layer);
        for (h, (k, v)) in heads.iter().zip(k.chunks_exact(d).zip(v.chunks_exact(d))) {
            h.check_input(OPS, k, v, 1)?;
        }
        for (h, (k, v)) in heads.iter_mut().zip(k.chunks_exact(d).zip(v.chunks_exact(d))) {
            h.append_checked(k, v)?;
        }
        Ok(())
    }

    /// Bulk insert of `n` tokens into every KV head of `layer` (a prefill). `keys` and
    /// `values` are **head-major**: `kv_heads × n × head_dim`, so each head's rows are
    /// contiguous (the layout of a `[kv_heads, seq, head_dim]` tensor).
    ///
    /// # Errors
    /// As [`MultiHeadCache::append_token`] and [`Hybrid::extend`]; the layer is
    /// unchanged on error.
    pub fn extend_layer(&mut self, layer: usize, keys: &[f32], values: &[f32]) -> Result<()> {
        const OPS: [&str; 2] =
            ["MultiHeadCache::extend_layer: keys", "MultiHeadCache::extend_layer: values"];
        let per_head = keys.len() / self.kv_heads;
        let n = per_head / self.head_dim;
        self.check_layer_input(OPS, layer, keys, values, n * self.head_dim)?;
        let heads = self.layer_mut(layer);
        for (h, (k, v)) in
            heads.iter().zip(keys.chunks_exact(per_head).zip(values.chunks_exact(per_head)))
        {
            h.check_input(OPS, k, v, n)?;
        }
        for (h, (k, v)) in
            heads.iter_mut().zip(keys.chunks_exact(per_head).zip(values.chunks_exact(per_head)))
        {
            h.extend_checked(k, v)?;
        }
        Ok(())
    }

    fn check_layer_input(
        &self,
        ops: [&'static str; 2],
        layer: usize,
        k: &[f32],
        v: &[f32],
        per_head: usize,
    ) -> Result<()> {
        self.check_layer(ops[0], layer)?;
        let expected = per_head * self.kv_heads;
        for (op, what, got) in [(ops[0], "keys", k.len()), (ops[1], "values", v.len())] {
            if got != expected {
                return Err(Error::LengthMismatch { op, what, expected, got });
            }
        }
        Ok(())
    }

    fn check_layer(&self, op: &'static str, layer: usize) -> Result<()> {
        if layer >= self.num_layers {
            return Err(Error::OutOfRange {
                op,
                what: "layer",
                index: layer,
                len: self.num_layers,
            });
        }
        Ok(())
    }

    fn layer_mut(&mut self, layer: usize) -> &mut [Hybrid<S, D>] {
        let n = self.kv_heads;
        &mut self.heads[layer * n..(layer + 1) * n]
    }

    /// The caches of `layer`, one per KV head, or `None` for a bad layer.
    pub fn layer(&self, layer: usize) -> Option<&[Hybrid<S, D>]> {
        let n = self.kv_heads;
        self.heads.get(layer * n..(layer + 1) * n)
    }

    /// Tokens held by `layer` (all its heads agree).
    ///
    /// # Errors
    /// [`Error::OutOfRange`] for a bad layer.
    pub fn layer_len(&self, layer: usize) -> Result<usize> {
        self.check_layer("MultiHeadCache::layer_len", layer)?;
        Ok(self.heads[layer * self.kv_heads].len())
    }

    /// The cache of (`layer`, `kv_head`), or `None`.
    pub fn head(&self, layer: usize, kv_head: usize) -> Option<&Hybrid<S, D>> {
        self.layer(layer)?.get(kv_head)
    }

    /// Mutable cache of (`layer`, `kv_head`), or `None`.
    pub fn head_mut(&mut self, layer: usize, kv_head: usize) -> Option<&mut Hybrid<S, D>> {
        if layer >= self.num_layers || kv_head >= self.kv_heads {
            return None;
        }
        self.heads.get_mut(layer * self.kv_heads + kv_head)
    }

    /// All caches, layer-major.
    pub fn heads(&self) -> &[Hybrid<S, D>] {
        &self.heads
    }

    /// Number of layers.
    pub fn num_layers(&self) -> usize {
        self.num_layers
    }

    /// KV heads per layer.
    pub fn kv_heads(&self) -> usize {
        self.kv_heads
    }

    /// Elements per key/value vector.
    pub fn head_dim(&self) -> usize {
        self.head_dim
    }

    /// Removes all tokens from every head.
    pub fn clear(&mut self) {
        self.heads.iter_mut().for_each(Hybrid::clear);
    }

    /// Bytes held by all heads together.
    pub fn memory(&self) -> MemoryReport {
        self.heads.iter().map(Hybrid::memory).sum()
    }
}

impl<I: SparseIndex, V: Value, D: Value> MultiHeadCache<I, V, D> {
    /// The kernel view of (`layer`, `kv_head`), or `None`.
    pub fn view(&self, layer: usize, kv_head: usize) -> Option<HybridView<'_, I, V, D>> {
        self.head(layer, kv_head).map(HybridCache::view)
    }
}

fn check_nonzero(op: &'static str, num_layers: usize, kv_heads: usize) -> Result<()> {
    for (what, got) in [("num_layers", num_layers), ("kv_heads", kv_heads)] {
        if got == 0 {
            return Err(Error::ShapeMismatch { op, what, expected: 1, got });
        }
    }
    Ok(())
}
