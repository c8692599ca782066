//! The reference kernels: plain, obviously correct decode attention in `f64`, the ground
//! truth of every optimized kernel — the CPU ones ([`crate::CpuAttention`], through
//! [`DecodeAttention`] / [`GatheredSparseAttention`] over borrowed views) and the GPU ones
//! ([`crate::cuda::Gpu`] and its [`crate::cuda::KernelEmulation`], through
//! [`DecodeDevice`] over the kernels' packed upload layouts).
//!
//! Every cached row is decoded to a dense `f64` vector (sparse rows scattered and scaled,
//! dense rows converted), then each q-head computes `softmax(scale · q·Kᵀ) V` the textbook
//! way: all logits, their maximum, exponentials, one normalised sum. No tiling, no online
//! softmax, no threads. A hybrid kv-head attends over `[sparse history; dense buffer]` under
//! one softmax (SWAN's decode step, method section and §3); gathered attention returns each
//! resident row's softmax weight summed over the q-heads of its GQA group (WnW's anchor
//! signal, §2.3 Eq. 2). The optimized kernels are tested against this, within the
//! tolerances of [`crate::accuracy`] (CPU) and of the GPU tests.

use kv_sparse::coded::{CodedView, IndexCode, ValueCode};
use kv_sparse::csr::{CsrView, SparseRow};
use kv_sparse::decoded::DecodeRows;
use kv_sparse::quant::{DenseCodec, QuantView};
use kv_sparse::{SparseIndex, Value};

use crate::api::{
    DecodeAttention, EncodedAttention, GatheredCodedAttention, GatheredSparseAttention,
};
use crate::config::AttnConfig;
use crate::cuda::{DecodeDevice, LayerCache, PackedCoded, PackedCsr};
use crate::error::Result;
use crate::validate;
use crate::views::{
    CodedHybridSource, DecodedKv, DenseKv, GatheredCodedKv, GatheredKv, GatheredSparseKv,
    HybridSource, QuantKv, RecentRows, SparseKv, SparseSlab,
};

/// The reference implementation of [`DecodeAttention`], [`GatheredSparseAttention`] and
/// [`DecodeDevice`] (slow; for tests and checks).
///
/// # Examples
/// ```
/// use attn_kernels::{AttnConfig, DecodeAttention, DenseKv, Reference};
/// let cfg = AttnConfig::new(1, 1, 2)?;
/// let (k, v) = ([1.0f32, 0.0, 0.0, 1.0], [1.0f32, 2.0, 3.0, 4.0]);
/// let mut out = [0.0f32; 2];
/// Reference.dense(&cfg, &[0.0, 0.0], &[DenseKv::new(2, &k, &v)], &mut out)?;
/// assert_eq!(out, [2.0, 3.0]); // equal logits: the mean of the value rows
/// # Ok::<(), attn_kernels::Error>(())
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct Reference;

/// One kv-head's rows decoded to dense `f64`, row-major.
struct Decoded {
    d: usize,
    keys: Vec<f64>,
    values: Vec<f64>,
}

impl Decoded {
    fn new(d: usize) -> Self {
        Self { d, keys: Vec::new(), values: Vec::new() }
    }

    fn rows(&self) -> usize {
        self.keys.len() / self.d
    }

    fn push_dense<D: Value>(&mut self, k: &[D], v: &[D]) {
        self.keys.extend(k.iter().map(|x| f64::from(x.to_f32())));
        self.values.extend(v.iter().map(|x| f64::from(x.to_f32())));
    }

    fn push_ring<D: Value>(&mut self, keys: (&[D], &[D]), values: (&[D], &[D])) {
        let kall = keys.0.iter().chain(keys.1);
        let vall = values.0.iter().chain(values.1);
        self.keys.extend(kall.map(|x| f64::from(x.to_f32())));
        self.values.extend(vall.map(|x| f64::from(x.to_f32())));
    }

