//! The prompt as the tiered cache collects it during prefill: every layer's K/V (rotated by
//! `P_QK` for `swan+tiered`) and the per-head span scores (`papers/wnw.txt` §2.3:
//! `p_{l,k,τ} = Σ_t attn_{l,k,t,τ}`, summed over the GQA group), turned into a
//! `kv-tiered` store after the last layer.

use std::ops::Range;

use kv_tiered::policy::PrefillSignal;
use kv_tiered::{DensePromptKv, RowCodec, RowLayout, StoreConfig, TieredStore};
use projection::ProjectionSet;

use super::{SpanRows, TieredSpec};
use crate::cache::{AttentionRequest, CacheShape, LayerKv};
use crate::error::{Result, invalid};

/// Prompt K/V and span scores of every layer, until the store is built.
pub(super) struct Prompt {
    shape: CacheShape,
    span: Range<usize>,
    tokens: usize,
    /// `[layer][kv_head][position][dim]`.
    keys: Vec<f32>,
    values: Vec<f32>,
    /// `[layer·kv_heads + kv_head][span position]`.
    scores: Vec<f32>,
    query_rows: usize,
    scored: Vec<bool>,
    filled: Vec<bool>,
}

impl Prompt {
    pub(super) fn new(shape: CacheShape, span: Range<usize>, tokens: usize) -> Result<Self> {
        let n = shape.layers * shape.kv_heads() * tokens * shape.head_dim();
        Ok(Self {
            shape,
            tokens,
            keys: vec![0.0; n],
            values: vec![0.0; n],
            scores: vec![0.0; shape.layers * shape.kv_heads() * span.len()],
            span,
            query_rows: 0,
            scored: vec![false; shape.layers],
            filled: vec![false; shape.layers],
        })
    }

    /// The attention statistic `signal` needs, remembering how many query rows it sums.
    pub(super) fn request(&mut self, signal: PrefillSignal) -> Option<AttentionRequest> {
        let queries = match signal {
            PrefillSignal::None => return None,
            PrefillSignal::TextToAudio => self.span.end..self.tokens,
            PrefillSignal::LastTokens(w) => self.tokens.saturating_sub(w)..self.tokens,
        };
        self.query_rows = queries.len();
        Some(AttentionRequest { keys: self.span.clone(), queries })
    }

    /// Adds one layer's `[q_heads][span]` sums, folded over each kv-head's group.
    pub(super) fn add_scores(&mut self, layer: usize, received: &[f32]) -> Result<()> {
        let (s, g, kv) = (self.span.len(), self.shape.group(), self.shape.kv_heads());
        if layer >= self.shape.layers || received.len() != self.shape.q_heads() * s {
            let reason = format!(
                "layer {layer}: {} sums, expected {}",
                received.len(),
                self.shape.q_heads() * s
            );
            return Err(invalid("tiered prefill attention", reason));
        }
        if received.iter().any(|x| !x.is_finite() || *x < 0.0) {
            return Err(invalid(
                "tiered prefill attention",
                format!("layer {layer}: negative or non-finite sums"),
            ));
        }
        let dst = &mut self.scores[layer * kv * s..(layer + 1) * kv * s];
        dst.fill(0.0);
        for (qh, row) in received.chunks_exact(s).enumerate() {
            let head = &mut dst[(qh / g) * s..(qh / g + 1) * s];
            head.iter_mut().zip(row).for_each(|(a, b)| *a += b);
        }
        self.scored[layer] = true;
        Ok(())
    }

