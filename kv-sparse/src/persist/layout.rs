//! Where each head's sections lie in a cache file, computed from its counts with checked
//! arithmetic. Writer and reader share this one function, so offsets are never stored,
//! only derived — and a hostile count can only produce a layout that fails the
//! "fits the file" check, never an out-of-bounds slice.
//!
//! Per head, in order (each section starting at a multiple of [`SECTION_ALIGN`]):
//! * CSR hybrid: key CSR (block bases u64, row offsets u16, indices, values), value CSR
//!   (same four), buffer keys, buffer values (dense rows in token order) — SWAN's CSR
//!   rows ("Memory footprint") and dense buffer (Algorithm 1) one-to-one;
//! * coded hybrid: key rows (block bases u64, row offsets u16, row bytes), value rows
//!   (same three), buffer keys, buffer values;
//! * dense or quantized rows: key rows, value rows;
//! * whole-row hybrid: key codes, keys waiting in f16 (KIVI), value codes, buffer keys,
//!   buffer values.
//!
//! Before the heads, after the directory: the head-checksum table (version 3 on: one
//! little-endian `u32` CRC-32 per head), the identity block and the extra block. Head `h`'s
//! checksum covers the bytes from the end of head `h - 1` (or of the extra block) to the
//! end of its last section, padding included, so the heads' spans tile the file after the
//! metadata and a reader can check one head without reading the others.

use std::ops::Range;

use super::header::{
    CacheLayout, ENTRY_BYTES, FileFormat, HEADER_BYTES, HeadEntry, SECTION_ALIGN, corrupt,
};
use crate::Result;
use crate::decoded::Side;
use crate::hybrid::HistoryFormat;

/// Where the metadata after the header lies: directory, head-checksum table and blocks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct MetaLayout {
    /// The directory (one entry per head).
    pub directory: Range<usize>,
    /// The head-checksum table (empty before version 3).
    pub head_crcs: Range<usize>,
    /// The identity block.
    pub identity: Range<usize>,
    /// The extra block.
    pub extra: Range<usize>,
    /// The end of the metadata, where the first head's span starts.
    pub end: u64,
}

/// Places the metadata of `format` within `limit` bytes (checked arithmetic).
pub(crate) fn place_meta(format: &FileFormat, limit: u64) -> Result<MetaLayout> {
    let heads = format.heads();
    let dir_end =
        heads.checked_mul(ENTRY_BYTES as u64).and_then(|d| d.checked_add(HEADER_BYTES as u64));
    let Some(dir_end) = dir_end.filter(|&end| end <= limit) else {
        return Err(corrupt(format!(
            "a directory of {heads} heads does not fit the {limit}-byte file"
        )));
    };
    let mut p = Placer { cursor: dir_end, limit };
    let crcs = if format.has_head_crcs() { heads } else { 0 };
    let head_crcs = p.place("head checksums", crcs, 4)?;
    let identity = p.place("identity block", format.identity_bytes, 1)?;
    let extra = p.place("extra block", format.extra_bytes, 1)?;
    // `dir_end <= limit <= usize::MAX` (the limit is a real buffer's length, or u64::MAX
    // for a writer's plan, whose directory is a real Vec).
    let directory = HEADER_BYTES..dir_end as usize;
    Ok(MetaLayout { directory, head_crcs, identity, extra, end: p.cursor })
}

/// Byte ranges of one side's sparse rows. CSR rows use all four; coded rows keep their
/// bytes in `values` and leave `indices` empty; dense heads leave all four empty.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct RowSections {
    pub bases: Range<usize>,
    pub offsets: Range<usize>,
    pub indices: Range<usize>,
    pub values: Range<usize>,
}

/// Byte ranges of one head's sections (`dense_*`: the hybrid buffer, or all rows of a
/// dense / quantized head).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct HeadLayout {
    pub keys: RowSections,
    pub values: RowSections,
    pub dense_keys: Range<usize>,
    pub dense_values: Range<usize>,
}

impl HeadLayout {
    /// The sections of `layout` in file order (what a writer emits, one part each).
    pub(crate) fn ordered(&self, layout: &CacheLayout) -> Vec<Range<usize>> {
        let mut out = Vec::with_capacity(10);
        for s in [&self.keys, &self.values] {
            match layout {
                CacheLayout::Csr { .. } => {
                    out.extend([&s.bases, &s.offsets, &s.indices, &s.values].map(Clone::clone))
                }
                CacheLayout::Coded { .. } => {
                    out.extend([&s.bases, &s.offsets, &s.values].map(Clone::clone))
                }
                CacheLayout::Rows { .. } => out.extend([&s.values, &s.indices].map(Clone::clone)),
                _ => {}
            }
        }
        out.extend([self.dense_keys.clone(), self.dense_values.clone()]);
        out
    }
}

/// A cursor that places aligned sections and refuses to pass `limit`.
pub(crate) struct Placer {
    pub cursor: u64,
    pub limit: u64,
}

