//! The frontier study: perplexity against KV bytes for the formats a runtime already has —
//! dense f16, fp8 (per-token scale), int8 (`q8_0` blocks) and int4 (`q4_0` blocks), each
//! unrotated, Walsh–Hadamard-rotated (as llama.cpp rotates a quantized cache) or in the SWAN
//! calibrated basis — and SWAN (`papers/swan.txt`, method section) under every row encoding
//! (`u8` index list or bitmask × f16 / fp8 / int8 / int4 values) × `k` × buffer `b`.
//!
//! Every byte a cache holds is counted (buffer, indices or masks, offsets, scales, block
//! headers), two ways: at the end of each evaluation window (short windows make the dense
//! buffer weigh more), and per token of a 4096-token cache from the formulas (checked against
//! the measured bytes: the [`formula_bytes`] check). The non-dominated points are marked,
//! a table per budget (0.15 … 0.5 × f16) gives the best dense and the best SWAN
//! configuration at or under it, and the external check runs llama.cpp's own perplexity
//! tool with `-ctk/-ctv f16, q8_0, q4_0` on the same text when its path is given.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde::Serialize;

use super::Context;
use super::corpus::SWAN_EVAL_PLAY;
use super::decode::{Trace, group_by_weights, teacher_force_texts};
use super::findings::{Check, Finding};
use super::plot::Plot;
use super::report::{Section, Table, num, pct};
use crate::error::{Result, invalid};
use models::cache::KvCache;
use models::cache::spec::CacheSpec;

/// Tokens of the cache the per-token budgets are quoted for.
pub const LONG_CACHE: usize = 4096;
/// The budgets (× dense f16 bytes) of the per-budget tables.
pub const BUDGETS: [f64; 6] = [0.15, 0.2, 0.25, 0.3, 0.4, 0.5];

/// One configuration of the study.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct FrontierRun {
    /// `dense` or `swan`.
    pub family: &'static str,
    /// Dense storage (`f16`, `fp8`, `int8`, `int4`) or SWAN value code.
    pub values: &'static str,
    /// Rotation of a dense cache (`none`, `hadamard`, `calibrated`); SWAN: its basis.
    pub rotate: &'static str,
    /// SWAN index code (`list`, `bitmask`); `—` for dense.
    pub index: &'static str,
    /// Kept components per sparse row (SWAN).
    pub k: Option<usize>,
    /// Dense buffer rows (SWAN).
    pub buffer: usize,
}

impl FrontierRun {
    fn dense(values: &'static str, rotate: &'static str) -> Self {
        Self { family: "dense", values, rotate, index: "—", k: None, buffer: 0 }
    }

    fn swan(index: &'static str, values: &'static str, k: usize, buffer: usize) -> Self {
        Self { family: "swan", values, rotate: "calibrated", index, k: Some(k), buffer }
    }

    /// A short label.
    pub fn label(&self) -> String {
        match self.k {
            None if self.rotate == "none" => format!("dense {}", self.values),
            None => format!("dense {} rotate={}", self.values, self.rotate),
            Some(k) => format!("swan {} {} k={k} b={}", self.index, self.values, self.buffer),
        }
    }

    /// The cache spec (`proj` = the calibrated projection file).
    pub fn spec(&self, proj: &str, threads: usize) -> String {
        match self.k {
            None => {
                let p = if self.rotate == "calibrated" {
                    format!(",proj={proj}")
                } else {
                    String::new()
                };
                format!("dense:format={},rotate={}{p},threads={threads}", self.values, self.rotate)
            }
            Some(k) => format!(
                "swan:k={k},kv={k},b={},index={},value={},buffer=f16,basis=calibrated,proj={proj},threads={threads}",
                self.buffer, self.index, self.values
            ),
        }
    }

