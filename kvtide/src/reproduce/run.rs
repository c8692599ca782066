//! The `kvtide reproduce` driver: runs the studies in order, assembles the report, enforces
//! the checks (lossless settings, fixture agreement, completeness) and writes the results.

use std::path::PathBuf;

use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;

use super::Context;
use super::findings::{Check, Finding, checks_table, findings_table, lossless_check};
use super::grid::Size;
use super::report::Report;
use super::{
    audio_study, frontier, frontier_reuse, memory, premise_study, swan_report, swan_study,
    wnw_report, wnw_study,
};
use crate::error::{Result, invalid};

/// Arguments of `kvtide reproduce`.
#[derive(Args, Debug, Clone)]
pub struct ReproduceArgs {
    /// CI-sized run (minutes on 2 cores); still enforces the lossless and completeness checks.
    #[arg(long)]
    pub quick: bool,
    /// Most of the full grids on the quick run's short texts (under an hour on one core).
    #[arg(long, conflicts_with = "quick")]
    pub reduced: bool,
    /// Output directory (JSON, Markdown, figures).
    #[arg(long, default_value = "results")]
    pub out: PathBuf,
    /// GGUF model (default: the SmolLM2 GGUF fetched by `scripts/setup.sh`).
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// llama.cpp's tools directory (`llama-perplexity`, `llama-quantize`) for the frontier
    /// study's external check; without it that row is skipped with a printed reason.
    #[arg(long)]
    pub llama_cpp: Option<PathBuf>,
    /// The frontier study runs on the run's model and on every further model set up (Gemma 3
    /// 270M once `scripts/setup.sh gemma` fetched it); with this flag, on the further models
    /// only.
    #[arg(long, conflicts_with = "primary_model_only")]
    pub further_models_only: bool,
    /// The frontier study on the run's model alone: every further model's leg is skipped, and
    /// the report says so (a full-size run on the run's model in a few hours of 2 cores).
    #[arg(long)]
    pub primary_model_only: bool,
    /// The frontier study reduced to llama.cpp's counterparts (dense f16, Hadamard int8 and
    /// int4, and int4 with its values alone rotated where the plan has it) on its full windows, with the external check: the peer comparison in minutes,
    /// without the SWAN grid.
    #[arg(long)]
    pub frontier_external_only: bool,
    /// With `--frontier-external-only`: dense int4 also in this many seeded random orthogonal
    /// bases (1–8), under llama.cpp's condition beside the counterparts — the spread of a
    /// 4-bit cost over equally good rotations, against which a peer gap between two single
    /// draws is read.
    #[arg(long, requires = "frontier_external_only", value_parser = clap::value_parser!(u8).range(1..=8))]
    pub frontier_rotation_draws: Option<u8>,
    /// With `--frontier-rotation-draws`: which seeded bases the draws come from, one family
    /// or several (comma-separated): `random` (Haar-random orthogonal), `hadamard-signs`
    /// (llama.cpp's Walsh–Hadamard matrices with random row signs — the plain matrix's
    /// structure, another sign pattern per draw), `hadamard-value-signs` (llama.cpp's key
    /// rotation exactly, its value blocks with random row signs: how far another rounding of
    /// the 4-bit values alone moves the cost) or `hadamard-jitter` (the plain matrices
    /// turned by 1e-5 rad: how far rounding-sized differences alone move the cost).
    #[arg(
        long,
        requires = "frontier_rotation_draws",
        value_enum,
        value_delimiter = ',',
        default_value = "random"
    )]
    pub frontier_draw_bases: Vec<frontier::DrawFamily>,
    /// The play the frontier study scores (a play of the text set-up, not one the SWAN
    /// projections are calibrated on): the same windows for kvtide and llama.cpp, to see
    /// how a figure moves with the text.
    #[arg(long, default_value = super::corpus::SWAN_EVAL_PLAY)]
    pub frontier_play: String,
    /// How many windows the frontier study scores (the plan's own otherwise: 8 of 1024
    /// tokens at full size): more windows narrow each figure's resolution and take
    /// proportionally longer; the play must hold them all. Earlier runs on another count are
    /// not reused.
    #[arg(long)]
    pub frontier_windows: Option<usize>,
    /// The frontier study on equal footing only: dense f16, the quantized formats with one
    /// format for keys and values (unrotated and Walsh–Hadamard-rotated) and SWAN's rows in
    /// the paper's form, every one at each buffer of the plan and without a sink (f16 rings
    /// on a sliding-window model) — the comparison of formats, not of buffers.
    #[arg(long, conflicts_with = "frontier_external_only")]
    pub frontier_equal_footing: bool,
    /// A restriction of the frontier study's SWAN grid.
    #[command(flatten)]
    pub frontier_grid: frontier::SwanGrid,
    /// Figures of earlier frontier runs taken into this one.
    #[command(flatten)]
    pub frontier_reuse: frontier_reuse::ReuseArgs,
    /// Only these studies (comma-separated: memory, premise, swan, frontier, wnw, audio); the
    /// completeness check then covers only them. For development; the default runs all.
    #[arg(long, value_delimiter = ',')]
    pub only: Vec<String>,
}

