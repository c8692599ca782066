//! The Llama hyper-parameters this example reads from a Hugging Face `config.json`: the
//! attention geometry shared with `projection` ([`projection::ModelDims`]) and
//! `attn-kernels` ([`attn_kernels::AttnConfig`]), and what the forward needs besides.

use std::path::Path;

use serde::Deserialize;

use crate::error::{Error, Result};

/// A Llama decoder's shape (default RoPE, no attention bias).
#[derive(Clone, Debug, PartialEq)]
pub struct LlamaConfig {
    /// Residual width.
    pub hidden: usize,
    /// Decoder layers.
    pub layers: usize,
    /// Query heads per layer.
    pub q_heads: usize,
    /// Key/value heads per layer (GQA).
    pub kv_heads: usize,
    /// Elements per head.
    pub head_dim: usize,
    /// MLP width.
    pub intermediate: usize,
    /// Vocabulary size.
    pub vocab: usize,
    /// RMSNorm epsilon.
    pub rms_eps: f32,
    /// RoPE base θ.
    pub rope_theta: f64,
    /// Whether the output head reuses the embedding matrix.
    pub tie_embeddings: bool,
}

#[derive(Deserialize)]
struct Rope {
    rope_theta: f64,
    rope_type: Option<String>,
}

#[derive(Deserialize)]
struct Raw {
    model_type: String,
    hidden_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    num_key_value_heads: Option<usize>,
    head_dim: Option<usize>,
    intermediate_size: usize,
    vocab_size: usize,
    rms_norm_eps: f32,
    rope_theta: Option<f64>,
    rope_parameters: Option<Rope>,
    rope_scaling: Option<serde_json::Value>,
    tie_word_embeddings: Option<bool>,
    attention_bias: Option<bool>,
}

impl LlamaConfig {
    /// Parses `config.json` text.
    ///
    /// # Errors
    /// [`Error::Config`] for malformed JSON; [`Error::Unsupported`] for another model type,
    /// RoPE scaling or attention biases.
    pub fn from_json(text: &str) -> Result<Self> {
        let raw: Raw = serde_json::from_str(text)?;
        let unsupported = |what: &str| Err(Error::Unsupported(what.to_owned()));
        if raw.model_type != "llama" {
            return unsupported(&format!("model_type {:?}", raw.model_type));
        }
        if raw.attention_bias == Some(true) {
            return unsupported("attention biases");
        }
        let scaled = raw.rope_scaling.as_ref().is_some_and(|v| !v.is_null());
        let typed = raw.rope_parameters.as_ref().and_then(|r| r.rope_type.as_deref());
        if scaled || typed.is_some_and(|t| t != "default") {
            return unsupported("RoPE scaling");
        }
        let rope_theta =
            raw.rope_parameters.map(|r| r.rope_theta).or(raw.rope_theta).unwrap_or(10_000.0);
        Ok(Self {
            hidden: raw.hidden_size,
            layers: raw.num_hidden_layers,
            q_heads: raw.num_attention_heads,
            kv_heads: raw.num_key_value_heads.unwrap_or(raw.num_attention_heads),
            head_dim: raw.head_dim.unwrap_or(raw.hidden_size / raw.num_attention_heads.max(1)),
            intermediate: raw.intermediate_size,
            vocab: raw.vocab_size,
            rms_eps: raw.rms_norm_eps,
            rope_theta,
            tie_embeddings: raw.tie_word_embeddings.unwrap_or(false),
        })
    }

    /// Reads `dir/config.json`.
    ///
    /// # Errors
    /// [`Error::Io`], then as [`LlamaConfig::from_json`].
    pub fn load(dir: &Path) -> Result<Self> {
        let path = dir.join("config.json");
        let text = std::fs::read_to_string(&path).map_err(|source| Error::Io { path, source })?;
        Self::from_json(&text)
    }

    /// The geometry `projection` indexes its bases by.
    ///
    /// # Errors
    /// [`Error::Projection`] for zero counts or `q_heads` not a multiple of `kv_heads`.
    pub fn dims(&self) -> Result<projection::ModelDims> {
        Ok(projection::ModelDims::new(self.layers, self.q_heads, self.kv_heads, self.head_dim)?)
    }

    /// One layer's attention shape for `attn-kernels` (softmax scale `1/√head_dim`).
    ///
    /// # Errors
    /// [`Error::Attention`] for an invalid head layout.
    pub fn attn(&self) -> Result<attn_kernels::AttnConfig> {
        Ok(attn_kernels::AttnConfig::new(self.q_heads, self.kv_heads, self.head_dim)?)
    }
}
