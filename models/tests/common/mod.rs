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

/// The kvtide cache directory (`$KVTIDE_CACHE`, default `~/.cache/kvtide`).
pub fn kvtide_cache() -> PathBuf {
    models::paths::cache_dir()
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
