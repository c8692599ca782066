//! A GGUF file seen as a Hugging Face checkpoint: [`config_from_gguf`] reads the
//! hyper-parameters from `{arch}.*` metadata, and [`GgufSource`] serves tensors under HF
//! names, de-quantised to f32 at load and, for the `llama` architecture, with the rows of
//! `attn_q`/`attn_k` put back in HF order (llama.cpp's converter interleaves the two
//! halves of every head for its GPT-J-style RoPE; we use the HF rotate-half form).

use std::path::Path;

use tch::{Kind, Tensor};

use super::error::GgufError;
use super::file::GgufFile;
use super::value::MetaValue;
use crate::error::{Error, Result, TorchOp, config_err};
use crate::load::config::{Architecture, LocalAttention, ModelConfig, RopeConfig, RopeScaling};
use crate::load::weights::WeightSource;

/// The metadata value at `key`, or [`GgufError::MissingMetadata`].
pub(crate) fn meta<'a>(file: &'a GgufFile, key: &str) -> Result<&'a MetaValue> {
    file.get(key).ok_or_else(|| GgufError::MissingMetadata { key: key.to_string() }.into())
}

fn type_err(key: &str, expected: &str, got: &MetaValue) -> Error {
    GgufError::MetadataType {
        key: key.into(),
        expected: expected.into(),
        got: got.type_name().into(),
    }
    .into()
}

/// A non-negative integer that fits `usize`.
pub(crate) fn meta_usize(file: &GgufFile, key: &str) -> Result<usize> {
    let v = meta(file, key)?;
    v.as_u64()
        .and_then(|n| usize::try_from(n).ok())
        .ok_or_else(|| type_err(key, "an unsigned integer", v))
}

fn meta_usize_or(file: &GgufFile, key: &str, default: usize) -> Result<usize> {
    if file.get(key).is_some() { meta_usize(file, key) } else { Ok(default) }
}

fn meta_f64_or(file: &GgufFile, key: &str, default: f64) -> Result<f64> {
    match file.get(key) {
        None => Ok(default),
        Some(v) => v.as_f64().ok_or_else(|| type_err(key, "a number", v)),
    }
}

fn meta_u32_opt(file: &GgufFile, key: &str) -> Result<Option<u32>> {
    match file.get(key) {
        None => Ok(None),
        Some(v) => v
            .as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .map(Some)
            .ok_or_else(|| type_err(key, "a token id", v)),
    }
}

/// Reads and validates the model's hyper-parameters from GGUF metadata.
///
/// # Errors
/// [`Error::UnsupportedArchitecture`], [`GgufError::MissingMetadata`],
/// [`GgufError::MetadataType`], or [`Error::Config`] when the values are inconsistent.
pub fn config_from_gguf(file: &GgufFile) -> Result<ModelConfig> {
    let arch_value = meta(file, "general.architecture")?;
    let arch_name = arch_value
        .as_str()
        .ok_or_else(|| type_err("general.architecture", "a string", arch_value))?;
    let arch = Architecture::parse(arch_name)?;
    let k = |suffix: &str| format!("{arch_name}.{suffix}");
    let hidden = meta_usize(file, &k("embedding_length"))?;
    let heads = meta_usize(file, &k("attention.head_count"))?;
    let head_dim = match file.get(&k("attention.key_length")) {
        Some(_) => meta_usize(file, &k("attention.key_length"))?,
        None => {
            meta_usize_or(file, &k("rope.dimension_count"), hidden.checked_div(heads).unwrap_or(0))?
        }
    };
    let cfg = ModelConfig {
        name: file.get("general.name").and_then(MetaValue::as_str).unwrap_or(arch_name).to_string(),
        arch,
        vocab_size: vocab_size(file, &k("vocab_size"))?,
        hidden_size: hidden,
        intermediate_size: meta_usize(file, &k("feed_forward_length"))?,
        num_layers: meta_usize(file, &k("block_count"))?,
        q_heads: heads,
        kv_heads: meta_usize_or(file, &k("attention.head_count_kv"), heads)?,
        head_dim,
        rms_norm_eps: meta_f64_or(file, &k("attention.layer_norm_rms_epsilon"), 1e-5)?,
        rope: rope(file, arch_name)?,
        max_position_embeddings: meta_usize_or(file, &k("context_length"), 4096)?,
        tie_word_embeddings: file.tensor_info("output.weight").is_none(),
        qkv_bias: file.tensor_info("blk.0.attn_q.bias").is_some(),
        o_bias: file.tensor_info("blk.0.attn_output.bias").is_some(),
        mlp_bias: file.tensor_info("blk.0.ffn_up.bias").is_some(),
        bos_token_id: meta_u32_opt(file, "tokenizer.ggml.bos_token_id")?,
        eos_token_ids: stop_ids(file)?,
        sliding_window: None,
        local_attention: None,
        query_scale: None,
    };
    let cfg = match arch {
        Architecture::Gemma3 => gemma3(file, cfg)?,
        _ => cfg,
    };
    cfg.validate()?;
    Ok(cfg)
}

