//! Shared test helpers: seeded Gaussian data and a plain-loop reference attention layer
//! (HF layout weights, rotate-half RoPE, causal softmax, GQA) used to check SWAN's
//! Lemma 1 and Lemma 2 end to end.
#![allow(dead_code)]

use projection::{CalibrationConfig, Calibrator, LayerActivations, ModelDims, ProjectionSet};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::StandardNormal;

/// `n` seeded standard-normal floats times `scale`.
pub fn gaussian(n: usize, scale: f32, seed: u64) -> Vec<f32> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    (0..n).map(|_| scale * rng.sample::<f32, _>(StandardNormal)).collect()
}

/// One attention layer's weights in Hugging Face `[out, in]` layout.
#[derive(Clone, Debug)]
pub struct LayerWeights {
    pub dims: ModelDims,
    pub hidden: usize,
    pub wq: Vec<f32>,
    pub wk: Vec<f32>,
    pub wv: Vec<f32>,
    pub bv: Option<Vec<f32>>,
    pub wo: Vec<f32>,
}

impl LayerWeights {
    pub fn random(dims: ModelDims, hidden: usize, v_bias: bool, seed: u64) -> Self {
        let (d, nq, nkv) = (dims.head_dim(), dims.q_heads(), dims.kv_heads());
        let s = 1.0 / (hidden as f32).sqrt();
        Self {
            dims,
            hidden,
            wq: gaussian(nq * d * hidden, s, seed),
            wk: gaussian(nkv * d * hidden, s, seed + 1),
            wv: gaussian(nkv * d * hidden, s, seed + 2),
            bv: v_bias.then(|| gaussian(nkv * d, 0.5, seed + 3)),
            wo: gaussian(hidden * nq * d, 1.0 / ((nq * d) as f32).sqrt(), seed + 4),
        }
    }
}

/// `y = x·Wᵀ + b` for `x: [n, inp]`, `w: [out, inp]`.
pub fn linear(
    x: &[f32],
    n: usize,
    w: &[f32],
    out: usize,
    inp: usize,
    b: Option<&[f32]>,
) -> Vec<f32> {
    let mut y = vec![0.0f32; n * out];
    for t in 0..n {
        for o in 0..out {
            let mut s = b.map_or(0.0, |b| b[o]);
            for i in 0..inp {
                s += x[t * inp + i] * w[o * inp + i];
            }
            y[t * out + o] = s;
        }
    }
    y
}

/// HF rotate-half RoPE in place on `[n, heads, d]` at positions `0..n`.
pub fn rope(x: &mut [f32], n: usize, heads: usize, d: usize, theta: f32) {
    let half = d / 2;
    for t in 0..n {
        for h in 0..heads {
            let v = &mut x[(t * heads + h) * d..][..d];
            for i in 0..half {
                let inv = theta.powf(-(2.0 * i as f32) / d as f32);
                let (sin, cos) = (t as f32 * inv).sin_cos();
                let (a, b) = (v[i], v[i + half]);
                v[i] = a * cos - b * sin;
                v[i + half] = b * cos + a * sin;
            }
        }
    }
}

/// Everything a forward pass produces that the lemmas talk about.
#[derive(Clone, Debug)]
pub struct Forward {
    /// `[n, q_heads, d]` after RoPE (and after `P_QK` in the rotated model).
    pub q: Vec<f32>,
    /// `[n, kv_heads, d]` after RoPE (and `P_QK`).
    pub k: Vec<f32>,
    /// `[n, kv_heads, d]`.
    pub v: Vec<f32>,
    /// `[q_heads, n, n]` pre-softmax scores `q·k/√d` (causal: only `s <= t` meaningful).
    pub scores: Vec<f32>,
    /// `[n, q_heads, d]` per-head attention outputs.
    pub attn_out: Vec<f32>,
    /// `[n, hidden]` layer output `o·W_Oᵀ`.
    pub y: Vec<f32>,
}

