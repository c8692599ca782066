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

use super::codes::{CodeRow, Codes, MaskedRow};
use super::qcodes::QueryCodes;
use super::tile::{
    DENSE_PASS, Kernels, MAX_LANES, SparseTile, TILE, TileValues, one_span, prefetch, rescale_rows,
};

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
    /// Placed key codes of one tile of coded rows (`TILE × d`).
    pub kcode: Vec<u8>,
    /// Placed value codes of one tile of coded rows (`TILE × d`).
    pub vcode: Vec<u8>,
    /// The current lane block's queries as int8 codes, for integer score products.
    pub qi: QueryCodes,
    /// Sketched queries `[dim][lane]` (QJL keys: `S·q` per lane).
    pub sq: Vec<f32>,
}

impl Scratch {
    /// Grows every buffer to what a job of head width `d` and `lanes` lanes needs with
    /// `u8` indices, so that no thread allocates in a later step however the work items
    /// fall among the threads (a thread that ran no item in the warm-up step would
    /// otherwise grow its buffers in a steady-state one).
    pub fn prepare(&mut self, lanes: usize, d: usize) {
        let table = table_rows::<u8>(d) * lanes;
        for (buf, len) in [
            (&mut self.q, lanes * d),
            (&mut self.qt, table),
            (&mut self.acc_t, table),
            (&mut self.kval, TILE * d),
            (&mut self.vval, TILE * d),
            (&mut self.sq, lanes * d),
        ] {
            buf.reserve(len.saturating_sub(buf.len()));
        }
        for buf in [&mut self.kcode, &mut self.vcode] {
            buf.reserve((TILE * d).saturating_sub(buf.len()));
        }
        self.qi.reserve(lanes, d);
    }
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
    // An index ≥ d (possible only in raw slabs) then meets a zero query component.
    table[d..].fill([0.0; W]);
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
        let next = r + n..(r + 2 * n).min(range.end);
        if !next.is_empty() {
            let ((kf, vf), (kl, vl)) = (row(next.start), row(next.end - 1));
            let rows = next.len();
            if !(one_span(&kf[..d], &kl[..d], rows) && one_span(&vf[..d], &vl[..d], rows)) {
                for j in next {
                    let (kn, vn) = row(j);
                    prefetch(&kn[..d]);
                    prefetch(&vn[..d]);
                }
            }
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

/// One tile of coded rows (keys `kr` in codes `K`, values `vr` in codes `V`, at most
/// [`TILE`] of each) through `slot`, as one tile of [`dense_segment`]: `q` holds the scaled
/// queries of the block's active heads (`heads × d`).
#[allow(clippy::too_many_arguments)]
pub(crate) fn code_tile<K: Codes, V: Codes, const W: usize>(
    k: Kernels,
    kr: &[CodeRow<'_>],
    vr: &[CodeRow<'_>],
    q: &[f32],
    qi: Option<&QueryCodes>,
    d: usize,
    slot: &mut Slot,
) {
    let heads = q.len() / d;
    let n = kr.len();
    let mut s = [[0.0f32; W]; TILE];
    for (pass, qp) in q.chunks(DENSE_PASS * d).enumerate() {
        let lane0 = pass * DENSE_PASS;
        match qi {
            Some(qi) => {
                let v = qi.view(lane0..lane0 + qp.len() / d);
                k.code_scores_i8::<K, W>(v, kr, lane0, &mut s[..n]);
            }
            None => k.code_scores::<K, W>(qp, d, kr, lane0, &mut s[..n]),
        }
    }
    let (m, l) = slot.lanes::<W>();
    let factor = k.softmax_update(m, l, &mut s[..n]);
    for (pass, acc) in slot.acc[..heads * d].chunks_mut(DENSE_PASS * d).enumerate() {
        k.code_accumulate::<V, W>(&s[..n], vr, pass * DENSE_PASS, &factor, acc, d);
    }
}

/// [`code_tile`] over bitmask rows read in place ([`Kernels::fuses_masked`]).
#[allow(clippy::too_many_arguments)]
pub(crate) fn masked_tile<C: Codes, const W: usize>(
    k: Kernels,
    kr: &[MaskedRow<'_>],
    vr: &[MaskedRow<'_>],
    q: &[f32],
    qi: Option<&QueryCodes>,
    d: usize,
    slot: &mut Slot,
) {
    let heads = q.len() / d;
    let n = kr.len();
    let mut s = [[0.0f32; W]; TILE];
    for (pass, qp) in q.chunks(DENSE_PASS * d).enumerate() {
        let lane0 = pass * DENSE_PASS;
        match qi {
            Some(qi) => {
                let v = qi.view(lane0..lane0 + qp.len() / d);
                k.masked_scores_i8::<C, W>(v, kr, lane0, &mut s[..n]);
            }
            None => k.masked_scores::<C, W>(qp, d, kr, lane0, &mut s[..n]),
        }
    }
    let (m, l) = slot.lanes::<W>();
    let factor = k.softmax_update(m, l, &mut s[..n]);
    for (pass, acc) in slot.acc[..heads * d].chunks_mut(DENSE_PASS * d).enumerate() {
        k.masked_accumulate::<C, W>(&s[..n], vr, pass * DENSE_PASS, &factor, acc, d);
    }
}

/// Sparse rows a segment streams tile by tile: a CSR view (consecutive rows of a block) or
/// a slab of a tiered store (rows at arbitrary slots).
pub(crate) trait SparseRows<I> {
    /// Rows of the tile starting at row `r`: at least 1, at most [`TILE`], not past `end`.
    fn tile_len(&self, r: usize, end: usize) -> usize;

    /// Rows `r..r + n` as a tile: their entries' indices and values (decoded into `buf`
    /// when the format needs it) and each row's span, written into `spans[..n]`.
    fn tile<'b>(
        &'b self,
        k: Kernels,
        r: usize,
        n: usize,
        spans: &'b mut [(usize, usize); TILE],
        buf: &'b mut Vec<f32>,
    ) -> SparseTile<'b, I>;
}

impl<I: SparseIndex, V: Value> SparseRows<I> for CsrView<'_, I, V> {
    /// Not past the end of `r`'s block either (a tile's entries are contiguous).
    fn tile_len(&self, r: usize, end: usize) -> usize {
        let rpb = self.rows_per_block();
        TILE.min(end - r).min(rpb - r % rpb)
    }

    fn tile<'b>(
        &'b self,
        k: Kernels,
        r: usize,
        n: usize,
        spans: &'b mut [(usize, usize); TILE],
        buf: &'b mut Vec<f32>,
    ) -> SparseTile<'b, I> {
        let rpb = self.rows_per_block();
        let block = self.block(r / rpb).expect("row inside the view");
        let local = r % rpb;
        let at = |t: usize| {
            block.offsets.get(local + t).map_or(block.indices.len(), |&o| usize::from(o))
        };
        let start = at(0);
        for (t, span) in spans[..n].iter_mut().enumerate() {
            *span = (at(t) - start, at(t + 1) - start);
        }
        let end = at(n);
        let val = decoded(k, &block.values[start..end], buf);
        SparseTile { idx: &block.indices[start..end], val, spans: &spans[..n] }
    }
}

/// The sparse rows of a tiered store's slab, in resident-list order (see
/// [`crate::GatheredSparseKv`]).
#[derive(Clone, Copy)]
pub(crate) struct SlabRows<'a> {
    pub slab: crate::views::SparseSlab<'a>,
    pub slots: Option<&'a [u32]>,
}

impl SparseRows<u8> for SlabRows<'_> {
    fn tile_len(&self, r: usize, end: usize) -> usize {
        TILE.min(end - r)
    }

