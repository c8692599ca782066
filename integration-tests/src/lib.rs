//! Cross-crate and end-to-end tests for kvtide live in `tests/`.
