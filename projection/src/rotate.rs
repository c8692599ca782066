//! Runtime rotation of queries and keys by `P_QK`, after RoPE.
//!
//! SWAN §4: RoPE is position-dependent, so `P_QK` cannot be folded into `W_Q`/`W_K`; each
//! decode step computes `q̂ = RoPE(q)·P_QK` and `k̂ = RoPE(k)·P_QK` (the `4·d_h²` FLOP term
//! of Appendix A.2). Query head `h` uses the basis of kv-head `h / group`.
//!
//! Two kernels: a register-blocked row kernel (output columns in blocks of 32 accumulators,
//! `P` streamed row by row, AVX2+FMA picked at run time on x86-64) for the few rows of a
//! decode step, and `matrixmultiply`'s SGEMM for prefill-sized batches (from
//! [`GEMM_MIN_ROWS`] rows per basis), where packing `P` once pays off.

use crate::error::{Result, check_len, check_product};
use crate::gemm::{View, sgemm};
use crate::mat::Mat;
use crate::set::ProjectionSet;

/// Rows per basis from which batched rotation switches from the row kernel to SGEMM
/// (picked from `cargo bench -p projection --bench rotate`).
pub const GEMM_MIN_ROWS: usize = 16;

/// Output columns accumulated in registers at once by the row kernel.
const BLOCK: usize = 32;

/// Rows of a strided activation tensor: row `r` is `data[offset + r * stride ..][..d]`.
#[derive(Clone, Copy)]
struct Rows {
    offset: usize,
    stride: usize,
    n: usize,
}

/// `out = x·P` for one row (`x`, `out`: `d` floats; `p`: `d × d` row-major).
#[inline(always)]
fn row_kernel<const FMA: bool>(x: &[f32], p: &[f32], out: &mut [f32]) {
    let d = x.len();
    let mut c0 = 0;
    while c0 + BLOCK <= d {
        let mut acc = [0.0f32; BLOCK];
        for (i, &xi) in x.iter().enumerate() {
            let row = &p[i * d + c0..i * d + c0 + BLOCK];
            for (a, &pv) in acc.iter_mut().zip(row) {
                *a = if FMA { xi.mul_add(pv, *a) } else { *a + xi * pv };
            }
        }
        out[c0..c0 + BLOCK].copy_from_slice(&acc);
        c0 += BLOCK;
    }
    if c0 < d {
        let tail = &mut out[c0..d];
        tail.fill(0.0);
        for (i, &xi) in x.iter().enumerate() {
            for (o, &pv) in tail.iter_mut().zip(&p[i * d + c0..(i + 1) * d]) {
                *o = if FMA { xi.mul_add(pv, *o) } else { *o + xi * pv };
            }
        }
    }
}

#[inline(always)]
fn rows_kernel<const FMA: bool>(x: &[f32], xr: Rows, p: &[f32], out: &mut [f32], or: Rows) {
    let d = p.len().isqrt();
    for r in 0..xr.n {
        let src = &x[xr.offset + r * xr.stride..][..d];
        let dst = &mut out[or.offset + r * or.stride..][..d];
        row_kernel::<FMA>(src, p, dst);
    }
}

/// # Safety
/// The CPU must support AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn rows_kernel_avx2(x: &[f32], xr: Rows, p: &[f32], out: &mut [f32], or: Rows) {
    rows_kernel::<true>(x, xr, p, out, or);
}

/// Which implementation rotates a batch of rows.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum RotationKernel {
    /// Row kernel below [`GEMM_MIN_ROWS`] rows, SGEMM from there on (what every
    /// `ProjectionSet` rotation uses).
    #[default]
    Auto,
    /// Always the register-blocked row kernel.
    Rows,
    /// Always `matrixmultiply` SGEMM.
    Gemm,
}

/// Rotates `xr.n` strided rows of `x` into `out` (shapes already validated by the caller).
fn rotate_strided(x: &[f32], xr: Rows, p: &Mat, out: &mut [f32], or: Rows) {
    rotate_strided_with(RotationKernel::Auto, x, xr, p, out, or);
}

fn rotate_strided_with(
    kernel: RotationKernel,
    x: &[f32],
    xr: Rows,
    p: &Mat,
    out: &mut [f32],
    or: Rows,
) {
    let d = p.rows();
    let gemm = match kernel {
        RotationKernel::Auto => xr.n >= GEMM_MIN_ROWS,
        RotationKernel::Rows => false,
        RotationKernel::Gemm => true,
    };
    if gemm {
        let a = View { data: x, offset: xr.offset, rs: xr.stride, cs: 1 };
        sgemm(xr.n, d, d, a, View::row_major(p.as_slice(), 0, d), 0.0, out, or.offset, or.stride);
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
        // SAFETY: both target features were detected on this CPU just above.
        unsafe { rows_kernel_avx2(x, xr, p.as_slice(), out, or) };
        return;
    }
    rows_kernel::<false>(x, xr, p.as_slice(), out, or);
}

