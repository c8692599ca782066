//! `tiered`, `swan+tiered` and `turbo+tiered`: WnW's store (`kv-tiered`) over a marked span
//! of the prompt (`papers/wnw.txt` §2.3; the paper's audio span, here any span a user marks).
//!
//! Prefill: the model reports each layer's prefill attention from the text rows to the span
//! (or the last-window rows for the SnapKV-style baselines) and the layer's K/V; after the
//! last layer the cache triages heads, solves the retention schedule and builds the store.
//! Decode: each layer's new k/v are appended (always resident) and attention runs over the
//! resident rows where they lie: the store's layer view lends every kv-head's dense rows
//! and, for `swan+tiered`, its SWAN sparse rows (`LayerView::with_gathered_parts`, lists
//! reused across steps) to `attn-kernels`' gathered dense + sparse kernel
//! (`GatheredSparseAttention::gathered_sparse`), which attends both under one softmax and
//! also returns the softmax weights the anchor heads feed back (Eq. 2); `end_step` lets the
//! policy recall and release.
//!
//! `swan+tiered` additionally rotates q/k by `P_QK` (values come rotated from the absorbed
//! `Ŵ_V`) and stores non-anchor span rows as SWAN sparse fp8 rows, cutting recall bytes
//! (`papers/swan.txt` method section inside WnW's store). The kernel reads those rows at
//! their kept indices — no row is decoded to f32 (`tests/tiered_rows.rs`) — and the
//! steady-state step allocates nothing (`tests/tiered_alloc.rs`).
//!
//! `turbo+tiered` does the same with the equal-footing TurboQuant-style codes (arXiv
//! 2504.19874, §3.1–3.2): q/k turned by the spec's rotation (the paper's random rotation by
//! default), non-anchor span rows stored as f16 norm + 2/3/4-bit codebook codes (keys
//! optionally with the QJL sketch), read in place by the gathered dense + coded kernel
//! (`GatheredCodedAttention::gathered_coded`).

mod prompt;
mod spec;

pub use spec::{PolicyKind, RolesSource, TieredSpec};

use std::sync::Arc;

use attn_kernels::{
    AttnConfig, CpuAttention, GatheredCodedAttention, GatheredCodedKv, GatheredKv,
    GatheredSparseAttention, GatheredSparseKv,
};
use kv_sparse::Value;
use kv_tiered::policy::StepSignal;
use kv_tiered::{GatheredLists, RowCodec, StepMetrics, TieredStore};
use projection::ProjectionSet;

use self::prompt::Prompt;
use super::{AttentionRequest, CacheBytes, CacheShape, KvCache, LayerKv, StepQkv, SwanConfig};
use crate::error::{Result, invalid};

/// What a tiered cache keeps the offloadable span rows of non-exact heads as.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum SpanRows {
    /// Dense rows in the spec's format (`tiered`).
    Dense,
    /// SWAN sparse fp8 rows (`swan+tiered`; dense rotated rows for the lossless
    /// `value=f32` with every component kept).
    Swan(SwanConfig),
    /// Coded rows, keys and values each in its codec (`turbo+tiered`).
    Coded(RowCodec, RowCodec),
}

impl SpanRows {
    /// The rows and rotation of a cache with optional SWAN: SWAN rows in its basis, or dense
    /// unrotated rows.
    fn of_swan(
        swan: Option<(SwanConfig, Arc<ProjectionSet>)>,
    ) -> (Self, Option<Arc<ProjectionSet>>) {
        match swan {
            Some((cfg, set)) => (Self::Swan(cfg), Some(set)),
            None => (Self::Dense, None),
        }
    }
}

impl TieredSpec {
    /// The cache this spec describes, with dense rows in the spec's format; `swan` adds the
    /// SWAN rotation and sparse span rows.
    ///
    /// # Errors
    /// As [`TieredCache::new`].
    pub fn build(
        &self,
        shape: CacheShape,
        swan: Option<(SwanConfig, Arc<ProjectionSet>)>,
        threads: usize,
    ) -> Result<Box<dyn KvCache>> {
        let (rows, rotation) = SpanRows::of_swan(swan);
        self.build_rows(shape, rows, rotation, threads)
    }

