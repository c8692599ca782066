//! Fixed-size binary records of the cache file: the [`FileHeader`] and one [`HeadEntry`]
//! per (layer, kv-head). Both are `#[repr(C)]` plain old data with compile-time size
//! checks, read and written as little-endian bytes via `bytemuck`.
//!
//! They persist the state of SWAN's hybrid cache (method section, Algorithm 1) — the
//! sparse history's counts and the dense buffer's fill, plus each head's configuration —
//! and, since version 2, the row counts of dense and dense-quantized caches, the
//! [`CacheLayout`] naming which of these a file holds, and the lengths of two opaque
//! blocks the caller fills (identity and state). Since version 3 the header's payload
//! checksum covers only the metadata (directory, head-checksum table, blocks); each head's
//! bytes have their own CRC-32 in the table after the directory.

use bytemuck::{Pod, Zeroable};

use crate::coded::{IndexKind, ValueKind};
use crate::hybrid::{HistoryFormat, HybridConfig, NonFinitePolicy, RowStore};
use crate::quant::DenseFormat;
use crate::{Error, Result, ValueFormat};

/// File magic: the first eight bytes of every cache file.
pub const MAGIC: [u8; 8] = *b"KVSPARSE";
/// The format version this build writes (3: per-head checksums).
pub const VERSION: u32 = 3;
/// The oldest format version this build still reads (version 1: CSR hybrid caches only).
pub const OLDEST_VERSION: u32 = 1;
/// Byte order marker, written natively: reads back differently on a foreign-endian host.
pub(crate) const ENDIAN_MARK: u32 = 0x0102_0304;
/// Every section starts at a multiple of this many bytes.
pub const SECTION_ALIGN: u64 = 64;
/// Size of [`FileHeader`].
pub(crate) const HEADER_BYTES: usize = 128;
/// Size of [`HeadEntry`].
pub(crate) const ENTRY_BYTES: usize = 64;

const OP: &str = "MappedCache::open";

/// The 128-byte file header. Version 1 wrote `layout`, `identity_bytes` and
/// `extra_bytes` as zero (reserved), which reads as a CSR file without blocks.
/// `payload_crc32` covers every byte after the header in versions 1 and 2, and the bytes
/// from the header's end to the end of the extra block (directory, head-checksum table,
/// identity and extra blocks) in version 3.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub(crate) struct FileHeader {
    pub magic: [u8; 8],
    pub version: u32,
    pub header_bytes: u32,
    pub endian: u32,
    pub head_dim: u32,
    pub index_code: u32,
    pub value_code: u32,
    pub dense_code: u32,
    pub num_layers: u32,
    pub kv_heads: u32,
    pub entry_bytes: u32,
    pub section_align: u32,
    pub layout: u32,
    pub file_bytes: u64,
    pub payload_crc32: u32,
    pub header_crc32: u32,
    pub identity_bytes: u64,
    pub extra_bytes: u64,
    pub reserved: [u64; 5],
}

/// One 64-byte directory entry: a head's configuration and counts. For coded rows
/// `key_nnz`/`value_nnz` count bytes; for dense and quantized rows only `buffer_rows` (the
/// rows held) is set and every other field is zero.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub(crate) struct HeadEntry {
    pub sparse_rows: u64,
    pub key_nnz: u64,
    pub value_nnz: u64,
    pub buffer_rows: u64,
    pub buffer_capacity: u64,
    pub k_key: u32,
    pub k_value: u32,
    pub rows_per_block: u32,
    pub non_finite: u32,
    pub key_scale: f32,
    pub value_scale: f32,
}

const _: () = assert!(std::mem::size_of::<FileHeader>() == HEADER_BYTES);
const _: () = assert!(std::mem::size_of::<HeadEntry>() == ENTRY_BYTES);

