//! Upload forms of the encoded KV formats the GPU kernels of `cuda/quant.cu` and
//! `cuda/coded.cu` read, and the checks that make their bytes safe to hand to a kernel.
//!
//! Owns the host side of the row sources of `cuda/encoded.cuh`:
//!
//! * [`PackedQuant`] — dense quantized rows of every kv-head (`kv-sparse`'s `quant`: q8_0
//!   int8 blocks, q4_0 int4 blocks, fp8 E4M3 with one f16 scale per token), rows
//!   concatenated as stored — the dense baselines SWAN is measured against;
//! * [`PackedCoded`] — SWAN's coded sparse rows (method section, "Memory footprint";
//!   `kv-sparse`'s `coded`: a u8/u16 index list or a `d_h`-bit mask, then fp8 values under the
//!   per-head scale or int8/int4 values after one f16 scale per row), paged like
//!   [`super::PackedCsr`] and uploaded without repacking;
//! * [`PackedCodedHybrid`] — a layer of SWAN hybrid caches over coded rows (§3: coded history
//!   plus dense buffer, one softmax);
//! * [`CodedHeadsArgs`] — the `#[repr(C)]` twin of the C `CodedHeads`, size-checked.
//!
//! Validation is kv-sparse's own: every head of a packed cache is re-read through
//! `QuantView::from_bytes` / `CodedView::from_parts` (scales, row lengths, ascending indices
//! below `head_dim`, mask popcounts), so a corrupt cache is a typed [`Error`] before any
//! kernel runs, never a panic or an out-of-bounds read.

use kv_sparse::Value;
use kv_sparse::ValueFormat;
use kv_sparse::coded::{
    Bitmask, CodedStore, CodedView, Elems, IndexCode, IndexKind, Int4Values, Int8Values, List,
    ValueCode, ValueKind,
};
use kv_sparse::fp8::Fp8E4M3;
use kv_sparse::hybrid::CodedHybridView;
use kv_sparse::quant::{DenseCodec, DenseFormat, Fp8Rows, Int4Blocks, Int8Blocks, QuantView};

use super::layout::{PackedDense, decode_value};
use crate::views::{CodedHybridSource, QuantKv};
use crate::{Error, Result};

/// The C `CodedHeads` parameter block (see `cuda/encoded.cuh`). Pointers are device addresses.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct CodedHeadsArgs {
    /// `bytes` device pointer (all heads' row bytes).
    pub bytes: u64,
    /// `offsets` device pointer.
    pub offsets: u64,
    /// `block_base` device pointer.
    pub block_base: u64,
    /// `head_base` device pointer.
    pub head_base: u64,
    /// Rows per head.
    pub rows: u32,
    /// Rows per block.
    pub rows_per_block: u32,
    /// Blocks per head.
    pub n_blocks: u32,
    /// Per-head multiplier of decoded values.
    pub value_scale: f32,
}

const _: () = assert!(std::mem::size_of::<CodedHeadsArgs>() == 48);

fn no_heads(op: &'static str) -> Error {
    Error::Param { op, what: "kv-heads", value: "0".into(), expected: ">= 1" }
}

fn f16_at(bytes: &[u8], at: usize) -> f32 {
    half::f16::from_le_bytes([bytes[at], bytes[at + 1]]).to_f32()
}

/// Dense quantized rows of every kv-head, `[kv_heads][rows][row_bytes]`, as kv-sparse
/// stores them (the upload form of `quant_decode_<format>`).
#[derive(Clone, Debug, PartialEq)]
pub struct PackedQuant {
    /// Row codec.
    pub format: DenseFormat,
    /// Head dimension.
    pub head_dim: usize,
    /// kv-heads.
    pub kv_heads: usize,
    /// Rows per head.
    pub rows: usize,
    /// Every head's rows, concatenated.
    pub data: Vec<u8>,
}

