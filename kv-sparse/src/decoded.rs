//! Row histories a kernel reads one row at a time through a decoder: [`DecodeRows`], the
//! borrowed side (keys or values) of a history whose rows are codes with shared parameters —
//! KIVI's per-channel key groups and per-token value groups ([`crate::kivi`]) and the
//! TurboQuant-style unit-vector codes ([`crate::turbo`]) — and the bit packing they share.
//!
//! [`RowCodes`] describes where a side's codes lie so that kernels read them in place.
//!
//! A decoded row is exact given the stored bytes (the f16 parameters widened, times the
//! code, plus the zero point), so every kernel and the f64 reference see the same numbers.

use half::f16;

use crate::{Error, Result};

/// Which side of a history a store holds: keys or values (a format may code them
/// differently, as KIVI groups keys along tokens and values along channels).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Side {
    /// Key rows.
    #[default]
    Keys,
    /// Value rows.
    Values,
}

/// One side (keys or values) of a coded history, read row by row.
pub trait DecodeRows: Sync {
    /// Elements per row.
    fn head_dim(&self) -> usize;

    /// Rows held.
    fn num_rows(&self) -> usize;

    /// Writes row `j` (`j < num_rows`) into `out` (`head_dim` elements).
    ///
    /// # Panics
    /// May panic if `j` or `out.len()` is out of range; [`DecodeRows::decode_into`] checks
    /// both.
    fn decode_row(&self, j: usize, out: &mut [f32]);

    /// [`DecodeRows::decode_row`] with the row index and length checked.
    ///
    /// # Errors
    /// [`Error::OutOfRange`] for `j ≥ num_rows`; [`Error::LengthMismatch`] for an `out`
    /// that is not `head_dim` long.
    fn decode_into(&self, j: usize, out: &mut [f32]) -> Result<()> {
        const OP: &str = "DecodeRows::decode_into";
        if j >= self.num_rows() {
            return Err(Error::OutOfRange { op: OP, what: "row", index: j, len: self.num_rows() });
        }
        if out.len() != self.head_dim() {
            let (expected, got) = (self.head_dim(), out.len());
            return Err(Error::LengthMismatch { op: OP, what: "out", expected, got });
        }
        self.decode_row(j, out);
        Ok(())
    }

    /// Where the rows' codes lie, for kernels that read them in place; `None` (the default)
    /// has kernels read the rows through [`DecodeRows::decode_row`].
    fn codes(&self) -> Option<RowCodes<'_>> {
        None
    }
}

/// A borrowed decoder decodes as the decoder it borrows (its layout included), so trait
/// objects and references go where a decoder does.
impl<T: DecodeRows + ?Sized> DecodeRows for &T {
    fn head_dim(&self) -> usize {
        (**self).head_dim()
    }

    fn num_rows(&self) -> usize {
        (**self).num_rows()
    }

    fn decode_row(&self, j: usize, out: &mut [f32]) {
        (**self).decode_row(j, out);
    }

    fn codes(&self) -> Option<RowCodes<'_>> {
        (**self).codes()
    }
}

/// Where one side's codes lie and how they decode — what a kernel needs to read them in
/// place (scores and value sums formed from the codes and their shared parameters) instead
/// of through [`DecodeRows::decode_row`]. Codes are packed LSB-first ([`packed_bytes`]);
/// parameters are little-endian f16.
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
pub enum RowCodes<'a> {
    /// Rows of `[f16 norm][d codes]`; element `c` = `norm · levels[code_c]`
    /// (TurboQuant-style rows, [`crate::turbo`]).
    Codebook {
        /// Bits per code.
        bits: usize,
        /// The `2^bits` levels, ascending.
        levels: &'a [f32],
        /// The rows.
        bytes: &'a [u8],
    },
    /// Rows of `[f16 norm][f16 γ][d codes][d sign bits]`; element `c` =
    /// `norm · (levels[code_c] + √(π/2)/d · γ · Σ_i sketch[i][c] · sign_i)`, `sign_i = ±1`
    /// (TurboQuant's inner-product keys with the QJL sketch, [`crate::turbo::TurboQjlRows`]).
    CodebookSketch {
        /// Bits per code.
        bits: usize,
        /// The `2^bits` levels, ascending.
        levels: &'a [f32],
        /// The `d × d` sketch matrix, row-major.
        sketch: &'a [f32],
        /// The rows.
        bytes: &'a [u8],
    },
    /// Groups of `group` rows, each `[d × (f16 scale, f16 zero)]` then its `group` rows of
    /// codes; element `c` of a row = `zero_c + scale_c · code_c`; then rows waiting in f16
    /// (KIVI's keys, per channel over token groups, [`crate::kivi`]).
    TokenGroups {
        /// Bits per code.
        bits: usize,
        /// Rows per group.
        group: usize,
        /// The complete groups.
        bytes: &'a [u8],
        /// Rows in `bytes` (a multiple of `group`).
        coded: usize,
        /// Rows after the coded ones, exact in f16, row-major.
        waiting: &'a [half::f16],
    },
    /// Rows of `[d/group × (f16 scale, f16 zero)][d codes]`; element `c` =
    /// `zero_g + scale_g · code_c` with `g = c / group` (KIVI's values, per token over
    /// channel groups).
    ChannelGroups {
        /// Bits per code.
        bits: usize,
        /// Channels per group.
        group: usize,
        /// The rows.
        bytes: &'a [u8],
    },
}

