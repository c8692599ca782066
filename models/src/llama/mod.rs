//! The Llama decoder (Llama 2/3, SmolLM2, Mistral; Qwen2 = the same block with q/k/v
//! biases; Gemma 3 = the block with the changes of [`gemma`]) on libtorch, f32 on the CPU.
//! Each layer has `load(...)` and forward functions:
//! [`Llama::prefill`] runs the prompt with full causal attention and fills the cache,
//! [`Llama::decode`] runs one token through the cache (`papers/swan.txt`, "decode step").

mod absorb;
mod attention;
pub mod gemma;
pub mod host;
pub mod linear;
mod mlp;
mod norm;
pub mod rope;

pub use attention::{Attention, AttentionTensors, BatchScratch, DecodeScratch};
pub use mlp::Mlp;
pub use norm::RmsNorm;

use std::ops::Range;

use attn_kernels::ThreadPool;
use tch::{Kind, Tensor};

use crate::cache::{AttentionRequest, KvCache};
use crate::error::{Result, TorchOp, invalid};
use crate::llama::gemma::SandwichNorms;
use crate::llama::rope::Rope;
use crate::load::config::{LayerKind, ModelConfig};
use crate::load::weights::{WeightSource, Weights};

/// Sees the prefill's intermediate tensors (calibration, parity traces).
pub trait PrefillObserver {
    /// A residual-stream tensor `[tokens, hidden]`: `embed`, `layer{i}.attn_out` (after
    /// `W_O`, before the residual add), `layer{i}.out`, `final_norm`.
    ///
    /// # Errors
    /// Implementations may fail; the forward stops with their error.
    fn hidden(&mut self, name: &str, h: &Tensor) -> Result<()> {
        let _ = (name, h);
        Ok(())
    }

    /// One layer's RoPE'd q/k, v and per-head attention outputs.
    ///
    /// # Errors
    /// Implementations may fail; the forward stops with their error.
    fn attention(&mut self, layer: usize, t: &AttentionTensors) -> Result<()> {
        let _ = (layer, t);
        Ok(())
    }
}

/// The observer that ignores everything.
pub struct NoObserver;

impl PrefillObserver for NoObserver {}

/// One decoder layer (clones share weight storage).
#[derive(Clone)]
pub struct Block {
    input_norm: RmsNorm,
    attn: Attention,
    /// The norm before the MLP (HF `post_attention_layernorm`; Gemma's
    /// `pre_feedforward_layernorm`).
    post_norm: RmsNorm,
    mlp: Mlp,
    sandwich: Option<SandwichNorms>,
}

impl Block {
    /// Loads `model.layers.{i}` (a local layer's attention keeps its window).
    ///
    /// # Errors
    /// Missing or mis-shaped weights.
    pub fn load(w: &Weights<'_>, cfg: &ModelConfig, i: usize) -> Result<Self> {
        let p = format!("model.layers.{i}");
        let window = match cfg.layer_kind(i) {
            LayerKind::Local { window } => Some(window),
            LayerKind::Global => None,
        };
        let sandwich = SandwichNorms::load(w, cfg, &p)?;
        let pre_mlp = if sandwich.is_some() {
            "pre_feedforward_layernorm"
        } else {
            "post_attention_layernorm"
        };
        Ok(Self {
            input_norm: RmsNorm::load(
                w,
                &format!("{p}.input_layernorm"),
                cfg.hidden_size,
                cfg.rms_norm_eps,
            )?,
            attn: Attention::load(w, cfg, &format!("{p}.self_attn"))?.with_window(window),
            post_norm: RmsNorm::load(
                w,
                &format!("{p}.{pre_mlp}"),
                cfg.hidden_size,
                cfg.rms_norm_eps,
            )?,
            mlp: Mlp::load(w, cfg, &format!("{p}.mlp"))?,
            sandwich,
        })
    }

    /// The attention sub-layer.
    pub fn attention(&self) -> &Attention {
        &self.attn
    }

    /// The same block with its attention replaced (other weights shared).
    pub fn with_attention(&self, attn: Attention) -> Self {
        Self { attn, ..self.clone() }
    }

