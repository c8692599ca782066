//! Calibration: what a cache learns from a model before it serves it.
//!
//! * [`swan`]: SWAN's per-head orthogonal bases (`papers/swan.txt` §4) from prefill
//!   activations of calibration texts, through the `projection` crate.
//! * [`roles`]: WnW's voice scores and head sensitivities over a marked span of any
//!   Llama-family prefill (`papers/wnw.txt` §2.2, Appendix E), by the decoder's recorded
//!   key-offset forward.
//! * [`audio`]: the same role calibration for an audio LLM, from word-aligned clips.

pub mod audio;
pub mod roles;
pub mod swan;
