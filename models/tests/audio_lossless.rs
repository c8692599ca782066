//! End-to-end decode path of both tiny audio LLMs over ≥ 60 s of real speech.
//!
//! Input: the five 16 kHz LibriVox clips of `~/.cache/kvtide/audio/data/librivox/` (Debian
//! `pocketsphinx-testdata`, 24.7 s together) in `fileids` order, concatenated three times
//! (74.2 s). The clips are short, so this is how the ≥ 60 s input is made.
//!
//! Greedy tokens generated through the dense f32 cache (one token at a time, the decode path
//! `kvtide transcribe --cache full` uses) must equal the arg-max of a single libtorch prefill
//! over the prompt plus those tokens, with logits within 1e-4 — i.e. the cached decode of
//! spliced audio is lossless.
//!
//! The tiered audio cache (WnW §2.3) in its lossless setting ([`AudioTiered::lossless`]:
//! retention 1, every chunk selected, δ = ∞) must give the same greedy tokens as that dense
//! cache over the same 74 s prompt. At r_GPU 0.3 (the tiny models have 4 KV-heads, so one
//! anchor head alone holds 0.25 of the audio KV) it must actually tier: prefill residency at
//! the target, tidal rows offloaded and recalled chunk by chunk as the anchor head's decode
//! attention selects them, fixed heads' unselected rows dropped (r_GPU < r_GPU+CPU < 1).

use std::path::{Path, PathBuf};

use models::audio::tiered::AudioTiered;
use models::audio::transcribe::{Transcription, greedy};
use models::audio::{Audio, AudioLlm, AudioPrompt, read_wav};
use models::cache::{CacheShape, DenseCache, KvCache};
use models::llama::NoObserver;
use tch::{Kind, Tensor};

const CLIPS: [&str; 5] = [
    "sense_and_sensibility_01_austen_64kb-0870",
    "sense_and_sensibility_01_austen_64kb-0880",
    "sense_and_sensibility_01_austen_64kb-0890",
    "sense_and_sensibility_01_austen_64kb-0920",
    "sense_and_sensibility_01_austen_64kb-0930",
];
const NEW_TOKENS: usize = 12;

fn cache_dir() -> PathBuf {
    std::env::var("KVTIDE_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|_| PathBuf::from(std::env::var("HOME").unwrap()).join(".cache/kvtide"))
}

fn long_audio() -> Audio {
    let dir = cache_dir().join("audio/data/librivox");
    let clips: Vec<Audio> =
        CLIPS.iter().map(|c| read_wav(&dir.join(format!("{c}.wav"))).unwrap()).collect();
    let thrice: Vec<Audio> = (0..3).flat_map(|_| clips.iter().cloned()).collect();
    Audio::concat(&thrice).unwrap()
}

/// The tiny checkpoint `name` and its transcription prompt over [`long_audio`].
fn model_and_prompt(name: &str) -> (AudioLlm, AudioPrompt, Audio) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/audio/tiny").join(name);
    let model = AudioLlm::load(&dir).unwrap();
    let audio = long_audio();
    assert!(audio.seconds() >= 60.0, "{} s", audio.seconds());
    let prompt = AudioPrompt::from_samples(&model, &audio.samples).unwrap();
    (model, prompt, audio)
}

fn decode(model: &AudioLlm, prompt: &AudioPrompt, cache: &mut dyn KvCache) -> Transcription {
    greedy(model, prompt, cache, NEW_TOKENS, &[], &mut |_| Ok(())).unwrap()
}

