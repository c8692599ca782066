//! Proptest strategies for WnW's configuration space, exported behind the `proptest` feature
//! so users can property-test their runtimes against a tiered store: head role maps (§2.2,
//! explicit or triaged from scores under every ranking signal), audio layouts (§2.3 segments
//! and chunks), retention schedules (Eq. 1), row layouts (dense f32/f16/bf16, optionally SWAN
//! sparse fp8 rows), the configurations of WnW and of every §3.3 baseline, and whole
//! prefill-ready stores ([`StoreCase`]).
//!
//! The lossless setting — dense f32 rows, δ = ∞, every chunk selected, retention 1, or the
//! Full cache — is drawn by [`lossless_store_case`]: every row is resident, so gathered
//! attention over the store equals dense attention over the prompt. Row data and scores are
//! standard-normal from a seed (`attn_kernels::synth`), so a failure is reproduced from its
//! printed seed; shapes shrink towards the smallest store.
//!
//! ```
//! use attn_kernels::accuracy::{Kernel, output_error, tolerance};
//! use attn_kernels::{CpuAttention, DecodeAttention, DenseKv, Reference};
//! use kv_tiered::strategies::{StoreLimits, lossless_store_case};
//! use kv_tiered::PromptKv;
//! use proptest::test_runner::{Config, TestRunner};
//!
//! TestRunner::new(Config::with_cases(16)).run(&lossless_store_case(StoreLimits::default()), |case| {
//!     let store = case.build().unwrap();
//!     let cfg = case.config.attn;
//!     let q = attn_kernels::synth::values(cfg.q_len(), case.seed);
//!     for layer in 0..case.config.layers {
//!         // Every row resident: the gathered kernel over the store's zero-copy views ...
//!         let view = store.layer_view(layer).unwrap();
//!         let mut gathered = Vec::new();
//!         view.gathered_into::<f32>(&mut gathered).unwrap();
//!         let mut got = vec![0.0; cfg.q_len()];
//!         CpuAttention::new(1).unwrap().gathered(&cfg, &q, &gathered, &mut got, None).unwrap();
//!         // ... equals dense attention over the whole prompt.
//!         let d = cfg.head_dim();
//!         let dense: Vec<DenseKv<'_, f32>> = (0..cfg.kv_heads())
//!             .map(|h| DenseKv::new(d, case.kv.keys(layer, h), case.kv.values(layer, h)))
//!             .collect();
//!         let mut want = vec![0.0; cfg.q_len()];
//!         Reference.dense(&cfg, &q, &dense, &mut want).unwrap();
//!         let tol = tolerance(Kernel::Gathered, kv_sparse::ValueFormat::F32).output;
//!         proptest::prop_assert!(output_error(&got, &want, case.value_bound()) <= tol);
//!     }
//!     Ok(())
//! }).unwrap();
//! ```

use std::num::NonZeroU32;

use attn_kernels::{AttnConfig, synth};
use kv_sparse::ValueFormat;
use proptest::collection::vec;
use proptest::prelude::*;

use crate::error::Result;
use crate::layout::AudioLayout;
use crate::policy::{
    AdaKvConfig, AdaKvPolicy, ArkValeConfig, ArkValePolicy, AudioKvConfig, AudioKvPolicy,
    EvictionLag, FullPolicy, Policy, SegmentQuota, WnwConfig, WnwPolicy,
};
use crate::retention::RetentionSchedule;
use crate::roles::{HeadRoles, RankingSignal, Role, TriageConfig};
use crate::rows::{RowCodec, RowLayout};
use crate::store::{DensePromptKv, StoreConfig, TieredStore};

/// Any head role.
pub fn role() -> impl Strategy<Value = Role> {
    prop_oneof![Just(Role::Anchor), Just(Role::Tidal), Just(Role::Fixed)]
}

/// Any ranking signal (VS×HS, or one of the A3 ablations).
pub fn ranking_signal() -> impl Strategy<Value = RankingSignal> {
    prop_oneof![Just(RankingSignal::VsHs), Just(RankingSignal::VsOnly), Just(RankingSignal::HsOnly)]
}

/// A per-head score: finite and non-negative, often a small integer (so rankings tie) or 0.
pub fn score() -> impl Strategy<Value = f32> {
    prop_oneof![4 => 0.0f32..10.0, 2 => (0u8..4).prop_map(f32::from), 1 => Just(0.0f32)]
}

