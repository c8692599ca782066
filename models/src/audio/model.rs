//! An audio LLM: one of the two WnW backbones (§3.1) loaded from a Hugging Face checkpoint
//! directory — Voxtral (`VoxtralForConditionalGeneration`: Whisper encoder + projector +
//! Llama/Mistral decoder, `r_tok = 12.5`) or Qwen2.5-Omni-thinker (chunked audio encoder +
//! Qwen2 decoder with M-RoPE, `r_tok = 25`). The audio embeddings replace the embeddings of
//! the audio placeholder tokens in order (`masked_scatter`), and the text decoder (the
//! crate's [`Llama`]) runs from those input embeddings, so every cache the decoder supports
//! serves the audio models too; the placeholder run is the audio span WnW manages.

use std::ops::Range;
use std::path::Path;

use serde_json::Value;
use tch::{Kind, Tensor};

use super::audio_err;
use super::mrope;
use super::names::Renamed;
use super::omni::{OmniAudio, OmniAudioConfig};
use super::voxtral::{VoxtralAudio, VoxtralAudioConfig};
use super::{LogMel, LogMelExtractor};
use crate::cache::KvCache;
use crate::error::{Error, Result, TorchOp, config_err};
use crate::llama::{Llama, PrefillObserver};
use crate::load::config::ModelConfig;
use crate::load::weights::{SafetensorsSource, WeightSource, Weights};

/// Which audio LLM family a checkpoint is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backbone {
    /// Voxtral (Mistral): 12.5 audio tokens per second.
    Voxtral,
    /// Qwen2.5-Omni thinker: 25 audio tokens per second.
    Omni,
}

impl Backbone {
    /// Audio tokens per second of audio (`r_tok`, WnW §2).
    pub fn tokens_per_second(self) -> f64 {
        match self {
            Self::Voxtral => 12.5,
            Self::Omni => 25.0,
        }
    }

    /// `K` of the voice-score hit ratio (Appendix E): about one spoken word.
    pub fn voice_top_k(self) -> usize {
        match self {
            Self::Voxtral => 4,
            Self::Omni => 8,
        }
    }
}

/// Placeholder and control token ids of the transcription prompt.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PromptIds {
    /// Tokens before the audio placeholders.
    pub before: Vec<u32>,
    /// The audio placeholder token.
    pub audio: u32,
    /// Tokens after the audio placeholders (the end of the prompt).
    pub after: Vec<u32>,
}

enum Tower {
    Voxtral(VoxtralAudio),
    Omni(OmniAudio),
}

/// An audio LLM ready to run.
pub struct AudioLlm {
    backbone: Backbone,
    tower: Tower,
    text: Llama,
    prompt: PromptIds,
    mrope_sections: Option<[usize; 3]>,
}

impl AudioLlm {
    /// Loads `dir/config.json` and the safetensors weights beside it.
    ///
    /// # Errors
    /// [`Error::Io`] / [`Error::Json`] for unreadable files, [`Error::Config`] for an
    /// unsupported or inconsistent configuration, weight errors naming the tensor.
    pub fn load(dir: &Path) -> Result<Self> {
        let path = dir.join("config.json");
        let text = crate::error::read_text_file(&path)?;
        let cfg: Value = serde_json::from_str(&text)
            .map_err(|source| Error::Json { what: path.display().to_string(), source })?;
        let src = SafetensorsSource::open_dir(dir)?;
        Self::from_parts(&cfg, &src)
    }

    /// Builds the model from a parsed `config.json` and a weight source.
    ///
    /// # Errors
    /// As [`AudioLlm::load`].
    pub fn from_parts(cfg: &Value, src: &dyn WeightSource) -> Result<Self> {
        let model_type = cfg.get("model_type").and_then(Value::as_str).unwrap_or_default();
        match model_type {
            "voxtral" => Self::voxtral(cfg, src),
            "qwen2_5_omni_thinker" => Self::omni(cfg, src),
            "qwen2_5_omni" => Self::omni(
                cfg.get("thinker_config").ok_or_else(|| config_err("thinker_config", "missing"))?,
                src,
            ),
            other => Err(config_err(
                "model_type",
                format!("`{other}` is not an audio LLM (voxtral, qwen2_5_omni[_thinker])"),
            )),
        }
    }

