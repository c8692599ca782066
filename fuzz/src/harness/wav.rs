//! Fuzz harness for WAV input (`models::audio::read_wav_from`, via `hound`) and the front
//! end a reader's output goes through next: resampling to 16 kHz (`Audio::to_16k`) and the
//! Whisper log-mel (`LogMelExtractor::compute`).
//!
//! Oracle: bytes either give a typed error, or mono audio with ≥ 1 sample; resampling it
//! either fails with a typed error or gives the
//! documented `⌈n · 16000 / rate⌉` samples; the log-mel of those samples (when finite) has
//! 80 bins and finite values. Any panic, abort or UB is a bug.

use std::io::Cursor;

use hound::{SampleFormat, WavSpec, WavWriter};
use models::audio::{Audio, LogMelExtractor, read_wav_from};

/// Longest resampled signal the harness runs the log-mel on (1 s) — keeps inputs fast.
const MEL_LIMIT: usize = 16_000;

/// Parses `data` and, if it is accepted, runs it through the front end.
pub fn check(data: &[u8]) {
    match read_wav_from(Cursor::new(data)) {
        Ok(audio) => exercise(&audio),
        Err(e) => assert!(!e.to_string().is_empty()),
    }
}

fn exercise(audio: &Audio) {
    assert!(!audio.samples.is_empty());
    let Ok(at16k) = audio.to_16k() else { return };
    let n = audio.samples.len() as u128;
    let want = (n * 16_000).div_ceil(u128::from(audio.sample_rate));
    assert_eq!(at16k.samples.len() as u128, want, "resampled length");
    let head = &at16k.samples[..at16k.samples.len().min(MEL_LIMIT)];
    if head.iter().all(|x| x.is_finite()) {
        let mel = LogMelExtractor::new(80).expect("80 bins").compute(head).expect("finite audio");
        assert!(mel.data().iter().all(|x| x.is_finite()));
    }
}

fn wav<S: hound::Sample + Copy>(
    channels: u16,
    rate: u32,
    bits: u16,
    float: bool,
    samples: &[S],
) -> Vec<u8> {
    let spec = WavSpec {
        channels,
        sample_rate: rate,
        bits_per_sample: bits,
        sample_format: if float { SampleFormat::Float } else { SampleFormat::Int },
    };
    let mut out = Cursor::new(Vec::new());
    let mut w = WavWriter::new(&mut out, spec).expect("wav header");
    for &s in samples {
        w.write_sample(s).expect("sample");
    }
    w.finalize().expect("finalize");
    out.into_inner()
}

/// A short deterministic waveform of `n` samples in `[-amp, amp]`.
fn tone(n: usize, amp: f32) -> Vec<f32> {
    (0..n).map(|i| (i as f32 * 0.3).sin() * amp).collect()
}

/// Valid files: 16 kHz mono (16-bit), stereo 8 kHz (8-bit), 44.1 kHz 24-bit, 48 kHz 32-bit
/// float with three channels, 22.05 kHz 32-bit int, and a one-sample file.
pub fn seeds() -> Vec<Vec<u8>> {
    let i16s: Vec<i16> = tone(400, 20_000.0).iter().map(|&x| x as i16).collect();
    let i8s: Vec<i8> = tone(200, 100.0).iter().map(|&x| x as i8).collect();
    let i24s: Vec<i32> = tone(300, 4_000_000.0).iter().map(|&x| x as i32).collect();
    let i32s: Vec<i32> = tone(220, 1.0e9).iter().map(|&x| x as i32).collect();
    vec![
        wav(1, 16_000, 16, false, &i16s),
        wav(2, 8_000, 8, false, &i8s),
        wav(1, 44_100, 24, false, &i24s),
        wav(3, 48_000, 32, true, &tone(480, 0.8)),
        wav(1, 22_050, 32, false, &i32s),
        wav(1, 16_000, 16, false, &[123i16]),
    ]
}
