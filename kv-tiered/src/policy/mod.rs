//! Policies: *which* audio KV lives where, at prefill and at every decode step. WnW
//! ([`WnwPolicy`], §2.2–2.3) and the baselines of §3.3 (Full cache, SnapKV/Ada-KV, AudioKV,
//! ArkVale, and the token-merging AffPool of Table 1 — the KV-eviction ones restricted to the audio region per the §3.3 audio-only constraint) implement
//! one trait, [`Policy`], so one harness ([`crate::TieredStore`]) runs and measures them all.
//!
//! The store owns the bytes and the tiers; a policy only decides:
//!
//! * at prefill, per head, a [`HeadPlan`]: audio positions kept on the device permanently,
//!   positions kept on the host (recallable), the rest dropped; text is always resident;
//! * at each decode step, from a [`StepObservation`] (anchor attention or queries), which
//!   recallable **units** (contiguous runs of [`Policy::unit_len`] audio positions: WnW
//!   segments, ArkVale pages) to recall or release, written into a [`StepPlan`].

mod adakv;
mod affpool;
mod arkvale;
mod audiokv;
mod full;
mod wnw;

pub use adakv::{AdaKvConfig, AdaKvPolicy};
pub use affpool::{AffPoolConfig, AffPoolPolicy};
pub use arkvale::{ArkValeConfig, ArkValePolicy};
pub use audiokv::{AudioKvConfig, AudioKvPolicy};
pub use full::FullPolicy;
pub use wnw::{EvictionLag, SegmentQuota, WnwConfig, WnwPolicy};

use crate::error::Result;
use crate::layout::AudioLayout;

/// Which per-head audio scores a policy needs from the runtime at prefill.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PrefillSignal {
    /// None (Full cache).
    None,
    /// `p_τ = Σ_{t ∈ text} attn_{t,τ}` summed over all text queries of the prompt and over the
    /// GQA group's q-heads (WnW §2.3).
    TextToAudio,
    /// The same sum restricted to the last `w` prompt tokens (SnapKV observation window).
    LastTokens(usize),
}

/// Which decode-time signal a policy needs from the runtime each step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StepSignal {
    /// Nothing (static policies).
    None,
    /// Softmax weights of the anchor heads' q-heads at audio positions (Eq. 2), reported with
    /// [`crate::TieredStore::add_anchor_weights`] for the heads [`Policy::is_anchor`] names.
    AnchorWeights,
    /// Every layer's queries, reported with [`crate::TieredStore::observe_queries`].
    Queries,
}

/// Placement of one head's audio after prefill. Audio indices are `0..T_a`, sorted ascending;
/// `device` and `host` are disjoint; anything in neither is dropped.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HeadPlan {
    /// Audio indices kept on the device for the whole decode.
    pub device: Vec<u32>,
    /// Audio indices kept on the host and recallable by unit.
    pub host: Vec<u32>,
    /// Units whose host rows also start on the device (ArkVale's initial pages).
    pub initially_resident: Vec<u32>,
    /// Rows of this head must stay exact (dense) even when SWAN sparse rows are enabled
    /// (anchors: their attention is the recall signal).
    pub exact: bool,
    /// Token merging (AffPool): empty, or one run length per `device` entry — `device[i]`
    /// then stands for the `pooled[i]` consecutive audio positions starting at it, and the
    /// store writes their mean key and mean value as that one row. Runs are disjoint from
    /// each other and from `host`.
    pub pooled: Vec<u32>,
}

/// Everything a policy may read at prefill.
#[derive(Clone, Copy)]
pub struct PrefillContext<'a> {
    /// Audio layout.
    pub layout: &'a AudioLayout,
    /// Layers.
    pub layers: usize,
    /// KV-heads per layer.
    pub kv_heads: usize,
    /// Head dimension.
    pub head_dim: usize,
    /// Per-head scores requested by [`Policy::prefill_signal`]: `heads × T_a`, head index
    /// `layer · kv_heads + kv_head`, finite and non-negative (validated). Empty for
    /// [`PrefillSignal::None`].
    pub scores: &'a [f32],
    /// Keys of every head at audio positions, `heads × T_a × head_dim` (ArkVale digests).
    pub audio_keys: &'a dyn Fn(usize) -> &'a [f32],
}

