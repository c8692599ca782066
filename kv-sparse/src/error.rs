//! The crate's one error type.
//!
//! Every fallible operation in `kv-sparse` returns [`Result`]; each variant names the
//! operation that failed and the expected/got values, so a caller can tell *what* was wrong
//! with its input (SWAN's hybrid cache, method section, is fed by model code, where a shape
//! or NaN bug should surface as a clear message, never as a panic or a silently corrupted
//! cache).

use std::path::PathBuf;
use std::sync::Arc;

use crate::ValueFormat;

/// Result alias used throughout the crate.
pub type Result<T> = std::result::Result<T, Error>;

/// Everything that can go wrong in `kv-sparse`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A slice had the wrong length.
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
    /// A requested number of kept dimensions exceeds the head dimension.
    #[error("{op}: k = {k} exceeds head_dim = {head_dim}")]
    KTooLarge {
        /// Operation that failed.
        op: &'static str,
        /// Requested k.
        k: usize,
        /// Head dimension.
        head_dim: usize,
    },
    /// A head dimension is zero or too large for the index type.
    #[error("{op}: head_dim = {head_dim} is out of range 1..={max}")]
    HeadDimOutOfRange {
        /// Operation that failed.
        op: &'static str,
        /// Requested head dimension.
        head_dim: usize,
        /// Largest supported head dimension for this index type.
        max: usize,
    },
    /// `rows_per_block` is zero or lets a block exceed 65 535 stored entries.
    #[error(
        "{op}: rows_per_block = {rows_per_block} is out of range 1..={max} for head_dim = {head_dim}"
    )]
    RowsPerBlockOutOfRange {
        /// Operation that failed.
        op: &'static str,
        /// Requested rows per block.
        rows_per_block: usize,
        /// Head dimension.
        head_dim: usize,
        /// Largest allowed value (`65535 / head_dim`).
        max: usize,
    },
    /// A NaN or infinity in an input row (see [`crate::hybrid::NonFinitePolicy`]).
    #[error("{op}: non-finite value {value} at position {position}")]
    NonFinite {
        /// Operation that failed.
        op: &'static str,
        /// Position of the first offending element.
        position: usize,
        /// The offending value.
        value: f32,
    },
    /// A finite value whose magnitude would encode to infinity in the storage format.
    #[error(
        "{op}: |{value}| does not fit {format} (values must be below {limit}); use a wider format or a scale"
    )]
    Overflow {
        /// Operation that failed.
        op: &'static str,
        /// Storage format that would overflow.
        format: ValueFormat,
        /// The offending value (after any scale was applied).
        value: f32,
        /// Smallest magnitude that overflows the format.
        limit: f32,
    },
    /// A scale factor that is not a positive normal finite number.
    #[error("{op}: scale {scale} must be a positive, normal, finite number")]
    InvalidScale {
        /// Operation that failed.
        op: &'static str,
        /// The rejected scale.
        scale: f32,
    },
    /// A key-selection weight that is negative, or weights that are all zero (see
    /// [`crate::hybrid::Hybrid::set_key_weights`]).
    #[error(
        "{op}: selection weight {value} at position {position} (weights must be ≥ 0, not all 0)"
    )]
    InvalidWeight {
        /// Operation that failed.
        op: &'static str,
        /// Position of the offending weight (the first one when all are zero).
        position: usize,
        /// The offending weight.
        value: f32,
    },
    /// A stored per-row or per-block scale that is zero, NaN or infinite.
    #[error("{op}: row {row} has scale {scale}; scales must be finite and non-zero")]
    InvalidRowScale {
        /// Operation that failed.
        op: &'static str,
        /// Row holding the scale.
        row: usize,
        /// The stored scale.
        scale: f32,
    },
    /// A finite value too large for the f16 scale of a quantized format.
    #[error("{op}: |{value}| does not fit {format} (its f16 scale needs values below {limit})")]
    ScaleOverflow {
        /// Operation that failed.
        op: &'static str,
        /// The quantized format.
        format: String,
        /// The offending magnitude.
        value: f32,
        /// Smallest magnitude that overflows.
        limit: f32,
    },
    /// A bitmask row whose popcount differs from the number of values the row stores.
    #[error("{op}: row {row}: mask has {popcount} bits set but the row stores {stored} values")]
    MaskCountMismatch {
        /// Operation that failed.
        op: &'static str,
        /// Row index.
        row: usize,
        /// Bits set in the mask.
        popcount: usize,
        /// Values the row's length implies.
        stored: usize,
    },
    /// An odd number of kept values with 4-bit values (two per byte).
    #[error("{op}: k = {k} is odd; 4-bit values need an even k")]
    OddK {
        /// Operation that failed.
        op: &'static str,
        /// The requested k.
        k: usize,
    },
    /// A dense history (every component of every row, e.g. [`crate::quant::QuantRows`])
    /// asked to keep fewer than all of a row's components.
    #[error("{op}: k = {k}, but a dense history keeps all head_dim = {head_dim} components")]
    PartialDenseRow {
        /// Operation that failed.
        op: &'static str,
        /// The requested k.
        k: usize,
        /// Head dimension.
        head_dim: usize,
    },
    /// A coded row layout that cannot be built: bits outside the format's set, a group that
    /// does not divide the head, rows that are not whole bytes.
    #[error("{op}: invalid {format} layout: {reason}")]
    InvalidCodeLayout {
        /// Operation that failed.
        op: &'static str,
        /// The format (`kivi`, `turbo`).
        format: &'static str,
        /// What is wrong and what is allowed.
        reason: String,
    },
    /// A view's scales differ from the config it is loaded with.
    #[error("{op}: (key, value) scales are {got:?}, expected {expected:?}")]
    ScaleMismatch {
        /// Operation that failed.
        op: &'static str,
        /// Scales of the config.
        expected: (f32, f32),
        /// Scales of the view.
        got: (f32, f32),
    },
    /// A sparse row whose indices are not strictly ascending or not below head_dim.
    #[error("{op}: sparse index {index} at position {position} is invalid ({reason})")]
    InvalidSparseIndex {
        /// Operation that failed.
        op: &'static str,
        /// Position within the row.
        position: usize,
        /// The offending index.
        index: usize,
        /// Why it is invalid.
        reason: &'static str,
    },
    /// Raw CSR parts (e.g. from a file or a caller) that break the CSR invariants.
    #[error("{op}: invalid CSR data: {reason}")]
    InvalidCsr {
        /// Operation that failed.
        op: &'static str,
        /// Which invariant is broken, and where.
        reason: String,
    },
    /// An index (row, layer, head, block) outside the valid range.
    #[error("{op}: {what} {index} is out of range (len {len})")]
    OutOfRange {
        /// Operation that failed.
        op: &'static str,
        /// What was indexed.
        what: &'static str,
        /// Requested index.
        index: usize,
        /// Number of valid entries.
        len: usize,
    },
    /// Caches that must agree on a shape do not.
    #[error("{op}: {what} is {got}, expected {expected}")]
    ShapeMismatch {
        /// Operation that failed.
        op: &'static str,
        /// Which dimension.
        what: &'static str,
        /// Expected value.
        expected: usize,
        /// Actual value.
        got: usize,
    },
    /// A persisted cache was written with other element formats than the ones requested.
    #[error("{op}: {what} format is {got}, expected {expected}")]
    FormatMismatch {
        /// Operation that failed.
        op: &'static str,
        /// Which element type (`"index"`, `"sparse value"`, `"dense buffer"`).
        what: &'static str,
        /// Format the caller asked for.
        expected: String,
        /// Format stored in the file.
        got: String,
    },
    /// An I/O error while reading or writing a cache file.
    #[error("{op}: I/O error on {path}: {source}")]
    Io {
        /// Operation that failed.
        op: &'static str,
        /// File involved.
        path: PathBuf,
        /// Underlying error.
        #[source]
        source: std::io::Error,
    },
    /// The file does not start with the kv-sparse magic bytes.
    #[error("open: not a kv-sparse cache file (bad magic {got:02x?})")]
    BadMagic {
        /// The first eight bytes found.
        got: [u8; 8],
    },
    /// The file was written by an incompatible format version.
    #[error("open: unsupported file format version {got}, this build reads 1..={expected}")]
    VersionMismatch {
        /// Newest version this build reads.
        expected: u32,
        /// Version found in the file.
        got: u32,
    },
    /// The file is shorter than its header says.
    #[error("open: file truncated: {got} bytes, header requires {expected}")]
    Truncated {
        /// Bytes the header requires.
        expected: u64,
        /// Bytes present.
        got: u64,
    },
    /// A checksum did not match.
    #[error("open: {what} checksum mismatch: stored {expected:#010x}, computed {got:#010x}")]
    ChecksumMismatch {
        /// `"header"`, `"payload"` (versions 1 and 2), `"directory"` or `"head"` (version 3).
        what: &'static str,
        /// Stored checksum.
        expected: u32,
        /// Computed checksum.
        got: u32,
    },
    /// A file names a layout, index, value or row format this build does not know.
    #[error("{op}: unknown {what} code {code}")]
    UnknownCode {
        /// Operation that failed.
        op: &'static str,
        /// Which code (`layout`, `coded index kind`, …).
        what: &'static str,
        /// The code found.
        code: u32,
    },
    /// One head of a cache file failed its content check (checksum, rows) when it was
    /// first used; the other heads stay usable. Every later use of the head gives the same
    /// cause.
    #[error("{op}: layer {layer} kv head {kv_head} is invalid: {source}")]
    BadHead {
        /// Operation that used the head.
        op: &'static str,
        /// Layer of the head.
        layer: usize,
        /// KV head within the layer.
        kv_head: usize,
        /// What the check found (`ChecksumMismatch`, `Corrupt`, …), shared by every use.
        #[source]
        source: Arc<Error>,
    },
    /// The file is structurally invalid (inconsistent counts, offsets or contents).
    #[error("open: corrupt cache file: {reason}")]
    Corrupt {
        /// What was inconsistent.
        reason: String,
    },
}