impl PackedQuant {
    /// Packs the rows of every kv-head, each given as its parts in token order (e.g. a
    /// reopened file's prefix, then the rows appended since).
    ///
    /// # Errors
    /// [`Error::Param`] for no heads; [`Error::HeadDimMismatch`] / [`Error::RowCountMismatch`]
    /// when heads disagree.
    pub fn from_views<C: DenseCodec>(heads: &[&[QuantView<'_, C>]]) -> Result<Self> {
        const OP: &str = "PackedQuant::from_views";
        let first = heads.first().ok_or_else(|| no_heads(OP))?;
        let head_dim = first.first().map_or(0, QuantView::head_dim);
        let rows = first.iter().map(QuantView::num_rows).sum();
        let mut data = Vec::with_capacity(heads.len() * rows * C::row_bytes(head_dim));
        for (h, parts) in heads.iter().enumerate() {
            if let Some(p) = parts.iter().find(|p| p.head_dim() != head_dim) {
                let got = p.head_dim();
                return Err(Error::HeadDimMismatch { op: OP, kv_head: h, expected: head_dim, got });
            }
            let n: usize = parts.iter().map(QuantView::num_rows).sum();
            if n != rows {
                let part = "quantized";
                return Err(Error::RowCountMismatch {
                    op: OP,
                    kv_head: h,
                    part,
                    keys: rows,
                    values: n,
                });
            }
            parts.iter().for_each(|p| data.extend_from_slice(p.bytes()));
        }
        Ok(Self { format: C::FORMAT, head_dim, kv_heads: heads.len(), rows, data })
    }

    /// Packs the keys and the values of a layer of [`QuantKv`] (one per kv-head, prefixes
    /// included).
    ///
    /// # Errors
    /// As [`PackedQuant::from_views`].
    ///
    /// # Examples
    /// ```
    /// use attn_kernels::QuantKv;
    /// use attn_kernels::cuda::PackedQuant;
    /// use kv_sparse::quant::{Int8Blocks, QuantRows};
    /// let mut rows = QuantRows::<Int8Blocks>::new(32)?;
    /// rows.push(&[0.5; 64])?; // two rows
    /// let (k, v) = PackedQuant::pair(&[QuantKv::new(rows.view(), rows.view())])?;
    /// assert_eq!((k.rows, k.row_bytes(), v.data.len()), (2, 34, 68));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn pair<K: DenseCodec, V: DenseCodec>(kv: &[QuantKv<'_, K, V>]) -> Result<(Self, Self)> {
        let mut keys: Vec<Vec<QuantView<'_, K>>> = Vec::with_capacity(kv.len());
        let mut values: Vec<Vec<QuantView<'_, V>>> = Vec::with_capacity(kv.len());
        for h in kv {
            if !h.sink.0.is_empty() {
                return Err(crate::Error::GpuUnsupported {
                    op: "PackedQuant::pair",
                    what: "sink rows kept in f32 before the quantized rows".into(),
                });
            }
            if h.buffer.is_some() {
                return Err(crate::Error::GpuUnsupported {
                    op: "PackedQuant::pair",
                    what: "a recent-token buffer of dense rows after the quantized rows".into(),
                });
            }
            let (pk, pv) = h.prefix.map_or((None, None), |(k, v)| (Some(k), Some(v)));
            keys.push(pk.into_iter().chain([h.keys]).collect());
            values.push(pv.into_iter().chain([h.values]).collect());
        }
        let keys = Self::from_views(&keys.iter().map(Vec::as_slice).collect::<Vec<_>>())?;
        let values = Self::from_views(&values.iter().map(Vec::as_slice).collect::<Vec<_>>())?;
        Ok((keys, values))
    }

    /// Bytes of one row.
    pub fn row_bytes(&self) -> usize {
        self.format.row_bytes(self.head_dim)
    }

    /// Number of kv-heads (the field, read like [`super::PackedCsr::kv_heads`]).
    pub fn kv_heads(&self) -> usize {
        self.kv_heads
    }

    /// The bytes of row `r` of head `h`.
    ///
    /// # Panics
    /// If `h` or `r` is out of range, or `data` is shorter than [`PackedQuant::check`] requires.
    pub fn row(&self, h: usize, r: usize) -> &[u8] {
        let rb = self.row_bytes();
        let at = (h * self.rows + r) * rb;
        &self.data[at..at + rb]
    }

    /// Row `r` of head `h` decoded into `out` (`head_dim` elements; exact given the bytes,
    /// as the kernels decode it).
    pub fn decode_row(&self, h: usize, r: usize, out: &mut [f32]) {
        let row = self.row(h, r);
        match self.format {
            DenseFormat::Int8 => Int8Blocks::decode(row, out),
            DenseFormat::Int4 => Int4Blocks::decode(row, out),
            DenseFormat::Fp8 => Fp8Rows::decode(row, out),
        }
    }

    /// Bytes the kernels read: every row, as stored.
    pub fn bytes_read(&self) -> usize {
        self.data.len()
    }

    /// Checks what the kernels trust: whole rows of every head, a head_dim the codec can
    /// encode, and every row's scales (and fp8 codes) through kv-sparse's `QuantView`.
    ///
    /// # Errors
    /// [`Error::LengthMismatch`] for the byte count; kv-sparse's row errors as
    /// [`Error::Sparse`].
    pub fn check(&self, op: &'static str) -> Result<()> {
        let want = self.kv_heads * self.rows * self.row_bytes();
        if self.data.len() != want {
            let got = self.data.len();
            return Err(Error::LengthMismatch { op, what: "quantized bytes", expected: want, got });
        }
        let head = self.rows * self.row_bytes();
        for h in 0..self.kv_heads {
            let bytes = &self.data[h * head..(h + 1) * head];
            match self.format {
                DenseFormat::Int8 => {
                    QuantView::<Int8Blocks>::from_bytes(self.head_dim, bytes).map(|_| ())?
                }
                DenseFormat::Int4 => {
                    QuantView::<Int4Blocks>::from_bytes(self.head_dim, bytes).map(|_| ())?
                }
                DenseFormat::Fp8 => {
                    QuantView::<Fp8Rows>::from_bytes(self.head_dim, bytes).map(|_| ())?
                }
            }
        }
        Ok(())
    }
}

/// One coded row decoded as the kernels walk it: entries in stored order and the multiplier
/// of their codes (the row's f16 scale, 1 for element values, times the per-head scale).
#[derive(Clone, Debug, PartialEq)]
pub struct CodedEntries {
    /// `(component, code)` per kept entry, in stored (ascending) order.
    pub entries: Vec<(usize, f32)>,
    /// The row's own f16 scale (1 for element values and for empty rows).
    pub row_scale: f32,
    /// What the kernels multiply codes by: `row_scale` × the per-head scale, in f32 (0 for
    /// an empty row).
    pub factor: f32,
}

/// SWAN coded rows of every kv-head in the kernels' layout (module docs): kv-sparse's
/// per-head row bytes, u16 row offsets and u64 block bases concatenated as they are, plus a
/// sentinel base per head (its byte count) and each head's absolute byte offset.
#[derive(Clone, Debug, PartialEq)]
pub struct PackedCoded {
    /// Index code of every row.
    pub index: IndexKind,
    /// Value code of every row.
    pub value: ValueKind,
    /// Head dimension.
    pub head_dim: usize,
    /// Rows per head (equal for every head).
    pub rows: usize,
    /// Rows per block.
    pub rows_per_block: usize,
    /// Blocks per head.
    pub n_blocks: usize,
    /// Row bytes of all heads.
    pub bytes: Vec<u8>,
    /// `[kv_heads][rows]` byte offsets relative to their block.
    pub offsets: Vec<u16>,
    /// `[kv_heads][n_blocks + 1]` byte bases relative to the head (last = head bytes).
    pub block_base: Vec<u64>,
    /// `[kv_heads]` absolute byte offset of each head.
    pub head_base: Vec<u64>,
    /// Per-head multiplier of decoded values (the hybrid cache's scale; 1 otherwise).
    pub scale: f32,
}

impl PackedCoded {
    /// Packs one [`CodedView`] per kv-head (all with the same rows, head_dim, block size).
    ///
    /// # Errors
    /// [`Error::Param`] for no heads; [`Error::HeadDimMismatch`] / [`Error::RowCountMismatch`]
    /// when heads disagree; [`Error::InvalidValueScale`] for a bad scale.
    pub fn from_views<X: IndexCode, Y: ValueCode>(
        views: &[CodedView<'_, X, Y>],
        scale: f32,
    ) -> Result<Self> {
        const OP: &str = "PackedCoded::from_views";
        let first = views.first().ok_or_else(|| no_heads(OP))?;
        if !(scale.is_finite() && scale > 0.0) {
            return Err(Error::InvalidValueScale { op: OP, kv_head: 0, what: "coded", scale });
        }
        let mut p = Self {
            index: X::KIND,
            value: Y::KIND,
            head_dim: first.head_dim(),
            rows: first.num_rows(),
            rows_per_block: first.rows_per_block(),
            n_blocks: first.block_bases().len(),
            bytes: Vec::new(),
            offsets: Vec::with_capacity(views.len() * first.num_rows()),
            block_base: Vec::new(),
            head_base: Vec::with_capacity(views.len()),
            scale,
        };
        for (h, v) in views.iter().enumerate() {
            if v.head_dim() != p.head_dim {
                let (expected, got) = (p.head_dim, v.head_dim());
                return Err(Error::HeadDimMismatch { op: OP, kv_head: h, expected, got });
            }
            if v.num_rows() != p.rows || v.rows_per_block() != p.rows_per_block {
                let (keys, values) = (p.rows, v.num_rows());
                return Err(Error::RowCountMismatch {
                    op: OP,
                    kv_head: h,
                    part: "coded",
                    keys,
                    values,
                });
            }
            p.head_base.push(p.bytes.len() as u64);
            p.bytes.extend_from_slice(v.bytes());
            p.offsets.extend_from_slice(v.offsets());
            p.block_base.extend_from_slice(v.block_bases());
            p.block_base.push(v.bytes().len() as u64);
        }
        Ok(p)
    }

    /// Number of kv-heads.
    pub fn kv_heads(&self) -> usize {
        self.head_base.len()
    }

    /// `(start, end)` byte range of row `r` of head `h` (the kernels' `coded_row_start`).
    pub fn row_range(&self, h: usize, r: usize) -> (usize, usize) {
        let start = |r: usize| {
            let hb = h * (self.n_blocks + 1);
            let base = self.head_base[h] as usize;
            if r >= self.rows {
                return base + self.block_base[hb + self.n_blocks] as usize;
            }
            base + self.block_base[hb + r / self.rows_per_block] as usize
                + usize::from(self.offsets[h * self.rows + r])
        };
        (start(r), start(r + 1))
    }

    /// Index-part bytes of every row whatever its `k` (the mask), and bytes per list entry.
    fn index_layout(&self) -> (usize, usize) {
        match self.index {
            IndexKind::ListU8 => (0, 1),
            IndexKind::ListU16 => (0, 2),
            _ => (self.head_dim.div_ceil(8), 0),
        }
    }

    /// Entries of a row whose bytes after the index part's fixed bytes number `rest`, as
    /// the kernels' `k_for` computes them (floor division; exact on checked rows).
    fn k_for(&self, rest: usize, entry: usize) -> usize {
        match self.value {
            ValueKind::Elems(f) => rest / (entry + f.bytes()),
            ValueKind::Int4 if rest >= 2 => 2 * ((rest - 2) / (2 * entry + 1)),
            ValueKind::Int8 if rest >= 2 => (rest - 2) / (entry + 1),
            _ => 0,
        }
    }

    /// Code `j` of a value part and the part's row scale.
    fn code(&self, vals: &[u8], j: usize) -> f32 {
        match self.value {
            ValueKind::Elems(f) => decode_value(f, vals, j),
            ValueKind::Int8 => f32::from(vals[2 + j] as i8),
            _ => {
                let b = vals[2 + j / 2];
                f32::from(if j % 2 == 1 { b >> 4 } else { b & 15 }) - 8.0
            }
        }
    }

    /// Row `r` of head `h` as the kernels walk it (`coded_row` + the index code's `walk`):
    /// entries with an index at or past `head_dim` are dropped, like the kernels skip them.
    ///
    /// # Panics
    /// If `h` or the row's byte range is out of bounds, which a cache that passed
    /// [`PackedCoded::check`] never has (the decode backends check first).
    pub fn entries(&self, h: usize, r: usize) -> CodedEntries {
        let (s, e) = self.row_range(h, r);
        let row = &self.bytes[s..e.max(s)];
        let (fixed, entry) = self.index_layout();
        let d = self.head_dim;
        let k = if row.len() < fixed { 0 } else { self.k_for(row.len() - fixed, entry).min(d) };
        let vals = &row[(fixed + k * entry).min(row.len())..];
        let row_scale = match (k, self.value) {
            (0, _) | (_, ValueKind::Elems(_)) => 1.0,
            _ => f16_at(vals, 0),
        };
        let factor = if k == 0 { 0.0 } else { row_scale * self.scale };
        let indices: Vec<usize> = match self.index {
            IndexKind::ListU8 => row[..k].iter().map(|&i| usize::from(i)).collect(),
            IndexKind::ListU16 => (0..k)
                .map(|j| usize::from(u16::from_le_bytes([row[2 * j], row[2 * j + 1]])))
                .collect(),
            _ => (0..fixed * 8).filter(|&i| row[i / 8] >> (i % 8) & 1 == 1).take(k).collect(),
        };
        let entries = indices
            .into_iter()
            .enumerate()
            .map(|(j, i)| (i, self.code(vals, j)))
            .filter(|&(i, _)| i < d)
            .collect();
        CodedEntries { entries, row_scale, factor }
    }

    /// Bytes the kernels read: row bytes, row offsets and block bases, as stored.
    pub fn bytes_read(&self) -> usize {
        self.bytes.len() + 2 * self.offsets.len() + 8 * self.block_base.len()
    }

    /// Checks what the kernels trust: array lengths, each head's byte extent, and every head
    /// re-read through kv-sparse's `CodedView::from_parts` (blocks and offsets ordered, each
    /// row's length fitting a `k`, indices ascending below `head_dim`, mask popcounts, row
    /// scales finite and non-zero, values finite).
    ///
    /// # Errors
    /// [`Error::LengthMismatch`] / [`Error::Param`] for the layout; kv-sparse's row errors
    /// as [`Error::Sparse`]; [`Error::GpuUnsupported`] for an index × value code pair no
    /// kernel reads.
    pub fn check(&self, op: &'static str) -> Result<()> {
        let kv_heads = self.kv_heads();
        let lens = [
            ("coded offsets", self.offsets.len(), kv_heads * self.rows),
            ("coded block bases", self.block_base.len(), kv_heads * (self.n_blocks + 1)),
            ("coded blocks", self.n_blocks, self.rows.div_ceil(self.rows_per_block.max(1))),
        ];
        for (what, got, expected) in lens {
            if got != expected {
                return Err(Error::LengthMismatch { op, what, expected, got });
            }
        }
        for h in 0..kv_heads {
            let hb = h * (self.n_blocks + 1);
            let start = self.head_base[h] as usize;
            let len = self.block_base[hb + self.n_blocks] as usize;
            let next = self.head_base.get(h + 1).map_or(self.bytes.len(), |&b| b as usize);
            if next > self.bytes.len() || start.checked_add(len) != Some(next) {
                return Err(Error::Param {
                    op,
                    what: "coded head extent",
                    value: format!("head {h}: bytes {start}+{len}, next head at {next}"),
                    expected: "heads back to back, the last ending at the byte count",
                });
            }
            let bases = &self.block_base[hb..hb + self.n_blocks];
            let offsets = &self.offsets[h * self.rows..(h + 1) * self.rows];
            self.check_head(op, bases, offsets, &self.bytes[start..next])?;
        }
        Ok(())
    }

    fn check_head(
        &self,
        op: &'static str,
        bases: &[u64],
        offsets: &[u16],
        bytes: &[u8],
    ) -> Result<()> {
        fn view<X: IndexCode, Y: ValueCode>(
            p: &PackedCoded,
            bases: &[u64],
            offsets: &[u16],
            bytes: &[u8],
        ) -> Result<()> {
            CodedView::<X, Y>::from_parts(p.head_dim, p.rows_per_block, bases, offsets, bytes)?;
            Ok(())
        }
        macro_rules! by_value {
            ($x:ty) => {
                match self.value {
                    ValueKind::Elems(ValueFormat::Fp8E4M3) => {
                        view::<$x, Elems<Fp8E4M3>>(self, bases, offsets, bytes)
                    }
                    ValueKind::Elems(ValueFormat::F16) => {
                        view::<$x, Elems<half::f16>>(self, bases, offsets, bytes)
                    }
                    ValueKind::Elems(ValueFormat::Bf16) => {
                        view::<$x, Elems<half::bf16>>(self, bases, offsets, bytes)
                    }
                    ValueKind::Elems(ValueFormat::F32) => {
                        view::<$x, Elems<f32>>(self, bases, offsets, bytes)
                    }
                    ValueKind::Int8 => view::<$x, Int8Values>(self, bases, offsets, bytes),
                    ValueKind::Int4 => view::<$x, Int4Values>(self, bases, offsets, bytes),
                    other => Err(unsupported(op, self.index, other)),
                }
            };
        }
        match self.index {
            IndexKind::ListU8 => by_value!(List<u8>),
            IndexKind::ListU16 => by_value!(List<u16>),
            IndexKind::Bitmask => by_value!(Bitmask),
            other => Err(unsupported(op, other, self.value)),
        }
    }
}

fn unsupported(op: &'static str, index: IndexKind, value: ValueKind) -> Error {
    Error::GpuUnsupported {
        op,
        what: format!("coded rows with {index} indices and {value} values"),
    }
}

/// A layer of SWAN hybrid caches over coded rows (one [`CodedHybridSource`] per kv-head) in
/// upload form: the coded history, then the dense buffer.
#[derive(Clone, Debug, PartialEq)]
pub struct PackedCodedHybrid {
    /// Coded key history.
    pub keys: PackedCoded,
    /// Coded value history.
    pub values: PackedCoded,
    /// Dense buffer keys, token order.
    pub buffer_keys: PackedDense,
    /// Dense buffer values, token order.
    pub buffer_values: PackedDense,
}

impl PackedCodedHybrid {
    /// Packs one source per kv-head (all heads with equal lengths and per-head scales). A
    /// history in two parts ([`CodedHybridSource::history_prefix`]) is joined row by row as
    /// encoded (no re-quantization).
    ///
    /// # Errors
    /// As [`PackedCoded::from_views`] / [`PackedDense::from_rows`];
    /// [`Error::InvalidValueScale`] if heads use different scales; kv-sparse's errors
    /// joining a prefix as [`Error::Sparse`].
    ///
    /// # Examples
    /// ```
    /// use kv_sparse::coded::{Bitmask, Int8Values};
    /// use kv_sparse::hybrid::{CodedHybridCache, HybridConfig};
    /// let mut c = CodedHybridCache::<Bitmask, Int8Values, half::f16>::new(HybridConfig::new(8, 1, 2))?;
    /// c.extend(&[1.0, 0.0, 2.0, 0.5, 0.0, 1.0, 0.0, 3.0, 0.5, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0], &[1.0; 16])?;
    /// let p = attn_kernels::cuda::PackedCodedHybrid::from_sources(&[c])?;
    /// assert_eq!((p.keys.rows, p.buffer_keys.rows), (1, 1));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn from_sources<X: IndexCode, Y: ValueCode, D: Value, H: CodedHybridSource<X, Y, D>>(
        heads: &[H],
    ) -> Result<Self> {
        const OP: &str = "PackedCodedHybrid::from_sources";
        if heads.iter().any(|h| !h.sink_rows().0.is_empty()) {
            return Err(Error::GpuUnsupported {
                op: OP,
                what: "sink rows kept in f32 before the coded hybrid rows".into(),
            });
        }
        let views: Vec<CodedHybridView<'_, X, Y, D>> =
            heads.iter().map(|h| h.coded_view()).collect();
        let (ks, vs) = views.first().map_or((1.0, 1.0), |v| v.value_scale);
        if let Some((h, v)) = views.iter().enumerate().find(|(_, v)| v.value_scale != (ks, vs)) {
            return Err(Error::InvalidValueScale {
                op: OP,
                kv_head: h,
                what: "per-head (key, value)",
                scale: v.value_scale.0,
            });
        }
        let mut joined: Vec<(CodedStore<X, Y>, CodedStore<X, Y>)> = Vec::new();
        for (h, v) in heads.iter().zip(&views) {
            if let Some((pk, pv)) = h.history_prefix() {
                joined.push((join(pk, v.sparse_keys)?, join(pv, v.sparse_values)?));
            }
        }
        let (keys, values): (Vec<_>, Vec<_>) = if joined.is_empty() {
            views.iter().map(|v| (v.sparse_keys, v.sparse_values)).unzip()
        } else if joined.len() == views.len() {
            joined.iter().map(|(k, v)| (k.view(), v.view())).unzip()
        } else {
            return Err(Error::Param {
                op: OP,
                what: "history prefixes",
                value: format!("{} of {} heads", joined.len(), views.len()),
                expected: "every head or none",
            });
        };
        let d = views.first().map_or(0, |v| v.head_dim);
        let bk: Vec<_> = views.iter().map(|v| v.buffer_keys).collect();
        let bv: Vec<_> = views.iter().map(|v| v.buffer_values).collect();
        Ok(Self {
            keys: PackedCoded::from_views(&keys, ks)?,
            values: PackedCoded::from_views(&values, vs)?,
            buffer_keys: PackedDense::from_rows(d, &bk)?,
            buffer_values: PackedDense::from_rows(d, &bv)?,
        })
    }

    /// The cache the decode backends read.
    pub fn as_cache(&self) -> super::LayerCache<'_> {
        super::LayerCache::Coded {
            keys: &self.keys,
            values: &self.values,
            buffer_keys: &self.buffer_keys,
            buffer_values: &self.buffer_values,
        }
    }
}

/// A prefix's rows followed by a view's, as one owned store (rows copied as encoded).
fn join<X: IndexCode, Y: ValueCode>(
    prefix: CodedView<'_, X, Y>,
    rows: CodedView<'_, X, Y>,
) -> Result<CodedStore<X, Y>> {
    let mut s = CodedStore::from_view(prefix);
    for r in rows.rows() {
        s.push_row(r)?;
    }
    Ok(s)
}
