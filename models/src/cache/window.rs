//! Sliding-window-aware caching for models that interleave local and global layers
//! (Gemma 3: five sliding-window layers of 512 positions for every global one).
//!
//! * [`WindowCache`]: a dense ring of the last `window` positions per (layer, kv-head) —
//!   all a local layer ever attends to, so it never grows past the window and never holds
//!   a sparse history. Position `p` lives in slot `p mod window`; attention is a softmax
//!   over a set, so the ring's slot order does not change the result beyond float rounding.
//! * [`QuantWindowCache`]: the same ring with rows stored by a dense quantized codec (fp8
//!   with a per-token scale, `q8_0` / `q4_0` blocks), q and k optionally rotated first, so a
//!   quantized cache quantizes every layer of the model as llama.cpp's `-ctk/-ctv` does.
//! * [`WindowedCache`]: local layers go to a ring, global layers to any other
//!   cache (dense, quantized, SWAN, tiered), and the bytes are reported per layer kind. Each
//!   part is built for its own layers only (global layer `j` of the model is layer `j` of
//!   the global cache, counting global layers alone), so a SWAN projection set or a WnW
//!   head triage covers exactly the layers it serves.
//!
//! [`crate::cache::CacheSpec::build`] wraps every cache it builds for such a model in a
//! [`WindowedCache`].

use std::sync::Arc;

use attn_kernels::{CpuAttention, DecodeAttention, DenseKv, EncodedAttention, QuantKv};
use kv_sparse::quant::{DenseCodec, DenseFormat, Fp8Rows, Int4Blocks, Int8Blocks, QuantRows};
use kv_sparse::{Value, ValueFormat};
use projection::ProjectionSet;

use super::rotation::QkRotation;
use super::sink::SinkRows;
use super::spec::DenseStorage;
use super::{AttentionRequest, CacheBytes, CacheShape, KvCache, LayerKv, StepQkv, check_finite};
use crate::error::{Result, invalid};
use crate::load::config::LocalAttention;

/// The last `window` keys and values per (layer, kv-head), row-major `[slot][head_dim]`.
pub struct WindowCache<D: Value> {
    shape: CacheShape,
    window: usize,
    kernel: CpuAttention,
    /// `keys[layer * kv_heads + h]`, at most `window` rows.
    keys: Vec<Vec<D>>,
    values: Vec<Vec<D>>,
    /// Positions appended to each layer.
    seen: Vec<usize>,
}

impl<D: Value> WindowCache<D> {
    /// An empty ring of `window` positions per layer, attention on `threads` threads.
    ///
    /// # Errors
    /// [`crate::Error::InvalidInput`] for a zero window; [`crate::Error::Attention`] for no
    /// threads.
    ///
    /// # Examples
    /// ```
    /// use models::cache::{CacheShape, KvCache, StepQkv, WindowCache};
    /// let shape = CacheShape::new(1, attn_kernels::AttnConfig::new(1, 1, 2)?);
    /// let mut ring = WindowCache::<f32>::new(shape, 2, 1)?;
    /// let mut out = [0.0; 2];
    /// for v in [1.0, 2.0, 3.0] {
    ///     let step = StepQkv { q: &[0.0, 0.0], k: &[0.0, 0.0], v: &[v, v] };
    ///     ring.decode(0, step, &mut out)?;
    /// }
    /// assert_eq!(out, [2.5, 2.5]); // equal scores: the mean of the last two values
    /// assert_eq!(ring.bytes().total(), 2 * 2 * 2 * 4); // 2 rows of k and v, 2 × f32
    /// # Ok::<(), models::Error>(())
    /// ```
    pub fn new(shape: CacheShape, window: usize, threads: usize) -> Result<Self> {
        if window == 0 {
            return Err(invalid("window cache", "a window of 0 positions"));
        }
        let heads = shape.layers * shape.kv_heads();
        Ok(Self {
            shape,
            window,
            kernel: CpuAttention::new(threads)?,
            keys: vec![Vec::new(); heads],
            values: vec![Vec::new(); heads],
            seen: vec![0; shape.layers],
        })
    }

