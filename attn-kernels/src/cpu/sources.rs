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
//! * quantized — dense int8 / int4 / scaled-fp8 rows (keys and values each in its own
//!   codec) read in place by the coded-row kernels of [`super::codes`] (rows whose width those kernels cannot read are decoded
//!   a tile at a time into per-thread scratch and streamed through the f32 dense kernel);
//! * coded hybrid — coded SWAN rows (bitmask or list indices); with fp8, int8 or int4
//!   values (int4 widened to the i8 codes it stands for, heads up to 256 wide) each tile's
//!   rows are placed into per-thread code rows and read by the coded-row kernels, other
//!   value codes are expanded to `f32` as above; then the dense buffer, under one softmax
//!   state;
//! * decoded — a sink, KIVI / TurboQuant-style codes read in place by [`super::rowcodes`]
//!   (a decoder that does not name its layout is decoded a tile at a time into per-thread
//!   scratch), then the recent-token buffer, under one softmax state.
//!
//! Rows that lie in order in one buffer are left to the hardware prefetcher; a segment
//! whose next tile's rows are scattered prefetches them row by row while it computes.

use kv_sparse::ValueFormat;
use kv_sparse::coded::{CodedView, IndexCode, IndexKind, ValueCode, ValueKind};
use kv_sparse::decoded::DecodeRows;
use kv_sparse::hybrid::{CodedHybridView, HybridView};
use kv_sparse::quant::{DenseCodec, DenseFormat};
use kv_sparse::{SparseIndex, Value};

use super::codes::{CodeRow, Codes, Fp8Codes, I8Codes, MaskedRow, Q4Blocks, Q8Blocks, block_scale};
use super::engine::{Item, ItemSource, Job};
use super::rowcodes;
use super::segment::{
    Scratch, SlabRows, Slot, SparsePair, SparseRows, code_tile, dense_segment, masked_tile,
    scaled_queries, sparse_segment, transpose_in, transpose_out, transposed_queries,
};
use super::tile::{Kernels, TILE, one_span, prefetch};
use crate::views::{
    CodedHybridSource, DecodedKv, DenseKv, GatheredCodedKv, GatheredKv, GatheredSparseKv,
    HybridSource, QuantKv, RecentRows, SparseKv,
};

/// A ring's `(older, newer)` row-major halves, rows of `d`, with the older half's row
/// count computed once (a division per row costs as much as a dense row's arithmetic).
#[derive(Clone, Copy)]
struct Ring<'a, D> {
    older: &'a [D],
    newer: &'a [D],
    n_older: usize,
    d: usize,
}

impl<'a, D> Ring<'a, D> {
    fn new((older, newer): (&'a [D], &'a [D]), d: usize) -> Self {
        Self { older, newer, n_older: older.len() / d, d }
    }

    /// Row `j`.
    #[inline]
    fn row(&self, j: usize) -> &'a [D] {
        let d = self.d;
        if j < self.n_older {
            &self.older[j * d..(j + 1) * d]
        } else {
            &self.newer[(j - self.n_older) * d..(j - self.n_older + 1) * d]
        }
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
        let (keys, values) = (Ring::new(kv.keys, d), Ring::new(kv.values, d));
        let row = |j| (keys.row(j), values.row(j));
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
        let head = &self.heads[kv];
        let view = head.hybrid_view();
        let sink = head.sink_rows().0.len() / view.head_dim.max(1);
        sink + view.len() + head.history_prefix().map_or(0, |(keys, _)| keys.num_rows())
    }

    fn run<const W: usize>(
        &self,
        k: Kernels,
        job: &Job<'_>,
        item: &Item,
        sc: &mut Scratch,
        slot: &mut Slot,
    ) {
        let head = &self.heads[item.kv];
        let Some(item) = &sink_segment::<W>(k, job, item, head.sink_rows(), sc, slot) else {
            return;
        };
        let view: HybridView<'_, I, V, D> = head.hybrid_view();
        match head.history_prefix() {
            None => hybrid_rows::<I, V, D, W>(k, job, item, &view, sc, slot),
            Some((sparse_keys, sparse_values)) => {
                let older = HybridView { sparse_keys, sparse_values, ..empty_buffer(view) };
                let (own, tail) = split_item(item, older.sparse_len());
                if let Some(i) = own {
                    hybrid_rows::<I, V, D, W>(k, job, &i, &older, sc, slot);
                }
                if let Some(i) = tail {
                    hybrid_rows::<I, V, D, W>(k, job, &i, &view, sc, slot);
                }
            }
        }
    }
}

