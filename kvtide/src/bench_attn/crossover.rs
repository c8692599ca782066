//! SWAN's compute break-even, measured (Appendix A.2): a full SWAN decode step — rotate
//! the new query and key by `P_QK` (the `d_h²` overhead of the formula), then the hybrid
//! kernel — against the dense kernel, over a ladder `L = b + 16·2^i`.

use projection::{ModelDims, ProjectionSet};

use super::*;

fn proj_err(e: projection::Error) -> Error {
    invalid("bench-attn crossover", e.to_string())
}

/// One row per (d, k, format), single engine (the first thread count).
pub(super) fn run(opts: &BenchAttnOptions, attn: &mut CpuAttention) -> Result<Json> {
    if opts.crossover_max_len == 0 {
        return Ok(json!([]));
    }
    let mut rows = Vec::new();
    for &d in &opts.head_dims {
        let dims = ModelDims::new(1, opts.q_heads, opts.kv_heads, d).map_err(proj_err)?;
        let set = ProjectionSet::random(dims, "bench-attn", opts.seed).map_err(proj_err)?;
        for k in opts.ks(d) {
            for &fmt in &opts.formats {
                rows.push(one(opts, attn, &set, (d, k, fmt))?);
            }
        }
    }
    Ok(json!(rows))
}

fn ladder(opts: &BenchAttnOptions) -> Vec<usize> {
    (0..)
        .map(|i| opts.buffer + (16 << i))
        .take_while(|&l| l <= opts.crossover_max_len.max(opts.buffer + 16))
        .collect()
}

/// Seconds of one dense step and one SWAN step (rotation + hybrid) at length `len`.
fn step_times(
    opts: &BenchAttnOptions,
    attn: &mut CpuAttention,
    set: &ProjectionSet,
    (d, k, fmt): (usize, usize, SparseValues),
    len: usize,
) -> Result<(f64, f64)> {
    let cfg = AttnConfig::new(opts.q_heads, opts.kv_heads, d).map_err(kernel_err)?;
    let q = synth::values(cfg.q_len(), opts.seed ^ 0x51);
    let key = synth::values(opts.kv_heads * d, opts.seed ^ 0x52);
    let dense: Vec<DenseHead> = (0..opts.kv_heads as u64)
        .map(|h| (synth::dense_rows(len, d, 2 * h), synth::dense_rows(len, d, 2 * h + 1)))
        .collect();
    let kv: Vec<DenseKv<'_, f16>> = dense.iter().map(|(k, v)| DenseKv::new(d, k, v)).collect();
    let hybrid = HybridSet::build(opts, d, len, k, fmt)?;
    let (mut out, mut qh, mut kh) =
        (vec![0.0; cfg.q_len()], vec![0.0; q.len()], vec![0.0; key.len()]);
    let (mut td, mut ts) = (f64::INFINITY, f64::INFINITY);
    for _ in 0..opts.rounds {
        td = td.min(time_best(opts.min_sample_secs, || {
            attn.dense(&cfg, &q, &kv, &mut out).map_err(kernel_err)
        })?);
        ts = ts.min(time_best(opts.min_sample_secs, || {
            set.rotate_qk_into(0, 1, &q, &key, &mut qh, &mut kh).map_err(proj_err)?;
            hybrid.decode(attn, &cfg, &qh, &mut out)
        })?);
    }
    Ok((td, ts))
}

fn one(
    opts: &BenchAttnOptions,
    attn: &mut CpuAttention,
    set: &ProjectionSet,
    (d, k, fmt): (usize, usize, SparseValues),
) -> Result<Json> {
    let formula = kv_sparse::memory::break_even_len(d, opts.buffer, k);
    let mut points = Vec::new();
    for len in ladder(opts) {
        let (dense, swan) = step_times(opts, attn, set, (d, k, fmt), len)?;
        points.push((len, dense, swan));
    }
    let measured = crossing(&points);
    let ratio = measured.zip(formula).map(|(m, f)| m / f);
    Ok(json!({
        "head_dim": d, "k": k, "values": fmt, "buffer": opts.buffer,
        "formula_len": formula,
        "measured_len": measured,
        "measured_over_formula": ratio,
        "within_2x": ratio.map(|r| (0.5..=2.0).contains(&r)),
        "points": points.iter().map(|&(l, a, b)| json!({"len": l, "dense_ms": a * 1e3, "swan_ms": b * 1e3})).collect::<Vec<_>>(),
    }))
}

/// The length from which SWAN stays faster: log-interpolated between the last ladder
/// point where it is slower and the next; the first point if it is never slower;
/// `None` if it is still slower at the longest point.
pub(super) fn crossing(points: &[(usize, f64, f64)]) -> Option<f64> {
    let faster = |p: &(usize, f64, f64)| p.2 < p.1;
    let last_slow = points.iter().rposition(|p| !faster(p));
    match last_slow {
        None => points.first().map(|p| p.0 as f64),
        Some(i) if i + 1 == points.len() => None,
        Some(i) => {
            let (a, b) = (points[i], points[i + 1]);
            let (ra, rb) = ((a.2 / a.1).ln(), (b.2 / b.1).ln());
            let t = if ra > rb { ra / (ra - rb) } else { 0.5 };
            Some(((a.0 as f64).ln() + t * ((b.0 as f64).ln() - (a.0 as f64).ln())).exp())
        }
    }
}
