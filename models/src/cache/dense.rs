//! `dense`: every key and value kept in full (f32, f16 or bf16), attention over all of
//! them with `attn-kernels`' dense kernel — the baseline every other cache is measured
//! against (`papers/swan.txt`, standard decode step: `K ← [K; k]`, `V ← [V; v]`,
//! `softmax(q Kᵀ/√d) V`). Optionally in a rotated basis (the same rotation the quantized
//! caches take), which changes nothing but float rounding.

use std::sync::Arc;

use attn_kernels::{CpuAttention, DecodeAttention, DenseKv};
use kv_sparse::Value;
use kv_sparse::persist::{CacheImage, MappedCache};
use projection::ProjectionSet;

use super::rotation::QkRotation;
use super::{CacheBytes, CacheShape, KvCache, LayerKv, StepQkv, check_finite};
use crate::error::{Result, invalid};

/// Full keys and values per (layer, kv-head), row-major `[tokens][head_dim]` of `D`.
pub struct DenseCache<D: Value> {
    shape: CacheShape,
    kernel: CpuAttention,
    rotation: Option<QkRotation>,
    /// `keys[layer * kv_heads + h]`: the rows after any reopened file's.
    keys: Vec<Vec<D>>,
    values: Vec<Vec<D>>,
    /// A reopened file whose rows of every head come first, read where they are mapped,
    /// and the rows each head holds there.
    reopened: Option<(Arc<MappedCache>, usize)>,
}

impl<D: Value> DenseCache<D> {
    /// An empty cache whose attention runs on `threads` threads.
    ///
    /// # Errors
    /// [`crate::Error::Attention`] for an impossible head layout or no threads.
    ///
    /// # Examples
    /// ```
    /// use models::cache::{CacheShape, DenseCache, KvCache, StepQkv};
    /// let shape = CacheShape::new(1, attn_kernels::AttnConfig::new(2, 1, 4)?);
    /// let mut cache = DenseCache::<f32>::new(shape, 1)?;
    /// let (q, kv) = ([1.0; 8], [0.5; 4]);
    /// let mut out = [0.0; 8];
    /// cache.decode(0, StepQkv { q: &q, k: &kv, v: &kv }, &mut out)?;
    /// assert_eq!(out, [0.5; 8]); // one token: its value, for both q-heads
    /// # Ok::<(), models::Error>(())
    /// ```
    pub fn new(shape: CacheShape, threads: usize) -> Result<Self> {
        let heads = shape.layers * shape.kv_heads();
        Ok(Self {
            shape,
            kernel: CpuAttention::new(threads)?,
            rotation: None,
            keys: vec![Vec::new(); heads],
            values: vec![Vec::new(); heads],
            reopened: None,
        })
    }

    /// The same cache storing q and k rotated by `set`'s `P_QK` (values must come from a
    /// model with `P_VO` absorbed).
    ///
    /// # Errors
    /// [`crate::Error::InvalidInput`] for a set of another shape.
    pub fn with_rotation(mut self, set: std::sync::Arc<projection::ProjectionSet>) -> Result<Self> {
        self.rotation = Some(QkRotation::new("dense cache", self.shape, set)?);
        Ok(self)
    }

    fn heads(&self, layer: usize) -> std::ops::Range<usize> {
        layer * self.shape.kv_heads()..(layer + 1) * self.shape.kv_heads()
    }

    /// The mapped rows of head `slot` (empty without a reopened file).
    fn mapped(&self, slot: usize) -> Result<(&[D], &[D])> {
        mapped_rows(self.reopened.as_ref(), self.shape.kv_heads(), slot)
    }

    fn push_rows(dst: &mut Vec<D>, rows: &[f32]) {
        dst.extend(rows.iter().map(|&x| D::from_f32(x)));
    }
}

/// The rows of head `slot` (`layer · kv_heads + h`) a reopened file maps, or none.
fn mapped_rows<D: Value>(
    reopened: Option<&(Arc<MappedCache>, usize)>,
    kv_heads: usize,
    slot: usize,
) -> Result<(&[D], &[D])> {
    match reopened {
        Some((file, _)) => Ok(file.dense_rows::<D>(slot / kv_heads, slot % kv_heads)?),
        None => Ok((&[], &[])),
    }
}

impl<D: Value> KvCache for DenseCache<D> {
    fn thread_pool(&self) -> Option<&attn_kernels::ThreadPool> {
        Some(self.kernel.pool())
    }

    fn label(&self) -> String {
        let rotate = self
            .rotation
            .as_ref()
            .map_or_else(String::new, |r| format!(" rotate={}", r.set().provenance().kind));
        format!("dense {}{rotate}", D::FORMAT)
    }

    fn shape(&self) -> CacheShape {
        self.shape
    }

    fn len(&self) -> usize {
        let mapped = self.reopened.as_ref().map_or(0, |r| r.1);
        self.keys.last().map_or(0, |k| k.len() / self.shape.head_dim()) + mapped
    }

    fn reserve(&mut self, tokens: usize) -> Result<()> {
        let extra = tokens * self.shape.head_dim();
        for rows in self.keys.iter_mut().chain(self.values.iter_mut()) {
            rows.reserve(extra);
        }
        Ok(())
    }

