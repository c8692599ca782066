//! Whisper log-mel spectrogram, computed exactly as `transformers`' `WhisperFeatureExtractor`
//! (the front end of Voxtral and Qwen2.5-Omni-thinker; WnW §3.1 backbones):
//!
//! 1. the 16 kHz signal is zero-padded to a whole number of 30 s windows (480 000 samples);
//! 2. centred STFT: reflect-padding of `n_fft / 2` samples at both ends, periodic Hann window of
//!    `n_fft = 400`, hop 160, one-sided power spectrum `|X_k|²` (201 bins);
//! 3. Slaney-normalised triangular mel filters on the Slaney mel scale, 0–8 kHz, 80 or 128 bins;
//! 4. `log10(max(mel, 1e-10))`, the last STFT frame dropped (3000 frames per window);
//! 5. dynamic-range clamp at `max − 8` (max over the whole padded input), then `(x + 4) / 4`.
//!
//! Long audio is computed as one continuous spectrogram over all padded windows and then split
//! into consecutive 3000-frame windows, which is what Voxtral's processor does
//! (`pad_to_multiple_of = 480000`, then a reshape); for a single window it is exactly the
//! Whisper extractor. All arithmetic is `f64`; the result is `f32`.

use std::sync::Arc;

use realfft::num_complex::Complex;
use realfft::{RealFftPlanner, RealToComplex};

use super::audio_err;
use crate::Result;

/// Audio sample rate every model front end expects (Hz).
pub const SAMPLE_RATE: u32 = 16_000;
/// STFT size.
pub const N_FFT: usize = 400;
/// STFT hop (10 ms at 16 kHz).
pub const HOP: usize = 160;
/// Samples per 30 s window.
pub const WINDOW_SAMPLES: usize = 30 * SAMPLE_RATE as usize;
/// Mel frames per 30 s window.
pub const WINDOW_FRAMES: usize = WINDOW_SAMPLES / HOP;
/// Floor applied before `log10`.
const MEL_FLOOR: f64 = 1e-10;
/// Dynamic range kept below the maximum, in log10 units.
const DYNAMIC_RANGE: f64 = 8.0;

/// Hz → mel on the Slaney scale (linear below 1 kHz, logarithmic above).
pub fn hz_to_mel_slaney(hz: f64) -> f64 {
    let linear = 3.0 * hz / 200.0;
    if hz >= 1000.0 { 15.0 + (hz / 1000.0).ln() * 27.0 / 6.4f64.ln() } else { linear }
}

/// Mel → Hz on the Slaney scale (inverse of [`hz_to_mel_slaney`]).
pub fn mel_to_hz_slaney(mel: f64) -> f64 {
    if mel >= 15.0 { 1000.0 * (6.4f64.ln() / 27.0 * (mel - 15.0)).exp() } else { 200.0 * mel / 3.0 }
}