impl RowCodes<'_> {
    /// Checks that the layout describes `rows` rows of `head_dim` elements exactly: codes of
    /// 1–8 bits filling whole bytes per row, `2^bits` levels, groups dividing what they
    /// group, byte lengths that tile the rows.
    ///
    /// # Errors
    /// [`Error::InvalidCodeLayout`] naming the first violated rule.
    pub fn check(&self, op: &'static str, head_dim: usize, rows: usize) -> Result<()> {
        let d = head_dim;
        let (bits, format) = match *self {
            Self::Codebook { bits, .. } => (bits, "codebook rows"),
            Self::CodebookSketch { bits, .. } => (bits, "sketched codebook rows"),
            Self::TokenGroups { bits, .. } => (bits, "token-group rows"),
            Self::ChannelGroups { bits, .. } => (bits, "channel-group rows"),
        };
        let fail = |reason: String| Err(Error::InvalidCodeLayout { op, format, reason });
        if !(1..=8).contains(&bits) || d == 0 || d > crate::MAX_HEAD_DIM {
            return fail(format!("bits = {bits}, head_dim = {d}: expected 1..=8 and 1..=256"));
        }
        if !(d * bits).is_multiple_of(8) {
            return fail(format!("head_dim = {d} at {bits} bits is not a whole number of bytes"));
        }
        let cb = packed_bytes(d, bits);
        let (len, want) = match *self {
            Self::Codebook { levels, bytes, .. } => {
                if levels.len() != 1 << bits {
                    return fail(format!("{} levels, expected {}", levels.len(), 1 << bits));
                }
                (bytes.len(), self.row_bytes(d).and_then(|rb| rows.checked_mul(rb)))
            }
            Self::CodebookSketch { levels, sketch, bytes, .. } => {
                if levels.len() != 1 << bits || sketch.len() != d * d || !d.is_multiple_of(8) {
                    let (l, s) = (levels.len(), sketch.len());
                    return fail(format!(
                        "{l} levels, a sketch of {s}, head_dim {d}: expected {}, {}, a multiple of 8",
                        1 << bits,
                        d * d
                    ));
                }
                (bytes.len(), self.row_bytes(d).and_then(|rb| rows.checked_mul(rb)))
            }
            Self::TokenGroups { group, bytes, coded, waiting, .. } => {
                if group == 0 || !coded.is_multiple_of(group) {
                    return fail(format!("{coded} coded rows in groups of {group}"));
                }
                if coded.checked_add(waiting.len() / d) != Some(rows)
                    || !waiting.len().is_multiple_of(d)
                {
                    let w = waiting.len();
                    return fail(format!("{coded} coded + {w} waiting elements ≠ {rows} rows"));
                }
                (bytes.len(), (coded / group).checked_mul(4 * d + group * cb))
            }
            Self::ChannelGroups { group, bytes, .. } => {
                if group == 0 || !d.is_multiple_of(group) {
                    return fail(format!("group = {group} does not divide head_dim = {d}"));
                }
                (bytes.len(), self.row_bytes(d).and_then(|rb| rows.checked_mul(rb)))
            }
        };
        if want != Some(len) {
            return fail(format!("{len} bytes, expected {want:?} for {rows} rows"));
        }
        Ok(())
    }
}

