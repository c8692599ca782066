//! The application's one error type: what the library crates report, plus what only the
//! application does (its files, its JSON, its command-line arguments, the libtorch calls
//! of the studies and the kernel bench).

use std::path::PathBuf;

/// Everything that can go wrong in the `kvtide` application.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A model-crate operation failed (loading, forward, cache).
    #[error(transparent)]
    Model(#[from] models::Error),
    /// Reading or writing a file failed.
    #[error("{op} {path}: {source}")]
    Io {
        /// What we were doing (`read`, `write`, `create`).
        op: &'static str,
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// A JSON document did not parse or serialise.
    #[error("parse {what}: {source}")]
    Json {
        /// Which document.
        what: String,
        /// The parser's error.
        source: serde_json::Error,
    },
    /// An argument has the wrong length, range or value.
    #[error("{op}: {reason}")]
    InvalidInput {
        /// The operation.
        op: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// A libtorch operation of a study or the kernel bench failed.
    #[error("libtorch {op}: {source}")]
    Torch {
        /// The operation.
        op: &'static str,
        /// tch's error.
        source: tch::TchError,
    },
    /// Audio input of a study or the audio commands was unusable.
    #[error("audio {op}: {detail}")]
    Audio {
        /// The operation.
        op: &'static str,
        /// What went wrong.
        detail: String,
    },
    /// A decode-attention kernel rejected its input.
    #[error("attn-kernels: {0}")]
    Attention(#[from] attn_kernels::Error),
    /// The projection crate rejected an operation.
    #[error("projection: {0}")]
    Projection(#[from] projection::Error),
    /// The tiered store rejected an operation.
    #[error("kv-tiered: {0}")]
    Tiered(#[from] kv_tiered::Error),
}

/// `Result` with this crate's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

/// Attaches the name of the libtorch operation to a [`tch::TchError`].
pub(crate) trait TorchOp<T> {
    /// Maps the error into [`Error::Torch`] naming `op`.
    fn op(self, op: &'static str) -> Result<T>;
}

impl<T> TorchOp<T> for std::result::Result<T, tch::TchError> {
    fn op(self, op: &'static str) -> Result<T> {
        self.map_err(|source| Error::Torch { op, source })
    }
}

/// Shorthand for an [`Error::InvalidInput`].
pub(crate) fn invalid(op: &'static str, reason: impl Into<String>) -> Error {
    Error::InvalidInput { op, reason: reason.into() }
}

/// Shorthand for an [`Error::Audio`].
pub(crate) fn audio_err(op: &'static str, detail: impl Into<String>) -> Error {
    Error::Audio { op, detail: detail.into() }
}