/// How `forward` applies a projection set.
#[derive(Clone, Copy)]
pub enum Mode<'a> {
    /// The original model.
    Dense,
    /// `P_QK` at run time; `P_VO` already absorbed into the weights by the caller.
    Absorbed(&'a ProjectionSet, usize),
    /// `P_QK` at run time; values rotated by `P_VO` and outputs rotated back at run time.
    Runtime(&'a ProjectionSet, usize),
}

/// Causal GQA attention layer under `mode`.
pub fn forward(w: &LayerWeights, x: &[f32], n: usize, mode: Mode<'_>) -> Forward {
    let dims = w.dims;
    let (d, nq, nkv, hd) = (dims.head_dim(), dims.q_heads(), dims.kv_heads(), w.hidden);
    let mut q = linear(x, n, &w.wq, nq * d, hd, None);
    let mut k = linear(x, n, &w.wk, nkv * d, hd, None);
    let mut v = linear(x, n, &w.wv, nkv * d, hd, w.bv.as_deref());
    rope(&mut q, n, nq, d, 10_000.0);
    rope(&mut k, n, nkv, d, 10_000.0);
    if let Mode::Absorbed(set, layer) | Mode::Runtime(set, layer) = mode {
        set.rotate_queries(layer, n, &mut q).unwrap();
        set.rotate_keys(layer, n, &mut k).unwrap();
    }
    if let Mode::Runtime(set, layer) = mode {
        let raw = v.clone();
        set.rotate_values_into(layer, n, &raw, &mut v).unwrap();
    }
    let scale = 1.0 / (d as f32).sqrt();
    let mut scores = vec![0.0f32; nq * n * n];
    let mut attn_out = vec![0.0f32; n * nq * d];
    for h in 0..nq {
        let j = dims.kv_of(h);
        for t in 0..n {
            let qv = &q[(t * nq + h) * d..][..d];
            let row = &mut scores[(h * n + t) * n..][..n];
            for s in 0..=t {
                let kv = &k[(s * nkv + j) * d..][..d];
                row[s] = scale * qv.iter().zip(kv).map(|(a, b)| a * b).sum::<f32>();
            }
            let m = row[..=t].iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let e: Vec<f32> = row[..=t].iter().map(|&r| (r - m).exp()).collect();
            let z: f32 = e.iter().sum();
            let out = &mut attn_out[(t * nq + h) * d..][..d];
            for (s, &es) in e.iter().enumerate() {
                let vv = &v[(s * nkv + j) * d..][..d];
                out.iter_mut().zip(vv).for_each(|(o, &x)| *o += es / z * x);
            }
        }
    }
    let y = match mode {
        Mode::Runtime(set, layer) => {
            let mut o = vec![0.0f32; attn_out.len()];
            set.unrotate_outputs_into(layer, n, &attn_out, &mut o).unwrap();
            linear(&o, n, &w.wo, hd, nq * d, None)
        }
        _ => linear(&attn_out, n, &w.wo, hd, nq * d, None),
    };
    Forward { q, k, v, scores, attn_out, y }
}

/// A calibrated set for a model whose layer `l` has weights `ws[l]`, fed from each layer's
/// own activations on the same input `x` (`[n, hidden]`).
pub fn calibrate_on(ws: &[LayerWeights], x: &[f32], n: usize, model: &str) -> ProjectionSet {
    let mut cal = Calibrator::new(ws[0].dims, CalibrationConfig::default()).unwrap();
    for (layer, w) in ws.iter().enumerate() {
        let f = forward(w, x, n, Mode::Dense);
        let acts = LayerActivations {
            n_tokens: n,
            queries: &f.q,
            keys: &f.k,
            values: &f.v,
            attn_out: &f.attn_out,
        };
        cal.observe_layer(layer, &acts).unwrap();
    }
    cal.finish_with_threads(model, 1).unwrap()
}

/// Max |a − b|.
pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

/// Max |x|.
pub fn max_abs(a: &[f32]) -> f32 {
    a.iter().map(|x| x.abs()).fold(0.0, f32::max)
}

/// Proptest config: `PROPTEST_CASES` cases if set, else `default`; no failure-persistence
/// files (the runner is driven by hand, so proptest cannot locate a source file anyway).
pub fn config(default: u32) -> proptest::test_runner::Config {
    let cases =
        std::env::var("PROPTEST_CASES").ok().and_then(|s| s.parse().ok()).unwrap_or(default);
    proptest::test_runner::Config { cases, failure_persistence: None, ..Default::default() }
}