impl RowCodes<'_> {
    /// Bytes of one row of a layout whose rows stand alone (codebook and channel-group
    /// rows) — what lets a store place rows anywhere (pages, slots); `None` for token groups,
    /// whose rows share their group's parameters.
    pub fn row_bytes(&self, head_dim: usize) -> Option<usize> {
        let d = head_dim;
        match *self {
            Self::Codebook { bits, .. } => Some(2 + packed_bytes(d, bits)),
            Self::CodebookSketch { bits, .. } => Some(4 + packed_bytes(d, bits) + d / 8),
            Self::ChannelGroups { bits, group, .. } => {
                Some(4 * d.checked_div(group)? + packed_bytes(d, bits))
            }
            Self::TokenGroups { .. } => None,
        }
    }

    /// Writes row `j` of a checked layout ([`RowCodes::check`]) of `out.len()`-element rows
    /// into `out`, exactly as the kernels read it: for tests, references and stores that
    /// decode a row or two (kernels read the codes in place).
    ///
    /// # Panics
    /// If `j` is not a row of the layout.
    pub fn decode_row(&self, j: usize, out: &mut [f32]) {
        let d = out.len();
        let f = |b: &[u8], i: usize| f16::from_le_bytes([b[2 * i], b[2 * i + 1]]).to_f32();
        with_scratch(d, |codes: &mut [u8]| match *self {
            Self::Codebook { bits, levels, bytes } => {
                let rb = 2 + packed_bytes(d, bits);
                let row = &bytes[j * rb..(j + 1) * rb];
                unpack_row(&row[2..], bits, codes);
                let norm = f(row, 0);
                for (o, &c) in out.iter_mut().zip(codes.iter()) {
                    *o = norm * levels[usize::from(c)];
                }
            }
            Self::CodebookSketch { bits, levels, sketch, bytes } => {
                let cb = packed_bytes(d, bits);
                let row = &bytes[j * (4 + cb + d / 8)..][..4 + cb + d / 8];
                unpack_row(&row[4..4 + cb], bits, codes);
                let (norm, k) = (f(row, 0), crate::turbo::sketch_scale(d) * f(row, 1));
                let signs = &row[4 + cb..];
                for (o, &c) in out.iter_mut().zip(codes.iter()) {
                    *o = levels[usize::from(c)];
                }
                for (i, s_row) in sketch.chunks_exact(d).enumerate() {
                    let sign = if signs[i / 8] >> (i % 8) & 1 == 1 { k } else { -k };
                    out.iter_mut().zip(s_row).for_each(|(o, s)| *o += sign * s);
                }
                out.iter_mut().for_each(|o| *o *= norm);
            }
            Self::TokenGroups { bits, group, bytes, coded, waiting } => {
                if j >= coded {
                    let w = &waiting[(j - coded) * d..(j - coded + 1) * d];
                    out.iter_mut().zip(w).for_each(|(o, x)| *o = x.to_f32());
                    return;
                }
                let cb = packed_bytes(d, bits);
                let base = &bytes[(j / group) * (4 * d + group * cb)..];
                unpack_row(&base[4 * d + (j % group) * cb..][..cb], bits, codes);
                for (c, o) in out.iter_mut().enumerate() {
                    *o = f(base, 2 * c + 1) + f(base, 2 * c) * f32::from(codes[c]);
                }
            }
            Self::ChannelGroups { bits, group, bytes } => {
                let params = 4 * (d / group);
                let rb = params + packed_bytes(d, bits);
                let row = &bytes[j * rb..(j + 1) * rb];
                unpack_row(&row[params..], bits, codes);
                for (c, o) in out.iter_mut().enumerate() {
                    let g = c / group;
                    *o = f(row, 2 * g + 1) + f(row, 2 * g) * f32::from(codes[c]);
                }
            }
        });
    }
}

/// Runs `f` on `n` elements of zeroed scratch: on the stack up to 256 elements (every head
/// size models use), on the heap beyond.
pub(crate) fn with_scratch<T: Copy + Default, R>(n: usize, f: impl FnOnce(&mut [T]) -> R) -> R {
    const STACK: usize = 256;
    if n <= STACK {
        let mut a = [T::default(); STACK];
        f(&mut a[..n])
    } else {
        f(&mut vec![T::default(); n])
    }
}

