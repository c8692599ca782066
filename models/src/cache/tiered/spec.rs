//! Parameters of the `tiered` and `swan+tiered` caches and how they become a `kv-tiered`
//! policy once the prompt is known (`papers/wnw.txt` §2.2–2.3, §3.3 baselines).
//!
//! Keys (all optional but `span`): `span=A..B` (or `A..` = to the end of the prompt), the
//! marked span WnW manages (the paper's audio; text positions stay resident);
//! `policy=wnw|full|snapkv|adakv|audiokv|arkvale|affpool`; `r_gpu` (target on-device retention of
//! the span, default 0.2; WnW runs at the nearest feasible prefill budget where a short span's
//! quotas or the anchors' share make the exact target unreachable); `n_voice`, `n_anchor` (default 37.5 % of heads, 5); `top` (chunks
//! selected per step, 3); `delta` (eviction lag, 3, or `inf`); `quota=segment|global`;
//! `segment`/`chunk` (tokens, 25/50 — Voxtral's 2 s/4 s at 12.5 tok/s); `window` (SnapKV-style
//! observation window, 32); `roles=auto|PATH` (auto: triage by the span's share of each head's
//! prefill attention, the text-model stand-in for the voice score, sensitivity 1); `format`
//! of dense rows (`f32`, `f16`, `bf16`; default f16); `max_new` (decode capacity if the
//! session does not reserve); `lossless` (WnW with retention 1, every chunk selected, δ = ∞).

use std::num::NonZeroU32;
use std::ops::Range;
use std::path::PathBuf;

use kv_sparse::ValueFormat;
use kv_tiered::policy::{
    AdaKvConfig, AdaKvPolicy, AffPoolConfig, AffPoolPolicy, ArkValeConfig, ArkValePolicy,
    AudioKvConfig, AudioKvPolicy, EvictionLag, FullPolicy, PrefillSignal, SegmentQuota, WnwConfig,
    WnwPolicy,
};
use kv_tiered::{AudioLayout, HeadRoles, Policy, RetentionSchedule, TriageConfig};

use crate::cache::spec::{Params, spec_err};
use crate::error::{Error, Result};

/// Which placement policy runs the store.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PolicyKind {
    /// WnW (anchor / tidal / fixed heads, chunk swap).
    Wnw,
    /// Everything resident.
    Full,
    /// SnapKV: static top-k by the last-window attention, uniform budgets.
    SnapKv,
    /// Ada-KV: SnapKV with adaptive per-head budgets.
    AdaKv,
    /// AudioKV: voice-score-weighted budgets.
    AudioKv,
    /// ArkVale: page recall by query-box bounds.
    ArkVale,
    /// AffPool: adjacent similar audio tokens pooled into one row at prefill.
    AffPool,
}

/// Where head roles come from.
#[derive(Clone, Debug, PartialEq)]
pub enum RolesSource {
    /// Triage from this prompt's span attention (voice-score stand-in; sensitivity 1).
    Auto,
    /// A `kv-tiered` roles JSON file.
    File(PathBuf),
}

/// The tiered-cache part of a cache spec.
#[derive(Clone, Debug, PartialEq)]
pub struct TieredSpec {
    /// Span start.
    pub span_start: usize,
    /// Span end (`None`: the end of the prompt).
    pub span_end: Option<usize>,
    /// Policy.
    pub policy: PolicyKind,
    /// Target on-device retention of the span.
    pub r_gpu: f64,
    /// Voice heads (`None`: 37.5 % of all kv-heads).
    pub n_voice: Option<usize>,
    /// Anchor heads.
    pub n_anchor: usize,
    /// Chunks selected per step.
    pub top_chunks: usize,
    /// Eviction lag.
    pub lag: EvictionLag,
    /// Prefill selection granularity.
    pub quota: SegmentQuota,
    /// Segment length `n_s` (tokens).
    pub segment: usize,
    /// Chunk length `n_c` (tokens).
    pub chunk: usize,
    /// Observation window of the SnapKV-style baselines.
    pub window: usize,
    /// Head roles.
    pub roles: RolesSource,
    /// Dense row format.
    pub format: ValueFormat,
    /// Decode capacity when the session does not reserve one.
    pub max_new: usize,
}

