//! The tiered audio KV cache of an audio LLM (`papers/wnw.txt` §2.3, §3.3–3.4): the prompt's
//! audio span is the span `kv-tiered` manages — text before and after it and every generated
//! token stay resident in full (the paper's audio-only scope). Segments and chunks follow the
//! backbone's audio rate (`n_s = ⌈2 s·r_tok⌉`, `n_c = ⌈4 s·r_tok⌉`: 25/50 tokens for Voxtral,
//! 50/100 for Qwen2.5-Omni). The decoder supplies the prefill text→audio attention sums and the
//! gathered decode kernel feeds the anchor heads' softmax weights back each step (the
//! [`crate::cache::TieredCache`] machinery); this module only turns the user's knobs into a
//! [`TieredSpec`] over the audio span.

use std::ops::Range;

use kv_sparse::ValueFormat;
use kv_tiered::policy::{EvictionLag, SegmentQuota};

use super::{AudioLlm, Backbone};
use crate::cache::tiered::{PolicyKind, RolesSource};
use crate::cache::{CacheShape, KvCache, TieredSpec};
use crate::calibrate::audio::default_triage;
use crate::error::Result;

/// Segment and chunk windows in seconds (§2.3: `W_s = 2 s`, `W_c = 4 s`).
pub const SEGMENT_SECONDS: f64 = 2.0;
/// Chunk window in seconds.
pub const CHUNK_SECONDS: f64 = 4.0;

/// The user's knobs for the tiered audio cache.
#[derive(Clone, Debug, PartialEq)]
pub struct AudioTiered {
    /// Placement policy (WnW or a §3.3 baseline).
    pub policy: PolicyKind,
    /// Target on-device retention of the audio KV (§3.4 r_GPU).
    pub r_gpu: f64,
    /// Head roles: triage from this prompt's text→audio attention, or a calibrated file.
    pub roles: RolesSource,
    /// Voice heads (`None`: [`default_triage`] for the model and `r_gpu`).
    pub n_voice: Option<usize>,
    /// Anchor heads (`None`: [`default_triage`]).
    pub n_anchor: Option<usize>,
    /// Chunks selected per decode step (3).
    pub top_chunks: usize,
    /// Eviction lag δ (3 steps).
    pub lag: EvictionLag,
    /// Per-segment or global prefill selection.
    pub quota: SegmentQuota,
    /// Format of the resident rows.
    pub format: ValueFormat,
    /// Lossless mode: WnW with retention 1, every chunk selected, δ = ∞.
    pub lossless: bool,
}

impl Default for AudioTiered {
    fn default() -> Self {
        Self {
            policy: PolicyKind::Wnw,
            r_gpu: 0.2,
            roles: RolesSource::Auto,
            n_voice: None,
            n_anchor: None,
            top_chunks: 3,
            lag: EvictionLag::default(),
            quota: SegmentQuota::PerSegment,
            format: ValueFormat::F32,
            lossless: false,
        }
    }
}

/// `(n_s, n_c)` in audio tokens for a backbone.
///
/// # Examples
/// ```
/// use models::audio::{Backbone, tiered::segment_and_chunk};
/// assert_eq!(segment_and_chunk(Backbone::Voxtral), (25, 50));
/// assert_eq!(segment_and_chunk(Backbone::Omni), (50, 100));
/// ```
pub fn segment_and_chunk(backbone: Backbone) -> (usize, usize) {
    let r = backbone.tokens_per_second();
    ((SEGMENT_SECONDS * r).ceil() as usize, (CHUNK_SECONDS * r).ceil() as usize)
}

impl AudioTiered {
    /// The lossless setting: WnW, retention 1, every chunk selected, δ = ∞, f32 rows.
    pub fn lossless() -> Self {
        Self { lossless: true, ..Self::default() }
    }

    /// The cache spec over `audio` for a model with `heads` KV-heads in all layers.
    pub fn spec(&self, backbone: Backbone, audio: Range<usize>, heads: usize) -> TieredSpec {
        let triage = default_triage(heads, self.r_gpu);
        let (segment, chunk) = segment_and_chunk(backbone);
        let mut s = TieredSpec {
            span_start: audio.start,
            span_end: Some(audio.end),
            policy: self.policy,
            r_gpu: self.r_gpu,
            n_voice: Some(self.n_voice.unwrap_or(triage.n_voice)),
            n_anchor: self.n_anchor.unwrap_or(triage.n_anchor),
            top_chunks: self.top_chunks,
            lag: self.lag,
            quota: self.quota,
            segment,
            chunk,
            window: 32,
            roles: self.roles.clone(),
            format: self.format,
            max_new: 4096,
        };
        if self.lossless {
            (s.policy, s.r_gpu, s.top_chunks, s.lag) =
                (PolicyKind::Wnw, 1.0, usize::MAX, EvictionLag::Never);
        }
        s
    }

    /// The cache for `model`'s prompt with audio at `audio`, attention on `threads` threads.
    ///
    /// # Errors
    /// [`crate::Error::InvalidInput`] / [`crate::Error::Attention`] for bad parameters;
    /// errors about the roles or an unreachable r_GPU target surface at prefill.
    pub fn cache(
        &self,
        model: &AudioLlm,
        audio: Range<usize>,
        threads: usize,
    ) -> Result<Box<dyn KvCache>> {
        let shape = CacheShape::of(model.config())?;
        let spec = self.spec(model.backbone(), audio, shape.layers * shape.kv_heads());
        spec.build(shape, None, threads)
    }
}