/// What a cache file holds per (layer, kv-head), with its element formats.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum CacheLayout {
    /// A CSR hybrid cache ([`crate::hybrid::HybridCache`]): `u8`/`u16` index lists,
    /// sparse values of `value`, dense buffer of `dense`. The only layout of version 1.
    Csr {
        /// Bytes per stored index (1 or 2).
        index_bytes: usize,
        /// Sparse value format.
        value: ValueFormat,
        /// Dense buffer format.
        dense: ValueFormat,
    },
    /// A coded hybrid cache ([`crate::hybrid::CodedHybridCache`]).
    Coded {
        /// Index code of the rows.
        index: IndexKind,
        /// Value code of the rows (per-row scales included in the rows).
        value: ValueKind,
        /// Dense buffer format.
        dense: ValueFormat,
    },
    /// Dense key and value rows of one float format (a full cache).
    Dense {
        /// Element format.
        format: ValueFormat,
    },
    /// Dense quantized key and value rows ([`crate::quant::QuantRows`]).
    Quant {
        /// Row codec.
        format: DenseFormat,
    },
    /// A hybrid cache whose history keeps every component of a row in codes of whole
    /// rows ([`crate::hybrid::WholeRowStore`]: dense quantized rows, KIVI,
    /// TurboQuant-style) behind a dense buffer.
    Rows {
        /// The history's format.
        history: HistoryFormat,
        /// Dense buffer format.
        dense: ValueFormat,
    },
}

impl std::fmt::Display for CacheLayout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CacheLayout::Csr { index_bytes, value, dense } => {
                write!(f, "csr u{} {value} buffer {dense}", index_bytes * 8)
            }
            CacheLayout::Coded { index, value, dense } => {
                write!(f, "coded {index} {value} buffer {dense}")
            }
            CacheLayout::Dense { format } => write!(f, "dense {format}"),
            CacheLayout::Quant { format } => write!(f, "quantized {format}"),
            CacheLayout::Rows { history, dense } => write!(f, "{history} buffer {dense}"),
        }
    }
}

const LAYOUT_CSR: u32 = 0;
const LAYOUT_CODED: u32 = 1;
const LAYOUT_DENSE: u32 = 2;
const LAYOUT_QUANT: u32 = 3;
const LAYOUT_ROWS: u32 = 4;

/// `(family, parameter)` codes of a whole-row history: quantized rows 1 with the row
/// format's code, KIVI 2, TurboQuant-style 3 and its QJL-keyed form 4 with their bits.
fn history_codes(history: HistoryFormat) -> [u32; 2] {
    match history {
        HistoryFormat::Quant(format) => [1, quant_code(format)],
        HistoryFormat::Kivi { bits } => [2, bits as u32],
        HistoryFormat::Turbo { bits } => [3, bits as u32],
        HistoryFormat::TurboQjl { bits } => [4, bits as u32],
    }
}

fn quant_format(code: u32) -> Result<DenseFormat> {
    Ok(match code {
        0 => DenseFormat::Int8,
        1 => DenseFormat::Int4,
        2 => DenseFormat::Fp8,
        other => return Err(unknown("quantized row format", other)),
    })
}

fn index_kind_code(kind: IndexKind) -> u32 {
    match kind {
        IndexKind::ListU8 => 1,
        IndexKind::ListU16 => 2,
        IndexKind::Bitmask => 3,
    }
}

fn value_kind_code(kind: ValueKind) -> u32 {
    match kind {
        ValueKind::Elems(f) => f.code(),
        ValueKind::Int8 => 16,
        ValueKind::Int4 => 17,
    }
}

fn quant_code(format: DenseFormat) -> u32 {
    match format {
        DenseFormat::Int8 => 0,
        DenseFormat::Int4 => 1,
        DenseFormat::Fp8 => 2,
    }
}

fn unknown(what: &'static str, code: u32) -> Error {
    Error::UnknownCode { op: OP, what, code }
}

fn value_format(what: &'static str, code: u32) -> Result<ValueFormat> {
    ValueFormat::from_code(code).ok_or_else(|| unknown(what, code))
}

