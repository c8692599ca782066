//! The pluggable KV cache of the decode path.
//!
//! A [`KvCache`] owns the keys and values of every (layer, kv-head) and computes one
//! decode step's attention for all heads of a layer (`papers/swan.txt`, decode step:
//! append `k_{i+1}, v_{i+1}`, then `softmax(q K^T/√d) V`). The model hands it:
//! * the prompt's K/V in bulk after the libtorch prefill ([`KvCache::prefill`]);
//! * optionally, the attention the prompt paid to a marked span during prefill
//!   ([`KvCache::prefill_attention`]: WnW's text→audio sums, `papers/wnw.txt` §2.3);
//! * each decode step's RoPE'd q, k and v rows per layer ([`KvCache::decode`]), getting
//!   the per-q-head attention output back in a caller-owned buffer;
//! * the end of every step ([`KvCache::end_step`]: WnW's chunk swap).
//!
//! Models with sliding-window layers get a [`WindowedCache`]: a dense ring of the window on
//! local layers, the chosen cache on global ones ([`KvCache::window`] says which layers keep
//! only a window).
//!
//! Caches report the bytes they hold ([`KvCache::bytes`]). Caches that change the value
//! basis (SWAN's absorbed `P_VO`) are paired with matching weights by
//! [`crate::session::Session`]; the cache never sees weights.

mod buffered;
mod dense;
pub mod persist;
mod quant;
mod rotation;
mod sink;
pub mod spec;
mod swan;
pub mod tiered;
mod window;

pub use buffered::{BufferedCache, BufferedHistory, BufferedQuantCache};
pub use dense::DenseCache;
pub use quant::QuantCache;
pub use spec::{CacheKind, CacheSpec, CodedFormat, CodedSpec, DenseSpec, DenseStorage, SwanSpec};
pub use swan::{ComponentNorm, Fp8Scale, KeySelect, SwanCache, SwanConfig, SwanIndex, SwanRows};
pub use tiered::{SpanRows, TieredCache, TieredSpec};
pub use window::{QuantWindowCache, WindowCache, WindowedCache, global_layers};

use std::ops::Range;

use attn_kernels::{AttnConfig, QueryPrecision, ThreadPool};
use kv_sparse::persist::{CacheImage, MappedCache};
use projection::ProjectionSet;

use crate::error::{Error, Result, invalid};
use crate::load::config::ModelConfig;

/// Dimensions of the attention a cache serves: the decoder's layer count and one layer's
/// head layout and softmax scale ([`AttnConfig`], the workspace's one per-layer attention
/// shape, which the kernels take as is).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CacheShape {
    /// Decoder layers.
    pub layers: usize,
    /// Heads and softmax scale of every layer.
    pub attn: AttnConfig,
}

impl CacheShape {
    /// `layers` layers of `attn`.
    pub fn new(layers: usize, attn: AttnConfig) -> Self {
        Self { layers, attn }
    }

    /// The shape of a model's attention.
    ///
    /// # Errors
    /// [`crate::Error::Attention`] for a head layout the kernels cannot run (zero counts,
    /// q-heads not a multiple of kv-heads, `head_dim > 65535`) or a softmax scale that is
    /// not finite and positive.
    pub fn of(cfg: &ModelConfig) -> Result<Self> {
        let attn = AttnConfig::new(cfg.q_heads, cfg.kv_heads, cfg.head_dim)?;
        let attn = match cfg.query_scale {
            Some(scale) => attn.with_scale(scale as f32)?,
            None => attn,
        };
        Ok(Self::new(cfg.num_layers, attn))
    }

    /// Query heads per layer.
    pub fn q_heads(&self) -> usize {
        self.attn.q_heads()
    }

    /// Key/value heads per layer.
    pub fn kv_heads(&self) -> usize {
        self.attn.kv_heads()
    }

    /// Width of one head.
    pub fn head_dim(&self) -> usize {
        self.attn.head_dim()
    }

    /// Query heads per kv-head.
    pub fn group(&self) -> usize {
        self.attn.group_size()
    }

