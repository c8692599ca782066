//! Row histories a kernel reads one row at a time through a decoder: [`DecodeRows`], the
//! borrowed side (keys or values) of a history whose rows are codes with shared parameters —
//! KIVI's per-channel key groups and per-token value groups ([`crate::kivi`]) and the
//! TurboQuant-style unit-vector codes ([`crate::turbo`]) — and the bit packing they share.
//!
//! A decoded row is exact given the stored bytes (the f16 parameters widened, times the
//! code, plus the zero point), so every kernel and the f64 reference see the same numbers.

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
}
