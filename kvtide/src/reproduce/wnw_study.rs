//! The WnW study on the text "transcription" task (`papers/wnw.txt` Table 5 / Figure 3,
//! Table 3 (A1, A3), Figure 4, Table 4, by analogy).
//!
//! Each evaluation sequence is prefix + passage + instruction (the prompt; the passage is
//! the span the tiered store manages, as audio is in the paper) followed by the passage
//! again, teacher-forced token by token through the decode path. Predicting the second copy
//! needs attention that sweeps the first copy in order, as ASR decoding sweeps audio; the
//! metric is the second copy's top-1 accuracy and perplexity (the WER analogue), with the
//! Full cache as reference. Head roles come from [`super::roles`] on disjoint passages; each
//! configuration reports measured `r_GPU` (mean over decode steps) and `r_GPU+CPU`, recall
//! bytes per step and ms per decoded token, and the first passage's cache size after every
//! step (Figure 4).

use std::path::PathBuf;

use kv_tiered::RankingSignal;
use kv_tiered::budget::{BudgetSearch, SearchOutcome};
use serde::Serialize;

use super::Context;
use super::corpus::{CopyTask, Variant, WNW_CALIBRATION_PLAYS};
use super::decode::{
    Agreement, StepSample, Trace, agreement, group_by_weights, teacher_force_batch,
};
use super::grid::{Method, Signal, WnwRun};
use super::roles::{TextCalibration, calibrate};
use crate::error::Result;
use models::cache::KvCache;
use models::cache::spec::CacheSpec;

/// One configuration's figures over all evaluation passages.
#[derive(Clone, Debug, Serialize)]
pub struct WnwResult {
    /// The configuration.
    pub run: WnwRun,
    /// The policy's budget knob the evaluation ran with (the spec's `r_gpu`): the target
    /// itself open loop, or what the closed-loop search chose.
    pub knob: f64,
    /// The closed-loop search on the calibration passage (`None`: open loop or Full).
    pub budget: Option<BudgetSearch>,
    /// Cache spec of the first passage (paths elided).
    pub spec: String,
    /// Scored tokens.
    pub tokens: usize,
    /// Arg-max accuracy on the second copy.
    pub top1: f64,
    /// Perplexity of the second copy.
    pub perplexity: f64,
    /// Measured on-device span retention, mean over decode steps and passages.
    pub r_gpu: f64,
    /// Resident-or-recallable span retention at the end (mean over passages).
    pub r_gpu_cpu: f64,
    /// Recall bytes per decode step.
    pub bytes_per_step: f64,
    /// Resident KV bytes at the end (mean over passages).
    pub resident_bytes: f64,
    /// Milliseconds per decoded token: the cache's own time plus its share of the batched
    /// model step (configurations served by the same model decode together, see
    /// [`teacher_force_batch`]).
    pub ms_per_token: f64,
    /// Milliseconds per decoded token inside the cache alone (append, attention, recall).
    pub cache_ms_per_token: f64,
    /// Wall seconds.
    pub seconds: f64,
}

/// Figure 4: one configuration's cache after every decode step of the first passage.
#[derive(Clone, Debug, Serialize)]
pub struct KvOverTime {
    /// Policy.
    pub method: Method,
    /// Target r_GPU.
    pub r_gpu: f64,
    /// Samples.
    pub samples: Vec<StepSample>,
}

/// Everything the WnW study measured.
#[derive(Clone, Debug, Serialize)]
pub struct WnwStudy {
    /// Passage length.
    pub passage: usize,
    /// Evaluation plays.
    pub plays: Vec<&'static str>,
    /// Calibrated scores.
    pub scores: TextCalibration,
    /// Anchor heads (`layer.kv_head`) of the main roles.
    pub anchors: Vec<String>,
    /// Results, in plan order.
    pub results: Vec<WnwResult>,
    /// WnW lossless mode (f32) vs dense f32 on the first passage.
    pub lossless: Agreement,
    /// Tiered Full policy (f16) vs dense f16 on the first passage.
    pub full_vs_dense: Agreement,
    /// Figure 4 data.
    pub kv_over_time: Vec<KvOverTime>,
}

impl WnwStudy {
    /// The result of `study`/`method` at target `r`.
    pub fn find(&self, study: &str, method: Method, r: f64) -> Option<&WnwResult> {
        self.results.iter().find(|x| {
            x.run.study == study && x.run.method == method && (x.run.r_gpu - r).abs() < 1e-9
        })
    }
}

fn ranking(signal: Signal) -> RankingSignal {
    match signal {
        Signal::VsHs => RankingSignal::VsHs,
        Signal::Vs => RankingSignal::VsOnly,
        Signal::Hs => RankingSignal::HsOnly,
    }
}

