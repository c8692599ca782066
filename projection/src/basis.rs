//! `Basis`: one orthogonal `d_h × d_h` matrix (basis vectors as columns) and, for calibrated
//! bases, its eigenvalues, explained-energy curve and the query side's energy per column.
//!
//! SWAN §4: each `P_QK`/`P_VO` is the eigen-decomposition of the joint second moment of the
//! vectors it rotates. We use nalgebra's symmetric eigen-solver (no hand-written solver),
//! sort eigenvectors by descending eigenvalue so coordinate 0 carries the most energy, and
//! fix each eigenvector's sign so that its largest-magnitude component (first one on ties)
//! is positive — the same data always gives the same matrix, bit for bit.

use nalgebra::{DMatrix, SymmetricEigen};

use crate::dims::Site;
use crate::error::{Error, Result, check_len};
use crate::mat::Mat;
use crate::moment::SecondMoment;

/// An orthogonal basis: a `d × d` [`Mat`] whose column `j` is basis vector `j`
/// (rotate a row vector as `x̂ = x·P`), plus optional eigenvalues and query-side energies
/// (calibrated bases only).
#[derive(Clone, Debug, PartialEq)]
pub struct Basis {
    matrix: Mat,
    eigenvalues: Option<Vec<f64>>,
    query_energy: Option<Vec<f64>>,
}

impl Basis {
    /// Wraps a square matrix (no eigenvalues: identity, random, shuffled or user bases).
    /// Orthogonality is checked when the basis joins a [`crate::ProjectionSet`].
    ///
    /// # Errors
    /// [`Error::Shape`] if `matrix` is not square; [`Error::NonFinite`] on NaN/∞.
    ///
    /// # Examples
    /// ```
    /// let b = projection::Basis::new(projection::Mat::identity(4))?;
    /// assert!(b.energy_curve().is_none());
    /// # Ok::<(), projection::Error>(())
    /// ```
    pub fn new(matrix: Mat) -> Result<Self> {
        check_len("Basis::new", "matrix cols", matrix.rows(), matrix.cols())?;
        crate::error::check_finite("Basis::new", "matrix", matrix.as_slice())?;
        Ok(Self { matrix, eigenvalues: None, query_energy: None })
    }

    /// Wraps a square matrix and its eigenvalues (one per column, in column order).
    ///
    /// # Errors
    /// As [`Basis::new`], plus [`Error::Shape`] if `eigenvalues.len() != d` and
    /// [`Error::NonFinite`] if an eigenvalue is NaN/∞.
    ///
    /// # Examples
    /// ```
    /// let b = projection::Basis::with_eigenvalues(projection::Mat::identity(2), vec![3.0, 1.0])?;
    /// assert_eq!(b.energy_curve(), Some(vec![0.75, 1.0]));
    /// # Ok::<(), projection::Error>(())
    /// ```
    pub fn with_eigenvalues(matrix: Mat, eigenvalues: Vec<f64>) -> Result<Self> {
        const OP: &str = "Basis::with_eigenvalues";
        check_len(OP, "eigenvalues", matrix.rows(), eigenvalues.len())?;
        if let Some(index) = eigenvalues.iter().position(|x| !x.is_finite()) {
            let value = eigenvalues[index];
            return Err(Error::NonFinite { op: OP, what: "eigenvalues", index, value });
        }
        let mut b = Self::new(matrix)?;
        b.eigenvalues = Some(eigenvalues);
        Ok(b)
    }

    /// The basis matrix (`d × d`, column `j` = basis vector `j`).
    pub fn matrix(&self) -> &Mat {
        &self.matrix
    }

    /// Head dimension `d`.
    pub fn dim(&self) -> usize {
        self.matrix.rows()
    }

    /// Eigenvalues in column order (descending), normalised per unit sample weight
    /// (`λ_j = p_jᵀ (Σ w·x xᵀ / Σ w) p_j`); `None` for bases that are not eigen-bases.
    pub fn eigenvalues(&self) -> Option<&[f64]> {
        self.eigenvalues.as_deref()
    }

