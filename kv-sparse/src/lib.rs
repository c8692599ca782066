//! # kv-sparse
//!
//! Sparse KV-cache storage from **SWAN** (*Sparse Winnowed Attention*, `papers/swan.txt`):
//! each (layer, kv-head) keeps its `b` most recent key/value vectors dense, and stores every
//! older vector as its top-k magnitude components in CSR form — `u8` (or `u16`) indices
//! plus `f16`, `bf16`, fp8 (OCP E4M3FN) or `f32` values — so attention can run directly on
//! the sparse rows, with no decompression.
//!
//! | module | owns | SWAN section |
//! |---|---|---|
//! | [`fp8`] | E4M3FN codec, decode table, optional per-head scale | 8-bit values |
//! | [`topk`] | O(d) magnitude top-k (ties → lower index) | pruning step |
//! | [`coded`] | SWAN rows as index list or bitmask × f16/bf16/fp8/int8/int4 values | memory footprint (encodings) |
//! | [`quant`] | dense int8 (q8_0) / int4 (q4_0) / scaled fp8 rows, integer value codes | baselines, 8-bit values |
//! | [`kivi`] | KIVI 2/4-bit rows: keys per channel over token groups, values per token over channel groups | baselines (KIVI, arXiv 2402.02750) |
//! | [`turbo`] | TurboQuant-style rows: f16 norm + Lloyd-Max codes of a random unit vector's coordinates | baselines (arXiv 2504.19874) |
//! | [`decoded`] | [`decoded::DecodeRows`]: coded histories read row by row; bit packing | kernels' view of coded rows |
//! | [`csr`] | paged CSR rows: [`csr::CsrStore`], [`csr::CsrView`] | memory footprint (CSR) |
//! | [`ring`] | dense ring buffer of recent rows | hybrid cache |
//! | [`hybrid`] | [`hybrid::HybridCache`], [`hybrid::MultiHeadCache`], kernel views | Algorithm 1 |
//! | [`memory`] | exact byte accounting, `3k+2` / `2k+2` / `2·d_h`, break-even length | memory, App. A.2 |
//! | [`persist`] | on-disk format v2, [`persist::MappedCache`] (memmap2, validated, zero-copy), [`persist::CacheImage`]: CSR and coded hybrid caches, dense and quantized rows | hybrid cache (persisted) |
//! | `strategies` | proptest strategies for rows and caches (feature `proptest`) | lossless property (App. A.1) |
//!
//! Element types are type parameters — `I`: [`SparseIndex`] (`u8` for `head_dim ≤ 256`,
//! `u16` above), `V`: sparse [`Value`] format, `D`: dense buffer format — so hot loops never
//! branch on a format. Bad input (wrong lengths, `k > head_dim`, NaN/∞, values that overflow
//! the format) is a typed [`Error`], never a panic; appends are all-or-nothing.
//!
//! **Lossless setting**: `f32` values, `f32` buffer and `k = head_dim`
//! ([`hybrid::HybridConfig::lossless`]) read every row back bit-exact, so a runtime can
//! property-test itself against dense attention.
//!
//! **Kernels** read a [`hybrid::HybridView`]: two [`csr::CsrView`]s (keys, values) whose raw
//! arrays — `u64` block bases, `u16` row offsets relative to their block, indices, values —
//! are contiguous (one upload each for a device), plus the dense buffer as two row-major
//! slices in token order. Mapped files give the very same view types.
//!
//! **Hot paths** (`append`, eviction, top-k) reuse scratch buffers and do not allocate in
//! steady state beyond the sparse stores' amortized growth (`HybridCache::reserve`); this is
//! tested with a counting allocator.
//!
//! ## Example
//! ```
//! use half::f16;
//! use kv_sparse::fp8::Fp8E4M3;
//! use kv_sparse::hybrid::{HybridCache, HybridConfig};
//! use kv_sparse::memory::sparse_row_bytes;
//! use kv_sparse::ValueFormat;
//!
//! // head_dim 8, dense buffer of 2 tokens, keep 3 key and 3 value components, fp8 values.
//! let cfg = HybridConfig::new(8, 2, 3);
//! let mut cache = HybridCache::<u8, Fp8E4M3, f16>::new(cfg)?;
//! for t in 0..5 {
//!     let k: Vec<f32> = (0..8).map(|i| ((i * 7 + t) % 5) as f32 - 2.0).collect();
//!     let v: Vec<f32> = (0..8).map(|i| (i as f32 - t as f32) * 0.25).collect();
//!     cache.append(&k, &v)?; // from the 3rd token on, the oldest buffered token is pruned
//! }
//! assert_eq!((cache.sparse_len(), cache.buffer_len()), (3, 2));
//!
//! // Kernels read a borrowed view: CSR history + dense buffer, in token order.
//! let view = cache.view();
//! let q = [1.0f32; 8];
//! let score: f32 = view.sparse_keys.row(0).unwrap().dot(&q)? * view.value_scale.0;
//! let mut k0 = [0.0f32; 8];
//! view.key_into(0, &mut k0)?; // token 0, decoded (zeros where pruned)
//! assert_eq!(score, k0.iter().sum::<f32>());
//!
//! // Memory: every sparse row costs exactly 2k+2 bytes (fp8 values, u8 indices).
//! let mem = cache.memory();
//! assert_eq!(mem.sparse_formula_bytes(), 2 * 3 * sparse_row_bytes(3, ValueFormat::Fp8E4M3, 1));
//! # Ok::<(), kv_sparse::Error>(())
//! ```
#![deny(unsafe_op_in_unsafe_fn)]

pub mod coded;
pub mod csr;
pub mod decoded;
mod error;
pub mod fp8;
pub mod hybrid;
mod index;
pub mod kivi;
pub mod memory;
pub mod persist;
pub mod quant;
pub mod ring;
#[cfg(feature = "proptest")]
pub mod strategies;
pub mod topk;
pub mod turbo;
mod value;

pub use error::{Error, Result};
pub use index::{MAX_HEAD_DIM, SparseIndex, index_bytes};
pub use value::{Value, ValueFormat, value_bytes};
