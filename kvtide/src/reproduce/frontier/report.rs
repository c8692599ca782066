//! The frontier study's report: the budget tables, the equal-footing table, the peer-gap and
//! rotation-draw tables and the paired ablations.

use super::*;

/// Best dense and best SWAN at or under one budget.
#[derive(Clone, Debug, Serialize)]
pub struct BudgetRow {
    /// Budget × dense f16.
    pub budget: f64,
    /// `window`, `4096` or (windowed models) `4096 global`.
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

/// Budgets of the equal-footing table (× dense f16 per token of a 4096-token cache).
pub const EQUAL_BUDGETS: [f64; 9] = [0.12, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.55];

/// The families the equal-footing table compares, in its column order.
pub const FAMILIES: [Family; 4] = [Family::Dense, Family::Kivi, Family::Turbo, Family::Swan];

/// A family's best configuration under a budget: (label, bytes / f16, perplexity).
pub type Best = (String, f64, f64);

/// The best configuration of each family at or under one budget, every one with the same
/// recent-token buffer `b`, and the gap between SWAN's best and the best of the other
/// families with its jackknife standard error over the windows.
#[derive(Clone, Debug, Serialize)]
pub struct EqualFootingRow {
    /// The buffer every configuration of the row keeps (`b`).
    pub buffer: usize,
    /// Budget × dense f16 (per token of a 4096-token cache; the global layers alone on a
    /// sliding-window model, whose rings are f16 in every configuration).
    pub budget: f64,
    /// Per family of [`FAMILIES`]: its best configuration (label, ratio, perplexity), if one
    /// fits the budget.
    pub best: Vec<(Family, Option<Best>)>,
    /// The best configuration of the families other than SWAN.
    pub other: Option<String>,
    /// SWAN's cost over dense f16 minus the best other configuration's (fraction of dense
    /// f16's perplexity; negative: SWAN better) and its leave-one-window-out jackknife
    /// standard error, when both were measured in this run on at least two windows.
    pub gap: Option<(f64, f64)>,
}

impl EqualFootingRow {
    /// Whether the gap is resolved (more than two standard errors from zero).
    pub fn resolved(&self) -> Option<bool> {
        self.gap.map(|(g, se)| g.abs() > 2.0 * se)
    }

