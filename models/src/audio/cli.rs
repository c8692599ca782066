//! `kvtide transcribe`: greedy transcription of a WAV file with an audio LLM checkpoint
//! (Voxtral or Qwen2.5-Omni thinker, WnW §3.1), printing the text (or the token ids when the
//! checkpoint has no `tokenizer.json`) and the cache figures of §3.4/§3.9 (`--json` for a
//! machine-readable record).

use std::path::PathBuf;

use clap::{Args, ValueEnum};
use serde::Serialize;

use super::transcribe::{AudioPrompt, greedy};
use super::{AudioLlm, Backbone};
use crate::cache::{CacheShape, DenseCache, KvCache};
use crate::error::Result;
use crate::generate::StopReason;
use crate::tokenizer::Tokenizer;

/// Which KV cache serves the decode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum AudioCache {
    /// Every position of every head in full (f32).
    Full,
}

/// Arguments of `kvtide transcribe`.
#[derive(Args, Debug, Clone)]
pub struct TranscribeArgs {
    /// Checkpoint directory (`config.json` + safetensors, HF layout).
    #[arg(long)]
    pub model: PathBuf,
    /// Input WAV (any rate / sample format / channel count).
    #[arg(long)]
    pub audio: PathBuf,
    /// KV cache for the decode.
    #[arg(long, value_enum, default_value = "full")]
    pub cache: AudioCache,
    /// Most tokens to generate.
    #[arg(long, default_value_t = 64)]
    pub max_new_tokens: usize,
    /// Attention threads.
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

/// What `kvtide transcribe` reports.
#[derive(Debug, Serialize)]
pub struct TranscribeReport {
    /// Checkpoint directory.
    pub model: String,
    /// `voxtral` or `omni`.
    pub backbone: &'static str,
    /// Seconds of audio.
    pub audio_seconds: f64,
    /// Audio tokens in the prompt.
    pub audio_tokens: usize,
    /// Audio span `[start, end)` in the prompt.
    pub audio_span: [usize; 2],
    /// Prompt tokens.
    pub prompt_tokens: usize,
    /// Cache label.
    pub cache: String,
    /// Generated ids.
    pub ids: Vec<u32>,
    /// Decoded text (`None` without a tokenizer).
    pub text: Option<String>,
    /// `eos` or `length`.
    pub stop: &'static str,
    /// Prefill seconds (audio tower excluded).
    pub prefill_s: f64,
    /// Mean decode milliseconds per token.
    pub ms_per_token: f64,
    /// Audio KV kept resident ÷ full audio KV (§3.4 r_GPU).
    pub r_gpu: f64,
    /// Audio KV resident + recallable ÷ full audio KV (§3.4 r_GPU+CPU).
    pub r_gpu_cpu: f64,
    /// Bytes moved host→device per decode step (recalls).
    pub bytes_per_step: f64,
    /// Cache bytes resident at the end.
    pub kv_bytes_resident: usize,
    /// Cache bytes offloaded at the end.
    pub kv_bytes_offloaded: usize,
}

/// Runs `kvtide transcribe`.
///
/// # Errors
/// Loading, audio and forward errors.
pub fn run(args: &TranscribeArgs) -> Result<TranscribeReport> {
    let model = AudioLlm::load(&args.model)?;
    let tokenizer = Some(args.model.join("tokenizer.json"))
        .filter(|p| p.is_file())
        .map(|p| Tokenizer::from_file(&p))
        .transpose()?;
    let prompt = AudioPrompt::from_wav(&model, &args.audio)?;
    let mut cache: Box<dyn KvCache> = match args.cache {
        AudioCache::Full => {
            Box::new(DenseCache::<f32>::new(CacheShape::of(model.config()), args.threads)?)
        }
    };
    let stop = model.config().eos_token_ids.clone();
    let out = greedy(&model, &prompt, cache.as_mut(), args.max_new_tokens, &stop, &mut |_| Ok(()))?;
    let text = tokenizer.as_ref().map(|t| t.decode(&out.generation.ids)).transpose()?;
    Ok(TranscribeReport {
        model: args.model.display().to_string(),
        backbone: match model.backbone() {
            Backbone::Voxtral => "voxtral",
            Backbone::Omni => "omni",
        },
        audio_seconds: prompt.seconds,
        audio_tokens: prompt.audio_span.len(),
        audio_span: [prompt.audio_span.start, prompt.audio_span.end],
        prompt_tokens: prompt.ids.len(),
        cache: cache.label(),
        ids: out.generation.ids.clone(),
        text,
        stop: match out.generation.stop {
            StopReason::StopToken(_) => "eos",
            StopReason::Length => "length",
        },
        prefill_s: out.generation.prefill_s,
        ms_per_token: out.ms_per_token(),
        r_gpu: 1.0,
        r_gpu_cpu: 1.0,
        bytes_per_step: 0.0,
        kv_bytes_resident: out.bytes_at_end.resident,
        kv_bytes_offloaded: out.bytes_at_end.offloaded,
    })
}

/// Prints a report as text or JSON.
///
/// # Errors
/// [`crate::Error::Json`] if serialisation fails.
pub fn print(report: &TranscribeReport, json: bool) -> Result<()> {
    if json {
        let s = serde_json::to_string_pretty(report)
            .map_err(|source| crate::Error::Json { what: "transcribe report".into(), source })?;
        println!("{s}");
        return Ok(());
    }
    match &report.text {
        Some(t) => println!("{t}"),
        None => println!("(no tokenizer.json: token ids) {:?}", report.ids),
    }
    println!(
        "{}: {:.1} s audio → {} audio tokens at {:?} of {} prompt tokens; cache {}; {} tokens ({}), prefill {:.2} s, {:.2} ms/token; r_GPU {:.3}, r_GPU+CPU {:.3}, {:.0} B/step recalled; KV {} B resident + {} B offloaded",
        report.backbone,
        report.audio_seconds,
        report.audio_tokens,
        report.audio_span,
        report.prompt_tokens,
        report.cache,
        report.ids.len(),
        report.stop,
        report.prefill_s,
        report.ms_per_token,
        report.r_gpu,
        report.r_gpu_cpu,
        report.bytes_per_step,
        report.kv_bytes_resident,
        report.kv_bytes_offloaded
    );
    Ok(())
}