impl ReproduceArgs {
    /// The run size the flags select.
    pub fn size(&self) -> Size {
        if self.quick {
            Size::Quick
        } else if self.reduced {
            Size::Reduced
        } else {
            Size::Full
        }
    }
}

/// The studies, in run order.
const STUDIES: [&str; 6] = ["memory", "premise", "swan", "frontier", "wnw", "audio"];

/// Tables and figures each study must produce.
fn expected(study: &str) -> (&'static [&'static str], &'static [&'static str]) {
    match study {
        "memory" => (&["memory_bytes_per_vector"], &["fig2a_bytes_per_vector"]),
        "premise" => (
            &["premise", "premise_vs_transformers"],
            &["fig1a_premise_per_position", "fig1b_premise_cumulative"],
        ),
        "swan" => (&["swan_main", "swan_projection", "swan_kv_split"], &["swan_ppl_vs_memory"]),
        // Per model: the legs that ran (`frontier::expected`).
        "frontier" => (&[], &[]),
        "wnw" => (
            &["wnw_main", "wnw_runs", "wnw_a1", "wnw_a3", "wnw_runtime"],
            &[
                "wnw_top1_vs_rgpu",
                "wnw_ppl_vs_rgpu",
                "fig4_kv_size_wnw",
                "fig4_kv_size_adakv",
                "fig4_kv_size_audiokv",
                "fig4_kv_size_arkvale",
                "fig4_kv_size_wnw_swan",
            ],
        ),
        _ => (&["audio"], &[]),
    }
}

/// What a run produced.
#[derive(Clone, Debug, Serialize)]
pub struct Outcome {
    /// Enforced checks.
    pub checks: Vec<Check>,
    /// Paper findings.
    pub findings: Vec<Finding>,
    /// Files written.
    pub files: Vec<PathBuf>,
    /// Wall seconds.
    pub seconds: f64,
}

impl Outcome {
    /// Whether every check passed.
    pub fn passed(&self) -> bool {
        self.checks.iter().all(|c| c.passed)
    }
}

/// Where and how the run happened.
#[derive(Clone, Debug, Serialize)]
struct RunInfo {
    command: String,
    quick: bool,
    size: Size,
    model: String,
    cpu: String,
    cores: usize,
    memory_gib: f64,
    unix_start: u64,
    seconds: f64,
    study_seconds: Vec<(String, f64)>,
    version: &'static str,
}

fn machine() -> (String, usize, f64) {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|s| s.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown".into());
    let mem = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("MemTotal"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|k| k.parse::<f64>().ok())
        })
        .map_or(f64::NAN, |kb| kb / 1024.0 / 1024.0);
    (cpu, std::thread::available_parallelism().map_or(1, |n| n.get()), mem)
}

fn progress(total: usize) -> ProgressBar {
    let pb = ProgressBar::new(total as u64);
    if let Ok(style) =
        ProgressStyle::with_template("{elapsed_precise} [{bar:30}] {pos}/{len} studies  {msg}")
    {
        pb.set_style(style.progress_chars("=> "));
    }
    pb
}

