//! `kvtide reproduce`: both papers' findings on a real model (SmolLM2-135M-Instruct on the
//! CPU), from one command, into one directory of JSON, Markdown tables and plots.
//!
//! * SWAN (`papers/swan.txt` §6, Tables 1–3, Figure 2): [`swan_study`] — perplexity through
//!   the decode path over retention × value format (16-bit vs fp8 at equal memory) × buffer,
//!   projection and key/value ablations; [`memory`] — Figure 2(a).
//! * WnW (`papers/wnw.txt` §2–3, Table 5 / Figure 3, Table 3, Table 4, Figure 4, Figure 1):
//!   [`wnw_study`] — the long-form "transcription" analogue on text (teacher-forced copy of a
//!   passage through the decode path) with roles calibrated by [`roles`] (VS from the known
//!   alignment, HS by autograd through the decoder's key-offset forward); [`premise_study`] —
//!   Figure 1, checked
//!   against the transformers fixtures; [`audio_study`] — the Voxtral-style pipeline end to
//!   end on LibriVox clips with the tiny parity model; [`wer`] — truncated WER.
//! * Against the formats runtimes already have: [`frontier`] — perplexity vs KV bytes for
//!   dense f16 / fp8 / int8 / int4 (unrotated, Hadamard, calibrated) and SWAN under every
//!   row encoding, the non-dominated frontier, and llama.cpp's own figures on the same text.
//!   A grid too large for one sitting is measured in parts and assembled: [`frontier_reuse`];
//!   how precisely the peer comparison's gaps are known, window by window: [`frontier_peer`].
//! * Output: [`report`] and [`plot`]; claims and enforced checks: [`findings`]; the grids
//!   (and the `--quick` CI plan): [`grid`].
//!
//! `--quick` runs everything at CI scale (minutes on 2 cores) and still enforces what is
//! robust at small scale: lossless settings are lossless, the premise figures agree with
//! transformers, the audio lossless mode reproduces the full cache, and every table and
//! figure is present. [`run`] returns the outcome; the CLI exits non-zero on a failed check.

pub mod audio_study;
pub mod corpus;
pub mod decode;
pub mod findings;
pub mod frontier;
pub mod frontier_peer;
pub mod frontier_reuse;
pub mod grid;
pub mod memory;
pub mod plot;
pub mod premise;
pub mod premise_study;
pub mod report;
pub mod roles;
pub mod swan_report;
pub mod swan_study;
pub mod wer;
pub mod wnw_report;
pub mod wnw_study;

mod context;
mod run;

pub use context::Context;
pub use run::{Outcome, ReproduceArgs, cli, run};
