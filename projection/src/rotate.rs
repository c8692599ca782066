//! Rotation kernels: `x̂ = x·P` (and the inverse `x = x̂·Pᵀ`) for row vectors.
//!
//! SWAN §4: RoPE is position-dependent, so `P_QK` cannot be folded into `W_Q`/`W_K`; each
//! decode step computes `q̂ = RoPE(q)·P_QK` and `k̂ = RoPE(k)·P_QK` (the `4·d_h²` FLOP term
//! of Appendix A.2). The head-layout entry points are in [`crate::heads`].
//!
//! Two kernels: a register-blocked row kernel (forward: output columns in blocks of 32
//! accumulators with `P` streamed row by row; inverse: 16-lane dot products against the
//! rows of `P`; AVX2+FMA picked at run time on x86-64) for the few rows of a decode step,
//! and `matrixmultiply`'s SGEMM for prefill-sized batches (from [`GEMM_MIN_ROWS`] rows per
//! basis), where packing `P` once pays off. A decode step's queries and key share their
//! group's basis; `rotate_group` runs them through the forward kernel together, up to six
//! rows per pass over `P` (behind [`crate::ProjectionSet::rotate_qk_into`]).

use crate::error::{Result, check_len};
use crate::gemm::{View, sgemm};
use crate::mat::Mat;

/// Rows per basis from which batched rotation switches from the row kernel to SGEMM
/// (picked from `cargo bench -p kvtide-projection --bench rotate`).
pub const GEMM_MIN_ROWS: usize = 16;

/// Output columns per register block of the portable forward kernel (the AVX2 build uses
/// 64 for one row and 32 per row for row pairs: 8 ymm accumulators either way).
const BLOCK: usize = 32;

/// Lanes of the inverse kernel's dot-product accumulators.
const LANES: usize = 16;

/// Rows of a strided activation tensor: row `r` is `data[offset + r * stride ..][..d]`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Rows {
    pub offset: usize,
    pub stride: usize,
    pub n: usize,
}

/// Rotate into the basis (`x̂ = x·P`) or back out of it (`x = x̂·Pᵀ`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Direction {
    /// `x̂ = x·P`: model coordinates → basis coordinates.
    #[default]
    Forward,
    /// `x = x̂·Pᵀ`: basis coordinates → model coordinates.
    Inverse,
}

#[inline(always)]
fn madd<const FMA: bool>(acc: f32, x: f32, p: f32) -> f32 {
    if FMA { x.mul_add(p, acc) } else { acc + x * p }
}

/// `outs[r] = xs[r]·P` for `R` rows at once (`p`: `d × d` row-major). Output columns are
/// produced in blocks of `B` register accumulators per row, and each loaded element of `P`
/// is used by all `R` rows (the rows of one GQA group share their basis).
#[inline(always)]
fn block_kernel<const FMA: bool, const R: usize, const B: usize>(
    xs: [&[f32]; R],
    p: &[f32],
    outs: &mut [&mut [f32]; R],
) {
    let d = xs[0].len();
    let mut c0 = 0;
    while c0 + B <= d {
        let mut acc = [[0.0f32; B]; R];
        for i in 0..d {
            let row = &p[i * d + c0..][..B];
            for r in 0..R {
                let xi = xs[r][i];
                for (a, &pv) in acc[r].iter_mut().zip(row) {
                    *a = madd::<FMA>(*a, xi, pv);
                }
            }
        }
        for r in 0..R {
            outs[r][c0..c0 + B].copy_from_slice(&acc[r]);
        }
        c0 += B;
    }
    if c0 < d {
        for r in 0..R {
            let tail = &mut outs[r][c0..d];
            tail.fill(0.0);
            for (i, &xi) in xs[r].iter().enumerate() {
                for (o, &pv) in tail.iter_mut().zip(&p[i * d + c0..(i + 1) * d]) {
                    *o = madd::<FMA>(*o, xi, pv);
                }
            }
        }
    }
}