    /// The same basis with the queries' mean energy along each column, `e_j = E[(q·p_j)²]`
    /// over the calibration queries (per query vector; calibrated QK bases carry it). A key's
    /// component `j` contributes `q̂_j·k̂_j` to a score, so `|k̂_j|·√e_j` ranks components by
    /// their expected share of it.
    ///
    /// # Errors
    /// [`Error::Shape`] if `energy.len() != d`; [`Error::NonFinite`] for NaN/∞;
    /// [`Error::InvalidWeight`] for a negative energy.
    ///
    /// # Examples
    /// ```
    /// let b = projection::Basis::new(projection::Mat::identity(2))?.with_query_energy(vec![4.0, 1.0])?;
    /// assert_eq!(b.query_energy(), Some(&[4.0, 1.0][..]));
    /// assert!(projection::Basis::new(projection::Mat::identity(2))?.with_query_energy(vec![-1.0, 1.0]).is_err());
    /// # Ok::<(), projection::Error>(())
    /// ```
    pub fn with_query_energy(mut self, energy: Vec<f64>) -> Result<Self> {
        const OP: &str = "Basis::with_query_energy";
        check_len(OP, "query energy", self.dim(), energy.len())?;
        if let Some(index) = energy.iter().position(|x| !x.is_finite()) {
            let value = energy[index];
            return Err(Error::NonFinite { op: OP, what: "query energy", index, value });
        }
        if let Some(&value) = energy.iter().find(|&&x| x < 0.0) {
            return Err(Error::InvalidWeight { op: OP, what: "query energy", value });
        }
        self.query_energy = Some(energy);
        Ok(self)
    }

    /// The query side's mean energy along each column (see [`Basis::with_query_energy`]);
    /// `None` for bases without calibration data.
    pub fn query_energy(&self) -> Option<&[f64]> {
        self.query_energy.as_deref()
    }

    /// Drops the eigenvalues and query energies (used when a basis is moved to another head
    /// by an ablation, where they no longer describe that head's data).
    pub(crate) fn without_eigenvalues(mut self) -> Self {
        self.eigenvalues = None;
        self.query_energy = None;
        self
    }

    /// Explained-energy curve: element `k-1` is the fraction of the calibration energy in
    /// the first `k` coordinates (`Σ_{j<k} λ_j / Σ λ`, negatives from round-off clamped to 0).
    /// `None` without eigenvalues. Users pick the pruning budget `k` from it.
    pub fn energy_curve(&self) -> Option<Vec<f64>> {
        let lambdas = self.eigenvalues.as_ref()?;
        let clamped: Vec<f64> = lambdas.iter().map(|&l| l.max(0.0)).collect();
        let total: f64 = clamped.iter().sum();
        let mut acc = 0.0;
        Some(
            clamped
                .iter()
                .map(|l| {
                    acc += l;
                    if total > 0.0 { acc / total } else { 0.0 }
                })
                .collect(),
        )
    }

    /// Smallest `k` whose leading `k` coordinates hold at least `fraction` of the energy
    /// (`None` without eigenvalues).
    ///
    /// # Examples
    /// ```
    /// let b = projection::Basis::with_eigenvalues(projection::Mat::identity(3), vec![8.0, 1.5, 0.5])?;
    /// assert_eq!(b.dims_for_energy(0.8), Some(1));
    /// assert_eq!(b.dims_for_energy(0.9), Some(2));
    /// # Ok::<(), projection::Error>(())
    /// ```
    pub fn dims_for_energy(&self, fraction: f64) -> Option<usize> {
        let curve = self.energy_curve()?;
        let k = curve.iter().position(|&e| e >= fraction - 1e-12).unwrap_or(curve.len() - 1);
        Some(k + 1)
    }
}