    /// Positions appended to `layer` so far (the ring holds the last `window` of them).
    pub fn positions(&self, layer: usize) -> usize {
        self.seen.get(layer).copied().unwrap_or(0)
    }

    fn heads(&self, layer: usize) -> std::ops::Range<usize> {
        layer * self.shape.kv_heads()..(layer + 1) * self.shape.kv_heads()
    }

    /// Writes one position's rows (`[kv_heads][head_dim]`) into its slot.
    fn push(&mut self, layer: usize, k: &[f32], v: &[f32], stride: usize, offset: usize) {
        let d = self.shape.head_dim();
        let slot = self.seen[layer] % self.window;
        for (i, head) in self.heads(layer).enumerate() {
            let at = i * stride + offset;
            for (dst, src) in [(&mut self.keys[head], k), (&mut self.values[head], v)] {
                let row = src[at..at + d].iter().map(|&x| D::from_f32(x));
                if dst.len() < slot * d {
                    // A prefill longer than the window starts past slot 0; it fills every
                    // slot before attention reads the ring.
                    dst.resize(self.window * d, D::from_f32(0.0));
                }
                if dst.len() == slot * d {
                    dst.extend(row);
                } else {
                    for (x, y) in dst[slot * d..(slot + 1) * d].iter_mut().zip(row) {
                        *x = y;
                    }
                }
            }
        }
        self.seen[layer] += 1;
    }
}

impl<D: Value> KvCache for WindowCache<D> {
    fn thread_pool(&self) -> Option<&attn_kernels::ThreadPool> {
        Some(self.kernel.pool())
    }

    fn label(&self) -> String {
        format!("window {} {}", self.window, D::FORMAT)
    }

    fn shape(&self) -> CacheShape {
        self.shape
    }

    fn len(&self) -> usize {
        self.seen.iter().map(|&s| s.min(self.window)).max().unwrap_or(0)
    }

    fn reserve(&mut self, tokens: usize) -> Result<()> {
        let d = self.shape.head_dim();
        for rows in self.keys.iter_mut().chain(self.values.iter_mut()) {
            let room = (self.window * d).saturating_sub(rows.len());
            rows.reserve((tokens * d).min(room));
        }
        Ok(())
    }

    fn prefill(&mut self, layer: usize, kv: LayerKv<'_>) -> Result<()> {
        self.shape.check_prefill(layer, &kv)?;
        check_finite("cache prefill", "keys", layer, kv.keys)?;
        check_finite("cache prefill", "values", layer, kv.values)?;
        let (d, n) = (self.shape.head_dim(), kv.tokens);
        // Positions before the last `window` would be overwritten: skip them, but count
        // them, so every position lands in its own slot.
        let skip = n.saturating_sub(self.window);
        self.seen[layer] += skip;
        for t in skip..n {
            self.push(layer, kv.keys, kv.values, n * d, t * d);
        }
        Ok(())
    }

    fn decode(&mut self, layer: usize, step: StepQkv<'_>, out: &mut [f32]) -> Result<()> {
        self.shape.check_step(layer, &step, out)?;
        check_finite("cache decode", "k", layer, step.k)?;
        check_finite("cache decode", "v", layer, step.v)?;
        let d = self.shape.head_dim();
        self.push(layer, step.k, step.v, d, 0);
        let views: Vec<DenseKv<'_, D>> =
            self.heads(layer).map(|s| DenseKv::new(d, &self.keys[s], &self.values[s])).collect();
        self.kernel.dense(&self.shape.attn, step.q, &views, out)?;
        Ok(())
    }

    fn window(&self, _layer: usize) -> Option<usize> {
        Some(self.window)
    }

    fn bytes(&self) -> CacheBytes {
        let elems: usize = self.keys.iter().chain(&self.values).map(Vec::len).sum();
        CacheBytes { resident: elems * D::FORMAT.bytes(), offloaded: 0 }
    }
}

