//! `kvtide transcribe`: greedy transcription of WAV audio with an audio LLM checkpoint
//! (Voxtral or Qwen2.5-Omni thinker, WnW §3.1) through the full cache or the tiered audio
//! cache (§2.3), printing the text (or the token ids when the checkpoint has no
//! `tokenizer.json`) and the cache figures of §3.4: r_GPU (after prefill, mean over decode
//! steps, at the end), r_GPU+CPU, bytes recalled per step and milliseconds per token (`--json`
//! for a machine-readable record).

use std::path::PathBuf;

use clap::{Args, ValueEnum};
use kv_sparse::ValueFormat;
use kv_tiered::budget::{BudgetSearch, DEFAULT_MEASURED_TOLERANCE, SearchOutcome};
use kv_tiered::policy::{EvictionLag, SegmentQuota};
use kv_tiered::retention::DEFAULT_TOLERANCE;
use serde::Serialize;

use crate::error::{Result, invalid};
use models::audio::tiered::AudioTiered;
use models::audio::transcribe::{AudioPrompt, Transcription, greedy};
use models::audio::{Audio, AudioLlm, Backbone, read_wav};
use models::cache::tiered::{PolicyKind, RolesSource};
use models::cache::{CacheShape, DenseCache, KvCache};
use models::calibrate::audio::default_triage;
use models::load::tokenizer::Tokenizer;
use models::session::generate::StopReason;

/// Which KV cache serves the decode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum AudioCache {
    /// Every position of every head resident.
    Full,
    /// The tiered audio cache (`--policy`, `--r-gpu`): only the audio span is managed.
    Tiered,
}

/// Placement policy of the tiered cache (§2.3 WnW, §3.3 baselines restricted to audio).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum AudioPolicy {
    /// WnW: anchor / tidal / fixed heads, anchor-driven chunk recall.
    Wnw,
    /// Everything resident (the tiered store's own full-cache reference).
    Full,
    /// SnapKV: static top-k by last-window attention.
    Snapkv,
    /// Ada-KV: SnapKV with adaptive per-head budgets.
    Adakv,
    /// AudioKV: voice-score-weighted budgets.
    Audiokv,
    /// ArkVale: page recall by query-box bounds.
    Arkvale,
    /// AffPool: adjacent similar audio tokens pooled into one row at prefill.
    Affpool,
}

impl From<AudioPolicy> for PolicyKind {
    fn from(p: AudioPolicy) -> Self {
        match p {
            AudioPolicy::Wnw => Self::Wnw,
            AudioPolicy::Full => Self::Full,
            AudioPolicy::Snapkv => Self::SnapKv,
            AudioPolicy::Adakv => Self::AdaKv,
            AudioPolicy::Audiokv => Self::AudioKv,
            AudioPolicy::Arkvale => Self::ArkVale,
            AudioPolicy::Affpool => Self::AffPool,
        }
    }
}

/// Format of resident KV rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum KvFormat {
    /// 32-bit floats (the lossless reference).
    F32,
    /// IEEE half.
    F16,
    /// bfloat16.
    Bf16,
}

impl From<KvFormat> for ValueFormat {
    fn from(f: KvFormat) -> Self {
        match f {
            KvFormat::F32 => Self::F32,
            KvFormat::F16 => Self::F16,
            KvFormat::Bf16 => Self::Bf16,
        }
    }
}

