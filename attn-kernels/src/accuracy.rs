//! How far each optimized kernel may be from the reference: one table, per kernel and
//! value format.
//!
//! **Metric.** For one call, `error = max_i |got_i − want_i| / bound`, where `want` is the
//! [`crate::Reference`] output and `bound` is the largest magnitude of any (decoded,
//! scaled) value entry the call attends over. An attention output is a convex combination
//! of value rows, so `bound` is its natural scale; an error relative to each output element
//! would be meaningless where the combination cancels to ≈ 0. For softmax weights
//! ([`crate::DecodeAttention::gathered`], [`crate::GatheredSparseAttention::gathered_sparse`])
//! the error is the plain absolute difference of each
//! per-row sum (a probability, at most the group size).
//!
//! **Where the error comes from.** The reference decodes exactly the stored values the
//! optimized kernels decode (f16, bf16 and fp8 all widen to `f32` without rounding), so the
//! storage format contributes *no* error to this comparison — it only fixes the
//! magnitudes. What differs is arithmetic: `f32` instead of `f64` dot products and sums
//! (tile-wise, split-wise), the online softmax's rescaling, and the degree-7 polynomial
//! `2^x` of the AVX2 kernels (relative error < 10⁻⁷ after rounding). The tolerances below
//! hold for logits of typical magnitude (`|scale · q·k| ≲ 30`) and caches up to 10⁵ rows;
//! they are about ten times the largest error the test-suite observes. Every entry is
//! exercised by `tests/kernels.rs` on every instruction set the machine supports.
//!
//! **What the table does not cover.** The loss of pruning itself (`k < d_h`) and of
//! quantising to a value format is SWAN's approximation, not a kernel error: it is measured
//! against dense attention in the losslessness tests (`k = d_h`, `f32`:
//! [`LOSSLESS_RELATIVE`]) and in the model-level evaluations.

use kv_sparse::ValueFormat;

/// The kernel families of [`crate::DecodeAttention`] and
/// [`crate::GatheredSparseAttention`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kernel {
    /// Dense K/V rows.
    Dense,
    /// CSR K/V rows.
    Sparse,
    /// Sparse history + dense buffer (the format is the sparse values' format).
    Hybrid,
    /// Resident rows of a tiered store.
    Gathered,
    /// Resident dense and sparse fp8 rows of a tiered store (the format is the dense
    /// rows'; sparse values are always fp8).
    GatheredSparse,
}

/// The tolerance of one optimized kernel against the reference.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Tolerance {
    /// Kernel family.
    pub kernel: Kernel,
    /// Value format (for [`Kernel::Hybrid`]: the sparse history's).
    pub format: ValueFormat,
    /// Largest allowed output error, relative to the value bound (see the module docs).
    pub output: f32,
    /// Largest allowed absolute error of a softmax-weight sum (gathered only; 0 elsewhere).
    pub weights: f32,
}

const fn t(kernel: Kernel, format: ValueFormat, output: f32, weights: f32) -> Tolerance {
    Tolerance { kernel, format, output, weights }
}

use Kernel::{Dense, Gathered, GatheredSparse, Hybrid, Sparse};
use ValueFormat::{Bf16, F16, F32, Fp8E4M3};

/// Every (kernel, format) pair and its tolerance.
pub const TABLE: [Tolerance; 20] = [
    t(Dense, F32, 4e-6, 0.0),
    t(Dense, F16, 4e-6, 0.0),
    t(Dense, Bf16, 4e-6, 0.0),
    t(Dense, Fp8E4M3, 4e-6, 0.0),
    t(Sparse, F32, 4e-6, 0.0),
    t(Sparse, F16, 4e-6, 0.0),
    t(Sparse, Bf16, 4e-6, 0.0),
    t(Sparse, Fp8E4M3, 4e-6, 0.0),
    t(Hybrid, F32, 4e-6, 0.0),
    t(Hybrid, F16, 4e-6, 0.0),
    t(Hybrid, Bf16, 4e-6, 0.0),
    t(Hybrid, Fp8E4M3, 4e-6, 0.0),
    t(Gathered, F32, 4e-6, 1.5e-6),
    t(Gathered, F16, 4e-6, 1.5e-6),
    t(Gathered, Bf16, 4e-6, 1.5e-6),
    t(Gathered, Fp8E4M3, 4e-6, 1.5e-6),
    t(GatheredSparse, F32, 4e-6, 1.5e-6),
    t(GatheredSparse, F16, 4e-6, 1.5e-6),
    t(GatheredSparse, Bf16, 4e-6, 1.5e-6),
    t(GatheredSparse, Fp8E4M3, 4e-6, 1.5e-6),
];

/// Lossless mode (`k = d_h`, `f32` values and buffer): the largest allowed difference
/// between sparse/hybrid and dense attention, relative to the largest output magnitude.
pub const LOSSLESS_RELATIVE: f32 = 1e-6;

/// The tolerance of `kernel` with values in `format`.
///
/// # Examples
/// ```
/// use attn_kernels::accuracy::{Kernel, tolerance};
/// let t = tolerance(Kernel::Hybrid, kv_sparse::ValueFormat::Fp8E4M3);
/// assert!(t.output > 0.0 && t.output < 1e-4);
/// ```
pub fn tolerance(kernel: Kernel, format: ValueFormat) -> Tolerance {
    TABLE
        .into_iter()
        .find(|t| t.kernel == kernel && t.format == format)
        .expect("TABLE covers every kernel and format")
}

/// `max_i |got_i − want_i| / bound` (the table's metric); `∞` on length mismatch or a
/// non-finite output.
///
/// # Examples
/// ```
/// let e = attn_kernels::accuracy::output_error(&[1.0, 2.0], &[1.0, 2.5], 5.0);
/// assert_eq!(e, 0.1);
/// ```
pub fn output_error(got: &[f32], want: &[f32], bound: f32) -> f32 {
    if got.len() != want.len() || got.iter().any(|x| !x.is_finite()) {
        return f32::INFINITY;
    }
    let worst = got.iter().zip(want).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
    worst / bound.max(f32::MIN_POSITIVE)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_covers_every_pair_once() {
        for kernel in [Dense, Sparse, Hybrid, Gathered, GatheredSparse] {
            for format in ValueFormat::ALL {
                let n = TABLE.iter().filter(|t| t.kernel == kernel && t.format == format).count();
                assert_eq!(n, 1, "{kernel:?} {format}");
            }
        }
    }

    #[test]
    fn output_error_rejects_nan_and_mismatch() {
        assert_eq!(output_error(&[f32::NAN], &[0.0], 1.0), f32::INFINITY);
        assert_eq!(output_error(&[0.0], &[0.0, 1.0], 1.0), f32::INFINITY);
        assert_eq!(output_error(&[0.5], &[0.5], 1.0), 0.0);
    }
}
