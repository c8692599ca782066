//! WnW head-role calibration on the text copy task (`papers/wnw.txt` §2.2, Appendix E).
//!
//! Each copy task becomes one teacher-forced [`SpanSample`] for the span-generic
//! [`RoleCalibrator`] of `models` (the decoder's own key-offset forward, autograd into the
//! span keys); this module only says what the span, the answer and the alignment are:
//! * the span is the first copy of the passage, the answer its second copy;
//! * voice score (Eq. 3): answer token `t` is aligned with span positions `[t − 1, t + 3)` —
//!   the token being copied plus the word-width slack an audio alignment has (`K` =
//!   [`VOICE_TOP_K`] covers roughly one word, as in the paper);
//! * head sensitivity (Eq. 4–5): Eq. 5's expectation over answer tokens is taken over
//!   `groups` contiguous groups of answer tokens ([`Sensitivity::Groups`]: one backward pass
//!   per group's mean loss) rather than one backward per token.
//!
//! Calibration passages come from plays disjoint from evaluation ([`super::corpus`]).

use serde::Serialize;

use kv_tiered::{HeadRoles, RankingSignal, TriageConfig};
use models::Llama;
use models::calibrate::roles::{
    RoleCalibrationConfig, RoleCalibrator, RoleScores, Sensitivity, SpanSample,
};

use super::corpus::CopyTask;
use crate::error::{Result, invalid};

/// Top-`K` attended positions per answer token (the paper's `K = 4` for Voxtral).
pub const VOICE_TOP_K: usize = 4;

/// The role scores of a text calibration and what produced them.
#[derive(Clone, Debug, Serialize)]
pub struct TextCalibration {
    /// Per-KV-head voice scores and head sensitivities.
    #[serde(flatten)]
    pub scores: RoleScores,
    /// Passages used.
    pub passages: Vec<String>,
    /// Answer-token groups per passage for HS.
    pub groups: usize,
    /// Seconds spent.
    pub seconds: f64,
}

impl TextCalibration {
    /// Head roles for `n_voice` voice heads (the top `n_anchor` anchors) ranked by `signal`.
    ///
    /// # Errors
    /// [`crate::Error::Model`] for counts the grid cannot hold.
    pub fn roles(
        &self,
        n_voice: usize,
        n_anchor: usize,
        signal: RankingSignal,
    ) -> Result<HeadRoles> {
        let cfg = TriageConfig { n_voice, n_anchor: n_anchor.min(n_voice), signal };
        Ok(self.scores.roles(cfg)?)
    }
}

/// The calibration sample of one copy task: the prompt (prefix, first copy, instruction)
/// holds the span, the second copy is the answer.
fn sample(model: &Llama, task: &CopyTask) -> Result<SpanSample> {
    let n = task.passage.len();
    let aligned = (0..n).map(|t| Some(t.saturating_sub(1)..(t + 3).min(n))).collect();
    Ok(SpanSample::from_ids(model, &task.prompt(), task.span(), &task.passage, aligned)?)
}

/// Calibrates voice scores and head sensitivities on `tasks`.
///
/// # Errors
/// [`crate::Error::InvalidInput`] without tasks or with passages shorter than
/// [`VOICE_TOP_K`] or the group count; forward, autograd and accumulator errors.
pub fn calibrate(
    model: &Llama,
    tasks: &[CopyTask],
    groups: usize,
    progress: &mut dyn FnMut(usize),
) -> Result<TextCalibration> {
    let t0 = std::time::Instant::now();
    if tasks.is_empty()
        || groups == 0
        || tasks.iter().any(|t| t.passage.len() < VOICE_TOP_K.max(groups))
    {
        return Err(invalid(
            "role calibration",
            "need passages longer than the voice top-K and the group count",
        ));
    }
    let cfg = RoleCalibrationConfig {
        voice_top_k: VOICE_TOP_K,
        sensitivity: Sensitivity::Groups(groups),
    };
    let mut cal = RoleCalibrator::new(model.config(), cfg)?;
    for (i, task) in tasks.iter().enumerate() {
        cal.add_sample(model, &sample(model, task)?)?;
        progress(i + 1);
    }
    Ok(TextCalibration {
        scores: cal.scores()?,
        passages: tasks
            .iter()
            .map(|t| format!("{} [{} tokens]", t.play, t.passage.len()))
            .collect(),
        groups,
        seconds: t0.elapsed().as_secs_f64(),
    })
}
