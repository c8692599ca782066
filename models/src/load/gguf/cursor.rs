//! A bounds-checked little-endian reader over the bytes of a GGUF file. Every read names
//! the field it is for, so a truncated file reports which field ran past the end.

use super::error::{GgufError, Result};

/// Reads fixed-width fields and length-prefixed strings from a byte slice.
pub(crate) struct Cursor<'a> {
    data: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    pub(crate) fn new(data: &'a [u8]) -> Self {
        Self { data, pos: 0 }
    }

    /// Current byte offset.
    pub(crate) fn pos(&self) -> usize {
        self.pos
    }

    /// Bytes left after the current offset.
    pub(crate) fn remaining(&self) -> usize {
        self.data.len() - self.pos
    }

    /// The next `n` bytes, or [`GgufError::Truncated`] naming `what`.
    pub(crate) fn take(&mut self, n: u64, what: &'static str) -> Result<&'a [u8]> {
        let available = self.remaining();
        let n_usize =
            usize::try_from(n).ok().filter(|&n| n <= available).ok_or(GgufError::Truncated {
                what,
                offset: self.pos as u64,
                needed: n,
                available: available as u64,
            })?;
        let out = &self.data[self.pos..self.pos + n_usize];
        self.pos += n_usize;
        Ok(out)
    }

    fn array<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N]> {
        let bytes = self.take(N as u64, what)?;
        let mut out = [0u8; N];
        out.copy_from_slice(bytes);
        Ok(out)
    }

    pub(crate) fn u8(&mut self, what: &'static str) -> Result<u8> {
        Ok(self.array::<1>(what)?[0])
    }

    pub(crate) fn u16(&mut self, what: &'static str) -> Result<u16> {
        Ok(u16::from_le_bytes(self.array(what)?))
    }

    pub(crate) fn u32(&mut self, what: &'static str) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    pub(crate) fn u64(&mut self, what: &'static str) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    pub(crate) fn f32(&mut self, what: &'static str) -> Result<f32> {
        Ok(f32::from_le_bytes(self.array(what)?))
    }

    pub(crate) fn f64(&mut self, what: &'static str) -> Result<f64> {
        Ok(f64::from_le_bytes(self.array(what)?))
    }

    /// A GGUF string: u64 byte length, then that many UTF-8 bytes.
    pub(crate) fn string(&mut self, what: &'static str) -> Result<String> {
        let start = self.pos;
        let len = self.u64(what)?;
        let bytes = self.take(len, what)?;
        std::str::from_utf8(bytes).map(str::to_owned).map_err(|e| GgufError::Invalid {
            what: what.to_string(),
            offset: start as u64,
            reason: format!("string is not UTF-8: {e}"),
        })
    }
}
