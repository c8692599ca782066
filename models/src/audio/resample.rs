//! Sample-rate conversion for the audio front end: every backbone (WnW §3.1) consumes 16 kHz
//! audio. Uses `rubato`'s synchronous FFT resampler (band-limited, exact rational ratio);
//! the resampler's delay (whole output samples) is trimmed so output sample `i` lines up with
//! input time `i / rate_out` to within half a sample, and the output has
//! `⌈n · rate_out / rate_in⌉` samples.

use rubato::{FftFixedIn, Resampler};

use super::audio_err;
use crate::Result;

/// Input frames per FFT chunk.
const CHUNK: usize = 1024;
/// Sample rates `resample` accepts (Hz): telephone-band 1 kHz up to 768 kHz. The FFT
/// resampler's buffers scale with `rate / gcd(rate_in, rate_out)` (and, below 1 kHz, with
/// `16 kHz / rate`), so a rate read from a hostile file header must be bounded.
pub const SUPPORTED_RATES: std::ops::RangeInclusive<u32> = 1_000..=768_000;

/// Resamples mono `samples` from `rate_in` to `rate_out` Hz.
///
/// # Errors
/// [`crate::Error::Audio`] for a rate outside 1 kHz–768 kHz, empty input, a
/// non-finite sample, or a resampler failure.
///
/// # Examples
/// ```
/// let tone: Vec<f32> = (0..8_000).map(|i| (i as f32 * 0.05).sin()).collect();
/// let up = models::audio::resample(&tone, 8_000, 16_000)?;
/// assert_eq!(up.len(), 16_000);
/// # Ok::<(), models::Error>(())
/// ```
pub fn resample(samples: &[f32], rate_in: u32, rate_out: u32) -> Result<Vec<f32>> {
    const OP: &str = "resample";
    if !SUPPORTED_RATES.contains(&rate_in) || !SUPPORTED_RATES.contains(&rate_out) {
        return Err(audio_err(
            OP,
            format!("rates {rate_in} → {rate_out} Hz: need {SUPPORTED_RATES:?} Hz"),
        ));
    }
    if samples.is_empty() {
        return Err(audio_err(OP, "0 samples: need ≥ 1"));
    }
    // rubato panics on NaN/∞ (its inverse FFT reports them and it unwraps).
    if let Some(i) = samples.iter().position(|x| !x.is_finite()) {
        return Err(audio_err(OP, format!("sample {i} is not finite")));
    }
    if rate_in == rate_out {
        return Ok(samples.to_vec());
    }
    let fail = |e: &dyn std::fmt::Display| audio_err(OP, e.to_string());
    let mut rs = FftFixedIn::<f64>::new(rate_in as usize, rate_out as usize, CHUNK, 2, 1)
        .map_err(|e| fail(&e))?;
    let want =
        (samples.len() as u128 * u128::from(rate_out)).div_ceil(u128::from(rate_in)) as usize;
    let delay = rs.output_delay();
    let input: Vec<f64> = samples.iter().map(|&x| f64::from(x)).collect();
    let mut out: Vec<f64> = Vec::with_capacity(want + delay + rs.output_frames_max());
    let mut pos = 0;
    while out.len() < want + delay {
        let need = rs.input_frames_next();
        let chunk = &input[pos.min(input.len())..(pos + need).min(input.len())];
        let produced = if chunk.len() == need {
            rs.process(&[chunk], None)
        } else if chunk.is_empty() {
            // Flushing the delay line: rubato wants no input buffer at all here.
            rs.process_partial(None::<&[&[f64]]>, None)
        } else {
            rs.process_partial(Some(&[chunk]), None)
        }
        .map_err(|e| fail(&e))?;
        out.extend_from_slice(&produced[0]);
        pos += need;
    }
    Ok(out[delay..delay + want].iter().map(|&x| x as f32).collect())
}
