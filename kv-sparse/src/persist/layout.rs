//! Where each head's sections lie in a cache file, computed from its counts with checked
//! arithmetic. Writer and reader share this one function, so offsets are never stored,
//! only derived — and a hostile count can only produce a layout that fails the
//! "fits the file" check, never an out-of-bounds slice.
//!
//! Per head, in order (each section starting at a multiple of [`SECTION_ALIGN`]):
//! key CSR (block bases u64, row offsets u16, indices, values), value CSR (same four),
//! buffer keys, buffer values (dense rows in token order). SWAN's CSR rows ("Memory
//! footprint") and dense buffer (Algorithm 1) map one-to-one onto these sections.

use std::ops::Range;

use super::header::{FileFormat, HeadEntry, SECTION_ALIGN, corrupt};
use crate::Result;

/// Byte ranges of one CSR store's four arrays.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct CsrSections {
    pub bases: Range<usize>,
    pub offsets: Range<usize>,
    pub indices: Range<usize>,
    pub values: Range<usize>,
}

/// Byte ranges of one head's sections.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct HeadLayout {
    pub keys: CsrSections,
    pub values: CsrSections,
    pub buffer_keys: Range<usize>,
    pub buffer_values: Range<usize>,
}

/// A cursor that places aligned sections and refuses to pass `limit`.
struct Placer {
    cursor: u64,
    limit: u64,
}

impl Placer {
    fn place(&mut self, what: &str, count: u64, elem_bytes: u64) -> Result<Range<usize>> {
        let start = self.cursor.div_ceil(SECTION_ALIGN).checked_mul(SECTION_ALIGN);
        let end = count.checked_mul(elem_bytes).and_then(|len| start?.checked_add(len));
        match (start, end) {
            (Some(start), Some(end)) if end <= self.limit => {
                self.cursor = end;
                // `end <= limit <= usize::MAX` (the limit is a real buffer's length).
                Ok(start as usize..end as usize)
            }
            _ => Err(corrupt(format!(
                "{what}: {count} elements of {elem_bytes} bytes at offset {} do not fit the {}-byte file",
                self.cursor, self.limit
            ))),
        }
    }

    fn csr(
        &mut self,
        rows: u64,
        nnz: u64,
        rows_per_block: u64,
        format: &FileFormat,
    ) -> Result<CsrSections> {
        let blocks = rows.div_ceil(rows_per_block.max(1));
        Ok(CsrSections {
            bases: self.place("block bases", blocks, 8)?,
            offsets: self.place("row offsets", rows, 2)?,
            indices: self.place("indices", nnz, format.index_bytes as u64)?,
            values: self.place("values", nnz, format.value.bytes() as u64)?,
        })
    }
}

/// Places one head's sections after byte `start`, within `limit` bytes. Returns the
/// layout and the end of its last section.
pub(crate) fn place_head(
    entry: &HeadEntry,
    format: &FileFormat,
    start: u64,
    limit: u64,
) -> Result<(HeadLayout, u64)> {
    let mut p = Placer { cursor: start, limit };
    let rpb = u64::from(entry.rows_per_block);
    let keys = p.csr(entry.sparse_rows, entry.key_nnz, rpb, format)?;
    let values = p.csr(entry.sparse_rows, entry.value_nnz, rpb, format)?;
    let dense = entry.buffer_rows.checked_mul(format.head_dim as u64);
    let dense =
        dense.ok_or_else(|| corrupt(format!("{} buffer rows overflow", entry.buffer_rows)))?;
    let dense_bytes = format.dense.bytes() as u64;
    let buffer_keys = p.place("buffer keys", dense, dense_bytes)?;
    let buffer_values = p.place("buffer values", dense, dense_bytes)?;
    Ok((HeadLayout { keys, values, buffer_keys, buffer_values }, p.cursor))
}
