//! Model hyper-parameters: one [`ModelConfig`] for every supported decoder (Llama,
//! Mistral, Qwen2, Gemma 3), read from a Hugging Face `config.json` (both the transformers 4.x
//! `rope_theta` + `rope_scaling` keys and the 5.x `rope_parameters` object) or from GGUF
//! metadata (see [`crate::load::gguf`]). Validation happens once, here, so the layers can
//! trust the numbers.

use std::path::Path;

use serde::Deserialize;
use serde_json::Value;

use crate::error::{Error, Result, config_err};

/// The decoder family. Llama, Mistral and Qwen2 share the Llama block and differ in biases
/// and defaults; Gemma 3 adds q/k RMS norms, norms after attention and MLP, a GeGLU MLP,
/// a scaled embedding and interleaved sliding-window / global layers
/// ([`crate::llama::gemma`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Architecture {
    /// Llama 2/3, SmolLM2 and friends.
    Llama,
    /// Mistral: a Llama block, optionally with sliding-window attention.
    Mistral,
    /// Qwen2: a Llama block with q/k/v biases.
    Qwen2,
    /// Gemma 3's text decoder (GGUF `gemma3`, HF `gemma3_text`).
    Gemma3,
}

impl Architecture {
    /// Parses an HF `model_type` or GGUF `general.architecture`.
    ///
    /// # Errors
    /// [`Error::UnsupportedArchitecture`] for anything else.
    pub fn parse(name: &str) -> Result<Self> {
        match name {
            "llama" => Ok(Self::Llama),
            "mistral" => Ok(Self::Mistral),
            "qwen2" => Ok(Self::Qwen2),
            "gemma3" | "gemma3_text" => Ok(Self::Gemma3),
            other => Err(Error::UnsupportedArchitecture { got: other.to_string() }),
        }
    }

    /// The lower-case name used by HF and GGUF.
    pub fn name(self) -> &'static str {
        match self {
            Self::Llama => "llama",
            Self::Mistral => "mistral",
            Self::Qwen2 => "qwen2",
            Self::Gemma3 => "gemma3",
        }
    }
}

/// How rotary frequencies are rescaled for long contexts.
#[derive(Clone, Debug, PartialEq)]
pub enum RopeScaling {
    /// Plain RoPE.
    None,
    /// Positions divided by `factor` (inverse frequencies divided by it).
    Linear {
        /// Scale factor.
        factor: f64,
    },
    /// Llama 3.1's band-wise rescaling of the inverse frequencies.
    Llama3 {
        /// Divisor for low frequencies.
        factor: f64,
        /// Wavelength band edge (low).
        low_freq_factor: f64,
        /// Wavelength band edge (high).
        high_freq_factor: f64,
        /// Training context the bands are relative to.
        original_max_position_embeddings: f64,
    },
    /// Explicit per-frequency divisors (`head_dim / 2` of them), as llama.cpp stores Llama 3
    /// scaling in GGUF (`rope_freqs.weight`).
    Factors(Vec<f64>),
}

/// Rotary embedding parameters.
#[derive(Clone, Debug, PartialEq)]
pub struct RopeConfig {
    /// Base θ of the inverse frequencies `θ^(-2i/d)`.
    pub theta: f64,
    /// Long-context rescaling.
    pub scaling: RopeScaling,
}

/// What a layer's attention sees.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LayerKind {
    /// Every earlier position (full causal attention).
    Global,
    /// The last `window` positions, the current one included (sliding-window attention).
    Local {
        /// Positions a query sees.
        window: usize,
    },
}

/// Interleaved sliding-window ("local") and full ("global") layers, as in Gemma 3: local
/// layers attend to the last `window` positions with their own rotary base.
#[derive(Clone, Debug, PartialEq)]
pub struct LocalAttention {
    /// Positions a local layer's query sees, its own included.
    pub window: usize,
    /// The rotary embedding of local layers (Gemma 3: θ = 10 000, no scaling).
    pub rope: RopeConfig,
    /// `local[i]` is whether layer `i` is a local layer.
    pub local: Vec<bool>,
}

