//! SWAN's orthogonal bases: calibration, eigen-bases, absorption into `W_V`/`W_O`, runtime
//! rotation of queries/keys, ablation bases, and safetensors persistence.
//!
//! SWAN (`papers/swan.txt`, §4 "projection matrices", Appendix A.1) rotates each attention
//! head into a data-driven orthogonal basis so that magnitude top-k pruning of cached keys
//! and values keeps most of their energy. Before pruning the rotation is exactly lossless:
//! scores `q̂·k̂ᵀ = q·kᵀ` (Lemma 1) and the layer output through `Ŵ_V`/`Ŵ_O` is unchanged
//! (Lemma 2) — both are property-tested in this crate.
//!
//! # Conventions
//! * Everything is row-major `f32` (accumulators: f64). Activations are row vectors.
//! * A basis `P` is a `d_h × d_h` [`Mat`] whose **columns** are the basis vectors, sorted by
//!   descending eigenvalue; rotation is `x̂ = x·P`, inverse `x = x̂·Pᵀ`.
//! * Weights are Hugging Face `nn.Linear` `[out, in]` (`y = x·Wᵀ + b`); see [`absorb`]'s
//!   module docs for the derivation in that layout.
//! * GQA: query head `h` belongs to kv-head `h / (q_heads / kv_heads)`.
//!
//! # Pipeline
//! ```
//! use projection::{CalibrationConfig, Calibrator, LayerActivations, ModelDims, ProjectionSet};
//! let dims = ModelDims::new(2, 4, 2, 8)?; // 2 layers, 4 q-heads, 2 kv-heads, d_h = 8
//! let mut cal = Calibrator::new(dims, CalibrationConfig::default())?;
//! let n = 16; // tokens in this chunk
//! let q: Vec<f32> = (0..n * 4 * 8).map(|i| ((i * 37) % 19) as f32 - 9.0).collect();
//! let kv: Vec<f32> = (0..n * 2 * 8).map(|i| ((i * 11) % 7) as f32 - 3.0).collect();
//! for layer in 0..2 {
//!     let acts = LayerActivations { n_tokens: n, queries: &q, keys: &kv, values: &kv, attn_out: &q };
//!     cal.observe_layer(layer, &acts)?;
//! }
//! let set = cal.finish("toy-model")?;
//! let mut w_v = vec![0.1f32; 2 * 8 * 32]; // v_proj.weight [kv_heads·d, hidden = 32]
//! set.absorb_value(0, &mut w_v, 32, None)?;
//! let mut q0 = q[..4 * 8].to_vec(); // one decode token, after RoPE
//! set.rotate_queries(0, 1, &mut q0)?;
//! let bytes = set.to_bytes()?;
//! assert_eq!(ProjectionSet::from_bytes(&bytes)?, set);
//! # Ok::<(), projection::Error>(())
//! ```

pub mod ablation;
pub mod absorb;
pub mod basis;
pub mod calibrate;
pub mod dims;
pub mod error;
mod gemm;
pub mod heads;
pub mod io;
pub mod mat;
pub mod moment;
pub mod reference;
pub mod rotate;
pub mod set;
#[cfg(feature = "proptest")]
pub mod strategies;

pub use ablation::{HADAMARD_V_BLOCK, JITTER_ANGLE, hadamard, hadamard_blocks, random_orthogonal};
pub use absorb::{absorb_output_weights, absorb_value_weights};
pub use basis::Basis;
pub use calibrate::{
    CalibrationConfig, Calibrator, LayerActivations, SampleCounts, Weighting, calibrate_parallel,
};
pub use dims::{ModelDims, Site, Stream};
pub use error::{Error, Result};
pub use mat::Mat;
pub use moment::SecondMoment;
pub use rotate::{
    Direction, GEMM_MIN_ROWS, RotationKernel, rotate_rows, rotate_rows_with, unrotate_rows,
};
pub use set::{BasisKind, HeadCounts, ORTHOGONALITY_TOLERANCE, ProjectionSet, Provenance};
