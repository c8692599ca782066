//! Cross-crate and end-to-end tests for kvtide live in `tests/`.
//!
//! This library target also compiles the workspace README's usage example as a doctest, so
//! the example users copy first can never drift from the API.

/// The workspace README, whose Rust code blocks run as doctests (`cargo test --doc`).
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
pub struct ReadmeDoctests;
