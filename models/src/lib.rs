//! `models`: thin libtorch-backed model forwards that plug kvtide's caches into a real
//! runtime. The `kvtide` command-line interface and the papers' studies live in the `kvtide`
//! application crate on top of this one. The folders tell the story:
//!
//! * [`load`]: [`ModelConfig`] from HF `config.json` or GGUF metadata; weights from
//!   safetensors (single or sharded) or GGUF, behind [`load::weights::WeightSource`]; the
//!   [`Tokenizer`] and [`ChatTemplate`]; [`Checkpoint`] ties them together.
//! * [`llama`]: the [`Llama`] decoder (Llama, Mistral, Qwen2, Gemma 3) with its RoPE and the
//!   host-tensor hand-over — libtorch prefill, then one token at a time through a pluggable
//!   [`KvCache`].
//! * [`audio`]: the audio front end and the audio-LLM forwards (Voxtral-style,
//!   Qwen2.5-Omni-thinker-style) over the same decoder.
//! * [`cache`]: the caches the decode path plugs in (dense, SWAN, WnW tiered) and the spec
//!   language that names them.
//! * [`calibrate`]: SWAN bases and WnW head roles (text and audio).
//! * [`session`]: a model paired with its cache, teacher-forced [`score`] (perplexity) and
//!   [`session::generate::greedy`] generation.
#![deny(unsafe_op_in_unsafe_fn)]

pub mod audio;
pub mod cache;
pub mod calibrate;
mod error;
pub mod llama;
pub mod load;
pub mod session;

pub use cache::{CacheBytes, CacheShape, KvCache};
pub use error::{Error, Result};
pub use llama::Llama;
pub use load::chat::{ChatMessage, ChatTemplate};
pub use load::checkpoint::Checkpoint;
pub use load::config::{
    Architecture, LayerKind, LocalAttention, ModelConfig, RopeConfig, RopeScaling,
};
pub use load::tokenizer::Tokenizer;
pub use session::Session;
pub use session::score::{Scores, score};