    /// The best configuration of `family`.
    pub fn of(&self, family: Family) -> Option<&Best> {
        self.best.iter().find(|(f, _)| *f == family).and_then(|(_, b)| b.as_ref())
    }
}

/// Whether `run` belongs to the equal-footing `family`: dense means the plain quantized
/// rows ([`FrontierRun::is_plain_quantized`]).
pub(super) fn in_family(run: &FrontierRun, family: Family) -> bool {
    match family {
        Family::Dense => run.is_plain_quantized(),
        Family::Swan => run.k.is_some(),
        other => run.family == other,
    }
}

/// The equal-footing rows of `points`: per buffer SWAN and another family were run at and per
/// budget, each family's lowest perplexity at or under it.
pub(super) fn equal_footing_rows(points: &[FrontierPoint], windowed: bool) -> Vec<EqualFootingRow> {
    let ratio = |p: &FrontierPoint| match windowed {
        true => p.global_long_ratio.unwrap_or(f64::INFINITY),
        false => p.long_ratio,
    };
    let f16 = points.iter().find(|p| p.run == FrontierRun::dense(Code::F16, None));
    let mut buffers: Vec<usize> = points.iter().map(|p| p.run.buffer).collect();
    buffers.sort_unstable();
    buffers.dedup();
    let mut out = Vec::new();
    for b in buffers {
        let at = |family: Family| {
            points.iter().filter(move |p| p.run.buffer == b && in_family(&p.run, family))
        };
        if at(Family::Swan).next().is_none()
            || FAMILIES[..3].iter().all(|&f| at(f).next().is_none())
        {
            continue;
        }
        for budget in EQUAL_BUDGETS {
            let best = |family: Family| {
                at(family)
                    .filter(|p| ratio(p) <= budget)
                    .min_by(|a, b| a.perplexity.total_cmp(&b.perplexity))
            };
            let swan = best(Family::Swan);
            let other = FAMILIES[..3]
                .iter()
                .filter_map(|&f| best(f))
                .min_by(|a, b| a.perplexity.total_cmp(&b.perplexity));
            let gap = match (swan, other, f16) {
                (Some(w), Some(o), Some(f)) => frontier_peer::peer_gap(
                    &w.window_nll,
                    &f.window_nll,
                    &o.window_nll,
                    &f.window_nll,
                )
                .map(|g| (g.gap, g.se)),
                _ => None,
            };
            let cell =
                |p: Option<&FrontierPoint>| p.map(|p| (p.label.clone(), ratio(p), p.perplexity));
            out.push(EqualFootingRow {
                buffer: b,
                budget,
                best: FAMILIES.iter().map(|&f| (f, cell(best(f)))).collect(),
                other: other.map(|p| p.label.clone()),
                gap,
            });
        }
    }
    out
}

/// The equal-footing table: per buffer and budget, the best configuration of each family and
/// the gap between SWAN's best and the best other one with its standard error.
pub(super) fn equal_footing_table(s: &FrontierStudy, leg: &Leg, base: f64, out: &mut Section) {
    if s.equal_footing.is_empty() {
        return;
    }
    let measure = if s.local.is_some() { "global layers, 4096" } else { "4096" };
    let headers = [
        "b",
        "budget × f16",
        "best dense int8/int4",
        "best KIVI",
        "best TurboQuant-style",
        "best SWAN",
        "SWAN − best other",
        "resolved (> 2 SE)",
    ];
    let mut t = Table::new(
        &leg.name("frontier_equal_footing"),
        &format!("Equal footing: the best of each family at the same buffer ({measure})"),
        &headers,
    );
    let cell = |c: Option<&(String, f64, f64)>| match c {
        Some((label, ratio, ppl)) => {
            format!("{label} ({}; {})", num(*ratio, 3), pct(ppl / base - 1.0, 2))
        }
        None => "—".to_owned(),
    };
    for r in &s.equal_footing {
        let (gap, resolved) = match (r.gap, r.resolved()) {
            (Some((g, se)), Some(res)) => {
                let who = if g < 0.0 { "SWAN" } else { "other" };
                (
                    format!("{:+.2} ± {:.2} pp", 100.0 * g, 100.0 * se),
                    if res { format!("yes: {who} better") } else { "no".to_owned() },
                )
            }
            _ => ("—".to_owned(), "—".to_owned()),
        };
        let mut row = vec![r.buffer.to_string(), num(r.budget, 2)];
        row.extend(FAMILIES.iter().map(|&f| cell(r.of(f))));
        row.extend([gap, resolved]);
        t.row(row);
    }
    let (count, ..) = s.windows;
    t.note(format!(
        "Each cell: the family's lowest perplexity at or under the budget (bytes / f16; Δ vs f16). Every configuration of a row keeps the same b newest positions in f16 and no sink; bytes count everything held, the buffer amortized over a {LONG_CACHE}-token cache. The gap is SWAN's cost over dense f16 minus the best other configuration's, in points of dense f16's perplexity, with its leave-one-window-out jackknife standard error over the {count} windows (both measured on the same windows)."
    ));
    out.table(t);
}

/// The resolution of the external check: each of llama.cpp's quantized KV types against its
/// counterpart, with the gap's jackknife standard error over the windows, and the costs of
/// every window alone (absent when either tool gave no per-window figures).
pub(super) fn peer_gap_tables(s: &FrontierStudy, leg: &Leg, out: &mut Section) {
    let draws =
        s.points.iter().filter(|p| p.run.is_rotation_draw()).map(|p| ("q4_0", p.run.label()));
    let gaps: Vec<(&str, String, PeerGap)> = LLAMACPP_COUNTERPARTS
        .iter()
        .filter(|(ty, _)| *ty != "f16")
        .map(|&(ty, label)| (ty, label.to_owned()))
        .chain(draws)
        .filter_map(|(ty, label)| {
            let gap = s.peer_gap(ty, &label)?;
            Some((ty, label, gap))
        })
        .collect();
    if gaps.is_empty() {
        return;
    }
    let n = s.windows.0;
    let pp = |x: f64| format!("{:+.2}", 100.0 * x);
    let mut g = Table::new(
        &leg.name("frontier_peer_gaps"),
        &format!("The peer gaps and their resolution over the {n} windows (llama.cpp's condition)"),
        &[
            "llama.cpp KV",
            "kvtide counterpart",
            "kvtide vs f16",
            "llama.cpp vs f16",
            "gap (pp)",
            "jackknife SE (pp)",
            "one window's gap (pp): min … max",
            "windows where kvtide costs more",
        ],
    );
    for (ty, label, p) in &gaps {
        let (lo, hi) = p.window_gaps().fold((f64::MAX, f64::MIN), |(a, b), x| (a.min(x), b.max(x)));
        g.row(vec![
            (*ty).to_owned(),
            label.clone(),
            pct(p.kvtide, 2),
            pct(p.llamacpp, 2),
            pp(p.gap),
            format!("{:.2}", 100.0 * p.se),
            format!("{} … {}", pp(lo), pp(hi)),
            format!("{} of {n}", p.window_gaps().filter(|x| *x > 0.0).count()),
        ]);
    }
    g.note("Both tools score the same positions of the same windows; a cost is exp(mean NLL − mean NLL of its own f16) − 1. The jackknife leaves one window out at a time: a gap within about two standard errors of zero is not resolved by these windows. Rows `rotate=random:SEED` (`--frontier-rotation-draws`) are int4 in seeded random orthogonal bases, none better than another in expectation: their spread is what one rounding draw of the positions every window shares (the attention sink above all) moves a 4-bit cost by, which the jackknife over windows cannot see. Rows `rotate=hadamard-signs:SEED` are int4 in the Walsh–Hadamard matrices with seeded random row signs: the plain matrix's structure, another sign pattern. Rows `rotate=hadamard-value-signs:SEED` keep the plain Hadamard on q/k and sign-randomize the v/o blocks: the keys llama.cpp's rotation stores, another rounding of every 4-bit value row (and through it of every later layer's keys) — the kind of change llama.cpp's own value types make. Rows `rotate=hadamard-jitter:SEED` are the plain matrices turned by 1e-5 rad in random planes: every stored coordinate moved by rounding-sized amounts, so their spread is how far float-rounding differences alone move the cost.");
    out.table(g);
    let mut w = Table::new(
        &leg.name("frontier_peer_windows"),
        "Each window alone: costs over each tool's own f16 (llama.cpp's condition)",
        &[
            "window",
            "llama.cpp KV",
            "kvtide counterpart",
            "kvtide vs f16",
            "llama.cpp vs f16",
            "gap (pp)",
        ],
    );
    for i in 0..n {
        for (ty, label, p) in &gaps {
            let Some(&(k, l)) = p.windows.get(i) else { continue };
            w.row(vec![
                (i + 1).to_string(),
                (*ty).to_owned(),
                label.clone(),
                pct(k, 2),
                pct(l, 2),
                pp(k - l),
            ]);
        }
    }
    out.table(w);
}

/// The spread of the int4 rotation draws' costs under llama.cpp's condition.
pub(super) struct DrawSpread {
    pub(super) n: usize,
    pub(super) lo: f64,
    pub(super) hi: f64,
    pub(super) median: f64,
}

/// [`DrawSpread`] of the study's rotation draws of `family` measured whole-window (`None`
/// without any).
pub(super) fn rotation_draw_spread(s: &FrontierStudy, family: DrawFamily) -> Option<DrawSpread> {
    let mut costs: Vec<f64> = s
        .points
        .iter()
        .filter(|p| p.run.rotation_draw() == Some(family))
        .filter_map(|p| s.whole_window_cost(&p.run.label()))
        .collect();
    if costs.is_empty() {
        return None;
    }
    costs.sort_by(f64::total_cmp);
    let n = costs.len();
    let median = if n % 2 == 1 { costs[n / 2] } else { (costs[n / 2 - 1] + costs[n / 2]) / 2.0 };
    Some(DrawSpread { n, lo: costs[0], hi: costs[n - 1], median })
}

/// The grid label of llama.cpp KV type `ty`'s counterpart.
pub(super) fn counterpart(ty: &str) -> Option<&'static str> {
    LLAMACPP_COUNTERPARTS.iter().find(|(t, _)| *t == ty).map(|(_, l)| *l)
}

