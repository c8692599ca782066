//! Teacher-forced scoring through the decode path, with per-step cache figures.
//!
//! The prompt is prefilled (libtorch, filling the cache) — or, with [`PromptPath::Decode`],
//! fed token by token through the cache as an engine that runs the whole text through its
//! cache does — then every target token is scored
//! and fed back one at a time through [`Session::decode`] — so every prediction after the
//! first is made by the cache under test (`papers/swan.txt` decode step; `papers/wnw.txt`
//! §3.5–3.9: accuracy, measured retention, recall bytes and time per decoded token). Unlike
//! [`models::session::score`], the loop can sample the cache after every step (WnW Figure 4: KV size
//! over decode steps).

use std::time::Instant;

use serde::Serialize;
use tch::{Kind, Tensor};

use crate::error::{Result, TorchOp, invalid};
use models::cache::{CacheBytes, KvCache};
use models::llama::{BatchScratch, Llama};
use models::session::Session;
use models::session::generate::argmax;

/// How [`teacher_force_texts`] puts each prompt into its cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PromptPath {
    /// One exact forward over the prompt ([`Llama::prefill_shared`]): the prompt's positions
    /// attend to each other's exact K/V, and the cache receives their rows afterwards.
    Prefill,
    /// Token by token through the decode path ([`Llama::decode_batch`]), as an engine that
    /// runs the whole text through its cache does (llama.cpp's perplexity tool): every
    /// prompt position attends to the rows the cache holds, its own included, as the cache
    /// stores them — so a quantized cache's rounding reaches even the first position's
    /// hidden states (a lone first token attends to nothing but its own stored value).
    Decode,
}

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
    /// The cache's own figures at the end ([`models::KvCache::stats`]).
    pub stats: Vec<(String, f64)>,
    /// Per-step samples (empty unless asked for).
    pub samples: Vec<StepSample>,
    /// Caches that shared each decode step's model matmuls (1 for [`teacher_force`]; see
    /// [`teacher_force_batch`]).
    pub batch: usize,
    /// Seconds spent inside this cache (append, attention, end of step) during decode, when
    /// measured separately from the model ([`teacher_force_batch`]).
    pub cache_s: Option<f64>,
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

/// [`score_one`] for every row of `logits` (`[batch, vocab]`) at once: row `b` scored
/// against `targets[b]`.
fn score_rows(logits: &Tensor, targets: &[u32]) -> Result<Vec<(f64, bool)>> {
    let lp = logits.f_log_softmax(1, Kind::Float).op("log_softmax")?;
    let ids: Vec<i64> = targets.iter().map(|&t| i64::from(t)).collect();
    let index = Tensor::f_from_slice(&ids).op("targets")?.f_unsqueeze(1).op("targets")?;
    let picked = lp.f_gather(1, &index, false).op("gather")?.f_flatten(0, -1).op("flatten")?;
    let lp = Vec::<f32>::try_from(&picked).op("log probs")?;
    let best = Vec::<i64>::try_from(&logits.f_argmax(1, false).op("argmax")?).op("argmax")?;
    Ok(lp.iter().zip(best).zip(ids).map(|((&lp, b), t)| (-f64::from(lp), b == t)).collect())
}

fn sample(session: &Session, step: usize) -> StepSample {
    sample_cache(session.cache(), step)
}

fn sample_cache(cache: &dyn KvCache, step: usize) -> StepSample {
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
        batch: 1,
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

/// Groups `models` by weights ([`Llama::same_weights`]): each group is its first model and
/// the positions of every model that computes with the same weights, in order — the
/// caches built alongside one group's models may share a [`teacher_force_batch`].
///
/// The models are taken one at a time and a duplicate is dropped as soon as its group is
/// found, so a lazy iterator that builds each model on demand holds only the distinct weight
/// sets at once (a grid of hundreds of absorbed-basis configurations would otherwise hold a
/// copy of the weights per configuration).
///
/// # Errors
/// The first error the iterator yields; [`crate::Error::Torch`] if a weight comparison fails.
pub fn group_by_weights(
    models: impl IntoIterator<Item = Result<Llama>>,
) -> Result<Vec<(Llama, Vec<usize>)>> {
    let mut groups: Vec<(Llama, Vec<usize>)> = Vec::new();
    'next: for (i, model) in models.into_iter().enumerate() {
        let model = model?;
        for (m, members) in &mut groups {
            if m.same_weights(&model)? {
                members.push(i);
                continue 'next;
            }
        }
        groups.push((model, vec![i]));
    }
    Ok(groups)
}

