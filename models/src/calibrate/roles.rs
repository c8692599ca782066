//! WnW head-role calibration over a marked span of any Llama-family decoder prefill
//! (`papers/wnw.txt` §2.2 "Voice Score" / "Head Sensitivity", Appendix E Eq. 3–5): the audio
//! span of a speech LLM, or any span of a text prompt a user marks.
//!
//! One calibration sample is a teacher-forced sequence: a prompt holding the span, followed by
//! the answer tokens (the reference transcript), each answer token optionally aligned to an
//! interval of span positions (a word's time span converted to audio tokens). One forward pass
//! that autograd records ([`Llama::forward_key_offsets`]: a zero leaf that requires grad is
//! added to every layer's span keys) gives
//! * the **voice score** (Eq. 3): for every answer token with an alignment, the fraction of
//!   each q-head's top-`K` attended span positions — from the query row that predicts the
//!   token — inside the aligned interval; `kv_tiered`'s [`VoiceScoreAccumulator`] averages
//!   over tokens, samples and each GQA group;
//! * the **head sensitivity** (Eq. 4–5): `‖∂L_t/∂K_{l,k,τ}‖` of the answer-token cross-entropy
//!   `L_t` with respect to every span key, by one backward pass per answer token (Eq. 5's
//!   expectation over tokens; [`Sensitivity::Groups`] trades exactness for fewer passes by
//!   differentiating the mean loss of contiguous token groups); [`HeadSensitivityAccumulator`]
//!   averages span positions, tokens, then samples.
//!
//! [`RoleScores::roles`] triages the heads (VS×HS, §2.2) into the [`HeadRoles`] file that the
//! `tiered` caches read (`roles=PATH`). The audio front end builds samples from WAV files and
//! word alignments (`crate::calibrate::audio`); text users build them with
//! [`SpanSample::from_ids`].

use std::ops::Range;

use serde::Serialize;
use tch::{Device, Kind, Tensor};

use kv_tiered::scores::{HeadSensitivityAccumulator, VoiceScoreAccumulator};
use kv_tiered::{HeadRoles, TriageConfig};

use crate::error::{Result, TorchOp, invalid};
use crate::llama::Llama;
use crate::llama::host::to_f32_vec;
use crate::load::config::ModelConfig;

/// One teacher-forced calibration sequence over a marked span.
pub struct SpanSample {
    /// Input embeddings `[n, hidden]` of the fed sequence: the prompt, then every answer
    /// token but the last (the last is only a target).
    pub embeds: Tensor,
    /// Rotary tables `(cos, sin)`, `[n, head_dim]` each, for the fed positions.
    pub tables: (Tensor, Tensor),
    /// The marked span (key positions whose roles are calibrated).
    pub span: Range<usize>,
    /// Position of the first answer token (= prompt length); the span lies before it.
    pub answer_start: usize,
    /// Answer token ids (the targets).
    pub answer: Vec<u32>,
    /// Per answer token, the aligned interval in span-relative positions (`0..span.len()`),
    /// or `None` when the token has no (confident) alignment and only enters the sensitivity.
    pub aligned: Vec<Option<Range<usize>>>,
}

impl SpanSample {
    /// A text-model sample: `prompt` (holding `span`) followed by `answer`, embedded by
    /// `model` with plain RoPE positions `0..n`.
    ///
    /// # Errors
    /// [`crate::Error::InvalidInput`] for an empty answer, ids out of range or alignments of
    /// the wrong count.
    ///
    /// # Examples
    /// ```no_run
    /// # fn main() -> models::Result<()> {
    /// use models::calibrate::roles::{RoleCalibrationConfig, RoleCalibrator, SpanSample};
    /// let ckpt = models::Checkpoint::load(std::path::Path::new("model.gguf"))?;
    /// // Span = the passage at 0..4, answer = its copy, token t aligned to position t.
    /// let passage = [10, 11, 12, 13];
    /// let aligned = (0..4).map(|t| Some(t..t + 1)).collect();
    /// let sample = SpanSample::from_ids(&ckpt.model, &passage, 0..4, &passage, aligned)?;
    /// let cfg = RoleCalibrationConfig { voice_top_k: 1, ..Default::default() };
    /// let mut cal = RoleCalibrator::new(ckpt.model.config(), cfg)?;
    /// cal.add_sample(&ckpt.model, &sample)?;
    /// let scores = cal.scores()?;
    /// # Ok(()) }
    /// ```
    pub fn from_ids(
        model: &Llama,
        prompt: &[u32],
        span: Range<usize>,
        answer: &[u32],
        aligned: Vec<Option<Range<usize>>>,
    ) -> Result<Self> {
        if answer.is_empty() {
            return Err(invalid("span sample", "empty answer"));
        }
        let mut ids = prompt.to_vec();
        ids.extend(&answer[..answer.len() - 1]);
        let sample = Self {
            embeds: model.embed(&ids)?,
            tables: model.rope().tables(0, ids.len())?,
            span,
            answer_start: prompt.len(),
            answer: answer.to_vec(),
            aligned,
        };
        sample.check(model.config())?;
        Ok(sample)
    }

