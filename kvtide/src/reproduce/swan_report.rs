//! Tables, plots and findings of the SWAN study (`papers/swan.txt` Table 1–3, Figure 2(b)
//! by analogy: perplexity instead of task accuracy, against the measured memory ratio).

use super::findings::Finding;
use super::frontier::Code;
use super::grid::{SwanGroup, SwanRun};
use super::memory::retained_k;
use super::plot::Plot;
use super::report::{Section, Table, num, pct};
use super::swan_study::{SwanResult, SwanStudy};

fn delta(r: &SwanResult, base: f64) -> String {
    pct(r.perplexity / base - 1.0, 1)
}

fn k_cell(run: &SwanRun) -> String {
    match (run.k_key, run.k_value) {
        (Some(a), Some(b)) if a == b => a.to_string(),
        (Some(a), Some(b)) => format!("{a}/{b}"),
        _ => "—".into(),
    }
}

fn main_table(s: &SwanStudy, base: f64) -> Table {
    let mut t = Table::new(
        "swan_main",
        "SWAN main grid (calibrated basis): perplexity through the decode path vs KV memory",
        &[
            "values",
            "buffer b",
            "k (of d_h)",
            "retention k/d (16-bit pair)",
            "KV memory / dense f16",
            "perplexity",
            "Δ vs dense f16",
            "top-1",
            "cache ms/token",
            "ms/token",
        ],
    );
    let mut rows: Vec<&SwanResult> = s
        .results
        .iter()
        .filter(|r| matches!(r.run.group, SwanGroup::Baseline | SwanGroup::Main))
        .collect();
    rows.sort_by(|a, b| {
        let key = |r: &SwanResult| {
            (r.run.group != SwanGroup::Baseline, r.run.values.to_string(), r.run.buffer)
        };
        key(a).cmp(&key(b)).then(b.run.retention.total_cmp(&a.run.retention))
    });
    for r in rows {
        t.row(vec![
            r.run.values.to_string(),
            if r.run.k_key.is_some() { r.run.buffer.to_string() } else { "—".into() },
            k_cell(&r.run),
            num(r.run.retention, 2),
            num(r.memory_ratio, 3),
            num(r.perplexity, 3),
            delta(r, base),
            pct(r.top1, 1),
            r.attention_ms_per_token.map_or_else(|| "—".into(), |x| num(x, 2)),
            num(r.ms_per_token, 1),
        ]);
    }
    t.note(format!(
        "{} windows × {} tokens of `{}` (first {} tokens prefilled, the rest fed one by one through the decode path): {} scored tokens per row. Configurations served by the same model weights (same absorbed basis) decode together, one libtorch matmul per layer for the batch; cache ms/token is the time inside the cache alone (append + attention), ms/token adds an equal share of the batched model step. fp8 rows keep k' = ⌊3k/2⌋ so a row costs no more than the 16-bit row it is paired with (2k'+2 ≤ 3k+2). Memory = bytes the cache holds at the end of a window (sparse rows + offsets + block headers + dense buffer) over a dense f16 cache of the same tokens.",
        s.windows.0,
        s.windows.1,
        s.eval_play,
        s.windows.2,
        s.results.first().map_or(0, |r| r.tokens)
    ));
    t
}

fn group_table(
    s: &SwanStudy,
    group: SwanGroup,
    name: &str,
    title: &str,
    first: &str,
    cell: fn(&SwanRun, usize) -> String,
) -> Table {
    let half = half_point(s.head_dim, "calibrated");
    let calibrated = ppl(s, &half);
    let mut t = Table::new(
        name,
        title,
        &[
            first,
            "k (key/value)",
            "KV memory / dense f16",
            "perplexity",
            "Δ vs calibrated",
            "top-1",
        ],
    );
    // The shared point (calibrated, k = d/2, f16, b = 0) ran once, under the group listing it first.
    for r in s.results.iter().filter(|r| r.run.group == group || half(&r.run)) {
        t.row(vec![
            cell(&r.run, s.head_dim),
            k_cell(&r.run),
            num(r.memory_ratio, 3),
            num(r.perplexity, 3),
            delta(r, calibrated),
            pct(r.top1, 1),
        ]);
    }
    t
}

