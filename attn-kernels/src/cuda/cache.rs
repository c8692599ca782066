//! [`LayerCache`]: what one GPU decode call attends over, and the checks every backend runs
//! before touching a row (SWAN §3 hybrid cache over CSR or coded rows; dense quantized rows;
//! WnW §2.3 gathered resident rows).

use super::encoded::{PackedCoded, PackedQuant};
use super::layout::{PackedCsr, PackedDense, check_gpu};
use crate::{AttnConfig, Error, Result};

/// One layer's cache in upload form, by kernel family.
#[derive(Clone, Copy, Debug)]
pub enum LayerCache<'a> {
    /// Dense K/V rows (the baseline).
    Dense {
        /// Keys.
        keys: &'a PackedDense,
        /// Values.
        values: &'a PackedDense,
    },
    /// Sparse CSR K/V rows only.
    Sparse {
        /// Keys.
        keys: &'a PackedCsr,
        /// Values.
        values: &'a PackedCsr,
    },
    /// Sparse history followed by the dense buffer, one softmax.
    Hybrid {
        /// Sparse keys.
        keys: &'a PackedCsr,
        /// Sparse values.
        values: &'a PackedCsr,
        /// Buffer keys.
        buffer_keys: &'a PackedDense,
        /// Buffer values.
        buffer_values: &'a PackedDense,
    },
    /// Dense arena rows read through per-head position lists.
    Gathered {
        /// Keys (with lists).
        keys: &'a PackedDense,
        /// Values (same lists).
        values: &'a PackedDense,
    },
    /// Dense quantized K/V rows (int8 / int4 blocks, fp8 with a per-token scale).
    Quant {
        /// Keys.
        keys: &'a PackedQuant,
        /// Values.
        values: &'a PackedQuant,
    },
    /// SWAN coded history (index list or bitmask, fp8 / int8 / int4 values) followed by the
    /// dense buffer, one softmax.
    Coded {
        /// Coded keys.
        keys: &'a PackedCoded,
        /// Coded values.
        values: &'a PackedCoded,
        /// Buffer keys.
        buffer_keys: &'a PackedDense,
        /// Buffer values.
        buffer_values: &'a PackedDense,
    },
}

impl<'a> LayerCache<'a> {
    /// The sparse CSR part, if any.
    pub fn sparse(&self) -> Option<(&'a PackedCsr, &'a PackedCsr)> {
        match *self {
            Self::Sparse { keys, values } | Self::Hybrid { keys, values, .. } => {
                Some((keys, values))
            }
            _ => None,
        }
    }

    /// The plain dense part (rows, arena or hybrid buffer), if any.
    pub fn dense(&self) -> Option<(&'a PackedDense, &'a PackedDense)> {
        match *self {
            Self::Dense { keys, values } | Self::Gathered { keys, values } => Some((keys, values)),
            Self::Hybrid { buffer_keys, buffer_values, .. }
            | Self::Coded { buffer_keys, buffer_values, .. } => Some((buffer_keys, buffer_values)),
            Self::Sparse { .. } | Self::Quant { .. } => None,
        }
    }

    /// The coded sparse part, if any.
    pub fn coded(&self) -> Option<(&'a PackedCoded, &'a PackedCoded)> {
        match *self {
            Self::Coded { keys, values, .. } => Some((keys, values)),
            _ => None,
        }
    }

    /// The dense quantized part, if any.
    pub fn quant(&self) -> Option<(&'a PackedQuant, &'a PackedQuant)> {
        match *self {
            Self::Quant { keys, values } => Some((keys, values)),
            _ => None,
        }
    }

    /// Sparse rows per kv-head (CSR or coded), attended before any dense row.
    pub fn sparse_rows(&self) -> usize {
        self.sparse().map_or(0, |(k, _)| k.rows) + self.coded().map_or(0, |(k, _)| k.rows)
    }

    /// Rows attended by kv-head `h` (sparse first, then dense).
    pub fn rows_of(&self, h: usize) -> usize {
        self.sparse_rows()
            + self.dense().map_or(0, |(k, _)| k.rows_of(h))
            + self.quant().map_or(0, |(k, _)| k.rows)
    }

    /// kv-heads of the cache's first part.
    fn kv_heads(&self) -> usize {
        let heads = self.sparse().map(|(k, _)| k.kv_heads());
        let heads = heads.or(self.coded().map(|(k, _)| k.kv_heads()));
        let heads = heads.or(self.quant().map(|(k, _)| k.kv_heads()));
        heads.or(self.dense().map(|(k, _)| k.kv_heads())).unwrap_or(0)
    }

    /// Total attended rows of all heads (the length of gathered anchor weights).
    pub fn total_rows(&self) -> usize {
        (0..self.kv_heads()).map(|h| self.rows_of(h)).sum()
    }

