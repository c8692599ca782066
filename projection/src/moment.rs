//! `SecondMoment`: a streaming, mergeable f64 accumulator of `Σ w·xᵀx` for one head.
//!
//! SWAN §4 builds each basis from the joint distribution of the vectors it will rotate: the
//! eigenvectors of their (uncentred) second-moment matrix. Uncentred on purpose: SWAN
//! prunes by magnitude around the origin, so the basis must compact `E[x xᵀ]`, not the
//! covariance around the mean.
//!
//! Layout: the accumulated matrix is `d × d` row-major f64, `M[(i, j)] = Σ_n w_n x_n[i]
//! x_n[j]`. Vectors are added in blocks and folded in with one GEMM (`XᵀX`) per block, so
//! accumulation runs at GEMM speed; two accumulators over disjoint data merge by addition.

use crate::error::{Error, Result, check_finite, check_len};
use crate::gemm::{View, dgemm};
use crate::mat::Mat;

/// Vectors folded into one GEMM call: bounds the scratch buffer to `MAX_BLOCK·d` f64.
const MAX_BLOCK: usize = 2048;

/// Column-block width of the symmetric (upper-triangle) accumulation in `fold`.
const SYMM_BLOCK: usize = 32;

/// Streaming f64 second-moment matrix of `d`-dimensional vectors.
#[derive(Clone, Debug, PartialEq)]
pub struct SecondMoment {
    dim: usize,
    sum: Vec<f64>,
    vectors: u64,
    weight: f64,
}

/// A strided run of sample vectors inside an activation tensor: for `t in 0..rows`, the
/// `run` vectors of `d` floats starting at `data[offset + t * stride]`, each with `weight`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RowBlock<'a> {
    pub data: &'a [f32],
    pub offset: usize,
    pub stride: usize,
    pub rows: usize,
    pub run: usize,
    pub weight: f64,
}

impl SecondMoment {
    /// An empty accumulator for `dim`-dimensional vectors.
    ///
    /// # Examples
    /// ```
    /// let m = projection::SecondMoment::new(4);
    /// assert_eq!((m.dim(), m.vectors()), (4, 0));
    /// ```
    pub fn new(dim: usize) -> Self {
        Self { dim, sum: vec![0.0; dim * dim], vectors: 0, weight: 0.0 }
    }

    /// Vector dimension `d`.
    pub const fn dim(&self) -> usize {
        self.dim
    }

    /// Number of vectors added (any weight).
    pub const fn vectors(&self) -> u64 {
        self.vectors
    }

    /// Sum of the weights of all vectors added.
    pub const fn total_weight(&self) -> f64 {
        self.weight
    }

    /// The accumulated `d × d` row-major matrix `Σ w·x xᵀ` (not normalised).
    pub fn matrix(&self) -> &[f64] {
        &self.sum
    }

    /// Trace of the accumulated matrix: the total weighted energy `Σ w·‖x‖²`.
    pub fn trace(&self) -> f64 {
        (0..self.dim).map(|i| self.sum[i * self.dim + i]).sum()
    }

    /// Adds `n` contiguous row vectors (`vectors` is `[n, d]` row-major), each with `weight`.
    ///
    /// # Errors
    /// [`Error::Shape`] if `vectors.len()` is not a multiple of `d`;
    /// [`Error::NonFinite`] on NaN/∞; [`Error::InvalidWeight`] for a negative or non-finite
    /// weight. On error nothing is added.
    ///
    /// # Examples
    /// ```
    /// let mut m = projection::SecondMoment::new(2);
    /// m.add_vectors(&[1.0, 0.0, 0.0, 2.0], 1.0)?;
    /// assert_eq!(m.matrix(), &[1.0, 0.0, 0.0, 4.0]);
    /// assert!(m.add_vectors(&[f32::NAN, 0.0], 1.0).is_err());
    /// # Ok::<(), projection::Error>(())
    /// ```
    pub fn add_vectors(&mut self, vectors: &[f32], weight: f64) -> Result<()> {
        const OP: &str = "SecondMoment::add_vectors";
        let d = self.dim.max(1);
        check_len(OP, "vectors (mod d)", 0, vectors.len() % d)?;
        check_finite(OP, "vectors", vectors)?;
        check_weight(OP, "weight", weight)?;
        let rows = vectors.len() / d;
        let block = RowBlock { data: vectors, offset: 0, stride: d, rows, run: 1, weight };
        self.add_blocks(&[block], &mut Vec::new());
        Ok(())
    }

