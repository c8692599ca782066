//! SWAN row encodings: which components a pruned row keeps ([`IndexCode`]) × how their
//! values are stored ([`ValueCode`]), in one byte string per row.
//!
//! SWAN ("Memory footprint" paragraph of the method section) stores a pruned vector as its
//! `k` kept values, their `u8` indices and a 2-byte offset: `3k + 2` bytes with 16-bit
//! values. That is one encoding among several, and not the smallest once `k > d_h/8`:
//!
//! | index code | bytes | value code | bytes (k kept) |
//! |---|---|---|---|
//! | [`List<u8>`] / [`List<u16>`] | `k` / `2k` | [`Elems<f16>`] etc. | `k · size_of::<V>()` |
//! | [`Bitmask`] | `⌈d_h/8⌉` (k = popcount) | [`Int8Values`] | `k + 2` (f16 scale) |
//! | | | [`Int4Values`] | `k/2 + 2` (k even) |
//!
//! A row is `[index part][value part]`; an empty row (`k = 0`) is only its index part. The
//! rows of a store live in paged blocks exactly like CSR rows ([`crate::csr`]): a u64 base
//! per block and a u16 offset per row, so every encoding costs
//! [`coded_row_bytes`]` = index + values + 2` bytes per row plus 8 bytes per block —
//! e.g. bitmask + int8 at `d_h = 64, k = 32`: `8 + 32 + 2 + 2 = 44` bytes against 128 for an
//! f16 row. The number of kept entries is implied by the row's length (and, for a bitmask,
//! equal to its popcount — a mismatch in untrusted data is [`crate::Error::MaskCountMismatch`]).
//!
//! Integer value codes are symmetric with one f16 scale per row from the largest kept
//! magnitude ([`crate::quant::encode_int8`]); `Elems<V>` rows share the per-head scale of
//! the hybrid cache, as CSR rows do. Codes are types, so hot loops never branch on them.
//!
//! Lossless setting: `List<u8>` or `Bitmask` with `Elems<f32>` and `k = head_dim` read
//! every row back bit-exact; `Int8Values` at `k = head_dim` stays within half a step of the
//! row's scale (both tested).

mod store;

pub use store::{CodedRow, CodedStore, CodedView, EXPAND_ON_STACK};

use std::fmt;
use std::marker::PhantomData;

use crate::quant::{decode_int4, decode_int8, encode_int4, encode_int8};
use crate::{Error, Result, SparseIndex, Value, ValueFormat};

mod private {
    /// Seals [`super::IndexCode`] and [`super::ValueCode`].
    pub trait Sealed {}
    impl<I> Sealed for super::List<I> {}
    impl Sealed for super::Bitmask {}
    impl<V> Sealed for super::Elems<V> {}
    impl Sealed for super::Int8Values {}
    impl Sealed for super::Int4Values {}
}

/// Runtime tag of an index code.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum IndexKind {
    /// One `u8` per kept component.
    ListU8,
    /// One `u16` per kept component.
    ListU16,
    /// One bit per component of the head.
    Bitmask,
}

impl fmt::Display for IndexKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            IndexKind::ListU8 => "list-u8",
            IndexKind::ListU16 => "list-u16",
            IndexKind::Bitmask => "bitmask",
        })
    }
}

/// Runtime tag of a value code.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ValueKind {
    /// One element of a [`Value`] format per kept component.
    Elems(ValueFormat),
    /// Symmetric `i8` with an f16 scale per row.
    Int8,
    /// Symmetric 4-bit with an f16 scale per row.
    Int4,
}

impl fmt::Display for ValueKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ValueKind::Elems(v) => write!(f, "{v}"),
            ValueKind::Int8 => f.write_str("int8"),
            ValueKind::Int4 => f.write_str("int4"),
        }
    }
}

/// Kept indices as a list of `I` (the paper's encoding).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct List<I>(PhantomData<I>);

/// Kept indices as a `head_dim`-bit mask (bit `i % 8` of byte `i / 8`), components in
/// ascending order.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Bitmask;

/// Kept values as elements of `V` (`f32`, f16, bf16, fp8).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Elems<V>(PhantomData<V>);

/// Kept values as symmetric `i8` codes with one f16 scale per row.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Int8Values;

/// Kept values as symmetric 4-bit codes with one f16 scale per row (`k` even).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Int4Values;

