//! Recall-overlap measurement for `scripts/gpu-check.sh` (WnW §2.3 recall, Table 4's
//! "MB/step"; beyond the paper: overlapped with attention). A step = `layers_per_step` hybrid
//! fp8 decode launches on the compute stream; a recall = `bytes_per_step` of segment pages
//! copied host→device through [`CudaTier::copy_to_device`] on the copy stream.

use std::time::Instant;

use attn_kernels::AttnConfig;
use attn_kernels::cuda::bench::{synthetic_csr, synthetic_dense};
use attn_kernels::cuda::{Gpu, LayerCache};
use kv_sparse::ValueFormat;

use super::CudaTier;
use crate::tier::{CopyEvent, DevicePage, HostPage, PoolSpec, Tier, TierConfig};

/// What to measure.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecallConfig {
    /// Bytes recalled per decode step (WnW Table 4: ≤ 1.04 MB).
    pub bytes_per_step: usize,
    /// Measured steps per phase.
    pub steps: usize,
    /// Decode launches per step (one per layer).
    pub layers_per_step: usize,
    /// Rows per kv-head of the attended hybrid cache.
    pub len: usize,
}

impl Default for RecallConfig {
    /// ≈ 1 MB per step, 30 layers of a 32k-token hybrid fp8 cache, 40 steps.
    fn default() -> Self {
        Self { bytes_per_step: 1 << 20, steps: 40, layers_per_step: 30, len: 32_768 }
    }
}

/// Seconds per step of each phase.
#[derive(Clone, Debug, PartialEq)]
pub struct RecallReport {
    /// Bytes actually recalled per step (whole pages).
    pub bytes_per_step: usize,
    /// Recall alone.
    pub recall_s: f64,
    /// Attention alone.
    pub compute_s: f64,
    /// Recall of step s+1 issued, then attention of step s, then both awaited.
    pub overlapped_s: f64,
}

impl RecallReport {
    /// H2D recall throughput (bytes/s) measured alone.
    pub fn h2d_bytes_per_s(&self) -> f64 {
        self.bytes_per_step as f64 / self.recall_s
    }
    /// Step time added by recall, as a fraction of attention alone (target < 0.05).
    pub fn added_fraction(&self) -> f64 {
        (self.overlapped_s - self.compute_s) / self.compute_s
    }
    /// Fraction of the recall time hidden behind attention (1 = fully hidden).
    pub fn hidden_fraction(&self) -> f64 {
        (1.0 - (self.overlapped_s - self.compute_s) / self.recall_s).clamp(0.0, 1.0)
    }
    /// JSON object of the report.
    pub fn to_json(&self) -> String {
        format!(
            "{{\"bytes_per_step\":{},\"recall_us\":{:.2},\"h2d_gb_per_s\":{:.2},\"attention_us\":{:.2},\"overlapped_us\":{:.2},\"added_fraction\":{:.4},\"hidden_fraction\":{:.4}}}",
            self.bytes_per_step,
            self.recall_s * 1e6,
            self.h2d_bytes_per_s() / 1e9,
            self.compute_s * 1e6,
            self.overlapped_s * 1e6,
            self.added_fraction(),
            self.hidden_fraction()
        )
    }
}

/// One step's recall: every host page into the device pages of `set`, all events awaited.
struct Recall {
    host: Vec<HostPage>,
    sets: [Vec<DevicePage>; 2],
    rows: usize,
}

impl Recall {
    fn issue(&mut self, tier: &CudaTier, set: usize) -> Result<Vec<super::CudaCopyEvent>, String> {
        let pages = std::mem::take(&mut self.sets[set]);
        let mut events = Vec::with_capacity(pages.len());
        for (src, dst) in self.host.iter().zip(pages) {
            match tier.copy_to_device(*src, dst, self.rows) {
                Ok((page, ev)) => {
                    self.sets[set].push(page);
                    events.push(ev);
                }
                Err(e) => {
                    self.sets[set].push(e.page);
                    return Err(format!("{}", e.error));
                }
            }
        }
        Ok(events)
    }
}