fn plot(s: &SwanStudy, base: f64) -> Plot {
    let mut p = Plot::new(
        "swan_ppl_vs_memory",
        &format!("SWAN on {}: perplexity vs KV memory (calibrated basis)", s.model),
        "KV memory / dense f16 cache",
        "perplexity (decode path)",
    )
    .reference("dense f16", base);
    let mut max = base;
    for values in [Code::F16, Code::Fp8] {
        for b in [0, 64, 128] {
            let mut pts: Vec<(f64, f64)> = s
                .results
                .iter()
                .filter(|r| {
                    r.run.group == SwanGroup::Main && r.run.values == values && r.run.buffer == b
                })
                .map(|r| (r.memory_ratio, r.perplexity))
                .collect();
            pts.sort_by(|a, b| a.0.total_cmp(&b.0));
            max = pts.iter().fold(max, |m, p| m.max(p.1));
            if !pts.is_empty() {
                let label = if values == Code::F16 { "16-bit" } else { "fp8 (equal budget)" };
                p = p.series(&format!("{label}, b={b}"), pts);
            }
        }
    }
    p.log_y(max / base > 4.0)
}

/// Adds the SWAN section (tables, the plot, calibration notes) to the report.
pub fn section(s: &SwanStudy, sec: &mut Section) {
    let base = s.dense_f16().map_or(f64::NAN, |r| r.perplexity);
    sec.text(format!(
        "Projections calibrated on {} ({} windows, {} tokens, {:.0} s; largest |key| {:.1}, |value| {:.2} — inside fp8 E4M3's ±448, so fp8 rows are stored unscaled). Perplexity evaluated on `{}` (disjoint).",
        s.calibration_plays.join(", "),
        s.calibration.windows,
        s.calibration.tokens,
        s.calibration.seconds,
        s.calibration.max_abs_key,
        s.calibration.max_abs_value,
        s.eval_play
    ));
    if let Some(l) = s.local {
        sec.text(format!(
            "{} has {} sliding-window layers of {} positions: their caches stay dense f16 rings in every configuration, which apply to its {} global layers; KV memory counts both, so it cannot fall below the rings' share.",
            s.model, l.layers, l.window, l.global_layers
        ));
    }
    sec.table(main_table(s, base));
    sec.plot(plot(s, base));
    sec.table(group_table(
        s,
        SwanGroup::Projection,
        "swan_projection",
        "Projection ablation (SWAN Table 3) at k/d = 0.5, f16 values, b = 0",
        "basis",
        |r, _| r.basis.clone(),
    ));
    sec.table(group_table(
        s,
        SwanGroup::KvSplit,
        "swan_kv_split",
        "Key/value budget split (SWAN Table 2) at b = 0, f16 values, calibrated basis",
        "k_key/d : k_value/d",
        |r, d| {
            format!(
                "{:.2} : {:.2}",
                r.k_key.unwrap_or(0) as f64 / d as f64,
                r.k_value.unwrap_or(0) as f64 / d as f64
            )
        },
    ));
    let l = &s.lossless;
    sec.text(format!(
        "Lossless check: SWAN with k = d_h, f32 values and buffer (random orthogonal basis) vs dense f32 over the same tokens: max |ΔNLL| = {:.2e} nats, same arg-max correctness at {} of positions, perplexity differs by {:.2e} (relative).",
        l.max_abs_nll_diff,
        pct(l.same_hit_rate, 2),
        l.ppl_rel_diff
    ));
}

/// The ablations' shared operating point: `k = d/2` keys and values, f16, `b = 0`, `basis`.
fn half_point(head_dim: usize, basis: &'static str) -> impl Fn(&SwanRun) -> bool {
    let k = Some(retained_k(0.5, head_dim));
    move |r: &SwanRun| {
        r.k_key == k && r.k_value == k && r.buffer == 0 && r.values == Code::F16 && r.basis == basis
    }
}

fn ppl(s: &SwanStudy, f: impl Fn(&SwanRun) -> bool) -> f64 {
    s.find(f).map_or(f64::NAN, |r| r.perplexity)
}

