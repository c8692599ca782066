//! Rows of the bad-input catalogue (`docs/bad-inputs.md`) that cross crates or had
//! no test of their own: missing `config.json` fields, WAV at other rates and 0-length or
//! non-finite audio through the front end, and a projection file for another model handed
//! to the SWAN cache builder. Every other row names its test in the crate it belongs to.

use std::io::Cursor;
use std::path::PathBuf;

use models::audio::{Audio, LogMelExtractor, read_wav_from};
use models::cache::spec::CacheSpec;
use models::{Checkpoint, Error, ModelConfig};
use projection::{ModelDims, ProjectionSet};

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../fixtures")
}

/// The fields a Llama/Qwen2 `config.json` cannot do without.
const REQUIRED: [&str; 6] = [
    "model_type",
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
];

/// Removing any one key of a real config either leaves a valid config (an optional key with
/// a documented default) or gives a typed error naming that key; the required ones fail.
#[test]
fn missing_config_fields_name_the_field() {
    let text = std::fs::read_to_string(fixtures().join("tiny/llama-gqa/config.json")).unwrap();
    let full: serde_json::Value = serde_json::from_str(&text).unwrap();
    let keys: Vec<String> = full.as_object().unwrap().keys().cloned().collect();
    for key in &keys {
        let mut doc = full.clone();
        doc.as_object_mut().unwrap().remove(key);
        match ModelConfig::from_hf_json(&doc.to_string()) {
            Ok(cfg) => {
                assert!(!REQUIRED.contains(&key.as_str()), "accepted a config without `{key}`");
                cfg.validate().unwrap();
            }
            Err(e) => {
                let typed = matches!(e, Error::Config { .. } | Error::Json { .. })
                    || matches!(e, Error::UnsupportedArchitecture { .. });
                assert!(typed, "without `{key}`: {e:?}");
                assert!(e.to_string().contains(key.as_str()), "without `{key}`: {e}");
            }
        }
    }
    for key in REQUIRED {
        let mut doc = full.clone();
        doc.as_object_mut().unwrap().remove(key);
        assert!(ModelConfig::from_hf_json(&doc.to_string()).is_err(), "without `{key}`");
    }
}

fn wav_i16(rate: u32, samples: &[i16]) -> Vec<u8> {
    let spec = hound::WavSpec {
        channels: 1,
        sample_rate: rate,
        bits_per_sample: 16,
        sample_format: hound::SampleFormat::Int,
    };
    let mut out = Cursor::new(Vec::new());
    let mut w = hound::WavWriter::new(&mut out, spec).unwrap();
    samples.iter().for_each(|&s| w.write_sample(s).unwrap());
    w.finalize().unwrap();
    out.into_inner()
}

fn wav_f32(rate: u32, samples: &[f32]) -> Vec<u8> {
    let spec = hound::WavSpec {
        channels: 1,
        sample_rate: rate,
        bits_per_sample: 32,
        sample_format: hound::SampleFormat::Float,
    };
    let mut out = Cursor::new(Vec::new());
    let mut w = hound::WavWriter::new(&mut out, spec).unwrap();
    samples.iter().for_each(|&s| w.write_sample(s).unwrap());
    w.finalize().unwrap();
    out.into_inner()
}

fn audio_err(r: models::Result<impl std::fmt::Debug>, needle: &str) {
    match r {
        Err(e @ Error::Audio { .. }) => assert!(e.to_string().contains(needle), "{e}"),
        other => panic!("expected an audio error containing {needle:?}, got {other:?}"),
    }
}

