//! `buffered`: a quantized dense cache with a recent-token buffer — the `b` newest positions
//! of every (layer, kv-head) exact in `f16` / `bf16` / `f32`, every older position whole in
//! `q8_0` / `q4_0` blocks or scaled fp8, optionally in a rotated basis (Walsh–Hadamard or the
//! SWAN basis, as [`super::QuantCache`]).
//!
//! This is the design of the quantized caches SWAN is compared with in the literature (KIVI,
//! arXiv 2402.02750 §3.3, keeps a 128-token fp16 residual; so do KVQuant, GEAR and the
//! TurboQuant experiments) and the footing SWAN itself stands on (`papers/swan.txt`, method
//! section: "a dense buffer of recent tokens"): comparing a buffered SWAN cache with an
//! unbuffered quantized one measures the buffer, not the format. The buffer and its
//! eviction are kv-sparse's one hybrid implementation ([`kv_sparse::hybrid::Hybrid`] over
//! [`QuantRows`]), the attention the quantized kernel with the buffer rows after the
//! quantized ones under one softmax ([`attn_kernels::QuantKv::with_buffer`]).
//!
//! Lossless setting: with `b` at least the sequence length and an `f32` buffer, no row is
//! ever quantized and the attention is the dense `f32` cache's bit for bit (tested).
//! Optionally the first `sink` positions stay in `f32` before everything else, as
//! [`super::QuantCache::with_sink`] keeps them. Not persisted (the file format holds
//! unbuffered quantized rows only): saving or loading one is
//! [`crate::Error::NotPersistable`].

use attn_kernels::{CpuAttention, EncodedAttention, QuantKv, RecentFormat};
use kv_sparse::hybrid::{HybridConfig, MultiHead};
use kv_sparse::quant::{DenseCodec, QuantRows};

use super::rotation::QkRotation;
use super::sink::SinkRows;
use super::{CacheBytes, CacheShape, KvCache, LayerKv, StepQkv};
use crate::error::{Result, invalid};

/// A quantized dense cache (history rows in codec `C`) whose `b` newest positions stay in the
/// float format `D`.
pub struct BufferedQuantCache<C: DenseCodec, D: RecentFormat> {
    shape: CacheShape,
    kernel: CpuAttention,
    rotation: Option<QkRotation>,
    /// Every (layer, kv-head): quantized history and exact buffer.
    caches: MultiHead<QuantRows<C>, D>,
    /// Buffer rows `b`.
    buffer: usize,
    /// Positions kept in `f32` before everything else.
    sink: SinkRows,
    /// One layer's keys and values without the sink's positions (prefill only).
    staged: (Vec<f32>, Vec<f32>),
}

impl<C: DenseCodec, D: RecentFormat> BufferedQuantCache<C, D> {
    /// An empty cache keeping the `buffer` newest positions in `D`; with `rotation` (a
    /// projection set for `shape`) q and k are rotated by its `P_QK` (values must come from a
    /// model with its `P_VO` absorbed).
    ///
    /// # Errors
    /// [`crate::Error::Sparse`] when the codec cannot hold rows of `head_dim` (int8/int4 need
    /// a multiple of 32) or the buffer cannot be allocated; [`crate::Error::InvalidInput`]
    /// for a set of another shape; [`crate::Error::Attention`] for a bad thread count.
    ///
    /// # Examples
    /// ```
    /// use half::f16;
    /// use kv_sparse::quant::Int4Blocks;
    /// use models::cache::{BufferedQuantCache, CacheShape, KvCache, StepQkv};
    /// let shape = CacheShape::new(1, attn_kernels::AttnConfig::new(1, 1, 32)?);
    /// let mut cache = BufferedQuantCache::<Int4Blocks, f16>::new(shape, None, 1, 2)?;
    /// let mut out = [0.0; 32];
    /// for t in 0..3 {
    ///     cache.decode(0, StepQkv { q: &[0.0; 32], k: &[0.1; 32], v: &[t as f32; 32] }, &mut out)?;
    /// }
    /// assert!(out.iter().all(|&x| (x - 1.0).abs() < 1e-2)); // equal scores: the mean value
    /// // One q4_0 row each for the oldest key and value, two f16 rows each in the buffer.
    /// assert_eq!(cache.bytes().total(), 2 * 18 + 2 * 2 * 32 * 2);
    /// assert_eq!(cache.label(), "dense int4 b=2 (f16)");
    /// # Ok::<(), models::Error>(())
    /// ```
    pub fn new(
        shape: CacheShape,
        rotation: Option<std::sync::Arc<projection::ProjectionSet>>,
        threads: usize,
        buffer: usize,
    ) -> Result<Self> {
        let rotation =
            rotation.map(|set| QkRotation::new("buffered cache", shape, set)).transpose()?;
        let cfg = HybridConfig::lossless(shape.head_dim(), buffer).for_store::<QuantRows<C>>();
        Ok(Self {
            shape,
            kernel: CpuAttention::new(threads)?,
            rotation,
            caches: MultiHead::new(shape.layers, shape.kv_heads(), cfg)?,
            buffer,
            sink: SinkRows::new(shape.layers * shape.kv_heads()),
            staged: (Vec::new(), Vec::new()),
        })
    }