    /// Bytes one (layer, kv-head) holds for `tokens` tokens, from the formulas: dense rows,
    /// or `min(n, b)` f16 buffer rows plus `n − b` sparse rows (key and value, each
    /// `index + values + scale + 2` bytes) plus an 8-byte base per block of sparse rows.
    pub fn head_bytes(&self, d: usize, tokens: usize) -> usize {
        use kv_sparse::quant::{DenseCodec, Fp8Rows, Int4Blocks, Int8Blocks};
        let Some(k) = self.k else {
            let row = match self.values {
                "fp8" => Fp8Rows::row_bytes(d),
                "int8" => Int8Blocks::row_bytes(d),
                "int4" => Int4Blocks::row_bytes(d),
                "f32" => 4 * d,
                _ => 2 * d,
            };
            return 2 * tokens * row;
        };
        let cfg = self.swan_config(d, k);
        let sparse = tokens.saturating_sub(self.buffer);
        let full = self.swan_config(d, d).sparse_token_bytes(d) / 2 - 2;
        let rows_per_block = (u16::MAX as usize / full).min(256);
        let blocks = 2 * sparse.div_ceil(rows_per_block);
        2 * tokens.min(self.buffer) * 2 * d + sparse * cfg.sparse_token_bytes(d) + 8 * blocks
    }

    fn swan_config(&self, d: usize, k: usize) -> models::cache::SwanConfig {
        use kv_sparse::ValueFormat;
        use kv_sparse::coded::ValueKind;
        let mut c = models::cache::SwanConfig::lossless(d, self.buffer);
        c.k_key = k;
        c.k_value = k;
        c.index = if self.index == "bitmask" {
            models::cache::SwanIndex::Bitmask
        } else {
            models::cache::SwanIndex::List
        };
        c.value = match self.values {
            "int8" => ValueKind::Int8,
            "int4" => ValueKind::Int4,
            "fp8" => ValueKind::Elems(ValueFormat::Fp8E4M3),
            "f32" => ValueKind::Elems(ValueFormat::F32),
            _ => ValueKind::Elems(ValueFormat::F16),
        };
        c
    }
}

/// The grid of a plan size: `swan_k` as fractions of `d_h` in eighths, `buffers` for SWAN.
pub fn grid(head_dim: usize, swan_k: &[usize], buffers: &[usize], full: bool) -> Vec<FrontierRun> {
    let mut runs = vec![FrontierRun::dense("f16", "none")];
    let rotations: &[&str] =
        if full { &["none", "hadamard", "calibrated"] } else { &["none", "hadamard"] };
    for values in ["fp8", "int8", "int4"] {
        for &rotate in rotations {
            runs.push(FrontierRun::dense(values, rotate));
        }
    }
    let values: &[&str] =
        if full { &["f16", "fp8", "int8", "int4"] } else { &["fp8", "int8", "int4"] };
    for index in ["list", "bitmask"] {
        for &v in values {
            for &eighths in swan_k {
                for &b in buffers {
                    runs.push(FrontierRun::swan(index, v, head_dim * eighths / 8, b));
                }
            }
        }
    }
    runs
}

/// One configuration's figures.
#[derive(Clone, Debug, Serialize)]
pub struct FrontierPoint {
    /// The configuration.
    pub run: FrontierRun,
    /// Its label.
    pub label: String,
    /// The spec it ran with (projection path elided).
    pub spec: String,
    /// Perplexity over the scored tokens of every window.
    pub perplexity: f64,
    /// Arg-max accuracy.
    pub top1: f64,
    /// Bytes held at the end of a window (mean over windows), all layers.
    pub window_bytes: f64,
    /// The same from the formulas (must be equal).
    pub window_formula_bytes: f64,
    /// `window_bytes` / dense f16 bytes of the same tokens.
    pub window_ratio: f64,
    /// Bytes per token of a 4096-token cache / dense f16.
    pub long_ratio: f64,
    /// Not dominated (fewer-or-equal bytes and lower-or-equal perplexity) at window bytes.
    pub frontier_window: bool,
    /// Not dominated at 4096-token bytes.
    pub frontier_long: bool,
}

