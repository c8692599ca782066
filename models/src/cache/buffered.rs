//! `buffered`: a cache with a recent-token buffer over a history format — the `b` newest
//! positions of every (layer, kv-head) exact in `f16` / `bf16` / `f32`, every older position
//! whole in the history format ([`BufferedHistory`]: `q8_0` / `q4_0` blocks or scaled fp8,
//! KIVI's grouped 2/4-bit codes, TurboQuant-style unit-vector codes), optionally in a rotated
//! basis (Walsh–Hadamard, a seeded random basis or the SWAN basis, as [`super::QuantCache`]).
//!
//! This is the design of the quantized caches SWAN is compared with in the literature (KIVI,
//! arXiv 2402.02750 §3.3, keeps a 128-token fp16 residual; so do KVQuant, GEAR and the
//! TurboQuant experiments) and the footing SWAN itself stands on (`papers/swan.txt`, method
//! section: "a dense buffer of recent tokens"): comparing a buffered SWAN cache with an
//! unbuffered quantized one measures the buffer, not the format. The buffer and its
//! eviction are kv-sparse's one hybrid implementation ([`kv_sparse::hybrid::Hybrid`] over
//! the format's row store), the attention the format's kernel with the buffer rows after
//! the history's under one softmax ([`attn_kernels::QuantKv::with_buffer`],
//! [`attn_kernels::DecodedKv::with_buffer`]).
//!
//! Lossless setting: with `b` at least the sequence length and an `f32` buffer, no row is
//! ever quantized and the attention is the dense `f32` cache's bit for bit (tested).
//! Optionally the first `sink` positions stay in `f32` before everything else, as
//! [`super::QuantCache::with_sink`] keeps them. Persisted as kv-sparse's whole-row hybrid
//! layout ([`kv_sparse::persist::CacheImage::rows`]: codes, KIVI's waiting keys and the buffer
//! exactly as held) and reloaded to continue; a cache with a sink is not persisted
//! ([`crate::Error::NotPersistable`]: the file holds no `f32` rows).

use attn_kernels::{AttnConfig, CpuAttention, DecodedKv, EncodedAttention, QuantKv, RecentFormat};
use kv_sparse::decoded::DecodeRows;
use std::sync::Arc;

use kv_sparse::decoded::Side;
use kv_sparse::hybrid::{Hybrid, HybridConfig, MultiHead, RowStore, WholeRowStore};
use kv_sparse::kivi::KiviRows;
use kv_sparse::persist::{CacheImage, MappedCache};
use kv_sparse::quant::{DenseCodec, QuantRows};
use kv_sparse::turbo::{TurboQjlRows, TurboRows};

use super::rotation::QkRotation;
use super::sink::SinkRows;
use super::{CacheBytes, CacheShape, KvCache, LayerKv, StepQkv};
use crate::error::{Result, invalid};

/// A history format of a [`BufferedCache`]: a kv-sparse row store and the kernel that reads
/// it. Sealed to kv-sparse's whole-row stores ([`QuantRows`], [`KiviRows`], [`TurboRows`]).
pub trait BufferedHistory: WholeRowStore + private::Sealed {
    /// The format as labels name it (`dense int4`, `kivi2 group=32`, `turbo3`), for a history of
    /// rows grouped by `group` (KIVI's group; ignored by the others).
    fn name(group: usize) -> String;

    /// Exact bytes of one position's key and value rows of one head once amortized (a KIVI
    /// key group's parameters spread over its tokens).
    fn token_bytes(head_dim: usize, group: usize) -> f64;

    /// Whether keys are `q8_0` or `q4_0` codes (the keys int8 queries are scored against).
    fn int8_keys() -> bool {
        false
    }

    /// One decode step of a layer over its kv-heads' caches, each head's `f32` sink rows
    /// (`sink[h]`, empty for none) attended first.
    ///
    /// # Errors
    /// Kernel errors.
    fn attend<D: RecentFormat>(
        kernel: &mut CpuAttention,
        cfg: &AttnConfig,
        q: &[f32],
        heads: &[Hybrid<Self, D>],
        sink: &[(&[f32], &[f32])],
        out: &mut [f32],
    ) -> attn_kernels::Result<()>;
}

mod private {
    /// Seals [`super::BufferedHistory`].
    pub trait Sealed {}
    impl<C> Sealed for kv_sparse::quant::QuantRows<C> {}
    impl<const B: usize> Sealed for kv_sparse::kivi::KiviRows<B> {}
    impl<const B: usize> Sealed for kv_sparse::turbo::TurboRows<B> {}
    impl<const B: usize> Sealed for kv_sparse::turbo::TurboQjlRows<B> {}
}

