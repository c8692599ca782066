//! KIVI's asymmetric 2- and 4-bit codes (Liu et al., arXiv 2402.02750, §3): **keys per
//! channel** over groups of `G` consecutive tokens, **values per token** over groups of `G`
//! channels, each group with an f16 scale and an f16 zero point (`x ≈ z + s·q`,
//! `q ∈ 0..2^bits`). Keys are grouped along tokens because their outliers sit in fixed
//! channels; values along channels because each token's output mixes them by its own weight.
//!
//! [`KiviRows`] is one side of such a history (the side is chosen when the store is made:
//! [`crate::hybrid::RowStore::empty_side`]), so the hybrid cache's one buffer logic gives
//! KIVI its full-precision residual: the `b` newest tokens stay in the dense buffer; an
//! evicted key waits, exact in f16, until `G` of them complete a group, which is then
//! quantized at once (§3.3: "tokens wait in the buffer until their key group is complete");
//! an evicted value is quantized right away. The group is the hybrid config's
//! `rows_per_block` (a block of `G` key rows is exactly one KIVI group).
//!
//! Bytes per token and head: keys `d·bits/8 + 4·d/G` (codes plus the group's per-channel
//! scale and zero amortized over its `G` tokens), values `d·bits/8 + 4·d/G` — `d·(bits+1)/8`
//! each at `G = 32` — plus at most `G − 1` waiting key rows in f16.
//!
//! Lossless setting: none (2 and 4 bits); a buffered cache whose buffer holds every token
//! never reaches these codes. Decoding is exact given the stored bytes.

use half::f16;

pub use crate::decoded::Side;

use crate::decoded::{DecodeRows, RowCodes, pack, packed_bytes};
use crate::memory::MemoryReport;
use crate::{Error, Result};

/// Largest magnitude a KIVI group encodes (its zero point and scale are f16).
pub const OVERFLOW_AT: f32 = 65504.0;

/// Bytes of the (scale, zero) pairs of `n` groups.
const fn param_bytes(n: usize) -> usize {
    4 * n
}

/// Checks a KIVI layout: `bits` ∈ {2, 4}, `group` ≥ 1 dividing `head_dim`, rows of whole
/// bytes.
///
/// # Errors
/// [`Error::InvalidCodeLayout`] naming the first violated rule.
pub fn check_layout(op: &'static str, bits: usize, head_dim: usize, group: usize) -> Result<()> {
    let reason = if bits != 2 && bits != 4 {
        Some(format!("bits = {bits}, expected 2 or 4"))
    } else if head_dim == 0 || head_dim > crate::MAX_HEAD_DIM {
        Some(format!("head_dim = {head_dim}, expected 1..={}", crate::MAX_HEAD_DIM))
    } else if group == 0 || !head_dim.is_multiple_of(group) {
        Some(format!("group = {group} does not divide head_dim = {head_dim}"))
    } else if !(head_dim * bits).is_multiple_of(8) {
        Some(format!("head_dim = {head_dim} at {bits} bits is not a whole number of bytes"))
    } else {
        None
    };
    match reason {
        Some(reason) => Err(Error::InvalidCodeLayout { op, format: "kivi", reason }),
        None => Ok(()),
    }
}

/// Asymmetric (scale, zero) of values in `lo..=hi` at `bits` bits, as stored (f16).
fn params(lo: f32, hi: f32, bits: usize) -> (f16, f16) {
    let levels = ((1u32 << bits) - 1) as f32;
    (f16::from_f32((hi - lo) / levels), f16::from_f32(lo))
}

/// The code of `x` under stored parameters (scale, zero).
#[inline]
fn code(x: f32, (s, z): (f32, f32), bits: usize) -> u8 {
    if s > 0.0 { ((x - z) / s).round().clamp(0.0, ((1u32 << bits) - 1) as f32) as u8 } else { 0 }
}