/// Rotates contiguous row vectors: `out[r] = x[r]·P` for `x`, `out`: `[n, d]` row-major and
/// `P`: `d × d` (basis vectors as columns). NaN/∞ in `x` propagate (no hot-path scan).
///
/// # Errors
/// [`crate::Error::Shape`] if `P` is not square, `x.len()` is not a multiple of `d`, or
/// `out.len() != x.len()`.
///
/// # Examples
/// ```
/// let p = projection::Mat::from_vec(2, 2, vec![0.0, 1.0, 1.0, 0.0])?; // swaps coordinates
/// let mut out = [0.0; 4];
/// projection::rotate_rows(&[1.0, 2.0, 3.0, 4.0], &p, &mut out)?;
/// assert_eq!(out, [2.0, 1.0, 4.0, 3.0]);
/// # Ok::<(), projection::Error>(())
/// ```
pub fn rotate_rows(x: &[f32], p: &Mat, out: &mut [f32]) -> Result<()> {
    rotate_rows_with(RotationKernel::Auto, x, p, out)
}

/// [`rotate_rows`] with an explicit implementation choice (for benchmarking the crossover
/// on a given machine; results agree to f32 rounding).
///
/// # Errors
/// As [`rotate_rows`].
///
/// # Examples
/// ```
/// use projection::{RotationKernel, rotate_rows_with};
/// let p = projection::random_orthogonal(8, 1);
/// let x = vec![0.5f32; 4 * 8];
/// let (mut a, mut b) = (vec![0.0; 32], vec![0.0; 32]);
/// rotate_rows_with(RotationKernel::Rows, &x, &p, &mut a)?;
/// rotate_rows_with(RotationKernel::Gemm, &x, &p, &mut b)?;
/// assert!(a.iter().zip(&b).all(|(u, v)| (u - v).abs() < 1e-5));
/// # Ok::<(), projection::Error>(())
/// ```
pub fn rotate_rows_with(kernel: RotationKernel, x: &[f32], p: &Mat, out: &mut [f32]) -> Result<()> {
    const OP: &str = "rotate_rows";
    let d = p.rows();
    check_len(OP, "P cols", d, p.cols())?;
    check_len(OP, "x (mod d)", 0, if d == 0 { x.len() } else { x.len() % d })?;
    check_len(OP, "out", x.len(), out.len())?;
    let n = x.len().checked_div(d).unwrap_or(0);
    let rows = Rows { offset: 0, stride: d, n };
    rotate_strided_with(kernel, x, rows, p, out, rows);
    Ok(())
}

impl ProjectionSet {
    /// `q̂ = RoPE(q)·P_QK` for one layer's queries `[n_tokens, q_heads, head_dim]`
    /// (row-major, after RoPE), written to `out` (same shape). Head `h` uses kv-head
    /// `h / group`'s basis. One decode token is `n_tokens = 1`.
    ///
    /// # Errors
    /// [`crate::Error::OutOfRange`] for a bad layer; [`crate::Error::Shape`] for wrong lengths.
    ///
    /// # Examples
    /// ```
    /// use projection::{ModelDims, ProjectionSet};
    /// let set = ProjectionSet::random(ModelDims::new(1, 4, 2, 8)?, "toy", 3)?;
    /// let (q, k) = (vec![0.5f32; 4 * 8], vec![0.25f32; 2 * 8]);
    /// let (mut qh, mut kh) = (vec![0.0; q.len()], vec![0.0; k.len()]);
    /// set.rotate_queries_into(0, 1, &q, &mut qh)?;
    /// set.rotate_keys_into(0, 1, &k, &mut kh)?;
    /// // Lemma 1: head 3 (kv-head 1) scores are unchanged by the rotation.
    /// let dot = |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f32>();
    /// assert!((dot(&qh[24..32], &kh[8..16]) - dot(&q[24..32], &k[8..16])).abs() < 1e-5);
    /// # Ok::<(), projection::Error>(())
    /// ```
    pub fn rotate_queries_into(
        &self,
        layer: usize,
        n_tokens: usize,
        q: &[f32],
        out: &mut [f32],
    ) -> Result<()> {
        self.rotate_heads(
            "ProjectionSet::rotate_queries",
            layer,
            n_tokens,
            self.dims().q_heads(),
            q,
            out,
        )
    }

    /// `k̂ = RoPE(k)·P_QK` for one layer's keys `[n_tokens, kv_heads, head_dim]` (after RoPE),
    /// written to `out` (same shape).
    ///
    /// # Errors
    /// [`crate::Error::OutOfRange`] for a bad layer; [`crate::Error::Shape`] for wrong lengths.
    ///
    /// # Examples
    /// See [`ProjectionSet::rotate_queries_into`].
    pub fn rotate_keys_into(
        &self,
        layer: usize,
        n_tokens: usize,
        k: &[f32],
        out: &mut [f32],
    ) -> Result<()> {
        self.rotate_heads(
            "ProjectionSet::rotate_keys",
            layer,
            n_tokens,
            self.dims().kv_heads(),
            k,
            out,
        )
    }