pub(super) fn mark_frontier(
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

/// One way of counting a point's bytes (over dense f16).
pub(super) type Ratio = dyn Fn(&FrontierPoint) -> f64;

pub(super) fn budget_rows(points: &[FrontierPoint], windowed: bool) -> Vec<BudgetRow> {
    let best = |family: Family, ratio: &dyn Fn(&FrontierPoint) -> f64, budget: f64| {
        points
            .iter()
            .filter(|p| p.run.family == family && ratio(p) <= budget)
            .min_by(|a, b| a.perplexity.total_cmp(&b.perplexity))
            .map(|p| (p.label.clone(), ratio(p), p.perplexity))
    };
    let mut out = Vec::new();
    let mut measures: Vec<(&'static str, &Ratio)> = vec![
        ("window", &|p: &FrontierPoint| p.window_ratio),
        ("4096", &|p: &FrontierPoint| p.long_ratio),
    ];
    if windowed {
        measures.push(("4096 global", &|p: &FrontierPoint| {
            p.global_long_ratio.unwrap_or(f64::INFINITY)
        }));
    }
    for (measure, ratio) in measures {
        for budget in BUDGETS {
            out.push(BudgetRow {
                budget,
                measure,
                dense: best(Family::Dense, ratio, budget),
                swan: best(Family::Swan, ratio, budget),
            });
        }
    }
    out
}

/// Where reused figures came from, how far each file's dense rows lie from this run's, and
/// what `--frontier-reuse-only` left out.
pub(super) fn reuse_text(s: &FrontierStudy, out: &mut Section) {
    if s.reused.is_empty() {
        return;
    }
    let reused = s.points.iter().filter(|p| p.reused_from.is_some()).count();
    out.text(format!(
        "{reused} of the {} SWAN configurations take their figures from earlier runs of this \
         study on the same model, play and windows (`--frontier-reuse`; each point's \
         `reused_from` in results.json names its file); the dense rows ran again here, and \
         dense f16 agreed with every file within {:e} (relative). Quantized rows do not repeat \
         exactly across runs (libtorch's batched products sum in an order that depends on the \
         configurations sharing a batch; a rounding flip in a code moves a perplexity): the \
         largest difference of each file's dense rows from this run's is its spread.",
        s.points.iter().filter(|p| p.run.k.is_some()).count(),
        crate::reproduce::frontier_reuse::DENSE_F16_AGREEMENT,
    ));
    let mut lines = Vec::new();
    for r in &s.reused {
        let spread =
            r.dense_spread.as_ref().map_or("no dense row in common".to_owned(), |(l, x)| {
                format!("dense rows within {} ({l})", pct(x.abs(), 3))
            });
        let when = r.unix_start.map_or(String::new(), |t| format!(", started at Unix time {t}"));
        lines.push(format!(
            "* `{}`: {} configurations; written by `{}`{when}; {spread}.",
            r.file, r.configurations, r.command
        ));
    }
    out.text(lines.join("\n"));
    if !s.not_run.is_empty() {
        out.text(format!(
            "{} SWAN configurations of the plan were measured by no file and left out \
             (`--frontier-reuse-only`): {}.",
            s.not_run.len(),
            s.not_run.join("; ")
        ));
    }
}

pub(super) fn cell(x: &Option<(String, f64, f64)>, base: f64) -> [String; 3] {
    match x {
        Some((l, r, p)) => {
            [l.clone(), num(*r, 3), format!("{} ({})", num(*p, 3), pct(p / base - 1.0, 2))]
        }
        None => ["—".into(), "—".into(), "—".into()],
    }
}

/// The tables and plot of one leg of the study (`leg` names them).
pub fn section(s: &FrontierStudy, leg: &Leg, out: &mut Section) {
    let base = s.dense_f16().map_or(f64::NAN, |p| p.perplexity);
    let (count, len, prefix) = s.windows;
    out.text(format!(
        "Model: {}. {count} window(s) of {len} tokens of {}, {prefix} prefilled, the rest scored through the decode path; d_h = {}. Bytes count everything a cache holds (buffer, indices or masks, offsets, scales, block headers): at the end of each window, and per token of a {LONG_CACHE}-token cache from the formulas. ★ marks a non-dominated point.",
        s.model, s.eval_play, s.head_dim
    ));
    if let Some(r) = &s.restricted {
        out.text(format!(
            "{r} (the run's choice: the plan's other SWAN configurations were not run)."
        ));
    }
    reuse_text(s, out);
    if let Some(l) = s.local {
        out.text(format!(
            "Sliding-window model: the cache named serves the {} global layers; each of the {} local layers keeps a dense ring of its last {} positions — in a dense configuration's own format (a quantized format quantizes every layer, rotated like the global ones, as llama.cpp's `-ctk/-ctv` does), f16 for a SWAN configuration (its buffer format) unless its label says `ring=int8` (`q8_0` rows, keys in the SWAN basis) or `ring=int4 ring_rotate=hadamard-v` (`q4_0` rows, values in 64-wide Walsh–Hadamard blocks, keys unrotated) or `ring=int8 ring_values=int4 ring_rotate=hadamard-v` (`q8_0` key rows unrotated, `q4_0` value rows in Walsh–Hadamard blocks). The budgets `window` and `4096` count both (ring bytes included), over dense f16 of the same windowed model (every layer dense f16); `4096 global` counts the global layers alone. With f16 rings a {LONG_CACHE}-token cache is at least {} × f16 whatever the global layers hold.",
            l.global_layers,
            l.layers,
            l.window,
            num(
                (l.layers * l.window) as f64 / (l.layers * l.window + l.global_layers * LONG_CACHE) as f64,
                3
            )
        ));
    }
    let mut headers = vec!["configuration", "bytes / f16 (window)", "bytes / f16 (4096)"];
    if s.local.is_some() {
        headers.push("bytes / f16 (4096, global layers)");
    }
    headers.extend(["perplexity", "Δ vs f16", "top-1", "frontier (window / 4096)"]);
    let mut t = Table::new(
        &leg.name("frontier_points"),
        "Perplexity vs KV bytes: dense quantized formats and SWAN encodings",
        &headers,
    );
    let mut pts: Vec<&FrontierPoint> = s.points.iter().collect();
    pts.sort_by(|a, b| a.long_ratio.total_cmp(&b.long_ratio));
    for p in pts {
        let star = |f: bool| if f { "★" } else { "" };
        let mut row = vec![p.label.clone(), num(p.window_ratio, 3), num(p.long_ratio, 3)];
        if let Some(g) = p.global_long_ratio {
            row.push(num(g, 3));
        }
        row.extend([
            num(p.perplexity, 3),
            pct(p.perplexity / base - 1.0, 2),
            pct(p.top1, 1),
            format!("{} / {}", star(p.frontier_window), star(p.frontier_long)),
        ]);
        t.row(row);
    }
    out.table(t);
    equal_footing_table(s, leg, base, out);
    let mut b = Table::new(
        &leg.name("frontier_budgets"),
        "Best dense quantized vs best SWAN at or under each budget, each at whichever buffer it does best with",
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
    key_selection_table(s, leg, base, out);
    component_norm_table(s, leg, base, out);
    let mut e = Table::new(
        &leg.name("frontier_external"),
        "External check: llama.cpp's perplexity tool on the same text (F32 weights)",
        &[
            "KV cache",
            "perplexity",
            "vs its f16",
            "kvtide counterpart",
            "kvtide vs f16 (half prefilled)",
            "kvtide vs f16 (whole window through the cache)",
        ],
    );
    let f16 = s.external.rows.iter().find(|(t, _)| t == "f16").map(|r| r.1);
    for (ty, ppl) in &s.external.rows {
        let label = counterpart(ty);
        let ours = label.and_then(|l| s.find(l));
        let whole = label.and_then(|l| s.whole_window_cost(l));
        e.row(vec![
            ty.clone(),
            num(*ppl, 4),
            f16.map_or("—".into(), |f| pct(ppl / f - 1.0, 2)),
            ours.map_or("—".into(), |p| p.label.clone()),
            ours.map_or("—".into(), |p| pct(p.perplexity / base - 1.0, 2)),
            whole.map_or("—".into(), |c| pct(c, 2)),
        ]);
    }
    if s.external.rows.is_empty() {
        let mut row = vec!["—".to_owned(); 6];
        row[1] = s.external.status.clone();
        e.row(row);
    }
    if !s.whole_window.is_empty() {
        e.note(format!(
            "Half prefilled: the grid's own condition ({} positions prefilled exactly, K/V stored in the format, the rest scored). Whole window through the cache: llama.cpp's condition — every position, the first (BOS) included, goes through the decode path and the cache under test, attending to its own stored row, so the first half's hidden states (the attention sink's too) carry the format's error; scored on llama.cpp's positions ({} … {}).",
            s.windows.2,
            s.windows.1 / 2 + 1,
            s.windows.1 - 1,
        ));
    }
    if let (Some(f16), Some(same)) = (f16, s.dense_f16_llamacpp_positions) {
        e.note(format!(
            "Dense f16 KV on llama.cpp's own scored positions ({} … {} of each window): kvtide {} vs llama.cpp {} ({} relative to llama.cpp).",
            s.windows.1 / 2 + 1,
            s.windows.1 - 1,
            num(same, 4),
            num(f16, 4),
            pct(same / f16 - 1.0, 2),
        ));
    }
    if let (Some(f16), Some(ours)) = (f16, s.dense_f16()) {
        e.note(format!(
            "Dense f16 KV, kvtide vs llama.cpp on the same windows: {} vs {} ({} relative to llama.cpp). llama.cpp scores the second half of each window but its first token ({} predictions per window), kvtide every token after the {} prefilled ({}).",
            num(ours.perplexity, 4),
            num(f16, 4),
            pct(ours.perplexity / f16 - 1.0, 2),
            s.windows.1 - s.windows.1 / 2 - 1,
            s.windows.2,
            s.windows.1 - s.windows.2,
        ));
    }
    out.table(e);
    peer_gap_tables(s, leg, out);
    // One line per SWAN encoding along k, and one per dense rotation across the formats.
    let line = |keep: &dyn Fn(&FrontierRun) -> bool| -> Vec<(f64, f64)> {
        let mut v: Vec<(f64, f64)> = s
            .points
            .iter()
            .filter(|p| keep(&p.run) && p.run.queries == attn_kernels::QueryPrecision::F32)
            .map(|p| (p.long_ratio, p.perplexity))
            .collect();
        v.sort_by(|a, b| a.0.total_cmp(&b.0));
        v
    };
    let mut plot = Plot::new(
        &leg.name("frontier_ppl_vs_bytes"),
        &if leg.tag.is_empty() {
            "Perplexity vs KV bytes (4096-token cache)".to_owned()
        } else {
            format!("{}: perplexity vs KV bytes (4096-token cache)", leg.title)
        },
        "KV bytes / dense f16",
        "perplexity",
    );
    let mut rotations: Vec<(Option<projection::BasisKind>, usize)> = Vec::new();
    // One line per SWAN encoding, key/value split or not, and ring format.
    type Encoding = (
        Option<models::cache::SwanIndex>,
        Code,
        bool,
        String,
        models::cache::KeySelect,
        models::cache::ComponentNorm,
    );
    let mut encodings: Vec<Encoding> = Vec::new();
    for p in &s.points {
        match p.run.k {
            None if p.run.family == Family::Dense
                && p.run.values != Code::F16
                && !rotations.contains(&(p.run.rotate, p.run.buffer)) =>
            {
                rotations.push((p.run.rotate, p.run.buffer));
            }
            Some(_) => {
                let r = &p.run;
                let e = (
                    r.index,
                    r.values,
                    r.kv.is_some(),
                    r.ring_formats(),
                    r.select_rule(),
                    r.norm_rule(),
                );
                if !encodings.contains(&e) {
                    encodings.push(e);
                }
            }
            _ => {}
        }
    }
    for (r, b) in rotations {
        let points = line(&|run| {
            run.family == Family::Dense
                && run.values != Code::F16
                && run.rotate == r
                && run.buffer == b
        });
        let buffered = if b > 0 { format!(", b={b}") } else { String::new() };
        let r = RotationName(r);
        plot = plot.series(&format!("dense, rotate={r}{buffered}"), points);
    }
    for (family, name) in [(Family::Kivi, "KIVI"), (Family::Turbo, "TurboQuant-style")] {
        let mut buffers: Vec<usize> =
            s.points.iter().filter(|p| p.run.family == family).map(|p| p.run.buffer).collect();
        buffers.dedup();
        for b in buffers {
            let points = line(&|run| run.family == family && run.buffer == b);
            plot = plot.series(&format!("{name}, b={b}"), points);
        }
    }
    for (index, values, split, ring, select, norm) in encodings {
        let points = line(&|run| {
            run.k.is_some()
                && run.index == index
                && run.values == values
                && run.kv.is_some() == split
                && run.ring_formats() == ring
                && run.select_rule() == select
                && run.norm_rule() == norm
        });
        let split = if split { ", keys ≠ values k" } else { "" };
        let ring = if s.local.is_some() { format!(", {ring} rings") } else { String::new() };
        let select =
            if select == models::cache::KeySelect::Query { ", query-selected keys" } else { "" };
        let norm = if norm == models::cache::ComponentNorm::Eigen {
            ", eigen-scaled components"
        } else {
            ""
        };
        let index = index.unwrap_or_default();
        plot = plot.series(&format!("SWAN {index} {values}{split}{ring}{select}{norm}"), points);
    }
    out.plot(plot.reference("dense f16", base));
}

/// A side-by-side table of the SWAN configurations run with a knob set and unset (same
/// bytes): `twin` gives a run with the knob set its unset twin (`None` for other runs).
pub(super) struct Pairing {
    pub(super) name: &'static str,
    pub(super) title: &'static str,
    /// How the unset and the set variant and their difference are named in the headers.
    pub(super) names: (&'static str, &'static str, &'static str),
    pub(super) twin: fn(&FrontierRun) -> Option<FrontierRun>,
    /// What the knob does, the note's opening.
    pub(super) what: &'static str,
}

pub(super) fn paired_table(s: &FrontierStudy, leg: &Leg, base: f64, p: Pairing, out: &mut Section) {
    let pairs: Vec<(&FrontierPoint, &FrontierPoint)> = s
        .points
        .iter()
        .filter_map(|on| {
            let twin = (p.twin)(&on.run)?;
            s.points.iter().find(|off| off.run == twin).map(|off| (off, on))
        })
        .collect();
    if pairs.is_empty() {
        return;
    }
    let (off, on, difference) = p.names;
    let headers = [
        "configuration".to_owned(),
        "bytes / f16 (4096)".to_owned(),
        format!("Δ vs f16, {off}"),
        format!("Δ vs f16, {on}"),
        difference.to_owned(),
    ];
    let headers: Vec<&str> = headers.iter().map(String::as_str).collect();
    let mut t = Table::new(&leg.name(p.name), p.title, &headers);
    for (m, q) in &pairs {
        t.row(vec![
            m.label.clone(),
            num(m.long_ratio, 3),
            pct(m.perplexity / base - 1.0, 2),
            pct(q.perplexity / base - 1.0, 2),
            format!("{:+.2} pp", 100.0 * (q.perplexity - m.perplexity) / base),
        ]);
    }
    let better = pairs.iter().filter(|(m, q)| q.perplexity < m.perplexity).count();
    t.note(format!("{}; it is better in {better} of {} pairs on this model.", p.what, pairs.len()));
    out.table(t);
}

/// Each integer-coded SWAN configuration run with and without component scaling.
pub(super) fn component_norm_table(s: &FrontierStudy, leg: &Leg, base: f64, out: &mut Section) {
    let pairing = Pairing {
        name: "frontier_component_norm",
        title: "Integer row codes: components as they are vs scaled by the basis' eigenvalues (norm=eigen), same bytes",
        names: ("unscaled", "norm=eigen", "eigen − unscaled"),
        twin: |r| {
            (r.norm == Some(models::cache::ComponentNorm::Eigen))
                .then(|| FrontierRun { norm: None, ..r.clone() })
        },
        what: "norm=eigen stores each calibrated basis component divided by the power of two nearest √(λ_j / mean λ) (λ_j: the keys' own energy along the basis vector for keys, the VO eigenvalue for values), so the row's one int8/int4 scale fits small components as well as large ones (queries and outputs are scaled back exactly)",
    };
    paired_table(s, leg, base, pairing, out);
}

/// Each SWAN configuration run with both key selections.
pub(super) fn key_selection_table(s: &FrontierStudy, leg: &Leg, base: f64, out: &mut Section) {
    let pairing = Pairing {
        name: "frontier_key_selection",
        title: "Key selection: magnitude (the paper's rule) vs query-weighted magnitude, same bytes",
        names: ("magnitude", "select=query", "query − magnitude"),
        twin: |r| {
            (r.select == Some(models::cache::KeySelect::Query))
                .then(|| FrontierRun { select: None, ..r.clone() })
        },
        what: "select=query keeps the k components of an evicted key with the largest |k̂_j|·√E[q̂_j²] (the queries' energy along each calibrated basis vector) instead of the largest |k̂_j|",
    };
    paired_table(s, leg, base, pairing, out);
}
