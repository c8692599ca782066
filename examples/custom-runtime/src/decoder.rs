//! The runtime loop: one decode step of the whole model, where the three lower crates meet
//! (SWAN's decode step, method section and §4):
//!
//! 1. `projection` rotates the RoPE'd query and key by `P_QK` ([`ProjectionSet::rotate_qk_into`]);
//!    values come out of `Ŵ_V = W_V·P_VO` already rotated.
//! 2. `kv-sparse` appends `k̂, v̂` to each kv-head's [`Hybrid`] cache: the newest `b` rows stay
//!    dense, older ones go to the history — SWAN's top-k CSR rows ([`Decoder`]), or any other
//!    whole-row history behind the same buffer ([`HistoryDecoder`]: dense `q8_0` / `q4_0` /
//!    fp8 rows, KIVI, TurboQuant-style codes, whose random rotation is the set's basis).
//! 3. `attn-kernels` runs one softmax over every kv-head's history and dense buffer
//!    ([`DecodeAttention::hybrid`], [`EncodedAttention::quantized`],
//!    [`EncodedAttention::decoded`]), GQA-aware, and the rotated output `ô` goes into `Ŵ_O`.
//!
//! [`ProjectionSet::rotate_qk_into`]: projection::ProjectionSet::rotate_qk_into

use attn_kernels::{
    AttnConfig, CpuAttention, DecodeAttention, DecodedKv, EncodedAttention, QuantKv, RecentFormat,
};
use kv_sparse::csr::CsrStore;
use kv_sparse::decoded::DecodeRows;
use kv_sparse::hybrid::{Hybrid, HybridConfig, RowStore};
use kv_sparse::kivi::KiviRows;
use kv_sparse::quant::{DenseCodec, QuantRows};
use kv_sparse::turbo::TurboRows;
use kv_sparse::{SparseIndex, Value};

use crate::error::{Error, Result};
use crate::model::{Llama, linear, mlp, rms_norm, rope};

/// A history a [`HistoryDecoder`] runs: a kv-sparse row store behind a `D` buffer and the
/// attn-kernels entry point that reads a layer of such caches.
pub trait History<D>: RowStore {
    /// One decode step of a layer: `q` (rotated) against every kv-head's cache.
    ///
    /// # Errors
    /// The kernel's input errors.
    fn attend(
        attention: &mut CpuAttention,
        cfg: &AttnConfig,
        q: &[f32],
        heads: &[Hybrid<Self, D>],
        out: &mut [f32],
    ) -> attn_kernels::Result<()>;
}

/// SWAN's CSR rows: the hybrid kernel.
impl<I: SparseIndex, V: Value, D: Value> History<D> for CsrStore<I, V> {
    fn attend(
        attention: &mut CpuAttention,
        cfg: &AttnConfig,
        q: &[f32],
        heads: &[Hybrid<Self, D>],
        out: &mut [f32],
    ) -> attn_kernels::Result<()> {
        attention.hybrid(cfg, q, heads, out)
    }
}

/// Dense quantized rows: the quantized kernel, the buffer after the history.
impl<C: DenseCodec, D: RecentFormat> History<D> for QuantRows<C> {
    fn attend(
        attention: &mut CpuAttention,
        cfg: &AttnConfig,
        q: &[f32],
        heads: &[Hybrid<Self, D>],
        out: &mut [f32],
    ) -> attn_kernels::Result<()> {
        let kv: Vec<_> = heads
            .iter()
            .map(|c| {
                let (k, v) = c.history();
                QuantKv::new(k, v).with_buffer(c.buffer_keys(), c.buffer_values())
            })
            .collect();
        attention.quantized(cfg, q, &kv, out)
    }
}

/// One decode step over caches whose history is read by the decoded-rows kernel (KIVI and
/// TurboQuant-style codes, in place): `history` borrows a cache's key and value rows.
fn decoded_step<'h, S: RowStore, D: RecentFormat, R: DecodeRows>(
    attention: &mut CpuAttention,
    (cfg, q, out): (&AttnConfig, &[f32], &mut [f32]),
    heads: &'h [Hybrid<S, D>],
    history: impl Fn(&'h Hybrid<S, D>) -> (R, R),
) -> attn_kernels::Result<()> {
    let kv: Vec<_> = heads
        .iter()
        .map(|c| {
            let (k, v) = history(c);
            DecodedKv::new(k, v).with_buffer(c.buffer_keys(), c.buffer_values())
        })
        .collect();
    attention.decoded(cfg, q, &kv, out)
}

/// KIVI codes.
impl<const B: usize, D: RecentFormat> History<D> for KiviRows<B> {
    fn attend(
        attention: &mut CpuAttention,
        cfg: &AttnConfig,
        q: &[f32],
        heads: &[Hybrid<Self, D>],
        out: &mut [f32],
    ) -> attn_kernels::Result<()> {
        decoded_step(attention, (cfg, q, out), heads, |c| c.history())
    }
}

/// TurboQuant-style codes.
impl<const B: usize, D: RecentFormat> History<D> for TurboRows<B> {
    fn attend(
        attention: &mut CpuAttention,
        cfg: &AttnConfig,
        q: &[f32],
        heads: &[Hybrid<Self, D>],
        out: &mut [f32],
    ) -> attn_kernels::Result<()> {
        decoded_step(attention, (cfg, q, out), heads, |c| c.history())
    }
}

/// Per-step buffers, allocated once.
#[derive(Debug)]
struct Scratch {
    x: Vec<f32>,
    normed: Vec<f32>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    q_hat: Vec<f32>,
    k_hat: Vec<f32>,
    o_hat: Vec<f32>,
    proj: Vec<f32>,
    gate: Vec<f32>,
    up: Vec<f32>,
    logits: Vec<f32>,
}

