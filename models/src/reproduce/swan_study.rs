//! The SWAN study (`papers/swan.txt` §6, Table 1–3, Figure 2) on SmolLM2: perplexity of the
//! evaluation play through the decode path for every cache of [`super::grid`], the KV bytes
//! each holds against a dense f16 cache (the paper's memory-ratio x-axis), and the
//! lossless check (`k = d_h`, f32) against dense f32.

use serde::Serialize;

use super::Context;
use super::corpus::{SWAN_CALIBRATION_PLAYS, SWAN_EVAL_PLAY};
use super::decode::{Agreement, Trace, agreement, teacher_force};
use super::grid::{SwanGroup, SwanRun};
use crate::calibrate::CalibrationStats;
use crate::error::Result;
use crate::session::Session;
use crate::spec::CacheSpec;

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
    /// Milliseconds per decoded token.
    pub ms_per_token: f64,
    /// Wall seconds.
    pub seconds: f64,
}

/// Everything the SWAN study measured.
#[derive(Clone, Debug, Serialize)]
pub struct SwanStudy {
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
        self.find(|r| r.group == SwanGroup::Baseline && r.values == "f16")
    }
}

fn concat(traces: Vec<Trace>) -> Trace {
    let mut all = Trace::default();
    for t in traces {
        all.nll.extend(t.nll);
        all.hit.extend(t.hit);
        all.decode_s += t.decode_s;
        all.steps += t.steps;
        all.at_end.resident += t.at_end.resident;
        all.at_end.offloaded += t.at_end.offloaded;
    }
    all
}

fn run_one(
    ctx: &Context,
    run: &SwanRun,
    proj: &str,
    windows: &[Vec<u32>],
    prefix: usize,
) -> Result<(SwanResult, Trace)> {
    let t0 = std::time::Instant::now();
    let spec_text = run.spec(proj, ctx.plan.threads);
    let spec: CacheSpec = spec_text.parse()?;
    let mut traces = Vec::with_capacity(windows.len());
    for w in windows {
        let (model, cache) = spec.build(&ctx.model)?;
        let mut session = Session::new(model, cache)?;
        traces.push(teacher_force(&mut session, &w[..prefix], &w[prefix..], false)?);
    }
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
        seconds: t0.elapsed().as_secs_f64(),
    };
    Ok((result, all))
}

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
    let mut results = Vec::with_capacity(runs.len());
    let (mut dense32, mut lossless) = (None, None);
    for (i, run) in runs.iter().enumerate() {
        let (result, trace) = run_one(ctx, run, &proj, &windows, prefix)?;
        ctx.log(&format!(
            "swan [{}/{}] {}: ppl {:.3}, memory {:.3}, {:.1} ms/token",
            i + 1,
            runs.len(),
            result.label,
            result.perplexity,
            result.memory_ratio,
            result.ms_per_token
        ));
        match run.group {
            SwanGroup::Baseline if run.values == "f32" => dense32 = Some(trace),
            SwanGroup::Lossless => lossless = Some(trace),
            _ => {}
        }
        results.push(result);
    }
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
        calibration_plays: SWAN_CALIBRATION_PLAYS.to_vec(),
        eval_play: SWAN_EVAL_PLAY,
        windows: (count, wlen, prefix),
        head_dim: ctx.model.config().head_dim,
        calibration,
        results,
        lossless,
    })
}