    /// Appends one dense row scattered from `(index, value)` entries, each value times `scale`.
    fn push_entries(
        out: &mut Vec<f64>,
        d: usize,
        entries: impl Iterator<Item = (usize, f32)>,
        scale: f32,
    ) {
        let start = out.len();
        out.resize(start + d, 0.0);
        for (i, x) in entries {
            if let Some(o) = out[start..].get_mut(i) {
                *o = f64::from(x) * f64::from(scale);
            }
        }
    }

    fn push_sparse_row<I: SparseIndex, V: Value>(
        out: &mut Vec<f64>,
        d: usize,
        row: SparseRow<'_, I, V>,
        scale: f32,
    ) {
        Self::push_entries(out, d, row.iter(), scale);
    }

    fn push_csr<I: SparseIndex, V: Value>(
        &mut self,
        keys: &CsrView<'_, I, V>,
        values: &CsrView<'_, I, V>,
        (key_scale, value_scale): (f32, f32),
    ) {
        for (k, v) in keys.rows().zip(values.rows()) {
            Self::push_sparse_row(&mut self.keys, self.d, k, key_scale);
            Self::push_sparse_row(&mut self.values, self.d, v, value_scale);
        }
    }

    fn push_slab_row(out: &mut Vec<f64>, d: usize, slab: &SparseSlab<'_>, row: usize) {
        let bytes = &slab.bytes[row * 2 * slab.k..(row + 1) * 2 * slab.k];
        let (idx, codes) = bytes.split_at(slab.k);
        let entries = idx
            .iter()
            .zip(codes)
            .map(|(&i, &c)| (usize::from(i), kv_sparse::fp8::Fp8E4M3::from_bits(c).to_f32()));
        Self::push_entries(out, d, entries, slab.scale);
    }

    /// Row `r` of kv-head `h` of a packed CSR layout (the GPU kernels' upload form).
    fn push_packed_row(out: &mut Vec<f64>, d: usize, p: &PackedCsr, h: usize, r: usize) {
        let (start, end) = p.row_range(h, r);
        Self::push_entries(out, d, (start..end).map(|e| (p.index(e), p.value(e))), p.scale);
    }

    /// Row `r` of kv-head `h` of packed coded rows: code × row scale × head scale per entry.
    fn push_coded_row(out: &mut Vec<f64>, d: usize, p: &PackedCoded, h: usize, r: usize) {
        let row = p.entries(h, r);
        let start = out.len();
        out.resize(start + d, 0.0);
        let factor = f64::from(row.row_scale) * f64::from(p.scale);
        for (i, x) in row.entries {
            out[start + i] = f64::from(x) * factor;
        }
    }

    /// kv-head `h` of a packed GPU layout: its sparse rows first, then its dense rows.
    fn push_packed(&mut self, cache: &LayerCache<'_>, h: usize) {
        let d = self.d;
        if let Some((k, v)) = cache.sparse() {
            for r in 0..k.rows {
                Self::push_packed_row(&mut self.keys, d, k, h, r);
                Self::push_packed_row(&mut self.values, d, v, h, r);
            }
        }
        if let Some((k, v)) = cache.coded() {
            for r in 0..k.rows {
                Self::push_coded_row(&mut self.keys, d, k, h, r);
                Self::push_coded_row(&mut self.values, d, v, h, r);
            }
        }
        if let Some((k, v)) = cache.quant() {
            let mut row = vec![0f32; d];
            for r in 0..k.rows {
                k.decode_row(h, r, &mut row);
                self.keys.extend(row.iter().map(|&x| f64::from(x)));
                v.decode_row(h, r, &mut row);
                self.values.extend(row.iter().map(|&x| f64::from(x)));
            }
        }
        if let Some((k, v)) = cache.dense() {
            for r in 0..k.rows_of(h) {
                self.keys.extend((0..d).map(|c| f64::from(k.get(h, r, c))));
                self.values.extend((0..d).map(|c| f64::from(v.get(h, r, c))));
            }
        }
    }