    /// Checks that a SWAN projection set was built for this shape (layers, heads, head
    /// size), the one geometry check every user of a set runs before rotating with it.
    ///
    /// # Errors
    /// [`crate::Error::InvalidInput`] naming `op` and both shapes.
    pub fn check_projection(&self, op: &'static str, dims: projection::ModelDims) -> Result<()> {
        let want = (self.layers, self.q_heads(), self.kv_heads(), self.head_dim());
        if (dims.layers(), dims.q_heads(), dims.kv_heads(), dims.head_dim()) != want {
            return Err(invalid(op, format!("projection set is for {dims:?}, model is {self:?}")));
        }
        Ok(())
    }

    /// Checks one decode step at the cache boundary, where the rows enter: the layer index,
    /// every row length (the caches slice rows per head on this alone), and that the query
    /// is finite. The query is checked here because the kernel sees it only after the step
    /// has appended its key and value; the key and value rows are checked once by the
    /// storage that keeps them (kv-sparse's `append_token`, kv-tiered's `append`,
    /// [`DenseCache`]'s own append), each all-or-nothing across heads. So a rejected step
    /// leaves the cache as it was.
    ///
    /// # Errors
    /// [`crate::Error::InvalidInput`] naming the first mismatch.
    pub fn check_step(&self, layer: usize, step: &StepQkv<'_>, out: &[f32]) -> Result<()> {
        let (q, kv) = (self.q_heads() * self.head_dim(), self.kv_heads() * self.head_dim());
        let lens = [
            ("q", step.q.len(), q),
            ("k", step.k.len(), kv),
            ("v", step.v.len(), kv),
            ("out", out.len(), q),
        ];
        self.check_layer(layer)?;
        for (what, got, want) in lens {
            if got != want {
                return Err(invalid(
                    "cache decode",
                    format!("{what} has {got} values, expected {want}"),
                ));
            }
        }
        check_finite("cache decode", "q", layer, step.q)
    }

    /// Checks a prefill block's lengths and the layer index.
    ///
    /// # Errors
    /// [`crate::Error::InvalidInput`] naming the first mismatch.
    pub fn check_prefill(&self, layer: usize, kv: &LayerKv<'_>) -> Result<()> {
        self.check_layer(layer)?;
        let want = self.kv_heads() * kv.tokens * self.head_dim();
        if kv.keys.len() != want || kv.values.len() != want {
            let reason = format!(
                "{} keys / {} values for {} tokens, expected {want}",
                kv.keys.len(),
                kv.values.len(),
                kv.tokens
            );
            return Err(invalid("cache prefill", reason));
        }
        Ok(())
    }

    fn check_layer(&self, layer: usize) -> Result<()> {
        if layer >= self.layers {
            return Err(invalid(
                "cache",
                format!("layer {layer} out of range (model has {})", self.layers),
            ));
        }
        Ok(())
    }
}

/// Rejects a row holding NaN or ±∞, naming the row and the first bad position.
pub(crate) fn check_finite(op: &'static str, what: &str, layer: usize, row: &[f32]) -> Result<()> {
    match row.iter().position(|x| !x.is_finite()) {
        None => Ok(()),
        Some(i) => {
            Err(invalid(op, format!("layer {layer}: {what}[{i}] = {} is not finite", row[i])))
        }
    }
}

/// Prefill attention a cache asks for: the softmax weights from every query row in
/// `queries` to every key position in `keys`, summed over the rows, per q-head. WnW's
/// text→audio score is `keys` = the audio span, `queries` = the text after it; SnapKV-style
/// policies use the last `w` prompt rows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AttentionRequest {
    /// Key positions (columns).
    pub keys: Range<usize>,
    /// Query positions (rows) whose weights are summed.
    pub queries: Range<usize>,
}

/// Bytes a cache holds, split by tier.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheBytes {
    /// Bytes attention reads from (device memory on a GPU run).
    pub resident: usize,
    /// Bytes kept elsewhere and recallable (WnW's pinned-CPU complement).
    pub offloaded: usize,
}

impl CacheBytes {
    /// Everything held.
    pub fn total(&self) -> usize {
        self.resident + self.offloaded
    }
}

/// The prompt's keys and values of one layer, head-major: `[kv_heads][tokens][head_dim]`.
#[derive(Clone, Copy, Debug)]
pub struct LayerKv<'a> {
    /// RoPE'd keys.
    pub keys: &'a [f32],
    /// Values.
    pub values: &'a [f32],
    /// Number of tokens.
    pub tokens: usize,
}