impl LocalAttention {
    /// Gemma 3's pattern: of every `period` layers the last is global, the rest local
    /// (`period` = 6 for every published Gemma 3; `period` = 0 makes every layer local).
    pub fn periodic(window: usize, rope: RopeConfig, layers: usize, period: usize) -> Self {
        let local = (0..layers).map(|i| !(i + 1).is_multiple_of(period)).collect();
        Self { window, rope, local }
    }
}

/// Validated hyper-parameters of a decoder-only transformer.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelConfig {
    /// Display name (from the checkpoint when it has one).
    pub name: String,
    /// Decoder family.
    pub arch: Architecture,
    /// Vocabulary size (rows of the embedding).
    pub vocab_size: usize,
    /// Residual stream width.
    pub hidden_size: usize,
    /// MLP inner width.
    pub intermediate_size: usize,
    /// Number of decoder layers.
    pub num_layers: usize,
    /// Query heads per layer.
    pub q_heads: usize,
    /// Key/value heads per layer (GQA when fewer than `q_heads`).
    pub kv_heads: usize,
    /// Width of one head.
    pub head_dim: usize,
    /// RMSNorm ε.
    pub rms_norm_eps: f64,
    /// Rotary embedding.
    pub rope: RopeConfig,
    /// Longest context the checkpoint was trained for.
    pub max_position_embeddings: usize,
    /// `lm_head` shares the embedding matrix.
    pub tie_word_embeddings: bool,
    /// q/k/v projections carry biases (Qwen2; Llama with `attention_bias`).
    pub qkv_bias: bool,
    /// The output projection carries a bias (Llama with `attention_bias`).
    pub o_bias: bool,
    /// MLP projections carry biases (`mlp_bias`).
    pub mlp_bias: bool,
    /// Beginning-of-sequence token, if the checkpoint names one.
    pub bos_token_id: Option<u32>,
    /// Tokens that end generation.
    pub eos_token_ids: Vec<u32>,
    /// Sliding-window width, when the model uses one (Mistral v0.1); sequences longer than
    /// this are rejected because full attention would then differ from the model's.
    pub sliding_window: Option<usize>,
    /// Interleaved local (sliding-window) and global layers (Gemma 3); `None`: every layer
    /// is global.
    pub local_attention: Option<LocalAttention>,
    /// Softmax scale of `q·k` when it is not `1/√head_dim` (Gemma 3:
    /// `query_pre_attn_scalar^(-1/2)`).
    pub query_scale: Option<f64>,
}

impl ModelConfig {
    /// Query heads that share one key/value head.
    pub fn group_size(&self) -> usize {
        self.q_heads / self.kv_heads
    }

    /// What layer `layer`'s attention sees.
    pub fn layer_kind(&self, layer: usize) -> LayerKind {
        match &self.local_attention {
            Some(l) if l.local.get(layer).copied().unwrap_or(false) => {
                LayerKind::Local { window: l.window }
            }
            _ => LayerKind::Global,
        }
    }

    /// The softmax scale of `q·k`: [`ModelConfig::query_scale`] or `1/√head_dim`.
    pub fn attention_scale(&self) -> f64 {
        self.query_scale.unwrap_or_else(|| 1.0 / (self.head_dim as f64).sqrt())
    }

    /// Checks every invariant the layers rely on.
    ///
    /// # Errors
    /// [`Error::Config`] naming the first field that is zero or inconsistent.
    pub fn validate(&self) -> Result<()> {
        let positive = [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            ("num_hidden_layers", self.num_layers),
            ("num_attention_heads", self.q_heads),
            ("num_key_value_heads", self.kv_heads),
            ("head_dim", self.head_dim),
            ("max_position_embeddings", self.max_position_embeddings),
        ];
        for (field, v) in positive {
            if v == 0 {
                return Err(config_err(field, "must be positive"));
            }
        }
        if !self.q_heads.is_multiple_of(self.kv_heads) {
            return Err(config_err(
                "num_key_value_heads",
                format!("{} does not divide num_attention_heads {}", self.kv_heads, self.q_heads),
            ));
        }
        if !self.head_dim.is_multiple_of(2) {
            return Err(config_err(
                "head_dim",
                format!("{} is odd; RoPE needs pairs", self.head_dim),
            ));
        }
        if !(self.rms_norm_eps.is_finite() && self.rms_norm_eps > 0.0) {
            return Err(config_err(
                "rms_norm_eps",
                format!("{} is not a positive number", self.rms_norm_eps),
            ));
        }
        if let RopeScaling::Factors(f) = &self.rope.scaling
            && f.len() != self.head_dim / 2
        {
            return Err(config_err(
                "rope_freqs",
                format!("{} factors for head_dim {}", f.len(), self.head_dim),
            ));
        }
        if let Some(scale) = self.query_scale
            && !(scale.is_finite() && scale > 0.0)
        {
            return Err(config_err(
                "query_pre_attn_scalar",
                format!("scale {scale} is not positive"),
            ));
        }
        if let Some(l) = &self.local_attention {
            if l.window == 0 {
                return Err(config_err("sliding_window", "must be positive"));
            }
            if l.local.len() != self.num_layers {
                return Err(config_err(
                    "sliding_window_pattern",
                    format!("{} layer kinds for {} layers", l.local.len(), self.num_layers),
                ));
            }
            validate_rope(&l.rope)?;
        }
        validate_rope(&self.rope)
    }