/// [`teacher_force`] for several caches of one model at once: the fresh caches are
/// prefilled with `prompt` by one shared forward ([`Llama::prefill_shared`]: every cache
/// receives the K/V rows it would have received on its own), then every target is scored
/// for every cache and fed
/// to all of them in one [`Llama::decode_batch`] step, so the model's weights are read once
/// per step for the whole batch (the SWAN grid evaluates many caches over the same text).
/// [`teacher_force_texts`] is the same over a different text per cache.
///
/// Each trace's `decode_s` is its cache's own time plus an equal share of the batch's
/// model time; `cache_s` is the cache's own time alone. With `sample_steps`, every cache is
/// recorded after every step.
///
/// # Errors
/// [`crate::Error::InvalidInput`] for an empty prompt, target list or batch, or a cache
/// that is not empty; forward and cache errors.
pub fn teacher_force_batch(
    model: &Llama,
    caches: &mut [Box<dyn KvCache>],
    prompt: &[u32],
    targets: &[u32],
    sample_steps: bool,
) -> Result<Vec<Trace>> {
    let texts = vec![(prompt, targets); caches.len()];
    teacher_force_texts(model, caches, &texts, PromptPath::Prefill, sample_steps, 1)
}

/// [`teacher_force_batch`] with text `texts[b] = (prompt, targets)` for `caches[b]`: the
/// texts may differ (several evaluation windows of one configuration share a batch) but
/// must have prompts of one length and target lists of one length, so every member decodes
/// at the same position each step. `prompt` says how the prompts enter the caches (with
/// [`PromptPath::Decode`] a trace's `prefill_s` is the prompt steps' share of time).
/// `workers` threads serve the members' caches each step
/// ([`BatchScratch::with_workers`]; for caches built with `threads=1`): scores are the same
/// for any count, time figures are per thread.
///
/// # Errors
/// [`crate::Error::InvalidInput`] for an empty batch, empty prompts or target lists,
/// texts of different lengths, `texts` and `caches` of different lengths, or a cache that
/// is not empty; forward and cache errors.
pub fn teacher_force_texts(
    model: &Llama,
    caches: &mut [Box<dyn KvCache>],
    texts: &[(&[u32], &[u32])],
    prompt: PromptPath,
    sample_steps: bool,
    workers: usize,
) -> Result<Vec<Trace>> {
    const OP: &str = "batched teacher-forced decode";
    let Some(&(first_prompt, first_targets)) = texts.first() else {
        return Err(invalid(OP, "need at least one cache and text"));
    };
    let (prompt_len, target_len) = (first_prompt.len(), first_targets.len());
    if prompt_len == 0 || target_len == 0 {
        return Err(invalid(OP, "need a prompt and at least one target"));
    }
    if texts.len() != caches.len() {
        return Err(invalid(OP, format!("{} texts for {} caches", texts.len(), caches.len())));
    }
    if let Some((p, t)) = texts.iter().find(|(p, t)| p.len() != prompt_len || t.len() != target_len)
    {
        return Err(invalid(
            OP,
            format!(
                "texts of different lengths: prompt {} / {} targets vs {prompt_len} / {target_len}",
                p.len(),
                t.len()
            ),
        ));
    }
    let batch = caches.len();
    for cache in caches.iter_mut() {
        if !cache.is_empty() {
            return Err(invalid(OP, format!("cache already holds {} tokens", cache.len())));
        }
        cache.reserve(prompt_len + target_len)?;
    }
    let (mut logits, prefill_s) = match prompt {
        PromptPath::Prefill => prefill_prompts(model, caches, texts)?,
        PromptPath::Decode => decode_prompts(model, caches, texts, workers)?,
    };
    let mut traces: Vec<Trace> = caches
        .iter()
        .zip(&prefill_s)
        .map(|(cache, &prefill_s)| Trace {
            nll: Vec::with_capacity(target_len),
            hit: Vec::with_capacity(target_len),
            prefill_s,
            after_prefill: cache.bytes(),
            batch,
            ..Trace::default()
        })
        .collect();
    let mut scratch = BatchScratch::new(model.config(), batch)?.with_workers(workers);
    let mut ids = vec![0u32; batch];
    let (mut wall, mut steps) = (0.0, 0);
    {
        let mut refs = dyn_caches(caches);
        for i in 0..target_len {
            for (id, &(_, targets)) in ids.iter_mut().zip(texts) {
                *id = targets[i];
            }
            for (trace, (nll, hit)) in traces.iter_mut().zip(score_rows(&logits, &ids)?) {
                trace.nll.push(nll);
                trace.hit.push(hit);
            }
            if i + 1 < target_len {
                let t = Instant::now();
                let all = model.decode_batch(&ids, prompt_len + i, &mut refs, &mut scratch)?;
                logits = all;
                wall += t.elapsed().as_secs_f64();
                steps += 1;
                if sample_steps {
                    for (trace, cache) in traces.iter_mut().zip(refs.iter()) {
                        trace.samples.push(sample_cache(&**cache, steps));
                    }
                }
            }
        }
    }
    let own = scratch.cache_seconds();
    let shared = (wall - own.iter().sum::<f64>()).max(0.0) / batch as f64;
    for ((trace, cache), &own) in traces.iter_mut().zip(caches.iter()).zip(own) {
        trace.steps = steps;
        trace.cache_s = Some(own);
        trace.decode_s = own + shared;
        trace.at_end = cache.bytes();
        trace.stats = cache.stats().into_iter().map(|(k, v)| (k.to_owned(), v)).collect();
    }
    Ok(traces)
}