    fn voxtral(cfg: &Value, src: &dyn WeightSource) -> Result<Self> {
        let text_cfg = text_config(cfg, VOXTRAL_TEXT_DEFAULTS, None)?;
        let audio_cfg = VoxtralAudioConfig::from_json(
            cfg.get("audio_config").ok_or_else(|| config_err("audio_config", "missing"))?,
        )?;
        let view = Renamed::voxtral(src);
        let tower =
            VoxtralAudio::load(&Weights::new(&view, Kind::Float), audio_cfg, text_cfg.hidden_size)?;
        let audio = id(cfg, &["audio_token_id"]).unwrap_or(24);
        // mistral-common's transcription request: <s> [INST] [BEGIN_AUDIO] [AUDIO]… [/INST] [TRANSCRIBE]
        let prompt = PromptIds { before: vec![1, 3, 25], audio, after: vec![4, 34] };
        Ok(Self {
            backbone: Backbone::Voxtral,
            tower: Tower::Voxtral(tower),
            text: Llama::load(&view, &text_cfg)?,
            prompt,
            mrope_sections: None,
        })
    }

    fn omni(cfg: &Value, src: &dyn WeightSource) -> Result<Self> {
        let sections = mrope_sections(cfg)?;
        let text_cfg = text_config(cfg, &[], Some("qwen2"))?;
        let audio_cfg = OmniAudioConfig::from_json(
            cfg.get("audio_config").ok_or_else(|| config_err("audio_config", "missing"))?,
        )?;
        if audio_cfg.output_dim != text_cfg.hidden_size {
            return Err(config_err(
                "audio_config.output_dim",
                format!("{} ≠ text hidden size {}", audio_cfg.output_dim, text_cfg.hidden_size),
            ));
        }
        let view = Renamed::omni(src);
        let tower = OmniAudio::load(&Weights::new(&view, Kind::Float), audio_cfg)?;
        let audio = id(cfg, &["audio_token_index", "audio_token_id"])
            .ok_or_else(|| config_err("audio_token_index", "missing"))?;
        let bos = id(cfg, &["audio_start_token_id"])
            .ok_or_else(|| config_err("audio_start_token_id", "missing"))?;
        let eos = id(cfg, &["audio_end_token_id"])
            .ok_or_else(|| config_err("audio_end_token_id", "missing"))?;
        let prompt = PromptIds { before: vec![bos], audio, after: vec![eos] };
        Ok(Self {
            backbone: Backbone::Omni,
            tower: Tower::Omni(tower),
            text: Llama::load(&view, &text_cfg)?,
            prompt,
            mrope_sections: Some(sections),
        })
    }

    /// The backbone family.
    pub fn backbone(&self) -> Backbone {
        self.backbone
    }

    /// The text decoder.
    pub fn text(&self) -> &Llama {
        &self.text
    }

    /// The text decoder's configuration.
    pub fn config(&self) -> &ModelConfig {
        self.text.config()
    }

    /// The transcription prompt's token ids (the audio placeholder repeated by the caller).
    pub fn prompt_ids(&self) -> &PromptIds {
        &self.prompt
    }

    /// Replaces the default prompt (e.g. with ids from the model's own tokenizer).
    pub fn set_prompt_ids(&mut self, prompt: PromptIds) {
        self.prompt = prompt;
    }

    /// Mel bins the audio tower expects.
    pub fn n_mels(&self) -> usize {
        match &self.tower {
            Tower::Voxtral(t) => t.config().dims.n_mels,
            Tower::Omni(t) => t.config().dims.n_mels,
        }
    }

