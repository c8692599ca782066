//! Gemma 3's departures from the Llama block (the Gemma 3 technical report's text decoder,
//! as transformers' `Gemma3ForCausalLM` computes it), which [`super::Block`],
//! [`super::Attention`] and [`super::Mlp`] switch on for [`Architecture::Gemma3`]:
//!
//! * the embedding is multiplied by `√hidden` (the tied output head is not);
//! * RMSNorm scales by `1 + w`: llama.cpp's converter stores `1 + w` in the GGUF, so the
//!   Llama RMSNorm on the stored weight is Gemma's norm;
//! * q and k are RMS-normalised per head (`q_norm`, `k_norm`, width `head_dim`) before RoPE;
//! * a norm after attention and one after the MLP, before each residual add
//!   ([`SandwichNorms`]), on top of the pre-norms;
//! * the MLP is GeGLU with the tanh approximation of GELU;
//! * queries are scaled by `query_pre_attn_scalar^(-1/2)` ([`ModelConfig::query_scale`]);
//! * local layers see the last `window` positions and use their own rotary base
//!   ([`crate::LocalAttention`]); global layers see everything.

use tch::{Device, Kind, Tensor};

use super::norm::RmsNorm;
use crate::error::{Result, TorchOp};
use crate::load::config::{Architecture, ModelConfig};
use crate::load::weights::Weights;

/// The norms Gemma puts after attention and after the MLP, before each residual add.
#[derive(Clone)]
pub struct SandwichNorms {
    post_attention: RmsNorm,
    post_feedforward: RmsNorm,
}

impl SandwichNorms {
    /// Loads `{prefix}.post_attention_layernorm` and `{prefix}.post_feedforward_layernorm`
    /// for a Gemma 3 layer; `None` for other architectures.
    ///
    /// # Errors
    /// Missing or mis-shaped weights.
    pub fn load(w: &Weights<'_>, cfg: &ModelConfig, prefix: &str) -> Result<Option<Self>> {
        if cfg.arch != Architecture::Gemma3 {
            return Ok(None);
        }
        let norm = |name: &str| {
            RmsNorm::load(w, &format!("{prefix}.{name}"), cfg.hidden_size, cfg.rms_norm_eps)
        };
        Ok(Some(Self {
            post_attention: norm("post_attention_layernorm")?,
            post_feedforward: norm("post_feedforward_layernorm")?,
        }))
    }

    /// Normalises the attention output.
    ///
    /// # Errors
    /// [`crate::Error::Torch`] on a shape mismatch.
    pub fn attention(&self, x: &Tensor) -> Result<Tensor> {
        self.post_attention.forward(x)
    }

    /// Normalises the MLP output.
    ///
    /// # Errors
    /// [`crate::Error::Torch`] on a shape mismatch.
    pub fn feedforward(&self, x: &Tensor) -> Result<Tensor> {
        self.post_feedforward.forward(x)
    }

    pub(crate) fn weights(&self) -> [&Tensor; 2] {
        [self.post_attention.weight(), self.post_feedforward.weight()]
    }
}

/// The per-head RMS norms of q and k (Gemma 3's QK-norm).
#[derive(Clone)]
pub struct QkNorm {
    q: RmsNorm,
    k: RmsNorm,
}

impl QkNorm {
    /// Loads `{prefix}.q_norm` and `{prefix}.k_norm` (width `head_dim`) for a Gemma 3
    /// layer; `None` for other architectures.
    ///
    /// # Errors
    /// Missing or mis-shaped weights.
    pub fn load(w: &Weights<'_>, cfg: &ModelConfig, prefix: &str) -> Result<Option<Self>> {
        if cfg.arch != Architecture::Gemma3 {
            return Ok(None);
        }
        let norm = |name: &str| {
            RmsNorm::load(w, &format!("{prefix}.{name}"), cfg.head_dim, cfg.rms_norm_eps)
        };
        Ok(Some(Self { q: norm("q_norm")?, k: norm("k_norm")? }))
    }

    /// Normalises queries `[..., head_dim]`.
    ///
    /// # Errors
    /// [`crate::Error::Torch`] on a shape mismatch.
    pub fn q(&self, x: &Tensor) -> Result<Tensor> {
        self.q.forward(x)
    }

    /// Normalises keys `[..., head_dim]`.
    ///
    /// # Errors
    /// [`crate::Error::Torch`] on a shape mismatch.
    pub fn k(&self, x: &Tensor) -> Result<Tensor> {
        self.k.forward(x)
    }

    pub(crate) fn weights(&self) -> [&Tensor; 2] {
        [self.q.weight(), self.k.weight()]
    }
}

/// The factor Gemma multiplies token embeddings by (`√hidden`); `None` for other
/// architectures.
pub fn embed_scale(cfg: &ModelConfig) -> Option<f64> {
    (cfg.arch == Architecture::Gemma3).then(|| (cfg.hidden_size as f64).sqrt())
}

/// The prefill mask `[tokens, tokens]` (true = masked): causal, and with `window`, also
/// every key `window` or more positions before the query.
///
/// # Errors
/// [`crate::Error::Torch`] if libtorch fails.
pub fn attention_mask(tokens: i64, window: Option<usize>) -> Result<Tensor> {
    let ones = Tensor::f_ones([tokens, tokens], (Kind::Bool, Device::Cpu)).op("mask")?;
    let causal = ones.f_triu(1).op("triu")?;
    match window {
        Some(w) if (w as i64) < tokens => {
            let far = ones.f_tril(-(w as i64)).op("tril")?;
            causal.f_logical_or(&far).op("window mask")
        }
        _ => Ok(causal),
    }
}
