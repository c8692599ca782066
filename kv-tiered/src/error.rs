//! The crate's error type: one `thiserror` enum whose variants name the operation that
//! failed and the expected/got values (team standard; no panics on bad input). It implements
//! no paper section; every WnW piece (§2.2 triage, §2.3 store, §3.4 solver) reports through it.

use crate::tier::TierError;

/// Everything that can go wrong in `kv-tiered`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An input slice has the wrong length.
    #[error("{op}: {what} has length {got}, expected {expected}")]
    Shape {
        /// Operation that rejected the input.
        op: &'static str,
        /// Which argument.
        what: &'static str,
        /// Expected length.
        expected: usize,
        /// Length received.
        got: usize,
    },
    /// A score, weight or row contains NaN or ±∞.
    #[error("{op}: {what}[{index}] is not finite ({value})")]
    NonFinite {
        /// Operation that rejected the input.
        op: &'static str,
        /// Which argument.
        what: &'static str,
        /// First offending index.
        index: usize,
        /// Offending value.
        value: f32,
    },
    /// A score that must be non-negative (voice score, sensitivity, attention mass) is negative.
    #[error("{op}: {what}[{index}] = {value} is negative")]
    Negative {
        /// Operation that rejected the input.
        op: &'static str,
        /// Which argument.
        what: &'static str,
        /// First offending index.
        index: usize,
        /// Offending value.
        value: f32,
    },
    /// The audio span is empty or does not lie inside the sequence.
    #[error(
        "audio span {start}..{end} is not a non-empty range inside a sequence of {seq_len} tokens"
    )]
    AudioSpan {
        /// First audio position.
        start: usize,
        /// One past the last audio position.
        end: usize,
        /// Prompt length.
        seq_len: usize,
    },
    /// A target on-device retention outside (0, 1].
    #[error("target r_GPU {target} is outside (0, 1]")]
    TargetOutOfRange {
        /// The rejected target.
        target: f64,
    },
    /// The λ solver cannot reach the target within the tolerance (e.g. anchors alone exceed it,
    /// or tied scores make r_GPU jump over it).
    #[error(
        "retention solver: target r_GPU {target:.4} unreachable within {tolerance:.4}; closest below {below:.4}, above {above:.4}"
    )]
    TargetUnreachable {
        /// Requested r_GPU.
        target: f64,
        /// Tolerance (absolute, fraction).
        tolerance: f64,
        /// Largest achievable r_GPU below the target.
        below: f64,
        /// Smallest achievable r_GPU above the target.
        above: f64,
    },
    /// A parameter is outside its valid range.
    #[error("{op}: parameter {name} = {value} is invalid, expected {expected}")]
    Param {
        /// Operation that rejected the parameter.
        op: &'static str,
        /// Parameter name.
        name: &'static str,
        /// Value received (formatted).
        value: String,
        /// What would have been valid.
        expected: &'static str,
    },
    /// A (layer, kv-head) pair outside the model's grid.
    #[error("{op}: head (layer {layer}, kv-head {kv_head}) outside {layers}×{kv_heads}")]
    HeadOutOfRange {
        /// Operation that rejected the head.
        op: &'static str,
        /// Layer requested.
        layer: usize,
        /// KV-head requested.
        kv_head: usize,
        /// Layers in the model.
        layers: usize,
        /// KV-heads per layer.
        kv_heads: usize,
    },
    /// A call arrived in the wrong phase (e.g. a decode step before prefill).
    #[error("{op}: called in phase {got}, expected {expected}")]
    Phase {
        /// Operation.
        op: &'static str,
        /// Phase required.
        expected: &'static str,
        /// Phase the store is in.
        got: &'static str,
    },
    /// Serialising or parsing head roles failed.
    #[error("head roles JSON: {0}")]
    Json(#[from] serde_json::Error),
    /// Head roles read from JSON are inconsistent.
    #[error("head roles: {0}")]
    Roles(String),
    /// A storage tier failed (allocation, copy, write).
    #[error("tier: {0}")]
    Tier(#[from] TierError),
    /// `attn-kernels` rejected an attention shape (head counts, head size).
    #[error("attention shape: {0}")]
    Attention(#[from] attn_kernels::Error),
    /// `kv-sparse` rejected a row (encoding sparse rows).
    #[error("sparse rows: {0}")]
    Sparse(#[from] kv_sparse::Error),
    /// The recall worker thread stopped (panicked) with recalls outstanding.
    #[error("recall worker stopped with {pending} recall(s) outstanding")]
    WorkerStopped {
        /// Recalls that will never complete.
        pending: usize,
    },
    /// Capacity fixed at construction is exhausted (e.g. decode longer than configured).
    #[error("{op}: capacity {capacity} exhausted")]
    Capacity {
        /// Operation.
        op: &'static str,
        /// The configured capacity.
        capacity: usize,
    },
}

/// Result alias for this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Checks that `xs` has `expected` elements.
pub(crate) fn check_len<T>(
    op: &'static str,
    what: &'static str,
    xs: &[T],
    expected: usize,
) -> Result<()> {
    if xs.len() == expected {
        Ok(())
    } else {
        Err(Error::Shape { op, what, expected, got: xs.len() })
    }
}

/// Checks that every element of `xs` is finite.
pub(crate) fn check_finite(op: &'static str, what: &'static str, xs: &[f32]) -> Result<()> {
    match xs.iter().position(|x| !x.is_finite()) {
        None => Ok(()),
        Some(index) => Err(Error::NonFinite { op, what, index, value: xs[index] }),
    }
}

/// Checks that every element of `xs` is finite and non-negative.
pub(crate) fn check_scores(op: &'static str, what: &'static str, xs: &[f32]) -> Result<()> {
    check_finite(op, what, xs)?;
    match xs.iter().position(|&x| x < 0.0) {
        None => Ok(()),
        Some(index) => Err(Error::Negative { op, what, index, value: xs[index] }),
    }
}

/// Builds a [`Error::Param`].
pub(crate) fn param(
    op: &'static str,
    name: &'static str,
    value: impl std::fmt::Display,
    expected: &'static str,
) -> Error {
    Error::Param { op, name, value: value.to_string(), expected }
}
