//! Grouped-query self-attention of a Llama/Qwen2 block.
//!
//! Prefill runs the whole prompt through libtorch (`softmax(QKᵀ/√d + causal mask)·V`,
//! q/k/v from one fused matmul, GQA served without repeating K/V; libtorch's fused
//! scaled-dot-product attention unless an observer asks for the probabilities) and hands
//! the RoPE'd K and V to the cache. Decode computes one token's q/k/v with libtorch, RoPEs them on
//! the host and lets the [`KvCache`] append and attend (`papers/swan.txt`, decode step);
//! the cache's output goes back through `W_O` without a copy ([`HostTensor`]). Gemma 3
//! layers add the per-head q/k norms before RoPE, their own softmax scale and, on local
//! layers, a sliding-window mask in prefill ([`crate::llama::gemma`]).

use std::ops::Range;

use attn_kernels::ThreadPool;
use tch::{Kind, Tensor};

use crate::cache::{AttentionRequest, KvCache, LayerKv, StepQkv};
use crate::error::{Result, TorchOp};
use crate::llama::gemma::{QkNorm, attention_mask};
use crate::llama::host::{HostTensor, f32_slice};
use crate::llama::linear::{linear, linear_on};
use crate::llama::rope::Rope;
use crate::load::config::ModelConfig;
use crate::load::weights::Weights;

/// One layer's prefill attention tensors, for observers (calibration, traces).
pub struct AttentionTensors {
    /// RoPE'd queries `[q_heads, tokens, head_dim]`.
    pub q: Tensor,
    /// RoPE'd keys `[kv_heads, tokens, head_dim]`.
    pub k: Tensor,
    /// Values `[kv_heads, tokens, head_dim]`.
    pub v: Tensor,
    /// Per-head attention outputs before `W_O`, `[q_heads, tokens, head_dim]`.
    pub o: Tensor,
}

/// Host buffers one decode step reuses (allocated once per session).
pub struct DecodeScratch {
    q: Vec<f32>,
    k: Vec<f32>,
    out: HostTensor,
}

impl DecodeScratch {
    /// Buffers for a model of this configuration.
    ///
    /// # Errors
    /// [`crate::Error::Torch`] if libtorch cannot allocate the output tensor.
    pub fn new(cfg: &ModelConfig) -> Result<Self> {
        let d = cfg.head_dim;
        Ok(Self {
            q: vec![0.0; cfg.q_heads * d],
            k: vec![0.0; cfg.kv_heads * d],
            out: HostTensor::zeros(&[1, (cfg.q_heads * d) as i64])?,
        })
    }
}

/// Host buffers a batched decode step reuses ([`crate::llama::Llama::decode_batch`]): one
/// query/key row per worker for the member it is serving, the `[batch, q_heads·head_dim]`
/// attention outputs every member's cache writes into, the seconds each member's cache
/// spent, and a pool of libtorch's intra-op thread count for the output layer. Nothing is
/// allocated per step.
pub struct BatchScratch {
    /// `[workers][q_heads·head_dim]`.
    q: Vec<f32>,
    /// `[workers][kv_heads·head_dim]`.
    k: Vec<f32>,
    out: HostTensor,
    cache_s: Vec<f64>,
    workers: usize,
    pool: Option<ThreadPool>,
}

impl BatchScratch {
    /// Buffers for `batch` caches served by a model of this configuration.
    ///
    /// # Errors
    /// [`crate::Error::InvalidInput`] for an empty batch; [`crate::Error::Torch`] if
    /// libtorch cannot allocate the output tensor; [`crate::Error::Attention`] if the
    /// output layer's threads cannot be started.
    pub fn new(cfg: &ModelConfig, batch: usize) -> Result<Self> {
        if batch == 0 {
            return Err(crate::error::invalid("batched decode scratch", "batch of 0 caches"));
        }
        let d = cfg.head_dim;
        Ok(Self {
            q: vec![0.0; cfg.q_heads * d],
            k: vec![0.0; cfg.kv_heads * d],
            out: HostTensor::zeros(&[batch as i64, (cfg.q_heads * d) as i64])?,
            cache_s: vec![0.0; batch],
            workers: 1,
            pool: match usize::try_from(tch::get_num_threads()) {
                Ok(threads) if threads > 1 => Some(ThreadPool::new(threads)?),
                _ => None,
            },
        })
    }

