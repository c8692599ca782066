//! Audio layout: where the audio span sits in the prompt, its `n_s`-token segments and its
//! overlapping `n_c`-token chunks with stride `n_s` (WnW §2.3 "Chunk Structure").
//!
//! Positions come in two flavours: *absolute* sequence positions (`0..seq_len` for the prompt,
//! then generated tokens) and *audio indices* `τ ∈ 0..T_a` (absolute minus `audio_start`).
//! Segment and chunk ranges are audio indices. Everything outside the audio span is text and
//! is always resident.
//!
//! * segment `j` covers `[j·n_s, min((j+1)·n_s, T_a))` — the last one may be partial;
//! * chunk `c` covers `[c·n_s, min(c·n_s + n_c, T_a))`; chunks start every `n_s` tokens and the
//!   last chunk is the first that reaches `T_a` (so no chunk is contained in its predecessor).
//!   With the defaults `n_c = 2·n_s` every chunk spans two contiguous segments.

use std::ops::Range;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result, param};

/// Default chunk window `W_c` in seconds.
pub const DEFAULT_CHUNK_SECONDS: f64 = 4.0;
/// Default segment stride `W_s` in seconds.
pub const DEFAULT_SEGMENT_SECONDS: f64 = 2.0;
/// Audio token rate of Voxtral (tokens per second).
pub const VOXTRAL_TOKENS_PER_SECOND: f64 = 12.5;
/// Audio token rate of Qwen2.5-Omni (tokens per second).
pub const QWEN_OMNI_TOKENS_PER_SECOND: f64 = 25.0;

/// `⌈seconds · rate⌉`, robust to float noise such as `0.48 · 12.5 = 6.000000000000001`.
fn tokens_for(seconds: f64, rate: f64) -> usize {
    let x = seconds * rate;
    (x - 1e-9 * x.abs().max(1.0)).ceil().max(0.0) as usize
}

/// Where the audio sits in a prompt and how it is cut into segments and chunks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AudioLayout {
    seq_len: usize,
    audio_start: usize,
    audio_len: usize,
    segment_len: usize,
    chunk_len: usize,
}

impl AudioLayout {
    /// A layout with explicit segment length `n_s` and chunk length `n_c` (tokens).
    ///
    /// # Errors
    /// [`Error::AudioSpan`] if `audio` is empty or not inside `0..seq_len`;
    /// [`Error::Param`] if `segment_len == 0` or `chunk_len < segment_len` (chunks would leave
    /// gaps between them).
    ///
    /// # Examples
    /// ```
    /// use kv_tiered::AudioLayout;
    /// let l = AudioLayout::new(120, 10..110, 25, 50)?;
    /// assert_eq!(l.num_segments(), 4); // 25, 25, 25, 25
    /// assert_eq!(l.num_chunks(), 3); // 0..50, 25..75, 50..100
    /// # Ok::<(), kv_tiered::Error>(())
    /// ```
    pub fn new(
        seq_len: usize,
        audio: Range<usize>,
        segment_len: usize,
        chunk_len: usize,
    ) -> Result<Self> {
        if audio.start >= audio.end || audio.end > seq_len {
            return Err(Error::AudioSpan { start: audio.start, end: audio.end, seq_len });
        }
        if segment_len == 0 {
            return Err(param("AudioLayout::new", "segment_len", 0, "≥ 1"));
        }
        if chunk_len < segment_len {
            return Err(param("AudioLayout::new", "chunk_len", chunk_len, "≥ segment_len"));
        }
        Ok(Self {
            seq_len,
            audio_start: audio.start,
            audio_len: audio.end - audio.start,
            segment_len,
            chunk_len,
        })
    }

    /// A layout from the audio token rate and the windows in seconds:
    /// `n_s = ⌈W_s·r_tok⌉`, `n_c = ⌈W_c·r_tok⌉`.
    ///
    /// # Errors
    /// As [`AudioLayout::new`], plus [`Error::Param`] for non-positive or non-finite rates or
    /// windows.
    ///
    /// # Examples
    /// ```
    /// use kv_tiered::layout::{AudioLayout, DEFAULT_CHUNK_SECONDS, DEFAULT_SEGMENT_SECONDS};
    /// let l = AudioLayout::from_rate(3100, 50..3050, 12.5, DEFAULT_SEGMENT_SECONDS, DEFAULT_CHUNK_SECONDS)?;
    /// assert_eq!((l.segment_len(), l.chunk_len()), (25, 50)); // Voxtral, §2.3
    /// # Ok::<(), kv_tiered::Error>(())
    /// ```
    pub fn from_rate(
        seq_len: usize,
        audio: Range<usize>,
        tokens_per_second: f64,
        segment_seconds: f64,
        chunk_seconds: f64,
    ) -> Result<Self> {
        for (name, v) in [
            ("tokens_per_second", tokens_per_second),
            ("segment_seconds", segment_seconds),
            ("chunk_seconds", chunk_seconds),
        ] {
            if !(v.is_finite() && v > 0.0) {
                return Err(param("AudioLayout::from_rate", name, v, "finite and > 0"));
            }
        }
        let n_s = tokens_for(segment_seconds, tokens_per_second);
        let n_c = tokens_for(chunk_seconds, tokens_per_second);
        Self::new(seq_len, audio, n_s, n_c)
    }

