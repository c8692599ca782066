//! AffPool (§3.3 and Table 1; hyper-parameters in Appendix F), the token-merging baseline:
//! adjacent audio tokens with high affinity are pooled into one KV row at prefill, so the
//! audio is *shortened* rather than evicted, and its retention is the remaining audio-token
//! ratio. Nothing goes to the host and nothing is recalled (r_GPU = r_GPU+CPU).
//!
//! **KV-level stand-in (our explicit choice).** The paper pools hidden states inside the
//! first 27 layers of the speech model before their KV is built ("deep pooling", window 3),
//! so a merge in an early layer shortens every later layer. This store only sees the
//! prompt's finished K/V, so each (layer, kv-head) pools its own rows: scanning the audio
//! left to right, a token joins the current run while the run is shorter than
//! [`AffPoolConfig::max_run`] and the cosine affinity between its key and the run's mean key
//! is at least a threshold τ; a run is stored as the mean of its keys and the mean of its
//! values, at the position of its first token. As in the paper, one τ serves every head and
//! is calibrated so the retention lands on the target (bisection on τ; the nearest
//! achievable ratio if ties make the exact target unreachable). What the stand-in does not
//! reproduce is the layer-to-layer propagation of merging errors that the paper names as
//! part of AffPool's failure at low retention.

use crate::error::{Result, param};
use crate::layout::AudioLayout;

use super::{
    HeadPlan, Policy, PrefillContext, PrefillSignal, Residency, StepObservation, StepPlan,
    StepSignal,
};

/// AffPool hyper-parameters.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct AffPoolConfig {
    /// Target remaining audio-token ratio (the r_GPU budget), in `(0, 1]`.
    pub r_gpu: f64,
    /// Longest run pooled into one row (≥ 1). Deep pooling with window 3 over many layers
    /// compounds to long runs; the default 8 lets the ratio reach 1/8.
    pub max_run: usize,
}

impl AffPoolConfig {
    /// Target `r_gpu`, runs of at most 8 tokens.
    pub fn new(r_gpu: f64) -> Self {
        Self { r_gpu, max_run: 8 }
    }
}

/// The AffPool policy.
///
/// # Examples
/// ```
/// use kv_tiered::policy::{AffPoolConfig, AffPoolPolicy};
/// let policy = AffPoolPolicy::new(AffPoolConfig::new(0.4))?;
/// assert_eq!(policy.achieved(), None); // known after prefill
/// # Ok::<(), kv_tiered::Error>(())
/// ```
#[derive(Clone, Debug)]
pub struct AffPoolPolicy {
    config: AffPoolConfig,
    threshold: Option<f32>,
    achieved: Option<f64>,
}

impl AffPoolPolicy {
    /// AffPool with `config`.
    ///
    /// # Errors
    /// [`crate::Error::Param`] if `r_gpu ∉ (0, 1]` or `max_run == 0`.
    pub fn new(config: AffPoolConfig) -> Result<Self> {
        if !(config.r_gpu > 0.0 && config.r_gpu <= 1.0) {
            return Err(param("AffPoolPolicy::new", "r_gpu", config.r_gpu, "in (0, 1]"));
        }
        if config.max_run == 0 {
            return Err(param("AffPoolPolicy::new", "max_run", 0, "≥ 1"));
        }
        Ok(Self { config, threshold: None, achieved: None })
    }

    /// The configuration.
    pub fn config(&self) -> AffPoolConfig {
        self.config
    }

    /// The calibrated affinity threshold τ (after prefill).
    pub fn threshold(&self) -> Option<f32> {
        self.threshold
    }

    /// The remaining audio-token ratio prefill produced (after prefill).
    pub fn achieved(&self) -> Option<f64> {
        self.achieved
    }
}

/// Greedy left-to-right runs of `keys` (`t × d`) at threshold `tau`: `(start, len)` pairs
/// appended to `out`.
fn runs(
    keys: &[f32],
    d: usize,
    tau: f32,
    max_run: usize,
    mean: &mut Vec<f32>,
    out: &mut Vec<(u32, u32)>,
) {
    let t = keys.len() / d;
    let mut start = 0;
    while start < t {
        mean.clear();
        mean.extend_from_slice(&keys[start * d..(start + 1) * d]);
        let mut len = 1;
        while start + len < t && len < max_run {
            let k = &keys[(start + len) * d..(start + len + 1) * d];
            if cosine(k, mean) < tau {
                break;
            }
            // Running mean of the run's keys.
            let n = (len + 1) as f32;
            for (m, &x) in mean.iter_mut().zip(k) {
                *m += (x - *m) / n;
            }
            len += 1;
        }
        out.push((start as u32, len as u32));
        start += len;
    }
}