/// Best dense and best SWAN at or under one budget.
#[derive(Clone, Debug, Serialize)]
pub struct BudgetRow {
    /// Budget × dense f16.
    pub budget: f64,
    /// `window` or `4096`.
    pub measure: &'static str,
    /// Best dense quantized point at or under the budget: (label, ratio, perplexity).
    pub dense: Option<(String, f64, f64)>,
    /// Best SWAN point at or under the budget.
    pub swan: Option<(String, f64, f64)>,
}

impl BudgetRow {
    /// Whether SWAN's best is at or below dense's best perplexity (`None` if either is absent).
    pub fn swan_wins(&self) -> Option<bool> {
        Some(self.swan.as_ref()?.2 <= self.dense.as_ref()?.2)
    }
}

/// llama.cpp's perplexity with a quantized KV cache on the same text.
#[derive(Clone, Debug, Default, Serialize)]
pub struct External {
    /// `ran` or why it did not.
    pub status: String,
    /// `(cache type, perplexity)` rows.
    pub rows: Vec<(String, f64)>,
}

/// Everything the study measured.
#[derive(Clone, Debug, Serialize)]
pub struct FrontierStudy {
    /// Evaluation play.
    pub eval_play: &'static str,
    /// Windows × length, prefix prefilled (the rest scored through the decode path).
    pub windows: (usize, usize, usize),
    /// Head dimension.
    pub head_dim: usize,
    /// Every configuration.
    pub points: Vec<FrontierPoint>,
    /// Per-budget comparisons.
    pub budgets: Vec<BudgetRow>,
    /// llama.cpp's own figures.
    pub external: External,
}

impl FrontierStudy {
    fn find(&self, label: &str) -> Option<&FrontierPoint> {
        self.points.iter().find(|p| p.label == label)
    }

    fn dense_f16(&self) -> Option<&FrontierPoint> {
        self.find("dense f16")
    }
}

fn mark_frontier(
    points: &mut [FrontierPoint],
    ratio: fn(&FrontierPoint) -> f64,
    set: fn(&mut FrontierPoint, bool),
) {
    let snapshot: Vec<(f64, f64)> = points.iter().map(|p| (ratio(p), p.perplexity)).collect();
    for (i, p) in points.iter_mut().enumerate() {
        let (r, ppl) = snapshot[i];
        let dominated = snapshot
            .iter()
            .enumerate()
            .any(|(j, &(r2, p2))| j != i && r2 <= r && p2 <= ppl && (r2 < r || p2 < ppl));
        set(p, !dominated);
    }
}

fn budget_rows(points: &[FrontierPoint]) -> Vec<BudgetRow> {
    let best = |family: &str, ratio: &dyn Fn(&FrontierPoint) -> f64, budget: f64| {
        points
            .iter()
            .filter(|p| p.run.family == family && ratio(p) <= budget)
            .min_by(|a, b| a.perplexity.total_cmp(&b.perplexity))
            .map(|p| (p.label.clone(), ratio(p), p.perplexity))
    };
    let mut out = Vec::new();
    for (measure, ratio) in [
        ("window", &(|p: &FrontierPoint| p.window_ratio) as &dyn Fn(&FrontierPoint) -> f64),
        ("4096", &|p: &FrontierPoint| p.long_ratio),
    ] {
        for budget in BUDGETS {
            out.push(BudgetRow {
                budget,
                measure,
                dense: best("dense", ratio, budget),
                swan: best("swan", ratio, budget),
            });
        }
    }
    out
}

/// Runs llama.cpp's perplexity tool (in `dir`) on `text` with each KV cache type.
fn external(ctx: &Context, dir: Option<&Path>, text: &str, windows: (usize, usize)) -> External {
    let Some(dir) = dir else {
        let status = "skipped: no --llama-cpp DIR given (build the tools with ../shared/recipes/llamacpp-peer.sh)";
        ctx.log(&format!("frontier external check {status}"));
        return External { status: status.into(), rows: Vec::new() };
    };
    match run_external(ctx, dir, text, windows) {
        Ok(rows) => External { status: "ran".into(), rows },
        Err(e) => {
            let status = format!("skipped: {e}");
            ctx.log(&format!("frontier external check {status}"));
            External { status, rows: Vec::new() }
        }
    }
}

