//! SnapKV / Ada-KV baseline (§3.3, Appendix F), restricted to the audio region.
//!
//! Scores: per KV-head, the attention of the last `w` prompt tokens (the observation window)
//! to each audio position, summed over the window and the GQA group (supplied by the runtime,
//! [`PrefillSignal::LastTokens`]), then max-pooled with kernel 7 (SnapKV's clustering step).
//! Budget: `B_l = round(r · H_kv · T_a)` audio positions per layer. Ada-KV allocation: each
//! head first keeps its top `⌊α·B_l/H_kv⌋` positions (the `floor_alpha` safeguard), then the
//! rest of the layer budget goes to the globally highest remaining scores across the layer's
//! heads. `α = 1` is plain SnapKV (uniform per-head budget). Evicted positions are dropped.
//!
//! Simplifications relative to the papers: scores come from one prefill pass (no separate
//! pseudo-query); the budget covers audio only (the §3.3 audio-only constraint) instead of the
//! whole sequence; GQA scores are summed over the group rather than kept per q-head.

use crate::error::{Result, param};
use crate::layout::AudioLayout;
use crate::topk::top_k_into;

use super::{
    HeadPlan, Policy, PrefillContext, PrefillSignal, Residency, StepObservation, StepPlan,
    StepSignal, max_pool,
};

/// SnapKV / Ada-KV hyper-parameters.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct AdaKvConfig {
    /// Target r_GPU in (0, 1].
    pub target_r_gpu: f64,
    /// Observation window `w` (last prompt tokens).
    pub window: usize,
    /// Max-pooling kernel (odd).
    pub pool_kernel: usize,
    /// Ada-KV safeguard α ∈ [0, 1]: share of the layer budget split uniformly (1 = SnapKV).
    pub floor_alpha: f64,
}

impl AdaKvConfig {
    /// Ada-KV defaults of Appendix F (α = 0.8, kernel 7, max pooling, window 32).
    pub fn ada_kv(target_r_gpu: f64) -> Self {
        Self { target_r_gpu, window: 32, pool_kernel: 7, floor_alpha: 0.8 }
    }
    /// Plain SnapKV: uniform per-head budget.
    pub fn snap_kv(target_r_gpu: f64) -> Self {
        Self { floor_alpha: 1.0, ..Self::ada_kv(target_r_gpu) }
    }
}

/// The SnapKV / Ada-KV policy.
#[derive(Clone, Debug)]
pub struct AdaKvPolicy {
    config: AdaKvConfig,
}

impl AdaKvPolicy {
    /// Validates the configuration.
    ///
    /// # Errors
    /// [`crate::Error::TargetOutOfRange`] for a target outside (0, 1]; [`crate::Error::Param`]
    /// for a zero window, an even kernel or α outside [0, 1].
    pub fn new(config: AdaKvConfig) -> Result<Self> {
        const OP: &str = "AdaKvPolicy::new";
        check_target(config.target_r_gpu)?;
        if config.window == 0 {
            return Err(param(OP, "window", 0, "≥ 1"));
        }
        if config.pool_kernel.is_multiple_of(2) {
            return Err(param(OP, "pool_kernel", config.pool_kernel, "odd"));
        }
        if !(0.0..=1.0).contains(&config.floor_alpha) {
            return Err(param(OP, "floor_alpha", config.floor_alpha, "in [0, 1]"));
        }
        Ok(Self { config })
    }

    /// Kept audio indices of the heads of one layer (`scores`: `kv_heads × T_a`, pooled).
    fn allocate_layer(&self, pooled: &[Vec<f32>], t: usize) -> Vec<Vec<u32>> {
        let h = pooled.len();
        let budget = ((self.config.target_r_gpu * (h * t) as f64).round() as usize).min(h * t);
        let floor = ((self.config.floor_alpha * budget as f64 / h as f64).floor() as usize).min(t);
        let mut kept: Vec<Vec<u32>> = Vec::with_capacity(h);
        let mut rest: Vec<(f32, u32, u32)> = Vec::new();
        for s in pooled {
            let mut k = Vec::new();
            top_k_into(s, floor, 0, &mut k);
            let mut taken = vec![false; t];
            k.iter().for_each(|&i| taken[i as usize] = true);
            rest.extend(
                (0..t as u32)
                    .filter(|&i| !taken[i as usize])
                    .map(|i| (s[i as usize], kept.len() as u32, i)),
            );
            kept.push(k);
        }
        let extra = budget - floor * h;
        rest.sort_by(|a, b| b.0.total_cmp(&a.0).then((a.1, a.2).cmp(&(b.1, b.2))));
        for &(_, head, i) in rest.iter().take(extra) {
            kept[head as usize].push(i);
        }
        kept.iter_mut().for_each(|k| k.sort_unstable());
        kept
    }
}

pub(crate) fn check_target(target: f64) -> Result<()> {
    if target > 0.0 && target <= 1.0 {
        Ok(())
    } else {
        Err(crate::Error::TargetOutOfRange { target })
    }
}

impl Policy for AdaKvPolicy {
    fn name(&self) -> &str {
        if self.config.floor_alpha >= 1.0 { "snapkv" } else { "adakv" }
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
        let t = ctx.layout.audio_len();
        let mut plans = Vec::with_capacity(ctx.layers * ctx.kv_heads);
        for l in 0..ctx.layers {
            let pooled: Vec<Vec<f32>> = (0..ctx.kv_heads)
                .map(|k| {
                    let h = l * ctx.kv_heads + k;
                    let mut out = Vec::with_capacity(t);
                    max_pool(&ctx.scores[h * t..(h + 1) * t], self.config.pool_kernel, &mut out);
                    out
                })
                .collect();
            plans.extend(
                self.allocate_layer(&pooled, t)
                    .into_iter()
                    .map(|device| HeadPlan { device, ..HeadPlan::default() }),
            );
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