    /// Serves the members' caches from up to `workers` threads per layer (at least 1, at
    /// most the batch), each thread a contiguous run of members. Meant for caches that
    /// attend on one thread each (`threads=1` in their spec): the batch, not each cache,
    /// is then split across the cores. Results are the same for any worker count; with more
    /// than one, [`BatchScratch::cache_seconds`] is each member's own time on its thread.
    #[must_use]
    pub fn with_workers(mut self, workers: usize) -> Self {
        let (qn, kn) = (self.q.len() / self.workers, self.k.len() / self.workers);
        self.workers = workers.clamp(1, self.cache_s.len());
        self.q.resize(qn * self.workers, 0.0);
        self.k.resize(kn * self.workers, 0.0);
        self
    }

    /// The output layer's threads: as many as libtorch's intra-op threads when the scratch
    /// was made, `None` for one ([`crate::llama::linear::linear_on`]).
    pub fn pool(&self) -> Option<&ThreadPool> {
        self.pool.as_ref()
    }

    /// Threads the members' caches are served from ([`BatchScratch::with_workers`]).
    pub fn workers(&self) -> usize {
        self.workers
    }

    /// Caches served per step.
    pub fn batch(&self) -> usize {
        self.cache_s.len()
    }

    /// Seconds each member's cache has spent in [`KvCache::decode`] and
    /// [`KvCache::end_step`] since the scratch was made (the attention share of a step;
    /// the rest of the step is the model's, shared by the whole batch).
    pub fn cache_seconds(&self) -> &[f64] {
        &self.cache_s
    }

    pub(crate) fn add_cache_seconds(&mut self, member: usize, seconds: f64) {
        self.cache_s[member] += seconds;
    }
}

/// Self-attention weights of one layer.
pub struct Attention {
    qkv: Tensor,
    qkv_bias: Option<Tensor>,
    o: Tensor,
    o_bias: Option<Tensor>,
    qk_norm: Option<QkNorm>,
    scale: f64,
    window: Option<usize>,
    q_heads: i64,
    kv_heads: i64,
    head_dim: i64,
}

/// Clones share the (immutable) weight storage.
impl Clone for Attention {
    fn clone(&self) -> Self {
        Self {
            qkv: self.qkv.shallow_clone(),
            qkv_bias: self.qkv_bias.as_ref().map(Tensor::shallow_clone),
            o: self.o.shallow_clone(),
            o_bias: self.o_bias.as_ref().map(Tensor::shallow_clone),
            qk_norm: self.qk_norm.clone(),
            ..*self
        }
    }
}

impl Attention {
    /// Loads `{prefix}.{q,k,v,o}_proj` (and their biases where the config has them; Gemma
    /// 3's `q_norm`/`k_norm`). The layer attends to every earlier position until
    /// [`Attention::with_window`] narrows it.
    ///
    /// # Errors
    /// Missing or mis-shaped weights.
    pub fn load(w: &Weights<'_>, cfg: &ModelConfig, prefix: &str) -> Result<Self> {
        let (h, d) = (cfg.hidden_size, cfg.head_dim);
        let rows = [("q", cfg.q_heads * d), ("k", cfg.kv_heads * d), ("v", cfg.kv_heads * d)];
        let mut weights = Vec::with_capacity(3);
        let mut biases = Vec::with_capacity(3);
        for (name, n) in rows {
            weights.push(w.get(&format!("{prefix}.{name}_proj.weight"), &[n, h])?);
            if cfg.qkv_bias {
                biases.push(w.get(&format!("{prefix}.{name}_proj.bias"), &[n])?);
            }
        }
        let o = w.get(&format!("{prefix}.o_proj.weight"), &[h, cfg.q_heads * d])?;
        let o_bias =
            if cfg.o_bias { Some(w.get(&format!("{prefix}.o_proj.bias"), &[h])?) } else { None };
        let qkv_bias = if biases.is_empty() {
            None
        } else {
            Some(Tensor::f_cat(&biases, 0).op("cat qkv bias")?)
        };
        Ok(Self {
            qkv: Tensor::f_cat(&weights, 0).op("cat qkv")?,
            qkv_bias,
            o,
            o_bias,
            qk_norm: QkNorm::load(w, cfg, prefix)?,
            scale: cfg.attention_scale(),
            window: None,
            q_heads: cfg.q_heads as i64,
            kv_heads: cfg.kv_heads as i64,
            head_dim: d as i64,
        })
    }