fn parse_span(p: &mut Params<'_>) -> Result<(usize, Option<usize>)> {
    let spec = p.spec();
    let raw = p.take("span").ok_or_else(|| spec_err(spec, "tiered caches need `span=A..B`"))?;
    let bad = || spec_err(spec, format!("`span={raw}`: expected A..B or A.."));
    let (a, b) = raw.split_once("..").ok_or_else(bad)?;
    let start = a.parse().map_err(|_| bad())?;
    let end = if b.is_empty() { None } else { Some(b.parse().map_err(|_| bad())?) };
    if end.is_some_and(|e| e <= start) {
        return Err(spec_err(spec, format!("`span={raw}` is empty")));
    }
    Ok((start, end))
}

fn parse_policy(p: &mut Params<'_>) -> Result<PolicyKind> {
    Ok(match p.take("policy").unwrap_or("wnw") {
        "wnw" => PolicyKind::Wnw,
        "full" => PolicyKind::Full,
        "snapkv" => PolicyKind::SnapKv,
        "adakv" => PolicyKind::AdaKv,
        "audiokv" => PolicyKind::AudioKv,
        "arkvale" => PolicyKind::ArkVale,
        "affpool" => PolicyKind::AffPool,
        other => return Err(spec_err(p.spec(), format!("unknown policy `{other}`"))),
    })
}

fn parse_lag(p: &mut Params<'_>) -> Result<EvictionLag> {
    match p.take("delta") {
        None => Ok(EvictionLag::default()),
        Some("inf") => Ok(EvictionLag::Never),
        Some(v) => {
            v.parse::<u32>().ok().and_then(NonZeroU32::new).map(EvictionLag::Steps).ok_or_else(
                || spec_err(p.spec(), format!("`delta={v}`: expected a positive integer or inf")),
            )
        }
    }
}

impl TieredSpec {
    pub(crate) fn parse(p: &mut Params<'_>) -> Result<Self> {
        let (span_start, span_end) = parse_span(p)?;
        let lossless = p.take("lossless").is_some();
        let quota = match p.take("quota") {
            None | Some("segment") => SegmentQuota::PerSegment,
            Some("global") => SegmentQuota::Global,
            Some(v) => {
                return Err(spec_err(p.spec(), format!("`quota={v}`: expected segment or global")));
            }
        };
        let format = match p.take("format") {
            None | Some("f16") => ValueFormat::F16,
            Some("f32") => ValueFormat::F32,
            Some("bf16") => ValueFormat::Bf16,
            Some(v) => {
                return Err(spec_err(p.spec(), format!("`format={v}`: expected f32, f16 or bf16")));
            }
        };
        let mut s = Self {
            span_start,
            span_end,
            policy: parse_policy(p)?,
            r_gpu: p.parse_opt("r_gpu")?.unwrap_or(0.2),
            n_voice: p.parse_opt("n_voice")?,
            n_anchor: p.parse_opt("n_anchor")?.unwrap_or(5),
            top_chunks: p.parse_opt("top")?.unwrap_or(3),
            lag: parse_lag(p)?,
            quota,
            segment: p.parse_opt("segment")?.unwrap_or(25),
            chunk: p.parse_opt("chunk")?.unwrap_or(50),
            window: p.parse_opt("window")?.unwrap_or(32),
            roles: p.take("roles").map_or(RolesSource::Auto, |r| match r {
                "auto" => RolesSource::Auto,
                path => RolesSource::File(PathBuf::from(path)),
            }),
            format,
            max_new: p.parse_opt("max_new")?.unwrap_or(4096),
        };
        if lossless {
            (s.policy, s.r_gpu, s.top_chunks, s.lag) =
                (PolicyKind::Wnw, 1.0, usize::MAX, EvictionLag::Never);
        }
        if !(s.r_gpu > 0.0 && s.r_gpu <= 1.0) {
            return Err(spec_err(p.spec(), format!("r_gpu={} must be in (0, 1]", s.r_gpu)));
        }
        Ok(s)
    }

    /// The span for a prompt of `prompt_len` tokens.
    ///
    /// # Errors
    /// [`Error::CacheSpec`] if it does not lie inside the prompt.
    pub fn span(&self, prompt_len: usize) -> Result<Range<usize>> {
        let end = self.span_end.unwrap_or(prompt_len);
        if self.span_start >= end || end > prompt_len {
            let reason = format!(
                "span {}..{end} is not inside the {prompt_len}-token prompt",
                self.span_start
            );
            return Err(Error::CacheSpec { spec: "span".into(), reason });
        }
        Ok(self.span_start..end)
    }