/// One token's projections for one layer: `q` is `[q_heads][head_dim]`, `k` and `v` are
/// `[kv_heads][head_dim]`; q and k are RoPE'd.
#[derive(Clone, Copy, Debug)]
pub struct StepQkv<'a> {
    /// Query rows.
    pub q: &'a [f32],
    /// Key rows of the new token.
    pub k: &'a [f32],
    /// Value rows of the new token.
    pub v: &'a [f32],
}

/// A KV cache that can serve the decode path of a model.
pub trait KvCache: Send {
    /// A one-line description (`dense f16`, `swan k=32/32 fp8 b=128 basis=calibrated`).
    fn label(&self) -> String;

    /// The attention dimensions this cache was built for.
    fn shape(&self) -> CacheShape;

    /// Tokens held per layer (the last layer to have been appended to decides).
    fn len(&self) -> usize;

    /// Whether no token is held.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Reserves room for `tokens` more tokens so later steps do not allocate.
    ///
    /// # Errors
    /// Implementations may fail to allocate.
    fn reserve(&mut self, tokens: usize) -> Result<()>;

    /// Stores the prompt's keys and values of one layer.
    ///
    /// # Errors
    /// [`crate::Error::InvalidInput`] on a length mismatch; storage errors.
    fn prefill(&mut self, layer: usize, kv: LayerKv<'_>) -> Result<()>;

    /// Which prefill attention statistics this cache wants for a prompt of `prompt_len`
    /// tokens (`None`: none). Asked once, before the first layer.
    fn attention_request(&mut self, prompt_len: usize) -> Option<AttentionRequest> {
        let _ = prompt_len;
        None
    }

    /// Receives, for one layer, the attention each q-head paid during prefill from the
    /// requested query rows to each requested key position, summed over those rows:
    /// `[q_heads][keys.len()]` (see [`AttentionRequest`]). Called before
    /// [`KvCache::prefill`] of the same layer.
    ///
    /// # Errors
    /// Implementations reject wrong lengths or non-finite sums.
    fn prefill_attention(&mut self, layer: usize, received: &[f32]) -> Result<()> {
        let _ = (layer, received);
        Ok(())
    }

    /// Appends the new token's k/v to `layer` and writes the attention output of every
    /// q-head (`[q_heads][head_dim]`, in the cache's value basis) to `out`.
    ///
    /// # Errors
    /// [`crate::Error::InvalidInput`] on a length mismatch or non-finite input; kernel errors.
    fn decode(&mut self, layer: usize, step: StepQkv<'_>, out: &mut [f32]) -> Result<()>;

    /// Called once after every layer of a decode step has run.
    ///
    /// # Errors
    /// Implementations may fail while moving data between tiers.
    fn end_step(&mut self) -> Result<()> {
        Ok(())
    }

    /// How many of the latest positions the cache keeps (and attends to) for `layer`:
    /// `None` for the whole history. A model whose layer attends to a sliding window
    /// refuses to decode past the window with a cache that keeps more there.
    fn window(&self, layer: usize) -> Option<usize> {
        let _ = layer;
        None
    }

    /// Bytes currently held.
    fn bytes(&self) -> CacheBytes;

    /// Whether the cache stores keys as int8 or 4-bit codes (dense `q8_0` and `q4_0` rows,
    /// SWAN rows with int8 values), the keys [`QueryPrecision::Int8`] scores by integer
    /// products.
    fn int8_keys(&self) -> bool {
        false
    }

    /// Sets how the attention kernels take the queries ([`QueryPrecision`];
    /// [`QueryPrecision::F32`], the lossless setting, unless set): int8 codes against the
    /// cache's int8 keys, or rounded to `q8_0` blocks against keys of any format (the
    /// quantized dense, SWAN and windowed caches; the default implementation takes f32
    /// only).
    ///
    /// # Errors
    /// [`crate::Error::InvalidInput`] when [`QueryPrecision::Int8`] is asked of a cache
    /// without int8 keys ([`KvCache::int8_keys`]) or a precision the cache does not take;
    /// [`crate::Error::Attention`] when this CPU cannot run it. On error nothing changes.
    fn set_query_precision(&mut self, precision: QueryPrecision) -> Result<()> {
        match precision {
            QueryPrecision::F32 => Ok(()),
            QueryPrecision::Int8 => Err(no_int8_keys(&self.label())),
            other => Err(invalid(
                "set query precision",
                format!("queries={other}: the {} cache scores f32 queries only", self.label()),
            )),
        }
    }

    /// The thread pool the cache's attention kernels run on, lent to the rest of a decode
    /// step: [`crate::llama::Llama::decode`] splits its matrix–vector products among the
    /// same threads, whose workers are still spinning from the last attention call (no
    /// wake-up between the two, and no second set of threads competing for the cores).
    /// `None` (the default) runs those products on the calling thread.
    fn thread_pool(&self) -> Option<&ThreadPool> {
        None
    }

    /// Cache-specific figures for reports (e.g. a tiered store's `r_gpu`; the dense,
    /// quantized, buffered and SWAN caches report [`Footprint`]); none by
    /// default.
    fn stats(&self) -> Vec<(&'static str, f64)> {
        Vec::new()
    }

    /// The projection set q/k are rotated by and `P_VO` absorbed with, if any (part of a
    /// persisted cache's identity).
    fn projection(&self) -> Option<&ProjectionSet> {
        None
    }

    /// Every layer's and kv-head's state as a persisted-cache image borrowing the cache
    /// (see [`persist`]).
    ///
    /// # Errors
    /// [`crate::Error::NotPersistable`] for caches without a persisted form (the default);
    /// [`crate::Error::Sparse`] if the state does not encode.
    fn image(&self) -> Result<CacheImage<'_>> {
        Err(crate::Error::NotPersistable { op: "save cache", cache: self.label() })
    }

    /// Replaces the cache's state by an opened file's (every layer, every kv-head; each
    /// head's contents are validated as it is read). A cache may keep `file` and read rows
    /// where they are mapped instead of copying them (the dense, quantized and SWAN caches
    /// do).
    /// The file is checked against this cache — layout and formats, shape, per-head
    /// configuration, equal token counts across layers — before anything changes, so on
    /// error the cache holds what it held before.
    ///
    /// # Errors
    /// [`crate::Error::NotPersistable`] (the default); [`crate::Error::Sparse`] for a file
    /// of another layout, format or shape; [`crate::Error::InvalidInput`] for per-head
    /// configurations or token counts this cache cannot continue from.
    fn load_image(&mut self, file: &std::sync::Arc<MappedCache>) -> Result<()> {
        let _ = file;
        Err(crate::Error::NotPersistable { op: "load cache", cache: self.label() })
    }
}

/// The [`KvCache::stats`] key of the exact bytes one position costs once it has left any
/// recent-token buffer and sink (keys and values of every layer and kv-head the cache
/// serves, by the storage format's formula): the figure formats are compared by at a length
/// where the buffer is amortized (see [`Footprint`]).
pub const HISTORY_BYTES_PER_TOKEN: &str = "history_bytes_per_token";

/// What one position costs in each part of a cache, over every layer and kv-head it serves:
/// the exact per-format formulas a cache reports in [`KvCache::stats`] (under the keys of
/// [`Footprint::stats`]), from which the bytes per token at any length follow — the byte
/// accounting every format is compared by, the same for all.
///
/// # Examples
/// ```
/// use models::cache::Footprint;
/// // A 128-row f16 buffer over int4 rows of 18 bytes (keys and values: 36), one head of 32.
/// let f = Footprint { history: 36.0, buffer_rows: 128, buffer: 128.0, sink_rows: 0, sink: 0.0, dense_f16: 128.0 };
/// assert_eq!(f.bytes(100), 100.0 * 128.0); // all in the buffer
/// assert_eq!(f.bytes(4096), 128.0 * 128.0 + 3968.0 * 36.0);
/// assert_eq!(Footprint::from_stats(&f.stats()), Some(f));
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Footprint {
    /// Bytes of one position in the history (quantized, sparse or dense rows).
    pub history: f64,
    /// Positions the recent-token buffer holds at most.
    pub buffer_rows: usize,
    /// Bytes of one buffered position.
    pub buffer: f64,
    /// Positions kept in `f32` first (the attention sink).
    pub sink_rows: usize,
    /// Bytes of one sink position.
    pub sink: f64,
    /// Bytes of one position of a dense f16 cache over the same layers and heads.
    pub dense_f16: f64,
}

impl Footprint {
    const KEYS: [&'static str; 6] = [
        HISTORY_BYTES_PER_TOKEN,
        "buffer_rows",
        "buffer_bytes_per_token",
        "sink_rows",
        "sink_bytes_per_token",
        "dense_f16_bytes_per_token",
    ];