fn signal_key(signal: Signal) -> &'static str {
    match signal {
        Signal::VsHs => "vshs",
        Signal::Vs => "vs",
        Signal::Hs => "hs",
    }
}

/// Writes (once) the roles file for `n_voice` and `signal`; returns its path.
fn roles_file(
    ctx: &Context,
    scores: &TextCalibration,
    n_voice: usize,
    signal: Signal,
) -> Result<PathBuf> {
    let path = ctx.work.join(format!("roles-nv{n_voice}-{}.json", signal_key(signal)));
    if !path.exists() {
        let json = scores.roles(n_voice, ctx.plan.n_anchor, ranking(signal))?.to_json()?;
        std::fs::write(&path, json).map_err(|source| crate::Error::Io {
            op: "write",
            path: path.clone(),
            source,
        })?;
    }
    Ok(path)
}

/// The cache spec of `run` for a task (`roles`: its roles file; `proj`: the SWAN basis),
/// with the policy's budget knob `r`.
fn spec(ctx: &Context, run: &WnwRun, task: &CopyTask, roles: &str, proj: &str, r: f64) -> String {
    let span = task.span();
    let base = format!(
        "span={}..{},format=f16,threads={}{}",
        span.start,
        span.end,
        ctx.plan.threads,
        run.knobs.spec_suffix()
    );
    match run.method {
        Method::Full => format!("tiered:{base},policy=full"),
        Method::AdaKv => format!("tiered:{base},policy=adakv,r_gpu={r}"),
        Method::AudioKv => format!("tiered:{base},policy=audiokv,r_gpu={r},roles={roles}"),
        Method::ArkVale => format!("tiered:{base},policy=arkvale,r_gpu={r}"),
        Method::AffPool => format!("tiered:{base},policy=affpool,r_gpu={r}"),
        Method::Wnw => format!("tiered:{base},policy=wnw,r_gpu={r},roles={roles}"),
        Method::WnwSwan => {
            let k = ctx.model.config().head_dim / 2;
            format!(
                "swan+tiered:k={k},kv={k},value=fp8,basis=calibrated,proj={proj},{base},policy=wnw,r_gpu={r},roles={roles}"
            )
        }
    }
}

/// Teacher-forces `task` through the caches of `specs`, batching the caches whose models
/// share weights into one decode per step ([`teacher_force_batch`]); traces in `specs`
/// order. A spec given twice (two studies sharing a configuration, such as A1's and A3's
/// WnW at the same voice heads) is decoded once, its trace repeated: decoding is
/// deterministic.
fn decode_all(
    ctx: &Context,
    specs: &[String],
    task: &CopyTask,
    sample: bool,
) -> Result<Vec<Trace>> {
    let mut unique: Vec<String> = Vec::with_capacity(specs.len());
    let at: Vec<usize> = specs
        .iter()
        .map(|s| {
            unique.iter().position(|u| u == s).unwrap_or_else(|| {
                unique.push(s.clone());
                unique.len() - 1
            })
        })
        .collect();
    let traces = decode_unique(ctx, &unique, task, sample)?;
    Ok(at.into_iter().map(|i| traces[i].clone()).collect())
}

/// [`decode_all`] over distinct specs.
fn decode_unique(
    ctx: &Context,
    specs: &[String],
    task: &CopyTask,
    sample: bool,
) -> Result<Vec<Trace>> {
    let mut caches = Vec::with_capacity(specs.len());
    let groups = group_by_weights(specs.iter().map(|text| {
        let (model, cache) = text.parse::<CacheSpec>()?.build(&ctx.model)?;
        caches.push(Some(cache));
        Ok(model)
    }))?;
    let mut out: Vec<Option<Trace>> = vec![None; specs.len()];
    let (prompt, passage) = (task.prompt(), &task.passage);
    for (model, members) in groups {
        let mut group: Vec<Box<dyn KvCache>> =
            members.iter().filter_map(|&i| caches[i].take()).collect();
        let traces = teacher_force_batch(&model, &mut group, &prompt, passage, sample)?;
        for (i, t) in members.into_iter().zip(traces) {
            out[i] = Some(t);
        }
    }
    out.into_iter()
        .zip(specs)
        .map(|(t, s)| {
            t.ok_or_else(|| crate::error::invalid("wnw study", format!("no trace for {s}")))
        })
        .collect()
}