    /// Prompt length (text + audio).
    pub fn seq_len(&self) -> usize {
        self.seq_len
    }
    /// First absolute position of the audio span.
    pub fn audio_start(&self) -> usize {
        self.audio_start
    }
    /// Number of audio positions `T_a`.
    pub fn audio_len(&self) -> usize {
        self.audio_len
    }
    /// The audio span as absolute positions.
    pub fn audio_span(&self) -> Range<usize> {
        self.audio_start..self.audio_start + self.audio_len
    }
    /// Segment length `n_s` (also the chunk stride).
    pub fn segment_len(&self) -> usize {
        self.segment_len
    }
    /// Chunk length `n_c`.
    pub fn chunk_len(&self) -> usize {
        self.chunk_len
    }
    /// Number of prompt text positions (always resident).
    pub fn text_len(&self) -> usize {
        self.seq_len - self.audio_len
    }

    /// Whether absolute position `pos` is audio.
    pub fn is_audio(&self, pos: usize) -> bool {
        self.audio_span().contains(&pos)
    }

    /// Audio index of absolute position `pos`, if it is audio.
    pub fn audio_index(&self, pos: usize) -> Option<usize> {
        self.is_audio(pos).then(|| pos - self.audio_start)
    }

    /// Number of segments `⌈T_a / n_s⌉`.
    pub fn num_segments(&self) -> usize {
        self.audio_len.div_ceil(self.segment_len)
    }

    /// Audio indices of segment `j` (the last may be partial). Empty if `j` is out of range.
    pub fn segment(&self, j: usize) -> Range<usize> {
        let start = (j * self.segment_len).min(self.audio_len);
        start..(start + self.segment_len).min(self.audio_len)
    }

    /// Segment holding audio index `tau`.
    pub fn segment_of(&self, tau: usize) -> usize {
        tau / self.segment_len
    }

    /// Number of chunks: 1 if `T_a ≤ n_c`, else `⌈(T_a − n_c)/n_s⌉ + 1`.
    pub fn num_chunks(&self) -> usize {
        if self.audio_len <= self.chunk_len {
            1
        } else {
            (self.audio_len - self.chunk_len).div_ceil(self.segment_len) + 1
        }
    }

    /// Audio indices of chunk `c` (clipped to `T_a`). Empty if `c` is out of range.
    pub fn chunk(&self, c: usize) -> Range<usize> {
        if c >= self.num_chunks() {
            return self.audio_len..self.audio_len;
        }
        let start = c * self.segment_len;
        start..(start + self.chunk_len).min(self.audio_len)
    }

    /// Segments overlapping chunk `c`, as a range of segment indices.
    pub fn chunk_segments(&self, c: usize) -> Range<usize> {
        let r = self.chunk(c);
        if r.is_empty() {
            return 0..0;
        }
        self.segment_of(r.start)..self.segment_of(r.end - 1) + 1
    }

    /// `Σ_j ⌊retention · |segment j|⌋`: audio positions a head with this retention keeps on
    /// the device after prefill (the per-segment quota of §2.3; the global variant spends the
    /// same total).
    pub fn kept_per_segment_quota(&self, retention: f64) -> usize {
        let full = self.audio_len / self.segment_len;
        let last = self.audio_len % self.segment_len;
        full * quota(retention, self.segment_len) + quota(retention, last)
    }
}

/// `⌊retention · n⌋`, clamped to `0..=n` (retention outside [0, 1] saturates). A relative
/// slack of 1e-9 absorbs float noise (`0.29 · 100 = 28.999999999999996` counts as 29).
pub fn quota(retention: f64, n: usize) -> usize {
    if retention >= 1.0 {
        n
    } else if retention.is_nan() || retention <= 0.0 {
        0
    } else {
        let x = retention * n as f64;
        ((x + 1e-9 * x.max(1.0)).floor() as usize).min(n)
    }
}
