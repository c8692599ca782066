//! Upload layouts of the GPU decode kernels and the split-K plan they run under.
//!
//! Owns the host-side form of one layer's cache as the kernels read it (SWAN §3: CSR sparse
//! history + dense buffer; WnW §2.3: per-head resident-position lists into a device arena):
//!
//! * [`PackedCsr`] — kv-sparse's CSR blocks of every kv-head, concatenated as-is (indices,
//!   values, u16 row offsets relative to their block, u64 block bases) plus one sentinel base
//!   per head (its nnz) and a per-head nnz offset, so a host cache uploads without repacking;
//! * [`PackedDense`] — dense rows `[kv_heads][rows][head_dim]`, or an arena with position lists;
//! * [`check_gpu`] — what the kernels add to a layer's [`AttnConfig`] (`head_dim ≤`
//!   [`MAX_HEAD_DIM`]) and the per-call query checks;
//! * [`Plan`] — how rows are cut into splits, warps and tiles (mirrors `cuda/common.cuh`);
//! * the `#[repr(C)]` kernel parameter blocks, with compile-time size checks against the
//!   C structs.

use kv_sparse::csr::CsrView;
use kv_sparse::hybrid::HybridView;
use kv_sparse::{SparseIndex, Value, ValueFormat};

use crate::config::AttnConfig;
use crate::validate;
use crate::{Error, Result};

/// Warps per thread block (`KV_WARPS`).
pub const WARPS: usize = 4;
/// Rows per warp tile (`KV_TILE`).
pub const TILE: usize = 32;
/// Largest number of q-heads one kernel pass serves (`KV_MAX_G`); larger GQA groups run
/// in several passes over the same rows.
pub const MAX_GROUP_PASS: usize = 8;
/// Largest head dimension the kernels support (`32 · KV_MAX_DPL`).
pub const MAX_HEAD_DIM: usize = 256;
/// Largest number of partials the combine kernel merges per q-head (its shared memory).
pub const MAX_PARTS: usize = 8192;

/// The C `CsrHeads` parameter block (see `cuda/common.cuh`). Pointers are device addresses.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct CsrHeadsArgs {
    /// `indices` device pointer.
    pub indices: u64,
    /// `values` device pointer.
    pub values: u64,
    /// `offsets` device pointer.
    pub offsets: u64,
    /// `block_base` device pointer.
    pub block_base: u64,
    /// `head_nnz` device pointer.
    pub head_nnz: u64,
    /// Rows per head.
    pub rows: u32,
    /// Rows per CSR block.
    pub rows_per_block: u32,
    /// Blocks per head.
    pub n_blocks: u32,
    /// Multiplier of decoded values.
    pub value_scale: f32,
}

/// The C `DenseHeads` parameter block.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DenseHeadsArgs {
    /// Row storage device pointer.
    pub rows: u64,
    /// Position list device pointer (0 for plain dense rows).
    pub pos: u64,
    /// Per-head position list offsets (`kv_heads + 1`; 0 for plain dense rows).
    pub pos_off: u64,
    /// Rows per head (plain dense rows).
    pub n_rows: u32,
    /// Arena rows per head (gathered).
    pub capacity: u32,
}

/// The C `DecodeArgs` parameter block.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct DecodeArgs {
    /// Query device pointer, `[q_heads][head_dim]` f32.
    pub q: u64,
    /// Partial accumulators, `[q_heads][n_parts][head_dim]` f32.
    pub part_acc: u64,
    /// Partial (max, sum) pairs, `[q_heads][n_parts][2]` f32.
    pub part_ml: u64,
    /// Optional logits output `[q_heads][max_rows]` (0 = none).
    pub scores: u64,
    /// Head dimension.
    pub d: u32,
    /// q-heads per kv-head.
    pub group: u32,
    /// First q-head of the group served by this pass.
    pub g0: u32,
    /// q-heads served by this pass.
    pub gc: u32,
    /// Rows per split (multiple of [`TILE`]).
    pub rows_per_split: u32,
    /// Partials per q-head.
    pub n_parts: u32,
    /// Softmax scale.
    pub scale: f32,
    /// Row stride of `scores`.
    pub max_rows: u32,
}

const _: () = assert!(std::mem::size_of::<CsrHeadsArgs>() == 56);
const _: () = assert!(std::mem::size_of::<DenseHeadsArgs>() == 32);
const _: () = assert!(std::mem::size_of::<DecodeArgs>() == 64);

