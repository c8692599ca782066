//! ArkVale-style baseline (§3.3, Appendix F): page-based recallable eviction, restricted to
//! the audio region.
//!
//! Audio is cut into pages of 32 positions. Every page of every head is mirrored on the host
//! (r_GPU+CPU = 1). Each page has a digest — the per-dimension bounding box `[min_d, max_d]`
//! of its keys. Each decode step, for each KV-head, a page's importance is the upper bound
//! of `q·k` over its box, `Σ_d max(q_d·min_d, q_d·max_d)`, maximised over the group's
//! q-heads; the top `B = r · T_a / 32` pages are resident, missing ones are recalled
//! and unselected ones released immediately. Initially resident pages are the top-`B` pages by
//! observation-window attention mass. A fractional `B` is kept on average over the heads:
//! each holds `⌊B⌋` or `⌈B⌉` pages, the larger budgets spread evenly so that all heads
//! together hold `round(B · heads)` pages — so the measured r_GPU moves with the target in
//! steps of one page of one head, not one page of every head (on a short prompt a page is
//! several points of r_GPU).
//!
//! Simplifications relative to ArkVale: the decision at step s uses the queries of step s−1
//! (so recall overlaps compute, like WnW's anchor signal) instead of the current query;
//! digests are cuboids only (ArkVale also offers spheres); all heads share one page budget
//! (up to the one page that spreads a fractional budget).

use crate::error::{Result, check_len, param};
use crate::layout::AudioLayout;
use crate::topk::top_k_into;

use super::adakv::check_target;
use super::{
    HeadPlan, Policy, PrefillContext, PrefillSignal, Residency, StepObservation, StepPlan,
    StepSignal,
};

/// ArkVale hyper-parameters.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ArkValeConfig {
    /// Target r_GPU in (0, 1].
    pub target_r_gpu: f64,
    /// Page size in audio positions (32).
    pub page_size: usize,
    /// Observation window for the initial pages.
    pub window: usize,
}

impl ArkValeConfig {
    /// Appendix F defaults: pages of 32.
    pub fn new(target_r_gpu: f64) -> Self {
        Self { target_r_gpu, page_size: 32, window: 32 }
    }
}

/// The ArkVale-style policy.
#[derive(Clone, Debug)]
pub struct ArkValePolicy {
    config: ArkValeConfig,
    layers: usize,
    kv_heads: usize,
    head_dim: usize,
    pages: usize,
    /// Pages each head keeps on the device (`⌊B⌋` or `⌈B⌉`).
    budgets: Vec<usize>,
    /// `[head][page][min | max][d]`.
    digests: Vec<f32>,
    page_scores: Vec<f32>,
    order: Vec<u32>,
    selected: Vec<bool>,
}

impl ArkValePolicy {
    /// Validates the configuration.
    ///
    /// # Errors
    /// [`crate::Error::TargetOutOfRange`]; [`crate::Error::Param`] for a zero page size or
    /// window.
    pub fn new(config: ArkValeConfig) -> Result<Self> {
        check_target(config.target_r_gpu)?;
        if config.page_size == 0 || config.window == 0 {
            return Err(param(
                "ArkValePolicy::new",
                "page_size/window",
                format!("{}/{}", config.page_size, config.window),
                "≥ 1",
            ));
        }
        Ok(Self {
            config,
            layers: 0,
            kv_heads: 0,
            head_dim: 0,
            pages: 0,
            budgets: Vec::new(),
            digests: Vec::new(),
            page_scores: Vec::new(),
            order: Vec::new(),
            selected: Vec::new(),
        })
    }

    /// Pages each head keeps on the device, in head order (layer-major), after prefill.
    pub fn budgets(&self) -> &[usize] {
        &self.budgets
    }

    /// Per-head page budgets averaging `b` pages (at least 1, at most `pages` each): heads
    /// get `⌊b⌋` pages, and `round(b · heads) − ⌊b⌋ · heads` of them, spread evenly, one more.
    fn spread(b: f64, heads: usize, pages: usize) -> Vec<usize> {
        let b = b.clamp(1.0, pages as f64);
        let (base, extra) = (b.floor() as usize, (b * heads as f64).round() as usize);
        let extra = extra.saturating_sub(base * heads).min(heads);
        (0..heads)
            .map(|h| {
                let more = (h + 1) * extra / heads > h * extra / heads;
                (base + usize::from(more)).min(pages)
            })
            .collect()
    }