fn run_external(
    ctx: &Context,
    dir: &Path,
    text: &str,
    (count, len): (usize, usize),
) -> Result<Vec<(String, f64)>> {
    let tool = |name: &str| {
        let p = dir.join(name);
        if p.is_file() {
            Ok(p)
        } else {
            Err(invalid("llama.cpp", format!("{} missing", p.display())))
        }
    };
    let (perplexity, quantize) = (tool("llama-perplexity")?, tool("llama-quantize")?);
    let model = ctx.model_path();
    let f32_gguf: PathBuf = crate::paths::cache_dir().join("models").join(format!(
        "{}-F32.gguf",
        model.file_stem().and_then(|s| s.to_str()).unwrap_or("model")
    ));
    if !f32_gguf.is_file() {
        let out = Command::new(&quantize)
            .arg("--allow-requantize")
            .args([model.as_os_str(), f32_gguf.as_os_str()])
            .arg("F32")
            .output()
            .map_err(|e| invalid("llama-quantize", e.to_string()))?;
        if !out.status.success() {
            return Err(invalid(
                "llama-quantize",
                String::from_utf8_lossy(&out.stderr).into_owned(),
            ));
        }
    }
    let text_file = std::env::temp_dir().join("kvtide-frontier-eval.txt");
    std::fs::write(&text_file, text).map_err(|e| invalid("frontier text", e.to_string()))?;
    let threads = ctx.plan.threads.to_string();
    let mut rows = Vec::new();
    for ty in ["f16", "q8_0", "q4_0"] {
        let out = Command::new(&perplexity)
            .arg("-m")
            .arg(&f32_gguf)
            .arg("-f")
            .arg(&text_file)
            .args(["-c", &len.to_string(), "--chunks", &count.to_string(), "-t", &threads])
            .args(["-fa", "on", "-ctk", ty, "-ctv", ty])
            .output()
            .map_err(|e| invalid("llama-perplexity", e.to_string()))?;
        let all = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let ppl = all
            .lines()
            .find_map(|l| l.split("Final estimate: PPL = ").nth(1))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|x| x.parse::<f64>().ok())
            .ok_or_else(|| {
                invalid("llama-perplexity", format!("no final estimate for -ctk {ty}"))
            })?;
        ctx.log(&format!("frontier external: llama.cpp -ctk/-ctv {ty}: ppl {ppl:.4}"));
        rows.push((ty.to_owned(), ppl));
    }
    Ok(rows)
}

