//! The premise study (`papers/wnw.txt` §2.1, Figure 1) over the plan's variants and passage
//! lengths, checked against the transformers measurements committed in `fixtures/premise/`
//! (same passages, same procedure): the exact passage ids must match, and the Rust
//! forward's masses, Jaccard@100 and second-copy accuracy must agree within tolerance.

use std::path::Path;

use serde::Serialize;
use serde_json::Value;

use super::Context;
use super::corpus::Variant;
use super::findings::{Check, Finding};
use super::plot::Plot;
use super::premise::{Premise, measure};
use super::report::{Section, Table, num, pct};
use crate::error::{Error, Result};

/// Tolerance for masses and accuracies (absolute) and Jaccard@100 against transformers.
pub const FIXTURE_TOLERANCE: (f64, f64) = (0.01, 0.03);

/// One figure compared with the transformers fixture.
#[derive(Clone, Debug, Serialize)]
pub struct FixtureComparison {
    /// Passage.
    pub label: String,
    /// Figure name.
    pub figure: &'static str,
    /// Rust.
    pub rust: f64,
    /// transformers.
    pub transformers: f64,
    /// Allowed |difference|.
    pub tolerance: f64,
}

/// Everything the premise study measured.
#[derive(Clone, Debug, Serialize)]
pub struct PremiseStudy {
    /// One row per passage.
    pub rows: Vec<Premise>,
    /// Comparisons with `fixtures/premise`.
    pub fixture: Vec<FixtureComparison>,
    /// Problems finding or matching the fixture (each fails the check).
    pub fixture_problems: Vec<String>,
}

fn fixture_passage(dir: &Path, variant: Variant, n: usize, play: &str) -> Result<Value> {
    let path = dir.join(format!("premise_{}_{n}.json", variant.name()));
    let text = std::fs::read_to_string(&path).map_err(|source| Error::Io {
        op: "read",
        path: path.clone(),
        source,
    })?;
    let doc: Value = serde_json::from_str(&text)
        .map_err(|source| Error::Json { what: path.display().to_string(), source })?;
    doc["passages"]
        .as_array()
        .and_then(|ps| ps.iter().find(|p| p["play"] == play).cloned())
        .ok_or_else(|| {
            crate::error::invalid(
                "premise fixture",
                format!("{} has no passage for {play}", path.display()),
            )
        })
}

fn compare(row: &Premise, fx: &Value) -> Vec<FixtureComparison> {
    let (tol_mass, tol_j) = FIXTURE_TOLERANCE;
    let label = format!("{} {} N={}", row.variant, row.play, row.n);
    let f = |v: &Value| v.as_f64().unwrap_or(f64::NAN);
    [
        (
            "prefill mass first 10 %",
            row.prefill.first_10pct,
            f(&fx["prefill"]["first_10pct"]),
            tol_mass,
        ),
        (
            "decode mass first 10 %",
            row.decode.first_10pct,
            f(&fx["decode_cumulative"]["first_10pct"]),
            tol_mass,
        ),
        ("Jaccard@100", row.jaccard_100, f(&fx["jaccard_prefill_vs_decode"]["K=100"]), tol_j),
        ("2nd-copy top-1", row.second_copy.top1, f(&fx["second_copy"]["top1_accuracy"]), tol_mass),
    ]
    .into_iter()
    .map(|(figure, rust, transformers, tolerance)| FixtureComparison {
        label: label.clone(),
        figure,
        rust,
        transformers,
        tolerance,
    })
    .collect()
}

/// Measures every premise passage of the plan and compares with the fixtures.
///
/// # Errors
/// Corpus and forward errors (fixture problems are recorded, not raised).
pub fn run(ctx: &mut Context) -> Result<PremiseStudy> {
    let mut study =
        PremiseStudy { rows: Vec::new(), fixture: Vec::new(), fixture_problems: Vec::new() };
    let dir = ctx.fixtures.join("premise");
    for (variant, n, plays) in ctx.plan.premise.clone() {
        for play in plays {
            let task = ctx.corpus.copy_task(play, n, variant)?;
            let row = measure(&ctx.model, &task)?;
            ctx.log(&format!(
                "premise {} {play} N={n}: prefill first-10% {:.3}, decode {:.3}, J@100 {:.3}, 2nd copy {:.3} ({:.0} s)",
                variant.name(),
                row.prefill.first_10pct,
                row.decode.first_10pct,
                row.jaccard_100,
                row.second_copy.top1,
                row.seconds
            ));
            match fixture_passage(&dir, variant, n, play) {
                Ok(fx) => {
                    let ids: Vec<u64> = task.passage.iter().map(|&x| u64::from(x)).collect();
                    if fx["passage_ids"]
                        .as_array()
                        .map(|a| a.iter().filter_map(Value::as_u64).collect::<Vec<_>>())
                        != Some(ids)
                    {
                        study.fixture_problems.push(format!(
                            "{} {play} N={n}: passage ids differ from the fixture's",
                            variant.name()
                        ));
                    }
                    study.fixture.extend(compare(&row, &fx));
                }
                Err(e) => study.fixture_problems.push(e.to_string()),
            }
            study.rows.push(row);
        }
    }
    Ok(study)
}

