//! WnW head-role calibration on the text copy task (`papers/wnw.txt` §2.2, Appendix E).
//!
//! * Voice score (Eq. 3): the answer token `t` of the second copy is aligned with position
//!   `t` of the first copy (the span) — the text analogue of WhisperX's word alignment. The
//!   query that predicts it is the one at [`CopyTask::answer_query`]`(t)`; its hit ratio is
//!   the share of its top-[`VOICE_TOP_K`] attended span positions inside the aligned
//!   interval `[t − 1, t + 3)` (the token being copied plus the word-width slack an audio
//!   alignment has: `K` covers roughly one word, as in the paper). `kv_tiered`'s
//!   [`VoiceScoreAccumulator`] averages over tokens, passages and the GQA group.
//! * Head sensitivity (Eq. 4–5): `‖∂L/∂K_τ‖` of the answer-token cross-entropy with respect
//!   to every span key, by libtorch autograd through [`GradModel`]. Eq. 5's expectation over
//!   answer tokens is taken over `groups` contiguous groups of answer tokens (one backward
//!   pass per group's mean loss) rather than per token, which would cost one backward per
//!   token; [`HeadSensitivityAccumulator`] averages positions, groups, then passages.
//!
//! Calibration passages come from plays disjoint from evaluation ([`super::corpus`]).

use serde::Serialize;
use tch::{Kind, Tensor};

use kv_tiered::scores::{HeadSensitivityAccumulator, VoiceScoreAccumulator};
use kv_tiered::{HeadRoles, RankingSignal, TriageConfig};

use super::autograd::{AttentionTap, GradModel};
use super::corpus::CopyTask;
use crate::error::{Result, TorchOp, invalid};
use crate::host::f32_slice;

/// Top-`K` attended positions per answer token (the paper's `K = 4` for Voxtral).
pub const VOICE_TOP_K: usize = 4;

/// Per-KV-head scores from calibration (index `layer · kv_heads + kv_head`).
#[derive(Clone, Debug, Serialize)]
pub struct RoleScores {
    /// Layers.
    pub layers: usize,
    /// KV-heads per layer.
    pub kv_heads: usize,
    /// Voice scores `VS`.
    pub voice_score: Vec<f32>,
    /// Head sensitivities `HS`.
    pub head_sensitivity: Vec<f32>,
    /// Passages used.
    pub passages: Vec<String>,
    /// Answer-token groups per passage for HS.
    pub groups: usize,
    /// Seconds spent.
    pub seconds: f64,
}

impl RoleScores {
    /// Head roles for `n_voice` voice heads (the top `n_anchor` anchors) ranked by `signal`.
    ///
    /// # Errors
    /// [`crate::Error::Tiered`] for counts the grid cannot hold.
    pub fn roles(
        &self,
        n_voice: usize,
        n_anchor: usize,
        signal: RankingSignal,
    ) -> Result<HeadRoles> {
        let cfg = TriageConfig { n_voice, n_anchor: n_anchor.min(n_voice), signal };
        Ok(HeadRoles::triage(
            self.layers,
            self.kv_heads,
            &self.voice_score,
            &self.head_sensitivity,
            cfg,
        )?)
    }
}

/// Collects Eq. 3 hit ratios from the attention of the answer queries to the span.
struct VoiceTap<'a> {
    acc: &'a mut VoiceScoreAccumulator,
    task: &'a CopyTask,
}

impl AttentionTap for VoiceTap<'_> {
    fn probs(&mut self, layer: usize, probs: &Tensor) -> Result<()> {
        let (span, n) = (self.task.span(), self.task.passage.len());
        let rows = probs
            .f_narrow(1, self.task.answer_query(0) as i64, n as i64)
            .op("answer rows")?
            .f_narrow(2, span.start as i64, n as i64)
            .op("span cols")?
            .f_contiguous()
            .op("contiguous")?;
        let data = f32_slice(&rows)?;
        for (h, head) in data.chunks_exact(n * n).enumerate() {
            for (t, row) in head.chunks_exact(n).enumerate() {
                let aligned = t.saturating_sub(1)..(t + 3).min(n);
                self.acc.observe(layer, h, row, aligned)?;
            }
        }
        Ok(())
    }
}

