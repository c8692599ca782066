//! The errors of reading a GGUF file: its structure (truncation, bad fields), its metadata
//! (missing or mistyped keys) and its tensor types. `models::Error::Gguf` carries them.

/// Everything that can be wrong with a GGUF file.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GgufError {
    /// The file ended before a field it declares.
    #[error(
        "GGUF truncated reading {what} at byte {offset}: need {needed} bytes, {available} left"
    )]
    Truncated {
        /// The field being read.
        what: &'static str,
        /// Byte offset of the read.
        offset: u64,
        /// Bytes the field needs.
        needed: u64,
        /// Bytes left in the file.
        available: u64,
    },
    /// The file is structurally invalid (bad magic, counts, offsets, alignment…).
    #[error("GGUF invalid {what} at byte {offset}: {reason}")]
    Invalid {
        /// The field or structure.
        what: String,
        /// Byte offset where the problem was detected.
        offset: u64,
        /// What is wrong with it.
        reason: String,
    },
    /// A tensor is stored in a type this loader cannot dequantise.
    #[error(
        "GGUF tensor `{tensor}`: unsupported tensor type {dtype} (supported: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_K)"
    )]
    UnsupportedTensorType {
        /// Tensor name.
        tensor: String,
        /// The type's name (or numeric id).
        dtype: String,
    },
    /// A metadata key the loader needs is absent.
    #[error("GGUF metadata: missing key `{key}`")]
    MissingMetadata {
        /// The key.
        key: String,
    },
    /// A metadata key has a value of the wrong type or range.
    #[error("GGUF metadata `{key}`: expected {expected}, got {got}")]
    MetadataType {
        /// The key.
        key: String,
        /// What was expected.
        expected: String,
        /// What was found.
        got: String,
    },
}

/// `Result` of the GGUF parser.
pub type Result<T> = std::result::Result<T, GgufError>;