    /// The same layer seeing only the last `window` positions in prefill (a local layer;
    /// in decode the cache keeps the window).
    pub fn with_window(self, window: Option<usize>) -> Self {
        Self { window, ..self }
    }

    /// The positions a query sees (`None`: all earlier ones).
    pub fn window(&self) -> Option<usize> {
        self.window
    }

    /// Every weight tensor of the layer (for [`crate::llama::Llama::same_weights`]).
    pub(crate) fn tensors(&self) -> Vec<&Tensor> {
        let mut t = vec![&self.qkv, &self.o];
        t.extend(self.qkv_bias.iter().chain(&self.o_bias));
        if let Some(n) = &self.qk_norm {
            t.extend(n.weights());
        }
        t
    }

    fn v_rows(&self) -> (i64, i64) {
        ((self.q_heads + self.kv_heads) * self.head_dim, self.kv_heads * self.head_dim)
    }

    /// `W_V` (`[kv_heads·head_dim, hidden]`, a view) and its bias.
    ///
    /// # Errors
    /// [`crate::Error::Torch`] if slicing fails.
    pub fn v_proj(&self) -> Result<(Tensor, Option<Tensor>)> {
        let (start, len) = self.v_rows();
        let b = match &self.qkv_bias {
            Some(b) => Some(b.f_narrow(0, start, len).op("narrow v bias")?),
            None => None,
        };
        Ok((self.qkv.f_narrow(0, start, len).op("narrow v")?, b))
    }

    /// `W_O` (`[hidden, q_heads·head_dim]`).
    pub fn o_proj(&self) -> &Tensor {
        &self.o
    }

    /// The same layer with `W_V` (and bias) and `W_O` replaced — SWAN's absorption of
    /// `P_VO` (`papers/swan.txt`: `Ŵ_V = W_V·P_VO`, `Ŵ_O` slices premultiplied by `P_VOᵀ`).
    ///
    /// # Errors
    /// [`crate::Error::Torch`] if the new weights do not have the old shapes.
    pub fn with_vo(&self, v: &Tensor, v_bias: Option<&Tensor>, o: Tensor) -> Result<Self> {
        let (start, _) = self.v_rows();
        let qk = self.qkv.f_narrow(0, 0, start).op("narrow qk")?;
        let qkv_bias = match (&self.qkv_bias, v_bias) {
            (Some(b), Some(vb)) => Some(
                Tensor::f_cat(&[&b.f_narrow(0, 0, start).op("narrow qk bias")?, vb], 0)
                    .op("cat bias")?,
            ),
            _ => None,
        };
        if o.size() != self.o.size() {
            return Err(crate::error::invalid(
                "absorb W_O",
                format!("shape {:?}, expected {:?}", o.size(), self.o.size()),
            ));
        }
        Ok(Self {
            qkv: Tensor::f_cat(&[&qk, v], 0).op("cat qkv")?,
            qkv_bias,
            o,
            o_bias: self.o_bias.as_ref().map(Tensor::shallow_clone),
            qk_norm: self.qk_norm.clone(),
            ..*self
        })
    }