    fn push_gathered<D: Value>(&mut self, kv: &GatheredKv<'_, D>) {
        let d = self.d;
        for i in 0..kv.num_rows() {
            let s = kv.slab_row(i);
            self.push_dense(&kv.keys[s * d..(s + 1) * d], &kv.values[s * d..(s + 1) * d]);
        }
    }

    fn push_gathered_sparse(&mut self, kv: &GatheredSparseKv<'_>) {
        for i in 0..kv.num_rows() {
            Self::push_slab_row(&mut self.keys, self.d, &kv.keys, kv.slab_row(i));
            Self::push_slab_row(&mut self.values, self.d, &kv.values, kv.slab_row(i));
        }
    }

    /// Gathered coded rows, each decoded by its layout (exact given the stored bytes).
    fn push_gathered_coded(&mut self, kv: &GatheredCodedKv<'_>) {
        let mut row = vec![0.0f32; self.d];
        for i in 0..kv.num_rows() {
            for (codes, side) in [(&kv.keys, &mut self.keys), (&kv.values, &mut self.values)] {
                codes.decode_row(kv.slab_row(i), &mut row);
                side.extend(row.iter().map(|&x| f64::from(x)));
            }
        }
    }

    /// Dense quantized rows, each decoded by its codec (exact given the stored bytes).
    fn push_quant<K: DenseCodec, V: DenseCodec>(
        &mut self,
        keys: &QuantView<'_, K>,
        values: &QuantView<'_, V>,
    ) {
        Self::push_decoded(&mut self.keys, self.d, keys);
        Self::push_decoded(&mut self.values, self.d, values);
    }

    /// Every row of `view` onto `side`, decoded by its codec.
    fn push_decoded<C: DenseCodec>(side: &mut Vec<f64>, d: usize, view: &QuantView<'_, C>) {
        let mut row = vec![0.0f32; d];
        for r in 0..view.num_rows() {
            C::decode(view.row(r).expect("row in range"), &mut row);
            side.extend(row.iter().map(|&x| f64::from(x)));
        }
    }

    /// Coded rows, scattered from their `(index, value)` entries and scaled.
    fn push_coded<X: IndexCode, Y: ValueCode>(
        &mut self,
        keys: &CodedView<'_, X, Y>,
        values: &CodedView<'_, X, Y>,
        (key_scale, value_scale): (f32, f32),
    ) {
        for (k, v) in keys.rows().zip(values.rows()) {
            Self::push_entries(&mut self.keys, self.d, k.entries().into_iter(), key_scale);
            Self::push_entries(&mut self.values, self.d, v.entries().into_iter(), value_scale);
        }
    }

    /// `out = softmax(scale · q·Kᵀ) V`; returns the softmax weights.
    fn attend(&self, q: &[f32], scale: f64, out: &mut [f32]) -> Vec<f64> {
        let d = self.d;
        let logits: Vec<f64> = self
            .keys
            .chunks_exact(d)
            .map(|k| scale * k.iter().zip(q).map(|(a, b)| a * f64::from(*b)).sum::<f64>())
            .collect();
        let max = logits.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let exps: Vec<f64> = logits.iter().map(|s| (s - max).exp()).collect();
        let total: f64 = exps.iter().sum();
        let weights: Vec<f64> = exps.iter().map(|e| e / total).collect();
        for (c, o) in out.iter_mut().enumerate() {
            let sum: f64 =
                weights.iter().enumerate().map(|(j, w)| w * self.values[j * d + c]).sum();
            *o = sum as f32;
        }
        weights
    }
}

