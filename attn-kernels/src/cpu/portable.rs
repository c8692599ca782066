//! Portable tile kernels: plain `f32` loops with the same contracts as the AVX2 ones
//! (see [`super::tile`] for layouts). Used on CPUs without AVX2 and as a second
//! implementation the tests hold against the reference.

use kv_sparse::{SparseIndex, Value};

use super::tile::SparseTile;

pub(super) fn dense_scores<D: Value, const W: usize>(
    q: &[f32],
    d: usize,
    rows: &[&[D]],
    lane0: usize,
    s: &mut [[f32; W]],
) {
    for (row, st) in rows.iter().zip(s.iter_mut()) {
        for (h, qh) in q.chunks_exact(d).enumerate() {
            st[lane0 + h] = qh.iter().zip(*row).map(|(a, b)| a * b.to_f32()).sum();
        }
    }
}

pub(super) fn dense_accumulate<D: Value, const W: usize>(
    p: &[[f32; W]],
    rows: &[&[D]],
    lane0: usize,
    factor: &[f32; W],
    acc: &mut [f32],
    d: usize,
) {
    for (h, acc_h) in acc.chunks_exact_mut(d).enumerate() {
        let f = factor[lane0 + h];
        acc_h.iter_mut().for_each(|a| *a *= f);
        for (pt, row) in p.iter().zip(rows) {
            let w = pt[lane0 + h];
            for (a, v) in acc_h.iter_mut().zip(*row) {
                *a += w * v.to_f32();
            }
        }
    }
}

pub(super) fn sparse_scores<I: SparseIndex, const W: usize>(
    qt: &[[f32; W]],
    tile: &SparseTile<'_, I>,
    s: &mut [[f32; W]],
) {
    for (t, st) in s[..tile.rows()].iter_mut().enumerate() {
        let mut acc = [0.0f32; W];
        for j in tile.entries(t) {
            let x = tile.val.get(j);
            for (a, qv) in acc.iter_mut().zip(&qt[tile.idx[j].to_usize()]) {
                *a += qv * x;
            }
        }
        *st = acc;
    }
}

pub(super) fn sparse_accumulate<I: SparseIndex, const W: usize>(
    p: &[[f32; W]],
    tile: &SparseTile<'_, I>,
    acc: &mut [[f32; W]],
) {
    for (t, pt) in p[..tile.rows()].iter().enumerate() {
        for j in tile.entries(t) {
            let x = tile.val.get(j);
            for (a, w) in acc[tile.idx[j].to_usize()].iter_mut().zip(pt) {
                *a += w * x;
            }
        }
    }
}

pub(super) fn softmax_update<const W: usize>(
    m: &mut [f32; W],
    l: &mut [f32; W],
    s: &mut [[f32; W]],
) -> [f32; W] {
    let mut factor = [0.0f32; W];
    for h in 0..W {
        let tile_max = s.iter().fold(f32::NEG_INFINITY, |a, st| a.max(st[h]));
        let m_new = m[h].max(tile_max);
        factor[h] = (m[h] - m_new).exp2();
        let mut sum = 0.0;
        for st in s.iter_mut() {
            st[h] = (st[h] - m_new).exp2();
            sum += st[h];
        }
        l[h] = l[h] * factor[h] + sum;
        m[h] = m_new;
    }
    factor
}

pub(super) fn decode<V: Value>(src: &[V], dst: &mut [f32]) {
    for (d, s) in dst.iter_mut().zip(src) {
        *d = s.to_f32();
    }
}