/// Runs every configuration of the plan's frontier grid.
///
/// # Errors
/// Corpus, calibration, cache and forward errors.
pub fn run(ctx: &mut Context, llama_cpp: Option<&Path>) -> Result<FrontierStudy> {
    let proj = ctx.projection()?.display().to_string();
    let (count, wlen, prefix) = ctx.plan.frontier_eval;
    let windows = ctx.corpus.windows(SWAN_EVAL_PLAY, 0, wlen, count)?;
    let d = ctx.model.config().head_dim;
    let heads = ctx.model.config().num_layers * ctx.model.config().kv_heads;
    let runs: Vec<FrontierRun> = ctx.plan.frontier.clone();
    let mut models = Vec::with_capacity(runs.len());
    let mut caches: Vec<Vec<Box<dyn KvCache>>> = Vec::with_capacity(runs.len());
    for run in &runs {
        let spec: CacheSpec = run.spec(&proj, ctx.plan.threads).parse()?;
        let (model, c) = spec.build_many(&ctx.model, windows.len())?;
        models.push(model);
        caches.push(c);
    }
    let groups = group_by_weights(models)?;
    let mut traces: Vec<Vec<Trace>> = vec![Vec::new(); runs.len()];
    for (model, members) in &groups {
        let per_batch = (64 / members.len()).clamp(1, windows.len().max(1));
        for chunk in windows.chunks(per_batch) {
            let mut batch = Vec::new();
            let mut texts: Vec<(&[u32], &[u32])> = Vec::new();
            for &i in members {
                batch.extend(caches[i].drain(..chunk.len()));
                texts.extend(chunk.iter().map(|w| w.split_at(prefix)));
            }
            let t0 = std::time::Instant::now();
            let out = teacher_force_texts(model, &mut batch, &texts, false)?;
            ctx.log(&format!(
                "frontier: {} configurations × {} windows in {:.0} s",
                members.len(),
                chunk.len(),
                t0.elapsed().as_secs_f64()
            ));
            let mut out = out.into_iter();
            for &i in members {
                traces[i].extend(out.by_ref().take(chunk.len()));
            }
        }
    }
    let tokens = wlen - 1;
    let dense16 = ctx.dense_f16_bytes(tokens) as f64;
    let long16 = (2 * LONG_CACHE * 2 * d) as f64;
    let mut points: Vec<FrontierPoint> = runs
        .iter()
        .zip(traces)
        .map(|(run, ts)| {
            let (mut nll, mut hits, mut n, mut bytes) = (0.0, 0usize, 0usize, 0.0);
            for t in &ts {
                nll += t.nll_sum();
                hits += t.hits();
                n += t.nll.len();
                bytes += t.at_end.total() as f64;
            }
            let window_bytes = bytes / ts.len().max(1) as f64;
            let point = FrontierPoint {
                run: run.clone(),
                label: run.label(),
                spec: run.spec(&proj, ctx.plan.threads).replace(&proj, "<calibrated.safetensors>"),
                perplexity: (nll / n.max(1) as f64).exp(),
                top1: hits as f64 / n.max(1) as f64,
                window_bytes,
                window_formula_bytes: (heads * run.head_bytes(d, tokens)) as f64,
                window_ratio: window_bytes / dense16,
                long_ratio: run.head_bytes(d, LONG_CACHE) as f64 / long16,
                frontier_window: false,
                frontier_long: false,
            };
            ctx.log(&format!(
                "frontier {}: ppl {:.3}, {:.3} × f16 (window), {:.3} × f16 (4096)",
                point.label, point.perplexity, point.window_ratio, point.long_ratio
            ));
            point
        })
        .collect();
    mark_frontier(&mut points, |p| p.window_ratio, |p, f| p.frontier_window = f);
    mark_frontier(&mut points, |p| p.long_ratio, |p, f| p.frontier_long = f);
    let budgets = budget_rows(&points);
    let text = models::load::text::read_text(
        &crate::paths::plays_dir().join(format!("{SWAN_EVAL_PLAY}.md")),
    )?;
    let external = external(ctx, llama_cpp, &text, (count, wlen));
    Ok(FrontierStudy {
        eval_play: SWAN_EVAL_PLAY,
        windows: (count, wlen, prefix),
        head_dim: d,
        points,
        budgets,
        external,
    })
}

fn cell(x: &Option<(String, f64, f64)>, base: f64) -> [String; 3] {
    match x {
        Some((l, r, p)) => {
            [l.clone(), num(*r, 3), format!("{} ({})", num(*p, 3), pct(p / base - 1.0, 2))]
        }
        None => ["—".into(), "—".into(), "—".into()],
    }
}