    /// Fed positions `n`.
    pub fn len(&self) -> usize {
        self.embeds.size().first().copied().unwrap_or(0) as usize
    }

    /// Whether nothing is fed.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Rows whose logits predict the answer tokens.
    fn answer_rows(&self) -> Range<usize> {
        self.answer_start - 1..self.answer_start - 1 + self.answer.len()
    }

    /// Checks the layout: span before the answer, one alignment per answer token inside
    /// the span, targets inside the vocabulary, the fed length `answer_start + m − 1`.
    fn check(&self, cfg: &ModelConfig) -> Result<()> {
        let (m, s) = (self.answer.len(), self.span.len());
        let bad = |reason: String| Err(invalid("span sample", reason));
        if m == 0 || s == 0 || self.span.end > self.answer_start || self.answer_start == 0 {
            return bad(format!(
                "span {:?}, answer of {m} tokens at {}: need a non-empty span before a non-empty answer",
                self.span, self.answer_start
            ));
        }
        if self.len() != self.answer_start + m - 1 {
            return bad(format!(
                "{} fed positions, expected prompt {} + answer {m} − 1",
                self.len(),
                self.answer_start
            ));
        }
        if self.aligned.len() != m {
            return bad(format!("{} alignments for {m} answer tokens", self.aligned.len()));
        }
        if let Some(r) = self.aligned.iter().flatten().find(|r| r.start > r.end || r.end > s) {
            return bad(format!("alignment {r:?} outside the {s}-position span"));
        }
        if let Some(&t) = self.answer.iter().find(|&&t| t as usize >= cfg.vocab_size) {
            return bad(format!("answer token {t} ≥ vocab size {}", cfg.vocab_size));
        }
        Ok(())
    }
}

/// How Eq. 5's expectation over answer tokens is taken.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub enum Sensitivity {
    /// One backward pass per answer token (Eq. 4–5 exactly).
    #[default]
    PerToken,
    /// One backward pass per contiguous group of answer tokens, differentiating the group's
    /// mean loss (fewer passes; an approximation of Eq. 5).
    Groups(usize),
}

/// Calibration knobs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct RoleCalibrationConfig {
    /// `K` of the voice-score hit ratio (Appendix E: 4 for Voxtral, 8 for Qwen2.5-Omni).
    pub voice_top_k: usize,
    /// Token granularity of the head sensitivity.
    pub sensitivity: Sensitivity,
}

impl Default for RoleCalibrationConfig {
    fn default() -> Self {
        Self { voice_top_k: 4, sensitivity: Sensitivity::PerToken }
    }
}

/// What one sample contributed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct SampleStats {
    /// Fed positions.
    pub positions: usize,
    /// Span positions.
    pub span: usize,
    /// Answer tokens.
    pub answer_tokens: usize,
    /// Answer tokens with an alignment (voice-score observations per q-head).
    pub aligned_tokens: usize,
    /// Backward passes run.
    pub backward_passes: usize,
}

/// Per-KV-head calibration scores (index `layer · kv_heads + kv_head`).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RoleScores {
    /// Layers.
    pub layers: usize,
    /// KV-heads per layer.
    pub kv_heads: usize,
    /// Voice scores `VS_{l,k}` (Eq. 3, GQA-averaged).
    pub voice_score: Vec<f32>,
    /// Head sensitivities `HS_{l,k}` (Eq. 5).
    pub head_sensitivity: Vec<f32>,
    /// Per-sample statistics.
    pub samples: Vec<SampleStats>,
}