/// Streams `item`'s rows among the first `sink` ones (`f32` keys and values, row-major)
/// through `slot` and returns its other rows renumbered from 0 (`None` when none remain):
/// the attention sink, kept in full before a cache's own rows under the same softmax.
fn sink_segment<const W: usize>(
    k: Kernels,
    job: &Job<'_>,
    item: &Item,
    sink: (&[f32], &[f32]),
    sc: &mut Scratch,
    slot: &mut Slot,
) -> Option<Item> {
    if sink.0.is_empty() {
        return Some(item.clone());
    }
    let d = job.cfg.head_dim();
    let (head, tail) = split_item(item, sink.0.len() / d);
    if let Some(i) = head {
        let q = scaled_queries(job.queries(i.kv, i.block), job.logit_scale(), &mut sc.q);
        let (keys, values) = (Ring::new((sink.0, &[]), d), Ring::new((sink.1, &[]), d));
        let row = |j| (keys.row(j), values.row(j));
        dense_segment::<f32, W>(k, &row, i.rows, q, d, slot, None);
    }
    tail
}

/// `item`'s rows before `p` and, renumbered from 0, those from `p` (each `None` when empty).
fn split_item(item: &Item, p: usize) -> (Option<Item>, Option<Item>) {
    let std::ops::Range { start, end } = item.rows;
    let (kv, block) = (item.kv, item.block);
    let head = (start < p).then(|| Item { kv, block, rows: start..end.min(p) });
    let tail = (end > p).then(|| Item { kv, block, rows: start.saturating_sub(p)..end - p });
    (head, tail)
}

/// The view with an empty buffer: a history prefix takes its head dim and scales.
fn empty_buffer<'a, I, V, D>(view: HybridView<'a, I, V, D>) -> HybridView<'a, I, V, D> {
    HybridView { buffer_keys: (&[], &[]), buffer_values: (&[], &[]), ..view }
}

/// As [`empty_buffer`], for coded views.
fn empty_coded_buffer<'a, X, Y, D>(
    view: CodedHybridView<'a, X, Y, D>,
) -> CodedHybridView<'a, X, Y, D> {
    CodedHybridView { buffer_keys: (&[], &[]), buffer_values: (&[], &[]), ..view }
}

/// Streams rows `item.rows` of one hybrid view (sparse history, then buffer) through `slot`.
fn hybrid_rows<I: SparseIndex, V: Value, D: Value, const W: usize>(
    k: Kernels,
    job: &Job<'_>,
    item: &Item,
    view: &HybridView<'_, I, V, D>,
    sc: &mut Scratch,
    slot: &mut Slot,
) {
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
    let (keys, values) = (Ring::new(keys, d), Ring::new(values, d));
    let row = |j: usize| (keys.row(j - split), values.row(j - split));
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

/// The second part of a gathered kv-head — SWAN sparse fp8 rows or coded rows — streamed
/// where the tiered store placed them.
pub(crate) trait GatheredPart: Sync {
    /// Resident rows.
    fn num_rows(&self) -> usize;

    /// Streams rows `range` of the part through `slot`, capturing their log2-domain scores
    /// when `capture` is given.
    #[allow(clippy::too_many_arguments)]
    fn stream<const W: usize>(
        &self,
        k: Kernels,
        job: &Job<'_>,
        item: &Item,
        range: std::ops::Range<usize>,
        sc: &mut Scratch,
        slot_capture: (&mut Slot, Option<&mut [f32]>),
    );
}

impl GatheredPart for GatheredSparseKv<'_> {
    fn num_rows(&self) -> usize {
        self.num_rows()
    }

    fn stream<const W: usize>(
        &self,
        k: Kernels,
        job: &Job<'_>,
        item: &Item,
        range: std::ops::Range<usize>,
        sc: &mut Scratch,
        slot_capture: (&mut Slot, Option<&mut [f32]>),
    ) {
        let rows = |slab| SlabRows { slab, slots: self.slots };
        let (keys, values) = (rows(self.keys), rows(self.values));
        let pair = SparsePair { keys, values, value_scale: self.values.scale };
        let key_scale = self.keys.scale;
        run_sparse::<u8, _, _, W>(k, job, item, &pair, key_scale, range, sc, slot_capture);
    }
}

