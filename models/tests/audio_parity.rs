//! Audio-LLM parity with `transformers` 5.24 on the tiny random checkpoints in
//! fixtures/audio/tiny (scripts/fixtures/gen_audio.py): Voxtral's Whisper encoder and
//! projector, Qwen2.5-Omni-thinker's chunked audio encoder, and both models' logits with the
//! audio spliced into the decoder (Omni also with non-trivial M-RoPE position rows) — all
//! ≤ 1e-4 max abs in f32.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use models::audio::{
    AudioLlm, Backbone, OmniAudio, OmniAudioConfig, VoxtralAudio, VoxtralAudioConfig,
};
use models::llama::NoObserver;
use models::load::weights::{SafetensorsSource, Weights};
use tch::{Kind, Tensor};

const TOL: f64 = 1e-4;

fn tiny(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/audio/tiny").join(name)
}

fn reference(name: &str) -> HashMap<String, Tensor> {
    Tensor::read_safetensors(tiny(&format!("{name}.reference.safetensors")))
        .unwrap()
        .into_iter()
        .collect()
}

fn config(name: &str) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(tiny(name).join("config.json")).unwrap()).unwrap()
}

fn max_abs(a: &Tensor, b: &Tensor) -> f64 {
    assert_eq!(a.size(), b.size());
    (a.to_kind(Kind::Double) - b.to_kind(Kind::Double)).abs().max().double_value(&[])
}

#[test]
fn voxtral_encoder_and_projector_match_transformers() {
    let cfg = config("voxtral");
    let src = SafetensorsSource::open_dir(&tiny("voxtral")).unwrap();
    let w = Weights::new(&src, Kind::Float);
    let acfg = VoxtralAudioConfig::from_json(&cfg["audio_config"]).unwrap();
    let audio = VoxtralAudio::load(&w, acfg, 64).unwrap();
    let r = reference("voxtral");
    let mel = &r["input_features"];
    let enc = audio.encode(mel).unwrap();
    let e1 = max_abs(&enc, &r["audio_encoder_out"]);
    let emb = audio.embed(mel).unwrap();
    let e2 = max_abs(&emb, &r["audio_embeds"]);
    eprintln!("voxtral: encoder max abs {e1:.2e}, projector max abs {e2:.2e}");
    assert!(e1 <= TOL && e2 <= TOL);
    assert!(audio.encode(&mel.narrow(2, 0, 95)).is_err(), "a short window must be rejected");
}

#[test]
fn omni_audio_encoder_matches_transformers() {
    let cfg = config("qwen2_5_omni_thinker");
    let src = SafetensorsSource::open_dir(&tiny("qwen2_5_omni_thinker")).unwrap();
    let w = Weights::new(&src, Kind::Float);
    let acfg = OmniAudioConfig::from_json(&cfg["audio_config"]).unwrap();
    let audio = OmniAudio::load(&w, acfg).unwrap();
    let r = reference("qwen2_5_omni_thinker");
    let feats = &r["input_features"];
    let mask = &r["feature_attention_mask"];
    let mut outs = Vec::new();
    for i in 0..2 {
        let valid = mask.get(i).sum(Kind::Int64).int64_value(&[]);
        let mel = feats.get(i).narrow(1, 0, valid);
        let e = audio.embed(&mel).unwrap();
        assert_eq!(e.size()[0] as usize, OmniAudioConfig::tokens_for_frames(valid as usize));
        outs.push(e);
    }
    let err = max_abs(&Tensor::cat(&outs, 0), &r["audio_features"]);
    eprintln!("omni audio tower: max abs {err:.2e}");
    assert!(err <= TOL);
}

fn ids(r: &HashMap<String, Tensor>) -> Vec<u32> {
    Vec::<i64>::try_from(&r["input_ids"]).unwrap().into_iter().map(|x| x as u32).collect()
}

#[test]
fn voxtral_logits_match_transformers() {
    let model = AudioLlm::load(&tiny("voxtral")).unwrap();
    assert_eq!(model.backbone(), Backbone::Voxtral);
    let r = reference("voxtral");
    let audio = model.audio_embeds_from_features(&r["input_features"]).unwrap();
    let logits = model.prefill(&ids(&r), &audio, None, &mut NoObserver, true).unwrap();
    let err = max_abs(&logits, &r["logits"]);
    eprintln!("voxtral logits: max abs {err:.2e}");
    assert!(err <= TOL);
    // One placeholder too many is an error, not a silent mis-splice.
    let mut bad = ids(&r);
    bad.push(24);
    assert!(model.prefill(&bad, &audio, None, &mut NoObserver, true).is_err());
}

#[test]
fn omni_thinker_logits_match_transformers_with_plain_and_custom_mrope_positions() {
    let model = AudioLlm::load(&tiny("qwen2_5_omni_thinker")).unwrap();
    assert_eq!(model.backbone(), Backbone::Omni);
    let r = reference("qwen2_5_omni_thinker");
    let mask = &r["feature_attention_mask"];
    let audio: Vec<Tensor> = (0..2)
        .map(|i| {
            let valid = mask.get(i).sum(Kind::Int64).int64_value(&[]);
            model
                .audio_embeds_from_features(&r["input_features"].get(i).narrow(1, 0, valid))
                .unwrap()
        })
        .collect();
    let audio = Tensor::cat(&audio, 0);
    let ids = ids(&r);
    let logits = model.prefill(&ids, &audio, None, &mut NoObserver, true).unwrap();
    let err = max_abs(&logits, &r["logits"]);
    let h = model.splice(&ids, &audio).unwrap();
    let sections = model.mrope_sections().unwrap();
    let tables = model.mrope_tables(&r["custom_position_ids"], &sections).unwrap();
    let custom = model.text().prefill_embeds(&h, tables, None, &mut NoObserver, true).unwrap();
    let err_custom = max_abs(&custom, &r["logits_custom_positions"]);
    eprintln!("omni logits: max abs {err:.2e}; custom M-RoPE positions: {err_custom:.2e}");
    assert!(err <= TOL && err_custom <= TOL);
}
