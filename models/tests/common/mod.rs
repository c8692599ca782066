//! Helpers shared by the models integration tests: fixture paths and reference tensors.
#![allow(dead_code)]

use std::collections::HashMap;
use std::path::PathBuf;

use safetensors::SafeTensors;
use safetensors::tensor::Dtype;
use tch::Tensor;

/// `fixtures/` at the workspace root.
pub fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../fixtures")
}

/// The kvtide cache directory `scripts/setup.sh` fills (`$KVTIDE_CACHE`, default
/// `~/.cache/kvtide`).
pub fn kvtide_cache() -> PathBuf {
    match std::env::var_os("KVTIDE_CACHE").filter(|d| !d.is_empty()) {
        Some(dir) => PathBuf::from(dir),
        None => PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| ".".into()))
            .join(".cache/kvtide"),
    }
}

/// The SmolLM2-135M-Instruct GGUF of the cache directory.
pub fn default_model() -> PathBuf {
    kvtide_cache().join("models/SmolLM2-135M-Instruct.Q4_1.gguf")
}

/// The Gemma 3 270M Q4_K_M GGUF of the cache directory (`scripts/setup.sh gemma`).
pub fn gemma_model() -> PathBuf {
    kvtide_cache().join("models/gemma-3-270m-q4_k_m.gguf")
}

/// FNV-1a 64 of `bytes` (the fixture generators hash token ids and tensors the same way).
pub fn fnv1a64(bytes: impl IntoIterator<Item = u8>) -> u64 {
    bytes
        .into_iter()
        .fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
}

/// The Shakespeare plays of the cache directory.
pub fn plays_dir() -> PathBuf {
    kvtide_cache().join("text/plays")
}

/// Every tensor of a reference safetensors file, as f32 / i64 libtorch tensors.
pub fn read_reference(path: &std::path::Path) -> HashMap<String, Tensor> {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    let st = SafeTensors::deserialize(&bytes).unwrap();
    st.iter()
        .map(|(name, view)| {
            let shape: Vec<i64> = view.shape().iter().map(|&d| d as i64).collect();
            let kind = match view.dtype() {
                Dtype::F32 => tch::Kind::Float,
                Dtype::I64 => tch::Kind::Int64,
                other => panic!("{name}: unexpected dtype {other:?}"),
            };
            (name.to_string(), Tensor::from_data_size(view.data(), &shape, kind))
        })
        .collect()
}

/// A JSON document from the fixtures.
pub fn read_json(path: &std::path::Path) -> serde_json::Value {
    let text =
        std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap()
}

/// Integer array at `key` of a JSON object, as token ids.
pub fn ids(v: &serde_json::Value, key: &str) -> Vec<u32> {
    v[key]
        .as_array()
        .unwrap_or_else(|| panic!("no array `{key}`"))
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

/// Largest absolute difference between two tensors of the same shape.
pub fn max_abs(a: &Tensor, b: &Tensor) -> f64 {
    assert_eq!(a.size(), b.size(), "shapes differ");
    (a - b).abs().max().double_value(&[])
}

/// A SWAN projection calibrated on `ids` (windows of 48 tokens) for `ckpt`'s model and saved
/// as `tiny.projection.safetensors` in `dir`: the set and the file's path.
pub fn calibrated_projection(
    ckpt: &models::Checkpoint,
    ids: &[u32],
    dir: &std::path::Path,
) -> (projection::ProjectionSet, PathBuf) {
    let windows = models::calibrate::swan::windows(ids, 48, ids.len());
    let (set, _) = models::calibrate::swan::calibrate(
        &ckpt.model,
        &windows,
        projection::CalibrationConfig::default(),
        &mut |_| (),
    )
    .unwrap();
    let path = dir.join("tiny.projection.safetensors");
    set.save(&path).unwrap();
    (set, path)
}