    /// The cache this spec describes with `rows` for the offloadable span rows, q/k turned
    /// by `rotation`'s `P_QK` when given (values come rotated from the model's absorbed
    /// `Ŵ_V`).
    ///
    /// # Errors
    /// As [`TieredCache::with_rows`].
    pub fn build_rows(
        &self,
        shape: CacheShape,
        rows: SpanRows,
        rotation: Option<Arc<ProjectionSet>>,
        threads: usize,
    ) -> Result<Box<dyn KvCache>> {
        use half::{bf16, f16};
        use kv_sparse::ValueFormat;
        let s = self.clone();
        Ok(match self.format {
            ValueFormat::F32 => {
                Box::new(TieredCache::<f32>::with_rows(shape, s, rows, rotation, threads)?)
            }
            ValueFormat::Bf16 => {
                Box::new(TieredCache::<bf16>::with_rows(shape, s, rows, rotation, threads)?)
            }
            _ => Box::new(TieredCache::<f16>::with_rows(shape, s, rows, rotation, threads)?),
        })
    }
}

/// A WnW tiered store behind the [`KvCache`] interface; `D` is the dense row format.
pub struct TieredCache<D: Value> {
    shape: CacheShape,
    spec: TieredSpec,
    rows: SpanRows,
    rotation: Option<Arc<ProjectionSet>>,
    kernel: CpuAttention,
    prompt: Option<Prompt>,
    store: Option<TieredStore>,
    reserved: usize,
    appended: usize,
    q_rot: Vec<f32>,
    k_rot: Vec<f32>,
    weights: Vec<f32>,
    lists: GatheredLists<D>,
    last: StepMetrics,
}

impl<D: Value> TieredCache<D> {
    /// An empty cache; `swan` adds the SWAN rotation and sparse span rows.
    ///
    /// # Errors
    /// As [`TieredCache::with_rows`].
    pub fn new(
        shape: CacheShape,
        spec: TieredSpec,
        swan: Option<(SwanConfig, Arc<ProjectionSet>)>,
        threads: usize,
    ) -> Result<Self> {
        let (rows, rotation) = SpanRows::of_swan(swan);
        Self::with_rows(shape, spec, rows, rotation, threads)
    }

    /// An empty cache keeping the offloadable span rows of non-exact heads as `rows`, q/k
    /// turned by `rotation`'s `P_QK` when given.
    ///
    /// # Errors
    /// [`crate::Error::InvalidInput`] if the format is not `D`, SWAN rows are not u8-list
    /// fp8 (or the lossless f32 with every component), coded rows do not fit the head size,
    /// SWAN rows come without a rotation, or the projection set does not fit `shape`;
    /// [`crate::Error::Attention`] for a bad layout or thread count.
    pub fn with_rows(
        shape: CacheShape,
        spec: TieredSpec,
        rows: SpanRows,
        rotation: Option<Arc<ProjectionSet>>,
        threads: usize,
    ) -> Result<Self> {
        if spec.format != D::FORMAT {
            return Err(invalid(
                "tiered cache",
                format!("format {} is not the cache's {}", spec.format, D::FORMAT),
            ));
        }
        match rows {
            SpanRows::Swan(cfg) => {
                let full = cfg.k_key == shape.head_dim() && cfg.k_value == shape.head_dim();
                use kv_sparse::coded::ValueKind::Elems;
                let list = cfg.index == super::SwanIndex::List;
                if !list
                    || cfg.value != Elems(kv_sparse::ValueFormat::Fp8E4M3)
                        && !(full && cfg.value == Elems(kv_sparse::ValueFormat::F32))
                {
                    let reason = "kv-tiered stores sparse rows as u8-list fp8: use index=list with value=fp8, or value=f32 with k = kv = head_dim (dense rotated rows)";
                    return Err(invalid("swan+tiered cache", reason));
                }
                if rotation.is_none() {
                    return Err(invalid("swan+tiered cache", "SWAN rows need their rotation"));
                }
            }
            SpanRows::Coded(keys, values) => {
                let d = shape.head_dim();
                let layout = kv_tiered::RowLayout::with_coded(d, spec.format, keys, values);
                layout.validate().map_err(|e| invalid("coded tiered cache", e.to_string()))?;
            }
            SpanRows::Dense => {}
        }
        if let Some(set) = &rotation {
            shape.check_projection("tiered cache", set.dims())?;
        }
        Ok(Self {
            shape,
            spec,
            rows,
            rotation,
            kernel: CpuAttention::new(threads)?,
            prompt: None,
            store: None,
            reserved: 0,
            appended: 0,
            q_rot: vec![0.0; shape.q_heads() * shape.head_dim()],
            k_rot: vec![0.0; shape.kv_heads() * shape.head_dim()],
            weights: Vec::new(),
            lists: GatheredLists::with_capacity(shape.kv_heads()),
            last: StepMetrics::default(),
        })
    }

    /// The store, once prefill has completed.
    pub fn store(&self) -> Option<&TieredStore> {
        self.store.as_ref()
    }