impl CacheLayout {
    /// `(layout, index, value, dense)` codes of the header.
    fn codes(&self) -> [u32; 4] {
        match *self {
            CacheLayout::Csr { index_bytes, value, dense } => {
                [LAYOUT_CSR, index_bytes as u32, value.code(), dense.code()]
            }
            CacheLayout::Coded { index, value, dense } => {
                [LAYOUT_CODED, index_kind_code(index), value_kind_code(value), dense.code()]
            }
            CacheLayout::Dense { format } => [LAYOUT_DENSE, 0, 0, format.code()],
            CacheLayout::Quant { format } => [LAYOUT_QUANT, 0, 0, quant_code(format)],
            CacheLayout::Rows { history, dense } => {
                let [family, param] = history_codes(history);
                [LAYOUT_ROWS, family, param, dense.code()]
            }
        }
    }

    fn from_codes([layout, index, value, dense]: [u32; 4]) -> Result<Self> {
        let unused = |what: &'static str, code: u32| match code {
            0 => Ok(()),
            c => Err(unknown(what, c)),
        };
        Ok(match layout {
            LAYOUT_CSR => CacheLayout::Csr {
                index_bytes: match index {
                    1 | 2 => index as usize,
                    other => return Err(unknown("CSR index width", other)),
                },
                value: value_format("sparse value format", value)?,
                dense: value_format("dense buffer format", dense)?,
            },
            LAYOUT_CODED => CacheLayout::Coded {
                index: match index {
                    1 => IndexKind::ListU8,
                    2 => IndexKind::ListU16,
                    3 => IndexKind::Bitmask,
                    other => return Err(unknown("coded index kind", other)),
                },
                value: match value {
                    16 => ValueKind::Int8,
                    17 => ValueKind::Int4,
                    v => ValueKind::Elems(value_format("coded value kind", v)?),
                },
                dense: value_format("dense buffer format", dense)?,
            },
            LAYOUT_DENSE => {
                unused("dense index code", index)?;
                unused("dense value code", value)?;
                CacheLayout::Dense { format: value_format("dense row format", dense)? }
            }
            LAYOUT_QUANT => {
                unused("quantized index code", index)?;
                unused("quantized value code", value)?;
                CacheLayout::Quant { format: quant_format(dense)? }
            }
            LAYOUT_ROWS => CacheLayout::Rows {
                history: match (index, value) {
                    (1, code) => HistoryFormat::Quant(quant_format(code)?),
                    (2, bits @ (2 | 4)) => HistoryFormat::Kivi { bits: bits as usize },
                    (3, bits @ 2..=4) => HistoryFormat::Turbo { bits: bits as usize },
                    (4, bits @ 2..=4) => HistoryFormat::TurboQjl { bits: bits as usize },
                    (1..=4, bits) => return Err(unknown("whole-row history bits", bits)),
                    (family, _) => return Err(unknown("whole-row history family", family)),
                },
                dense: value_format("dense buffer format", dense)?,
            },
            other => return Err(unknown("layout", other)),
        })
    }

    /// Largest head_dim the layout can hold.
    fn max_head_dim(&self) -> usize {
        match self {
            CacheLayout::Csr { index_bytes: 1, .. }
            | CacheLayout::Coded { index: IndexKind::ListU8, .. } => 256,
            _ => crate::MAX_HEAD_DIM,
        }
    }

    /// Whether heads hold a hybrid cache (a config and a sparse history).
    pub(crate) fn is_hybrid(&self) -> bool {
        matches!(
            self,
            CacheLayout::Csr { .. } | CacheLayout::Coded { .. } | CacheLayout::Rows { .. }
        )
    }
}

/// Element formats, shape and block sizes shared by every head of a file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct FileFormat {
    pub version: u32,
    pub head_dim: usize,
    pub layout: CacheLayout,
    pub num_layers: usize,
    pub kv_heads: usize,
    pub identity_bytes: u64,
    pub extra_bytes: u64,
}

impl FileFormat {
    /// Whether the file has a per-head checksum table (version 3 on).
    pub(crate) fn has_head_crcs(&self) -> bool {
        self.version >= 3
    }

    /// Number of (layer, kv-head) entries.
    pub(crate) fn heads(&self) -> u64 {
        self.num_layers as u64 * self.kv_heads as u64
    }
}

