//! Teacher-forced scoring through the decode path, with per-step cache figures.
//!
//! The prompt is prefilled (libtorch, filling the cache), then every target token is scored
//! and fed back one at a time through [`Session::decode`] — so every prediction after the
//! first is made by the cache under test (`papers/swan.txt` decode step; `papers/wnw.txt`
//! §3.5–3.9: accuracy, measured retention, recall bytes and time per decoded token). Unlike
//! [`crate::score`], the loop can sample the cache after every step (WnW Figure 4: KV size
//! over decode steps).

use std::time::Instant;

use serde::Serialize;
use tch::{Kind, Tensor};

use crate::cache::CacheBytes;
use crate::error::{Result, TorchOp, invalid};
use crate::generate::argmax;
use crate::session::Session;

/// The cache after one decode step.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct StepSample {
    /// Decode step (1-based: tokens fed through the decode path so far).
    pub step: usize,
    /// Bytes attention reads.
    pub resident_bytes: usize,
    /// Bytes kept recallable elsewhere.
    pub offloaded_bytes: usize,
    /// The cache's current on-device span retention, when it reports one.
    pub r_gpu: Option<f64>,
}

/// What one teacher-forced pass measured.
#[derive(Clone, Debug, Default)]
pub struct Trace {
    /// Negative log-likelihood (nats) of every target.
    pub nll: Vec<f64>,
    /// Whether the arg-max prediction was the target.
    pub hit: Vec<bool>,
    /// Prefill seconds.
    pub prefill_s: f64,
    /// Seconds spent in decode steps (the forward of each fed token).
    pub decode_s: f64,
    /// Tokens fed through the decode path.
    pub steps: usize,
    /// Cache bytes right after prefill.
    pub after_prefill: CacheBytes,
    /// Cache bytes at the end.
    pub at_end: CacheBytes,
    /// The cache's own figures at the end ([`crate::KvCache::stats`]).
    pub stats: Vec<(String, f64)>,
    /// Per-step samples (empty unless asked for).
    pub samples: Vec<StepSample>,
}

impl Trace {
    /// Sum of NLLs.
    pub fn nll_sum(&self) -> f64 {
        self.nll.iter().sum()
    }

    /// Number of correct arg-max predictions.
    pub fn hits(&self) -> usize {
        self.hit.iter().filter(|&&h| h).count()
    }

    /// Milliseconds per decoded token.
    pub fn ms_per_token(&self) -> f64 {
        if self.steps == 0 { f64::NAN } else { 1e3 * self.decode_s / self.steps as f64 }
    }

    /// A figure from [`Trace::stats`].
    pub fn stat(&self, key: &str) -> Option<f64> {
        self.stats.iter().find(|(k, _)| k == key).map(|(_, v)| *v)
    }
}

fn score_one(logits: &Tensor, target: u32) -> Result<(f64, bool)> {
    let lp = logits.f_log_softmax(0, Kind::Float).op("log_softmax")?;
    let nll = -lp.f_double_value(&[i64::from(target)]).op("log prob")?;
    Ok((nll, argmax(logits)? == target))
}

fn sample(session: &Session, step: usize) -> StepSample {
    let cache = session.cache();
    let bytes = cache.bytes();
    let r_gpu = cache.stats().iter().find(|(k, _)| *k == "r_gpu").map(|(_, v)| *v);
    StepSample { step, resident_bytes: bytes.resident, offloaded_bytes: bytes.offloaded, r_gpu }
}

/// Prefills `prompt` into the fresh `session`, then scores `targets` one by one, feeding each
/// through the decode path; with `sample_steps`, records the cache after every step.
///
/// # Errors
/// [`crate::Error::InvalidInput`] for an empty prompt or target list; forward and cache
/// errors.
pub fn teacher_force(
    session: &mut Session,
    prompt: &[u32],
    targets: &[u32],
    sample_steps: bool,
) -> Result<Trace> {
    if prompt.is_empty() || targets.is_empty() {
        return Err(invalid("teacher-forced decode", "need a prompt and at least one target"));
    }
    session.reserve(prompt.len() + targets.len())?;
    let mut trace = Trace {
        nll: Vec::with_capacity(targets.len()),
        hit: Vec::with_capacity(targets.len()),
        ..Trace::default()
    };
    let t0 = Instant::now();
    let mut logits = session.prefill(prompt)?;
    trace.prefill_s = t0.elapsed().as_secs_f64();
    trace.after_prefill = session.cache().bytes();
    for (i, &target) in targets.iter().enumerate() {
        let (nll, hit) = score_one(&logits, target)?;
        trace.nll.push(nll);
        trace.hit.push(hit);
        if i + 1 < targets.len() {
            let t = Instant::now();
            logits = session.decode(target)?;
            trace.decode_s += t.elapsed().as_secs_f64();
            trace.steps += 1;
            if sample_steps {
                trace.samples.push(sample(session, trace.steps));
            }
        }
    }
    trace.at_end = session.cache().bytes();
    trace.stats = session.cache().stats().into_iter().map(|(k, v)| (k.to_owned(), v)).collect();
    Ok(trace)
}

/// How closely two traces of the same targets agree (the lossless checks).
#[derive(Clone, Copy, Debug, Serialize, PartialEq)]
pub struct Agreement {
    /// Largest per-position |ΔNLL| (nats).
    pub max_abs_nll_diff: f64,
    /// Share of positions with the same arg-max correctness.
    pub same_hit_rate: f64,
    /// Relative perplexity difference.
    pub ppl_rel_diff: f64,
}

/// Compares two traces position by position.
///
/// # Errors
/// [`crate::Error::InvalidInput`] if they scored different numbers of targets.
pub fn agreement(a: &Trace, b: &Trace) -> Result<Agreement> {
    if a.nll.len() != b.nll.len() || a.nll.is_empty() {
        return Err(invalid(
            "trace agreement",
            format!("{} vs {} scored tokens", a.nll.len(), b.nll.len()),
        ));
    }
    let n = a.nll.len() as f64;
    let max_abs_nll_diff = a.nll.iter().zip(&b.nll).map(|(x, y)| (x - y).abs()).fold(0.0, f64::max);
    let same_hit_rate = a.hit.iter().zip(&b.hit).filter(|(x, y)| x == y).count() as f64 / n;
    let (pa, pb) = ((a.nll_sum() / n).exp(), (b.nll_sum() / n).exp());
    Ok(Agreement { max_abs_nll_diff, same_hit_rate, ppl_rel_diff: (pa - pb).abs() / pb })
}