    fn prompt_mut(&mut self, tokens: usize) -> Result<&mut Prompt> {
        if self.store.is_some() {
            return Err(invalid("tiered prefill", "the store is already built; prefill runs once"));
        }
        if self.prompt.is_none() {
            self.prompt = Some(Prompt::new(self.shape, self.spec.span(tokens)?, tokens)?);
        }
        self.prompt.as_mut().ok_or_else(|| invalid("tiered prefill", "no prompt"))
    }

    /// Rotates one token's q and k into the cache's basis (no-op without a rotation).
    fn rotate_step(&mut self, layer: usize, step: &StepQkv<'_>) -> Result<bool> {
        let Some(set) = &self.rotation else { return Ok(false) };
        set.rotate_qk_into(layer, 1, step.q, step.k, &mut self.q_rot, &mut self.k_rot)?;
        Ok(true)
    }

    fn store_mut(&mut self) -> Result<&mut TieredStore> {
        self.store.as_mut().ok_or_else(|| {
            invalid("tiered decode", "the tiered cache needs a prefill covering its span first")
        })
    }
}

impl<D: Value> KvCache for TieredCache<D> {
    fn thread_pool(&self) -> Option<&attn_kernels::ThreadPool> {
        Some(self.kernel.pool())
    }

    fn label(&self) -> String {
        let basis = self
            .rotation
            .as_ref()
            .map_or(String::new(), |s| format!(" basis={}", s.provenance().kind));
        let rows = match self.rows {
            SpanRows::Dense => String::new(),
            SpanRows::Swan(c) => format!("swan k={}/{}{basis} + ", c.k_key, c.k_value),
            SpanRows::Coded(k, v) => format!("{k}/{v}{basis} + "),
        };
        let s = &self.spec;
        format!(
            "{rows}tiered {:?} r_gpu={} span={}..{} ({})",
            s.policy,
            s.r_gpu,
            s.span_start,
            s.span_end.map_or(String::new(), |e| e.to_string()),
            D::FORMAT
        )
    }

    fn shape(&self) -> CacheShape {
        self.shape
    }

    fn len(&self) -> usize {
        self.store.as_ref().map_or(0, |s| s.config().layout.seq_len() + self.appended)
    }

    fn reserve(&mut self, tokens: usize) -> Result<()> {
        self.reserved = self.reserved.max(tokens);
        Ok(())
    }

    fn attention_request(&mut self, prompt_len: usize) -> Option<AttentionRequest> {
        let signal = self.spec.prefill_signal();
        let prompt = self.prompt_mut(prompt_len).ok()?;
        prompt.request(signal)
    }

    fn prefill_attention(&mut self, layer: usize, received: &[f32]) -> Result<()> {
        let prompt = self
            .prompt
            .as_mut()
            .ok_or_else(|| invalid("tiered prefill", "attention before the request"))?;
        prompt.add_scores(layer, received)
    }

    fn prefill(&mut self, layer: usize, kv: LayerKv<'_>) -> Result<()> {
        self.shape.check_prefill(layer, &kv)?;
        let set = self.rotation.clone();
        let prompt = self.prompt_mut(kv.tokens)?;
        prompt.add_layer(layer, &kv, set.as_deref())?;
        if layer + 1 == self.shape.layers {
            let prompt =
                self.prompt.take().ok_or_else(|| invalid("tiered prefill", "no prompt"))?;
            let capacity = if self.reserved > 0 {
                self.reserved.saturating_sub(kv.tokens).max(1)
            } else {
                self.spec.max_new
            };
            // Sparse span rows only for fp8 values; f32 with every component kept is the
            // lossless setting and stays dense (rotated).
            let fp8 = kv_sparse::coded::ValueKind::Elems(kv_sparse::ValueFormat::Fp8E4M3);
            let rows = match self.rows {
                SpanRows::Swan(c) if c.value != fp8 => SpanRows::Dense,
                rows => rows,
            };
            self.store = Some(prompt.build_store(&self.spec, rows, capacity)?);
            // Every later step attends at most `tokens + capacity` rows per kv-head.
            self.weights.reserve(self.shape.kv_heads() * (kv.tokens + capacity));
            self.kernel.reserve(&self.shape.attn, kv.tokens + capacity);
        }
        Ok(())
    }