/// Unpacks the first `out.len()` codes of `bits` bits packed LSB-first in `bytes` (2, 4 and
/// 8 bits a byte at a time, 3 bits eight codes from three bytes at a time).
///
/// # Panics
/// If `bytes` holds fewer than `packed_bytes(out.len(), bits)` bytes or `bits` is not in
/// `1..=8`.
#[inline]
pub fn unpack_row(bytes: &[u8], bits: usize, out: &mut [u8]) {
    assert!((1..=8).contains(&bits) && bytes.len() >= packed_bytes(out.len(), bits));
    match bits {
        8 => out.copy_from_slice(&bytes[..out.len()]),
        4 => {
            let (pairs, rest) = out.as_chunks_mut::<2>();
            for (o, &b) in pairs.iter_mut().zip(bytes) {
                *o = [b & 0x0F, b >> 4];
            }
            if let Some(o) = rest.first_mut() {
                *o = bytes[pairs.len()] & 0x0F;
            }
        }
        2 => {
            let (quads, rest) = out.as_chunks_mut::<4>();
            for (o, &b) in quads.iter_mut().zip(bytes) {
                *o = [b & 3, (b >> 2) & 3, (b >> 4) & 3, b >> 6];
            }
            let base = quads.len() * 4;
            for (i, o) in rest.iter_mut().enumerate() {
                *o = unpack(bytes, 2, base + i);
            }
        }
        3 => {
            // Eight codes in three bytes.
            let (octets, rest) = out.as_chunks_mut::<8>();
            for (o, b) in octets.iter_mut().zip(bytes.chunks_exact(3)) {
                let w = u32::from(b[0]) | u32::from(b[1]) << 8 | u32::from(b[2]) << 16;
                for (k, x) in o.iter_mut().enumerate() {
                    *x = (w >> (3 * k) & 7) as u8;
                }
            }
            let base = octets.len() * 8;
            for (i, o) in rest.iter_mut().enumerate() {
                *o = unpack(bytes, 3, base + i);
            }
        }
        _ => {
            for (i, o) in out.iter_mut().enumerate() {
                *o = unpack(bytes, bits, i);
            }
        }
    }
}

/// Bytes of `n` codes of `bits` bits packed LSB-first.
pub const fn packed_bytes(n: usize, bits: usize) -> usize {
    (n * bits).div_ceil(8)
}

/// Packs `codes` (each below `2^bits`) LSB-first into `out` (`packed_bytes(codes, bits)`
/// bytes, overwritten).
pub(crate) fn pack(codes: &[u8], bits: usize, out: &mut [u8]) {
    out.fill(0);
    for (i, &c) in codes.iter().enumerate() {
        let bit = i * bits;
        let (byte, shift) = (bit / 8, bit % 8);
        let wide = u16::from(c) << shift;
        out[byte] |= wide as u8;
        if shift + bits > 8 {
            out[byte + 1] |= (wide >> 8) as u8;
        }
    }
}

