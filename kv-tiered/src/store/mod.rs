//! The tiered store: one model's audio-prompt KV cache under a [`Policy`], on a [`Tier`]
//! (WnW §2.3; DESIGN.md "One decode step (WnW)").
//!
//! # Driving it from a decoder
//! ```text
//! prefill:  full attention → per-head audio scores (policy.prefill_signal(): text→audio
//!           attention summed over text queries and the GQA group) + all K/V rows
//!           store = TieredStore::prefill(config, tier, policy, &kv, &scores)?
//!           (or TieredStore::prefill_host(config, policy, &kv, &scores)? on a HostTier)
//! each decode step s:
//!   for layer l:
//!     store.append(l, &k_new, &v_new)?      // new token, all kv-heads (always resident)
//!     let view = store.layer_view(l)?;      // waits only for layer l's recalls
//!     view.with_gathered_parts(&mut lists, |dense, sparse| {   // zero-copy, reused lists
//!         attn.gathered_sparse(&cfg, &q, dense, sparse, &mut out, Some(&mut weights))
//!     })??;
//!     drop(view);
//!     store.add_gathered_weights(l, &weights)?   // anchor signal (StepSignal::AnchorWeights)
//!     store.observe_queries(l, &q)?               // only for StepSignal::Queries (ArkVale)
//!   store.end_step()?                        // decide, release, issue recalls → StepMetrics
//! ```
//! Runtimes that compute the anchor weights themselves can call
//! [`TieredStore::add_anchor_weights`] (per head, any positions) or
//! [`TieredStore::add_audio_weights`] (pre-summed) instead. With SWAN sparse rows, a
//! non-anchor head's audio rows are in [`HeadView::sparse`]; the gathered dense + sparse
//! kernel reads them in place. A store without sparse rows can also use
//! [`LayerView::gathered_into`] with `attn.gathered`.
//!
//! Recalls issued by `end_step` run on a background worker while the runtime computes the
//! next step's early layers; `layer_view(l)` blocks only until layer `l`'s recalls landed.
//! Per-step calls do not allocate once warmed up (buffers and arenas are reserved at prefill;
//! `tests/alloc_free.rs`).
//!
//! Heads are indexed `layer · kv_heads + kv_head`; positions are absolute (`0..seq_len` for
//! the prompt, `seq_len + i` for the i-th generated token).

mod audit;
mod decode;
mod prefill;
pub(crate) mod shared;
mod view;

pub use audit::Audit;
pub use view::{Gather, GatheredLists, HeadView, LayerView};

use std::sync::Arc;
use std::thread::JoinHandle;

use attn_kernels::AttnConfig;
use crossbeam::channel::Sender;

use crate::error::{Error, Result, check_len, param};
use crate::layout::AudioLayout;
use crate::metrics::{RunMetrics, StepMetrics};
use crate::policy::{Policy, Residency, StepPlan};
use crate::rows::RowLayout;
use crate::tier::{HostTier, PoolSpec, Tier, TierConfig};
use shared::{Job, Shared};

/// Shape of the model and the cache.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StoreConfig {
    /// Decoder layers `L`.
    pub layers: usize,
    /// One layer's attention shape (`H_q`, `H_kv`, head size, softmax scale): the shape
    /// the store hands its rows to the kernels with.
    pub attn: AttnConfig,
    /// Row formats (their head dimension is `attn`'s).
    pub rows: RowLayout,
    /// Where the audio sits in the prompt.
    pub layout: AudioLayout,
    /// Generated tokens the store must hold (capacity reserved at prefill).
    pub max_new_tokens: usize,
    /// Capacity of the recall queue (jobs in flight before `end_step` blocks).
    pub queue_capacity: usize,
}

impl StoreConfig {
    /// A configuration with dense f32 rows and a 4096-job recall queue.
    pub fn new(
        layers: usize,
        attn: AttnConfig,
        layout: AudioLayout,
        max_new_tokens: usize,
    ) -> Self {
        Self {
            layers,
            attn,
            rows: RowLayout::dense_f32(attn.head_dim()),
            layout,
            max_new_tokens,
            queue_capacity: 4096,
        }
    }

    /// Checks sizes and row formats.
    ///
    /// # Errors
    /// [`Error::Param`] for zero layers, rows of another head size than `attn`, a zero
    /// queue, positions that would not fit `u32`; as [`RowLayout::validate`]. (The head
    /// layout itself was checked when `attn` was made.)
    pub fn validate(&self) -> Result<()> {
        const OP: &str = "StoreConfig::validate";
        if self.layers == 0 {
            return Err(param(OP, "layers", 0, "≥ 1"));
        }
        if self.rows.head_dim != self.attn.head_dim() {
            return Err(param(OP, "rows.head_dim", self.rows.head_dim, "attn.head_dim()"));
        }
        if self.queue_capacity == 0 {
            return Err(param(OP, "queue_capacity", 0, "≥ 1"));
        }
        if self.layout.seq_len() + self.max_new_tokens >= u32::MAX as usize / 2 {
            return Err(param(
                OP,
                "seq_len + max_new_tokens",
                self.layout.seq_len() + self.max_new_tokens,
                "< 2^31",
            ));
        }
        self.rows.validate()
    }

