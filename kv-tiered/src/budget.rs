//! Closed-loop budget calibration (WnW §3.4 "Configuration": λ is selected on a calibration
//! set so that the **measured** r_GPU matches each target, not the prefill-time one).
//!
//! A policy's budget knob (the prefill r_GPU a [`crate::RetentionSchedule`] is solved for,
//! or a baseline's per-head budget) sets what stays on the device after prefill; recall
//! during decode (WnW's tidal heads, ArkVale's pages) then adds to it, so the mean r_GPU
//! measured over a decode sits above the knob by an amount that depends on the prompt and
//! the policy. [`BudgetSearch`] finds the knob whose measured r_GPU is within a tolerance of
//! the target by a bracketing search over calibration decodes: the caller decodes with
//! [`BudgetSearch::proposal`], reports the measured mean with [`BudgetSearch::observe`], and
//! repeats until [`BudgetSearch::proposal`] returns `None`. Searches of many configurations
//! advance in lock-step, so one batched decode serves every search's next probe.
//!
//! The model of the response is "measured = knob + offset" (an additive recall share),
//! refined by secant steps once the target is bracketed. Where the target lies below what
//! any knob achieves (anchors alone, or recall alone, exceed it), the search stops at the
//! smallest knob and [`BudgetSearch::best`] is the nearest feasible budget.

use crate::error::{Error, Result, param};

/// The smallest knob a search proposes (a knob of 0 is not a budget).
pub const MIN_KNOB: f64 = 1e-3;

/// A response slope (measured r_GPU per unit of knob) below which two probes on the same
/// side of the target count as a plateau.
const FLAT_SLOPE: f64 = 0.1;

/// Default tolerance on the measured r_GPU: two percentage points.
pub const DEFAULT_MEASURED_TOLERANCE: f64 = 0.02;

/// One probe of a search: the knob and the r_GPU measured with it.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct Probe {
    /// The budget knob decoded with.
    pub knob: f64,
    /// Mean r_GPU measured over the calibration decode.
    pub measured: f64,
}

/// Why a search stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub enum SearchOutcome {
    /// Still probing.
    Running,
    /// A probe landed within the tolerance.
    Converged,
    /// Even the smallest knob measures above the target: the best probe is the nearest
    /// feasible budget.
    FloorAboveTarget,
    /// Even a knob of 1 measures below the target.
    CeilingBelowTarget,
    /// The probe budget ran out; the best probe is the closest one seen.
    Exhausted,
}

/// A bracketing search for the budget knob whose measured r_GPU hits a target.
///
/// # Examples
/// ```
/// use kv_tiered::budget::{BudgetSearch, SearchOutcome};
/// // A policy that recalls 4 points of r_GPU on top of its prefill budget.
/// let measure = |knob: f64| (knob + 0.04).min(1.0);
/// let mut search = BudgetSearch::new(0.2, 0.005, 6)?;
/// while let Some(knob) = search.proposal() {
///     search.observe(measure(knob))?;
/// }
/// assert_eq!(search.outcome(), SearchOutcome::Converged);
/// assert!((search.best().measured - 0.2).abs() <= 0.005);
/// assert!((search.best().knob - 0.16).abs() < 1e-9);
/// # Ok::<(), kv_tiered::Error>(())
/// ```
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct BudgetSearch {
    target: f64,
    tolerance: f64,
    max_probes: usize,
    probes: Vec<Probe>,
    next: Option<f64>,
    outcome: SearchOutcome,
}

impl BudgetSearch {
    /// A search for `target` (in `(0, 1]`) within `tolerance`, with at most `max_probes`
    /// calibration decodes; the first probe is the target itself.
    ///
    /// # Errors
    /// [`Error::TargetOutOfRange`] for a target outside `(0, 1]`; [`Error::Param`] for a
    /// negative or non-finite tolerance or `max_probes == 0`.
    pub fn new(target: f64, tolerance: f64, max_probes: usize) -> Result<Self> {
        if !(target > 0.0 && target <= 1.0) {
            return Err(Error::TargetOutOfRange { target });
        }
        if !(tolerance.is_finite() && tolerance >= 0.0) {
            return Err(param("BudgetSearch::new", "tolerance", tolerance, "finite and ≥ 0"));
        }
        if max_probes == 0 {
            return Err(param("BudgetSearch::new", "max_probes", 0, "≥ 1"));
        }
        Ok(Self {
            target,
            tolerance,
            max_probes,
            probes: Vec::with_capacity(max_probes),
            next: Some(target.max(MIN_KNOB)),
            outcome: SearchOutcome::Running,
        })
    }