    /// Stores one layer's K/V, rotating keys into `set`'s `P_QK` basis when given.
    pub(super) fn add_layer(
        &mut self,
        layer: usize,
        kv: &LayerKv<'_>,
        set: Option<&ProjectionSet>,
    ) -> Result<()> {
        if kv.tokens != self.tokens {
            return Err(invalid(
                "tiered prefill",
                format!("{} tokens in layer {layer}, prompt has {}", kv.tokens, self.tokens),
            ));
        }
        let per_layer = self.shape.kv_heads() * self.tokens * self.shape.head_dim();
        let (keys, values) = (
            &mut self.keys[layer * per_layer..(layer + 1) * per_layer],
            &mut self.values[layer * per_layer..(layer + 1) * per_layer],
        );
        values.copy_from_slice(kv.values);
        match set {
            None => keys.copy_from_slice(kv.keys),
            Some(set) => {
                let n = self.tokens * self.shape.head_dim();
                for (h, (src, dst)) in
                    kv.keys.chunks_exact(n).zip(keys.chunks_exact_mut(n)).enumerate()
                {
                    projection::rotate_rows(src, set.qk(layer, h)?, dst)?;
                }
            }
        }
        self.filled[layer] = true;
        Ok(())
    }

    /// Bytes buffered (f32 keys and values).
    pub(super) fn bytes(&self) -> usize {
        (self.keys.len() + self.values.len()) * 4
    }

    /// Per-head share of attention the span received per query row — the text-model
    /// stand-in for WnW's voice score (how strongly a head is grounded in the span).
    fn voice_scores(&self) -> Vec<f32> {
        let norm = (self.query_rows.max(1) * self.shape.group()) as f32;
        self.scores.chunks_exact(self.span.len()).map(|s| s.iter().sum::<f32>() / norm).collect()
    }

    /// The dense, sparse or coded row layout; sparse fp8 scales fit the span's largest
    /// magnitudes.
    fn rows(&self, spec: &TieredSpec, rows: SpanRows) -> Result<RowLayout> {
        let d = self.shape.head_dim();
        let c = match rows {
            SpanRows::Dense => {
                return Ok(RowLayout { head_dim: d, dense: spec.format, sparse: None });
            }
            SpanRows::Coded(k, v) => return Ok(RowLayout::with_coded(d, spec.format, k, v)),
            SpanRows::Swan(c) => c,
        };
        let span_max = |x: &[f32]| {
            x.chunks_exact(self.tokens * d)
                .flat_map(|head| &head[self.span.start * d..self.span.end * d])
                .fold(0f32, |m, v| m.max(v.abs()))
        };
        let ks = kv_sparse::fp8::scale_for_max_abs(span_max(&self.keys))?;
        let vs = kv_sparse::fp8::scale_for_max_abs(span_max(&self.values))?;
        let codec = |k, scale| RowCodec::SparseFp8 { k, scale };
        Ok(RowLayout {
            sparse: Some((codec(c.k_key, ks), codec(c.k_value, vs))),
            ..RowLayout::with_sparse(d, spec.format, c.k_key, c.k_value)
        })
    }

    /// Builds the store: roles, policy and retention from `spec`, rows placed by the policy.
    pub(super) fn build_store(
        self,
        spec: &TieredSpec,
        rows: SpanRows,
        capacity: usize,
    ) -> Result<TieredStore> {
        if let Some(layer) = self.filled.iter().position(|f| !f) {
            return Err(invalid("tiered prefill", format!("layer {layer} never received its K/V")));
        }
        let signal = spec.prefill_signal();
        if signal != PrefillSignal::None && self.scored.iter().any(|s| !s) {
            return Err(invalid(
                "tiered prefill",
                "the policy needs prefill attention scores (prefill through Llama::prefill)",
            ));
        }
        let s = self.shape;
        let layout = spec.layout(self.tokens)?;
        let policy = spec.policy(layout, s.layers, s.kv_heads(), &self.voice_scores())?;
        if policy.prefill_signal() != signal {
            return Err(invalid(
                "tiered prefill",
                format!("policy wants {:?}, collected {signal:?}", policy.prefill_signal()),
            ));
        }
        let config = StoreConfig {
            rows: self.rows(spec, rows)?,
            ..StoreConfig::new(s.layers, s.attn, layout, capacity)
        };
        let scores = if signal == PrefillSignal::None { Vec::new() } else { self.scores };
        let kv = DensePromptKv::new(
            s.layers,
            s.kv_heads(),
            self.tokens,
            s.head_dim(),
            self.keys,
            self.values,
        )?;
        Ok(TieredStore::prefill_host(config, policy, &kv, &scores)?)
    }
}
