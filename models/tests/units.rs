//! Unit tests of `models`' public helpers (configuration parsing, GGUF block dequantisation,
//! RoPE tables, WAV reading, resampling and log-mel features, word alignments, markdown
//! stripping, tensor hand-over), one module per source file, against the public API only.

mod config {
    use models::load::config::*;
    use models::{Error, Result};

    const BASE: &str = r#""vocab_size": 32, "hidden_size": 16, "intermediate_size": 32,
        "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2,
        "rms_norm_eps": 1e-5, "max_position_embeddings": 64"#;

    fn parse(extra: &str) -> Result<ModelConfig> {
        ModelConfig::from_hf_json(&format!("{{{BASE}, {extra}}}"))
    }

    #[test]
    fn gemma3_config_json_is_refused_and_layer_patterns_validate() {
        let e = parse(r#""model_type": "gemma3_text""#).unwrap_err();
        assert!(matches!(e, Error::Config { .. }) && e.to_string().contains("model_type"), "{e}");
        let mut cfg = parse(r#""model_type": "llama""#).unwrap();
        let rope = RopeConfig { theta: 10_000.0, scaling: RopeScaling::None };
        cfg.local_attention = Some(LocalAttention::periodic(8, rope.clone(), 1, 6));
        cfg.validate().unwrap();
        assert_eq!(cfg.layer_kind(0), LayerKind::Local { window: 8 });
        cfg.local_attention = Some(LocalAttention::periodic(8, rope.clone(), 2, 6));
        assert!(matches!(cfg.validate(), Err(Error::Config { .. })), "2 kinds for 1 layer");
        cfg.local_attention = Some(LocalAttention::periodic(0, rope, 1, 6));
        assert!(matches!(cfg.validate(), Err(Error::Config { .. })), "window 0");
        cfg.local_attention = None;
        cfg.query_scale = Some(f64::NAN);
        assert!(matches!(cfg.validate(), Err(Error::Config { .. })), "NaN query scale");
    }

    #[test]
    fn transformers5_rope_parameters_and_llama3_scaling() {
        let cfg = parse(
            r#""model_type": "llama", "rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0,
            "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192}"#,
        )
        .unwrap();
        assert_eq!(cfg.rope.theta, 500000.0);
        assert!(matches!(cfg.rope.scaling, RopeScaling::Llama3 { factor, .. } if factor == 8.0));
        assert_eq!(cfg.head_dim, 4);
    }

    #[test]
    fn qwen2_has_qkv_bias_and_ignores_unused_sliding_window() {
        let cfg = parse(r#""model_type": "qwen2", "sliding_window": 4096, "use_sliding_window": false, "eos_token_id": [2, 3]"#)
            .unwrap();
        assert!(cfg.qkv_bias && !cfg.o_bias);
        assert_eq!(cfg.sliding_window, None);
        assert_eq!(cfg.eos_token_ids, vec![2, 3]);
    }

    #[test]
    fn bad_values_are_typed_errors() {
        assert!(matches!(
            parse(r#""model_type": "gpt2""#),
            Err(Error::UnsupportedArchitecture { .. })
        ));
        let text = format!(
            "{{{}, \"model_type\": \"llama\"}}",
            BASE.replace("\"num_key_value_heads\": 2", "\"num_key_value_heads\": 3")
        );
        let e = ModelConfig::from_hf_json(&text);
        assert!(
            matches!(e, Err(Error::Config { ref field, .. }) if field == "num_key_value_heads")
        );
        let e = parse(r#""model_type": "llama", "rope_scaling": {"type": "yarn", "factor": 2.0}"#);
        assert!(matches!(e, Err(Error::Config { .. })));
        let e = parse(r#""model_type": "llama", "hidden_act": "gelu""#);
        assert!(matches!(e, Err(Error::Config { ref field, .. }) if field == "hidden_act"));
        assert!(matches!(ModelConfig::from_hf_json("{"), Err(Error::Json { .. })));
    }
}

mod wav {
    use hound::SampleFormat;
    use models::Error;
    use models::audio::*;
    use std::io::Cursor;
    use std::path::Path;

    fn wav_bytes<S: hound::Sample + Copy>(spec: hound::WavSpec, samples: &[S]) -> Vec<u8> {
        let mut bytes = Cursor::new(Vec::new());
        let mut w = hound::WavWriter::new(&mut bytes, spec).unwrap();
        for &s in samples {
            w.write_sample(s).unwrap();
        }
        w.finalize().unwrap();
        bytes.into_inner()
    }

    fn spec(channels: u16, bits: u16, format: SampleFormat) -> hound::WavSpec {
        hound::WavSpec {
            channels,
            sample_rate: 16_000,
            bits_per_sample: bits,
            sample_format: format,
        }
    }

    #[test]
    fn every_int_width_and_float_downmix_to_the_same_mono_signal() {
        let a = read_wav_from(Cursor::new(wav_bytes(spec(1, 8, SampleFormat::Int), &[64i8, -32])))
            .unwrap();
        assert_eq!(a.samples, [0.5, -0.25]);
        let b = read_wav_from(Cursor::new(wav_bytes(
            spec(1, 24, SampleFormat::Int),
            &[1 << 22, -(1 << 21)],
        )))
        .unwrap();
        assert_eq!(b.samples, [0.5, -0.25]);
        let c = read_wav_from(Cursor::new(wav_bytes(
            spec(3, 32, SampleFormat::Float),
            &[0.5f32, 0.5, 0.5, 0.0, -0.75, 0.0],
        )))
        .unwrap();
        assert_eq!(c.samples, [0.5, -0.25]);
    }

    #[test]
    fn empty_and_garbage_inputs_are_typed_errors() {
        let empty = wav_bytes::<i16>(spec(1, 16, SampleFormat::Int), &[]);
        let err = read_wav_from(Cursor::new(empty)).unwrap_err();
        assert!(err.to_string().contains("0 samples"), "{err}");
        let err = read_wav_from(Cursor::new(b"RIFF\x04\0\0\0WAVEjunk".to_vec())).unwrap_err();
        assert!(matches!(err, Error::Audio { .. }));
        let missing = read_wav(Path::new("/nonexistent/x.wav")).unwrap_err();
        assert!(missing.to_string().contains("/nonexistent/x.wav"));
    }

    #[test]
    fn concat_checks_rates() {
        let a = Audio { samples: vec![0.1], sample_rate: 16_000 };
        let b = Audio { samples: vec![0.2], sample_rate: 8_000 };
        assert!(Audio::concat(&[a.clone(), b]).is_err());
        assert_eq!(Audio::concat(&[a.clone(), a]).unwrap().samples, [0.1, 0.1]);
        assert!(Audio::concat(&[]).is_err());
    }
}

mod resample {
    use models::audio::*;

    fn tone(rate: u32, hz: f64, n: usize) -> Vec<f32> {
        (0..n)
            .map(|i| (2.0 * std::f64::consts::PI * hz * i as f64 / f64::from(rate)).sin() as f32)
            .collect()
    }

    #[test]
    fn a_tone_survives_resampling_within_half_a_sample() {
        for rate in [8_000u32, 22_050, 44_100, 48_000] {
            let n = rate as usize; // one second
            let out = resample(&tone(rate, 440.0, n), rate, 16_000).unwrap();
            assert_eq!(out.len(), 16_000, "rate {rate}");
            let want = tone(16_000, 440.0, 16_000);
            // Away from the edges the band-limited resampler reproduces the tone; the reported
            // delay is whole output samples, so a sub-sample lag (≤ 1/2 sample, i.e.
            // ≤ 2π·440/16000/2 ≈ 0.086 in amplitude) may remain.
            let mid = 2000..14000;
            let err = out[mid.clone()]
                .iter()
                .zip(&want[mid.clone()])
                .map(|(a, b)| (a - b).abs())
                .fold(0.0, f32::max);
            assert!(err < 0.087, "rate {rate}: max error {err}");
            let rms = |x: &[f32]| (x.iter().map(|v| v * v).sum::<f32>() / x.len() as f32).sqrt();
            let gain = rms(&out[mid.clone()]) / rms(&want[mid]);
            assert!((gain - 1.0).abs() < 5e-3, "rate {rate}: gain {gain}");
        }
    }

    #[test]
    fn bad_rates_and_empty_input_are_errors() {
        assert!(resample(&[0.0], 0, 16_000).is_err());
        assert!(resample(&[], 8_000, 16_000).is_err());
        assert_eq!(resample(&[0.5], 16_000, 16_000).unwrap(), [0.5]);
    }

    /// Regressions found by fuzzing WAV input: a NaN/∞ sample made rubato
    /// panic (it unwraps its inverse FFT's "non-zero imaginary part" report), and a header
    /// rate like 4 294 967 295 Hz sized FFT buffers of tens of GB.
    #[test]
    fn non_finite_samples_and_absurd_rates_are_errors() {
        for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            let e = resample(&[0.1, bad, 0.2], 8_000, 16_000).unwrap_err();
            assert!(e.to_string().contains("not finite"), "{e}");
        }
        for rate in [1, 999, 768_001, u32::MAX] {
            assert!(resample(&[0.0; 4], rate, 16_000).is_err(), "{rate}");
            assert!(resample(&[0.0; 4], 16_000, rate).is_err(), "{rate}");
        }
        assert_eq!(resample(&[0.0; 1000], 1_000, 16_000).unwrap().len(), 16_000);
    }
}

mod align {
    use models::audio::*;

    #[test]
    fn uniform_split_covers_the_clip_in_order() {
        let a = WordAlignment::uniform("and mister john dashwood had then", 3.3).unwrap();
        assert_eq!(a.method, UNIFORM_SPLIT);
        assert_eq!(a.transcript(), "and mister john dashwood had then");
        assert_eq!(a.words[0].start, 0.0);
        assert!((a.words.last().unwrap().end - 3.3).abs() < 1e-12);
        assert!(a.words.windows(2).all(|w| w[0].end < w[1].start));
        // Constant rate: each word's duration is proportional to its length.
        let rate = |w: &WordSpan| (w.end - w.start) / w.word.len() as f64;
        assert!(a.words.iter().all(|w| (rate(w) - rate(&a.words[0])).abs() < 1e-12));
    }

    #[test]
    fn concat_shifts_later_clips() {
        let a = WordAlignment::uniform("x", 1.0).unwrap();
        let b = WordAlignment::uniform("y z", 2.0).unwrap();
        let c = WordAlignment::concat(&[(a, 1.5), (b, 2.0)]).unwrap();
        assert_eq!(c.transcript(), "x y z");
        assert_eq!((c.words[1].start, c.words[2].end), (1.5, 3.5));
        assert_eq!(c.method, UNIFORM_SPLIT);
    }

    #[test]
    fn whisperx_word_segments_and_bad_input() {
        let a = WordAlignment::from_json(
            r#"{"word_segments":[{"word":"so","start":0.0,"end":0.2,"score":0.5},{"word":"it","start":0.3,"end":0.6,"score":0.9}]}"#,
        )
        .unwrap();
        let ans = align_answer(&a, AnswerTokens::Bytes, 10.0, 100, MIN_WORD_SCORE).unwrap();
        // "so" is below the confidence floor; " it" is three bytes on [3, 6).
        assert_eq!(ans.spans, [None, None, Some(3..6), Some(3..6), Some(3..6)]);
        for bad in [
            r#"{"words":[]}"#,
            r#"{"words":[{"word":" ","start":0,"end":1}]}"#,
            r#"{"words":[{"word":"a","start":-1,"end":1}]}"#,
            r#"{"words":[{"word":"a","start":0,"end":1,"score":1.5}]}"#,
            r#"{"words":[{"word":"a","start":0}]}"#,
        ] {
            assert!(WordAlignment::from_json(bad).is_err(), "{bad}");
        }
        let late = WordAlignment::uniform("a", 20.0).unwrap();
        let shifted = WordAlignment::concat(&[(late.clone(), 20.0), (late, 20.0)]).unwrap();
        assert!(align_answer(&shifted, AnswerTokens::Bytes, 1.0, 15, 0.85).is_err());
        assert!(parse_sphinx_transcripts("<s> no id </s>").is_err());
    }
}

mod quant {
    use half::{bf16, f16};
    use models::Error;
    use models::load::gguf::*;

    fn f16_bytes(x: f32) -> [u8; 2] {
        f16::from_f32(x).to_le_bytes()
    }

    #[test]
    fn q4_0_hand_block() {
        // d = 0.25; byte j holds low nibble j % 16 and high nibble 15 − j % 16.
        let mut b = f16_bytes(0.25).to_vec();
        b.extend((0..16u8).map(|j| j | ((15 - j) << 4)));
        let mut out = [0f32; 32];
        dequantize("q", GgmlType::Q4_0, &b, &mut out).unwrap();
        for j in 0..16 {
            assert_eq!(out[j], (j as f32 - 8.0) * 0.25, "low nibble {j}");
            assert_eq!(out[j + 16], ((15 - j) as f32 - 8.0) * 0.25, "high nibble {j}");
        }
    }

    #[test]
    fn q4_1_hand_block() {
        // d = 2, m = −3: low nibbles 0..15 → −3, −1, …, 27; high nibbles all 1 → −1.
        let mut b = f16_bytes(2.0).to_vec();
        b.extend(f16_bytes(-3.0));
        b.extend((0..16u8).map(|j| j | (1 << 4)));
        let mut out = [0f32; 32];
        dequantize("q", GgmlType::Q4_1, &b, &mut out).unwrap();
        assert_eq!(&out[..3], &[-3.0, -1.0, 1.0]);
        assert_eq!(out[15], 27.0);
        assert!(out[16..].iter().all(|&x| x == -1.0));
    }

    #[test]
    fn q8_0_two_blocks_signed() {
        let mut b = f16_bytes(0.5).to_vec();
        b.extend((0..32).map(|i| (i as i8 - 16) as u8));
        b.extend(f16_bytes(-1.0));
        b.extend([127u8; 16].iter().chain([0x80u8; 16].iter()));
        let mut out = [0f32; 64];
        dequantize("q", GgmlType::Q8_0, &b, &mut out).unwrap();
        assert_eq!((out[0], out[16], out[31]), (-8.0, 0.0, 7.5));
        assert_eq!((out[32], out[63]), (-127.0, 128.0));
    }

    /// Every supported type against PyPI `gguf`'s dequantisers on the committed random
    /// blocks of `fixtures/gguf_quants` (`scripts/fixtures/gen_gguf_quants.py`). The
    /// comparison is bit-exact: each value is the same f32 products and sums in the same
    /// order as ggml's reference, so there is no rounding to tolerate.
    #[test]
    fn every_supported_type_matches_pypi_gguf_bit_for_bit() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/gguf_quants");
        let manifest: serde_json::Value =
            serde_json::from_slice(&std::fs::read(dir.join("manifest.json")).unwrap()).unwrap();
        let mut seen = Vec::new();
        for entry in manifest["types"].as_array().unwrap() {
            let name = entry["type"].as_str().unwrap();
            let ty = GgmlType::from_name(name).unwrap();
            assert_eq!(u64::from(ty.id()), entry["id"].as_u64().unwrap(), "{name}");
            let blocks = std::fs::read(dir.join(format!("{name}.blocks"))).unwrap();
            let reference: Vec<f32> = std::fs::read(dir.join(format!("{name}.f32")))
                .unwrap()
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
                .collect();
            assert_eq!(reference.len() as u64, entry["elements"].as_u64().unwrap(), "{name}");
            let mut out = vec![f32::NAN; reference.len()];
            dequantize(name, ty, &blocks, &mut out).unwrap();
            for (i, (got, want)) in out.iter().zip(&reference).enumerate() {
                assert!(
                    got.to_bits() == want.to_bits(),
                    "{name} element {i} (block {}): got {got:e}, gguf {want:e}",
                    i as u64 / ty.block_size()
                );
            }
            seen.push(ty);
        }
        seen.sort_by_key(|t| t.id());
        assert_eq!(seen, GgmlType::SUPPORTED, "the fixtures cover exactly the supported types");
    }

    #[test]
    fn truncated_blocks_and_unknown_types_are_typed() {
        for ty in GgmlType::SUPPORTED {
            let n = 2 * ty.block_size() as usize;
            let bytes = vec![0u8; 2 * ty.block_bytes() as usize];
            let mut out = vec![0f32; n];
            dequantize("w", ty, &bytes, &mut out).unwrap();
            assert!(out.iter().all(|&x| x == 0.0), "{ty}: zero blocks give zeros");
            let e = dequantize("w", ty, &bytes[..bytes.len() - 1], &mut out).unwrap_err();
            assert!(matches!(e, Error::InvalidInput { .. }), "{ty}: {e}");
            assert!(e.to_string().contains(ty.name()), "{ty}: {e}");
        }
        let names: Vec<&str> = GgmlType::SUPPORTED.iter().map(|t| t.name()).collect();
        assert_eq!(
            names,
            [
                "F32", "F16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K",
                "Q5_K", "Q6_K", "Q8_K", "BF16"
            ]
        );
        assert_eq!(GgmlType::from_name("Q4_K"), Some(GgmlType::Q4_K));
        assert_eq!(GgmlType::from_name("Q4_X"), None);
        assert_eq!(GgmlType::Q4_K.storage_bytes(512), Some(288));
        assert_eq!(GgmlType::Q6_K.storage_bytes(255), None);
    }

    #[test]
    fn floats_and_errors() {
        let mut out = [0f32; 2];
        let b: Vec<u8> = [1.5f32, -2.0].iter().flat_map(|x| x.to_le_bytes()).collect();
        dequantize("f", GgmlType::F32, &b, &mut out).unwrap();
        assert_eq!(out, [1.5, -2.0]);
        let b: Vec<u8> =
            [0.5f32, 3.0].iter().flat_map(|&x| bf16::from_f32(x).to_le_bytes()).collect();
        dequantize("b", GgmlType::BF16, &b, &mut out).unwrap();
        assert_eq!(out, [0.5, 3.0]);
        let e = dequantize("f", GgmlType::F16, &[0; 3], &mut out).unwrap_err();
        assert!(matches!(e, Error::InvalidInput { .. }));
        let iq2 = GgmlType::from_id(16).unwrap();
        let e = dequantize("k", iq2, &[0; 66], &mut [0f32; 256]).unwrap_err();
        assert!(
            matches!(e, Error::Gguf(GgufError::UnsupportedTensorType { ref dtype, ref tensor }) if dtype == "IQ2_XXS" && tensor == "k"),
            "{e}"
        );
        assert!(e.to_string().contains("IQ2_XXS"), "{e}");
        assert_eq!(GgmlType::from_id(4), None);
        assert_eq!(GgmlType::Q4_1.storage_bytes(33), None);
    }
}

mod rope {
    use models::llama::rope::*;
    use models::{RopeConfig, RopeScaling};
    use tch::Tensor;

    fn rope() -> Rope {
        Rope::new(&RopeConfig { theta: 10_000.0, scaling: RopeScaling::None }, 8)
    }

    #[test]
    fn host_rows_match_tensor_form() {
        let r = rope();
        let x: Vec<f32> = (0..16).map(|i| (i as f32 * 0.37).sin()).collect();
        let (cos, sin) = r.tables(5, 1).unwrap();
        let t = Tensor::from_slice(&x).reshape([1, 2, 8]);
        let want = Vec::<f32>::try_from(r.apply(&t, &cos, &sin).unwrap().flatten(0, -1)).unwrap();
        let mut rows = x.clone();
        r.apply_rows(&mut rows, 5);
        for (a, b) in rows.iter().zip(&want) {
            assert!((a - b).abs() < 1e-6, "{a} vs {b}");
        }
    }

    #[test]
    fn position_zero_is_identity_and_norm_is_kept() {
        let r = rope();
        let x: Vec<f32> = (0..8).map(|i| i as f32 - 3.5).collect();
        let mut rows = x.clone();
        r.apply_rows(&mut rows, 0);
        assert_eq!(rows, x);
        r.apply_rows(&mut rows, 1234);
        let n = |v: &[f32]| v.iter().map(|a| a * a).sum::<f32>();
        assert!((n(&rows) - n(&x)).abs() < 1e-3);
    }

    #[test]
    fn llama3_keeps_high_and_divides_low_frequencies() {
        let cfg = RopeConfig {
            theta: 500_000.0,
            scaling: RopeScaling::Llama3 {
                factor: 8.0,
                low_freq_factor: 1.0,
                high_freq_factor: 4.0,
                original_max_position_embeddings: 8192.0,
            },
        };
        let (plain, scaled) = (
            Rope::new(&RopeConfig { scaling: RopeScaling::None, ..cfg.clone() }, 128),
            Rope::new(&cfg, 128),
        );
        assert_eq!(scaled.inv_freq()[0], plain.inv_freq()[0]);
        let last = plain.inv_freq().len() - 1;
        assert!((scaled.inv_freq()[last] * 8.0 - plain.inv_freq()[last]).abs() < 1e-12);
    }
}

mod mrope {
    use models::audio::mrope::*;
    use tch::Tensor;

    #[test]
    fn equal_rows_are_plain_rope() {
        let (cos, sin) = cos_sin(&audio_text_positions(3, 7), 16, 1e4, &[2, 3, 3]).unwrap();
        for t in 0..7i64 {
            for i in 0..8i64 {
                let a = (t + 3) as f64 * 1e4f64.powf(-2.0 * i as f64 / 16.0);
                assert!((cos.double_value(&[t, i]) - a.cos()).abs() < 1e-5);
                assert!((sin.double_value(&[t, i + 8]) - a.sin()).abs() < 1e-5);
            }
        }
    }

    #[test]
    fn sections_pick_their_rows() {
        let pos = Tensor::from_slice(&[1i64, 2, 3]).view([3, 1]);
        let (cos, _) = cos_sin(&pos, 4, 1e4, &[1, 0, 1]).unwrap();
        // i = 0 from row 0 (pos 1), i = 1 from row 2 (pos 3): inv = [1, 1e-2].
        assert!((cos.double_value(&[0, 0]) - 1f64.cos()).abs() < 1e-6);
        assert!((cos.double_value(&[0, 1]) - 0.03f64.cos()).abs() < 1e-6);
        assert!(cos_sin(&pos, 4, 1e4, &[1, 1, 1]).is_err());
    }
}

mod voxtral {
    use models::audio::voxtral::*;

    /// Regression found by fuzzing `config.json`: `hidden_size = 2^62`
    /// overflowed `4 · hidden_size` (a panic in debug builds, a wrapped comparison in
    /// release); `max_source_positions` near `usize::MAX` overflowed `window_frames`.
    #[test]
    fn overflowing_sizes_are_config_errors() {
        let cfg = |d_model: u64, ffn: u64, positions: u64| {
            serde_json::json!({"num_mel_bins": 80, "hidden_size": d_model,
                "num_hidden_layers": 1, "num_attention_heads": 1, "intermediate_size": ffn,
                "max_source_positions": positions})
        };
        assert!(VoxtralAudioConfig::from_json(&cfg(8, 32, 16)).is_ok());
        assert!(VoxtralAudioConfig::from_json(&cfg(1 << 62, 0, 16)).is_err());
        assert!(VoxtralAudioConfig::from_json(&cfg(8, 32, u64::MAX - 3)).is_err());
    }
}

mod text {
    use models::load::text::*;

    #[test]
    fn stage_direction_on_one_line_and_speaker_rules() {
        let md = "_Exit_\nkept\n**A**\n** not a speaker\n_Enter\nmany\nlines_\nlast\\";
        assert_eq!(strip_markdown(md), "kept ** not a speaker last");
        assert_eq!(strip_markdown("_\nstill stage_\nafter"), "after");
    }
}

mod mel {
    use models::Error;
    use models::audio::mel::*;

    #[test]
    fn silence_is_flat_and_long_audio_splits_into_windows() {
        let ex = LogMelExtractor::new(80).unwrap();
        let mel = ex.compute(&vec![0.0; WINDOW_SAMPLES + 1]).unwrap();
        assert_eq!((mel.windows(), mel.frames()), (2, 2 * WINDOW_FRAMES));
        // All -10 → max − 8 clamp is a no-op, (−10 + 4) / 4 = −1.5 everywhere.
        assert!(mel.data().iter().all(|&x| x == -1.5));
        assert_eq!(mel.valid_frames(), WINDOW_FRAMES + 1);
        let (n, w) = mel.split_windows(WINDOW_FRAMES);
        assert_eq!((n, w.len()), (2, 2 * 80 * WINDOW_FRAMES));
        let (n, w) = mel.split_windows(1000);
        assert_eq!((n, w.len()), (4, 4 * 80 * 1000));
    }

    #[test]
    fn bad_input_is_a_typed_error() {
        let ex = LogMelExtractor::new(128).unwrap();
        assert!(matches!(ex.compute(&[]), Err(Error::Audio { .. })));
        assert!(matches!(ex.compute(&[0.0, f32::NAN]), Err(Error::Audio { .. })));
        assert!(LogMelExtractor::new(0).is_err());
    }
}

mod host {
    use models::llama::host::{f32_slice, to_f32_vec};
    use tch::{Kind, Tensor};

    #[test]
    fn borrow_or_copy_contiguous_f32_only() {
        let t = Tensor::from_slice(&[1f32, 2.0, 3.0]);
        // SAFETY: `t` is not shared and not written while borrowed.
        assert_eq!(unsafe { f32_slice(&t) }.unwrap(), &[1.0, 2.0, 3.0]);
        assert_eq!(to_f32_vec(&t).unwrap(), vec![1.0, 2.0, 3.0]);
        assert!(to_f32_vec(&t.to_kind(Kind::Double)).is_err());
        let strided = Tensor::from_slice(&[1f32, 2.0, 3.0, 4.0]).reshape([2, 2]).tr();
        assert!(to_f32_vec(&strided).is_err());
        // SAFETY: as above.
        assert!(unsafe { f32_slice(&strided) }.is_err());
    }
}
