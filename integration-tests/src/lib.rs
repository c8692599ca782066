//! Cross-crate and end-to-end tests for kvtide live in `tests/`.
//!
//! This library target also compiles the usage examples of the workspace README and of each
//! publishable crate's README as doctests, so the examples users copy first can never drift
//! from the API.

/// The workspace README, whose Rust code blocks run as doctests (`cargo test --doc`).
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
pub struct ReadmeDoctests;

/// The `kv-sparse` crate README (its usage example runs as a doctest).
#[cfg(doctest)]
#[doc = include_str!("../../kv-sparse/README.md")]
pub struct KvSparseReadmeDoctests;

/// The `projection` crate README (its usage example runs as a doctest).
#[cfg(doctest)]
#[doc = include_str!("../../projection/README.md")]
pub struct ProjectionReadmeDoctests;

/// The `attn-kernels` crate README (its usage example runs as a doctest).
#[cfg(doctest)]
#[doc = include_str!("../../attn-kernels/README.md")]
pub struct AttnKernelsReadmeDoctests;

/// The `kv-tiered` crate README (its usage example runs as a doctest).
#[cfg(doctest)]
#[doc = include_str!("../../kv-tiered/README.md")]
pub struct KvTieredReadmeDoctests;
