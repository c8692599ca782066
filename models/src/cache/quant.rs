//! `quant`: dense quantized K/V — int8 blocks (llama.cpp `q8_0`), int4 blocks (`q4_0`) or
//! fp8 with a per-token scale (vLLM's) — optionally in a rotated basis (Walsh–Hadamard, as
//! llama.cpp rotates q/k/v for a quantized cache, or the SWAN calibrated basis). The
//! baselines SWAN is measured against in the frontier study: every key and value kept,
//! each stored at 8 or 4 bits (`papers/swan.txt` compares against dense f16; a runtime
//! compares against what its engine already offers).
//!
//! Keys and values may be stored in different formats (`QuantCache<Int8Blocks,
//! Int4Blocks>`, spec `dense:format=int8,values=int4`): llama.cpp's `-ctk q8_0 -ctv q4_0`,
//! a common setting where keys, whose rounding every score sees, keep more bits than values.
//!
//! Optionally the first `sink` positions of every layer and kv-head stay in `f32` (`sink=N`
//! of a dense spec): the attention sink — the first token, which every later query attends
//! heavily — is the one row whose rounding error every window and every query shares, and
//! on some models (Gemma 3 at 4 bits) it sets most of the quantized cache's cost.

use std::sync::Arc;

use attn_kernels::{CpuAttention, EncodedAttention, QuantKv};
use kv_sparse::persist::{CacheImage, MappedCache};
use kv_sparse::quant::{DenseCodec, QuantRows, QuantView};
use projection::ProjectionSet;

use super::rotation::QkRotation;
use super::sink::SinkRows;
use super::{CacheBytes, CacheShape, KvCache, LayerKv, StepQkv};
use crate::error::{Result, invalid};

/// Quantized keys (encoded by `K`) and values (encoded by `V`, by default as the keys) per
/// (layer, kv-head).
pub struct QuantCache<K: DenseCodec, V: DenseCodec = K> {
    shape: CacheShape,
    kernel: CpuAttention,
    rotation: Option<QkRotation>,
    /// `keys[layer * kv_heads + h]`: the rows after any reopened file's.
    keys: Vec<QuantRows<K>>,
    values: Vec<QuantRows<V>>,
    /// A reopened file whose rows of every head come first, read where they are mapped,
    /// and the rows each head holds there.
    reopened: Option<(Arc<MappedCache>, usize)>,
    /// Positions kept in `f32` before the quantized rows.
    sink: SinkRows,
}

/// The rows of head `slot` (`layer · kv_heads + h`) a reopened file maps, if any (only a
/// cache whose keys and values share a format reopens a file).
fn mapped_rows<K: DenseCodec, V: DenseCodec>(
    reopened: Option<&(Arc<MappedCache>, usize)>,
    kv_heads: usize,
    slot: usize,
) -> Result<Option<(QuantView<'_, K>, QuantView<'_, V>)>> {
    match reopened {
        Some((file, _)) => {
            let (layer, h) = (slot / kv_heads, slot % kv_heads);
            Ok(Some((file.quant_rows::<K>(layer, h)?.0, file.quant_rows::<V>(layer, h)?.1)))
        }
        None => Ok(None),
    }
}

impl<K: DenseCodec, V: DenseCodec> QuantCache<K, V> {
    /// An empty cache; with `rotation` (a projection set for `shape`), q and k are rotated by
    /// its `P_QK` (values must come from a model with its `P_VO` absorbed).
    ///
    /// # Errors
    /// [`crate::Error::Sparse`] when the codec cannot hold rows of `head_dim` (int8/int4
    /// need a multiple of 32; keys and values both); [`crate::Error::InvalidInput`] for a set
    /// of another shape;
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
    ///
    /// Keys in q8_0 blocks, values in q4_0 blocks (llama.cpp's `-ctk q8_0 -ctv q4_0`):
    /// ```
    /// use kv_sparse::quant::{Int4Blocks, Int8Blocks};
    /// use models::cache::{CacheShape, KvCache, QuantCache, StepQkv};
    /// let shape = CacheShape::new(1, attn_kernels::AttnConfig::new(1, 1, 32)?);
    /// let mut cache = QuantCache::<Int8Blocks, Int4Blocks>::new(shape, None, 1)?;
    /// let mut out = [0.0; 32];
    /// cache.decode(0, StepQkv { q: &[1.0; 32], k: &[0.5; 32], v: &[0.5; 32] }, &mut out)?;
    /// assert_eq!(cache.bytes().total(), 34 + 18); // one q8_0 key block, one q4_0 value block
    /// assert_eq!(cache.label(), "dense int8 values=int4");
    /// # Ok::<(), models::Error>(())
    /// ```
    pub fn new(
        shape: CacheShape,
        rotation: Option<std::sync::Arc<projection::ProjectionSet>>,
        threads: usize,
    ) -> Result<Self> {
        let heads = shape.layers * shape.kv_heads();
        let d = shape.head_dim();
        let rotation =
            rotation.map(|set| QkRotation::new("quantized cache", shape, set)).transpose()?;
        Ok(Self {
            shape,
            kernel: CpuAttention::new(threads)?,
            rotation,
            keys: (0..heads).map(|_| QuantRows::new(d)).collect::<kv_sparse::Result<_>>()?,
            values: (0..heads).map(|_| QuantRows::new(d)).collect::<kv_sparse::Result<_>>()?,
            reopened: None,
            sink: SinkRows::new(heads),
        })
    }

