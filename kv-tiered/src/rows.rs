//! Row codecs: how one K or V row (`head_dim` f32 values from the runtime) is laid out in a
//! page pool. Dense rows (f32/f16/bf16, the default and the lossless setting) or — beyond
//! the paper — compact rows for the offloadable audio of non-exact heads, so a recall moves
//! fewer bytes:
//! * SWAN sparse rows ("SWAN inside WnW"): the top-k magnitude dimensions of the (already
//!   rotated) row as u8 indices followed by fp8 E4M3 values, `2k` bytes per row;
//! * coded rows, the equal-footing histories whose rows stand alone: TurboQuant-style
//!   codebook rows (`kv_sparse::turbo`, f16 norm + 2/3/4-bit codes; keys optionally with the
//!   QJL sketch) and per-token channel groups (KIVI's value code, `kv_sparse::kivi`, at
//!   2/4/8 bits; KIVI's per-channel *key* groups span tokens and cannot be paged row by
//!   row). Kernels read them in place (`attn_kernels::GatheredCodedAttention`).
//!
//! A sparse row's bytes are `[indices: k × u8][values: k × Fp8E4M3]`; the decoded value of
//! dimension `indices[j]` is `values[j].to_f32() · scale`. Dimensions not stored are zero.
//! A coded row's bytes are one row of its `kv_sparse::decoded::RowCodes` layout.

use std::sync::Arc;

use kv_sparse::decoded::RowCodes;
use kv_sparse::fp8::Fp8E4M3;
use kv_sparse::topk::top_k_magnitude;
use kv_sparse::{Value, ValueFormat};

use crate::error::{Error, Result, check_finite, param};

/// Layout of one kind of row (keys or values) in a pool.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum RowCodec {
    /// All `head_dim` values in `format` (F32, F16 or Bf16).
    Dense {
        /// Storage format.
        format: ValueFormat,
    },
    /// SWAN sparse row: top-`k` magnitude dimensions, u8 indices + fp8 values scaled by `scale`.
    SparseFp8 {
        /// Stored dimensions per row.
        k: usize,
        /// Decoded values are `fp8 · scale` (choose with `kv_sparse::fp8::scale_for_max_abs`).
        scale: f32,
    },
    /// TurboQuant-style row: f16 norm and `bits`-bit (2, 3, 4) codes of the direction in
    /// the codebook of a random unit vector's coordinate (`RowCodes::Codebook`).
    Turbo {
        /// Bits per code.
        bits: usize,
    },
    /// TurboQuant's inner-product key row at `bits` bits in all (2, 3, 4): codes at
    /// `bits − 1` plus the QJL sign sketch of the residual (`RowCodes::CodebookSketch`; keys
    /// only, `head_dim` a multiple of 8).
    TurboQjl {
        /// Bits per element in all.
        bits: usize,
    },
    /// Per-token channel groups: `head_dim/group` f16 (scale, zero) pairs and `bits`-bit
    /// (2, 4, 8) asymmetric codes (`RowCodes::ChannelGroups`, KIVI's value code).
    Groups {
        /// Bits per code.
        bits: usize,
        /// Channels per group (divides `head_dim`).
        group: usize,
    },
}

impl std::fmt::Display for RowCodec {
    /// `f16`, `fp8 k=32`, `turbo3`, `turbo3 qjl`, `int4 groups of 32`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            Self::Dense { format } => write!(f, "{format}"),
            Self::SparseFp8 { k, .. } => write!(f, "fp8 k={k}"),
            Self::Turbo { bits } => write!(f, "turbo{bits}"),
            Self::TurboQjl { bits } => write!(f, "turbo{bits} qjl"),
            Self::Groups { bits, group } => write!(f, "int{bits} groups of {group}"),
        }
    }
}

/// The shared tables coded rows decode with: each side's codebook levels and the QJL
/// sketch (empty where a side needs none), made once per store and lent to its views.
#[derive(Clone, Debug, Default)]
pub struct CodeTables {
    /// Key codebook levels.
    pub key_levels: Arc<[f32]>,
    /// Value codebook levels.
    pub value_levels: Arc<[f32]>,
    /// The `d × d` QJL sketch (keys with [`RowCodec::TurboQjl`]).
    pub sketch: Arc<[f32]>,
}

