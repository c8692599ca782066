//! Word alignments for the voice score (`papers/wnw.txt` §2.2, Appendix E Eq. 3): each answer
//! token is scored against the time span of the word it belongs to, converted to audio-token
//! indices `[⌊a·r_tok⌋, ⌊b·r_tok⌋)`.
//!
//! An aligner is out of scope: alignments come in as JSON, one object per word —
//! `{"words": [{"word": "he", "start": 0.42, "end": 0.55, "score": 0.97}, …]}` (WhisperX's
//! `word_segments` key is accepted too; `score` is optional, words below the confidence floor,
//! 0.85 in the paper, are not scored). [`WordAlignment::uniform`] makes a **test** alignment
//! from a transcript without timings (LibriVox transcripts have none): the clip is split at a
//! constant speaking rate in characters. It is labelled [`UNIFORM_SPLIT`] wherever it goes and
//! is not a substitute for a forced alignment.
//!
//! Answer tokens are the transcript's words tokenised one by one (a leading space before every
//! word but the first), with the checkpoint's tokenizer or, for tokenizer-less test
//! checkpoints with a 256-entry vocabulary, as UTF-8 bytes ([`AnswerTokens::Bytes`]).

use std::ops::Range;
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::audio_err;
use crate::error::{Error, Result};
use crate::load::tokenizer::Tokenizer;

/// The `method` label of [`WordAlignment::uniform`] alignments.
pub const UNIFORM_SPLIT: &str = "uniform-split TEST alignment: constant speaking rate in characters over the clip, not a forced alignment";

/// Default alignment-confidence floor (Appendix E / F: `min_word_score = 0.85`).
pub const MIN_WORD_SCORE: f64 = 0.85;

/// One aligned word.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WordSpan {
    /// The word as spoken in the transcript.
    pub word: String,
    /// Start, seconds from the beginning of the audio.
    pub start: f64,
    /// End, seconds.
    pub end: f64,
    /// Alignment confidence in `[0, 1]` (absent: trusted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub score: Option<f64>,
}

/// A transcript with word time spans.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WordAlignment {
    /// How the alignment was made (e.g. `whisperx`, or [`UNIFORM_SPLIT`]).
    #[serde(default)]
    pub method: String,
    /// The words in order.
    #[serde(alias = "word_segments")]
    pub words: Vec<WordSpan>,
}

impl WordAlignment {
    /// Parses and validates an alignment JSON document.
    ///
    /// # Errors
    /// [`Error::Json`] for malformed JSON; [`Error::Audio`] for an empty word list, an empty
    /// word, non-finite or negative times, `end < start` or a score outside `[0, 1]`.
    ///
    /// # Examples
    /// ```
    /// use models::audio::WordAlignment;
    /// let a = WordAlignment::from_json(r#"{"words":[{"word":"hi","start":0.1,"end":0.4}]}"#)?;
    /// assert_eq!(a.words[0].end, 0.4);
    /// assert!(WordAlignment::from_json(r#"{"words":[{"word":"hi","start":0.4,"end":0.1}]}"#).is_err());
    /// # Ok::<(), models::Error>(())
    /// ```
    pub fn from_json(text: &str) -> Result<Self> {
        let a: Self = serde_json::from_str(text)
            .map_err(|source| Error::Json { what: "word alignment".into(), source })?;
        a.validate()?;
        Ok(a)
    }

    /// Reads [`WordAlignment::from_json`] from a file.
    ///
    /// # Errors
    /// [`Error::Io`] if unreadable; as [`WordAlignment::from_json`].
    pub fn read(path: &Path) -> Result<Self> {
        Self::from_json(&crate::error::read_text_file(path)?)
    }

