//! The four kernel inputs as [`ItemSource`]s: how each streams a row range of one
//! kv-head through dense and sparse segments.
//!
//! * dense — one dense segment over the ring's `(older, newer)` rows;
//! * sparse — one CSR segment (SWAN's sparse history alone);
//! * hybrid — the CSR history, then the dense buffer, continuing one softmax state
//!   (SWAN method section, Algorithm 1);
//! * gathered — a dense segment over the resident rows of a tiered store, optionally
//!   keeping every row's logits for the anchor signal (WnW §2.3, Eq. 2);
//! * gathered sparse — a kv-head's dense resident rows, then its sparse slab rows (SWAN
//!   rows recalled by the WnW store), continuing one softmax state, logits optionally kept;
//! * quantized — dense int8 / int4 / scaled-fp8 rows, decoded a tile at a time into
//!   per-thread scratch and streamed through the f32 dense tile kernel;
//! * coded hybrid — coded SWAN rows (bitmask or list × float or integer values), expanded a
//!   tile at a time the same way, then the dense buffer, under one softmax state.

use kv_sparse::coded::{CodedView, IndexCode, ValueCode};
use kv_sparse::hybrid::{CodedHybridView, HybridView};
use kv_sparse::quant::DenseCodec;
use kv_sparse::{SparseIndex, Value};

use super::engine::{Item, ItemSource, Job};
use super::segment::{
    Scratch, SlabRows, Slot, SparsePair, SparseRows, dense_segment, scaled_queries, sparse_segment,
    transpose_in, transpose_out, transposed_queries,
};
use super::tile::{Kernels, TILE};
use crate::views::{
    CodedHybridSource, DenseKv, GatheredKv, GatheredSparseKv, HybridSource, QuantKv, SparseKv,
};

/// Row `j` of a ring's `(older, newer)` row-major halves.
fn ring_row<'a, D>((older, newer): (&'a [D], &'a [D]), d: usize, j: usize) -> &'a [D] {
    let n_older = older.len() / d;
    if j < n_older {
        &older[j * d..(j + 1) * d]
    } else {
        &newer[(j - n_older) * d..(j - n_older + 1) * d]
    }
}

/// Dense keys/values of every kv-head.
pub(crate) struct DenseSrc<'s, 'a, D>(pub &'s [DenseKv<'a, D>]);

impl<D: Value> ItemSource for DenseSrc<'_, '_, D> {
    fn rows(&self, kv: usize) -> usize {
        self.0[kv].num_rows()
    }

    fn run<const W: usize>(
        &self,
        k: Kernels,
        job: &Job<'_>,
        item: &Item,
        sc: &mut Scratch,
        slot: &mut Slot,
    ) {
        let (kv, d) = (&self.0[item.kv], job.cfg.head_dim());
        let q = scaled_queries(job.queries(item.kv, item.block), job.logit_scale(), &mut sc.q);
        let row = |j| (ring_row(kv.keys, d, j), ring_row(kv.values, d, j));
        dense_segment::<D, W>(k, &row, item.rows.clone(), q, d, slot, None);
    }
}

/// Runs sparse rows `range` of `pair` (keys scaled by `key_scale`) through `slot`,
/// optionally capturing their scores.
#[allow(clippy::too_many_arguments)]
fn run_sparse<I: SparseIndex, K: SparseRows<I>, V: SparseRows<I>, const W: usize>(
    k: Kernels,
    job: &Job<'_>,
    item: &Item,
    pair: &SparsePair<K, V>,
    key_scale: f32,
    range: std::ops::Range<usize>,
    sc: &mut Scratch,
    (slot, capture): (&mut Slot, Option<&mut [f32]>),
) {
    let d = job.cfg.head_dim();
    let q = job.queries(item.kv, item.block);
    let qt = transposed_queries::<I, W>(q, d, job.logit_scale() * key_scale, &mut sc.qt);
    let acc = transpose_in::<I, W>(slot, d, &mut sc.acc_t);
    let bufs = (&mut sc.kval, &mut sc.vval);
    sparse_segment::<I, K, V, W>(k, pair, range, qt, acc, slot, bufs, capture);
    transpose_out::<W>(acc, d, slot);
}

/// CSR keys/values of every kv-head.
pub(crate) struct SparseSrc<'s, 'a, I, V>(pub &'s [SparseKv<'a, I, V>]);

impl<I: SparseIndex, V: Value> ItemSource for SparseSrc<'_, '_, I, V> {
    fn rows(&self, kv: usize) -> usize {
        self.0[kv].num_rows()
    }

    fn run<const W: usize>(
        &self,
        k: Kernels,
        job: &Job<'_>,
        item: &Item,
        sc: &mut Scratch,
        slot: &mut Slot,
    ) {
        let kv = &self.0[item.kv];
        let pair = SparsePair { keys: kv.keys, values: kv.values, value_scale: kv.value_scale };
        let range = item.rows.clone();
        run_sparse::<I, _, _, W>(k, job, item, &pair, kv.key_scale, range, sc, (slot, None));
    }
}

