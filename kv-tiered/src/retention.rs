//! Retention schedule (WnW §2.2 Eq. 1) and the λ solver (§3.4 "Configuration").
//!
//! `retention_i = min(s̃_i · λ, 1)` for tidal and fixed heads; anchors have retention 1.
//!
//! **Normalisation of s̃ (our explicit choice).** `s̃_i = s_i / max_j s_j` where `s` is the
//! head importance under the triage signal (VS×HS by default) and the max runs over the
//! non-anchor heads, so `s̃ ∈ [0, 1]` and the most important non-anchor head reaches
//! retention 1 first. Max-normalisation keeps the schedule *proportional* (any positive
//! rescaling of `s` is absorbed by λ); min-max normalisation would instead pin the least
//! important head at retention 0 whatever λ is, which the paper's "proportional schedule"
//! does not suggest. If every non-anchor importance is 0, `s̃ = 0` and only anchors keep audio.
//!
//! The solver picks λ so that the prefill-time r_GPU (§3.4: device audio KV / `L·H_kv·T_a`,
//! with the per-segment floor `⌊retention·n_s⌋`) is within a tolerance (default 0.5 pp) of the
//! target. r_GPU(λ) is a non-decreasing step function; bisection finds its crossing. Tied
//! scores can make it jump over the target, in which case the solver reports the closest
//! achievable values instead of silently missing.

use crate::error::{Error, Result, param};
use crate::layout::AudioLayout;
use crate::roles::{HeadRoles, Role};

/// Default solver tolerance: 0.5 percentage points of r_GPU.
pub const DEFAULT_TOLERANCE: f64 = 0.005;

/// `s̃` for every head (anchors get 1).
///
/// # Examples
/// ```
/// use kv_tiered::{HeadRoles, Role, retention::normalized_importance};
/// let roles = HeadRoles::from_roles(1, 3, &[Role::Anchor, Role::Tidal, Role::Fixed])?;
/// assert_eq!(normalized_importance(&roles), [1.0, 1.0, 1.0]); // scores default to 1
/// # Ok::<(), kv_tiered::Error>(())
/// ```
pub fn normalized_importance(roles: &HeadRoles) -> Vec<f64> {
    let s = roles.importance();
    let max = roles
        .roles()
        .iter()
        .zip(&s)
        .filter(|(r, _)| **r != Role::Anchor)
        .map(|(_, &x)| f64::from(x))
        .fold(0.0, f64::max);
    roles
        .roles()
        .iter()
        .zip(&s)
        .map(|(r, &x)| match r {
            Role::Anchor => 1.0,
            _ if max > 0.0 => f64::from(x) / max,
            _ => 0.0,
        })
        .collect()
}

/// How close a solved schedule came to the r_GPU it was asked for
/// ([`RetentionSchedule::solve_nearest`]).
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct BudgetFit {
    /// The r_GPU asked for.
    pub target: f64,
    /// The prefill r_GPU the schedule achieves.
    pub achieved: f64,
    /// `|achieved − target| ≤` [`DEFAULT_TOLERANCE`].
    pub exact: bool,
}

/// Per-head audio retention on the device after prefill.
#[derive(Clone, Debug, PartialEq)]
pub struct RetentionSchedule {
    lambda: f64,
    retention: Vec<f64>,
}

impl RetentionSchedule {
    /// The schedule for a given λ.
    ///
    /// # Errors
    /// [`Error::Param`] if λ is negative or not finite.
    pub fn with_lambda(roles: &HeadRoles, lambda: f64) -> Result<Self> {
        if !(lambda.is_finite() && lambda >= 0.0) {
            return Err(param(
                "RetentionSchedule::with_lambda",
                "lambda",
                lambda,
                "finite and ≥ 0",
            ));
        }
        Ok(Self::build(&normalized_importance(roles), roles.roles(), lambda))
    }

    /// Uniform retention `r` for every non-anchor head (useful for tests and as a baseline).
    ///
    /// # Errors
    /// [`Error::Param`] if `r ∉ [0, 1]`.
    pub fn uniform(roles: &HeadRoles, r: f64) -> Result<Self> {
        if !(0.0..=1.0).contains(&r) {
            return Err(param("RetentionSchedule::uniform", "r", r, "in [0, 1]"));
        }
        let retention =
            roles.roles().iter().map(|&role| if role == Role::Anchor { 1.0 } else { r }).collect();
        Ok(Self { lambda: f64::NAN, retention })
    }

    fn build(s_tilde: &[f64], roles: &[Role], lambda: f64) -> Self {
        let retention = s_tilde
            .iter()
            .zip(roles)
            .map(|(&s, &r)| if r == Role::Anchor { 1.0 } else { (s * lambda).min(1.0) })
            .collect();
        Self { lambda, retention }
    }

    /// Solves λ for `target` r_GPU within [`DEFAULT_TOLERANCE`].
    ///
    /// # Errors
    /// [`Error::TargetOutOfRange`] unless `0 < target ≤ 1`; [`Error::TargetUnreachable`] if
    /// no λ lands within the tolerance.
    ///
    /// # Examples
    /// ```
    /// use kv_tiered::{AudioLayout, HeadRoles, RetentionSchedule, TriageConfig};
    /// let vs: Vec<f32> = (0..240).map(|i| 0.2 + (i as f32 * 0.37).sin().abs()).collect();
    /// let hs: Vec<f32> = (0..240).map(|i| 1.0 + (i as f32 * 0.11).cos().abs()).collect();
    /// let roles = HeadRoles::triage(30, 8, &vs, &hs, TriageConfig::default())?;
    /// let layout = AudioLayout::new(3100, 50..3050, 25, 50)?;
    /// let sched = RetentionSchedule::solve(&roles, &layout, 0.2)?;
    /// assert!((sched.r_gpu(&layout) - 0.2).abs() <= 0.005);
    /// # Ok::<(), kv_tiered::Error>(())
    /// ```
    pub fn solve(roles: &HeadRoles, layout: &AudioLayout, target: f64) -> Result<Self> {
        Self::solve_with_tolerance(roles, layout, target, DEFAULT_TOLERANCE)
    }

