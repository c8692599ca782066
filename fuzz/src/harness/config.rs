//! Fuzz harness for Hugging Face `config.json` files: the decoder config
//! (`ModelConfig::from_hf_json`) and the audio encoders' `audio_config`
//! (`VoxtralAudioConfig::from_json`, `OmniAudioConfig::from_json`).
//!
//! Oracle: text either gives a typed error, or a config that passes `validate()` with a
//! whole GQA group and an even head_dim; an accepted audio config gives window sizes and a
//! mel extractor for its bin count without panicking. Any panic, abort or UB is a bug.

use models::ModelConfig;
use models::audio::{LogMelExtractor, OmniAudioConfig, VoxtralAudioConfig};
use serde_json::Value;

/// Parses `data` (as UTF-8 text, as `from_hf_file` reads it) with every config parser.
pub fn check(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else { return };
    match ModelConfig::from_hf_json(text) {
        Ok(cfg) => {
            cfg.validate().expect("an accepted config validates");
            assert!(cfg.group_size() >= 1 && cfg.head_dim % 2 == 0);
        }
        Err(e) => assert!(!e.to_string().is_empty()),
    }
    let Ok(json) = serde_json::from_str::<Value>(text) else { return };
    if let Some(text_config) = json.get("text_config")
        && let Ok(cfg) = ModelConfig::from_hf_json(&text_config.to_string())
    {
        cfg.validate().expect("an accepted text_config validates");
    }
    let audio = json.get("audio_config").unwrap_or(&json);
    if let Ok(cfg) = VoxtralAudioConfig::from_json(audio) {
        let _ = (cfg.window_frames(), cfg.tokens_per_window());
        mel_extractor(cfg.dims.n_mels);
    }
    if let Ok(cfg) = OmniAudioConfig::from_json(audio) {
        let _ = OmniAudioConfig::tokens_for_frames(cfg.max_source_positions);
        mel_extractor(cfg.dims.n_mels);
    }
}

/// What a loader does next with an accepted bin count: build the log-mel front end.
fn mel_extractor(n_mels: usize) {
    if let Ok(mel) = LogMelExtractor::new(n_mels) {
        assert_eq!(mel.n_mels(), n_mels);
    }
}

/// `seed` (a JSON document) with one structured edit ([`super::json::edit`]); `None` if
/// it is not JSON.
pub fn json_mutant(seed: &[u8], at: u64, choice: u64, remove: bool) -> Option<Vec<u8>> {
    let mut doc: Value = serde_json::from_slice(seed).ok()?;
    super::json::edit(&mut doc, at, choice, remove);
    Some(doc.to_string().into_bytes())
}

/// Valid files: the committed tiny checkpoints' configs (Llama MHA/GQA, Llama 3 rope
/// scaling, Qwen2 with and without tied embeddings, Voxtral, Qwen2.5-Omni thinker) and a
/// transformers-5 style `rope_parameters` config with an EOS list.
pub fn seeds() -> Vec<Vec<u8>> {
    let rope_parameters = r#"{"model_type": "mistral", "vocab_size": 64, "hidden_size": 32,
        "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 8, "rms_norm_eps": 1e-6,
        "max_position_embeddings": 128, "sliding_window": 64, "hidden_act": "silu",
        "rope_parameters": {"rope_type": "linear", "rope_theta": 1e6, "factor": 2.0},
        "eos_token_id": [2, 7], "bos_token_id": 1, "tie_word_embeddings": true}"#;
    [
        include_str!("../../../fixtures/tiny/llama-mha/config.json"),
        include_str!("../../../fixtures/tiny/llama-gqa/config.json"),
        include_str!("../../../fixtures/tiny/llama3-rope/config.json"),
        include_str!("../../../fixtures/tiny/qwen2/config.json"),
        include_str!("../../../fixtures/tiny/qwen2-tied/config.json"),
        include_str!("../../../fixtures/audio/tiny/voxtral/config.json"),
        include_str!("../../../fixtures/audio/tiny/qwen2_5_omni_thinker/config.json"),
        rope_parameters,
    ]
    .iter()
    .map(|s| s.as_bytes().to_vec())
    .collect()
}