    /// The same (empty) cache keeping its first `positions` positions of every layer and
    /// kv-head in `f32`, attended before the quantized rows under one softmax; `0` keeps
    /// none. Their bytes count as resident. A cache with a sink is not persisted: the file
    /// format holds quantized rows only.
    ///
    /// # Errors
    /// [`crate::Error::InvalidInput`] when the cache already holds positions.
    ///
    /// # Examples
    /// ```
    /// use kv_sparse::quant::Int4Blocks;
    /// use models::cache::{CacheShape, KvCache, QuantCache, StepQkv};
    /// let shape = CacheShape::new(1, attn_kernels::AttnConfig::new(1, 1, 32)?);
    /// let mut cache = QuantCache::<Int4Blocks>::new(shape, None, 1)?.with_sink(1)?;
    /// let (q, k) = ([0.0; 32], [0.1; 32]);
    /// let mut out = [0.0; 32];
    /// cache.decode(0, StepQkv { q: &q, k: &k, v: &[0.3; 32] }, &mut out)?;
    /// assert_eq!(out, [0.3; 32]); // the sink row, exactly
    /// cache.decode(0, StepQkv { q: &q, k: &k, v: &[0.7; 32] }, &mut out)?;
    /// assert!(out.iter().all(|&x| (x - 0.5).abs() < 0.01)); // the mean of both values
    /// assert_eq!(cache.bytes().total(), 2 * 32 * 4 + 2 * 18); // f32 sink + one q4_0 block each
    /// assert_eq!(cache.label(), "dense int4 sink=1");
    /// # Ok::<(), models::Error>(())
    /// ```
    pub fn with_sink(mut self, positions: usize) -> Result<Self> {
        if self.len() > 0 {
            return Err(invalid(
                "quantized cache sink",
                format!("the cache already holds {} positions", self.len()),
            ));
        }
        self.sink.positions = positions;
        Ok(self)
    }

    fn heads(&self, layer: usize) -> std::ops::Range<usize> {
        layer * self.shape.kv_heads()..(layer + 1) * self.shape.kv_heads()
    }

    /// Whether keys and values share one format (what the file format holds).
    fn uniform(&self) -> bool {
        K::FORMAT == V::FORMAT
    }

    /// Checks every head's rows of a block, then appends them (all-or-nothing): the rows
    /// of positions still inside the sink to it, the others quantized.
    fn push(&mut self, layer: usize, keys: &[f32], values: &[f32]) -> Result<()> {
        const OP: &str = "quantized cache append";
        let n = keys.len() / self.shape.kv_heads();
        let d = self.shape.head_dim();
        let first = self.heads(layer).start;
        // Rows of this block that go to the sink (the same for every head of the layer).
        let to_sink = self.sink.takes(first, n / d, d) * d;
        for slot in self.heads(layer) {
            let i = slot - first;
            self.keys[slot].check(OP, &keys[i * n + to_sink..(i + 1) * n])?;
            self.values[slot].check(OP, &values[i * n + to_sink..(i + 1) * n])?;
            SinkRows::check(OP, &keys[i * n..i * n + to_sink], &values[i * n..i * n + to_sink])?;
        }
        for slot in self.heads(layer) {
            let i = slot - first;
            self.sink.push(slot, &keys[i * n..i * n + to_sink], &values[i * n..i * n + to_sink]);
            self.keys[slot].push_checked(&keys[i * n + to_sink..(i + 1) * n]);
            self.values[slot].push_checked(&values[i * n + to_sink..(i + 1) * n]);
        }
        Ok(())
    }
}

impl<K: DenseCodec, V: DenseCodec> KvCache for QuantCache<K, V> {
    fn thread_pool(&self) -> Option<&attn_kernels::ThreadPool> {
        Some(self.kernel.pool())
    }

    fn int8_keys(&self) -> bool {
        matches!(
            K::FORMAT,
            kv_sparse::quant::DenseFormat::Int8 | kv_sparse::quant::DenseFormat::Int4
        )
    }

    fn set_query_precision(&mut self, precision: attn_kernels::QueryPrecision) -> Result<()> {
        if precision == attn_kernels::QueryPrecision::Int8 && !self.int8_keys() {
            return Err(super::no_int8_keys(&self.label()));
        }
        Ok(self.kernel.set_query_precision(precision)?)
    }

    fn label(&self) -> String {
        let rotate = self
            .rotation
            .as_ref()
            .map_or_else(String::new, |r| format!(" rotate={}", r.set().provenance().kind));
        let queries = super::queries_label(&self.kernel);
        let values = super::values_label::<K, V>();
        format!("dense {}{values}{rotate}{}{queries}", K::FORMAT, self.sink.label())
    }

