//! A Llama decoder's weights and per-token math in plain Rust: RMSNorm, linear layers
//! (Hugging Face `[out, in]` layout), rotate-half RoPE and the SiLU-gated MLP. Loading folds
//! SWAN's `P_VO` into `W_V` and `W_O` (SWAN §4, Lemma 2) with `projection`, so the cache
//! holds values in the rotated basis and the attention output goes straight into `Ŵ_O`.

use std::path::Path;

use projection::ProjectionSet;

use crate::config::LlamaConfig;
use crate::error::Result;
use crate::weights::Weights;

/// One decoder layer's weights (`W_V`, `W_O` with `P_VO` absorbed).
#[derive(Clone, Debug)]
pub struct Layer {
    pub(crate) attn_norm: Vec<f32>,
    pub(crate) wq: Vec<f32>,
    pub(crate) wk: Vec<f32>,
    pub(crate) wv: Vec<f32>,
    pub(crate) wo: Vec<f32>,
    pub(crate) mlp_norm: Vec<f32>,
    pub(crate) w_gate: Vec<f32>,
    pub(crate) w_up: Vec<f32>,
    pub(crate) w_down: Vec<f32>,
}

/// A Llama checkpoint ready to decode with a [`ProjectionSet`].
#[derive(Clone, Debug)]
pub struct Llama {
    /// The checkpoint's shape.
    pub config: LlamaConfig,
    /// The SWAN bases: `P_QK` applied at run time, `P_VO` already absorbed.
    pub set: ProjectionSet,
    pub(crate) embed: Vec<f32>,
    pub(crate) layers: Vec<Layer>,
    pub(crate) norm: Vec<f32>,
    pub(crate) lm_head: Vec<f32>,
}

impl Llama {
    /// Loads `dir` (`config.json` + safetensors) and absorbs `set`'s `P_VO` bases.
    ///
    /// # Errors
    /// As [`LlamaConfig::load`] and [`Weights::load`]; [`crate::Error::Weight`] for missing
    /// or misshapen tensors; [`crate::Error::Projection`] if `set` does not fit the model.
    pub fn load(dir: &Path, set: ProjectionSet) -> Result<Self> {
        let config = LlamaConfig::load(dir)?;
        set.check_compatible(&config.dims()?, None)?;
        let mut w = Weights::load(dir)?;
        let (h, d, i) = (config.hidden, config.head_dim, config.intermediate);
        let (qd, kvd) = (config.q_heads * d, config.kv_heads * d);
        let mut layers = Vec::with_capacity(config.layers);
        for l in 0..config.layers {
            let p = |s: &str| format!("model.layers.{l}.{s}");
            let mut wv = w.take(&p("self_attn.v_proj.weight"), &[kvd, h])?;
            let mut wo = w.take(&p("self_attn.o_proj.weight"), &[h, qd])?;
            set.absorb_value(l, &mut wv, h, None)?;
            set.absorb_output(l, &mut wo, h)?;
            layers.push(Layer {
                attn_norm: w.take(&p("input_layernorm.weight"), &[h])?,
                wq: w.take(&p("self_attn.q_proj.weight"), &[qd, h])?,
                wk: w.take(&p("self_attn.k_proj.weight"), &[kvd, h])?,
                wv,
                wo,
                mlp_norm: w.take(&p("post_attention_layernorm.weight"), &[h])?,
                w_gate: w.take(&p("mlp.gate_proj.weight"), &[i, h])?,
                w_up: w.take(&p("mlp.up_proj.weight"), &[i, h])?,
                w_down: w.take(&p("mlp.down_proj.weight"), &[h, i])?,
            });
        }
        let embed = w.take("model.embed_tokens.weight", &[config.vocab, h])?;
        let lm_head = if config.tie_embeddings && !w.contains("lm_head.weight") {
            embed.clone()
        } else {
            w.take("lm_head.weight", &[config.vocab, h])?
        };
        let norm = w.take("model.norm.weight", &[h])?;
        Ok(Self { config, set, embed, layers, norm, lm_head })
    }
}

/// `out = x·Wᵀ` for one row `x` (`W`: `[out.len(), x.len()]`).
pub(crate) fn linear(w: &[f32], x: &[f32], out: &mut [f32]) {
    for (o, row) in out.iter_mut().zip(w.chunks_exact(x.len())) {
        *o = row.iter().zip(x).map(|(a, b)| a * b).sum();
    }
}

/// RMSNorm: `out = x / √(mean(x²) + ε) · weight`.
pub(crate) fn rms_norm(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    let mean = x.iter().map(|v| v * v).sum::<f32>() / x.len() as f32;
    let inv = 1.0 / (mean + eps).sqrt();
    for ((o, v), g) in out.iter_mut().zip(x).zip(weight) {
        *o = v * inv * g;
    }
}

/// Rotate-half RoPE at position `pos` on every `head_dim`-row of `x`, in place.
pub(crate) fn rope(x: &mut [f32], head_dim: usize, pos: usize, theta: f64) {
    let half = head_dim / 2;
    for head in x.chunks_exact_mut(head_dim) {
        for i in 0..half {
            let inv = (theta.powf(-2.0 * i as f64 / head_dim as f64)) as f32;
            let (sin, cos) = (pos as f32 * inv).sin_cos();
            let (a, b) = (head[i], head[i + half]);
            head[i] = a * cos - b * sin;
            head[i + half] = b * cos + a * sin;
        }
    }
}

/// `silu(x·W_gateᵀ) ⊙ (x·W_upᵀ)`, then `·W_downᵀ` into `out`.
pub(crate) fn mlp(layer: &Layer, x: &[f32], gate: &mut [f32], up: &mut [f32], out: &mut [f32]) {
    linear(&layer.w_gate, x, gate);
    linear(&layer.w_up, x, up);
    for (g, u) in gate.iter_mut().zip(up.iter()) {
        *g = *g / (1.0 + (-*g).exp()) * u;
    }
    linear(&layer.w_down, gate, out);
}