impl RowCodec {
    /// Checks the codec against `head_dim`.
    ///
    /// # Errors
    /// [`Error::Param`] for fp8 dense rows, `k = 0`, `k > head_dim`, `head_dim > 256` with
    /// sparse rows (u8 indices) or a non-positive/non-finite scale.
    pub fn validate(&self, head_dim: usize) -> Result<()> {
        const OP: &str = "RowCodec::validate";
        match *self {
            Self::Dense { format: ValueFormat::Fp8E4M3 } => {
                Err(param(OP, "format", "fp8", "F32, F16 or Bf16 for dense rows"))
            }
            Self::Dense { .. } => Ok(()),
            Self::SparseFp8 { k, scale } => {
                if k == 0 || k > head_dim || head_dim > 256 {
                    return Err(param(OP, "k", k, "1 ≤ k ≤ head_dim ≤ 256"));
                }
                if !(scale.is_finite() && scale > 0.0) {
                    return Err(param(OP, "scale", scale, "finite and > 0"));
                }
                Ok(())
            }
            Self::Turbo { bits } => Ok(kv_sparse::turbo::check_layout(OP, bits, head_dim)?),
            Self::TurboQjl { bits } => Ok(kv_sparse::turbo::check_qjl_layout(OP, bits, head_dim)?),
            Self::Groups { bits, group } => {
                if bits != 8 {
                    kv_sparse::kivi::check_layout(OP, bits, head_dim, group)?;
                }
                if !(1..=256).contains(&head_dim) || group == 0 || !head_dim.is_multiple_of(group) {
                    return Err(param(OP, "group", group, "a divisor of head_dim ≤ 256"));
                }
                Ok(())
            }
        }
    }

    /// Whether rows are coded (read through a `RowCodes` layout).
    pub fn is_coded(&self) -> bool {
        matches!(self, Self::Turbo { .. } | Self::TurboQjl { .. } | Self::Groups { .. })
    }

    /// The tables of `(keys, values)` coded rows of `head_dim` elements.
    pub fn tables(keys: RowCodec, values: RowCodec, head_dim: usize) -> CodeTables {
        let levels = |c: RowCodec| match c {
            Self::Turbo { bits } => kv_sparse::turbo::codebook(head_dim, bits),
            Self::TurboQjl { bits } => kv_sparse::turbo::codebook(head_dim, bits - 1),
            _ => Arc::from([]),
        };
        let sketch = match keys {
            Self::TurboQjl { .. } => kv_sparse::turbo::sketch(head_dim),
            _ => Arc::from([]),
        };
        CodeTables { key_levels: levels(keys), value_levels: levels(values), sketch }
    }

