//! The Whisper-style audio transformer shared by both backbones (WnW §3.1): 2 × conv1d + GELU
//! stem, then pre-LayerNorm blocks of bidirectional multi-head attention (q and v biased, k
//! not) and a GELU MLP. Voxtral adds learned positions and a final LayerNorm over whole 30 s
//! windows; Qwen2.5-Omni adds sinusoidal positions per 2 s chunk, block-diagonal attention,
//! pooling and a projection (see [`super::omni`]).

use serde_json::Value;
use tch::{Kind, Tensor};

use crate::Result;
use crate::error::config_err;
use crate::load::weights::Weights;

/// A dense layer `y = x Wᵀ + b`.
#[derive(Debug)]
pub(crate) struct Linear {
    w: Tensor,
    b: Option<Tensor>,
}

impl Linear {
    /// Loads `{prefix}.weight` (`out × inp`) and, if `bias`, `{prefix}.bias`.
    pub(crate) fn load(
        w: &Weights<'_>,
        prefix: &str,
        out: usize,
        inp: usize,
        bias: bool,
    ) -> Result<Self> {
        let weight = w.get(&format!("{prefix}.weight"), &[out, inp])?;
        let b = if bias { Some(w.get(&format!("{prefix}.bias"), &[out])?) } else { None };
        Ok(Self { w: weight, b })
    }

    pub(crate) fn forward(&self, x: &Tensor) -> Tensor {
        x.linear(&self.w, self.b.as_ref())
    }
}

/// `nn.LayerNorm(d)` with eps 1e-5.
#[derive(Debug)]
pub(crate) struct LayerNorm {
    w: Tensor,
    b: Tensor,
    d: i64,
}

impl LayerNorm {
    pub(crate) fn load(w: &Weights<'_>, prefix: &str, d: usize) -> Result<Self> {
        Ok(Self {
            w: w.get(&format!("{prefix}.weight"), &[d])?,
            b: w.get(&format!("{prefix}.bias"), &[d])?,
            d: d as i64,
        })
    }

    pub(crate) fn forward(&self, x: &Tensor) -> Tensor {
        x.layer_norm([self.d], Some(&self.w), Some(&self.b), 1e-5, false)
    }
}

/// `nn.Conv1d` with kernel 3 and padding 1.
#[derive(Debug)]
pub(crate) struct Conv3 {
    w: Tensor,
    b: Tensor,
    stride: i64,
}

impl Conv3 {
    pub(crate) fn load(
        w: &Weights<'_>,
        prefix: &str,
        out: usize,
        inp: usize,
        stride: i64,
    ) -> Result<Self> {
        Ok(Self {
            w: w.get(&format!("{prefix}.weight"), &[out, inp, 3])?,
            b: w.get(&format!("{prefix}.bias"), &[out])?,
            stride,
        })
    }

    /// `x`: `[batch, channels, time]`.
    pub(crate) fn forward(&self, x: &Tensor) -> Tensor {
        x.conv1d(&self.w, Some(&self.b), [self.stride], [1], [1], 1)
    }
}

/// Sizes of a Whisper-style encoder.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EncoderDims {
    /// Mel bins in.
    pub n_mels: usize,
    /// Model width.
    pub d_model: usize,
    /// Transformer blocks.
    pub layers: usize,
    /// Attention heads.
    pub heads: usize,
    /// MLP width.
    pub ffn: usize,
}

/// An integer field `k` of an `audio_config` JSON object.
pub(crate) fn json_usize(audio: &Value, k: &str) -> Result<usize> {
    audio
        .get(k)
        .and_then(Value::as_u64)
        .map(|v| v as usize)
        .ok_or_else(|| config_err(&format!("audio_config.{k}"), "missing or not an integer"))
}

impl EncoderDims {
    /// The encoder sizes of an `audio_config` JSON object, whose fields for mel bins, width,
    /// blocks, heads and MLP width are named `keys` (Voxtral and Qwen2.5-Omni name them
    /// differently); rejects an activation other than GELU and `heads ∤ d_model`.
    ///
    /// # Errors
    /// [`crate::Error::Config`] for a missing field, another activation or bad head counts.
    pub(crate) fn from_json(audio: &Value, keys: [&str; 5]) -> Result<Self> {
        if let Some(act) =
            audio.get("activation_function").and_then(Value::as_str).filter(|a| *a != "gelu")
        {
            return Err(config_err(
                "audio_config.activation_function",
                format!("`{act}` unsupported (gelu only)"),
            ));
        }
        let [n_mels, d_model, layers, heads, ffn] = keys.map(|k| json_usize(audio, k));
        let dims =
            Self { n_mels: n_mels?, d_model: d_model?, layers: layers?, heads: heads?, ffn: ffn? };
        if dims.heads == 0 || !dims.d_model.is_multiple_of(dims.heads) {
            return Err(config_err("audio_config", format!("{dims:?}: need heads | d_model")));
        }
        Ok(dims)
    }
}