/// Codes one row per token over channel groups (KIVI's value code) into `out`: `d/group`
/// little-endian f16 (scale, zero) pairs, then the `d` codes packed LSB-first — one
/// [`RowCodes::ChannelGroups`] row, `4·d/group + ⌈d·bits/8⌉` bytes. `bits` may be 2, 4 or 8
/// here (8: a per-token int8 code of the same shape).
///
/// # Errors
/// [`Error::InvalidCodeLayout`] for `bits` outside {2, 4, 8} or a `group` that does not
/// divide `x.len()`; [`Error::LengthMismatch`] for an `out` that is not one row;
/// [`Error::NonFinite`] / [`Error::ScaleOverflow`] for values an f16 cannot hold.
pub fn encode_token_row(bits: usize, group: usize, x: &[f32], out: &mut [u8]) -> Result<()> {
    const OP: &str = "kivi::encode_token_row";
    let d = x.len();
    match bits {
        8 if (1..=crate::MAX_HEAD_DIM).contains(&d) && group > 0 && d.is_multiple_of(group) => {}
        8 => {
            let reason = format!("group = {group}, head_dim = {d}: expected a divisor of 1..=256");
            return Err(Error::InvalidCodeLayout { op: OP, format: "kivi", reason });
        }
        _ => check_layout(OP, bits, d, group)?,
    }
    let want = param_bytes(d / group) + packed_bytes(d, bits);
    if out.len() != want {
        return Err(Error::LengthMismatch { op: OP, what: "out", expected: want, got: out.len() });
    }
    crate::value::check_rows(OP, d, x, (OVERFLOW_AT, || format!("kivi{bits}")))?;
    crate::decoded::with_scratch(d, |codes: &mut [u8]| code_token_row(bits, group, x, codes, out));
    Ok(())
}

/// Fills `out`'s parameters and packed codes for `x` (sizes checked by the caller); `codes`
/// is `x.len()` bytes of scratch.
fn code_token_row(bits: usize, group: usize, x: &[f32], codes: &mut [u8], out: &mut [u8]) {
    let (head, packed) = out.split_at_mut(param_bytes(x.len() / group));
    for (i, chunk) in x.chunks_exact(group).enumerate() {
        let (lo, hi) = chunk
            .iter()
            .fold((f32::INFINITY, f32::NEG_INFINITY), |(a, b), &v| (a.min(v), b.max(v)));
        let (s, z) = params(lo, hi, bits);
        head[4 * i..4 * i + 2].copy_from_slice(&s.to_le_bytes());
        head[4 * i + 2..4 * i + 4].copy_from_slice(&z.to_le_bytes());
        for (c, &v) in codes[i * group..].iter_mut().zip(chunk) {
            *c = code(v, (s.to_f32(), z.to_f32()), bits);
        }
    }
    pack(codes, bits, packed);
}

/// One side of a KIVI history at `BITS` bits (2 or 4). See the module docs.
#[derive(Clone, Debug)]
pub struct KiviRows<const BITS: usize> {
    side: Side,
    head_dim: usize,
    group: usize,
    /// Keys: complete groups, each `[d × (scale, zero)]` then `G` rows of codes. Values: rows,
    /// each `[d/G × (scale, zero)]` then its codes. Parameters are little-endian f16.
    bytes: Vec<u8>,
    /// Rows in `bytes`.
    coded: usize,
    /// Keys of the incomplete group, exact in f16, row-major.
    pending: Vec<f16>,
    /// The rows of the most recently completed key group (so a rollback past it is exact).
    last_group: Vec<f16>,
    /// Scratch: codes of one row or group column.
    codes: Vec<u8>,
}

impl<const BITS: usize> KiviRows<BITS> {
    /// An empty side of a history of rows of `head_dim`, grouped by `group`.
    ///
    /// # Errors
    /// As [`check_layout`].
    ///
    /// # Examples
    /// ```
    /// use kv_sparse::kivi::{KiviRows, Side};
    /// use kv_sparse::decoded::DecodeRows;
    /// let mut keys = KiviRows::<2>::new(Side::Keys, 32, 4)?;
    /// for t in 0..6 {
    ///     keys.push(&[t as f32; 32])?;
    /// }
    /// assert_eq!((keys.len(), keys.waiting()), (6, 2)); // one group of 4 coded, 2 waiting
    /// let mut row = [0.0; 32];
    /// keys.view().decode_row(5, &mut row);
    /// assert_eq!(row, [5.0; 32]); // a waiting key is exact
    /// keys.view().decode_row(3, &mut row);
    /// assert_eq!(row, [3.0; 32]); // 0..=3 at 2 bits: scale 1, zero 0
    /// assert!(KiviRows::<2>::new(Side::Keys, 32, 5).is_err()); // 5 does not divide 32
    /// # Ok::<(), kv_sparse::Error>(())
    /// ```
    pub fn new(side: Side, head_dim: usize, group: usize) -> Result<Self> {
        check_layout("KiviRows::new", BITS, head_dim, group)?;
        Ok(Self {
            side,
            head_dim,
            group,
            bytes: Vec::new(),
            coded: 0,
            pending: Vec::new(),
            last_group: Vec::new(),
            codes: vec![0; head_dim.max(group)],
        })
    }

