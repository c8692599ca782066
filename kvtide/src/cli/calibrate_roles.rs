//! `kvtide calibrate-roles`: WnW head triage for an audio LLM (`papers/wnw.txt` §2.2,
//! Appendix E). Each calibration clip comes with a word alignment (`--alignment`, JSON) or —
//! for test data without timings — a transcript split at a constant speaking rate
//! (`--uniform-transcripts`, a Sphinx `transcription` file, labelled as a TEST alignment in
//! the report). Voice scores and head sensitivities ([`models::calibrate::audio`]) are triaged by
//! VS×HS into kv-tiered's roles JSON (`--out`), which `kvtide transcribe --roles` reads.

use std::path::{Path, PathBuf};

use clap::{Args, ValueEnum};
use kv_tiered::{RankingSignal, Role, TriageConfig};
use serde::Serialize;

use crate::error::audio_err;
use crate::error::{Error, Result};
use models::audio::{AnswerTokens, WordAlignment, parse_sphinx_transcripts};
use models::audio::{Audio, AudioLlm, read_wav};
use models::calibrate::audio::{AudioCalibration, calibrate, default_triage};
use models::calibrate::roles::{SampleStats, Sensitivity};
use models::load::tokenizer::Tokenizer;

/// Triage ranking signal (§2.2 VS×HS; ablation A3 single signals).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Signal {
    /// Voice score × head sensitivity.
    VsHs,
    /// Voice score only.
    Vs,
    /// Head sensitivity only.
    Hs,
}