/// A decoding session over a [`Llama`]: one cache per (layer, kv-head), history `S` behind
/// a `D` dense buffer.
#[derive(Debug)]
pub struct HistoryDecoder<S, D> {
    model: Llama,
    attn_cfg: AttnConfig,
    attention: CpuAttention,
    caches: Vec<Vec<Hybrid<S, D>>>,
    scratch: Scratch,
    position: usize,
}

/// SWAN's decoder: CSR rows with `I` indices and `V` sparse values behind a `D` buffer.
pub type Decoder<I, V, D> = HistoryDecoder<CsrStore<I, V>, D>;

impl<S: History<D>, D: Value> HistoryDecoder<S, D> {
    /// A session whose caches all use `cache` (its `head_dim` must be the model's; for a
    /// whole-row history every component kept, e.g. [`HybridConfig::lossless`] with the
    /// buffer, `rows_per_block` the KIVI group), with the attention kernels on `threads`
    /// threads.
    ///
    /// # Errors
    /// [`Error::Attention`] for the head layout or thread count; [`Error::Sparse`] for a cache
    /// configuration that does not fit.
    pub fn new(model: Llama, cache: HybridConfig, threads: usize) -> Result<Self> {
        let c = &model.config;
        let attn_cfg = c.attn()?;
        let caches = (0..c.layers)
            .map(|_| (0..c.kv_heads).map(|_| Hybrid::new(cache)).collect())
            .collect::<kv_sparse::Result<Vec<Vec<_>>>>()?;
        let (qd, kvd) = (c.q_heads * c.head_dim, c.kv_heads * c.head_dim);
        let scratch = Scratch {
            x: vec![0.0; c.hidden],
            normed: vec![0.0; c.hidden],
            q: vec![0.0; qd],
            k: vec![0.0; kvd],
            v: vec![0.0; kvd],
            q_hat: vec![0.0; qd],
            k_hat: vec![0.0; kvd],
            o_hat: vec![0.0; qd],
            proj: vec![0.0; c.hidden],
            gate: vec![0.0; c.intermediate],
            up: vec![0.0; c.intermediate],
            logits: vec![0.0; c.vocab],
        };
        let attention = CpuAttention::new(threads)?;
        Ok(Self { model, attn_cfg, attention, caches, scratch, position: 0 })
    }

    /// Tokens decoded so far (the position of the next one).
    pub fn position(&self) -> usize {
        self.position
    }

    /// The caches of one layer, one per kv-head.
    pub fn layer_caches(&self, layer: usize) -> &[Hybrid<S, D>] {
        &self.caches[layer]
    }

    /// Feeds `token` at the next position and returns the next-token logits.
    ///
    /// # Errors
    /// [`Error::Token`] for an id outside the vocabulary; errors of the lower crates
    /// (non-finite rows, kernel input checks).
    pub fn step(&mut self, token: u32) -> Result<&[f32]> {
        let c = &self.model.config;
        let (h, vocab) = (c.hidden, c.vocab);
        let row = (token as usize).checked_mul(h).filter(|_| (token as usize) < vocab);
        let start = row.ok_or(Error::Token { token, vocab })?;
        self.scratch.x.copy_from_slice(&self.model.embed[start..start + h]);
        for layer in 0..c.layers {
            self.attention_block(layer)?;
            self.mlp_block(layer);
        }
        let s = &mut self.scratch;
        rms_norm(&s.x, &self.model.norm, self.model.config.rms_eps, &mut s.normed);
        linear(&self.model.lm_head, &s.normed, &mut s.logits);
        self.position += 1;
        Ok(&self.scratch.logits)
    }

    /// `x += Ŵ_O · attention(rotate(RoPE(W_Q x)), cache ∪ {rotate(RoPE(W_K x)), Ŵ_V x})`.
    fn attention_block(&mut self, layer: usize) -> Result<()> {
        let (m, s) = (&self.model, &mut self.scratch);
        let (w, d) = (&m.layers[layer], m.config.head_dim);
        rms_norm(&s.x, &w.attn_norm, m.config.rms_eps, &mut s.normed);
        linear(&w.wq, &s.normed, &mut s.q);
        linear(&w.wk, &s.normed, &mut s.k);
        linear(&w.wv, &s.normed, &mut s.v); // v̂ = v·P_VO (absorbed)
        rope(&mut s.q, d, self.position, m.config.rope_theta);
        rope(&mut s.k, d, self.position, m.config.rope_theta);
        m.set.rotate_qk_into(layer, 1, &s.q, &s.k, &mut s.q_hat, &mut s.k_hat)?;
        let caches = &mut self.caches[layer];
        for (head, cache) in caches.iter_mut().enumerate() {
            cache.append(&s.k_hat[head * d..][..d], &s.v[head * d..][..d])?;
        }
        S::attend(&mut self.attention, &self.attn_cfg, &s.q_hat, caches.as_slice(), &mut s.o_hat)?;
        linear(&w.wo, &s.o_hat, &mut s.proj); // Ŵ_O = W_O with P_VOᵀ folded in
        s.x.iter_mut().zip(&s.proj).for_each(|(x, p)| *x += p);
        Ok(())
    }

    /// `x += MLP(RMSNorm(x))`.
    fn mlp_block(&mut self, layer: usize) {
        let (m, s) = (&self.model, &mut self.scratch);
        let w = &m.layers[layer];
        rms_norm(&s.x, &w.mlp_norm, m.config.rms_eps, &mut s.normed);
        mlp(w, &s.normed, &mut s.gate, &mut s.up, &mut s.proj);
        s.x.iter_mut().zip(&s.proj).for_each(|(x, p)| *x += p);
    }
}