/// The paper's SWAN findings, evaluated on this run.
pub fn findings(s: &SwanStudy) -> Vec<Finding> {
    let base = s.dense_f16().map_or(f64::NAN, |r| r.perplexity);
    let main = |v: Code, r: f64, b: usize| {
        move |x: &SwanRun| {
            x.group == SwanGroup::Main
                && x.values == v
                && (x.retention - r).abs() < 1e-9
                && x.buffer == b
        }
    };
    let proj = |name: &'static str| half_point(s.head_dim, name);
    let mut out = Vec::new();
    let full16 = ppl(s, main(Code::F16, 1.0, 0));
    out.push(Finding::new(
        "swan-lossless",
        "Lossless at k = d_h (f32: identical to dense f32; 16-bit: within 1 % of dense f16)",
        s.lossless.max_abs_nll_diff <= 5e-3 && (full16 / base - 1.0).abs() <= 0.01,
        format!(
            "f32 max |ΔNLL| {:.1e}; f16 k = {} ppl {} vs dense {}",
            s.lossless.max_abs_nll_diff,
            s.head_dim,
            num(full16, 3),
            num(base, 3)
        ),
    ));
    let (cal, rnd, id) =
        (ppl(s, proj("calibrated")), ppl(s, proj("random:7")), ppl(s, proj("identity")));
    out.push(Finding::new(
        "swan-calibrated-beats-generic",
        "Calibrated basis beats random and identity at k/d = 0.5",
        cal < rnd && cal < id,
        format!(
            "ppl calibrated {} vs random {} vs identity {}",
            num(cal, 3),
            num(rnd, 3),
            num(id, 3)
        ),
    ));
    let shuffles: Vec<f64> = ["layer-shuffle:7", "head-shuffle:7", "kv-shuffle"]
        .iter()
        .map(|b| ppl(s, proj(b)))
        .filter(|x| x.is_finite())
        .collect();
    if !shuffles.is_empty() {
        out.push(Finding::new(
            "swan-calibrated-beats-shuffles",
            "Calibrated basis beats every shuffled basis (layer, head, KV)",
            shuffles.iter().all(|&x| cal < x),
            format!(
                "calibrated {} vs shuffles {}",
                num(cal, 3),
                shuffles.iter().map(|x| num(*x, 3)).collect::<Vec<_>>().join(", ")
            ),
        ));
    }
    let gain = |r: f64| {
        ppl(s, main(Code::F16, r, 0))
            - ppl(s, main(Code::F16, r, 128)).min(ppl(s, main(Code::F16, r, 64)))
    };
    let (tight, loose) = (gain(0.3), gain(0.75));
    if tight.is_finite() && loose.is_finite() {
        out.push(Finding::new(
            "swan-buffer-matters-most-when-tight",
            "The dense buffer helps most at high compression (16-bit: ppl gain of b > 0 over b = 0 larger at k/d 0.3 than 0.75)",
            tight > loose,
            format!("gain at 0.3: {}; at 0.75: {}", num(tight, 3), num(loose, 3)),
        ));
    }
    for b in [0, 64, 128] {
        let (t16, t8, l16, l8) = (
            ppl(s, main(Code::F16, 0.3, b)),
            ppl(s, main(Code::Fp8, 0.3, b)),
            ppl(s, main(Code::F16, 1.0, b)),
            ppl(s, main(Code::Fp8, 1.0, b)),
        );
        if [t16, t8, l16, l8].iter().all(|x| x.is_finite()) {
            out.push(Finding::new(
                &format!("swan-fp8-crossover-b{b}"),
                &format!("fp8 overtakes 16-bit at a tight equal budget (b = {b}: fp8 better at k/d 0.3, 16-bit no worse at 1.0)"),
                t8 < t16 && l16 <= l8 * 1.001,
                format!("k/d 0.3: fp8 {} vs 16-bit {}; k/d 1.0: fp8 {} vs 16-bit {}", num(t8, 3), num(t16, 3), num(l8, 3), num(l16, 3)),
            ));
        }
    }
    out
}