    fn build_digests(&mut self, ctx: &PrefillContext<'_>) {
        let (d, t, p) = (ctx.head_dim, ctx.layout.audio_len(), self.config.page_size);
        self.digests = Vec::with_capacity(ctx.layers * ctx.kv_heads * self.pages * 2 * d);
        for h in 0..ctx.layers * ctx.kv_heads {
            let keys = (ctx.audio_keys)(h);
            for page in 0..self.pages {
                let rows = &keys[page * p * d..((page + 1) * p).min(t) * d];
                let mut lo = vec![f32::INFINITY; d];
                let mut hi = vec![f32::NEG_INFINITY; d];
                for row in rows.chunks_exact(d) {
                    for (j, &x) in row.iter().enumerate() {
                        lo[j] = lo[j].min(x);
                        hi[j] = hi[j].max(x);
                    }
                }
                self.digests.extend_from_slice(&lo);
                self.digests.extend_from_slice(&hi);
            }
        }
    }

    /// Upper bound of `q·k` over the page box of `(head, page)`, max over `qs` rows.
    fn page_bound(&self, head: usize, page: usize, qs: &[f32]) -> f32 {
        let d = self.head_dim;
        let base = (head * self.pages + page) * 2 * d;
        let (lo, hi) = (&self.digests[base..base + d], &self.digests[base + d..base + 2 * d]);
        qs.chunks_exact(d)
            .map(|q| {
                q.iter()
                    .zip(lo.iter().zip(hi))
                    .map(|(&q, (&a, &b))| (q * a).max(q * b))
                    .sum::<f32>()
            })
            .fold(f32::NEG_INFINITY, f32::max)
    }
}

impl Policy for ArkValePolicy {
    fn name(&self) -> &str {
        "arkvale"
    }
    fn prefill_signal(&self) -> PrefillSignal {
        PrefillSignal::LastTokens(self.config.window)
    }
    fn step_signal(&self) -> StepSignal {
        StepSignal::Queries
    }
    fn unit_len(&self, _layout: &AudioLayout) -> usize {
        self.config.page_size
    }
    fn is_anchor(&self, _head: usize) -> bool {
        false
    }

    fn plan_prefill(&mut self, ctx: &PrefillContext<'_>) -> Result<Vec<HeadPlan>> {
        let (t, p) = (ctx.layout.audio_len(), self.config.page_size);
        (self.layers, self.kv_heads, self.head_dim) = (ctx.layers, ctx.kv_heads, ctx.head_dim);
        self.pages = t.div_ceil(p);
        let heads = ctx.layers * ctx.kv_heads;
        self.budgets =
            Self::spread(self.config.target_r_gpu * t as f64 / p as f64, heads, self.pages);
        self.build_digests(ctx);
        check_len("ArkValePolicy::plan_prefill", "scores", ctx.scores, heads * t)?;
        let mut plans = Vec::with_capacity(heads);
        let mut mass = Vec::with_capacity(self.pages);
        for h in 0..heads {
            let s = &ctx.scores[h * t..(h + 1) * t];
            mass.clear();
            mass.extend(s.chunks(p).map(|c| c.iter().sum::<f32>()));
            let mut initial = Vec::new();
            top_k_into(&mass, self.budgets[h], 0, &mut initial);
            plans.push(HeadPlan {
                host: (0..t as u32).collect(),
                initially_resident: initial,
                ..HeadPlan::default()
            });
        }
        self.selected = vec![false; self.pages];
        Ok(plans)
    }

    fn plan_step(&mut self, obs: &StepObservation<'_>, residency: &Residency, plan: &mut StepPlan) {
        let (d, g) = (self.head_dim, obs.q_heads / self.kv_heads.max(1));
        if obs.queries.len() != self.layers * obs.q_heads * d || g == 0 {
            return; // no queries this step: keep the current pages
        }
        for h in 0..self.layers * self.kv_heads {
            let (l, k) = (h / self.kv_heads, h % self.kv_heads);
            let q0 = (l * obs.q_heads + k * g) * d;
            let qs = &obs.queries[q0..q0 + g * d];
            self.page_scores.clear();
            for page in 0..self.pages {
                let s = self.page_bound(h, page, qs);
                self.page_scores.push(s);
            }
            let budget = self.budgets.get(h).copied().unwrap_or(1);
            top_k_into(&self.page_scores, budget, 0, &mut self.order);
            self.selected.fill(false);
            for &u in &self.order {
                self.selected[u as usize] = true;
                if !residency.resident(h, u as usize) {
                    plan.recalls.push((h as u32, u));
                }
            }
            for &u in residency.resident_units(h) {
                if !self.selected[u as usize] {
                    plan.releases.push((h as u32, u));
                }
            }
        }
    }
}
