//! `quant`: dense quantized K/V — int8 blocks (llama.cpp `q8_0`), int4 blocks (`q4_0`) or
//! fp8 with a per-token scale (vLLM's) — optionally in a rotated basis (Walsh–Hadamard, as
//! llama.cpp rotates q/k/v for a quantized cache, or the SWAN calibrated basis). The
//! baselines SWAN is measured against in the frontier study: every key and value kept,
//! each stored at 8 or 4 bits (`papers/swan.txt` compares against dense f16; a runtime
//! compares against what its engine already offers).

use attn_kernels::{CpuAttention, EncodedAttention, QuantKv};
use kv_sparse::persist::{CacheImage, MappedCache};
use kv_sparse::quant::{DenseCodec, QuantRows};
use projection::ProjectionSet;

use super::rotation::QkRotation;
use super::{CacheBytes, CacheShape, KvCache, LayerKv, StepQkv};
use crate::error::{Result, invalid};

/// Quantized keys and values per (layer, kv-head), encoded by `C`.
pub struct QuantCache<C: DenseCodec> {
    shape: CacheShape,
    kernel: CpuAttention,
    rotation: Option<QkRotation>,
    /// `keys[layer * kv_heads + h]`.
    keys: Vec<QuantRows<C>>,
    values: Vec<QuantRows<C>>,
}

impl<C: DenseCodec> QuantCache<C> {
    /// An empty cache; with `rotation` (a projection set for `shape`), q and k are rotated by
    /// its `P_QK` (values must come from a model with its `P_VO` absorbed).
    ///
    /// # Errors
    /// [`crate::Error::Sparse`] when the codec cannot hold rows of `head_dim` (int8/int4
    /// need a multiple of 32); [`crate::Error::InvalidInput`] for a set of another shape;
    /// [`crate::Error::Attention`] for a bad layout or thread count.
    ///
    /// # Examples
    /// ```
    /// use kv_sparse::quant::Int8Blocks;
    /// use models::cache::{CacheShape, KvCache, QuantCache, StepQkv};
    /// let shape = CacheShape::new(1, attn_kernels::AttnConfig::new(2, 1, 32)?);
    /// let mut cache = QuantCache::<Int8Blocks>::new(shape, None, 1)?;
    /// let (q, kv) = ([1.0; 64], [0.5; 32]);
    /// let mut out = [0.0; 64];
    /// cache.decode(0, StepQkv { q: &q, k: &kv, v: &kv }, &mut out)?;
    /// assert!(out.iter().all(|&x| (x - 0.5).abs() < 1e-3)); // one token: its value
    /// assert_eq!(cache.bytes().total(), 2 * 34); // one q8_0 block for k, one for v
    /// # Ok::<(), models::Error>(())
    /// ```
    pub fn new(
        shape: CacheShape,
        rotation: Option<std::sync::Arc<projection::ProjectionSet>>,
        threads: usize,
    ) -> Result<Self> {
        let heads = shape.layers * shape.kv_heads();
        let rows = || QuantRows::<C>::new(shape.head_dim());
        let rotation =
            rotation.map(|set| QkRotation::new("quantized cache", shape, set)).transpose()?;
        Ok(Self {
            shape,
            kernel: CpuAttention::new(threads)?,
            rotation,
            keys: (0..heads).map(|_| rows()).collect::<kv_sparse::Result<_>>()?,
            values: (0..heads).map(|_| rows()).collect::<kv_sparse::Result<_>>()?,
        })
    }

    fn heads(&self, layer: usize) -> std::ops::Range<usize> {
        layer * self.shape.kv_heads()..(layer + 1) * self.shape.kv_heads()
    }

    /// Checks every head's rows of a block, then appends them (all-or-nothing).
    fn push(&mut self, layer: usize, keys: &[f32], values: &[f32]) -> Result<()> {
        const OP: &str = "quantized cache append";
        let n = keys.len() / self.shape.kv_heads();
        for slot in self.heads(layer) {
            let i = slot - self.heads(layer).start;
            self.keys[slot].check(OP, &keys[i * n..(i + 1) * n])?;
            self.values[slot].check(OP, &values[i * n..(i + 1) * n])?;
        }
        for slot in self.heads(layer) {
            let i = slot - self.heads(layer).start;
            self.keys[slot].push_checked(&keys[i * n..(i + 1) * n]);
            self.values[slot].push_checked(&values[i * n..(i + 1) * n]);
        }
        Ok(())
    }
}

