//! Calibration score helpers a model runtime feeds (WnW §2.2, Appendix E):
//!
//! * **voice score** (Eq. 3): per q-head and answer token, the fraction of the head's top-`K`
//!   attended audio positions that fall inside the token's word-aligned span
//!   `[⌊a_t·r_tok⌋, ⌊b_t·r_tok⌋)`; averaged over tokens, then over calibration samples, then
//!   over the `g` q-heads of each GQA group → `VS_{l,k}`;
//! * **head sensitivity** (Eq. 4–5): per KV-head, the ℓ2 norm of the answer-token loss
//!   gradient w.r.t. each audio key, averaged over audio positions, tokens, then samples →
//!   `HS_{l,k}`. The runtime computes the gradients (autograd); this module aggregates.
//!
//! Both accumulators average in the nested order of Eq. 5: tokens within a sample first
//! ([`VoiceScoreAccumulator::finish_sample`]), then samples. Filtering tokens by alignment
//! confidence (≥ 0.85 in the paper) is the caller's job: only observe confident tokens.

use std::ops::Range;

use crate::error::{Error, Result, check_finite, check_scores, param};
use crate::topk::top_k_into;

/// The audio-index span `[⌊start·r_tok⌋, ⌊end·r_tok⌋)` of a word aligned at
/// `[start_s, end_s)` seconds from the start of the audio (Appendix E).
///
/// # Errors
/// [`Error::Param`] if times or rate are negative/non-finite or `end_s < start_s`;
/// [`Error::AudioSpan`] if the span ends past `audio_len`.
///
/// # Examples
/// ```
/// let span = kv_tiered::scores::aligned_span(1.0, 1.5, 12.5, 3000)?;
/// assert_eq!(span, 12..18);
/// # Ok::<(), kv_tiered::Error>(())
/// ```
pub fn aligned_span(
    start_s: f64,
    end_s: f64,
    tokens_per_second: f64,
    audio_len: usize,
) -> Result<Range<usize>> {
    const OP: &str = "aligned_span";
    for (name, v) in
        [("start_s", start_s), ("end_s", end_s), ("tokens_per_second", tokens_per_second)]
    {
        if !(v.is_finite() && v >= 0.0) {
            return Err(param(OP, name, v, "finite and ≥ 0"));
        }
    }
    if end_s < start_s {
        return Err(param(OP, "end_s", end_s, "≥ start_s"));
    }
    let a = (start_s * tokens_per_second).floor() as usize;
    let b = (end_s * tokens_per_second).floor() as usize;
    if b > audio_len {
        return Err(Error::AudioSpan { start: a, end: b, seq_len: audio_len });
    }
    Ok(a..b)
}

/// Eq. 3 for one q-head and token: the fraction of the `k` largest entries of `attn` (softmax
/// weights at audio positions) whose index lies in `span`.
///
/// # Errors
/// [`Error::NonFinite`] for NaN/∞ weights; [`Error::Param`] if `k == 0` or `k > attn.len()`;
/// [`Error::AudioSpan`] if `span` is not inside `0..attn.len()`.
///
/// # Examples
/// ```
/// let attn = [0.05, 0.4, 0.3, 0.05, 0.2];
/// assert_eq!(kv_tiered::scores::hit_ratio(&attn, 1..3, 4)?, 0.5);
/// # Ok::<(), kv_tiered::Error>(())
/// ```
pub fn hit_ratio(attn: &[f32], span: Range<usize>, k: usize) -> Result<f32> {
    let mut scratch = Vec::with_capacity(attn.len());
    hit_ratio_with(attn, span, k, &mut scratch)
}

fn hit_ratio_with(
    attn: &[f32],
    span: Range<usize>,
    k: usize,
    scratch: &mut Vec<u32>,
) -> Result<f32> {
    const OP: &str = "hit_ratio";
    check_finite(OP, "attn", attn)?;
    if k == 0 || k > attn.len() {
        return Err(param(OP, "k", k, "1 ≤ k ≤ number of audio positions"));
    }
    if span.start > span.end || span.end > attn.len() {
        return Err(Error::AudioSpan { start: span.start, end: span.end, seq_len: attn.len() });
    }
    top_k_into(attn, k, 0, scratch);
    let hits = scratch.iter().filter(|&&i| span.contains(&(i as usize))).count();
    Ok(hits as f32 / k as f32)
}

/// Nested mean per head: mean over observations within a sample, then over samples.
#[derive(Clone, Debug)]
struct NestedMean {
    sample_sum: Vec<f64>,
    sample_count: Vec<u64>,
    total: Vec<f64>,
    samples: Vec<u64>,
}