/// Marks the element types a source reads without owning any.
type Types<I, V, D> = std::marker::PhantomData<fn() -> (I, V, D)>;

/// Hybrid caches of every kv-head.
pub(crate) struct HybridSrc<'s, H, I, V, D> {
    pub heads: &'s [H],
    pub types: Types<I, V, D>,
}

impl<I, V, D, H> ItemSource for HybridSrc<'_, H, I, V, D>
where
    I: SparseIndex,
    V: Value,
    D: Value,
    H: HybridSource<I, V, D>,
{
    fn rows(&self, kv: usize) -> usize {
        self.heads[kv].hybrid_view().len()
    }

    fn run<const W: usize>(
        &self,
        k: Kernels,
        job: &Job<'_>,
        item: &Item,
        sc: &mut Scratch,
        slot: &mut Slot,
    ) {
        let view: HybridView<'_, I, V, D> = self.heads[item.kv].hybrid_view();
        let split = view.sparse_len();
        let (start, end) = (item.rows.start, item.rows.end);
        if start < split {
            let pair = SparsePair {
                keys: view.sparse_keys,
                values: view.sparse_values,
                value_scale: view.value_scale.1,
            };
            let range = start..end.min(split);
            let key_scale = view.value_scale.0;
            run_sparse::<I, _, _, W>(k, job, item, &pair, key_scale, range, sc, (slot, None));
        }
        if end > split {
            let (keys, values) = (view.buffer_keys, view.buffer_values);
            buffer_segment::<D, W>(k, job, item, keys, values, split, sc, slot);
        }
    }
}

/// Streams the dense buffer rows of `item` (the rows from `split`, SWAN's buffer after the
/// sparse history) through `slot`.
#[allow(clippy::too_many_arguments)]
fn buffer_segment<D: Value, const W: usize>(
    k: Kernels,
    job: &Job<'_>,
    item: &Item,
    keys: (&[D], &[D]),
    values: (&[D], &[D]),
    split: usize,
    sc: &mut Scratch,
    slot: &mut Slot,
) {
    let d = job.cfg.head_dim();
    let q = scaled_queries(job.queries(item.kv, item.block), job.logit_scale(), &mut sc.q);
    let row = |j: usize| (ring_row(keys, d, j - split), ring_row(values, d, j - split));
    dense_segment::<D, W>(k, &row, item.rows.start.max(split)..item.rows.end, q, d, slot, None);
}

/// Resident rows of every kv-head.
pub(crate) struct GatheredSrc<'s, 'a, D>(pub &'s [GatheredKv<'a, D>]);

impl<D: Value> ItemSource for GatheredSrc<'_, '_, D> {
    fn rows(&self, kv: usize) -> usize {
        self.0[kv].num_rows()
    }

    fn run<const W: usize>(
        &self,
        k: Kernels,
        job: &Job<'_>,
        item: &Item,
        sc: &mut Scratch,
        slot: &mut Slot,
    ) {
        let mut capture = std::mem::take(&mut slot.capture);
        let cap = job.capture.then_some(&mut capture[..]);
        let kv = &self.0[item.kv];
        run_gathered::<D, W>(k, job, item, kv, item.rows.clone(), sc, (slot, cap));
        slot.capture = capture;
    }
}

/// Runs resident dense rows `range` of `kv` through `slot`, optionally capturing scores.
fn run_gathered<D: Value, const W: usize>(
    k: Kernels,
    job: &Job<'_>,
    item: &Item,
    kv: &GatheredKv<'_, D>,
    range: std::ops::Range<usize>,
    sc: &mut Scratch,
    (slot, capture): (&mut Slot, Option<&mut [f32]>),
) {
    let d = job.cfg.head_dim();
    let q = scaled_queries(job.queries(item.kv, item.block), job.logit_scale(), &mut sc.q);
    let row = |j: usize| {
        let s = kv.slab_row(j);
        (&kv.keys[s * d..(s + 1) * d], &kv.values[s * d..(s + 1) * d])
    };
    dense_segment::<D, W>(k, &row, range, q, d, slot, capture);
}

/// Resident dense and sparse rows of every kv-head: rows `0..n_dense` are the dense list,
/// the rest the sparse list.
pub(crate) struct GatheredSparseSrc<'s, 'a, D> {
    pub dense: &'s [GatheredKv<'a, D>],
    pub sparse: &'s [GatheredSparseKv<'a>],
}

impl<D: Value> ItemSource for GatheredSparseSrc<'_, '_, D> {
    fn rows(&self, kv: usize) -> usize {
        self.dense[kv].num_rows() + self.sparse[kv].num_rows()
    }

