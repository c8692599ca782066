//! [`KernelEmulation`]: a line-by-line f32 mirror of `cuda/common.cuh` and `combine.cu` —
//! the same [`Plan`], warps, 32-row tiles, per-tile max, rescaling and flash-decoding
//! combine, and the gathered anchor weights from the combined log-sum-exp — so the kernels'
//! decomposition of SWAN's hybrid decode (§3, one softmax over sparse history and dense
//! buffer) and of WnW's gathered decode (§2.3 Eq. 2) is tested on machines without a GPU.
//! It implements [`super::DecodeDevice`] like [`super::Gpu`]; both are compared to the f64
//! [`crate::Reference`].

use super::DecodeDevice;
use super::cache::LayerCache;
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
    /// Scores of one tile row, exactly as `sparse_dot` / `dense_dot` form them (f32, entry order).
    fn score(cache: &LayerCache<'_>, h: usize, r: usize, q_s: &[f32]) -> f32 {
        let s = cache.sparse().map_or(0, |(k, _)| k.rows);
        if r < s {
            let (k, _) = cache.sparse().expect("sparse part");
            let (a, b) = k.row_range(h, r);
            return (a..b).fold(0f32, |t, e| q_s[k.index(e)].mul_add(k.value(e), t)) * k.scale;
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
        let s_rows = cache.sparse().map_or(0, |(k, _)| k.rows);
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
            let (_, v) = cache.sparse().expect("sparse part");
            let (a, b) = v.row_range(h, r);
            for e in a..b {
                acc[v.index(e)] += p * (v.value(e) * v.scale);
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