/// The last `window` keys and values per (layer, kv-head), key rows encoded by `K` and
/// value rows by `V` (by default as the keys): a [`WindowCache`] of quantized rows. With a
/// rotation, q and k are turned into its basis before storing (values come from a model
/// with the set's `P_VO` absorbed).
pub struct QuantWindowCache<K: DenseCodec, V: DenseCodec = K> {
    shape: CacheShape,
    window: usize,
    kernel: CpuAttention,
    rotation: Option<QkRotation>,
    /// `keys[layer * kv_heads + h]`, at most `window` rows; position `p` in row `p mod window`.
    keys: Vec<QuantRows<K>>,
    values: Vec<QuantRows<V>>,
    /// Positions appended to each layer.
    seen: Vec<usize>,
    /// Positions kept in `f32` while they are inside the window.
    sink: SinkRows,
}

impl<K: DenseCodec, V: DenseCodec> QuantWindowCache<K, V> {
    /// An empty ring of `window` positions per layer; with `rotation` (a projection set for
    /// `shape`), q and k are rotated by its `P_QK`.
    ///
    /// # Errors
    /// [`crate::Error::InvalidInput`] for a zero window or a set of another shape;
    /// [`crate::Error::Sparse`] when `K` or `V` cannot hold rows of `head_dim`;
    /// [`crate::Error::Attention`] for no threads.
    ///
    /// # Examples
    /// ```
    /// use kv_sparse::quant::Int8Blocks;
    /// use models::cache::{CacheShape, KvCache, QuantWindowCache, StepQkv};
    /// let shape = CacheShape::new(1, attn_kernels::AttnConfig::new(1, 1, 32)?);
    /// let mut ring = QuantWindowCache::<Int8Blocks>::new(shape, 2, None, 1)?;
    /// let mut out = [0.0; 32];
    /// for v in [1.0, 2.0, 3.0] {
    ///     let step = StepQkv { q: &[0.0; 32], k: &[0.0; 32], v: &[v; 32] };
    ///     ring.decode(0, step, &mut out)?;
    /// }
    /// assert!(out.iter().all(|&x| (x - 2.5).abs() < 0.02)); // the mean of the last two
    /// assert_eq!(ring.bytes().total(), 2 * 2 * 34); // 2 rows of k and v, one q8_0 block each
    /// # Ok::<(), models::Error>(())
    /// ```
    pub fn new(
        shape: CacheShape,
        window: usize,
        rotation: Option<Arc<ProjectionSet>>,
        threads: usize,
    ) -> Result<Self> {
        if window == 0 {
            return Err(invalid("quantized window cache", "a window of 0 positions"));
        }
        let heads = shape.layers * shape.kv_heads();
        let d = shape.head_dim();
        let rotation = rotation
            .map(|set| QkRotation::new("quantized window cache", shape, set))
            .transpose()?;
        Ok(Self {
            shape,
            window,
            kernel: CpuAttention::new(threads)?,
            rotation,
            keys: (0..heads).map(|_| QuantRows::new(d)).collect::<kv_sparse::Result<_>>()?,
            values: (0..heads).map(|_| QuantRows::new(d)).collect::<kv_sparse::Result<_>>()?,
            seen: vec![0; shape.layers],
            sink: SinkRows::new(heads),
        })
    }

    /// The same (empty) ring keeping its first `positions` positions in `f32` while they
    /// are inside the window — attended in place of their quantized slots, under one
    /// softmax (see [`crate::cache::QuantCache::with_sink`]); their bytes count as resident.
    ///
    /// # Errors
    /// [`crate::Error::InvalidInput`] when the ring already holds positions or `positions`
    /// exceeds the window.
    ///
    /// # Examples
    /// ```
    /// use kv_sparse::quant::Int4Blocks;
    /// use models::cache::{CacheShape, KvCache, QuantWindowCache, StepQkv};
    /// let shape = CacheShape::new(1, attn_kernels::AttnConfig::new(1, 1, 32)?);
    /// let mut ring = QuantWindowCache::<Int4Blocks>::new(shape, 2, None, 1)?.with_sink(1)?;
    /// let mut out = [0.0; 32];
    /// for (i, v) in [0.3, 0.7, 0.9].into_iter().enumerate() {
    ///     let step = StepQkv { q: &[0.0; 32], k: &[0.1; 32], v: &[v; 32] };
    ///     ring.decode(0, step, &mut out)?;
    ///     if i == 0 {
    ///         assert_eq!(out, [0.3; 32]); // the sink row, exactly
    ///     }
    /// }
    /// assert!(out.iter().all(|&x| (x - 0.8).abs() < 0.02)); // the last two; the sink left
    /// # Ok::<(), models::Error>(())
    /// ```
    pub fn with_sink(mut self, positions: usize) -> Result<Self> {
        if self.seen.iter().any(|&s| s > 0) {
            return Err(invalid("quantized window sink", "the ring already holds positions"));
        }
        if positions > self.window {
            return Err(invalid(
                "quantized window sink",
                format!("a sink of {positions} positions in a window of {}", self.window),
            ));
        }
        self.sink.positions = positions;
        Ok(self)
    }