    /// Bytes of one row's codes.
    fn code_bytes(&self) -> usize {
        packed_bytes(self.head_dim, BITS)
    }

    /// Bytes of one coded unit: a key group or a value row.
    fn unit_bytes(&self) -> usize {
        Self::unit(self.side, self.head_dim, self.group).0
    }

    /// Bytes of one coded unit of `side` (a key group of `group` rows, or one value row)
    /// and the rows it holds.
    pub fn unit(side: Side, head_dim: usize, group: usize) -> (usize, usize) {
        let codes = packed_bytes(head_dim, BITS);
        match side {
            Side::Keys => (param_bytes(head_dim) + group * codes, group),
            Side::Values => (param_bytes(head_dim / group.max(1)) + codes, 1),
        }
    }

    /// Which side this store holds.
    pub fn side(&self) -> Side {
        self.side
    }

    /// Tokens per key group, channels per value group.
    pub fn group(&self) -> usize {
        self.group
    }

    /// Rows held (coded and waiting).
    pub fn len(&self) -> usize {
        self.coded + self.waiting()
    }

    /// True when no row is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Key rows waiting in f16 for their group to complete (0 for values).
    pub fn waiting(&self) -> usize {
        self.pending.len() / self.head_dim
    }

    /// Elements per row.
    pub fn head_dim(&self) -> usize {
        self.head_dim
    }

    /// Checks rows (flattened) without storing them.
    ///
    /// # Errors
    /// [`Error::LengthMismatch`], [`Error::NonFinite`], [`Error::ScaleOverflow`].
    pub fn check(&self, op: &'static str, rows: &[f32]) -> Result<()> {
        let limit = (OVERFLOW_AT, || format!("kivi{BITS}"));
        crate::value::check_rows(op, self.head_dim, rows, limit)
    }

    /// Appends whole rows. All-or-nothing.
    ///
    /// # Errors
    /// As [`KiviRows::check`].
    pub fn push(&mut self, rows: &[f32]) -> Result<()> {
        self.check("KiviRows::push", rows)?;
        for row in rows.chunks_exact(self.head_dim) {
            match self.side {
                Side::Keys => self.push_key(row),
                Side::Values => self.push_value(row),
            }
        }
        Ok(())
    }

    fn push_key(&mut self, row: &[f32]) {
        self.pending.extend(row.iter().map(|&x| f16::from_f32(x)));
        if self.waiting() == self.group {
            self.seal_group();
        }
    }

    /// Quantizes the waiting keys (a full group) channel by channel.
    fn seal_group(&mut self) {
        let (d, g, cb) = (self.head_dim, self.group, self.code_bytes());
        let start = self.bytes.len();
        self.bytes.resize(start + self.unit_bytes(), 0);
        let (head, codes) = self.bytes[start..].split_at_mut(param_bytes(d));
        let mut grid = vec![0u8; g * d];
        for c in 0..d {
            let column = (0..g).map(|t| self.pending[t * d + c].to_f32());
            let (lo, hi) = column
                .clone()
                .fold((f32::INFINITY, f32::NEG_INFINITY), |(a, b), x| (a.min(x), b.max(x)));
            let (s, z) = params(lo, hi, BITS);
            head[4 * c..4 * c + 2].copy_from_slice(&s.to_le_bytes());
            head[4 * c + 2..4 * c + 4].copy_from_slice(&z.to_le_bytes());
            for (t, x) in column.enumerate() {
                grid[t * d + c] = code(x, (s.to_f32(), z.to_f32()), BITS);
            }
        }
        for (t, out) in codes.chunks_exact_mut(cb).enumerate() {
            pack(&grid[t * d..(t + 1) * d], BITS, out);
        }
        self.last_group.clear();
        self.last_group.append(&mut self.pending);
        self.coded += g;
    }