impl GatheredPart for GatheredCodedKv<'_> {
    fn num_rows(&self) -> usize {
        self.num_rows()
    }

    fn stream<const W: usize>(
        &self,
        k: Kernels,
        job: &Job<'_>,
        item: &Item,
        range: std::ops::Range<usize>,
        sc: &mut Scratch,
        slot_capture: (&mut Slot, Option<&mut [f32]>),
    ) {
        rowcodes::gathered_segment::<W>(k, job, item, (self, range), sc, slot_capture);
    }
}

/// Resident dense rows and a second part ([`GatheredPart`]) of every kv-head: rows
/// `0..n_dense` are the dense list, the rest the part's list.
pub(crate) struct GatheredPartSrc<'s, 'a, D, P> {
    pub dense: &'s [GatheredKv<'a, D>],
    pub parts: &'s [P],
}

impl<D: Value, P: GatheredPart> ItemSource for GatheredPartSrc<'_, '_, D, P> {
    fn rows(&self, kv: usize) -> usize {
        self.dense[kv].num_rows() + self.parts[kv].num_rows()
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
        let (cap_dense, cap_part) = if job.capture {
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
            let range = start.max(split) - split..end - split;
            self.parts[item.kv].stream::<W>(k, job, item, range, sc, (slot, cap_part));
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

/// Coded rows read through row decoders (KIVI, TurboQuant-style) of every kv-head.
pub(crate) struct DecodedSrc<'s, 'a, K, V>(pub &'s [DecodedKv<'a, K, V>]);

impl<K: DecodeRows, V: DecodeRows> ItemSource for DecodedSrc<'_, '_, K, V> {
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
        // The sink's f32 rows, the coded rows a tile at a time, then the buffer's.
        let Some(item) = &sink_segment::<W>(k, job, item, kv.sink, sc, slot) else { return };
        let (coded, recent) = split_item(item, kv.keys.num_rows());
        if let Some(item) = &coded {
            match (kv.keys.codes(), kv.values.codes()) {
                // Codes of a layout the in-place kernels read: scores and sums from the codes.
                (Some(keys), Some(values))
                    if rowcodes::reads_keys(&keys) && rowcodes::reads_values(&values) =>
                {
                    rowcodes::coded_segment::<W>(k, job, item, (keys, values), sc, slot);
                }
                _ => {
                    let decode = |j: usize, ko: &mut [f32], vo: &mut [f32]| {
                        kv.keys.decode_row(j, ko);
                        kv.values.decode_row(j, vo);
                    };
                    decoded_segment::<W>(k, job, item, item.rows.clone(), sc, slot, decode);
                }
            }
        }
        if let (Some(item), Some(buffer)) = (recent, kv.buffer) {
            recent_rows::<W>(k, job, &item, buffer, sc, slot);
        }
    }
}

/// Streams `item`'s rows of a recent-token buffer through `slot`.
fn recent_rows<const W: usize>(
    k: Kernels,
    job: &Job<'_>,
    item: &Item,
    buffer: RecentRows<'_>,
    sc: &mut Scratch,
    slot: &mut Slot,
) {
    let d = job.cfg.head_dim();
    let q = scaled_queries(job.queries(item.kv, item.block), job.logit_scale(), &mut sc.q);
    let rows = item.rows.clone();
    match buffer {
        RecentRows::F32(b) => recent_segment::<f32, W>(k, &b, rows, q, d, slot),
        RecentRows::F16(b) => recent_segment::<_, W>(k, &b, rows, q, d, slot),
        RecentRows::Bf16(b) => recent_segment::<_, W>(k, &b, rows, q, d, slot),
    }
}

/// Dense quantized keys (codec `K`) and values (codec `V`) of every kv-head.
pub(crate) struct QuantSrc<'s, 'a, K, V>(pub &'s [QuantKv<'a, K, V>]);

/// A stored dense row as the coded-row kernels read it: blocked rows carry their scales
/// inside (row factor 1); a scaled-fp8 row is its f16 scale, then `d` codes.
fn dense_code_row<C: DenseCodec>(bytes: &[u8]) -> CodeRow<'_> {
    if C::FORMAT == DenseFormat::Fp8 {
        CodeRow { bytes: &bytes[2..], scale: block_scale(bytes) }
    } else {
        CodeRow { bytes, scale: 1.0 }
    }
}

