//! Checkpoint layouts of the audio LLMs (WnW §3.1 backbones): the Hub/`save_pretrained`
//! layout of `VoxtralForConditionalGeneration` (`audio_tower.*`, `multi_modal_projector.*`,
//! `language_model.model.*`, `language_model.lm_head.weight`), transformers 5's in-memory
//! layout (`model.audio_tower.*`, `model.language_model.*`, `lm_head.weight`), and the
//! Qwen2.5-Omni thinker with or without the full model's `thinker.` prefix. A [`Renamed`]
//! source presents any of them under the canonical names the loaders ask for:
//! `audio_tower.*`, `multi_modal_projector.*`, and the text decoder's `model.*` / `lm_head.*`.

use tch::{Kind, Tensor};

use crate::Result;
use crate::load::weights::WeightSource;

/// A [`WeightSource`] view that rewrites canonical names by prefix rules.
pub struct Renamed<'a> {
    inner: &'a dyn WeightSource,
    rules: Vec<(&'static str, &'static str)>,
}

impl<'a> Renamed<'a> {
    /// Wraps `inner`; a requested name starting with `rules[i].0` (first match wins) is
    /// looked up with that prefix replaced by `rules[i].1`.
    pub fn new(inner: &'a dyn WeightSource, rules: Vec<(&'static str, &'static str)>) -> Self {
        Self { inner, rules }
    }

    /// The view for a Voxtral checkpoint, whichever layout it uses.
    pub fn voxtral(inner: &'a dyn WeightSource) -> Self {
        let rules = if inner.shape("model.language_model.embed_tokens.weight").is_some() {
            vec![
                ("audio_tower.", "model.audio_tower."),
                ("multi_modal_projector.", "model.multi_modal_projector."),
                ("model.", "model.language_model."),
            ]
        } else {
            vec![("model.", "language_model.model."), ("lm_head.", "language_model.lm_head.")]
        };
        Self::new(inner, rules)
    }

    /// The view for a Qwen2.5-Omni thinker checkpoint (alone, or inside the full Omni model
    /// under `thinker.`; the talker and vocoder weights are never read).
    pub fn omni(inner: &'a dyn WeightSource) -> Self {
        let rules = if inner.shape("thinker.model.embed_tokens.weight").is_some() {
            vec![("", "thinker.")]
        } else if inner.shape("model.language_model.embed_tokens.weight").is_some() {
            vec![("audio_tower.", "model.audio_tower."), ("model.", "model.language_model.")]
        } else {
            Vec::new()
        };
        Self::new(inner, rules)
    }

    fn map(&self, name: &str) -> String {
        for (from, to) in &self.rules {
            if let Some(rest) = name.strip_prefix(from) {
                return format!("{to}{rest}");
            }
        }
        name.to_string()
    }
}

impl WeightSource for Renamed<'_> {
    fn shape(&self, name: &str) -> Option<Vec<usize>> {
        self.inner.shape(&self.map(name))
    }

    fn load(&self, name: &str, kind: Kind) -> Result<Tensor> {
        self.inner.load(&self.map(name), kind).map_err(|e| match e {
            crate::Error::MissingTensor { .. } => crate::Error::MissingTensor {
                name: format!("{name} (stored as {})", self.map(name)),
            },
            other => other,
        })
    }

    fn describe(&self) -> String {
        format!("{} (renamed {:?})", self.inner.describe(), self.rules)
    }
}
