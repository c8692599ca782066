//! Head-role calibration of an audio LLM (`papers/wnw.txt` §2.2, §3.4, Appendix E): each
//! calibration clip becomes a teacher-forced [`SpanSample`] — the transcription prompt with
//! the clip's audio embeddings spliced in, followed by the reference transcript — whose span is
//! the audio; [`crate::calibrate::roles`] computes voice scores (word-aligned hit ratios, `K`
//! from the backbone) and head sensitivities (autograd), and [`default_triage`] picks the
//! paper's voice/anchor counts for a GPU budget. The roles file `kvtide transcribe --roles`
//! and the `tiered` caches read is kv-tiered's [`kv_tiered::HeadRoles`] JSON.

use kv_tiered::{RankingSignal, TriageConfig};

use crate::audio::{
    AnswerTokens, AudioLlm, AudioPrompt, MIN_WORD_SCORE, WordAlignment, align_answer, audio_err,
};
use crate::calibrate::roles::{
    RoleCalibrationConfig, RoleCalibrator, RoleScores, SampleStats, Sensitivity, SpanSample,
};
use crate::error::Result;

/// Audio calibration knobs.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AudioCalibration {
    /// Alignment-confidence floor for the voice score (0.85 in the paper).
    pub min_word_score: f64,
    /// Token granularity of the head sensitivity.
    pub sensitivity: Sensitivity,
}

impl Default for AudioCalibration {
    fn default() -> Self {
        Self { min_word_score: MIN_WORD_SCORE, sensitivity: Sensitivity::PerToken }
    }
}

/// The calibration sample of one clip (16 kHz mono `samples`) and its word alignment.
///
/// # Errors
/// [`crate::Error::Audio`] if a word lies past the audio or an answer token is the audio
/// placeholder or outside the vocabulary; front-end and forward errors.
pub fn span_sample(
    model: &AudioLlm,
    samples: &[f32],
    alignment: &WordAlignment,
    tokens: AnswerTokens<'_>,
    min_word_score: f64,
) -> Result<SpanSample> {
    let prompt = AudioPrompt::from_samples(model, samples)?;
    let rate = model.backbone().tokens_per_second();
    let answer = align_answer(alignment, tokens, rate, prompt.audio_span.len(), min_word_score)?;
    let (audio_id, vocab) = (model.prompt_ids().audio, model.config().vocab_size);
    if let Some(&t) = answer.ids.iter().find(|&&t| t == audio_id || t as usize >= vocab) {
        return Err(audio_err(
            "calibration sample",
            format!("answer token {t} is the audio placeholder {audio_id} or ≥ vocab size {vocab}"),
        ));
    }
    let mut ids = prompt.ids.clone();
    ids.extend(&answer.ids[..answer.ids.len() - 1]);
    let span = prompt.audio_span.clone();
    Ok(SpanSample {
        embeds: model.splice(&ids, &prompt.audio)?,
        tables: model.rope_tables(0, ids.len())?,
        span,
        answer_start: prompt.ids.len(),
        answer: answer.ids,
        aligned: answer.spans,
    })
}

/// Calibrates voice scores and head sensitivities over `clips` (16 kHz samples and word
/// alignment each); `on_sample` sees each clip's statistics.
///
/// # Errors
/// [`crate::Error::Audio`] without clips; as [`span_sample`] and
/// [`RoleCalibrator::add_sample`]; [`crate::Error::Tiered`] if no answer token was aligned.
pub fn calibrate(
    model: &AudioLlm,
    clips: &[(&[f32], &WordAlignment)],
    tokens: AnswerTokens<'_>,
    cfg: AudioCalibration,
    on_sample: &mut dyn FnMut(usize, &SampleStats),
) -> Result<RoleScores> {
    if clips.is_empty() {
        return Err(audio_err("calibrate roles", "no calibration clips"));
    }
    let rc = RoleCalibrationConfig {
        voice_top_k: model.backbone().voice_top_k(),
        sensitivity: cfg.sensitivity,
    };
    let mut cal = RoleCalibrator::new(model.config(), rc)?;
    for (i, (samples, alignment)) in clips.iter().enumerate() {
        let sample = span_sample(model, samples, alignment, tokens, cfg.min_word_score)?;
        let stats = cal.add_sample(model.text(), &sample)?;
        on_sample(i, &stats);
    }
    cal.scores()
}

/// The paper's triage counts scaled to a model with `heads = L·H_kv` KV-heads at target
/// `r_gpu` (§3.4: `n_voice` = 90/50/30/30 of Voxtral's 240 heads and 27/15/9/9 of Omni's 72 at
/// r_GPU 0.2/0.4/0.6/0.8 — the same fractions 0.375/0.208/0.125/0.125; the nearest level is
/// used), with `n_anchor = 5` (§2.2), kept below `n_voice` so at least one voice head is tidal
/// (a model with two or more heads gets at least two voice heads: one anchor, one tidal).
///
/// # Examples
/// ```
/// use models::calibrate::audio::default_triage;
/// let c = default_triage(240, 0.2);
/// assert_eq!((c.n_voice, c.n_anchor), (90, 5));
/// assert_eq!(default_triage(72, 0.4).n_voice, 15);
/// assert_eq!((default_triage(4, 0.2).n_voice, default_triage(4, 0.2).n_anchor), (2, 1));
/// // 4 · 50/240 rounds to 1 voice head: raised to 2 so one is tidal.
/// assert_eq!((default_triage(4, 0.4).n_voice, default_triage(4, 0.4).n_anchor), (2, 1));
/// assert_eq!((default_triage(1, 0.4).n_voice, default_triage(1, 0.4).n_anchor), (1, 1));
/// ```
pub fn default_triage(heads: usize, r_gpu: f64) -> TriageConfig {
    const LEVELS: [(f64, f64); 4] =
        [(0.2, 90.0 / 240.0), (0.4, 50.0 / 240.0), (0.6, 30.0 / 240.0), (0.8, 30.0 / 240.0)];
    let frac = LEVELS
        .iter()
        .min_by(|a, b| (a.0 - r_gpu).abs().total_cmp(&(b.0 - r_gpu).abs()))
        .map_or(LEVELS[0].1, |l| l.1);
    let n_voice = ((heads as f64 * frac).round() as usize).max(2).min(heads.max(1));
    let n_anchor = kv_tiered::roles::DEFAULT_N_ANCHOR.min(n_voice.saturating_sub(1)).max(1);
    TriageConfig { n_voice, n_anchor, signal: RankingSignal::VsHs }
}