/// [`code_segment`] over keys in codes `KC` and values of dense codec `V`, if the
/// coded-row kernels read `V`'s rows at this width; `false` (nothing streamed) otherwise.
#[allow(clippy::too_many_arguments)]
fn quant_codes<'r, KC: Codes, V: DenseCodec, const W: usize>(
    k: Kernels,
    job: &Job<'_>,
    item: &Item,
    range: std::ops::Range<usize>,
    sc: &mut Scratch,
    slot: &mut Slot,
    row: impl Fn(usize) -> (CodeRow<'r>, CodeRow<'r>),
) -> bool {
    let d = job.cfg.head_dim();
    match V::FORMAT {
        DenseFormat::Int8 if Q8Blocks::supports(d) => {
            code_segment::<KC, Q8Blocks, W>(k, job, item, range, sc, slot, row);
        }
        DenseFormat::Int4 if Q4Blocks::supports(d) => {
            code_segment::<KC, Q4Blocks, W>(k, job, item, range, sc, slot, row);
        }
        DenseFormat::Fp8 if Fp8Codes::supports(d) => {
            code_segment::<KC, Fp8Codes, W>(k, job, item, range, sc, slot, row);
        }
        _ => return false,
    }
    true
}

impl<'a, K: DenseCodec, V: DenseCodec> ItemSource for QuantSrc<'_, 'a, K, V> {
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
        // The sink's f32 rows come first, then the quantized rows, then the recent-token
        // buffer's dense rows, all under the same softmax.
        let Some(item) = &sink_segment::<W>(k, job, item, kv.sink, sc, slot) else { return };
        let (quantized, recent) = split_item(item, kv.quantized_rows());
        if let Some(item) = &quantized {
            quant_rows::<K, V, W>(k, job, item, kv, sc, slot);
        }
        if let (Some(item), Some(buffer)) = (recent, kv.buffer) {
            recent_rows::<W>(k, job, &item, buffer, sc, slot);
        }
    }
}

/// Streams rows `rows` of a recent-token buffer (dense rows in `D`) through `slot`.
fn recent_segment<D: Value, const W: usize>(
    k: Kernels,
    buffer: &DenseKv<'_, D>,
    rows: std::ops::Range<usize>,
    q: &[f32],
    d: usize,
    slot: &mut Slot,
) {
    let (keys, values) = (Ring::new(buffer.keys, d), Ring::new(buffer.values, d));
    let row = |j| (keys.row(j), values.row(j));
    dense_segment::<D, W>(k, &row, rows, q, d, slot, None);
}

/// Streams `item`'s quantized rows of `kv` (prefix rows first) through `slot`, read in place
/// by the coded-row kernels where they take the row width, else decoded a tile at a time.
fn quant_rows<K: DenseCodec, V: DenseCodec, const W: usize>(
    k: Kernels,
    job: &Job<'_>,
    item: &Item,
    kv: &QuantKv<'_, K, V>,
    sc: &mut Scratch,
    slot: &mut Slot,
) {
    let d = job.cfg.head_dim();
    let row = |j: usize| kv.row(j).expect("validated row");
    let range = item.rows.clone();
    let coded = |j| {
        let (kr, vr) = row(j);
        (dense_code_row::<K>(kr), dense_code_row::<V>(vr))
    };
    // Keys and values may be in different codecs (`-ctk` / `-ctv`): the key codes pick
    // the score kernel, the value codes the accumulation kernel.
    let (r, s) = (range.clone(), &mut *sc);
    let streamed = match K::FORMAT {
        DenseFormat::Int8 if Q8Blocks::supports(d) => {
            quant_codes::<Q8Blocks, V, W>(k, job, item, r, s, slot, coded)
        }
        DenseFormat::Int4 if Q4Blocks::supports(d) => {
            quant_codes::<Q4Blocks, V, W>(k, job, item, r, s, slot, coded)
        }
        DenseFormat::Fp8 if Fp8Codes::supports(d) => {
            quant_codes::<Fp8Codes, V, W>(k, job, item, r, s, slot, coded)
        }
        _ => false,
    };
    if !streamed {
        let decode = |j: usize, ko: &mut [f32], vo: &mut [f32]| {
            let (kr, vr) = row(j);
            K::decode(kr, ko);
            V::decode(vr, vo);
        };
        decoded_segment::<W>(k, job, item, range, sc, slot, decode);
    }
}