/// The convolutional stem: conv(k3, s1) → GELU → conv(k3, s2) → GELU, halving time.
#[derive(Debug)]
pub(crate) struct ConvStem {
    conv1: Conv3,
    conv2: Conv3,
}

impl ConvStem {
    pub(crate) fn load(w: &Weights<'_>, p: &str, dims: EncoderDims) -> Result<Self> {
        Ok(Self {
            conv1: Conv3::load(w, &format!("{p}conv1"), dims.d_model, dims.n_mels, 1)?,
            conv2: Conv3::load(w, &format!("{p}conv2"), dims.d_model, dims.d_model, 2)?,
        })
    }

    /// `[batch, n_mels, frames]` → `[batch, ⌈frames / 2⌉, d_model]`.
    pub(crate) fn forward(&self, mel: &Tensor) -> Tensor {
        let x = self.conv1.forward(mel).gelu("none");
        self.conv2.forward(&x).gelu("none").permute([0, 2, 1])
    }
}

/// One pre-LN encoder block.
#[derive(Debug)]
struct Block {
    ln1: LayerNorm,
    q: Linear,
    k: Linear,
    v: Linear,
    o: Linear,
    ln2: LayerNorm,
    fc1: Linear,
    fc2: Linear,
    heads: i64,
}

impl Block {
    fn load(w: &Weights<'_>, p: &str, dims: EncoderDims) -> Result<Self> {
        let d = dims.d_model;
        let lin =
            |name: &str, out, inp, bias| Linear::load(w, &format!("{p}{name}"), out, inp, bias);
        Ok(Self {
            ln1: LayerNorm::load(w, &format!("{p}self_attn_layer_norm"), d)?,
            q: lin("self_attn.q_proj", d, d, true)?,
            k: lin("self_attn.k_proj", d, d, false)?,
            v: lin("self_attn.v_proj", d, d, true)?,
            o: lin("self_attn.out_proj", d, d, true)?,
            ln2: LayerNorm::load(w, &format!("{p}final_layer_norm"), d)?,
            fc1: lin("fc1", dims.ffn, d, true)?,
            fc2: lin("fc2", d, dims.ffn, true)?,
            heads: dims.heads as i64,
        })
    }

    /// `x`: `[batch, time, d]`; attention is bidirectional within each batch row.
    fn forward(&self, x: &Tensor) -> Tensor {
        let h = self.ln1.forward(x);
        let (b, t, d) = x.size3().expect("encoder activations are [batch, time, d]");
        let hd = d / self.heads;
        let split = |y: Tensor| y.view([b, t, self.heads, hd]).transpose(1, 2);
        let q = split(self.q.forward(&h) * (hd as f64).powf(-0.5));
        let k = split(self.k.forward(&h));
        let v = split(self.v.forward(&h));
        let att = q.matmul(&k.transpose(-2, -1)).softmax(-1, Kind::Float).to_kind(q.kind());
        let a = att.matmul(&v).transpose(1, 2).reshape([b, t, d]);
        let x = x + self.o.forward(&a);
        let m = self.fc2.forward(&self.fc1.forward(&self.ln2.forward(&x)).gelu("none"));
        x + m
    }
}

/// The stack of encoder blocks (`{prefix}layers.{i}.…`).
#[derive(Debug)]
pub(crate) struct Blocks {
    blocks: Vec<Block>,
}

impl Blocks {
    pub(crate) fn load(w: &Weights<'_>, p: &str, dims: EncoderDims) -> Result<Self> {
        let blocks = (0..dims.layers)
            .map(|i| Block::load(w, &format!("{p}layers.{i}."), dims))
            .collect::<Result<_>>()?;
        Ok(Self { blocks })
    }

    /// Runs every block over `[batch, time, d]`.
    pub(crate) fn forward(&self, x: &Tensor) -> Tensor {
        self.blocks.iter().fold(x.shallow_clone(), |h, blk| blk.forward(&h))
    }
}