/// The tables and plot of the study.
pub fn section(s: &FrontierStudy, out: &mut Section) {
    let base = s.dense_f16().map_or(f64::NAN, |p| p.perplexity);
    let (count, len, prefix) = s.windows;
    out.text(format!(
        "{count} window(s) of {len} tokens of {}, {prefix} prefilled, the rest scored through the decode path; d_h = {}. Bytes count everything a cache holds (buffer, indices or masks, offsets, scales, block headers): at the end of each window, and per token of a {LONG_CACHE}-token cache from the formulas. ★ marks a non-dominated point.",
        s.eval_play, s.head_dim
    ));
    let mut t = Table::new(
        "frontier_points",
        "Perplexity vs KV bytes: dense quantized formats and SWAN encodings",
        &[
            "configuration",
            "bytes / f16 (window)",
            "bytes / f16 (4096)",
            "perplexity",
            "Δ vs f16",
            "top-1",
            "frontier (window / 4096)",
        ],
    );
    let mut pts: Vec<&FrontierPoint> = s.points.iter().collect();
    pts.sort_by(|a, b| a.long_ratio.total_cmp(&b.long_ratio));
    for p in pts {
        let star = |f: bool| if f { "★" } else { "" };
        t.row(vec![
            p.label.clone(),
            num(p.window_ratio, 3),
            num(p.long_ratio, 3),
            num(p.perplexity, 3),
            pct(p.perplexity / base - 1.0, 2),
            pct(p.top1, 1),
            format!("{} / {}", star(p.frontier_window), star(p.frontier_long)),
        ]);
    }
    out.table(t);
    let mut b = Table::new(
        "frontier_budgets",
        "Best dense quantized vs best SWAN at or under each budget",
        &[
            "budget × f16",
            "bytes counted",
            "best dense",
            "its bytes",
            "its ppl",
            "best SWAN",
            "its bytes",
            "its ppl",
            "SWAN ≤ dense",
        ],
    );
    for r in &s.budgets {
        let [dl, dr, dp] = cell(&r.dense, base);
        let [sl, sr, sp] = cell(&r.swan, base);
        let wins =
            r.swan_wins().map_or("—".into(), |w| if w { "yes".to_string() } else { "no".into() });
        b.row(vec![num(r.budget, 2), r.measure.to_owned(), dl, dr, dp, sl, sr, sp, wins]);
    }
    out.table(b);
    let mut e = Table::new(
        "frontier_external",
        "External check: llama.cpp's perplexity tool on the same text (F32 weights)",
        &["KV cache", "perplexity", "vs its f16", "kvtide counterpart", "kvtide vs f16"],
    );
    let f16 = s.external.rows.iter().find(|(t, _)| t == "f16").map(|r| r.1);
    for (ty, ppl) in &s.external.rows {
        let ours = match ty.as_str() {
            "q8_0" => s.find("dense int8 rotate=hadamard"),
            "q4_0" => s.find("dense int4 rotate=hadamard"),
            _ => s.dense_f16(),
        };
        e.row(vec![
            ty.clone(),
            num(*ppl, 4),
            f16.map_or("—".into(), |f| pct(ppl / f - 1.0, 2)),
            ours.map_or("—".into(), |p| p.label.clone()),
            ours.map_or("—".into(), |p| pct(p.perplexity / base - 1.0, 2)),
        ]);
    }
    if s.external.rows.is_empty() {
        e.row(vec!["—".into(), s.external.status.clone(), "—".into(), "—".into(), "—".into()]);
    }
    out.table(e);
    let series = |family: &str, index: &str| -> Vec<(f64, f64)> {
        let mut v: Vec<(f64, f64)> = s
            .points
            .iter()
            .filter(|p| p.run.family == family && (index.is_empty() || p.run.index == index))
            .map(|p| (p.long_ratio, p.perplexity))
            .collect();
        v.sort_by(|a, b| a.0.total_cmp(&b.0));
        v
    };
    out.plot(
        Plot::new(
            "frontier_ppl_vs_bytes",
            "Perplexity vs KV bytes (4096-token cache)",
            "KV bytes / dense f16",
            "perplexity",
        )
        .series("dense quantized", series("dense", ""))
        .series("SWAN list", series("swan", "list"))
        .series("SWAN bitmask", series("swan", "bitmask"))
        .reference("dense f16", base),
    );
}

