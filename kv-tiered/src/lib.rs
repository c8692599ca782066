//! # kv-tiered — WnW tiered audio KV cache
//!
//! Implements WnW (`papers/wnw.txt`): head triage into anchor / tidal / fixed roles (§2.2),
//! the retention schedule and its λ solver (Eq. 1, §3.4), per-segment prefill compression and
//! decode-time chunk swap with eviction lag (§2.3), the §3.4 retention metrics, the §3.3
//! baselines behind one [`Policy`] trait, and — beyond the paper — SWAN sparse fp8 rows for
//! non-anchor audio and recall overlapped with compute on a background worker.
//!
//! Layers, from the bottom:
//! * [`tier`]: where bytes live — the [`Tier`] trait (device arenas, pinned host pool, async
//!   copies with events, move-only pages handed back on failure), [`HostTier`] (default, CPU),
//!   [`tier::FaultyTier`] (fault injection), [`tier::contract`] (conformance check);
//!   [`cuda::CudaTier`] (feature `cuda`) implements the same trait on GPU memory.
//! * [`roles`], [`scores`], [`retention`], [`layout`]: calibration and geometry;
//!   [`budget`]: the closed-loop search for the budget whose *measured* r_GPU hits a target.
//! * [`rows`]: dense rows (lossless f32, or f16/bf16), SWAN sparse fp8 rows and coded rows
//!   (TurboQuant-style, per-token channel groups).
//! * [`policy`]: WnW and the baselines decide placement and recall.
//! * [`TieredStore`]: owns the rows, runs a policy, gives attention kernels zero-copy per-head
//!   views ([`HeadView`]; `attn_kernels::GatheredKv` and `GatheredSparseKv` lists built in
//!   reused [`GatheredLists`]), recalls on a worker thread, reports
//!   [`metrics`], checks itself ([`TieredStore::audit`]).
//! * [`sim`]: a synthetic Voxtral-scale workload for benches and smoke tests.
//!
//! Lossless setting: dense f32 rows, δ = ∞ ([`policy::EvictionLag::Never`]), every chunk
//! selected and retention 1 — gathered attention then equals dense attention
//! (`tests/lossless.rs`).
//!
//! ```
//! use kv_tiered::{AudioLayout, DensePromptKv, HeadRoles, StoreConfig, TieredStore, TriageConfig};
//! use kv_tiered::policy::{WnwConfig, WnwPolicy};
//! // 2 layers × 2 kv-heads, 4 q-heads, head_dim = 4; 40-token prompt with audio at 5..35.
//! let layout = AudioLayout::new(40, 5..35, 5, 10)?;
//! let roles = HeadRoles::triage(2, 2, &[0.9, 0.5, 0.4, 0.1], &[1.0; 4],
//!     TriageConfig { n_voice: 3, n_anchor: 1, ..Default::default() })?;
//! let policy = WnwPolicy::for_target(roles, layout, 0.5, WnwConfig::default())?;
//! let config = StoreConfig::new(2, attn_kernels::AttnConfig::new(4, 2, 4)?, layout, 8);
//! let n = 2 * 2 * 40 * 4;
//! let keys = (0..n).map(|i| (i % 7) as f32).collect();
//! let kv = DensePromptKv::new(2, 2, 40, 4, keys, vec![0.5; n])?;
//! let scores: Vec<f32> = (0..4 * 30).map(|i| (i % 11) as f32).collect();
//! let mut store = TieredStore::prefill_host(config, Box::new(policy), &kv, &scores)?;
//! for layer in 0..2 {
//!     store.append(layer, &[0.1; 8], &[0.2; 8])?;
//!     let view = store.layer_view(layer)?;
//!     assert!(view.head(0).unwrap().len() > 10);
//! }
//! store.add_audio_weights(&[1.0; 30])?;
//! let m = store.end_step()?;
//! assert!(m.r_gpu > 0.4);
//! # Ok::<(), kv_tiered::Error>(())
//! ```

pub mod budget;
pub mod cuda;
pub mod error;
pub mod layout;
pub mod metrics;
pub mod policy;
pub mod residency;
pub mod retention;
pub mod roles;
pub mod rows;
pub mod scores;
pub mod sim;
pub mod store;
#[cfg(feature = "proptest")]
pub mod strategies;
pub mod tier;
pub mod topk;

pub use error::{Error, Result};
pub use layout::AudioLayout;
pub use metrics::{RunMetrics, StepMetrics};
pub use policy::Policy;
pub use retention::{BudgetFit, RetentionSchedule};
pub use roles::{HeadRoles, RankingSignal, Role, TriageConfig};
pub use rows::{CodeTables, RowCodec, RowLayout};
pub use store::{
    Audit, DensePromptKv, Gather, GatheredLists, HeadView, LayerView, PromptKv, StoreConfig,
    TieredStore,
};
pub use tier::{HostTier, Tier};