    fn heads(&self, layer: usize) -> std::ops::Range<usize> {
        layer * self.shape.kv_heads()..(layer + 1) * self.shape.kv_heads()
    }

    /// Checks positions `from..to` of a block (`[kv_heads][tokens][head_dim]`, `stride`
    /// elements per head), then writes each into its slot: all-or-nothing.
    fn push(
        &mut self,
        layer: usize,
        (keys, values): (&[f32], &[f32]),
        stride: usize,
        (from, to): (usize, usize),
    ) -> Result<()> {
        const OP: &str = "quantized window cache append";
        let d = self.shape.head_dim();
        let rows = |i: usize| i * stride + from * d..i * stride + to * d;
        for (i, slot) in self.heads(layer).enumerate() {
            self.keys[slot].check(OP, &keys[rows(i)])?;
            self.values[slot].check(OP, &values[rows(i)])?;
        }
        for t in from..to {
            let ring = self.seen[layer] % self.window;
            let in_sink = self.seen[layer] < self.sink.positions;
            for (i, slot) in self.heads(layer).enumerate() {
                let at = i * stride + t * d;
                if in_sink {
                    // Row p at p·d: positions a long prefill skipped (never attended again,
                    // they lie before the window) are zeros.
                    let p = self.seen[layer] * d;
                    for (dst, src) in
                        [(&mut self.sink.keys[slot], keys), (&mut self.sink.values[slot], values)]
                    {
                        dst.resize(p, 0.0);
                        dst.extend_from_slice(&src[at..at + d]);
                    }
                }
                put(&mut self.keys[slot], ring, &keys[at..at + d]);
                put(&mut self.values[slot], ring, &values[at..at + d]);
            }
            self.seen[layer] += 1;
        }
        Ok(())
    }
}

/// Writes `row` (checked) into slot `ring` of a ring's rows.
fn put<C: DenseCodec>(dst: &mut QuantRows<C>, ring: usize, row: &[f32]) {
    let d = row.len();
    if dst.len() < ring {
        // A prefill longer than the window starts past slot 0; it fills every slot before
        // attention reads the ring.
        dst.push_checked(&vec![0.0; (ring - dst.len()) * d]);
    }
    if dst.len() == ring {
        dst.push_checked(row);
    } else {
        dst.replace_checked(ring, row);
    }
}