impl Placer {
    pub(crate) fn place(
        &mut self,
        what: &str,
        count: u64,
        elem_bytes: u64,
    ) -> Result<Range<usize>> {
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

    fn csr(&mut self, rows: u64, nnz: u64, rpb: u64, format: &FileFormat) -> Result<RowSections> {
        let CacheLayout::Csr { index_bytes, value, .. } = format.layout else {
            unreachable!("csr sections are placed for CSR files only");
        };
        let blocks = rows.div_ceil(rpb.max(1));
        Ok(RowSections {
            bases: self.place("block bases", blocks, 8)?,
            offsets: self.place("row offsets", rows, 2)?,
            indices: self.place("indices", nnz, index_bytes as u64)?,
            values: self.place("values", nnz, value.bytes() as u64)?,
        })
    }

    fn coded(&mut self, rows: u64, bytes: u64, rpb: u64) -> Result<RowSections> {
        let blocks = rows.div_ceil(rpb.max(1));
        let bases = self.place("block bases", blocks, 8)?;
        let offsets = self.place("row offsets", rows, 2)?;
        let values = self.place("row bytes", bytes, 1)?;
        Ok(RowSections { bases, offsets, indices: values.start..values.start, values })
    }

    /// A whole-row history: key codes, the keys waiting in f16 (their count is what the
    /// key codes leave of the history rows), value codes (all of its rows). Coded rows
    /// keep their bytes in `values`; waiting keys lie in the key side's `indices` (the
    /// value side's is empty, at the end of its codes).
    fn whole_rows(
        &mut self,
        entry: &HeadEntry,
        history: HistoryFormat,
        d: usize,
    ) -> Result<(RowSections, RowSections)> {
        let rpb = entry.rows_per_block as usize;
        let rows = |side, bytes: u64, what| {
            usize::try_from(bytes)
                .ok()
                .and_then(|b| history.coded_rows(side, d, rpb, b))
                .ok_or_else(|| {
                    corrupt(format!("{bytes} {what} bytes are not whole {history} units"))
                })
        };
        let coded = rows(Side::Keys, entry.key_nnz, "key")? as u64;
        let waiting = entry.sparse_rows.checked_sub(coded).ok_or_else(|| {
            corrupt(format!("{coded} coded key rows exceed {} history rows", entry.sparse_rows))
        })?;
        if rows(Side::Values, entry.value_nnz, "value")? as u64 != entry.sparse_rows {
            return Err(corrupt(format!(
                "value codes do not hold the {} history rows",
                entry.sparse_rows
            )));
        }
        let key_codes = self.place("key codes", entry.key_nnz, 1)?;
        let waiting = waiting
            .checked_mul(d as u64)
            .ok_or_else(|| corrupt(format!("{waiting} waiting rows overflow")))?;
        let waiting = self.place("waiting keys", waiting, 2)?;
        let value_codes = self.place("value codes", entry.value_nnz, 1)?;
        let keys = RowSections { indices: waiting, values: key_codes, ..RowSections::default() };
        let end = value_codes.end..value_codes.end;
        Ok((keys, RowSections { indices: end, values: value_codes, ..RowSections::default() }))
    }

    fn rows(&mut self, what: [&str; 2], rows: u64, row_bytes: u64) -> Result<[Range<usize>; 2]> {
        Ok([self.place(what[0], rows, row_bytes)?, self.place(what[1], rows, row_bytes)?])
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
    let d = format.head_dim as u64;
    let dense_row = |rows: u64, elem: usize| {
        rows.checked_mul(d)
            .map(|n| (n, elem as u64))
            .ok_or_else(|| corrupt(format!("{rows} dense rows overflow")))
    };
    let rpb = u64::from(entry.rows_per_block);
    let (keys, values, dense) = match format.layout {
        CacheLayout::Csr { dense, .. } => {
            let keys = p.csr(entry.sparse_rows, entry.key_nnz, rpb, format)?;
            let values = p.csr(entry.sparse_rows, entry.value_nnz, rpb, format)?;
            (keys, values, dense_row(entry.buffer_rows, dense.bytes())?)
        }
        CacheLayout::Coded { dense, .. } => {
            let keys = p.coded(entry.sparse_rows, entry.key_nnz, rpb)?;
            let values = p.coded(entry.sparse_rows, entry.value_nnz, rpb)?;
            (keys, values, dense_row(entry.buffer_rows, dense.bytes())?)
        }
        CacheLayout::Dense { format: f } => (
            RowSections::default(),
            RowSections::default(),
            dense_row(entry.buffer_rows, f.bytes())?,
        ),
        CacheLayout::Quant { format: f } => {
            let rb = f.row_bytes(format.head_dim) as u64;
            (RowSections::default(), RowSections::default(), (entry.buffer_rows, rb))
        }
        CacheLayout::Rows { history, dense } => {
            let (keys, values) = p.whole_rows(entry, history, format.head_dim)?;
            (keys, values, dense_row(entry.buffer_rows, dense.bytes())?)
        }
    };
    let what = if format.layout.is_hybrid() {
        ["buffer keys", "buffer values"]
    } else {
        ["key rows", "value rows"]
    };
    let [dense_keys, dense_values] = p.rows(what, dense.0, dense.1)?;
    Ok((HeadLayout { keys, values, dense_keys, dense_values }, p.cursor))
}