    /// Reads and validates `config.json` of a Hugging Face checkpoint.
    ///
    /// # Errors
    /// [`Error::Io`] if the file cannot be read, [`Error::Json`] if it is not JSON,
    /// [`Error::Config`] / [`Error::UnsupportedArchitecture`] for unusable values.
    pub fn from_hf_file(path: &Path) -> Result<Self> {
        Self::from_hf_json(&crate::error::read_text_file(path)?)
    }

    /// Parses and validates the text of an HF `config.json`.
    ///
    /// # Errors
    /// As [`ModelConfig::from_hf_file`].
    ///
    /// # Examples
    /// ```
    /// let cfg = models::ModelConfig::from_hf_json(r#"{
    ///     "model_type": "llama", "vocab_size": 32, "hidden_size": 16, "intermediate_size": 32,
    ///     "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1,
    ///     "rms_norm_eps": 1e-5, "max_position_embeddings": 64, "rope_theta": 10000.0
    /// }"#).unwrap();
    /// assert_eq!((cfg.head_dim, cfg.group_size()), (8, 2));
    /// ```
    pub fn from_hf_json(text: &str) -> Result<Self> {
        let raw: HfConfig = serde_json::from_str(text)
            .map_err(|source| Error::Json { what: "config.json".into(), source })?;
        raw.into_config()
    }
}

fn validate_rope(rope: &RopeConfig) -> Result<()> {
    if !(rope.theta.is_finite() && rope.theta > 1.0) {
        return Err(config_err(
            "rope_theta",
            format!("{} must be a finite number > 1", rope.theta),
        ));
    }
    let ok = match rope.scaling {
        RopeScaling::None => true,
        RopeScaling::Factors(ref f) => f.iter().all(|v| v.is_finite() && *v > 0.0),
        RopeScaling::Linear { factor } => factor.is_finite() && factor > 0.0,
        RopeScaling::Llama3 {
            factor,
            low_freq_factor,
            high_freq_factor,
            original_max_position_embeddings,
        } => {
            [factor, low_freq_factor, high_freq_factor, original_max_position_embeddings]
                .iter()
                .all(|v| v.is_finite() && *v > 0.0)
                && high_freq_factor > low_freq_factor
        }
    };
    if ok {
        Ok(())
    } else {
        Err(config_err("rope_scaling", format!("invalid parameters {:?}", rope.scaling)))
    }
}

/// The subset of an HF `config.json` we read; unknown keys are ignored.
#[derive(Deserialize)]
struct HfConfig {
    model_type: String,
    #[serde(default, rename = "_name_or_path")]
    name_or_path: Option<String>,
    vocab_size: usize,
    hidden_size: usize,
    intermediate_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    num_key_value_heads: Option<usize>,
    head_dim: Option<usize>,
    rms_norm_eps: f64,
    #[serde(default = "default_max_pos")]
    max_position_embeddings: usize,
    rope_theta: Option<f64>,
    rope_scaling: Option<Value>,
    rope_parameters: Option<Value>,
    tie_word_embeddings: Option<bool>,
    #[serde(default)]
    attention_bias: bool,
    #[serde(default)]
    mlp_bias: bool,
    hidden_act: Option<String>,
    bos_token_id: Option<u32>,
    eos_token_id: Option<Value>,
    sliding_window: Option<usize>,
    use_sliding_window: Option<bool>,
}