/// The GPU's limit on a layer's [`AttnConfig`] plus the per-call query and output checks
/// every CUDA backend runs before touching a row: `head_dim ≤` [`MAX_HEAD_DIM`], `q` and the
/// output of `q_len()` elements, `q` finite. (Head counts, GQA grouping and the scale are
/// valid by construction of [`AttnConfig`].)
///
/// # Errors
/// [`Error::InvalidLayout`] for a head wider than the kernels support;
/// [`Error::LengthMismatch`] or [`Error::NonFiniteQuery`] as [`crate::DecodeAttention`].
///
/// # Examples
/// ```
/// use attn_kernels::{AttnConfig, cuda::check_gpu};
/// let cfg = AttnConfig::new(4, 2, 64)?;
/// assert!(check_gpu("example", &cfg, &[0.0; 256], 256).is_ok());
/// let wide = AttnConfig::new(4, 2, 300)?; // fine on the CPU, too wide for the GPU kernels
/// assert!(check_gpu("example", &wide, &[0.0; 1200], 1200).is_err());
/// # Ok::<(), attn_kernels::Error>(())
/// ```
pub fn check_gpu(op: &'static str, cfg: &AttnConfig, q: &[f32], out_len: usize) -> Result<()> {
    if cfg.head_dim() > MAX_HEAD_DIM {
        return Err(Error::InvalidLayout {
            op,
            q_heads: cfg.q_heads(),
            kv_heads: cfg.kv_heads(),
            head_dim: cfg.head_dim(),
            reason: "GPU kernels support head_dim <= 256",
        });
    }
    validate::lengths(op, cfg, q.len(), out_len)?;
    validate::finite_query(op, cfg, q)
}

/// Decodes element `i` of a packed value array.
pub(crate) fn decode_value(format: ValueFormat, bytes: &[u8], i: usize) -> f32 {
    match format {
        ValueFormat::F32 => {
            f32::from_le_bytes(bytes[4 * i..4 * i + 4].try_into().unwrap_or([0; 4]))
        }
        ValueFormat::F16 => half::f16::from_le_bytes([bytes[2 * i], bytes[2 * i + 1]]).to_f32(),
        ValueFormat::Bf16 => half::bf16::from_le_bytes([bytes[2 * i], bytes[2 * i + 1]]).to_f32(),
        ValueFormat::Fp8E4M3 => kv_sparse::fp8::Fp8E4M3::from_bits(bytes[i]).to_f32(),
    }
}

/// The CSR rows of every kv-head of a layer in the kernels' layout (module docs).
#[derive(Clone, Debug, PartialEq)]
pub struct PackedCsr {
    /// Value format of `values`.
    pub format: ValueFormat,
    /// Bytes per index (1 = u8, 2 = u16).
    pub index_bytes: usize,
    /// Head dimension.
    pub head_dim: usize,
    /// Rows per head (equal for every head).
    pub rows: usize,
    /// Rows per CSR block.
    pub rows_per_block: usize,
    /// Blocks per head.
    pub n_blocks: usize,
    /// Indices of all heads, little-endian.
    pub indices: Vec<u8>,
    /// Values of all heads, little-endian.
    pub values: Vec<u8>,
    /// `[kv_heads][rows]` row offsets relative to their block.
    pub offsets: Vec<u16>,
    /// `[kv_heads][n_blocks + 1]` block bases relative to the head (last = head nnz).
    pub block_base: Vec<u64>,
    /// `[kv_heads]` absolute nnz offset of each head.
    pub head_nnz: Vec<u64>,
    /// Multiplier of decoded values (fp8 scaling; 1 otherwise).
    pub scale: f32,
}

