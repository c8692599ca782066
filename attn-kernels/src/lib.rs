//! # attn-kernels
//!
//! Decode attention — one new token's query against a layer's whole KV cache — over the
//! caches of kvtide: dense rows, SWAN's sparse (CSR) rows and hybrid cache
//! (`papers/swan.txt`, method section and Appendix A.2), and WnW's gathered resident
//! positions with the anchor-head signal (`papers/wnw.txt`, §2.3 Eq. 2).
//!
//! * [`DecodeAttention`] — the one signature of every implementation: `dense`, `sparse`,
//!   `hybrid`, `gathered`, each running one decode step of all heads of a layer (GQA-aware:
//!   one pass over a kv-head's rows serves all q-heads of its group);
//!   [`GatheredSparseAttention`] — the gathered kernel over a tiered store's dense *and*
//!   SWAN sparse fp8 rows ([`GatheredSparseKv`], [`SparseSlab`]) under one softmax;
//!   [`EncodedAttention`] — dense quantized rows ([`QuantKv`]: int8 / int4 blocks, scaled
//!   fp8) and SWAN's hybrid cache over coded rows ([`CodedHybridSource`]: bitmask or list
//!   indices with float or integer values).
//! * [`Reference`] — plain `f64` kernels, obviously correct, slow: the ground truth of the
//!   CPU kernels and, over the GPU's packed layouts ([`cuda::DecodeDevice`]), of the GPU path.
//! * [`CpuAttention`] — optimized kernels: online softmax over tiles, AVX-512 or
//!   AVX2/FMA/F16C with run-time detection ([`Isa`]) and a portable fallback, a persistent
//!   [`ThreadPool`] splitting heads and long caches, no allocation in the steady state.
//!   Outputs do not depend on the thread count. [`QueryPrecision::Int8`] (opt-in, lossy)
//!   scores int8 keys by integer products with the queries rounded to int8;
//!   [`QueryPrecision::Q8Blocks`] (opt-in, lossy) rounds the queries to ggml's `q8_0`
//!   blocks against keys of any format, as llama.cpp's CPU flash attention does.
//! * [`accuracy`] — the tolerance of every optimized kernel against the reference, per
//!   value format, in one table.
//! * [`synth`] — synthetic caches for tests and benchmarks.
//!
//! Inputs are borrowed views ([`DenseKv`], [`SparseKv`], any [`HybridSource`],
//! [`GatheredKv`], [`GatheredSparseKv`]) over row-major slices, so in-memory, memory-mapped
//! and tiered stores are read without copies. Bad input is an [`Error`], never a panic.
//!
//! ```
//! use attn_kernels::{AttnConfig, CpuAttention, DecodeAttention, Reference, synth};
//! use kv_sparse::hybrid::HybridCache;
//!
//! let cfg = AttnConfig::new(4, 2, 32)?;
//! // Two kv-heads of SWAN hybrid caches: 40 tokens, the last 8 dense, k = 16 kept dims.
//! let caches: Vec<HybridCache<u8, half::f16, half::f16>> = (0..2)
//!     .map(|h| synth::hybrid_cache(32, 8, 16, 40, h as u64))
//!     .collect::<Result<_, _>>()?;
//! let q = synth::values(cfg.q_len(), 7);
//! let (mut fast, mut slow) = (vec![0.0; cfg.q_len()], vec![0.0; cfg.q_len()]);
//! CpuAttention::new(1)?.hybrid(&cfg, &q, &caches, &mut fast)?;
//! Reference.hybrid(&cfg, &q, &caches, &mut slow)?;
//! assert!(fast.iter().zip(&slow).all(|(a, b)| (a - b).abs() < 1e-4));
//! # Ok::<(), attn_kernels::Error>(())
//! ```

pub mod accuracy;
mod api;
mod config;
mod cpu;
pub mod cuda;
mod error;
mod pool;
pub mod reference;
#[cfg(feature = "proptest")]
pub mod strategies;
pub mod synth;
mod validate;
mod views;

pub use api::{DecodeAttention, EncodedAttention, GatheredCodedAttention, GatheredSparseAttention};
pub use config::AttnConfig;
pub use cpu::{CpuAttention, Isa, QueryPrecision};
pub use error::{Error, Result};
pub use pool::ThreadPool;
pub use reference::Reference;
pub use views::{
    CodedHistoryPrefix, CodedHybridSource, DecodedKv, DenseKv, GatheredCodedKv, GatheredKv,
    GatheredSparseKv, HistoryPrefix, HybridSource, PrefixedCodedHybrid, PrefixedHybrid, QuantKv,
    RecentFormat, RecentRows, SparseKv, SparseSlab, WithSink,
};