impl NestedMean {
    fn new(n: usize) -> Self {
        Self {
            sample_sum: vec![0.0; n],
            sample_count: vec![0; n],
            total: vec![0.0; n],
            samples: vec![0; n],
        }
    }
    fn add(&mut self, i: usize, x: f64) {
        self.sample_sum[i] += x;
        self.sample_count[i] += 1;
    }
    fn finish_sample(&mut self) {
        for i in 0..self.total.len() {
            if self.sample_count[i] > 0 {
                self.total[i] += self.sample_sum[i] / self.sample_count[i] as f64;
                self.samples[i] += 1;
            }
            self.sample_sum[i] = 0.0;
            self.sample_count[i] = 0;
        }
    }
    fn mean(&self, i: usize) -> Option<f64> {
        (self.samples[i] > 0).then(|| self.total[i] / self.samples[i] as f64)
    }
}

/// Accumulates Eq. 3 hit ratios over answer tokens and calibration samples.
#[derive(Clone, Debug)]
pub struct VoiceScoreAccumulator {
    layers: usize,
    q_heads: usize,
    kv_heads: usize,
    top_k: usize,
    acc: NestedMean,
    scratch: Vec<u32>,
}

impl VoiceScoreAccumulator {
    /// An accumulator for `layers × q_heads` q-heads in GQA groups of `q_heads / kv_heads`,
    /// counting hits among the top `top_k` positions (`K = 4` for Voxtral, 8 for Qwen2.5-Omni).
    ///
    /// # Errors
    /// [`Error::Param`] if a size is zero, `q_heads` is not a multiple of `kv_heads`, or
    /// `top_k == 0`.
    pub fn new(layers: usize, q_heads: usize, kv_heads: usize, top_k: usize) -> Result<Self> {
        const OP: &str = "VoiceScoreAccumulator::new";
        if layers == 0 || kv_heads == 0 || q_heads == 0 || !q_heads.is_multiple_of(kv_heads) {
            return Err(param(
                OP,
                "layers/q_heads/kv_heads",
                format!("{layers}/{q_heads}/{kv_heads}"),
                "non-zero, q_heads a multiple of kv_heads",
            ));
        }
        if top_k == 0 {
            return Err(param(OP, "top_k", 0, "≥ 1"));
        }
        let acc = NestedMean::new(layers * q_heads);
        Ok(Self { layers, q_heads, kv_heads, top_k, acc, scratch: Vec::new() })
    }

    /// Observes one answer token for q-head `(layer, q_head)`: its softmax weights at the audio
    /// positions and the token's aligned span (see [`aligned_span`]).
    ///
    /// # Errors
    /// [`Error::HeadOutOfRange`] for a bad head; as [`hit_ratio`] otherwise.
    pub fn observe(
        &mut self,
        layer: usize,
        q_head: usize,
        attn: &[f32],
        span: Range<usize>,
    ) -> Result<()> {
        if layer >= self.layers || q_head >= self.q_heads {
            return Err(Error::HeadOutOfRange {
                op: "VoiceScoreAccumulator::observe",
                layer,
                kv_head: q_head,
                layers: self.layers,
                kv_heads: self.q_heads,
            });
        }
        let hit = hit_ratio_with(attn, span, self.top_k, &mut self.scratch)?;
        self.acc.add(layer * self.q_heads + q_head, f64::from(hit));
        Ok(())
    }

    /// Closes the current calibration sample (its token mean enters the sample average).
    pub fn finish_sample(&mut self) {
        self.acc.finish_sample();
    }

    /// `VS_{l,k}` for every KV-head (index `layer · kv_heads + kv_head`): the mean over the
    /// group's q-heads of their sample-averaged hit ratios. Call after the last
    /// [`finish_sample`](Self::finish_sample).
    ///
    /// # Errors
    /// [`Error::Param`] if some q-head was never observed in a finished sample.
    pub fn voice_scores(&self) -> Result<Vec<f32>> {
        let g = self.q_heads / self.kv_heads;
        let mut out = Vec::with_capacity(self.layers * self.kv_heads);
        for l in 0..self.layers {
            for k in 0..self.kv_heads {
                let mut sum = 0.0;
                for j in 0..g {
                    let q = l * self.q_heads + k * g + j;
                    sum += self.acc.mean(q).ok_or_else(|| {
                        param(
                            "VoiceScoreAccumulator::voice_scores",
                            "q_head",
                            q,
                            "observed in ≥ 1 finished sample",
                        )
                    })?;
                }
                out.push((sum / g as f64) as f32);
            }
        }
        Ok(out)
    }
}

