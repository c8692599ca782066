//! Slow, obviously-correct reference implementations of the tuned paths, for tests and as
//! the in-run baselines of the criterion benches (SWAN §4 rotation and calibration).

use crate::error::{Result, check_finite, check_len};
use crate::mat::Mat;

/// Textbook triple loop `out[r][j] = Σ_i x[r][i]·P[i][j]` (inner loop walks a column of
/// `P`): the baseline the tuned [`crate::rotate_rows`] is benchmarked against.
///
/// # Errors
/// As [`crate::rotate_rows`].
///
/// # Examples
/// ```
/// let p = projection::Mat::identity(3);
/// let mut out = [0.0; 3];
/// projection::reference::rotate_rows_naive(&[1.0, 2.0, 3.0], &p, &mut out)?;
/// assert_eq!(out, [1.0, 2.0, 3.0]);
/// # Ok::<(), projection::Error>(())
/// ```
pub fn rotate_rows_naive(x: &[f32], p: &Mat, out: &mut [f32]) -> Result<()> {
    const OP: &str = "rotate_rows_naive";
    let d = p.rows();
    check_len(OP, "P cols", d, p.cols())?;
    check_len(OP, "x (mod d)", 0, if d == 0 { x.len() } else { x.len() % d })?;
    check_len(OP, "out", x.len(), out.len())?;
    let pm = p.as_slice();
    for r in 0..x.len().checked_div(d).unwrap_or(0) {
        for j in 0..d {
            let mut s = 0.0f32;
            for i in 0..d {
                s += x[r * d + i] * pm[i * d + j];
            }
            out[r * d + j] = s;
        }
    }
    Ok(())
}

/// Rank-one-update accumulation `M += w·x xᵀ` in f64, one vector at a time: the baseline of
/// the GEMM-based [`crate::SecondMoment::add_vectors`]. `m` is `d × d` row-major.
///
/// # Errors
/// [`crate::Error::Shape`] if `m` is not `d × d` or `vectors` is not `[n, d]`;
/// [`crate::Error::NonFinite`] on NaN/∞.
///
/// # Examples
/// ```
/// let mut m = vec![0.0f64; 4];
/// projection::reference::accumulate_naive(&mut m, 2, &[1.0, 2.0], 1.0)?;
/// assert_eq!(m, vec![1.0, 2.0, 2.0, 4.0]);
/// # Ok::<(), projection::Error>(())
/// ```
pub fn accumulate_naive(m: &mut [f64], d: usize, vectors: &[f32], weight: f64) -> Result<()> {
    const OP: &str = "accumulate_naive";
    check_len(OP, "m", d * d, m.len())?;
    check_len(OP, "vectors (mod d)", 0, if d == 0 { vectors.len() } else { vectors.len() % d })?;
    check_finite(OP, "vectors", vectors)?;
    for x in vectors.chunks_exact(d.max(1)) {
        for i in 0..d {
            let wi = weight * f64::from(x[i]);
            for j in 0..d {
                m[i * d + j] += wi * f64::from(x[j]);
            }
        }
    }
    Ok(())
}