fn stat(stats: &[(&'static str, f64)], key: &str) -> f64 {
    stats.iter().find(|(k, _)| *k == key).map(|&(_, v)| v).unwrap_or_else(|| panic!("no {key}"))
}

/// Logits `[tokens.len(), vocab]` of the cached path: the prefill's last row, then one decode
/// step per token of `tokens` but the last.
fn teacher_forced(
    model: &AudioLlm,
    prompt: &AudioPrompt,
    cache: &mut dyn KvCache,
    tokens: &[u32],
) -> Tensor {
    let mut steps = vec![
        model.prefill(&prompt.ids, &prompt.audio, Some(cache), &mut NoObserver, false).unwrap(),
    ];
    let mut scratch = models::llama::DecodeScratch::new(model.config()).unwrap();
    for (i, &t) in tokens[..tokens.len() - 1].iter().enumerate() {
        steps.push(model.text().decode(t, prompt.ids.len() + i, cache, &mut scratch).unwrap());
    }
    Tensor::cat(&steps, 0)
}

fn max_abs_diff(a: &Tensor, b: &Tensor) -> f64 {
    (a - b).abs().max().to_kind(Kind::Double).double_value(&[])
}

fn check(name: &str) {
    let (model, prompt, audio) = model_and_prompt(name);
    let expected_tokens = (audio.seconds() * model.backbone().tokens_per_second()).floor() as usize;
    let n_audio = prompt.audio_span.len();
    assert!(
        n_audio + 13 >= expected_tokens && n_audio <= expected_tokens + 13,
        "{name}: {n_audio} audio tokens for {:.1} s",
        audio.seconds()
    );
    let mut cache = DenseCache::<f32>::new(CacheShape::of(model.config()).unwrap(), 1).unwrap();
    let out = decode(&model, &prompt, &mut cache);
    let generated = &out.generation.ids;
    assert_eq!(generated.len(), NEW_TOKENS);
    // One libtorch pass over prompt + generated tokens (the last one is not fed back).
    let mut ids = prompt.ids.clone();
    ids.extend(&generated[..generated.len() - 1]);
    let logits = model.prefill(&ids, &prompt.audio, None, &mut NoObserver, true).unwrap();
    let p = prompt.ids.len() as i64;
    let tail = logits.narrow(0, p - 1, NEW_TOKENS as i64);
    let want: Vec<i64> = Vec::try_from(&tail.argmax(1, false)).unwrap();
    let got: Vec<i64> = generated.iter().map(|&t| i64::from(t)).collect();
    assert_eq!(got, want, "{name}: cached greedy tokens differ from a full recompute");
    // Re-run the cached path and compare its per-step logits with the recompute.
    let mut cache = DenseCache::<f32>::new(CacheShape::of(model.config()).unwrap(), 1).unwrap();
    let steps = teacher_forced(&model, &prompt, &mut cache, generated);
    let err = max_abs_diff(&steps, &tail);
    eprintln!(
        "{name}: {:.1} s audio → {n_audio} audio tokens, prompt {p}, {NEW_TOKENS} greedy tokens, max |Δlogit| {err:.2e}",
        audio.seconds()
    );
    assert!(err <= 1e-4, "{name}: decode-path logits differ by {err}");
}

#[test]
fn voxtral_cached_greedy_decode_is_lossless_on_74s_of_speech() {
    check("voxtral");
}

#[test]
fn omni_cached_greedy_decode_is_lossless_on_74s_of_speech() {
    check("qwen2_5_omni_thinker");
}

/// Tiered lossless == dense f32, token for token; the lossy setting really offloads.
fn check_tiered(name: &str) {
    let (model, prompt, _) = model_and_prompt(name);
    let mut dense = DenseCache::<f32>::new(CacheShape::of(model.config()).unwrap(), 1).unwrap();
    let want = decode(&model, &prompt, &mut dense).generation.ids;
    let span = prompt.audio_span.clone();
    let mut lossless = AudioTiered::lossless().cache(&model, span.clone(), 1).unwrap();
    let got = decode(&model, &prompt, lossless.as_mut());
    assert_eq!(got.generation.ids, want, "{name}: tiered lossless differs from the dense cache");
    let end = lossless.stats();
    assert_eq!(stat(&got.stats_after_prefill, "r_gpu"), 1.0, "{name}: lossless prefill r_GPU");
    assert_eq!((stat(&end, "r_gpu"), stat(&end, "r_gpu_cpu")), (1.0, 1.0), "{name}");
    // Per-step logits too (the tiny Omni's greedy output is one repeated token).
    let mut dense = DenseCache::<f32>::new(CacheShape::of(model.config()).unwrap(), 1).unwrap();
    let mut lossless = AudioTiered::lossless().cache(&model, span.clone(), 1).unwrap();
    let err = max_abs_diff(
        &teacher_forced(&model, &prompt, &mut dense, &want),
        &teacher_forced(&model, &prompt, lossless.as_mut(), &want),
    );
    eprintln!("{name}: tiered lossless vs dense over {NEW_TOKENS} steps: max |Δlogit| {err:.2e}");
    assert!(err <= 1e-4, "{name}: tiered lossless logits differ by {err}");
    let lossy = AudioTiered { r_gpu: 0.3, ..AudioTiered::default() };
    let mut tiered = lossy.cache(&model, span, 1).unwrap();
    let out = decode(&model, &prompt, tiered.as_mut());
    assert_eq!(out.generation.ids.len(), NEW_TOKENS);
    let (prefill, end) = (stat(&out.stats_after_prefill, "r_gpu"), tiered.stats());
    let (r_gpu, r_gpu_cpu) = (stat(&end, "r_gpu"), stat(&end, "r_gpu_cpu"));
    eprintln!(
        "{name}: {} audio tokens; r_GPU 0.3 → prefill {prefill:.3}, mean {:.3}, end {r_gpu:.3}, r_GPU+CPU {r_gpu_cpu:.3}, {:.0} B/step, {} recalls; tokens {:?} vs dense {want:?}",
        prompt.audio_span.len(),
        stat(&end, "mean_r_gpu"),
        stat(&end, "h2d_bytes_per_step"),
        stat(&end, "recalls"),
        out.generation.ids,
    );
    assert!((prefill - 0.3).abs() <= 0.01, "{name}: prefill r_GPU {prefill} for target 0.3");
    assert!(r_gpu < r_gpu_cpu && r_gpu_cpu < 1.0, "{name}: {r_gpu} / {r_gpu_cpu}");
    assert!(stat(&end, "recalls") > 0.0, "{name}: the anchor head never recalled a chunk");
    assert!(out.bytes_at_end.offloaded > 0, "{name}: nothing offloaded at r_GPU 0.3");
}

#[test]
fn voxtral_tiered_lossless_equals_dense_on_74s_of_speech() {
    check_tiered("voxtral");
}

#[test]
fn omni_tiered_lossless_equals_dense_on_74s_of_speech() {
    check_tiered("qwen2_5_omni_thinker");
}
