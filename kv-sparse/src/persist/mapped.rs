//! [`MappedCache`]: a validated, read-only, zero-copy view of a cache file.
//!
//! Persisted SWAN caches (method section, hybrid KV-cache) are read back as the very same
//! [`HybridView`]/[`crate::csr::CsrView`] types the in-memory cache gives, so decode
//! kernels run on a mapped prefix unchanged.

use std::path::Path;

use memmap2::Mmap;

use super::header::{ENTRY_BYTES, FileFormat, FileHeader, HEADER_BYTES, HeadEntry, corrupt};
use super::layout::{CsrSections, HeadLayout, place_head};
use crate::csr::CsrView;
use crate::fp8::Fp8E4M3;
use crate::hybrid::{HybridCache, HybridConfig, HybridView, MultiHeadCache};
use crate::{Error, Result, SparseIndex, Value, ValueFormat};

/// The bytes behind a [`MappedCache`].
enum Backing {
    /// A read-only memory map (see [`MappedCache::open`]'s safety contract).
    Mapped(Mmap),
    /// An owned copy, 8-byte aligned (`u64` words), and its length in bytes.
    Owned(Vec<u64>, usize),
}

impl Backing {
    fn bytes(&self) -> &[u8] {
        match self {
            Backing::Mapped(m) => m,
            Backing::Owned(words, len) => &bytemuck::cast_slice(words)[..*len],
        }
    }
}

/// A cache file, fully validated on open, giving zero-copy [`HybridView`]s.
///
/// Opening checks, before anything is trusted: magic, version, byte order, header CRC,
/// formats and head_dim, the file length against the header, that the directory fits the
/// file, the payload CRC, every head's config, that every section derived from the
/// counts lies inside the file, and every CSR invariant ([`CsrView::from_parts`]:
/// offsets, block extents, strictly ascending indices below head_dim, finite values) plus
/// finite buffer values that fit the sparse value format once evicted, and sparse values
/// that stay finite once scaled. Any failure is a typed [`Error`] — never a panic or UB.
///
/// **Allocation bound**: besides the mapping (or, for [`MappedCache::read`], one buffer of
/// the file's actual size), opening allocates one small layout record (≤ 256 bytes) per
/// 64-byte directory entry that fits in the file — at most 4 bytes per file byte, however
/// large the counts a hostile header claims.
///
/// ## Safety of mapped files
/// A memory map aliases the file: if another process truncates or writes the file while
/// it is mapped, reads see changed bytes or fault (`SIGBUS`), which Rust treats as
/// undefined behaviour for `&[u8]`. Hence [`MappedCache::open`] is `unsafe`, and
/// [`MappedCache::read`] is the safe alternative that copies the file into memory.
pub struct MappedCache {
    backing: Backing,
    format: FileFormat,
    configs: Vec<HybridConfig>,
    layouts: Vec<HeadLayout>,
}

impl std::fmt::Debug for MappedCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MappedCache")
            .field("format", &self.format)
            .field("bytes", &self.backing.bytes().len())
            .finish()
    }
}

const OP: &str = "MappedCache";