/// How a row names its kept components. Sealed: [`List<u8>`], [`List<u16>`], [`Bitmask`].
pub trait IndexCode: private::Sealed + Copy + Default + Send + Sync + fmt::Debug + 'static {
    /// Runtime tag.
    const KIND: IndexKind;
    /// Bytes per kept entry (0 for a bitmask).
    const ENTRY_BYTES: usize;
    /// Largest head dimension the code can name.
    const MAX_HEAD_DIM: usize;

    /// Bytes every row carries whatever its `k` (the mask; 0 for a list).
    fn fixed_bytes(head_dim: usize) -> usize;

    /// Bytes of the index part of a row keeping `k` components.
    fn bytes(k: usize, head_dim: usize) -> usize {
        Self::fixed_bytes(head_dim) + k * Self::ENTRY_BYTES
    }

    /// Writes strictly ascending `indices` (each `< head_dim`) into `out`.
    fn encode(indices: &[usize], head_dim: usize, out: &mut [u8]);

    /// Calls `f(j, index)` for the kept entries `j = k−1, …, 0` (descending).
    fn for_each_rev(part: &[u8], k: usize, f: impl FnMut(usize, usize));

    /// Calls `f(j, index)` for the kept entries `j = 0, …, k−1` (ascending); a mask is read
    /// 64 bits at a time.
    fn for_each(part: &[u8], k: usize, f: impl FnMut(usize, usize));

    /// Checks an untrusted index part for `k` entries: ascending, below `head_dim`, and for
    /// a mask, popcount equal to `k`.
    ///
    /// # Errors
    /// [`Error::InvalidSparseIndex`] or [`Error::MaskCountMismatch`].
    fn check(op: &'static str, row: usize, part: &[u8], k: usize, head_dim: usize) -> Result<()>;
}

impl<I: SparseIndex> IndexCode for List<I> {
    const KIND: IndexKind = if I::BYTES == 1 { IndexKind::ListU8 } else { IndexKind::ListU16 };
    const ENTRY_BYTES: usize = I::BYTES;
    const MAX_HEAD_DIM: usize =
        if I::MAX_HEAD_DIM < crate::MAX_HEAD_DIM { I::MAX_HEAD_DIM } else { crate::MAX_HEAD_DIM };

    fn fixed_bytes(_: usize) -> usize {
        0
    }

    fn encode(indices: &[usize], _: usize, out: &mut [u8]) {
        for (o, &i) in out.chunks_exact_mut(I::BYTES).zip(indices) {
            o.copy_from_slice(bytemuck::bytes_of(&I::from_usize(i)));
        }
    }

    fn for_each_rev(part: &[u8], k: usize, mut f: impl FnMut(usize, usize)) {
        for j in (0..k).rev() {
            let at = j * I::BYTES;
            f(j, bytemuck::pod_read_unaligned::<I>(&part[at..at + I::BYTES]).to_usize());
        }
    }

    fn for_each(part: &[u8], k: usize, mut f: impl FnMut(usize, usize)) {
        for (j, b) in part[..k * I::BYTES].chunks_exact(I::BYTES).enumerate() {
            f(j, bytemuck::pod_read_unaligned::<I>(b).to_usize());
        }
    }

    fn check(op: &'static str, _: usize, part: &[u8], k: usize, head_dim: usize) -> Result<()> {
        let indices = part[..k * I::BYTES]
            .chunks_exact(I::BYTES)
            .map(|b| bytemuck::pod_read_unaligned::<I>(b).to_usize());
        crate::index::check_ascending(op, indices, head_dim)
    }
}

impl IndexCode for Bitmask {
    const KIND: IndexKind = IndexKind::Bitmask;
    const ENTRY_BYTES: usize = 0;
    const MAX_HEAD_DIM: usize = crate::MAX_HEAD_DIM;

    fn fixed_bytes(head_dim: usize) -> usize {
        head_dim.div_ceil(8)
    }

    fn encode(indices: &[usize], head_dim: usize, out: &mut [u8]) {
        out[..head_dim.div_ceil(8)].fill(0);
        for &i in indices {
            out[i / 8] |= 1 << (i % 8);
        }
    }