    /// Heads `L · H_kv`.
    pub fn total_kv_heads(&self) -> usize {
        self.layers * self.attn.kv_heads()
    }

    /// Pool geometry for pages of `page_rows` rows: pool 0 dense, pool 1 sparse (if enabled).
    pub fn pool_specs(&self, page_rows: usize) -> Vec<PoolSpec> {
        (0..self.rows.num_pools())
            .map(|p| {
                let (k, v) = self.rows.codecs(p);
                PoolSpec {
                    page_rows,
                    key_row_bytes: k.row_bytes(self.rows.head_dim),
                    value_row_bytes: v.row_bytes(self.rows.head_dim),
                }
            })
            .collect()
    }

    /// As [`tier_config`](Self::tier_config) with page limits that can never be exceeded, for
    /// tiers that allocate once (the CUDA tier): per layer and pool, every kv-head's whole
    /// prompt plus `max_new_tokens` packed in pages (one partial page each) plus one page per
    /// recallable unit; per host pool, one page per `(head, unit)`. These are full-retention
    /// bounds; a smaller device limit saves memory and is safe for recall (a recall that finds
    /// no page is skipped and retried), but prefill and `append` need their pages.
    pub fn bounded_tier_config(&self, policy: &dyn Policy) -> TierConfig {
        let unit = policy.unit_len(&self.layout).max(1);
        let units = self.layout.audio_len().div_ceil(unit);
        let rows = self.layout.seq_len() + self.max_new_tokens;
        let per_head = rows.div_ceil(unit) + 1 + units;
        TierConfig {
            device_pages_per_layer: Some(self.attn.kv_heads() * per_head),
            host_pages: Some(self.total_kv_heads() * units),
            ..self.tier_config(policy)
        }
    }

    /// The tier configuration a store under `policy` needs (unlimited pages).
    pub fn tier_config(&self, policy: &dyn Policy) -> TierConfig {
        TierConfig {
            layers: self.layers,
            pools: self.pool_specs(policy.unit_len(&self.layout)),
            device_pages_per_layer: None,
            host_pages: None,
        }
    }
}

/// The prompt's K/V rows for prefill (after RoPE, and after the SWAN rotation if used).
pub trait PromptKv {
    /// Keys of `(layer, kv_head)`: `seq_len × head_dim`, row-major.
    fn keys(&self, layer: usize, kv_head: usize) -> &[f32];
    /// Values of `(layer, kv_head)`: `seq_len × head_dim`, row-major.
    fn values(&self, layer: usize, kv_head: usize) -> &[f32];
}

/// The whole prompt's K/V rows, owned, as prefill input: one f32 buffer for keys and one for
/// values, each laid out `[layer][kv_head][position][head_dim]` (the simplest
/// [`PromptKv`]). Not to be confused with `attn_kernels::DenseKv`, a borrowed per-head view
/// the attention kernels read.
#[derive(Clone, Debug, PartialEq)]
pub struct DensePromptKv {
    kv_heads: usize,
    stride: usize,
    keys: Vec<f32>,
    values: Vec<f32>,
}

impl DensePromptKv {
    /// Wraps `keys`/`values` of `layers × kv_heads × seq_len × head_dim` floats.
    ///
    /// # Errors
    /// [`Error::Shape`] if a buffer has the wrong length.
    pub fn new(
        layers: usize,
        kv_heads: usize,
        seq_len: usize,
        head_dim: usize,
        keys: Vec<f32>,
        values: Vec<f32>,
    ) -> Result<Self> {
        let n = layers * kv_heads * seq_len * head_dim;
        check_len("DensePromptKv::new", "keys", &keys, n)?;
        check_len("DensePromptKv::new", "values", &values, n)?;
        Ok(Self { kv_heads, stride: seq_len * head_dim, keys, values })
    }
}

impl PromptKv for DensePromptKv {
    fn keys(&self, layer: usize, kv_head: usize) -> &[f32] {
        let i = (layer * self.kv_heads + kv_head) * self.stride;
        &self.keys[i..i + self.stride]
    }
    fn values(&self, layer: usize, kv_head: usize) -> &[f32] {
        let i = (layer * self.kv_heads + kv_head) * self.stride;
        &self.values[i..i + self.stride]
    }
}

/// Per-head facts the decode path needs on the calling thread.
#[derive(Clone, Copy, Debug)]
struct HeadMeta {
    /// Pool holding this head's audio rows.
    audio_pool: u8,
}