fn cosine(a: &[f32], b: &[f32]) -> f32 {
    let (mut ab, mut aa, mut bb) = (0.0f64, 0.0f64, 0.0f64);
    for (&x, &y) in a.iter().zip(b) {
        ab += f64::from(x) * f64::from(y);
        aa += f64::from(x) * f64::from(x);
        bb += f64::from(y) * f64::from(y);
    }
    if aa == 0.0 || bb == 0.0 {
        // A zero key has no direction: it merges only with another zero key.
        return if aa == bb { 1.0 } else { -1.0 };
    }
    (ab / (aa.sqrt() * bb.sqrt())) as f32
}

impl Policy for AffPoolPolicy {
    fn name(&self) -> &str {
        "affpool"
    }
    fn prefill_signal(&self) -> PrefillSignal {
        PrefillSignal::None
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
        let (t, d) = (ctx.layout.audio_len(), ctx.head_dim);
        let heads = ctx.layers * ctx.kv_heads;
        let (target, max_run) = (self.config.r_gpu, self.config.max_run);
        let (mut mean, mut buf) = (Vec::with_capacity(d), Vec::with_capacity(t));
        let mut rows_at = |tau: f32| -> usize {
            (0..heads)
                .map(|h| {
                    buf.clear();
                    runs((ctx.audio_keys)(h), d, tau, max_run, &mut mean, &mut buf);
                    buf.len()
                })
                .sum()
        };
        let full = (heads * t) as f64;
        // Rows grow with τ: above 1 nothing merges (ratio 1), below −1 every run is as long
        // as `max_run` allows. Bisection keeps r(lo) ≤ target ≤ r(hi).
        let (mut lo, mut hi) = (-1.5f32, 1.5f32);
        let (mut r_lo, mut r_hi) = (rows_at(lo) as f64 / full, rows_at(hi) as f64 / full);
        if target <= r_lo {
            hi = lo;
            r_hi = r_lo;
        } else {
            for _ in 0..40 {
                let mid = 0.5 * (lo + hi);
                let r = rows_at(mid) as f64 / full;
                if r < target {
                    (lo, r_lo) = (mid, r);
                } else {
                    (hi, r_hi) = (mid, r);
                }
                if (r_hi - target).abs() < 0.5 / full {
                    break;
                }
            }
        }
        let tau = if (target - r_lo).abs() < (r_hi - target).abs() { lo } else { hi };
        let mut plans = Vec::with_capacity(heads);
        let mut kept = 0usize;
        for h in 0..heads {
            buf.clear();
            runs((ctx.audio_keys)(h), d, tau, self.config.max_run, &mut mean, &mut buf);
            kept += buf.len();
            plans.push(HeadPlan {
                device: buf.iter().map(|&(s, _)| s).collect(),
                pooled: buf.iter().map(|&(_, n)| n).collect(),
                ..HeadPlan::default()
            });
        }
        self.threshold = Some(tau);
        self.achieved = Some(kept as f64 / full);
        Ok(plans)
    }

    fn plan_step(&mut self, _obs: &StepObservation<'_>, _r: &Residency, _plan: &mut StepPlan) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identical_keys_pool_up_to_the_run_cap_and_orthogonal_ones_never() {
        let d = 4;
        let same: Vec<f32> = (0..10).flat_map(|_| [1.0, 2.0, 0.0, 0.0]).collect();
        let (mut mean, mut out) = (Vec::new(), Vec::new());
        runs(&same, d, 0.99, 4, &mut mean, &mut out);
        assert_eq!(out, [(0, 4), (4, 4), (8, 2)]);
        let ortho: Vec<f32> = (0..6)
            .flat_map(|i| {
                let mut r = [0.0; 4];
                r[i % 4] = 1.0;
                r
            })
            .collect();
        out.clear();
        runs(&ortho, d, 0.5, 8, &mut mean, &mut out);
        assert_eq!(out.len(), 6);
    }

    #[test]
    fn a_ratio_outside_zero_one_is_refused() {
        assert!(AffPoolPolicy::new(AffPoolConfig::new(0.0)).is_err());
        assert!(AffPoolPolicy::new(AffPoolConfig::new(1.2)).is_err());
        assert!(AffPoolPolicy::new(AffPoolConfig { r_gpu: 0.5, max_run: 0 }).is_err());
    }
}