    fn for_each_rev(part: &[u8], k: usize, mut f: impl FnMut(usize, usize)) {
        let mut j = k;
        for (p, &byte) in part.iter().enumerate().rev() {
            let mut b = byte;
            while b != 0 && j > 0 {
                let bit = 7 - b.leading_zeros() as usize;
                j -= 1;
                f(j, p * 8 + bit);
                b &= !(1 << bit);
            }
        }
    }

    fn for_each(part: &[u8], k: usize, mut f: impl FnMut(usize, usize)) {
        let mut j = 0;
        let mut base = 0;
        let mut words = part.chunks_exact(8);
        for word in &mut words {
            let mut bytes = [0u8; 8];
            bytes.copy_from_slice(word);
            let mut w = u64::from_le_bytes(bytes);
            while w != 0 && j < k {
                f(j, base + w.trailing_zeros() as usize);
                j += 1;
                w &= w - 1;
            }
            base += 64;
        }
        for &byte in words.remainder() {
            let mut b = byte;
            while b != 0 && j < k {
                f(j, base + b.trailing_zeros() as usize);
                j += 1;
                b &= b - 1;
            }
            base += 8;
        }
    }

    fn check(op: &'static str, row: usize, part: &[u8], k: usize, head_dim: usize) -> Result<()> {
        let popcount: usize = part.iter().map(|b| b.count_ones() as usize).sum();
        if popcount != k {
            return Err(Error::MaskCountMismatch { op, row, popcount, stored: k });
        }
        let tail = head_dim % 8;
        if tail != 0 && part[head_dim / 8] >> tail != 0 {
            let index = head_dim + (part[head_dim / 8] >> tail).trailing_zeros() as usize;
            return Err(Error::InvalidSparseIndex {
                op,
                position: k - 1,
                index,
                reason: "not below head_dim",
            });
        }
        Ok(())
    }
}

/// How a row stores its kept values. Sealed: [`Elems<V>`], [`Int8Values`], [`Int4Values`].
pub trait ValueCode: private::Sealed + Copy + Default + Send + Sync + fmt::Debug + 'static {
    /// Runtime tag.
    const KIND: ValueKind;
    /// Smallest magnitude (after the per-head scale) that does not encode finitely.
    const OVERFLOW_AT: f32;
    /// Bytes of the per-row scale (0 for [`Elems`]); rows keeping nothing store none.
    const SCALE_BYTES: usize;

    /// Bytes of the codes of `k` values (scale excluded).
    fn code_bytes(k: usize) -> usize;

    /// Bytes of the value part of a row keeping `k` values (0 for `k = 0`).
    fn bytes(k: usize) -> usize {
        if k == 0 { 0 } else { Self::SCALE_BYTES + Self::code_bytes(k) }
    }

    /// The `k` whose row of `len` bytes (beyond the index part's fixed bytes) holds
    /// `entry_index_bytes` per entry, or `None` when no `k` fits exactly.
    fn k_for(len: usize, entry_index_bytes: usize) -> Option<usize>;

    /// Checks that rows of `k` values can be stored.
    ///
    /// # Errors
    /// [`Error::OddK`] for an odd `k` with 4-bit values.
    fn check_k(op: &'static str, k: usize) -> Result<()> {
        let _ = (op, k);
        Ok(())
    }

    /// Encodes `values` (finite, below [`ValueCode::OVERFLOW_AT`]) into `out`
    /// (`bytes(values.len())` bytes).
    fn encode(values: &[f32], out: &mut [u8]);

    /// Decodes a value part holding `out.len()` values into `out`.
    fn decode(part: &[u8], out: &mut [f32]);

    /// Checks an untrusted value part holding `k` values: finite codes, valid scale.
    ///
    /// # Errors
    /// [`Error::InvalidRowScale`], [`Error::NonFinite`].
    fn check(op: &'static str, row: usize, part: &[u8], k: usize) -> Result<()>;
}

impl<V: Value> ValueCode for Elems<V> {
    const KIND: ValueKind = ValueKind::Elems(V::FORMAT);
    const OVERFLOW_AT: f32 = V::OVERFLOW_AT;
    const SCALE_BYTES: usize = 0;

    fn code_bytes(k: usize) -> usize {
        k * size_of::<V>()
    }

    fn k_for(len: usize, entry_index_bytes: usize) -> Option<usize> {
        let per = entry_index_bytes + size_of::<V>();
        len.is_multiple_of(per).then_some(len / per)
    }