    /// The log-mel front end for this model.
    ///
    /// # Errors
    /// Never for a loaded model (its bin count is validated).
    pub fn mel_extractor(&self) -> Result<LogMelExtractor> {
        LogMelExtractor::new(self.n_mels())
    }

    /// Audio embeddings `[n_audio, hidden]` of one input's log-mel: Voxtral encodes every
    /// window and concatenates; Omni encodes the valid frames.
    ///
    /// # Errors
    /// [`Error::Audio`] for a wrong bin count or too little audio.
    pub fn audio_embeds(&self, mel: &LogMel) -> Result<Tensor> {
        let _guard = tch::no_grad_guard();
        match &self.tower {
            Tower::Voxtral(t) => t.embed(&t.windows(mel)?),
            Tower::Omni(t) => {
                if mel.n_mels() != t.config().dims.n_mels {
                    return Err(audio_err(
                        "AudioLlm::audio_embeds",
                        format!(
                            "{} mel bins, model expects {}",
                            mel.n_mels(),
                            t.config().dims.n_mels
                        ),
                    ));
                }
                let frames = mel.valid_frames();
                let data = mel.leading(frames);
                t.embed(&Tensor::from_slice(&data).view([mel.n_mels() as i64, frames as i64]))
            }
        }
    }

    /// Audio embeddings from precomputed features: Voxtral `[windows, n_mels, frames]`,
    /// Omni `[n_mels, valid_frames]` (one audio).
    ///
    /// # Errors
    /// [`Error::Audio`] for mis-shaped features.
    pub fn audio_embeds_from_features(&self, features: &Tensor) -> Result<Tensor> {
        let _guard = tch::no_grad_guard();
        match &self.tower {
            Tower::Voxtral(t) => t.embed(features),
            Tower::Omni(t) => t.embed(features),
        }
    }

    /// The transcription prompt for `n_audio` audio tokens and the span they occupy.
    pub fn transcription_prompt(&self, n_audio: usize) -> (Vec<u32>, Range<usize>) {
        let p = &self.prompt;
        let mut ids = p.before.clone();
        let start = ids.len();
        ids.extend(std::iter::repeat_n(p.audio, n_audio));
        ids.extend(&p.after);
        (ids, start..start + n_audio)
    }

    /// Token embeddings of `ids` with the rows of `audio` (`[n_audio, hidden]`) written at
    /// the audio placeholder positions, in order.
    ///
    /// # Errors
    /// [`Error::Audio`] if the placeholder count differs from the audio rows;
    /// [`Error::InvalidInput`] for ids out of range.
    pub fn splice(&self, ids: &[u32], audio: &Tensor) -> Result<Tensor> {
        let slots: Vec<i64> = ids
            .iter()
            .enumerate()
            .filter(|&(_, &t)| t == self.prompt.audio)
            .map(|(i, _)| i as i64)
            .collect();
        let rows = audio.size().first().copied().unwrap_or(0);
        if slots.len() as i64 != rows {
            return Err(audio_err(
                "AudioLlm::splice",
                format!("{} audio placeholders, {rows} audio embeddings", slots.len()),
            ));
        }
        let h = self.text.embed(ids)?;
        let index = Tensor::from_slice(&slots);
        h.f_index_copy(0, &index, &audio.to_kind(h.kind())).op("splice audio")
    }

    /// Rotary tables `[len, head_dim]` for positions `start..start+len`: plain RoPE for
    /// Voxtral, M-RoPE (all rows equal for audio + text) for Omni.
    ///
    /// # Errors
    /// Shape errors from the rotary builders.
    pub fn rope_tables(&self, start: usize, len: usize) -> Result<(Tensor, Tensor)> {
        match self.mrope_sections {
            None => self.text.rope().tables(start, len),
            Some(s) => {
                self.mrope_tables(&mrope::audio_text_positions(start as i64, len as i64), &s)
            }
        }
    }

