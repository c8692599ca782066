//! Writing caches to the on-disk format (header, directory, blocks, aligned sections,
//! CRC-32s): [`CacheImage`] gathers the heads of any layout, borrowed, and streams them.
//!
//! Persists SWAN's hybrid cache state (method section, Algorithm 1) for prefix reuse —
//! the sparse history of every head (CSR or coded rows) plus its dense buffer, exactly as
//! held in memory — and the full caches SWAN is compared with (dense float rows, dense
//! quantized rows).

use std::borrow::Cow;
use std::fs::File;
use std::io::{BufWriter, Seek, SeekFrom, Write};
use std::ops::Range;
use std::path::{Path, PathBuf};

use super::header::{CacheLayout, FileFormat, FileHeader, HEADER_BYTES, HeadEntry};
use super::layout::{HeadLayout, MetaLayout, place_head, place_meta};
use crate::coded::{CodedStore, CodedView, IndexCode, ValueCode};
use crate::csr::{CsrStore, CsrView};
use crate::hybrid::{
    CodedHybridView, Hybrid, HybridCache, HybridConfig, HybridView, MultiHeadCache, RowStore,
    WholeRowStore,
};
use crate::quant::{DenseCodec, QuantView};
use crate::{Error, Result, SparseIndex, Value};

const OP: &str = "persist::write";

/// A cache file's content, borrowed from the caches it describes: `num_layers × kv_heads`
/// heads of one [`CacheLayout`], layer-major, plus an optional identity block and extra
/// block (opaque bytes the reader gets back from [`super::MappedCache::identity`] and
/// [`super::MappedCache::extra`]).
///
/// # Examples
/// ```
/// use kv_sparse::coded::{Bitmask, CodedStore, Int8Values};
/// use kv_sparse::hybrid::{CodedHybridCache, HybridConfig};
/// use kv_sparse::persist::{CacheImage, MappedCache};
/// let cfg = HybridConfig::new(16, 2, 4).for_store::<CodedStore<Bitmask, Int8Values>>();
/// let mut cache = CodedHybridCache::<Bitmask, Int8Values, half::f16>::new(cfg)?;
/// for t in 0..5 {
///     cache.append(&[t as f32 + 1.0; 16], &[0.5; 16])?;
/// }
/// let heads = [(*cache.config(), cache.view())];
/// let image = CacheImage::coded(1, 1, &heads)?.with_identity(b"model=tiny").encode()?;
/// let file = MappedCache::from_bytes(&image)?;
/// assert_eq!(file.identity(), b"model=tiny");
/// let view = file.coded_view::<Bitmask, Int8Values, half::f16>(0, 0)?;
/// assert_eq!((view.sparse_len(), view.buffer_len()), (3, 2));
/// # Ok::<(), kv_sparse::Error>(())
/// ```
#[derive(Debug)]
pub struct CacheImage<'a> {
    format: FileFormat,
    entries: Vec<HeadEntry>,
    /// Per head, one `[older, newer]` pair of byte slices per section, in file order
    /// (borrowed rows; owned only for the block tables of a continued history).
    parts: Vec<Vec<Part<'a>>>,
    identity: &'a [u8],
    extra: &'a [u8],
}

/// Where everything of an image lies.
struct Plan {
    meta: MetaLayout,
    layouts: Vec<HeadLayout>,
    file_bytes: u64,
}

/// Writes sections in file order, zero-padding up to each one's start.
struct Emitter<'s> {
    pos: usize,
    sink: &'s mut dyn FnMut(&[u8]) -> std::io::Result<()>,
}

impl Emitter<'_> {
    fn section(&mut self, range: &Range<usize>, parts: [&[u8]; 2]) -> std::io::Result<()> {
        debug_assert_eq!(range.len(), parts[0].len() + parts[1].len());
        (self.sink)(&[0u8; 64][..range.start - self.pos])?;
        (self.sink)(parts[0])?;
        (self.sink)(parts[1])?;
        self.pos = range.end;
        Ok(())
    }
}

fn check_count(num_layers: usize, kv_heads: usize, got: usize) -> Result<()> {
    let expected = num_layers * kv_heads;
    if got == 0 || got != expected {
        return Err(Error::ShapeMismatch { op: OP, what: "number of heads", expected, got });
    }
    Ok(())
}

fn bytes_of<T: bytemuck::Pod>(x: &[T]) -> &[u8] {
    bytemuck::cast_slice(x)
}