fn wait(events: Vec<super::CudaCopyEvent>) -> Result<(), String> {
    events.into_iter().try_for_each(|e| e.wait().map_err(|e| e.to_string()))
}

/// Measures recall alone, attention alone and both overlapped (see the module docs).
///
/// # Errors
/// A message when there is no GPU (or no `cuda` feature) or a CUDA call fails.
pub fn recall_overlap(cfg: &RecallConfig) -> Result<RecallReport, String> {
    let spec = PoolSpec { page_rows: 25, key_row_bytes: 256, value_row_bytes: 256 };
    let pages = cfg.bytes_per_step.div_ceil(spec.rows_bytes(spec.page_rows)).max(1);
    let tier = CudaTier::new(TierConfig {
        layers: 1,
        pools: vec![spec],
        device_pages_per_layer: Some(2 * pages),
        host_pages: Some(pages),
    })
    .map_err(|e| e.to_string())?;
    let fill: Vec<u8> = (0..spec.page_key_bytes()).map(|i| (i * 31 % 251) as u8).collect();
    let mut recall =
        Recall { host: Vec::new(), sets: [Vec::new(), Vec::new()], rows: spec.page_rows };
    for _ in 0..pages {
        let h = tier.alloc_host(0).map_err(|e| e.to_string())?;
        tier.write_host(h, 0, &fill, &fill).map_err(|e| e.to_string())?;
        recall.host.push(h);
        for set in &mut recall.sets {
            set.push(tier.alloc_device(0, 0).map_err(|e| e.to_string())?);
        }
    }
    let gpu = Gpu::new().map_err(|e| e.to_string())?;
    let attn = AttnConfig::new(32, 8, 128).map_err(|e| e.to_string())?;
    let (k, v) = (
        synthetic_csr(8, cfg.len - 128, 128, 64, ValueFormat::Fp8E4M3, 1),
        synthetic_csr(8, cfg.len - 128, 128, 64, ValueFormat::Fp8E4M3, 2),
    );
    let (bk, bv) = (
        synthetic_dense(8, 128, 128, ValueFormat::F16, 3),
        synthetic_dense(8, 128, 128, ValueFormat::F16, 4),
    );
    let dev = gpu
        .upload(
            &attn,
            LayerCache::Hybrid { keys: &k, values: &v, buffer_keys: &bk, buffer_values: &bv },
        )
        .map_err(|e| e.to_string())?;
    let q = vec![0.01f32; 32 * 128];
    let compute = || {
        gpu.time_decode(&attn, &q, &dev, cfg.layers_per_step).map(drop).map_err(|e| e.to_string())
    };
    compute()?;
    wait(recall.issue(&tier, 0)?)?;
    let steps = cfg.steps.max(1);
    let t = Instant::now();
    for s in 0..steps {
        wait(recall.issue(&tier, s % 2)?)?;
    }
    let recall_s = t.elapsed().as_secs_f64() / steps as f64;
    let t = Instant::now();
    for _ in 0..steps {
        compute()?;
    }
    let compute_s = t.elapsed().as_secs_f64() / steps as f64;
    let t = Instant::now();
    for s in 0..steps {
        let next = recall.issue(&tier, (s + 1) % 2)?; // recall for step s+1 ...
        compute()?; // ... overlaps the attention of step s
        wait(next)?;
    }
    let overlapped_s = t.elapsed().as_secs_f64() / steps as f64;
    Ok(RecallReport {
        bytes_per_step: pages * spec.rows_bytes(spec.page_rows),
        recall_s,
        compute_s,
        overlapped_s,
    })
}

/// What the store-level leg measured: a WnW decode through a [`crate::TieredStore`] on the
/// CUDA tier (recalls issued on the copy stream, each layer's view waiting only for its own
/// recalls), against the same store with every head at retention 1 (nothing to recall).
#[derive(Clone, Debug, PartialEq)]
pub struct StoreStepReport {
    /// Recall bytes per step (mean over the WnW run).
    pub bytes_per_step: f64,
    /// Measured mean r_GPU of the WnW run.
    pub mean_r_gpu: f64,
    /// Seconds per step (append + layer views + end of step) with WnW's recalls.
    pub wnw_step_s: f64,
    /// Seconds per step with nothing to recall.
    pub no_recall_step_s: f64,
}

