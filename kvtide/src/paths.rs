//! The fixed cache layout `scripts/setup.sh` fills: `$KVTIDE_CACHE` (default
//! `~/.cache/kvtide`) with `models/SmolLM2-135M-Instruct.Q4_1.gguf` and
//! `text/plays/*.md`. The CLI's defaults and the real-model tests read from here.

use std::path::PathBuf;

/// File name of the default model.
pub const DEFAULT_MODEL: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

/// File name of the Gemma 3 270M model (`scripts/setup.sh gemma`).
pub const GEMMA_MODEL: &str = "gemma-3-270m-q4_k_m.gguf";

/// Play used when no text is given.
pub const DEFAULT_PLAY: &str = "hamlet.md";

/// `$KVTIDE_CACHE`, or `~/.cache/kvtide`.
pub fn cache_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("KVTIDE_CACHE").filter(|d| !d.is_empty()) {
        return PathBuf::from(dir);
    }
    let home = std::env::var_os("HOME").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("."));
    home.join(".cache").join("kvtide")
}

/// The default model file.
pub fn default_model() -> PathBuf {
    cache_dir().join("models").join(DEFAULT_MODEL)
}

/// The Gemma 3 270M model file (present once `scripts/setup.sh gemma` ran).
pub fn gemma_model() -> PathBuf {
    cache_dir().join("models").join(GEMMA_MODEL)
}

/// The directory of Shakespeare plays (markdown).
pub fn plays_dir() -> PathBuf {
    cache_dir().join("text").join("plays")
}

/// The default play.
pub fn default_play() -> PathBuf {
    plays_dir().join(DEFAULT_PLAY)
}

/// Where `kvtide calibrate` writes (and `swan` caches look for) a model's projection set:
/// `$KVTIDE_CACHE/projections/<model>.safetensors`, the name made file-system safe.
pub fn projection_file(model: &str) -> PathBuf {
    let safe: String = model
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || "-_.".contains(c) { c } else { '_' })
        .collect();
    cache_dir().join("projections").join(format!("{safe}.safetensors"))
}
