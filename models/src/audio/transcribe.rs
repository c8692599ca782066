//! Transcription with an audio LLM (WnW §3.1, §3.5): WAV → log-mel → audio embeddings →
//! prompt with the audio span → libtorch prefill into a [`KvCache`] → greedy decode through
//! the cache. Reports the prompt's audio span, prefill and per-token decode time, and the
//! cache's bytes, so `kvtide transcribe` can compare caches on the same input.

use std::ops::Range;
use std::path::Path;
use std::time::Instant;

use super::{AudioLlm, read_wav};
use crate::cache::{CacheBytes, KvCache};
use crate::error::{Result, TorchOp};
use crate::llama::{DecodeScratch, NoObserver};
use crate::session::generate::{Generation, greedy_loop};

/// A prepared transcription input: the prompt ids, where the audio sits, and its embeddings.
pub struct AudioPrompt {
    /// Prompt token ids (audio placeholders included).
    pub ids: Vec<u32>,
    /// Positions of the audio placeholders.
    pub audio_span: Range<usize>,
    /// Audio embeddings `[audio_span.len(), hidden]`.
    pub audio: tch::Tensor,
    /// Seconds of audio.
    pub seconds: f64,
}

impl AudioPrompt {
    /// Reads `wav`, resamples to 16 kHz, computes the model's log-mel and audio embeddings
    /// and builds the transcription prompt.
    ///
    /// # Errors
    /// [`crate::Error::Audio`] for unreadable or empty audio; forward errors.
    pub fn from_wav(model: &AudioLlm, wav: &Path) -> Result<Self> {
        let audio = read_wav(wav)?.to_16k()?;
        Self::from_samples(model, &audio.samples)
    }

    /// As [`AudioPrompt::from_wav`] from 16 kHz mono samples.
    ///
    /// # Errors
    /// As [`AudioPrompt::from_wav`].
    pub fn from_samples(model: &AudioLlm, samples: &[f32]) -> Result<Self> {
        let mel = model.mel_extractor()?.compute(samples)?;
        let audio = model.audio_embeds(&mel)?;
        let n = audio.size()[0] as usize;
        let (ids, audio_span) = model.transcription_prompt(n);
        Ok(Self {
            ids,
            audio_span,
            audio,
            seconds: samples.len() as f64 / f64::from(super::mel::SAMPLE_RATE),
        })
    }
}

/// The result of one transcription run.
#[derive(Clone, Debug)]
pub struct Transcription {
    /// Greedy output (ids, stop reason, timings).
    pub generation: Generation,
    /// Cache bytes after prefill.
    pub bytes_after_prefill: CacheBytes,
    /// The cache's own figures after prefill ([`KvCache::stats`]: e.g. a tiered store's
    /// prefill-time `r_gpu`).
    pub stats_after_prefill: Vec<(&'static str, f64)>,
    /// Cache bytes at the end.
    pub bytes_at_end: CacheBytes,
}

impl Transcription {
    /// Mean decode time per generated token in milliseconds.
    pub fn ms_per_token(&self) -> f64 {
        let steps = self.generation.ids.len().saturating_sub(1).max(1) as f64;
        1e3 * self.generation.decode_s / steps
    }
}

/// Greedy decoding of up to `max_new_tokens` after `prompt`, through `cache` (which must
/// be empty), stopping after any id in `stop`; `on_token` sees each id as produced.
///
/// # Errors
/// [`crate::Error::InvalidInput`] for a non-empty cache; forward and cache errors.
pub fn greedy(
    model: &AudioLlm,
    prompt: &AudioPrompt,
    cache: &mut dyn KvCache,
    max_new_tokens: usize,
    stop: &[u32],
    on_token: &mut dyn FnMut(u32) -> Result<()>,
) -> Result<Transcription> {
    if !cache.is_empty() {
        return Err(crate::error::invalid(
            "transcribe",
            format!("cache already holds {} tokens", cache.len()),
        ));
    }
    cache.reserve(prompt.ids.len() + max_new_tokens)?;
    let t0 = Instant::now();
    let logits = model
        .prefill(&prompt.ids, &prompt.audio, Some(&mut *cache), &mut NoObserver, false)?
        .f_squeeze_dim(0)
        .op("squeeze")?;
    let prefill_s = t0.elapsed().as_secs_f64();
    let (bytes_after_prefill, stats_after_prefill) = (cache.bytes(), cache.stats());
    let mut scratch = DecodeScratch::new(model.config())?;
    let t1 = Instant::now();
    let mut position = prompt.ids.len();
    let mut step = |id: u32| {
        let logits = model.text().decode(id, position, &mut *cache, &mut scratch)?;
        position += 1;
        logits.f_squeeze_dim(0).op("squeeze")
    };
    let (ids, stop) = greedy_loop(logits, max_new_tokens, stop, on_token, &mut step)?;
    let generation = Generation { ids, stop, prefill_s, decode_s: t1.elapsed().as_secs_f64() };
    Ok(Transcription {
        generation,
        bytes_after_prefill,
        stats_after_prefill,
        bytes_at_end: cache.bytes(),
    })
}
