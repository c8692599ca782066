//! [`KernelEmulation`]: a line-by-line f32 mirror of `cuda/common.cuh`, `cuda/encoded.cuh`
//! and `combine.cu` — the same [`Plan`], warps, 32-row tiles, per-tile max, rescaling and
//! flash-decoding combine, the same per-block / per-row scaling of quantized and coded rows,
//! and the gathered anchor weights from the combined log-sum-exp — so the kernels'
//! decomposition of SWAN's hybrid decode (§3, one softmax over a CSR or coded sparse history
//! and the dense buffer), of the dense quantized baselines and of WnW's gathered decode
//! (§2.3 Eq. 2) is tested on machines without a GPU.
//! It implements [`super::DecodeDevice`] like [`super::Gpu`]; both are compared to the f64
//! [`crate::Reference`].

use super::DecodeDevice;
use kv_sparse::quant::{DenseFormat, INT4_BLOCK_BYTES, INT8_BLOCK_BYTES};

use super::cache::LayerCache;
use super::encoded::PackedQuant;
use super::layout::{Plan, TILE, WARPS, group_passes};
use crate::{AttnConfig, Result};

/// f32 mirror of the CUDA kernels (see the module docs); `target_blocks` plays the role of
/// the GPU's block budget so that tests can force many splits on small caches.
#[derive(Clone, Copy, Debug)]
pub struct KernelEmulation {
    /// Blocks the plan aims for (the GPU launcher uses 4 × its multiprocessors).
    pub target_blocks: usize,
}

/// One warp's partial (the kernel's `WarpState` after its last tile).
struct Partial {
    m: f32,
    l: f32,
    acc: Vec<f32>,
}

impl KernelEmulation {
    /// Scores of one tile row, exactly as `sparse_dot` / `dense_dot` / `CodedRows::dot` /
    /// the quantized codecs' `dot` form them (f32, entry order).
    fn score(cache: &LayerCache<'_>, h: usize, r: usize, q_s: &[f32]) -> f32 {
        let s = cache.sparse_rows();
        if r < s {
            if let Some((k, _)) = cache.sparse() {
                let (a, b) = k.row_range(h, r);
                return (a..b).fold(0f32, |t, e| q_s[k.index(e)].mul_add(k.value(e), t)) * k.scale;
            }
            let (k, _) = cache.coded().expect("a sparse part");
            let row = k.entries(h, r);
            return row.entries.iter().fold(0f32, |t, &(i, v)| q_s[i].mul_add(v, t)) * row.factor;
        }
        if let Some((k, _)) = cache.quant() {
            return quant_dot(k, h, r - s, q_s);
        }
        let (k, _) = cache.dense().expect("dense part");
        (0..k.head_dim).fold(0f32, |t, c| q_s[c].mul_add(k.get(h, r - s, c), t))
    }

    /// One warp over its tiles: `tile_softmax`, `state_rescale`, scatter / `dense_values`.
    fn warp(
        cache: &LayerCache<'_>,
        h: usize,
        rows: (usize, usize),
        q_s: &[f32],
        scores: &mut [f32],
    ) -> Partial {
        let d = q_s.len();
        let (mut m, mut lanes_l, mut acc) = (f32::NEG_INFINITY, [0f32; TILE], vec![0f32; d]);
        let s_rows = cache.sparse_rows();
        let mut t0 = rows.0;
        while t0 < rows.1 {
            let n = TILE.min(rows.1 - t0);
            let s: Vec<f32> = (0..n).map(|j| Self::score(cache, h, t0 + j, q_s)).collect();
            scores[t0..t0 + n].copy_from_slice(&s);
            let mn = s.iter().copied().fold(m, f32::max);
            let alpha = (m - mn).exp();
            if alpha != 1.0 {
                acc.iter_mut().for_each(|a| *a *= alpha);
            }
            for (j, lane_l) in lanes_l.iter_mut().enumerate() {
                let p = if j < n { (s[j] - mn).exp() } else { 0.0 };
                *lane_l = *lane_l * alpha + p;
                if j < n {
                    Self::accumulate(cache, h, t0 + j, s_rows, p, &mut acc);
                }
            }
            m = mn;
            t0 += WARPS * TILE;
        }
        Partial { m, l: lanes_l.iter().sum(), acc }
    }

    fn accumulate(
        cache: &LayerCache<'_>,
        h: usize,
        r: usize,
        s_rows: usize,
        p: f32,
        acc: &mut [f32],
    ) {
        if r < s_rows {
            if let Some((_, v)) = cache.sparse() {
                let (a, b) = v.row_range(h, r);
                for e in a..b {
                    acc[v.index(e)] += p * (v.value(e) * v.scale);
                }
                return;
            }
            let (_, v) = cache.coded().expect("a sparse part");
            let row = v.entries(h, r);
            for (i, x) in row.entries {
                acc[i] += p * (x * row.factor);
            }
        } else if let Some((_, v)) = cache.quant() {
            let mut x = vec![0f32; acc.len()];
            v.decode_row(h, r - s_rows, &mut x);
            for (a, x) in acc.iter_mut().zip(&x) {
                *a = p.mul_add(*x, *a);
            }
        } else {
            let (_, v) = cache.dense().expect("dense part");
            for (c, x) in acc.iter_mut().enumerate() {
                *x = p.mul_add(v.get(h, r - s_rows, c), *x);
            }
        }
    }