    fn shape(&self) -> CacheShape {
        self.shape
    }

    fn len(&self) -> usize {
        let mapped = self.reopened.as_ref().map_or(0, |r| r.1);
        let sink = self.sink.keys.last().map_or(0, Vec::len) / self.shape.head_dim().max(1);
        self.keys.last().map_or(0, QuantRows::len) + mapped + sink
    }

    fn reserve(&mut self, tokens: usize) -> Result<()> {
        self.keys.iter_mut().for_each(|rows| rows.reserve(tokens));
        self.values.iter_mut().for_each(|rows| rows.reserve(tokens));
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
            let mut views: Vec<QuantKv<'_, K, V>> = Vec::with_capacity(self.shape.kv_heads());
            for s in self.heads(layer) {
                let (sk, sv) = self.sink.all(s);
                let mut kv =
                    QuantKv::new(self.keys[s].view(), self.values[s].view()).with_sink(sk, sv);
                kv.prefix = mapped_rows(self.reopened.as_ref(), self.shape.kv_heads(), s)?;
                views.push(kv);
            }
            if views.is_empty() {
                return Err(invalid("quantized cache decode", "no kv-heads"));
            }
            self.kernel.quantized(&self.shape.attn, step.q, &views, out)?;
            Ok(())
        })();
        self.rotation = rotation;
        result
    }

    fn stats(&self) -> Vec<(&'static str, f64)> {
        let d = self.shape.head_dim();
        let plain =
            super::Footprint::plain(&self.shape, (K::row_bytes(d) + V::row_bytes(d)) as f64);
        plain.with_sink(&self.shape, self.sink.positions).stats()
    }

    /// Mapped rows count as resident: attention reads them every step.
    fn bytes(&self) -> CacheBytes {
        let mut held: usize = self.keys.iter().map(|r| r.memory().held_bytes()).sum::<usize>()
            + self.values.iter().map(|r| r.memory().held_bytes()).sum::<usize>();
        held += self.sink.held_bytes();
        for slot in 0..self.keys.len() {
            if let Ok(Some((k, v))) =
                mapped_rows::<K, V>(self.reopened.as_ref(), self.shape.kv_heads(), slot)
            {
                held += k.bytes().len() + v.bytes().len();
            }
        }
        CacheBytes { resident: held, offloaded: 0 }
    }

    fn projection(&self) -> Option<&ProjectionSet> {
        self.rotation.as_ref().map(QkRotation::set)
    }

    /// A cache with a sink, or with keys and values in different formats, is not persisted
    /// (the file format holds one quantized format and no f32 rows).
    fn image(&self) -> Result<CacheImage<'_>> {
        if self.sink.positions > 0 || !self.uniform() {
            return Err(crate::Error::NotPersistable { op: "save cache", cache: self.label() });
        }
        let mut heads = Vec::with_capacity(self.keys.len());
        for (slot, (k, v)) in self.keys.iter().zip(&self.values).enumerate() {
            let older = mapped_rows::<K, K>(self.reopened.as_ref(), self.shape.kv_heads(), slot)?;
            // One format: the value rows are laid out as `K`'s (checked again as such).
            let v = QuantView::<K>::from_bytes(v.head_dim(), v.view().bytes())?;
            heads.push((older, k.view(), v));
        }
        Ok(CacheImage::quant_continued(self.shape.layers, self.shape.kv_heads(), &heads)?)
    }

    /// Keeps `file` and attends each head's saved rows where they are mapped (the kernel
    /// reads a head as the mapped rows, then the rows appended since): nothing is copied.
    /// Every head is validated before the cache changes.
    fn load_image(&mut self, file: &Arc<MappedCache>) -> Result<()> {
        const OP: &str = "quantized cache load";
        if self.sink.positions > 0 || !self.uniform() {
            return Err(crate::Error::NotPersistable { op: "load cache", cache: self.label() });
        }
        let s = self.shape;
        file.check_shape(s.layers, s.kv_heads(), s.head_dim())?;
        let tokens = super::persist::common_tokens(OP, file)?;
        // Every head on every attention thread at once; the loop below then reads checked heads.
        file.validate_all_on(self.kernel.threads())?;
        for slot in 0..s.layers * s.kv_heads() {
            let (k, v) = file.quant_rows::<K>(slot / s.kv_heads(), slot % s.kv_heads())?;
            if k.num_rows() != tokens || v.num_rows() != tokens {
                return Err(invalid(OP, format!("head {slot}: ragged rows")));
            }
        }
        let heads = s.layers * s.kv_heads();
        let d = s.head_dim();
        let keys = (0..heads).map(|_| QuantRows::new(d)).collect::<kv_sparse::Result<_>>()?;
        let values = (0..heads).map(|_| QuantRows::new(d)).collect::<kv_sparse::Result<_>>()?;
        (self.keys, self.values) = (keys, values);
        self.reopened = (tokens > 0).then(|| (Arc::clone(file), tokens));
        Ok(())
    }
}
