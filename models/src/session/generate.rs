//! Greedy generation: prefill the prompt, then repeatedly take the arg-max token and feed
//! it back through the decode path until a stop token or the token budget.

use std::time::Instant;

use tch::Tensor;

use crate::error::{Result, TorchOp, invalid};
use crate::session::Session;

/// Why generation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopReason {
    /// A stop token was produced (it is included in the output).
    StopToken(u32),
    /// `max_new_tokens` were produced.
    Length,
}

/// What greedy generation produced.
#[derive(Clone, Debug)]
pub struct Generation {
    /// Generated ids (not including the prompt).
    pub ids: Vec<u32>,
    /// Why it stopped.
    pub stop: StopReason,
    /// Seconds spent in prefill.
    pub prefill_s: f64,
    /// Seconds spent decoding.
    pub decode_s: f64,
}

impl Generation {
    /// Decode throughput (tokens fed through the decode path per second).
    pub fn decode_tokens_per_s(&self) -> f64 {
        let fed = self.ids.len().saturating_sub(1) as f64;
        if self.decode_s > 0.0 { fed / self.decode_s } else { 0.0 }
    }
}

/// The highest-scoring id of `logits` (`[vocab]`; ties → lowest id).
///
/// # Errors
/// [`crate::Error::Torch`] if the tensor is not one-dimensional.
pub fn argmax(logits: &Tensor) -> Result<u32> {
    let id = logits.f_argmax(0, false).op("argmax")?.f_int64_value(&[]).op("argmax value")?;
    u32::try_from(id).map_err(|_| invalid("argmax", format!("id {id} out of range")))
}

/// Greedy decoding of up to `max_new_tokens` after `prompt`, stopping after any id in
/// `stop`; `on_token` sees each id as it is produced (for streaming output).
///
/// # Errors
/// [`crate::Error::InvalidInput`] for an empty prompt or a session that is not fresh;
/// forward and cache errors.
pub fn greedy(
    session: &mut Session,
    prompt: &[u32],
    max_new_tokens: usize,
    stop: &[u32],
    on_token: &mut dyn FnMut(u32) -> Result<()>,
) -> Result<Generation> {
    session.reserve(prompt.len() + max_new_tokens)?;
    let t0 = Instant::now();
    let logits = session.prefill(prompt)?;
    let prefill_s = t0.elapsed().as_secs_f64();
    let t1 = Instant::now();
    let (ids, stop) =
        greedy_loop(logits, max_new_tokens, stop, on_token, &mut |id| session.decode(id))?;
    Ok(Generation { ids, stop, prefill_s, decode_s: t1.elapsed().as_secs_f64() })
}

/// Greedy decoding of up to `max_new_tokens` from a session already holding a prompt
/// (e.g. after [`Session::resume`]) whose next-token logits are `logits` (`[vocab]`);
/// otherwise as [`greedy`] (`prefill_s` is 0: no prefill ran).
///
/// # Errors
/// [`crate::Error::Torch`] if the logits do not form a tensor; forward and cache errors.
pub fn greedy_from(
    session: &mut Session,
    logits: &[f32],
    max_new_tokens: usize,
    stop: &[u32],
    on_token: &mut dyn FnMut(u32) -> Result<()>,
) -> Result<Generation> {
    session.reserve(max_new_tokens)?;
    let t1 = Instant::now();
    let logits = Tensor::f_from_slice(logits).op("logits tensor")?;
    let (ids, stop) =
        greedy_loop(logits, max_new_tokens, stop, on_token, &mut |id| session.decode(id))?;
    Ok(Generation { ids, stop, prefill_s: 0.0, decode_s: t1.elapsed().as_secs_f64() })
}

/// The arg-max loop every greedy decode shares: from the prompt's `logits`, take the
/// arg-max id, hand it to `on_token`, stop after a `stop` id or `max_new_tokens`, else feed
/// it through `step` (one decode step, returning the next logits `[vocab]`).
pub(crate) fn greedy_loop(
    mut logits: Tensor,
    max_new_tokens: usize,
    stop: &[u32],
    on_token: &mut dyn FnMut(u32) -> Result<()>,
    step: &mut dyn FnMut(u32) -> Result<Tensor>,
) -> Result<(Vec<u32>, StopReason)> {
    let mut ids = Vec::with_capacity(max_new_tokens);
    while ids.len() < max_new_tokens {
        let next = argmax(&logits)?;
        ids.push(next);
        on_token(next)?;
        if stop.contains(&next) {
            return Ok((ids, StopReason::StopToken(next)));
        }
        if ids.len() < max_new_tokens {
            logits = step(next)?;
        }
    }
    Ok((ids, StopReason::Length))
}