/// One section's bytes, written `[0]` then `[1]`.
type Part<'a> = [Cow<'a, [u8]>; 2];

fn one(bytes: &[u8]) -> Part<'_> {
    [Cow::Borrowed(bytes), Cow::Borrowed(&[])]
}

fn pair<'a>(older: &'a [u8], newer: &'a [u8]) -> Part<'a> {
    [Cow::Borrowed(older), Cow::Borrowed(newer)]
}

const WHAT: &str = "CacheImage: continued history";

/// A history's block bases and row offsets (`rows_per_block` rows per block) as its own
/// arrays give them, or as one table over `older`'s rows followed by `newer`'s when the
/// history is a prefix held elsewhere plus the rows added since. Each part is
/// `(block bases, row offsets, stored units)`; `newer`'s rows start `older`'s unit count
/// further on.
fn block_tables<'a>(
    rows_per_block: usize,
    older: Option<(&[u64], &[u16], usize)>,
    newer: (&'a [u64], &'a [u16]),
) -> Result<[Part<'a>; 2]> {
    let Some(older) = older else {
        return Ok([one(bytes_of(newer.0)), one(bytes_of(newer.1))]);
    };
    fn starts<'t>(
        (bases, offsets): (&'t [u64], &'t [u16]),
        rows_per_block: usize,
        shift: u64,
    ) -> impl Iterator<Item = Result<u64>> + 't {
        offsets.iter().enumerate().map(move |(r, &o)| {
            let base = bases.get(r / rows_per_block).ok_or_else(|| Error::InvalidCsr {
                op: WHAT,
                reason: format!("row {r} has no block base"),
            })?;
            Ok(base + u64::from(o) + shift)
        })
    }
    let rows = older.1.len() + newer.1.len();
    let (mut bases, mut offsets) =
        (Vec::with_capacity(rows.div_ceil(rows_per_block)), Vec::with_capacity(rows));
    let mut base = 0;
    let all = starts((older.0, older.1), rows_per_block, 0).chain(starts(
        newer,
        rows_per_block,
        older.2 as u64,
    ));
    for (r, start) in all.enumerate() {
        let start: u64 = start?;
        if r % rows_per_block == 0 {
            base = start;
            bases.push(start);
        }
        let offset = start.checked_sub(base).and_then(|o| u16::try_from(o).ok());
        offsets.push(offset.ok_or_else(|| Error::InvalidCsr {
            op: WHAT,
            reason: format!("row {r} starts {start}, outside its block at {base}"),
        })?);
    }
    let owned = |b: &[u8]| [Cow::Owned(b.to_vec()), Cow::Borrowed(&[][..])];
    Ok([owned(bytes_of(&bases)), owned(bytes_of(&offsets))])
}

impl<'a> CacheImage<'a> {
    fn new(layout: CacheLayout, num_layers: usize, kv_heads: usize, head_dim: usize) -> Self {
        let format = FileFormat {
            version: super::VERSION,
            head_dim,
            layout,
            num_layers,
            kv_heads,
            identity_bytes: 0,
            extra_bytes: 0,
        };
        let heads = num_layers * kv_heads;
        Self {
            format,
            entries: Vec::with_capacity(heads),
            parts: Vec::with_capacity(heads),
            identity: &[],
            extra: &[],
        }
    }

