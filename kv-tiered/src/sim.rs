//! A synthetic WnW workload for benches, examples and runtime smoke tests: a random model of
//! a given shape (random calibration scores, prompt K/V and prefill attention), and an anchor
//! signal shaped like §2.1's decode-time attention — a bump that sweeps through the audio as
//! the transcript advances, over a small noise floor. Deterministic per seed (SplitMix64), no
//! extra dependencies.
//!
//! [`SimConfig::voxtral_mini`] is Voxtral-mini's scale: 30 layers × 8 kv-heads,
//! 32 q-heads, head_dim = 128, 5 anchors, 90 voice heads, 3000 audio tokens (4 min at 12.5 tok/s).

use attn_kernels::AttnConfig;

use crate::error::Result;
use crate::layout::{
    AudioLayout, DEFAULT_CHUNK_SECONDS, DEFAULT_SEGMENT_SECONDS, VOXTRAL_TOKENS_PER_SECOND,
};
use crate::policy::{WnwConfig, WnwPolicy};
use crate::roles::{HeadRoles, RankingSignal, TriageConfig};
use crate::rows::RowLayout;
use crate::store::{DensePromptKv, StoreConfig, TieredStore};

/// Shape and knobs of a synthetic run.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SimConfig {
    /// Layers.
    pub layers: usize,
    /// KV-heads per layer.
    pub kv_heads: usize,
    /// Q-heads per layer.
    pub q_heads: usize,
    /// Head dimension.
    pub head_dim: usize,
    /// Text tokens before the audio.
    pub text_before: usize,
    /// Audio tokens.
    pub audio_len: usize,
    /// Text tokens after the audio (the instruction).
    pub text_after: usize,
    /// Voice heads.
    pub n_voice: usize,
    /// Anchor heads.
    pub n_anchor: usize,
    /// Target r_GPU.
    pub target_r_gpu: f64,
    /// Decode steps the signal sweeps the audio in.
    pub steps: usize,
    /// PRNG seed.
    pub seed: u64,
}

impl SimConfig {
    /// Voxtral-mini at r_GPU = 0.2 (§3.4), a 600-token transcript.
    pub fn voxtral_mini() -> Self {
        Self {
            layers: 30,
            kv_heads: 8,
            q_heads: 32,
            head_dim: 128,
            text_before: 40,
            audio_len: 3000,
            text_after: 60,
            n_voice: 90,
            n_anchor: 5,
            target_r_gpu: 0.2,
            steps: 600,
            seed: 1,
        }
    }

    /// The audio layout (Voxtral rate, default windows).
    ///
    /// # Errors
    /// [`crate::Error::AudioSpan`] for an empty audio span.
    pub fn layout(&self) -> Result<AudioLayout> {
        let a = self.text_before..self.text_before + self.audio_len;
        AudioLayout::from_rate(
            a.end + self.text_after,
            a,
            VOXTRAL_TOKENS_PER_SECOND,
            DEFAULT_SEGMENT_SECONDS,
            DEFAULT_CHUNK_SECONDS,
        )
    }

    /// Store configuration with the given row layout (decode capacity = `steps`).
    ///
    /// # Errors
    /// As [`SimConfig::layout`].
    pub fn store_config(&self, rows: RowLayout) -> Result<StoreConfig> {
        let attn = AttnConfig::new(self.q_heads, self.kv_heads, self.head_dim)?;
        let mut c = StoreConfig::new(self.layers, attn, self.layout()?, self.steps);
        c.rows = rows;
        Ok(c)
    }
}

/// SplitMix64: tiny, deterministic, good enough for synthetic data.
#[derive(Clone, Debug)]
pub struct SplitMix(u64);

impl SplitMix {
    /// A generator from `seed`.
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }
    /// Next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in `[0, 1)`.
    pub fn unit(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32
    }
}

/// A synthetic model: roles, prompt K/V and prefill text→audio scores.
pub struct SimModel {
    /// The configuration.
    pub config: SimConfig,
    /// Triage from random VS/HS.
    pub roles: HeadRoles,
    /// Prompt K/V (uniform in [-1, 1]).
    pub kv: DensePromptKv,
    /// Per-head prefill scores (sink-heavy: decaying over the audio, plus noise).
    pub scores: Vec<f32>,
}