impl StoreStepReport {
    /// Step time recall adds (`wnw − no recall`; negative values are noise).
    pub fn added_s(&self) -> f64 {
        self.wnw_step_s - self.no_recall_step_s
    }

    /// One JSON object.
    pub fn to_json(&self) -> String {
        format!(
            "{{\"bytes_per_step\":{:.0},\"mean_r_gpu\":{:.4},\"wnw_step_us\":{:.1},\"no_recall_step_us\":{:.1},\"added_step_us\":{:.1},\"note\":\"store-side time only (no attention kernels in this loop); recall hidden behind attention is the recall leg\"}}",
            self.bytes_per_step,
            self.mean_r_gpu,
            self.wnw_step_s * 1e6,
            self.no_recall_step_s * 1e6,
            self.added_s() * 1e6
        )
    }
}

/// Runs `sim`'s WnW decode through a store on the CUDA tier and the same decode with every
/// head at retention 1, `sim.config.steps` steps each.
///
/// # Errors
/// A message when there is no GPU (or no `cuda` feature) or a store call fails.
pub fn store_steps(sim: &crate::sim::SimModel) -> Result<StoreStepReport, String> {
    use crate::policy::{WnwConfig, WnwPolicy};
    use crate::sim::{SplitMix, frontier_signal};
    use crate::{RetentionSchedule, RowLayout};
    let cfg = sim.config;
    let rows = RowLayout { head_dim: cfg.head_dim, dense: ValueFormat::F16, sparse: None };
    let layout = cfg.layout().map_err(|e| e.to_string())?;
    let tier_cfg = sim.bounded_tier_config(rows).map_err(|e| e.to_string())?;
    let wnw =
        WnwPolicy::for_target(sim.roles.clone(), layout, cfg.target_r_gpu, WnwConfig::default())
            .map_err(|e| e.to_string())?;
    let all = RetentionSchedule::uniform(&sim.roles, 1.0).map_err(|e| e.to_string())?;
    let keep = WnwPolicy::new(sim.roles.clone(), all, layout, WnwConfig::default())
        .map_err(|e| e.to_string())?;
    let mut out = [0.0f64; 2];
    let mut figures = (0.0, 0.0);
    for (i, policy) in [Box::new(wnw), Box::new(keep)].into_iter().enumerate() {
        let tier = std::sync::Arc::new(CudaTier::new(tier_cfg.clone()).map_err(|e| e.to_string())?);
        let mut store = sim.store_on(rows, tier, policy).map_err(|e| e.to_string())?;
        let (mut rng, d) = (SplitMix::new(5), cfg.head_dim);
        let row: Vec<f32> = (0..cfg.kv_heads * d).map(|_| rng.unit() - 0.5).collect();
        let mut weights = vec![0.0f32; cfg.audio_len];
        let t = Instant::now();
        for step in 0..cfg.steps {
            for layer in 0..cfg.layers {
                store.append(layer, &row, &row).map_err(|e| e.to_string())?;
                drop(store.layer_view(layer).map_err(|e| e.to_string())?);
            }
            frontier_signal(&mut rng, step, cfg.steps, &mut weights);
            store.add_audio_weights(&weights).map_err(|e| e.to_string())?;
            store.end_step().map_err(|e| e.to_string())?;
        }
        out[i] = t.elapsed().as_secs_f64() / cfg.steps.max(1) as f64;
        if i == 0 {
            let run = store.run_metrics();
            figures = (run.mean_bytes_per_step(), run.mean_r_gpu());
        }
    }
    Ok(StoreStepReport {
        bytes_per_step: figures.0,
        mean_r_gpu: figures.1,
        wnw_step_s: out[0],
        no_recall_step_s: out[1],
    })
}