/// Accumulates Eq. 4–5 head sensitivities from runtime-supplied key gradients.
#[derive(Clone, Debug)]
pub struct HeadSensitivityAccumulator {
    layers: usize,
    kv_heads: usize,
    acc: NestedMean,
}

impl HeadSensitivityAccumulator {
    /// An accumulator for `layers × kv_heads` KV-heads.
    ///
    /// # Errors
    /// [`Error::Param`] for an empty grid.
    pub fn new(layers: usize, kv_heads: usize) -> Result<Self> {
        if layers == 0 || kv_heads == 0 {
            return Err(param(
                "HeadSensitivityAccumulator::new",
                "layers × kv_heads",
                format!("{layers} × {kv_heads}"),
                "non-empty",
            ));
        }
        Ok(Self { layers, kv_heads, acc: NestedMean::new(layers * kv_heads) })
    }

    fn index(&self, op: &'static str, layer: usize, kv_head: usize) -> Result<usize> {
        if layer >= self.layers || kv_head >= self.kv_heads {
            return Err(Error::HeadOutOfRange {
                op,
                layer,
                kv_head,
                layers: self.layers,
                kv_heads: self.kv_heads,
            });
        }
        Ok(layer * self.kv_heads + kv_head)
    }

    /// Observes one answer token for a KV-head given `S^key_τ = ‖∂L/∂K_τ‖` at every audio
    /// position τ (Eq. 4); adds `mean_τ S^key_τ`.
    ///
    /// # Errors
    /// [`Error::HeadOutOfRange`], [`Error::Shape`] for an empty slice,
    /// [`Error::NonFinite`]/[`Error::Negative`] for bad norms.
    pub fn observe_norms(&mut self, layer: usize, kv_head: usize, norms: &[f32]) -> Result<()> {
        const OP: &str = "HeadSensitivityAccumulator::observe_norms";
        let i = self.index(OP, layer, kv_head)?;
        if norms.is_empty() {
            return Err(Error::Shape { op: OP, what: "norms", expected: 1, got: 0 });
        }
        check_scores(OP, "norms", norms)?;
        let mean = norms.iter().map(|&x| f64::from(x)).sum::<f64>() / norms.len() as f64;
        self.acc.add(i, mean);
        Ok(())
    }

    /// As [`observe_norms`](Self::observe_norms) from the raw gradient rows
    /// `∂L/∂K_τ` (`audio_len × head_dim`, row-major).
    ///
    /// # Errors
    /// [`Error::Shape`] if `grads.len()` is not a non-zero multiple of `head_dim`;
    /// [`Error::NonFinite`] for NaN/∞ gradients.
    ///
    /// # Examples
    /// ```
    /// use kv_tiered::scores::HeadSensitivityAccumulator;
    /// let mut hs = HeadSensitivityAccumulator::new(1, 1)?;
    /// hs.observe_gradients(0, 0, &[3.0, 4.0, 0.0, 0.0], 2)?; // norms 5 and 0
    /// hs.finish_sample();
    /// assert_eq!(hs.sensitivities()?, [2.5]);
    /// # Ok::<(), kv_tiered::Error>(())
    /// ```
    pub fn observe_gradients(
        &mut self,
        layer: usize,
        kv_head: usize,
        grads: &[f32],
        head_dim: usize,
    ) -> Result<()> {
        const OP: &str = "HeadSensitivityAccumulator::observe_gradients";
        let i = self.index(OP, layer, kv_head)?;
        if head_dim == 0 || grads.is_empty() || !grads.len().is_multiple_of(head_dim) {
            return Err(Error::Shape {
                op: OP,
                what: "grads",
                expected: head_dim.max(1),
                got: grads.len(),
            });
        }
        check_finite(OP, "grads", grads)?;
        let rows = grads.len() / head_dim;
        let sum: f64 = grads
            .chunks_exact(head_dim)
            .map(|r| r.iter().map(|&x| f64::from(x) * f64::from(x)).sum::<f64>().sqrt())
            .sum();
        self.acc.add(i, sum / rows as f64);
        Ok(())
    }

    /// Closes the current calibration sample.
    pub fn finish_sample(&mut self) {
        self.acc.finish_sample();
    }

    /// `HS_{l,k}` for every KV-head.
    ///
    /// # Errors
    /// [`Error::Param`] if some head was never observed in a finished sample.
    pub fn sensitivities(&self) -> Result<Vec<f32>> {
        (0..self.layers * self.kv_heads)
            .map(|i| {
                self.acc.mean(i).map(|m| m as f32).ok_or_else(|| {
                    param(
                        "HeadSensitivityAccumulator::sensitivities",
                        "head",
                        i,
                        "observed in ≥ 1 finished sample",
                    )
                })
            })
            .collect()
    }
}