impl FileHeader {
    /// The header's CRC-32, computed with the `header_crc32` field zeroed.
    pub(crate) fn crc(&self) -> u32 {
        let mut copy = *self;
        copy.header_crc32 = 0;
        crc32fast::hash(bytemuck::bytes_of(&copy))
    }

    pub(crate) fn new(format: &FileFormat, file_bytes: u64, payload_crc32: u32) -> Self {
        let [layout, index_code, value_code, dense_code] = format.layout.codes();
        let mut h = Self {
            magic: MAGIC,
            version: VERSION,
            header_bytes: HEADER_BYTES as u32,
            endian: ENDIAN_MARK,
            head_dim: format.head_dim as u32,
            index_code,
            value_code,
            dense_code,
            num_layers: format.num_layers as u32,
            kv_heads: format.kv_heads as u32,
            entry_bytes: ENTRY_BYTES as u32,
            section_align: SECTION_ALIGN as u32,
            layout,
            file_bytes,
            payload_crc32,
            header_crc32: 0,
            identity_bytes: format.identity_bytes,
            extra_bytes: format.extra_bytes,
            reserved: [0; 5],
        };
        h.header_crc32 = h.crc();
        h
    }

    /// Reads and checks the header (magic, version, byte order, checksum, constants,
    /// layout and formats, head_dim) from the first bytes of a file.
    pub(crate) fn parse(bytes: &[u8]) -> Result<(Self, FileFormat)> {
        let Some(raw) = bytes.get(..HEADER_BYTES) else {
            return Err(Error::Truncated {
                expected: HEADER_BYTES as u64,
                got: bytes.len() as u64,
            });
        };
        let h: FileHeader = bytemuck::pod_read_unaligned(raw);
        h.check_identity()?;
        let computed = h.crc();
        if computed != h.header_crc32 {
            return Err(Error::ChecksumMismatch {
                what: "header",
                expected: h.header_crc32,
                got: computed,
            });
        }
        h.check_constants()?;
        Ok((h, h.format()?))
    }

    /// Magic, version and byte order: what says the bytes are a cache file this build reads.
    fn check_identity(&self) -> Result<()> {
        let h = self;
        if h.magic != MAGIC {
            return Err(Error::BadMagic { got: h.magic });
        }
        if !(OLDEST_VERSION..=VERSION).contains(&h.version) {
            return Err(Error::VersionMismatch { expected: VERSION, got: h.version });
        }
        if h.endian != ENDIAN_MARK {
            return Err(corrupt(format!(
                "byte order marker {:#010x}: written on a host of other endianness",
                h.endian
            )));
        }
        Ok(())
    }

    /// The sizes every version fixes (header, entry, alignment).
    fn check_constants(&self) -> Result<()> {
        let h = self;
        let constants = [
            ("header size", h.header_bytes, HEADER_BYTES as u32),
            ("entry size", h.entry_bytes, ENTRY_BYTES as u32),
            ("section alignment", h.section_align, SECTION_ALIGN as u32),
        ];
        for (what, got, expected) in constants {
            if got != expected {
                return Err(corrupt(format!("{what} is {got}, expected {expected}")));
            }
        }
        Ok(())
    }

    /// The header and format of `bytes` without checking the header's own CRC (for
    /// re-sealing an edited image); `None` when they do not parse.
    pub(crate) fn parse_unsealed(bytes: &[u8]) -> Option<(Self, FileFormat)> {
        let h: FileHeader = bytemuck::pod_read_unaligned(bytes.get(..HEADER_BYTES)?);
        h.check_identity().ok()?;
        h.check_constants().ok()?;
        Some((h, h.format().ok()?))
    }

