//! Input validation shared by the reference, the optimized CPU kernels and the CUDA path's
//! query checks: every shape, count, scale and ordering a kernel relies on is checked here,
//! once per call, before any row is read — so a bad input is a typed [`Error`], never a
//! panic or an out-of-bounds read. It guards the inputs of SWAN's hybrid decode (method
//! section: CSR history + dense buffer) and of WnW's gathered decode (§2.3: resident
//! positions, slots and the dense/sparse split of one kv-head).

use kv_sparse::coded::{IndexCode, ValueCode};
use kv_sparse::csr::CsrView;
use kv_sparse::hybrid::{CodedHybridView, HybridView};
use kv_sparse::quant::DenseCodec;
use kv_sparse::{SparseIndex, Value};

use crate::config::AttnConfig;
use crate::error::{Error, Result};
use crate::views::{
    CodedHistoryPrefix, DenseKv, GatheredKv, GatheredSparseKv, HistoryPrefix, QuantKv, SparseKv,
    SparseSlab,
};

/// Query and output lengths, the number of per-kv-head caches, a finite query.
pub(crate) fn call(
    op: &'static str,
    cfg: &AttnConfig,
    q: &[f32],
    out: &[f32],
    caches: usize,
) -> Result<()> {
    lengths(op, cfg, q.len(), out.len())?;
    if caches != cfg.kv_heads() {
        let expected = cfg.kv_heads();
        return Err(Error::LengthMismatch { op, what: "kv-head caches", expected, got: caches });
    }
    finite_query(op, cfg, q)
}

/// Query and output lengths: `q_len()` elements each.
pub(crate) fn lengths(op: &'static str, cfg: &AttnConfig, q: usize, out: usize) -> Result<()> {
    let expected = cfg.q_len();
    for (what, got) in [("q", q), ("out", out)] {
        if got != expected {
            return Err(Error::LengthMismatch { op, what, expected, got });
        }
    }
    Ok(())
}

/// A query without NaN or infinity.
pub(crate) fn finite_query(op: &'static str, cfg: &AttnConfig, q: &[f32]) -> Result<()> {
    if let Some(i) = q.iter().position(|x| !x.is_finite()) {
        let d = cfg.head_dim();
        return Err(Error::NonFiniteQuery { op, q_head: i / d, dim: i % d, value: q[i] });
    }
    Ok(())
}

fn head_dim(op: &'static str, kv_head: usize, expected: usize, got: usize) -> Result<()> {
    if got != expected {
        return Err(Error::HeadDimMismatch { op, kv_head, expected, got });
    }
    Ok(())
}

