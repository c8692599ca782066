//! Parser harnesses shared by the libFuzzer targets (`fuzz/fuzz_targets/*.rs`) and the
//! in-tree property fuzzing (`integration-tests/tests/fuzz_parsers.rs`, which includes
//! this directory with `#[path]`): one module per parser of outside bytes, each with a
//! `check(&[u8])` oracle ("typed error or valid value, never a panic") and `seeds()`,
//! valid files that start the corpus and feed the mutated-valid strategy.

pub mod config;
pub mod gguf;
pub mod json;
pub mod mutate;
pub mod persist;
pub mod projection;
pub mod wav;