    /// The layout of the span inside a prompt of `prompt_len` tokens.
    ///
    /// # Errors
    /// As [`TieredSpec::span`]; [`Error::Tiered`] for bad segment/chunk lengths.
    pub fn layout(&self, prompt_len: usize) -> Result<AudioLayout> {
        Ok(AudioLayout::new(prompt_len, self.span(prompt_len)?, self.segment, self.chunk)?)
    }

    /// The prefill statistic this spec's policy reads.
    pub fn prefill_signal(&self) -> PrefillSignal {
        match self.policy {
            PolicyKind::Wnw => PrefillSignal::TextToAudio,
            PolicyKind::Full | PolicyKind::AffPool => PrefillSignal::None,
            _ => PrefillSignal::LastTokens(self.window),
        }
    }

    /// Triage of `layers × kv_heads` heads from per-head voice scores (auto) or the file.
    ///
    /// # Errors
    /// [`Error::Io`] for an unreadable roles file; [`Error::Tiered`] for invalid roles.
    pub fn roles(&self, layers: usize, kv_heads: usize, voice: &[f32]) -> Result<HeadRoles> {
        let heads = layers * kv_heads;
        match &self.roles {
            RolesSource::File(path) => {
                let roles = HeadRoles::from_json(&crate::error::read_text_file(path)?)?;
                if (roles.layers(), roles.kv_heads()) != (layers, kv_heads) {
                    let reason = format!(
                        "{}×{} roles for a {layers}×{kv_heads} model",
                        roles.layers(),
                        roles.kv_heads()
                    );
                    return Err(Error::CacheSpec {
                        spec: format!("roles={}", path.display()),
                        reason,
                    });
                }
                Ok(roles)
            }
            RolesSource::Auto => {
                let n_voice = self.n_voice.unwrap_or((heads * 3).div_ceil(8)).clamp(1, heads);
                let n_anchor = self.n_anchor.min(n_voice);
                let cfg = TriageConfig { n_voice, n_anchor, ..TriageConfig::default() };
                Ok(HeadRoles::triage(layers, kv_heads, voice, &vec![1.0; heads], cfg)?)
            }
        }
    }

    /// The policy for this spec, given the layout and per-head voice scores.
    ///
    /// # Errors
    /// [`Error::Tiered`] for parameters the policy rejects. An r_GPU target WnW cannot reach
    /// exactly is not an error: it runs at the nearest feasible budget, and the cache's
    /// `prefill_r_gpu` and `target_r_gpu` statistics show both.
    pub fn policy(
        &self,
        layout: AudioLayout,
        layers: usize,
        kv_heads: usize,
        voice: &[f32],
    ) -> Result<Box<dyn Policy>> {
        let r = self.r_gpu;
        Ok(match self.policy {
            PolicyKind::Full => Box::new(FullPolicy),
            PolicyKind::Wnw => {
                let cfg = WnwConfig {
                    top_chunks: self.top_chunks.min(layout.num_chunks()).max(1),
                    lag: self.lag,
                    quota: self.quota,
                };
                let roles = self.roles(layers, kv_heads, voice)?;
                let (schedule, _fit) = RetentionSchedule::solve_nearest(&roles, &layout, r)?;
                Box::new(WnwPolicy::new(roles, schedule, layout, cfg)?)
            }
            PolicyKind::AffPool => Box::new(AffPoolPolicy::new(AffPoolConfig::new(r))?),
            PolicyKind::SnapKv => Box::new(AdaKvPolicy::new(AdaKvConfig {
                window: self.window,
                ..AdaKvConfig::snap_kv(r)
            })?),
            PolicyKind::AdaKv => Box::new(AdaKvPolicy::new(AdaKvConfig {
                window: self.window,
                ..AdaKvConfig::ada_kv(r)
            })?),
            PolicyKind::AudioKv => {
                let vs = self.roles(layers, kv_heads, voice)?.voice_score().to_vec();
                Box::new(AudioKvPolicy::new(AudioKvConfig {
                    window: self.window,
                    ..AudioKvConfig::new(r, vs)
                })?)
            }
            PolicyKind::ArkVale => {
                let cfg = ArkValeConfig { window: self.window, ..ArkValeConfig::new(r) };
                Box::new(ArkValePolicy::new(cfg)?)
            }
        })
    }
}
