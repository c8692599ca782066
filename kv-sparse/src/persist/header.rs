//! Fixed-size binary records of the cache file: the [`FileHeader`] and one [`HeadEntry`]
//! per (layer, kv-head). Both are `#[repr(C)]` plain old data with compile-time size
//! checks, read and written as little-endian bytes via `bytemuck`.
//!
//! They persist the state of SWAN's hybrid cache (method section, Algorithm 1): the
//! CSR history's counts and the dense buffer's fill, plus each head's configuration.

use bytemuck::{Pod, Zeroable};

use crate::hybrid::{HybridConfig, NonFinitePolicy};
use crate::{Error, Result, ValueFormat};

/// File magic: the first eight bytes of every cache file.
pub const MAGIC: [u8; 8] = *b"KVSPARSE";
/// The format version this build writes and reads.
pub const VERSION: u32 = 1;
/// Byte order marker, written natively: reads back differently on a foreign-endian host.
pub(crate) const ENDIAN_MARK: u32 = 0x0102_0304;
/// Every section starts at a multiple of this many bytes.
pub const SECTION_ALIGN: u64 = 64;
/// Size of [`FileHeader`].
pub(crate) const HEADER_BYTES: usize = 128;
/// Size of [`HeadEntry`].
pub(crate) const ENTRY_BYTES: usize = 64;

/// The 128-byte file header.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub(crate) struct FileHeader {
    pub magic: [u8; 8],
    pub version: u32,
    pub header_bytes: u32,
    pub endian: u32,
    pub head_dim: u32,
    pub index_bytes: u32,
    pub value_format: u32,
    pub dense_format: u32,
    pub num_layers: u32,
    pub kv_heads: u32,
    pub entry_bytes: u32,
    pub section_align: u32,
    pub reserved0: u32,
    pub file_bytes: u64,
    pub payload_crc32: u32,
    pub header_crc32: u32,
    pub reserved: [u64; 7],
}

/// One 64-byte directory entry: a head's configuration and counts.
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

/// Element formats and shape shared by every head of a file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct FileFormat {
    pub head_dim: usize,
    pub index_bytes: usize,
    pub value: ValueFormat,
    pub dense: ValueFormat,
    pub num_layers: usize,
    pub kv_heads: usize,
}

impl FileHeader {
    /// The header's CRC-32, computed with the `header_crc32` field zeroed.
    pub(crate) fn crc(&self) -> u32 {
        let mut copy = *self;
        copy.header_crc32 = 0;
        crc32fast::hash(bytemuck::bytes_of(&copy))
    }

    pub(crate) fn new(format: &FileFormat, file_bytes: u64, payload_crc32: u32) -> Self {
        let mut h = Self {
            magic: MAGIC,
            version: VERSION,
            header_bytes: HEADER_BYTES as u32,
            endian: ENDIAN_MARK,
            head_dim: format.head_dim as u32,
            index_bytes: format.index_bytes as u32,
            value_format: format.value.code(),
            dense_format: format.dense.code(),
            num_layers: format.num_layers as u32,
            kv_heads: format.kv_heads as u32,
            entry_bytes: ENTRY_BYTES as u32,
            section_align: SECTION_ALIGN as u32,
            reserved0: 0,
            file_bytes,
            payload_crc32,
            header_crc32: 0,
            reserved: [0; 7],
        };
        h.header_crc32 = h.crc();
        h
    }

    /// Reads and checks the header (magic, version, byte order, checksum, constants,
    /// formats, head_dim) from the first bytes of a file of `file_len` bytes.
    pub(crate) fn parse(bytes: &[u8]) -> Result<(Self, FileFormat)> {
        let Some(raw) = bytes.get(..HEADER_BYTES) else {
            return Err(Error::Truncated {
                expected: HEADER_BYTES as u64,
                got: bytes.len() as u64,
            });
        };
        let h: FileHeader = bytemuck::pod_read_unaligned(raw);
        if h.magic != MAGIC {
            return Err(Error::BadMagic { got: h.magic });
        }
        if h.version != VERSION {
            return Err(Error::VersionMismatch { expected: VERSION, got: h.version });
        }
        if h.endian != ENDIAN_MARK {
            return Err(corrupt(format!(
                "byte order marker {:#010x}: written on a host of other endianness",
                h.endian
            )));
        }
        let computed = h.crc();
        if computed != h.header_crc32 {
            return Err(Error::ChecksumMismatch {
                what: "header",
                expected: h.header_crc32,
                got: computed,
            });
        }
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
        Ok((h, h.format()?))
    }

    fn format(&self) -> Result<FileFormat> {
        let code = |what: &str, c: u32| {
            ValueFormat::from_code(c)
                .ok_or_else(|| corrupt(format!("unknown {what} format code {c}")))
        };
        let index_bytes = match self.index_bytes {
            1 | 2 => self.index_bytes as usize,
            other => return Err(corrupt(format!("index width {other} bytes (expected 1 or 2)"))),
        };
        let max_dim = if index_bytes == 1 { 256 } else { crate::MAX_HEAD_DIM };
        let head_dim = self.head_dim as usize;
        if head_dim == 0 || head_dim > max_dim {
            return Err(corrupt(format!("head_dim {head_dim} out of range 1..={max_dim}")));
        }
        if self.num_layers == 0 || self.kv_heads == 0 {
            return Err(corrupt(format!(
                "{} layers × {} kv heads",
                self.num_layers, self.kv_heads
            )));
        }
        Ok(FileFormat {
            head_dim,
            index_bytes,
            value: code("value", self.value_format)?,
            dense: code("dense", self.dense_format)?,
            num_layers: self.num_layers as usize,
            kv_heads: self.kv_heads as usize,
        })
    }
}

impl HeadEntry {
    pub(crate) fn new(
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

    /// The head's configuration, validated for the file's formats.
    pub(crate) fn config(&self, format: &FileFormat) -> Result<HybridConfig> {
        let non_finite = NonFinitePolicy::from_code(self.non_finite).ok_or_else(|| {
            corrupt(format!("unknown non-finite policy code {}", self.non_finite))
        })?;
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
        let validated = match format.index_bytes {
            1 => cfg.validate_formats::<crate::csr::CsrStore<u8, f32>>(format.dense),
            _ => cfg.validate_formats::<crate::csr::CsrStore<u16, f32>>(format.dense),
        };
        validated.map_err(|e| corrupt(format!("head config: {e}")))?;
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
