//! [`DecodeAttention`] and [`EncodedAttention`] for the GPU: the crate's decode signatures
//! (shared with [`crate::Reference`] and [`crate::CpuAttention`]) on the CUDA kernels. Each
//! call packs the borrowed views into the kernels' upload layout (kv-sparse CSR blocks, coded
//! rows and quantized rows as-is), uploads, decodes and copies the output back (SWAN §3 hybrid
//! decode over CSR or coded rows; dense quantized baselines; WnW §2.3 gathered decode with
//! anchor weights). Long-lived caches should use [`Gpu::upload`] + [`Gpu::decode_resident`].

use kv_sparse::coded::{IndexCode, ValueCode};
use kv_sparse::quant::DenseCodec;
use kv_sparse::{SparseIndex, Value};

use super::encoded::{PackedCodedHybrid, PackedQuant};
use super::layout::{PackedCsr, PackedDense, PackedHybrid};
use super::{DecodeDevice, Gpu, LayerCache};
use crate::{
    AttnConfig, CodedHybridSource, DecodeAttention, DenseKv, EncodedAttention, Error, GatheredKv,
    HybridSource, QuantKv, Result, SparseKv,
};

fn dense_pair<D: Value>(
    cfg: &AttnConfig,
    kv: &[DenseKv<'_, D>],
) -> Result<(PackedDense, PackedDense)> {
    let keys: Vec<_> = kv.iter().map(|h| h.keys).collect();
    let values: Vec<_> = kv.iter().map(|h| h.values).collect();
    Ok((
        PackedDense::from_rows(cfg.head_dim(), &keys)?,
        PackedDense::from_rows(cfg.head_dim(), &values)?,
    ))
}

/// A gathered head's resident rows, compacted per head into an arena of the longest slab.
fn gathered_pair<D: Value>(
    cfg: &AttnConfig,
    kv: &[GatheredKv<'_, D>],
) -> Result<(PackedDense, PackedDense)> {
    const OP: &str = "Gpu::gathered";
    let d = cfg.head_dim();
    let slab_rows = |g: &GatheredKv<'_, D>| g.keys.len() / d.max(1);
    let cap = kv.iter().map(slab_rows).max().unwrap_or(0);
    let pad = |slab: &[D]| {
        let mut v = slab.to_vec();
        v.resize(cap * d, D::default());
        v
    };
    let (mut keys, mut values, mut lists) = (Vec::new(), Vec::new(), Vec::new());
    for (h, g) in kv.iter().enumerate() {
        if g.keys.len() != g.values.len() || g.keys.len() % d.max(1) != 0 {
            return Err(Error::RaggedRows {
                op: OP,
                kv_head: h,
                what: "slab",
                len: g.values.len(),
                head_dim: d,
            });
        }
        if let Some(row) = g.positions.windows(2).position(|w| w[0] >= w[1]) {
            return Err(Error::PositionsNotAscending {
                op: OP,
                kv_head: h,
                row: row + 1,
                position: g.positions[row + 1],
            });
        }
        if let Some(s) = g.slots.filter(|s| s.len() != g.positions.len()) {
            return Err(Error::LengthMismatch {
                op: OP,
                what: "slots",
                expected: g.positions.len(),
                got: s.len(),
            });
        }
        keys.push(pad(g.keys));
        values.push(pad(g.values));
        lists.push(
            (0..g.num_rows()).map(|i| g.slots.map_or(i as u32, |s| s[i])).collect::<Vec<u32>>(),
        );
    }
    let k: Vec<&[D]> = keys.iter().map(Vec::as_slice).collect();
    let v: Vec<&[D]> = values.iter().map(Vec::as_slice).collect();
    let l: Vec<&[u32]> = lists.iter().map(Vec::as_slice).collect();
    Ok((PackedDense::gathered(d, &k, &l)?, PackedDense::gathered(d, &v, &l)?))
}

impl DecodeAttention for Gpu {
    fn dense<D: Value>(
        &mut self,
        cfg: &AttnConfig,
        q: &[f32],
        kv: &[DenseKv<'_, D>],
        out: &mut [f32],
    ) -> Result<()> {
        let (k, v) = dense_pair(cfg, kv)?;
        self.decode(cfg, q, LayerCache::Dense { keys: &k, values: &v }, out, None)
    }

    fn sparse<I: SparseIndex, V: Value>(
        &mut self,
        cfg: &AttnConfig,
        q: &[f32],
        kv: &[SparseKv<'_, I, V>],
        out: &mut [f32],
    ) -> Result<()> {
        let keys: Vec<_> = kv.iter().map(|h| h.keys).collect();
        let values: Vec<_> = kv.iter().map(|h| h.values).collect();
        let ks = kv.first().map_or(1.0, |h| h.key_scale);
        let vs = kv.first().map_or(1.0, |h| h.value_scale);
        if let Some((h, x)) =
            kv.iter().enumerate().find(|(_, x)| (x.key_scale, x.value_scale) != (ks, vs))
        {
            return Err(Error::InvalidValueScale {
                op: "Gpu::sparse",
                kv_head: h,
                what: "per-head (key, value)",
                scale: x.key_scale,
            });
        }
        let (k, v) = (PackedCsr::from_views(&keys, ks)?, PackedCsr::from_views(&values, vs)?);
        self.decode(cfg, q, LayerCache::Sparse { keys: &k, values: &v }, out, None)
    }

    fn hybrid<I: SparseIndex, V: Value, D: Value, H: HybridSource<I, V, D>>(
        &mut self,
        cfg: &AttnConfig,
        q: &[f32],
        kv: &[H],
        out: &mut [f32],
    ) -> Result<()> {
        if kv.iter().any(|h| h.history_prefix().is_some()) {
            return Err(Error::GpuUnsupported {
                op: "Gpu::hybrid",
                what: "a sparse history split into a prefix and the view's own rows".into(),
            });
        }
        if kv.iter().any(|h| !h.sink_rows().0.is_empty()) {
            return Err(Error::GpuUnsupported {
                op: "Gpu::hybrid",
                what: "sink rows kept in f32 before the hybrid rows".into(),
            });
        }
        let views: Vec<_> = kv.iter().map(HybridSource::hybrid_view).collect();
        let p = PackedHybrid::from_views(&views)?;
        self.decode(cfg, q, p.as_cache(), out, None)
    }

    fn gathered<D: Value>(
        &mut self,
        cfg: &AttnConfig,
        q: &[f32],
        kv: &[GatheredKv<'_, D>],
        out: &mut [f32],
        weights: Option<&mut [f32]>,
    ) -> Result<()> {
        let (k, v) = gathered_pair(cfg, kv)?;
        self.decode(cfg, q, LayerCache::Gathered { keys: &k, values: &v }, out, weights)
    }
}

impl EncodedAttention for Gpu {
    /// Not on the GPU: coded rows read through row decoders have no CUDA kernel.
    fn decoded<K: kv_sparse::decoded::DecodeRows, V: kv_sparse::decoded::DecodeRows>(
        &mut self,
        _cfg: &AttnConfig,
        _q: &[f32],
        _kv: &[crate::DecodedKv<'_, K, V>],
        _out: &mut [f32],
    ) -> Result<()> {
        Err(crate::Error::GpuUnsupported {
            op: "Gpu::decoded",
            what: "KIVI and TurboQuant-style rows (no CUDA kernel reads them)".into(),
        })
    }

    fn quantized<K: DenseCodec, V: DenseCodec>(
        &mut self,
        cfg: &AttnConfig,
        q: &[f32],
        kv: &[QuantKv<'_, K, V>],
        out: &mut [f32],
    ) -> Result<()> {
        if K::FORMAT != V::FORMAT {
            return Err(crate::Error::GpuUnsupported {
                op: "Gpu::quantized",
                what: format!("keys in {} with values in {}", K::FORMAT, V::FORMAT),
            });
        }
        let (k, v) = PackedQuant::pair(kv)?;
        self.decode(cfg, q, LayerCache::Quant { keys: &k, values: &v }, out, None)
    }

    fn coded_hybrid<X: IndexCode, Y: ValueCode, D: Value, H: CodedHybridSource<X, Y, D>>(
        &mut self,
        cfg: &AttnConfig,
        q: &[f32],
        kv: &[H],
        out: &mut [f32],
    ) -> Result<()> {
        let p = PackedCodedHybrid::from_sources(kv)?;
        self.decode(cfg, q, p.as_cache(), out, None)
    }
}