    fn tensors(&self) -> Vec<&Tensor> {
        let mut t = self.attn.tensors();
        t.extend(self.mlp.tensors());
        t.extend([self.input_norm.weight(), self.post_norm.weight()]);
        if let Some(n) = &self.sandwich {
            t.extend(n.weights());
        }
        t
    }

    fn finish(&self, h: &Tensor, attn_out: &Tensor, pool: Option<&ThreadPool>) -> Result<Tensor> {
        let Some(sandwich) = &self.sandwich else {
            let h = h.f_add(attn_out).op("residual")?;
            let m = self.mlp.forward_on(pool, &self.post_norm.forward(&h)?)?;
            return h.f_add(&m).op("residual");
        };
        let h = h.f_add(&sandwich.attention(attn_out)?).op("residual")?;
        let m = self.mlp.forward_on(pool, &self.post_norm.forward(&h)?)?;
        h.f_add(&sandwich.feedforward(&m)?).op("residual")
    }
}

/// A Llama-family decoder.
pub struct Llama {
    cfg: ModelConfig,
    embed: Tensor,
    blocks: Vec<Block>,
    norm: RmsNorm,
    lm_head: Tensor,
    rope: Rope,
    /// The rotary embedding of local layers, when they have their own.
    local_rope: Option<Rope>,
}

/// Clones share the (immutable) weight storage, so a session can own its model cheaply.
impl Clone for Llama {
    fn clone(&self) -> Self {
        Self {
            cfg: self.cfg.clone(),
            embed: self.embed.shallow_clone(),
            blocks: self.blocks.clone(),
            norm: self.norm.clone(),
            lm_head: self.lm_head.shallow_clone(),
            rope: self.rope.clone(),
            local_rope: self.local_rope.clone(),
        }
    }
}