impl<C: DenseCodec> BufferedHistory for QuantRows<C> {
    fn name(_group: usize) -> String {
        format!("dense {}", C::FORMAT)
    }

    fn token_bytes(head_dim: usize, _group: usize) -> f64 {
        (2 * C::row_bytes(head_dim)) as f64
    }

    fn int8_keys() -> bool {
        matches!(
            C::FORMAT,
            kv_sparse::quant::DenseFormat::Int8 | kv_sparse::quant::DenseFormat::Int4
        )
    }

    fn attend<D: RecentFormat>(
        kernel: &mut CpuAttention,
        cfg: &AttnConfig,
        q: &[f32],
        heads: &[Hybrid<Self, D>],
        sink: &[(&[f32], &[f32])],
        out: &mut [f32],
    ) -> attn_kernels::Result<()> {
        let views: Vec<QuantKv<'_, C>> = heads
            .iter()
            .zip(sink)
            .map(|(c, &(sk, sv))| {
                let (keys, values) = c.history();
                QuantKv::new(keys, values)
                    .with_sink(sk, sv)
                    .with_buffer(c.buffer_keys(), c.buffer_values())
            })
            .collect();
        kernel.quantized(cfg, q, &views, out)
    }
}

/// One decode step over heads whose history rows are read through row decoders (KIVI,
/// TurboQuant-style): each head's sink, `history` rows and buffer under one softmax.
fn attend_decoded<'h, S: RowStore, D: RecentFormat, R: DecodeRows>(
    kernel: &mut CpuAttention,
    (cfg, q, out): (&AttnConfig, &[f32], &mut [f32]),
    heads: &'h [Hybrid<S, D>],
    sink: &[(&'h [f32], &'h [f32])],
    history: impl Fn(&'h Hybrid<S, D>) -> (R, R),
) -> attn_kernels::Result<()> {
    let views: Vec<_> = heads
        .iter()
        .zip(sink)
        .map(|(c, &(sk, sv))| {
            let (keys, values) = history(c);
            DecodedKv::new(keys, values)
                .with_sink(sk, sv)
                .with_buffer(c.buffer_keys(), c.buffer_values())
        })
        .collect();
    kernel.decoded(cfg, q, &views, out)
}

impl<const B: usize> BufferedHistory for KiviRows<B> {
    fn name(group: usize) -> String {
        format!("kivi{B} group={group}")
    }

    fn token_bytes(head_dim: usize, group: usize) -> f64 {
        2.0 * KiviRows::<B>::row_bytes(head_dim, group)
    }

    fn attend<D: RecentFormat>(
        kernel: &mut CpuAttention,
        cfg: &AttnConfig,
        q: &[f32],
        heads: &[Hybrid<Self, D>],
        sink: &[(&[f32], &[f32])],
        out: &mut [f32],
    ) -> attn_kernels::Result<()> {
        attend_decoded(kernel, (cfg, q, out), heads, sink, |c| c.history())
    }
}

impl<const B: usize> BufferedHistory for TurboQjlRows<B> {
    fn name(_group: usize) -> String {
        format!("turbo{B} qjl")
    }

    fn token_bytes(head_dim: usize, _group: usize) -> f64 {
        (TurboQjlRows::<B>::row_bytes(Side::Keys, head_dim)
            + TurboQjlRows::<B>::row_bytes(Side::Values, head_dim)) as f64
    }

    fn attend<D: RecentFormat>(
        kernel: &mut CpuAttention,
        cfg: &AttnConfig,
        q: &[f32],
        heads: &[Hybrid<Self, D>],
        sink: &[(&[f32], &[f32])],
        out: &mut [f32],
    ) -> attn_kernels::Result<()> {
        attend_decoded(kernel, (cfg, q, out), heads, sink, |c| c.history())
    }
}

impl<const B: usize> BufferedHistory for TurboRows<B> {
    fn name(_group: usize) -> String {
        format!("turbo{B}")
    }

    fn token_bytes(head_dim: usize, _group: usize) -> f64 {
        (2 * TurboRows::<B>::row_bytes(head_dim)) as f64
    }

    fn attend<D: RecentFormat>(
        kernel: &mut CpuAttention,
        cfg: &AttnConfig,
        q: &[f32],
        heads: &[Hybrid<Self, D>],
        sink: &[(&[f32], &[f32])],
        out: &mut [f32],
    ) -> attn_kernels::Result<()> {
        attend_decoded(kernel, (cfg, q, out), heads, sink, |c| c.history())
    }
}