    fn push_value(&mut self, row: &[f32]) {
        let start = self.bytes.len();
        self.bytes.resize(start + self.unit_bytes(), 0);
        let d = self.head_dim;
        code_token_row(BITS, self.group, row, &mut self.codes[..d], &mut self.bytes[start..]);
        self.coded += 1;
    }

    /// Keeps the first `rows` rows. A rollback into the most recently completed key group
    /// restores its rows exactly; further back, the dropped group's kept rows are decoded
    /// back into waiting rows (re-quantized when the group completes again).
    pub fn truncate(&mut self, rows: usize) {
        if rows >= self.len() {
            return;
        }
        let d = self.head_dim;
        if rows >= self.coded {
            self.pending.truncate((rows - self.coded) * d);
            return;
        }
        match self.side {
            Side::Values => {
                self.bytes.truncate(rows * self.unit_bytes());
                self.coded = rows;
            }
            Side::Keys => {
                let g = self.group;
                let keep_groups = rows / g;
                let restored: Vec<f16> = if rows >= self.coded - g && !self.last_group.is_empty() {
                    self.last_group[..(rows - (self.coded - g)) * d].to_vec()
                } else {
                    let mut row = vec![0.0f32; d];
                    let view = self.view();
                    let mut out = Vec::with_capacity((rows % g) * d);
                    for j in keep_groups * g..rows {
                        view.decode_row(j, &mut row);
                        out.extend(row.iter().map(|&x| f16::from_f32(x)));
                    }
                    out
                };
                self.bytes.truncate(keep_groups * self.unit_bytes());
                self.coded = keep_groups * g;
                self.pending = restored;
                self.last_group.clear();
            }
        }
    }

    /// Reserves room for `rows` more rows.
    pub fn reserve(&mut self, rows: usize) {
        let units = match self.side {
            Side::Keys => rows.div_ceil(self.group),
            Side::Values => rows,
        };
        self.bytes.reserve(units * self.unit_bytes());
        if self.side == Side::Keys {
            self.pending.reserve(self.group * self.head_dim);
            self.last_group.reserve(self.group * self.head_dim);
        }
    }

    /// Bytes held: codes and waiting rows as `dense_bytes`, scales and zero points as
    /// `scale_bytes`.
    pub fn memory(&self) -> MemoryReport {
        let units = match self.side {
            Side::Keys => self.coded / self.group,
            Side::Values => self.coded,
        };
        let per_unit = match self.side {
            Side::Keys => param_bytes(self.head_dim),
            Side::Values => param_bytes(self.head_dim / self.group),
        };
        let scales = units * per_unit;
        let slack = self.bytes.capacity() - self.bytes.len()
            + 2 * (self.pending.capacity() - self.pending.len() + self.last_group.capacity())
            + self.codes.capacity();
        MemoryReport {
            dense_bytes: self.bytes.len() - scales + 2 * self.pending.len(),
            scale_bytes: scales,
            capacity_slack_bytes: slack,
            ..MemoryReport::default()
        }
    }

    /// Exact bytes per row once amortized: codes plus the group's parameters (a waiting key
    /// row costs `2·head_dim` until its group completes).
    pub fn row_bytes(head_dim: usize, group: usize) -> f64 {
        packed_bytes(head_dim, BITS) as f64 + param_bytes(head_dim) as f64 / group as f64
    }

    /// The coded groups (keys) or rows (values), as held.
    pub fn coded_bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// The key rows waiting for their group, exact in f16, row-major (empty for values).
    pub fn waiting_rows(&self) -> &[f16] {
        &self.pending
    }