/// A [`TriageConfig`] for `heads` KV-heads: `n_voice ≤ heads`, `n_anchor ≤ n_voice`.
pub fn triage_config(heads: usize) -> impl Strategy<Value = TriageConfig> {
    (0..=heads)
        .prop_flat_map(|n_voice| (Just(n_voice), 0..=n_voice, ranking_signal()))
        .prop_map(|(n_voice, n_anchor, signal)| TriageConfig { n_voice, n_anchor, signal })
}

/// The roles of a `layers × kv_heads` grid (both ≥ 1): given explicitly
/// ([`HeadRoles::from_roles`]) or triaged from random voice scores and sensitivities
/// ([`HeadRoles::triage`]). Every draw survives its JSON round trip.
///
/// # Examples
/// ```
/// use kv_tiered::HeadRoles;
/// use kv_tiered::strategies::head_roles;
/// use proptest::test_runner::TestRunner;
/// TestRunner::default().run(&head_roles(3, 2), |roles| {
///     proptest::prop_assert_eq!(HeadRoles::from_json(&roles.to_json().unwrap()).unwrap(), roles);
///     Ok(())
/// }).unwrap();
/// ```
pub fn head_roles(layers: usize, kv_heads: usize) -> impl Strategy<Value = HeadRoles> {
    let n = layers * kv_heads;
    let explicit = vec(role(), n).prop_map(move |roles| {
        HeadRoles::from_roles(layers, kv_heads, &roles).expect("a non-empty grid")
    });
    let triaged =
        (vec(score(), n), vec(score(), n), triage_config(n)).prop_map(move |(vs, hs, config)| {
            HeadRoles::triage(layers, kv_heads, &vs, &hs, config).expect("valid scores and counts")
        });
    prop_oneof![explicit, triaged]
}

/// An [`AudioLayout`] of a prompt of `1..=max_seq_len` tokens: a non-empty audio span
/// anywhere in it (text before, after, both or neither), segments of any length up to the
/// span, chunks of one to three segments.
///
/// # Examples
/// ```
/// use kv_tiered::strategies::audio_layout;
/// use proptest::test_runner::TestRunner;
/// TestRunner::default().run(&audio_layout(64), |l| {
///     // Segments partition the audio span.
///     let covered: usize = (0..l.num_segments()).map(|j| l.segment(j).len()).sum();
///     proptest::prop_assert_eq!(covered, l.audio_len());
///     Ok(())
/// }).unwrap();
/// ```
pub fn audio_layout(max_seq_len: usize) -> impl Strategy<Value = AudioLayout> {
    (1..=max_seq_len.max(1))
        .prop_flat_map(|seq| (Just(seq), 0..seq))
        .prop_flat_map(|(seq, start)| (Just(seq), Just(start), start + 1..=seq))
        .prop_flat_map(|(seq, start, end)| {
            let segment = (1..=end - start).prop_flat_map(|s| (Just(s), s..=3 * s));
            (Just(seq), Just(start..end), segment)
        })
        .prop_map(|(seq, audio, (segment, chunk))| {
            AudioLayout::new(seq, audio, segment, chunk).expect("a valid layout")
        })
}

/// Any eviction lag: δ in `1..=5` steps, or never (the lossless setting).
pub fn eviction_lag() -> impl Strategy<Value = EvictionLag> {
    prop_oneof![
        3 => (1u32..=5).prop_map(|d| EvictionLag::Steps(NonZeroU32::new(d).expect("d ≥ 1"))),
        1 => Just(EvictionLag::Never),
    ]
}

/// A [`WnwConfig`] for `layout`: `1..=num_chunks` chunks per step, any lag, either quota
/// (per segment, or the A2 global top-k).
pub fn wnw_config(layout: AudioLayout) -> impl Strategy<Value = WnwConfig> {
    let quota = prop_oneof![Just(SegmentQuota::PerSegment), Just(SegmentQuota::Global)];
    (1..=layout.num_chunks(), eviction_lag(), quota)
        .prop_map(|(top_chunks, lag, quota)| WnwConfig { top_chunks, lag, quota })
}

