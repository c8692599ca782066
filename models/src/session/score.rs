//! Teacher-forced scoring through the decode path: prefill a prefix, then feed the true
//! tokens one at a time through the cache and score each next token — the perplexity the
//! cache configuration actually delivers at decode time.

use std::time::Instant;

use tch::{Kind, Tensor};

use crate::error::{Result, TorchOp, invalid};
use crate::session::Session;
use crate::session::generate::argmax;

/// Per-token results of [`score`].
#[derive(Clone, Debug, Default)]
pub struct Scores {
    /// Negative log-likelihood (nats) of each predicted token, `ids[prefix..]`.
    pub nll: Vec<f64>,
    /// Arg-max prediction at each of those positions.
    pub argmax: Vec<u32>,
    /// Seconds spent in prefill.
    pub prefill_s: f64,
    /// Seconds spent decoding.
    pub decode_s: f64,
    /// Tokens fed through the decode path.
    pub decoded: usize,
}

impl Scores {
    /// `exp(mean NLL)`.
    pub fn perplexity(&self) -> f64 {
        if self.nll.is_empty() {
            f64::NAN
        } else {
            (self.nll.iter().sum::<f64>() / self.nll.len() as f64).exp()
        }
    }

    /// Decode throughput in tokens per second.
    pub fn decode_tokens_per_s(&self) -> f64 {
        if self.decode_s > 0.0 { self.decoded as f64 / self.decode_s } else { 0.0 }
    }
}

fn nll(logits: &Tensor, target: u32) -> Result<f64> {
    let lp = logits.f_log_softmax(0, Kind::Float).op("log_softmax")?;
    Ok(-lp.f_double_value(&[i64::from(target)]).op("log prob")?)
}

/// Whether [`score`] can run on a text of `len` tokens with `prefix` of them prefilled: a
/// caller that builds its caches first can refuse before it does, with the same rule.
///
/// # Errors
/// [`crate::Error::InvalidInput`] naming `op` if `prefix` is not below `len` or `len` is
/// below 2 (nothing would be scored).
pub fn check_prefix(op: &'static str, prefix: usize, len: usize) -> Result<()> {
    if prefix >= len || len < 2 {
        return Err(invalid(
            op,
            format!("prefix {prefix} must be in 0..{len} (and at least 2 tokens)"),
        ));
    }
    Ok(())
}

/// Prefills `ids[..prefix]`, then decodes `ids[prefix..n-1]` one by one, scoring the
/// prediction of every `ids[p]`, `p ≥ prefix`. With `prefix` 0 nothing is prefilled: `ids[0]`
/// goes through the decode path too — stored in the cache's format and attending to its own
/// stored row, as an engine that runs the whole text through its cache does (llama.cpp's
/// perplexity tool) — and scoring starts at `ids[1]` (that first step's time is
/// `prefill_s`, and `decoded` counts the steps after it). `on_logits(p, logits)` sees the
/// logits that predict `ids[p]` (`[vocab]`), e.g. to compare two caches position by
/// position; `on_step` is called after each decoded token (progress bars).
///
/// # Errors
/// [`crate::Error::InvalidInput`] if `prefix` is not below `ids.len()` (or `ids` has fewer
/// than 2 tokens); forward, cache and callback errors.
pub fn score(
    session: &mut Session,
    ids: &[u32],
    prefix: usize,
    on_logits: &mut dyn FnMut(usize, &Tensor) -> Result<()>,
    on_step: &mut dyn FnMut(usize),
) -> Result<Scores> {
    check_prefix("score", prefix, ids.len())?;
    session.reserve(ids.len())?;
    let first = prefix.max(1);
    let mut out = Scores { nll: Vec::with_capacity(ids.len() - first), ..Scores::default() };
    let t0 = Instant::now();
    let mut logits =
        if prefix == 0 { session.decode(ids[0])? } else { session.prefill(&ids[..prefix])? };
    out.prefill_s = t0.elapsed().as_secs_f64();
    let t1 = Instant::now();
    for p in first..ids.len() {
        on_logits(p, &logits)?;
        out.nll.push(nll(&logits, ids[p])?);
        out.argmax.push(argmax(&logits)?);
        if p + 1 < ids.len() {
            logits = session.decode(ids[p])?;
            out.decoded += 1;
            on_step(out.decoded);
        }
    }
    out.decode_s = t1.elapsed().as_secs_f64();
    Ok(out)
}