/// Rows of a ring's `(older, newer)` halves, each a whole number of rows.
fn ring_rows<D>(
    op: &'static str,
    kv_head: usize,
    what: [&'static str; 2],
    (older, newer): (&[D], &[D]),
    d: usize,
) -> Result<usize> {
    for (what, part) in what.into_iter().zip([older, newer]) {
        if !part.len().is_multiple_of(d) {
            return Err(Error::RaggedRows { op, kv_head, what, len: part.len(), head_dim: d });
        }
    }
    Ok((older.len() + newer.len()) / d)
}

fn same_rows(
    op: &'static str,
    kv_head: usize,
    part: &'static str,
    keys: usize,
    values: usize,
) -> Result<usize> {
    if keys != values {
        return Err(Error::RowCountMismatch { op, kv_head, part, keys, values });
    }
    Ok(keys)
}

fn non_empty(op: &'static str, kv_head: usize, rows: usize) -> Result<usize> {
    if rows == 0 {
        return Err(Error::EmptyCache { op, kv_head });
    }
    Ok(rows)
}

fn scale(op: &'static str, kv_head: usize, what: &'static str, scale: f32) -> Result<()> {
    if !(scale.is_finite() && scale > 0.0) {
        return Err(Error::InvalidValueScale { op, kv_head, what, scale });
    }
    Ok(())
}

/// A dense kv-head; returns its rows.
pub(crate) fn dense<D: Value>(
    op: &'static str,
    d: usize,
    kv_head: usize,
    kv: &DenseKv<'_, D>,
) -> Result<usize> {
    head_dim(op, kv_head, d, kv.head_dim)?;
    let k = ring_rows(op, kv_head, ["keys.0", "keys.1"], kv.keys, d)?;
    let v = ring_rows(op, kv_head, ["values.0", "values.1"], kv.values, d)?;
    non_empty(op, kv_head, same_rows(op, kv_head, "dense", k, v)?)
}

/// The CSR part of a kv-head with its key/value scales; returns its rows (may be 0).
fn csr<I: SparseIndex, V: Value>(
    op: &'static str,
    d: usize,
    kv_head: usize,
    keys: &CsrView<'_, I, V>,
    values: &CsrView<'_, I, V>,
    (key_scale, value_scale): (f32, f32),
) -> Result<usize> {
    head_dim(op, kv_head, d, keys.head_dim())?;
    head_dim(op, kv_head, d, values.head_dim())?;
    scale(op, kv_head, "key", key_scale)?;
    scale(op, kv_head, "value", value_scale)?;
    same_rows(op, kv_head, "sparse", keys.num_rows(), values.num_rows())
}

/// A sparse kv-head; returns its rows.
pub(crate) fn sparse<I: SparseIndex, V: Value>(
    op: &'static str,
    d: usize,
    kv_head: usize,
    kv: &SparseKv<'_, I, V>,
) -> Result<usize> {
    let rows = csr(op, d, kv_head, &kv.keys, &kv.values, (kv.key_scale, kv.value_scale))?;
    non_empty(op, kv_head, rows)
}

/// A hybrid kv-head and the older sparse rows before its history, if any; returns its
/// rows (prefix + sparse + buffer).
pub(crate) fn hybrid<I: SparseIndex, V: Value, D: Value>(
    op: &'static str,
    d: usize,
    kv_head: usize,
    view: &HybridView<'_, I, V, D>,
    prefix: Option<&HistoryPrefix<'_, I, V>>,
    sink_rows: (&[f32], &[f32]),
) -> Result<usize> {
    head_dim(op, kv_head, d, view.head_dim)?;
    let mut s = csr(op, d, kv_head, &view.sparse_keys, &view.sparse_values, view.value_scale)?;
    s += sink(op, d, kv_head, sink_rows)?;
    if let Some((keys, values)) = prefix {
        s += csr(op, d, kv_head, keys, values, view.value_scale)?;
    }
    let k = ring_rows(op, kv_head, ["buffer_keys.0", "buffer_keys.1"], view.buffer_keys, d)?;
    let v = ring_rows(op, kv_head, ["buffer_values.0", "buffer_values.1"], view.buffer_values, d)?;
    non_empty(op, kv_head, s + same_rows(op, kv_head, "buffer", k, v)?)
}

/// A dense quantized kv-head; returns its rows.
pub(crate) fn quantized<K: DenseCodec, V: DenseCodec>(
    op: &'static str,
    d: usize,
    kv_head: usize,
    kv: &QuantKv<'_, K, V>,
) -> Result<usize> {
    let own = ("dense", (&kv.keys, &kv.values));
    let older = kv.prefix.as_ref().map(|(k, v)| ("dense prefix", (k, v)));
    let mut rows = 0;
    for (what, (keys, values)) in std::iter::once(own).chain(older) {
        head_dim(op, kv_head, d, keys.head_dim())?;
        head_dim(op, kv_head, d, values.head_dim())?;
        rows += same_rows(op, kv_head, what, keys.num_rows(), values.num_rows())?;
    }
    rows += sink(op, d, kv_head, kv.sink)?;
    if let Some(buffer) = &kv.buffer {
        rows += recent(op, d, kv_head, buffer)?;
    }
    non_empty(op, kv_head, rows)
}

/// A decoded kv-head (coded rows read through row decoders); returns its rows.
pub(crate) fn decoded<K: kv_sparse::decoded::DecodeRows, V: kv_sparse::decoded::DecodeRows>(
    op: &'static str,
    d: usize,
    kv_head: usize,
    kv: &crate::views::DecodedKv<'_, K, V>,
) -> Result<usize> {
    head_dim(op, kv_head, d, kv.keys.head_dim())?;
    head_dim(op, kv_head, d, kv.values.head_dim())?;
    let mut rows = same_rows(op, kv_head, "coded", kv.keys.num_rows(), kv.values.num_rows())?;
    for codes in [kv.keys.codes(), kv.values.codes()].into_iter().flatten() {
        codes.check(op, d, kv.keys.num_rows())?;
    }
    rows += sink(op, d, kv_head, kv.sink)?;
    if let Some(buffer) = &kv.buffer {
        rows += recent(op, d, kv_head, buffer)?;
    }
    non_empty(op, kv_head, rows)
}

/// A kv-head's recent-token buffer (dense keys and values in a float format); returns its
/// rows.
pub(crate) fn recent(
    op: &'static str,
    d: usize,
    kv_head: usize,
    buffer: &crate::views::RecentRows<'_>,
) -> Result<usize> {
    use crate::views::RecentRows;
    fn rows<D>(op: &'static str, d: usize, kv_head: usize, kv: &DenseKv<'_, D>) -> Result<usize> {
        head_dim(op, kv_head, d, kv.head_dim)?;
        let k = ring_rows(op, kv_head, ["buffer keys.0", "buffer keys.1"], kv.keys, d)?;
        let v = ring_rows(op, kv_head, ["buffer values.0", "buffer values.1"], kv.values, d)?;
        same_rows(op, kv_head, "buffer", k, v)
    }
    match buffer {
        RecentRows::F32(kv) => rows(op, d, kv_head, kv),
        RecentRows::F16(kv) => rows(op, d, kv_head, kv),
        RecentRows::Bf16(kv) => rows(op, d, kv_head, kv),
    }
}

/// A kv-head's `f32` sink rows (keys, values); returns their rows.
pub(crate) fn sink(
    op: &'static str,
    d: usize,
    kv_head: usize,
    (keys, values): (&[f32], &[f32]),
) -> Result<usize> {
    let k = ring_rows(op, kv_head, ["sink keys", "sink keys"], (keys, &[]), d)?;
    let v = ring_rows(op, kv_head, ["sink values", "sink values"], (values, &[]), d)?;
    same_rows(op, kv_head, "sink", k, v)
}

/// A coded hybrid kv-head and the older coded rows before its history, if any; returns
/// its rows (prefix + sparse + buffer).
pub(crate) fn coded_hybrid<X: IndexCode, Y: ValueCode, D: Value>(
    op: &'static str,
    d: usize,
    kv_head: usize,
    view: &CodedHybridView<'_, X, Y, D>,
    prefix: Option<&CodedHistoryPrefix<'_, X, Y>>,
    sink_rows: (&[f32], &[f32]),
) -> Result<usize> {
    head_dim(op, kv_head, d, view.head_dim)?;
    scale(op, kv_head, "key", view.value_scale.0)?;
    scale(op, kv_head, "value", view.value_scale.1)?;
    let mut s = sink(op, d, kv_head, sink_rows)?;
    let own = ("sparse", (&view.sparse_keys, &view.sparse_values));
    let older = prefix.map(|(k, v)| ("sparse prefix", (k, v)));
    for (what, (keys, values)) in std::iter::once(own).chain(older) {
        head_dim(op, kv_head, d, keys.head_dim())?;
        head_dim(op, kv_head, d, values.head_dim())?;
        s += same_rows(op, kv_head, what, keys.num_rows(), values.num_rows())?;
    }
    let k = ring_rows(op, kv_head, ["buffer_keys.0", "buffer_keys.1"], view.buffer_keys, d)?;
    let v = ring_rows(op, kv_head, ["buffer_values.0", "buffer_values.1"], view.buffer_values, d)?;
    non_empty(op, kv_head, s + same_rows(op, kv_head, "buffer", k, v)?)
}

/// A gathered kv-head; returns its resident rows.
pub(crate) fn gathered<D: Value>(
    op: &'static str,
    d: usize,
    kv_head: usize,
    kv: &GatheredKv<'_, D>,
) -> Result<usize> {
    non_empty(op, kv_head, gathered_rows(op, d, kv_head, kv)?)
}

/// A gathered kv-head's dense part; returns its resident rows (may be 0).
fn gathered_rows<D: Value>(
    op: &'static str,
    d: usize,
    kv_head: usize,
    kv: &GatheredKv<'_, D>,
) -> Result<usize> {
    head_dim(op, kv_head, d, kv.head_dim)?;
    let k = ring_rows(op, kv_head, ["keys", "keys"], (kv.keys, &[]), d)?;
    let v = ring_rows(op, kv_head, ["values", "values"], (kv.values, &[]), d)?;
    let slab_rows = same_rows(op, kv_head, "gathered slab", k, v)?;
    resident(op, kv_head, kv.positions, kv.slots, slab_rows)
}

/// A resident list: slots inside the slab, positions strictly ascending; returns its rows.
fn resident(
    op: &'static str,
    kv_head: usize,
    positions: &[u32],
    slots: Option<&[u32]>,
    slab_rows: usize,
) -> Result<usize> {
    let rows = positions.len();
    match slots {
        Some(slots) if slots.len() != rows => {
            return Err(Error::LengthMismatch {
                op,
                what: "slots",
                expected: rows,
                got: slots.len(),
            });
        }
        Some(slots) => {
            if let Some(row) = slots.iter().position(|&s| s as usize >= slab_rows) {
                return Err(Error::SlotOutOfRange {
                    op,
                    kv_head,
                    row,
                    slot: slots[row],
                    slab_rows,
                });
            }
        }
        None if rows > slab_rows => {
            let what = "positions (one slab row each)";
            return Err(Error::LengthMismatch { op, what, expected: slab_rows, got: rows });
        }
        None => {}
    }
    if let Some(row) = positions.windows(2).position(|w| w[1] <= w[0]) {
        let position = positions[row + 1];
        return Err(Error::PositionsNotAscending { op, kv_head, row: row + 1, position });
    }
    Ok(rows)
}

/// A sparse slab for head dimension `d`; returns its rows (`usize::MAX` when `k = 0`:
/// rows of no bytes, any slot reads nothing).
fn slab(
    op: &'static str,
    d: usize,
    kv_head: usize,
    what: &'static str,
    s: &SparseSlab<'_>,
) -> Result<usize> {
    let bad = |reason| {
        let (k, len) = (s.k, s.bytes.len());
        Err(Error::InvalidSlab { op, kv_head, what, k, head_dim: d, len, reason })
    };
    if d > 256 {
        return bad("u8 indices reach head_dim ≤ 256 only");
    }
    if s.k > d {
        return bad("k must be ≤ head_dim");
    }
    match s.num_rows() {
        None if !s.bytes.is_empty() => bad("k = 0 rows hold no bytes"),
        None => Ok(usize::MAX),
        Some(_) if !s.bytes.len().is_multiple_of(s.row_bytes()) => {
            bad("length must be a multiple of the 2k-byte row")
        }
        Some(rows) => Ok(rows),
    }
}

/// A gathered kv-head's sparse part; returns its resident rows (may be 0).
fn gathered_sparse_rows(
    op: &'static str,
    d: usize,
    kv_head: usize,
    kv: &GatheredSparseKv<'_>,
) -> Result<usize> {
    head_dim(op, kv_head, d, kv.head_dim)?;
    let k = slab(op, d, kv_head, "key", &kv.keys)?;
    let v = slab(op, d, kv_head, "value", &kv.values)?;
    scale(op, kv_head, "key", kv.keys.scale)?;
    scale(op, kv_head, "value", kv.values.scale)?;
    let slab_rows = match (k, v) {
        (usize::MAX, r) | (r, usize::MAX) => r,
        (k, v) => same_rows(op, kv_head, "gathered sparse slab", k, v)?,
    };
    resident(op, kv_head, kv.positions, kv.slots, slab_rows)
}

/// Two ascending position lists of one kv-head share no position.
fn disjoint(op: &'static str, kv_head: usize, a: &[u32], b: &[u32]) -> Result<()> {
    let (mut i, mut j) = (0, 0);
    while i < a.len() && j < b.len() {
        match a[i].cmp(&b[j]) {
            std::cmp::Ordering::Less => i += 1,
            std::cmp::Ordering::Greater => j += 1,
            std::cmp::Ordering::Equal => {
                return Err(Error::PositionsOverlap { op, kv_head, position: a[i] });
            }
        }
    }
    Ok(())
}

/// A gathered kv-head's coded part; returns its resident rows (may be 0). Layouts must
/// stand alone per row (keys any the in-place kernels read, values not sketched) and the
/// slabs must be whole rows of them.
fn gathered_coded_rows(
    op: &'static str,
    d: usize,
    kv_head: usize,
    kv: &crate::views::GatheredCodedKv<'_>,
) -> Result<usize> {
    use kv_sparse::decoded::RowCodes;
    head_dim(op, kv_head, d, kv.head_dim)?;
    if kv.positions.is_empty() {
        return Ok(0);
    }
    let mut slab_rows = [0; 2];
    for (n, (codes, values)) in slab_rows.iter_mut().zip([(&kv.keys, false), (&kv.values, true)]) {
        let bytes = match *codes {
            RowCodes::Codebook { bytes, .. } | RowCodes::ChannelGroups { bytes, .. } => Some(bytes),
            RowCodes::CodebookSketch { bytes, .. } if !values => Some(bytes),
            _ => None,
        };
        let (Some(bytes), Some(rb)) = (bytes, codes.row_bytes(d)) else {
            let (format, reason) = if values {
                ("gathered value rows", "codebook or channel-group rows".into())
            } else {
                ("gathered key rows", "codebook, sketched codebook or channel-group rows".into())
            };
            return Err(kv_sparse::Error::InvalidCodeLayout { op, format, reason }.into());
        };
        *n = bytes.len() / rb;
        codes.check(op, d, *n)?;
    }
    let rows = same_rows(op, kv_head, "gathered coded slab", slab_rows[0], slab_rows[1])?;
    resident(op, kv_head, kv.positions, kv.slots, rows)
}

/// Checks an optional weights output against the total resident rows.
pub(crate) fn weights(op: &'static str, weights: Option<&[f32]>, total_rows: usize) -> Result<()> {
    match weights {
        Some(w) if w.len() != total_rows => {
            Err(Error::LengthMismatch { op, what: "weights", expected: total_rows, got: w.len() })
        }
        _ => Ok(()),
    }
}

/// The second part of a gathered kv-head (SWAN sparse or coded rows), as validated.
pub(crate) trait GatheredPart {
    /// What a list of parts is called in errors.
    const LISTS: &'static str;

    /// Absolute positions of the part's resident rows.
    fn positions(&self) -> &[u32];

    /// Checks the part against head dimension `d`; returns its resident rows (may be 0).
    fn checked_rows(&self, op: &'static str, d: usize, kv_head: usize) -> Result<usize>;
}

impl GatheredPart for GatheredSparseKv<'_> {
    const LISTS: &'static str = "sparse kv-head lists";

    fn positions(&self) -> &[u32] {
        self.positions
    }

    fn checked_rows(&self, op: &'static str, d: usize, kv_head: usize) -> Result<usize> {
        gathered_sparse_rows(op, d, kv_head, self)
    }
}

impl GatheredPart for crate::views::GatheredCodedKv<'_> {
    const LISTS: &'static str = "coded kv-head lists";

    fn positions(&self) -> &[u32] {
        self.positions
    }

    fn checked_rows(&self, op: &'static str, d: usize, kv_head: usize) -> Result<usize> {
        gathered_coded_rows(op, d, kv_head, self)
    }
}

/// Everything [`crate::GatheredSparseAttention::gathered_sparse`] and
/// [`crate::GatheredCodedAttention::gathered_coded`] check except the weights: per kv-head,
/// the dense part, the second part and their disjoint positions; returns the resident rows
/// of all kv-heads.
pub(crate) fn gathered_parts_call<D: Value, P: GatheredPart>(
    op: &'static str,
    cfg: &AttnConfig,
    q: &[f32],
    out: &[f32],
    dense: &[GatheredKv<'_, D>],
    parts: &[P],
) -> Result<usize> {
    call(op, cfg, q, out, dense.len())?;
    if parts.len() != dense.len() {
        let (what, expected, got) = (P::LISTS, dense.len(), parts.len());
        return Err(Error::LengthMismatch { op, what, expected, got });
    }
    let d = cfg.head_dim();
    let mut total = 0;
    for (h, (dk, part)) in dense.iter().zip(parts).enumerate() {
        let rows = gathered_rows(op, d, h, dk)? + part.checked_rows(op, d, h)?;
        disjoint(op, h, dk.positions, part.positions())?;
        total += non_empty(op, h, rows)?;
    }
    Ok(total)
}