/// `out = x·Pᵀ` for one row: `out[j]` is the dot product of `x` with row `j` of `P`.
#[inline(always)]
fn row_kernel_inverse<const FMA: bool>(x: &[f32], p: &[f32], out: &mut [f32]) {
    let d = x.len();
    let (x_chunks, x_tail) = x.as_chunks::<LANES>();
    for (j, o) in out.iter_mut().enumerate() {
        let (p_chunks, p_tail) = p[j * d..(j + 1) * d].as_chunks::<LANES>();
        let mut acc = [0.0f32; LANES];
        for (xc, pc) in x_chunks.iter().zip(p_chunks) {
            for ((a, &xv), &pv) in acc.iter_mut().zip(xc).zip(pc) {
                *a = if FMA { xv.mul_add(pv, *a) } else { *a + xv * pv };
            }
        }
        let tail: f32 = x_tail.iter().zip(p_tail).map(|(a, b)| a * b).sum();
        *o = acc.iter().sum::<f32>() + tail;
    }
}

/// Applies the forward (`INV = false`) or inverse kernel to `xr.n` strided rows; forward
/// rows go two at a time (blocks of `B2` columns) with a single-row tail (blocks of `B1`).
#[inline(always)]
fn rows_kernel<const FMA: bool, const INV: bool, const B1: usize, const B2: usize>(
    x: &[f32],
    xr: Rows,
    p: &[f32],
    out: &mut [f32],
    or: Rows,
) {
    let d = p.len().isqrt();
    let src = |r: usize| &x[xr.offset + r * xr.stride..][..d];
    let mut r = 0;
    while !INV && r + 2 <= xr.n {
        let (o0, o1) = (or.offset + r * or.stride, or.offset + (r + 1) * or.stride);
        // Two disjoint output rows (or.stride >= d, checked by the callers' shapes).
        let (head, rest) = out.split_at_mut(o1);
        let mut outs = [&mut head[o0..o0 + d], &mut rest[..d]];
        block_kernel::<FMA, 2, B2>([src(r), src(r + 1)], p, &mut outs);
        r += 2;
    }
    for r in r..xr.n {
        let dst = &mut out[or.offset + r * or.stride..][..d];
        if INV {
            row_kernel_inverse::<FMA>(src(r), p, dst);
        } else {
            block_kernel::<FMA, 1, B1>([src(r)], p, &mut [dst]);
        }
    }
}

/// # Safety
/// The CPU must support AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn rows_kernel_avx2<const INV: bool>(
    x: &[f32],
    xr: Rows,
    p: &[f32],
    out: &mut [f32],
    or: Rows,
) {
    rows_kernel::<true, INV, 64, 32>(x, xr, p, out, or);
}

/// Most rows one pass of [`rotate_group`] carries: with 16 output columns per block (two
/// AVX2 registers per row) that is 12 accumulators plus the two `P` chunks and a broadcast.
pub(crate) const GROUP_ROWS: usize = 6;

/// Output columns per block of [`rotate_group`].
const GROUP_BLOCK: usize = 16;

/// `outs[r] = xs[r]·P` for rows that share one basis — a GQA group's queries and its key
/// in one decode step — in passes of up to [`GROUP_ROWS`] rows, so each element of `P`
/// is loaded once per pass instead of once per call per row pair. Same summation order as
/// the forward row kernel (`acc ← x_i·p_ic + acc` for `i = 0..d`), so the results equal
/// [`rotate_strided`]'s bit for bit on the same instruction set.
pub(crate) fn rotate_group(xs: &[&[f32]], p: &Mat, outs: &mut [&mut [f32]]) {
    debug_assert_eq!(xs.len(), outs.len());
    for (x, out) in xs.chunks(GROUP_ROWS).zip(outs.chunks_mut(GROUP_ROWS)) {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
        {
            // SAFETY: both target features were detected on this CPU just above.
            unsafe { group_pass_avx2(x, p.as_slice(), out) };
            continue;
        }
        group_pass::<false>(x, p.as_slice(), out);
    }
}

