//! The 8-bit float codec: OCP FP8 **E4M3FN** ([`Fp8E4M3`]), bulk slice conversion and the
//! decode table kernels may use.
//!
//! SWAN ("8-bit values" paragraph of the method section) quantizes the kept components of
//! sparse vectors to float8 so that a row costs `2k+2` bytes instead of `3k+2`, letting a
//! memory budget keep more components. We use the OCP 8-bit floating point specification's
//! E4M3FN encoding: 1 sign bit, 4 exponent bits (bias 7), 3 mantissa bits, subnormals,
//! no infinities, and one NaN pattern per sign (`S.1111.111`, i.e. `0x7F` / `0xFF`).
//! The largest finite magnitude is `448 = 1.75·2⁸`, the smallest normal `2⁻⁶`, the smallest
//! subnormal `2⁻⁹`.
//!
//! # Conversion from `f32`
//! [`Fp8E4M3::from_f32`] rounds to the nearest representable value, ties to even, and uses
//! the OCP *saturation* mode: finite magnitudes at or above 448 (and ±∞) become ±448; NaN
//! stays NaN (its sign is kept). Zero keeps its sign.
//!
//! # When a per-head scale is needed
//! E4M3 has only ~2 significant decimal digits over the range `[2⁻⁶, 448]`. Two regimes lose
//! information badly, and a per-head `f32` scale `s` (store `fp8(x / s)`, read back
//! `fp8 · s`; [`crate::hybrid::HybridConfig::fp8_scale`]) fixes both:
//! * **magnitudes above 448** saturate — the error is unbounded (a key component of 2000
//!   is read back as 448). Rotated keys of heads with massive activations reach this range.
//! * **magnitudes below 2⁻⁶ ≈ 0.0156** fall into the subnormal grid of fixed step
//!   `2⁻⁹ ≈ 0.00195`: relative error grows as the magnitude shrinks, and magnitudes below
//!   `2⁻¹⁰` flush to zero. Value vectors of many heads live at 0.01–0.1 and lose most of
//!   their precision without a scale.
//!
//! Choose `s` from calibration so the largest magnitude of the head lands just below 448:
//! [`scale_for_max_abs`] returns that power of two (a power of two makes the division exact,
//! so scaling adds no rounding of its own). With `max|x| ≤ 448` and no values below `2⁻⁶`
//! the scale is unnecessary; with a scale of 1 the codec is used as is.

use std::fmt;

use crate::{Error, Result};

/// An OCP FP8 E4M3FN value (bias 7, max ±448, no infinities, NaN = `S.1111.111`).
///
/// Equality compares encodings: `+0 != -0`, and a NaN equals the same NaN encoding.
#[repr(transparent)]
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash, bytemuck::Pod, bytemuck::Zeroable)]
pub struct Fp8E4M3(u8);

const _: () = assert!(std::mem::size_of::<Fp8E4M3>() == 1);

impl Fp8E4M3 {
    /// Largest finite value, 448.
    pub const MAX: Self = Self(0x7E);
    /// Most negative finite value, −448.
    pub const MIN: Self = Self(0xFE);
    /// Smallest positive normal value, 2⁻⁶.
    pub const MIN_POSITIVE: Self = Self(0x08);
    /// Smallest positive subnormal value, 2⁻⁹.
    pub const MIN_POSITIVE_SUBNORMAL: Self = Self(0x01);
    /// Positive NaN (`0x7F`).
    pub const NAN: Self = Self(0x7F);
    /// Positive zero.
    pub const ZERO: Self = Self(0x00);

