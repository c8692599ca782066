//! Fuzzing of every kvtide parser of outside bytes: libFuzzer targets in
//! `fuzz_targets/` call the oracles in [`harness`]; the seed corpora in `seeds/` are
//! written by `gen-seeds.sh` from the same harnesses. See `README.md` for commands and
//! the recorded runs.

pub mod harness;