impl MappedCache {
    /// Memory-maps and validates a cache file (zero-copy).
    ///
    /// # Safety
    /// The file must not be modified or truncated (by this or any other process) while the
    /// returned value or any view borrowed from it is alive; see the
    /// [type-level safety section](MappedCache#safety-of-mapped-files).
    ///
    /// # Errors
    /// [`Error::Io`] when the file cannot be opened or mapped; the validation errors listed
    /// on [`MappedCache`] (`Truncated`, `BadMagic`, `VersionMismatch`, `ChecksumMismatch`,
    /// `Corrupt`).
    pub unsafe fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let io = |source| Error::Io { op: "MappedCache::open", path: path.to_path_buf(), source };
        let file = std::fs::File::open(path).map_err(io)?;
        let len = file.metadata().map_err(io)?.len();
        if len < HEADER_BYTES as u64 {
            return Err(Error::Truncated { expected: HEADER_BYTES as u64, got: len });
        }
        // SAFETY: the caller guarantees the file is not modified or truncated while mapped
        // (this function's contract). The map is read-only and owned by the returned value;
        // every view borrows it, so no slice outlives the mapping.
        let map = unsafe { Mmap::map(&file) }.map_err(io)?;
        Self::validate(Backing::Mapped(map))
    }

    /// Reads a cache file into memory and validates it (safe; one copy of the file).
    ///
    /// # Errors
    /// As [`MappedCache::open`].
    pub fn read(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let bytes = std::fs::read(path).map_err(|source| Error::Io {
            op: "MappedCache::read",
            path: path.to_path_buf(),
            source,
        })?;
        Self::from_bytes(&bytes)
    }

    /// Validates a file image held in memory (copied into an aligned buffer).
    ///
    /// # Errors
    /// As [`MappedCache::open`], minus I/O.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self> {
        let mut words = vec![0u64; bytes.len().div_ceil(8)];
        bytemuck::cast_slice_mut::<u64, u8>(&mut words)[..bytes.len()].copy_from_slice(bytes);
        Self::validate(Backing::Owned(words, bytes.len()))
    }

    fn validate(backing: Backing) -> Result<Self> {
        let bytes = backing.bytes();
        let (header, format) = FileHeader::parse(bytes)?;
        let actual = bytes.len() as u64;
        if actual < header.file_bytes {
            return Err(Error::Truncated { expected: header.file_bytes, got: actual });
        }
        if actual > header.file_bytes {
            return Err(corrupt(format!("{actual} bytes, header says {}", header.file_bytes)));
        }
        let heads = (format.num_layers as u64) * (format.kv_heads as u64);
        let dir_end =
            heads.checked_mul(ENTRY_BYTES as u64).and_then(|d| d.checked_add(HEADER_BYTES as u64));
        if dir_end.is_none_or(|end| end > actual) {
            return Err(corrupt(format!(
                "a directory of {heads} heads does not fit the {actual}-byte file"
            )));
        }
        let computed = crc32fast::hash(&bytes[HEADER_BYTES..]);
        if computed != header.payload_crc32 {
            return Err(Error::ChecksumMismatch {
                what: "payload",
                expected: header.payload_crc32,
                got: computed,
            });
        }
        let (configs, layouts) = Self::directory(bytes, &format, heads as usize)?;
        let cache = Self { backing, format, configs, layouts };
        for h in 0..cache.layouts.len() {
            cache.check_head_contents(h)?;
        }
        Ok(cache)
    }

    /// Parses the directory: configs and section layouts, which must tile the file.
    fn directory(
        bytes: &[u8],
        format: &FileFormat,
        heads: usize,
    ) -> Result<(Vec<HybridConfig>, Vec<HeadLayout>)> {
        let limit = bytes.len() as u64;
        let mut cursor = (HEADER_BYTES + heads * ENTRY_BYTES) as u64;
        let (mut configs, mut layouts) = (Vec::with_capacity(heads), Vec::with_capacity(heads));
        for h in 0..heads {
            let at = HEADER_BYTES + h * ENTRY_BYTES;
            let entry: HeadEntry = bytemuck::pod_read_unaligned(&bytes[at..at + ENTRY_BYTES]);
            let context = |e: Error| corrupt(format!("head {h}: {e}"));
            configs.push(entry.config(format).map_err(context)?);
            let (layout, end) = place_head(&entry, format, cursor, limit).map_err(context)?;
            layouts.push(layout);
            cursor = end;
        }
        if cursor != limit {
            return Err(corrupt(format!("sections end at {cursor}, file has {limit} bytes")));
        }
        Ok((configs, layouts))
    }

    /// Checks one head's CSR invariants and buffer values (dispatching on the formats).
    fn check_head_contents(&self, h: usize) -> Result<()> {
        let context = |e: Error| corrupt(format!("head {h}: {e}"));
        macro_rules! check_as {
            ($idx:ty, $val:ty) => {{
                for sections in [&self.layouts[h].keys, &self.layouts[h].values] {
                    self.csr_checked::<$idx, $val>(h, sections).map_err(context)?;
                }
            }};
        }
        macro_rules! by_value {
            ($idx:ty) => {
                match self.format.value {
                    ValueFormat::F32 => check_as!($idx, f32),
                    ValueFormat::F16 => check_as!($idx, half::f16),
                    ValueFormat::Bf16 => check_as!($idx, half::bf16),
                    ValueFormat::Fp8E4M3 => check_as!($idx, Fp8E4M3),
                }
            };
        }
        match self.format.index_bytes {
            1 => by_value!(u8),
            _ => by_value!(u16),
        }
        let layout = &self.layouts[h];
        for range in [&layout.buffer_keys, &layout.buffer_values] {
            let finite = match self.format.dense {
                ValueFormat::F32 => all_finite::<f32>(self.section(range)?),
                ValueFormat::F16 => all_finite::<half::f16>(self.section(range)?),
                ValueFormat::Bf16 => all_finite::<half::bf16>(self.section(range)?),
                ValueFormat::Fp8E4M3 => all_finite::<Fp8E4M3>(self.section(range)?),
            };
            if !finite {
                return Err(corrupt(format!("head {h}: non-finite dense buffer value")));
            }
        }
        let fits = match self.format.value {
            ValueFormat::F32 => self.check_decoded_ranges::<f32>(h),
            ValueFormat::F16 => self.check_decoded_ranges::<half::f16>(h),
            ValueFormat::Bf16 => self.check_decoded_ranges::<half::bf16>(h),
            ValueFormat::Fp8E4M3 => self.check_decoded_ranges::<Fp8E4M3>(h),
        };
        fits.map_err(context)
    }

    /// Ranges an in-memory cache guarantees: sparse values decode (`value · scale`) to
    /// finite numbers, and buffered rows fit the sparse value format once evicted (after the
    /// head's scale) — otherwise a loaded cache could never take another row (every append
    /// would fail evicting the oldest one).
    fn check_decoded_ranges<V: Value>(&self, h: usize) -> Result<()> {
        let (cfg, layout) = (&self.configs[h], &self.layouts[h]);
        let (key_scale, value_scale) = cfg.scales();
        for (what, s, scale) in
            [("key", &layout.keys, key_scale), ("value", &layout.values, value_scale)]
        {
            let m = max_abs::<V>(self.section(&s.values)?);
            if !(m * scale).is_finite() {
                return Err(corrupt(format!(
                    "sparse {what} value {m} × scale {scale} overflows f32"
                )));
            }
        }
        let parts = [
            (&layout.buffer_keys, cfg.k_key, key_scale),
            (&layout.buffer_values, cfg.k_value, value_scale),
        ];
        for (range, k, scale) in parts {
            if k > 0 {
                let max_abs = match self.format.dense {
                    ValueFormat::F32 => max_abs::<f32>(self.section(range)?),
                    ValueFormat::F16 => max_abs::<half::f16>(self.section(range)?),
                    ValueFormat::Bf16 => max_abs::<half::bf16>(self.section(range)?),
                    ValueFormat::Fp8E4M3 => max_abs::<Fp8E4M3>(self.section(range)?),
                };
                crate::value::check_overflow::<V>("MappedCache::open", max_abs / scale)?;
            }
        }
        Ok(())
    }

    fn csr_checked<I: SparseIndex, V: Value>(
        &self,
        h: usize,
        s: &CsrSections,
    ) -> Result<CsrView<'_, I, V>> {
        let cfg = &self.configs[h];
        CsrView::from_parts(
            cfg.head_dim,
            cfg.rows_per_block,
            self.section(&s.bases)?,
            self.section(&s.offsets)?,
            self.section(&s.indices)?,
            self.section(&s.values)?,
        )
    }

    /// A typed slice of the file (ranges are validated to lie inside the file and to be
    /// aligned: sections start at multiples of 64 and both backings are 8-aligned).
    fn section<T: bytemuck::Pod>(&self, range: &std::ops::Range<usize>) -> Result<&[T]> {
        let bytes = self.backing.bytes().get(range.clone());
        let bytes = bytes.ok_or_else(|| corrupt(format!("section {range:?} outside the file")))?;
        bytemuck::try_cast_slice(bytes).map_err(|e| corrupt(format!("section {range:?}: {e}")))
    }

    /// The kernel view of (`layer`, `kv_head`) — the same type an in-memory cache gives.
    ///
    /// # Errors
    /// [`Error::FormatMismatch`] when `I`, `V` or `D` differ from the file's formats;
    /// [`Error::OutOfRange`] for a bad layer or head.
    pub fn view<I: SparseIndex, V: Value, D: Value>(
        &self,
        layer: usize,
        kv_head: usize,
    ) -> Result<HybridView<'_, I, V, D>> {
        self.check_types::<I, V, D>()?;
        let h = self.head_index(layer, kv_head)?;
        let (cfg, layout) = (&self.configs[h], &self.layouts[h]);
        let csr = |s: &CsrSections| -> Result<CsrView<'_, I, V>> {
            Ok(CsrView::from_parts_unchecked(
                cfg.head_dim,
                cfg.rows_per_block,
                self.section(&s.bases)?,
                self.section(&s.offsets)?,
                self.section(&s.indices)?,
                self.section(&s.values)?,
            ))
        };
        Ok(HybridView {
            head_dim: cfg.head_dim,
            sparse_keys: csr(&layout.keys)?,
            sparse_values: csr(&layout.values)?,
            buffer_keys: (self.section(&layout.buffer_keys)?, &[]),
            buffer_values: (self.section(&layout.buffer_values)?, &[]),
            value_scale: cfg.scales(),
        })
    }

    /// The configuration (layer, kv_head) was written with.
    ///
    /// # Errors
    /// [`Error::OutOfRange`] for a bad layer or head.
    pub fn config(&self, layer: usize, kv_head: usize) -> Result<HybridConfig> {
        Ok(self.configs[self.head_index(layer, kv_head)?])
    }

    /// Copies (layer, kv_head) into an owned [`HybridCache`] to keep appending (prefix reuse).
    ///
    /// # Errors
    /// As [`MappedCache::view`].
    pub fn load<I: SparseIndex, V: Value, D: Value>(
        &self,
        layer: usize,
        kv_head: usize,
    ) -> Result<HybridCache<I, V, D>> {
        let view = self.view::<I, V, D>(layer, kv_head)?;
        HybridCache::from_view(self.config(layer, kv_head)?, view)
    }

    /// Copies every head into an owned [`MultiHeadCache`].
    ///
    /// # Errors
    /// As [`MappedCache::view`].
    pub fn load_multi<I: SparseIndex, V: Value, D: Value>(
        &self,
    ) -> Result<MultiHeadCache<I, V, D>> {
        let (layers, heads) = (self.format.num_layers, self.format.kv_heads);
        let all = (0..layers * heads)
            .map(|h| self.load(h / heads, h % heads))
            .collect::<Result<Vec<_>>>()?;
        MultiHeadCache::from_heads(layers, heads, all)
    }

    /// Checks the file's shape against what the caller's model expects.
    ///
    /// # Errors
    /// [`Error::ShapeMismatch`] naming the first dimension that differs.
    pub fn check_shape(&self, num_layers: usize, kv_heads: usize, head_dim: usize) -> Result<()> {
        let checks = [
            ("num_layers", num_layers, self.format.num_layers),
            ("kv_heads", kv_heads, self.format.kv_heads),
            ("head_dim", head_dim, self.format.head_dim),
        ];
        for (what, expected, got) in checks {
            if expected != got {
                return Err(Error::ShapeMismatch {
                    op: "MappedCache::check_shape",
                    what,
                    expected,
                    got,
                });
            }
        }
        Ok(())
    }

    fn check_types<I: SparseIndex, V: Value, D: Value>(&self) -> Result<()> {
        let f = &self.format;
        let index = |b: usize| format!("u{}", b * 8);
        let checks = [
            ("index", index(I::BYTES), index(f.index_bytes)),
            ("sparse value", V::FORMAT.to_string(), f.value.to_string()),
            ("dense buffer", D::FORMAT.to_string(), f.dense.to_string()),
        ];
        for (what, expected, got) in checks {
            if expected != got {
                return Err(Error::FormatMismatch { op: "MappedCache::view", what, expected, got });
            }
        }
        Ok(())
    }

    fn head_index(&self, layer: usize, kv_head: usize) -> Result<usize> {
        let f = &self.format;
        for (what, index, len) in [("layer", layer, f.num_layers), ("kv head", kv_head, f.kv_heads)]
        {
            if index >= len {
                return Err(Error::OutOfRange { op: OP, what, index, len });
            }
        }
        Ok(layer * f.kv_heads + kv_head)
    }

    /// Number of layers in the file.
    pub fn num_layers(&self) -> usize {
        self.format.num_layers
    }

    /// KV heads per layer.
    pub fn kv_heads(&self) -> usize {
        self.format.kv_heads
    }

    /// Elements per key/value vector.
    pub fn head_dim(&self) -> usize {
        self.format.head_dim
    }

    /// Bytes per stored index (1 = `u8`, 2 = `u16`).
    pub fn index_bytes(&self) -> usize {
        self.format.index_bytes
    }

    /// Format of the sparse values.
    pub fn value_format(&self) -> ValueFormat {
        self.format.value
    }

    /// Format of the dense buffer.
    pub fn dense_format(&self) -> ValueFormat {
        self.format.dense
    }

    /// Size of the file in bytes.
    pub fn file_bytes(&self) -> usize {
        self.backing.bytes().len()
    }
}

fn all_finite<D: Value>(values: &[D]) -> bool {
    values.iter().all(|v| v.to_f32().is_finite())
}

fn max_abs<D: Value>(values: &[D]) -> f32 {
    values.iter().fold(0.0, |m, v| m.max(v.to_f32().abs()))
}