fn summarize(
    run: &WnwRun,
    budget: Option<BudgetSearch>,
    spec: String,
    traces: &[Trace],
    seconds: f64,
) -> WnwResult {
    let n: usize = traces.iter().map(|t| t.nll.len()).sum();
    let steps: usize = traces.iter().map(|t| t.steps).sum();
    let p = traces.len().max(1) as f64;
    let mean = |f: &dyn Fn(&Trace) -> f64| traces.iter().map(f).sum::<f64>() / p;
    WnwResult {
        run: run.clone(),
        knob: budget.as_ref().map_or(run.r_gpu, |b| b.best().knob),
        budget,
        spec,
        tokens: n,
        top1: traces.iter().map(Trace::hits).sum::<usize>() as f64 / n as f64,
        perplexity: (traces.iter().map(Trace::nll_sum).sum::<f64>() / n as f64).exp(),
        r_gpu: mean(&|t| t.stat("mean_r_gpu").unwrap_or(1.0)),
        r_gpu_cpu: mean(&|t| t.stat("r_gpu_cpu").unwrap_or(1.0)),
        bytes_per_step: mean(&|t| t.stat("h2d_bytes_per_step").unwrap_or(0.0)),
        resident_bytes: mean(&|t| t.at_end.resident as f64),
        ms_per_token: 1e3 * traces.iter().map(|t| t.decode_s).sum::<f64>() / steps.max(1) as f64,
        cache_ms_per_token: 1e3 * traces.iter().filter_map(|t| t.cache_s).sum::<f64>()
            / steps.max(1) as f64,
        seconds,
    }
}

/// Calibrates head roles, then runs every configuration of the plan on every passage.
///
/// # Errors
/// Corpus, calibration, cache and forward errors.
pub fn run(ctx: &mut Context) -> Result<WnwStudy> {
    let (cal_n, cal_plays, groups) = ctx.plan.wnw_calibration.clone();
    let cal_tasks = cal_plays
        .iter()
        .map(|p| ctx.corpus.copy_task(p, cal_n, Variant::Chat))
        .collect::<Result<Vec<_>>>()?;
    ctx.log(&format!(
        "wnw: calibrating roles (VS, HS by autograd) on {} passages of {cal_n} tokens",
        cal_tasks.len()
    ));
    let scores = calibrate(&ctx.model, &cal_tasks, groups, &mut |_| {})?;
    debug_assert!(cal_plays.iter().all(|p| WNW_CALIBRATION_PLAYS.contains(p)));
    let n = ctx.plan.wnw_passage;
    let plays = ctx.plan.wnw_plays.clone();
    let tasks = plays
        .iter()
        .map(|p| ctx.corpus.copy_task(p, n, Variant::Chat))
        .collect::<Result<Vec<_>>>()?;
    let proj = ctx.projection()?.display().to_string();
    let (lossless, full_vs_dense) = checks(ctx, &tasks[0])?;
    let runs = ctx.plan.wnw.clone();
    let (mut results, mut kv_over_time) = (Vec::with_capacity(runs.len()), Vec::new());
    let main_nv =
        runs.iter().find(|r| r.method == Method::Wnw).map_or(ctx.plan.n_anchor + 1, |r| r.n_voice);
    let mut roles = Vec::with_capacity(runs.len());
    for run in &runs {
        let nv = if run.method == Method::AudioKv {
            main_nv
        } else {
            run.n_voice.max(ctx.plan.n_anchor + 1)
        };
        roles.push(roles_file(ctx, &scores, nv, run.signal)?.display().to_string());
    }
    let budgets = closed_loop(ctx, &runs, &roles, &proj, &cal_plays)?;
    let knobs: Vec<f64> = budgets
        .iter()
        .zip(&runs)
        .map(|(b, r)| b.as_ref().map_or(r.r_gpu, |b| b.best().knob))
        .collect();
    let knob = |i: usize| knobs[i];
    // Every configuration over one passage at a time, batched per model variant.
    let mut per_run: Vec<Vec<Trace>> = vec![Vec::with_capacity(tasks.len()); runs.len()];
    for (j, task) in tasks.iter().enumerate() {
        let specs: Vec<String> = runs
            .iter()
            .zip(&roles)
            .enumerate()
            .map(|(i, (run, r))| spec(ctx, run, task, r, &proj, knob(i)))
            .collect();
        for (i, t) in decode_all(ctx, &specs, task, j == 0)?.into_iter().enumerate() {
            per_run[i].push(t);
        }
    }
    for (i, ((run, traces), budget)) in runs.iter().zip(per_run).zip(budgets).enumerate() {
        let seconds = traces.iter().map(|t| t.prefill_s + t.decode_s).sum();
        let shown = spec(ctx, run, &tasks[0], "<roles.json>", "<calibrated.safetensors>", knob(i));
        let result = summarize(run, budget, shown, &traces, seconds);
        ctx.log(&format!(
            "wnw [{}/{}] {} {} r={} (knob {:.4}) nv={}{}: top-1 {:.3}, ppl {:.3}, r_GPU {:.3}, {:.0} B/step, {:.1} ms/token ({:.2} in the cache; batch of {})",
            i + 1,
            runs.len(),
            run.study,
            run.method.name(),
            run.r_gpu,
            result.knob,
            run.n_voice,
            run.knobs.spec_suffix(),
            result.top1,
            result.perplexity,
            result.r_gpu,
            result.bytes_per_step,
            result.ms_per_token,
            result.cache_ms_per_token,
            traces[0].batch,
        ));
        if run.study == "main" {
            kv_over_time.push(KvOverTime {
                method: run.method,
                r_gpu: run.r_gpu,
                samples: traces[0].samples.clone(),
            });
        }
        results.push(result);
    }
    let anchors = scores
        .roles(main_nv, ctx.plan.n_anchor, RankingSignal::VsHs)?
        .heads_with(kv_tiered::Role::Anchor)
        .map(|h| format!("{}.{}", h / scores.scores.kv_heads, h % scores.scores.kv_heads))
        .collect();
    Ok(WnwStudy {
        passage: n,
        plays,
        scores,
        anchors,
        results,
        lossless,
        full_vs_dense,
        kv_over_time,
    })
}