    /// `combine_partials_f32` for one q-head: output row and log-sum-exp.
    fn combine(parts: &[Partial], out: &mut [f32]) -> f32 {
        let m = parts.iter().map(|p| p.m).fold(f32::NEG_INFINITY, f32::max);
        let w: Vec<f32> = parts
            .iter()
            .map(|p| if m == f32::NEG_INFINITY { 0.0 } else { (p.m - m).exp() })
            .collect();
        let l: f32 = parts.iter().zip(&w).map(|(p, w)| w * p.l).sum();
        let inv = if l > 0.0 { 1.0 / l } else { 0.0 };
        for (c, o) in out.iter_mut().enumerate() {
            *o = parts.iter().zip(&w).fold(0f32, |t, (p, w)| w.mul_add(p.acc[c], t)) * inv;
        }
        if l > 0.0 { m + l.ln() } else { f32::NEG_INFINITY }
    }
}

fn f16_at(b: &[u8]) -> f32 {
    half::f16::from_le_bytes([b[0], b[1]]).to_f32()
}

/// `QInt8::dot` / `QInt4::dot` / `QFp8::dot` of `cuda/encoded.cuh`: per block, the codes'
/// dot product in element (int8) or byte-then-nibble (int4) order, then one fma with the
/// block's scale; fp8 rows scale the whole dot product once.
fn quant_dot(p: &PackedQuant, h: usize, r: usize, q: &[f32]) -> f32 {
    let row = p.row(h, r);
    match p.format {
        DenseFormat::Int8 => {
            row.chunks_exact(INT8_BLOCK_BYTES).zip(q.chunks_exact(32)).fold(0f32, |t, (b, qb)| {
                let tb = qb
                    .iter()
                    .zip(&b[2..])
                    .fold(0f32, |tb, (q, &c)| q.mul_add(f32::from(c as i8), tb));
                tb.mul_add(f16_at(b), t)
            })
        }
        DenseFormat::Int4 => {
            row.chunks_exact(INT4_BLOCK_BYTES).zip(q.chunks_exact(32)).fold(0f32, |t, (b, qb)| {
                let tb = (0..16).fold(0f32, |tb, j| {
                    let lo = f32::from(b[2 + j] & 15) - 8.0;
                    let hi = f32::from(b[2 + j] >> 4) - 8.0;
                    qb[j + 16].mul_add(hi, qb[j].mul_add(lo, tb))
                });
                tb.mul_add(f16_at(b), t)
            })
        }
        DenseFormat::Fp8 => {
            let t = q.iter().zip(&row[2..]).fold(0f32, |t, (q, &c)| {
                q.mul_add(kv_sparse::fp8::Fp8E4M3::from_bits(c).to_f32(), t)
            });
            t * f16_at(row)
        }
    }
}

impl DecodeDevice for KernelEmulation {
    fn describe(&self) -> String {
        format!("cpu-kernel-emulation (f32, {} target blocks)", self.target_blocks)
    }

    fn decode(
        &self,
        cfg: &AttnConfig,
        q: &[f32],
        cache: LayerCache<'_>,
        out: &mut [f32],
        mut weights: Option<&mut [f32]>,
    ) -> Result<()> {
        cache.check(
            "KernelEmulation::decode",
            cfg,
            q,
            out.len(),
            weights.as_deref().map(<[f32]>::len),
        )?;
        let (d, group, kv_heads) = (cfg.head_dim(), cfg.group_size(), cfg.kv_heads());
        let max_rows = (0..kv_heads).map(|h| cache.rows_of(h)).max().unwrap_or(0);
        let plan = Plan::new(max_rows, kv_heads, self.target_blocks);
        let mut first_row = 0;
        for h in 0..kv_heads {
            let total = cache.rows_of(h);
            let mut head_w = vec![0f32; total];
            for (g0, gc) in group_passes(group) {
                for g in g0..g0 + gc {
                    let qh = h * group + g;
                    let q_s: Vec<f32> =
                        q[qh * d..(qh + 1) * d].iter().map(|x| x * cfg.scale()).collect();
                    let mut scores = vec![0f32; total];
                    let parts: Vec<Partial> = (0..plan.n_parts)
                        .map(|part| {
                            let (split, warp) = (part / WARPS, part % WARPS);
                            let begin = split * plan.rows_per_split + warp * TILE;
                            let end = total.min((split + 1) * plan.rows_per_split);
                            Self::warp(&cache, h, (begin, end.max(begin)), &q_s, &mut scores)
                        })
                        .collect();
                    let lse = Self::combine(&parts, &mut out[qh * d..(qh + 1) * d]);
                    for (w, s) in head_w.iter_mut().zip(&scores) {
                        *w += (s - lse).exp();
                    }
                }
            }
            if let Some(w) = weights.as_deref_mut() {
                w[first_row..first_row + total].copy_from_slice(&head_w);
            }
            first_row += total;
        }
        Ok(())
    }
}