/// The frontier study on one model (one leg): its section, findings, check and record.
fn frontier_leg(
    leg: &frontier::Leg,
    one_leg: bool,
    args: &ReproduceArgs,
    ctx: &mut Context,
    out: &mut Outputs<'_>,
) -> Result<()> {
    check_frontier_play(&args.frontier_play)?;
    if let Some(n) = args.frontier_windows {
        if n == 0 {
            return Err(invalid(
                "reproduce --frontier-windows",
                "expected at least 1 window, got 0",
            ));
        }
        ctx.plan.frontier_eval.0 = n;
    }
    if ctx.model_path().file_name() != Some(std::ffi::OsStr::new(crate::paths::DEFAULT_MODEL)) {
        let d = ctx.model.config().head_dim;
        ctx.plan.further_model_frontier(d);
    }
    // A windowed model's rings are most of its cache at a few thousand tokens: its SWAN
    // configurations also run with int8 rings, as a quantized dense configuration's are.
    if ctx.model.config().local_attention.is_some() {
        frontier::add_int8_rings(&mut ctx.plan.frontier);
    }
    // Keys pruned by query-weighted magnitude beside the paper's rule: which one a model's
    // attention prefers is measured, not assumed.
    frontier::add_query_selection(&mut ctx.plan.frontier);
    // Integer row codes with the components scaled by the basis' eigenvalues beside the
    // unscaled rows: one row scale spans components of very different sizes otherwise.
    frontier::add_component_norm(&mut ctx.plan.frontier);
    // Below ~0.38 × f16 at the end of a short window only 4-bit rings leave the global
    // layers any bytes: the int8 bitmask runs once more with int4 rings in a basis of their own.
    if ctx.model.config().local_attention.is_some() {
        frontier::add_int4_rings(&mut ctx.plan.frontier);
        // The int8-ring rows once more with the dense int8/int4 rows' rings: q4_0 values.
        frontier::add_mixed_rings(&mut ctx.plan.frontier);
    }
    // The attention sink kept in f32 by the SWAN rows that compete with a dense 4-bit cache,
    // as the dense rows keep it.
    let windowed = ctx.model.config().local_attention.is_some();
    frontier::add_sinks(&mut ctx.plan.frontier, windowed);
    if args.frontier_external_only {
        ctx.plan.frontier.retain(frontier::FrontierRun::is_llamacpp_counterpart);
        ctx.log("frontier: llama.cpp's counterparts only (--frontier-external-only)");
        if let Some(n) = args.frontier_rotation_draws {
            let mut families: Vec<frontier::DrawFamily> = Vec::new();
            for &f in &args.frontier_draw_bases {
                if !families.contains(&f) {
                    families.push(f);
                }
            }
            for family in families {
                frontier::add_rotation_draws(&mut ctx.plan.frontier, family, usize::from(n));
                ctx.log(&format!("frontier: int4 in {n} {} beside them", family.describe()));
            }
        }
    }
    let restricted = if args.frontier_grid.is_whole() {
        None
    } else {
        let d = ctx.model.config().head_dim;
        args.frontier_grid.apply(&mut ctx.plan.frontier, d)?;
        let line = args.frontier_grid.describe();
        ctx.log(&format!("frontier: {line}"));
        Some(line)
    };
    // After the SWAN grid's restriction: every other family joins at the SWAN rows' buffers.
    if args.frontier_equal_footing {
        frontier::equal_footing(&mut ctx.plan.frontier, windowed);
        ctx.log("frontier: equal footing only (--frontier-equal-footing)");
    }
    let mut s = frontier::run(
        ctx,
        args.llama_cpp.as_deref(),
        &args.frontier_play,
        &args.frontier_reuse,
        one_leg,
    )?;
    s.restricted = restricted;
    let title = if leg.tag.is_empty() {
        "Frontier: perplexity vs KV bytes against quantized dense KV".to_owned()
    } else {
        format!("Frontier on {}: perplexity vs KV bytes against quantized dense KV", leg.title)
    };
    frontier::section(&s, leg, out.report.section(&title));
    out.findings.extend(frontier::findings(&s, leg));
    out.checks.push(frontier::formula_bytes(&s, leg));
    out.report.record(&leg.name("frontier"), &s)?;
    out.legs.push(leg.clone());
    Ok(())
}

/// What the studies add to: the report, findings, checks, and the frontier legs that ran.
struct Outputs<'a> {
    report: &'a mut Report,
    findings: &'a mut Vec<Finding>,
    checks: &'a mut Vec<Check>,
    legs: Vec<frontier::Leg>,
}

