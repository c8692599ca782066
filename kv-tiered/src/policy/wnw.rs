//! The WnW policy (§2.2–2.3): anchors keep all audio; tidal and fixed heads keep the top
//! `⌊retention·n_s⌋` positions of each segment by summed text→audio attention (or the same
//! budget by global top-k, ablation A2); tidal complements go to the host, fixed complements
//! are dropped. Each decode step, the anchors' summed softmax weights `A^{(s)}` (Eq. 2,
//! reset every step) give chunk scores `Ā_c = mean_{τ∈c} A_τ`; the top-k chunks are
//! selected; tidal heads recall the missing segments of selected chunks and release recalled
//! segments left unselected for δ consecutive steps (the host copy stays).

use std::num::NonZeroU32;

use crate::error::{Error, Result, param};
use crate::layout::AudioLayout;
use crate::retention::RetentionSchedule;
use crate::roles::{HeadRoles, Role};
use crate::topk::top_k_into;

use super::{
    HeadPlan, Policy, PrefillContext, PrefillSignal, Residency, StepObservation, StepPlan,
    StepSignal,
};

/// How prefill spends each head's audio budget (ablation A2).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum SegmentQuota {
    /// Top `⌊retention·n_s⌋` of every segment (WnW default: no segment wholly evicted).
    #[default]
    PerSegment,
    /// The same total budget by global top-k over all audio positions.
    Global,
}

/// Eviction lag δ.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum EvictionLag {
    /// Release after this many consecutive unselected steps.
    Steps(NonZeroU32),
    /// Never release (δ = ∞, the lossless setting).
    Never,
}

impl Default for EvictionLag {
    /// δ = 3 (§2.3).
    fn default() -> Self {
        Self::Steps(NonZeroU32::new(3).expect("3 > 0"))
    }
}

/// WnW hyper-parameters.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct WnwConfig {
    /// Chunks selected per step (k = 3).
    pub top_chunks: usize,
    /// Eviction lag δ.
    pub lag: EvictionLag,
    /// Prefill selection granularity.
    pub quota: SegmentQuota,
}

impl Default for WnwConfig {
    fn default() -> Self {
        Self { top_chunks: 3, lag: EvictionLag::default(), quota: SegmentQuota::PerSegment }
    }
}

/// The WnW policy. Build with [`WnwPolicy::new`] (explicit schedule) or
/// [`WnwPolicy::for_target`] (λ solved for a target r_GPU).
#[derive(Clone, Debug)]
pub struct WnwPolicy {
    roles: HeadRoles,
    schedule: RetentionSchedule,
    layout: AudioLayout,
    config: WnwConfig,
    anchor: Vec<bool>,
    tidal: Vec<u32>,
    /// Consecutive unselected steps per (head, segment).
    lag: Vec<u32>,
    chunk_scores: Vec<f32>,
    prefix: Vec<f64>,
    order: Vec<u32>,
    selected: Vec<bool>,
    selected_list: Vec<u32>,
    scratch: Vec<u32>,
}

impl WnwPolicy {
    /// WnW with an explicit retention schedule.
    ///
    /// # Errors
    /// [`Error::Shape`] if the schedule does not cover every head; [`Error::Param`] if
    /// `top_chunks == 0`.
    pub fn new(
        roles: HeadRoles,
        schedule: RetentionSchedule,
        layout: AudioLayout,
        config: WnwConfig,
    ) -> Result<Self> {
        if schedule.retentions().len() != roles.total_kv_heads() {
            return Err(Error::Shape {
                op: "WnwPolicy::new",
                what: "schedule",
                expected: roles.total_kv_heads(),
                got: schedule.retentions().len(),
            });
        }
        if config.top_chunks == 0 {
            return Err(param("WnwPolicy::new", "top_chunks", 0, "≥ 1"));
        }
        let anchor = roles.roles().iter().map(|&r| r == Role::Anchor).collect();
        let tidal = roles.heads_with(Role::Tidal).map(|h| h as u32).collect();
        let n = roles.total_kv_heads() * layout.num_segments();
        Ok(Self {
            roles,
            schedule,
            layout,
            config,
            anchor,
            tidal,
            lag: vec![0; n],
            chunk_scores: Vec::with_capacity(layout.num_chunks()),
            prefix: Vec::with_capacity(layout.audio_len() + 1),
            order: Vec::with_capacity(layout.num_chunks()),
            selected: vec![false; layout.num_segments()],
            selected_list: Vec::with_capacity(layout.num_segments()),
            scratch: Vec::new(),
        })
    }

    /// WnW with λ solved so the prefill r_GPU is within 0.5 pp of `target_r_gpu`.
    ///
    /// # Errors
    /// As [`RetentionSchedule::solve`] and [`WnwPolicy::new`].
    pub fn for_target(
        roles: HeadRoles,
        layout: AudioLayout,
        target_r_gpu: f64,
        config: WnwConfig,
    ) -> Result<Self> {
        let schedule = RetentionSchedule::solve(&roles, &layout, target_r_gpu)?;
        Self::new(roles, schedule, layout, config)
    }

