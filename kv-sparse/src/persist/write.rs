//! Writing caches to the on-disk format (header, directory, aligned sections, CRC-32s).
//!
//! Persists SWAN's hybrid cache state (method section, Algorithm 1) for prefix reuse:
//! the CSR history of every head plus its dense buffer, exactly as held in memory.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use super::header::{ENTRY_BYTES, FileFormat, FileHeader, HEADER_BYTES, HeadEntry};
use super::layout::{HeadLayout, place_head};
use crate::hybrid::{HybridCache, HybridConfig, HybridView, MultiHeadCache};
use crate::{Error, Result, SparseIndex, Value};

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

/// Writes `num_layers × kv_heads` heads given as (config, view) pairs, layer-major
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
    let path = path.as_ref();
    let plan = Plan::new(num_layers, kv_heads, heads)?;
    let tmp = temp_path(path);
    let written = write_file(&tmp, &plan, heads).and_then(|()| {
        std::fs::rename(&tmp, path)
            .map_err(|source| io_error("persist::write (rename)", path, source))
    });
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

/// Encodes heads into an in-memory file image (what [`write_views`] would write).
///
/// # Errors
/// [`Error::ShapeMismatch`] as [`write_views`].
pub fn encode_views<I: SparseIndex, V: Value, D: Value>(
    num_layers: usize,
    kv_heads: usize,
    heads: &[(HybridConfig, HybridView<'_, I, V, D>)],
) -> Result<Vec<u8>> {
    let plan = Plan::new(num_layers, kv_heads, heads)?;
    let mut out = Vec::with_capacity(plan.file_bytes as usize);
    out.extend_from_slice(bytemuck::bytes_of(&plan.header(heads)));
    plan.emit(heads, &mut |b| {
        out.extend_from_slice(b);
        Ok(())
    })
    .expect("writing to a Vec cannot fail");
    Ok(out)
}

fn temp_path(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(format!(".tmp-{}", std::process::id()));
    path.with_file_name(name)
}

fn io_error(op: &'static str, path: &Path, source: std::io::Error) -> Error {
    Error::Io { op, path: path.to_path_buf(), source }
}

fn write_file<I: SparseIndex, V: Value, D: Value>(
    tmp: &Path,
    plan: &Plan,
    heads: &[(HybridConfig, HybridView<'_, I, V, D>)],
) -> Result<()> {
    let err = |source| io_error("persist::write", tmp, source);
    let file = File::create(tmp).map_err(err)?;
    let mut w = BufWriter::with_capacity(1 << 20, file);
    w.write_all(bytemuck::bytes_of(&plan.header(heads))).map_err(err)?;
    plan.emit(heads, &mut |b| w.write_all(b)).map_err(err)?;
    let file = w.into_inner().map_err(|e| err(e.into_error()))?;
    file.sync_all().map_err(err)
}

/// The file's format, directory and section layout, derived from the heads.
struct Plan {
    format: FileFormat,
    entries: Vec<HeadEntry>,
    layouts: Vec<HeadLayout>,
    file_bytes: u64,
}

impl Plan {
    fn new<I: SparseIndex, V: Value, D: Value>(
        num_layers: usize,
        kv_heads: usize,
        heads: &[(HybridConfig, HybridView<'_, I, V, D>)],
    ) -> Result<Self> {
        const OP: &str = "persist::write";
        let expected = num_layers * kv_heads;
        if heads.is_empty() || heads.len() != expected {
            let got = heads.len();
            return Err(Error::ShapeMismatch { op: OP, what: "number of heads", expected, got });
        }
        let head_dim = heads[0].0.head_dim;
        let format = FileFormat {
            head_dim,
            index_bytes: I::BYTES,
            value: V::FORMAT,
            dense: D::FORMAT,
            num_layers,
            kv_heads,
        };
        let mut entries = Vec::with_capacity(heads.len());
        for (cfg, view) in heads {
            check_head(OP, head_dim, cfg, view)?;
            let nnz = (view.sparse_keys.nnz(), view.sparse_values.nnz());
            entries.push(HeadEntry::new(cfg, view.sparse_len(), nnz, view.buffer_len()));
        }
        let mut cursor = (HEADER_BYTES + ENTRY_BYTES * entries.len()) as u64;
        let mut layouts = Vec::with_capacity(entries.len());
        for entry in &entries {
            let (layout, end) = place_head(entry, &format, cursor, u64::MAX)?;
            layouts.push(layout);
            cursor = end;
        }
        Ok(Self { format, entries, layouts, file_bytes: cursor })
    }

    fn header<I: SparseIndex, V: Value, D: Value>(
        &self,
        heads: &[(HybridConfig, HybridView<'_, I, V, D>)],
    ) -> FileHeader {
        let mut hasher = crc32fast::Hasher::new();
        self.emit(heads, &mut |b| {
            hasher.update(b);
            Ok(())
        })
        .expect("hashing cannot fail");
        FileHeader::new(&self.format, self.file_bytes, hasher.finalize())
    }

    /// Feeds everything after the header (directory, padding, sections) to `sink`.
    fn emit<I: SparseIndex, V: Value, D: Value>(
        &self,
        heads: &[(HybridConfig, HybridView<'_, I, V, D>)],
        sink: &mut dyn FnMut(&[u8]) -> std::io::Result<()>,
    ) -> std::io::Result<()> {
        let mut pos = HEADER_BYTES;
        for entry in &self.entries {
            sink(bytemuck::bytes_of(entry))?;
            pos += ENTRY_BYTES;
        }
        let mut section = |start: usize, parts: &[&[u8]]| -> std::io::Result<()> {
            sink(&[0u8; 64][..start - pos])?;
            for part in parts {
                sink(part)?;
            }
            pos = start + parts.iter().map(|p| p.len()).sum::<usize>();
            Ok(())
        };
        for ((_, view), layout) in heads.iter().zip(&self.layouts) {
            for (csr, at) in
                [(view.sparse_keys, &layout.keys), (view.sparse_values, &layout.values)]
            {
                section(at.bases.start, &[bytemuck::cast_slice(csr.block_bases())])?;
                section(at.offsets.start, &[bytemuck::cast_slice(csr.offsets())])?;
                section(at.indices.start, &[bytemuck::cast_slice(csr.indices())])?;
                section(at.values.start, &[bytemuck::cast_slice(csr.values())])?;
            }
            for ((a, b), at) in [
                (view.buffer_keys, &layout.buffer_keys),
                (view.buffer_values, &layout.buffer_values),
            ] {
                section(at.start, &[bytemuck::cast_slice(a), bytemuck::cast_slice(b)])?;
            }
        }
        Ok(())
    }
}

/// A head to be written must agree with its config and the file's head_dim.
fn check_head<I: SparseIndex, V: Value, D: Value>(
    op: &'static str,
    head_dim: usize,
    cfg: &HybridConfig,
    view: &HybridView<'_, I, V, D>,
) -> Result<()> {
    cfg.validate::<I, D>()?;
    view.check_shape(op)?;
    let checks = [
        ("head_dim", head_dim, cfg.head_dim),
        ("view head_dim", head_dim, view.head_dim),
        ("key rows_per_block", cfg.rows_per_block, view.sparse_keys.rows_per_block()),
        ("value rows_per_block", cfg.rows_per_block, view.sparse_values.rows_per_block()),
        ("buffer rows (at most the capacity)", cfg.buffer, cfg.buffer.max(view.buffer_len())),
    ];
    for (what, expected, got) in checks {
        if expected != got {
            return Err(Error::ShapeMismatch { op, what, expected, got });
        }
    }
    if view.value_scale != cfg.scales() {
        return Err(Error::ScaleMismatch { op, expected: cfg.scales(), got: view.value_scale });
    }
    Ok(())
}
