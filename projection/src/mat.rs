//! `Mat`: the small dense row-major `f32` matrix every basis is stored in.
//!
//! Layout: element `(r, c)` lives at `data[r * cols + c]`. A SWAN basis `P` (SWAN §4,
//! "projection matrices") is a `d_h × d_h` `Mat` whose **columns** are the basis vectors:
//! `P[(i, j)]` is component `i` of basis vector `j`, and a row vector `x` (a query, key,
//! value or attention output, exactly as the paper writes them) is rotated as `x̂ = x·P`,
//! i.e. `x̂[j] = Σ_i x[i]·P[(i, j)]` = the coordinate of `x` along basis vector `j`.

use std::ops::Index;

use crate::error::{Result, check_product};
use crate::gemm::{View, dgemm, sgemm};

/// Dense row-major `rows × cols` matrix of `f32` (see the module docs for the layout).
#[derive(Clone, Debug, PartialEq)]
pub struct Mat {
    rows: usize,
    cols: usize,
    data: Vec<f32>,
}

impl Mat {
    /// A `rows × cols` matrix of zeros.
    ///
    /// # Examples
    /// ```
    /// let m = projection::Mat::zeros(2, 3);
    /// assert_eq!((m.rows(), m.cols()), (2, 3));
    /// ```
    pub fn zeros(rows: usize, cols: usize) -> Self {
        Self { rows, cols, data: vec![0.0; rows * cols] }
    }

    /// The `n × n` identity.
    ///
    /// # Examples
    /// ```
    /// let i = projection::Mat::identity(3);
    /// assert_eq!(i[(1, 1)], 1.0);
    /// assert_eq!(i.orthogonality_error(), 0.0);
    /// ```
    pub fn identity(n: usize) -> Self {
        Self::from_fn(n, n, |r, c| if r == c { 1.0 } else { 0.0 })
    }

    /// Builds a matrix from `f(row, col)`.
    ///
    /// # Examples
    /// ```
    /// let m = projection::Mat::from_fn(2, 2, |r, c| (r * 2 + c) as f32);
    /// assert_eq!(m.as_slice(), &[0.0, 1.0, 2.0, 3.0]);
    /// ```
    pub fn from_fn(rows: usize, cols: usize, mut f: impl FnMut(usize, usize) -> f32) -> Self {
        let mut data = Vec::with_capacity(rows * cols);
        for r in 0..rows {
            for c in 0..cols {
                data.push(f(r, c));
            }
        }
        Self { rows, cols, data }
    }

    /// Wraps row-major `data` of length `rows * cols`.
    ///
    /// # Errors
    /// [`crate::Error::Shape`] if `data.len() != rows * cols`.
    ///
    /// # Examples
    /// ```
    /// let m = projection::Mat::from_vec(2, 2, vec![0.0, 1.0, -1.0, 0.0])?;
    /// assert_eq!(m[(1, 0)], -1.0);
    /// assert!(projection::Mat::from_vec(2, 2, vec![0.0; 3]).is_err());
    /// # Ok::<(), projection::Error>(())
    /// ```
    pub fn from_vec(rows: usize, cols: usize, data: Vec<f32>) -> Result<Self> {
        check_product("Mat::from_vec", "data", &[rows, cols], data.len())?;
        Ok(Self { rows, cols, data })
    }

    /// Number of rows.
    pub const fn rows(&self) -> usize {
        self.rows
    }

    /// Number of columns.
    pub const fn cols(&self) -> usize {
        self.cols
    }

    /// The row-major elements.
    pub fn as_slice(&self) -> &[f32] {
        &self.data
    }

    /// Consumes the matrix, returning its row-major elements.
    pub fn into_vec(self) -> Vec<f32> {
        self.data
    }

    /// Row `r` as a slice (panics if `r >= rows`, like slice indexing).
    pub fn row(&self, r: usize) -> &[f32] {
        &self.data[r * self.cols..(r + 1) * self.cols]
    }

