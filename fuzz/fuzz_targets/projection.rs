//! libFuzzer target: `projection` harness (see `src/harness/projection.rs` for the oracle).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| kvtide_fuzz::harness::projection::check(data));
