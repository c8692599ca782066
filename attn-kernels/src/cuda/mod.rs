//! # GPU decode attention (feature `cuda`)
//!
//! CUDA versions of the decode kernels — dense baseline and its quantized variants (int8 /
//! int4 blocks, fp8 with a per-token scale), sparse CSR (SWAN §3, attention on the sparse rows
//! without decompression), hybrid sparse history + dense buffer under one softmax with the
//! history as CSR rows or as SWAN's coded rows (index list or bitmask × fp8 / int8 / int4),
//! and gathered attention over per-head resident positions returning anchor weights
//! (WnW §2.3) — plus CPU backends with the same signature.
//!
//! ## Primer
//! * **Sources and PTX.** One `.cu` per kernel family in `attn-kernels/cuda/`, kernel names
//!   suffixed by dtype (`hybrid_decode_fp8_u8_f16`). `scripts/gen_ptx.py` compiles them with
//!   NVRTC to PTX for `compute_80` and `compute_90`; the PTX is committed and embedded here,
//!   CI checks it is fresh and that `ptxas` accepts it.
//! * **Context, stream, modules.** [`Gpu::new`] initialises the driver once per process
//!   (primary context of device 0), creates a compute stream and a copy stream, and loads
//!   each PTX module the first time a kernel of its family runs (cached in a `OnceLock`).
//! * **Grid.** A decode launch is `grid = (splits, kv-heads)` blocks of 4 warps; each warp
//!   walks 32-row tiles of its split with an online softmax and writes one partial; the
//!   combine kernel merges the partials (flash-decoding). [`Plan`] computes the split.
//! * **Safety.** Every launch goes through one checked function whose `// SAFETY:` contract
//!   ties each device pointer to a live allocation sized by a [`LayerCache::check`]ed cache
//!   and a [`Plan`]; the host reads device memory only after synchronising the stream.
//!
//! Without the `cuda` feature the same API exists and [`Gpu::new`] returns
//! [`Error::CudaNotCompiled`](crate::Error::CudaNotCompiled); with it but without a device it
//! returns [`Error::NoDevice`](crate::Error::NoDevice).
//!
//! ## Testing without a GPU
//! [`crate::Reference`] (plain f64, the same functions the CPU kernels are tested against) and
//! [`KernelEmulation`] (an f32 mirror of the kernels' split, tile and combine arithmetic)
//! implement [`DecodeDevice`] like [`Gpu`]; the test bodies in this module run over every
//! available device, compare each to the reference, and print `SKIPPED: <reason>` for the GPU
//! when none is present.

mod attention;
mod cache;
mod emulation;
mod encoded;
mod kernels;
mod layout;

#[cfg(feature = "cuda")]
mod driver;
#[cfg(not(feature = "cuda"))]
mod nodriver;
#[cfg(feature = "cuda")]
pub use driver::{DeviceCache, Gpu};
#[cfg(not(feature = "cuda"))]
pub use nodriver::{DeviceCache, Gpu};

pub mod bench;
#[cfg(test)]
mod tests;

pub use cache::LayerCache;
pub use emulation::KernelEmulation;
pub use encoded::{CodedEntries, CodedHeadsArgs, PackedCoded, PackedCodedHybrid, PackedQuant};
pub use kernels::{
    CODED_BUFFERS, CODED_INDICES, CODED_VALUES, COMBINE_KERNEL, Family, HYBRID_PAIRS,
    WEIGHTS_KERNEL, kernel_for,
};
pub use layout::{
    CsrHeadsArgs, DecodeArgs, DenseHeadsArgs, MAX_GROUP_PASS, MAX_HEAD_DIM, MAX_PARTS, PackedCsr,
    PackedDense, PackedHybrid, Plan, TILE, WARPS, check_gpu, group_passes,
};

use crate::{AttnConfig, Result};

/// A decode backend: the GPU, or a CPU reference with the identical signature.
pub trait DecodeDevice {
    /// Human-readable name (device model, or which CPU backend).
    fn describe(&self) -> String;

    /// One decode step of a layer: `out[qh]` = softmax over the kv-head's rows of
    /// `scale · q[qh] · k` applied to its values, for every q-head (GQA: q-head `qh` reads
    /// kv-head `qh / group`). For [`LayerCache::Gathered`], `weights` (if given, one entry
    /// per attended row, heads concatenated) receives each row's softmax weight summed over
    /// the q-heads of its group.
    ///
    /// # Errors
    /// Any [`LayerCache::check`] failure; GPU driver errors as [`crate::Error::Cuda`].
    fn decode(
        &self,
        cfg: &AttnConfig,
        q: &[f32],
        cache: LayerCache<'_>,
        out: &mut [f32],
        weights: Option<&mut [f32]>,
    ) -> Result<()>;
}
