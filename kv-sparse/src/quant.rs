//! Dense quantized K/V rows — the baselines a runtime already has — and the integer codes
//! SWAN rows reuse for their kept values.
//!
//! Three dense row codecs ([`DenseCodec`]), each a type so hot loops never branch on it:
//! * [`Int8Blocks`] — blocks of 32 elements, an f16 scale `d` and 32 `i8` codes
//!   (`x ≈ d·q`): llama.cpp's `q8_0` layout, 34 bytes per 32 elements;
//! * [`Int4Blocks`] — blocks of 32 elements, an f16 scale `d` and 16 bytes of nibbles
//!   (`x ≈ d·(q − 8)`, element `j` in the low nibble of byte `j`, element `j + 16` in its
//!   high nibble): llama.cpp's `q4_0` layout, 18 bytes per 32 elements;
//!
//!   both encode as ggml's reference quantizers do, byte for byte (codes from the unrounded
//!   f32 scale; tested against PyPI `gguf`'s bit-exact quantizer in `tests/ggml_blocks.rs`),
//!   so a row holds what llama.cpp's `-ctk/-ctv q8_0|q4_0` cache would hold for it;
//! * [`Fp8Rows`] — one f16 scale per row (per token) then `d_h` OCP E4M3FN codes
//!   (`x ≈ s·e4m3`), as vLLM's fp8 KV cache scales it.
//!
//! SWAN (method section, "8-bit values") stores kept components as 8-bit floats; the
//! integer alternatives here ([`encode_int8`], [`encode_int4`]: one f16 scale for a row's
//! kept values, symmetric, from their largest magnitude) are what `crate::coded` stores
//! when a row's values are `int8` or `int4`. Which code wins at a byte budget is a
//! measurement (the frontier study), not a given.
//!
//! Every scale is finite and non-zero: an all-zero block or row is stored with scale 1,
//! and a scale that would round to zero is stored as the smallest positive f16. Decoding
//! a row is exact given its bytes (`f32(d)·q`), so kernels and references agree.
//!
//! Lossless setting: none of these codecs is lossless; their error bound is tested
//! (`|x − x̂| ≤ d/2` per block for int8 and `≤ |d|/2` inside the representable range for
//! int4, each plus the stored f16 scale's rounding carried by the largest code).

use half::f16;

use crate::fp8::Fp8E4M3;
use crate::memory::MemoryReport;
use crate::{Error, Result};

mod private {
    /// Seals [`super::DenseCodec`]: only this crate's codecs implement it.
    pub trait Sealed {}
    impl Sealed for super::Int8Blocks {}
    impl Sealed for super::Int4Blocks {}
    impl Sealed for super::Fp8Rows {}
}

/// Elements per scale block of [`Int8Blocks`] and [`Int4Blocks`].
pub const BLOCK: usize = 32;
/// Bytes of one [`Int8Blocks`] block: f16 scale + 32 `i8`.
pub const INT8_BLOCK_BYTES: usize = 2 + BLOCK;
/// Bytes of one [`Int4Blocks`] block: f16 scale + 16 bytes of nibbles.
pub const INT4_BLOCK_BYTES: usize = 2 + BLOCK / 2;

const _: () = assert!(INT8_BLOCK_BYTES == 34, "q8_0 block layout");
const _: () = assert!(INT4_BLOCK_BYTES == 18, "q4_0 block layout");

/// Runtime tag of a dense quantized format (reports, specs, errors).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DenseFormat {
    /// [`Int8Blocks`].
    Int8,
    /// [`Int4Blocks`].
    Int4,
    /// [`Fp8Rows`].
    Fp8,
}

impl std::fmt::Display for DenseFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            DenseFormat::Int8 => "int8",
            DenseFormat::Int4 => "int4",
            DenseFormat::Fp8 => "fp8",
        })
    }
}

impl DenseFormat {
    /// Bytes of one encoded row of `head_dim` elements ([`DenseCodec::row_bytes`] of the
    /// format's codec).
    pub fn row_bytes(self, head_dim: usize) -> usize {
        match self {
            DenseFormat::Int8 => Int8Blocks::row_bytes(head_dim),
            DenseFormat::Int4 => Int4Blocks::row_bytes(head_dim),
            DenseFormat::Fp8 => Fp8Rows::row_bytes(head_dim),
        }
    }

