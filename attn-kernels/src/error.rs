//! The crate's one error type.
//!
//! Every kernel validates its whole input before touching a row, so a shape bug in model
//! code (SWAN's hybrid decode step, method section; WnW's gathered decode over resident
//! positions, §2.3) surfaces as a variant naming the operation and the expected/got values —
//! never as a panic, an out-of-bounds read or a silently wrong output.

/// Result alias used throughout the crate.
pub type Result<T> = std::result::Result<T, Error>;

/// Everything that can go wrong in `attn-kernels`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The head layout is impossible: zero heads, zero `head_dim`, or q-heads not a
    /// multiple of kv-heads.
    #[error(
        "{op}: invalid head layout {q_heads} q-heads / {kv_heads} kv-heads / head_dim {head_dim}: {reason}"
    )]
    InvalidLayout {
        /// Operation that failed.
        op: &'static str,
        /// Requested query heads.
        q_heads: usize,
        /// Requested key/value heads.
        kv_heads: usize,
        /// Requested head dimension.
        head_dim: usize,
        /// What is wrong.
        reason: &'static str,
    },
    /// The softmax scale is not a finite positive number.
    #[error("{op}: scale {scale} must be finite and > 0")]
    InvalidScale {
        /// Operation that failed.
        op: &'static str,
        /// The rejected scale.
        scale: f32,
    },
    /// A slice or list has the wrong length.
    #[error("{op}: {what} has length {got}, expected {expected}")]
    LengthMismatch {
        /// Operation that failed.
        op: &'static str,
        /// Which argument.
        what: &'static str,
        /// Expected length.
        expected: usize,
        /// Actual length.
        got: usize,
    },
    /// A per-head cache was built for another head dimension.
    #[error("{op}: kv-head {kv_head} has head_dim {got}, expected {expected}")]
    HeadDimMismatch {
        /// Operation that failed.
        op: &'static str,
        /// Offending kv-head.
        kv_head: usize,
        /// The layout's head dimension.
        expected: usize,
        /// The cache's head dimension.
        got: usize,
    },
    /// A row-major slice is not a whole number of `head_dim`-wide rows.
    #[error(
        "{op}: kv-head {kv_head}: {what} has {len} elements, not a multiple of head_dim {head_dim}"
    )]
    RaggedRows {
        /// Operation that failed.
        op: &'static str,
        /// Offending kv-head.
        kv_head: usize,
        /// Which slice.
        what: &'static str,
        /// Its length in elements.
        len: usize,
        /// The head dimension.
        head_dim: usize,
    },
    /// Keys and values of one kv-head hold different numbers of rows.
    #[error("{op}: kv-head {kv_head} {part}: {keys} key rows but {values} value rows")]
    RowCountMismatch {
        /// Operation that failed.
        op: &'static str,
        /// Offending kv-head.
        kv_head: usize,
        /// Which part of the cache (`"dense"`, `"sparse"`, `"buffer"`, `"gathered"`).
        part: &'static str,
        /// Key rows.
        keys: usize,
        /// Value rows.
        values: usize,
    },
    /// A kv-head has no cached rows at all: softmax over nothing is undefined.
    #[error("{op}: kv-head {kv_head} has an empty cache (no rows to attend to)")]
    EmptyCache {
        /// Operation that failed.
        op: &'static str,
        /// Offending kv-head.
        kv_head: usize,
    },
    /// The query holds a NaN or an infinity.
    #[error("{op}: query of q-head {q_head} has non-finite value {value} at dim {dim}")]
    NonFiniteQuery {
        /// Operation that failed.
        op: &'static str,
        /// Offending q-head.
        q_head: usize,
        /// Offending dimension.
        dim: usize,
        /// The value.
        value: f32,
    },
    /// A sparse view's scale is not finite, or is zero or negative.
    #[error("{op}: kv-head {kv_head} {what} scale {scale} must be finite and > 0")]
    InvalidValueScale {
        /// Operation that failed.
        op: &'static str,
        /// Offending kv-head.
        kv_head: usize,
        /// `"key"` or `"value"`.
        what: &'static str,
        /// The rejected scale.
        scale: f32,
    },
    /// Gathered positions are not strictly ascending.
    #[error(
        "{op}: kv-head {kv_head}: position {position} at row {row} does not exceed its predecessor"
    )]
    PositionsNotAscending {
        /// Operation that failed.
        op: &'static str,
        /// Offending kv-head.
        kv_head: usize,
        /// Offending row of the position list.
        row: usize,
        /// Offending position.
        position: u32,
    },
    /// A position is resident both as a dense and as a sparse row of one kv-head.
    #[error("{op}: kv-head {kv_head}: position {position} is both a dense and a sparse row")]
    PositionsOverlap {
        /// Operation that failed.
        op: &'static str,
        /// Offending kv-head.
        kv_head: usize,
        /// The position listed twice.
        position: u32,
    },
    /// A sparse slab cannot hold the rows it claims.
    #[error(
        "{op}: kv-head {kv_head}: {what} slab: {reason} (k {k}, head_dim {head_dim}, {len} bytes)"
    )]
    InvalidSlab {
        /// Operation that failed.
        op: &'static str,
        /// Offending kv-head.
        kv_head: usize,
        /// `"key"` or `"value"`.
        what: &'static str,
        /// Kept dimensions per row.
        k: usize,
        /// The layer's head dimension.
        head_dim: usize,
        /// Bytes of the slab.
        len: usize,
        /// What is wrong.
        reason: &'static str,
    },
    /// A gathered slot points past the end of its slab.
    #[error(
        "{op}: kv-head {kv_head}: slot {slot} of row {row} is past the slab's {slab_rows} rows"
    )]
    SlotOutOfRange {
        /// Operation that failed.
        op: &'static str,
        /// Offending kv-head.
        kv_head: usize,
        /// Offending row of the position list.
        row: usize,
        /// The slot.
        slot: u32,
        /// Rows in the slab.
        slab_rows: usize,
    },
    /// An anchor request names a kv-head the layer does not have.
    #[error("{op}: anchor kv-head {kv_head} out of range (layer has {kv_heads} kv-heads)")]
    AnchorHeadOutOfRange {
        /// Operation that failed.
        op: &'static str,
        /// Offending kv-head.
        kv_head: usize,
        /// kv-heads of the layer.
        kv_heads: usize,
    },
    /// A thread count of zero, or a worker thread that could not be started.
    #[error("{op}: cannot run on {threads} threads: {reason}")]
    Threads {
        /// Operation that failed.
        op: &'static str,
        /// Requested threads.
        threads: usize,
        /// What went wrong.
        reason: String,
    },
    /// A benchmark or measurement parameter is out of range.
    #[error("{op}: {what} = {value} is out of range ({expected})")]
    Param {
        /// Operation that failed.
        op: &'static str,
        /// Which parameter.
        what: &'static str,
        /// The rejected value, formatted.
        value: String,
        /// What was expected.
        expected: &'static str,
    },
    // ---- GPU path (attn-kernels/src/cuda) ----
    /// The crate was built without the `cuda` feature, so the GPU path does not exist.
    #[error("{op}: attn-kernels was built without the `cuda` feature")]
    CudaNotCompiled {
        /// Operation that failed.
        op: &'static str,
    },
    /// The CUDA driver loaded but found no device (cust's `NoDevice`).
    #[error("{op}: no CUDA device: {detail}")]
    NoDevice {
        /// Operation that failed.
        op: &'static str,
        /// The driver's error, as cust's `{:?}`.
        detail: String,
    },
    /// A CUDA driver call failed.
    #[error("{op}: CUDA error {detail}")]
    Cuda {
        /// Operation that failed.
        op: &'static str,
        /// The driver's error, as cust's `{:?}`.
        detail: String,
    },
    /// The GPU kernels do not cover this input (format pair, head_dim, device generation).
    #[error("{op}: not supported by the GPU kernels: {what}")]
    GpuUnsupported {
        /// Operation that failed.
        op: &'static str,
        /// What is unsupported.
        what: String,
    },
    // ---- end GPU path ----
    /// An error from `kv-sparse` (building a synthetic cache).
    #[error(transparent)]
    Sparse(#[from] kv_sparse::Error),
}
