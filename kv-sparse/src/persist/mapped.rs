//! [`MappedCache`]: a validated, read-only, zero-copy view of a cache file.
//!
//! Persisted SWAN caches (method section, hybrid KV-cache) are read back as the very same
//! [`HybridView`]/[`CodedHybridView`]/[`QuantView`] types the in-memory caches give, so
//! decode kernels run on a mapped prefix unchanged.

use std::ops::Range;
use std::path::Path;
use std::sync::{Arc, OnceLock};

use memmap2::Mmap;

use super::header::{
    CacheLayout, ENTRY_BYTES, FileFormat, FileHeader, HEADER_BYTES, HeadEntry, corrupt,
};
use super::kinds::{with_codec, with_coded, with_history, with_value};
use super::layout::{HeadLayout, MetaLayout, RowSections, place_head, place_meta};
use crate::coded::{CodedStore, CodedView, IndexCode, ValueCode, ValueKind};
use crate::csr::{CsrStore, CsrView};
use crate::decoded::Side;
use crate::fp8::Fp8E4M3;
use crate::hybrid::{
    CodedHybridCache, CodedHybridView, CodedMultiHeadCache, Hybrid, HybridCache, HybridConfig,
    HybridView, MultiHeadCache, WholeRowStore, check_limits,
};
use crate::quant::{DenseCodec, QuantRows, QuantView};
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

/// One head's validated directory entry, hybrid config (hybrid layouts) and sections, and
/// the outcome of its content check, run on first use.
#[derive(Debug)]
struct Head {
    entry: HeadEntry,
    config: Option<HybridConfig>,
    layout: HeadLayout,
    /// The bytes the head's checksum covers (its sections and the padding before them).
    span: Range<usize>,
    /// The head's stored CRC-32 (version 3 on).
    crc: Option<u32>,
    checked: OnceLock<std::result::Result<(), Arc<Error>>>,
}

// The allocation bound documented on `MappedCache`: one record per directory entry.
const _: () = assert!(std::mem::size_of::<Head>() <= 512);

/// A cache file: its structure validated on open, each head's contents on first use,
/// giving zero-copy views of every head.
///
/// **Opening** reads only the header and the metadata after it, so it costs
/// O(header + directory) whatever the size of the rows. It checks, before anything is
/// trusted: magic, version (1, 2 or 3), byte order, header CRC, layout and formats (an
/// unknown code is [`Error::UnknownCode`]) and head_dim, the file length against the
/// header, that the directory, the head-checksum table and the identity and extra blocks
/// fit the file, the metadata CRC (version 3: directory, table and blocks; versions 1 and
/// 2 have one CRC over the whole payload, so opening them reads every byte), every head's
/// config, and that every section derived from the counts lies inside the file and that
/// the sections tile it.
///
/// **First use of a head** (any view, row accessor or load of it, or
/// [`MappedCache::validate_head`] / [`MappedCache::validate_all`]) checks its contents
/// once: the head's CRC-32 (version 3), then the rows through the validators an in-memory
/// cache uses:
/// * CSR rows: [`CsrView::from_parts`] (offsets, block extents, strictly ascending indices
///   below head_dim, finite values);
/// * coded rows: [`CodedView::from_parts`] (block extents, row lengths that fit a `k`,
///   ascending indices, mask popcounts, row scales finite and non-zero, finite values,
///   even `k` for 4-bit values);
/// * quantized rows: [`QuantView::from_bytes`] (whole rows, every block scale valid);
/// * dense rows and hybrid buffers: finite values; buffered rows that fit the sparse
///   encoding once evicted, and sparse values that stay finite once scaled.
///
/// A head that fails is [`Error::BadHead`] (naming the head, with the cause) on that and
/// every later use; the other heads stay usable. The directory-only accessors
/// ([`MappedCache::config`], [`MappedCache::tokens`], the shape and blocks) need no head
/// check. Any failure is a typed [`Error`] — never a panic or UB.
///
/// **Allocation bound**: besides the mapping (or, for [`MappedCache::read`], one buffer of
/// the file's actual size), opening allocates one small record (≤ 512 bytes) per 64-byte
/// directory entry that fits in the file — at most 8 bytes per file byte, however large
/// the counts a hostile header claims.
///
/// ## Safety of mapped files
/// A memory map aliases the file: if another process truncates or writes the file while
/// it is mapped, reads see changed bytes or fault (`SIGBUS`), which Rust treats as
/// undefined behaviour for `&[u8]`. Hence [`MappedCache::open`] is `unsafe`, and
/// [`MappedCache::read`] is the safe alternative that copies the file into memory.
pub struct MappedCache {
    backing: Backing,
    format: FileFormat,
    identity: Range<usize>,
    extra: Range<usize>,
    heads: Vec<Head>,
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
    /// Memory-maps a cache file and validates its structure (zero-copy; reads the header
    /// and directory only — see [`MappedCache`] for what is checked when).
    ///
    /// # Safety
    /// The file must not be modified or truncated (by this or any other process) while the
    /// returned value or any view borrowed from it is alive; see the
    /// [type-level safety section](MappedCache#safety-of-mapped-files).
    ///
    /// # Errors
    /// [`Error::Io`] when the file cannot be opened or mapped; the structure errors listed
    /// on [`MappedCache`] (`Truncated`, `BadMagic`, `VersionMismatch`, `UnknownCode`,
    /// `ChecksumMismatch`, `Corrupt`).
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