    fn run<const W: usize>(
        &self,
        k: Kernels,
        job: &Job<'_>,
        item: &Item,
        sc: &mut Scratch,
        slot: &mut Slot,
    ) {
        let split = self.dense[item.kv].num_rows();
        let (start, end) = (item.rows.start, item.rows.end);
        let mut capture = std::mem::take(&mut slot.capture);
        let (cap_dense, cap_sparse) = if job.capture {
            let (a, b) = capture.split_at_mut((split.clamp(start, end) - start) * W);
            (Some(a), Some(b))
        } else {
            (None, None)
        };
        if start < split {
            let (kv, range) = (&self.dense[item.kv], start..end.min(split));
            run_gathered::<D, W>(k, job, item, kv, range, sc, (slot, cap_dense));
        }
        if end > split {
            let kv = &self.sparse[item.kv];
            let rows = |slab| SlabRows { slab, slots: kv.slots };
            let (keys, values) = (rows(kv.keys), rows(kv.values));
            let pair = SparsePair { keys, values, value_scale: kv.values.scale };
            let range = start.max(split) - split..end - split;
            let key_scale = kv.keys.scale;
            run_sparse::<u8, _, _, W>(
                k,
                job,
                item,
                &pair,
                key_scale,
                range,
                sc,
                (slot, cap_sparse),
            );
        }
        slot.capture = capture;
    }
}

/// Streams rows `range` whose key and value rows `decode(j, key_out, value_out)` writes as
/// `f32` (`d` each), [`TILE`] rows at a time through the dense f32 tile kernel: the stored
/// rows are read once, the decoded tile lives in per-thread scratch.
fn decoded_segment<const W: usize>(
    k: Kernels,
    job: &Job<'_>,
    item: &Item,
    range: std::ops::Range<usize>,
    sc: &mut Scratch,
    slot: &mut Slot,
    decode: impl Fn(usize, &mut [f32], &mut [f32]),
) {
    let d = job.cfg.head_dim();
    let Scratch { q: qbuf, kval, vval, .. } = sc;
    let q = scaled_queries(job.queries(item.kv, item.block), job.logit_scale(), qbuf);
    for buf in [&mut *kval, &mut *vval] {
        if buf.len() < TILE * d {
            buf.resize(TILE * d, 0.0);
        }
    }
    let mut r = range.start;
    while r < range.end {
        let n = TILE.min(range.end - r);
        for t in 0..n {
            decode(r + t, &mut kval[t * d..(t + 1) * d], &mut vval[t * d..(t + 1) * d]);
        }
        let (kt, vt) = (&kval[..], &vval[..]);
        let row = |j: usize| (&kt[j * d..(j + 1) * d], &vt[j * d..(j + 1) * d]);
        dense_segment::<f32, W>(k, &row, 0..n, q, d, slot, None);
        r += n;
    }
}

/// Dense quantized keys/values of every kv-head.
pub(crate) struct QuantSrc<'s, 'a, C>(pub &'s [QuantKv<'a, C>]);

impl<C: DenseCodec> ItemSource for QuantSrc<'_, '_, C> {
    fn rows(&self, kv: usize) -> usize {
        self.0[kv].num_rows()
    }

    fn run<const W: usize>(
        &self,
        k: Kernels,
        job: &Job<'_>,
        item: &Item,
        sc: &mut Scratch,
        slot: &mut Slot,
    ) {
        let kv = &self.0[item.kv];
        let decode = |j: usize, ko: &mut [f32], vo: &mut [f32]| {
            C::decode(kv.keys.row(j).expect("validated row"), ko);
            C::decode(kv.values.row(j).expect("validated row"), vo);
        };
        decoded_segment::<W>(k, job, item, item.rows.clone(), sc, slot, decode);
    }
}

/// Expands coded row `j` of `view` into `out`, times `scale`.
fn expand_scaled<X: IndexCode, Y: ValueCode>(
    view: &CodedView<'_, X, Y>,
    j: usize,
    scale: f32,
    out: &mut [f32],
) {
    view.row(j).expect("validated row").expand(out);
    if scale != 1.0 {
        out.iter_mut().for_each(|x| *x *= scale);
    }
}

/// Coded hybrid caches of every kv-head.
pub(crate) struct CodedHybridSrc<'s, H, X, Y, D> {
    pub heads: &'s [H],
    pub types: Types<X, Y, D>,
}

impl<X, Y, D, H> ItemSource for CodedHybridSrc<'_, H, X, Y, D>
where
    X: IndexCode,
    Y: ValueCode,
    D: Value,
    H: CodedHybridSource<X, Y, D>,
{
    fn rows(&self, kv: usize) -> usize {
        self.heads[kv].coded_view().len()
    }

    fn run<const W: usize>(
        &self,
        k: Kernels,
        job: &Job<'_>,
        item: &Item,
        sc: &mut Scratch,
        slot: &mut Slot,
    ) {
        let view: CodedHybridView<'_, X, Y, D> = self.heads[item.kv].coded_view();
        let split = view.sparse_len();
        let (start, end) = (item.rows.start, item.rows.end);
        if start < split {
            let (sk, sv) = view.value_scale;
            let decode = |j: usize, ko: &mut [f32], vo: &mut [f32]| {
                expand_scaled(&view.sparse_keys, j, sk, ko);
                expand_scaled(&view.sparse_values, j, sv, vo);
            };
            decoded_segment::<W>(k, job, item, start..end.min(split), sc, slot, decode);
        }
        if end > split {
            let (keys, values) = (view.buffer_keys, view.buffer_values);
            buffer_segment::<D, W>(k, job, item, keys, values, split, sc, slot);
        }
    }
}
