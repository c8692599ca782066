//! `kvtide transcribe` end to end on the tiny Voxtral fixture over the five LibriVox clips
//! (`~/.cache/kvtide/audio/data/librivox/`, Debian `pocketsphinx-testdata`): the command's
//! full and tiered caches, their reported figures, and its bad-knob errors.

use std::path::Path;

use clap::Parser;
use kvtide::cli::transcribe::{self as cli, TranscribeArgs};

const CLIPS: [&str; 5] = [
    "sense_and_sensibility_01_austen_64kb-0870",
    "sense_and_sensibility_01_austen_64kb-0880",
    "sense_and_sensibility_01_austen_64kb-0890",
    "sense_and_sensibility_01_austen_64kb-0920",
    "sense_and_sensibility_01_austen_64kb-0930",
];

/// `kvtide transcribe …` arguments parsed as the CLI parses them.
#[derive(Parser)]
struct Transcribe {
    #[command(flatten)]
    args: TranscribeArgs,
}

fn transcribe(name: &str, extra: &str) -> kvtide::Result<cli::TranscribeReport> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/audio/tiny").join(name);
    let clip = |c: &str| {
        format!("--audio {}/audio/data/librivox/{c}.wav", kvtide::paths::cache_dir().display())
    };
    let audio: Vec<String> = CLIPS.iter().map(|c| clip(c)).collect();
    let line = format!(
        "transcribe --model {} {} --max-new-tokens 8 {extra}",
        dir.display(),
        audio.join(" ")
    );
    cli::run(&Transcribe::try_parse_from(line.split_whitespace()).unwrap().args)
}

/// The command's own path: `--cache tiered --lossless` reports the full cache's tokens at
/// r_GPU 1; `--r-gpu 0.3` reports its target, offloaded bytes and recalls; bad knobs are
/// typed errors.
#[test]
fn transcribe_command_reports_full_and_tiered_figures() {
    let full = transcribe("voxtral", "--cache full").unwrap();
    let lossless = transcribe("voxtral", "--cache tiered --lossless").unwrap();
    assert_eq!((full.audio_tokens, full.ids.len()), (lossless.audio_tokens, 8));
    assert_eq!(lossless.ids, full.ids);
    assert_eq!((lossless.target_r_gpu, lossless.r_gpu, lossless.r_gpu_cpu), (Some(1.0), 1.0, 1.0));
    assert_eq!(full.target_r_gpu, None);
    let tiered = transcribe("voxtral", "--cache tiered --r-gpu 0.3 --delta 2 --top 2").unwrap();
    assert_eq!(tiered.target_r_gpu, Some(0.3));
    assert!((tiered.r_gpu_prefill - 0.3).abs() <= 0.01, "{}", tiered.r_gpu_prefill);
    assert!(tiered.kv_bytes_offloaded > 0 && tiered.recalls > 0.0, "{tiered:?}");
    assert!(tiered.kv_bytes_resident < full.kv_bytes_resident, "{tiered:?}");
    for bad in ["--cache tiered --delta 0", "--cache tiered --roles /nonexistent.json"] {
        assert!(transcribe("voxtral", bad).is_err(), "{bad}");
    }
}