impl PackedCsr {
    /// Packs one [`CsrView`] per kv-head (all with the same rows, head_dim, block size).
    ///
    /// # Errors
    /// [`Error::RowCountMismatch`] / [`Error::HeadDimMismatch`] / [`Error::Param`] when the
    /// heads disagree or there are none; [`Error::InvalidValueScale`] for a bad scale.
    pub fn from_views<I: SparseIndex, V: Value>(
        views: &[CsrView<'_, I, V>],
        scale: f32,
    ) -> Result<Self> {
        const OP: &str = "PackedCsr::from_views";
        let first = views.first().ok_or(Error::Param {
            op: OP,
            what: "views",
            value: "0".into(),
            expected: ">= 1 kv-head",
        })?;
        if !(scale.is_finite() && scale > 0.0) {
            return Err(Error::InvalidValueScale { op: OP, kv_head: 0, what: "sparse", scale });
        }
        let mut p = Self {
            format: V::FORMAT,
            index_bytes: I::BYTES,
            head_dim: first.head_dim(),
            rows: first.num_rows(),
            rows_per_block: first.rows_per_block(),
            n_blocks: first.num_blocks(),
            indices: Vec::new(),
            values: Vec::new(),
            offsets: Vec::new(),
            block_base: Vec::new(),
            head_nnz: Vec::new(),
            scale,
        };
        for (h, v) in views.iter().enumerate() {
            if v.head_dim() != p.head_dim {
                return Err(Error::HeadDimMismatch {
                    op: OP,
                    kv_head: h,
                    expected: p.head_dim,
                    got: v.head_dim(),
                });
            }
            if v.num_rows() != p.rows || v.rows_per_block() != p.rows_per_block {
                return Err(Error::RowCountMismatch {
                    op: OP,
                    kv_head: h,
                    part: "sparse",
                    keys: p.rows,
                    values: v.num_rows(),
                });
            }
            p.head_nnz.push((p.values.len() / V::FORMAT.bytes()) as u64);
            p.indices.extend_from_slice(kv_sparse::index_bytes(v.indices()));
            p.values.extend_from_slice(kv_sparse::value_bytes(v.values()));
            p.offsets.extend_from_slice(v.offsets());
            p.block_base.extend_from_slice(v.block_bases());
            p.block_base.push(v.nnz() as u64);
        }
        Ok(p)
    }

    /// Number of kv-heads.
    pub fn kv_heads(&self) -> usize {
        self.head_nnz.len()
    }

    /// `(start, end)` entry range of row `r` of head `h` (the kernels' `csr_row_start`).
    pub fn row_range(&self, h: usize, r: usize) -> (usize, usize) {
        let start = |r: usize| {
            let hb = h * (self.n_blocks + 1);
            let base = self.head_nnz[h] as usize;
            if r >= self.rows {
                return base + self.block_base[hb + self.n_blocks] as usize;
            }
            base + self.block_base[hb + r / self.rows_per_block] as usize
                + usize::from(self.offsets[h * self.rows + r])
        };
        (start(r), start(r + 1))
    }

    /// Index of entry `e`.
    pub fn index(&self, e: usize) -> usize {
        match self.index_bytes {
            1 => usize::from(self.indices[e]),
            _ => usize::from(u16::from_le_bytes([self.indices[2 * e], self.indices[2 * e + 1]])),
        }
    }

    /// Decoded (unscaled) value of entry `e`.
    pub fn value(&self, e: usize) -> f32 {
        decode_value(self.format, &self.values, e)
    }

    /// Total bytes the kernels read from this store (indices, values, row offsets).
    pub fn bytes_read(&self) -> usize {
        self.indices.len() + self.values.len() + 2 * self.offsets.len()
    }
}

/// Dense rows of every kv-head: plain `[kv_heads][rows][head_dim]`, or an arena
/// `[kv_heads][capacity][head_dim]`
/// read through per-head position lists (gathered attention).
#[derive(Clone, Debug, PartialEq)]
pub struct PackedDense {
    /// Element format of `data`.
    pub format: ValueFormat,
    /// Head dimension.
    pub head_dim: usize,
    /// kv-heads.
    pub kv_heads: usize,
    /// Rows stored per head (plain: rows attended; gathered: arena capacity).
    pub rows: usize,
    /// Row-major little-endian storage of all heads.
    pub data: Vec<u8>,
    /// Gathered mode: concatenated per-head arena row lists and their `kv_heads + 1` offsets.
    pub gather: Option<(Vec<u32>, Vec<u32>)>,
}

impl PackedDense {
    /// Packs plain dense rows, one `(older, newer)` pair of row-major slices per kv-head (a
    /// kv-sparse ring buffer's `as_slices`; pass an empty second slice for a plain matrix).
    ///
    /// # Errors
    /// [`Error::RaggedRows`] or [`Error::RowCountMismatch`] if heads disagree; [`Error::Param`]
    /// for no heads or an unsupported format (fp8 dense rows).
    pub fn from_rows<D: Value>(head_dim: usize, heads: &[(&[D], &[D])]) -> Result<Self> {
        const OP: &str = "PackedDense::from_rows";
        check_dense_format(OP, D::FORMAT, heads.len())?;
        let rows = (heads[0].0.len() + heads[0].1.len()) / head_dim.max(1);
        let mut data = Vec::new();
        for (h, (a, b)) in heads.iter().enumerate() {
            let len = a.len() + b.len();
            if head_dim == 0 || a.len() % head_dim != 0 || b.len() % head_dim != 0 {
                return Err(Error::RaggedRows { op: OP, kv_head: h, what: "rows", len, head_dim });
            }
            if len / head_dim != rows {
                return Err(Error::RowCountMismatch {
                    op: OP,
                    kv_head: h,
                    part: "dense",
                    keys: rows,
                    values: len / head_dim,
                });
            }
            data.extend_from_slice(kv_sparse::value_bytes(a));
            data.extend_from_slice(kv_sparse::value_bytes(b));
        }
        Ok(Self { format: D::FORMAT, head_dim, kv_heads: heads.len(), rows, data, gather: None })
    }