    /// The knob to decode with next; `None` once the search has stopped.
    pub fn proposal(&self) -> Option<f64> {
        self.next
    }

    /// Records the mean r_GPU measured with the last [`proposal`](Self::proposal) and
    /// chooses the next one.
    ///
    /// # Errors
    /// [`Error::Param`] if `measured ∉ [0, 1]` or the search has already stopped.
    pub fn observe(&mut self, measured: f64) -> Result<()> {
        let Some(knob) = self.next else {
            return Err(param("BudgetSearch::observe", "state", "stopped", "a running search"));
        };
        if !(0.0..=1.0).contains(&measured) {
            return Err(param("BudgetSearch::observe", "measured", measured, "in [0, 1]"));
        }
        self.probes.push(Probe { knob, measured });
        let (t, tol) = (self.target, self.tolerance);
        self.next = None;
        self.outcome = if (measured - t).abs() <= tol {
            SearchOutcome::Converged
        } else if measured > t && knob <= MIN_KNOB {
            SearchOutcome::FloorAboveTarget
        } else if measured < t && knob >= 1.0 {
            SearchOutcome::CeilingBelowTarget
        } else if self.probes.len() >= self.max_probes {
            SearchOutcome::Exhausted
        } else {
            self.next = Some(self.step(knob, measured));
            SearchOutcome::Running
        };
        Ok(())
    }

    /// The next knob: a secant step inside the bracket once the target is bracketed, else
    /// the additive step `knob + (target − measured)` — or straight to the bound on that side
    /// when the last two probes show a plateau — clamped to `[MIN_KNOB, 1]`.
    fn step(&self, knob: f64, measured: f64) -> f64 {
        let t = self.target;
        let below =
            self.probes.iter().filter(|p| p.measured < t).max_by(|a, b| a.knob.total_cmp(&b.knob));
        let above =
            self.probes.iter().filter(|p| p.measured > t).min_by(|a, b| a.knob.total_cmp(&b.knob));
        let x = match (below, above) {
            (Some(lo), Some(hi)) if hi.knob > lo.knob => {
                let slope = (hi.measured - lo.measured) / (hi.knob - lo.knob);
                let secant = lo.knob + (t - lo.measured) / slope;
                // Stay strictly inside the bracket so a flat or noisy response still shrinks it.
                let margin = 0.1 * (hi.knob - lo.knob);
                if secant.is_finite() {
                    secant.clamp(lo.knob + margin, hi.knob - margin)
                } else {
                    0.5 * (lo.knob + hi.knob)
                }
            }
            _ => match self.probes[..] {
                // Two probes on one side whose measurement barely followed the knob (a floor
                // of anchors or recall, or a ceiling): the additive step would creep along it,
                // so go to the bound at once — it settles the floor or brackets the target.
                [.., a, b]
                    if (a.measured - t).signum() == (b.measured - t).signum()
                        && a.knob != b.knob
                        && ((b.measured - a.measured) / (b.knob - a.knob)) < FLAT_SLOPE =>
                {
                    if measured > t {
                        MIN_KNOB
                    } else {
                        1.0
                    }
                }
                _ => knob + (t - measured),
            },
        };
        x.clamp(MIN_KNOB, 1.0)
    }

    /// Why the search stopped ([`SearchOutcome::Running`] while probing).
    pub fn outcome(&self) -> SearchOutcome {
        self.outcome
    }

    /// The probe whose measured r_GPU is closest to the target (the target itself, measured
    /// as 0, before any probe).
    pub fn best(&self) -> Probe {
        let t = self.target;
        self.probes
            .iter()
            .copied()
            .min_by(|a, b| (a.measured - t).abs().total_cmp(&(b.measured - t).abs()))
            .unwrap_or(Probe { knob: t, measured: 0.0 })
    }

    /// Whether the probe just observed is [`best`](Self::best) (the first of equally close
    /// probes wins), so a caller can keep only the decode that goes with it.
    pub fn latest_is_best(&self) -> bool {
        self.probes.last().is_some_and(|&p| p == self.best())
    }

    /// Every probe, in order.
    pub fn probes(&self) -> &[Probe] {
        &self.probes
    }