    /// q, k, v of `x` (`[tokens, hidden]`) as `[heads, tokens, head_dim]`, q and k RoPE'd.
    fn heads(
        &self,
        x: &Tensor,
        rope: &Rope,
        cos: &Tensor,
        sin: &Tensor,
    ) -> Result<(Tensor, Tensor, Tensor)> {
        let t = x.size()[0];
        let qkv = linear(x, &self.qkv, self.qkv_bias.as_ref(), "qkv proj")?;
        let (nq, nkv, d) = (self.q_heads, self.kv_heads, self.head_dim);
        let part = |start: i64, heads: i64| -> Result<Tensor> {
            qkv.f_narrow(1, start * d, heads * d)
                .op("split qkv")?
                .f_reshape([t, heads, d])
                .op("reshape heads")
        };
        let (q, k) = match &self.qk_norm {
            Some(n) => (n.q(&part(0, nq)?)?, n.k(&part(nq, nkv)?)?),
            None => (part(0, nq)?, part(nq, nkv)?),
        };
        let q = rope.apply(&q, cos, sin)?;
        let k = rope.apply(&k, cos, sin)?;
        let v = part(nq + nkv, nkv)?;
        let to_heads =
            |x: Tensor| x.f_transpose(0, 1).op("transpose")?.f_contiguous().op("contiguous");
        Ok((to_heads(q)?, to_heads(k)?, to_heads(v)?))
    }

    /// Causal attention probabilities `[q_heads, tokens, tokens]`; each group of q-heads is
    /// multiplied against its kv-head without repeating K.
    fn probs(&self, q: &Tensor, k: &Tensor) -> Result<Tensor> {
        let t = q.size()[1];
        let (nq, nkv, d) = (self.q_heads, self.kv_heads, self.head_dim);
        let grouped = q.f_reshape([nkv, (nq / nkv) * t, d]).op("group q")?;
        let scores = grouped.f_matmul(&k.f_transpose(1, 2).op("kT")?).op("q·kT")?;
        let scores =
            scores.f_reshape([nq, t, t]).op("scores")?.f_mul_scalar(self.scale).op("scale")?;
        let mask = attention_mask(t, self.window)?;
        scores
            .f_masked_fill(&mask, f64::NEG_INFINITY)
            .op("mask fill")?
            .f_softmax(-1, Kind::Float)
            .op("softmax")
    }

    /// Per-head outputs `[q_heads, tokens, head_dim]` of causal attention (within the
    /// layer's window) without materialising the probabilities: libtorch's fused
    /// scaled-dot-product attention, GQA served without repeating K/V. The same values as
    /// `context(probs(q, k), v)` up to f32 rounding, in O(tokens) memory per head instead of
    /// O(tokens²) (a 2k-token prompt's score matrices are ~140 MB per layer, allocated and
    /// page-faulted afresh by every layer).
    fn fused(&self, q: &Tensor, k: &Tensor, v: &Tensor) -> Result<Tensor> {
        let t = q.size()[1];
        let windowed = self.window.is_some_and(|w| (w as i64) < t);
        let mask = if windowed {
            Some(attention_mask(t, self.window)?.f_logical_not().op("attend mask")?)
        } else {
            None
        };
        let (q, k, v) = (q.f_unsqueeze(0), k.f_unsqueeze(0), v.f_unsqueeze(0));
        let (q, k, v) = (q.op("batch q")?, k.op("batch k")?, v.op("batch v")?);
        Tensor::f_scaled_dot_product_attention(&q, &k, &v, mask, 0.0, !windowed, self.scale, true)
            .op("fused attention")?
            .f_squeeze_dim(0)
            .op("unbatch")
    }

