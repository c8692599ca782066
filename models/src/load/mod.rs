//! Loading a checkpoint: its configuration ([`config`], from Hugging Face `config.json` or
//! GGUF metadata), its weights ([`weights`]: safetensors, single or sharded; [`gguf`]:
//! llama.cpp's format with dequantisation at load), its [`tokenizer`] and [`chat`] template,
//! tied together by [`checkpoint`]; and [`text`], the plain-prose reading of the
//! Shakespeare markdown the studies and tests use.

pub mod chat;
pub mod checkpoint;
pub mod config;
pub mod gguf;
pub mod text;
pub mod tokenizer;
pub mod weights;