/// Arguments of `kvtide transcribe`.
#[derive(Args, Debug, Clone)]
pub struct TranscribeArgs {
    /// Checkpoint directory (`config.json` + safetensors, HF layout).
    #[arg(long)]
    pub model: PathBuf,
    /// Input WAV (any rate / sample format / channel count); repeat to concatenate clips.
    #[arg(long, required = true)]
    pub audio: Vec<PathBuf>,
    /// KV cache for the decode.
    #[arg(long, value_enum, default_value = "full")]
    pub cache: AudioCache,
    /// Tiered placement policy.
    #[arg(long, value_enum, default_value = "wnw")]
    pub policy: AudioPolicy,
    /// Target on-device retention of the audio KV (tiered).
    #[arg(long, default_value_t = 0.2)]
    pub r_gpu: f64,
    /// Head roles: `auto` (triage by this prompt's text→audio attention, sensitivity 1) or a
    /// roles JSON from `kvtide calibrate-roles`.
    #[arg(long, default_value = "auto")]
    pub roles: String,
    /// Voice heads for `--roles auto` (default: the paper's share for `--r-gpu`).
    #[arg(long)]
    pub n_voice: Option<usize>,
    /// Anchor heads for `--roles auto` (default 5, below the voice-head count).
    #[arg(long)]
    pub n_anchor: Option<usize>,
    /// Chunks selected per decode step.
    #[arg(long, default_value_t = 3)]
    pub top: usize,
    /// Eviction lag δ in steps, or `inf`.
    #[arg(long, default_value = "3")]
    pub delta: String,
    /// Prefill selection: per segment (WnW) or global top-k.
    #[arg(long, default_value = "segment", value_parser = ["segment", "global"])]
    pub quota: String,
    /// Lossless tiered mode (retention 1, every chunk, δ = ∞): must match `--cache full`.
    #[arg(long)]
    pub lossless: bool,
    /// Format of resident KV rows (both caches).
    #[arg(long, value_enum, default_value = "f32")]
    pub kv_format: KvFormat,
    /// Most tokens to generate.
    #[arg(long, default_value_t = 64)]
    pub max_new_tokens: usize,
    /// Attention threads.
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
    /// Closed-loop budget: up to this many calibration decodes of the same prompt to find
    /// the policy budget whose *measured* mean r_GPU over decode is within 0.02 of
    /// `--r-gpu` (0: the prefill budget is the target itself).
    #[arg(long, default_value_t = 0)]
    pub closed_loop: usize,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

impl TranscribeArgs {
    /// The tiered-cache knobs these arguments select.
    ///
    /// # Errors
    /// [`crate::Error::InvalidInput`] for a bad `--delta`.
    pub fn tiered(&self) -> Result<AudioTiered> {
        let lag = match self.delta.as_str() {
            "inf" => EvictionLag::Never,
            d => d
                .parse::<u32>()
                .ok()
                .and_then(std::num::NonZeroU32::new)
                .map(EvictionLag::Steps)
                .ok_or_else(|| invalid("--delta", format!("`{d}`: a positive integer or inf")))?,
        };
        Ok(AudioTiered {
            policy: self.policy.into(),
            r_gpu: self.r_gpu,
            roles: match self.roles.as_str() {
                "auto" => RolesSource::Auto,
                path => RolesSource::File(PathBuf::from(path)),
            },
            n_voice: self.n_voice,
            n_anchor: self.n_anchor,
            top_chunks: self.top,
            lag,
            quota: if self.quota == "global" {
                SegmentQuota::Global
            } else {
                SegmentQuota::PerSegment
            },
            format: self.kv_format.into(),
            lossless: self.lossless,
        })
    }
}

/// What `kvtide transcribe` reports.
#[derive(Debug, Serialize)]
pub struct TranscribeReport {
    /// Checkpoint directory.
    pub model: String,
    /// `voxtral` or `omni`.
    pub backbone: &'static str,
    /// Input files (concatenated in order).
    pub audio: Vec<String>,
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
    /// Target r_GPU (tiered caches).
    pub target_r_gpu: Option<f64>,
    /// The policy budget the decode ran with (`--r-gpu` itself unless `--closed-loop` chose
    /// another; tiered caches).
    pub budget_knob: Option<f64>,
    /// The closed-loop search, probe by probe (`--closed-loop`).
    pub budget_search: Option<BudgetSearch>,
    /// Set when the run could not meet the target exactly and ran at the nearest feasible
    /// budget instead (also printed to stderr).
    pub warning: Option<String>,
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
    /// Audio KV resident ÷ full audio KV after prefill (§3.4 r_GPU).
    pub r_gpu_prefill: f64,
    /// r_GPU averaged over decode steps.
    pub r_gpu_mean: f64,
    /// r_GPU at the end.
    pub r_gpu: f64,
    /// Audio KV resident + recallable ÷ full audio KV at the end (§3.4 r_GPU+CPU).
    pub r_gpu_cpu: f64,
    /// Bytes moved host→device per decode step (recalls), mean.
    pub bytes_per_step: f64,
    /// Segment recalls over the run.
    pub recalls: f64,
    /// Segment releases over the run.
    pub releases: f64,
    /// Cache bytes resident at the end.
    pub kv_bytes_resident: usize,
    /// Cache bytes offloaded at the end.
    pub kv_bytes_offloaded: usize,
}

/// Reads and concatenates the input clips at 16 kHz.
fn read_inputs(paths: &[PathBuf]) -> Result<Audio> {
    let clips = paths.iter().map(|p| read_wav(p)?.to_16k()).collect::<models::Result<Vec<_>>>()?;
    Ok(Audio::concat(&clips)?)
}

fn stat(stats: &[(&'static str, f64)], key: &str) -> Option<f64> {
    stats.iter().find(|(k, _)| *k == key).map(|&(_, v)| v)
}

/// Runs `kvtide transcribe`.
///
/// # Errors
/// Loading, audio, cache-parameter and forward errors.
pub fn run(args: &TranscribeArgs) -> Result<TranscribeReport> {
    let model = AudioLlm::load(&args.model)?;
    let tokenizer = Some(args.model.join("tokenizer.json"))
        .filter(|p| p.is_file())
        .map(|p| Tokenizer::from_file(&p))
        .transpose()?;
    let audio = read_inputs(&args.audio)?;
    let prompt = AudioPrompt::from_samples(&model, &audio.samples)?;
    let stop = model.config().eos_token_ids.clone();
    let decode = |cache: &mut dyn KvCache| {
        greedy(&model, &prompt, cache, args.max_new_tokens, &stop, &mut |_| Ok(()))
    };
    let tiered = args.cache == AudioCache::Tiered;
    let (cache, out, search): (Box<dyn KvCache>, Transcription, Option<BudgetSearch>) = match args
        .cache
    {
        AudioCache::Full => {
            let mut cache = full_cache(&model, args.kv_format, args.threads)?;
            let out = decode(cache.as_mut())?;
            (cache, out, None)
        }
        AudioCache::Tiered => {
            let mut knobs = args.tiered()?;
            // The triage follows the target, not the knob the search moves.
            let heads = CacheShape::of(model.config())?;
            let triage = default_triage(heads.layers * heads.kv_heads(), args.r_gpu);
            knobs.n_voice = knobs.n_voice.or(Some(triage.n_voice));
            knobs.n_anchor = knobs.n_anchor.or(Some(triage.n_anchor));
            let build = |r_gpu: f64| {
                AudioTiered { r_gpu, ..knobs.clone() }.cache(
                    &model,
                    prompt.audio_span.clone(),
                    args.threads,
                )
            };
            if args.closed_loop > 0 && !args.lossless {
                let mut search =
                    BudgetSearch::new(args.r_gpu, DEFAULT_MEASURED_TOLERANCE, args.closed_loop)?;
                let mut best: Option<(Box<dyn KvCache>, Transcription)> = None;
                while let Some(knob) = search.proposal() {
                    let mut cache = build(knob)?;
                    let out = decode(cache.as_mut())?;
                    let measured = stat(&cache.stats(), "mean_r_gpu").unwrap_or(1.0);
                    search.observe(measured.clamp(0.0, 1.0))?;
                    if search.latest_is_best() {
                        best = Some((cache, out));
                    }
                }
                let (cache, out) =
                    best.ok_or_else(|| invalid("--closed-loop", "no calibration decode ran"))?;
                (cache, out, Some(search))
            } else {
                let mut cache = build(args.r_gpu)?;
                let out = decode(cache.as_mut())?;
                (cache, out, None)
            }
        }
    };
    let text = tokenizer.as_ref().map(|t| t.decode(&out.generation.ids)).transpose()?;
    let mut report = report(args, &model, &prompt, cache.as_ref(), &out, text, tiered);
    report.warning = budget_warning(args, &report, search.as_ref());
    report.budget_knob = tiered.then(|| search.as_ref().map_or(args.r_gpu, |s| s.best().knob));
    report.budget_search = search;
    if let Some(w) = &report.warning {
        eprintln!("warning: {w}");
    }
    Ok(report)
}

/// The warning for a run that could not meet its r_GPU target exactly: the closed loop did
/// not converge, or (open loop) the prefill budget differs from the target because the
/// prompt is too short for its per-segment quotas or the anchors alone exceed it.
fn budget_warning(
    args: &TranscribeArgs,
    r: &TranscribeReport,
    search: Option<&BudgetSearch>,
) -> Option<String> {
    let target = r.target_r_gpu.filter(|_| !args.lossless)?;
    match search {
        Some(s) if s.outcome() != SearchOutcome::Converged => Some(format!(
            "target r_GPU {target} not met within {DEFAULT_MEASURED_TOLERANCE} after {} calibration decodes ({:?}); ran at the nearest feasible budget: knob {:.4}, measured mean r_GPU {:.4} ({} audio tokens)",
            s.probes().len(),
            s.outcome(),
            s.best().knob,
            r.r_gpu_mean,
            r.audio_tokens
        )),
        Some(_) => None,
        None if (r.r_gpu_prefill - target).abs() > DEFAULT_TOLERANCE => Some(format!(
            "target r_GPU {target} is not reachable at prefill for this prompt ({} audio tokens: per-segment quotas too coarse or the anchor heads alone exceed it); ran at the nearest feasible prefill budget {:.4} (measured mean over decode {:.4})",
            r.audio_tokens, r.r_gpu_prefill, r.r_gpu_mean
        )),
        None => None,
    }
}

fn full_cache(model: &AudioLlm, format: KvFormat, threads: usize) -> Result<Box<dyn KvCache>> {
    use half::{bf16, f16};
    let shape = CacheShape::of(model.config())?;
    Ok(match format {
        KvFormat::F32 => Box::new(DenseCache::<f32>::new(shape, threads)?),
        KvFormat::F16 => Box::new(DenseCache::<f16>::new(shape, threads)?),
        KvFormat::Bf16 => Box::new(DenseCache::<bf16>::new(shape, threads)?),
    })
}

fn report(
    args: &TranscribeArgs,
    model: &AudioLlm,
    prompt: &AudioPrompt,
    cache: &dyn KvCache,
    out: &Transcription,
    text: Option<String>,
    tiered: bool,
) -> TranscribeReport {
    let end = cache.stats();
    let at_end = |k: &str| stat(&end, k).unwrap_or(1.0);
    TranscribeReport {
        model: args.model.display().to_string(),
        backbone: match model.backbone() {
            Backbone::Voxtral => "voxtral",
            Backbone::Omni => "omni",
        },
        audio: args.audio.iter().map(|p| p.display().to_string()).collect(),
        audio_seconds: prompt.seconds,
        audio_tokens: prompt.audio_span.len(),
        audio_span: [prompt.audio_span.start, prompt.audio_span.end],
        prompt_tokens: prompt.ids.len(),
        cache: cache.label(),
        target_r_gpu: tiered.then_some(if args.lossless { 1.0 } else { args.r_gpu }),
        budget_knob: None,
        budget_search: None,
        warning: None,
        ids: out.generation.ids.clone(),
        text,
        stop: match out.generation.stop {
            StopReason::StopToken(_) => "eos",
            StopReason::Length => "length",
        },
        prefill_s: out.generation.prefill_s,
        ms_per_token: out.ms_per_token(),
        r_gpu_prefill: stat(&out.stats_after_prefill, "r_gpu").unwrap_or(1.0),
        r_gpu_mean: at_end("mean_r_gpu"),
        r_gpu: at_end("r_gpu"),
        r_gpu_cpu: at_end("r_gpu_cpu"),
        bytes_per_step: stat(&end, "h2d_bytes_per_step").unwrap_or(0.0),
        recalls: stat(&end, "recalls").unwrap_or(0.0),
        releases: stat(&end, "releases").unwrap_or(0.0),
        kv_bytes_resident: out.bytes_at_end.resident,
        kv_bytes_offloaded: out.bytes_at_end.offloaded,
    }
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
        "{}: {:.1} s audio → {} audio tokens at {:?} of {} prompt tokens; cache {}",
        report.backbone,
        report.audio_seconds,
        report.audio_tokens,
        report.audio_span,
        report.prompt_tokens,
        report.cache,
    );
    println!(
        "{} tokens ({}), prefill {:.2} s, {:.2} ms/token; r_GPU {:.3} after prefill, {:.3} mean, {:.3} at end (target {}); r_GPU+CPU {:.3}; {:.0} B/step recalled ({} recalls, {} releases); KV {} B resident + {} B offloaded",
        report.ids.len(),
        report.stop,
        report.prefill_s,
        report.ms_per_token,
        report.r_gpu_prefill,
        report.r_gpu_mean,
        report.r_gpu,
        report.target_r_gpu.map_or("-".into(), |t| format!("{t}")),
        report.r_gpu_cpu,
        report.bytes_per_step,
        report.recalls,
        report.releases,
        report.kv_bytes_resident,
        report.kv_bytes_offloaded
    );
    if let (Some(knob), Some(s)) = (report.budget_knob, &report.budget_search) {
        println!(
            "closed-loop budget: knob {knob:.4} after {} calibration decodes ({:?})",
            s.probes().len(),
            s.outcome()
        );
    }
    Ok(())
}