    /// In-place [`ProjectionSet::rotate_queries_into`] (allocates one scratch buffer).
    ///
    /// # Errors
    /// As [`ProjectionSet::rotate_queries_into`].
    ///
    /// # Examples
    /// ```
    /// use projection::{ModelDims, ProjectionSet};
    /// let set = ProjectionSet::identity(ModelDims::new(1, 2, 1, 4)?, "toy")?;
    /// let mut q = vec![1.0f32; 8];
    /// set.rotate_queries(0, 1, &mut q)?;
    /// assert_eq!(q, vec![1.0; 8]);
    /// # Ok::<(), projection::Error>(())
    /// ```
    pub fn rotate_queries(&self, layer: usize, n_tokens: usize, q: &mut [f32]) -> Result<()> {
        let mut out = vec![0.0; q.len()];
        self.rotate_queries_into(layer, n_tokens, q, &mut out)?;
        q.copy_from_slice(&out);
        Ok(())
    }

    /// In-place [`ProjectionSet::rotate_keys_into`] (allocates one scratch buffer).
    ///
    /// # Errors
    /// As [`ProjectionSet::rotate_keys_into`].
    ///
    /// # Examples
    /// ```
    /// use projection::{ModelDims, ProjectionSet};
    /// let set = ProjectionSet::random(ModelDims::new(1, 2, 1, 4)?, "toy", 0)?;
    /// let mut k = vec![1.0f32; 4];
    /// set.rotate_keys(0, 1, &mut k)?;
    /// let norm: f32 = k.iter().map(|x| x * x).sum();
    /// assert!((norm - 4.0).abs() < 1e-5); // rotations preserve norms
    /// # Ok::<(), projection::Error>(())
    /// ```
    pub fn rotate_keys(&self, layer: usize, n_tokens: usize, k: &mut [f32]) -> Result<()> {
        let mut out = vec![0.0; k.len()];
        self.rotate_keys_into(layer, n_tokens, k, &mut out)?;
        k.copy_from_slice(&out);
        Ok(())
    }

    /// Rotates `[n_tokens, heads, d]` where `heads` is `q_heads` or `kv_heads`; head `h`
    /// uses kv-head `h / (heads / kv_heads)`.
    fn rotate_heads(
        &self,
        op: &'static str,
        layer: usize,
        n_tokens: usize,
        heads: usize,
        x: &[f32],
        out: &mut [f32],
    ) -> Result<()> {
        let dims = self.dims();
        dims.check_layer(op, layer)?;
        let d = dims.head_dim();
        check_product(op, "input", &[n_tokens, heads, d], x.len())?;
        check_len(op, "out", x.len(), out.len())?;
        let per_kv = heads / dims.kv_heads();
        let bases = self.layer_bases(crate::error::Stream::Qk, layer);
        if n_tokens >= GEMM_MIN_ROWS {
            for h in 0..heads {
                let rows = Rows { offset: h * d, stride: heads * d, n: n_tokens };
                rotate_strided(x, rows, bases[h / per_kv].matrix(), out, rows);
            }
            return Ok(());
        }
        for t in 0..n_tokens {
            for (j, basis) in bases.iter().enumerate() {
                let rows = Rows { offset: (t * heads + j * per_kv) * d, stride: d, n: per_kv };
                rotate_strided(x, rows, basis.matrix(), out, rows);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reference::rotate_rows_naive;

    #[test]
    fn every_path_matches_the_naive_loop() {
        for d in [1usize, 5, 32, 33, 64, 70] {
            let p = crate::ablation::random_orthogonal(d, d as u64);
            for n in [1usize, 3, GEMM_MIN_ROWS - 1, GEMM_MIN_ROWS, 40] {
                let x: Vec<f32> =
                    (0..n * d).map(|i| ((i * 7919) % 23) as f32 / 11.0 - 1.0).collect();
                let (mut fast, mut slow) = (vec![0.0; n * d], vec![0.0; n * d]);
                rotate_rows(&x, &p, &mut fast).unwrap();
                rotate_rows_naive(&x, &p, &mut slow).unwrap();
                for (a, b) in fast.iter().zip(&slow) {
                    assert!((a - b).abs() < 1e-5, "d {d} n {n}: {a} vs {b}");
                }
                rows_kernel::<false>(
                    &x,
                    Rows { offset: 0, stride: d, n },
                    p.as_slice(),
                    &mut fast,
                    Rows { offset: 0, stride: d, n },
                );
                for (a, b) in fast.iter().zip(&slow) {
                    assert!((a - b).abs() < 1e-5, "portable kernel d {d} n {n}: {a} vs {b}");
                }
            }
        }
    }

    #[test]
    fn shape_errors() {
        let p = Mat::identity(4);
        assert!(rotate_rows(&[0.0; 6], &p, &mut [0.0; 6]).is_err());
        assert!(rotate_rows(&[0.0; 8], &p, &mut [0.0; 4]).is_err());
        assert!(rotate_rows(&[0.0; 4], &Mat::zeros(4, 3), &mut [0.0; 4]).is_err());
    }
}