impl RoleScores {
    /// Triage into anchor / tidal / fixed heads (§2.2).
    ///
    /// # Errors
    /// [`crate::Error::Tiered`] for counts the grid cannot hold.
    ///
    /// # Examples
    /// ```
    /// use kv_tiered::{Role, TriageConfig};
    /// use models::calibrate::roles::RoleScores;
    /// let s = RoleScores {
    ///     layers: 1,
    ///     kv_heads: 3,
    ///     voice_score: vec![0.5, 0.2, 0.9],
    ///     head_sensitivity: vec![1.0, 1.0, 2.0],
    ///     samples: vec![],
    /// };
    /// let roles = s.roles(TriageConfig { n_voice: 2, n_anchor: 1, ..Default::default() })?;
    /// assert_eq!(roles.roles(), &[Role::Tidal, Role::Fixed, Role::Anchor]);
    /// # Ok::<(), models::Error>(())
    /// ```
    pub fn roles(&self, cfg: TriageConfig) -> Result<HeadRoles> {
        Ok(HeadRoles::triage(
            self.layers,
            self.kv_heads,
            &self.voice_score,
            &self.head_sensitivity,
            cfg,
        )?)
    }
}

/// Accumulates voice scores and head sensitivities over calibration samples.
pub struct RoleCalibrator {
    cfg: RoleCalibrationConfig,
    layers: usize,
    kv_heads: usize,
    head_dim: usize,
    vs: VoiceScoreAccumulator,
    hs: HeadSensitivityAccumulator,
    samples: Vec<SampleStats>,
}

impl RoleCalibrator {
    /// A calibrator for a decoder of configuration `model`.
    ///
    /// # Errors
    /// [`crate::Error::Tiered`] for a zero `K` or an empty head grid;
    /// [`crate::Error::InvalidInput`] for zero sensitivity groups.
    pub fn new(model: &ModelConfig, cfg: RoleCalibrationConfig) -> Result<Self> {
        if cfg.sensitivity == Sensitivity::Groups(0) {
            return Err(invalid("role calibration", "sensitivity groups must be ≥ 1"));
        }
        let (l, q, kv) = (model.num_layers, model.q_heads, model.kv_heads);
        Ok(Self {
            cfg,
            layers: l,
            kv_heads: kv,
            head_dim: model.head_dim,
            vs: VoiceScoreAccumulator::new(l, q, kv, cfg.voice_top_k)?,
            hs: HeadSensitivityAccumulator::new(l, kv)?,
            samples: Vec::new(),
        })
    }

    /// Runs one sample (one recorded forward, then the backward passes) and adds it.
    ///
    /// # Errors
    /// [`crate::Error::InvalidInput`] for a sample that does not fit `model` or a span shorter
    /// than `K`; forward, autograd and accumulator errors.
    pub fn add_sample(&mut self, model: &Llama, sample: &SpanSample) -> Result<SampleStats> {
        sample.check(model.config())?;
        let cfg = model.config();
        if (cfg.num_layers, cfg.kv_heads, cfg.head_dim)
            != (self.layers, self.kv_heads, self.head_dim)
        {
            return Err(invalid("role calibration", "model differs from the calibrator's"));
        }
        if sample.span.len() < self.cfg.voice_top_k {
            return Err(invalid(
                "role calibration",
                format!(
                    "span of {} positions < voice top-K {}",
                    sample.span.len(),
                    self.cfg.voice_top_k
                ),
            ));
        }
        let offsets = self.key_offsets(sample.span.len())?;
        let logits = {
            let vs = &mut self.vs;
            let mut tap = |layer: usize, probs: &Tensor| voice_hits(vs, layer, probs, sample);
            model.forward_key_offsets(
                &sample.embeds,
                (sample.tables.0.shallow_clone(), sample.tables.1.shallow_clone()),
                sample.span.clone(),
                &offsets,
                &mut tap,
            )?
        };
        let passes = self.sensitivities(&logits, &offsets, sample)?;
        self.vs.finish_sample();
        self.hs.finish_sample();
        let stats = SampleStats {
            positions: sample.len(),
            span: sample.span.len(),
            answer_tokens: sample.answer.len(),
            aligned_tokens: sample.aligned.iter().flatten().count(),
            backward_passes: passes,
        };
        self.samples.push(stats);
        Ok(stats)
    }

    /// Zero leaves `[kv_heads, span, head_dim]` per layer that require grad.
    fn key_offsets(&self, span: usize) -> Result<Vec<Tensor>> {
        let shape = [self.kv_heads as i64, span as i64, self.head_dim as i64];
        (0..self.layers)
            .map(|_| {
                Tensor::f_zeros(shape, (Kind::Float, Device::Cpu))
                    .op("key offset")?
                    .f_set_requires_grad(true)
                    .op("requires grad")
            })
            .collect()
    }