/// Arguments of `kvtide calibrate-roles`.
#[derive(Args, Debug, Clone)]
pub struct CalibrateRolesArgs {
    /// Checkpoint directory (`config.json` + safetensors, HF layout).
    #[arg(long)]
    pub model: PathBuf,
    /// Calibration clips (WAV), one sample each.
    #[arg(long, required = true)]
    pub audio: Vec<PathBuf>,
    /// Word alignment JSON per clip, in `--audio` order.
    #[arg(long, conflicts_with = "uniform_transcripts")]
    pub alignment: Vec<PathBuf>,
    /// TEST ONLY: a Sphinx `transcription` file (`<s> words </s> (clip-id)`); each clip's
    /// words (looked up by file stem) are spread over it at a constant speaking rate.
    #[arg(long)]
    pub uniform_transcripts: Option<PathBuf>,
    /// Where to write the roles JSON.
    #[arg(long)]
    pub out: PathBuf,
    /// GPU budget the roles are for (picks the paper's voice-head share).
    #[arg(long, default_value_t = 0.2)]
    pub r_gpu: f64,
    /// Voice heads (default: from `--r-gpu`).
    #[arg(long)]
    pub n_voice: Option<usize>,
    /// Anchor heads (default 5, below the voice-head count).
    #[arg(long)]
    pub n_anchor: Option<usize>,
    /// Ranking signal.
    #[arg(long, value_enum, default_value = "vs-hs")]
    pub signal: Signal,
    /// Alignment-confidence floor for the voice score.
    #[arg(long, default_value_t = models::audio::MIN_WORD_SCORE)]
    pub min_word_score: f64,
    /// Head sensitivity from this many answer-token groups per clip instead of every token.
    #[arg(long)]
    pub hs_groups: Option<usize>,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

/// One calibration clip in the report.
#[derive(Debug, Serialize)]
pub struct ClipReport {
    /// The WAV file.
    pub audio: String,
    /// Seconds of audio.
    pub seconds: f64,
    /// Where the alignment came from.
    pub alignment: String,
    /// Aligned words.
    pub words: usize,
    /// What the sample contributed.
    pub stats: SampleStats,
}

/// What `kvtide calibrate-roles` reports.
#[derive(Debug, Serialize)]
pub struct CalibrateRolesReport {
    /// Checkpoint directory.
    pub model: String,
    /// Answer tokenisation (`tokenizer.json` or UTF-8 bytes).
    pub answer_tokens: &'static str,
    /// Clips.
    pub clips: Vec<ClipReport>,
    /// KV-heads per layer.
    pub kv_heads: usize,
    /// Triage used.
    pub triage: TriageConfig,
    /// Voice score per KV-head (`layer · kv_heads + kv_head`).
    pub voice_score: Vec<f32>,
    /// Head sensitivity per KV-head.
    pub head_sensitivity: Vec<f32>,
    /// Role per KV-head.
    pub roles: Vec<Role>,
    /// The roles file written.
    pub out: String,
    /// Seconds spent.
    pub seconds: f64,
}

fn alignments(args: &CalibrateRolesArgs, clips: &[Audio]) -> Result<Vec<WordAlignment>> {
    if let Some(path) = &args.uniform_transcripts {
        let text = std::fs::read_to_string(path).map_err(|source| Error::Io {
            op: "read",
            path: path.clone(),
            source,
        })?;
        let table = parse_sphinx_transcripts(&text)?;
        return args
            .audio
            .iter()
            .zip(clips)
            .map(|(wav, clip)| {
                let stem = wav.file_stem().and_then(|s| s.to_str()).unwrap_or_default();
                let (_, words) = table.iter().find(|(id, _)| id == stem).ok_or_else(|| {
                    audio_err(
                        "calibrate roles",
                        format!("no transcript for `{stem}` in {}", path.display()),
                    )
                })?;
                Ok(WordAlignment::uniform(words, clip.seconds())?)
            })
            .collect();
    }
    if args.alignment.len() != args.audio.len() {
        return Err(audio_err(
            "calibrate roles",
            format!(
                "{} --alignment for {} --audio: give one per clip (or --uniform-transcripts)",
                args.alignment.len(),
                args.audio.len()
            ),
        ));
    }
    Ok(args.alignment.iter().map(|p| WordAlignment::read(p)).collect::<models::Result<_>>()?)
}

fn answer_tokens(model: &AudioLlm, dir: &Path) -> Result<(Option<Tokenizer>, &'static str)> {
    let path = dir.join("tokenizer.json");
    if path.is_file() {
        return Ok((Some(Tokenizer::from_file(&path)?), "tokenizer.json"));
    }
    if model.config().vocab_size < 256 {
        return Err(audio_err(
            "calibrate roles",
            "no tokenizer.json and a vocabulary under 256 entries: cannot tokenise the transcript",
        ));
    }
    Ok((None, "UTF-8 bytes (no tokenizer.json; test checkpoints only)"))
}

/// Runs `kvtide calibrate-roles`: calibrates, writes the roles file, returns the report.
///
/// # Errors
/// Loading, alignment, forward/autograd and triage errors; [`Error::Io`] if the roles file
/// cannot be written.
pub fn run(args: &CalibrateRolesArgs) -> Result<CalibrateRolesReport> {
    let t0 = std::time::Instant::now();
    let model = AudioLlm::load(&args.model)?;
    let (tokenizer, how) = answer_tokens(&model, &args.model)?;
    let tokens = tokenizer.as_ref().map_or(AnswerTokens::Bytes, AnswerTokens::Tokenizer);
    let clips =
        args.audio.iter().map(|p| read_wav(p)?.to_16k()).collect::<models::Result<Vec<_>>>()?;
    let aligned = alignments(args, &clips)?;
    let cfg = AudioCalibration {
        min_word_score: args.min_word_score,
        sensitivity: args.hs_groups.map_or(Sensitivity::PerToken, Sensitivity::Groups),
    };
    let inputs: Vec<(&[f32], &WordAlignment)> =
        clips.iter().map(|c| c.samples.as_slice()).zip(&aligned).collect();
    let mut stats = Vec::new();
    let scores = calibrate(&model, &inputs, tokens, cfg, &mut |_, s| stats.push(*s))?;
    let cfg = model.config();
    let mut triage = default_triage(cfg.num_layers * cfg.kv_heads, args.r_gpu);
    triage.n_voice = args.n_voice.unwrap_or(triage.n_voice);
    triage.n_anchor = args.n_anchor.unwrap_or(triage.n_anchor).min(triage.n_voice);
    triage.signal = match args.signal {
        Signal::VsHs => RankingSignal::VsHs,
        Signal::Vs => RankingSignal::VsOnly,
        Signal::Hs => RankingSignal::HsOnly,
    };
    let roles = scores.roles(triage)?;
    std::fs::write(&args.out, roles.to_json()?).map_err(|source| Error::Io {
        op: "write",
        path: args.out.clone(),
        source,
    })?;
    let clips = args
        .audio
        .iter()
        .zip(&clips)
        .zip(aligned.iter().zip(stats))
        .map(|((p, c), (a, s))| ClipReport {
            audio: p.display().to_string(),
            seconds: c.seconds(),
            alignment: a.method.clone(),
            words: a.words.len(),
            stats: s,
        })
        .collect();
    Ok(CalibrateRolesReport {
        model: args.model.display().to_string(),
        answer_tokens: how,
        clips,
        kv_heads: cfg.kv_heads,
        triage,
        voice_score: scores.voice_score,
        head_sensitivity: scores.head_sensitivity,
        roles: roles.roles().to_vec(),
        out: args.out.display().to_string(),
        seconds: t0.elapsed().as_secs_f64(),
    })
}

/// Prints a report as text or JSON.
///
/// # Errors
/// [`Error::Json`] if serialisation fails.
pub fn print(report: &CalibrateRolesReport, json: bool) -> Result<()> {
    if json {
        let s = serde_json::to_string_pretty(report)
            .map_err(|source| Error::Json { what: "calibrate-roles report".into(), source })?;
        println!("{s}");
        return Ok(());
    }
    for c in &report.clips {
        println!(
            "{}: {:.1} s, {} words ({}), {} answer tokens ({} aligned), {} backward passes",
            c.audio,
            c.seconds,
            c.words,
            c.alignment,
            c.stats.answer_tokens,
            c.stats.aligned_tokens,
            c.stats.backward_passes
        );
    }
    println!("answer tokens: {}", report.answer_tokens);
    println!("head (layer.kv)   voice score   sensitivity   role");
    let kv = report.kv_heads.max(1);
    for (i, ((vs, hs), role)) in
        report.voice_score.iter().zip(&report.head_sensitivity).zip(&report.roles).enumerate()
    {
        println!("{:>6}.{:<9} {vs:>11.4} {hs:>13.4e}   {role:?}", i / kv, i % kv);
    }
    println!(
        "{} voice heads ({} anchors), ranked by {:?}; roles written to {} in {:.1} s",
        report.triage.n_voice,
        report.triage.n_anchor,
        report.triage.signal,
        report.out,
        report.seconds
    );
    Ok(())
}