    fn encode(values: &[f32], out: &mut [u8]) {
        for (o, &x) in out.chunks_exact_mut(size_of::<V>()).zip(values) {
            o.copy_from_slice(bytemuck::bytes_of(&V::from_f32(x)));
        }
    }

    fn decode(part: &[u8], out: &mut [f32]) {
        for (o, b) in out.iter_mut().zip(part.chunks_exact(size_of::<V>())) {
            *o = bytemuck::pod_read_unaligned::<V>(b).to_f32();
        }
    }

    fn check(op: &'static str, _: usize, part: &[u8], k: usize) -> Result<()> {
        for (position, b) in part.chunks_exact(size_of::<V>()).take(k).enumerate() {
            let value = bytemuck::pod_read_unaligned::<V>(b).to_f32();
            if !value.is_finite() {
                return Err(Error::NonFinite { op, position, value });
            }
        }
        Ok(())
    }
}

fn check_row_scale(op: &'static str, row: usize, part: &[u8], k: usize) -> Result<()> {
    if k == 0 {
        return Ok(());
    }
    let scale = half::f16::from_le_bytes([part[0], part[1]]).to_f32();
    if scale == 0.0 || !scale.is_finite() {
        return Err(Error::InvalidRowScale { op, row, scale });
    }
    Ok(())
}

impl ValueCode for Int8Values {
    const KIND: ValueKind = ValueKind::Int8;
    const OVERFLOW_AT: f32 = 65504.0 * 127.0;
    const SCALE_BYTES: usize = 2;

    fn code_bytes(k: usize) -> usize {
        k
    }

    fn k_for(len: usize, entry_index_bytes: usize) -> Option<usize> {
        if len == 0 {
            return Some(0);
        }
        let rest = len.checked_sub(2)?;
        let per = entry_index_bytes + 1;
        (rest.is_multiple_of(per) && rest > 0).then_some(rest / per)
    }

    fn encode(values: &[f32], out: &mut [u8]) {
        encode_int8(values, out);
    }

    fn decode(part: &[u8], out: &mut [f32]) {
        decode_int8(part, out);
    }

    fn check(op: &'static str, row: usize, part: &[u8], k: usize) -> Result<()> {
        check_row_scale(op, row, part, k)
    }
}

impl ValueCode for Int4Values {
    const KIND: ValueKind = ValueKind::Int4;
    const OVERFLOW_AT: f32 = 65504.0 * 7.0;
    const SCALE_BYTES: usize = 2;

    fn code_bytes(k: usize) -> usize {
        k.div_ceil(2)
    }

    fn k_for(len: usize, entry_index_bytes: usize) -> Option<usize> {
        if len == 0 {
            return Some(0);
        }
        let rest = len.checked_sub(2)?;
        // k = 2m entries: m·(2·index bytes + 1) bytes.
        let per_pair = 2 * entry_index_bytes + 1;
        (rest.is_multiple_of(per_pair) && rest > 0).then_some(2 * (rest / per_pair))
    }

    fn check_k(op: &'static str, k: usize) -> Result<()> {
        if k % 2 == 1 {
            return Err(Error::OddK { op, k });
        }
        Ok(())
    }

    fn encode(values: &[f32], out: &mut [u8]) {
        encode_int4(values, out);
    }

    fn decode(part: &[u8], out: &mut [f32]) {
        decode_int4(part, out);
    }

    fn check(op: &'static str, row: usize, part: &[u8], k: usize) -> Result<()> {
        check_row_scale(op, row, part, k)
    }
}

/// Bytes of one coded row keeping `k` of `head_dim` components, the 2-byte row offset
/// included (block bases excluded, as in [`crate::memory::sparse_row_bytes`]).
///
/// # Examples
/// ```
/// use kv_sparse::coded::{coded_row_bytes, Bitmask, Elems, Int8Values, List};
/// use kv_sparse::fp8::Fp8E4M3;
/// assert_eq!(coded_row_bytes::<Bitmask, Int8Values>(32, 64), 8 + 32 + 2 + 2);
/// assert_eq!(coded_row_bytes::<List<u8>, Elems<Fp8E4M3>>(32, 64), 2 * 32 + 2);
/// ```
pub fn coded_row_bytes<X: IndexCode, Y: ValueCode>(k: usize, head_dim: usize) -> usize {
    X::bytes(k, head_dim) + Y::bytes(k) + 2
}