    /// [`DenseCodec::check_head_dim`] of the format's codec.
    ///
    /// # Errors
    /// As [`DenseCodec::check_head_dim`].
    pub fn check_head_dim(self, op: &'static str, head_dim: usize) -> Result<()> {
        match self {
            DenseFormat::Int8 => Int8Blocks::check_head_dim(op, head_dim),
            DenseFormat::Int4 => Int4Blocks::check_head_dim(op, head_dim),
            DenseFormat::Fp8 => Fp8Rows::check_head_dim(op, head_dim),
        }
    }
}

/// A dense row codec: a row of `head_dim` finite `f32` ↔ [`DenseCodec::row_bytes`] bytes.
///
/// Sealed: implemented by [`Int8Blocks`], [`Int4Blocks`] and [`Fp8Rows`].
pub trait DenseCodec:
    private::Sealed + Copy + Default + Send + Sync + std::fmt::Debug + 'static
{
    /// Runtime tag.
    const FORMAT: DenseFormat;
    /// Smallest magnitude whose scale would not be a finite f16.
    const OVERFLOW_AT: f32;

    /// Bytes of one encoded row of `head_dim` elements.
    fn row_bytes(head_dim: usize) -> usize;

    /// Bytes of the scales inside one row (the rest are codes).
    fn scale_bytes(head_dim: usize) -> usize;

    /// Checks that the codec can encode rows of `head_dim` elements.
    ///
    /// # Errors
    /// [`Error::HeadDimOutOfRange`] for 0, or [`Error::ShapeMismatch`] when blocked codecs
    /// get a `head_dim` that is not a multiple of [`BLOCK`].
    fn check_head_dim(op: &'static str, head_dim: usize) -> Result<()>;

    /// Encodes `x` (finite, below [`DenseCodec::OVERFLOW_AT`]; `x.len()` is the head size)
    /// into `out` (`row_bytes(x.len())` bytes).
    fn encode(x: &[f32], out: &mut [u8]);

    /// Decodes one row's bytes into `out` (`head_dim` elements).
    fn decode(row: &[u8], out: &mut [f32]);

    /// Checks one encoded row from an untrusted source: every scale finite and non-zero.
    ///
    /// # Errors
    /// [`Error::InvalidRowScale`] naming the first bad scale.
    fn check_row(op: &'static str, row: usize, bytes: &[u8]) -> Result<()>;
}

/// llama.cpp `q8_0`: blocks of 32 `i8` with an f16 scale (see the [module docs](self)).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Int8Blocks;
/// llama.cpp `q4_0`: blocks of 32 nibbles with an f16 scale (see the [module docs](self)).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Int4Blocks;
/// fp8 E4M3FN with one f16 scale per row (see the [module docs](self)).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Fp8Rows;

/// Largest finite f16.
const F16_MAX: f32 = 65504.0;

/// The f16 scale `≥ amax / levels` (rounded up, so `|x| / s ≤ levels`), never zero, 1 for
/// an all-zero input.
pub(crate) fn scale_up(amax: f32, levels: f32) -> f16 {
    if amax == 0.0 {
        return f16::ONE;
    }
    let s = amax / levels;
    let mut h = f16::from_f32(s);
    if h.to_f32() < s {
        h = f16::from_bits(h.to_bits() + 1);
    }
    if h.to_bits() == 0 {
        h = f16::from_bits(1);
    }
    h
}

/// A ggml block's scale `d` (f32, as computed) → the f16 it stores and the reciprocal its
/// codes are computed with: ggml's `1/d` of the unrounded `d`, so the codes match its
/// reference quantizer's. Where the f16 would be zero — an all-zero block (`d = 0`: scale 1,
/// codes of zero either way) or `|d|` below f16's smallest subnormal — the smallest nonzero
/// scale is stored instead and the codes follow it, so every stored scale passes the
/// zero-scale check.
fn ggml_scale(d: f32) -> (f16, f32) {
    if d == 0.0 {
        return (f16::ONE, 1.0);
    }
    let h = f16::from_f32(d);
    if h.to_f32() == 0.0 {
        let h = f16::from_bits(if d < 0.0 { 0x8001 } else { 0x0001 });
        return (h, 1.0 / h.to_f32());
    }
    (h, 1.0 / d)
}

fn read_scale(bytes: &[u8]) -> f32 {
    f16::from_le_bytes([bytes[0], bytes[1]]).to_f32()
}

fn check_scale(op: &'static str, row: usize, scale: f32) -> Result<()> {
    if scale == 0.0 || !scale.is_finite() {
        return Err(Error::InvalidRowScale { op, row, scale });
    }
    Ok(())
}

fn amax(x: &[f32]) -> f32 {
    x.iter().fold(0.0f32, |m, v| m.max(v.abs()))
}

/// Encodes `x` as symmetric `i8` codes with one f16 scale `s = amax/127` (rounded up):
/// writes the scale's two bytes then `x.len()` codes into `out`. Nothing for an empty `x`.
pub fn encode_int8(x: &[f32], out: &mut [u8]) {
    if x.is_empty() {
        return;
    }
    let s = scale_up(amax(x), 127.0);
    write_int8(x, s, 1.0 / s.to_f32(), out);
}

/// Writes `scale`'s two bytes then `x.len()` symmetric `i8` codes `round(x · inv)` (halves
/// away from zero, clamped to ±127) into `out`: the layout of [`encode_int8`]'s rows and of
/// a `q8_0` block, whichever rule chose the scale and the reciprocal.
fn write_int8(x: &[f32], scale: f16, inv: f32, out: &mut [u8]) {
    out[..2].copy_from_slice(&scale.to_le_bytes());
    for (o, &v) in out[2..2 + x.len()].iter_mut().zip(x) {
        *o = ((v * inv).round().clamp(-127.0, 127.0) as i8) as u8;
    }
}

/// Decodes [`encode_int8`]'s bytes into `out` (`out.len()` codes follow the scale).
pub fn decode_int8(bytes: &[u8], out: &mut [f32]) {
    if out.is_empty() {
        return;
    }
    let s = read_scale(bytes);
    for (o, &c) in out.iter_mut().zip(&bytes[2..]) {
        *o = f32::from(c as i8) * s;
    }
}

/// Encodes `x` (even length) as symmetric 4-bit codes `q ∈ [−7, 7]` stored as `q + 8`,
/// two per byte (element `2j` in the low nibble of byte `j`), after one f16 scale
/// `s = amax/7` (rounded up). Nothing for an empty `x`.
pub fn encode_int4(x: &[f32], out: &mut [u8]) {
    if x.is_empty() {
        return;
    }
    let s = scale_up(amax(x), 7.0);
    out[..2].copy_from_slice(&s.to_le_bytes());
    let inv = 1.0 / s.to_f32();
    let code = |v: f32| ((v * inv).round().clamp(-7.0, 7.0) as i8 + 8) as u8;
    for (o, pair) in out[2..].iter_mut().zip(x.chunks(2)) {
        let hi = pair.get(1).map_or(8, |&v| code(v));
        *o = code(pair[0]) | (hi << 4);
    }
}

/// Decodes [`encode_int4`]'s bytes into `out` (`out.len()` elements).
pub fn decode_int4(bytes: &[u8], out: &mut [f32]) {
    if out.is_empty() {
        return;
    }
    let s = read_scale(bytes);
    let codes = &bytes[2..2 + out.len().div_ceil(2)];
    for (pair, &b) in out.chunks_mut(2).zip(codes) {
        pair[0] = f32::from((b & 0x0f) as i8 - 8) * s;
        if let Some(high) = pair.get_mut(1) {
            *high = f32::from((b >> 4) as i8 - 8) * s;
        }
    }
}

fn check_blocked(op: &'static str, head_dim: usize) -> Result<()> {
    if head_dim == 0 {
        return Err(Error::HeadDimOutOfRange { op, head_dim, max: crate::MAX_HEAD_DIM });
    }
    if !head_dim.is_multiple_of(BLOCK) {
        let expected = head_dim.div_ceil(BLOCK) * BLOCK;
        return Err(Error::ShapeMismatch {
            op,
            what: "head_dim (a multiple of the 32-element block)",
            expected,
            got: head_dim,
        });
    }
    Ok(())
}

impl DenseCodec for Int8Blocks {
    const FORMAT: DenseFormat = DenseFormat::Int8;
    const OVERFLOW_AT: f32 = F16_MAX * 127.0;

    fn row_bytes(head_dim: usize) -> usize {
        head_dim / BLOCK * INT8_BLOCK_BYTES
    }

    fn scale_bytes(head_dim: usize) -> usize {
        head_dim / BLOCK * 2
    }

    fn check_head_dim(op: &'static str, head_dim: usize) -> Result<()> {
        check_blocked(op, head_dim)
    }

    /// `q8_0`, byte for byte as ggml's reference quantizer writes it: `d = amax / 127`,
    /// `q = round(x/d)` (halves away from zero) with the f32 `d`, and `d` stored as f16 (a
    /// block whose f16 scale would be zero stores a nonzero one instead, as the module notes say).
    fn encode(x: &[f32], out: &mut [u8]) {
        for (b, o) in x.chunks_exact(BLOCK).zip(out.chunks_exact_mut(INT8_BLOCK_BYTES)) {
            let (d, inv) = ggml_scale(amax(b) / 127.0);
            write_int8(b, d, inv, o);
        }
    }

    fn decode(row: &[u8], out: &mut [f32]) {
        for (b, o) in row.chunks_exact(INT8_BLOCK_BYTES).zip(out.chunks_exact_mut(BLOCK)) {
            decode_int8(b, o);
        }
    }

    fn check_row(op: &'static str, row: usize, bytes: &[u8]) -> Result<()> {
        bytes.chunks_exact(INT8_BLOCK_BYTES).try_for_each(|b| check_scale(op, row, read_scale(b)))
    }
}

impl DenseCodec for Int4Blocks {
    const FORMAT: DenseFormat = DenseFormat::Int4;
    const OVERFLOW_AT: f32 = F16_MAX * 8.0;

    fn row_bytes(head_dim: usize) -> usize {
        head_dim / BLOCK * INT4_BLOCK_BYTES
    }

    fn scale_bytes(head_dim: usize) -> usize {
        head_dim / BLOCK * 2
    }

    fn check_head_dim(op: &'static str, head_dim: usize) -> Result<()> {
        check_blocked(op, head_dim)
    }

    /// `q4_0`, byte for byte as ggml's reference quantizer writes it: `d = m / −8` where `m`
    /// is the block's element of largest magnitude (with its sign, the first of equal
    /// magnitudes), `q = min(15, ⌊x/d + 8.5⌋)` with the f32 `d`, and `d` stored as f16 (a
    /// block whose f16 scale would be zero stores a nonzero one instead, as the module notes say).
    fn encode(x: &[f32], out: &mut [u8]) {
        for (b, o) in x.chunks_exact(BLOCK).zip(out.chunks_exact_mut(INT4_BLOCK_BYTES)) {
            let m = b.iter().fold(0.0f32, |m, &v| if v.abs() > m.abs() { v } else { m });
            let (d, inv) = ggml_scale(m / -8.0);
            o[..2].copy_from_slice(&d.to_le_bytes());
            let code = |v: f32| ((v * inv + 8.5).clamp(0.0, 15.0)) as u8;
            for j in 0..BLOCK / 2 {
                o[2 + j] = code(b[j]) | (code(b[j + BLOCK / 2]) << 4);
            }
        }
    }

    fn decode(row: &[u8], out: &mut [f32]) {
        for (b, o) in row.chunks_exact(INT4_BLOCK_BYTES).zip(out.chunks_exact_mut(BLOCK)) {
            let d = read_scale(b);
            for j in 0..BLOCK / 2 {
                let q = b[2 + j];
                o[j] = f32::from((q & 0x0f) as i8 - 8) * d;
                o[j + BLOCK / 2] = f32::from((q >> 4) as i8 - 8) * d;
            }
        }
    }

    fn check_row(op: &'static str, row: usize, bytes: &[u8]) -> Result<()> {
        bytes.chunks_exact(INT4_BLOCK_BYTES).try_for_each(|b| check_scale(op, row, read_scale(b)))
    }
}

impl DenseCodec for Fp8Rows {
    const FORMAT: DenseFormat = DenseFormat::Fp8;
    const OVERFLOW_AT: f32 = F16_MAX * 448.0;

    fn row_bytes(head_dim: usize) -> usize {
        2 + head_dim
    }

    fn scale_bytes(_: usize) -> usize {
        2
    }

    fn check_head_dim(op: &'static str, head_dim: usize) -> Result<()> {
        if head_dim == 0 || head_dim > crate::MAX_HEAD_DIM {
            return Err(Error::HeadDimOutOfRange { op, head_dim, max: crate::MAX_HEAD_DIM });
        }
        Ok(())
    }

    fn encode(x: &[f32], out: &mut [u8]) {
        let s = scale_up(amax(x), 448.0);
        out[..2].copy_from_slice(&s.to_le_bytes());
        let inv = 1.0 / s.to_f32();
        for (o, &v) in out[2..].iter_mut().zip(x) {
            *o = Fp8E4M3::from_f32(v * inv).to_bits();
        }
    }

    fn decode(row: &[u8], out: &mut [f32]) {
        let s = read_scale(row);
        for (o, &c) in out.iter_mut().zip(&row[2..]) {
            *o = crate::fp8::DECODE_TABLE[usize::from(c)] * s;
        }
    }

    fn check_row(op: &'static str, row: usize, bytes: &[u8]) -> Result<()> {
        check_scale(op, row, read_scale(bytes))?;
        match bytes[2..].iter().position(|&c| Fp8E4M3::from_bits(c).is_nan()) {
            Some(p) => Err(Error::NonFinite { op, position: p, value: f32::NAN }),
            None => Ok(()),
        }
    }
}

/// Dense quantized rows of one kv-head (keys or values), in token order: `len` rows of
/// `C::row_bytes(head_dim)` bytes, contiguous.
///
/// # Examples
/// ```
/// use kv_sparse::quant::{Int8Blocks, QuantRows};
/// let mut rows = QuantRows::<Int8Blocks>::new(32)?;
/// let x: Vec<f32> = (0..32).map(|i| i as f32 - 16.0).collect();
/// rows.push(&x)?;
/// let mut back = vec![0.0; 32];
/// rows.decode_row(0, &mut back)?;
/// assert!(back.iter().zip(&x).all(|(a, b)| (a - b).abs() <= 16.0 / 127.0 / 2.0 + 1e-3));
/// assert_eq!(rows.memory().held_bytes(), 34); // one q8_0 block
/// assert!(QuantRows::<Int8Blocks>::new(40).is_err()); // not a multiple of 32
/// # Ok::<(), kv_sparse::Error>(())
/// ```
#[derive(Clone, Debug)]
pub struct QuantRows<C> {
    head_dim: usize,
    row_bytes: usize,
    bytes: Vec<u8>,
    codec: std::marker::PhantomData<C>,
}

impl<C: DenseCodec> QuantRows<C> {
    /// No rows, for vectors of `head_dim` elements.
    ///
    /// # Errors
    /// As [`DenseCodec::check_head_dim`].
    pub fn new(head_dim: usize) -> Result<Self> {
        C::check_head_dim("QuantRows::new", head_dim)?;
        let row_bytes = C::row_bytes(head_dim);
        Ok(Self { head_dim, row_bytes, bytes: Vec::new(), codec: std::marker::PhantomData })
    }

    /// Checks rows (flattened, whole rows of `head_dim`) without storing them.
    ///
    /// # Errors
    /// [`Error::LengthMismatch`], [`Error::NonFinite`], [`Error::ScaleOverflow`].
    pub fn check(&self, op: &'static str, rows: &[f32]) -> Result<()> {
        let limit = (C::OVERFLOW_AT, || C::FORMAT.to_string());
        crate::value::check_rows(op, self.head_dim, rows, limit)
    }

    /// Appends whole rows (`rows.len()` a multiple of `head_dim`). All-or-nothing.
    ///
    /// # Errors
    /// As [`QuantRows::check`].
    pub fn push(&mut self, rows: &[f32]) -> Result<()> {
        self.check("QuantRows::push", rows)?;
        self.push_checked(rows);
        Ok(())
    }

    /// [`QuantRows::push`] after [`QuantRows::check`] succeeded for `rows`.
    pub fn push_checked(&mut self, rows: &[f32]) {
        let n = rows.len() / self.head_dim;
        let start = self.bytes.len();
        self.bytes.resize(start + n * self.row_bytes, 0);
        let dst = self.bytes[start..].chunks_exact_mut(self.row_bytes);
        for (x, out) in rows.chunks_exact(self.head_dim).zip(dst) {
            C::encode(x, out);
        }
    }

    /// Replaces row `i` (`i < len`) with `row` (`head_dim` elements), as a ring of rows
    /// overwrites its oldest slot. Nothing changes on an error.
    ///
    /// # Errors
    /// [`Error::OutOfRange`] for `i >= len`; as [`QuantRows::check`] for `row`, and
    /// [`Error::LengthMismatch`] when it is not one row.
    ///
    /// # Examples
    /// ```
    /// use kv_sparse::quant::{Int8Blocks, QuantRows};
    /// let mut rows = QuantRows::<Int8Blocks>::new(32)?;
    /// rows.push(&[1.0; 64])?;
    /// rows.replace(1, &[-2.0; 32])?;
    /// let mut out = [0.0; 32];
    /// rows.decode_row(1, &mut out)?;
    /// assert!(out.iter().all(|&x| (x + 2.0).abs() < 1e-2));
    /// assert!(rows.replace(2, &[0.0; 32]).is_err());
    /// # Ok::<(), kv_sparse::Error>(())
    /// ```
    pub fn replace(&mut self, i: usize, row: &[f32]) -> Result<()> {
        const OP: &str = "QuantRows::replace";
        if i >= self.len() {
            return Err(Error::OutOfRange { op: OP, what: "row", index: i, len: self.len() });
        }
        if row.len() != self.head_dim {
            return Err(Error::LengthMismatch {
                op: OP,
                what: "row",
                expected: self.head_dim,
                got: row.len(),
            });
        }
        self.check(OP, row)?;
        self.replace_checked(i, row);
        Ok(())
    }

    /// [`QuantRows::replace`] after [`QuantRows::check`] succeeded for `row`, which must be
    /// one row (`head_dim` elements; checked in debug builds).
    ///
    /// # Panics
    /// If `i >= len`.
    pub fn replace_checked(&mut self, i: usize, row: &[f32]) {
        debug_assert_eq!(row.len(), self.head_dim, "QuantRows::replace_checked: one row");
        C::encode(row, &mut self.bytes[i * self.row_bytes..(i + 1) * self.row_bytes]);
    }

    /// An owned copy of a view's rows (e.g. of a mapped file, to keep appending).
    pub fn from_view(view: QuantView<'_, C>) -> Self {
        Self {
            head_dim: view.head_dim,
            row_bytes: C::row_bytes(view.head_dim),
            bytes: view.bytes.to_vec(),
            codec: std::marker::PhantomData,
        }
    }

    /// Rows held.
    pub fn len(&self) -> usize {
        self.bytes.len() / self.row_bytes
    }

    /// True when no row is held.
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    /// Elements per row.
    pub fn head_dim(&self) -> usize {
        self.head_dim
    }

    /// Reserves room for `rows` more rows.
    pub fn reserve(&mut self, rows: usize) {
        self.bytes.reserve(rows * self.row_bytes);
    }

    /// Removes every row (keeps the allocation).
    pub fn clear(&mut self) {
        self.bytes.clear();
    }

    /// Keeps the first `rows` rows.
    pub fn truncate(&mut self, rows: usize) {
        self.bytes.truncate(rows * self.row_bytes);
    }

    /// Borrowed view of every row (what kernels read).
    pub fn view(&self) -> QuantView<'_, C> {
        QuantView { head_dim: self.head_dim, bytes: &self.bytes, codec: std::marker::PhantomData }
    }

    /// Decodes row `i` into `out` (`head_dim` elements).
    ///
    /// # Errors
    /// [`Error::OutOfRange`], [`Error::LengthMismatch`].
    pub fn decode_row(&self, i: usize, out: &mut [f32]) -> Result<()> {
        self.view().decode_row(i, out)
    }

    /// Bytes held: codes as `dense_bytes`, scales as `scale_bytes`.
    pub fn memory(&self) -> MemoryReport {
        let rows = self.len();
        let scales = rows * C::scale_bytes(self.head_dim);
        MemoryReport {
            dense_bytes: self.bytes.len() - scales,
            scale_bytes: scales,
            capacity_slack_bytes: self.bytes.capacity() - self.bytes.len(),
            ..MemoryReport::default()
        }
    }
}

/// Borrowed dense quantized rows (in-memory or from another process), `C`-encoded.
pub struct QuantView<'a, C> {
    head_dim: usize,
    bytes: &'a [u8],
    codec: std::marker::PhantomData<C>,
}

