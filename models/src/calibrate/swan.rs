//! The calibration driver (`papers/swan.txt`, "projection matrices": bases from the joint
//! second moments of RoPE'd queries/keys and of values/per-head outputs). The model's
//! libtorch prefill runs over windows of calibration text; a [`PrefillObserver`] hands every
//! layer's RoPE'd q and k, v and per-head attention outputs to `projection`'s streaming
//! [`Calibrator`]; the eigen-bases form the [`ProjectionSet`] that `swan` caches load.

use projection::{CalibrationConfig, Calibrator, LayerActivations, ModelDims, ProjectionSet};
use serde::Serialize;
use tch::Tensor;

use crate::error::{Result, TorchOp, invalid};
use crate::llama::host::f32_slice;
use crate::llama::{AttentionTensors, Llama, PrefillObserver};

/// What a calibration run saw.
#[derive(Clone, Debug, Default, Serialize)]
pub struct CalibrationStats {
    /// Windows run.
    pub windows: usize,
    /// Tokens run.
    pub tokens: usize,
    /// Largest |key| (after RoPE) over every layer and head — above 448, fp8 needs a scale.
    pub max_abs_key: f32,
    /// Largest |value|.
    pub max_abs_value: f32,
    /// Seconds spent (forward passes and eigen-decompositions).
    pub seconds: f64,
}

struct Feed<'a> {
    cal: &'a mut Calibrator,
    stats: &'a mut CalibrationStats,
}

/// `[heads, tokens, d]` → contiguous `[tokens, heads, d]` (the calibrator's layout).
fn token_major(t: &Tensor) -> Result<Tensor> {
    t.f_transpose(0, 1).op("transpose")?.f_contiguous().op("contiguous")
}

fn max_abs(x: &[f32]) -> f32 {
    x.iter().fold(0f32, |m, v| m.max(v.abs()))
}

impl PrefillObserver for Feed<'_> {
    fn attention(&mut self, layer: usize, t: &AttentionTensors) -> Result<()> {
        let (q, k, v, o) =
            (token_major(&t.q)?, token_major(&t.k)?, token_major(&t.v)?, token_major(&t.o)?);
        // SAFETY: `q`, `k`, `v`, `o` are contiguous results of `token_major` (fresh
        // tensors, or aliases of the observer's read-only inputs); nothing writes to them
        // while the borrows below live (they end with this function).
        let acts = unsafe {
            LayerActivations {
                n_tokens: k.size()[0] as usize,
                queries: f32_slice(&q)?,
                keys: f32_slice(&k)?,
                values: f32_slice(&v)?,
                attn_out: f32_slice(&o)?,
            }
        };
        self.stats.max_abs_key = self.stats.max_abs_key.max(max_abs(acts.keys));
        self.stats.max_abs_value = self.stats.max_abs_value.max(max_abs(acts.values));
        self.cal.observe_layer(layer, &acts)?;
        Ok(())
    }
}

/// Cuts `ids` into consecutive windows of `window` tokens (the last may be shorter, but not
/// below 2 tokens), using at most `max_tokens` tokens.
///
/// # Examples
/// ```
/// let ids: Vec<u32> = (0..10).collect();
/// let w = models::calibrate::swan::windows(&ids, 4, 9);
/// assert_eq!(w, vec![&ids[0..4], &ids[4..8]]); // the 1-token rest is dropped
/// ```
pub fn windows(ids: &[u32], window: usize, max_tokens: usize) -> Vec<&[u32]> {
    let ids = &ids[..ids.len().min(max_tokens)];
    ids.chunks(window.max(1)).filter(|w| w.len() >= 2).collect()
}

/// Calibrates a projection set for `model` on `windows`, each run as one causal prefill;
/// `progress(i)` is called after window `i` (1-based).
///
/// # Errors
/// [`crate::Error::InvalidInput`] without windows; forward errors; [`crate::Error::Projection`]
/// if an accumulator saw nothing or an eigen-decomposition fails.
pub fn calibrate<W: AsRef<[u32]>>(
    model: &Llama,
    windows: &[W],
    config: CalibrationConfig,
    progress: &mut dyn FnMut(usize),
) -> Result<(ProjectionSet, CalibrationStats)> {
    if windows.is_empty() {
        return Err(invalid("calibrate", "no calibration windows"));
    }
    let t0 = std::time::Instant::now();
    let cfg = model.config();
    let dims = ModelDims::new(cfg.num_layers, cfg.q_heads, cfg.kv_heads, cfg.head_dim)?;
    let mut cal = Calibrator::new(dims, config)?;
    let mut stats = CalibrationStats::default();
    for (i, w) in windows.iter().enumerate() {
        let mut feed = Feed { cal: &mut cal, stats: &mut stats };
        let _logits = model.prefill(w.as_ref(), None, &mut feed, false)?;
        stats.windows += 1;
        stats.tokens += w.as_ref().len();
        progress(i + 1);
    }
    let set = cal.finish(&cfg.name)?;
    stats.seconds = t0.elapsed().as_secs_f64();
    Ok((set, stats))
}