    fn decode(&mut self, layer: usize, step: StepQkv<'_>, out: &mut [f32]) -> Result<()> {
        self.shape.check_step(layer, &step, out)?;
        let rotated = self.rotate_step(layer, &step)?;
        let Self { store, q_rot, k_rot, kernel, shape, weights, lists, .. } = self;
        let attn = &shape.attn;
        let store = store.as_mut().ok_or_else(|| {
            invalid("tiered decode", "the tiered cache needs a prefill covering its span first")
        })?;
        let (q, k) = if rotated { (&q_rot[..], &k_rot[..]) } else { (step.q, step.k) };
        store.append(layer, k, step.v)?;
        store.observe_queries(layer, q)?;
        let weights =
            (store.policy().step_signal() == StepSignal::AnchorWeights).then_some(weights);
        attend(store, layer, (kernel, attn, lists), q, out, weights)?;
        if layer + 1 == self.shape.layers {
            self.appended += 1;
        }
        Ok(())
    }

    fn end_step(&mut self) -> Result<()> {
        self.last = *self.store_mut()?.end_step()?;
        Ok(())
    }

    fn bytes(&self) -> CacheBytes {
        match (&self.store, &self.prompt) {
            (Some(store), _) => store_bytes(store),
            (None, Some(p)) => CacheBytes { resident: p.bytes(), offloaded: 0 },
            (None, None) => CacheBytes::default(),
        }
    }

    fn stats(&self) -> Vec<(&'static str, f64)> {
        let Some(store) = &self.store else { return Vec::new() };
        let run = store.run_metrics();
        vec![
            ("r_gpu", store.r_gpu()),
            ("target_r_gpu", self.spec.r_gpu),
            ("prefill_r_gpu", run.prefill_r_gpu),
            ("r_gpu_cpu", store.r_gpu_cpu()),
            ("mean_r_gpu", run.mean_r_gpu()),
            ("h2d_bytes_per_step", run.mean_bytes_per_step()),
            ("recalls", run.recalls as f64),
            ("releases", run.releases as f64),
            ("policy_us_per_step", run.mean_policy_time().as_secs_f64() * 1e6),
        ]
    }
}

/// Attention over one layer's resident dense and SWAN sparse or coded rows, read in place;
/// with `weights` (the policy reads the anchor signal) the kernel's per-row softmax weights
/// are fed back to the store (Eq. 2).
fn attend<D: Value>(
    store: &mut TieredStore,
    layer: usize,
    (kernel, attn, lists): (&mut CpuAttention, &AttnConfig, &mut GatheredLists<D>),
    q: &[f32],
    out: &mut [f32],
    mut weights: Option<&mut Vec<f32>>,
) -> Result<()> {
    let dense_rows =
        |dense: &[GatheredKv<'_, D>]| dense.iter().map(GatheredKv::num_rows).sum::<usize>();
    let view = store.layer_view(layer)?;
    if store.config().rows.is_coded() {
        view.with_coded_parts(lists, |dense, coded| {
            let rows =
                dense_rows(dense) + coded.iter().map(GatheredCodedKv::num_rows).sum::<usize>();
            kernel.gathered_coded(attn, q, dense, coded, out, sized(weights.as_deref_mut(), rows))
        })??;
    } else {
        view.with_gathered_parts(lists, |dense, sparse| {
            let rows =
                dense_rows(dense) + sparse.iter().map(GatheredSparseKv::num_rows).sum::<usize>();
            kernel.gathered_sparse(attn, q, dense, sparse, out, sized(weights.as_deref_mut(), rows))
        })??;
    }
    drop(view);
    if let Some(w) = weights {
        store.add_gathered_weights(layer, w)?;
    }
    Ok(())
}

/// `weights` resized to `rows`, as the kernels' weights output.
fn sized(weights: Option<&mut Vec<f32>>, rows: usize) -> Option<&mut [f32]> {
    weights.map(|w| {
        w.resize(rows, 0.0);
        &mut w[..]
    })
}

/// Resident bytes (rows attention reads, by pool format) and the host copies.
fn store_bytes(store: &TieredStore) -> CacheBytes {
    let cfg = store.config();
    let d = cfg.rows.head_dim;
    let row = |pool: usize| {
        let (k, v) = cfg.rows.codecs(pool);
        k.row_bytes(d) + v.row_bytes(d)
    };
    let (dense, sparse) = (row(0), row(1));
    let mut resident = 0;
    for layer in 0..cfg.layers {
        if let Ok(view) = store.layer_view(layer) {
            for h in 0..view.kv_heads() {
                if let Some(head) = view.head(h) {
                    resident +=
                        head.dense.positions.len() * dense + head.sparse.positions.len() * sparse;
                }
            }
        }
    }
    CacheBytes { resident, offloaded: store.run_metrics().prefill_host_bytes as usize }
}