/// Slaney-normalised triangular mel filters, `n_mels × (n_fft / 2 + 1)` row-major
/// (row = mel bin), spanning `0..=f_max` Hz — `transformers.audio_utils.mel_filter_bank` with
/// `norm = "slaney"`, `mel_scale = "slaney"`.
///
/// # Errors
/// [`crate::Error::Audio`] if `n_mels == 0`, `n_fft < 2` or `f_max` is not in `(0, sample_rate / 2]`.
///
/// # Examples
/// ```
/// let f = models::audio::mel::mel_filters(80, 400, 16_000, 8_000.0)?;
/// assert_eq!(f.len(), 80 * 201);
/// assert!(f.iter().all(|&w| w >= 0.0));
/// # Ok::<(), models::Error>(())
/// ```
pub fn mel_filters(n_mels: usize, n_fft: usize, sample_rate: u32, f_max: f64) -> Result<Vec<f64>> {
    let nyquist = f64::from(sample_rate) / 2.0;
    let n_freq = n_fft / 2 + 1;
    // More bins than FFT frequencies would only add empty filters; the bound also keeps a
    // bin count read from a config file from sizing an absurd allocation.
    if n_mels == 0 || n_mels > n_freq || n_fft < 2 || !(f_max > 0.0 && f_max <= nyquist) {
        return Err(audio_err(
            "mel_filters",
            format!(
                "n_mels {n_mels}, n_fft {n_fft}, f_max {f_max}: need 1 ≤ n_mels ≤ n_fft/2 + 1 = {n_freq}, n_fft ≥ 2, 0 < f_max ≤ {nyquist}"
            ),
        ));
    }
    let mel_max = hz_to_mel_slaney(f_max);
    let centres: Vec<f64> = (0..n_mels + 2)
        .map(|i| mel_to_hz_slaney(mel_max * i as f64 / (n_mels + 1) as f64))
        .collect();
    // `np.linspace(0, sample_rate // 2, n_freq)`.
    let half = f64::from(sample_rate / 2);
    let fft_freqs: Vec<f64> = (0..n_freq).map(|k| half * k as f64 / (n_freq - 1) as f64).collect();
    let mut out = vec![0.0; n_mels * n_freq];
    for m in 0..n_mels {
        let (lo, mid, hi) = (centres[m], centres[m + 1], centres[m + 2]);
        let enorm = 2.0 / (hi - lo);
        for (k, &f) in fft_freqs.iter().enumerate() {
            let down = (f - lo) / (mid - lo);
            let up = (hi - f) / (hi - mid);
            out[m * n_freq + k] = down.min(up).max(0.0) * enorm;
        }
    }
    Ok(out)
}

/// Periodic Hann window of length `n` (`torch.hann_window(n)`).
pub fn hann_window(n: usize) -> Vec<f64> {
    (0..n).map(|i| 0.5 - 0.5 * (2.0 * std::f64::consts::PI * i as f64 / n as f64).cos()).collect()
}

/// Log-mel features of one input: one continuous `n_mels × frames` spectrogram (row = mel
/// bin), `frames` a whole number of 30 s windows.
#[derive(Clone, Debug, PartialEq)]
pub struct LogMel {
    n_mels: usize,
    frames: usize,
    samples: usize,
    floor: f32,
    data: Vec<f32>,
}

impl LogMel {
    /// Mel bins per frame.
    pub fn n_mels(&self) -> usize {
        self.n_mels
    }
    /// Frames computed (`30 s windows × 3000`).
    pub fn frames(&self) -> usize {
        self.frames
    }
    /// Number of 30 s windows.
    pub fn windows(&self) -> usize {
        self.frames / WINDOW_FRAMES
    }
    /// Input length in samples (before padding).
    pub fn samples(&self) -> usize {
        self.samples
    }
    /// Frames that cover real audio (`⌈samples / hop⌉`, the length of Whisper's attention
    /// mask); the rest is padding.
    pub fn valid_frames(&self) -> usize {
        self.samples.div_ceil(HOP)
    }
    /// The scaled clamp floor `(max − 8 + 4) / 4`: the value of every silent padding frame.
    pub fn floor(&self) -> f32 {
        self.floor
    }
    /// All features, `n_mels × frames` row-major.
    pub fn data(&self) -> &[f32] {
        &self.data
    }
    /// The first `frames` frames (`n_mels × frames` row-major); frames past the computed ones
    /// are the padding value [`floor`](Self::floor).
    pub fn leading(&self, frames: usize) -> Vec<f32> {
        let mut out = vec![self.floor; self.n_mels * frames];
        let keep = frames.min(self.frames);
        for m in 0..self.n_mels {
            let src = &self.data[m * self.frames..m * self.frames + keep];
            out[m * frames..m * frames + keep].copy_from_slice(src);
        }
        out
    }
    /// Consecutive windows of `window_frames` frames covering every valid frame
    /// (`⌈valid_frames / window_frames⌉` windows, `windows × n_mels × window_frames` row-major),
    /// the last padded with [`floor`](Self::floor). With `window_frames = 3000` this is
    /// exactly Voxtral's processor output (30 s windows).
    ///
    /// # Panics
    /// If `window_frames == 0`.
    pub fn split_windows(&self, window_frames: usize) -> (usize, Vec<f32>) {
        assert!(window_frames > 0, "window_frames must be ≥ 1");
        let n = self.valid_frames().div_ceil(window_frames);
        let flat = self.leading(n * window_frames);
        let total = n * window_frames;
        let mut out = Vec::with_capacity(flat.len());
        for w in 0..n {
            for m in 0..self.n_mels {
                let row = m * total + w * window_frames;
                out.extend_from_slice(&flat[row..row + window_frames]);
            }
        }
        (n, out)
    }
}

