//! Audio LLMs for WnW (§2, §3.1): the audio front end (WAV → 16 kHz mono → Whisper log-mel),
//! the Voxtral-style (Whisper encoder + 4-frame projector + Llama/Mistral decoder) and
//! Qwen2.5-Omni-thinker-style (chunked Whisper-like encoder with pooling + Qwen2 decoder with
//! multimodal rotary sections) forwards, and the tiered audio KV cache driving them.
//!
//! Front end: [`read_wav`] / [`read_wav_from`] → [`Audio::to_16k`] (rubato) →
//! [`mel::LogMelExtractor::compute`] (exactly `WhisperFeatureExtractor`).
//! Tiered audio KV: [`tiered::AudioTiered`] (§2.3, §3.4). Role calibration (§2.2, Appendix E):
//! [`crate::calibrate::audio`] over word alignments ([`WordAlignment`]).

mod align;
mod encoder;
pub mod mel;
mod model;
pub mod mrope;
mod names;
pub mod omni;
mod resample;
pub mod tiered;
pub mod transcribe;
pub mod voxtral;
mod wav;

pub use align::{
    AlignedAnswer, AnswerTokens, MIN_WORD_SCORE, UNIFORM_SPLIT, WordAlignment, WordSpan,
    align_answer, parse_sphinx_transcripts,
};
pub use encoder::EncoderDims;
pub use mel::{LogMel, LogMelExtractor};
pub use model::{AudioLlm, Backbone, PromptIds};
pub use names::Renamed;
pub use omni::{OmniAudio, OmniAudioConfig};
pub use resample::resample;
pub use transcribe::{AudioPrompt, Transcription};
pub use voxtral::{VoxtralAudio, VoxtralAudioConfig};
pub use wav::{Audio, read_wav, read_wav_from};

/// Shorthand for an [`Error::Audio`](crate::Error::Audio).
pub(crate) fn audio_err(op: &'static str, detail: impl Into<String>) -> crate::Error {
    crate::Error::Audio { op, detail: detail.into() }
}
