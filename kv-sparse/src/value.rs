//! Element types of stored K/V values: the runtime [`ValueFormat`] tag and the sealed
//! [`Value`] trait implemented for `f32`, `half::f16`, `half::bf16` and [`Fp8E4M3`].
//!
//! SWAN ("Memory footprint" and "8-bit values" paragraphs of the method section) stores the
//! kept components of each pruned vector as 16-bit floats, or as 8-bit floats for higher
//! compression; `f32` is our lossless setting. The format is a type parameter, so hot loops
//! never branch on it; [`ValueFormat`] is the runtime tag used in files and reports.

use std::fmt;

use half::slice::HalfFloatSliceExt;

use crate::fp8::Fp8E4M3;
use crate::{Error, Result};

pub(crate) mod sealed {
    /// Seals [`crate::Value`] and [`crate::SparseIndex`]: only this crate's plain-old-data
    /// element types implement them, so views can be cast zero-copy from file bytes.
    pub trait Sealed: bytemuck::Pod {}
    impl Sealed for f32 {}
    impl Sealed for half::f16 {}
    impl Sealed for half::bf16 {}
    impl Sealed for crate::fp8::Fp8E4M3 {}
    impl Sealed for u8 {}
    impl Sealed for u16 {}
}

/// Runtime tag of a value format (stored in files, memory reports and error messages).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ValueFormat {
    /// IEEE 754 binary32: the lossless setting.
    F32,
    /// IEEE 754 binary16 (`half::f16`).
    F16,
    /// bfloat16 (`half::bf16`).
    Bf16,
    /// OCP 8-bit E4M3FN ([`Fp8E4M3`]).
    Fp8E4M3,
}

impl ValueFormat {
    /// All formats, in file-code order.
    pub const ALL: [ValueFormat; 4] =
        [ValueFormat::F32, ValueFormat::F16, ValueFormat::Bf16, ValueFormat::Fp8E4M3];

    /// Bytes per stored element.
    ///
    /// # Examples
    /// ```
    /// use kv_sparse::ValueFormat;
    /// assert_eq!(ValueFormat::F16.bytes(), 2);
    /// assert_eq!(ValueFormat::Fp8E4M3.bytes(), 1);
    /// ```
    pub const fn bytes(self) -> usize {
        match self {
            ValueFormat::F32 => 4,
            ValueFormat::F16 | ValueFormat::Bf16 => 2,
            ValueFormat::Fp8E4M3 => 1,
        }
    }

    /// Stable numeric code used by the on-disk format.
    pub(crate) const fn code(self) -> u32 {
        match self {
            ValueFormat::F32 => 0,
            ValueFormat::F16 => 1,
            ValueFormat::Bf16 => 2,
            ValueFormat::Fp8E4M3 => 3,
        }
    }

    /// Inverse of [`ValueFormat::code`].
    pub(crate) fn from_code(code: u32) -> Option<Self> {
        Self::ALL.into_iter().find(|f| f.code() == code)
    }
}

impl fmt::Display for ValueFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ValueFormat::F32 => "f32",
            ValueFormat::F16 => "f16",
            ValueFormat::Bf16 => "bf16",
            ValueFormat::Fp8E4M3 => "fp8-e4m3fn",
        })
    }
}

/// A stored value element: converts from and to `f32`.
///
/// Sealed: implemented for `f32`, [`half::f16`], [`half::bf16`] and [`Fp8E4M3`].
pub trait Value:
    sealed::Sealed + Copy + Default + Send + Sync + PartialEq + fmt::Debug + 'static
{
    /// Runtime tag of this type.
    const FORMAT: ValueFormat;
    /// Smallest magnitude whose encoding is not finite (`f32::INFINITY` when every finite
    /// input encodes to a finite value: exact `f32`, saturating fp8).
    const OVERFLOW_AT: f32;
    /// Encodes an `f32`: round to nearest even (fp8: see [`Fp8E4M3::from_f32`]).
    fn from_f32(x: f32) -> Self;
    /// Decodes to `f32` (exact for every format).
    fn to_f32(self) -> f32;

    /// Encodes the first `min(src.len(), dst.len())` elements of `src` into `dst`, as
    /// [`Value::from_f32`] would — vectorized where the format allows (f16 uses F16C
    /// instructions when the CPU has them).
    #[inline]
    fn encode_into(src: &[f32], dst: &mut [Self]) {
        for (d, &s) in dst.iter_mut().zip(src) {
            *d = Self::from_f32(s);
        }
    }

    /// Decodes the first `min(src.len(), dst.len())` elements of `src` into `dst`, as
    /// [`Value::to_f32`] would (vectorized where the format allows).
    #[inline]
    fn decode_into(src: &[Self], dst: &mut [f32]) {
        for (d, s) in dst.iter_mut().zip(src) {
            *d = s.to_f32();
        }
    }
}

impl Value for f32 {
    const FORMAT: ValueFormat = ValueFormat::F32;
    const OVERFLOW_AT: f32 = f32::INFINITY;
    #[inline(always)]
    fn from_f32(x: f32) -> Self {
        x
    }
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }
}