/// Whisper log-mel extractor with precomputed filters, window and FFT plan.
#[derive(Clone)]
pub struct LogMelExtractor {
    n_mels: usize,
    filters: Vec<f64>,
    window: Vec<f64>,
    fft: Arc<dyn RealToComplex<f64>>,
}

impl std::fmt::Debug for LogMelExtractor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogMelExtractor").field("n_mels", &self.n_mels).finish_non_exhaustive()
    }
}

impl LogMelExtractor {
    /// An extractor with `n_mels` bins (80 for Whisper v2, 128 for Voxtral and Qwen2.5-Omni).
    ///
    /// # Errors
    /// [`crate::Error::Audio`] if `n_mels == 0`.
    pub fn new(n_mels: usize) -> Result<Self> {
        let filters = mel_filters(n_mels, N_FFT, SAMPLE_RATE, 8000.0)?;
        let fft = RealFftPlanner::<f64>::new().plan_fft_forward(N_FFT);
        Ok(Self { n_mels, filters, window: hann_window(N_FFT), fft })
    }

    /// Mel bins per frame.
    pub fn n_mels(&self) -> usize {
        self.n_mels
    }

    /// Log-mel features of 16 kHz mono `samples`, padded to whole 30 s windows.
    ///
    /// # Errors
    /// [`crate::Error::Audio`] for empty input or non-finite samples.
    ///
    /// # Examples
    /// ```
    /// use models::audio::mel::{LogMelExtractor, WINDOW_FRAMES};
    /// let tone: Vec<f32> = (0..16_000).map(|i| (i as f32 * 0.1).sin()).collect();
    /// let mel = LogMelExtractor::new(80)?.compute(&tone)?;
    /// assert_eq!((mel.windows(), mel.data().len()), (1, 80 * WINDOW_FRAMES));
    /// assert_eq!(mel.valid_frames(), 100);
    /// # Ok::<(), models::Error>(())
    /// ```
    pub fn compute(&self, samples: &[f32]) -> Result<LogMel> {
        if samples.is_empty() {
            return Err(audio_err("LogMelExtractor::compute", "0 samples: need ≥ 1"));
        }
        if let Some(i) = samples.iter().position(|x| !x.is_finite()) {
            return Err(audio_err("LogMelExtractor::compute", format!("sample {i} is not finite")));
        }
        let frames = samples.len().div_ceil(WINDOW_SAMPLES) * WINDOW_FRAMES;
        let log = self.log_mel_frames(samples, frames * HOP, frames);
        let max = log.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let floor = max - DYNAMIC_RANGE;
        let scale = |x: f64| ((x.max(floor) + 4.0) / 4.0) as f32;
        let mut data = vec![0.0f32; self.n_mels * frames];
        for (t, frame) in log.chunks_exact(self.n_mels).enumerate() {
            for (m, &x) in frame.iter().enumerate() {
                data[m * frames + t] = scale(x);
            }
        }
        Ok(LogMel {
            n_mels: self.n_mels,
            frames,
            samples: samples.len(),
            floor: scale(floor),
            data,
        })
    }