    /// A cache of `shape` without buffer or sink whose key and value rows of one head cost
    /// `row_bytes` together.
    pub(crate) fn plain(shape: &CacheShape, row_bytes: f64) -> Self {
        let heads = (shape.layers * shape.kv_heads()) as f64;
        Self {
            history: heads * row_bytes,
            buffer_rows: 0,
            buffer: 0.0,
            sink_rows: 0,
            sink: 0.0,
            dense_f16: heads * (4 * shape.head_dim()) as f64,
        }
    }

    /// The same with `rows` buffered positions of `row_bytes` (keys and values of one head).
    pub(crate) fn with_buffer(self, shape: &CacheShape, rows: usize, row_bytes: usize) -> Self {
        let heads = (shape.layers * shape.kv_heads()) as f64;
        Self { buffer_rows: rows, buffer: heads * row_bytes as f64, ..self }
    }

    /// The same with `rows` sink positions in `f32`.
    pub(crate) fn with_sink(self, shape: &CacheShape, rows: usize) -> Self {
        let heads = (shape.layers * shape.kv_heads()) as f64;
        Self { sink_rows: rows, sink: heads * (8 * shape.head_dim()) as f64, ..self }
    }

    /// Bytes held for `tokens` positions: the sink's first, then the buffer's newest, the
    /// history the rest.
    pub fn bytes(&self, tokens: usize) -> f64 {
        let sink = tokens.min(self.sink_rows);
        let buffered = (tokens - sink).min(self.buffer_rows);
        let history = tokens - sink - buffered;
        sink as f64 * self.sink + buffered as f64 * self.buffer + history as f64 * self.history
    }