/// Runs one study and adds its section, findings and checks.
fn study(name: &str, args: &ReproduceArgs, ctx: &mut Context, out: &mut Outputs<'_>) -> Result<()> {
    if name == "frontier" {
        let gemma = crate::paths::gemma_model();
        let choice = if args.further_models_only {
            frontier::LegChoice::FurtherOnly
        } else if args.primary_model_only {
            frontier::LegChoice::PrimaryOnly
        } else {
            frontier::LegChoice::All
        };
        let legs = frontier::legs(ctx.model_path(), &gemma, choice);
        // A reused file matching no leg is an error only where it cannot be another leg's.
        let one_leg = legs.iter().filter(|l| l.model.is_ok()).count() <= 1;
        for leg in legs {
            match (&leg.model, leg.tag.is_empty()) {
                (Err(_), _) => {
                    let line = leg.skip_line().unwrap_or_default();
                    ctx.log(&line);
                    out.report.section(&format!("Frontier on {}: skipped", leg.title)).text(line);
                }
                (Ok(_), true) => frontier_leg(&leg, one_leg, args, ctx, out)?,
                (Ok(path), false) => {
                    ctx.log(&format!("frontier: the {} leg on {}", leg.title, path.display()));
                    let mut further = ctx.for_model(path)?;
                    frontier_leg(&leg, one_leg, args, &mut further, out)?;
                }
            }
        }
        return Ok(());
    }
    let (report, findings, checks) = (&mut *out.report, &mut *out.findings, &mut *out.checks);
    match name {
        "memory" => {
            let (plot, table) = memory::figure(&[ctx.model.config().head_dim, 128]);
            report.section("SWAN memory per stored vector (Figure 2(a))").table(table).plot(plot);
        }
        "premise" => {
            let s = premise_study::run(ctx)?;
            premise_study::section(
                &s,
                report.section("WnW premise: prefill vs decode attention (Figure 1)"),
            );
            findings.extend(premise_study::findings(&s));
            checks.push(premise_study::check(&s));
            report.record("premise", &s)?;
        }
        "swan" => {
            let s = swan_study::run(ctx)?;
            swan_report::section(
                &s,
                report.section("SWAN: perplexity vs KV memory (Tables 1–3, Figure 2(b))"),
            );
            findings.extend(swan_report::findings(&s));
            checks.push(lossless_check(
                "SWAN k = d_h, f32 values ≡ dense f32 (decode path)",
                &s.lossless,
            ));
            report.record("swan", &s)?;
        }
        "wnw" => {
            let s = wnw_study::run(ctx)?;
            wnw_report::section(
                &s,
                report.section(
                    "WnW: long-form copy task (Table 5 / Figure 3, Table 3, Table 4, Figure 4)",
                ),
            );
            findings.extend(wnw_report::findings(&s));
            checks.push(lossless_check(
                "WnW lossless mode (f32) ≡ dense f32 (decode path)",
                &s.lossless,
            ));
            checks.push(lossless_check(
                "tiered Full policy (f16) ≡ dense f16 (decode path)",
                &s.full_vs_dense,
            ));
            report.record("wnw", &s)?;
        }
        "audio" => {
            let s = audio_study::run(ctx)?;
            audio_study::section(
                &s,
                report.section("Audio: Voxtral-style pipeline end to end on LibriVox clips"),
            );
            checks.push(audio_study::check(&s));
            findings.extend(audio_study::findings(&s));
            report.record("audio", &s)?;
        }
        other => {
            return Err(invalid(
                "reproduce",
                format!("unknown study `{other}` (memory, premise, swan, frontier, wnw, audio)"),
            ));
        }
    }
    Ok(())
}

/// Every expected table has rows and every expected figure has a line (the frontier's for
/// each of its `legs` that ran).
fn completeness(report: &Report, studies: &[&str], legs: &[frontier::Leg]) -> Check {
    let owned = |x: &[&str]| x.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
    let mut names: Vec<(Vec<String>, Vec<String>)> =
        studies.iter().map(|s| (owned(expected(s).0), owned(expected(s).1))).collect();
    names.extend(legs.iter().map(frontier::expected));
    let mut missing = Vec::new();
    for (tables, plots) in &names {
        for t in tables {
            if !report.tables().any(|x| x.name == *t && !x.rows.is_empty()) {
                missing.push(format!("table {t}"));
            }
        }
        for p in plots {
            if !report.plots().any(|x| x.stem == *p && x.num_points() >= 2) {
                missing.push(format!("figure {p}"));
            }
        }
    }
    let n: usize = names.iter().map(|(t, p)| t.len() + p.len()).sum();
    Check::new(
        "every reported table and figure is present and non-empty",
        missing.is_empty(),
        if missing.is_empty() {
            format!("{n} tables and figures")
        } else {
            format!("missing or empty: {}", missing.join(", "))
        },
    )
}