    fn prefill(&mut self, layer: usize, kv: LayerKv<'_>) -> Result<()> {
        self.shape.check_prefill(layer, &kv)?;
        let shape = self.shape;
        let mut rotation = self.rotation.take();
        let result = match rotation.as_mut() {
            Some(r) => match r.prefill(layer, &shape, kv) {
                Ok(kv) => self.store_prefill(layer, kv),
                Err(e) => Err(e),
            },
            None => self.store_prefill(layer, kv),
        };
        self.rotation = rotation;
        result
    }

    fn decode(&mut self, layer: usize, step: StepQkv<'_>, out: &mut [f32]) -> Result<()> {
        self.shape.check_step(layer, &step, out)?;
        let mut rotation = self.rotation.take();
        let result = match rotation.as_mut() {
            Some(r) => match r.step(layer, step) {
                Ok(step) => self.store_and_attend(layer, step, out),
                Err(e) => Err(e),
            },
            None => self.store_and_attend(layer, step, out),
        };
        self.rotation = rotation;
        result
    }

    fn stats(&self) -> Vec<(&'static str, f64)> {
        let d = self.shape().head_dim();
        super::Footprint::plain(&self.shape(), (2 * d * D::FORMAT.bytes()) as f64).stats()
    }

    fn bytes(&self) -> CacheBytes {
        let mut elems: usize = self.keys.iter().chain(&self.values).map(Vec::len).sum();
        // Mapped rows count as resident: attention reads them every step.
        elems +=
            self.reopened.as_ref().map_or(0, |r| 2 * self.keys.len() * r.1 * self.shape.head_dim());
        CacheBytes { resident: elems * D::FORMAT.bytes(), offloaded: 0 }
    }

    fn projection(&self) -> Option<&ProjectionSet> {
        self.rotation.as_ref().map(QkRotation::set)
    }

    fn image(&self) -> Result<CacheImage<'_>> {
        let mut heads = Vec::with_capacity(self.keys.len());
        for (slot, (k, v)) in self.keys.iter().zip(&self.values).enumerate() {
            let (mk, mv) = self.mapped(slot)?;
            heads.push(((mk, &k[..]), (mv, &v[..])));
        }
        let s = &self.shape;
        Ok(CacheImage::dense_continued(s.layers, s.kv_heads(), s.head_dim(), &heads)?)
    }

    /// Keeps `file` and attends each head's saved rows where they are mapped (the dense
    /// kernel reads a head as two row-major parts), appending new rows to owned storage:
    /// nothing is copied. Every head is validated before the cache changes.
    fn load_image(&mut self, file: &Arc<MappedCache>) -> Result<()> {
        let s = self.shape;
        file.check_shape(s.layers, s.kv_heads(), s.head_dim())?;
        let tokens = super::persist::common_tokens("dense cache load", file)?;
        // Every head on every attention thread at once; the loop below then reads checked heads.
        file.validate_all_on(self.kernel.threads())?;
        for slot in 0..s.layers * s.kv_heads() {
            let (k, v) = file.dense_rows::<D>(slot / s.kv_heads(), slot % s.kv_heads())?;
            if k.len() != tokens * s.head_dim() || v.len() != k.len() {
                return Err(invalid("dense cache load", format!("head {slot}: ragged rows")));
            }
        }
        let heads = s.layers * s.kv_heads();
        (self.keys, self.values) = (vec![Vec::new(); heads], vec![Vec::new(); heads]);
        self.reopened = (tokens > 0).then(|| (Arc::clone(file), tokens));
        Ok(())
    }
}

impl<D: Value> DenseCache<D> {
    fn store_prefill(&mut self, layer: usize, kv: LayerKv<'_>) -> Result<()> {
        check_finite("cache prefill", "keys", layer, kv.keys)?;
        check_finite("cache prefill", "values", layer, kv.values)?;
        let n = kv.tokens * self.shape.head_dim();
        for (i, slot) in self.heads(layer).enumerate() {
            Self::push_rows(&mut self.keys[slot], &kv.keys[i * n..(i + 1) * n]);
            Self::push_rows(&mut self.values[slot], &kv.values[i * n..(i + 1) * n]);
        }
        Ok(())
    }

    fn store_and_attend(&mut self, layer: usize, step: StepQkv<'_>, out: &mut [f32]) -> Result<()> {
        // This cache is the storage of k and v: they are checked here, before any head
        // takes its row (`check_step` checked q and the lengths).
        check_finite("cache decode", "k", layer, step.k)?;
        check_finite("cache decode", "v", layer, step.v)?;
        let d = self.shape.head_dim();
        for (i, slot) in self.heads(layer).enumerate() {
            Self::push_rows(&mut self.keys[slot], &step.k[i * d..(i + 1) * d]);
            Self::push_rows(&mut self.values[slot], &step.v[i * d..(i + 1) * d]);
        }
        let mut views: Vec<DenseKv<'_, D>> = Vec::with_capacity(self.shape.kv_heads());
        for s in self.heads(layer) {
            let (mk, mv) = mapped_rows(self.reopened.as_ref(), self.shape.kv_heads(), s)?;
            views.push(DenseKv {
                head_dim: d,
                keys: (mk, &self.keys[s]),
                values: (mv, &self.values[s]),
            });
        }
        self.kernel.dense(&self.shape.attn, step.q, &views, out)?;
        Ok(())
    }
}