impl<C: DenseCodec> KvCache for QuantCache<C> {
    fn label(&self) -> String {
        let rotate = self
            .rotation
            .as_ref()
            .map_or_else(String::new, |r| format!(" rotate={}", r.set().provenance().kind));
        format!("dense {}{rotate}", C::FORMAT)
    }

    fn shape(&self) -> CacheShape {
        self.shape
    }

    fn len(&self) -> usize {
        self.keys.last().map_or(0, QuantRows::len)
    }

    fn reserve(&mut self, tokens: usize) -> Result<()> {
        for rows in self.keys.iter_mut().chain(self.values.iter_mut()) {
            rows.reserve(tokens);
        }
        self.kernel.reserve(&self.shape.attn, self.len() + tokens);
        Ok(())
    }

    fn prefill(&mut self, layer: usize, kv: LayerKv<'_>) -> Result<()> {
        self.shape.check_prefill(layer, &kv)?;
        let shape = self.shape;
        let mut rotation = self.rotation.take();
        let result = match rotation.as_mut() {
            Some(r) => match r.prefill(layer, &shape, kv) {
                Ok(kv) => self.push(layer, kv.keys, kv.values),
                Err(e) => Err(e),
            },
            None => self.push(layer, kv.keys, kv.values),
        };
        self.rotation = rotation;
        result
    }

    fn decode(&mut self, layer: usize, step: StepQkv<'_>, out: &mut [f32]) -> Result<()> {
        self.shape.check_step(layer, &step, out)?;
        let mut rotation = self.rotation.take();
        let result = (|| {
            let step = match rotation.as_mut() {
                Some(r) => r.step(layer, step)?,
                None => step,
            };
            self.push(layer, step.k, step.v)?;
            let heads = self.heads(layer);
            let views: Vec<QuantKv<'_, C>> =
                heads.map(|s| QuantKv::new(self.keys[s].view(), self.values[s].view())).collect();
            if views.is_empty() {
                return Err(invalid("quantized cache decode", "no kv-heads"));
            }
            self.kernel.quantized(&self.shape.attn, step.q, &views, out)?;
            Ok(())
        })();
        self.rotation = rotation;
        result
    }

    fn bytes(&self) -> CacheBytes {
        let held = self.keys.iter().chain(&self.values).map(|r| r.memory().held_bytes()).sum();
        CacheBytes { resident: held, offloaded: 0 }
    }

    fn projection(&self) -> Option<&ProjectionSet> {
        self.rotation.as_ref().map(QkRotation::set)
    }

    fn image(&self) -> Result<CacheImage<'_>> {
        let heads: Vec<_> =
            self.keys.iter().zip(&self.values).map(|(k, v)| (k.view(), v.view())).collect();
        Ok(CacheImage::quant(self.shape.layers, self.shape.kv_heads(), &heads)?)
    }

    /// Copies the rows out of the file: this cache appends every step to each head's
    /// rows, which must own their storage.
    fn load_image(&mut self, file: &std::sync::Arc<MappedCache>) -> Result<()> {
        let s = self.shape;
        file.check_shape(s.layers, s.kv_heads(), s.head_dim())?;
        super::persist::common_tokens("quantized cache load", file)?;
        // Every head on every attention thread at once; the loop below then reads checked heads.
        file.validate_all_on(self.kernel.threads())?;
        let (mut keys, mut values) = (Vec::new(), Vec::new());
        for slot in 0..s.layers * s.kv_heads() {
            let (k, v) = file.load_quant::<C>(slot / s.kv_heads(), slot % s.kv_heads())?;
            keys.push(k);
            values.push(v);
        }
        (self.keys, self.values) = (keys, values);
        Ok(())
    }
}
