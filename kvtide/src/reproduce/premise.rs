//! WnW's premise (`papers/wnw.txt` §2.1, Figure 1) on the text copy task: is the prefill
//! attention to the span (from the query that emits the first answer token) a good proxy
//! for the attention the whole decode pays to it?
//!
//! Procedure (identical to `scripts/fixtures/gen_premise.py`, so the figures can be checked
//! against transformers'): one teacher-forced causal forward over prompt + second copy
//! (with a full cache every decode step sees exactly these weights); the *prefill*
//! distribution is the attention of the last prompt position to the span, the
//! *decode-cumulative* one additionally averages over the `N` answer queries; both are
//! averaged over layers and q-heads and renormalised over the span. Reported: mass on the
//! first 10 % (`⌊0.1 N⌋` positions) and the first half, top-`K` Jaccard of the two rankings
//! (and of the first-answer-token query), per-KV-head Jaccard@100, 20-bin histograms, and
//! top-1 accuracy / perplexity of both copies from the same logits.

use std::collections::HashSet;

use serde::Serialize;
use tch::{Device, Kind, Tensor};

use super::corpus::CopyTask;
use crate::error::{Result, TorchOp};
use models::Llama;
use models::llama::host::to_f32_vec;

/// Attention rows of one layer, `[q_heads][N]` each.
#[derive(Default)]
struct LayerRows {
    prefill: Vec<f32>,
    first: Vec<f32>,
    decode: Vec<f32>,
}

struct PremiseTap<'a> {
    task: &'a CopyTask,
    layers: Vec<LayerRows>,
}

fn host(t: &Tensor) -> Result<Vec<f32>> {
    Ok(to_f32_vec(&t.f_contiguous().op("contiguous")?)?)
}

impl PremiseTap<'_> {
    fn probs(&mut self, probs: &Tensor) -> Result<()> {
        let (span, n) = (self.task.span(), self.task.passage.len() as i64);
        let q = self.task.answer_query(0) as i64;
        let s = probs.f_narrow(2, span.start as i64, n).op("span cols")?;
        let decode = s
            .f_narrow(1, q, n)
            .op("answer rows")?
            .f_mean_dim(&[1i64][..], false, Kind::Float)
            .op("mean")?;
        self.layers.push(LayerRows {
            prefill: host(&s.f_select(1, q).op("prefill row")?)?,
            first: host(&s.f_select(1, q + 1).op("first row")?)?,
            decode: host(&decode)?,
        });
        Ok(())
    }
}

/// Mass of a distribution on the first 10 % and each half.
#[derive(Clone, Copy, Debug, Serialize, PartialEq)]
pub struct Mass {
    /// Mass on the first `⌊0.1 N⌋` positions.
    pub first_10pct: f64,
    /// Mass on the first `⌊N/2⌋` positions.
    pub first_half: f64,
}

/// Top-1 accuracy and perplexity of one copy.
#[derive(Clone, Copy, Debug, Serialize, PartialEq)]
pub struct CopyScore {
    /// Scored tokens.
    pub n: usize,
    /// Arg-max accuracy.
    pub top1: f64,
    /// Perplexity.
    pub perplexity: f64,
}

/// Figure 1's measurements for one passage.
#[derive(Clone, Debug, Serialize)]
pub struct Premise {
    /// Play.
    pub play: String,
    /// `bare` or `chat`.
    pub variant: &'static str,
    /// Passage tokens.
    pub n: usize,
    /// Prefill distribution.
    pub prefill: Mass,
    /// Decode-cumulative distribution.
    pub decode: Mass,
    /// Jaccard of the top-100 prefill and decode positions.
    pub jaccard_100: f64,
    /// Jaccard@500 (passages of ≥ 1000 tokens).
    pub jaccard_500: Option<f64>,
    /// Jaccard@100 of the first-answer-token query and decode.
    pub jaccard_first_token_100: f64,
    /// Random baseline `K / (2N − K)`.
    pub jaccard_random_100: f64,
    /// Per-KV-head Jaccard@100 (`[layer][kv_head]`).
    pub per_head_jaccard_100: Vec<Vec<f64>>,
    /// 20-bin histograms (prefill, decode) when `N` is a multiple of 20.
    pub histogram_20: Option<(Vec<f64>, Vec<f64>)>,
    /// Second copy (the "transcript").
    pub second_copy: CopyScore,
    /// First copy (no earlier copy to read from).
    pub first_copy: CopyScore,
    /// Forward seconds.
    pub seconds: f64,
}

/// Layer- and head-averaged distribution of `pick(rows)`, renormalised.
fn distribution(layers: &[LayerRows], n: usize, pick: fn(&LayerRows) -> &[f32]) -> Vec<f64> {
    let mut d = vec![0f64; n];
    for l in layers {
        for head in pick(l).chunks_exact(n) {
            d.iter_mut().zip(head).for_each(|(a, &b)| *a += f64::from(b));
        }
    }
    let total: f64 = d.iter().sum();
    d.iter_mut().for_each(|x| *x /= total);
    d
}

fn mass(d: &[f64]) -> Mass {
    let n = d.len();
    Mass { first_10pct: d[..n / 10].iter().sum(), first_half: d[..n / 2].iter().sum() }
}

fn top_k(d: &[f64], k: usize) -> HashSet<usize> {
    let mut idx: Vec<usize> = (0..d.len()).collect();
    idx.sort_by(|&a, &b| d[b].total_cmp(&d[a]).then(a.cmp(&b)));
    idx.into_iter().take(k.min(d.len())).collect()
}

