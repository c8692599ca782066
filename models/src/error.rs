//! The crate's one error type. Every variant names the operation that failed and, where
//! it applies, what was expected and what was found, so bad input (a corrupt GGUF, a
//! mis-shaped tensor, an unknown cache name) reads as a sentence rather than a panic.

use std::path::{Path, PathBuf};

/// Everything that can go wrong in `models`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Reading or mapping a file failed.
    #[error("{op} {path}: {source}")]
    Io {
        /// What we were doing (`open`, `map`, `read`).
        op: &'static str,
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// A JSON document (config, index, calibration metadata) did not parse.
    #[error("parse {what}: {source}")]
    Json {
        /// Which document.
        what: String,
        /// The parser's error.
        source: serde_json::Error,
    },
    /// A model configuration field is missing or out of range.
    #[error("model config: field `{field}`: {reason}")]
    Config {
        /// The offending field.
        field: String,
        /// Why it was rejected.
        reason: String,
    },
    /// The checkpoint's architecture is not one this crate implements.
    #[error("unsupported architecture `{got}` (supported: llama, mistral, qwen2)")]
    UnsupportedArchitecture {
        /// The architecture the file declares.
        got: String,
    },
    /// A GGUF file is truncated or malformed, lacks metadata, or holds a tensor type the
    /// loader cannot dequantise.
    #[error(transparent)]
    Gguf(#[from] crate::load::gguf::GgufError),
    /// A weight the model needs is not in the checkpoint.
    #[error("load weights: missing tensor `{name}`")]
    MissingTensor {
        /// The (HF-style) tensor name.
        name: String,
    },
    /// A weight has the wrong shape for the configuration.
    #[error("load weights: tensor `{name}` has shape {got:?}, expected {expected:?}")]
    TensorShape {
        /// The tensor name.
        name: String,
        /// Shape the config implies.
        expected: Vec<usize>,
        /// Shape in the file.
        got: Vec<usize>,
    },
    /// A safetensors file failed to parse or a tensor in it is unusable.
    #[error("safetensors {path}: {reason}")]
    Safetensors {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        reason: String,
    },
    /// Building or running the tokenizer failed.
    #[error("tokenizer {op}: {reason}")]
    Tokenizer {
        /// The operation (`build`, `encode`, `decode`, `load`).
        op: &'static str,
        /// The underlying message.
        reason: String,
    },
    /// Rendering the chat template failed.
    #[error("chat template: {reason}")]
    ChatTemplate {
        /// The template engine's message.
        reason: String,
    },
    /// A libtorch operation failed.
    #[error("libtorch {op}: {source}")]
    Torch {
        /// The operation.
        op: &'static str,
        /// tch's error.
        source: tch::TchError,
    },
    /// An argument has the wrong length, range or value.
    #[error("{op}: {reason}")]
    InvalidInput {
        /// The operation.
        op: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// Audio input or an audio-LLM forward failed (`models::audio`).
    #[error("audio {op}: {detail}")]
    Audio {
        /// The operation.
        op: &'static str,
        /// What went wrong.
        detail: String,
    },
    /// The sparse storage crate rejected an operation.
    #[error("kv-sparse: {0}")]
    Sparse(#[from] kv_sparse::Error),
    /// A decode-attention kernel rejected its input.
    #[error("attn-kernels: {0}")]
    Attention(#[from] attn_kernels::Error),
    /// The projection crate rejected an operation (basis file, rotation, absorption).
    #[error("projection: {0}")]
    Projection(#[from] projection::Error),
    /// The tiered store rejected an operation.
    #[error("kv-tiered: {0}")]
    Tiered(#[from] kv_tiered::Error),
    /// A persisted cache was computed by another model or projection, or holds another
    /// cache format, than the run reopening it.
    #[error("{op}: the cache file's {what} is `{got}`, this run's is `{expected}`")]
    CacheMismatch {
        /// The operation (`load cache`).
        op: &'static str,
        /// Which identity differs: `model`, `projection` or `format`.
        what: &'static str,
        /// This run's identity.
        expected: String,
        /// The file's identity.
        got: String,
    },
    /// A cache does not support saving or loading its state.
    #[error("{op}: the {cache} cache cannot be persisted")]
    NotPersistable {
        /// The operation (`save cache`, `load cache`).
        op: &'static str,
        /// The cache's label.
        cache: String,
    },
    /// A cache specification string could not be parsed.
    #[error("cache spec `{spec}`: {reason}")]
    CacheSpec {
        /// The specification as given.
        spec: String,
        /// Why it was rejected.
        reason: String,
    },
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

/// Reads a whole file as text; the error names the file.
pub(crate) fn read_text_file(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).map_err(|source| Error::Io {
        op: "read",
        path: path.into(),
        source,
    })
}

/// Reads a whole file as bytes; the error names the file.
pub(crate) fn read_file(path: &Path) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|source| Error::Io { op: "read", path: path.into(), source })
}

/// Shorthand for an [`Error::Config`].
pub(crate) fn config_err(field: &str, reason: impl Into<String>) -> Error {
    Error::Config { field: field.to_string(), reason: reason.into() }
}