/// Refuses a frontier play the SWAN projections were calibrated on (the SWAN points would
/// be scored on their own calibration text) or that is not in the plays directory.
fn check_frontier_play(play: &str) -> Result<()> {
    if super::corpus::SWAN_CALIBRATION_PLAYS.contains(&play) {
        return Err(invalid(
            "reproduce --frontier-play",
            format!(
                "{play:?} calibrates the SWAN projections; choose a play outside {:?}",
                super::corpus::SWAN_CALIBRATION_PLAYS
            ),
        ));
    }
    let path = crate::paths::plays_dir().join(format!("{play}.md"));
    if !path.is_file() {
        return Err(invalid(
            "reproduce --frontier-play",
            format!("{play:?}: no {} (run scripts/setup.sh)", path.display()),
        ));
    }
    Ok(())
}

/// Runs `kvtide reproduce`.
///
/// # Errors
/// Loading, study and writing errors (a failed *check* is not an error: see
/// [`Outcome::passed`]).
pub fn run(args: &ReproduceArgs) -> Result<Outcome> {
    let studies: Vec<&str> = if args.only.is_empty() {
        STUDIES.to_vec()
    } else {
        STUDIES.iter().copied().filter(|s| args.only.iter().any(|o| o == s)).collect()
    };
    if studies.is_empty() {
        return Err(invalid(
            "reproduce --only",
            format!("{:?} names no study (memory, premise, swan, frontier, wnw, audio)", args.only),
        ));
    }
    let model = args.model.clone().unwrap_or_else(crate::paths::default_model);
    let pb = progress(studies.len());
    let mut ctx = Context::new(&model, args.size(), pb.clone())?;
    let (mut report, mut findings, mut checks, mut times) =
        (Report::default(), Vec::new(), Vec::new(), Vec::new());
    let unix_start = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let mut out = Outputs {
        report: &mut report,
        findings: &mut findings,
        checks: &mut checks,
        legs: Vec::new(),
    };
    for name in &studies {
        ctx.tick(name);
        let t0 = ctx.elapsed();
        study(name, args, &mut ctx, &mut out)?;
        times.push(((*name).to_owned(), ctx.elapsed() - t0));
        ctx.log(&format!("{name}: done in {:.0} s", ctx.elapsed() - t0));
    }
    let legs = out.legs;
    pb.finish_and_clear();
    checks.push(completeness(&report, &studies, &legs));
    let (cpu, cores, memory_gib) = machine();
    let info = RunInfo {
        command: portable_command(std::env::args()),
        quick: args.quick,
        size: args.size(),
        model: portable_path(&model.display().to_string()),
        cpu,
        cores,
        memory_gib,
        unix_start,
        seconds: ctx.elapsed(),
        study_seconds: times,
        version: env!("CARGO_PKG_VERSION"),
    };
    report
        .section("Findings and checks")
        .table(findings_table(&findings))
        .table(checks_table(&checks))
        .text(format!(
            "Run: `{}` on {} ({} cores, {:.0} GiB), {:.0} s.",
            info.command, info.cpu, info.cores, info.memory_gib, info.seconds
        ));
    report.record("run", &info)?;
    report.record("findings", &findings)?;
    report.record("checks", &checks)?;
    let heading = if args.further_models_only {
        format!("kvtide reproduce — the frontier study on further models ({})", args.size().name())
    } else {
        let name = &ctx.model.config().name;
        format!("kvtide reproduce — SWAN and WnW on {name} ({})", args.size().name())
    };
    let written = report.write(&args.out, &heading)?;
    let unwritten: Vec<String> = written
        .files
        .iter()
        .filter(|f| std::fs::metadata(f).map_or(true, |m| m.len() == 0))
        .map(|f| f.display().to_string())
        .collect();
    checks.push(Check::new(
        "every output file was written",
        unwritten.is_empty(),
        format!("{} files; empty or missing: {unwritten:?}", written.files.len()),
    ));
    Ok(Outcome { checks, findings, files: written.files, seconds: ctx.elapsed() })
}

/// `kvtide reproduce` as a command: runs, prints the checks and findings, and returns the
/// process exit code (0 only if every check passed).
pub fn cli(args: &ReproduceArgs) -> i32 {
    match run(args) {
        Ok(o) => {
            for c in &o.checks {
                println!("[{}] {}: {}", if c.passed { "pass" } else { "FAIL" }, c.name, c.detail);
            }
            for f in &o.findings {
                println!(
                    "[{}] {} ({})",
                    if f.holds { "holds" } else { "does not hold" },
                    f.claim,
                    f.evidence
                );
            }
            println!(
                "kvtide reproduce: {} files in {} ({:.0} s)",
                o.files.len(),
                args.out.display(),
                o.seconds
            );
            if o.passed() { 0 } else { 1 }
        }
        Err(e) => {
            eprintln!("kvtide reproduce: {e}");
            1
        }
    }
}