    /// Packs a gathered layout: per kv-head an arena of `capacity` rows and the arena rows to
    /// attend to (`lists[h]`, in attention order; each `< capacity`).
    ///
    /// # Errors
    /// As [`PackedDense::from_rows`]; [`Error::SlotOutOfRange`] for a row past the arena.
    pub fn gathered<D: Value>(head_dim: usize, arenas: &[&[D]], lists: &[&[u32]]) -> Result<Self> {
        const OP: &str = "PackedDense::gathered";
        let pairs: Vec<(&[D], &[D])> = arenas.iter().map(|a| (*a, &[][..])).collect();
        let mut p = Self::from_rows(head_dim, &pairs).map_err(|e| rename(e, OP))?;
        if lists.len() != arenas.len() {
            return Err(Error::LengthMismatch {
                op: OP,
                what: "position lists",
                expected: arenas.len(),
                got: lists.len(),
            });
        }
        let (mut pos, mut off) = (Vec::new(), vec![0u32]);
        for (h, l) in lists.iter().enumerate() {
            if let Some((row, &slot)) = l.iter().enumerate().find(|(_, s)| **s as usize >= p.rows) {
                return Err(Error::SlotOutOfRange {
                    op: OP,
                    kv_head: h,
                    row,
                    slot,
                    slab_rows: p.rows,
                });
            }
            pos.extend_from_slice(l);
            off.push(u32::try_from(pos.len()).map_err(|_| too_many(OP, pos.len()))?);
        }
        p.gather = Some((pos, off));
        Ok(p)
    }

    /// Number of kv-heads (the field, read like [`PackedCsr::kv_heads`]).
    pub fn kv_heads(&self) -> usize {
        self.kv_heads
    }

    /// Rows attended for head `h`.
    pub fn rows_of(&self, h: usize) -> usize {
        match &self.gather {
            Some((_, off)) => (off[h + 1] - off[h]) as usize,
            None => self.rows,
        }
    }

    /// Element `c` of attended row `r` of head `h`.
    pub fn get(&self, h: usize, r: usize, c: usize) -> f32 {
        let row = match &self.gather {
            Some((pos, off)) => pos[off[h] as usize + r] as usize,
            None => r,
        };
        decode_value(self.format, &self.data, (h * self.rows + row) * self.head_dim + c)
    }

    /// Bytes the kernels read: attended rows only (plus position lists).
    pub fn bytes_read(&self) -> usize {
        let rows: usize = (0..self.kv_heads).map(|h| self.rows_of(h)).sum();
        rows * self.head_dim * self.format.bytes()
            + self.gather.as_ref().map_or(0, |(p, o)| 4 * (p.len() + o.len()))
    }
}

/// A layer of SWAN hybrid caches (one [`HybridView`] per kv-head) in upload form.
#[derive(Clone, Debug, PartialEq)]
pub struct PackedHybrid {
    /// Sparse key history.
    pub keys: PackedCsr,
    /// Sparse value history.
    pub values: PackedCsr,
    /// Dense buffer keys, token order.
    pub buffer_keys: PackedDense,
    /// Dense buffer values, token order.
    pub buffer_values: PackedDense,
}

impl PackedHybrid {
    /// Packs one view per kv-head (all heads with equal lengths and value scales).
    ///
    /// # Errors
    /// As [`PackedCsr::from_views`] / [`PackedDense::from_rows`];
    /// [`Error::InvalidValueScale`] if heads use different fp8 scales.
    ///
    /// # Examples
    /// ```
    /// use kv_sparse::hybrid::{HybridCache, HybridConfig};
    /// let mut c = HybridCache::<u8, half::f16, half::f16>::new(HybridConfig::new(4, 1, 2))?;
    /// c.extend(&[1.0, 0.0, 2.0, 0.5, 0.0, 1.0, 0.0, 3.0], &[1.0; 8])?;
    /// let p = attn_kernels::cuda::PackedHybrid::from_views(&[c.view()])?;
    /// assert_eq!((p.keys.rows, p.buffer_keys.rows), (1, 1));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn from_views<I: SparseIndex, V: Value, D: Value>(
        views: &[HybridView<'_, I, V, D>],
    ) -> Result<Self> {
        const OP: &str = "PackedHybrid::from_views";
        let (ks, vs) = views.first().map_or((1.0, 1.0), |v| v.value_scale);
        if let Some((h, v)) = views.iter().enumerate().find(|(_, v)| v.value_scale != (ks, vs)) {
            return Err(Error::InvalidValueScale {
                op: OP,
                kv_head: h,
                what: "per-head (key, value)",
                scale: v.value_scale.0,
            });
        }
        let keys: Vec<_> = views.iter().map(|v| v.sparse_keys).collect();
        let values: Vec<_> = views.iter().map(|v| v.sparse_values).collect();
        let bk: Vec<_> = views.iter().map(|v| v.buffer_keys).collect();
        let bv: Vec<_> = views.iter().map(|v| v.buffer_values).collect();
        let d = views.first().map_or(0, |v| v.head_dim);
        Ok(Self {
            keys: PackedCsr::from_views(&keys, ks)?,
            values: PackedCsr::from_views(&values, vs)?,
            buffer_keys: PackedDense::from_rows(d, &bk)?,
            buffer_values: PackedDense::from_rows(d, &bv)?,
        })
    }