impl<K: DenseCodec, V: DenseCodec> KvCache for QuantWindowCache<K, V> {
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
        format!(
            "window {} {}{}{rotate}{}{}",
            self.window,
            K::FORMAT,
            super::values_label::<K, V>(),
            self.sink.label(),
            super::queries_label(&self.kernel)
        )
    }

    fn shape(&self) -> CacheShape {
        self.shape
    }

    fn len(&self) -> usize {
        self.seen.iter().map(|&s| s.min(self.window)).max().unwrap_or(0)
    }

    fn reserve(&mut self, tokens: usize) -> Result<()> {
        let room = tokens.min(self.window);
        self.keys.iter_mut().for_each(|r| r.reserve(room.saturating_sub(r.len())));
        self.values.iter_mut().for_each(|r| r.reserve(room.saturating_sub(r.len())));
        self.kernel.reserve(&self.shape.attn, room);
        Ok(())
    }

    fn prefill(&mut self, layer: usize, kv: LayerKv<'_>) -> Result<()> {
        self.shape.check_prefill(layer, &kv)?;
        let (shape, n) = (self.shape, kv.tokens);
        // Positions before the last `window` would be overwritten: skip them, but count
        // them, so every position lands in its own slot.
        let skip = n.saturating_sub(self.window);
        let mut rotation = self.rotation.take();
        let result = (|| {
            let kv = match rotation.as_mut() {
                Some(r) => r.prefill(layer, &shape, kv)?,
                None => kv,
            };
            let seen = self.seen[layer];
            self.seen[layer] += skip;
            let pushed = self.push(layer, (kv.keys, kv.values), n * shape.head_dim(), (skip, n));
            if pushed.is_err() {
                self.seen[layer] = seen;
            }
            pushed
        })();
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
            let d = self.shape.head_dim();
            self.push(layer, (step.k, step.v), d, (0, 1))?;
            // Sink positions still inside the window: slots lo..hi, read from the f32 rows.
            let n = self.seen[layer];
            let (lo, hi) = (n.saturating_sub(self.window), self.sink.positions.min(n));
            let mut views: Vec<QuantKv<'_, K, V>> = Vec::with_capacity(self.shape.kv_heads());
            for s in self.heads(layer) {
                let (k, v) = (self.keys[s].view(), self.values[s].view());
                views.push(if lo < hi {
                    let len = k.num_rows();
                    let before = (k.rows(0..lo), v.rows(0..lo));
                    let (sk, sv) = self.sink.rows(s, lo..hi, d);
                    QuantKv::continuing(before, k.rows(hi..len), v.rows(hi..len)).with_sink(sk, sv)
                } else {
                    QuantKv::new(k, v)
                });
            }
            self.kernel.quantized(&self.shape.attn, step.q, &views, out)?;
            Ok(())
        })();
        self.rotation = rotation;
        result
    }

    fn window(&self, _layer: usize) -> Option<usize> {
        Some(self.window)
    }

    fn projection(&self) -> Option<&ProjectionSet> {
        self.rotation.as_ref().map(QkRotation::set)
    }

    fn bytes(&self) -> CacheBytes {
        let held = self.keys.iter().map(|r| r.memory().held_bytes()).sum::<usize>()
            + self.values.iter().map(|r| r.memory().held_bytes()).sum::<usize>();
        CacheBytes { resident: held + self.sink.held_bytes(), offloaded: 0 }
    }
}

/// The ring of the local layers of `shape` in `format`: a [`WindowCache`] of floats, or a
/// [`QuantWindowCache`] rotating q/k by `rotation` when given (a float ring needs none: an
/// orthogonal basis change leaves its attention unchanged).
fn ring_cache(
    shape: CacheShape,
    window: usize,
    format: DenseStorage,
    rotation: Option<Arc<ProjectionSet>>,
    (threads, sink): (usize, usize),
) -> Result<Box<dyn KvCache>> {
    let (w, t) = (window, threads);
    /// A quantized ring of keys `K` and values in `values`.
    fn quant<K: DenseCodec>(
        (shape, w, values): (CacheShape, usize, DenseFormat),
        rotation: Option<Arc<ProjectionSet>>,
        (t, sink): (usize, usize),
    ) -> Result<Box<dyn KvCache>> {
        Ok(match values {
            DenseFormat::Fp8 => Box::new(
                QuantWindowCache::<K, Fp8Rows>::new(shape, w, rotation, t)?.with_sink(sink)?,
            ),
            DenseFormat::Int8 => Box::new(
                QuantWindowCache::<K, Int8Blocks>::new(shape, w, rotation, t)?.with_sink(sink)?,
            ),
            DenseFormat::Int4 => Box::new(
                QuantWindowCache::<K, Int4Blocks>::new(shape, w, rotation, t)?.with_sink(sink)?,
            ),
        })
    }
    let Some((keys, values)) = format.quant_formats() else {
        return Ok(match format {
            DenseStorage::Float(ValueFormat::F32) => {
                Box::new(WindowCache::<f32>::new(shape, w, t)?)
            }
            DenseStorage::Float(ValueFormat::Bf16) => {
                Box::new(WindowCache::<half::bf16>::new(shape, w, t)?)
            }
            _ => Box::new(WindowCache::<half::f16>::new(shape, w, t)?),
        });
    };
    let at = (shape, w, values);
    match keys {
        DenseFormat::Fp8 => quant::<Fp8Rows>(at, rotation, (t, sink)),
        DenseFormat::Int8 => quant::<Int8Blocks>(at, rotation, (t, sink)),
        DenseFormat::Int4 => quant::<Int4Blocks>(at, rotation, (t, sink)),
    }
}

