//! `kvtide bench-attn`'s `targets` object: each speed target's smallest ratio over the grid,
//! the read-bandwidth and crossover targets, each with `met`, target and points.

use super::*;

/// Whether the int8-query kernels are timed: asked for, and this CPU runs them.
pub(super) fn int8_queries(opts: &BenchAttnOptions) -> bool {
    opts.int8_queries && QueryPrecision::Int8.is_available()
}

/// The kernel targets (bandwidth, crossover, hybrid speed-up), evaluated on the measured figures.
pub(super) fn targets(opts: &BenchAttnOptions, points: &[Json], crossover: &Json) -> Json {
    let max_len = opts.lengths.iter().copied().max().unwrap_or(0);
    let headline: Vec<Json> = points
        .iter()
        .filter(|p| p["len"] == json!(max_len))
        .flat_map(|p| {
            let d = p["head_dim"].as_u64().unwrap_or(0);
            let rows = p["hybrid"].as_array().cloned().unwrap_or_default();
            let p = p.clone();
            rows.into_iter()
                .filter(move |h| h["values"] == json!("fp8") && h["k"].as_u64() == Some(d / 2))
                .map(move |h| {
                    let (vd, vt) =
                        (h["speedup_vs_dense_f16"].as_f64(), h["speedup_vs_torch_f32"].as_f64());
                    json!({
                        "threads": p["threads"], "head_dim": d, "len": max_len,
                        "speedup_vs_dense_f16": vd, "target_vs_dense_f16": 1.5,
                        "speedup_vs_torch_f32": vt, "target_vs_torch_f32": 5.0,
                        "met": vd.is_some_and(|v| v >= 1.5) && vt.is_some_and(|v| v >= 5.0),
                    })
                })
        })
        .collect();
    let ratio = |name, target, f: &dyn Fn(&Json, u64) -> Option<f64>| {
        ratio_target(points, max_len, name, target, f)
    };
    let half_k_in = |part: &str, p: &Json, d: u64, values: &str, key: &str| {
        p[part]
            .as_array()?
            .iter()
            .find(|b| b["values"] == json!(values) && b["k"].as_u64() == Some(d / 2))?[key]
            .as_f64()
    };
    let half_k =
        |p: &Json, d: u64, values: &str, key: &str| half_k_in("bitmask", p, d, values, key);
    let q8 = |p: &Json, d: u64, key: &str| half_k_in("bitmask_int8_queries", p, d, "int8", key);
    json!({
        "hybrid_fp8_half_k_longest": headline,
        "bandwidth_at_16k_or_more": bandwidth_target(points),
        "read_bandwidth_at_16k_or_more": read_bandwidth_target(points),
        "bitmask_fp8_half_k_vs_dense_f16": ratio(
            "bitmask fp8, k = d/2, vs dense f16", 2.0,
            &|p, d| half_k(p, d, "fp8", "speedup_vs_dense_f16"),
        ),
        "bitmask_int8_half_k_vs_dense_f16": ratio(
            "bitmask int8, k = d/2, vs dense f16", 2.0,
            &|p, d| half_k(p, d, "int8", "speedup_vs_dense_f16"),
        ),
        "bitmask_half_k_vs_dense_int8": ratio(
            "the faster of bitmask fp8 / int8, k = d/2, vs dense int8", 1.2,
            &|p, d| {
                let (a, b) = (
                    half_k(p, d, "fp8", "speedup_vs_dense_int8"),
                    half_k(p, d, "int8", "speedup_vs_dense_int8"),
                );
                a.into_iter().chain(b).reduce(f64::max)
            },
        ),
        "dense_int8_vs_dense_f16": ratio(
            "dense int8 (q8_0 blocks) vs dense f16", 1.6,
            &|p, _| p["dense_int8"]["speedup_vs_dense_f16"].as_f64(),
        ),
        "crossover_within_2x": crossover_target(crossover),
        "int8_vs_dense_f16": ratio(
            "dense int8 (q8_0 blocks) vs dense f16", 1.3,
            &|p, _| p["dense_int8"]["speedup_vs_dense_f16"].as_f64(),
        ),
        "int4_vs_dense_f16": ratio(
            "dense int4 (q4_0 blocks) vs dense f16", 1.8,
            &|p, _| p["dense_int4"]["speedup_vs_dense_f16"].as_f64(),
        ),
        "turbo3_vs_dense_f16": ratio(
            "TurboQuant-style 3-bit rows behind the f16 buffer, read in place, vs dense f16", 1.8,
            &|p, _| p["turbo3"]["speedup_vs_dense_f16"].as_f64(),
        ),
        "kivi2_vs_dense_f16": ratio(
            "KIVI-2 rows (groups of 32) behind the f16 buffer, read in place, vs dense f16", 1.8,
            &|p, _| p["kivi2"]["speedup_vs_dense_f16"].as_f64(),
        ),
        "bitmask_half_k_vs_dense_f16": ratio(
            "the faster of bitmask fp8 / int8 (8-bit values), k = d/2, vs dense f16", 1.2,
            &|p, d| {
                let (a, b) = (
                    half_k(p, d, "fp8", "speedup_vs_dense_f16"),
                    half_k(p, d, "int8", "speedup_vs_dense_f16"),
                );
                a.into_iter().chain(b).reduce(f64::max)
            },
        ),
        "min_read_bandwidth_fraction": min_read_fraction(points, 2, 0.5),
        "int8_queries": if opts.int8_queries && !int8_queries(opts) {
            json!({"timed": false, "reason": "this CPU lacks AVX2 (the integer products need it)"})
        } else {
            json!({
                "timed": opts.int8_queries,
                "note": "lossy: queries rounded to int8 per head and step; the targets above take f32 queries",
                "bitmask_int8_half_k_vs_dense_f16": ratio(
                    "bitmask int8, k = d/2, int8 queries, vs dense f16", 2.0,
                    &|p, d| q8(p, d, "speedup_vs_dense_f16"),
                ),
                "bitmask_half_k_vs_dense_int8": ratio(
                    "bitmask int8, k = d/2, vs dense int8, both with int8 queries", 1.2,
                    &|p, d| q8(p, d, "speedup_vs_dense_int8_int8_queries"),
                ),
                "dense_int8_vs_dense_f16": ratio(
                    "dense int8 (q8_0 blocks) with int8 queries vs dense f16", 1.6,
                    &|p, _| p["dense_int8_int8_queries"]["speedup_vs_dense_f16"].as_f64(),
                ),
                "dense_int4_vs_dense_f16": ratio(
                    "dense int4 (q4_0 blocks) with int8 queries vs dense f16", 1.8,
                    &|p, _| p["dense_int4_int8_queries"]["speedup_vs_dense_f16"].as_f64(),
                ),
            })
        },
    })
}