/// Decode-step inputs the store collected for the policy.
#[derive(Clone, Copy, Debug)]
pub struct StepObservation<'a> {
    /// Decode step (0-based).
    pub step: u64,
    /// `A^{(s)}_τ` of Eq. 2 (summed over anchors), `T_a` entries; zeros unless requested.
    pub anchor_weights: &'a [f32],
    /// Queries `layers × q_heads × head_dim`; empty unless requested.
    pub queries: &'a [f32],
    /// q-heads per layer.
    pub q_heads: usize,
}

/// Read-only residency of recallable units, maintained by the store.
#[derive(Clone, Debug)]
pub struct Residency {
    units: usize,
    recallable: Vec<bool>,
    resident: Vec<bool>,
    lists: Vec<Vec<u32>>,
}

impl Residency {
    pub(crate) fn new(heads: usize, units: usize) -> Self {
        Self {
            units,
            recallable: vec![false; heads * units],
            resident: vec![false; heads * units],
            lists: (0..heads).map(|_| Vec::with_capacity(units)).collect(),
        }
    }
    pub(crate) fn set_recallable(&mut self, head: usize, unit: usize) {
        self.recallable[head * self.units + unit] = true;
    }
    pub(crate) fn set_resident(&mut self, head: usize, unit: usize, on: bool) {
        let i = head * self.units + unit;
        if self.resident[i] == on {
            return;
        }
        self.resident[i] = on;
        let list = &mut self.lists[head];
        if on {
            list.push(unit as u32);
        } else if let Some(p) = list.iter().position(|&u| u as usize == unit) {
            list.swap_remove(p);
        }
    }
    /// Units per head.
    pub fn units(&self) -> usize {
        self.units
    }
    /// Whether `(head, unit)` has host rows that can be recalled.
    pub fn recallable(&self, head: usize, unit: usize) -> bool {
        self.recallable[head * self.units + unit]
    }
    /// Whether `(head, unit)`'s host rows are currently on the device.
    pub fn resident(&self, head: usize, unit: usize) -> bool {
        self.resident[head * self.units + unit]
    }
    /// The units of `head` currently recalled (any order).
    pub fn resident_units(&self, head: usize) -> &[u32] {
        &self.lists[head]
    }
}

/// A policy's decisions for one step. Entries are `(head, unit)`.
#[derive(Clone, Debug, Default)]
pub struct StepPlan {
    /// Units to bring to the device.
    pub recalls: Vec<(u32, u32)>,
    /// Units to release from the device (the host copy stays).
    pub releases: Vec<(u32, u32)>,
}

impl StepPlan {
    /// Empties both lists (keeps capacity).
    pub fn clear(&mut self) {
        self.recalls.clear();
        self.releases.clear();
    }
}

/// A KV placement policy. See the module documentation.
pub trait Policy: Send {
    /// Short name for reports ("wnw", "full", …).
    fn name(&self) -> &str;
    /// Scores the runtime must supply at prefill.
    fn prefill_signal(&self) -> PrefillSignal;
    /// Signal the runtime must supply each decode step.
    fn step_signal(&self) -> StepSignal;
    /// Recall granularity in audio positions (also the page size of the store's pools).
    fn unit_len(&self, layout: &AudioLayout) -> usize;
    /// Whether `head`'s attention weights feed [`StepSignal::AnchorWeights`].
    fn is_anchor(&self, head: usize) -> bool;
    /// Per-head placement (one [`HeadPlan`] per head, head index `layer · kv_heads + kv_head`).
    ///
    /// # Errors
    /// Policy-specific validation failures.
    fn plan_prefill(&mut self, ctx: &PrefillContext<'_>) -> Result<Vec<HeadPlan>>;
    /// Decisions for one decode step. Must only recall recallable, non-resident units and only
    /// release resident ones (the store checks).
    fn plan_step(&mut self, obs: &StepObservation<'_>, residency: &Residency, plan: &mut StepPlan);
}

/// Max-pooling with odd `kernel` (same padding): `out[i] = max(x[i−k/2 ..= i+k/2])`.
pub(crate) fn max_pool(x: &[f32], kernel: usize, out: &mut Vec<f32>) {
    let h = kernel / 2;
    out.clear();
    out.extend((0..x.len()).map(|i| {
        let (a, b) = (i.saturating_sub(h), (i + h + 1).min(x.len()));
        x[a..b].iter().copied().fold(f32::NEG_INFINITY, f32::max)
    }));
}