    /// Reads a cache file into memory and validates its structure (safe; one copy of the
    /// file).
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

    /// Validates the structure of a file image held in memory (copied into an aligned
    /// buffer).
    ///
    /// # Errors
    /// As [`MappedCache::open`], minus I/O.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self> {
        let mut words = vec![0u64; bytes.len().div_ceil(8)];
        bytemuck::cast_slice_mut::<u64, u8>(&mut words)[..bytes.len()].copy_from_slice(bytes);
        Self::validate(Backing::Owned(words, bytes.len()))
    }

    /// Checks every head's contents now (what first use would check), so that no later
    /// use can fail on them.
    ///
    /// # Errors
    /// [`Error::BadHead`] for the first head, layer-major, that fails.
    pub fn validate_all(&self) -> Result<()> {
        (0..self.heads.len()).try_for_each(|h| self.checked("MappedCache::validate_all", h))
    }

    /// [`MappedCache::validate_all`] on up to `threads` threads (scoped, one head at a
    /// time each; the caller's thread is one of them): the same checks and the same error
    /// — the first failing head in layer-major order — in a fraction of the time on a
    /// multi-core machine.
    ///
    /// # Errors
    /// As [`MappedCache::validate_all`].
    pub fn validate_all_on(&self, threads: usize) -> Result<()> {
        const OP: &str = "MappedCache::validate_all";
        let n = self.heads.len();
        let next = std::sync::atomic::AtomicUsize::new(0);
        let work = || {
            loop {
                let h = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if h >= n {
                    break;
                }
                // Outcomes are kept per head; the ordered pass below reports them.
                let _ = self.checked(OP, h);
            }
        };
        std::thread::scope(|s| {
            for _ in 1..threads.clamp(1, n.max(1)) {
                s.spawn(work);
            }
            work();
        });
        (0..n).try_for_each(|h| self.checked(OP, h))
    }

    /// Checks the contents of (`layer`, `kv_head`) now, if no use has yet.
    ///
    /// # Errors
    /// [`Error::OutOfRange`] for a bad layer or head; [`Error::BadHead`] when its
    /// contents are invalid.
    pub fn validate_head(&self, layer: usize, kv_head: usize) -> Result<()> {
        let h = self.head_index(layer, kv_head)?;
        self.checked("MappedCache::validate_head", h)
    }

    /// The outcome of head `h`'s content check, run on its first use.
    fn checked(&self, op: &'static str, h: usize) -> Result<()> {
        let outcome = self.heads[h].checked.get_or_init(|| self.check_head(h).map_err(Arc::new));
        outcome.clone().map_err(|source| Error::BadHead {
            op,
            layer: h / self.format.kv_heads,
            kv_head: h % self.format.kv_heads,
            source,
        })
    }

    /// Head `h`'s checksum (version 3), then its rows.
    fn check_head(&self, h: usize) -> Result<()> {
        let head = &self.heads[h];
        if let Some(expected) = head.crc {
            let got = crc32fast::hash(&self.backing.bytes()[head.span.clone()]);
            if got != expected {
                return Err(Error::ChecksumMismatch { what: "head", expected, got });
            }
        }
        self.check_head_contents(h)
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
        let meta = place_meta(&format, actual)?;
        // `meta.end <= actual`: placement stays inside the file.
        let (what, covered) = if format.has_head_crcs() {
            ("directory", &bytes[HEADER_BYTES..meta.end as usize])
        } else {
            ("payload", &bytes[HEADER_BYTES..])
        };
        let computed = crc32fast::hash(covered);
        if computed != header.payload_crc32 {
            return Err(Error::ChecksumMismatch {
                what,
                expected: header.payload_crc32,
                got: computed,
            });
        }
        let heads = Self::directory(bytes, &format, &meta)?;
        let (identity, extra) = (meta.identity, meta.extra);
        Ok(Self { backing, format, identity, extra, heads })
    }

    /// Parses the directory: configs and section layouts, which must tile the file, and
    /// the head checksums (version 3).
    fn directory(bytes: &[u8], format: &FileFormat, meta: &MetaLayout) -> Result<Vec<Head>> {
        fn coded_config<X: IndexCode, Y: ValueCode>(
            entry: &HeadEntry,
            format: &FileFormat,
        ) -> Result<HybridConfig> {
            entry.config::<CodedStore<X, Y>>(format)
        }
        fn rows_config<S: WholeRowStore>(
            entry: &HeadEntry,
            format: &FileFormat,
        ) -> Result<HybridConfig> {
            entry.config::<S>(format)
        }
        let limit = bytes.len() as u64;
        let entries = bytes[meta.directory.clone()].chunks_exact(ENTRY_BYTES);
        let mut crcs = bytes[meta.head_crcs.clone()]
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]));
        let mut cursor = meta.end;
        let mut out = Vec::with_capacity(entries.len());
        for (h, raw) in entries.enumerate() {
            let entry: HeadEntry = bytemuck::pod_read_unaligned(raw);
            let context = |e: Error| corrupt(format!("head {h}: {e}"));
            let config = match format.layout {
                CacheLayout::Csr { index_bytes: 1, .. } => {
                    Some(entry.config::<CsrStore<u8, f32>>(format))
                }
                CacheLayout::Csr { .. } => Some(entry.config::<CsrStore<u16, f32>>(format)),
                CacheLayout::Coded { index, value, .. } => {
                    Some(with_coded!(index, value, coded_config(&entry, format)))
                }
                CacheLayout::Rows { history, .. } => {
                    Some(with_history!(history, rows_config(&entry, format)))
                }
                _ => {
                    entry.check_rows_only().map_err(context)?;
                    None
                }
            };
            let config = config.transpose().map_err(context)?;
            let (layout, end) = place_head(&entry, format, cursor, limit).map_err(context)?;
            // Both ends lie inside the file (placement checked them against `limit`).
            let span = cursor as usize..end as usize;
            out.push(Head {
                entry,
                config,
                layout,
                span,
                crc: crcs.next(),
                checked: OnceLock::new(),
            });
            cursor = end;
        }
        if cursor != limit {
            return Err(corrupt(format!("sections end at {cursor}, file has {limit} bytes")));
        }
        Ok(out)
    }

    /// Checks one head's rows with the validator of its layout.
    fn check_head_contents(&self, h: usize) -> Result<()> {
        fn csr<I: SparseIndex, V: Value>(
            c: &MappedCache,
            h: usize,
            dense: ValueFormat,
        ) -> Result<()> {
            c.check_csr::<I, V>(h, dense)
        }
        fn csr_u8<V: Value>(c: &MappedCache, h: usize, dense: ValueFormat) -> Result<()> {
            csr::<u8, V>(c, h, dense)
        }
        fn csr_u16<V: Value>(c: &MappedCache, h: usize, dense: ValueFormat) -> Result<()> {
            csr::<u16, V>(c, h, dense)
        }
        fn coded<X: IndexCode, Y: ValueCode>(
            c: &MappedCache,
            h: usize,
            dense: ValueFormat,
        ) -> Result<()> {
            c.check_coded::<X, Y>(h, dense)
        }
        fn dense<D: Value>(c: &MappedCache, h: usize) -> Result<()> {
            let layout = &c.heads[h].layout;
            for range in [&layout.dense_keys, &layout.dense_values] {
                if !all_finite::<D>(c.section(range)?) {
                    return Err(corrupt("non-finite dense value".into()));
                }
            }
            Ok(())
        }
        fn rows<S: WholeRowStore>(c: &MappedCache, h: usize, dense: ValueFormat) -> Result<()> {
            c.check_rows::<S>(h, dense)
        }
        fn quant<C: DenseCodec>(c: &MappedCache, h: usize) -> Result<()> {
            let layout = &c.heads[h].layout;
            for range in [&layout.dense_keys, &layout.dense_values] {
                QuantView::<C>::from_bytes(c.format.head_dim, c.section(range)?)?;
            }
            Ok(())
        }
        match self.format.layout {
            CacheLayout::Csr { index_bytes: 1, value, dense } => {
                with_value!(value, csr_u8(self, h, dense))
            }
            CacheLayout::Csr { value, dense, .. } => with_value!(value, csr_u16(self, h, dense)),
            CacheLayout::Coded { index, value, dense } => {
                with_coded!(index, value, coded(self, h, dense))
            }
            CacheLayout::Dense { format } => with_value!(format, dense(self, h)),
            CacheLayout::Quant { format } => with_codec!(format, quant(self, h)),
            CacheLayout::Rows { history, dense } => with_history!(history, rows(self, h, dense)),
        }
    }

    /// Whole-row histories rebuilt from their checked parts, finite buffers that fit the
    /// history once evicted.
    fn check_rows<S: WholeRowStore>(&self, h: usize, dense: ValueFormat) -> Result<()> {
        let (cfg, layout) = (self.config_of(h)?, &self.heads[h].layout);
        self.whole_stores::<S>(cfg, layout)?;
        self.check_buffers(h, dense)?;
        self.check_buffers_fit::<S>(h, dense)
    }

    /// Both sides of a whole-row history, rebuilt from the file's sections.
    fn whole_stores<S: WholeRowStore>(
        &self,
        cfg: &HybridConfig,
        layout: &HeadLayout,
    ) -> Result<(S, S)> {
        let (d, rpb) = (self.format.head_dim, cfg.rows_per_block);
        let keys = S::from_parts(
            Side::Keys,
            d,
            rpb,
            self.section(&layout.keys.values)?,
            self.section(&layout.keys.indices)?,
        )?;
        let values =
            S::from_parts(Side::Values, d, rpb, self.section(&layout.values.values)?, &[])?;
        Ok((keys, values))
    }

    fn config_of(&self, h: usize) -> Result<&HybridConfig> {
        self.heads[h].config.as_ref().ok_or_else(|| Error::FormatMismatch {
            op: OP,
            what: "layout",
            expected: "a hybrid layout".into(),
            got: self.format.layout.to_string(),
        })
    }

    /// CSR invariants of both histories, finite buffers, and the decoded ranges.
    fn check_csr<I: SparseIndex, V: Value>(&self, h: usize, dense: ValueFormat) -> Result<()> {
        let (cfg, layout) = (self.config_of(h)?, &self.heads[h].layout);
        for sections in [&layout.keys, &layout.values] {
            self.csr_view::<I, V>(cfg, sections, true)?;
        }
        self.check_buffers(h, dense)?;
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
        self.check_buffers_fit::<CsrStore<I, V>>(h, dense)
    }

    /// Coded-row invariants of both histories, finite buffers, and the decoded ranges.
    fn check_coded<X: IndexCode, Y: ValueCode>(&self, h: usize, dense: ValueFormat) -> Result<()> {
        let (cfg, layout) = (self.config_of(h)?, &self.heads[h].layout);
        let (key_scale, value_scale) = cfg.scales();
        for (what, sections, scale) in
            [("key", &layout.keys, key_scale), ("value", &layout.values, value_scale)]
        {
            let view = self.coded_rows::<X, Y>(cfg, sections, true)?;
            // Decoded values are a row's values times the head's scale; where the code's
            // largest magnitude times the scale is finite, no row can overflow.
            if !(largest_decoded(Y::KIND) * scale).is_finite() {
                let mut row = vec![0.0f32; cfg.head_dim];
                for r in view.rows() {
                    r.expand(&mut row);
                    let m = row.iter().fold(0f32, |m, x| m.max(x.abs()));
                    if !(m * scale).is_finite() {
                        return Err(corrupt(format!(
                            "sparse {what} value {m} × scale {scale} overflows f32"
                        )));
                    }
                }
            }
        }
        self.check_buffers(h, dense)?;
        self.check_buffers_fit::<CodedStore<X, Y>>(h, dense)
    }

    fn check_buffers(&self, h: usize, dense: ValueFormat) -> Result<()> {
        fn finite<D: Value>(c: &MappedCache, range: &Range<usize>) -> Result<bool> {
            Ok(all_finite::<D>(c.section(range)?))
        }
        let layout = &self.heads[h].layout;
        for range in [&layout.dense_keys, &layout.dense_values] {
            if !with_value!(dense, finite(self, range))? {
                return Err(corrupt("non-finite dense buffer value".into()));
            }
        }
        Ok(())
    }

    /// Buffered rows must fit the sparse encoding once evicted (after the head's scale):
    /// otherwise a loaded cache could never take another row (every append would fail
    /// evicting the oldest one).
    fn check_buffers_fit<S: crate::hybrid::RowStore>(
        &self,
        h: usize,
        dense: ValueFormat,
    ) -> Result<()> {
        fn fit<S: crate::hybrid::RowStore, D: Value>(
            c: &MappedCache,
            range: &Range<usize>,
            keeps: bool,
            scale: f32,
        ) -> Result<()> {
            let m = max_abs::<D>(c.section(range)?);
            check_limits::<S, D>("MappedCache::open", m, true, keeps, scale)
        }
        let (cfg, layout) = (self.config_of(h)?, &self.heads[h].layout);
        let (key_scale, value_scale) = cfg.scales();
        let parts = [
            (&layout.dense_keys, cfg.k_key > 0, key_scale),
            (&layout.dense_values, cfg.k_value > 0, value_scale),
        ];
        for (range, keeps, scale) in parts {
            match dense {
                ValueFormat::F32 => fit::<S, f32>(self, range, keeps, scale)?,
                ValueFormat::F16 => fit::<S, half::f16>(self, range, keeps, scale)?,
                ValueFormat::Bf16 => fit::<S, half::bf16>(self, range, keeps, scale)?,
                ValueFormat::Fp8E4M3 => fit::<S, Fp8E4M3>(self, range, keeps, scale)?,
            }
        }
        Ok(())
    }

    fn csr_view<I: SparseIndex, V: Value>(
        &self,
        cfg: &HybridConfig,
        s: &RowSections,
        checked: bool,
    ) -> Result<CsrView<'_, I, V>> {
        let parts = (
            self.section(&s.bases)?,
            self.section(&s.offsets)?,
            self.section(&s.indices)?,
            self.section(&s.values)?,
        );
        let (d, rpb) = (cfg.head_dim, cfg.rows_per_block);
        Ok(if checked {
            CsrView::from_parts(d, rpb, parts.0, parts.1, parts.2, parts.3)?
        } else {
            CsrView::from_parts_unchecked(d, rpb, parts.0, parts.1, parts.2, parts.3)
        })
    }

    fn coded_rows<X: IndexCode, Y: ValueCode>(
        &self,
        cfg: &HybridConfig,
        s: &RowSections,
        checked: bool,
    ) -> Result<CodedView<'_, X, Y>> {
        let parts = (self.section(&s.bases)?, self.section(&s.offsets)?, self.section(&s.values)?);
        let (d, rpb) = (cfg.head_dim, cfg.rows_per_block);
        Ok(if checked {
            CodedView::from_parts(d, rpb, parts.0, parts.1, parts.2)?
        } else {
            CodedView::from_parts_unchecked(d, rpb, parts.0, parts.1, parts.2)
        })
    }

    /// A typed slice of the file (ranges are validated to lie inside the file and to be
    /// aligned: sections start at multiples of 64 and both backings are 8-aligned).
    fn section<T: bytemuck::Pod>(&self, range: &Range<usize>) -> Result<&[T]> {
        let bytes = self.backing.bytes().get(range.clone());
        let bytes = bytes.ok_or_else(|| corrupt(format!("section {range:?} outside the file")))?;
        bytemuck::try_cast_slice(bytes).map_err(|e| corrupt(format!("section {range:?}: {e}")))
    }

    /// The kernel view of (`layer`, `kv_head`) of a CSR file — the same type an in-memory
    /// [`HybridCache`] gives.
    ///
    /// # Errors
    /// [`Error::FormatMismatch`] when the file's layout is not CSR or `I`, `V` or `D`
    /// differ from its formats; [`Error::OutOfRange`] for a bad layer or head;
    /// [`Error::BadHead`] when the head's contents fail their check (first use).
    pub fn view<I: SparseIndex, V: Value, D: Value>(
        &self,
        layer: usize,
        kv_head: usize,
    ) -> Result<HybridView<'_, I, V, D>> {
        let expected =
            CacheLayout::Csr { index_bytes: I::BYTES, value: V::FORMAT, dense: D::FORMAT };
        self.check_layout(expected)?;
        let h = self.head_index(layer, kv_head)?;
        self.checked("MappedCache::view", h)?;
        let (cfg, layout) = (self.config_of(h)?, &self.heads[h].layout);
        Ok(HybridView {
            head_dim: cfg.head_dim,
            sparse_keys: self.csr_view(cfg, &layout.keys, false)?,
            sparse_values: self.csr_view(cfg, &layout.values, false)?,
            buffer_keys: (self.section(&layout.dense_keys)?, &[]),
            buffer_values: (self.section(&layout.dense_values)?, &[]),
            value_scale: cfg.scales(),
        })
    }

    /// The kernel view of (`layer`, `kv_head`) of a coded file — the same type an
    /// in-memory [`CodedHybridCache`] gives.
    ///
    /// # Errors
    /// [`Error::FormatMismatch`] when the layout is not coded rows of `X`, `Y` with a `D`
    /// buffer; [`Error::OutOfRange`] for a bad layer or head; [`Error::BadHead`] when the
    /// head's contents fail their check (first use).
    pub fn coded_view<X: IndexCode, Y: ValueCode, D: Value>(
        &self,
        layer: usize,
        kv_head: usize,
    ) -> Result<CodedHybridView<'_, X, Y, D>> {
        let expected = CacheLayout::Coded { index: X::KIND, value: Y::KIND, dense: D::FORMAT };
        self.check_layout(expected)?;
        let h = self.head_index(layer, kv_head)?;
        self.checked("MappedCache::coded_view", h)?;
        let (cfg, layout) = (self.config_of(h)?, &self.heads[h].layout);
        Ok(CodedHybridView {
            head_dim: cfg.head_dim,
            sparse_keys: self.coded_rows(cfg, &layout.keys, false)?,
            sparse_values: self.coded_rows(cfg, &layout.values, false)?,
            buffer_keys: (self.section(&layout.dense_keys)?, &[]),
            buffer_values: (self.section(&layout.dense_values)?, &[]),
            value_scale: cfg.scales(),
        })
    }

    /// The key and value rows (row-major `[rows][head_dim]`) of (`layer`, `kv_head`) of a
    /// dense file, borrowed from the file.
    ///
    /// # Errors
    /// [`Error::FormatMismatch`] when the layout is not dense `D`; [`Error::OutOfRange`];
    /// [`Error::BadHead`] when the head's contents fail their check (first use).
    pub fn dense_rows<D: Value>(&self, layer: usize, kv_head: usize) -> Result<(&[D], &[D])> {
        self.check_layout(CacheLayout::Dense { format: D::FORMAT })?;
        let h = self.head_index(layer, kv_head)?;
        self.checked("MappedCache::dense_rows", h)?;
        let layout = &self.heads[h].layout;
        Ok((self.section(&layout.dense_keys)?, self.section(&layout.dense_values)?))
    }

    /// The key and value rows of (`layer`, `kv_head`) of a quantized file, borrowed from
    /// the file — the views kernels read.
    ///
    /// # Errors
    /// [`Error::FormatMismatch`] when the layout is not rows of codec `C`;
    /// [`Error::OutOfRange`]; [`Error::BadHead`] when the head's contents fail their check
    /// (first use).
    pub fn quant_rows<C: DenseCodec>(
        &self,
        layer: usize,
        kv_head: usize,
    ) -> Result<(QuantView<'_, C>, QuantView<'_, C>)> {
        self.check_layout(CacheLayout::Quant { format: C::FORMAT })?;
        let h = self.head_index(layer, kv_head)?;
        self.checked("MappedCache::quant_rows", h)?;
        let layout = &self.heads[h].layout;
        let d = self.format.head_dim;
        Ok((
            QuantView::from_bytes_unchecked(d, self.section(&layout.dense_keys)?),
            QuantView::from_bytes_unchecked(d, self.section(&layout.dense_values)?),
        ))
    }

    /// The configuration (layer, kv_head) was written with (hybrid layouts).
    ///
    /// # Errors
    /// [`Error::OutOfRange`] for a bad layer or head; [`Error::FormatMismatch`] for a
    /// dense or quantized file.
    pub fn config(&self, layer: usize, kv_head: usize) -> Result<HybridConfig> {
        self.config_of(self.head_index(layer, kv_head)?).copied()
    }

    /// Tokens held by (layer, kv_head): sparse plus buffered rows, or the rows of a dense
    /// or quantized head.
    ///
    /// # Errors
    /// [`Error::OutOfRange`] for a bad layer or head.
    pub fn tokens(&self, layer: usize, kv_head: usize) -> Result<usize> {
        let e = &self.heads[self.head_index(layer, kv_head)?].entry;
        // Both counts fit the file (their sections were placed inside it).
        Ok((e.sparse_rows + e.buffer_rows) as usize)
    }

    /// Copies (layer, kv_head) of a CSR file into an owned [`HybridCache`] to keep
    /// appending (prefix reuse).
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

    /// Copies every head of a CSR file into an owned [`MultiHeadCache`].
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

    /// Copies (layer, kv_head) of a coded file into an owned [`CodedHybridCache`].
    ///
    /// # Errors
    /// As [`MappedCache::coded_view`].
    pub fn load_coded<X: IndexCode, Y: ValueCode, D: Value>(
        &self,
        layer: usize,
        kv_head: usize,
    ) -> Result<CodedHybridCache<X, Y, D>> {
        let view = self.coded_view::<X, Y, D>(layer, kv_head)?;
        CodedHybridCache::from_view(self.config(layer, kv_head)?, view)
    }

    /// Copies every head of a coded file into an owned [`CodedMultiHeadCache`].
    ///
    /// # Errors
    /// As [`MappedCache::coded_view`].
    pub fn load_coded_multi<X: IndexCode, Y: ValueCode, D: Value>(
        &self,
    ) -> Result<CodedMultiHeadCache<X, Y, D>> {
        let (layers, heads) = (self.format.num_layers, self.format.kv_heads);
        let all = (0..layers * heads)
            .map(|h| self.load_coded(h / heads, h % heads))
            .collect::<Result<Vec<_>>>()?;
        CodedMultiHeadCache::from_heads(layers, heads, all)
    }

    /// Copies (layer, kv_head) of a quantized file into owned key and value rows.
    ///
    /// # Errors
    /// As [`MappedCache::quant_rows`].
    pub fn load_quant<C: DenseCodec>(
        &self,
        layer: usize,
        kv_head: usize,
    ) -> Result<(QuantRows<C>, QuantRows<C>)> {
        let (k, v) = self.quant_rows::<C>(layer, kv_head)?;
        Ok((QuantRows::from_view(k), QuantRows::from_view(v)))
    }

    /// Copies (layer, kv_head) of a whole-row file ([`CacheImage::rows`]) into an owned
    /// hybrid cache to keep appending (prefix reuse).
    ///
    /// # Errors
    /// [`Error::FormatMismatch`] when the file holds another layout, history format or
    /// buffer format; [`Error::OutOfRange`]; [`Error::BadHead`] when the head's contents
    /// fail their check (first use).
    ///
    /// [`CacheImage::rows`]: super::CacheImage::rows
    pub fn load_rows<S: WholeRowStore, D: Value>(
        &self,
        layer: usize,
        kv_head: usize,
    ) -> Result<Hybrid<S, D>> {
        self.check_layout(CacheLayout::Rows { history: S::HISTORY, dense: D::FORMAT })?;
        let h = self.head_index(layer, kv_head)?;
        self.checked("MappedCache::load_rows", h)?;
        let (cfg, layout) = (self.config_of(h)?, &self.heads[h].layout);
        let stores = self.whole_stores::<S>(cfg, layout)?;
        let (keys, values) =
            (self.section(&layout.dense_keys)?, self.section(&layout.dense_values)?);
        Hybrid::from_history(*cfg, stores, keys, values)
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

    /// `FormatMismatch` unless the file's layout is `expected`.
    fn check_layout(&self, expected: CacheLayout) -> Result<()> {
        let got = self.format.layout;
        if got == expected {
            return Ok(());
        }
        let mismatch = |what, e: String, g: String| Error::FormatMismatch {
            op: "MappedCache::view",
            what,
            expected: e,
            got: g,
        };
        let index = |b: usize| format!("u{}", b * 8);
        Err(match (expected, got) {
            (
                CacheLayout::Csr { index_bytes: ei, value: ev, dense: ed },
                CacheLayout::Csr { index_bytes: gi, value: gv, dense: gd },
            ) => {
                if ei != gi {
                    mismatch("index", index(ei), index(gi))
                } else if ev != gv {
                    mismatch("sparse value", ev.to_string(), gv.to_string())
                } else {
                    mismatch("dense buffer", ed.to_string(), gd.to_string())
                }
            }
            (
                CacheLayout::Coded { index: ei, value: ev, dense: ed },
                CacheLayout::Coded { index: gi, value: gv, dense: gd },
            ) => {
                if ei != gi {
                    mismatch("index", ei.to_string(), gi.to_string())
                } else if ev != gv {
                    mismatch("sparse value", ev.to_string(), gv.to_string())
                } else {
                    mismatch("dense buffer", ed.to_string(), gd.to_string())
                }
            }
            _ => mismatch("layout", expected.to_string(), got.to_string()),
        })
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

    /// What the file holds per head and in which formats.
    pub fn layout(&self) -> CacheLayout {
        self.format.layout
    }

    /// The format version the file was written with (1 or 2).
    pub fn version(&self) -> u32 {
        self.format.version
    }

    /// The identity block the writer attached (empty when none): opaque bytes, e.g. a
    /// fingerprint of the model, projection and cache spec, for the caller to check.
    pub fn identity(&self) -> &[u8] {
        &self.backing.bytes()[self.identity.clone()]
    }

    /// The extra block the writer attached (empty when none): opaque caller state, e.g.
    /// the prompt's token ids.
    pub fn extra(&self) -> &[u8] {
        &self.backing.bytes()[self.extra.clone()]
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

    /// Size of the file in bytes.
    pub fn file_bytes(&self) -> usize {
        self.backing.bytes().len()
    }
}

/// The largest magnitude a kept value of `kind` decodes to before the head's scale.
fn largest_decoded(kind: ValueKind) -> f32 {
    match kind {
        ValueKind::Elems(ValueFormat::F16) => 65504.0,
        ValueKind::Elems(ValueFormat::Fp8E4M3) => 448.0,
        ValueKind::Int8 => 127.0 * 65504.0,
        ValueKind::Int4 => 8.0 * 65504.0,
        _ => f32::INFINITY,
    }
}

fn all_finite<D: Value>(values: &[D]) -> bool {
    values.iter().all(|v| v.to_f32().is_finite())
}

fn max_abs<D: Value>(values: &[D]) -> f32 {
    values.iter().fold(0.0, |m, v| m.max(v.to_f32().abs()))
}
