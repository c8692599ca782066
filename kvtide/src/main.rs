//! The `kvtide` command-line interface: inspect a model's KV footprint (`info`), generate
//! text through any cache (`generate`), calibrate SWAN projections (`calibrate`), measure
//! perplexity, KV bytes and speed of cache configurations through the decode path
//! (`eval-ppl`), benchmark the attention kernels (`bench-attn`) and transcribe audio
//! (`transcribe`). With no command it runs the demo: dense vs SWAN settings on the default
//! model and play (calibrating first if no projection file exists).
//!
//! Defaults come from the cache `scripts/setup.sh` fills (`$KVTIDE_CACHE`, default
//! `~/.cache/kvtide`): the SmolLM2-135M-Instruct Q4_1 GGUF and `text/plays/hamlet.md`,
//! markdown stripped by the rule in `models::load::text` (headings, speaker names and stage
//! directions dropped, escapes removed, lines joined with spaces).

use clap::{Parser, Subcommand};
use kvtide::cli::{calibrate, calibrate_roles, eval, generate, info, transcribe};

/// kvtide: KV-cache toolkit for LLM inference (SWAN sparse caches, WnW tiered caches).
#[derive(Parser, Debug)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    /// libtorch intra-op threads (default: all cores).
    #[arg(long, global = true)]
    torch_threads: Option<i32>,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Model, heads and KV bytes per token for every cache format.
    Info(info::InfoArgs),
    /// Generate text (greedy) through a cache.
    Generate(Box<generate::GenerateArgs>),
    /// Calibrate SWAN projections on text and write the ProjectionSet file.
    Calibrate(calibrate::CalibrateArgs),
    /// Perplexity, KV bytes and decode speed of cache configurations on a text.
    EvalPpl(Box<eval::EvalArgs>),
    /// Decode-attention kernels vs libtorch vs memory bandwidth (one JSON object).
    BenchAttn(eval::BenchArgs),
    /// Transcribe a WAV file with an audio LLM (Voxtral or Qwen2.5-Omni thinker checkpoint).
    Transcribe(transcribe::TranscribeArgs),
    /// WnW head roles of an audio LLM from word-aligned clips (voice score × sensitivity).
    CalibrateRoles(calibrate_roles::CalibrateRolesArgs),
    /// Reproduce the SWAN and WnW papers' findings into results/ (JSON, Markdown, plots).
    Reproduce(kvtide::reproduce::ReproduceArgs),
}

fn run(cli: Cli) -> kvtide::Result<()> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get() as i32);
    tch::set_num_threads(cli.torch_threads.unwrap_or(cores).max(1));
    tch::set_num_interop_threads(1);
    match cli.command {
        None => eval::demo(),
        Some(Command::Info(a)) => info::run(&a),
        Some(Command::Generate(a)) => generate::run(&a),
        Some(Command::Calibrate(a)) => calibrate::run(&a),
        Some(Command::EvalPpl(a)) => eval::run(&a),
        Some(Command::BenchAttn(a)) => eval::bench(&a),
        Some(Command::Transcribe(a)) => {
            transcribe::run(&a).and_then(|r| transcribe::print(&r, a.json))
        }
        Some(Command::Reproduce(a)) => std::process::exit(kvtide::reproduce::cli(&a)),
        Some(Command::CalibrateRoles(a)) => {
            calibrate_roles::run(&a).and_then(|r| calibrate_roles::print(&r, a.json))
        }
    }
}

/// libtorch's OpenMP runtime (libgomp) keeps idle worker threads spinning between
/// parallel regions. A decode step alternates hundreds of small libtorch ops with our
/// attention kernels, so on a 2-core machine the spinning workers steal the cores our
/// kernels run on (measured here: 2.5 vs 5.4 tokens/s). `OMP_WAIT_POLICY=PASSIVE` makes them
/// sleep instead; libgomp reads it when it is loaded, so the process re-executes itself once
/// with the variable set (unless the user already chose a policy).
#[cfg(unix)]
fn ensure_passive_openmp() {
    use std::os::unix::process::CommandExt;
    if std::env::var_os("OMP_WAIT_POLICY").is_some() {
        return;
    }
    if let Ok(exe) = std::env::current_exe() {
        let err = std::process::Command::new(exe)
            .args(std::env::args_os().skip(1))
            .env("OMP_WAIT_POLICY", "PASSIVE")
            .exec();
        eprintln!("kvtide: could not re-execute with OMP_WAIT_POLICY=PASSIVE ({err}); continuing");
    }
}

fn main() {
    #[cfg(unix)]
    ensure_passive_openmp();
    if let Err(e) = run(Cli::parse()) {
        eprintln!("kvtide: {e}");
        std::process::exit(1);
    }
}