    /// Per-head outputs `[q_heads, tokens, head_dim]` of `probs · V`.
    fn context(&self, probs: &Tensor, v: &Tensor) -> Result<Tensor> {
        let t = probs.size()[1];
        let (nq, nkv, d) = (self.q_heads, self.kv_heads, self.head_dim);
        let grouped = probs.f_reshape([nkv, (nq / nkv) * t, t]).op("group probs")?;
        grouped.f_matmul(v).op("probs·V")?.f_reshape([nq, t, d]).op("context")
    }

    /// `W_O` applied to per-head outputs laid out `[tokens, q_heads·head_dim]`.
    /// A one-row product runs on `pool`'s threads (see [`linear_on`]).
    fn output(&self, o: &Tensor, pool: Option<&ThreadPool>) -> Result<Tensor> {
        linear_on(pool, o, &self.o, self.o_bias.as_ref(), "o proj")
    }

    /// Full causal attention over `x` (`[tokens, hidden]`): returns the layer output
    /// (`[tokens, hidden]`) and the tensors observers see. With `request`, also the
    /// attention each q-head paid from the requested rows to the requested keys, summed over
    /// the rows (`[q_heads, keys]`).
    ///
    /// # Errors
    /// [`crate::Error::Torch`] on shape errors.
    pub fn prefill(
        &self,
        x: &Tensor,
        rope: &Rope,
        (cos, sin): (&Tensor, &Tensor),
        request: Option<&AttentionRequest>,
    ) -> Result<(Tensor, AttentionTensors, Option<Tensor>)> {
        let (q, k, v) = self.heads(x, rope, cos, sin)?;
        let (o, received) = match request {
            Some(r) => {
                let probs = self.probs(&q, &k)?;
                (self.context(&probs, &v)?, Some(received(&probs, r)?))
            }
            None => (self.fused(&q, &k, &v)?, None),
        };
        Ok((self.merge_heads(&o)?, AttentionTensors { q, k, v, o }, received))
    }

    /// Differentiable prefill for calibration (`papers/wnw.txt` Appendix E, Eq. 4): full
    /// causal attention over `x` with `key_offset` (`[kv_heads, span.len(), head_dim]`,
    /// typically a zero leaf that requires grad) added to the RoPE'd keys at the positions
    /// `span`, so that `∂L/∂key_offset = ∂L/∂K_span`. Returns the layer output and the
    /// attention probabilities `[q_heads, tokens, tokens]`, both part of the autograd graph.
    /// Call with grad mode on.
    ///
    /// # Errors
    /// [`crate::Error::InvalidInput`] if `span` is not inside the input or the offset is
    /// mis-shaped; [`crate::Error::Torch`] on shape errors.
    pub fn prefill_key_offset(
        &self,
        x: &Tensor,
        rope: &Rope,
        (cos, sin): (&Tensor, &Tensor),
        span: Range<usize>,
        key_offset: &Tensor,
    ) -> Result<(Tensor, Tensor)> {
        let t = x.size()[0];
        let want = [self.kv_heads, span.len() as i64, self.head_dim];
        if span.end as i64 > t || span.is_empty() || key_offset.size() != want {
            return Err(crate::error::invalid(
                "prefill with key offsets",
                format!(
                    "offset {:?} at {span:?} of {t} tokens, expected {want:?}",
                    key_offset.size()
                ),
            ));
        }
        let (q, k, v) = self.heads(x, rope, cos, sin)?;
        let pad = [0, 0, span.start as i64, t - span.end as i64];
        let k =
            k.f_add(&key_offset.f_constant_pad_nd(pad).op("pad key offset")?).op("key offset")?;
        let probs = self.probs(&q, &k)?;
        let o = self.context(&probs, &v)?;
        Ok((self.merge_heads(&o)?, probs))
    }

    /// `W_O` applied to per-head outputs `[q_heads, tokens, head_dim]`.
    fn merge_heads(&self, o: &Tensor) -> Result<Tensor> {
        let t = o.size()[1];
        let flat = o
            .f_transpose(0, 1)
            .op("transpose")?
            .f_reshape([t, self.q_heads * self.head_dim])
            .op("flatten")?;
        self.output(&flat, None)
    }

