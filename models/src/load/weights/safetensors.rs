//! Hugging Face safetensors checkpoints: one `model.safetensors` or shards listed by
//! `model.safetensors.index.json`. Each file is read into memory (a memory map would alias
//! a file another process may rewrite, which safe code cannot rule out), its header parsed
//! and validated once by the `safetensors` crate, and tensors are copied out (converted to
//! the compute dtype) only when the model asks for them. f32, f16 and bf16 are accepted.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};

use safetensors::tensor::{Dtype, Metadata, SafeTensors};
use tch::{Kind, Tensor};

use super::{WeightSource, tensor_from_bytes};
use crate::error::{Error, Result};

/// Size of the little-endian header-length prefix of a safetensors file.
const LEN_PREFIX: usize = 8;

struct Shard {
    path: PathBuf,
    bytes: Vec<u8>,
    header_len: usize,
    meta: Metadata,
}

/// Tensors of one or more safetensors files, held in memory.
pub struct SafetensorsSource {
    shards: Vec<Shard>,
    by_name: HashMap<String, usize>,
}

impl SafetensorsSource {
    /// Opens a checkpoint directory: `model.safetensors.index.json` if present, else
    /// `model.safetensors`.
    ///
    /// # Errors
    /// [`Error::Io`] if neither file exists or a shard cannot be read;
    /// [`Error::Safetensors`] for an invalid header or an index that names a tensor its
    /// shard does not contain; [`Error::Json`] for a malformed index.
    pub fn open_dir(dir: &Path) -> Result<Self> {
        let index = dir.join("model.safetensors.index.json");
        if index.is_file() {
            Self::open_index(&index)
        } else {
            Self::open_files(&[dir.join("model.safetensors")])
        }
    }

    /// Opens the shards listed in a `model.safetensors.index.json`.
    ///
    /// # Errors
    /// As [`SafetensorsSource::open_dir`].
    pub fn open_index(index: &Path) -> Result<Self> {
        let text = crate::error::read_text_file(index)?;
        let parsed: serde_json::Value = serde_json::from_str(&text)
            .map_err(|source| Error::Json { what: index.display().to_string(), source })?;
        let map = parsed.get("weight_map").and_then(|m| m.as_object()).ok_or_else(|| {
            Error::Safetensors {
                path: index.to_path_buf(),
                reason: "index has no `weight_map` object".into(),
            }
        })?;
        let dir = index.parent().unwrap_or(Path::new("."));
        let mut wanted = HashMap::new();
        for (name, file) in map {
            let file = file.as_str().ok_or_else(|| Error::Safetensors {
                path: index.to_path_buf(),
                reason: format!("weight_map entry `{name}` is not a file name"),
            })?;
            wanted.insert(name.clone(), dir.join(file));
        }
        let files: BTreeSet<&PathBuf> = wanted.values().collect();
        let files: Vec<PathBuf> = files.into_iter().cloned().collect();
        let source = Self::open_files(&files)?;
        source.check_index(&wanted)?;
        Ok(source)
    }

    /// Opens the given files as one checkpoint (a tensor name may appear only once).
    ///
    /// # Errors
    /// As [`SafetensorsSource::open_dir`].
    pub fn open_files(files: &[PathBuf]) -> Result<Self> {
        let mut shards = Vec::with_capacity(files.len());
        let mut by_name = HashMap::new();
        for (i, path) in files.iter().enumerate() {
            let shard = open_shard(path)?;
            for name in shard.meta.tensors().keys() {
                if by_name.insert(name.clone(), i).is_some() {
                    return Err(Error::Safetensors {
                        path: path.clone(),
                        reason: format!("tensor `{name}` appears in more than one shard"),
                    });
                }
            }
            shards.push(shard);
        }
        Ok(Self { shards, by_name })
    }

    fn check_index(&self, wanted: &HashMap<String, PathBuf>) -> Result<()> {
        for (name, path) in wanted {
            let found = self.by_name.get(name).map(|&i| &self.shards[i].path);
            if found != Some(path) {
                return Err(Error::Safetensors {
                    path: path.clone(),
                    reason: format!("index maps `{name}` here but the shard does not contain it"),
                });
            }
        }
        Ok(())
    }

    /// Names of every tensor, sorted.
    pub fn names(&self) -> Vec<&str> {
        let mut names: Vec<&str> = self.by_name.keys().map(String::as_str).collect();
        names.sort_unstable();
        names
    }
}

fn open_shard(path: &Path) -> Result<Shard> {
    let bytes = crate::error::read_file(path)?;
    let (header_len, meta) = SafeTensors::read_metadata(&bytes)
        .map_err(|e| Error::Safetensors { path: path.to_path_buf(), reason: e.to_string() })?;
    Ok(Shard { path: path.to_path_buf(), bytes, header_len, meta })
}

fn torch_kind(dtype: Dtype) -> Option<Kind> {
    match dtype {
        Dtype::F32 => Some(Kind::Float),
        Dtype::F16 => Some(Kind::Half),
        Dtype::BF16 => Some(Kind::BFloat16),
        _ => None,
    }
}

impl WeightSource for SafetensorsSource {
    fn shape(&self, name: &str) -> Option<Vec<usize>> {
        let shard = &self.shards[*self.by_name.get(name)?];
        shard.meta.info(name).map(|i| i.shape.clone())
    }

    fn load(&self, name: &str, kind: Kind) -> Result<Tensor> {
        let missing = || Error::MissingTensor { name: name.to_string() };
        let shard = &self.shards[*self.by_name.get(name).ok_or_else(missing)?];
        let info = shard.meta.info(name).ok_or_else(missing)?;
        let stored = torch_kind(info.dtype).ok_or_else(|| Error::Safetensors {
            path: shard.path.clone(),
            reason: format!(
                "tensor `{name}`: unsupported dtype {:?} (supported: F32, F16, BF16)",
                info.dtype
            ),
        })?;
        let start = LEN_PREFIX + shard.header_len + info.data_offsets.0;
        let end = LEN_PREFIX + shard.header_len + info.data_offsets.1;
        tensor_from_bytes(&shard.bytes[start..end], &info.shape, stored, kind)
    }

    fn describe(&self) -> String {
        match self.shards.as_slice() {
            [one] => format!("safetensors {}", one.path.display()),
            many => format!(
                "safetensors, {} shards in {}",
                many.len(),
                many[0].path.parent().unwrap_or(Path::new(".")).display()
            ),
        }
    }
}