    /// The layout of `bytes` (whole rows of this codec) for the kernels, decoded with
    /// `levels` and `sketch` (a side of [`CodeTables`]); `None` for dense and sparse rows.
    pub fn codes<'a>(
        &self,
        bytes: &'a [u8],
        levels: &'a [f32],
        sketch: &'a [f32],
    ) -> Option<RowCodes<'a>> {
        Some(match *self {
            Self::Turbo { bits } => RowCodes::Codebook { bits, levels, bytes },
            Self::TurboQjl { bits } => {
                RowCodes::CodebookSketch { bits: bits - 1, levels, sketch, bytes }
            }
            Self::Groups { bits, group } => RowCodes::ChannelGroups { bits, group, bytes },
            _ => return None,
        })
    }

    /// Bytes of one encoded row.
    pub fn row_bytes(&self, head_dim: usize) -> usize {
        match *self {
            Self::Dense { format } => head_dim * format.bytes(),
            Self::SparseFp8 { k, .. } => 2 * k,
            // The layout's own formula; an invalid group counts as an empty row.
            Self::Turbo { .. } | Self::TurboQjl { .. } | Self::Groups { .. } => {
                self.codes(&[], &[], &[]).and_then(|c| c.row_bytes(head_dim)).unwrap_or(0)
            }
        }
    }

    /// Whether rows are stored exactly (dense f32).
    pub fn is_exact(&self) -> bool {
        matches!(self, Self::Dense { format: ValueFormat::F32 })
    }

    /// Appends the encoding of `row` to `out`; `scratch` is reused top-k space.
    ///
    /// # Errors
    /// [`Error::NonFinite`] for NaN/∞ input; [`Error::Sparse`] for a row a coded codec cannot
    /// hold (a norm or group beyond f16). `out` is unchanged on error.
    pub fn encode(&self, row: &[f32], out: &mut Vec<u8>, scratch: &mut Vec<usize>) -> Result<()> {
        check_finite("RowCodec::encode", "row", row)?;
        match *self {
            Self::Dense { format } => encode_dense(format, row, out),
            Self::SparseFp8 { k, scale } => {
                top_k_magnitude(row, k, scratch)?;
                out.extend(scratch.iter().map(|&i| i as u8));
                out.extend(scratch.iter().map(|&i| Fp8E4M3::from_f32(row[i] / scale).to_bits()));
            }
            Self::Turbo { .. } | Self::TurboQjl { .. } | Self::Groups { .. } => {
                let start = out.len();
                out.resize(start + self.row_bytes(row.len()), 0);
                let coded = self.encode_coded(row, &mut out[start..]);
                if coded.is_err() {
                    out.truncate(start);
                }
                coded?;
            }
        }
        Ok(())
    }

    /// Codes `row` into `out` (one row of a coded codec).
    fn encode_coded(&self, row: &[f32], out: &mut [u8]) -> Result<()> {
        let d = row.len();
        match *self {
            Self::Turbo { bits } => {
                let levels = kv_sparse::turbo::codebook(d, bits);
                kv_sparse::turbo::encode_row(bits, &levels, row, out)?;
            }
            Self::TurboQjl { bits } => {
                let tables = Self::tables(*self, *self, d);
                let parts = (&tables.key_levels[..], &tables.sketch[..]);
                kv_sparse::turbo::encode_qjl_key_row(bits, parts, row, out)?;
            }
            Self::Groups { bits, group } => {
                kv_sparse::kivi::encode_token_row(bits, group, row, out)?
            }
            Self::Dense { .. } | Self::SparseFp8 { .. } => {}
        }
        Ok(())
    }

    /// Decodes one encoded row into `out` (`head_dim` values; zeros where nothing is stored).
    ///
    /// # Errors
    /// [`Error::Shape`] if `bytes` is not one row.
    pub fn decode(&self, bytes: &[u8], out: &mut [f32]) -> Result<()> {
        if bytes.len() != self.row_bytes(out.len()) {
            return Err(Error::Shape {
                op: "RowCodec::decode",
                what: "bytes",
                expected: self.row_bytes(out.len()),
                got: bytes.len(),
            });
        }
        match *self {
            Self::Dense { format } => decode_dense(format, bytes, out),
            Self::SparseFp8 { k, scale } => {
                out.fill(0.0);
                let (idx, val) = bytes.split_at(k);
                for (&i, &v) in idx.iter().zip(val) {
                    out[usize::from(i)] = Fp8E4M3::from_bits(v).to_f32() * scale;
                }
            }
            Self::Turbo { .. } | Self::TurboQjl { .. } | Self::Groups { .. } => {
                let tables = Self::tables(*self, *self, out.len());
                if let Some(codes) = self.codes(bytes, &tables.key_levels, &tables.sketch) {
                    codes.decode_row(0, out);
                }
            }
        }
        Ok(())
    }
}

fn encode_dense(format: ValueFormat, row: &[f32], out: &mut Vec<u8>) {
    match format {
        ValueFormat::F32 => out.extend_from_slice(bytemuck::cast_slice(row)),
        ValueFormat::F16 => {
            out.extend(row.iter().flat_map(|&x| half::f16::from_f32(x).to_le_bytes()))
        }
        ValueFormat::Bf16 => {
            out.extend(row.iter().flat_map(|&x| half::bf16::from_f32(x).to_le_bytes()))
        }
        ValueFormat::Fp8E4M3 => out.extend(row.iter().map(|&x| Fp8E4M3::from_f32(x).to_bits())),
    }
}

fn decode_dense(format: ValueFormat, bytes: &[u8], out: &mut [f32]) {
    fn typed<V: Value>(bytes: &[u8], out: &mut [f32]) {
        let n = std::mem::size_of::<V>();
        for (o, b) in out.iter_mut().zip(bytes.chunks_exact(n)) {
            *o = bytemuck::pod_read_unaligned::<V>(b).to_f32();
        }
    }
    match format {
        ValueFormat::F32 => typed::<f32>(bytes, out),
        ValueFormat::F16 => typed::<half::f16>(bytes, out),
        ValueFormat::Bf16 => typed::<half::bf16>(bytes, out),
        ValueFormat::Fp8E4M3 => typed::<Fp8E4M3>(bytes, out),
    }
}