    /// CSR hybrid heads given as (config, view) pairs, layer-major.
    ///
    /// # Errors
    /// [`Error::ShapeMismatch`] when the head count or a view's shape does not match its
    /// config or the first head's head_dim; [`Error::ScaleMismatch`]; config errors.
    pub fn csr<I: SparseIndex, V: Value, D: Value>(
        num_layers: usize,
        kv_heads: usize,
        heads: &[(HybridConfig, HybridView<'a, I, V, D>)],
    ) -> Result<Self> {
        let heads: Vec<_> = heads.iter().map(|(cfg, view)| (*cfg, None, *view)).collect();
        Self::csr_continued(num_layers, kv_heads, &heads)
    }

    /// CSR hybrid heads whose sparse history may begin with older rows held elsewhere,
    /// given as (config, older (keys, values), view) triples, layer-major: each head is
    /// written as one history (the older rows, then the view's) and the view's buffer —
    /// e.g. a reopened file's mapped history continued in memory, saved again without
    /// copying either into one store. The rows are borrowed; only the block tables of a
    /// continued history are rebuilt.
    ///
    /// # Errors
    /// As [`CacheImage::csr`]; also when the older rows' head_dim or rows per block
    /// differ from the config or their keys and values hold different numbers of rows.
    #[allow(clippy::type_complexity)]
    pub fn csr_continued<I: SparseIndex, V: Value, D: Value>(
        num_layers: usize,
        kv_heads: usize,
        heads: &[(
            HybridConfig,
            Option<(CsrView<'a, I, V>, CsrView<'a, I, V>)>,
            HybridView<'a, I, V, D>,
        )],
    ) -> Result<Self> {
        check_count(num_layers, kv_heads, heads.len())?;
        let head_dim = heads[0].0.head_dim;
        let layout = CacheLayout::Csr { index_bytes: I::BYTES, value: V::FORMAT, dense: D::FORMAT };
        let mut image = Self::new(layout, num_layers, kv_heads, head_dim);
        for (cfg, older, view) in heads {
            let rpb = [view.sparse_keys.rows_per_block(), view.sparse_values.rows_per_block()];
            let scales = view.value_scale;
            check_hybrid::<CsrStore<I, V>, D>(head_dim, cfg, view.head_dim, rpb, scales)?;
            view.check_shape(OP)?;
            check_buffer(cfg, view.buffer_len())?;
            let mut nnz = (view.sparse_keys.nnz(), view.sparse_values.nnz());
            let mut rows = view.sparse_len();
            if let Some((k, v)) = older {
                let shape =
                    ([k.head_dim(), v.head_dim()], [k.rows_per_block(), v.rows_per_block()]);
                check_older(cfg, shape, (k.num_rows(), v.num_rows()))?;
                nnz = (nnz.0 + k.nnz(), nnz.1 + v.nnz());
                rows += k.num_rows();
            }
            image.entries.push(HeadEntry::hybrid(cfg, rows, nnz, view.buffer_len()));
            let mut parts = Vec::with_capacity(10);
            let sides =
                [(older.map(|o| o.0), view.sparse_keys), (older.map(|o| o.1), view.sparse_values)];
            for (older, csr) in sides {
                let tables = older.map(|o| (o.block_bases(), o.offsets(), o.nnz()));
                let newer = (csr.block_bases(), csr.offsets());
                parts.extend(block_tables(cfg.rows_per_block, tables, newer)?);
                let (oi, ov) = older
                    .map_or((&[][..], &[][..]), |o| (bytes_of(o.indices()), bytes_of(o.values())));
                parts.push(pair(oi, bytes_of(csr.indices())));
                parts.push(pair(ov, bytes_of(csr.values())));
            }
            for (a, b) in [view.buffer_keys, view.buffer_values] {
                parts.push(pair(bytes_of(a), bytes_of(b)));
            }
            image.parts.push(parts);
        }
        Ok(image)
    }

    /// Coded hybrid heads (index list or bitmask rows, float or integer values with their
    /// row scales) given as (config, view) pairs, layer-major.
    ///
    /// # Errors
    /// As [`CacheImage::csr`].
    pub fn coded<X: IndexCode, Y: ValueCode, D: Value>(
        num_layers: usize,
        kv_heads: usize,
        heads: &[(HybridConfig, CodedHybridView<'a, X, Y, D>)],
    ) -> Result<Self> {
        let heads: Vec<_> = heads.iter().map(|(cfg, view)| (*cfg, None, *view)).collect();
        Self::coded_continued(num_layers, kv_heads, &heads)
    }

    /// Coded hybrid heads whose sparse history may begin with older rows held elsewhere
    /// (see [`CacheImage::csr_continued`]).
    ///
    /// # Errors
    /// As [`CacheImage::csr_continued`].
    #[allow(clippy::type_complexity)]
    pub fn coded_continued<X: IndexCode, Y: ValueCode, D: Value>(
        num_layers: usize,
        kv_heads: usize,
        heads: &[(
            HybridConfig,
            Option<(CodedView<'a, X, Y>, CodedView<'a, X, Y>)>,
            CodedHybridView<'a, X, Y, D>,
        )],
    ) -> Result<Self> {
        check_count(num_layers, kv_heads, heads.len())?;
        let head_dim = heads[0].0.head_dim;
        let layout = CacheLayout::Coded { index: X::KIND, value: Y::KIND, dense: D::FORMAT };
        let mut image = Self::new(layout, num_layers, kv_heads, head_dim);
        for (cfg, older, view) in heads {
            let rpb = [view.sparse_keys.rows_per_block(), view.sparse_values.rows_per_block()];
            let scales = view.value_scale;
            check_hybrid::<CodedStore<X, Y>, D>(head_dim, cfg, view.head_dim, rpb, scales)?;
            view.check_shape(OP)?;
            check_buffer(cfg, view.buffer_len())?;
            let mut nnz = (view.sparse_keys.bytes().len(), view.sparse_values.bytes().len());
            let mut rows = view.sparse_len();
            if let Some((k, v)) = older {
                let shape =
                    ([k.head_dim(), v.head_dim()], [k.rows_per_block(), v.rows_per_block()]);
                check_older(cfg, shape, (k.num_rows(), v.num_rows()))?;
                nnz = (nnz.0 + k.bytes().len(), nnz.1 + v.bytes().len());
                rows += k.num_rows();
            }
            image.entries.push(HeadEntry::hybrid(cfg, rows, nnz, view.buffer_len()));
            let mut parts = Vec::with_capacity(8);
            let sides =
                [(older.map(|o| o.0), view.sparse_keys), (older.map(|o| o.1), view.sparse_values)];
            for (older, rows) in sides {
                let tables = older.map(|o| (o.block_bases(), o.offsets(), o.bytes().len()));
                let newer = (rows.block_bases(), rows.offsets());
                parts.extend(block_tables(cfg.rows_per_block, tables, newer)?);
                parts.push(pair(older.map_or(&[][..], |o| o.bytes()), rows.bytes()));
            }
            for (a, b) in [view.buffer_keys, view.buffer_values] {
                parts.push(pair(bytes_of(a), bytes_of(b)));
            }
            image.parts.push(parts);
        }
        Ok(image)
    }

    /// Hybrid heads whose history keeps whole rows ([`WholeRowStore`]: dense quantized
    /// rows, KIVI, TurboQuant-style), layer-major: per head its key codes, the keys
    /// waiting in f16, its value codes and its buffer, exactly as held.
    ///
    /// # Errors
    /// [`Error::ShapeMismatch`] when the head count is wrong or a head's head_dim or config
    /// differs from the first head's shape; config errors.
    ///
    /// # Examples
    /// ```
    /// use kv_sparse::hybrid::{Hybrid, HybridConfig};
    /// use kv_sparse::kivi::KiviRows;
    /// use kv_sparse::persist::{CacheImage, MappedCache};
    /// let cfg = HybridConfig::new(32, 4, 32).for_store::<KiviRows<2>>();
    /// let mut head = Hybrid::<KiviRows<2>, half::f16>::new(cfg)?;
    /// for t in 0..12 {
    ///     head.append(&[t as f32; 32], &[0.5; 32])?;
    /// }
    /// let bytes = CacheImage::rows(1, 1, &[&head])?.encode()?;
    /// let file = MappedCache::from_bytes(&bytes)?;
    /// let back = file.load_rows::<KiviRows<2>, half::f16>(0, 0)?;
    /// assert_eq!((back.sparse_len(), back.buffer_len()), (8, 4));
    /// # Ok::<(), kv_sparse::Error>(())
    /// ```
    pub fn rows<S: WholeRowStore, D: Value>(
        num_layers: usize,
        kv_heads: usize,
        heads: &[&'a Hybrid<S, D>],
    ) -> Result<Self> {
        check_count(num_layers, kv_heads, heads.len())?;
        let head_dim = heads[0].head_dim();
        let layout = CacheLayout::Rows { history: S::HISTORY, dense: D::FORMAT };
        let mut image = Self::new(layout, num_layers, kv_heads, head_dim);
        for head in heads {
            let cfg = head.config();
            let rpb = [cfg.rows_per_block; 2];
            check_hybrid::<S, D>(head_dim, cfg, head.head_dim(), rpb, cfg.scales())?;
            let (keys, values) = head.history_stores();
            let nnz = (keys.coded_bytes().len(), values.coded_bytes().len());
            image.entries.push(HeadEntry::hybrid(cfg, head.sparse_len(), nnz, head.buffer_len()));
            let mut parts = vec![
                one(keys.coded_bytes()),
                one(bytes_of(keys.waiting_rows())),
                one(values.coded_bytes()),
                one(&[]),
            ];
            for (a, b) in [head.buffer_keys(), head.buffer_values()] {
                parts.push(pair(bytes_of(a), bytes_of(b)));
            }
            image.parts.push(parts);
        }
        Ok(image)
    }

    /// Dense heads: per head its keys and values, row-major `[rows][head_dim]` of `D`.
    ///
    /// # Errors
    /// [`Error::HeadDimOutOfRange`]; [`Error::ShapeMismatch`] when the head count is wrong
    /// or a head's keys and values are not the same whole number of rows.
    pub fn dense<D: Value>(
        num_layers: usize,
        kv_heads: usize,
        head_dim: usize,
        heads: &[(&'a [D], &'a [D])],
    ) -> Result<Self> {
        let heads: Vec<_> = heads.iter().map(|&(k, v)| ((k, &[][..]), (v, &[][..]))).collect();
        Self::dense_continued(num_layers, kv_heads, head_dim, &heads)
    }

    /// Dense heads whose rows lie in two parts each: per head its keys and its values as
    /// `(older, newer)` row-major slices — e.g. a reopened file's mapped rows, then the rows
    /// appended since — written as one contiguous head each, without joining them first.
    ///
    /// # Errors
    /// As [`CacheImage::dense`].
    #[allow(clippy::type_complexity)]
    pub fn dense_continued<D: Value>(
        num_layers: usize,
        kv_heads: usize,
        head_dim: usize,
        heads: &[((&'a [D], &'a [D]), (&'a [D], &'a [D]))],
    ) -> Result<Self> {
        check_count(num_layers, kv_heads, heads.len())?;
        if head_dim == 0 || head_dim > crate::MAX_HEAD_DIM {
            return Err(Error::HeadDimOutOfRange { op: OP, head_dim, max: crate::MAX_HEAD_DIM });
        }
        let mut image =
            Self::new(CacheLayout::Dense { format: D::FORMAT }, num_layers, kv_heads, head_dim);
        for &((k0, k1), (v0, v1)) in heads {
            let (keys, values) = (k0.len() + k1.len(), v0.len() + v1.len());
            let rows = keys / head_dim;
            let checks = [
                ("older key elements (whole rows)", k0.len() / head_dim * head_dim, k0.len()),
                ("key elements (whole rows)", rows * head_dim, keys),
                ("value elements", keys, values),
            ];
            for (what, expected, got) in checks {
                if expected != got {
                    return Err(Error::ShapeMismatch { op: OP, what, expected, got });
                }
            }
            image.entries.push(HeadEntry::rows(rows));
            image
                .parts
                .push(vec![pair(bytes_of(k0), bytes_of(k1)), pair(bytes_of(v0), bytes_of(v1))]);
        }
        Ok(image)
    }

    /// Dense quantized heads: per head its key and value rows.
    ///
    /// # Errors
    /// [`Error::ShapeMismatch`] when the head count is wrong, a view's head_dim differs
    /// from the first one's, or keys and values hold different numbers of rows.
    pub fn quant<C: DenseCodec>(
        num_layers: usize,
        kv_heads: usize,
        heads: &[(QuantView<'a, C>, QuantView<'a, C>)],
    ) -> Result<Self> {
        let heads: Vec<_> = heads.iter().map(|&(k, v)| (None, k, v)).collect();
        Self::quant_continued(num_layers, kv_heads, &heads)
    }

    /// Dense quantized heads whose rows may lie in two parts: per head older (keys, values)
    /// rows held elsewhere, then its key and value rows — written as one head each, without
    /// joining them first.
    ///
    /// # Errors
    /// As [`CacheImage::quant`], for the older rows too.
    #[allow(clippy::type_complexity)]
    pub fn quant_continued<C: DenseCodec>(
        num_layers: usize,
        kv_heads: usize,
        heads: &[(
            Option<(QuantView<'a, C>, QuantView<'a, C>)>,
            QuantView<'a, C>,
            QuantView<'a, C>,
        )],
    ) -> Result<Self> {
        check_count(num_layers, kv_heads, heads.len())?;
        let head_dim = heads[0].1.head_dim();
        let layout = CacheLayout::Quant { format: C::FORMAT };
        let mut image = Self::new(layout, num_layers, kv_heads, head_dim);
        for (older, keys, values) in heads {
            let mut checks = vec![
                ("key head_dim", head_dim, keys.head_dim()),
                ("value head_dim", head_dim, values.head_dim()),
                ("value rows", keys.num_rows(), values.num_rows()),
            ];
            if let Some((k, v)) = older {
                checks.extend([
                    ("older key head_dim", head_dim, k.head_dim()),
                    ("older value head_dim", head_dim, v.head_dim()),
                    ("older value rows", k.num_rows(), v.num_rows()),
                ]);
            }
            for (what, expected, got) in checks {
                if expected != got {
                    return Err(Error::ShapeMismatch { op: OP, what, expected, got });
                }
            }
            let (ok, ov) = older.map_or((&[][..], &[][..]), |(k, v)| (k.bytes(), v.bytes()));
            let rows = keys.num_rows() + older.map_or(0, |(k, _)| k.num_rows());
            image.entries.push(HeadEntry::rows(rows));
            image.parts.push(vec![pair(ok, keys.bytes()), pair(ov, values.bytes())]);
        }
        Ok(image)
    }

    /// Attaches the identity block (e.g. model, projection and cache-spec fingerprints).
    pub fn with_identity(mut self, identity: &'a [u8]) -> Self {
        self.identity = identity;
        self.format.identity_bytes = identity.len() as u64;
        self
    }

    /// Attaches the extra block (caller state, e.g. the prompt's token ids).
    pub fn with_extra(mut self, extra: &'a [u8]) -> Self {
        self.extra = extra;
        self.format.extra_bytes = extra.len() as u64;
        self
    }

    /// The layout the image will be written with.
    pub fn layout(&self) -> CacheLayout {
        self.format.layout
    }

    fn plan(&self) -> Result<Plan> {
        let meta = place_meta(&self.format, u64::MAX)?;
        let mut cursor = meta.end;
        let mut layouts = Vec::with_capacity(self.entries.len());
        for entry in &self.entries {
            let (layout, end) = place_head(entry, &self.format, cursor, u64::MAX)?;
            layouts.push(layout);
            cursor = end;
        }
        Ok(Plan { meta, layouts, file_bytes: cursor })
    }

    /// Feeds the metadata after the header (directory, head-checksum table `crcs`, blocks)
    /// to `sink`.
    fn emit_meta(
        &self,
        plan: &Plan,
        crcs: &[u32],
        sink: &mut dyn FnMut(&[u8]) -> std::io::Result<()>,
    ) -> std::io::Result<()> {
        let entries: &[u8] = bytemuck::cast_slice(&self.entries);
        let table: Vec<u8> = crcs.iter().flat_map(|c| c.to_le_bytes()).collect();
        let mut e = Emitter { pos: HEADER_BYTES, sink };
        e.section(&plan.meta.directory, [entries, &[]])?;
        e.section(&plan.meta.head_crcs, [&table, &[]])?;
        e.section(&plan.meta.identity, [self.identity, &[]])?;
        e.section(&plan.meta.extra, [self.extra, &[]])
    }

    /// Feeds head `h`'s span (padding and sections, starting where head `h - 1` or the
    /// metadata ends) to `sink`.
    fn emit_head(
        &self,
        plan: &Plan,
        h: usize,
        start: usize,
        sink: &mut dyn FnMut(&[u8]) -> std::io::Result<()>,
    ) -> std::io::Result<usize> {
        let ranges = plan.layouts[h].ordered(&self.format.layout);
        debug_assert_eq!(ranges.len(), self.parts[h].len());
        let mut e = Emitter { pos: start, sink };
        for (range, part) in ranges.iter().zip(&self.parts[h]) {
            e.section(range, [&part[0], &part[1]])?;
        }
        Ok(e.pos)
    }

    /// Streams every head to `sink`, returning each head's CRC-32.
    fn emit_heads(
        &self,
        plan: &Plan,
        sink: &mut dyn FnMut(&[u8]) -> std::io::Result<()>,
    ) -> std::io::Result<Vec<u32>> {
        // `meta.end` is a real offset in a file whose size fits a `u64` (the plan's).
        let mut pos = plan.meta.end as usize;
        let mut crcs = Vec::with_capacity(plan.layouts.len());
        for h in 0..plan.layouts.len() {
            let mut hasher = crc32fast::Hasher::new();
            pos = self.emit_head(plan, h, pos, &mut |b| {
                hasher.update(b);
                sink(b)
            })?;
            crcs.push(hasher.finalize());
        }
        Ok(crcs)
    }

    /// The metadata CRC-32 once the head checksums are known.
    fn meta_crc(&self, plan: &Plan, crcs: &[u32]) -> u32 {
        let mut hasher = crc32fast::Hasher::new();
        self.emit_meta(plan, crcs, &mut |b| {
            hasher.update(b);
            Ok(())
        })
        .expect("hashing cannot fail");
        hasher.finalize()
    }

    /// The file image in memory (what [`CacheImage::write`] writes).
    ///
    /// # Errors
    /// [`Error::Corrupt`] only if the counts overflow a `u64` file size.
    pub fn encode(&self) -> Result<Vec<u8>> {
        let plan = self.plan()?;
        let mut out = Vec::with_capacity(plan.file_bytes as usize);
        out.extend_from_slice(&[0u8; HEADER_BYTES]);
        let mut push = |b: &[u8]| {
            out.extend_from_slice(b);
            Ok(())
        };
        let zeros = vec![0u32; self.entries.len()];
        self.emit_meta(&plan, &zeros, &mut push).expect("writing to a Vec cannot fail");
        let crcs = self.emit_heads(&plan, &mut push).expect("writing to a Vec cannot fail");
        out[plan.meta.head_crcs.clone()]
            .copy_from_slice(&crcs.iter().flat_map(|c| c.to_le_bytes()).collect::<Vec<_>>());
        let header = FileHeader::new(&self.format, plan.file_bytes, self.meta_crc(&plan, &crcs));
        out[..HEADER_BYTES].copy_from_slice(bytemuck::bytes_of(&header));
        Ok(out)
    }

    /// Writes the file to a temporary sibling of `path` in one pass (the head checksums are
    /// computed while streaming; the checksum table and the header are written last) and
    /// renames it into place, so a reader never sees a half-written file.
    ///
    /// # Errors
    /// [`Error::Io`] on file-system errors.
    pub fn write(&self, path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        let plan = self.plan()?;
        let tmp = temp_path(path);
        let written = self.write_file(&tmp, &plan).and_then(|()| {
            std::fs::rename(&tmp, path)
                .map_err(|source| io_error("persist::write (rename)", path, source))
        });
        if written.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        written
    }

    fn write_file(&self, tmp: &Path, plan: &Plan) -> Result<()> {
        let err = |source| io_error(OP, tmp, source);
        let file = File::create(tmp).map_err(err)?;
        let mut w = BufWriter::with_capacity(1 << 20, file);
        w.write_all(&[0u8; HEADER_BYTES]).map_err(err)?;
        let zeros = vec![0u32; self.entries.len()];
        self.emit_meta(plan, &zeros, &mut |b| w.write_all(b)).map_err(err)?;
        let crcs = self.emit_heads(plan, &mut |b| w.write_all(b)).map_err(err)?;
        let table: Vec<u8> = crcs.iter().flat_map(|c| c.to_le_bytes()).collect();
        w.seek(SeekFrom::Start(plan.meta.head_crcs.start as u64)).map_err(err)?;
        w.write_all(&table).map_err(err)?;
        let header = FileHeader::new(&self.format, plan.file_bytes, self.meta_crc(plan, &crcs));
        w.rewind().map_err(err)?;
        w.write_all(bytemuck::bytes_of(&header)).map_err(err)?;
        let file = w.into_inner().map_err(|e| err(e.into_error()))?;
        file.sync_all().map_err(err)
    }
}

/// Writes one hybrid cache to `path` (a file of 1 layer × 1 kv-head).
///
/// The file is written to a temporary sibling and renamed into place, so a reader never
/// sees a half-written file.
///
/// # Errors
/// [`Error::Io`] on file-system errors.
///
/// # Examples
/// ```
/// use kv_sparse::hybrid::{HybridCache, HybridConfig};
/// use kv_sparse::persist::{self, MappedCache};
/// let mut cache = HybridCache::<u8, half::f16, half::f16>::new(HybridConfig::new(4, 1, 2))?;
/// cache.extend(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0], &[0.5; 8])?;
/// let dir = tempfile::tempdir().unwrap();
/// let path = dir.path().join("prefix.kvs");
/// persist::write_cache(&path, &cache)?;
/// let mapped = MappedCache::read(&path)?;
/// let view = mapped.view::<u8, half::f16, half::f16>(0, 0)?;
/// assert_eq!(view.sparse_keys.row(0).unwrap().indices, &[2, 3]);
/// # Ok::<(), kv_sparse::Error>(())
/// ```
pub fn write_cache<I: SparseIndex, V: Value, D: Value>(
    path: impl AsRef<Path>,
    cache: &HybridCache<I, V, D>,
) -> Result<()> {
    write_views(path, 1, 1, &[(*cache.config(), cache.view())])
}

/// Writes every head of a multi-head cache to `path`.
///
/// # Errors
/// [`Error::Io`] on file-system errors.
pub fn write_multi<I: SparseIndex, V: Value, D: Value>(
    path: impl AsRef<Path>,
    cache: &MultiHeadCache<I, V, D>,
) -> Result<()> {
    let heads: Vec<_> = cache.heads().iter().map(|h| (*h.config(), h.view())).collect();
    write_views(path, cache.num_layers(), cache.kv_heads(), &heads)
}

/// Writes `num_layers × kv_heads` CSR heads given as (config, view) pairs, layer-major
/// (e.g. views of a [`super::MappedCache`], to re-save it).
///
/// # Errors
/// [`Error::ShapeMismatch`] when the head count or a view's shape does not match;
/// [`Error::Io`] on file-system errors.
pub fn write_views<I: SparseIndex, V: Value, D: Value>(
    path: impl AsRef<Path>,
    num_layers: usize,
    kv_heads: usize,
    heads: &[(HybridConfig, HybridView<'_, I, V, D>)],
) -> Result<()> {
    CacheImage::csr(num_layers, kv_heads, heads)?.write(path)
}

/// Encodes CSR heads into an in-memory file image (what [`write_views`] would write).
///
/// # Errors
/// [`Error::ShapeMismatch`] as [`write_views`].
pub fn encode_views<I: SparseIndex, V: Value, D: Value>(
    num_layers: usize,
    kv_heads: usize,
    heads: &[(HybridConfig, HybridView<'_, I, V, D>)],
) -> Result<Vec<u8>> {
    CacheImage::csr(num_layers, kv_heads, heads)?.encode()
}

fn temp_path(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(format!(".tmp-{}", std::process::id()));
    path.with_file_name(name)
}

fn io_error(op: &'static str, path: &Path, source: std::io::Error) -> Error {
    Error::Io { op, path: path.to_path_buf(), source }
}

/// A hybrid head to be written must agree with its config and the file's head_dim.
fn check_hybrid<S: RowStore, D: Value>(
    head_dim: usize,
    cfg: &HybridConfig,
    view_head_dim: usize,
    rows_per_block: [usize; 2],
    scales: (f32, f32),
) -> Result<()> {
    cfg.validate_store::<S, D>()?;
    let checks = [
        ("head_dim", head_dim, cfg.head_dim),
        ("view head_dim", head_dim, view_head_dim),
        ("key rows_per_block", cfg.rows_per_block, rows_per_block[0]),
        ("value rows_per_block", cfg.rows_per_block, rows_per_block[1]),
    ];
    for (what, expected, got) in checks {
        if expected != got {
            return Err(Error::ShapeMismatch { op: OP, what, expected, got });
        }
    }
    if scales != cfg.scales() {
        return Err(Error::ScaleMismatch { op: OP, expected: cfg.scales(), got: scales });
    }
    Ok(())
}

/// The older rows of a continued history must have the config's head_dim and rows per
/// block, and as many key rows as value rows.
fn check_older(
    cfg: &HybridConfig,
    (head_dims, rows_per_block): ([usize; 2], [usize; 2]),
    (keys, values): (usize, usize),
) -> Result<()> {
    let checks = [
        ("older key head_dim", cfg.head_dim, head_dims[0]),
        ("older value head_dim", cfg.head_dim, head_dims[1]),
        ("older key rows_per_block", cfg.rows_per_block, rows_per_block[0]),
        ("older value rows_per_block", cfg.rows_per_block, rows_per_block[1]),
        ("older value rows", keys, values),
    ];
    for (what, expected, got) in checks {
        if expected != got {
            return Err(Error::ShapeMismatch { op: OP, what, expected, got });
        }
    }
    Ok(())
}

fn check_buffer(cfg: &HybridConfig, buffer_len: usize) -> Result<()> {
    if buffer_len > cfg.buffer {
        let what = "buffer rows (at most the capacity)";
        return Err(Error::ShapeMismatch { op: OP, what, expected: cfg.buffer, got: buffer_len });
    }
    Ok(())
}