fn mean(rows: &[&Premise], f: impl Fn(&Premise) -> f64) -> f64 {
    rows.iter().map(|r| f(r)).sum::<f64>() / rows.len().max(1) as f64
}

/// Rows grouped by (variant, N), in plan order.
fn groups(s: &PremiseStudy) -> Vec<Vec<&Premise>> {
    let mut out: Vec<Vec<&Premise>> = Vec::new();
    for r in &s.rows {
        match out.iter_mut().find(|g| g[0].variant == r.variant && g[0].n == r.n) {
            Some(g) => g.push(r),
            None => out.push(vec![r]),
        }
    }
    out
}

fn table(s: &PremiseStudy) -> Table {
    let mut t = Table::new(
        "premise",
        "WnW premise (Figure 1 analogue), mean over plays: prefill vs decode-cumulative attention to the span",
        &[
            "variant, N",
            "plays",
            "prefill mass first 10 %",
            "decode-cum. mass first 10 %",
            "prefill / decode first half",
            "Jaccard@100 (random)",
            "Jaccard@500",
            "per-KV-head J@100 min–max",
            "2nd-copy top-1 / ppl",
            "1st-copy top-1",
        ],
    );
    for g in groups(s) {
        let heads: Vec<f64> =
            g.iter().flat_map(|r| r.per_head_jaccard_100.iter().flatten().copied()).collect();
        let j500: Vec<f64> = g.iter().filter_map(|r| r.jaccard_500).collect();
        t.row(vec![
            format!("{}, {}", g[0].variant, g[0].n),
            g.iter().map(|r| r.play.as_str()).collect::<Vec<_>>().join(", "),
            pct(mean(&g, |r| r.prefill.first_10pct), 1),
            pct(mean(&g, |r| r.decode.first_10pct), 1),
            format!(
                "{} / {}",
                pct(mean(&g, |r| r.prefill.first_half), 1),
                pct(mean(&g, |r| r.decode.first_half), 1)
            ),
            format!(
                "{} ({})",
                num(mean(&g, |r| r.jaccard_100), 3),
                num(mean(&g, |r| r.jaccard_random_100), 3)
            ),
            if j500.is_empty() {
                "—".into()
            } else {
                num(j500.iter().sum::<f64>() / j500.len() as f64, 3)
            },
            format!(
                "{}–{}",
                num(heads.iter().copied().fold(f64::INFINITY, f64::min), 2),
                num(heads.iter().copied().fold(0.0, f64::max), 2)
            ),
            format!(
                "{} / {}",
                pct(mean(&g, |r| r.second_copy.top1), 1),
                num(mean(&g, |r| r.second_copy.perplexity), 3)
            ),
            pct(mean(&g, |r| r.first_copy.top1), 1),
        ]);
    }
    t.note("`bare`: the passage starts at position 0, so the attention sink (position 0) lies inside the span. `chat`: the passage is wrapped in the chat template, the sink precedes the span (as in an audio-LLM prompt). One teacher-forced causal forward over prompt + second copy; attention averaged over all 30 layers and 9 q-heads, renormalised over the span; prefill query = last prompt position.");
    t
}

fn fixture_table(s: &PremiseStudy) -> Table {
    let mut t = Table::new(
        "premise_vs_transformers",
        "Premise figures: this Rust forward vs transformers (fixtures/premise)",
        &["passage", "figure", "Rust", "transformers", "|Δ| ≤"],
    );
    for c in &s.fixture {
        t.row(vec![
            c.label.clone(),
            c.figure.to_owned(),
            num(c.rust, 4),
            num(c.transformers, 4),
            num(c.tolerance, 2),
        ]);
    }
    for p in &s.fixture_problems {
        t.row(vec![p.clone(), "fixture problem".into()]);
    }
    t
}