/// A speed-up target at the longest `L`: every (threads, d) point must reach `target`; the
/// measured value is the smallest.
pub(super) fn ratio_target(
    points: &[Json],
    max_len: usize,
    what: &str,
    target: f64,
    f: &dyn Fn(&Json, u64) -> Option<f64>,
) -> Json {
    let per: Vec<Json> = points
        .iter()
        .filter(|p| p["len"] == json!(max_len))
        .map(|p| {
            let d = p["head_dim"].as_u64().unwrap_or(0);
            json!({"threads": p["threads"], "head_dim": d, "measured": f(p, d)})
        })
        .collect();
    let measured: Vec<f64> = per.iter().filter_map(|x| x["measured"].as_f64()).collect();
    let min = measured.iter().copied().reduce(f64::min);
    json!({
        "what": what,
        "len": max_len,
        "target": target,
        "measured": min,
        "points": per,
        "met": min.map(|m| m >= target && measured.len() == per.len()),
    })
}

/// Every kernel of a grid point with its figures, named.
fn kernels_of(p: &Json) -> Vec<(String, Json)> {
    let mut kernels: Vec<(String, Json)> = [
        "dense_f16",
        "gathered_f16",
        "dense_int8",
        "dense_int4",
        "dense_fp8",
        "dense_int8_int8_queries",
        "dense_int4_int8_queries",
        "kivi2",
        "turbo3",
    ]
    .iter()
    .filter(|n| !p[**n].is_null())
    .map(|n| ((*n).to_string(), p[*n].clone()))
    .collect();
    for part in ["hybrid", "gathered_sparse", "bitmask", "bitmask_int8_queries"] {
        for h in p[part].as_array().into_iter().flatten() {
            kernels.push((
                format!("{part}_{}_k{}", h["values"].as_str().unwrap_or("?"), h["k"]),
                h.clone(),
            ));
        }
    }
    kernels
}