/// Running audio counts behind r_GPU and r_GPU+CPU.
#[derive(Clone, Copy, Debug, Default)]
struct Counts {
    device_audio: u64,
    host_only_audio: u64,
}

/// Reused buffers of [`TieredStore::append`].
#[derive(Debug, Default)]
struct AppendBufs {
    keys: Vec<u8>,
    values: Vec<u8>,
    topk: Vec<usize>,
    /// Reserved `(page, row)` slot per head.
    slots: Vec<(usize, usize)>,
}

/// The tiered KV store. See the module documentation for the call sequence.
pub struct TieredStore<T: Tier = HostTier> {
    config: StoreConfig,
    /// Codebooks and sketch of coded compact rows (empty without them).
    tables: crate::rows::CodeTables,
    policy: Box<dyn Policy>,
    shared: Arc<Shared<T>>,
    heads: Vec<HeadMeta>,
    residency: Residency,
    counts: Counts,
    appended: Vec<usize>,
    step: u64,
    anchor_acc: Vec<f32>,
    anchor_seen: bool,
    queries: Vec<f32>,
    queries_seen: usize,
    enc: AppendBufs,
    plan: StepPlan,
    jobs_buf: Vec<Job>,
    jobs: Option<Sender<Job>>,
    worker: Option<JoinHandle<()>>,
    last: StepMetrics,
    run: RunMetrics,
}

impl<T: Tier> TieredStore<T> {
    /// The configuration.
    pub fn config(&self) -> &StoreConfig {
        &self.config
    }
    /// The policy.
    pub fn policy(&self) -> &dyn Policy {
        self.policy.as_ref()
    }
    /// The tier.
    pub fn tier(&self) -> &T {
        &self.shared.tier
    }
    /// Residency of recallable units (as the policy sees it).
    pub fn residency(&self) -> &Residency {
        &self.residency
    }
    /// Decode steps completed.
    pub fn steps(&self) -> u64 {
        self.step
    }
    /// Metrics of the last completed step.
    pub fn last_step(&self) -> &StepMetrics {
        &self.last
    }
    /// Metrics of the whole run so far.
    pub fn run_metrics(&self) -> &RunMetrics {
        &self.run
    }
    /// Whether `(layer, kv_head)`'s attention weights are wanted this step.
    pub fn is_anchor(&self, layer: usize, kv_head: usize) -> bool {
        layer < self.config.layers
            && kv_head < self.config.attn.kv_heads()
            && self.policy.is_anchor(layer * self.config.attn.kv_heads() + kv_head)
    }
    /// Current r_GPU (§3.4).
    pub fn r_gpu(&self) -> f64 {
        self.counts.device_audio as f64 / self.full_audio()
    }
    /// Current r_GPU+CPU (§3.4; see [`crate::metrics`] for the counting rule).
    pub fn r_gpu_cpu(&self) -> f64 {
        (self.counts.device_audio + self.counts.host_only_audio) as f64 / self.full_audio()
    }
    fn full_audio(&self) -> f64 {
        (self.config.total_kv_heads() * self.config.layout.audio_len()) as f64
    }
    fn check_head(&self, op: &'static str, layer: usize, kv_head: usize) -> Result<usize> {
        if layer >= self.config.layers || kv_head >= self.config.attn.kv_heads() {
            return Err(Error::HeadOutOfRange {
                op,
                layer,
                kv_head,
                layers: self.config.layers,
                kv_heads: self.config.attn.kv_heads(),
            });
        }
        Ok(layer * self.config.attn.kv_heads() + kv_head)
    }
    fn worker_alive(&self) -> bool {
        self.worker.as_ref().is_some_and(|w| !w.is_finished())
    }
}

impl TieredStore<HostTier> {
    /// [`TieredStore::prefill`] on a fresh [`HostTier`] sized for `policy`.
    ///
    /// # Errors
    /// As [`TieredStore::prefill`].
    pub fn prefill_host(
        config: StoreConfig,
        policy: Box<dyn Policy>,
        kv: &dyn PromptKv,
        scores: &[f32],
    ) -> Result<Self> {
        config.validate()?;
        let tier = Arc::new(HostTier::new(config.tier_config(policy.as_ref()))?);
        Self::prefill(config, tier, policy, kv, scores)
    }
}

impl<T: Tier> Drop for TieredStore<T> {
    /// Stops the worker (after it drained its queue), then returns every device and host page.
    fn drop(&mut self) {
        self.jobs = None;
        if let Some(w) = self.worker.take() {
            let _ = w.join();
        }
        let tier = self.shared.tier.as_ref();
        for layer in &self.shared.layers {
            for t in layer.write().iter_mut() {
                for page in
                    t.permanent.drain(..).chain(t.recalled.iter_mut().filter_map(Option::take))
                {
                    tier.free_device(page);
                }
            }
        }
        for page in self.shared.host.pages.iter().flatten() {
            tier.free_host(*page);
        }
    }
}
