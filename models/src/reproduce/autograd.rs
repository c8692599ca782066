//! A differentiable Llama forward for the signals the decode path cannot give: the full
//! causal attention probabilities of a teacher-forced sequence (WnW Figure 1's prefill vs
//! decode-cumulative attention; the voice score's top-K attended positions, Appendix E
//! Eq. 3) and gradients of the answer-token loss with respect to each head's span keys (head
//! sensitivity, Eq. 4–5).
//!
//! [`crate::Llama`] runs under `no_grad` and owns its weights privately, so this module
//! loads its own copy from the same [`WeightSource`] and re-states the block with plain
//! libtorch ops (reusing [`RmsNorm`], [`Mlp`] and [`Rope`]): embeddings → per layer
//! `RMSNorm → q,k,v → RoPE → (+ key offset) → softmax(qkᵀ/√d + causal) v → W_O`, residual,
//! `RMSNorm → MLP`, residual → final norm → LM head. The key offset is a zero leaf tensor
//! that requires grad, so `∂L/∂offset = ∂L/∂K`. Teacher forcing through the full cache
//! computes exactly these attention weights, so one forward stands for the whole decode.

use tch::{Device, Kind, Tensor};

use crate::config::ModelConfig;
use crate::error::{Result, TorchOp};
use crate::llama::{Mlp, RmsNorm};
use crate::rope::Rope;
use crate::weights::{WeightSource, Weights};

/// Sees each layer's attention probabilities `[q_heads, T, T]` (detached).
pub trait AttentionTap {
    /// One layer's probabilities.
    ///
    /// # Errors
    /// Implementations may fail; the forward stops with their error.
    fn probs(&mut self, layer: usize, probs: &Tensor) -> Result<()>;
}

/// A tap that ignores everything.
pub struct NoTap;

impl AttentionTap for NoTap {
    fn probs(&mut self, _: usize, _: &Tensor) -> Result<()> {
        Ok(())
    }
}

struct Projection {
    weight: Tensor,
    bias: Option<Tensor>,
}

impl Projection {
    fn load(w: &Weights<'_>, name: &str, shape: [usize; 2], bias: bool) -> Result<Self> {
        let b = if bias { Some(w.get(&format!("{name}.bias"), &shape[..1])?) } else { None };
        Ok(Self { weight: w.get(&format!("{name}.weight"), &shape)?, bias: b })
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        x.f_linear(&self.weight, self.bias.as_ref()).op("linear")
    }
}

struct Layer {
    input_norm: RmsNorm,
    q: Projection,
    k: Projection,
    v: Projection,
    o: Projection,
    post_norm: RmsNorm,
    mlp: Mlp,
}

/// The differentiable twin of [`crate::Llama`] (f32, CPU).
pub struct GradModel {
    cfg: ModelConfig,
    embed: Tensor,
    layers: Vec<Layer>,
    norm: RmsNorm,
    lm_head: Tensor,
    rope: Rope,
}

impl GradModel {
    /// Loads every weight from `src` (HF names) as f32.
    ///
    /// # Errors
    /// Missing or mis-shaped weights; the source's load errors.
    pub fn load(src: &dyn WeightSource, cfg: &ModelConfig) -> Result<Self> {
        cfg.validate()?;
        let w = Weights::new(src, Kind::Float);
        let (h, d) = (cfg.hidden_size, cfg.head_dim);
        let embed = w.get("model.embed_tokens.weight", &[cfg.vocab_size, h])?;
        let lm_head = match w.get_opt("lm_head.weight", &[cfg.vocab_size, h])? {
            Some(t) if !cfg.tie_word_embeddings => t,
            _ => embed.shallow_clone(),
        };
        let mut layers = Vec::with_capacity(cfg.num_layers);
        for i in 0..cfg.num_layers {
            let p = format!("model.layers.{i}");
            let a = format!("{p}.self_attn");
            layers.push(Layer {
                input_norm: RmsNorm::load(
                    &w,
                    &format!("{p}.input_layernorm"),
                    h,
                    cfg.rms_norm_eps,
                )?,
                q: Projection::load(
                    &w,
                    &format!("{a}.q_proj"),
                    [cfg.num_heads * d, h],
                    cfg.qkv_bias,
                )?,
                k: Projection::load(
                    &w,
                    &format!("{a}.k_proj"),
                    [cfg.num_kv_heads * d, h],
                    cfg.qkv_bias,
                )?,
                v: Projection::load(
                    &w,
                    &format!("{a}.v_proj"),
                    [cfg.num_kv_heads * d, h],
                    cfg.qkv_bias,
                )?,
                o: Projection::load(
                    &w,
                    &format!("{a}.o_proj"),
                    [h, cfg.num_heads * d],
                    cfg.o_bias,
                )?,
                post_norm: RmsNorm::load(
                    &w,
                    &format!("{p}.post_attention_layernorm"),
                    h,
                    cfg.rms_norm_eps,
                )?,
                mlp: Mlp::load(&w, cfg, &format!("{p}.mlp"))?,
            });
        }
        let norm = RmsNorm::load(&w, "model.norm", h, cfg.rms_norm_eps)?;
        Ok(Self { cfg: cfg.clone(), embed, layers, norm, lm_head, rope: Rope::new(&cfg.rope, d) })
    }

