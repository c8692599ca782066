//! libFuzzer target: `config` harness (see `src/harness/config.rs` for the oracle).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| kvtide_fuzz::harness::config::check(data));