/// The batch as the trait objects [`Llama::decode_batch`] steps.
fn dyn_caches(caches: &mut [Box<dyn KvCache>]) -> Vec<&mut dyn KvCache> {
    caches
        .iter_mut()
        .map(|c| {
            let r: &mut dyn KvCache = c.as_mut();
            r
        })
        .collect()
}

/// [`PromptPath::Prefill`]: one prefill per distinct prompt, shared by every cache of that
/// prompt ([`Llama::prefill_shared`]); each cache is charged an equal share of its time.
/// Returns the logits after the prompts (`[batch, vocab]`) and each cache's prefill time.
fn prefill_prompts(
    model: &Llama,
    caches: &mut [Box<dyn KvCache>],
    texts: &[(&[u32], &[u32])],
) -> Result<(Tensor, Vec<f64>)> {
    let batch = caches.len();
    let mut first_logits: Vec<Option<Tensor>> = (0..batch).map(|_| None).collect();
    let mut prefill_s = vec![0.0; batch];
    for b in 0..batch {
        if first_logits[b].is_some() {
            continue;
        }
        let prompt = texts[b].0;
        let members: Vec<usize> =
            (b..batch).filter(|&i| first_logits[i].is_none() && texts[i].0 == prompt).collect();
        let mut group: Vec<&mut dyn KvCache> = caches
            .iter_mut()
            .enumerate()
            .filter(|(i, _)| members.contains(i))
            .map(|(_, c)| {
                let r: &mut dyn KvCache = c.as_mut();
                r
            })
            .collect();
        let t0 = Instant::now();
        let l = model.prefill_shared(prompt, &mut group)?.f_squeeze_dim(0).op("squeeze")?;
        let share = t0.elapsed().as_secs_f64() / members.len() as f64;
        for &i in &members {
            first_logits[i] = Some(l.shallow_clone());
            prefill_s[i] = share;
        }
    }
    let rows: Vec<Tensor> = first_logits.into_iter().flatten().collect();
    Ok((Tensor::f_stack(&rows, 0).op("stack logits")?, prefill_s))
}

/// [`PromptPath::Decode`]: every prompt token fed to every cache by one
/// [`Llama::decode_batch`] step per position. Returns the logits after the last prompt
/// token and each cache's equal share of the steps' time.
fn decode_prompts(
    model: &Llama,
    caches: &mut [Box<dyn KvCache>],
    texts: &[(&[u32], &[u32])],
    workers: usize,
) -> Result<(Tensor, Vec<f64>)> {
    let batch = caches.len();
    let mut scratch = BatchScratch::new(model.config(), batch)?.with_workers(workers);
    let mut refs = dyn_caches(caches);
    let mut ids = vec![0u32; batch];
    let t0 = Instant::now();
    let mut logits = None;
    for position in 0..texts.first().map_or(0, |(p, _)| p.len()) {
        for (id, &(prompt, _)) in ids.iter_mut().zip(texts) {
            *id = prompt[position];
        }
        logits = Some(model.decode_batch(&ids, position, &mut refs, &mut scratch)?);
    }
    let logits = logits.ok_or_else(|| invalid("prompt through the decode path", "empty prompt"))?;
    Ok((logits, vec![t0.elapsed().as_secs_f64() / batch as f64; batch]))
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
