//! The SWAN study (`papers/swan.txt` §6, Table 1–3, Figure 2) on SmolLM2: perplexity of the
//! evaluation play through the decode path for every cache of [`super::grid`], the KV bytes
//! each holds against a dense f16 cache (the paper's memory-ratio x-axis), and the
//! lossless check (`k = d_h`, f32) against dense f32.

use serde::Serialize;

use super::Context;
use super::corpus::{SWAN_CALIBRATION_PLAYS, SWAN_EVAL_PLAY};
use super::decode::{
    Agreement, PromptPath, Trace, agreement, group_by_weights, teacher_force_texts,
};
use super::frontier::Code;
use super::grid::{SwanGroup, SwanRun};
use crate::error::Result;
use models::cache::KvCache;
use models::cache::spec::CacheSpec;
use models::calibrate::swan::CalibrationStats;
use models::llama::Llama;

/// One configuration's figures over all evaluation windows.
#[derive(Clone, Debug, Serialize)]
pub struct SwanResult {
    /// The configuration.
    pub run: SwanRun,
    /// Its label.
    pub label: String,
    /// The cache spec (`kvtide eval-ppl --cache …`).
    pub spec: String,
    /// Tokens scored (all through the decode path but each window's first).
    pub tokens: usize,
    /// Perplexity.
    pub perplexity: f64,
    /// Arg-max accuracy.
    pub top1: f64,
    /// KV bytes held at the end of a window (mean over windows).
    pub kv_bytes: f64,
    /// The same tokens in a dense f16 cache.
    pub dense_f16_bytes: f64,
    /// `kv_bytes / dense_f16_bytes`.
    pub memory_ratio: f64,
    /// Milliseconds per decoded token: the cache's own time plus its share of the batched
    /// model step (see [`super::decode::teacher_force_batch`]).
    pub ms_per_token: f64,
    /// Milliseconds per decoded token spent inside the cache alone (append + attention).
    pub attention_ms_per_token: Option<f64>,
    /// Configurations that shared each model step.
    pub batch: usize,
    /// Wall seconds.
    pub seconds: f64,
}

/// Everything the SWAN study measured.
#[derive(Clone, Debug, Serialize)]
pub struct SwanStudy {
    /// The model (configuration name).
    pub model: String,
    /// The model's sliding-window layers, if any (their caches stay dense f16 rings; the
    /// configurations apply to the global layers, and memory counts both).
    pub local: Option<super::frontier::LocalLayers>,
    /// Calibration plays.
    pub calibration_plays: Vec<&'static str>,
    /// Evaluation play.
    pub eval_play: &'static str,
    /// Windows × length, prefix prefilled.
    pub windows: (usize, usize, usize),
    /// Head dimension `d_h`.
    pub head_dim: usize,
    /// Calibration figures.
    pub calibration: CalibrationStats,
    /// One result per unique configuration.
    pub results: Vec<SwanResult>,
    /// `k = d_h` f32 SWAN vs dense f32, position by position.
    pub lossless: Agreement,
}

impl SwanStudy {
    /// The result of the first run matching `pred`.
    pub fn find(&self, pred: impl Fn(&SwanRun) -> bool) -> Option<&SwanResult> {
        self.results.iter().find(|r| pred(&r.run))
    }

    /// The dense f16 reference.
    pub fn dense_f16(&self) -> Option<&SwanResult> {
        self.find(|r| r.group == SwanGroup::Baseline && r.values == Code::F16)
    }
}

fn concat(traces: Vec<Trace>) -> Trace {
    let mut all = Trace::default();
    let cache_s = traces.iter().map(|t| t.cache_s).sum::<Option<f64>>();
    for t in traces {
        all.nll.extend(t.nll);
        all.hit.extend(t.hit);
        all.prefill_s += t.prefill_s;
        all.decode_s += t.decode_s;
        all.steps += t.steps;
        all.at_end.resident += t.at_end.resident;
        all.at_end.offloaded += t.at_end.offloaded;
        all.batch = all.batch.max(t.batch);
    }
    all.cache_s = cache_s;
    all
}

/// The figures of one configuration from its traces over all windows.
fn result_of(
    ctx: &Context,
    run: &SwanRun,
    proj: &str,
    windows: &[Vec<u32>],
    traces: Vec<Trace>,
) -> (SwanResult, Trace) {
    let spec_text = run.spec(proj, ctx.plan.threads);
    let per_window_tokens = windows.first().map_or(0, |w| w.len() - 1);
    let dense = ctx.dense_f16_bytes(per_window_tokens) as f64;
    let n_windows = windows.len().max(1) as f64;
    let all = concat(traces);
    let n = all.nll.len() as f64;
    let kv_bytes = all.at_end.total() as f64 / n_windows;
    let result = SwanResult {
        run: run.clone(),
        label: run.label(),
        spec: spec_text.replace(proj, "<calibrated.safetensors>"),
        tokens: all.nll.len(),
        perplexity: (all.nll_sum() / n).exp(),
        top1: all.hits() as f64 / n,
        kv_bytes,
        dense_f16_bytes: dense,
        memory_ratio: kv_bytes / dense,
        ms_per_token: all.ms_per_token(),
        attention_ms_per_token: all.cache_s.map(|c| 1e3 * c / all.steps.max(1) as f64),
        batch: all.batch,
        seconds: all.prefill_s + all.decode_s,
    };
    (result, all)
}