/// A WAV at a rate other than 16 kHz is not an error: the front end resamples it to the
/// 16 kHz every backbone consumes. A rate the resampler cannot bound (a hostile header) is.
#[test]
fn non_16k_wav_is_resampled_and_absurd_rates_are_typed() {
    let tone: Vec<i16> = (0..4410).map(|i| ((i as f32 * 0.05).sin() * 8000.0) as i16).collect();
    for (rate, want) in [(8_000u32, 8_820usize), (44_100, 1_600), (22_050, 3_200), (48_000, 1_470)]
    {
        let audio = read_wav_from(Cursor::new(wav_i16(rate, &tone))).unwrap();
        assert_eq!(audio.sample_rate, rate);
        let at16k = audio.to_16k().unwrap();
        assert_eq!((at16k.sample_rate, at16k.samples.len()), (16_000, want), "{rate} Hz");
    }
    let mut refused_by_resampler = 0;
    for rate in [1u32, 999, 768_001, u32::MAX] {
        // Patched into a valid header (hound's writer itself refuses such rates).
        let mut bytes = wav_i16(16_000, &tone[..64]);
        bytes[24..28].copy_from_slice(&rate.to_le_bytes());
        bytes[28..32].copy_from_slice(&rate.wrapping_mul(2).to_le_bytes());
        let audio = read_wav_from(Cursor::new(bytes));
        // hound may refuse the header itself; if it is read, resampling refuses the rate.
        if let Ok(audio) = audio {
            audio_err(audio.to_16k(), "Hz");
            refused_by_resampler += 1;
        }
    }
    assert!(refused_by_resampler >= 2, "the resampler's rate check was reached");
}

/// 0-length audio is an error at every stage: the WAV reader, the resampler, the log-mel.
#[test]
fn zero_length_audio_is_typed_everywhere() {
    audio_err(read_wav_from(Cursor::new(wav_i16(16_000, &[]))), "0 samples");
    audio_err(read_wav_from(Cursor::new(wav_i16(8_000, &[]))), "0 samples");
    let empty = Audio { samples: Vec::new(), sample_rate: 8_000 };
    audio_err(empty.to_16k(), "0 samples");
    audio_err(LogMelExtractor::new(80).unwrap().compute(&[]), "0 samples");
    audio_err(read_wav_from(Cursor::new(Vec::new())), "");
}

/// NaN/∞ samples (32-bit float WAV) are read as they are and refused by the next stage,
/// with the sample index in the message.
#[test]
fn non_finite_audio_is_typed() {
    let mut samples = vec![0.25f32; 100];
    samples[37] = f32::NAN;
    samples[60] = f32::INFINITY;
    let at16k = read_wav_from(Cursor::new(wav_f32(16_000, &samples))).unwrap();
    audio_err(LogMelExtractor::new(80).unwrap().compute(&at16k.samples), "sample 37");
    let at8k = read_wav_from(Cursor::new(wav_f32(8_000, &samples))).unwrap();
    audio_err(at8k.to_16k(), "sample 37");
}

/// A projection file calibrated for another model (other dims or name) is refused by the
/// SWAN cache builder with a typed error naming the file — never applied to the wrong heads.
#[test]
fn projection_for_another_model_is_refused_by_the_cache_builder() {
    let ckpt = Checkpoint::load(&fixtures().join("tiny/llama-gqa")).unwrap();
    let cfg = ckpt.model.config().clone();
    let dir = tempfile::tempdir().unwrap();
    let others = [
        (ModelDims::new(cfg.num_layers + 1, cfg.q_heads, cfg.kv_heads, cfg.head_dim), "layers"),
        (ModelDims::new(cfg.num_layers, cfg.q_heads, cfg.q_heads, cfg.head_dim), "kv"),
        (ModelDims::new(cfg.num_layers, cfg.q_heads, cfg.kv_heads, cfg.head_dim * 2), "dim"),
    ];
    for (i, (dims, what)) in others.into_iter().enumerate() {
        let set = ProjectionSet::random(dims.unwrap(), "another-model", 3).unwrap();
        let path = dir.path().join(format!("other-{i}.safetensors"));
        std::fs::write(&path, set.to_bytes().unwrap()).unwrap();
        let spec: CacheSpec = format!("swan:k=4,proj={}", path.display()).parse().unwrap();
        match spec.build(&ckpt.model) {
            Err(e @ Error::CacheSpec { .. }) => {
                assert!(e.to_string().contains(&path.display().to_string()), "{what}: {e}");
            }
            Err(e) => panic!("{what}: untyped {e:?}"),
            Ok(_) => panic!("{what}: a projection for another model was accepted"),
        }
    }
}