/// Gemma 3's layer settings. The GGUF stores the window, the global rotary base and (in
/// newer converters) the local base and the layer pattern; what it leaves out llama.cpp
/// fixes per model, and so do we: the local base is 10 000, every 6th layer is global, and
/// queries are scaled by `head_dim^(-1/2)` except for the 27B model (62 blocks), whose
/// `query_pre_attn_scalar` is `hidden / heads`. `<end_of_turn>` joins the stop tokens.
fn gemma3(file: &GgufFile, mut cfg: ModelConfig) -> Result<ModelConfig> {
    let window = meta_usize(file, "gemma3.attention.sliding_window")?;
    let local_rope = RopeConfig {
        theta: meta_f64_or(file, "gemma3.rope.freq_base_swa", 10_000.0)?,
        scaling: RopeScaling::None,
    };
    let key = "gemma3.attention.sliding_window_pattern";
    let local = match file.get(key) {
        None => LocalAttention::periodic(window, local_rope, cfg.num_layers, 6),
        Some(MetaValue::Array(items)) => {
            let local = items
                .iter()
                .map(|v| match v {
                    MetaValue::Bool(b) => Ok(*b),
                    other => Err(type_err(key, "an array of booleans", other)),
                })
                .collect::<Result<Vec<_>>>()?;
            LocalAttention { window, rope: local_rope, local }
        }
        Some(_) => match meta_usize(file, key)? {
            0 => return Err(config_err("sliding_window_pattern", "period 0")),
            period => LocalAttention::periodic(window, local_rope, cfg.num_layers, period),
        },
    };
    let scalar = if cfg.num_layers == 62 { cfg.hidden_size / cfg.q_heads } else { cfg.head_dim };
    cfg.query_scale = Some(1.0 / (scalar as f64).sqrt());
    // Instruct turns end with `<end_of_turn>`, which the metadata does not name as a stop.
    let tokens = file.get("tokenizer.ggml.tokens").and_then(MetaValue::as_array);
    let end_of_turn =
        tokens.and_then(|t| t.iter().position(|v| v.as_str() == Some("<end_of_turn>")));
    if let Some(id) = end_of_turn.and_then(|i| u32::try_from(i).ok())
        && !cfg.eos_token_ids.contains(&id)
    {
        cfg.eos_token_ids.push(id);
    }
    cfg.local_attention = Some(local);
    Ok(cfg)
}

fn vocab_size(file: &GgufFile, key: &str) -> Result<usize> {
    if file.get(key).is_some() {
        return meta_usize(file, key);
    }
    if let Some(tokens) = file.get("tokenizer.ggml.tokens").and_then(MetaValue::as_array) {
        return Ok(tokens.len());
    }
    let emb = file
        .tensor_info("token_embd.weight")
        .ok_or_else(|| GgufError::MissingMetadata { key: key.into() })?;
    Ok(emb.shape[0])
}

fn stop_ids(file: &GgufFile) -> Result<Vec<u32>> {
    let mut ids = Vec::new();
    for key in ["tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id"] {
        if let Some(id) = meta_u32_opt(file, key)?.filter(|id| !ids.contains(id)) {
            ids.push(id);
        }
    }
    Ok(ids)
}

/// θ from `rope.freq_base`; linear scaling from `rope.scaling.*`; Llama 3's per-frequency
/// factors from the `rope_freqs.weight` tensor llama.cpp stores instead of metadata.
fn rope(file: &GgufFile, arch: &str) -> Result<RopeConfig> {
    let theta = meta_f64_or(file, &format!("{arch}.rope.freq_base"), 10_000.0)?;
    let kind = file
        .get(&format!("{arch}.rope.scaling.type"))
        .and_then(MetaValue::as_str)
        .unwrap_or("none");
    let scaling = match kind {
        "none" => match file.tensor_info("rope_freqs.weight") {
            Some(_) => {
                let (factors, _) = file.dequantize("rope_freqs.weight")?;
                RopeScaling::Factors(factors.iter().map(|&f| f64::from(f)).collect())
            }
            None => RopeScaling::None,
        },
        "linear" => RopeScaling::Linear {
            factor: meta_f64_or(file, &format!("{arch}.rope.scaling.factor"), 1.0)?,
        },
        other => {
            return Err(config_err("rope.scaling.type", format!("`{other}` is not supported")));
        }
    };
    Ok(RopeConfig { theta, scaling })
}

/// How a tensor's rows must be reordered on the way from GGUF to HF layout.
#[derive(Clone, Copy)]
enum Rows {
    AsIs,
    /// Undo llama.cpp's q/k permutation for this many heads.
    Unpermute(usize),
}

/// A GGUF model's tensors under Hugging Face names.
pub struct GgufSource {
    file: GgufFile,
    path: String,
    permute_qk: bool,
    /// Gemma 3 names: its `post_attention_layernorm` follows attention (llama.cpp's
    /// `post_attention_norm`) and `ffn_norm` is its `pre_feedforward_layernorm`.
    gemma: bool,
    heads: usize,
    kv_heads: usize,
}