    /// The same (empty) cache keeping its first `positions` positions of every layer and
    /// kv-head in `f32`, attended before everything else; `0` keeps none.
    ///
    /// # Errors
    /// [`crate::Error::InvalidInput`] when the cache already holds positions.
    pub fn with_sink(mut self, positions: usize) -> Result<Self> {
        if self.len() > 0 {
            return Err(invalid(
                "buffered cache sink",
                format!("the cache already holds {} positions", self.len()),
            ));
        }
        self.sink.positions = positions;
        Ok(self)
    }

    /// Stores a layer's rows (`[kv_heads][tokens][d]`, keys already rotated): the positions
    /// still inside the sink to it, the others through the buffer. Nothing is stored on error.
    fn store(&mut self, layer: usize, keys: &[f32], values: &[f32]) -> Result<()> {
        const OP: &str = "buffered cache append";
        let (d, kv_heads) = (self.shape.head_dim(), self.shape.kv_heads());
        let n = keys.len() / kv_heads;
        let first = layer * kv_heads;
        let to_sink = self.sink.takes(first, n / d, d) * d;
        if to_sink == 0 {
            return Ok(self.caches.extend_layer(layer, keys, values)?);
        }
        let (sk, sv) = &mut self.staged;
        sk.clear();
        sv.clear();
        for h in 0..kv_heads {
            let head = h * n..(h + 1) * n;
            let (k, v) = (&keys[head.clone()], &values[head]);
            SinkRows::check(OP, &k[..to_sink], &v[..to_sink])?;
            sk.extend_from_slice(&k[to_sink..]);
            sv.extend_from_slice(&v[to_sink..]);
        }
        if n > to_sink {
            self.caches.extend_layer(layer, &self.staged.0, &self.staged.1)?;
        }
        for h in 0..kv_heads {
            let sink = h * n..h * n + to_sink;
            self.sink.push(first + h, &keys[sink.clone()], &values[sink]);
        }
        Ok(())
    }
}

impl<C: DenseCodec, D: RecentFormat> KvCache for BufferedQuantCache<C, D> {
    fn thread_pool(&self) -> Option<&attn_kernels::ThreadPool> {
        Some(self.kernel.pool())
    }

    fn int8_keys(&self) -> bool {
        C::FORMAT == kv_sparse::quant::DenseFormat::Int8
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
        format!(
            "dense {}{rotate} b={} ({}){}{}",
            C::FORMAT,
            self.buffer,
            D::FORMAT,
            self.sink.label(),
            super::queries_label(&self.kernel)
        )
    }

    fn shape(&self) -> CacheShape {
        self.shape
    }

    fn len(&self) -> usize {
        let last = self.shape.layers - 1;
        let sink = self.sink.held(last * self.shape.kv_heads(), self.shape.head_dim());
        self.caches.layer_len(last).unwrap_or(0) + sink
    }

    fn reserve(&mut self, tokens: usize) -> Result<()> {
        for l in 0..self.shape.layers {
            for h in 0..self.shape.kv_heads() {
                if let Some(c) = self.caches.head_mut(l, h) {
                    c.reserve(tokens);
                }
            }
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
                Ok(kv) => self.store(layer, kv.keys, kv.values),
                Err(e) => Err(e),
            },
            None => self.store(layer, kv.keys, kv.values),
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
            self.store(layer, step.k, step.v)?;
            let heads = self
                .caches
                .layer(layer)
                .ok_or_else(|| invalid("buffered cache decode", "layer out of range"))?;
            let first = layer * self.shape.kv_heads();
            let views: Vec<QuantKv<'_, C>> = heads
                .iter()
                .enumerate()
                .map(|(h, c)| {
                    let (sk, sv) = self.sink.all(first + h);
                    let (keys, values) = c.history();
                    QuantKv::new(keys, values)
                        .with_sink(sk, sv)
                        .with_buffer(c.buffer_keys(), c.buffer_values())
                })
                .collect();
            self.kernel.quantized(&self.shape.attn, step.q, &views, out)?;
            Ok(())
        })();
        self.rotation = rotation;
        result
    }

    fn stats(&self) -> Vec<(&'static str, f64)> {
        let (s, d) = (&self.shape, self.shape.head_dim());
        let plain = super::Footprint::plain(s, 2 * C::row_bytes(d));
        let buffered = plain.with_buffer(s, self.buffer, 2 * d * D::FORMAT.bytes());
        buffered.with_sink(s, self.sink.positions).stats()
    }

    fn bytes(&self) -> CacheBytes {
        let held = self.caches.memory().held_bytes() + self.sink.held_bytes();
        CacheBytes { resident: held, offloaded: 0 }
    }

    fn projection(&self) -> Option<&projection::ProjectionSet> {
        self.rotation.as_ref().map(QkRotation::set)
    }
}
