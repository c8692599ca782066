//! The four kernel inputs as [`ItemSource`]s: how each streams a row range of one
//! kv-head through dense and sparse segments.
//!
//! * dense — one dense segment over the ring's `(older, newer)` rows;
//! * sparse — one CSR segment (SWAN's sparse history alone);
//! * hybrid — the CSR history, then the dense buffer, continuing one softmax state
//!   (SWAN method section, Algorithm 1);
//! * gathered — a dense segment over the resident rows of a tiered store, optionally
//!   keeping every row's logits for the anchor signal (WnW §2.3, Eq. 2).

use kv_sparse::hybrid::HybridView;
use kv_sparse::{SparseIndex, Value};

use super::engine::{Item, ItemSource, Job};
use super::segment::{
    CsrPair, Scratch, Slot, dense_segment, scaled_queries, sparse_segment, transpose_in,
    transpose_out, transposed_queries,
};
use super::tile::Kernels;
use crate::views::{DenseKv, GatheredKv, HybridSource, SparseKv};

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

/// Runs CSR rows `range` of `pair` (keys scaled by `key_scale`) through `slot`.
#[allow(clippy::too_many_arguments)]
fn run_sparse<I: SparseIndex, V: Value, const W: usize>(
    k: Kernels,
    job: &Job<'_>,
    item: &Item,
    pair: &CsrPair<'_, I, V>,
    key_scale: f32,
    range: std::ops::Range<usize>,
    sc: &mut Scratch,
    slot: &mut Slot,
) {
    let d = job.cfg.head_dim();
    let q = job.queries(item.kv, item.block);
    let qt = transposed_queries::<I, W>(q, d, job.logit_scale() * key_scale, &mut sc.qt);
    let acc = transpose_in::<I, W>(slot, d, &mut sc.acc_t);
    sparse_segment::<I, V, W>(k, pair, range, qt, acc, slot, (&mut sc.kval, &mut sc.vval));
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
        let pair = CsrPair { keys: kv.keys, values: kv.values, value_scale: kv.value_scale };
        run_sparse::<I, V, W>(k, job, item, &pair, kv.key_scale, item.rows.clone(), sc, slot);
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
        let (d, split) = (job.cfg.head_dim(), view.sparse_len());
        let (start, end) = (item.rows.start, item.rows.end);
        if start < split {
            let pair = CsrPair {
                keys: view.sparse_keys,
                values: view.sparse_values,
                value_scale: view.value_scale.1,
            };
            let range = start..end.min(split);
            run_sparse::<I, V, W>(k, job, item, &pair, view.value_scale.0, range, sc, slot);
        }
        if end > split {
            let q = scaled_queries(job.queries(item.kv, item.block), job.logit_scale(), &mut sc.q);
            let row = |j: usize| {
                (
                    ring_row(view.buffer_keys, d, j - split),
                    ring_row(view.buffer_values, d, j - split),
                )
            };
            dense_segment::<D, W>(k, &row, start.max(split)..end, q, d, slot, None);
        }
    }
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
        let (kv, d) = (&self.0[item.kv], job.cfg.head_dim());
        let q = scaled_queries(job.queries(item.kv, item.block), job.logit_scale(), &mut sc.q);
        let row = |j: usize| {
            let s = kv.slab_row(j);
            (&kv.keys[s * d..(s + 1) * d], &kv.values[s * d..(s + 1) * d])
        };
        let mut capture = std::mem::take(&mut slot.capture);
        let cap = job.capture.then_some(&mut capture[..]);
        dense_segment::<D, W>(k, &row, item.rows.clone(), q, d, slot, cap);
        slot.capture = capture;
    }
}