/// Tolerance of the closed-loop search on the calibration passage: tighter than the ±2 pp
/// the evaluation is held to, leaving room for the passage-to-passage spread.
const CALIBRATION_TOLERANCE: f64 = 0.01;

/// The closed-loop budget (§3.4: λ chosen so the *measured* r_GPU matches the target): for
/// every configuration with a budget, a [`BudgetSearch`] over decodes of a calibration
/// passage (the first calibration play, disjoint from the evaluation plays, at the
/// evaluation length); all searches still running decode together each round. `None` for
/// Full and when the plan runs open loop.
fn closed_loop(
    ctx: &mut Context,
    runs: &[WnwRun],
    roles: &[String],
    proj: &str,
    cal_plays: &[&'static str],
) -> Result<Vec<Option<BudgetSearch>>> {
    let probes = ctx.plan.closed_loop;
    let mut searches: Vec<Option<BudgetSearch>> = runs
        .iter()
        .map(|r| {
            (probes > 0 && r.method != Method::Full)
                .then(|| BudgetSearch::new(r.r_gpu, CALIBRATION_TOLERANCE, probes))
                .transpose()
        })
        .collect::<std::result::Result<_, _>>()?;
    let Some(play) = cal_plays.first() else { return Ok(searches) };
    if searches.iter().all(Option::is_none) {
        return Ok(searches);
    }
    let task = ctx.corpus.copy_task(play, ctx.plan.wnw_passage, Variant::Chat)?;
    for round in 1..=probes {
        let live: Vec<(usize, f64)> = searches
            .iter()
            .enumerate()
            .filter_map(|(i, s)| s.as_ref().and_then(BudgetSearch::proposal).map(|k| (i, k)))
            .collect();
        if live.is_empty() {
            break;
        }
        let specs: Vec<String> =
            live.iter().map(|&(i, k)| spec(ctx, &runs[i], &task, &roles[i], proj, k)).collect();
        let traces = decode_all(ctx, &specs, &task, false)?;
        for (&(i, _), t) in live.iter().zip(&traces) {
            if let Some(s) = searches[i].as_mut() {
                s.observe(t.stat("mean_r_gpu").unwrap_or(1.0).clamp(0.0, 1.0))?;
            }
        }
        let done =
            searches.iter().flatten().filter(|s| s.outcome() != SearchOutcome::Running).count();
        ctx.log(&format!(
            "wnw: closed-loop budget round {round}: {} configurations probed on `{play}`, {done} settled",
            live.len()
        ));
    }
    Ok(searches)
}

/// WnW lossless (f32) vs dense f32, and the tiered Full policy vs dense f16.
fn checks(ctx: &Context, task: &CopyTask) -> Result<(Agreement, Agreement)> {
    let span = task.span();
    let threads = ctx.plan.threads;
    let specs = [
        format!("dense:format=f32,threads={threads}"),
        format!("tiered:span={}..{},lossless,format=f32,threads={threads}", span.start, span.end),
        format!("dense:format=f16,threads={threads}"),
        format!(
            "tiered:span={}..{},policy=full,format=f16,threads={threads}",
            span.start, span.end
        ),
    ];
    let [dense32, lossless, dense16, full]: [Trace; 4] = decode_all(ctx, &specs, task, false)?
        .try_into()
        .map_err(|_| crate::error::invalid("wnw checks", "expected four traces"))?;
    Ok((agreement(&lossless, &dense32)?, agreement(&full, &dense16)?))
}
