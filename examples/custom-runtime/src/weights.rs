//! Checkpoint tensors as `f32` in host memory, read with the `safetensors` crate (no
//! libtorch): one `model.safetensors`, or the shards a `model.safetensors.index.json` names.
//! `f16` and `bf16` weights are widened exactly.

use std::collections::{BTreeSet, HashMap};
use std::path::Path;

use half::{bf16, f16};
use safetensors::tensor::{Dtype, SafeTensors};

use crate::error::{Error, Result};

/// Every tensor of a checkpoint, by name: shape and row-major `f32` data.
#[derive(Clone, Debug, Default)]
pub struct Weights {
    tensors: HashMap<String, (Vec<usize>, Vec<f32>)>,
}

fn read(path: &Path) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|source| Error::Io { path: path.to_owned(), source })
}

fn widen(name: &str, dtype: Dtype, bytes: &[u8]) -> Result<Vec<f32>> {
    let words = |n: usize| bytes.chunks_exact(n);
    Ok(match dtype {
        Dtype::F32 => words(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect(),
        Dtype::F16 => words(2).map(|b| f16::from_le_bytes([b[0], b[1]]).to_f32()).collect(),
        Dtype::BF16 => words(2).map(|b| bf16::from_le_bytes([b[0], b[1]]).to_f32()).collect(),
        other => {
            let reason = format!("dtype {other:?} (F32, F16 or BF16 only)");
            return Err(Error::Weight { name: name.to_owned(), reason });
        }
    })
}

impl Weights {
    /// Reads every tensor of the checkpoint in `dir`.
    ///
    /// # Errors
    /// [`Error::Io`], [`Error::Safetensors`], [`Error::Config`] for a malformed index and
    /// [`Error::Weight`] for an unsupported dtype.
    pub fn load(dir: &Path) -> Result<Self> {
        let index = dir.join("model.safetensors.index.json");
        let files: BTreeSet<String> = if index.exists() {
            let text = String::from_utf8_lossy(&read(&index)?).into_owned();
            let v: serde_json::Value = serde_json::from_str(&text)?;
            let map = v["weight_map"]
                .as_object()
                .ok_or_else(|| Error::Unsupported("an index without a weight_map".to_owned()))?;
            map.values().filter_map(|f| f.as_str().map(str::to_owned)).collect()
        } else {
            BTreeSet::from(["model.safetensors".to_owned()])
        };
        let mut weights = Self::default();
        for file in files {
            let bytes = read(&dir.join(&file))?;
            let st = SafeTensors::deserialize(&bytes)?;
            for (name, view) in st.tensors() {
                let data = widen(&name, view.dtype(), view.data())?;
                weights.tensors.insert(name, (view.shape().to_vec(), data));
            }
        }
        Ok(weights)
    }

    /// Whether a tensor is present.
    pub fn contains(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }

    /// Removes and returns tensor `name`, checking its shape.
    ///
    /// # Errors
    /// [`Error::Weight`] if it is missing or has another shape.
    pub fn take(&mut self, name: &str, shape: &[usize]) -> Result<Vec<f32>> {
        let bad = |reason: String| Error::Weight { name: name.to_owned(), reason };
        let (got, data) = self.tensors.remove(name).ok_or_else(|| bad("missing".to_owned()))?;
        if got != shape {
            return Err(bad(format!("shape {got:?}, expected {shape:?}")));
        }
        Ok(data)
    }
}