    /// Bytes per position at `tokens` positions over a dense f16 cache's.
    pub fn ratio_to_f16(&self, tokens: usize) -> f64 {
        self.bytes(tokens) / (tokens.max(1) as f64 * self.dense_f16)
    }

    /// The figures as [`KvCache::stats`] entries.
    pub fn stats(&self) -> Vec<(&'static str, f64)> {
        let values = [
            self.history,
            self.buffer_rows as f64,
            self.buffer,
            self.sink_rows as f64,
            self.sink,
            self.dense_f16,
        ];
        Self::KEYS.into_iter().zip(values).collect()
    }

    /// The footprint a cache's stats report, if they report one.
    pub fn from_stats(stats: &[(&str, f64)]) -> Option<Self> {
        let get = |key: &str| stats.iter().find(|(k, _)| *k == key).map(|(_, v)| *v);
        let [h, br, b, sr, s, f] = Self::KEYS.map(get);
        Some(Self {
            history: h?,
            buffer_rows: br? as usize,
            buffer: b?,
            sink_rows: sr? as usize,
            sink: s?,
            dense_f16: f?,
        })
    }
}

/// The error of [`KvCache::set_query_precision`] asking int8 queries of a cache without int8
/// keys.
pub(crate) fn no_int8_keys(label: &str) -> Error {
    invalid("set query precision", format!("int8 queries: the {label} cache stores no int8 keys"))
}

/// ` values=V` for a quantized cache whose value rows are in codec `V` and key rows in
/// another codec `K`, else nothing: the part of a cache's label after its key format.
pub(crate) fn values_label<K: kv_sparse::quant::DenseCodec, V: kv_sparse::quant::DenseCodec>()
-> String {
    if K::FORMAT == V::FORMAT { String::new() } else { format!(" values={}", V::FORMAT) }
}

/// ` queries=int8` / ` queries=q8_0` for a kernel taking its queries so
/// ([`KvCache::set_query_precision`]), else nothing: the suffix of a cache's label.
pub(crate) fn queries_label(kernel: &attn_kernels::CpuAttention) -> &'static str {
    match kernel.query_precision() {
        QueryPrecision::Int8 => " queries=int8",
        QueryPrecision::Q8Blocks => " queries=q8_0",
        _ => "",
    }
}