/// A [`WindowCache`] for the local layers of a model and any cache for its global layers.
pub struct WindowedCache {
    shape: CacheShape,
    window: usize,
    /// Per model layer: whether it is local, and its index among the layers of its kind.
    slots: Vec<(bool, usize)>,
    ring: Box<dyn KvCache>,
    global: Box<dyn KvCache>,
}

/// The model's global layers, in order (the layers a [`WindowedCache`]'s global part serves).
pub fn global_layers(layers: &LocalAttention) -> Vec<usize> {
    (0..layers.local.len()).filter(|&i| !layers.local[i]).collect()
}

impl WindowedCache {
    /// Serves the local layers of `layers` from a ring of `format` rows (a float format, or a
    /// quantized one whose q/k are rotated by `rotation`, a set for the local layers alone
    /// in order, when given) and the global layers from `global`, which must be built for
    /// them alone: its layer `j` is the model's `j`-th global layer ([`global_layers`]).
    ///
    /// # Errors
    /// [`crate::Error::InvalidInput`] if `global` has another number of layers than the
    /// model has global layers, already holds tokens, the window is 0, or `rotation` has
    /// another shape than the local layers; [`crate::Error::Sparse`] for a quantized format
    /// that cannot hold rows of the head dimension.
    pub fn new(
        layers: &LocalAttention,
        format: DenseStorage,
        rotation: Option<Arc<ProjectionSet>>,
        global: Box<dyn KvCache>,
        threads: usize,
    ) -> Result<Self> {
        Self::with_ring_sink(layers, (format, 0), rotation, global, threads)
    }

    /// [`WindowedCache::new`] with a quantized ring keeping its first `sink` positions in
    /// `f32` while they are inside the window ([`QuantWindowCache::with_sink`]; a float
    /// ring keeps every position in full already and ignores it).
    ///
    /// # Errors
    /// As [`WindowedCache::new`]; also [`crate::Error::InvalidInput`] for a sink longer
    /// than the window.
    pub fn with_ring_sink(
        layers: &LocalAttention,
        (format, sink): (DenseStorage, usize),
        rotation: Option<Arc<ProjectionSet>>,
        global: Box<dyn KvCache>,
        threads: usize,
    ) -> Result<Self> {
        let inner = global.shape();
        let n_global = layers.local.iter().filter(|&&l| !l).count();
        if inner.layers != n_global {
            let reason = format!(
                "the global cache has {} layers, the model {n_global} global layers",
                inner.layers
            );
            return Err(invalid("windowed cache", reason));
        }
        if !global.is_empty() {
            return Err(invalid("windowed cache", "the global cache already holds tokens"));
        }
        let mut counts = [0usize; 2];
        let slots = layers
            .local
            .iter()
            .map(|&local| {
                let n = &mut counts[usize::from(local)];
                *n += 1;
                (local, *n - 1)
            })
            .collect();
        let (w, local_shape) = (layers.window, CacheShape { layers: counts[1], ..inner });
        let ring = ring_cache(local_shape, w, format, rotation, (threads, sink))?;
        let shape = CacheShape { layers: layers.local.len(), ..inner };
        Ok(Self { shape, window: w, slots, ring, global })
    }