/// A command line as the reports state it: the program as `kvtide`, paths under the set-up
/// folder from `$KVTIDE_CACHE`, other absolute paths by their last component — no path of
/// the machine that ran it.
fn portable_command(args: impl Iterator<Item = String>) -> String {
    let mut out: Vec<String> = Vec::new();
    for (i, a) in args.enumerate() {
        out.push(if i == 0 { "kvtide".to_owned() } else { portable_path(&a) });
    }
    out.join(" ")
}

/// `path` without the machine's folders (see [`portable_command`]); other text unchanged.
fn portable_path(path: &str) -> String {
    let cache = std::env::var("KVTIDE_CACHE").ok().filter(|c| c.starts_with('/'));
    if let Some(rest) = cache.as_deref().and_then(|c| path.strip_prefix(c)) {
        return format!("$KVTIDE_CACHE{rest}");
    }
    if path.starts_with('/') {
        let name = std::path::Path::new(path).file_name().map(|n| n.to_string_lossy());
        return name.map_or_else(|| path.to_owned(), |n| n.into_owned());
    }
    path.to_owned()
}

#[cfg(test)]
mod tests {
    #[test]
    fn reported_commands_name_no_path_of_the_machine() {
        let args = ["/tmp/kvtide-frontier", "reproduce", "--out", "/tmp/frontier-full", "--quick"];
        let line = super::portable_command(args.iter().map(|a| (*a).to_owned()));
        assert_eq!(line, "kvtide reproduce --out frontier-full --quick");
        assert_eq!(super::portable_path("results/x"), "results/x");
    }

    use super::*;

    #[test]
    fn a_frontier_play_of_the_swan_calibration_or_missing_is_refused() {
        let e = check_frontier_play("othello").unwrap_err().to_string();
        assert!(e.contains("--frontier-play") && e.contains("calibrates"), "{e}");
        let e = check_frontier_play("no-such-play").unwrap_err().to_string();
        assert!(e.contains("no-such-play"), "{e}");
    }

    /// Rotation draws join the external-only run alone, 1 to 8 of them.
    #[test]
    fn rotation_draws_need_the_external_only_run_and_count_one_to_eight() {
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            args: ReproduceArgs,
        }
        let parse = |extra: &[&str]| {
            <Cli as clap::Parser>::try_parse_from(["kvtide"].iter().chain(extra)).map(|c| c.args)
        };
        let a = parse(&["--frontier-external-only", "--frontier-rotation-draws", "8"]).unwrap();
        assert_eq!(a.frontier_rotation_draws, Some(8));
        assert_eq!(parse(&["--frontier-external-only"]).unwrap().frontier_rotation_draws, None);
        assert!(parse(&["--frontier-rotation-draws", "2"]).is_err());
        assert_eq!(a.frontier_draw_bases, [frontier::DrawFamily::Random]);
        let both = ["--frontier-external-only", "--frontier-rotation-draws", "4"];
        let b = parse(&[&both[..], &["--frontier-draw-bases", "hadamard-signs,random"]].concat());
        assert_eq!(
            b.unwrap().frontier_draw_bases,
            [frontier::DrawFamily::HadamardSigns, frontier::DrawFamily::Random]
        );
        assert!(parse(&[&both[..], &["--frontier-draw-bases", "hadamard"]].concat()).is_err());
        let j = parse(&[&both[..], &["--frontier-draw-bases", "hadamard-jitter"]].concat());
        assert_eq!(j.unwrap().frontier_draw_bases, [frontier::DrawFamily::HadamardJitter]);
        let v = parse(&[&both[..], &["--frontier-draw-bases", "hadamard-value-signs"]].concat());
        assert_eq!(v.unwrap().frontier_draw_bases, [frontier::DrawFamily::HadamardValueSigns]);
        assert!(parse(&["--frontier-external-only", "--frontier-draw-bases", "random"]).is_err());
        for n in ["0", "9"] {
            assert!(parse(&["--frontier-external-only", "--frontier-rotation-draws", n]).is_err());
        }
    }
}