/// Code `i` of codes of `bits` bits packed LSB-first in `bytes`.
#[inline]
pub(crate) fn unpack(bytes: &[u8], bits: usize, i: usize) -> u8 {
    let bit = i * bits;
    let (byte, shift) = (bit / 8, bit % 8);
    let lo = u16::from(bytes[byte]);
    let hi = if shift + bits > 8 { u16::from(bytes[byte + 1]) << 8 } else { 0 };
    (((lo | hi) >> shift) & ((1 << bits) - 1)) as u8
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packing_round_trips_every_width() {
        for bits in 1..=8 {
            let codes: Vec<u8> = (0..37).map(|i| ((i * 7 + 3) % (1 << bits)) as u8).collect();
            let mut packed = vec![0xFF; packed_bytes(codes.len(), bits)];
            pack(&codes, bits, &mut packed);
            let back: Vec<u8> = (0..codes.len()).map(|i| unpack(&packed, bits, i)).collect();
            assert_eq!(back, codes, "{bits} bits");
        }
        assert_eq!(packed_bytes(64, 3), 24);
    }

    #[test]
    fn row_unpacking_matches_code_by_code() {
        for bits in 1..=8 {
            for n in [1, 3, 8, 31, 64] {
                let codes: Vec<u8> = (0..n).map(|i| ((i * 5 + 1) % (1 << bits)) as u8).collect();
                let mut packed = vec![0; packed_bytes(n, bits)];
                pack(&codes, bits, &mut packed);
                let mut out = vec![0xAA; n];
                unpack_row(&packed, bits, &mut out);
                assert_eq!(out, codes, "{bits} bits, {n} codes");
            }
        }
    }

    /// The stores' own layouts pass; every broken rule is a typed error.
    #[test]
    fn layouts_are_checked_against_the_rows() {
        use crate::kivi::KiviRows;
        use crate::turbo::TurboRows;
        let x: Vec<f32> = (0..40 * 32).map(|i| (i % 17) as f32 - 8.0).collect();
        let mut t = TurboRows::<3>::new(32).unwrap();
        t.push(&x).unwrap();
        let v = t.view();
        v.codes().unwrap().check("t", 32, 40).unwrap();
        assert!(v.codes().unwrap().check("t", 32, 39).is_err());
        assert!(v.codes().unwrap().check("t", 64, 20).is_err());
        for side in [Side::Keys, Side::Values] {
            let mut k = KiviRows::<2>::new(side, 32, 8).unwrap();
            k.push(&x).unwrap();
            k.view().codes().unwrap().check("k", 32, 40).unwrap();
            assert!(k.view().codes().unwrap().check("k", 32, 41).is_err());
        }
        let bad = [
            RowCodes::Codebook { bits: 3, levels: &[0.0; 4], bytes: &[] },
            RowCodes::Codebook { bits: 9, levels: &[], bytes: &[] },
            RowCodes::TokenGroups { bits: 2, group: 3, bytes: &[], coded: 4, waiting: &[] },
            RowCodes::ChannelGroups { bits: 2, group: 5, bytes: &[] },
        ];
        for b in bad {
            assert!(matches!(b.check("x", 32, 0), Err(Error::InvalidCodeLayout { .. })), "{b:?}");
        }
    }

    /// A layout's own row decode equals its store's decoder, for every code family, and the
    /// per-row encoders write the rows those stores write.
    #[test]
    fn layout_decode_matches_the_stores() {
        use crate::kivi::KiviRows;
        use crate::turbo::{TurboQjlRows, TurboRows};
        let d = 32;
        let rows: Vec<f32> =
            (0..d * 40).map(|i| ((i * 7919 % 211) as f32 / 50.0 - 2.1) * 1.3).collect();
        let mut kivi_k = KiviRows::<2>::new(Side::Keys, d, 8).unwrap();
        let mut kivi_v = KiviRows::<4>::new(Side::Values, d, 8).unwrap();
        let mut turbo = TurboRows::<3>::new(d).unwrap();
        let mut qjl = TurboQjlRows::<3>::new(Side::Keys, d).unwrap();
        kivi_k.push(&rows).unwrap();
        kivi_v.push(&rows).unwrap();
        turbo.push(&rows).unwrap();
        qjl.push(&rows).unwrap();
        let (kk, kv, tv, qv) = (kivi_k.view(), kivi_v.view(), turbo.view(), qjl.view());
        let views: [&dyn DecodeRows; 4] = [&kk, &kv, &tv, &qv];
        let (mut a, mut b) = (vec![0.0; d], vec![0.0; d]);
        for v in views {
            let codes = v.codes().unwrap();
            codes.check("test", d, v.num_rows()).unwrap();
            for j in 0..v.num_rows() {
                v.decode_row(j, &mut a);
                codes.decode_row(j, &mut b);
                assert_eq!(a, b, "{codes:?} row {j}");
            }
        }
        let levels = crate::turbo::codebook(d, 3);
        let mut row = vec![0u8; TurboRows::<3>::row_bytes(d)];
        crate::turbo::encode_row(3, &levels, &rows[5 * d..6 * d], &mut row).unwrap();
        assert_eq!(row, turbo.bytes()[5 * row.len()..6 * row.len()]);
        let (levels, sketch) = (crate::turbo::codebook(d, 2), crate::turbo::sketch(d));
        let mut row = vec![0u8; 4 + d / 4 + d / 8];
        crate::turbo::encode_qjl_key_row(3, (&levels, &sketch), &rows[5 * d..6 * d], &mut row)
            .unwrap();
        assert_eq!(row, qjl.bytes()[5 * row.len()..6 * row.len()]);
        let RowCodes::ChannelGroups { bytes, .. } = kv.codes().unwrap() else { panic!() };
        let mut row = vec![0u8; 4 * d / 8 + d / 2];
        crate::kivi::encode_token_row(4, 8, &rows[5 * d..6 * d], &mut row).unwrap();
        assert_eq!(row, bytes[5 * row.len()..6 * row.len()]);
        let bad = crate::kivi::encode_token_row(8, 5, &rows[..d], &mut row);
        assert!(matches!(bad, Err(Error::InvalidCodeLayout { .. })));
        let mut nan = rows[..d].to_vec();
        nan[3] = f32::NAN;
        assert!(crate::turbo::encode_row(3, &levels, &nan, &mut [0; 14]).is_err());
    }
}