    /// Eq. 4–5: backward passes of the answer losses into the key offsets.
    fn sensitivities(
        &mut self,
        logits: &Tensor,
        offsets: &[Tensor],
        sample: &SpanSample,
    ) -> Result<usize> {
        let rows = sample.answer_rows();
        let targets: Vec<i64> = sample.answer.iter().map(|&t| i64::from(t)).collect();
        let nll = tch::with_grad(|| -> Result<Tensor> {
            logits
                .f_narrow(0, rows.start as i64, rows.len() as i64)
                .op("answer logits")?
                .f_log_softmax(-1, Kind::Float)
                .op("log_softmax")?
                .f_gather(
                    1,
                    &Tensor::f_from_slice(&targets)
                        .op("targets")?
                        .f_unsqueeze(1)
                        .op("unsqueeze")?,
                    false,
                )
                .op("gather")?
                .f_neg()
                .op("nll")
        })?;
        let groups = token_groups(sample.answer.len(), self.cfg.sensitivity);
        for (i, g) in groups.iter().enumerate() {
            let loss = tch::with_grad(|| {
                nll.f_narrow(0, g.start as i64, g.len() as i64)?.f_mean(Kind::Float)
            })
            .op("group loss")?;
            let keep = i + 1 < groups.len();
            let grads = Tensor::f_run_backward(&[&loss], offsets, keep, false).op("backward")?;
            for (layer, grad) in grads.iter().enumerate() {
                let grad = grad.f_contiguous().op("contiguous")?;
                let per_head = sample.span.len() * self.head_dim;
                for (kv, head) in to_f32_vec(&grad)?.chunks_exact(per_head).enumerate() {
                    self.hs.observe_gradients(layer, kv, head, self.head_dim)?;
                }
            }
        }
        Ok(groups.len())
    }

    /// The scores so far.
    ///
    /// # Errors
    /// [`crate::Error::Tiered`] if no sample has been added or no answer token was aligned.
    pub fn scores(&self) -> Result<RoleScores> {
        Ok(RoleScores {
            layers: self.layers,
            kv_heads: self.kv_heads,
            voice_score: self.vs.voice_scores()?,
            head_sensitivity: self.hs.sensitivities()?,
            samples: self.samples.clone(),
        })
    }
}

/// Eq. 3 hit ratios of one layer: each q-head's weights from the answer-predicting rows to
/// the span, against each aligned token's interval.
fn voice_hits(
    vs: &mut VoiceScoreAccumulator,
    layer: usize,
    probs: &Tensor,
    sample: &SpanSample,
) -> Result<()> {
    if sample.aligned.iter().all(Option::is_none) {
        return Ok(());
    }
    let (rows, s) = (sample.answer_rows(), sample.span.len());
    let block = probs
        .f_detach()
        .op("detach")?
        .f_narrow(1, rows.start as i64, rows.len() as i64)
        .op("answer rows")?
        .f_narrow(2, sample.span.start as i64, s as i64)
        .op("span columns")?
        .f_contiguous()
        .op("contiguous")?;
    let data = to_f32_vec(&block)?;
    for (h, head) in data.chunks_exact(rows.len() * s).enumerate() {
        for (row, aligned) in head.chunks_exact(s).zip(&sample.aligned) {
            if let Some(r) = aligned {
                vs.observe(layer, h, row, r.clone())?;
            }
        }
    }
    Ok(())
}

/// Contiguous token ranges, one per backward pass.
fn token_groups(m: usize, how: Sensitivity) -> Vec<Range<usize>> {
    let n = match how {
        Sensitivity::PerToken => m,
        Sensitivity::Groups(g) => g.clamp(1, m),
    };
    (0..n).map(|g| g * m / n..(g + 1) * m / n).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_groups_cover_every_token_once() {
        for m in 1..40 {
            for how in [Sensitivity::PerToken, Sensitivity::Groups(1), Sensitivity::Groups(7)] {
                let g = token_groups(m, how);
                assert_eq!(g.first().map(|r| r.start), Some(0));
                assert_eq!(g.last().map(|r| r.end), Some(m));
                assert!(g.windows(2).all(|w| w[0].end == w[1].start && !w[0].is_empty()));
            }
        }
    }
}
