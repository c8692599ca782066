//! Voxtral's audio path (WnW §3.1 main backbone, Voxtral-mini-3b: `r_tok = 12.5`): a Whisper
//! encoder over 30 s log-mel windows (conv stem, learned positions, pre-LN blocks, final
//! LayerNorm; 1500 frames per window) and the projector that stacks 4 consecutive frames
//! (`reshape(-1, 4·d_audio)`) → linear → GELU → linear into the text width, giving 375 audio
//! embeddings per window. Windows are encoded independently and concatenated in time, as
//! `VoxtralForConditionalGeneration` does. Checkpoint names: `audio_tower.*`,
//! `multi_modal_projector.linear_{1,2}.weight`.

use serde_json::Value;
use tch::{Kind, Tensor};

use super::audio_err;
use super::encoder::{Blocks, ConvStem, EncoderDims, LayerNorm, Linear, json_usize};
use crate::Result;
use crate::error::config_err;
use crate::load::weights::Weights;

/// Frames stacked by the projector.
pub const STACK: usize = 4;

/// Voxtral audio hyper-parameters (`audio_config` of a `VoxtralConfig`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VoxtralAudioConfig {
    /// Encoder sizes.
    pub dims: EncoderDims,
    /// Encoder frames per window (1500: a window is `2 ·` this many mel frames).
    pub max_source_positions: usize,
    /// Projector input width (`intermediate_size`, must be `4 · d_model`).
    pub projector_in: usize,
}

impl VoxtralAudioConfig {
    /// Reads `audio_config` from a Voxtral `config.json` value.
    ///
    /// # Errors
    /// [`crate::Error::Config`] for missing fields, an activation other than GELU, or
    /// `intermediate_size ≠ 4 · hidden_size` (the projector stacks 4 frames).
    pub fn from_json(audio: &Value) -> Result<Self> {
        const KEYS: [&str; 5] = [
            "num_mel_bins",
            "hidden_size",
            "num_hidden_layers",
            "num_attention_heads",
            "intermediate_size",
        ];
        let dims = EncoderDims::from_json(audio, KEYS)?;
        let cfg = Self {
            dims,
            max_source_positions: json_usize(audio, "max_source_positions")?,
            projector_in: dims.ffn,
        };
        // Checked: the counts come from a file (`4 · d_model` or `2 · max_source_positions`
        // overflowing is a bad config, not a panic).
        if dims.d_model.checked_mul(STACK) != Some(cfg.projector_in) {
            return Err(config_err(
                "audio_config.intermediate_size",
                format!("{} ≠ 4 × hidden_size {}", cfg.projector_in, dims.d_model),
            ));
        }
        if !cfg.max_source_positions.is_multiple_of(STACK)
            || cfg.max_source_positions.checked_mul(2).is_none()
        {
            return Err(config_err(
                "audio_config",
                format!(
                    "max_source_positions {}: need 4 | max_source_positions",
                    cfg.max_source_positions
                ),
            ));
        }
        Ok(cfg)
    }

    /// Mel frames per window (`2 · max_source_positions`; 3000 = 30 s for the real model).
    pub fn window_frames(&self) -> usize {
        2 * self.max_source_positions
    }

    /// Audio tokens per window (`max_source_positions / 4`; 375 for the real model).
    pub fn tokens_per_window(&self) -> usize {
        self.max_source_positions / STACK
    }
}

/// Voxtral's encoder + projector.
#[derive(Debug)]
pub struct VoxtralAudio {
    cfg: VoxtralAudioConfig,
    stem: ConvStem,
    positions: Tensor,
    blocks: Blocks,
    ln: LayerNorm,
    proj1: Linear,
    proj2: Linear,
}

impl VoxtralAudio {
    /// Loads `audio_tower.*` and `multi_modal_projector.*` for text width `text_hidden`.
    ///
    /// # Errors
    /// [`crate::Error::MissingTensor`] / [`crate::Error::TensorShape`] for a mismatched
    /// checkpoint.
    pub fn load(w: &Weights<'_>, cfg: VoxtralAudioConfig, text_hidden: usize) -> Result<Self> {
        let d = cfg.dims.d_model;
        let p = "audio_tower.";
        Ok(Self {
            cfg,
            stem: ConvStem::load(w, p, cfg.dims)?,
            positions: w
                .get("audio_tower.embed_positions.weight", &[cfg.max_source_positions, d])?,
            blocks: Blocks::load(w, p, cfg.dims)?,
            ln: LayerNorm::load(w, "audio_tower.layer_norm", d)?,
            proj1: Linear::load(
                w,
                "multi_modal_projector.linear_1",
                text_hidden,
                cfg.projector_in,
                false,
            )?,
            proj2: Linear::load(
                w,
                "multi_modal_projector.linear_2",
                text_hidden,
                text_hidden,
                false,
            )?,
        })
    }

    /// The configuration.
    pub fn config(&self) -> VoxtralAudioConfig {
        self.cfg
    }

    /// Encoder output `[windows, max_source_positions, d_audio]` for mel windows
    /// `[windows, n_mels, window_frames]`.
    ///
    /// # Errors
    /// [`crate::Error::Audio`] if `mel` has the wrong shape.
    pub fn encode(&self, mel: &Tensor) -> Result<Tensor> {
        let want = [self.cfg.dims.n_mels as i64, self.cfg.window_frames() as i64];
        let size = mel.size();
        if size.len() != 3 || size[1..] != want || size[0] == 0 {
            return Err(audio_err(
                "VoxtralAudio::encode",
                format!("mel shape {size:?}, expected [windows ≥ 1, {}, {}]", want[0], want[1]),
            ));
        }
        let x = self.stem.forward(&mel.to_kind(self.positions.kind())) + &self.positions;
        Ok(self.ln.forward(&self.blocks.forward(&x)))
    }

    /// Audio embeddings `[windows · tokens_per_window, text_hidden]`: the encoder output of
    /// each window, 4 frames stacked, through the projector; windows concatenated in time.
    ///
    /// # Errors
    /// As [`VoxtralAudio::encode`].
    pub fn embed(&self, mel: &Tensor) -> Result<Tensor> {
        let enc = self.encode(mel)?;
        let stacked = enc.reshape([-1, self.cfg.projector_in as i64]);
        Ok(self.proj2.forward(&self.proj1.forward(&stacked).gelu("none")))
    }

    /// Mel windows of a [`super::LogMel`] as a `[windows, n_mels, window_frames]` tensor
    /// (30 s windows for the real model; see [`super::LogMel::split_windows`]).
    ///
    /// # Errors
    /// [`crate::Error::Audio`] if the mel has a different number of bins.
    pub fn windows(&self, mel: &super::LogMel) -> Result<Tensor> {
        if mel.n_mels() != self.cfg.dims.n_mels {
            return Err(audio_err(
                "VoxtralAudio::windows",
                format!("{} mel bins, model expects {}", mel.n_mels(), self.cfg.dims.n_mels),
            ));
        }
        let wf = self.cfg.window_frames();
        let (n, data) = mel.split_windows(wf);
        Ok(Tensor::from_slice(&data)
            .view([n as i64, mel.n_mels() as i64, wf as i64])
            .to_kind(Kind::Float))
    }
}