    /// Folds already-validated blocks in: gathers `√w·x` rows into `scratch` and adds
    /// `XᵀX` with one GEMM per `MAX_BLOCK` vectors. Weight-0 blocks are counted but skipped.
    pub(crate) fn add_blocks(&mut self, blocks: &[RowBlock<'_>], scratch: &mut Vec<f64>) {
        let d = self.dim;
        scratch.clear();
        for b in blocks {
            self.vectors += (b.rows * b.run) as u64;
            self.weight += b.weight * (b.rows * b.run) as f64;
            if b.weight == 0.0 {
                continue;
            }
            let scale = b.weight.sqrt();
            for t in 0..b.rows {
                let start = b.offset + t * b.stride;
                let src = &b.data[start..start + b.run * d];
                scratch.extend(src.iter().map(|&x| scale * f64::from(x)));
                if scratch.len() >= MAX_BLOCK * d {
                    self.fold(scratch);
                }
            }
        }
        self.fold(scratch);
    }

    /// `sum += XᵀX` for the `[m, d]` rows in `scratch`, then clears it.
    ///
    /// `XᵀX` is symmetric, so only the block upper triangle is computed (column blocks of
    /// [`SYMM_BLOCK`]: block `J` gets rows `0..end(J)`), about `½ + SYMM_BLOCK/2d` of a full
    /// GEMM; the strict lower triangle is then mirrored from the upper one.
    fn fold(&mut self, scratch: &mut Vec<f64>) {
        let d = self.dim;
        if d == 0 || scratch.is_empty() {
            scratch.clear();
            return;
        }
        let m = scratch.len() / d;
        let x = scratch.as_slice();
        for c0 in (0..d).step_by(SYMM_BLOCK) {
            let (width, rows) = (SYMM_BLOCK.min(d - c0), (c0 + SYMM_BLOCK).min(d));
            let xt = View::transposed(x, 0, d);
            let xj = View::row_major(x, c0, d);
            dgemm(rows, m, width, xt, xj, 1.0, &mut self.sum, c0, d);
        }
        for i in 0..d {
            for j in 0..i.min((i / SYMM_BLOCK) * SYMM_BLOCK) {
                self.sum[i * d + j] = self.sum[j * d + i];
            }
        }
        scratch.clear();
    }

    /// Adds another accumulator's data (disjoint samples) into this one.
    ///
    /// # Errors
    /// [`Error::Mismatch`] if the dimensions differ.
    ///
    /// # Examples
    /// ```
    /// let mut a = projection::SecondMoment::new(2);
    /// let mut b = projection::SecondMoment::new(2);
    /// a.add_vectors(&[1.0, 1.0], 1.0)?;
    /// b.add_vectors(&[1.0, -1.0], 1.0)?;
    /// a.merge(&b)?;
    /// assert_eq!(a.matrix(), &[2.0, 0.0, 0.0, 2.0]);
    /// # Ok::<(), projection::Error>(())
    /// ```
    pub fn merge(&mut self, other: &SecondMoment) -> Result<()> {
        if self.dim != other.dim {
            return Err(Error::Mismatch {
                op: "SecondMoment::merge",
                what: "dim",
                expected: self.dim.to_string(),
                got: other.dim.to_string(),
            });
        }
        self.sum.iter_mut().zip(&other.sum).for_each(|(a, b)| *a += b);
        self.vectors += other.vectors;
        self.weight += other.weight;
        Ok(())
    }

    /// Energy captured by the first `k` columns of an arbitrary orthogonal `basis`, for every
    /// `k = 1..=d`: `e_k = Σ_{j<k} p_jᵀ M p_j / tr(M)` (non-decreasing, `e_d = 1` for an
    /// orthogonal basis). For the eigen-basis this is the explained-energy curve; for any
    /// other basis it says how much of the same data its leading dims would keep.
    ///
    /// # Errors
    /// [`Error::Shape`] if `basis` is not `d × d`. (A zero-trace moment is not an error
    /// here: its curve is all zeros.)
    ///
    /// # Examples
    /// ```
    /// let mut m = projection::SecondMoment::new(2);
    /// m.add_vectors(&[3.0, 1.0], 1.0)?;
    /// let e = m.captured_energy(&projection::Mat::identity(2))?;
    /// assert!((e[0] - 0.9).abs() < 1e-12 && (e[1] - 1.0).abs() < 1e-12);
    /// # Ok::<(), projection::Error>(())
    /// ```
    pub fn captured_energy(&self, basis: &Mat) -> Result<Vec<f64>> {
        const OP: &str = "SecondMoment::captured_energy";
        let d = self.dim;
        check_len(OP, "basis rows", d, basis.rows())?;
        check_len(OP, "basis cols", d, basis.cols())?;
        let trace = self.trace();
        let mut acc = 0.0;
        Ok(self
            .column_forms(basis)
            .map(|e| {
                acc += e;
                if trace > 0.0 { acc / trace } else { 0.0 }
            })
            .collect())
    }
    /// Mean energy along each column of an arbitrary `basis`: `p_jᵀ M p_j / Σ w` for every
    /// `j` (zeros when nothing was accumulated).
    ///
    /// # Errors
    /// [`Error::Shape`] if `basis` is not `d × d`.
    ///
    /// # Examples
    /// ```
    /// let mut m = projection::SecondMoment::new(2);
    /// m.add_vectors(&[3.0, 1.0, 1.0, 1.0], 1.0)?;
    /// assert_eq!(m.column_energy(&projection::Mat::identity(2))?, vec![5.0, 1.0]);
    /// # Ok::<(), projection::Error>(())
    /// ```
    pub fn column_energy(&self, basis: &Mat) -> Result<Vec<f64>> {
        const OP: &str = "SecondMoment::column_energy";
        let d = self.dim;
        check_len(OP, "basis rows", d, basis.rows())?;
        check_len(OP, "basis cols", d, basis.cols())?;
        let w = self.weight;
        Ok(self.column_forms(basis).map(|e| if w > 0.0 { (e / w).max(0.0) } else { 0.0 }).collect())
    }

    /// `p_jᵀ M p_j` for every column `j` of `basis` (already checked to be `d × d`).
    fn column_forms<'a>(&'a self, basis: &'a Mat) -> impl Iterator<Item = f64> + 'a {
        let d = self.dim;
        (0..d).map(move |j| {
            let p: Vec<f64> = basis.column(j).into_iter().map(f64::from).collect();
            (0..d)
                .map(|r| {
                    let row = &self.sum[r * d..(r + 1) * d];
                    p[r] * row.iter().zip(&p).map(|(m, x)| m * x).sum::<f64>()
                })
                .sum()
        })
    }
}

/// Errors unless `w` is finite and non-negative.
pub(crate) fn check_weight(op: &'static str, what: &'static str, w: f64) -> Result<()> {
    if w.is_finite() && w >= 0.0 {
        Ok(())
    } else {
        Err(Error::InvalidWeight { op, what, value: w })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gemm_accumulation_matches_rank_one_updates() {
        for (d, n) in [(5usize, 4100usize), (70, 2100)] {
            check_against_rank_one(d, n);
        }
    }

    fn check_against_rank_one(d: usize, n: usize) {
        let xs: Vec<f32> = (0..d * n).map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0).collect();
        let mut m = SecondMoment::new(d);
        m.add_vectors(&xs, 0.5).unwrap();
        let mut want = vec![0.0f64; d * d];
        for x in xs.chunks(d) {
            for i in 0..d {
                for j in 0..d {
                    want[i * d + j] += 0.5 * f64::from(x[i]) * f64::from(x[j]);
                }
            }
        }
        for (a, b) in m.matrix().iter().zip(&want) {
            assert!((a - b).abs() <= 1e-9 * b.abs().max(1.0), "{a} vs {b}");
        }
        assert_eq!(m.vectors(), n as u64);
        assert!((m.total_weight() - 0.5 * n as f64).abs() < 1e-9);
    }

    #[test]
    fn rejects_bad_weight_and_ragged_input_without_mutating() {
        let mut m = SecondMoment::new(3);
        assert!(matches!(m.add_vectors(&[1.0; 3], -1.0), Err(Error::InvalidWeight { .. })));
        assert!(matches!(m.add_vectors(&[1.0; 4], 1.0), Err(Error::Shape { .. })));
        assert!(matches!(
            m.add_vectors(&[1.0, f32::INFINITY, 0.0], 1.0),
            Err(Error::NonFinite { index: 1, .. })
        ));
        assert_eq!(m, SecondMoment::new(3));
    }
}