    /// Encodes an `f32`: round to nearest, ties to even; saturate |x| ≥ 448 and ±∞ to ±448;
    /// NaN → NaN (sign kept).
    ///
    /// # Examples
    /// ```
    /// use kv_sparse::fp8::Fp8E4M3;
    /// assert_eq!(Fp8E4M3::from_f32(1.0).to_bits(), 0x38);
    /// assert_eq!(Fp8E4M3::from_f32(1.0625).to_f32(), 1.0); // tie -> even mantissa
    /// assert_eq!(Fp8E4M3::from_f32(1e6).to_f32(), 448.0); // saturates
    /// assert!(Fp8E4M3::from_f32(f32::NAN).to_f32().is_nan());
    /// ```
    #[inline]
    pub fn from_f32(x: f32) -> Self {
        let bits = x.to_bits();
        let sign = ((bits >> 24) & 0x80) as u8;
        let abs = bits & 0x7fff_ffff;
        if abs > 0x7f80_0000 {
            return Self(sign | 0x7f);
        }
        // |x| >= 448 (0x43E0_0000), including infinity: saturate.
        if abs >= 0x43e0_0000 {
            return Self(sign | 0x7e);
        }
        // |x| < 2^-6 (0x3C80_0000): subnormal grid with step 2^-9 (the scaling is exact).
        if abs < 0x3c80_0000 {
            let q = (f32::from_bits(abs) * 512.0).round_ties_even() as u8;
            return Self(sign | q);
        }
        // Normal: fp8 exponent field = f32 exponent - 127 + 7; keep 3 of 23 mantissa bits.
        let mut code = (((abs >> 23) - 120) << 3) | ((abs >> 20) & 0x7);
        let rem = abs & 0xf_ffff;
        if rem > 0x8_0000 || (rem == 0x8_0000 && code & 1 == 1) {
            code += 1; // a mantissa carry correctly bumps the exponent
        }
        Self(sign | code as u8)
    }

    /// Decodes to `f32` (exact; a table lookup).
    ///
    /// # Examples
    /// ```
    /// use kv_sparse::fp8::Fp8E4M3;
    /// assert_eq!(Fp8E4M3::MAX.to_f32(), 448.0);
    /// assert_eq!(Fp8E4M3::MIN_POSITIVE_SUBNORMAL.to_f32(), 2f32.powi(-9));
    /// ```
    #[inline(always)]
    pub fn to_f32(self) -> f32 {
        DECODE_TABLE[self.0 as usize]
    }

    /// Builds a value from its encoding.
    pub const fn from_bits(bits: u8) -> Self {
        Self(bits)
    }

    /// The encoding.
    pub const fn to_bits(self) -> u8 {
        self.0
    }

    /// True for the two NaN encodings `0x7F` and `0xFF`.
    pub const fn is_nan(self) -> bool {
        self.0 & 0x7f == 0x7f
    }
}

impl fmt::Debug for Fp8E4M3 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Fp8E4M3({} = {:#04x})", self.to_f32(), self.0)
    }
}

impl fmt::Display for Fp8E4M3 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.to_f32(), f)
    }
}

const fn decode_bits(b: u8) -> f32 {
    let negative = b & 0x80 != 0;
    let exp = ((b >> 3) & 0xf) as u32;
    let man = (b & 0x7) as u32;
    let magnitude = if exp == 15 && man == 7 {
        f32::NAN
    } else if exp == 0 {
        man as f32 / 512.0
    } else {
        f32::from_bits(((exp + 120) << 23) | (man << 20))
    };
    if negative { -magnitude } else { magnitude }
}

const fn build_table() -> [f32; 256] {
    let mut table = [0.0f32; 256];
    let mut i = 0;
    while i < 256 {
        table[i] = decode_bits(i as u8);
        i += 1;
    }
    table
}

/// Code → `f32` for all 256 encodings (NaN for `0x7F`/`0xFF`); kernels may index it directly.
pub static DECODE_TABLE: [f32; 256] = build_table();

/// Encodes `src` into `dst` element by element ([`Fp8E4M3::from_f32`]).
///
/// # Errors
/// [`Error::LengthMismatch`] when the slices differ in length.
///
/// # Examples
/// ```
/// use kv_sparse::fp8::{encode_slice, Fp8E4M3};
/// let mut out = [Fp8E4M3::ZERO; 2];
/// encode_slice(&[0.5, -2.0], &mut out)?;
/// assert_eq!(out[1].to_f32(), -2.0);
/// # Ok::<(), kv_sparse::Error>(())
/// ```
pub fn encode_slice(src: &[f32], dst: &mut [Fp8E4M3]) -> Result<()> {
    check_len("fp8::encode_slice", src.len(), dst.len())?;
    for (d, &s) in dst.iter_mut().zip(src) {
        *d = Fp8E4M3::from_f32(s);
    }
    Ok(())
}