/// A cache whose `b` newest positions stay exact in the float format `D` and whose older
/// positions are kept whole in the history format `S`.
pub struct BufferedCache<S: BufferedHistory, D: RecentFormat> {
    shape: CacheShape,
    kernel: CpuAttention,
    rotation: Option<QkRotation>,
    /// Every (layer, kv-head): history and exact buffer.
    caches: MultiHead<S, D>,
    /// Buffer rows `b`.
    buffer: usize,
    /// The history's group (KIVI; the store's rows per block otherwise).
    group: usize,
    /// Positions kept in `f32` before everything else.
    sink: SinkRows,
    /// One layer's keys and values without the sink's positions (prefill only).
    staged: (Vec<f32>, Vec<f32>),
}

/// A quantized dense cache (`q8_0` / `q4_0` blocks or scaled fp8, codec `C`) with a recent-token
/// buffer in `D`.
pub type BufferedQuantCache<C, D> = BufferedCache<QuantRows<C>, D>;

impl<S: BufferedHistory, D: RecentFormat> BufferedCache<S, D> {
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
        let group = S::default_rows_per_block(shape.head_dim()).max(1);
        Self::with_group(shape, rotation, threads, buffer, group)
    }

    /// [`BufferedCache::new`] with the history's rows grouped by `group` (KIVI: tokens per key
    /// group and channels per value group).
    ///
    /// # Errors
    /// As [`BufferedCache::new`]; [`crate::Error::Sparse`] for a group the format cannot
    /// take (KIVI: one not dividing `head_dim`).
    pub fn with_group(
        shape: CacheShape,
        rotation: Option<std::sync::Arc<projection::ProjectionSet>>,
        threads: usize,
        buffer: usize,
        group: usize,
    ) -> Result<Self> {
        let rotation =
            rotation.map(|set| QkRotation::new("buffered cache", shape, set)).transpose()?;
        let cfg = HybridConfig {
            rows_per_block: group,
            ..HybridConfig::lossless(shape.head_dim(), buffer)
        };
        Ok(Self {
            shape,
            kernel: CpuAttention::new(threads)?,
            rotation,
            caches: MultiHead::new(shape.layers, shape.kv_heads(), cfg)?,
            buffer,
            group,
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

impl<S: BufferedHistory, D: RecentFormat> KvCache for BufferedCache<S, D> {
    fn thread_pool(&self) -> Option<&attn_kernels::ThreadPool> {
        Some(self.kernel.pool())
    }

    fn int8_keys(&self) -> bool {
        S::int8_keys()
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
            "{}{rotate} b={} ({}){}{}",
            S::name(self.group),
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
            let sink: Vec<(&[f32], &[f32])> =
                (first..first + self.shape.kv_heads()).map(|slot| self.sink.all(slot)).collect();
            S::attend(&mut self.kernel, &self.shape.attn, step.q, heads, &sink, out)?;
            Ok(())
        })();
        self.rotation = rotation;
        result
    }

    fn stats(&self) -> Vec<(&'static str, f64)> {
        let (s, d) = (&self.shape, self.shape.head_dim());
        let plain = super::Footprint::plain(s, S::token_bytes(d, self.group));
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

    /// Every head's history codes, waiting keys and buffer as held. A cache with a sink is
    /// not persisted (the file holds no `f32` rows).
    fn image(&self) -> Result<CacheImage<'_>> {
        if self.sink.positions > 0 {
            return Err(crate::Error::NotPersistable { op: "save cache", cache: self.label() });
        }
        let heads: Vec<&Hybrid<S, D>> = self.caches.heads().iter().collect();
        Ok(CacheImage::rows(self.shape.layers, self.shape.kv_heads(), &heads)?)
    }

    /// Rebuilds every head from `file` (copied: the history keeps growing in memory). Every
    /// head is checked — format, shape, buffer and group equal to this cache's — before the
    /// cache changes.
    fn load_image(&mut self, file: &Arc<MappedCache>) -> Result<()> {
        const OP: &str = "buffered cache load";
        if self.sink.positions > 0 {
            return Err(crate::Error::NotPersistable { op: "load cache", cache: self.label() });
        }
        let s = self.shape;
        file.check_shape(s.layers, s.kv_heads(), s.head_dim())?;
        super::persist::common_tokens(OP, file)?;
        let mut heads = Vec::with_capacity(s.layers * s.kv_heads());
        for l in 0..s.layers {
            for h in 0..s.kv_heads() {
                let head = file.load_rows::<S, D>(l, h)?;
                let cfg = head.config();
                if (cfg.buffer, cfg.rows_per_block) != (self.buffer, self.group) {
                    return Err(invalid(
                        OP,
                        format!(
                            "layer {l} head {h} holds b={} group={}, this cache b={} group={}",
                            cfg.buffer, cfg.rows_per_block, self.buffer, self.group
                        ),
                    ));
                }
                heads.push(head);
            }
        }
        self.caches = MultiHead::from_heads(s.layers, s.kv_heads(), heads)?;
        Ok(())
    }
}
