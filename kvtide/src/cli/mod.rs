//! The subcommands of the `kvtide` binary: each module holds one command's clap arguments
//! and its `run`; [`common`] holds what they share (the model argument, text loading,
//! indicatif progress bars on stderr so `--json` output stays clean).

pub mod calibrate;
pub mod calibrate_roles;
pub mod common;
pub mod eval;
pub mod generate;
pub mod info;
pub mod transcribe;