    /// The target r_GPU.
    pub fn target(&self) -> f64 {
        self.target
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(target: f64, f: impl Fn(f64) -> f64, probes: usize) -> BudgetSearch {
        let mut s = BudgetSearch::new(target, 0.005, probes).unwrap();
        while let Some(k) = s.proposal() {
            s.observe(f(k)).unwrap();
        }
        s
    }

    #[test]
    fn a_nonlinear_recall_share_converges_by_secant_steps() {
        // Recall share shrinks as the prefill budget grows (fewer segments left to recall).
        let f = |k: f64| (k + 0.15 * (1.0 - k).powi(2)).min(1.0);
        for target in [0.2, 0.4, 0.6, 0.8] {
            let s = run(target, f, 8);
            assert_eq!(s.outcome(), SearchOutcome::Converged, "target {target}: {:?}", s.probes());
            assert!((s.best().measured - target).abs() <= 0.005);
        }
    }

    #[test]
    fn a_floor_above_the_target_stops_at_the_smallest_knob() {
        let s = run(0.2, |k| 0.3 + 0.5 * k, 8);
        assert_eq!(s.outcome(), SearchOutcome::FloorAboveTarget);
        assert_eq!(s.best().knob, MIN_KNOB);
        assert!((s.best().measured - 0.3005).abs() < 1e-12);
    }

    #[test]
    fn a_plateau_above_the_target_goes_to_the_smallest_knob_at_once() {
        // Anchors and recall hold 0.428 of the span whatever the knob below ~0.29 (the
        // audio study's tiny model at target 0.4): additive steps would creep down 0.028
        // a probe.
        let floor = |k: f64| (k + 0.14).max(0.428);
        let s = run(0.4, floor, 6);
        assert_eq!(s.outcome(), SearchOutcome::FloorAboveTarget, "{:?}", s.probes());
        assert_eq!(s.probes().len(), 4, "{:?}", s.probes());
        assert_eq!(s.best().measured, 0.428);
        // A plateau that ends lower down: the jump brackets the target and the search goes
        // on inside the bracket.
        let shelf = |k: f64| if k < 0.1 { 4.0 * k } else { (k + 0.14).max(0.428) };
        let s = run(0.4, shelf, 8);
        assert_eq!(s.probes()[3].knob, MIN_KNOB, "{:?}", s.probes());
        assert_ne!(s.outcome(), SearchOutcome::FloorAboveTarget, "{:?}", s.probes());
        assert!(s.probes().len() > 4, "{:?}", s.probes());
    }

    #[test]
    fn a_ceiling_below_the_target_stops_at_one() {
        let s = run(0.9, |k| 0.5 * k, 8);
        assert_eq!(s.outcome(), SearchOutcome::CeilingBelowTarget);
        assert_eq!(s.best().knob, 1.0);
    }

    #[test]
    fn a_step_response_exhausts_with_the_closest_probe() {
        // Tied scores: measured r_GPU jumps from 0.1 to 0.3 at knob 0.25.
        let s = run(0.2, |k| if k < 0.25 { 0.1 } else { 0.3 }, 6);
        assert_eq!(s.outcome(), SearchOutcome::Exhausted);
        assert_eq!(s.probes().len(), 6);
        let mut again = BudgetSearch::new(0.2, 0.005, 2).unwrap();
        again.observe(0.1).unwrap();
        assert!(again.latest_is_best());
        again.observe(0.1).unwrap(); // as close as the first: the first stays best
        assert!(!again.latest_is_best());
        assert!((s.best().measured - 0.2).abs() <= 0.1 + 1e-12);
    }

    #[test]
    fn an_exact_first_probe_needs_no_second() {
        let s = run(0.4, |k| k, 8);
        assert_eq!(s.probes().len(), 1);
        assert_eq!(s.outcome(), SearchOutcome::Converged);
    }

    #[test]
    fn bad_inputs_are_typed_errors() {
        assert!(matches!(BudgetSearch::new(0.0, 0.01, 3), Err(Error::TargetOutOfRange { .. })));
        assert!(matches!(BudgetSearch::new(1.5, 0.01, 3), Err(Error::TargetOutOfRange { .. })));
        assert!(matches!(BudgetSearch::new(0.2, f64::NAN, 3), Err(Error::Param { .. })));
        assert!(matches!(BudgetSearch::new(0.2, 0.01, 0), Err(Error::Param { .. })));
        let mut s = BudgetSearch::new(0.2, 0.01, 1).unwrap();
        assert!(matches!(s.observe(f64::NAN), Err(Error::Param { .. })));
        s.observe(0.5).unwrap();
        assert_eq!(s.outcome(), SearchOutcome::Exhausted);
        assert!(matches!(s.observe(0.2), Err(Error::Param { .. })));
    }
}
