//! AudioKV-style baseline (§3.3, Appendix F), restricted to the audio region: a static
//! prefill top-k whose per-head budget follows the voice score.
//!
//! * Budget: `B = round(r · L·H_kv · T_a)` over the whole model; head `i` gets
//!   `B · (β/N + (1−β) · VS_i / Σ VS)` (β = `baseline_ratio`, N heads), capped at `T_a` with the
//!   excess water-filled onto uncapped heads, rounded by largest remainder so the total is
//!   exactly `B`.
//! * Scores: observation-window attention (last `w = 32` prompt tokens) to audio positions,
//!   smoothed in the frequency domain: a real FFT, keeping the lowest `ρ` fraction of the
//!   frequency bins, inverse FFT; the final score mixes `α · raw/max + (1−α) · smooth/max`.
//!
//! Our reading of the hyper-parameters (the AudioKV paper is not in our reference set):
//! `α` = mixing weight of the raw score, `ρ` = kept share of the spectrum, `baseline_ratio` =
//! uniform share of the budget. The voice scores are the same per-KV-head `VS` WnW calibrates
//! (Appendix F: shared `min_word_score`). Evicted positions are dropped.

use realfft::RealFftPlanner;
use realfft::num_complex::Complex;

use crate::error::{Result, check_len, check_scores, param};
use crate::layout::AudioLayout;
use crate::topk::top_k_into;

use super::adakv::check_target;
use super::{
    HeadPlan, Policy, PrefillContext, PrefillSignal, Residency, StepObservation, StepPlan,
    StepSignal,
};

/// AudioKV hyper-parameters.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct AudioKvConfig {
    /// Target r_GPU in (0, 1].
    pub target_r_gpu: f64,
    /// Per-head voice scores (`L·H_kv`).
    pub voice_scores: Vec<f32>,
    /// Observation window.
    pub window: usize,
    /// Weight of the raw (unsmoothed) score, in [0, 1].
    pub alpha: f64,
    /// Share of the frequency bins kept by the low-pass, in (0, 1].
    pub rho: f64,
    /// Uniform share of the budget, in [0, 1].
    pub baseline_ratio: f64,
}

impl AudioKvConfig {
    /// Appendix F defaults: α = 0.5, ρ = 0.7, window 32, baseline ratio 0.5.
    pub fn new(target_r_gpu: f64, voice_scores: Vec<f32>) -> Self {
        Self { target_r_gpu, voice_scores, window: 32, alpha: 0.5, rho: 0.7, baseline_ratio: 0.5 }
    }
}

/// The AudioKV-style policy.
#[derive(Clone, Debug)]
pub struct AudioKvPolicy {
    config: AudioKvConfig,
}

impl AudioKvPolicy {
    /// Validates the configuration.
    ///
    /// # Errors
    /// [`crate::Error::TargetOutOfRange`]; [`crate::Error::Param`] for parameters outside
    /// their ranges; [`crate::Error::NonFinite`]/[`crate::Error::Negative`] for bad voice scores.
    pub fn new(config: AudioKvConfig) -> Result<Self> {
        const OP: &str = "AudioKvPolicy::new";
        check_target(config.target_r_gpu)?;
        check_scores(OP, "voice_scores", &config.voice_scores)?;
        if config.window == 0 {
            return Err(param(OP, "window", 0, "≥ 1"));
        }
        for (name, v, lo_open) in [
            ("alpha", config.alpha, false),
            ("rho", config.rho, true),
            ("baseline_ratio", config.baseline_ratio, false),
        ] {
            if !(v <= 1.0 && (v > 0.0 || (!lo_open && v == 0.0))) {
                return Err(param(OP, name, v, "in [0, 1] (ρ in (0, 1])"));
            }
        }
        Ok(Self { config })
    }

    /// Integer budgets per head summing to `round(r · heads · t)`.
    fn budgets(&self, heads: usize, t: usize) -> Vec<usize> {
        let total = (self.config.target_r_gpu * (heads * t) as f64).round().min((heads * t) as f64);
        let vs_sum: f64 = self.config.voice_scores.iter().map(|&v| f64::from(v)).sum();
        let beta = self.config.baseline_ratio;
        let share = |i: usize| {
            let vs = if vs_sum > 0.0 {
                f64::from(self.config.voice_scores[i]) / vs_sum
            } else {
                1.0 / heads as f64
            };
            beta / heads as f64 + (1.0 - beta) * vs
        };
        let mut want: Vec<f64> = (0..heads).map(|i| total * share(i)).collect();
        water_fill(&mut want, t as f64);
        round_to_total(&want, total as usize, t)
    }
}