    /// Bytes the kernels must read for one decode step, as stored (K and V, indices,
    /// offsets, block bases of coded rows, lists).
    pub fn bytes_read(&self) -> usize {
        self.sparse().map_or(0, |(k, v)| k.bytes_read() + v.bytes_read())
            + self.coded().map_or(0, |(k, v)| k.bytes_read() + v.bytes_read())
            + self.quant().map_or(0, |(k, v)| k.bytes_read() + v.bytes_read())
            + self.dense().map_or(0, |(k, v)| k.bytes_read() + v.bytes_read())
    }

    /// Checks the cache against the layer's `cfg` and the call's buffers: the GPU limits and
    /// the query ([`check_gpu`]), head counts, head_dim, key/value agreement, non-empty heads,
    /// scales, gathered lists, weights length.
    ///
    /// # Errors
    /// The first violated condition as a typed [`Error`].
    pub fn check(
        &self,
        op: &'static str,
        cfg: &AttnConfig,
        q: &[f32],
        out: usize,
        weights: Option<usize>,
    ) -> Result<()> {
        check_gpu(op, cfg, q, out)?;
        if let Some((k, v)) = self.sparse() {
            check_csr(op, cfg, k, v)?;
        }
        if let Some((k, v)) = self.coded() {
            check_coded(op, cfg, k, v)?;
        }
        if let Some((k, v)) = self.quant() {
            check_quant(op, cfg, k, v)?;
        }
        if let Some((k, v)) = self.dense() {
            check_dense(op, cfg, k, v)?;
        }
        for h in 0..cfg.kv_heads() {
            if self.rows_of(h) == 0 {
                return Err(Error::EmptyCache { op, kv_head: h });
            }
        }
        match (self, weights) {
            (Self::Gathered { .. }, Some(n)) if n != self.total_rows() => {
                Err(Error::LengthMismatch {
                    op,
                    what: "anchor weights",
                    expected: self.total_rows(),
                    got: n,
                })
            }
            (Self::Gathered { .. }, _) | (_, None) => Ok(()),
            (_, Some(_)) => Err(Error::Param {
                op,
                what: "weights",
                value: "Some".into(),
                expected: "None (only gathered decode returns weights)",
            }),
        }
    }
}

fn check_csr(op: &'static str, cfg: &AttnConfig, k: &PackedCsr, v: &PackedCsr) -> Result<()> {
    for (what, p) in [("key", k), ("value", v)] {
        if p.kv_heads() != cfg.kv_heads() {
            return Err(Error::LengthMismatch {
                op,
                what: "sparse kv-heads",
                expected: cfg.kv_heads(),
                got: p.kv_heads(),
            });
        }
        if p.head_dim != cfg.head_dim() {
            return Err(Error::HeadDimMismatch {
                op,
                kv_head: 0,
                expected: cfg.head_dim(),
                got: p.head_dim,
            });
        }
        if !(p.scale.is_finite() && p.scale > 0.0) {
            return Err(Error::InvalidValueScale { op, kv_head: 0, what, scale: p.scale });
        }
        check_csr_structure(op, p)?;
    }
    if k.rows != v.rows {
        return Err(Error::RowCountMismatch {
            op,
            kv_head: 0,
            part: "sparse",
            keys: k.rows,
            values: v.rows,
        });
    }
    if k.format != v.format || k.index_bytes != v.index_bytes {
        return Err(Error::Param {
            op,
            what: "sparse formats",
            value: format!("{}/{}", k.format, v.format),
            expected: "keys and values in one format",
        });
    }
    Ok(())
}

/// Array lengths, monotone row ranges and every index below head_dim: the kernels trust these.
fn check_csr_structure(op: &'static str, p: &PackedCsr) -> Result<()> {
    let kv_heads = p.kv_heads();
    let nnz = p.values.len() / p.format.bytes();
    let lens = [
        ("offsets", p.offsets.len(), kv_heads * p.rows),
        ("block bases", p.block_base.len(), kv_heads * (p.n_blocks + 1)),
        ("indices", p.indices.len(), nnz * p.index_bytes),
        ("blocks", p.n_blocks, p.rows.div_ceil(p.rows_per_block.max(1))),
    ];
    for (what, got, expected) in lens {
        if got != expected {
            return Err(Error::LengthMismatch { op, what, expected, got });
        }
    }
    for h in 0..kv_heads {
        let end = if h + 1 < kv_heads { p.head_nnz[h + 1] as usize } else { nnz };
        let mut prev = p.head_nnz[h] as usize;
        for r in 0..p.rows {
            let (s, e) = p.row_range(h, r);
            if s < prev || e < s || e > end {
                return Err(Error::Param {
                    op,
                    what: "CSR row range",
                    value: format!("head {h} row {r}: {s}..{e}"),
                    expected: "ascending within the head",
                });
            }
            if let Some(i) = (s..e).map(|i| p.index(i)).find(|&i| i >= p.head_dim) {
                return Err(Error::Param {
                    op,
                    what: "CSR index",
                    value: i.to_string(),
                    expected: "below head_dim",
                });
            }
            prev = s;
        }
    }
    Ok(())
}

