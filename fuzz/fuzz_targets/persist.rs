//! libFuzzer target: `persist` harness (see `src/harness/persist.rs` for the oracle).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| kvtide_fuzz::harness::persist::check(data));
