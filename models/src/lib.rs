//! `models`: thin libtorch-backed model forwards that plug kvtide's caches into a real
//! runtime. The `kvtide` command-line interface and the papers' studies live in the `kvtide`
//! application crate on top of this one.
//!
//! * Loading: [`ModelConfig`] from HF `config.json` or GGUF metadata; weights from
//!   safetensors (single or sharded) or GGUF ([`gguf`]), behind [`weights::WeightSource`];
//!   the [`Tokenizer`] and [`ChatTemplate`]; [`Checkpoint`] ties them together.
//! * Forward: the [`Llama`] decoder (Llama, Mistral, Qwen2) — libtorch prefill, then one
//!   token at a time through a pluggable [`KvCache`] ([`cache`]), driven by a [`Session`].
//! * Uses: teacher-forced [`score`] (perplexity) and [`generate::greedy`] generation.
#![deny(unsafe_op_in_unsafe_fn)]

pub mod audio;
pub mod cache;
pub mod calibrate;
pub mod chat;
pub mod checkpoint;
pub mod config;
mod error;
pub mod generate;
pub mod gguf;
pub mod host;
pub mod llama;
pub mod roles_calibration;
pub mod rope;
pub mod score;
pub mod session;
pub mod text;
pub mod tokenizer;
pub mod weights;

pub use cache::{CacheBytes, CacheShape, KvCache};
pub use chat::{ChatMessage, ChatTemplate};
pub use checkpoint::Checkpoint;
pub use config::{Architecture, ModelConfig, RopeConfig, RopeScaling};
pub use error::{Error, Result};
pub use llama::Llama;
pub use score::{Scores, score};
pub use session::Session;
pub use tokenizer::Tokenizer;

/// The libtorch shared library this process loaded, read from `/proc/self/maps`
/// (Linux only; `None` elsewhere or when libtorch is not mapped yet).
pub fn loaded_libtorch() -> Option<std::path::PathBuf> {
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    maps.lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .find(|p| p.ends_with("libtorch_cpu.so"))
        .map(std::path::PathBuf::from)
}
