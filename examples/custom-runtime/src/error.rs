//! The example's one error type: what can go wrong loading a checkpoint and decoding, with
//! the lower crates' errors passed through unchanged.

use std::path::PathBuf;

/// Everything [`crate::Llama::load`] and [`crate::Decoder::step`] can fail with.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file of the checkpoint could not be read.
    #[error("reading {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// `config.json` is not valid JSON for a Llama config.
    #[error("config.json: {0}")]
    Config(#[from] serde_json::Error),
    /// The checkpoint uses something this example does not implement.
    #[error("unsupported checkpoint: {0}")]
    Unsupported(String),
    /// A weight is missing, has another shape or an unsupported dtype.
    #[error("weight {name}: {reason}")]
    Weight {
        /// Tensor name in the checkpoint.
        name: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The safetensors container is malformed.
    #[error("safetensors: {0}")]
    Safetensors(#[from] safetensors::SafeTensorError),
    /// A token id outside the vocabulary.
    #[error("token {token} is outside the vocabulary of {vocab}")]
    Token {
        /// The id.
        token: u32,
        /// Vocabulary size.
        vocab: usize,
    },
    /// From `projection` (a set that does not fit the model, rotation, absorption).
    #[error(transparent)]
    Projection(#[from] projection::Error),
    /// From `kv-sparse` (cache configuration, appends).
    #[error(transparent)]
    Sparse(#[from] kv_sparse::Error),
    /// From `attn-kernels` (attention shape, kernels).
    #[error(transparent)]
    Attention(#[from] attn_kernels::Error),
}

/// `Result` with this example's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;