    /// The head roles.
    pub fn roles(&self) -> &HeadRoles {
        &self.roles
    }
    /// The retention schedule.
    pub fn schedule(&self) -> &RetentionSchedule {
        &self.schedule
    }
    /// The configuration.
    pub fn config(&self) -> WnwConfig {
        self.config
    }
    /// Segments selected at the last step (ascending).
    pub fn selected_segments(&self) -> &[u32] {
        &self.selected_list
    }

    /// Retained audio indices of one non-anchor head (sorted).
    fn retained(&mut self, scores: &[f32], retention: f64, out: &mut Vec<u32>) {
        out.clear();
        match self.config.quota {
            SegmentQuota::PerSegment => {
                for j in 0..self.layout.num_segments() {
                    let seg = self.layout.segment(j);
                    let k = crate::layout::quota(retention, seg.len());
                    top_k_into(&scores[seg.clone()], k, seg.start as u32, &mut self.scratch);
                    out.extend_from_slice(&self.scratch);
                }
            }
            SegmentQuota::Global => {
                let k = self.layout.kept_per_segment_quota(retention);
                top_k_into(scores, k, 0, out);
            }
        }
    }

    /// Chunk scores from the anchor weights, then the selected segments. No weights (the
    /// runtime reported none this step) select nothing.
    fn select(&mut self, weights: &[f32]) {
        self.selected.fill(false);
        self.selected_list.clear();
        if weights.len() != self.layout.audio_len() {
            return;
        }
        self.prefix.clear();
        self.prefix.push(0.0);
        let mut acc = 0.0f64;
        for &w in weights {
            acc += f64::from(w);
            self.prefix.push(acc);
        }
        self.chunk_scores.clear();
        for c in 0..self.layout.num_chunks() {
            let r = self.layout.chunk(c);
            let mean = (self.prefix[r.end] - self.prefix[r.start]) / r.len() as f64;
            self.chunk_scores.push(mean as f32);
        }
        top_k_into(&self.chunk_scores, self.config.top_chunks, 0, &mut self.order);
        for &c in &self.order {
            for s in self.layout.chunk_segments(c as usize) {
                self.selected[s] = true;
            }
        }
        self.selected_list
            .extend((0..self.selected.len() as u32).filter(|&s| self.selected[s as usize]));
    }
}

impl Policy for WnwPolicy {
    fn name(&self) -> &str {
        "wnw"
    }
    fn prefill_signal(&self) -> PrefillSignal {
        PrefillSignal::TextToAudio
    }
    fn step_signal(&self) -> StepSignal {
        StepSignal::AnchorWeights
    }
    fn unit_len(&self, layout: &AudioLayout) -> usize {
        layout.segment_len()
    }
    fn is_anchor(&self, head: usize) -> bool {
        self.anchor.get(head).copied().unwrap_or(false)
    }

    fn plan_prefill(&mut self, ctx: &PrefillContext<'_>) -> Result<Vec<HeadPlan>> {
        let t = self.layout.audio_len();
        if ctx.layout != &self.layout || ctx.layers * ctx.kv_heads != self.roles.total_kv_heads() {
            return Err(param(
                "WnwPolicy::plan_prefill",
                "layout/heads",
                format!("{} heads", ctx.layers * ctx.kv_heads),
                "the layout and roles the policy was built with",
            ));
        }
        let mut plans = Vec::with_capacity(self.roles.total_kv_heads());
        let mut kept = Vec::with_capacity(t);
        for h in 0..self.roles.total_kv_heads() {
            let role = self.roles.roles()[h];
            let mut plan = HeadPlan { exact: role == Role::Anchor, ..HeadPlan::default() };
            if role == Role::Anchor {
                plan.device = (0..t as u32).collect();
            } else {
                let retention = self.schedule.retention(h);
                self.retained(&ctx.scores[h * t..(h + 1) * t], retention, &mut kept);
                if role == Role::Tidal {
                    plan.host = complement(&kept, t);
                }
                plan.device = kept.clone();
            }
            plans.push(plan);
        }
        self.lag.fill(0);
        Ok(plans)
    }

    fn plan_step(&mut self, obs: &StepObservation<'_>, residency: &Residency, plan: &mut StepPlan) {
        self.select(obs.anchor_weights);
        let units = residency.units();
        let limit = match self.config.lag {
            EvictionLag::Steps(d) => d.get(),
            EvictionLag::Never => u32::MAX,
        };
        for &h in &self.tidal {
            let hu = h as usize;
            for &s in &self.selected_list {
                if residency.recallable(hu, s as usize) && !residency.resident(hu, s as usize) {
                    plan.recalls.push((h, s));
                    self.lag[hu * units + s as usize] = 0;
                }
            }
            for &s in residency.resident_units(hu) {
                let lag = &mut self.lag[hu * units + s as usize];
                if self.selected[s as usize] {
                    *lag = 0;
                } else {
                    *lag = lag.saturating_add(1);
                    if *lag >= limit {
                        plan.releases.push((h, s));
                    }
                }
            }
        }
    }
}

/// `0..n` minus the sorted list `kept`.
fn complement(kept: &[u32], n: usize) -> Vec<u32> {
    let mut out = Vec::with_capacity(n - kept.len());
    let mut it = kept.iter().peekable();
    for i in 0..n as u32 {
        if it.peek() == Some(&&i) {
            it.next();
        } else {
            out.push(i);
        }
    }
    out
}