    /// Column `c` copied out (a basis vector when `self` is a basis).
    ///
    /// # Examples
    /// ```
    /// let m = projection::Mat::from_vec(2, 2, vec![1.0, 2.0, 3.0, 4.0])?;
    /// assert_eq!(m.column(1), vec![2.0, 4.0]);
    /// # Ok::<(), projection::Error>(())
    /// ```
    pub fn column(&self, c: usize) -> Vec<f32> {
        (0..self.rows).map(|r| self[(r, c)]).collect()
    }

    /// The transpose.
    ///
    /// # Examples
    /// ```
    /// let m = projection::Mat::from_vec(1, 2, vec![1.0, 2.0])?;
    /// assert_eq!(m.transpose().rows(), 2);
    /// # Ok::<(), projection::Error>(())
    /// ```
    pub fn transpose(&self) -> Self {
        Self::from_fn(self.cols, self.rows, |r, c| self[(c, r)])
    }

    /// Matrix product `self · rhs` (f32, `matrixmultiply` GEMM).
    ///
    /// # Errors
    /// [`crate::Error::Shape`] if `self.cols() != rhs.rows()`.
    ///
    /// # Examples
    /// ```
    /// let p = projection::Mat::from_vec(2, 2, vec![0.0, 1.0, -1.0, 0.0])?;
    /// let pp = p.transpose().matmul(&p)?;
    /// assert_eq!(pp, projection::Mat::identity(2));
    /// # Ok::<(), projection::Error>(())
    /// ```
    pub fn matmul(&self, rhs: &Mat) -> Result<Mat> {
        crate::error::check_len("Mat::matmul", "rhs rows", self.cols, rhs.rows)?;
        let mut out = Mat::zeros(self.rows, rhs.cols);
        sgemm(
            self.rows,
            self.cols,
            rhs.cols,
            View::row_major(&self.data, 0, self.cols),
            View::row_major(&rhs.data, 0, rhs.cols),
            0.0,
            &mut out.data,
            0,
            rhs.cols,
        );
        Ok(out)
    }

    /// Entry-wise max norm `max_ij |(PᵀP − I)_ij|` of a square matrix, computed in f64 from
    /// the stored f32 entries (so the figure measures the stored matrix, not the check).
    /// Returns `f64::INFINITY` for a non-square matrix or one holding NaN.
    ///
    /// # Examples
    /// ```
    /// let s = std::f32::consts::FRAC_1_SQRT_2;
    /// let r = projection::Mat::from_vec(2, 2, vec![s, s, -s, s])?;
    /// assert!(r.orthogonality_error() < 1e-6);
    /// # Ok::<(), projection::Error>(())
    /// ```
    pub fn orthogonality_error(&self) -> f64 {
        let n = self.rows;
        if n != self.cols {
            return f64::INFINITY;
        }
        let p: Vec<f64> = self.data.iter().map(|&x| f64::from(x)).collect();
        let mut g = vec![0.0f64; n * n];
        dgemm(n, n, n, View::transposed(&p, 0, n), View::row_major(&p, 0, n), 0.0, &mut g, 0, n);
        let mut worst = 0.0f64;
        for (i, &gij) in g.iter().enumerate() {
            let target = if i / n == i % n { 1.0 } else { 0.0 };
            let e = (gij - target).abs();
            if e.is_nan() {
                return f64::INFINITY;
            }
            worst = worst.max(e);
        }
        worst
    }

    /// `true` if no element is NaN or ±∞.
    pub fn is_finite(&self) -> bool {
        self.data.iter().all(|x| x.is_finite())
    }
}

impl Index<(usize, usize)> for Mat {
    type Output = f32;

    fn index(&self, (r, c): (usize, usize)) -> &f32 {
        assert!(r < self.rows && c < self.cols, "Mat index ({r}, {c}) out of bounds");
        &self.data[r * self.cols + c]
    }
}