/// Row layout of a store: dense rows for exact heads and text, optional compact rows (SWAN
/// sparse or coded) for the audio of non-exact heads (tidal and fixed under WnW).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RowLayout {
    /// Head dimension (`head_dim`).
    pub head_dim: usize,
    /// Dense rows (pool 0): text, anchors, and all audio unless `sparse` is set.
    pub dense: ValueFormat,
    /// Compact rows (pool 1) for the audio of non-exact heads: `(key codec, value codec)`,
    /// both [`RowCodec::SparseFp8`] (SWAN rows), or coded ([`RowCodec::is_coded`]; values not
    /// [`RowCodec::TurboQjl`]). `None` = everything dense (the lossless setting).
    pub sparse: Option<(RowCodec, RowCodec)>,
}

impl RowLayout {
    /// Dense f32 rows everywhere (lossless).
    pub fn dense_f32(head_dim: usize) -> Self {
        Self { head_dim, dense: ValueFormat::F32, sparse: None }
    }

    /// Dense rows in `dense` plus SWAN fp8 rows keeping `k_key`/`k_value` dimensions (scale 1).
    pub fn with_sparse(head_dim: usize, dense: ValueFormat, k_key: usize, k_value: usize) -> Self {
        let s = |k| RowCodec::SparseFp8 { k, scale: 1.0 };
        Self { head_dim, dense, sparse: Some((s(k_key), s(k_value))) }
    }

    /// Dense rows in `dense` plus coded rows (`keys`, `values`) for offloadable audio.
    pub fn with_coded(
        head_dim: usize,
        dense: ValueFormat,
        keys: RowCodec,
        values: RowCodec,
    ) -> Self {
        Self { head_dim, dense, sparse: Some((keys, values)) }
    }

    /// Whether the compact rows are coded (read through `attn_kernels::GatheredCodedKv`).
    pub fn is_coded(&self) -> bool {
        self.sparse.is_some_and(|(k, _)| k.is_coded())
    }

    /// The tables the coded rows decode with (empty without coded rows).
    pub fn code_tables(&self) -> CodeTables {
        match self.sparse {
            Some((k, v)) if k.is_coded() => RowCodec::tables(k, v, self.head_dim),
            _ => CodeTables::default(),
        }
    }

    /// Validates all codecs.
    ///
    /// # Errors
    /// As [`RowCodec::validate`]; [`Error::Param`] if `head_dim == 0` or the compact codecs
    /// are neither both sparse nor both coded (QJL keys only).
    pub fn validate(&self) -> Result<()> {
        const OP: &str = "RowLayout::validate";
        if self.head_dim == 0 {
            return Err(param(OP, "head_dim", 0, "≥ 1"));
        }
        self.dense_codec().validate(self.head_dim)?;
        if let Some((k, v)) = self.sparse {
            let sparse = |c: RowCodec| matches!(c, RowCodec::SparseFp8 { .. });
            let ok = (sparse(k) && sparse(v))
                || (k.is_coded() && v.is_coded() && !matches!(v, RowCodec::TurboQjl { .. }));
            if !ok {
                let expected = "both RowCodec::SparseFp8, or both coded (TurboQjl for keys only)";
                return Err(param(OP, "sparse", format!("{k:?}, {v:?}"), expected));
            }
            k.validate(self.head_dim)?;
            v.validate(self.head_dim)?;
        }
        Ok(())
    }

    /// The dense codec (pool 0).
    pub fn dense_codec(&self) -> RowCodec {
        RowCodec::Dense { format: self.dense }
    }

    /// `(key, value)` codecs of `pool` (0 dense, 1 sparse).
    pub fn codecs(&self, pool: usize) -> (RowCodec, RowCodec) {
        match (pool, self.sparse) {
            (1, Some(kv)) => kv,
            _ => (self.dense_codec(), self.dense_codec()),
        }
    }

    /// Number of pools (1 or 2).
    pub fn num_pools(&self) -> usize {
        1 + usize::from(self.sparse.is_some())
    }
}