/// One pass of at most [`GROUP_ROWS`] rows, dispatched to the block kernel of that height.
#[inline(always)]
fn group_pass<const FMA: bool>(xs: &[&[f32]], p: &[f32], outs: &mut [&mut [f32]]) {
    macro_rules! pass {
        ($($n:literal)*) => {
            match xs.len() {
                $($n => {
                    let x: [&[f32]; $n] = std::array::from_fn(|r| xs[r]);
                    let mut o: [&mut [f32]; $n] = rows_mut(outs);
                    block_kernel::<FMA, $n, GROUP_BLOCK>(x, p, &mut o);
                })*
                n => unreachable!("a pass holds 1..={GROUP_ROWS} rows, got {n}"),
            }
        };
    }
    pass!(1 2 3 4 5 6);
}

/// The first `N` output rows as an array of mutable slices.
fn rows_mut<'a, const N: usize>(outs: &'a mut [&mut [f32]]) -> [&'a mut [f32]; N] {
    let mut it = outs.iter_mut();
    std::array::from_fn(|_| &mut **it.next().expect("a pass has N output rows"))
}

/// # Safety
/// The CPU must support AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn group_pass_avx2(xs: &[&[f32]], p: &[f32], outs: &mut [&mut [f32]]) {
    group_pass::<true>(xs, p, outs);
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
pub(crate) fn rotate_strided(
    kernel: RotationKernel,
    dir: Direction,
    x: &[f32],
    xr: Rows,
    p: &Mat,
    out: &mut [f32],
    or: Rows,
) {
    let d = p.rows();
    let inverse = dir == Direction::Inverse;
    let gemm = match kernel {
        RotationKernel::Auto => xr.n >= GEMM_MIN_ROWS,
        RotationKernel::Rows => false,
        RotationKernel::Gemm => true,
    };
    if gemm {
        let a = View { data: x, offset: xr.offset, rs: xr.stride, cs: 1 };
        let pm = p.as_slice();
        let b = if inverse { View::transposed(pm, 0, d) } else { View::row_major(pm, 0, d) };
        sgemm(xr.n, d, d, a, b, 0.0, out, or.offset, or.stride);
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
        // SAFETY: both target features were detected on this CPU just above.
        unsafe {
            if inverse {
                rows_kernel_avx2::<true>(x, xr, p.as_slice(), out, or);
            } else {
                rows_kernel_avx2::<false>(x, xr, p.as_slice(), out, or);
            }
        }
        return;
    }
    if inverse {
        rows_kernel::<false, true, BLOCK, BLOCK>(x, xr, p.as_slice(), out, or);
    } else {
        rows_kernel::<false, false, BLOCK, BLOCK>(x, xr, p.as_slice(), out, or);
    }
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
    rotate_rows_with(RotationKernel::Auto, Direction::Forward, x, p, out)
}

/// Inverse rotation of contiguous row vectors: `out[r] = x̂[r]·Pᵀ` (back to model
/// coordinates). Same layouts as [`rotate_rows`].
///
/// # Errors
/// As [`rotate_rows`].
///
/// # Examples
/// ```
/// let p = projection::random_orthogonal(8, 3);
/// let x: Vec<f32> = (0..16).map(|i| i as f32).collect();
/// let (mut rotated, mut back) = (vec![0.0; 16], vec![0.0; 16]);
/// projection::rotate_rows(&x, &p, &mut rotated)?;
/// projection::unrotate_rows(&rotated, &p, &mut back)?;
/// assert!(x.iter().zip(&back).all(|(a, b)| (a - b).abs() < 1e-4));
/// # Ok::<(), projection::Error>(())
/// ```
pub fn unrotate_rows(x: &[f32], p: &Mat, out: &mut [f32]) -> Result<()> {
    rotate_rows_with(RotationKernel::Auto, Direction::Inverse, x, p, out)
}