/// `|A ∩ B| / |A ∪ B|` of the top-`k` index sets of two score vectors.
///
/// # Examples
/// ```
/// use kvtide::reproduce::premise::jaccard;
/// assert_eq!(jaccard(&[3.0, 2.0, 1.0, 0.0], &[0.0, 2.0, 3.0, 1.0], 2), 1.0 / 3.0);
/// ```
pub fn jaccard(a: &[f64], b: &[f64], k: usize) -> f64 {
    let (sa, sb) = (top_k(a, k), top_k(b, k));
    sa.intersection(&sb).count() as f64 / sa.union(&sb).count().max(1) as f64
}

fn per_head(layers: &[LayerRows], n: usize, kv_heads: usize) -> Vec<Vec<f64>> {
    let mean_group = |rows: &[f32], kv: usize, g: usize| -> Vec<f64> {
        let mut m = vec![0f64; n];
        for head in rows.chunks_exact(n).skip(kv * g).take(g) {
            m.iter_mut().zip(head).for_each(|(a, &b)| *a += f64::from(b) / g as f64);
        }
        m
    };
    layers
        .iter()
        .map(|l| {
            let g = l.prefill.len() / n / kv_heads;
            (0..kv_heads)
                .map(|kv| {
                    jaccard(&mean_group(&l.prefill, kv, g), &mean_group(&l.decode, kv, g), 100)
                })
                .collect()
        })
        .collect()
}

fn copy_score(logits: &Tensor, first_query: usize, targets: &[u32]) -> Result<CopyScore> {
    let n = targets.len();
    let rows = logits.f_narrow(0, first_query as i64, n as i64).op("copy rows")?;
    let t: Vec<i64> = targets.iter().map(|&x| i64::from(x)).collect();
    let t = Tensor::f_from_slice(&t).op("targets")?;
    let lp = rows.f_log_softmax(-1, Kind::Double).op("log_softmax")?;
    let nll = lp
        .f_gather(1, &t.f_unsqueeze(1).op("unsqueeze")?, false)
        .op("gather")?
        .f_mean(Kind::Double)
        .op("mean")?;
    let hits = rows
        .f_argmax(-1, false)
        .op("argmax")?
        .f_eq_tensor(&t)
        .op("eq")?
        .f_sum(Kind::Int64)
        .op("sum")?;
    Ok(CopyScore {
        n,
        top1: hits.f_int64_value(&[]).op("hits")? as f64 / n as f64,
        perplexity: (-nll.f_double_value(&[]).op("nll")?).exp(),
    })
}

/// Logits `[T, vocab]` of one causal forward over `seq`, each layer's attention
/// probabilities `[q_heads, T, T]` handed to `tap`: the decoder's key-offset forward with
/// zero offsets that require no grad (so nothing is recorded).
fn causal_forward(model: &Llama, seq: &[u32], tap: &mut PremiseTap<'_>) -> Result<Tensor> {
    let cfg = model.config();
    let shape = [cfg.kv_heads as i64, seq.len() as i64, cfg.head_dim as i64];
    let zero = Tensor::f_zeros(shape, (Kind::Float, Device::Cpu)).op("zero offsets")?;
    let offsets: Vec<Tensor> = (0..cfg.num_layers).map(|_| zero.shallow_clone()).collect();
    // The forward's callback speaks the model crate's error; a tap failure (a libtorch op
    // on the probabilities) is carried through it as text.
    let mut probs = |_: usize, p: &Tensor| {
        tap.probs(p)
            .map_err(|e| models::Error::InvalidInput { op: "premise tap", reason: e.to_string() })
    };
    Ok(model.forward_key_offsets(
        &model.embed(seq)?,
        model.rope().tables(0, seq.len())?,
        0..seq.len(),
        &offsets,
        &mut probs,
    )?)
}

/// Measures the premise on one copy task.
///
/// # Errors
/// Forward errors; [`crate::Error::InvalidInput`] for passages under 100 tokens.
pub fn measure(model: &Llama, task: &CopyTask) -> Result<Premise> {
    let n = task.passage.len();
    if n < 100 {
        return Err(crate::error::invalid(
            "premise",
            format!("passage of {n} tokens; need ≥ 100 for Jaccard@100"),
        ));
    }
    let t0 = std::time::Instant::now();
    let _guard = tch::no_grad_guard();
    let seq = task.sequence();
    let mut tap = PremiseTap { task, layers: Vec::new() };
    let logits = causal_forward(model, &seq, &mut tap)?;
    let layers = tap.layers;
    let (pre, first, dec) = (
        distribution(&layers, n, |l| &l.prefill),
        distribution(&layers, n, |l| &l.first),
        distribution(&layers, n, |l| &l.decode),
    );
    let hist = |d: &[f64]| d.chunks_exact(n / 20).map(|c| c.iter().sum()).collect::<Vec<f64>>();
    let span = task.span();
    // The first copy is predicted from its own prefix (position 0 has no prediction).
    let first_start = span.start.max(1);
    Ok(Premise {
        play: task.play.clone(),
        variant: task.variant.name(),
        n,
        prefill: mass(&pre),
        decode: mass(&dec),
        jaccard_100: jaccard(&pre, &dec, 100),
        jaccard_500: (n >= 1000).then(|| jaccard(&pre, &dec, 500)),
        jaccard_first_token_100: jaccard(&first, &dec, 100),
        jaccard_random_100: 100.0 / (2 * n - 100) as f64,
        per_head_jaccard_100: per_head(&layers, n, model.config().kv_heads),
        histogram_20: (n.is_multiple_of(20)).then(|| (hist(&pre), hist(&dec))),
        second_copy: copy_score(&logits, task.answer_query(0), &task.passage)?,
        first_copy: copy_score(&logits, first_start - 1, &seq[first_start..span.end])?,
        seconds: t0.elapsed().as_secs_f64(),
    })
}