/// Attends every q-head of kv-head `kv` over `rows`; adds the group's weights to `weights`.
fn attend_group(
    cfg: &AttnConfig,
    q: &[f32],
    kv: usize,
    rows: &Decoded,
    out: &mut [f32],
    weights: Option<&mut [f32]>,
) {
    let (d, g) = (cfg.head_dim(), cfg.group_size());
    let mut sum = vec![0.0f64; rows.rows()];
    for h in kv * g..(kv + 1) * g {
        let w = rows.attend(
            &q[h * d..(h + 1) * d],
            f64::from(cfg.scale()),
            &mut out[h * d..(h + 1) * d],
        );
        sum.iter_mut().zip(&w).for_each(|(s, x)| *s += x);
    }
    if let Some(weights) = weights {
        weights.iter_mut().zip(&sum).for_each(|(o, s)| *o = *s as f32);
    }
}

/// Attends every kv-head's decoded rows in turn (kv-head `h` = the `h`-th item); `weights`,
/// if given, receives each head's group-summed row weights, kv-head after kv-head.
fn attend_all(
    cfg: &AttnConfig,
    q: &[f32],
    out: &mut [f32],
    mut weights: Option<&mut [f32]>,
    heads: impl Iterator<Item = Decoded>,
) {
    let mut offset = 0;
    for (h, rows) in heads.enumerate() {
        let n = rows.rows();
        let w = weights.as_deref_mut().map(|w| &mut w[offset..offset + n]);
        attend_group(cfg, q, h, &rows, out, w);
        offset += n;
    }
}

