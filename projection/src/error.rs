//! The crate's single error type.
//!
//! Every fallible operation of the SWAN projection pipeline (calibration, eigen-bases,
//! persistence, absorption, rotation, ablations — SWAN §4 and Appendix A.1) reports one
//! of these variants. Variants name the operation and the expected/got values so a caller
//! can tell *what* was wrong without reading our code.

use std::path::PathBuf;

use crate::dims::Site;

/// Errors of the `projection` crate.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A slice or matrix had the wrong length or dimension.
    #[error("{op}: {what} has size {got}, expected {expected}")]
    Shape {
        /// Operation that rejected the input.
        op: &'static str,
        /// Which argument or dimension.
        what: &'static str,
        /// Expected size.
        expected: usize,
        /// Size received.
        got: usize,
    },
    /// Model dimensions that cannot describe an attention layer.
    #[error("invalid model dimensions: {reason}")]
    InvalidDims {
        /// What is wrong (e.g. q-heads not a multiple of kv-heads).
        reason: String,
    },
    /// A layer or head index past the end.
    #[error("{op}: {what} index {index} out of range (count {count})")]
    OutOfRange {
        /// Operation that rejected the index.
        op: &'static str,
        /// "layer", "kv-head", ...
        what: &'static str,
        /// Index received.
        index: usize,
        /// Number of valid indices.
        count: usize,
    },
    /// Input contained NaN or ±∞.
    #[error("{op}: {what} element {index} is not finite ({value})")]
    NonFinite {
        /// Operation that rejected the input.
        op: &'static str,
        /// Which argument.
        what: &'static str,
        /// Flat index of the first offending element.
        index: usize,
        /// The offending value.
        value: f64,
    },
    /// A sample weight that is negative or not finite.
    #[error("{op}: weight {what} = {value} must be finite and >= 0")]
    InvalidWeight {
        /// Operation that rejected the weight.
        op: &'static str,
        /// Which weight.
        what: &'static str,
        /// Value received.
        value: f64,
    },
    /// A basis was requested for a position that received no samples (or only zero weight).
    #[error("{site}: no calibration samples (tokens {tokens}, total weight {weight})")]
    NoSamples {
        /// The position without data.
        site: Site,
        /// Tokens observed there.
        tokens: u64,
        /// Total sample weight observed there.
        weight: f64,
    },
    /// Samples were all zero vectors: the second moment has zero trace and no preferred basis.
    #[error("{site}: calibration samples carry zero energy (trace {trace})")]
    ZeroEnergy {
        /// The position without energy.
        site: Site,
        /// Trace of the accumulated second moment.
        trace: f64,
    },
    /// nalgebra's symmetric eigen-solver did not converge.
    #[error("{site}: symmetric eigen-decomposition did not converge")]
    EigenFailed {
        /// The position whose moment matrix failed.
        site: Site,
    },
    /// A matrix that must be orthogonal is not.
    #[error("{op}: {site} basis is not orthogonal: max |PᵀP − I| = {error:e} > {tolerance:e}")]
    NotOrthogonal {
        /// Operation that checked.
        op: &'static str,
        /// Which basis.
        site: Site,
        /// Entry-wise max of |PᵀP − I|.
        error: f64,
        /// Tolerance applied.
        tolerance: f64,
    },
    /// Two objects that must agree (calibrators to merge, a projection file and a model) do not.
    #[error("{op}: {what} mismatch: expected {expected}, got {got}")]
    Mismatch {
        /// Operation that compared them.
        op: &'static str,
        /// What differs ("layers", "kv_heads", "model", "qk weighting", ...).
        what: &'static str,
        /// Value on the reference side (the model, or `self`).
        expected: String,
        /// Value on the other side (the file, or the argument).
        got: String,
    },
    /// An ablation that would be a no-op (e.g. head-shuffle with one kv-head) or asked of the
    /// wrong kind.
    #[error("ablation {kind} not applicable: {reason}")]
    AblationNotApplicable {
        /// The ablation requested.
        kind: String,
        /// Why it cannot be built.
        reason: String,
    },
    /// A projection file whose content is not a valid `ProjectionSet`.
    #[error("projection file format: {reason}")]
    Format {
        /// What is missing or malformed.
        reason: String,
    },
    /// Error from the safetensors codec (truncated or corrupt file).
    #[error("safetensors: {0}")]
    Safetensors(#[from] safetensors::SafeTensorError),
    /// Reading or writing a file failed.
    #[error("{op} {path}: {source}", path = path.display())]
    Io {
        /// "read" or "write".
        op: &'static str,
        /// The file.
        path: PathBuf,
        /// Underlying I/O error.
        #[source]
        source: std::io::Error,
    },
}

/// `Result` with the crate's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

/// Returns `Err(Error::Shape)` unless `got == expected`.
pub(crate) fn check_len(
    op: &'static str,
    what: &'static str,
    expected: usize,
    got: usize,
) -> Result<()> {
    if expected == got { Ok(()) } else { Err(Error::Shape { op, what, expected, got }) }
}

/// Returns `Err(Error::OutOfRange)` unless `index < count`.
pub(crate) fn check_index(
    op: &'static str,
    what: &'static str,
    index: usize,
    count: usize,
) -> Result<()> {
    if index < count { Ok(()) } else { Err(Error::OutOfRange { op, what, index, count }) }
}

/// Returns `Err(Error::NonFinite)` at the first NaN/∞ of `xs`.
pub(crate) fn check_finite(op: &'static str, what: &'static str, xs: &[f32]) -> Result<()> {
    match xs.iter().position(|x| !x.is_finite()) {
        None => Ok(()),
        Some(index) => Err(Error::NonFinite { op, what, index, value: f64::from(xs[index]) }),
    }
}

/// Returns `Err(Error::Shape)` unless `a * b` (checked) equals `got`.
pub(crate) fn check_product(
    op: &'static str,
    what: &'static str,
    factors: &[usize],
    got: usize,
) -> Result<()> {
    let expected =
        factors.iter().try_fold(1usize, |acc, &f| acc.checked_mul(f)).ok_or_else(|| {
            Error::InvalidDims {
                reason: format!("{op}: {what} size overflows usize ({factors:?})"),
            }
        })?;
    check_len(op, what, expected, got)
}