impl GgufSource {
    /// Opens `path` and reads the head counts needed to un-permute q/k.
    ///
    /// # Errors
    /// The errors of [`GgufFile::open`] and [`config_from_gguf`].
    pub fn open(path: &Path) -> Result<(Self, ModelConfig)> {
        let file = GgufFile::open(path)?;
        Self::from_file(file, path.display().to_string())
    }

    /// Wraps an already parsed file (`label` names it in messages).
    ///
    /// # Errors
    /// The errors of [`config_from_gguf`].
    pub fn from_file(file: GgufFile, label: String) -> Result<(Self, ModelConfig)> {
        let cfg = config_from_gguf(&file)?;
        let source = Self {
            file,
            path: label,
            permute_qk: cfg.arch == Architecture::Llama,
            gemma: cfg.arch == Architecture::Gemma3,
            heads: cfg.q_heads,
            kv_heads: cfg.kv_heads,
        };
        Ok((source, cfg))
    }

    /// The parsed file (metadata, tokenizer, directory).
    pub fn file(&self) -> &GgufFile {
        &self.file
    }

    /// The GGUF name and row order for an HF name.
    fn resolve(&self, hf: &str) -> Option<(String, Rows)> {
        let fixed = match hf {
            "model.embed_tokens.weight" => Some("token_embd.weight"),
            "model.norm.weight" => Some("output_norm.weight"),
            "lm_head.weight" => Some("output.weight"),
            _ => None,
        };
        if let Some(name) = fixed {
            return Some((name.to_string(), Rows::AsIs));
        }
        let rest = hf.strip_prefix("model.layers.")?;
        let (layer, rest) = rest.split_once('.')?;
        let layer: usize = layer.parse().ok()?;
        let (module, suffix) = rest.rsplit_once('.')?;
        let (gguf, rows) = match module {
            "input_layernorm" => ("attn_norm", Rows::AsIs),
            "self_attn.q_proj" => ("attn_q", self.qk_rows(self.heads)),
            "self_attn.k_proj" => ("attn_k", self.qk_rows(self.kv_heads)),
            "self_attn.v_proj" => ("attn_v", Rows::AsIs),
            "self_attn.o_proj" => ("attn_output", Rows::AsIs),
            "post_attention_layernorm" if self.gemma => ("post_attention_norm", Rows::AsIs),
            "post_attention_layernorm" => ("ffn_norm", Rows::AsIs),
            "pre_feedforward_layernorm" if self.gemma => ("ffn_norm", Rows::AsIs),
            "post_feedforward_layernorm" if self.gemma => ("post_ffw_norm", Rows::AsIs),
            "self_attn.q_norm" if self.gemma => ("attn_q_norm", Rows::AsIs),
            "self_attn.k_norm" if self.gemma => ("attn_k_norm", Rows::AsIs),
            "mlp.gate_proj" => ("ffn_gate", Rows::AsIs),
            "mlp.up_proj" => ("ffn_up", Rows::AsIs),
            "mlp.down_proj" => ("ffn_down", Rows::AsIs),
            _ => return None,
        };
        Some((format!("blk.{layer}.{gguf}.{suffix}"), rows))
    }

    fn qk_rows(&self, heads: usize) -> Rows {
        if self.permute_qk { Rows::Unpermute(heads) } else { Rows::AsIs }
    }
}

impl WeightSource for GgufSource {
    fn shape(&self, name: &str) -> Option<Vec<usize>> {
        let (gguf, _) = self.resolve(name)?;
        self.file.tensor_info(&gguf).map(|i| i.shape.clone())
    }

    fn load(&self, name: &str, kind: Kind) -> Result<Tensor> {
        let (gguf, rows) =
            self.resolve(name).ok_or_else(|| Error::MissingTensor { name: name.to_string() })?;
        let (values, shape) = self.file.dequantize(&gguf)?;
        let dims: Vec<i64> = shape.iter().map(|&d| d as i64).collect();
        let t = Tensor::f_from_slice(&values).op("from_slice")?.f_reshape(&dims).op("reshape")?;
        let t = match rows {
            Rows::AsIs => t,
            Rows::Unpermute(heads) => unpermute(&t, heads, name)?,
        };
        t.f_to_kind(kind).op("to_kind")
    }

    fn describe(&self) -> String {
        format!("GGUF v{} {}", self.file.version(), self.path)
    }
}

/// Inverse of llama.cpp's `permute`: rows of each head go from `[d/2, 2]` back to `[2, d/2]`.
fn unpermute(t: &Tensor, heads: usize, name: &str) -> Result<Tensor> {
    let size = t.size();
    let rows = size[0];
    let heads = heads as i64;
    if heads == 0 || rows % (2 * heads) != 0 {
        let reason = format!("`{name}`: {rows} rows do not split into {heads} heads of pairs");
        return Err(crate::error::invalid("unpermute q/k rows", reason));
    }
    let mut split = vec![heads, rows / heads / 2, 2];
    split.extend_from_slice(&size[1..]);
    t.f_reshape(&split)
        .op("reshape")?
        .f_transpose(1, 2)
        .op("transpose")?
        .f_reshape(&size)
        .op("reshape")
}