    /// M-RoPE tables for arbitrary position rows `[3, len]` (Omni only).
    ///
    /// # Errors
    /// [`Error::Audio`] for Voxtral or mis-shaped positions.
    pub fn mrope_tables(
        &self,
        positions: &Tensor,
        sections: &[usize; 3],
    ) -> Result<(Tensor, Tensor)> {
        let cfg = self.text.config();
        mrope::cos_sin(positions, cfg.head_dim, cfg.rope.theta, sections)
    }

    /// M-RoPE sections `[s_t, s_h, s_w]` (Omni only).
    pub fn mrope_sections(&self) -> Option<[usize; 3]> {
        self.mrope_sections
    }

    /// Prefill of `ids` with `audio` spliced in, positions `0..n`: fills `cache`, reports
    /// to `obs`, returns logits `[n, vocab]` (`all_logits`) or `[1, vocab]`.
    ///
    /// # Errors
    /// As [`AudioLlm::splice`] and the decoder's prefill.
    pub fn prefill(
        &self,
        ids: &[u32],
        audio: &Tensor,
        cache: Option<&mut dyn KvCache>,
        obs: &mut dyn PrefillObserver,
        all_logits: bool,
    ) -> Result<Tensor> {
        let _guard = tch::no_grad_guard();
        let h = self.splice(ids, audio)?;
        let tables = self.rope_tables(0, ids.len())?;
        self.text.prefill_embeds(&h, tables, cache, obs, all_logits)
    }
}

/// Voxtral's defaults for keys a `text_config` may omit (transformers' `VoxtralConfig`).
const VOXTRAL_TEXT_DEFAULTS: &[(&str, f64)] = &[
    ("vocab_size", 131072.0),
    ("hidden_size", 3072.0),
    ("intermediate_size", 8192.0),
    ("num_hidden_layers", 30.0),
    ("num_attention_heads", 32.0),
    ("num_key_value_heads", 8.0),
    ("max_position_embeddings", 131072.0),
    ("rms_norm_eps", 1e-5),
    ("rope_theta", 1e8),
    ("head_dim", 128.0),
];

/// The decoder's [`ModelConfig`] from `text_config` (defaults filled, `model_type` replaced).
fn text_config(
    cfg: &Value,
    defaults: &[(&str, f64)],
    model_type: Option<&str>,
) -> Result<ModelConfig> {
    let mut text =
        cfg.get("text_config").cloned().ok_or_else(|| config_err("text_config", "missing"))?;
    let obj = text.as_object_mut().ok_or_else(|| config_err("text_config", "not an object"))?;
    for &(k, v) in defaults {
        if !obj.contains_key(k) {
            let n = if v.fract() == 0.0 { Value::from(v as u64) } else { Value::from(v) };
            obj.insert(k.to_string(), n);
        }
    }
    obj.entry("model_type").or_insert_with(|| Value::from("llama"));
    if let Some(t) = model_type {
        obj.insert("model_type".into(), Value::from(t));
    }
    ModelConfig::from_hf_json(&text.to_string())
}

fn mrope_sections(cfg: &Value) -> Result<[usize; 3]> {
    let text = cfg.get("text_config").ok_or_else(|| config_err("text_config", "missing"))?;
    let s = text
        .get("rope_parameters")
        .or_else(|| text.get("rope_scaling"))
        .and_then(|p| p.get("mrope_section"))
        .and_then(Value::as_array)
        .ok_or_else(|| config_err("text_config.rope_parameters.mrope_section", "missing"))?;
    let v: Vec<usize> = s.iter().filter_map(Value::as_u64).map(|x| x as usize).collect();
    match v.as_slice() {
        &[a, b, c] => Ok([a, b, c]),
        _ => Err(config_err("mrope_section", format!("{s:?}: need 3 integers"))),
    }
}

fn id(cfg: &Value, keys: &[&str]) -> Option<u32> {
    keys.iter().find_map(|k| cfg.get(*k).and_then(Value::as_u64)).map(|v| v as u32)
}
