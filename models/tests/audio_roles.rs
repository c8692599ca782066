//! Head-role calibration of the tiny audio LLMs on real LibriVox speech (`papers/wnw.txt`
//! §2.2, Appendix E Eq. 3–5).
//!
//! * The recorded calibration forward ([`models::llama::Llama::forward_key_offsets`]) of a
//!   calibration sample (prompt + spliced audio + teacher-forced transcript) equals the
//!   inference prefill with zero key offsets, and its autograd gradient with respect to the
//!   span keys is the true derivative of the answer loss: a central finite difference along
//!   the gradient matches `‖∇‖`.
//!
//! The `kvtide calibrate-roles` command over the same clips is tested in the `kvtide` crate.

use std::path::{Path, PathBuf};

use models::audio::{
    AnswerTokens, AudioLlm, MIN_WORD_SCORE, WordAlignment, parse_sphinx_transcripts, read_wav,
};
use models::calibrate::audio::span_sample;
use models::calibrate::roles::SpanSample;
use models::llama::NoObserver;
use tch::{Device, Kind, Tensor};

const CLIPS: [&str; 2] =
    ["sense_and_sensibility_01_austen_64kb-0880", "sense_and_sensibility_01_austen_64kb-0930"];

fn librivox() -> PathBuf {
    let home = std::env::var("KVTIDE_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|_| PathBuf::from(std::env::var("HOME").unwrap()).join(".cache/kvtide"));
    home.join("audio/data/librivox")
}

fn model_dir(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/audio/tiny").join(name)
}

/// The first clip as a calibration sample (uniform-split TEST alignment, byte tokens).
fn sample(model: &AudioLlm) -> SpanSample {
    let dir = librivox();
    let text = std::fs::read_to_string(dir.join("transcription")).unwrap();
    let table = parse_sphinx_transcripts(&text).unwrap();
    let words = &table.iter().find(|(id, _)| id == CLIPS[0]).unwrap().1;
    let audio = read_wav(&dir.join(format!("{}.wav", CLIPS[0]))).unwrap().to_16k().unwrap();
    let alignment = WordAlignment::uniform(words, audio.seconds()).unwrap();
    span_sample(model, &audio.samples, &alignment, AnswerTokens::Bytes, MIN_WORD_SCORE).unwrap()
}

/// Logits of the recorded forward with `offsets` added to the span keys.
fn forward(model: &AudioLlm, s: &SpanSample, offsets: &[Tensor]) -> Tensor {
    let tables = (s.tables.0.shallow_clone(), s.tables.1.shallow_clone());
    model
        .text()
        .forward_key_offsets(&s.embeds, tables, s.span.clone(), offsets, &mut |_, _| Ok(()))
        .unwrap()
}

/// Mean answer-token cross-entropy.
fn loss(s: &SpanSample, logits: &Tensor) -> Tensor {
    let rows = logits.narrow(0, s.answer_start as i64 - 1, s.answer.len() as i64);
    let targets: Vec<i64> = s.answer.iter().map(|&t| i64::from(t)).collect();
    rows.log_softmax(-1, Kind::Float)
        .gather(1, &Tensor::from_slice(&targets).unsqueeze(1), false)
        .neg()
        .mean(Kind::Float)
}

fn scalar(t: &Tensor) -> f64 {
    t.to_kind(Kind::Double).double_value(&[])
}

fn check_gradient(name: &str) {
    let model = AudioLlm::load(&model_dir(name)).unwrap();
    let s = sample(&model);
    let cfg = model.config();
    let shape = [cfg.kv_heads as i64, s.span.len() as i64, cfg.head_dim as i64];
    let zeros = || -> Vec<Tensor> {
        (0..cfg.num_layers)
            .map(|_| Tensor::zeros(shape, (Kind::Float, Device::Cpu)).set_requires_grad(true))
            .collect()
    };
    // Zero offsets: the inference prefill of the same ids and audio.
    let offsets = zeros();
    let logits = forward(&model, &s, &offsets);
    let mut fed = model.transcription_prompt(s.span.len()).0;
    fed.extend(&s.answer[..s.answer.len() - 1]);
    let audio = s.embeds.narrow(0, s.span.start as i64, s.span.len() as i64);
    let plain = model.prefill(&fed, &audio, None, &mut NoObserver, true).unwrap();
    let same = scalar(&(&logits.detach() - &plain).abs().max());
    assert!(same <= 1e-4, "{name}: calibration forward differs from prefill by {same}");
    // Autograd vs a central finite difference along the gradient of the last layer's keys.
    let l0 = tch::with_grad(|| loss(&s, &logits));
    let last = cfg.num_layers - 1;
    let grads = Tensor::run_backward(&[&l0], &offsets, false, false);
    let norm = scalar(&grads[last].norm());
    assert!(norm > 0.0, "{name}: zero gradient");
    let eps = 1e-2 / norm;
    let at = |sign: f64| {
        let mut o = zeros();
        o[last] = &grads[last] * (sign * eps / norm);
        let _g = tch::no_grad_guard();
        scalar(&loss(&s, &forward(&model, &s, &o)))
    };
    let fd = (at(1.0) - at(-1.0)) / (2.0 * eps);
    eprintln!("{name}: ‖∂L/∂K_span‖ {norm:.4e}, finite difference {fd:.4e}, prefill Δ {same:.1e}");
    assert!((fd - norm).abs() <= 0.02 * norm, "{name}: autograd {norm} vs finite difference {fd}");
}

#[test]
fn voxtral_key_gradients_match_finite_differences() {
    check_gradient("voxtral");
}

#[test]
fn omni_key_gradients_match_finite_differences() {
    check_gradient("qwen2_5_omni_thinker");
}