    /// A **test** alignment of `transcript` over `seconds` of audio: the duration is divided
    /// among the words in proportion to their characters (one extra character per gap), as if
    /// spoken at a constant rate. Labelled [`UNIFORM_SPLIT`].
    ///
    /// # Errors
    /// [`Error::Audio`] for a transcript without words or a non-positive duration.
    ///
    /// # Examples
    /// ```
    /// use models::audio::WordAlignment;
    /// let a = WordAlignment::uniform("ab c", 4.0)?;
    /// assert_eq!((a.words[0].start, a.words[0].end), (0.0, 2.0)); // "ab" + gap: 3 of 4 chars
    /// assert_eq!((a.words[1].start, a.words[1].end), (3.0, 4.0));
    /// # Ok::<(), models::Error>(())
    /// ```
    pub fn uniform(transcript: &str, seconds: f64) -> Result<Self> {
        let words: Vec<&str> = transcript.split_whitespace().collect();
        if words.is_empty() || !(seconds.is_finite() && seconds > 0.0) {
            return Err(audio_err(
                "uniform alignment",
                format!(
                    "{} words over {seconds} s: need ≥ 1 word and a positive duration",
                    words.len()
                ),
            ));
        }
        let chars = |w: &str| w.chars().count() as f64;
        let total = words.iter().map(|w| chars(w)).sum::<f64>() + (words.len() - 1) as f64;
        let rate = seconds / total;
        let mut at = 0.0;
        let mut spans = Vec::with_capacity(words.len());
        for w in words {
            let end = at + chars(w);
            spans.push(WordSpan {
                word: w.to_string(),
                start: at * rate,
                end: end * rate,
                score: None,
            });
            at = end + 1.0;
        }
        Ok(Self { method: UNIFORM_SPLIT.into(), words: spans })
    }

    /// Alignments of consecutive clips joined into one, each shifted by the duration of the
    /// clips before it (`parts`: alignment and clip seconds). Methods are joined with `+` when
    /// they differ.
    ///
    /// # Errors
    /// [`Error::Audio`] for no parts or a non-positive duration.
    pub fn concat(parts: &[(Self, f64)]) -> Result<Self> {
        if parts.is_empty() || parts.iter().any(|(_, s)| !(s.is_finite() && *s > 0.0)) {
            return Err(audio_err(
                "concat alignments",
                "need ≥ 1 part, each with a positive duration",
            ));
        }
        let mut methods: Vec<&str> = parts.iter().map(|(a, _)| a.method.as_str()).collect();
        methods.dedup();
        let mut words = Vec::new();
        let mut offset = 0.0;
        for (a, seconds) in parts {
            words.extend(a.words.iter().map(|w| WordSpan {
                start: w.start + offset,
                end: w.end + offset,
                ..w.clone()
            }));
            offset += seconds;
        }
        Ok(Self { method: methods.join(" + "), words })
    }

    /// The transcript (words joined by spaces).
    pub fn transcript(&self) -> String {
        self.words.iter().map(|w| w.word.as_str()).collect::<Vec<_>>().join(" ")
    }

    fn validate(&self) -> Result<()> {
        if self.words.is_empty() {
            return Err(audio_err("word alignment", "no words"));
        }
        for (i, w) in self.words.iter().enumerate() {
            let times_ok =
                w.start.is_finite() && w.end.is_finite() && 0.0 <= w.start && w.start <= w.end;
            let score_ok = w.score.is_none_or(|s| (0.0..=1.0).contains(&s));
            if w.word.trim().is_empty() || !times_ok || !score_ok {
                return Err(audio_err(
                    "word alignment",
                    format!(
                        "word {i} {:?} at [{}, {}] score {:?}: need a word, 0 ≤ start ≤ end (finite), score in [0, 1]",
                        w.word, w.start, w.end, w.score
                    ),
                ));
            }
        }
        Ok(())
    }
}

/// How answer words become token ids.
#[derive(Clone, Copy)]
pub enum AnswerTokens<'a> {
    /// The checkpoint's tokenizer.
    Tokenizer(&'a Tokenizer),
    /// UTF-8 bytes as ids (test checkpoints without a tokenizer and with a vocabulary of at
    /// least 256 entries).
    Bytes,
}

impl AnswerTokens<'_> {
    fn encode(&self, text: &str) -> Result<Vec<u32>> {
        match self {
            Self::Tokenizer(t) => t.encode(text),
            Self::Bytes => Ok(text.bytes().map(u32::from).collect()),
        }
    }
}