fn check_coded(op: &'static str, cfg: &AttnConfig, k: &PackedCoded, v: &PackedCoded) -> Result<()> {
    for (what, p) in [("key", k), ("value", v)] {
        if p.kv_heads() != cfg.kv_heads() {
            let (expected, got) = (cfg.kv_heads(), p.kv_heads());
            return Err(Error::LengthMismatch { op, what: "coded kv-heads", expected, got });
        }
        if p.head_dim != cfg.head_dim() {
            let (expected, got) = (cfg.head_dim(), p.head_dim);
            return Err(Error::HeadDimMismatch { op, kv_head: 0, expected, got });
        }
        if !(p.scale.is_finite() && p.scale > 0.0) {
            return Err(Error::InvalidValueScale { op, kv_head: 0, what, scale: p.scale });
        }
        p.check(op)?;
    }
    if k.rows != v.rows {
        let (keys, values) = (k.rows, v.rows);
        return Err(Error::RowCountMismatch { op, kv_head: 0, part: "coded", keys, values });
    }
    if (k.index, k.value) != (v.index, v.value) {
        return Err(Error::Param {
            op,
            what: "coded formats",
            value: format!("{}/{} and {}/{}", k.index, k.value, v.index, v.value),
            expected: "keys and values in one encoding",
        });
    }
    Ok(())
}

fn check_quant(op: &'static str, cfg: &AttnConfig, k: &PackedQuant, v: &PackedQuant) -> Result<()> {
    for p in [k, v] {
        if p.kv_heads() != cfg.kv_heads() {
            let (expected, got) = (cfg.kv_heads(), p.kv_heads());
            return Err(Error::LengthMismatch { op, what: "quantized kv-heads", expected, got });
        }
        if p.head_dim != cfg.head_dim() {
            let (expected, got) = (cfg.head_dim(), p.head_dim);
            return Err(Error::HeadDimMismatch { op, kv_head: 0, expected, got });
        }
        p.check(op)?;
    }
    if k.rows != v.rows {
        let (keys, values) = (k.rows, v.rows);
        return Err(Error::RowCountMismatch { op, kv_head: 0, part: "quantized", keys, values });
    }
    if k.format != v.format {
        return Err(Error::Param {
            op,
            what: "quantized formats",
            value: format!("{}/{}", k.format, v.format),
            expected: "keys and values in one format",
        });
    }
    Ok(())
}

fn check_dense(op: &'static str, cfg: &AttnConfig, k: &PackedDense, v: &PackedDense) -> Result<()> {
    for p in [k, v] {
        if p.kv_heads() != cfg.kv_heads() {
            return Err(Error::LengthMismatch {
                op,
                what: "dense kv-heads",
                expected: cfg.kv_heads(),
                got: p.kv_heads(),
            });
        }
        if p.head_dim != cfg.head_dim() {
            return Err(Error::HeadDimMismatch {
                op,
                kv_head: 0,
                expected: cfg.head_dim(),
                got: p.head_dim,
            });
        }
        let want = cfg.kv_heads() * p.rows * p.head_dim * p.format.bytes();
        if p.data.len() != want {
            return Err(Error::LengthMismatch {
                op,
                what: "dense bytes",
                expected: want,
                got: p.data.len(),
            });
        }
        if let Some((pos, off)) = &p.gather {
            let ok = off.len() == cfg.kv_heads() + 1
                && off.windows(2).all(|w| w[0] <= w[1])
                && *off.last().unwrap_or(&0) as usize == pos.len();
            if !ok {
                return Err(Error::Param {
                    op,
                    what: "position list offsets",
                    value: format!("{off:?}"),
                    expected: "kv_heads + 1 ascending offsets ending at the list length",
                });
            }
            if let Some((row, &slot)) = pos.iter().enumerate().find(|(_, s)| **s as usize >= p.rows)
            {
                return Err(Error::SlotOutOfRange { op, kv_head: 0, row, slot, slab_rows: p.rows });
            }
        }
    }
    for h in 0..cfg.kv_heads() {
        if k.rows_of(h) != v.rows_of(h) {
            return Err(Error::RowCountMismatch {
                op,
                kv_head: h,
                part: "dense",
                keys: k.rows_of(h),
                values: v.rows_of(h),
            });
        }
    }
    if k.gather != v.gather || k.format != v.format {
        return Err(Error::Param {
            op,
            what: "dense keys/values",
            value: "differ".into(),
            expected: "same format and position lists",
        });
    }
    Ok(())
}
