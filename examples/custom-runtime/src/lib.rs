//! # custom-runtime
//!
//! A worked example for people who build their own inference runtime: a small pure-Rust
//! Llama decoder that composes `projection`, `kv-sparse` and `attn-kernels` into SWAN's
//! decode step (`papers/swan.txt`, method section and §4) — no libtorch anywhere in its
//! dependency tree. `docs/INTEGRATING.md` walks through this code.
//!
//! * [`config`], [`weights`]: a Hugging Face checkpoint (`config.json` + safetensors).
//! * [`model`]: the decoder's weights with `P_VO` absorbed, and its plain per-token math.
//! * [`decoder`]: the runtime loop — rotate, append to the hybrid caches, attend; SWAN's
//!   sparse rows ([`Decoder`]) or any whole-row history behind the same buffer
//!   ([`HistoryDecoder`]: dense quantized rows, KIVI, TurboQuant-style).
//!
//! In the lossless setting (`k = head_dim`, `f32` storage) its logits equal the dense
//! model's, whatever orthogonal bases are used; the tests check them against the
//! transformers reference logits and `integration-tests` against the `models` forward.
//!
//! ```no_run
//! use custom_runtime::{Decoder, Llama};
//! use kv_sparse::hybrid::HybridConfig;
//! use projection::ProjectionSet;
//!
//! let dir = std::path::Path::new("fixtures/tiny/llama-gqa");
//! let dims = custom_runtime::LlamaConfig::load(dir)?.dims()?;
//! let model = Llama::load(dir, ProjectionSet::random(dims, "llama-gqa", 1)?)?;
//! // A dense buffer of 8 tokens, 8 of 16 components kept in older rows, fp8 values.
//! let cache = HybridConfig::new(dims.head_dim(), 8, 8);
//! let mut decoder = Decoder::<u8, kv_sparse::fp8::Fp8E4M3, half::f16>::new(model, cache, 1)?;
//! for token in [1, 17, 42] {
//!     let logits = decoder.step(token)?;
//!     println!("{}", logits.len());
//! }
//! # Ok::<(), custom_runtime::Error>(())
//! ```

pub mod config;
pub mod decoder;
mod error;
pub mod model;
pub mod weights;

pub use config::LlamaConfig;
pub use decoder::{Decoder, History, HistoryDecoder};
pub use error::{Error, Result};
pub use model::Llama;