/// Streams rows `range` of coded rows (`row(j)` = key row `j` in codes `K`, value row `j`
/// in codes `V`) through `slot`, [`TILE`] at a time, read in place by the coded-row kernels.
fn code_segment<'r, K: Codes, V: Codes, const W: usize>(
    k: Kernels,
    job: &Job<'_>,
    item: &Item,
    range: std::ops::Range<usize>,
    sc: &mut Scratch,
    slot: &mut Slot,
    row: impl Fn(usize) -> (CodeRow<'r>, CodeRow<'r>),
) {
    let d = job.cfg.head_dim();
    let Scratch { q: qbuf, qi, .. } = sc;
    let q = scaled_queries(job.queries(item.kv, item.block), job.logit_scale(), qbuf);
    let qi = k.int8_scores::<K>(d).then(|| {
        qi.quantize(q, d);
        &*qi
    });
    let (mut kr, mut vr) = ([CodeRow::EMPTY; TILE], [CodeRow::EMPTY; TILE]);
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
            if !(one_span(kf.bytes, kl.bytes, rows) && one_span(vf.bytes, vl.bytes, rows)) {
                for j in next {
                    let (kn, vn) = row(j);
                    prefetch(kn.bytes);
                    prefetch(vn.bytes);
                }
            }
        }
        code_tile::<K, V, W>(k, &kr[..n], &vr[..n], q, qi, d, slot);
        r += n;
    }
}

/// Byte ranges of consecutive rows of a coded view, walked without a division per row
/// (the block and the row inside it advance by counting).
struct RowWalk<'v, 'a, X, Y> {
    view: &'v CodedView<'a, X, Y>,
    block: usize,
    local: usize,
    j: usize,
}

impl<'v, 'a, X: IndexCode, Y: ValueCode> RowWalk<'v, 'a, X, Y> {
    /// A walk starting at row `j`.
    fn at(view: &'v CodedView<'a, X, Y>, j: usize) -> Self {
        let rpb = view.rows_per_block();
        Self { view, block: j / rpb, local: j % rpb, j }
    }

    /// Where the next row starts in `view.bytes()` (a bitmask row's length follows from its
    /// mask, so its end is not needed).
    fn next_start(&mut self) -> usize {
        let v = self.view;
        let start = v.block_bases()[self.block] as usize + usize::from(v.offsets()[self.j]);
        self.j += 1;
        self.local += 1;
        if self.local == v.rows_per_block() {
            (self.local, self.block) = (0, self.block + 1);
        }
        start
    }

    /// The bytes of the next row (index part, then value part), relative to
    /// `view.bytes()`, and its number of kept entries.
    fn next_row(&mut self) -> (std::ops::Range<usize>, usize) {
        let v = self.view;
        let base = v.block_bases()[self.block] as usize;
        let start = base + usize::from(v.offsets()[self.j]);
        let end = if self.local + 1 == v.rows_per_block() || self.j + 1 == v.num_rows() {
            v.block_bases().get(self.block + 1).map_or(v.bytes().len(), |&e| e as usize)
        } else {
            base + usize::from(v.offsets()[self.j + 1])
        };
        self.j += 1;
        self.local += 1;
        if self.local == v.rows_per_block() {
            (self.local, self.block) = (0, self.block + 1);
        }
        let d = v.head_dim();
        let kept = (end - start)
            .checked_sub(X::fixed_bytes(d))
            .and_then(|rest| Y::k_for(rest, X::ENTRY_BYTES))
            .filter(|&k| k <= d)
            .unwrap_or(0);
        (start..end, kept)
    }
}

/// Widest head whose int4 coded rows are read in place (their nibbles are widened on the
/// stack); wider heads expand their rows to `f32`.
const INT4_IN_PLACE_MAX: usize = 256;

