//! Which PTX module and entry point serves a [`LayerCache`]: the dtype-suffixed kernel names of
//! `attn-kernels/cuda/*.cu` and the committed PTX they live in (embedded with `include_str!`):
//! the dense baseline and its quantized variants, SWAN's sparse and hybrid decode over CSR or
//! coded rows (§3) and WnW's gathered decode with its anchor-weights pass (§2.3 Eq. 2).

use kv_sparse::ValueFormat;
use kv_sparse::coded::{IndexKind, ValueKind};

use super::cache::LayerCache;
use crate::{Error, Result};

/// A kernel family = one `.cu` file = one PTX module per architecture.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Family {
    /// `dense.cu`
    Dense,
    /// `sparse.cu`
    Sparse,
    /// `hybrid.cu`
    Hybrid,
    /// `gathered.cu` (also `gathered_weights_f32`)
    Gathered,
    /// `combine.cu`
    Combine,
    /// `quant.cu`
    Quant,
    /// `coded.cu`
    Coded,
}

impl Family {
    /// All families, in module-cache order.
    pub const ALL: [Family; 7] = [
        Family::Dense,
        Family::Sparse,
        Family::Hybrid,
        Family::Gathered,
        Family::Combine,
        Family::Quant,
        Family::Coded,
    ];

    /// Position in [`Family::ALL`].
    pub fn slot(self) -> usize {
        self as usize
    }

    /// The committed PTX of this family for `compute_80` (`sm90 == false`) or `compute_90`.
    pub fn ptx(self, sm90: bool) -> &'static str {
        macro_rules! ptx {
            ($name:literal) => {
                if sm90 {
                    include_str!(concat!("../../cuda/ptx/", $name, ".compute_90.ptx"))
                } else {
                    include_str!(concat!("../../cuda/ptx/", $name, ".compute_80.ptx"))
                }
            };
        }
        match self {
            Family::Dense => ptx!("dense"),
            Family::Sparse => ptx!("sparse"),
            Family::Hybrid => ptx!("hybrid"),
            Family::Gathered => ptx!("gathered"),
            Family::Combine => ptx!("combine"),
            Family::Quant => ptx!("quant"),
            Family::Coded => ptx!("coded"),
        }
    }
}

fn suffix(format: ValueFormat) -> &'static str {
    match format {
        ValueFormat::F32 => "f32",
        ValueFormat::F16 => "f16",
        ValueFormat::Bf16 => "bf16",
        ValueFormat::Fp8E4M3 => "fp8",
    }
}

fn index_suffix(bytes: usize) -> &'static str {
    if bytes == 1 { "u8" } else { "u16" }
}

/// The hybrid (sparse values, buffer) pairs compiled in `hybrid.cu`.
pub const HYBRID_PAIRS: [(ValueFormat, ValueFormat); 5] = [
    (ValueFormat::F16, ValueFormat::F16),
    (ValueFormat::Bf16, ValueFormat::Bf16),
    (ValueFormat::Fp8E4M3, ValueFormat::F16),
    (ValueFormat::Fp8E4M3, ValueFormat::Bf16),
    (ValueFormat::F32, ValueFormat::F32),
];

/// Index codes `coded.cu` compiles.
pub const CODED_INDICES: [IndexKind; 3] =
    [IndexKind::ListU8, IndexKind::ListU16, IndexKind::Bitmask];

/// Value codes `coded.cu` compiles (fp8 elements under the per-head scale; int8 / int4 with
/// a per-row f16 scale).
pub const CODED_VALUES: [ValueKind; 3] =
    [ValueKind::Elems(ValueFormat::Fp8E4M3), ValueKind::Int8, ValueKind::Int4];

/// Dense buffer formats `coded.cu` compiles.
pub const CODED_BUFFERS: [ValueFormat; 2] = [ValueFormat::F16, ValueFormat::Bf16];

fn coded_name(index: IndexKind, value: ValueKind, buffer: ValueFormat) -> Result<String> {
    let x = match index {
        IndexKind::ListU8 => "u8",
        IndexKind::ListU16 => "u16",
        IndexKind::Bitmask => "mask",
        _ => "",
    };
    let v = match value {
        ValueKind::Elems(ValueFormat::Fp8E4M3) => "fp8",
        ValueKind::Int8 => "int8",
        ValueKind::Int4 => "int4",
        _ => "",
    };
    if x.is_empty() || v.is_empty() || !CODED_BUFFERS.contains(&buffer) {
        return Err(Error::GpuUnsupported {
            op: "kernel_for",
            what: format!(
                "coded rows with {index} indices and {value} values over a {buffer} buffer \
                 (supported: {CODED_INDICES:?} x {CODED_VALUES:?} x {CODED_BUFFERS:?})"
            ),
        });
    }
    Ok(format!("coded_decode_{x}_{v}_{}", suffix(buffer)))
}

/// The family and entry point of the decode kernel for `cache`.
///
/// # Errors
/// [`Error::GpuUnsupported`] for a (values, buffer) pair `hybrid.cu` does not compile, or a
/// coded (index, values, buffer) combination `coded.cu` does not.
///
/// # Examples
/// ```
/// # use attn_kernels::cuda::{kernel_for, Family, LayerCache, PackedDense};
/// let k = PackedDense::from_rows::<half::f16>(2, &[(&[half::f16::ONE; 2], &[])])?;
/// let (family, name) = kernel_for(&LayerCache::Dense { keys: &k, values: &k })?;
/// assert_eq!((family, name.as_str()), (Family::Dense, "dense_decode_f16"));
/// # Ok::<(), attn_kernels::Error>(())
/// ```
pub fn kernel_for(cache: &LayerCache<'_>) -> Result<(Family, String)> {
    Ok(match *cache {
        LayerCache::Dense { keys, .. } => {
            (Family::Dense, format!("dense_decode_{}", suffix(keys.format)))
        }
        LayerCache::Gathered { keys, .. } => {
            (Family::Gathered, format!("gathered_decode_{}", suffix(keys.format)))
        }
        LayerCache::Sparse { keys, .. } => (
            Family::Sparse,
            format!("sparse_decode_{}_{}", suffix(keys.format), index_suffix(keys.index_bytes)),
        ),
        LayerCache::Hybrid { keys, buffer_keys, .. } => {
            if !HYBRID_PAIRS.contains(&(keys.format, buffer_keys.format)) {
                return Err(Error::GpuUnsupported {
                    op: "kernel_for",
                    what: format!(
                        "hybrid sparse {} values with a {} buffer (supported: {HYBRID_PAIRS:?})",
                        keys.format, buffer_keys.format
                    ),
                });
            }
            let name = format!(
                "hybrid_decode_{}_{}_{}",
                suffix(keys.format),
                index_suffix(keys.index_bytes),
                suffix(buffer_keys.format)
            );
            (Family::Hybrid, name)
        }
        LayerCache::Quant { keys, .. } => (Family::Quant, format!("quant_decode_{}", keys.format)),
        LayerCache::Coded { keys, buffer_keys, .. } => {
            (Family::Coded, coded_name(keys.index, keys.value, buffer_keys.format)?)
        }
    })
}

/// Entry points the combine and weights passes use.
pub const COMBINE_KERNEL: &str = "combine_partials_f32";
/// Anchor-weights kernel of `gathered.cu`.
pub const WEIGHTS_KERNEL: &str = "gathered_weights_f32";
