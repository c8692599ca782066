//! Qwen2.5-Omni-thinker's audio encoder (WnW §3.1 cross-model backbone, Qwen2.5-Omni-3B:
//! `r_tok = 25`). The valid mel frames of each audio are cut into chunks of `2 · n_window`
//! frames (2 s; the last may be shorter); each chunk goes through the conv stem on its own
//! (zero padding at its edges), gets sinusoidal positions restarting at 0, and attends only
//! within itself (block-diagonal attention). The chunks are concatenated again, adjacent
//! frames are averaged in pairs (stride-2 pooling), then `ln_post` and `proj` map to the text
//! width: `((L − 1) / 2 + 1 − 2) / 2 + 1` embeddings for `L` mel frames.
//! Checkpoint names: `audio_tower.*` (or `thinker.audio_tower.*`).

use serde_json::Value;
use tch::{Kind, Tensor};

use super::audio_err;
use super::encoder::{Blocks, ConvStem, EncoderDims, LayerNorm, Linear, json_usize};
use crate::Result;
use crate::error::config_err;
use crate::load::weights::Weights;

/// Omni audio-encoder hyper-parameters (`audio_config` of the thinker config).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OmniAudioConfig {
    /// Encoder sizes.
    pub dims: EncoderDims,
    /// Half the chunk length in mel frames (100 → 2 s chunks).
    pub n_window: usize,
    /// Length of the sinusoidal position table.
    pub max_source_positions: usize,
    /// Output width (the text hidden size).
    pub output_dim: usize,
}

impl OmniAudioConfig {
    /// Reads `audio_config` from a thinker `config.json` value.
    ///
    /// # Errors
    /// [`crate::Error::Config`] for missing or inconsistent fields.
    pub fn from_json(audio: &Value) -> Result<Self> {
        const KEYS: [&str; 5] = [
            "num_mel_bins",
            "d_model",
            "encoder_layers",
            "encoder_attention_heads",
            "encoder_ffn_dim",
        ];
        let dims = EncoderDims::from_json(audio, KEYS)?;
        let cfg = Self {
            dims,
            n_window: json_usize(audio, "n_window")?,
            max_source_positions: json_usize(audio, "max_source_positions")?,
            output_dim: json_usize(audio, "output_dim")?,
        };
        if !dims.d_model.is_multiple_of(2)
            || cfg.n_window == 0
            || cfg.max_source_positions < cfg.n_window
        {
            return Err(config_err(
                "audio_config",
                format!(
                    "{cfg:?}: need even d_model, n_window ≥ 1, max_source_positions ≥ n_window"
                ),
            ));
        }
        Ok(cfg)
    }

    /// Audio tokens for `frames` valid mel frames.
    pub fn tokens_for_frames(frames: usize) -> usize {
        let after_conv = frames.saturating_sub(1) / 2 + 1;
        if after_conv < 2 { 0 } else { (after_conv - 2) / 2 + 1 }
    }
}

/// Whisper's sinusoid table: row `t` = `[sin(t·ω_i), cos(t·ω_i)]`,
/// `ω_i = exp(−i · ln(10⁴) / (C/2 − 1))`.
pub fn sinusoids(length: usize, channels: usize) -> Tensor {
    let half = channels / 2;
    let inc = 10_000f64.ln() / (half.max(2) - 1) as f64;
    let mut data = Vec::with_capacity(length * channels);
    for t in 0..length {
        let row: Vec<f64> = (0..half).map(|i| t as f64 * (-inc * i as f64).exp()).collect();
        data.extend(row.iter().map(|x| x.sin() as f32));
        data.extend(row.iter().map(|x| x.cos() as f32));
    }
    Tensor::from_slice(&data).view([length as i64, channels as i64])
}

/// The Omni audio tower.
#[derive(Debug)]
pub struct OmniAudio {
    cfg: OmniAudioConfig,
    stem: ConvStem,
    positions: Tensor,
    blocks: Blocks,
    ln_post: LayerNorm,
    proj: Linear,
}

impl OmniAudio {
    /// Loads `audio_tower.*` (the unused `audio_bos_eos_token` table is ignored).
    ///
    /// # Errors
    /// [`crate::Error::MissingTensor`] / [`crate::Error::TensorShape`].
    pub fn load(w: &Weights<'_>, cfg: OmniAudioConfig) -> Result<Self> {
        let p = "audio_tower.";
        let d = cfg.dims.d_model;
        Ok(Self {
            cfg,
            stem: ConvStem::load(w, p, cfg.dims)?,
            positions: sinusoids(cfg.max_source_positions, d).to_kind(w.kind()),
            blocks: Blocks::load(w, p, cfg.dims)?,
            ln_post: LayerNorm::load(w, "audio_tower.ln_post", d)?,
            proj: Linear::load(w, "audio_tower.proj", cfg.output_dim, d, true)?,
        })
    }

    /// The configuration.
    pub fn config(&self) -> OmniAudioConfig {
        self.cfg
    }

    /// Embeddings `[tokens_for_frames(L), output_dim]` of one audio's valid mel frames
    /// `[n_mels, L]`.
    ///
    /// # Errors
    /// [`crate::Error::Audio`] for a wrong bin count or fewer than 3 frames.
    pub fn embed(&self, mel: &Tensor) -> Result<Tensor> {
        let size = mel.size();
        if size.len() != 2 || size[0] != self.cfg.dims.n_mels as i64 || size[1] < 3 {
            return Err(audio_err(
                "OmniAudio::embed",
                format!("mel shape {size:?}, expected [{}, ≥ 3 frames]", self.cfg.dims.n_mels),
            ));
        }
        let frames = size[1];
        let chunk = 2 * self.cfg.n_window as i64;
        let full = frames / chunk;
        let mel = mel.to_kind(self.positions.kind());
        let mut parts = Vec::with_capacity(2);
        if full > 0 {
            // [n_mels, full·chunk] → [full, n_mels, chunk]
            let x = mel.narrow(1, 0, full * chunk).view([-1, full, chunk]).permute([1, 0, 2]);
            parts.push(self.chunks(&x).reshape([-1, self.cfg.dims.d_model as i64]));
        }
        if frames % chunk != 0 {
            let tail = mel.narrow(1, full * chunk, frames % chunk).unsqueeze(0);
            parts.push(self.chunks(&tail).squeeze_dim(0));
        }
        let h = Tensor::cat(&parts, 0);
        let pooled = OmniAudioConfig::tokens_for_frames(frames as usize) as i64;
        let pairs =
            h.narrow(0, 0, 2 * pooled).view([pooled, 2, -1]).mean_dim(1, false, None::<Kind>);
        Ok(self.proj.forward(&self.ln_post.forward(&pairs)))
    }

    /// Conv stem, chunk-local positions and transformer for equal-length chunks
    /// `[n, n_mels, len]` → `[n, ⌈len/2⌉, d]`.
    fn chunks(&self, x: &Tensor) -> Tensor {
        let h = self.stem.forward(x);
        let t = h.size()[1];
        self.blocks.forward(&(h + self.positions.narrow(0, 0, t)))
    }
}