/// The study's claims (its quality-per-byte targets), measured.
pub fn findings(s: &FrontierStudy) -> Vec<Finding> {
    let base = s.dense_f16().map_or(f64::NAN, |p| p.perplexity);
    let mut out = Vec::new();
    let lost: Vec<String> = s
        .budgets
        .iter()
        .filter(|r| r.swan_wins() == Some(false))
        .map(|r| format!("{} × f16 ({})", r.budget, r.measure))
        .collect();
    let compared = s.budgets.iter().filter(|r| r.swan_wins().is_some()).count();
    out.push(Finding::new(
        "frontier-budgets",
        "At every budget 0.15–0.5 × f16 the best SWAN configuration's perplexity is at or below the best dense quantized one's",
        compared > 0 && lost.is_empty(),
        format!("{compared} budget comparisons; SWAN behind at: {lost:?}"),
    ));
    let target = s
        .points
        .iter()
        .filter(|p| {
            p.run.family == "swan"
                && p.run.index == "bitmask"
                && matches!(p.run.values, "fp8" | "int8")
                && p.run.k == Some(s.head_dim / 2)
                && p.run.buffer == 128
        })
        .min_by(|a, b| a.perplexity.total_cmp(&b.perplexity));
    if let Some(p) = target {
        let sparse = p.run.swan_config(s.head_dim, s.head_dim / 2).sparse_token_bytes(s.head_dim)
            as f64
            / (2.0 * 2.0 * s.head_dim as f64);
        let dppl = p.perplexity / base - 1.0;
        out.push(Finding::new(
            "frontier-bitmask-half-k",
            "SWAN bitmask, best 8-bit values, k = d_h/2, b = 128: ≤ 0.36 × f16 per sparse token, ≤ 0.40 × f16 for a 4096-token cache, ≤ +0.5 % perplexity",
            sparse <= 0.36 && p.long_ratio <= 0.40 && dppl <= 0.005,
            format!("{}: {:.3} × f16 per sparse token, {:.3} × f16 at 4096 tokens, {} perplexity", p.label, sparse, p.long_ratio, pct(dppl, 2)),
        ));
    }
    let ext = |ty: &str| s.external.rows.iter().find(|(t, _)| t == ty).map(|r| r.1);
    if let (Some(f16), Some(q8), Some(q4)) = (ext("f16"), ext("q8_0"), ext("q4_0")) {
        let ours = |l: &str| s.find(l).map(|p| p.perplexity / base - 1.0);
        if let (Some(i8), Some(i4)) =
            (ours("dense int8 rotate=hadamard"), ours("dense int4 rotate=hadamard"))
        {
            let (d8, d4) = ((i8 - (q8 / f16 - 1.0)).abs(), (i4 - (q4 / f16 - 1.0)).abs());
            out.push(Finding::new(
                "frontier-llamacpp",
                "kvtide int8 / int4 (Hadamard) cost within 0.1 / 1.5 percentage points of llama.cpp's q8_0 / q4_0",
                d8 <= 0.001 && d4 <= 0.015,
                format!("int8 {} vs q8_0 {}; int4 {} vs q4_0 {}", pct(i8, 2), pct(q8 / f16 - 1.0, 2), pct(i4, 2), pct(q4 / f16 - 1.0, 2)),
            ));
        }
    }
    out
}

/// The enforced check: every configuration's measured bytes equal its formula, and every
/// perplexity is finite.
pub fn formula_bytes(s: &FrontierStudy) -> Check {
    let bad: Vec<String> = s
        .points
        .iter()
        .filter(|p| {
            (p.window_bytes - p.window_formula_bytes).abs() > 0.5 || !p.perplexity.is_finite()
        })
        .map(|p| {
            format!(
                "{}: {} held vs {} formula, ppl {}",
                p.label, p.window_bytes, p.window_formula_bytes, p.perplexity
            )
        })
        .collect();
    Check::new(
        "frontier: every format's held bytes equal its formula; perplexities finite",
        bad.is_empty(),
        format!("{} configurations; mismatches: {bad:?}", s.points.len()),
    )
}