    /// A side rebuilt from its coded bytes and waiting rows (as [`KiviRows::coded_bytes`]
    /// and [`KiviRows::waiting_rows`] give them), checked as untrusted input: whole units,
    /// fewer than `group` waiting keys (none for values), every parameter and waiting
    /// element a finite f16 below [`OVERFLOW_AT`]. A rollback into the last coded group
    /// then restores its rows from their codes (the exact rows are not persisted).
    ///
    /// # Errors
    /// As [`check_layout`]; [`Error::Corrupt`] for input that breaks a rule above.
    pub fn from_parts(
        side: Side,
        head_dim: usize,
        group: usize,
        bytes: &[u8],
        waiting: &[f16],
    ) -> Result<Self> {
        let mut rows = Self::new(side, head_dim, group)?;
        let unit = rows.unit_bytes();
        let corrupt = |reason: String| Err(Error::Corrupt { reason });
        if !bytes.len().is_multiple_of(unit) {
            return corrupt(format!(
                "{} bytes are not whole kivi{BITS} units of {unit}",
                bytes.len()
            ));
        }
        let max_waiting = if side == Side::Keys { group - 1 } else { 0 };
        if !waiting.len().is_multiple_of(head_dim) || waiting.len() / head_dim > max_waiting {
            let n = waiting.len();
            return corrupt(format!(
                "{n} waiting elements, expected whole rows, at most {max_waiting}"
            ));
        }
        let params = match side {
            Side::Keys => param_bytes(head_dim),
            Side::Values => param_bytes(head_dim / group),
        };
        let ok = |x: f16| x.is_finite() && x.to_f32().abs() < OVERFLOW_AT;
        for (u, chunk) in bytes.chunks_exact(unit).enumerate() {
            let bad =
                chunk[..params].chunks_exact(2).position(|b| !ok(f16::from_le_bytes([b[0], b[1]])));
            if let Some(i) = bad {
                return corrupt(format!("unit {u}: parameter {i} is not a finite f16"));
            }
        }
        if let Some(i) = waiting.iter().position(|&x| !ok(x)) {
            return corrupt(format!("waiting element {i} is not a finite f16"));
        }
        rows.coded = match side {
            Side::Keys => bytes.len() / unit * group,
            Side::Values => bytes.len() / unit,
        };
        rows.bytes = bytes.to_vec();
        rows.pending = waiting.to_vec();
        Ok(rows)
    }

    /// Borrowed view of every row (what kernels read).
    pub fn view(&self) -> KiviView<'_> {
        KiviView {
            side: self.side,
            bits: BITS,
            head_dim: self.head_dim,
            group: self.group,
            bytes: &self.bytes,
            coded: self.coded,
            pending: &self.pending,
        }
    }
}

/// Borrowed KIVI rows of one side: coded groups or rows, then (keys) the waiting rows.
#[derive(Clone, Copy, Debug)]
pub struct KiviView<'a> {
    side: Side,
    bits: usize,
    head_dim: usize,
    group: usize,
    bytes: &'a [u8],
    coded: usize,
    pending: &'a [f16],
}

impl KiviView<'_> {
    /// Rows held as codes (the rest wait in f16).
    pub fn coded_rows(&self) -> usize {
        self.coded
    }

    /// Which side the rows are.
    pub fn side(&self) -> Side {
        self.side
    }
}