/// The smallest fraction of the read bandwidth (same threads, same run) any kernel reaches
/// on its stored bytes at L ≥ 16k on `threads` threads (every thread count when `None`),
/// against `target`.
fn worst_read_fraction(points: &[Json], threads: Option<u64>, target: f64) -> Json {
    let mut worst: Option<(f64, String)> = None;
    let long = |p: &&Json| p["len"].as_u64().is_some_and(|l| l >= 16384);
    let on = |p: &&Json| threads.is_none_or(|t| p["threads"].as_u64() == Some(t));
    for p in points.iter().filter(long).filter(on) {
        let tag = format!("t{} d{} L{}", p["threads"], p["head_dim"], p["len"]);
        for (name, f) in kernels_of(p) {
            let frac = f["frac_read_bw"].as_f64().unwrap_or(0.0);
            if worst.as_ref().is_none_or(|(w, _)| frac < *w) {
                worst = Some((frac, format!("{name} {tag}")));
            }
        }
    }
    match worst {
        Some((frac, at)) => {
            json!({"measured": frac, "at": at, "target": target, "met": frac >= target})
        }
        None => json!({
            "measured": null,
            "note": "no length ≥ 16k (on these threads) in the grid",
            "target": target,
            "met": null,
        }),
    }
}

/// The smallest fraction of the read bandwidth any kernel reaches at L ≥ 16k (target ≥ 0.6).
pub(super) fn read_bandwidth_target(points: &[Json]) -> Json {
    worst_read_fraction(points, None, 0.6)
}

/// The smallest fraction of the read bandwidth any format reaches on its stored bytes at
/// L ≥ 16k with `threads` threads, against `target`.
pub(super) fn min_read_fraction(points: &[Json], threads: u64, target: f64) -> Json {
    let mut out = worst_read_fraction(points, Some(threads), target);
    out["threads"] = json!(threads);
    out
}

/// The smallest fraction of copy bandwidth any kernel reaches at L ≥ 16k (target ≥ 0.5).
pub(super) fn bandwidth_target(points: &[Json]) -> Json {
    let mut worst: Option<(f64, String)> = None;
    for p in points.iter().filter(|p| p["len"].as_u64().is_some_and(|l| l >= 16384)) {
        let tag = format!("t{} d{} L{}", p["threads"], p["head_dim"], p["len"]);
        let mut kernels = vec![("dense_f16".to_string(), p["dense_f16"].clone())];
        for part in ["hybrid", "gathered_sparse"] {
            for h in p[part].as_array().into_iter().flatten() {
                kernels.push((
                    format!("{part}_{}_k{}", h["values"].as_str().unwrap_or("?"), h["k"]),
                    h.clone(),
                ));
            }
        }
        kernels.push(("gathered_f16".to_string(), p["gathered_f16"].clone()));
        for (name, f) in kernels {
            let frac = f["frac_copy_bw"].as_f64().unwrap_or(0.0);
            if worst.as_ref().is_none_or(|(w, _)| frac < *w) {
                worst = Some((frac, format!("{name} {tag}")));
            }
        }
    }
    match worst {
        Some((frac, at)) => {
            json!({"min_frac_copy_bw": frac, "at": at, "target": 0.5, "met": frac >= 0.5})
        }
        None => {
            json!({"min_frac_copy_bw": null, "note": "no length ≥ 16k in the grid", "met": null})
        }
    }
}

pub(super) fn crossover_target(crossover: &Json) -> Json {
    let rows = crossover.as_array().cloned().unwrap_or_default();
    let within = rows.iter().filter(|r| r["within_2x"] == json!(true)).count();
    json!({"within": within, "of": rows.len(), "met": !rows.is_empty() && within == rows.len()})
}