/// Places the coded row at `at` (keeping `kept` entries) of `view` into `out` (`head_dim`
/// codes: the kept codes at their components, zeros elsewhere; int4 values as the i8 codes
/// they stand for) and returns the factor its values carry (row scale times `head_scale`).
fn place<X: IndexCode, Y: ValueCode>(
    k: Kernels,
    view: &CodedView<'_, X, Y>,
    (at, kept): (std::ops::Range<usize>, usize),
    head_scale: f32,
    out: &mut [u8],
) -> f32 {
    let d = view.head_dim();
    let bytes = &view.bytes()[at.clone()];
    let index_bytes = X::bytes(kept, d);
    let (index, value) = bytes.split_at(index_bytes);
    let (scale, codes_at) = if Y::SCALE_BYTES > 0 && kept > 0 {
        (block_scale(value), index_bytes + Y::SCALE_BYTES)
    } else {
        (1.0, index_bytes)
    };
    if Y::KIND == ValueKind::Int4 {
        // Nibbles widened to the i8 codes they stand for (`q − 8`, element 2j in the low
        // nibble of byte j), then placed like an int8 row's codes.
        let mut wide = [0u8; INT4_IN_PLACE_MAX];
        let wide = &mut wide[..kept];
        for (pair, &b) in wide.chunks_exact_mut(2).zip(&bytes[codes_at..]) {
            pair[0] = ((b & 0x0f) as i8 - 8) as u8;
            pair[1] = ((b >> 4) as i8 - 8) as u8;
        }
        if X::KIND == IndexKind::Bitmask {
            k.place_masked(index, wide, 0, out);
        } else {
            out.fill(0);
            X::for_each_rev(index, kept, |e, i| out[i] = wide[e]);
        }
    } else if X::KIND == IndexKind::Bitmask {
        // Read from the whole byte buffer, so the shuffle's 16-byte loads may run past the
        // row into its successors (never past the buffer).
        k.place_masked(index, view.bytes(), at.start + codes_at, out);
    } else {
        out.fill(0);
        let codes = &bytes[codes_at..];
        X::for_each_rev(index, kept, |e, i| out[i] = codes[e]);
    }
    scale * head_scale
}

/// Streams the coded sparse rows `range` of `view` (8-bit codes `C`) through `slot`: each
/// tile's key and value rows are placed into per-thread code rows, then read by the
/// coded-row kernels.
#[allow(clippy::too_many_arguments)]
fn placed_segment<X: IndexCode, Y: ValueCode, D: Value, C: Codes, const W: usize>(
    k: Kernels,
    job: &Job<'_>,
    item: &Item,
    view: &CodedHybridView<'_, X, Y, D>,
    range: std::ops::Range<usize>,
    sc: &mut Scratch,
    slot: &mut Slot,
) {
    let d = job.cfg.head_dim();
    let Scratch { q: qbuf, kcode, vcode, qi, .. } = sc;
    let q = scaled_queries(job.queries(item.kv, item.block), job.logit_scale(), qbuf);
    let qi = k.int8_scores::<C>(d).then(|| {
        qi.quantize(q, d);
        &*qi
    });
    for buf in [&mut *kcode, &mut *vcode] {
        if buf.len() < TILE * d {
            buf.resize(TILE * d, 0);
        }
    }
    let (sk, sv) = view.value_scale;
    let (mut ks, mut vs) = ([0.0f32; TILE], [0.0f32; TILE]);
    let (keys, values) = (&view.sparse_keys, &view.sparse_values);
    // The rows of a coded view lie in order in one buffer: the hardware prefetcher streams
    // them (see `one_span`).
    let (mut kw, mut vw) = (RowWalk::at(keys, range.start), RowWalk::at(values, range.start));
    // Bitmask rows of 8-bit codes are placed a tile at a time; int4 rows row by row.
    let bitmask = X::KIND == IndexKind::Bitmask && Y::KIND != ValueKind::Int4;
    // Where the kernels expand a mask's codes in registers, rows are read in place.
    let in_place = bitmask && k.fuses_masked::<C>(d);
    let (mut kst, mut vst) = ([0usize; TILE], [0usize; TILE]);
    let mut r = range.start;
    while r < range.end {
        let n = TILE.min(range.end - r);
        if bitmask {
            for t in 0..n {
                (kst[t], vst[t]) = (kw.next_start(), vw.next_start());
            }
            let sb = Y::SCALE_BYTES;
            if in_place {
                let (mut kr, mut vr) = ([MaskedRow::EMPTY; TILE], [MaskedRow::EMPTY; TILE]);
                k.masked_rows(keys.bytes(), &kst[..n], d, sb, sk, &mut kr);
                k.masked_rows(values.bytes(), &vst[..n], d, sb, sv, &mut vr);
                masked_tile::<C, W>(k, &kr[..n], &vr[..n], q, qi, d, slot);
                r += n;
                continue;
            }
            k.place_bitmask_rows(keys.bytes(), &kst[..n], d, sb, sk, kcode, &mut ks);
            k.place_bitmask_rows(values.bytes(), &vst[..n], d, sb, sv, vcode, &mut vs);
        } else {
            let kc = kcode[..n * d].chunks_exact_mut(d);
            let vc = vcode[..n * d].chunks_exact_mut(d);
            for (t, (ko, vo)) in kc.zip(vc).enumerate() {
                ks[t] = place(k, keys, kw.next_row(), sk, ko);
                vs[t] = place(k, values, vw.next_row(), sv, vo);
            }
        }
        let (mut kr, mut vr) = ([CodeRow::EMPTY; TILE], [CodeRow::EMPTY; TILE]);
        for t in 0..n {
            kr[t] = CodeRow { bytes: &kcode[t * d..(t + 1) * d], scale: ks[t] };
            vr[t] = CodeRow { bytes: &vcode[t * d..(t + 1) * d], scale: vs[t] };
        }
        code_tile::<C, C, W>(k, &kr[..n], &vr[..n], q, qi, d, slot);
        r += n;
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
        let head = &self.heads[kv];
        let view = head.coded_view();
        let sink = head.sink_rows().0.len() / view.head_dim.max(1);
        sink + view.len() + head.history_prefix().map_or(0, |(keys, _)| keys.num_rows())
    }

    fn run<const W: usize>(
        &self,
        k: Kernels,
        job: &Job<'_>,
        item: &Item,
        sc: &mut Scratch,
        slot: &mut Slot,
    ) {
        let head = &self.heads[item.kv];
        let Some(item) = &sink_segment::<W>(k, job, item, head.sink_rows(), sc, slot) else {
            return;
        };
        let view: CodedHybridView<'_, X, Y, D> = head.coded_view();
        match head.history_prefix() {
            None => coded_hybrid_rows::<X, Y, D, W>(k, job, item, &view, sc, slot),
            Some((sparse_keys, sparse_values)) => {
                let older =
                    CodedHybridView { sparse_keys, sparse_values, ..empty_coded_buffer(view) };
                let (own, tail) = split_item(item, older.sparse_len());
                if let Some(i) = own {
                    coded_hybrid_rows::<X, Y, D, W>(k, job, &i, &older, sc, slot);
                }
                if let Some(i) = tail {
                    coded_hybrid_rows::<X, Y, D, W>(k, job, &i, &view, sc, slot);
                }
            }
        }
    }
}