/// Prefill and decode-cumulative mass per 5 % bin of the span.
type Histograms = (Vec<f64>, Vec<f64>);

fn plots(s: &PremiseStudy) -> (Plot, Plot) {
    let mut a = Plot::new(
        "fig1a_premise_per_position",
        "Attention mass per 5 % of the span (mean over plays)",
        "position in span (fraction)",
        "attention mass",
    );
    let mut b = Plot::new(
        "fig1b_premise_cumulative",
        "Cumulative attention mass over the span (mean over plays)",
        "position in span (fraction)",
        "cumulative mass",
    );
    for g in groups(s) {
        let hs: Vec<&Histograms> = g.iter().filter_map(|r| r.histogram_20.as_ref()).collect();
        if hs.is_empty() {
            continue;
        }
        let avg = |pick: fn(&Histograms) -> &Vec<f64>| -> Vec<f64> {
            (0..20).map(|i| hs.iter().map(|h| pick(h)[i]).sum::<f64>() / hs.len() as f64).collect()
        };
        for (name, bins) in [("prefill", avg(|h| &h.0)), ("decode-cumulative", avg(|h| &h.1))] {
            let label = format!("{name} ({}, N={})", g[0].variant, g[0].n);
            a = a.series(
                &label,
                bins.iter().enumerate().map(|(i, &m)| ((i as f64 + 0.5) / 20.0, m)).collect(),
            );
            let mut acc = 0.0;
            let cum = std::iter::once((0.0, 0.0)).chain(bins.iter().enumerate().map(|(i, &m)| {
                acc += m;
                ((i + 1) as f64 / 20.0, acc)
            }));
            b = b.series(&label, cum.collect());
        }
    }
    (a, b.reference("uniform at the midpoint", 0.5))
}

/// Adds the premise section.
pub fn section(s: &PremiseStudy, sec: &mut Section) {
    sec.table(table(s));
    let (a, b) = plots(s);
    sec.plot(a).plot(b);
    sec.table(fixture_table(s));
}

/// `|a − b| ≤ tol`, false when either side is NaN.
fn within_tolerance(a: f64, b: f64, tol: f64) -> bool {
    (a - b).abs() <= tol
}

/// The enforced agreement with transformers.
pub fn check(s: &PremiseStudy) -> Check {
    let bad: Vec<String> = s
        .fixture
        .iter()
        .filter(|c| !within_tolerance(c.rust, c.transformers, c.tolerance))
        .map(|c| format!("{} {}: {:.4} vs {:.4}", c.label, c.figure, c.rust, c.transformers))
        .chain(s.fixture_problems.iter().cloned())
        .collect();
    let worst = s.fixture.iter().map(|c| (c.rust - c.transformers).abs()).fold(0.0, f64::max);
    Check::new(
        "premise figures match transformers (fixtures/premise)",
        bad.is_empty() && !s.fixture.is_empty(),
        if bad.is_empty() {
            format!("{} figures compared, largest |Δ| {worst:.4}", s.fixture.len())
        } else {
            bad.join("; ")
        },
    )
}

/// The paper's premise claims, evaluated per (variant, N).
pub fn findings(s: &PremiseStudy) -> Vec<Finding> {
    let mut out = Vec::new();
    for g in groups(s) {
        let (p, d) = (mean(&g, |r| r.prefill.first_10pct), mean(&g, |r| r.decode.first_10pct));
        let (j, rnd) = (mean(&g, |r| r.jaccard_100), mean(&g, |r| r.jaccard_random_100));
        let tag = format!("{}, N={}", g[0].variant, g[0].n);
        out.push(Finding::new(
            &format!("premise-sink-{}-{}", g[0].variant, g[0].n),
            &format!("Prefill puts clearly more mass on the span's first 10 % than decode-cumulative ({tag}; ≥ 1.5×)"),
            p >= 1.5 * d,
            format!("prefill {} vs decode {}", pct(p, 1), pct(d, 1)),
        ));
        out.push(Finding::new(
            &format!("premise-jaccard-{}-{}", g[0].variant, g[0].n),
            &format!("Top-100 rankings overlap weakly: Jaccard@100 < 0.5 yet above random ({tag})"),
            j < 0.5 && j > rnd,
            format!("Jaccard@100 {} (random {})", num(j, 3), num(rnd, 3)),
        ));
    }
    out
}