    /// The fused `q|k|v` rows `[batch, (q_heads + 2·kv_heads)·head_dim]` of decode input
    /// `x` (`[batch, hidden]`), q and k normalised per head where the layer has QK-norm;
    /// contiguous, so the host can read them. A one-row product runs on `pool`'s threads.
    fn decode_qkv(&self, x: &Tensor, pool: Option<&ThreadPool>) -> Result<Tensor> {
        let qkv = linear_on(pool, x, &self.qkv, self.qkv_bias.as_ref(), "qkv proj")?;
        let Some(norm) = &self.qk_norm else { return Ok(qkv) };
        let (b, nq, nkv, d) = (qkv.size()[0], self.q_heads, self.kv_heads, self.head_dim);
        let part = |start: i64, heads: i64| -> Result<Tensor> {
            qkv.f_narrow(1, start * d, heads * d)
                .op("split qkv")?
                .f_reshape([b, heads, d])
                .op("heads")
        };
        let q = norm.q(&part(0, nq)?)?.f_reshape([b, nq * d]).op("flatten q")?;
        let k = norm.k(&part(nq, nkv)?)?.f_reshape([b, nkv * d]).op("flatten k")?;
        let v = qkv.f_narrow(1, (nq + nkv) * d, nkv * d).op("split v")?;
        Tensor::f_cat(&[q, k, v], 1).op("cat qkv")?.f_contiguous().op("contiguous")
    }

    /// One decode step for `x` (`[1, hidden]`) at `position`: q/k/v by libtorch, RoPE on the
    /// host, append + attention by `cache`, `W_O` by libtorch.
    ///
    /// # Errors
    /// Cache errors; [`crate::Error::Torch`] on shape errors.
    pub fn decode(
        &self,
        x: &Tensor,
        rope: &Rope,
        position: usize,
        (layer, cache): (usize, &mut dyn KvCache),
        scratch: &mut DecodeScratch,
    ) -> Result<Tensor> {
        let qkv = self.decode_qkv(x, cache.thread_pool())?;
        let DecodeScratch { q, k, out } = scratch;
        // SAFETY: `qkv` is the fresh result of the linear above, held only here; nothing
        // writes to it while the row is borrowed.
        let row = unsafe { f32_slice(&qkv)? };
        attend_row(row, (q, k), rope, position, (layer, &mut *cache), out.as_mut_slice())?;
        self.output(scratch.out.tensor(), cache.thread_pool())
    }
}