    /// The tile's index slice is the slab shifted so that entry `j`'s index is byte `j` and
    /// its value byte `j + k`: row `s` spans entries `2k·s .. 2k·s + k`.
    fn tile<'b>(
        &'b self,
        _: Kernels,
        r: usize,
        n: usize,
        spans: &'b mut [(usize, usize); TILE],
        _: &'b mut Vec<f32>,
    ) -> SparseTile<'b, u8> {
        let (bytes, k) = (self.slab.bytes, self.slab.k);
        for (t, span) in spans[..n].iter_mut().enumerate() {
            let s = self.slots.map_or(r + t, |s| s[r + t] as usize);
            *span = (2 * k * s, 2 * k * s + k);
        }
        let val = bytes.get(k..).unwrap_or(&[]);
        SparseTile { idx: &bytes[..val.len()], val: TileValues::Fp8(val), spans: &spans[..n] }
    }
}

/// One kv-head's sparse keys and values with the value scale, as a segment reads them.
pub(crate) struct SparsePair<K, V> {
    pub keys: K,
    pub values: V,
    pub value_scale: f32,
}

/// Streams sparse rows `range` through `slot`'s state, accumulating into the transposed
/// table `acc` (see [`transpose_in`]). `qt` holds transposed queries that already carry
/// the key scale. With `capture`, the log2-domain scores of row `j` land at
/// `capture[(j − start)·W..]`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn sparse_segment<I, K, V, const W: usize>(
    k: Kernels,
    kv: &SparsePair<K, V>,
    range: Range<usize>,
    qt: &[[f32; W]],
    acc: &mut [[f32; W]],
    slot: &mut Slot,
    bufs: (&mut Vec<f32>, &mut Vec<f32>),
    mut capture: Option<&mut [f32]>,
) where
    I: SparseIndex,
    K: SparseRows<I>,
    V: SparseRows<I>,
{
    let mut s = [[0.0f32; W]; TILE];
    let (mut ks, mut vs) = ([(0, 0); TILE], [(0, 0); TILE]);
    let mut r = range.start;
    while r < range.end {
        let n = kv.keys.tile_len(r, range.end).min(kv.values.tile_len(r, range.end));
        k.sparse_scores(qt, &kv.keys.tile(k, r, n, &mut ks, bufs.0), &mut s[..n]);
        if let Some(c) = capture.as_deref_mut() {
            let at = (r - range.start) * W;
            c[at..at + n * W].copy_from_slice(s[..n].as_flattened());
        }
        let (m, l) = slot.lanes::<W>();
        let factor = k.softmax_update(m, l, &mut s[..n]);
        rescale_rows(acc, &factor);
        if kv.value_scale != 1.0 {
            s[..n].as_flattened_mut().iter_mut().for_each(|p| *p *= kv.value_scale);
        }
        k.sparse_accumulate(&s[..n], &kv.values.tile(k, r, n, &mut vs, bufs.1), acc);
        r += n;
    }
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
