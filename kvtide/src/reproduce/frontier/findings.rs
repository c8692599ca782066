//! The frontier study's findings and the check that the byte formulas match the measured
//! bytes.

use super::*;

/// The study's claims (its quality-per-byte targets), measured on one leg's model.
pub fn findings(s: &FrontierStudy, leg: &Leg) -> Vec<Finding> {
    let mut out = leg_findings(s);
    if !leg.tag.is_empty() {
        for f in &mut out {
            f.id = leg.name(&f.id);
            f.claim = format!("{}: {}", leg.title, f.claim);
        }
    }
    out
}

pub(super) fn leg_findings(s: &FrontierStudy) -> Vec<Finding> {
    let base = s.dense_f16().map_or(f64::NAN, |p| p.perplexity);
    let mut out = Vec::new();
    let lost: Vec<String> = s
        .budgets
        .iter()
        .filter(|r| r.swan_wins() == Some(false))
        .map(|r| format!("{} × f16 ({})", r.budget, r.measure))
        .collect();
    let compared = s.budgets.iter().filter(|r| r.swan_wins().is_some()).count();
    // A run without SWAN configurations (--frontier-external-only) has nothing to compare.
    let any_swan = s.points.iter().any(|p| p.run.family == Family::Swan);
    out.extend(any_swan.then(|| Finding::new(
        "frontier-budgets",
        "At every budget 0.15–0.5 × f16 the best SWAN configuration's perplexity is at or below the best dense quantized one's",
        compared > 0 && lost.is_empty(),
        format!("{compared} budget comparisons; SWAN behind at: {lost:?}"),
    )));
    // The bitmask target's operating point (8-bit values, b = 128), best perplexity among
    // the rows whose key/value kept components `pair` accepts.
    let best_at_target = |pair: &dyn Fn(usize, Option<usize>) -> bool| {
        s.points
            .iter()
            .filter(|p| {
                p.run.family == Family::Swan
                    && p.run.index == Some(models::cache::SwanIndex::Bitmask)
                    && matches!(p.run.values, Code::Fp8 | Code::Int8)
                    && p.run.buffer == 128
                    && p.run.k.is_some_and(|k| pair(k, p.run.kv))
            })
            .min_by(|a, b| a.perplexity.total_cmp(&b.perplexity))
    };
    let target = best_at_target(&|k, kv| k == s.head_dim / 2 && kv.is_none());
    if let Some(p) = target {
        let half = s.head_dim / 2;
        let sparse = p.run.swan_config(s.head_dim, half, half).sparse_token_bytes(s.head_dim)
            as f64
            / (2.0 * 2.0 * s.head_dim as f64);
        let dppl = p.perplexity / base - 1.0;
        // On a windowed model the 4096-token target is about the layers the cache serves
        // (the local rings are those of every configuration with the same ring format).
        let (long, which) = match p.global_long_ratio {
            Some(g) => (g, " (global layers)"),
            None => (p.long_ratio, ""),
        };
        out.push(Finding::new(
            "frontier-bitmask-half-k",
            "SWAN bitmask, best 8-bit values, k = d_h/2, b = 128: ≤ 0.36 × f16 per sparse token, ≤ 0.40 × f16 for a 4096-token cache, ≤ +0.5 % perplexity",
            sparse <= 0.36 && long <= 0.40 && dppl <= 0.005,
            format!("{}: {:.3} × f16 per sparse token, {:.3} × f16 at 4096 tokens{which}, {} perplexity", p.label, sparse, long, pct(dppl, 2)),
        ));
    }
    // The same bytes split unevenly between key and value rows (full grid only).
    let split = best_at_target(&|k, kv| kv.is_some_and(|kv| k + kv == s.head_dim));
    if let Some(p) = split {
        let dppl = p.perplexity / base - 1.0;
        out.push(Finding::new(
            "frontier-bitmask-half-k-split",
            "SWAN bitmask, best 8-bit values, the bytes of k = d_h/2 split between key and value rows, b = 128: ≤ +0.5 % perplexity",
            dppl <= 0.005,
            format!("{}: {} perplexity ({:.3} × f16 at 4096 tokens)", p.label, pct(dppl, 2), p.global_long_ratio.unwrap_or(p.long_ratio)),
        ));
    }
    let ext = |ty: &str| s.external.rows.iter().find(|(t, _)| t == ty).map(|r| r.1);
    if let (Some(f16), Some(ours), Some(same)) =
        (ext("f16"), s.dense_f16(), s.dense_f16_llamacpp_positions)
    {
        let diff = same / f16 - 1.0;
        out.push(Finding::new(
            "frontier-llamacpp-dense",
            "kvtide's dense f16 perplexity is within 1.5 % of llama.cpp's (f16 KV, F32 weights) on the same windows and scored positions",
            diff.abs() <= 0.015,
            format!(
                "kvtide {same:.4} vs llama.cpp {f16:.4}: {} (kvtide over all its scored positions: {:.4}, {})",
                pct(diff, 2),
                ours.perplexity,
                pct(ours.perplexity / f16 - 1.0, 2)
            ),
        ));
    }
    if let (Some(f16), Some(q8), Some(q4)) = (ext("f16"), ext("q8_0"), ext("q4_0")) {
        let ours = |l: &str| s.find(l).map(|p| p.perplexity / base - 1.0);
        let (i8l, i4l) = ("dense int8 rotate=hadamard", "dense int4 rotate=hadamard");
        if let (Some(i8), Some(i4)) = (ours(i8l), ours(i4l)) {
            let (c8, c4) = (q8 / f16 - 1.0, q4 / f16 - 1.0);
            // Judged under llama.cpp's own condition (whole window through the cache) when
            // it was measured; the half-prefilled costs are reported beside it.
            let whole = s.whole_window_cost(i8l).zip(s.whole_window_cost(i4l));
            let (j8, j4) = whole.unwrap_or((i8, i4));
            let met = (j8 - c8).abs() <= 0.001 && (j4 - c4).abs() <= 0.015;
            let mut detail = format!(
                "half prefilled: int8 {} vs q8_0 {}; int4 {} vs q4_0 {}",
                pct(i8, 2),
                pct(c8, 2),
                pct(i4, 2),
                pct(c4, 2)
            );
            if let Some((w8, w4)) = whole {
                detail = format!(
                    "whole window through the cache (llama.cpp's condition, judged): int8 {} vs q8_0 {} ({:.2} pp), int4 {} vs q4_0 {} ({:.2} pp); {detail}",
                    pct(w8, 2),
                    pct(c8, 2),
                    100.0 * (w8 - c8).abs(),
                    pct(w4, 2),
                    pct(c4, 2),
                    100.0 * (w4 - c4).abs()
                );
                let se = |ty, l| s.peer_gap(ty, l).map(|g| format!("{:.2}", 100.0 * g.se));
                if let (Some(e8), Some(e4)) = (se("q8_0", i8l), se("q4_0", i4l)) {
                    detail = format!(
                        "{detail}; gaps' jackknife SE over the {} windows: int8 {e8} pp, int4 {e4} pp",
                        s.windows.0
                    );
                }
            }
            // Reported beside the judged counterparts, not judged (the target names the
            // f32-query setting and llama.cpp's rotation): the int8 cache scored with int8
            // queries, as llama.cpp scores q8_0, and int4 with the values alone rotated.
            let beside = [
                (
                    "dense int8 rotate=hadamard queries=int8",
                    c8,
                    "with int8 queries (as llama.cpp scores q8_0)",
                ),
                (
                    "dense int4 rotate=hadamard-v",
                    c4,
                    "int4 with the values alone rotated (hadamard-v)",
                ),
                (
                    "dense int4 rotate=hadamard queries=q8_0",
                    c4,
                    "int4 with q8_0 queries (as llama.cpp's CPU flash attention scores q4_0)",
                ),
            ];
            let mixed = [
                ("dense int8 values=int4 rotate=hadamard", "q8_0/q4_0", "int8 keys, int4 values"),
                ("dense int4 values=int8 rotate=hadamard", "q4_0/q8_0", "int4 keys, int8 values"),
            ];
            let beside = beside
                .into_iter()
                .map(|(l, c, w)| (l, Some(c), w))
                .chain(mixed.into_iter().map(|(l, ty, w)| (l, ext(ty).map(|p| p / f16 - 1.0), w)));
            for (label, peer, what) in beside {
                let Some(half) = ours(label) else { continue };
                let Some(peer) = peer else {
                    let w = s.whole_window_cost(label).map_or_else(
                        || "whole window not measured".to_owned(),
                        |w| format!("whole window {}", pct(w, 2)),
                    );
                    detail = format!("{detail}; {what}: {w}, half prefilled {}", pct(half, 2));
                    continue;
                };
                let w = s.whole_window_cost(label).map_or_else(
                    || "whole window not measured".to_owned(),
                    |w| format!("whole window {} ({:.2} pp)", pct(w, 2), 100.0 * (w - peer).abs()),
                );
                detail = format!("{detail}; {what}: {w}, half prefilled {}", pct(half, 2));
            }
            for family in DrawFamily::ALL {
                let Some(d) = rotation_draw_spread(s, family) else { continue };
                let side = |x: f64| match (x < d.lo, x > d.hi) {
                    (true, _) => "below",
                    (_, true) => "above",
                    _ => "inside",
                };
                detail = format!(
                    "{detail}; int4 in {} {} (whole window): {} … {} (median {}) — llama.cpp's q4_0 {} is {} that spread, kvtide's Hadamard int4 {}",
                    d.n,
                    family.describe(),
                    pct(d.lo, 2),
                    pct(d.hi, 2),
                    pct(d.median, 2),
                    pct(c4, 2),
                    side(c4),
                    whole.map_or_else(
                        || "not measured whole-window".to_owned(),
                        |(_, w4)| { format!("{} {}", pct(w4, 2), side(w4)) }
                    ),
                );
            }
            out.push(Finding::new(
                "frontier-llamacpp",
                "kvtide int8 / int4 (Hadamard) cost within 0.1 / 1.5 percentage points of llama.cpp's q8_0 / q4_0",
                met,
                detail,
            ));
        }
    }
    out
}

/// The enforced check: every configuration's measured bytes equal its formula, and every
/// perplexity is finite.
pub fn formula_bytes(s: &FrontierStudy, leg: &Leg) -> Check {
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
    let name = "frontier: every format's held bytes equal its formula; perplexities finite";
    Check::new(
        &if leg.tag.is_empty() { name.to_owned() } else { format!("{} ({})", name, leg.title) },
        bad.is_empty(),
        format!("{} configurations; mismatches: {bad:?}", s.points.len()),
    )
}