    fn format(&self) -> Result<FileFormat> {
        // Version 1 had one layout and no blocks; its reserved words are not read.
        let (layout_code, blocks) = if self.version == 1 {
            (LAYOUT_CSR, (0, 0))
        } else {
            if self.reserved != [0; 5] {
                return Err(corrupt("reserved header words are not zero".into()));
            }
            (self.layout, (self.identity_bytes, self.extra_bytes))
        };
        let layout = CacheLayout::from_codes([
            layout_code,
            self.index_code,
            self.value_code,
            self.dense_code,
        ])?;
        let max_dim = layout.max_head_dim();
        let head_dim = self.head_dim as usize;
        if head_dim == 0 || head_dim > max_dim {
            return Err(corrupt(format!("head_dim {head_dim} out of range 1..={max_dim}")));
        }
        if let CacheLayout::Quant { format } = layout {
            format.check_head_dim(OP, head_dim).map_err(|e| corrupt(e.to_string()))?;
        }
        if self.num_layers == 0 || self.kv_heads == 0 {
            return Err(corrupt(format!(
                "{} layers × {} kv heads",
                self.num_layers, self.kv_heads
            )));
        }
        Ok(FileFormat {
            version: self.version,
            head_dim,
            layout,
            num_layers: self.num_layers as usize,
            kv_heads: self.kv_heads as usize,
            identity_bytes: blocks.0,
            extra_bytes: blocks.1,
        })
    }
}

impl HeadEntry {
    /// The entry of a hybrid head (CSR or coded rows; `nnz` counts entries or bytes).
    pub(crate) fn hybrid(
        cfg: &HybridConfig,
        sparse_rows: usize,
        nnz: (usize, usize),
        buffer_rows: usize,
    ) -> Self {
        let (key_scale, value_scale) = cfg.scales();
        Self {
            sparse_rows: sparse_rows as u64,
            key_nnz: nnz.0 as u64,
            value_nnz: nnz.1 as u64,
            buffer_rows: buffer_rows as u64,
            buffer_capacity: cfg.buffer as u64,
            k_key: cfg.k_key as u32,
            k_value: cfg.k_value as u32,
            rows_per_block: cfg.rows_per_block as u32,
            non_finite: cfg.non_finite.code(),
            key_scale,
            value_scale,
        }
    }

    /// The entry of a dense or quantized head holding `rows` rows.
    pub(crate) fn rows(rows: usize) -> Self {
        Self { buffer_rows: rows as u64, ..Self::zeroed() }
    }

    /// Checks that a dense or quantized head's entry sets nothing but its row count.
    pub(crate) fn check_rows_only(&self) -> Result<()> {
        let mut rest = *self;
        rest.buffer_rows = 0;
        if bytemuck::bytes_of(&rest).iter().any(|&b| b != 0) {
            return Err(corrupt("a dense head's entry sets fields besides its row count".into()));
        }
        Ok(())
    }

    /// The head's hybrid configuration, validated for the file's formats with the row
    /// store `S` the layout names.
    pub(crate) fn config<S: RowStore>(&self, format: &FileFormat) -> Result<HybridConfig> {
        let non_finite = NonFinitePolicy::from_code(self.non_finite).ok_or_else(|| {
            corrupt(format!("unknown non-finite policy code {}", self.non_finite))
        })?;
        let dense = match format.layout {
            CacheLayout::Csr { dense, .. }
            | CacheLayout::Coded { dense, .. }
            | CacheLayout::Rows { dense, .. } => dense,
            other => return Err(corrupt(format!("{other} heads have no hybrid config"))),
        };
        let scales = (self.key_scale, self.value_scale);
        let cfg = HybridConfig {
            head_dim: format.head_dim,
            buffer: usize::try_from(self.buffer_capacity)
                .map_err(|_| corrupt("buffer capacity".into()))?,
            k_key: self.k_key as usize,
            k_value: self.k_value as usize,
            non_finite,
            rows_per_block: self.rows_per_block as usize,
            fp8_scale: if scales == (1.0, 1.0) { None } else { Some(scales) },
        };
        cfg.validate_formats::<S>(dense).map_err(|e| corrupt(format!("head config: {e}")))?;
        if self.buffer_rows > self.buffer_capacity {
            return Err(corrupt(format!(
                "{} buffer rows exceed capacity {}",
                self.buffer_rows, self.buffer_capacity
            )));
        }
        Ok(cfg)
    }
}

pub(crate) fn corrupt(reason: String) -> Error {
    Error::Corrupt { reason }
}