impl DecodeAttention for Reference {
    fn dense<D: Value>(
        &mut self,
        cfg: &AttnConfig,
        q: &[f32],
        kv: &[DenseKv<'_, D>],
        out: &mut [f32],
    ) -> Result<()> {
        const OP: &str = "Reference::dense";
        validate::call(OP, cfg, q, out, kv.len())?;
        for (h, c) in kv.iter().enumerate() {
            validate::dense(OP, cfg.head_dim(), h, c)?;
        }
        let heads = kv.iter().map(|c| {
            let mut rows = Decoded::new(cfg.head_dim());
            rows.push_ring(c.keys, c.values);
            rows
        });
        attend_all(cfg, q, out, None, heads);
        Ok(())
    }

    fn sparse<I: SparseIndex, V: Value>(
        &mut self,
        cfg: &AttnConfig,
        q: &[f32],
        kv: &[SparseKv<'_, I, V>],
        out: &mut [f32],
    ) -> Result<()> {
        const OP: &str = "Reference::sparse";
        validate::call(OP, cfg, q, out, kv.len())?;
        for (h, c) in kv.iter().enumerate() {
            validate::sparse(OP, cfg.head_dim(), h, c)?;
        }
        let heads = kv.iter().map(|c| {
            let mut rows = Decoded::new(cfg.head_dim());
            rows.push_csr(&c.keys, &c.values, (c.key_scale, c.value_scale));
            rows
        });
        attend_all(cfg, q, out, None, heads);
        Ok(())
    }

    fn hybrid<I: SparseIndex, V: Value, D: Value, H: HybridSource<I, V, D>>(
        &mut self,
        cfg: &AttnConfig,
        q: &[f32],
        kv: &[H],
        out: &mut [f32],
    ) -> Result<()> {
        const OP: &str = "Reference::hybrid";
        validate::call(OP, cfg, q, out, kv.len())?;
        for (h, c) in kv.iter().enumerate() {
            let (view, prefix) = (c.hybrid_view(), c.history_prefix());
            validate::hybrid(OP, cfg.head_dim(), h, &view, prefix.as_ref(), c.sink_rows())?;
        }
        let heads = kv.iter().map(|c| {
            let v = c.hybrid_view();
            let mut rows = Decoded::new(cfg.head_dim());
            let (sink_keys, sink_values) = c.sink_rows();
            rows.push_dense(sink_keys, sink_values);
            if let Some((keys, values)) = c.history_prefix() {
                rows.push_csr(&keys, &values, v.value_scale);
            }
            rows.push_csr(&v.sparse_keys, &v.sparse_values, v.value_scale);
            rows.push_ring(v.buffer_keys, v.buffer_values);
            rows
        });
        attend_all(cfg, q, out, None, heads);
        Ok(())
    }

    fn gathered<D: Value>(
        &mut self,
        cfg: &AttnConfig,
        q: &[f32],
        kv: &[GatheredKv<'_, D>],
        out: &mut [f32],
        weights: Option<&mut [f32]>,
    ) -> Result<()> {
        const OP: &str = "Reference::gathered";
        validate::call(OP, cfg, q, out, kv.len())?;
        let mut total = 0;
        for (h, c) in kv.iter().enumerate() {
            total += validate::gathered(OP, cfg.head_dim(), h, c)?;
        }
        validate::weights(OP, weights.as_deref(), total)?;
        let heads = kv.iter().map(|c| {
            let mut rows = Decoded::new(cfg.head_dim());
            rows.push_gathered(c);
            rows
        });
        attend_all(cfg, q, out, weights, heads);
        Ok(())
    }
}

impl GatheredSparseAttention for Reference {
    fn gathered_sparse<D: Value>(
        &mut self,
        cfg: &AttnConfig,
        q: &[f32],
        dense: &[GatheredKv<'_, D>],
        sparse: &[GatheredSparseKv<'_>],
        out: &mut [f32],
        weights: Option<&mut [f32]>,
    ) -> Result<()> {
        let op = "Reference::gathered_sparse";
        gathered_parts(op, cfg, q, (dense, sparse), out, weights, Decoded::push_gathered_sparse)
    }
}

impl GatheredCodedAttention for Reference {
    fn gathered_coded<D: Value>(
        &mut self,
        cfg: &AttnConfig,
        q: &[f32],
        dense: &[GatheredKv<'_, D>],
        coded: &[GatheredCodedKv<'_>],
        out: &mut [f32],
        weights: Option<&mut [f32]>,
    ) -> Result<()> {
        let op = "Reference::gathered_coded";
        gathered_parts(op, cfg, q, (dense, coded), out, weights, Decoded::push_gathered_coded)
    }
}

/// The reference over every kv-head's dense rows and second part, each part's rows decoded
/// by `push`.
fn gathered_parts<D: Value, P: validate::GatheredPart>(
    op: &'static str,
    cfg: &AttnConfig,
    q: &[f32],
    (dense, parts): (&[GatheredKv<'_, D>], &[P]),
    out: &mut [f32],
    weights: Option<&mut [f32]>,
    push: fn(&mut Decoded, &P),
) -> Result<()> {
    let total = validate::gathered_parts_call(op, cfg, q, out, dense, parts)?;
    validate::weights(op, weights.as_deref(), total)?;
    let heads = dense.iter().zip(parts).map(|(dk, part)| {
        let mut rows = Decoded::new(cfg.head_dim());
        rows.push_gathered(dk);
        push(&mut rows, part);
        rows
    });
    attend_all(cfg, q, out, weights, heads);
    Ok(())
}

impl DecodeDevice for Reference {
    fn describe(&self) -> String {
        "cpu-reference (f64)".into()
    }

    fn decode(
        &self,
        cfg: &AttnConfig,
        q: &[f32],
        cache: LayerCache<'_>,
        out: &mut [f32],
        weights: Option<&mut [f32]>,
    ) -> Result<()> {
        let n_weights = weights.as_deref().map(<[f32]>::len);
        cache.check("Reference::decode", cfg, q, out.len(), n_weights)?;
        let heads = (0..cfg.kv_heads()).map(|h| {
            let mut rows = Decoded::new(cfg.head_dim());
            rows.push_packed(&cache, h);
            rows
        });
        attend_all(cfg, q, out, weights, heads);
        Ok(())
    }
}

impl EncodedAttention for Reference {
    fn decoded<K: DecodeRows, V: DecodeRows>(
        &mut self,
        cfg: &AttnConfig,
        q: &[f32],
        kv: &[DecodedKv<'_, K, V>],
        out: &mut [f32],
    ) -> Result<()> {
        const OP: &str = "Reference::decoded";
        validate::call(OP, cfg, q, out, kv.len())?;
        for (h, c) in kv.iter().enumerate() {
            validate::decoded(OP, cfg.head_dim(), h, c)?;
        }
        let d = cfg.head_dim();
        let heads = kv.iter().map(|c| {
            let mut rows = Decoded::new(d);
            rows.push_dense(c.sink.0, c.sink.1);
            let (mut k, mut v) = (vec![0.0f32; d], vec![0.0f32; d]);
            for j in 0..c.keys.num_rows() {
                c.keys.decode_row(j, &mut k);
                c.values.decode_row(j, &mut v);
                rows.push_dense(&k, &v);
            }
            match c.buffer {
                Some(RecentRows::F32(kv)) => rows.push_ring(kv.keys, kv.values),
                Some(RecentRows::F16(kv)) => rows.push_ring(kv.keys, kv.values),
                Some(RecentRows::Bf16(kv)) => rows.push_ring(kv.keys, kv.values),
                None => {}
            }
            rows
        });
        attend_all(cfg, q, out, None, heads);
        Ok(())
    }

    fn quantized<K: DenseCodec, V: DenseCodec>(
        &mut self,
        cfg: &AttnConfig,
        q: &[f32],
        kv: &[QuantKv<'_, K, V>],
        out: &mut [f32],
    ) -> Result<()> {
        const OP: &str = "Reference::quantized";
        validate::call(OP, cfg, q, out, kv.len())?;
        for (h, c) in kv.iter().enumerate() {
            validate::quantized(OP, cfg.head_dim(), h, c)?;
        }
        let heads = kv.iter().map(|c| {
            let mut rows = Decoded::new(cfg.head_dim());
            rows.push_dense(c.sink.0, c.sink.1);
            if let Some((keys, values)) = &c.prefix {
                rows.push_quant(keys, values);
            }
            rows.push_quant(&c.keys, &c.values);
            match c.buffer {
                Some(RecentRows::F32(kv)) => rows.push_ring(kv.keys, kv.values),
                Some(RecentRows::F16(kv)) => rows.push_ring(kv.keys, kv.values),
                Some(RecentRows::Bf16(kv)) => rows.push_ring(kv.keys, kv.values),
                None => {}
            }
            rows
        });
        attend_all(cfg, q, out, None, heads);
        Ok(())
    }

    fn coded_hybrid<X: IndexCode, Y: ValueCode, D: Value, H: CodedHybridSource<X, Y, D>>(
        &mut self,
        cfg: &AttnConfig,
        q: &[f32],
        kv: &[H],
        out: &mut [f32],
    ) -> Result<()> {
        const OP: &str = "Reference::coded_hybrid";
        validate::call(OP, cfg, q, out, kv.len())?;
        for (h, c) in kv.iter().enumerate() {
            validate::coded_hybrid(
                OP,
                cfg.head_dim(),
                h,
                &c.coded_view(),
                c.history_prefix().as_ref(),
                c.sink_rows(),
            )?;
        }
        let heads = kv.iter().map(|c| {
            let v = c.coded_view();
            let mut rows = Decoded::new(cfg.head_dim());
            let (sink_keys, sink_values) = c.sink_rows();
            rows.push_dense(sink_keys, sink_values);
            if let Some((keys, values)) = c.history_prefix() {
                rows.push_coded(&keys, &values, v.value_scale);
            }
            rows.push_coded(&v.sparse_keys, &v.sparse_values, v.value_scale);
            rows.push_ring(v.buffer_keys, v.buffer_values);
            rows
        });
        attend_all(cfg, q, out, None, heads);
        Ok(())
    }
}
