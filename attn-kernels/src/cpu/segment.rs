//! Segments: a run of consecutive rows of one kv-head, all dense or all CSR, streamed tile
//! by tile through one online-softmax state ([`Slot`]).
//!
//! SWAN's hybrid decode step (method section; Algorithm 1) attends over `[sparse history;
//! dense buffer]` with a single softmax: here the sparse segment and the dense segment of a
//! kv-head simply continue the same running maxima, sums and accumulators, so the two parts
//! are never concatenated and no sparse row is ever expanded to a dense one.

use std::ops::Range;

use kv_sparse::csr::CsrView;
use kv_sparse::{SparseIndex, Value};

use super::tile::{DENSE_PASS, Kernels, MAX_LANES, SparseTile, TILE, TileValues, rescale_rows};

/// `log2(e)`: queries carry it so that the kernels exponentiate in base 2.
pub(crate) const LOG2_E: f32 = std::f32::consts::LOG2_E;

/// The running state of one work item: per lane, the running maximum `m` and sum `l`
/// (base-2 log domain), and the accumulators, head-major (`lanes × d`).
#[derive(Debug, Default)]
pub(crate) struct Slot {
    pub m: [f32; MAX_LANES],
    pub l: [f32; MAX_LANES],
    pub acc: Vec<f32>,
    /// Log2-domain scores of the item's rows (`rows × W`), kept for softmax weights.
    pub capture: Vec<f32>,
}

impl Slot {
    /// Empties the state for `lanes × d` accumulators.
    pub fn reset(&mut self, lanes: usize, d: usize) {
        self.m = [f32::NEG_INFINITY; MAX_LANES];
        self.l = [0.0; MAX_LANES];
        self.acc.clear();
        self.acc.resize(lanes * d, 0.0);
    }

    /// The first `W` lanes of the running maxima and sums.
    pub fn lanes<const W: usize>(&mut self) -> (&mut [f32; W], &mut [f32; W]) {
        let m = self.m.first_chunk_mut::<W>().expect("W ≤ MAX_LANES");
        let l = self.l.first_chunk_mut::<W>().expect("W ≤ MAX_LANES");
        (m, l)
    }
}

/// Per-thread buffers, grown on first use and reused by every later call.
#[derive(Debug, Default)]
pub(crate) struct Scratch {
    /// Scaled head-major queries of the current lane block.
    pub q: Vec<f32>,
    /// Scaled transposed queries `[dim][lane]`, covering every index value.
    pub qt: Vec<f32>,
    /// Transposed accumulators `[dim][lane]`, same extent as `qt`.
    pub acc_t: Vec<f32>,
    /// Decoded key entries of one sparse tile.
    pub kval: Vec<f32>,
    /// Decoded value entries of one sparse tile.
    pub vval: Vec<f32>,
}

/// Writes `q · scale` (`heads × d`, head-major) into `buf` and returns it.
pub(crate) fn scaled_queries<'b>(q: &[f32], scale: f32, buf: &'b mut Vec<f32>) -> &'b [f32] {
    buf.clear();
    buf.extend(q.iter().map(|x| x * scale));
    buf
}

/// Rows in a transposed table for index type `I` and head dimension `d`.
fn table_rows<I: SparseIndex>(d: usize) -> usize {
    d.max(I::MAX_HEAD_DIM)
}

/// Writes `q · scale` transposed (`[dim][lane]`, `W` lanes, unused lanes 0) into `buf`,
/// sized so every value of `I` indexes a row.
pub(crate) fn transposed_queries<'b, I: SparseIndex, const W: usize>(
    q: &[f32],
    d: usize,
    scale: f32,
    buf: &'b mut Vec<f32>,
) -> &'b [[f32; W]] {
    let rows = table_rows::<I>(d);
    if buf.len() < rows * W {
        buf.resize(rows * W, 0.0);
    }
    let (table, _) = buf[..rows * W].as_chunks_mut::<W>();
    for (i, row) in table[..d].iter_mut().enumerate() {
        *row = [0.0; W];
        for (h, qh) in q.chunks_exact(d).enumerate() {
            row[h] = qh[i] * scale;
        }
    }
    table
}

/// Copies the head-major accumulators of `slot` into a transposed table in `buf`.
pub(crate) fn transpose_in<'b, I: SparseIndex, const W: usize>(
    slot: &Slot,
    d: usize,
    buf: &'b mut Vec<f32>,
) -> &'b mut [[f32; W]] {
    let rows = table_rows::<I>(d);
    if buf.len() < rows * W {
        buf.resize(rows * W, 0.0);
    }
    let (table, _) = buf[..rows * W].as_chunks_mut::<W>();
    for (i, row) in table[..d].iter_mut().enumerate() {
        for (h, x) in row.iter_mut().enumerate() {
            *x = slot.acc[h * d + i];
        }
    }
    table
}

/// Copies a transposed table back into the head-major accumulators of `slot`.
pub(crate) fn transpose_out<const W: usize>(table: &[[f32; W]], d: usize, slot: &mut Slot) {
    for (i, row) in table[..d].iter().enumerate() {
        for (h, x) in row.iter().enumerate() {
            slot.acc[h * d + i] = *x;
        }
    }
}