    /// `log10(max(mel, 1e-10))` for the first `frames` centred STFT frames of `samples`
    /// zero-padded to `padded` samples; frame-major (`frames × n_mels`).
    fn log_mel_frames(&self, samples: &[f32], padded: usize, frames: usize) -> Vec<f64> {
        let n_freq = N_FFT / 2 + 1;
        let mut input = self.fft.make_input_vec();
        let mut spectrum = self.fft.make_output_vec();
        let mut scratch = self.fft.make_scratch_vec();
        let mut power = vec![0.0f64; n_freq];
        let silent = MEL_FLOOR.log10();
        let mut out = vec![silent; frames * self.n_mels];
        // Frames whose window lies wholly in the zero padding are silent: skip their FFTs.
        let last_live = (samples.len() + N_FFT / 2).div_ceil(HOP).min(frames);
        for t in 0..last_live {
            let start = (t * HOP) as isize - (N_FFT / 2) as isize;
            for (i, slot) in input.iter_mut().enumerate() {
                let j = reflect(start + i as isize, padded);
                *slot = samples.get(j).map_or(0.0, |&x| f64::from(x)) * self.window[i];
            }
            self.fft
                .process_with_scratch(&mut input, &mut spectrum, &mut scratch)
                .expect("buffers come from the plan, so their lengths match");
            power_spectrum(&spectrum, &mut power);
            let row = &mut out[t * self.n_mels..(t + 1) * self.n_mels];
            for (m, slot) in row.iter_mut().enumerate() {
                let w = &self.filters[m * n_freq..(m + 1) * n_freq];
                let e: f64 = w.iter().zip(&power).map(|(a, b)| a * b).sum();
                *slot = e.max(MEL_FLOOR).log10();
            }
        }
        out
    }
}

/// `|X_k|²` of a one-sided spectrum.
fn power_spectrum(spectrum: &[Complex<f64>], power: &mut [f64]) {
    for (p, c) in power.iter_mut().zip(spectrum) {
        *p = c.norm_sqr();
    }
}

/// numpy/torch `reflect` padding index for position `i` of a signal of length `n`
/// (the edge sample is not repeated). Valid for `-n < i < 2n - 1`.
fn reflect(i: isize, n: usize) -> usize {
    let n = n as isize;
    let j = if i < 0 {
        -i
    } else if i >= n {
        2 * (n - 1) - i
    } else {
        i
    };
    j as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slaney_scale_round_trips_and_is_continuous_at_1khz() {
        for hz in [0.0, 200.0, 999.0, 1000.0, 4000.0, 8000.0] {
            assert!((mel_to_hz_slaney(hz_to_mel_slaney(hz)) - hz).abs() < 1e-9);
        }
        assert!((hz_to_mel_slaney(1000.0) - 15.0).abs() < 1e-12);
    }

    #[test]
    fn reflect_matches_numpy() {
        let n = 5;
        let got: Vec<usize> = (-3..8).map(|i| reflect(i, n)).collect();
        assert_eq!(got, [3, 2, 1, 0, 1, 2, 3, 4, 3, 2, 1]);
    }

    /// Regression found by fuzzing `config.json`: a bin count read from a
    /// config (`num_mel_bins`) of `usize::MAX` overflowed `n_mels + 2` (a panic); absurd
    /// counts sized huge filter banks.
    #[test]
    fn more_bins_than_fft_frequencies_is_an_error() {
        assert!(mel_filters(201, N_FFT, SAMPLE_RATE, 8000.0).is_ok());
        for n_mels in [202, 1 << 40, usize::MAX] {
            assert!(mel_filters(n_mels, N_FFT, SAMPLE_RATE, 8000.0).is_err(), "{n_mels}");
            assert!(LogMelExtractor::new(n_mels).is_err(), "{n_mels}");
        }
    }

    #[test]
    fn hann_is_periodic() {
        let w = hann_window(400);
        assert_eq!(w[0], 0.0);
        assert!((w[200] - 1.0).abs() < 1e-15);
        assert!((w[100] - w[300]).abs() < 1e-12);
    }
}