fn default_max_pos() -> usize {
    4096
}

impl HfConfig {
    fn into_config(self) -> Result<ModelConfig> {
        let arch = Architecture::parse(&self.model_type)?;
        if arch == Architecture::Gemma3 {
            return Err(config_err(
                "model_type",
                "gemma3 loads from a GGUF file only (its config.json layout is not read)",
            ));
        }
        if let Some(act) = self.hidden_act.as_deref().filter(|a| *a != "silu") {
            return Err(config_err("hidden_act", format!("`{act}` is not supported (only silu)")));
        }
        let head_dim = match self.head_dim {
            Some(d) => d,
            None if self.num_attention_heads > 0 => self.hidden_size / self.num_attention_heads,
            None => 0,
        };
        let sliding_window = match arch {
            Architecture::Qwen2 if self.use_sliding_window != Some(true) => None,
            _ => self.sliding_window,
        };
        let cfg = ModelConfig {
            name: self.name_or_path.clone().unwrap_or_else(|| self.model_type.clone()),
            arch,
            vocab_size: self.vocab_size,
            hidden_size: self.hidden_size,
            intermediate_size: self.intermediate_size,
            num_layers: self.num_hidden_layers,
            q_heads: self.num_attention_heads,
            kv_heads: self.num_key_value_heads.unwrap_or(self.num_attention_heads),
            head_dim,
            rms_norm_eps: self.rms_norm_eps,
            rope: self.rope()?,
            max_position_embeddings: self.max_position_embeddings,
            tie_word_embeddings: self.tie_word_embeddings.unwrap_or(false),
            qkv_bias: arch == Architecture::Qwen2 || self.attention_bias,
            o_bias: arch != Architecture::Qwen2 && self.attention_bias,
            mlp_bias: self.mlp_bias,
            bos_token_id: self.bos_token_id,
            eos_token_ids: eos_ids(self.eos_token_id.as_ref())?,
            sliding_window,
            local_attention: None,
            query_scale: None,
        };
        cfg.validate()?;
        Ok(cfg)
    }

    /// transformers 5 keeps θ and the scaling in `rope_parameters`; 4.x used `rope_theta`
    /// plus an optional `rope_scaling` object.
    fn rope(&self) -> Result<RopeConfig> {
        let params = self.rope_parameters.as_ref().or(self.rope_scaling.as_ref());
        let theta = params
            .and_then(|p| p.get("rope_theta"))
            .and_then(Value::as_f64)
            .or(self.rope_theta)
            .unwrap_or(10_000.0);
        let scaling = match params {
            Some(p) => rope_scaling(p)?,
            None => RopeScaling::None,
        };
        Ok(RopeConfig { theta, scaling })
    }
}

fn rope_scaling(p: &Value) -> Result<RopeScaling> {
    let kind =
        p.get("rope_type").or_else(|| p.get("type")).and_then(Value::as_str).unwrap_or("default");
    let num = |key: &str| {
        p.get(key)
            .and_then(Value::as_f64)
            .ok_or_else(|| config_err(&format!("rope_scaling.{key}"), "missing or not a number"))
    };
    match kind {
        "default" => Ok(RopeScaling::None),
        "linear" => Ok(RopeScaling::Linear { factor: num("factor")? }),
        "llama3" => Ok(RopeScaling::Llama3 {
            factor: num("factor")?,
            low_freq_factor: num("low_freq_factor")?,
            high_freq_factor: num("high_freq_factor")?,
            original_max_position_embeddings: num("original_max_position_embeddings")?,
        }),
        other => Err(config_err("rope_scaling.rope_type", format!("`{other}` is not supported"))),
    }
}

fn eos_ids(v: Option<&Value>) -> Result<Vec<u32>> {
    let as_id = |x: &Value| {
        x.as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .ok_or_else(|| config_err("eos_token_id", format!("{x} is not a token id")))
    };
    match v {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(items)) => items.iter().map(as_id).collect(),
        Some(x) => Ok(vec![as_id(x)?]),
    }
}