/// Caps entries at `cap`, spreading the excess over uncapped entries proportionally.
fn water_fill(want: &mut [f64], cap: f64) {
    for _ in 0..want.len() {
        let excess: f64 = want.iter().map(|&w| (w - cap).max(0.0)).sum();
        if excess <= 1e-9 {
            return;
        }
        let free: f64 = want.iter().filter(|&&w| w < cap).sum();
        for w in want.iter_mut() {
            *w = if *w >= cap {
                cap
            } else if free > 0.0 {
                *w + excess * *w / free
            } else {
                *w
            };
        }
    }
}

/// Floors, then hands the remaining units to the largest fractional parts (respecting `cap`).
fn round_to_total(want: &[f64], total: usize, cap: usize) -> Vec<usize> {
    let mut out: Vec<usize> = want.iter().map(|&w| (w.floor() as usize).min(cap)).collect();
    let mut order: Vec<usize> = (0..want.len()).collect();
    order.sort_by(|&a, &b| {
        (want[b] - want[b].floor()).total_cmp(&(want[a] - want[a].floor())).then(a.cmp(&b))
    });
    let mut left = total.saturating_sub(out.iter().sum());
    for &i in order.iter().cycle().take(want.len() * 2) {
        if left == 0 {
            break;
        }
        if out[i] < cap {
            out[i] += 1;
            left -= 1;
        }
    }
    out
}

/// FFT low-pass keeping the lowest `rho` share of the bins of `x`.
fn smooth(planner: &mut RealFftPlanner<f32>, x: &[f32], rho: f64) -> Vec<f32> {
    let n = x.len();
    if n < 2 {
        return x.to_vec();
    }
    let fwd = planner.plan_fft_forward(n);
    let inv = planner.plan_fft_inverse(n);
    let mut input = x.to_vec();
    let mut spec = fwd.make_output_vec();
    let mut out = inv.make_output_vec();
    if fwd.process(&mut input, &mut spec).is_err() {
        return x.to_vec();
    }
    let keep = ((rho * spec.len() as f64).ceil() as usize).clamp(1, spec.len());
    spec[keep..].iter_mut().for_each(|c| *c = Complex::new(0.0, 0.0));
    spec[0].im = 0.0;
    if n.is_multiple_of(2) {
        let last = spec.len() - 1;
        spec[last].im = 0.0;
    }
    if inv.process(&mut spec, &mut out).is_err() {
        return x.to_vec();
    }
    out.iter_mut().for_each(|v| *v /= n as f32);
    out
}

fn normalized(x: &[f32]) -> impl Iterator<Item = f32> + '_ {
    let max = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    x.iter().map(move |&v| if max > 0.0 { v / max } else { 0.0 })
}

impl Policy for AudioKvPolicy {
    fn name(&self) -> &str {
        "audiokv"
    }
    fn prefill_signal(&self) -> PrefillSignal {
        PrefillSignal::LastTokens(self.config.window)
    }
    fn step_signal(&self) -> StepSignal {
        StepSignal::None
    }
    fn unit_len(&self, layout: &AudioLayout) -> usize {
        layout.segment_len()
    }
    fn is_anchor(&self, _head: usize) -> bool {
        false
    }
    fn plan_prefill(&mut self, ctx: &PrefillContext<'_>) -> Result<Vec<HeadPlan>> {
        let (heads, t) = (ctx.layers * ctx.kv_heads, ctx.layout.audio_len());
        check_len("AudioKvPolicy::plan_prefill", "voice_scores", &self.config.voice_scores, heads)?;
        let budgets = self.budgets(heads, t);
        let mut planner = RealFftPlanner::<f32>::new();
        let a = self.config.alpha as f32;
        let mut plans = Vec::with_capacity(heads);
        for (h, &b) in budgets.iter().enumerate() {
            let raw = &ctx.scores[h * t..(h + 1) * t];
            let sm = smooth(&mut planner, raw, self.config.rho);
            let mixed: Vec<f32> =
                normalized(raw).zip(normalized(&sm)).map(|(r, s)| a * r + (1.0 - a) * s).collect();
            let mut device = Vec::with_capacity(b);
            top_k_into(&mixed, b, 0, &mut device);
            plans.push(HeadPlan { device, ..HeadPlan::default() });
        }
        Ok(plans)
    }
    fn plan_step(
        &mut self,
        _obs: &StepObservation<'_>,
        _residency: &Residency,
        _plan: &mut StepPlan,
    ) {
    }
}