/// Streams rows `item.rows` of one coded hybrid view (sparse history, then buffer)
/// through `slot`.
fn coded_hybrid_rows<X: IndexCode, Y: ValueCode, D: Value, const W: usize>(
    k: Kernels,
    job: &Job<'_>,
    item: &Item,
    view: &CodedHybridView<'_, X, Y, D>,
    sc: &mut Scratch,
    slot: &mut Slot,
) {
    let view = *view;
    let split = view.sparse_len();
    let (start, end) = (item.rows.start, item.rows.end);
    let d = job.cfg.head_dim();
    type Placed<'v, X, Y, D> = fn(
        Kernels,
        &Job<'_>,
        &Item,
        &CodedHybridView<'v, X, Y, D>,
        std::ops::Range<usize>,
        &mut Scratch,
        &mut Slot,
    );
    // 8-bit value codes are placed and read in place; the type picks the kernels.
    let placed: Option<Placed<'_, X, Y, D>> = if Y::KIND == ValueKind::Elems(ValueFormat::Fp8E4M3)
        && Fp8Codes::supports(d)
    {
        Some(placed_segment::<X, Y, D, Fp8Codes, W>)
    } else if I8Codes::supports(d)
        && (Y::KIND == ValueKind::Int8 || (Y::KIND == ValueKind::Int4 && d <= INT4_IN_PLACE_MAX))
    {
        Some(placed_segment::<X, Y, D, I8Codes, W>)
    } else {
        None
    };
    if start < split {
        let sparse = start..end.min(split);
        if let Some(placed) = placed {
            placed(k, job, item, &view, sparse, sc, slot);
        } else {
            let (sk, sv) = view.value_scale;
            let decode = |j: usize, ko: &mut [f32], vo: &mut [f32]| {
                expand_scaled(&view.sparse_keys, j, sk, ko);
                expand_scaled(&view.sparse_values, j, sv, vo);
            };
            decoded_segment::<W>(k, job, item, sparse, sc, slot, decode);
        }
    }
    if end > split {
        let (keys, values) = (view.buffer_keys, view.buffer_values);
        buffer_segment::<D, W>(k, job, item, keys, values, split, sc, slot);
    }
}