/// Answer tokens with the audio-token interval of the word each belongs to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AlignedAnswer {
    /// Token ids of the transcript.
    pub ids: Vec<u32>,
    /// Per token: `[⌊start·r_tok⌋, ⌊end·r_tok⌋)` clipped to the audio, or `None` for a word
    /// below the confidence floor or too short to cover an audio token.
    pub spans: Vec<Option<Range<usize>>>,
}

/// Tokenises `alignment`'s words and maps each token to its word's audio-token interval
/// (`tokens_per_second`: the model's `r_tok`; `audio_len`: audio tokens in the prompt).
///
/// # Errors
/// [`Error::Audio`] if a word starts past the audio, a non-positive rate, or no tokens;
/// tokenizer errors.
///
/// # Examples
/// ```
/// use models::audio::{AnswerTokens, WordAlignment, align_answer};
/// let a = WordAlignment::from_json(r#"{"words":[{"word":"a","start":0.0,"end":0.5},{"word":"b","start":0.5,"end":1.0}]}"#)?;
/// let ans = align_answer(&a, AnswerTokens::Bytes, 12.5, 20, 0.85)?;
/// assert_eq!(ans.ids, [97, 32, 98]); // "a", " b"
/// assert_eq!(ans.spans, [Some(0..6), Some(6..12), Some(6..12)]);
/// # Ok::<(), models::Error>(())
/// ```
pub fn align_answer(
    alignment: &WordAlignment,
    tokens: AnswerTokens<'_>,
    tokens_per_second: f64,
    audio_len: usize,
    min_score: f64,
) -> Result<AlignedAnswer> {
    const OP: &str = "align answer";
    if !(tokens_per_second.is_finite() && tokens_per_second > 0.0) {
        return Err(audio_err(OP, format!("r_tok {tokens_per_second}: need > 0")));
    }
    let mut out = AlignedAnswer { ids: Vec::new(), spans: Vec::new() };
    for (i, w) in alignment.words.iter().enumerate() {
        let a = (w.start * tokens_per_second).floor() as usize;
        let b = ((w.end * tokens_per_second).floor() as usize).min(audio_len);
        if a >= audio_len {
            return Err(audio_err(
                OP,
                format!(
                    "word {i} {:?} starts at {} s, past the {audio_len} audio tokens",
                    w.word, w.start
                ),
            ));
        }
        let confident = w.score.is_none_or(|s| s >= min_score);
        let span = (confident && a < b).then_some(a..b);
        let text = if i == 0 { w.word.clone() } else { format!(" {}", w.word) };
        let ids = tokens.encode(&text)?;
        out.spans.extend(std::iter::repeat_n(span, ids.len()));
        out.ids.extend(ids);
    }
    if out.ids.is_empty() {
        return Err(audio_err(OP, "the transcript has no tokens"));
    }
    Ok(out)
}

/// Parses a Sphinx-style transcription file (`pocketsphinx-testdata`'s LibriVox
/// `transcription`): lines `<s> words </s> (utterance-id)`. Returns `(id, words)` in order.
///
/// # Errors
/// [`Error::Audio`] naming the first line without a trailing `(id)`.
///
/// # Examples
/// ```
/// let t = models::audio::parse_sphinx_transcripts("<s> he was not </s> (clip-0880)\n")?;
/// assert_eq!(t, [("clip-0880".to_string(), "he was not".to_string())]);
/// # Ok::<(), models::Error>(())
/// ```
pub fn parse_sphinx_transcripts(text: &str) -> Result<Vec<(String, String)>> {
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let line = line.trim();
        let (words, id) =
            line.strip_suffix(')').and_then(|l| l.rsplit_once('(')).ok_or_else(|| {
                audio_err("sphinx transcription", format!("line {}: no `(id)`", n + 1))
            })?;
        let words: Vec<&str> =
            words.split_whitespace().filter(|w| !matches!(*w, "<s>" | "</s>" | "<sil>")).collect();
        out.push((id.trim().to_string(), words.join(" ")));
    }
    Ok(out)
}