/// [`rotate_rows`] / [`unrotate_rows`] with an explicit implementation choice (for
/// benchmarking the crossover on a given machine; results agree to f32 rounding).
///
/// # Errors
/// As [`rotate_rows`].
///
/// # Examples
/// ```
/// use projection::{Direction, RotationKernel, rotate_rows_with};
/// let p = projection::random_orthogonal(8, 1);
/// let x = vec![0.5f32; 4 * 8];
/// let (mut a, mut b) = (vec![0.0; 32], vec![0.0; 32]);
/// rotate_rows_with(RotationKernel::Rows, Direction::Forward, &x, &p, &mut a)?;
/// rotate_rows_with(RotationKernel::Gemm, Direction::Forward, &x, &p, &mut b)?;
/// assert!(a.iter().zip(&b).all(|(u, v)| (u - v).abs() < 1e-5));
/// # Ok::<(), projection::Error>(())
/// ```
pub fn rotate_rows_with(
    kernel: RotationKernel,
    dir: Direction,
    x: &[f32],
    p: &Mat,
    out: &mut [f32],
) -> Result<()> {
    const OP: &str = "rotate_rows";
    let d = p.rows();
    check_len(OP, "P cols", d, p.cols())?;
    check_len(OP, "x (mod d)", 0, if d == 0 { x.len() } else { x.len() % d })?;
    check_len(OP, "out", x.len(), out.len())?;
    let n = x.len().checked_div(d).unwrap_or(0);
    let rows = Rows { offset: 0, stride: d, n };
    rotate_strided(kernel, dir, x, rows, p, out, rows);
    Ok(())
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
                let all = Rows { offset: 0, stride: d, n };
                rows_kernel::<false, false, BLOCK, 16>(&x, all, p.as_slice(), &mut fast, all);
                for (a, b) in fast.iter().zip(&slow) {
                    assert!((a - b).abs() < 1e-5, "portable kernel d {d} n {n}: {a} vs {b}");
                }
                let pt = p.transpose();
                rotate_rows_naive(&x, &pt, &mut slow).unwrap();
                for kernel in [RotationKernel::Rows, RotationKernel::Gemm] {
                    rotate_rows_with(kernel, Direction::Inverse, &x, &p, &mut fast).unwrap();
                    for (a, b) in fast.iter().zip(&slow) {
                        assert!((a - b).abs() < 1e-5, "inverse {kernel:?} d {d} n {n}: {a} vs {b}");
                    }
                }
                rows_kernel::<false, true, BLOCK, BLOCK>(&x, all, p.as_slice(), &mut fast, all);
                for (a, b) in fast.iter().zip(&slow) {
                    assert!((a - b).abs() < 1e-5, "portable inverse d {d} n {n}: {a} vs {b}");
                }
            }
        }
    }

    #[test]
    fn group_passes_match_the_row_kernel_bit_for_bit() {
        for d in [1usize, 5, 16, 33, 64] {
            let p = crate::ablation::random_orthogonal(d, 3 + d as u64);
            for n in 1..=GROUP_ROWS {
                let x: Vec<f32> = (0..n * d).map(|i| ((i * 13) % 19) as f32 / 5.0 - 1.7).collect();
                let all = Rows { offset: 0, stride: d, n };
                let mut want = vec![0.0; n * d];
                let mut got = vec![0.0; n * d];
                let xs: Vec<&[f32]> = x.chunks_exact(d).collect();
                for fma in [false, true] {
                    let mut outs: Vec<&mut [f32]> = got.chunks_exact_mut(d).collect();
                    if fma {
                        rows_kernel::<true, false, BLOCK, BLOCK>(
                            &x,
                            all,
                            p.as_slice(),
                            &mut want,
                            all,
                        );
                        group_pass::<true>(&xs, p.as_slice(), &mut outs);
                    } else {
                        rows_kernel::<false, false, BLOCK, BLOCK>(
                            &x,
                            all,
                            p.as_slice(),
                            &mut want,
                            all,
                        );
                        group_pass::<false>(&xs, p.as_slice(), &mut outs);
                    }
                    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                    assert_eq!(bits(&got), bits(&want), "d {d}, {n} rows, fma {fma}");
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