    /// As [`solve`](Self::solve) with an explicit absolute tolerance.
    ///
    /// # Errors
    /// As [`solve`](Self::solve); [`Error::Param`] for a negative or non-finite tolerance.
    pub fn solve_with_tolerance(
        roles: &HeadRoles,
        layout: &AudioLayout,
        target: f64,
        tolerance: f64,
    ) -> Result<Self> {
        if !(target > 0.0 && target <= 1.0) {
            return Err(Error::TargetOutOfRange { target });
        }
        if !(tolerance.is_finite() && tolerance >= 0.0) {
            return Err(param(
                "RetentionSchedule::solve",
                "tolerance",
                tolerance,
                "finite and ≥ 0",
            ));
        }
        let (best, below, above) = Self::search(roles, layout, target);
        if (best.r_gpu(layout) - target).abs() <= tolerance {
            Ok(best)
        } else {
            Err(Error::TargetUnreachable { target, tolerance, below, above })
        }
    }

    /// The schedule whose prefill r_GPU is closest to `target`, and how close it came.
    ///
    /// Unlike [`solve`](Self::solve) this never refuses a target in `(0, 1]`: a short prompt
    /// (few segments, so coarse per-segment quotas) or an anchor share above the target
    /// runs at the nearest feasible budget, and [`BudgetFit::exact`] says whether that is
    /// within [`DEFAULT_TOLERANCE`] of what was asked.
    ///
    /// # Errors
    /// [`Error::TargetOutOfRange`] unless `0 < target ≤ 1`.
    ///
    /// # Examples
    /// ```
    /// use kv_tiered::{AudioLayout, HeadRoles, RetentionSchedule, Role};
    /// // One anchor of four heads: no schedule keeps less than a quarter of the audio.
    /// let roles = HeadRoles::from_roles(1, 4, &[Role::Anchor, Role::Tidal, Role::Tidal, Role::Fixed])?;
    /// let layout = AudioLayout::new(120, 10..110, 25, 50)?;
    /// let (sched, fit) = RetentionSchedule::solve_nearest(&roles, &layout, 0.2)?;
    /// assert!(!fit.exact);
    /// assert_eq!(fit.achieved, 0.25);
    /// assert_eq!(sched.r_gpu(&layout), fit.achieved);
    /// # Ok::<(), kv_tiered::Error>(())
    /// ```
    pub fn solve_nearest(
        roles: &HeadRoles,
        layout: &AudioLayout,
        target: f64,
    ) -> Result<(Self, BudgetFit)> {
        if !(target > 0.0 && target <= 1.0) {
            return Err(Error::TargetOutOfRange { target });
        }
        let (best, _, _) = Self::search(roles, layout, target);
        let achieved = best.r_gpu(layout);
        let exact = (achieved - target).abs() <= DEFAULT_TOLERANCE;
        Ok((best, BudgetFit { target, achieved, exact }))
    }

    /// Bisection on λ: the schedule closest to `target`, and the closest achievable r_GPU
    /// below and above it.
    fn search(roles: &HeadRoles, layout: &AudioLayout, target: f64) -> (Self, f64, f64) {
        let s = normalized_importance(roles);
        let eval = |lambda: f64| Self::build(&s, roles.roles(), lambda);
        let min_pos = s.iter().copied().filter(|&x| x > 0.0).fold(f64::INFINITY, f64::min);
        let mut hi = if min_pos.is_finite() { 1.0 / min_pos } else { 0.0 };
        let mut lo = 0.0;
        let (r_lo, r_hi) = (eval(lo).r_gpu(layout), eval(hi).r_gpu(layout));
        if target <= r_lo {
            return (eval(lo), 0.0, r_lo);
        }
        if target >= r_hi {
            return (eval(hi), r_hi, 1.0);
        }
        // Invariant: r(lo) < target ≤ r(hi).
        for _ in 0..200 {
            let mid = 0.5 * (lo + hi);
            if mid <= lo || mid >= hi {
                break;
            }
            if eval(mid).r_gpu(layout) < target {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        let (below, above) = (eval(lo), eval(hi));
        let (rb, ra) = (below.r_gpu(layout), above.r_gpu(layout));
        (if target - rb < ra - target { below } else { above }, rb, ra)
    }

    /// λ (NaN for [`uniform`](Self::uniform) schedules).
    pub fn lambda(&self) -> f64 {
        self.lambda
    }
    /// Retention of every head.
    pub fn retentions(&self) -> &[f64] {
        &self.retention
    }
    /// Retention of head `i`.
    pub fn retention(&self, head: usize) -> f64 {
        self.retention[head]
    }
    /// Audio positions head `i` keeps on the device after prefill.
    pub fn kept_audio(&self, head: usize, layout: &AudioLayout) -> usize {
        layout.kept_per_segment_quota(self.retention[head])
    }
    /// Prefill-time r_GPU (§3.4).
    pub fn r_gpu(&self, layout: &AudioLayout) -> f64 {
        let kept: usize = self.retention.iter().map(|&r| layout.kept_per_segment_quota(r)).sum();
        kept as f64 / (self.retention.len() * layout.audio_len()) as f64
    }
}