impl DecodeRows for KiviView<'_> {
    fn head_dim(&self) -> usize {
        self.head_dim
    }

    fn num_rows(&self) -> usize {
        self.coded + self.pending.len() / self.head_dim
    }

    fn decode_row(&self, j: usize, out: &mut [f32]) {
        if let Some(codes) = self.codes() {
            codes.decode_row(j, &mut out[..self.head_dim]);
        }
    }
    fn codes(&self) -> Option<RowCodes<'_>> {
        let (bits, group, bytes) = (self.bits, self.group, self.bytes);
        Some(match self.side {
            Side::Keys => RowCodes::TokenGroups {
                bits,
                group,
                bytes,
                coded: self.coded,
                waiting: self.pending,
            },
            Side::Values => RowCodes::ChannelGroups { bits, group, bytes },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows(n: usize, d: usize, seed: u32) -> Vec<f32> {
        (0..n * d)
            .map(|i| {
                let x = (i as u32).wrapping_mul(2654435761).wrapping_add(seed) >> 8;
                (x % 2001) as f32 / 1000.0 - 1.0 + if i % d == 3 { 8.0 } else { 0.0 }
            })
            .collect()
    }

    /// Every decoded element lies within half a step of its group's scale (plus the f16
    /// rounding of the zero point and scale), keys and values, 2 and 4 bits.
    fn error_bound<const B: usize>() {
        let (d, g, n) = (64, 32, 100);
        let x = rows(n, d, 7);
        for side in [Side::Keys, Side::Values] {
            let mut s = KiviRows::<B>::new(side, d, g).unwrap();
            s.push(&x).unwrap();
            let v = s.view();
            assert_eq!(v.num_rows(), n);
            let mut out = vec![0.0; d];
            for j in 0..n {
                v.decode_row(j, &mut out);
                for c in 0..d {
                    let (t0, c0, tn, cn) = match side {
                        Side::Keys => (j / g * g, c, g, 1),
                        Side::Values => (j, c / g * g, 1, g),
                    };
                    let group: Vec<f32> = (t0..(t0 + tn).min(n))
                        .flat_map(|t| (c0..c0 + cn).map(move |cc| (t, cc)))
                        .map(|(t, cc)| x[t * d + cc])
                        .collect();
                    let (lo, hi) =
                        group.iter().fold((f32::MAX, f32::MIN), |(a, b), &y| (a.min(y), b.max(y)));
                    let step = (hi - lo) / ((1 << B) - 1) as f32;
                    let tol = step / 2.0 + (hi.abs() + lo.abs()) * 2e-3 + 1e-6;
                    let err = (out[c] - x[j * d + c]).abs();
                    assert!(err <= tol, "{side:?} {B} bits row {j} ch {c}: {err} > {tol}");
                }
            }
        }
    }

    #[test]
    fn decoded_rows_are_within_half_a_step() {
        error_bound::<2>();
        error_bound::<4>();
    }

    /// Bytes: `d·bits/8 + 4·d/G` per row once a key group is sealed, f16 while waiting.
    #[test]
    fn bytes_follow_the_formula() {
        let (d, g) = (64, 32);
        let mut k = KiviRows::<2>::new(Side::Keys, d, g).unwrap();
        let mut v = KiviRows::<2>::new(Side::Values, d, g).unwrap();
        let x = rows(40, d, 1);
        k.push(&x).unwrap();
        v.push(&x).unwrap();
        assert_eq!(k.memory().held_bytes(), 32 * 16 + 4 * 64 + 8 * 2 * 64);
        assert_eq!(v.memory().held_bytes(), 40 * (16 + 4 * 2));
        assert_eq!(KiviRows::<2>::row_bytes(d, g), 16.0 + 8.0);
    }

    /// Rolling back into the last sealed group restores its keys exactly; further back the
    /// rows kept are the decoded ones; values drop whole rows.
    #[test]
    fn truncation_restores_waiting_rows() {
        let (d, g) = (32, 4);
        let x = rows(9, d, 3);
        let mut k = KiviRows::<4>::new(Side::Keys, d, g).unwrap();
        k.push(&x[..8 * d]).unwrap();
        assert_eq!((k.len(), k.waiting()), (8, 0));
        k.truncate(7);
        assert_eq!((k.len(), k.waiting()), (7, 3));
        let mut row = vec![0.0; d];
        k.view().decode_row(6, &mut row);
        let exact: Vec<f32> = x[6 * d..7 * d].iter().map(|&y| f16::from_f32(y).to_f32()).collect();
        assert_eq!(row, exact);
        k.push(&x[7 * d..9 * d]).unwrap();
        assert_eq!((k.len(), k.waiting()), (9, 1));
        k.truncate(2);
        assert_eq!((k.len(), k.waiting()), (2, 2));
        k.truncate(0);
        assert!(k.is_empty());
        let mut v = KiviRows::<4>::new(Side::Values, d, g).unwrap();
        v.push(&x).unwrap();
        v.truncate(5);
        assert_eq!(v.len(), 5);
    }

    #[test]
    fn bad_layouts_and_rows_are_typed_errors() {
        assert!(matches!(
            KiviRows::<3>::new(Side::Keys, 32, 32),
            Err(Error::InvalidCodeLayout { .. })
        ));
        assert!(KiviRows::<2>::new(Side::Keys, 32, 0).is_err());
        assert!(KiviRows::<2>::new(Side::Values, 48, 32).is_err());
        assert!(KiviRows::<2>::new(Side::Values, 6, 2).is_err()); // 12 bits a row
        let mut k = KiviRows::<2>::new(Side::Keys, 32, 32).unwrap();
        assert!(matches!(k.push(&[f32::NAN; 32]), Err(Error::NonFinite { .. })));
        assert!(matches!(k.push(&[1e5; 32]), Err(Error::ScaleOverflow { .. })));
        assert!(matches!(k.push(&[0.0; 31]), Err(Error::LengthMismatch { .. })));
        assert!(k.is_empty());
    }
}