impl Llama {
    /// Loads every weight from `src` (HF names), as f32.
    ///
    /// # Errors
    /// [`crate::Error::MissingTensor`] / [`crate::Error::TensorShape`] naming the first bad
    /// weight; format errors from the source.
    pub fn load(src: &dyn WeightSource, cfg: &ModelConfig) -> Result<Self> {
        cfg.validate()?;
        let w = Weights::new(src, Kind::Float);
        let embed = w.get("model.embed_tokens.weight", &[cfg.vocab_size, cfg.hidden_size])?;
        let lm_head = match w.get_opt("lm_head.weight", &[cfg.vocab_size, cfg.hidden_size])? {
            Some(t) if !cfg.tie_word_embeddings => t,
            _ if cfg.tie_word_embeddings => embed.shallow_clone(),
            _ => return Err(crate::Error::MissingTensor { name: "lm_head.weight".into() }),
        };
        let blocks = (0..cfg.num_layers).map(|i| Block::load(&w, cfg, i)).collect::<Result<_>>()?;
        let norm = RmsNorm::load(&w, "model.norm", cfg.hidden_size, cfg.rms_norm_eps)?;
        Ok(Self {
            cfg: cfg.clone(),
            embed,
            blocks,
            norm,
            lm_head,
            rope: Rope::new(&cfg.rope, cfg.head_dim),
            local_rope: cfg.local_attention.as_ref().map(|l| Rope::new(&l.rope, cfg.head_dim)),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    /// The decoder layers.
    pub fn blocks(&self) -> &[Block] {
        &self.blocks
    }

    /// The rotary embedding (of global layers, where local ones have their own).
    pub fn rope(&self) -> &Rope {
        &self.rope
    }

    /// The rotary embedding of layer `layer`.
    pub fn layer_rope(&self, layer: usize) -> &Rope {
        match (&self.local_rope, self.cfg.layer_kind(layer)) {
            (Some(local), LayerKind::Local { .. }) => local,
            _ => &self.rope,
        }
    }

    /// Rotary tables of the local layers for positions `0..n` (`None` when no layer has
    /// its own rotary base).
    fn local_tables(&self, n: usize) -> Result<Option<(Tensor, Tensor)>> {
        self.local_rope.as_ref().map(|r| r.tables(0, n)).transpose()
    }

    /// Layer `layer`'s rope and tables: the local ones on a local layer.
    fn layer_tables<'a>(
        &'a self,
        layer: usize,
        global: &'a (Tensor, Tensor),
        local: &'a Option<(Tensor, Tensor)>,
    ) -> (&'a Rope, (&'a Tensor, &'a Tensor)) {
        match (local, self.cfg.layer_kind(layer)) {
            (Some(t), LayerKind::Local { .. }) => (self.layer_rope(layer), (&t.0, &t.1)),
            _ => (&self.rope, (&global.0, &global.1)),
        }
    }

    /// Scales token embeddings where the architecture does (Gemma: `√hidden`).
    fn scale_embed(&self, h: Tensor) -> Result<Tensor> {
        match crate::llama::gemma::embed_scale(&self.cfg) {
            Some(s) => h.f_mul_scalar(s).op("embed scale"),
            None => Ok(h),
        }
    }

    /// Checks, before a decode step at `position`, that `cache` keeps only the window of
    /// every local layer once the sequence is longer than it (a cache that keeps the whole
    /// history there would attend to positions the model never sees).
    fn check_cache_window(&self, position: usize, cache: &dyn KvCache) -> Result<()> {
        for layer in 0..self.cfg.num_layers {
            if let LayerKind::Local { window } = self.cfg.layer_kind(layer)
                && position >= window
                && cache.window(layer) != Some(window)
            {
                return Err(invalid(
                    "decode",
                    format!(
                        "layer {layer} attends to the last {window} positions, but cache `{}` keeps {:?} there; build the cache from a spec for this model",
                        cache.label(),
                        cache.window(layer)
                    ),
                ));
            }
        }
        Ok(())
    }

    /// The same model with its blocks replaced (other weights shared, not copied).
    ///
    /// # Errors
    /// [`crate::Error::InvalidInput`] if the number of blocks differs.
    pub fn with_blocks(&self, blocks: Vec<Block>) -> Result<Self> {
        if blocks.len() != self.blocks.len() {
            return Err(invalid(
                "replace blocks",
                format!("{} blocks for {} layers", blocks.len(), self.blocks.len()),
            ));
        }
        Ok(Self { blocks, ..self.clone() })
    }

    fn check_ids(&self, ids: &[u32]) -> Result<()> {
        if let Some(&bad) = ids.iter().find(|&&id| id as usize >= self.cfg.vocab_size) {
            return Err(invalid(
                "forward",
                format!("token id {bad} ≥ vocab size {}", self.cfg.vocab_size),
            ));
        }
        Ok(())
    }

    fn check_window(&self, len: usize) -> Result<()> {
        match self.cfg.sliding_window {
            Some(w) if len > w => Err(invalid(
                "forward",
                format!(
                    "{len} positions exceed the sliding window {w}, which full attention would not reproduce"
                ),
            )),
            _ => Ok(()),
        }
    }

    /// Runs `ids` (positions `0..n`) with full causal attention, hands each layer's K/V to
    /// `cache` (and the attention received by its span, if it asks), reports intermediates
    /// to `obs`, and returns logits `[n, vocab]` (`all_logits`) or `[1, vocab]` (last).
    ///
    /// # Errors
    /// [`crate::Error::InvalidInput`] for empty input, ids out of range or a sequence
    /// longer than a sliding window; cache and observer errors.
    pub fn prefill(
        &self,
        ids: &[u32],
        cache: Option<&mut dyn KvCache>,
        obs: &mut dyn PrefillObserver,
        all_logits: bool,
    ) -> Result<Tensor> {
        let _guard = tch::no_grad_guard();
        let h = self.embed(ids)?;
        self.prefill_embeds(&h, self.rope.tables(0, ids.len())?, cache, obs, all_logits)
    }

    /// Token embeddings `[n, hidden]` of `ids` (scaled by `√hidden` for Gemma).
    ///
    /// # Errors
    /// [`crate::Error::InvalidInput`] for empty input or ids out of range.
    pub fn embed(&self, ids: &[u32]) -> Result<Tensor> {
        if ids.is_empty() {
            return Err(invalid("prefill", "no tokens"));
        }
        self.check_ids(ids)?;
        let idx: Vec<i64> = ids.iter().map(|&i| i64::from(i)).collect();
        let h = self.embed.f_index_select(0, &Tensor::f_from_slice(&idx).op("ids")?).op("embed")?;
        self.scale_embed(h)
    }

    /// [`Llama::prefill`] from input embeddings `h` (`[n, hidden]`) and explicit rotary
    /// tables `(cos, sin)` (`[n, head_dim]`, as [`Rope::tables`] builds them): audio LLMs
    /// splice audio embeddings into the prompt, and Qwen2.5-Omni supplies M-RoPE tables.
    /// The tables serve the global layers; local layers with their own rotary base use
    /// that base at positions `0..n`.
    ///
    /// # Errors
    /// [`crate::Error::InvalidInput`] for an empty or mis-shaped input, or a sequence longer
    /// than a sliding window; cache and observer errors.
    pub fn prefill_embeds(
        &self,
        h: &Tensor,
        tables: (Tensor, Tensor),
        cache: Option<&mut dyn KvCache>,
        obs: &mut dyn PrefillObserver,
        all_logits: bool,
    ) -> Result<Tensor> {
        let n = self.check_embeds(h, &tables)?;
        let mut caches: Vec<&mut dyn KvCache> = cache.into_iter().collect();
        let request = caches.first_mut().and_then(|c| c.attention_request(n as usize));
        self.prefill_core(n, h, &tables, &mut caches, request.as_ref(), obs, all_logits)
    }

    /// [`Llama::prefill`] for several caches of the same prompt at once: the forward runs
    /// once and every cache receives the same K/V rows, exactly as if each had been
    /// prefilled on its own (the prompt's attention is full causal attention whatever the
    /// cache; logits `[1, vocab]` of the last position). Caches that ask for prefill
    /// attention statistics ([`KvCache::attention_request`], asked once each) are grouped by
    /// request, and the forward runs once per distinct request, since the statistics it
    /// gathers depend on it. A grid of cache configurations evaluated on one text therefore
    /// pays for one prefill instead of one per configuration.
    ///
    /// # Errors
    /// [`crate::Error::InvalidInput`] for no caches, empty input, ids out of range or a
    /// sequence longer than a sliding window; cache errors.
    pub fn prefill_shared(&self, ids: &[u32], caches: &mut [&mut dyn KvCache]) -> Result<Tensor> {
        if caches.is_empty() {
            return Err(invalid("shared prefill", "no caches"));
        }
        let _guard = tch::no_grad_guard();
        let h = self.embed(ids)?;
        let tables = self.rope.tables(0, ids.len())?;
        let n = self.check_embeds(&h, &tables)?;
        let requests: Vec<Option<AttentionRequest>> =
            caches.iter_mut().map(|c| c.attention_request(n as usize)).collect();
        let mut distinct: Vec<Option<AttentionRequest>> = Vec::new();
        for r in &requests {
            if !distinct.contains(r) {
                distinct.push(r.clone());
            }
        }
        let mut logits = None;
        for request in &distinct {
            let mut group: Vec<&mut dyn KvCache> = caches
                .iter_mut()
                .zip(&requests)
                .filter(|(_, r)| *r == request)
                .map(|(c, _)| {
                    let r: &mut dyn KvCache = &mut **c;
                    r
                })
                .collect();
            let l = self.prefill_core(
                n,
                &h,
                &tables,
                &mut group,
                request.as_ref(),
                &mut NoObserver,
                false,
            )?;
            logits.get_or_insert(l);
        }
        logits.ok_or_else(|| invalid("shared prefill", "no caches"))
    }

    /// The prefill forward of `h` (`n` rows, checked by the caller with
    /// [`Llama::check_embeds`]) at `tables`, feeding every layer's K/V (and the attention
    /// statistics of `request`) to each of `caches`.
    #[allow(clippy::too_many_arguments)]
    fn prefill_core(
        &self,
        n: i64,
        h: &Tensor,
        tables: &(Tensor, Tensor),
        caches: &mut [&mut dyn KvCache],
        request: Option<&AttentionRequest>,
        obs: &mut dyn PrefillObserver,
        all_logits: bool,
    ) -> Result<Tensor> {
        let _guard = tch::no_grad_guard();
        let mut h = h.to_kind(Kind::Float);
        obs.hidden("embed", &h)?;
        let local = self.local_tables(n as usize)?;
        for (i, block) in self.blocks.iter().enumerate() {
            let x = block.input_norm.forward(&h)?;
            let (rope, layer_tables) = self.layer_tables(i, tables, &local);
            let (attn_out, tensors, received) =
                block.attn.prefill(&x, rope, layer_tables, request)?;
            obs.attention(i, &tensors)?;
            obs.hidden(&format!("layer{i}.attn_out"), &attn_out)?;
            for c in caches.iter_mut() {
                feed_cache(&mut **c, i, &tensors, received.as_ref())?;
            }
            h = block.finish(&h, &attn_out, None)?;
            obs.hidden(&format!("layer{i}.out"), &h)?;
        }
        let last = if all_logits { h } else { h.f_narrow(0, n - 1, 1).op("last")? };
        let normed = self.norm.forward(&last)?;
        obs.hidden("final_norm", &normed)?;
        linear::linear(&normed, &self.lm_head, None, "lm_head")
    }

    /// The output head: final norm and `lm_head` of residual-stream rows `[rows, hidden]`
    /// (e.g. the `layer{last}.out` rows a [`PrefillObserver`] saw), giving `[rows, vocab]`
    /// logits without computing them for every position.
    ///
    /// # Errors
    /// [`crate::Error::Torch`] on a shape mismatch.
    pub fn head(&self, h: &Tensor) -> Result<Tensor> {
        let _guard = tch::no_grad_guard();
        linear::linear(&self.norm.forward(h)?, &self.lm_head, None, "lm_head")
    }

    /// Checks input embeddings `[n, hidden]` and rotary tables `[n, head_dim]`; returns `n`.
    fn check_embeds(&self, h: &Tensor, tables: &(Tensor, Tensor)) -> Result<i64> {
        let size = h.size();
        let n = size.first().copied().unwrap_or(0);
        let want_tables = [n, self.cfg.head_dim as i64];
        if size.len() != 2
            || n == 0
            || size[1] != self.cfg.hidden_size as i64
            || tables.0.size() != want_tables
            || tables.1.size() != want_tables
        {
            let reason = format!(
                "embeddings {size:?}, tables {:?}: need [n ≥ 1, {}] and {want_tables:?}",
                tables.0.size(),
                self.cfg.hidden_size
            );
            return Err(invalid("prefill", reason));
        }
        self.check_window(n as usize)?;
        Ok(n)
    }

    /// A teacher-forced forward that autograd records, for calibration (`papers/wnw.txt`
    /// Appendix E): as [`Llama::prefill_embeds`] without a cache, with `key_offsets[l]`
    /// (`[kv_heads, span.len(), head_dim]`, zero leaves that require grad) added to layer
    /// `l`'s RoPE'd keys at `span` (so `∂L/∂key_offsets[l] = ∂L/∂K_span`); `probs(l, p)`
    /// sees each layer's attention probabilities `[q_heads, n, n]` (in the graph: detach
    /// what you keep). Returns logits `[n, vocab]`. Runs with grad mode on.
    ///
    /// # Errors
    /// [`crate::Error::InvalidInput`] for mis-shaped input, tables or offsets, a span outside
    /// the input or the wrong number of offsets; callback errors.
    pub fn forward_key_offsets(
        &self,
        h: &Tensor,
        tables: (Tensor, Tensor),
        span: Range<usize>,
        key_offsets: &[Tensor],
        probs: &mut dyn FnMut(usize, &Tensor) -> Result<()>,
    ) -> Result<Tensor> {
        self.check_embeds(h, &tables)?;
        if key_offsets.len() != self.blocks.len() {
            let reason =
                format!("{} key offsets for {} layers", key_offsets.len(), self.blocks.len());
            return Err(invalid("forward with key offsets", reason));
        }
        let local = self.local_tables(h.size()[0] as usize)?;
        tch::with_grad(|| {
            let mut h = h.to_kind(Kind::Float);
            for ((i, block), offset) in self.blocks.iter().enumerate().zip(key_offsets) {
                let x = block.input_norm.forward(&h)?;
                let rope = self.layer_tables(i, &tables, &local);
                let (attn_out, p) =
                    block.attn.prefill_key_offset(&x, rope.0, rope.1, span.clone(), offset)?;
                probs(i, &p)?;
                h = block.finish(&h, &attn_out, None)?;
            }
            linear::linear(&self.norm.forward(&h)?, &self.lm_head, None, "lm_head")
        })
    }

    /// Runs one token at `position` through every layer with `cache` (which must already
    /// hold positions `0..position`), then calls [`KvCache::end_step`]. Returns logits
    /// `[1, vocab]`. The step's matrix–vector products run on the cache's attention threads
    /// ([`KvCache::thread_pool`]), split by output rows; the logits do not depend on the
    /// number of threads.
    ///
    /// # Errors
    /// [`crate::Error::InvalidInput`] for an id out of range or a position past a sliding
    /// window; cache errors.
    pub fn decode(
        &self,
        id: u32,
        position: usize,
        cache: &mut dyn KvCache,
        scratch: &mut DecodeScratch,
    ) -> Result<Tensor> {
        self.check_ids(&[id])?;
        self.check_window(position + 1)?;
        self.check_cache_window(position, cache)?;
        let _guard = tch::no_grad_guard();
        let mut h = self.scale_embed(self.embed.f_narrow(0, i64::from(id), 1).op("embed")?)?;
        for (i, block) in self.blocks.iter().enumerate() {
            let x = block.input_norm.forward(&h)?;
            let rope = self.layer_rope(i);
            let attn_out = block.attn.decode(&x, rope, position, (i, &mut *cache), scratch)?;
            h = block.finish(&h, &attn_out, cache.thread_pool())?;
        }
        cache.end_step()?;
        let normed = self.norm.forward(&h)?;
        linear::linear_on(cache.thread_pool(), &normed, &self.lm_head, None, "lm_head")
    }
}

impl Llama {
    /// A fingerprint of the configuration and the weights, for checking that a persisted
    /// cache was computed by this model: `NAME config:CRC weights:CRC`, the first CRC-32
    /// over the configuration's debug text, the second over every tensor's shape and its
    /// first and last 2048 elements (a sample, so a 500 MB model is fingerprinted in
    /// milliseconds; any re-quantization or fine-tune changes the sampled values).
    ///
    /// # Errors
    /// [`crate::Error::Torch`] if a tensor cannot be read.
    pub fn fingerprint(&self) -> Result<String> {
        const SAMPLE: i64 = 2048;
        let config = crc32fast::hash(format!("{:?}", self.cfg).as_bytes());
        let mut tensors = vec![&self.embed, &self.lm_head, self.norm.weight()];
        for b in &self.blocks {
            tensors.extend(b.tensors());
        }
        let mut hasher = crc32fast::Hasher::new();
        for t in tensors {
            for dim in t.size() {
                hasher.update(&dim.to_le_bytes());
            }
            let flat = t.f_flatten(0, -1).op("fingerprint flatten")?;
            let n = flat.size()[0];
            let parts = if n <= 2 * SAMPLE {
                vec![flat]
            } else {
                let head = flat.f_narrow(0, 0, SAMPLE).op("fingerprint sample")?;
                vec![head, flat.f_narrow(0, n - SAMPLE, SAMPLE).op("fingerprint sample")?]
            };
            for part in parts {
                let part = part
                    .f_to_kind(tch::Kind::Float)
                    .and_then(|p| p.f_contiguous())
                    .op("fingerprint")?;
                hasher.update(bytemuck::cast_slice(&host::to_f32_vec(&part)?));
            }
        }
        Ok(format!("{} config:{config:08x} weights:{:08x}", self.cfg.name, hasher.finalize()))
    }

    /// Whether `other` computes with exactly the same weights (same configuration, and every
    /// tensor sharing storage with or equal to this model's) — the condition under which
    /// caches built for `other` may be served by [`Llama::decode_batch`] of this model.
    ///
    /// # Errors
    /// [`crate::Error::Torch`] if a comparison fails.
    pub fn same_weights(&self, other: &Llama) -> Result<bool> {
        if self.cfg != other.cfg || self.blocks.len() != other.blocks.len() {
            return Ok(false);
        }
        let mut pairs = vec![(&self.embed, &other.embed), (&self.lm_head, &other.lm_head)];
        pairs.push((self.norm.weight(), other.norm.weight()));
        for (a, b) in self.blocks.iter().zip(&other.blocks) {
            let (ta, tb) = (a.tensors(), b.tensors());
            if ta.len() != tb.len() {
                return Ok(false);
            }
            pairs.extend(ta.into_iter().zip(tb));
        }
        for (a, b) in pairs {
            if a.size() != b.size() {
                return Ok(false);
            }
            if a.data_ptr() != b.data_ptr() && !a.f_equal(b).op("compare weights")? {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// One decode step at `position` for several caches at once: `ids[b]` is fed to
    /// `caches[b]` (teacher forcing several cache configurations over one text, or over
    /// several texts of equal length). Every matmul runs once for the whole batch, so the
    /// weights are read once per step; each cache appends and attends its own row, so row
    /// `b` of the result equals [`Llama::decode`] of `ids[b]` with `caches[b]` up to matmul
    /// rounding. Calls [`KvCache::end_step`] on every cache and returns logits
    /// `[batch, vocab]`.
    ///
    /// Every cache must belong to this model (a SWAN cache to a model with its `P_VO`
    /// absorbed: check with [`Llama::same_weights`]) and hold positions `0..position`.
    ///
    /// # Errors
    /// [`crate::Error::InvalidInput`] for an id out of range, a position past a sliding
    /// window, a cache of another shape, or `ids`/`caches` that do not match the batch of
    /// `scratch`; cache errors.
    pub fn decode_batch(
        &self,
        ids: &[u32],
        position: usize,
        caches: &mut [&mut dyn KvCache],
        scratch: &mut BatchScratch,
    ) -> Result<Tensor> {
        self.check_ids(ids)?;
        self.check_window(position + 1)?;
        let want = crate::cache::CacheShape::of(&self.cfg)?;
        if let Some(c) = caches.iter().find(|c| c.shape() != want) {
            return Err(invalid(
                "batched decode",
                format!("cache shape {:?} does not match model {want:?}", c.shape()),
            ));
        }
        let batch = scratch.batch();
        if caches.len() != batch || ids.len() != batch {
            return Err(invalid(
                "batched decode",
                format!(
                    "{} caches and {} token ids for a scratch of batch {batch}",
                    caches.len(),
                    ids.len()
                ),
            ));
        }
        for cache in caches.iter() {
            self.check_cache_window(position, &**cache)?;
        }
        let _guard = tch::no_grad_guard();
        let index: Vec<i64> = ids.iter().map(|&id| i64::from(id)).collect();
        let index = Tensor::f_from_slice(&index).op("token ids")?;
        let mut h = self.scale_embed(self.embed.f_index_select(0, &index).op("embed")?)?;
        for (i, block) in self.blocks.iter().enumerate() {
            let x = block.input_norm.forward(&h)?;
            let rope = self.layer_rope(i);
            let attn_out =
                block.attn.decode_batch(&x, rope, position, (i, &mut *caches), scratch)?;
            h = block.finish(&h, &attn_out, None)?;
        }
        for (b, cache) in caches.iter_mut().enumerate() {
            let t = std::time::Instant::now();
            cache.end_step()?;
            scratch.add_cache_seconds(b, t.elapsed().as_secs_f64());
        }
        linear::linear_on(scratch.pool(), &self.norm.forward(&h)?, &self.lm_head, None, "lm_head")
    }
}

/// Hands one layer's prefill results to the cache: received span attention first, then K/V.
fn feed_cache(
    cache: &mut dyn KvCache,
    layer: usize,
    t: &AttentionTensors,
    received: Option<&Tensor>,
) -> Result<()> {
    if let Some(r) = received {
        let r = r.f_contiguous().op("contiguous")?;
        // SAFETY: `r` is the prefill's received-attention sums, read-only here; nothing
        // writes to it while the cache reads the slice.
        cache.prefill_attention(layer, unsafe { crate::llama::host::f32_slice(&r)? })?;
    }
    attention::prefill_cache(cache, layer, &t.k, &t.v)
}