    /// The cache the decode backends read.
    pub fn as_cache(&self) -> super::LayerCache<'_> {
        super::LayerCache::Hybrid {
            keys: &self.keys,
            values: &self.values,
            buffer_keys: &self.buffer_keys,
            buffer_values: &self.buffer_values,
        }
    }
}

fn check_dense_format(op: &'static str, format: ValueFormat, kv_heads: usize) -> Result<()> {
    if kv_heads == 0 {
        return Err(Error::Param { op, what: "kv-heads", value: "0".into(), expected: ">= 1" });
    }
    if format == ValueFormat::Fp8E4M3 {
        return Err(Error::Param {
            op,
            what: "dense format",
            value: format.to_string(),
            expected: "f32, f16 or bf16",
        });
    }
    Ok(())
}

fn too_many(op: &'static str, n: usize) -> Error {
    Error::Param { op, what: "rows", value: n.to_string(), expected: "< 2^32" }
}

fn rename(e: Error, op: &'static str) -> Error {
    match e {
        Error::RaggedRows { kv_head, what, len, head_dim, .. } => {
            Error::RaggedRows { op, kv_head, what, len, head_dim }
        }
        other => other,
    }
}

/// How one launch cuts each kv-head's rows: `n_splits` blocks of `rows_per_split` rows,
/// each split shared by [`WARPS`] warps in [`TILE`]-row tiles; one partial per warp.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Plan {
    /// Rows per split (a multiple of `TILE · WARPS`).
    pub rows_per_split: usize,
    /// Splits (grid x).
    pub n_splits: usize,
    /// Partials per q-head (`n_splits · WARPS`).
    pub n_parts: usize,
}

impl Plan {
    /// Splits `max_rows` rows (the longest head) so that about `target_blocks` blocks run
    /// in total over `kv_heads` heads.
    ///
    /// # Examples
    /// ```
    /// let p = attn_kernels::cuda::Plan::new(131_072, 8, 528);
    /// assert_eq!(p.n_parts, p.n_splits * 4);
    /// assert!(p.n_splits * p.rows_per_split >= 131_072);
    /// ```
    pub fn new(max_rows: usize, kv_heads: usize, target_blocks: usize) -> Self {
        let unit = TILE * WARPS;
        let units = max_rows.div_ceil(unit).max(1);
        let want = (target_blocks / kv_heads.max(1)).clamp(1, MAX_PARTS / WARPS);
        let rows_per_split = units.div_ceil(want) * unit;
        let n_splits = max_rows.div_ceil(rows_per_split).max(1);
        Self { rows_per_split, n_splits, n_parts: n_splits * WARPS }
    }

    /// Dynamic shared memory of one decode block serving `gc` q-heads.
    pub fn shared_bytes(gc: usize, head_dim: usize) -> usize {
        4 * (gc * head_dim + WARPS * (gc * head_dim + gc * TILE))
    }
}

/// The q-head passes `(g0, gc)` covering a GQA group of `group` q-heads.
pub fn group_passes(group: usize) -> impl Iterator<Item = (usize, usize)> {
    (0..group).step_by(MAX_GROUP_PASS).map(move |g0| (g0, MAX_GROUP_PASS.min(group - g0)))
}
