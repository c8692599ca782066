//! Structured byte mutations of valid files, for the in-tree property fuzzing
//! (`integration-tests/tests/fuzz_parsers.rs`): the same operators libFuzzer applies
//! (bit flips, byte and word overwrites with "interesting" values, truncation,
//! insertion, deletion, in-file copies), written out so a proptest strategy can
//! generate and shrink them.
//!
//! Positions are taken modulo the current length, so every mutation applies to any
//! input (an empty input only grows by insertion).

/// Values that tend to hit boundaries in length and count fields: zero, one, the
/// extremes of each width, sign bits, and sizes just past what a small file holds.
pub const INTERESTING: [u64; 18] = [
    0,
    1,
    2,
    7,
    8,
    64,
    0x7f,
    0x80,
    0xff,
    0x100,
    0xffff,
    0x1_0000,
    0x7fff_ffff,
    0x8000_0000,
    0xffff_ffff,
    1 << 40,
    i64::MAX as u64,
    u64::MAX,
];

/// One edit of a byte string.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Mutation {
    /// Flip bit `bit % 8` of byte `at`.
    FlipBit {
        /// Byte position (modulo the length).
        at: usize,
        /// Bit index (modulo 8).
        bit: u8,
    },
    /// Overwrite byte `at` with `value`.
    SetByte {
        /// Byte position (modulo the length).
        at: usize,
        /// New value.
        value: u8,
    },
    /// Overwrite a little-endian word of `width` bytes (1, 2, 4 or 8) at `at`, clipped to
    /// the end of the input.
    SetWord {
        /// Byte position (modulo the length).
        at: usize,
        /// Word width selector (`1 << (width % 4)` bytes).
        width: u8,
        /// Value written (low bytes first).
        value: u64,
    },
    /// Keep only the first `len % (length + 1)` bytes.
    Truncate {
        /// New length (modulo length + 1).
        len: usize,
    },
    /// Insert `bytes` before position `at`.
    Insert {
        /// Position (modulo length + 1).
        at: usize,
        /// Bytes inserted.
        bytes: Vec<u8>,
    },
    /// Remove up to `len` bytes starting at `at`.
    Remove {
        /// Start (modulo the length).
        at: usize,
        /// Bytes removed (clipped to the end).
        len: usize,
    },
    /// Copy up to `len` bytes from `from` over the bytes at `to`.
    CopyWithin {
        /// Source start (modulo the length).
        from: usize,
        /// Destination start (modulo the length).
        to: usize,
        /// Bytes copied (clipped to both ends).
        len: usize,
    },
}

impl Mutation {
    /// Applies the edit to `data`.
    pub fn apply(&self, data: &mut Vec<u8>) {
        let n = data.len();
        match *self {
            Mutation::Insert { at, ref bytes } => {
                let at = at % (n + 1);
                data.splice(at..at, bytes.iter().copied());
            }
            Mutation::Truncate { len } => data.truncate(len % (n + 1)),
            _ if n == 0 => {}
            Mutation::FlipBit { at, bit } => data[at % n] ^= 1 << (bit % 8),
            Mutation::SetByte { at, value } => data[at % n] = value,
            Mutation::SetWord { at, width, value } => {
                let at = at % n;
                let width = (1usize << (width % 4)).min(n - at);
                data[at..at + width].copy_from_slice(&value.to_le_bytes()[..width]);
            }
            Mutation::Remove { at, len } => {
                let at = at % n;
                data.drain(at..at + len.min(n - at));
            }
            Mutation::CopyWithin { from, to, len } => {
                let (from, to) = (from % n, to % n);
                let len = len.min(n - from).min(n - to);
                data.copy_within(from..from + len, to);
            }
        }
    }
}

/// `seed` with every mutation of `edits` applied in order.
pub fn mutated(seed: &[u8], edits: &[Mutation]) -> Vec<u8> {
    let mut data = seed.to_vec();
    for m in edits {
        m.apply(&mut data);
    }
    data
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_operator_edits_in_bounds() {
        let base = vec![0u8, 1, 2, 3, 4, 5, 6, 7];
        let cases = [
            (Mutation::FlipBit { at: 9, bit: 9 }, vec![0u8, 3, 2, 3, 4, 5, 6, 7]),
            (
                Mutation::SetWord { at: 6, width: 3, value: u64::MAX },
                vec![0, 1, 2, 3, 4, 5, 255, 255],
            ),
            (Mutation::Truncate { len: 12 }, vec![0, 1, 2]),
            (Mutation::Remove { at: 6, len: 5 }, vec![0, 1, 2, 3, 4, 5]),
            (Mutation::CopyWithin { from: 0, to: 6, len: 4 }, vec![0, 1, 2, 3, 4, 5, 0, 1]),
        ];
        for (m, want) in cases {
            assert_eq!(mutated(&base, std::slice::from_ref(&m)), want, "{m:?}");
        }
        let grown = mutated(
            &[],
            &[Mutation::SetByte { at: 3, value: 1 }, Mutation::Insert { at: 5, bytes: vec![9, 9] }],
        );
        assert_eq!(grown, [9, 9]);
    }
}