/// WnW's lossless knobs for `layout`: every chunk selected, δ = ∞ (with retention 1, or once
/// every tidal segment has been recalled, attention equals dense attention).
///
/// # Examples
/// ```
/// use kv_tiered::{AudioLayout, policy::EvictionLag, strategies::lossless_wnw_config};
/// let l = AudioLayout::new(40, 4..36, 4, 8)?;
/// let c = lossless_wnw_config(&l);
/// assert_eq!((c.top_chunks, c.lag), (l.num_chunks(), EvictionLag::Never));
/// # Ok::<(), kv_tiered::Error>(())
/// ```
pub fn lossless_wnw_config(layout: &AudioLayout) -> WnwConfig {
    WnwConfig {
        top_chunks: layout.num_chunks(),
        lag: EvictionLag::Never,
        quota: SegmentQuota::PerSegment,
    }
}

/// A retention schedule for `roles`: uniform retention in `[0, 1]`, or Eq. 1 with λ in
/// `[0, 4)` (anchors always 1).
pub fn retention_schedule(roles: HeadRoles) -> impl Strategy<Value = RetentionSchedule> {
    let uniform = {
        let roles = roles.clone();
        (0.0f64..=1.0)
            .prop_map(move |r| RetentionSchedule::uniform(&roles, r).expect("r in [0, 1]"))
    };
    let lambda = (0.0f64..4.0).prop_map(move |l| {
        RetentionSchedule::with_lambda(&roles, l).expect("a finite non-negative λ")
    });
    prop_oneof![uniform, lambda]
}

/// A [`RowLayout`] for `head_dim`: dense f32, f16 or bf16 rows, and — for `head_dim ≤ 256`
/// (u8 indices) — often SWAN sparse fp8 rows for non-exact heads' audio, with `k` in
/// `1..=head_dim` for keys and values and scales in `[0.25, 2)`.
pub fn row_layout(head_dim: usize) -> impl Strategy<Value = RowLayout> {
    let dense =
        prop_oneof![Just(ValueFormat::F32), Just(ValueFormat::F16), Just(ValueFormat::Bf16)];
    let sparse = if head_dim <= 256 {
        let codec = || {
            (1..=head_dim, prop_oneof![Just(1.0f32), 0.25f32..2.0])
                .prop_map(|(k, scale)| RowCodec::SparseFp8 { k, scale })
        };
        prop_oneof![1 => Just(None), 2 => (codec(), codec()).prop_map(Some)].boxed()
    } else {
        Just(None).boxed()
    };
    (dense, sparse).prop_map(move |(dense, sparse)| RowLayout { head_dim, dense, sparse })
}

/// A target r_GPU in `(0, 1]`.
fn target() -> impl Strategy<Value = f64> {
    prop_oneof![3 => 0.05f64..1.0, 1 => Just(1.0)]
}

/// A SnapKV / Ada-KV configuration: any target, window `1..=8`, odd pooling kernel up to 7,
/// α in `[0, 1]`.
pub fn ada_kv_config() -> impl Strategy<Value = AdaKvConfig> {
    (target(), 1usize..=8, 0usize..4, 0.0f64..=1.0).prop_map(|(t, window, k, floor_alpha)| {
        AdaKvConfig { target_r_gpu: t, window, pool_kernel: 2 * k + 1, floor_alpha }
    })
}

/// An AudioKV configuration for `heads` KV-heads: any target, voice scores, window,
/// mixing weight, kept spectrum and baseline share.
pub fn audio_kv_config(heads: usize) -> impl Strategy<Value = AudioKvConfig> {
    (target(), vec(score(), heads), 1usize..=8, 0.0f64..=1.0, 0.05f64..=1.0, 0.0f64..=1.0).prop_map(
        |(target_r_gpu, voice_scores, window, alpha, rho, baseline_ratio)| AudioKvConfig {
            target_r_gpu,
            voice_scores,
            window,
            alpha,
            rho,
            baseline_ratio,
        },
    )
}

/// An ArkVale configuration: any target, pages of `1..=max_page` positions, window `1..=8`.
pub fn ark_vale_config(max_page: usize) -> impl Strategy<Value = ArkValeConfig> {
    (target(), 1..=max_page.max(1), 1usize..=8).prop_map(|(target_r_gpu, page_size, window)| {
        ArkValeConfig { target_r_gpu, page_size, window }
    })
}

