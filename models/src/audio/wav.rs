//! WAV input for the audio front end (WnW §3.2 inputs are 16 kHz speech): any PCM integer
//! width hound reads (8/16/24/32 bit) or 32-bit float, any channel count, downmixed to mono
//! `f32` in `[-1, 1]` (integers scaled by `2^(bits-1)`, as `soundfile` does) and resampled to
//! 16 kHz with `rubato`.

use std::io::Read;
use std::path::Path;

use hound::{SampleFormat, WavReader};

use super::audio_err;
use super::mel::SAMPLE_RATE;
use super::resample::resample;
use crate::{Error, Result};

/// Mono audio samples at a known rate.
#[derive(Clone, Debug, PartialEq)]
pub struct Audio {
    /// Samples in `[-1, 1]`.
    pub samples: Vec<f32>,
    /// Sample rate in Hz.
    pub sample_rate: u32,
}

impl Audio {
    /// Duration in seconds.
    pub fn seconds(&self) -> f64 {
        self.samples.len() as f64 / f64::from(self.sample_rate)
    }

    /// This audio at 16 kHz (a copy when already at 16 kHz).
    ///
    /// # Errors
    /// As [`resample`].
    pub fn to_16k(&self) -> Result<Audio> {
        if self.sample_rate == SAMPLE_RATE {
            return Ok(self.clone());
        }
        let samples = resample(&self.samples, self.sample_rate, SAMPLE_RATE)?;
        Ok(Audio { samples, sample_rate: SAMPLE_RATE })
    }

    /// Concatenation of several inputs (all must share one rate).
    ///
    /// # Errors
    /// [`Error::Audio`] for an empty list or mixed rates.
    pub fn concat(parts: &[Audio]) -> Result<Audio> {
        let first = parts.first().ok_or_else(|| audio_err("Audio::concat", "no inputs"))?;
        if let Some(p) = parts.iter().find(|p| p.sample_rate != first.sample_rate) {
            return Err(audio_err(
                "Audio::concat",
                format!("sample rate {} Hz, expected {} Hz", p.sample_rate, first.sample_rate),
            ));
        }
        let samples = parts.iter().flat_map(|p| p.samples.iter().copied()).collect();
        Ok(Audio { samples, sample_rate: first.sample_rate })
    }
}

/// Reads a WAV file as mono `f32` at its own rate.
///
/// # Errors
/// [`Error::Io`]-style [`Error::Audio`] for unreadable files, [`Error::Audio`] for an unsupported
/// sample format (e.g. 64-bit float, 12-bit containers hound rejects), zero channels or zero
/// samples.
pub fn read_wav(path: &Path) -> Result<Audio> {
    let reader = WavReader::open(path)
        .map_err(|e| audio_err("read_wav", format!("{}: {e}", path.display())))?;
    decode(reader).map_err(|e| match e {
        Error::Audio { op, detail } => {
            Error::Audio { op, detail: format!("{}: {detail}", path.display()) }
        }
        other => other,
    })
}

/// Reads a WAV stream (see [`read_wav`]).
///
/// # Errors
/// As [`read_wav`].
///
/// # Examples
/// ```
/// let spec = hound::WavSpec { channels: 2, sample_rate: 8000, bits_per_sample: 16,
///     sample_format: hound::SampleFormat::Int };
/// let mut bytes = std::io::Cursor::new(Vec::new());
/// let mut w = hound::WavWriter::new(&mut bytes, spec).unwrap();
/// for s in [16384i16, 0, -16384, -16384] { w.write_sample(s).unwrap(); }
/// w.finalize().unwrap();
/// let audio = models::audio::read_wav_from(std::io::Cursor::new(bytes.into_inner()))?;
/// assert_eq!((audio.sample_rate, audio.samples.as_slice()), (8000, &[0.25, -0.5][..]));
/// # Ok::<(), models::Error>(())
/// ```
pub fn read_wav_from<R: Read>(reader: R) -> Result<Audio> {
    decode(WavReader::new(reader).map_err(|e| audio_err("read_wav", e.to_string()))?)
}

fn decode<R: Read>(mut reader: WavReader<R>) -> Result<Audio> {
    let spec = reader.spec();
    let channels = usize::from(spec.channels);
    if channels == 0 {
        return Err(audio_err("read_wav", "0 channels"));
    }
    let interleaved: Vec<f32> = match (spec.sample_format, spec.bits_per_sample) {
        (SampleFormat::Float, 32) => collect(reader.samples::<f32>(), |x| x)?,
        (SampleFormat::Int, bits @ 1..=32) => {
            let scale = 1.0 / f64::from(1u32 << (bits - 1)) as f32;
            collect(reader.samples::<i32>(), |x| x as f32 * scale)?
        }
        (format, bits) => {
            return Err(audio_err(
                "read_wav",
                format!(
                    "unsupported sample format {format:?} with {bits} bits: need PCM ≤ 32-bit or 32-bit float"
                ),
            ));
        }
    };
    if interleaved.len() < channels {
        return Err(audio_err("read_wav", "0 samples: need ≥ 1 frame of audio"));
    }
    let samples = interleaved
        .chunks_exact(channels)
        .map(|frame| frame.iter().sum::<f32>() / channels as f32)
        .collect();
    Ok(Audio { samples, sample_rate: spec.sample_rate })
}

fn collect<S, I: Iterator<Item = hound::Result<S>>>(
    it: I,
    f: impl Fn(S) -> f32,
) -> Result<Vec<f32>> {
    it.map(|s| s.map(&f).map_err(|e| audio_err("read_wav", format!("decoding samples: {e}"))))
        .collect()
}
