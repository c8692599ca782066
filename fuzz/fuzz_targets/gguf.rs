//! libFuzzer target: `gguf` harness (see `src/harness/gguf.rs` for the oracle).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| kvtide_fuzz::harness::gguf::check(data));