/// A policy and its configuration, owned (a [`Policy`] is built per store).
#[derive(Clone, Debug)]
pub enum PolicyConfig {
    /// The Full cache (everything resident).
    Full,
    /// WnW with explicit roles and schedule.
    Wnw {
        /// Head roles.
        roles: HeadRoles,
        /// Per-head retention.
        schedule: RetentionSchedule,
        /// Chunks per step, lag, quota.
        config: WnwConfig,
    },
    /// SnapKV / Ada-KV.
    AdaKv(AdaKvConfig),
    /// AudioKV.
    AudioKv(AudioKvConfig),
    /// ArkVale.
    ArkVale(ArkValeConfig),
}

impl PolicyConfig {
    /// The policy for a store over `layout`.
    ///
    /// # Errors
    /// The policy's own validation ([`WnwPolicy::new`], [`AdaKvPolicy::new`], …); never for
    /// a configuration drawn by [`policy_config`].
    pub fn build(&self, layout: AudioLayout) -> Result<Box<dyn Policy>> {
        Ok(match self {
            Self::Full => Box::new(FullPolicy),
            Self::Wnw { roles, schedule, config } => {
                Box::new(WnwPolicy::new(roles.clone(), schedule.clone(), layout, *config)?)
            }
            Self::AdaKv(c) => Box::new(AdaKvPolicy::new(*c)?),
            Self::AudioKv(c) => Box::new(AudioKvPolicy::new(c.clone())?),
            Self::ArkVale(c) => Box::new(ArkValePolicy::new(*c)?),
        })
    }
}

/// WnW over any roles, schedule and configuration for a `layers × kv_heads` model.
pub fn wnw_policy_config(
    layers: usize,
    kv_heads: usize,
    layout: AudioLayout,
) -> impl Strategy<Value = PolicyConfig> {
    head_roles(layers, kv_heads).prop_flat_map(move |roles| {
        (retention_schedule(roles.clone()), wnw_config(layout), Just(roles))
            .prop_map(|(schedule, config, roles)| PolicyConfig::Wnw { roles, schedule, config })
    })
}

/// Any policy for a `layers × kv_heads` model over `layout`: WnW (most often), the Full
/// cache, SnapKV/Ada-KV, AudioKV or ArkVale.
pub fn policy_config(
    layers: usize,
    kv_heads: usize,
    layout: AudioLayout,
) -> impl Strategy<Value = PolicyConfig> {
    let heads = layers * kv_heads;
    prop_oneof![
        4 => wnw_policy_config(layers, kv_heads, layout),
        1 => Just(PolicyConfig::Full),
        1 => ada_kv_config().prop_map(PolicyConfig::AdaKv),
        1 => audio_kv_config(heads).prop_map(PolicyConfig::AudioKv),
        1 => ark_vale_config(8).prop_map(PolicyConfig::ArkVale),
    ]
}

/// Upper bounds of the stores [`store_case`] draws (each drawn from `1..=bound`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StoreLimits {
    /// Most decoder layers.
    pub layers: usize,
    /// Most kv-heads per layer.
    pub kv_heads: usize,
    /// Most q-heads per kv-head.
    pub group: usize,
    /// Largest head size.
    pub head_dim: usize,
    /// Longest prompt.
    pub seq_len: usize,
    /// Most generated tokens the store reserves room for.
    pub max_new_tokens: usize,
}

impl Default for StoreLimits {
    /// Up to 2 layers × 3 kv-heads, groups of 3, `head_dim` 12, 48-token prompts, 4 new
    /// tokens.
    fn default() -> Self {
        Self { layers: 2, kv_heads: 3, group: 3, head_dim: 12, seq_len: 48, max_new_tokens: 4 }
    }
}

/// Everything [`TieredStore::prefill_host`] takes, owned: the store's shape, a policy, the
/// prompt's K/V rows and the per-head audio scores.
#[derive(Clone, Debug)]
pub struct StoreCase {
    /// Model and cache shape, row layout included.
    pub config: StoreConfig,
    /// The placement policy.
    pub policy: PolicyConfig,
    /// Prompt keys and values (standard-normal).
    pub kv: DensePromptKv,
    /// Per-head audio scores, `L·H_kv × T_a`, non-negative.
    pub scores: Vec<f32>,
    /// Seed of the row data and scores.
    pub seed: u64,
}

impl StoreCase {
    /// A host-tier store after prefill.
    ///
    /// # Errors
    /// As [`TieredStore::prefill_host`] and [`PolicyConfig::build`]; never for a case drawn
    /// by [`store_case`] or [`lossless_store_case`].
    pub fn build(&self) -> Result<TieredStore> {
        let policy = self.policy.build(self.config.layout)?;
        TieredStore::prefill_host(self.config, policy, &self.kv, &self.scores)
    }

