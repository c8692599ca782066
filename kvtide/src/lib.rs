//! `kvtide`: the application on top of the library crates — the command-line interface
//! and `kvtide reproduce`, which regenerates both papers' tables and figures on a real model.
//!
//! * [`cli`]: one module per subcommand (`info`, `generate`, `calibrate`, `eval-ppl` and
//!   the demo, `transcribe`, `calibrate-roles`) and the pieces they share (model loading,
//!   progress bars, byte formatting).
//! * [`reproduce`]: the SWAN (`papers/swan.txt` §6) and WnW (`papers/wnw.txt` §2–3,
//!   Appendix C/E) studies, their reports and plots.
//! * [`bench_attn`]: `kvtide bench-attn`, the decode-attention kernels against libtorch and
//!   the machine's memory bandwidth ([`bandwidth`]).
//! * [`paths`]: where `scripts/setup.sh` put the default model, texts and projections.
//!
//! The library crates never read the cache directory: every default path is resolved here
//! and handed down as an argument.

pub mod bandwidth;
pub mod bench_attn;
pub mod cli;
mod error;
pub mod paths;
pub mod reproduce;

pub use error::{Error, Result};
