//! Row codecs: how one K or V row (`head_dim` f32 values from the runtime) is laid out in a
//! page pool. Dense rows (f32/f16/bf16, the default and the lossless setting) or — "SWAN
//! inside WnW", beyond the paper — SWAN sparse rows: the top-k magnitude dimensions of the
//! (already rotated) row as u8 indices followed by fp8 E4M3 values, `2k` bytes per row, so
//! a recall moves `2k` instead of `2·d_h` (bf16) or `4·d_h` (f32) bytes per vector.
//!
//! A sparse row's bytes are `[indices: k × u8][values: k × Fp8E4M3]`; the decoded value of
//! dimension `indices[j]` is `values[j].to_f32() · scale`. Dimensions not stored are zero.

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
        }
    }

    /// Bytes of one encoded row.
    pub fn row_bytes(&self, head_dim: usize) -> usize {
        match *self {
            Self::Dense { format } => head_dim * format.bytes(),
            Self::SparseFp8 { k, .. } => 2 * k,
        }
    }

    /// Whether rows are stored exactly (dense f32).
    pub fn is_exact(&self) -> bool {
        matches!(self, Self::Dense { format: ValueFormat::F32 })
    }

    /// Appends the encoding of `row` to `out`; `scratch` is reused top-k space.
    ///
    /// # Errors
    /// [`Error::NonFinite`] for NaN/∞ input.
    pub fn encode(&self, row: &[f32], out: &mut Vec<u8>, scratch: &mut Vec<usize>) -> Result<()> {
        check_finite("RowCodec::encode", "row", row)?;
        match *self {
            Self::Dense { format } => encode_dense(format, row, out),
            Self::SparseFp8 { k, scale } => {
                top_k_magnitude(row, k, scratch)?;
                out.extend(scratch.iter().map(|&i| i as u8));
                out.extend(scratch.iter().map(|&i| Fp8E4M3::from_f32(row[i] / scale).to_bits()));
            }
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

/// Row layout of a store: dense rows for exact heads and text, optional sparse rows for the
/// audio of non-exact heads (tidal and fixed under WnW).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RowLayout {
    /// Head dimension (`head_dim`).
    pub head_dim: usize,
    /// Dense rows (pool 0): text, anchors, and all audio unless `sparse` is set.
    pub dense: ValueFormat,
    /// SWAN sparse rows (pool 1) for the audio of non-exact heads: `(key codec, value codec)`,
    /// both [`RowCodec::SparseFp8`]. `None` = everything dense (the lossless setting).
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

    /// Validates all codecs.
    ///
    /// # Errors
    /// As [`RowCodec::validate`]; [`Error::Param`] if `head_dim == 0` or the sparse codecs
    /// are not sparse.
    pub fn validate(&self) -> Result<()> {
        if self.head_dim == 0 {
            return Err(param("RowLayout::validate", "head_dim", 0, "≥ 1"));
        }
        self.dense_codec().validate(self.head_dim)?;
        if let Some((k, v)) = self.sparse {
            for c in [k, v] {
                if !matches!(c, RowCodec::SparseFp8 { .. }) {
                    return Err(param(
                        "RowLayout::validate",
                        "sparse",
                        format!("{c:?}"),
                        "RowCodec::SparseFp8",
                    ));
                }
                c.validate(self.head_dim)?;
            }
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