    /// Largest `|value|` of the prompt (the `attn_kernels::accuracy` bound of attention
    /// over it).
    pub fn value_bound(&self) -> f32 {
        use crate::store::PromptKv;
        let (layers, kv_heads) = (self.config.layers, self.config.attn.kv_heads());
        (0..layers * kv_heads)
            .flat_map(|h| self.kv.values(h / kv_heads, h % kv_heads))
            .fold(0.0, |m, x| m.max(x.abs()))
    }
}

/// The geometry of a store: layers, attention shape, audio layout and a seed.
fn store_shape(
    limits: StoreLimits,
) -> impl Strategy<Value = (usize, AttnConfig, AudioLayout, u64)> {
    let heads = (1..=limits.kv_heads.max(1), 1..=limits.group.max(1), 1..=limits.head_dim.max(1))
        .prop_map(|(kv, g, d)| AttnConfig::new(kv * g, kv, d).expect("a valid layout"));
    (1..=limits.layers.max(1), heads, audio_layout(limits.seq_len), any::<u64>())
}

fn case_from(
    (layers, attn, layout, seed): (usize, AttnConfig, AudioLayout, u64),
    rows: RowLayout,
    policy: PolicyConfig,
    max_new_tokens: usize,
) -> StoreCase {
    let (kv_heads, d) = (attn.kv_heads(), attn.head_dim());
    let n = layers * kv_heads * layout.seq_len() * d;
    let (keys, values) = (synth::values(n, seed), synth::values(n, seed ^ 0x5eed));
    let kv = DensePromptKv::new(layers, kv_heads, layout.seq_len(), d, keys, values)
        .expect("buffers of the model's size");
    let scores = synth::values(layers * kv_heads * layout.audio_len(), seed.rotate_left(17))
        .into_iter()
        .map(f32::abs)
        .collect();
    let config = StoreConfig { rows, ..StoreConfig::new(layers, attn, layout, max_new_tokens) };
    StoreCase { config, policy, kv, scores, seed }
}

/// A prefill-ready store of any shape up to `limits`, with any [`row_layout`] and any
/// [`policy_config`].
///
/// # Examples
/// ```
/// use kv_tiered::strategies::{StoreLimits, store_case};
/// use proptest::test_runner::{Config, TestRunner};
/// TestRunner::new(Config::with_cases(16)).run(&store_case(StoreLimits::default()), |case| {
///     let mut store = case.build().unwrap();
///     let audit = store.audit().unwrap();
///     proptest::prop_assert!(audit.violations.is_empty(), "{:?}", audit.violations);
///     proptest::prop_assert!((0.0..=1.0).contains(&store.r_gpu()));
///     Ok(())
/// }).unwrap();
/// ```
pub fn store_case(limits: StoreLimits) -> impl Strategy<Value = StoreCase> {
    store_shape(limits).prop_flat_map(move |shape| {
        let (layers, attn, layout, _) = shape;
        let policy = policy_config(layers, attn.kv_heads(), layout);
        (Just(shape), row_layout(attn.head_dim()), policy, 1..=limits.max_new_tokens.max(1))
            .prop_map(|(shape, rows, policy, new)| case_from(shape, rows, policy, new))
    })
}

/// A store in the lossless setting: dense f32 rows, and either the Full cache or WnW with
/// any roles, retention 1 and [`lossless_wnw_config`] — every prompt row is resident.
///
/// # Examples
/// See the [module docs](self).
pub fn lossless_store_case(limits: StoreLimits) -> impl Strategy<Value = StoreCase> {
    store_shape(limits).prop_flat_map(move |shape| {
        let (layers, attn, layout, _) = shape;
        let wnw = head_roles(layers, attn.kv_heads()).prop_map(move |roles| {
            let schedule = RetentionSchedule::uniform(&roles, 1.0).expect("1 is in [0, 1]");
            PolicyConfig::Wnw { roles, schedule, config: lossless_wnw_config(&layout) }
        });
        let policy = prop_oneof![3 => wnw, 1 => Just(PolicyConfig::Full)];
        (Just(shape), policy, 1..=limits.max_new_tokens.max(1)).prop_map(|(shape, policy, new)| {
            let rows = RowLayout::dense_f32(shape.1.head_dim());
            case_from(shape, rows, policy, new)
        })
    })
}