    /// The part serving `layer` and the layer's index there.
    fn part(&mut self, layer: usize) -> Result<(&mut dyn KvCache, usize)> {
        match self.slots.get(layer) {
            Some(&(true, i)) => Ok((self.ring.as_mut(), i)),
            Some(&(false, i)) => Ok((self.global.as_mut(), i)),
            None => Err(invalid(
                "cache",
                format!("layer {layer} out of range (model has {})", self.slots.len()),
            )),
        }
    }

    /// Bytes the local layers' windows hold.
    pub fn window_bytes(&self) -> CacheBytes {
        self.ring.bytes()
    }

    /// Bytes the global layers' cache holds.
    pub fn global_bytes(&self) -> CacheBytes {
        self.global.bytes()
    }

    /// The cache of the global layers.
    pub fn global(&self) -> &dyn KvCache {
        self.global.as_ref()
    }
}

impl KvCache for WindowedCache {
    /// The local layers' ring's pool (most layers of a sliding-window model are local),
    /// else the global layers'.
    fn thread_pool(&self) -> Option<&attn_kernels::ThreadPool> {
        self.ring.thread_pool().or_else(|| self.global.thread_pool())
    }

    fn int8_keys(&self) -> bool {
        self.global.int8_keys() || self.ring.int8_keys()
    }

    /// Sets int8 queries on whichever part stores int8 keys (the global layers' cache, the
    /// local layers' ring, or both); [`attn_kernels::QueryPrecision::F32`] and
    /// [`attn_kernels::QueryPrecision::Q8Blocks`] on both.
    fn set_query_precision(&mut self, precision: attn_kernels::QueryPrecision) -> Result<()> {
        use attn_kernels::QueryPrecision;
        if precision == QueryPrecision::Int8 && !self.int8_keys() {
            return Err(super::no_int8_keys(&self.label()));
        }
        let parts = [self.global.as_mut(), self.ring.as_mut()];
        for part in parts {
            if precision != QueryPrecision::Int8 || part.int8_keys() {
                part.set_query_precision(precision)?;
            }
        }
        Ok(())
    }

    fn label(&self) -> String {
        format!("{} (global layers) + {} (local layers)", self.global.label(), self.ring.label())
    }

    fn shape(&self) -> CacheShape {
        self.shape
    }

    fn len(&self) -> usize {
        if self.global.shape().layers == 0 { self.ring.len() } else { self.global.len() }
    }

    fn reserve(&mut self, tokens: usize) -> Result<()> {
        self.ring.reserve(tokens)?;
        self.global.reserve(tokens)
    }

    fn prefill(&mut self, layer: usize, kv: LayerKv<'_>) -> Result<()> {
        let (part, i) = self.part(layer)?;
        part.prefill(i, kv)
    }

    fn attention_request(&mut self, prompt_len: usize) -> Option<AttentionRequest> {
        self.global.attention_request(prompt_len)
    }

    fn prefill_attention(&mut self, layer: usize, received: &[f32]) -> Result<()> {
        match self.slots.get(layer) {
            Some(&(false, i)) => self.global.prefill_attention(i, received),
            _ => Ok(()),
        }
    }

    fn decode(&mut self, layer: usize, step: StepQkv<'_>, out: &mut [f32]) -> Result<()> {
        let (part, i) = self.part(layer)?;
        part.decode(i, step, out)
    }

    fn end_step(&mut self) -> Result<()> {
        self.global.end_step()
    }

    fn window(&self, layer: usize) -> Option<usize> {
        match self.slots.get(layer) {
            Some(&(true, _)) => Some(self.window),
            Some(&(false, i)) => self.global.window(i),
            None => None,
        }
    }

    fn bytes(&self) -> CacheBytes {
        let (r, g) = (self.ring.bytes(), self.global.bytes());
        CacheBytes { resident: r.resident + g.resident, offloaded: r.offloaded + g.offloaded }
    }

    fn stats(&self) -> Vec<(&'static str, f64)> {
        let mut s = self.global.stats();
        s.push(("window_bytes", self.ring.bytes().total() as f64));
        s.push(("global_bytes", self.global.bytes().total() as f64));
        s
    }
}