    /// The configuration.
    pub fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    /// Zero key offsets `[kv_heads, tokens, head_dim]` per layer that require grad.
    ///
    /// # Errors
    /// [`crate::Error::Torch`] if libtorch cannot allocate them.
    pub fn key_offsets(&self, tokens: usize) -> Result<Vec<Tensor>> {
        let shape = [self.cfg.num_kv_heads as i64, tokens as i64, self.cfg.head_dim as i64];
        (0..self.cfg.num_layers)
            .map(|_| {
                Tensor::f_zeros(shape, (Kind::Float, Device::Cpu))
                    .op("zeros")?
                    .f_set_requires_grad(true)
                    .op("requires_grad")
            })
            .collect()
    }

    /// Logits `[T, vocab]` of `ids` (positions `0..T`), with `offsets[l]` added to layer
    /// `l`'s RoPE'd keys when given; `tap` sees each layer's probabilities. Call under
    /// `tch::no_grad_guard()` unless gradients are wanted.
    ///
    /// # Errors
    /// [`crate::Error::InvalidInput`] for empty input, ids out of range or offsets of the
    /// wrong count; tap and libtorch errors.
    pub fn forward(
        &self,
        ids: &[u32],
        offsets: Option<&[Tensor]>,
        tap: &mut dyn AttentionTap,
    ) -> Result<Tensor> {
        if ids.is_empty() || ids.iter().any(|&i| i as usize >= self.cfg.vocab_size) {
            return Err(crate::error::invalid("grad forward", "empty input or id out of range"));
        }
        if offsets.is_some_and(|o| o.len() != self.layers.len()) {
            return Err(crate::error::invalid("grad forward", "one key offset per layer"));
        }
        let idx: Vec<i64> = ids.iter().map(|&i| i64::from(i)).collect();
        let mut h =
            self.embed.f_index_select(0, &Tensor::f_from_slice(&idx).op("ids")?).op("embed")?;
        let (cos, sin) = self.rope.tables(0, ids.len())?;
        let mask = Tensor::f_ones([ids.len() as i64; 2], (Kind::Bool, Device::Cpu))
            .op("mask")?
            .f_triu(1)
            .op("triu")?;
        for (l, layer) in self.layers.iter().enumerate() {
            let x = layer.input_norm.forward(&h)?;
            let offset = offsets.map(|o| &o[l]);
            let attn = self.attention(layer, &x, (&cos, &sin), &mask, offset, (l, tap))?;
            h = h.f_add(&attn).op("residual")?;
            let m = layer.mlp.forward(&layer.post_norm.forward(&h)?)?;
            h = h.f_add(&m).op("residual")?;
        }
        self.norm.forward(&h)?.f_linear(&self.lm_head, None::<Tensor>).op("lm_head")
    }

    /// `[heads, T, d]` of a projection of `x`, RoPE'd when `rope`.
    fn heads(
        &self,
        p: &Projection,
        x: &Tensor,
        heads: usize,
        rope: Option<(&Tensor, &Tensor)>,
    ) -> Result<Tensor> {
        let t = x.size()[0];
        let y = p.forward(x)?.f_reshape([t, heads as i64, self.cfg.head_dim as i64]).op("heads")?;
        let y = match rope {
            Some((cos, sin)) => self.rope.apply(&y, cos, sin)?,
            None => y,
        };
        y.f_transpose(0, 1).op("transpose")
    }

    fn attention(
        &self,
        layer: &Layer,
        x: &Tensor,
        tables: (&Tensor, &Tensor),
        mask: &Tensor,
        offset: Option<&Tensor>,
        (l, tap): (usize, &mut dyn AttentionTap),
    ) -> Result<Tensor> {
        let (nq, nkv, d) =
            (self.cfg.num_heads as i64, self.cfg.num_kv_heads as i64, self.cfg.head_dim as i64);
        let t = x.size()[0];
        let q = self.heads(&layer.q, x, nq as usize, Some(tables))?;
        let mut k = self.heads(&layer.k, x, nkv as usize, Some(tables))?;
        if let Some(o) = offset {
            k = k.f_add(o).op("key offset")?;
        }
        let v = self.heads(&layer.v, x, nkv as usize, None)?;
        let grouped = q.f_reshape([nkv, (nq / nkv) * t, d]).op("group q")?;
        let scores = grouped
            .f_matmul(&k.f_transpose(1, 2).op("kT")?)
            .op("q·kT")?
            .f_reshape([nq, t, t])
            .op("scores")?;
        let probs = scores
            .f_mul_scalar(1.0 / (d as f64).sqrt())
            .op("scale")?
            .f_masked_fill(mask, f64::NEG_INFINITY)
            .op("mask")?
            .f_softmax(-1, Kind::Float)
            .op("softmax")?;
        tap.probs(l, &probs.f_detach().op("detach")?)?;
        let ctx = probs
            .f_reshape([nkv, (nq / nkv) * t, t])
            .op("group probs")?
            .f_matmul(&v)
            .op("probs·V")?;
        let flat = ctx
            .f_reshape([nq, t, d])
            .op("ctx")?
            .f_transpose(0, 1)
            .op("transpose")?
            .f_reshape([t, nq * d])
            .op("flatten")?;
        layer.o.forward(&flat)
    }
}