impl Value for half::f16 {
    const FORMAT: ValueFormat = ValueFormat::F16;
    /// Midpoint between 65504 (largest finite) and the next step: ties go to even = inf.
    const OVERFLOW_AT: f32 = 65520.0;
    #[inline(always)]
    fn from_f32(x: f32) -> Self {
        half::f16::from_f32(x)
    }
    #[inline(always)]
    fn to_f32(self) -> f32 {
        half::f16::to_f32(self)
    }
    #[inline]
    fn encode_into(src: &[f32], dst: &mut [Self]) {
        let n = src.len().min(dst.len());
        dst[..n].convert_from_f32_slice(&src[..n]);
    }
    #[inline]
    fn decode_into(src: &[Self], dst: &mut [f32]) {
        let n = src.len().min(dst.len());
        src[..n].convert_to_f32_slice(&mut dst[..n]);
    }
}

impl Value for half::bf16 {
    const FORMAT: ValueFormat = ValueFormat::Bf16;
    /// Midpoint between bf16::MAX (0x7F7F) and infinity (0x7F80): ties go to even = inf.
    const OVERFLOW_AT: f32 = f32::from_bits(0x7F7F_8000);
    #[inline(always)]
    fn from_f32(x: f32) -> Self {
        half::bf16::from_f32(x)
    }
    #[inline(always)]
    fn to_f32(self) -> f32 {
        half::bf16::to_f32(self)
    }
}

impl Value for Fp8E4M3 {
    const FORMAT: ValueFormat = ValueFormat::Fp8E4M3;
    const OVERFLOW_AT: f32 = f32::INFINITY;
    #[inline(always)]
    fn from_f32(x: f32) -> Self {
        Fp8E4M3::from_f32(x)
    }
    #[inline(always)]
    fn to_f32(self) -> f32 {
        Fp8E4M3::to_f32(self)
    }
}

/// Reinterprets a slice of stored values as bytes (e.g. for a device upload).
///
/// # Examples
/// ```
/// let v = [half::f16::from_f32(1.0)];
/// assert_eq!(kv_sparse::value_bytes(&v), &[0x00, 0x3c]);
/// ```
pub fn value_bytes<V: Value>(values: &[V]) -> &[u8] {
    bytemuck::cast_slice(values)
}

/// The largest magnitude of `x` as its bit pattern (`0x7f80_0000` or more when `x` holds
/// a NaN or an infinity). Integer max over masked bits: vectorizes, no branches.
pub(crate) fn max_magnitude_bits(x: &[f32]) -> u32 {
    x.iter().fold(0, |m, v| m.max(v.to_bits() & 0x7fff_ffff))
}

/// Checks whole rows of `head_dim` (flattened) for a store whose elements must be finite and
/// below `limit` in magnitude (`format` names the store in the error).
///
/// # Errors
/// [`Error::LengthMismatch`], [`Error::NonFinite`], [`Error::ScaleOverflow`].
pub(crate) fn check_rows(
    op: &'static str,
    head_dim: usize,
    rows: &[f32],
    (limit, format): (f32, impl FnOnce() -> String),
) -> Result<()> {
    if !rows.len().is_multiple_of(head_dim) {
        let expected = rows.len().div_ceil(head_dim) * head_dim;
        return Err(Error::LengthMismatch { op, what: "rows", expected, got: rows.len() });
    }
    let max = check_finite(op, rows)?;
    if max >= limit {
        return Err(Error::ScaleOverflow { op, format: format(), value: max, limit });
    }
    Ok(())
}

/// Returns the largest magnitude of `x`, or [`Error::NonFinite`] for the first NaN/±∞.
pub(crate) fn check_finite(op: &'static str, x: &[f32]) -> Result<f32> {
    let max = max_magnitude_bits(x);
    if max < 0x7f80_0000 {
        return Ok(f32::from_bits(max));
    }
    let position = x.iter().position(|v| !v.is_finite()).unwrap_or_default();
    Err(Error::NonFinite { op, position, value: x[position] })
}

/// [`Error::Overflow`] when `max_abs` would not encode to a finite `V`.
pub(crate) fn check_overflow<V: Value>(op: &'static str, max_abs: f32) -> Result<()> {
    if max_abs >= V::OVERFLOW_AT {
        return Err(Error::Overflow {
            op,
            format: V::FORMAT,
            value: max_abs,
            limit: V::OVERFLOW_AT,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overflow_limits_are_the_first_non_finite_inputs() {
        let below = |x: f32| f32::from_bits(x.to_bits() - 1);
        assert!(half::f16::from_f32(half::f16::OVERFLOW_AT).to_f32().is_infinite());
        assert!(half::f16::from_f32(below(half::f16::OVERFLOW_AT)).to_f32().is_finite());
        assert!(half::bf16::from_f32(half::bf16::OVERFLOW_AT).to_f32().is_infinite());
        assert!(half::bf16::from_f32(below(half::bf16::OVERFLOW_AT)).to_f32().is_finite());
    }

    #[test]
    fn format_codes_round_trip() {
        for f in ValueFormat::ALL {
            assert_eq!(ValueFormat::from_code(f.code()), Some(f));
        }
        assert_eq!(ValueFormat::from_code(4), None);
    }
}