/// A model and the positions of the runs it serves.
type Group = (Llama, Vec<usize>);

/// One run's fresh caches, one per evaluation window.
type RunCaches = Vec<Box<dyn KvCache>>;

/// The plan's runs grouped by the model that serves them (runs whose built models have the
/// same weights — the same absorbed basis — share one batched decode), and each run's
/// `n` fresh caches (one per evaluation window), built with its model.
fn model_groups(
    ctx: &Context,
    runs: &[SwanRun],
    proj: &str,
    n: usize,
) -> Result<(Vec<Group>, Vec<RunCaches>)> {
    let mut caches = Vec::with_capacity(runs.len());
    let groups = group_by_weights(runs.iter().map(|run| {
        let spec: CacheSpec = run.spec(proj, ctx.plan.threads).parse()?;
        let (model, run_caches) = spec.build_many(&ctx.model, n)?;
        caches.push(run_caches);
        Ok(model)
    }))?;
    Ok((groups, caches))
}

/// Most caches one batched decode serves: the full plan's calibrated group (26
/// configurations) × 2 windows of 1024 tokens holds 1–3 GiB of caches, and the model
/// step is compute-bound well before this width.
const MAX_BATCH: usize = 64;

/// Calibrates the projections and runs every configuration of the plan.
///
/// # Errors
/// Corpus, calibration, cache and forward errors.
pub fn run(ctx: &mut Context) -> Result<SwanStudy> {
    let proj = ctx.projection()?.display().to_string();
    let calibration = ctx.calibration_stats().cloned().unwrap_or_default();
    let (count, wlen, prefix) = ctx.plan.swan_eval;
    let windows = ctx.corpus.windows(SWAN_EVAL_PLAY, 0, wlen, count)?;
    let runs: Vec<SwanRun> = ctx.plan.unique_swan().into_iter().cloned().collect();
    let (groups, mut run_caches) = model_groups(ctx, &runs, &proj, windows.len())?;
    ctx.log(&format!(
        "swan: {} configurations in {} batched decodes (one per model variant): {:?}",
        runs.len(),
        groups.len(),
        groups.iter().map(|(_, m)| m.len()).collect::<Vec<_>>()
    ));
    let mut per_run: Vec<Vec<Trace>> = vec![Vec::with_capacity(windows.len()); runs.len()];
    let mut results: Vec<Option<(SwanResult, Trace)>> = vec![None; runs.len()];
    let mut done = 0;
    for (model, members) in &groups {
        // Every (configuration, window) pair of the group is one member of a batched
        // decode; as many windows per batch as keep it within MAX_BATCH caches.
        let per_batch = (MAX_BATCH / members.len()).clamp(1, windows.len().max(1));
        for chunk in windows.chunks(per_batch) {
            let mut caches = Vec::with_capacity(members.len() * chunk.len());
            let mut texts: Vec<(&[u32], &[u32])> = Vec::with_capacity(caches.capacity());
            for &i in members {
                caches.extend(run_caches[i].drain(..chunk.len()));
                texts.extend(chunk.iter().map(|w| w.split_at(prefix)));
            }
            let t0 = std::time::Instant::now();
            let traces =
                teacher_force_texts(model, &mut caches, &texts, PromptPath::Prefill, false, 1)?;
            ctx.log(&format!(
                "swan: {} configurations × {} windows decoded in {:.0} s",
                members.len(),
                chunk.len(),
                t0.elapsed().as_secs_f64()
            ));
            let mut traces = traces.into_iter();
            for &i in members {
                per_run[i].extend(traces.by_ref().take(chunk.len()));
            }
        }
        for &i in members {
            let (result, trace) =
                result_of(ctx, &runs[i], &proj, &windows, std::mem::take(&mut per_run[i]));
            done += 1;
            ctx.log(&format!(
                "swan [{done}/{}] {}: ppl {:.3}, memory {:.3}, {:.1} ms/token ({:.2} ms in the cache; batch of {})",
                runs.len(),
                result.label,
                result.perplexity,
                result.memory_ratio,
                result.ms_per_token,
                result.attention_ms_per_token.unwrap_or(f64::NAN),
                result.batch,
            ));
            results[i] = Some((result, trace));
        }
    }
    let (mut dense32, mut lossless) = (None, None);
    let mut out = Vec::with_capacity(runs.len());
    for (run, r) in runs.iter().zip(results) {
        let (result, trace) = r.ok_or_else(|| {
            crate::error::invalid("swan study", format!("no result for {}", run.label()))
        })?;
        match run.group {
            SwanGroup::Baseline if run.values == Code::F32 => dense32 = Some(trace),
            SwanGroup::Lossless => lossless = Some(trace),
            _ => {}
        }
        out.push(result);
    }
    let results = out;
    let lossless = match (&dense32, &lossless) {
        (Some(a), Some(b)) => agreement(b, a)?,
        _ => {
            return Err(crate::error::invalid(
                "swan study",
                "the plan lacks dense f32 or the lossless run",
            ));
        }
    };
    Ok(SwanStudy {
        model: ctx.model.config().name.clone(),
        local: super::frontier::ByteModel::of(ctx.model.config()).local,
        calibration_plays: SWAN_CALIBRATION_PLAYS.to_vec(),
        eval_play: SWAN_EVAL_PLAY,
        windows: (count, wlen, prefix),
        head_dim: ctx.model.config().head_dim,
        calibration,
        results,
        lossless,
    })
}