/// Calibrates voice scores and head sensitivities on `tasks`.
///
/// # Errors
/// [`crate::Error::InvalidInput`] without tasks or with passages shorter than
/// [`VOICE_TOP_K`]; forward, autograd and accumulator errors.
pub fn calibrate(
    gm: &GradModel,
    tasks: &[CopyTask],
    groups: usize,
    progress: &mut dyn FnMut(usize),
) -> Result<RoleScores> {
    let t0 = std::time::Instant::now();
    let cfg = gm.config();
    if tasks.is_empty()
        || groups == 0
        || tasks.iter().any(|t| t.passage.len() < VOICE_TOP_K.max(groups))
    {
        return Err(invalid(
            "role calibration",
            "need passages longer than the voice top-K and the group count",
        ));
    }
    let mut vs =
        VoiceScoreAccumulator::new(cfg.num_layers, cfg.num_heads, cfg.num_kv_heads, VOICE_TOP_K)?;
    let mut hs = HeadSensitivityAccumulator::new(cfg.num_layers, cfg.num_kv_heads)?;
    for (i, task) in tasks.iter().enumerate() {
        sensitivity_and_voice(gm, task, groups, &mut vs, &mut hs)?;
        vs.finish_sample();
        hs.finish_sample();
        progress(i + 1);
    }
    Ok(RoleScores {
        layers: cfg.num_layers,
        kv_heads: cfg.num_kv_heads,
        voice_score: vs.voice_scores()?,
        head_sensitivity: hs.sensitivities()?,
        passages: tasks
            .iter()
            .map(|t| format!("{} [{} tokens]", t.play, t.passage.len()))
            .collect(),
        groups,
        seconds: t0.elapsed().as_secs_f64(),
    })
}

/// One forward with grad (voice taps on the way), then one backward per answer group.
fn sensitivity_and_voice(
    gm: &GradModel,
    task: &CopyTask,
    groups: usize,
    vs: &mut VoiceScoreAccumulator,
    hs: &mut HeadSensitivityAccumulator,
) -> Result<()> {
    let seq = task.sequence();
    let (span, n) = (task.span(), task.passage.len());
    let offsets = gm.key_offsets(seq.len())?;
    let logits = gm.forward(&seq, Some(&offsets), &mut VoiceTap { acc: vs, task })?;
    let rows = logits.f_narrow(0, task.answer_query(0) as i64, n as i64).op("answer logits")?;
    let targets: Vec<i64> = task.passage.iter().map(|&t| i64::from(t)).collect();
    let nll = rows
        .f_log_softmax(-1, Kind::Float)
        .op("log_softmax")?
        .f_gather(
            1,
            &Tensor::f_from_slice(&targets).op("targets")?.f_unsqueeze(1).op("unsqueeze")?,
            false,
        )
        .op("gather")?
        .f_neg()
        .op("neg")?;
    let d = gm.config().head_dim;
    for g in 0..groups {
        let (a, b) = (g * n / groups, (g + 1) * n / groups);
        let loss = nll
            .f_narrow(0, a as i64, (b - a) as i64)
            .op("group")?
            .f_mean(Kind::Float)
            .op("mean")?;
        let grads =
            Tensor::f_run_backward(&[&loss], &offsets, g + 1 < groups, false).op("backward")?;
        for (layer, grad) in grads.iter().enumerate() {
            let g_span = grad
                .f_narrow(1, span.start as i64, n as i64)
                .op("span grads")?
                .f_contiguous()
                .op("contiguous")?;
            for (kv, head) in f32_slice(&g_span)?.chunks_exact(n * d).enumerate() {
                hs.observe_gradients(layer, kv, head, d)?;
            }
        }
    }
    Ok(())
}