impl<C> Clone for QuantView<'_, C> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<C> Copy for QuantView<'_, C> {}

impl<C> std::fmt::Debug for QuantView<'_, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QuantView")
            .field("head_dim", &self.head_dim)
            .field("bytes", &self.bytes.len())
            .finish()
    }
}

impl<'a, C: DenseCodec> QuantView<'a, C> {
    /// A view over raw rows, checking every scale (untrusted input).
    ///
    /// # Errors
    /// As [`DenseCodec::check_head_dim`]; [`Error::LengthMismatch`] when `bytes` is not whole
    /// rows; [`Error::InvalidRowScale`] / [`Error::NonFinite`] for a bad row.
    pub fn from_bytes(head_dim: usize, bytes: &'a [u8]) -> Result<Self> {
        const OP: &str = "QuantView::from_bytes";
        C::check_head_dim(OP, head_dim)?;
        let rb = C::row_bytes(head_dim);
        if !bytes.len().is_multiple_of(rb) {
            let expected = bytes.len().div_ceil(rb) * rb;
            return Err(Error::LengthMismatch {
                op: OP,
                what: "bytes",
                expected,
                got: bytes.len(),
            });
        }
        for (r, row) in bytes.chunks_exact(rb).enumerate() {
            C::check_row(OP, r, row)?;
        }
        Ok(Self { head_dim, bytes, codec: std::marker::PhantomData })
    }