/// Decodes `src` into `dst` element by element ([`Fp8E4M3::to_f32`]).
///
/// # Errors
/// [`Error::LengthMismatch`] when the slices differ in length.
///
/// # Examples
/// ```
/// use kv_sparse::fp8::{decode_slice, Fp8E4M3};
/// let mut out = [0.0f32; 1];
/// decode_slice(&[Fp8E4M3::MAX], &mut out)?;
/// assert_eq!(out, [448.0]);
/// # Ok::<(), kv_sparse::Error>(())
/// ```
pub fn decode_slice(src: &[Fp8E4M3], dst: &mut [f32]) -> Result<()> {
    check_len("fp8::decode_slice", src.len(), dst.len())?;
    for (d, s) in dst.iter_mut().zip(src) {
        *d = s.to_f32();
    }
    Ok(())
}

fn check_len(op: &'static str, src: usize, dst: usize) -> Result<()> {
    if src != dst {
        return Err(Error::LengthMismatch { op, what: "dst", expected: src, got: dst });
    }
    Ok(())
}

/// The power-of-two scale `s` that maps `max_abs` into `(224, 448]`, the top binade of E4M3
/// (see the module docs for when a scale is needed). Returns 1 for `max_abs == 0`.
///
/// # Errors
/// [`Error::InvalidScale`] when `max_abs` is negative or not finite.
///
/// # Examples
/// ```
/// use kv_sparse::fp8::scale_for_max_abs;
/// assert_eq!(scale_for_max_abs(1000.0)?, 4.0);   // 1000 / 4 = 250 ≤ 448
/// assert_eq!(scale_for_max_abs(0.05)?, 0.0001220703125); // 0.05 / 2^-13 = 409.6
/// # Ok::<(), kv_sparse::Error>(())
/// ```
pub fn scale_for_max_abs(max_abs: f32) -> Result<f32> {
    if !max_abs.is_finite() || max_abs < 0.0 {
        return Err(Error::InvalidScale { op: "fp8::scale_for_max_abs", scale: max_abs });
    }
    if max_abs == 0.0 {
        return Ok(1.0);
    }
    let ratio = f64::from(max_abs) / 448.0;
    let mut exp = ratio.log2().ceil() as i32;
    while f64::from(max_abs) > 448.0 * 2f64.powi(exp) {
        exp += 1;
    }
    while f64::from(max_abs) <= 448.0 * 2f64.powi(exp - 1) {
        exp -= 1;
    }
    Ok(2f32.powi(exp.clamp(-126, 127)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn named_constants_decode_to_spec_values() {
        assert_eq!(Fp8E4M3::MAX.to_f32(), 448.0);
        assert_eq!(Fp8E4M3::MIN.to_f32(), -448.0);
        assert_eq!(Fp8E4M3::MIN_POSITIVE.to_f32(), 2f32.powi(-6));
        assert_eq!(Fp8E4M3::MIN_POSITIVE_SUBNORMAL.to_f32(), 2f32.powi(-9));
        assert!(Fp8E4M3::NAN.to_f32().is_nan());
        assert!(Fp8E4M3::from_bits(0xff).is_nan());
        assert_eq!(Fp8E4M3::from_f32(-0.0).to_bits(), 0x80);
    }

    #[test]
    fn saturation_and_nan() {
        assert_eq!(Fp8E4M3::from_f32(f32::INFINITY), Fp8E4M3::MAX);
        assert_eq!(Fp8E4M3::from_f32(f32::NEG_INFINITY), Fp8E4M3::MIN);
        assert_eq!(Fp8E4M3::from_f32(-f32::MAX), Fp8E4M3::MIN);
        assert_eq!(Fp8E4M3::from_f32(-f32::NAN).to_bits(), 0xff);
    }

    #[test]
    fn slice_helpers_check_lengths() {
        let mut out = [Fp8E4M3::ZERO; 3];
        assert!(matches!(encode_slice(&[1.0; 2], &mut out), Err(Error::LengthMismatch { .. })));
        let mut back = [0.0f32; 2];
        assert!(decode_slice(&out, &mut back).is_err());
    }

    #[test]
    fn scale_puts_the_max_in_the_top_binade() {
        for &m in &[1e-30f32, 1e-3, 0.05, 1.0, 224.0, 448.0, 449.0, 1e4, 3e38] {
            let s = scale_for_max_abs(m).unwrap();
            let r = m / s;
            assert!(r <= 448.0 && r > 224.0, "max {m}: scale {s} gives {r}");
            assert_eq!(s.to_bits() & 0x7f_ffff, 0, "power of two");
        }
        assert!(scale_for_max_abs(f32::NAN).is_err());
        assert!(scale_for_max_abs(-1.0).is_err());
    }
}