impl Attention {
    /// One decode step of several caches at once: `x` is `[batch, hidden]` (row `b` the
    /// layer input of `caches[b]`'s sequence); q/k/v and `W_O` are one libtorch matmul for
    /// the whole batch, each member's cache appends and attends its own row. Equivalent row
    /// by row to [`Attention::decode`], with the weight matrices read once per step instead
    /// of once per cache.
    ///
    /// # Errors
    /// [`crate::Error::InvalidInput`] if `x`, `caches` and `scratch` disagree on the batch
    /// size; cache errors; [`crate::Error::Torch`] on shape errors.
    pub fn decode_batch(
        &self,
        x: &Tensor,
        rope: &Rope,
        position: usize,
        (layer, caches): (usize, &mut [&mut dyn KvCache]),
        scratch: &mut BatchScratch,
    ) -> Result<Tensor> {
        let batch = scratch.batch();
        if caches.len() != batch || x.size().first() != Some(&(batch as i64)) {
            return Err(crate::error::invalid(
                "batched decode",
                format!(
                    "{} caches and input {:?} for a scratch of batch {batch}",
                    caches.len(),
                    x.size()
                ),
            ));
        }
        let qkv = self.decode_qkv(x, None)?;
        // SAFETY: `qkv` is the fresh result of the linear above, held only here; nothing
        // writes to it while the rows are borrowed.
        let rows = unsafe { f32_slice(&qkv)? };
        let width = rows.len() / batch;
        let BatchScratch { q, k, out, cache_s, workers, .. } = scratch;
        let out_rows = out.as_mut_slice();
        let out_width = out_rows.len() / batch;
        let serve = |(q, k): (&mut [f32], &mut [f32]),
                     caches: &mut [&mut dyn KvCache],
                     rows: &[f32],
                     out_rows: &mut [f32],
                     cache_s: &mut [f64]|
         -> Result<()> {
            let members = caches.iter_mut().zip(rows.chunks_exact(width));
            for ((cache, row), (out_row, s)) in
                members.zip(out_rows.chunks_exact_mut(out_width).zip(cache_s.iter_mut()))
            {
                let t = std::time::Instant::now();
                attend_row(
                    row,
                    (&mut *q, &mut *k),
                    rope,
                    position,
                    (layer, &mut **cache),
                    out_row,
                )?;
                *s += t.elapsed().as_secs_f64();
            }
            Ok(())
        };
        let (qn, kn) = (q.len() / *workers, k.len() / *workers);
        if *workers <= 1 {
            serve((q, k), caches, rows, out_rows, cache_s)?;
        } else {
            let per = batch.div_ceil(*workers);
            std::thread::scope(|scope| {
                let parts = caches
                    .chunks_mut(per)
                    .zip(rows.chunks(per * width))
                    .zip(out_rows.chunks_mut(per * out_width).zip(cache_s.chunks_mut(per)))
                    .zip(q.chunks_exact_mut(qn).zip(k.chunks_exact_mut(kn)));
                let handles: Vec<_> = parts
                    .map(|(((c, r), (o, s)), qk)| scope.spawn(move || serve(qk, c, r, o, s)))
                    .collect();
                handles
                    .into_iter()
                    .try_for_each(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            })?;
        }
        self.output(out.tensor(), None)
    }
}

/// The host part of one decode step for one cache: splits a fused `q|k|v` row, RoPEs q and
/// k at `position` (into the `q`/`k` buffers), and lets `cache` append and attend into `out`.
fn attend_row(
    row: &[f32],
    (q, k): (&mut [f32], &mut [f32]),
    rope: &Rope,
    position: usize,
    (layer, cache): (usize, &mut dyn KvCache),
    out: &mut [f32],
) -> Result<()> {
    let (nq, nkv) = (q.len(), k.len());
    q.copy_from_slice(&row[..nq]);
    k.copy_from_slice(&row[nq..nq + nkv]);
    rope.apply_rows(q, position);
    rope.apply_rows(k, position);
    cache.decode(layer, StepQkv { q, k, v: &row[nq + nkv..] }, out)
}

/// `[q_heads, keys]`: attention paid to `request.keys` by `request.queries`, summed.
fn received(probs: &Tensor, request: &AttentionRequest) -> Result<Tensor> {
    let t = probs.size()[1] as usize;
    let clamp = |r: &Range<usize>| (r.start.min(t) as i64, r.end.clamp(r.start.min(t), t) as i64);
    let ((k0, k1), (q0, q1)) = (clamp(&request.keys), clamp(&request.queries));
    let rows = probs.f_narrow(1, q0, q1 - q0).op("request rows")?;
    rows.f_narrow(2, k0, k1 - k0)
        .op("request cols")?
        .f_sum_dim_intlist(&[1i64][..], false, Kind::Float)
        .op("request sum")
}

/// Splits `[kv_heads, tokens, head_dim]` K and V into the cache's prefill block.
pub(crate) fn prefill_cache(
    cache: &mut dyn KvCache,
    layer: usize,
    k: &Tensor,
    v: &Tensor,
) -> Result<()> {
    let tokens = k.size()[1] as usize;
    // SAFETY: `k` and `v` are the prefill's contiguous K/V, borrowed read-only for the call;
    // no handle writes to them while the cache copies them in.
    let (keys, values) = unsafe { (f32_slice(k)?, f32_slice(v)?) };
    cache.prefill(layer, LayerKv { keys, values, tokens })
}