impl SimModel {
    /// Generates the model.
    ///
    /// # Errors
    /// As [`HeadRoles::triage`] and [`SimConfig::layout`].
    pub fn new(config: SimConfig) -> Result<Self> {
        let mut rng = SplitMix::new(config.seed);
        let heads = config.layers * config.kv_heads;
        let vs: Vec<f32> = (0..heads).map(|_| rng.unit()).collect();
        let hs: Vec<f32> = (0..heads).map(|_| 0.1 + rng.unit()).collect();
        let triage = TriageConfig {
            n_voice: config.n_voice,
            n_anchor: config.n_anchor,
            signal: RankingSignal::VsHs,
        };
        let roles = HeadRoles::triage(config.layers, config.kv_heads, &vs, &hs, triage)?;
        let seq = config.layout()?.seq_len();
        let n = heads * seq * config.head_dim;
        let keys = (0..n).map(|_| 2.0 * rng.unit() - 1.0).collect();
        let values = (0..n).map(|_| 2.0 * rng.unit() - 1.0).collect();
        let kv =
            DensePromptKv::new(config.layers, config.kv_heads, seq, config.head_dim, keys, values)?;
        let t = config.audio_len as f32;
        let scores = (0..heads * config.audio_len)
            .map(|i| (-3.0 * (i % config.audio_len) as f32 / t).exp() + 0.2 * rng.unit())
            .collect();
        Ok(Self { config, roles, kv, scores })
    }

    /// A WnW store on a fresh host tier with λ solved for the target.
    ///
    /// # Errors
    /// As [`WnwPolicy::for_target`] and [`TieredStore::prefill`].
    pub fn wnw_store(&self, rows: RowLayout, wnw: WnwConfig) -> Result<TieredStore> {
        let layout = self.config.layout()?;
        let policy =
            WnwPolicy::for_target(self.roles.clone(), layout, self.config.target_r_gpu, wnw)?;
        TieredStore::prefill_host(
            self.config.store_config(rows)?,
            Box::new(policy),
            &self.kv,
            &self.scores,
        )
    }

    /// A bounded tier geometry for this model's stores with `rows`: every head's prompt and
    /// decode rows plus every recallable unit fit on the device, every unit on the host
    /// (bounded tiers such as [`crate::cuda::CudaTier`] need the numbers up front).
    ///
    /// # Errors
    /// As [`SimConfig::store_config`].
    pub fn bounded_tier_config(&self, rows: RowLayout) -> Result<crate::tier::TierConfig> {
        let c = &self.config;
        let layout = c.layout()?;
        let store = c.store_config(rows)?;
        let unit = layout.segment_len();
        let per_head = (layout.seq_len() + c.steps).div_ceil(unit) + layout.num_segments() + 2;
        let mut tier = store.tier_config(&crate::policy::FullPolicy);
        tier.device_pages_per_layer = Some(c.kv_heads * per_head);
        tier.host_pages = Some(c.layers * c.kv_heads * (layout.num_segments() + 1));
        Ok(tier)
    }

    /// A store on `tier` running `policy` over this model's prompt.
    ///
    /// # Errors
    /// As [`TieredStore::prefill`].
    pub fn store_on<T: crate::Tier>(
        &self,
        rows: RowLayout,
        tier: std::sync::Arc<T>,
        policy: Box<dyn crate::Policy>,
    ) -> Result<TieredStore<T>> {
        TieredStore::prefill(self.config.store_config(rows)?, tier, policy, &self.kv, &self.scores)
    }
}

/// The anchor signal of step `step`: a bump of width ~2 s centred on a frontier that sweeps
/// the audio over `steps` steps, plus a 1% noise floor (`out` has `audio_len` entries).
pub fn frontier_signal(rng: &mut SplitMix, step: usize, steps: usize, out: &mut [f32]) {
    let t = out.len();
    let centre = (step as f64 + 0.5) / steps.max(1) as f64 * t as f64;
    let width = 25.0;
    for (i, w) in out.iter_mut().enumerate() {
        let z = (i as f64 - centre) / width;
        *w = (-0.5 * z * z).exp() as f32 + 0.01 * rng.unit();
    }
}