    /// A view of bytes [`QuantView::from_bytes`] has already accepted (nothing is checked).
    pub(crate) fn from_bytes_unchecked(head_dim: usize, bytes: &'a [u8]) -> Self {
        Self { head_dim, bytes, codec: std::marker::PhantomData }
    }

    /// Elements per row.
    pub fn head_dim(&self) -> usize {
        self.head_dim
    }

    /// Rows in the view.
    pub fn num_rows(&self) -> usize {
        self.bytes.len() / C::row_bytes(self.head_dim)
    }

    /// The encoded bytes of row `i`, or `None`.
    pub fn row(&self, i: usize) -> Option<&'a [u8]> {
        let rb = C::row_bytes(self.head_dim);
        self.bytes.get(i * rb..(i + 1) * rb)
    }

    /// Every row's bytes, contiguous (one upload for a device).
    pub fn bytes(&self) -> &'a [u8] {
        self.bytes
    }

    /// The view of rows `range` (clamped to the rows there are), still borrowed; nothing is
    /// checked again.
    ///
    /// # Examples
    /// ```
    /// use kv_sparse::quant::{Int8Blocks, QuantRows};
    /// let mut rows = QuantRows::<Int8Blocks>::new(32)?;
    /// rows.push(&[1.0; 3 * 32])?;
    /// let view = rows.view();
    /// assert_eq!(view.rows(1..3).num_rows(), 2);
    /// assert_eq!(view.rows(1..3).row(0), view.row(1));
    /// assert_eq!(view.rows(2..9).num_rows(), 1);
    /// # Ok::<(), kv_sparse::Error>(())
    /// ```
    pub fn rows(&self, range: std::ops::Range<usize>) -> Self {
        let (rb, n) = (C::row_bytes(self.head_dim), self.num_rows());
        let (start, end) = (range.start.min(n), range.end.min(n));
        Self::from_bytes_unchecked(self.head_dim, &self.bytes[start * rb..end.max(start) * rb])
    }

    /// Decodes row `i` into `out`.
    ///
    /// # Errors
    /// [`Error::OutOfRange`] for a missing row, [`Error::LengthMismatch`] for `out`.
    pub fn decode_row(&self, i: usize, out: &mut [f32]) -> Result<()> {
        const OP: &str = "QuantView::decode_row";
        if out.len() != self.head_dim {
            let (expected, got) = (self.head_dim, out.len());
            return Err(Error::LengthMismatch { op: OP, what: "out", expected, got });
        }
        let row = self.row(i).ok_or(Error::OutOfRange {
            op: OP,
            what: "row",
            index: i,
            len: self.num_rows(),
        })?;
        C::decode(row, out);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(n: usize, seed: u32) -> Vec<f32> {
        (0..n)
            .map(|i| {
                let h = (i as u32).wrapping_mul(2_654_435_761).wrapping_add(seed) >> 8;
                (h % 2001) as f32 / 100.0 - 10.0
            })
            .collect()
    }

    fn round_trip<C: DenseCodec>(x: &[f32]) -> Vec<f32> {
        let mut rows = QuantRows::<C>::new(x.len()).unwrap();
        rows.push(x).unwrap();
        let mut out = vec![0.0; x.len()];
        rows.decode_row(0, &mut out).unwrap();
        out
    }

    #[test]
    fn int8_blocks_stay_within_half_a_step() {
        let x = data(128, 3);
        let y = round_trip::<Int8Blocks>(&x);
        for (b, (xb, yb)) in x.chunks(BLOCK).zip(y.chunks(BLOCK)).enumerate() {
            // codes round x/d with the f32 d; the stored f16 d differs from it by at most
            // 2⁻¹¹ relative, which the largest code (127) carries into the decoded value.
            let d = amax(xb) / 127.0;
            let bound = d / 2.0 + 127.0 * d * 2f32.powi(-11);
            for (a, c) in xb.iter().zip(yb) {
                assert!((a - c).abs() <= bound * 1.0001, "block {b}: {a} vs {c}");
            }
        }
    }

    #[test]
    fn int4_blocks_follow_q4_0() {
        let x = data(64, 9);
        let y = round_trip::<Int4Blocks>(&x);
        for (xb, yb) in x.chunks(BLOCK).zip(y.chunks(BLOCK)) {
            let m = xb.iter().fold(0.0f32, |m, &v| if v.abs() > m.abs() { v } else { m });
            let d = f16::from_f32(m / -8.0).to_f32().abs();
            for (a, c) in xb.iter().zip(yb) {
                // inside [−8d, 7d] the error is at most d/2; the one clamped end (+8d) costs d.
                assert!((a - c).abs() <= d * 1.0001, "{a} vs {c}, d = {d}");
            }
        }
    }

    #[test]
    fn fp8_rows_keep_three_mantissa_bits() {
        let x = data(64, 5);
        let y = round_trip::<Fp8Rows>(&x);
        for (a, c) in x.iter().zip(&y) {
            assert!((a - c).abs() <= a.abs() / 16.0 + 1e-2, "{a} vs {c}");
        }
    }

    #[test]
    fn zero_rows_store_nonzero_scales() {
        for y in [round_trip::<Int8Blocks>(&[0.0; 32]), round_trip::<Int4Blocks>(&[0.0; 32])] {
            assert!(y.iter().all(|&v| v == 0.0));
        }
        let mut rows = QuantRows::<Int4Blocks>::new(32).unwrap();
        rows.push(&[0.0; 32]).unwrap();
        assert!(QuantView::<Int4Blocks>::from_bytes(32, rows.view().bytes()).is_ok());
    }

    #[test]
    fn bad_scales_and_inputs_are_typed_errors() {
        let mut bytes = vec![0u8; INT8_BLOCK_BYTES];
        assert!(matches!(
            QuantView::<Int8Blocks>::from_bytes(32, &bytes),
            Err(Error::InvalidRowScale { scale, .. }) if scale == 0.0
        ));
        bytes[..2].copy_from_slice(&f16::NAN.to_le_bytes());
        assert!(QuantView::<Int8Blocks>::from_bytes(32, &bytes).is_err());
        bytes[..2].copy_from_slice(&f16::INFINITY.to_le_bytes());
        assert!(QuantView::<Int8Blocks>::from_bytes(32, &bytes).is_err());
        assert!(QuantView::<Int8Blocks>::from_bytes(32, &bytes[..10]).is_err());
        let mut rows = QuantRows::<Fp8Rows>::new(4).unwrap();
        assert!(matches!(rows.push(&[1.0, f32::NAN, 0.0, 0.0]), Err(Error::NonFinite { .. })));
        assert!(matches!(rows.push(&[1e12, 0.0, 0.0, 0.0]), Err(Error::ScaleOverflow { .. })));
        assert!(rows.push(&[0.0; 3]).is_err());
        assert!(rows.is_empty());
    }

    #[test]
    fn int_row_codes_round_trip() {
        let x = data(10, 1);
        let mut buf = vec![0u8; 12];
        encode_int8(&x, &mut buf);
        let mut y = vec![0.0; 10];
        decode_int8(&buf, &mut y);
        let s = scale_up(amax(&x), 127.0).to_f32();
        assert!(x.iter().zip(&y).all(|(a, b)| (a - b).abs() <= s / 2.0 * 1.0001));
        let mut buf = vec![0u8; 7];
        encode_int4(&x, &mut buf);
        decode_int4(&buf, &mut y);
        let s = scale_up(amax(&x), 7.0).to_f32();
        assert!(x.iter().zip(&y).all(|(a, b)| (a - b).abs() <= s / 2.0 * 1.0001));
    }
}