impl SecondMoment {
    /// Eigen-basis of the accumulated second moment: eigenvectors as columns sorted by
    /// descending eigenvalue, signs fixed (largest-|component| positive), converted to f32.
    /// `site` only labels errors.
    ///
    /// # Errors
    /// [`Error::NoSamples`] if no weight was accumulated; [`Error::ZeroEnergy`] if every
    /// sample was zero; [`Error::EigenFailed`] if the solver does not converge.
    ///
    /// # Examples
    /// ```
    /// use projection::{SecondMoment, Site, Stream};
    /// let mut m = SecondMoment::new(2);
    /// m.add_vectors(&[1.0, 1.0, 2.0, 2.1, -1.0, -0.9], 1.0)?;
    /// let b = m.eigen_basis(Site { layer: 0, kv_head: 0, stream: Stream::Qk })?;
    /// let p0 = b.matrix().column(0);
    /// assert!(p0[0] > 0.69 && p0[1] > 0.69); // the dominant direction is ≈ (1, 1)/√2
    /// assert!(b.energy_curve().unwrap()[0] > 0.99);
    /// # Ok::<(), projection::Error>(())
    /// ```
    pub fn eigen_basis(&self, site: Site) -> Result<Basis> {
        let d = self.dim();
        if self.vectors() == 0 || self.total_weight() <= 0.0 {
            return Err(Error::NoSamples {
                site,
                tokens: self.vectors(),
                weight: self.total_weight(),
            });
        }
        let trace = self.trace();
        if trace <= 0.0 || d == 0 {
            return Err(Error::ZeroEnergy { site, trace });
        }
        let w = self.total_weight();
        let s = self.matrix();
        let sym = DMatrix::from_fn(d, d, |i, j| 0.5 * (s[i * d + j] + s[j * d + i]) / w);
        let eig = SymmetricEigen::try_new(sym, f64::EPSILON, 10_000 + 100 * d)
            .ok_or(Error::EigenFailed { site })?;
        let mut order: Vec<usize> = (0..d).collect();
        order.sort_by(|&a, &b| eig.eigenvalues[b].total_cmp(&eig.eigenvalues[a]));
        let mut data = vec![0.0f32; d * d];
        for (j, &src) in order.iter().enumerate() {
            let v = eig.eigenvectors.column(src);
            let sign = sign_of_largest(v.iter().copied());
            for i in 0..d {
                data[i * d + j] = (sign * v[i]) as f32;
            }
        }
        let eigenvalues = order.iter().map(|&i| eig.eigenvalues[i]).collect();
        Basis::with_eigenvalues(Mat::from_vec(d, d, data)?, eigenvalues)
    }
}

/// `+1.0` or `-1.0`: the sign of the largest-magnitude component (first one on ties).
fn sign_of_largest(v: impl Iterator<Item = f64>) -> f64 {
    let mut best = 0.0f64;
    for x in v {
        if x.abs() > best.abs() {
            best = x;
        }
    }
    if best < 0.0 { -1.0 } else { 1.0 }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dims::Stream;

    const SITE: Site = Site { layer: 0, kv_head: 0, stream: Stream::Vo };

    #[test]
    fn eigenvalues_descend_and_signs_are_canonical() {
        let mut m = SecondMoment::new(3);
        // Energy mostly along -e2, then e0, a little along e1.
        m.add_vectors(&[0.0, 0.0, -5.0, 2.0, 0.0, 0.0, 0.0, 0.5, 0.0], 1.0).unwrap();
        let b = m.eigen_basis(SITE).unwrap();
        let l = b.eigenvalues().unwrap();
        assert!(l[0] >= l[1] && l[1] >= l[2]);
        assert_eq!(b.matrix().column(0), vec![0.0, 0.0, 1.0]);
        assert_eq!(b.matrix().column(1), vec![1.0, 0.0, 0.0]);
        assert!(b.matrix().orthogonality_error() < 1e-6);
    }

    #[test]
    fn empty_and_zero_moments_are_typed_errors() {
        let m = SecondMoment::new(3);
        assert!(matches!(m.eigen_basis(SITE), Err(Error::NoSamples { .. })));
        let mut z = SecondMoment::new(3);
        z.add_vectors(&[0.0; 6], 1.0).unwrap();
        assert!(matches!(z.eigen_basis(SITE), Err(Error::ZeroEnergy { .. })));
    }

    #[test]
    fn dims_for_energy_caps_at_d() {
        let b = Basis::with_eigenvalues(Mat::identity(2), vec![1.0, 1.0]).unwrap();
        assert_eq!(b.dims_for_energy(2.0), Some(2));
        assert!(Basis::with_eigenvalues(Mat::identity(2), vec![f64::NAN, 1.0]).is_err());
    }
}