/// Streams dense rows `range` (`row(j)` = key and value row `j`, each `≥ d` elements)
/// through `slot`. `q` holds the scaled queries of the block's active heads (`heads × d`).
/// With `capture`, the log2-domain scores of row `j` land at `capture[(j − start)·W..]`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn dense_segment<'r, D: Value, const W: usize>(
    k: Kernels,
    row: &impl Fn(usize) -> (&'r [D], &'r [D]),
    range: Range<usize>,
    q: &[f32],
    d: usize,
    slot: &mut Slot,
    mut capture: Option<&mut [f32]>,
) {
    let heads = q.len() / d;
    let mut s = [[0.0f32; W]; TILE];
    let (mut kr, mut vr) = ([&[][..]; TILE], [&[][..]; TILE]);
    let mut r = range.start;
    while r < range.end {
        let n = TILE.min(range.end - r);
        for t in 0..n {
            (kr[t], vr[t]) = row(r + t);
        }
        for (pass, qp) in q.chunks(DENSE_PASS * d).enumerate() {
            k.dense_scores(qp, d, &kr[..n], pass * DENSE_PASS, &mut s[..n]);
        }
        if let Some(c) = capture.as_deref_mut() {
            let at = (r - range.start) * W;
            c[at..at + n * W].copy_from_slice(s[..n].as_flattened());
        }
        let (m, l) = slot.lanes::<W>();
        let factor = k.softmax_update(m, l, &mut s[..n]);
        for (pass, acc) in slot.acc[..heads * d].chunks_mut(DENSE_PASS * d).enumerate() {
            k.dense_accumulate(&s[..n], &vr[..n], pass * DENSE_PASS, &factor, acc, d);
        }
        r += n;
    }
}

/// One kv-head's CSR keys and values with their scales, as a segment reads them.
pub(crate) struct CsrPair<'a, I, V> {
    pub keys: CsrView<'a, I, V>,
    pub values: CsrView<'a, I, V>,
    pub value_scale: f32,
}

/// Streams CSR rows `range` through `slot`'s state, accumulating into the transposed
/// table `acc` (see [`transpose_in`]). `qt` holds transposed queries that already carry
/// the key scale.
pub(crate) fn sparse_segment<I: SparseIndex, V: Value, const W: usize>(
    k: Kernels,
    kv: &CsrPair<'_, I, V>,
    range: Range<usize>,
    qt: &[[f32; W]],
    acc: &mut [[f32; W]],
    slot: &mut Slot,
    bufs: (&mut Vec<f32>, &mut Vec<f32>),
) {
    let mut s = [[0.0f32; W]; TILE];
    let (mut kb, mut vb) = ([0u32; TILE + 1], [0u32; TILE + 1]);
    let mut r = range.start;
    while r < range.end {
        let n = tile_len(&kv.keys, r, range.end).min(tile_len(&kv.values, r, range.end));
        let (ki, kx) = tile_entries(&kv.keys, r, n, &mut kb);
        let keys = SparseTile { idx: ki, val: decoded(k, kx, bufs.0), bounds: &kb[..=n] };
        k.sparse_scores(qt, &keys, &mut s[..n]);
        let (m, l) = slot.lanes::<W>();
        let factor = k.softmax_update(m, l, &mut s[..n]);
        rescale_rows(acc, &factor);
        if kv.value_scale != 1.0 {
            s[..n].as_flattened_mut().iter_mut().for_each(|p| *p *= kv.value_scale);
        }
        let (vi, vx) = tile_entries(&kv.values, r, n, &mut vb);
        let values = SparseTile { idx: vi, val: decoded(k, vx, bufs.1), bounds: &vb[..=n] };
        k.sparse_accumulate(&s[..n], &values, acc);
        r += n;
    }
}

/// Rows of the tile starting at row `r`: at most [`TILE`], not past `end`, not past the
/// end of `r`'s block.
fn tile_len<I: SparseIndex, V: Value>(view: &CsrView<'_, I, V>, r: usize, end: usize) -> usize {
    let rpb = view.rows_per_block();
    TILE.min(end - r).min(rpb - r % rpb)
}

/// The entries of rows `r..r + n` (inside one block) and their bounds relative to the
/// first entry (`bounds[..=n]`).
fn tile_entries<'a, I: SparseIndex, V: Value>(
    view: &CsrView<'a, I, V>,
    r: usize,
    n: usize,
    bounds: &mut [u32; TILE + 1],
) -> (&'a [I], &'a [V]) {
    let rpb = view.rows_per_block();
    let block = view.block(r / rpb).expect("row inside the view");
    let local = r % rpb;
    let start = usize::from(block.offsets[local]);
    for (t, b) in bounds[..=n].iter_mut().enumerate() {
        let end = block.offsets.get(local + t).map_or(block.indices.len(), |&o| usize::from(o));
        *b = (end - start) as u32;
    }
    let end = start + bounds[n] as usize;
    (&block.indices[start..end], &block.values[start..end])
}

/// `src` as tile values: `f32` and fp8 codes borrowed as they are, other formats decoded
/// into `buf`.
fn decoded<'b, V: Value>(k: Kernels, src: &'b [V], buf: &'b mut Vec<f32>) -> TileValues<'b> {
    use std::any::TypeId;
    if TypeId::of::<V>() == TypeId::of::<f32>()
        && let Ok(f) = bytemuck::try_cast_slice::<V, f32>(src)
    {
        return TileValues::F32(f);
    }
    if TypeId::of::<V>() == TypeId::of::<kv_sparse::fp8::Fp8E4M3>()
        && let Ok(codes) = bytemuck::try_cast_slice::<V, u8>(src)
    {
        return TileValues::Fp8(codes);
    }
    if buf.len() < src.len() {
        buf.resize(src.len(), 0.0);
    }
    k.decode(src, &mut buf[..src.len()]);
    TileValues::F32(&buf[..src.len()])
}
