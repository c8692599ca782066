//! libFuzzer target: `wav` harness (see `src/harness/wav.rs` for the oracle).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| kvtide_fuzz::harness::wav::check(data));
