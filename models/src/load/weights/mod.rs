//! Where weights come from. A [`WeightSource`] serves tensors by their Hugging Face name
//! (`model.layers.0.self_attn.q_proj.weight`) whatever the file format — safetensors
//! (single or sharded) or GGUF (renamed and de-quantised on the fly) — and [`Weights`]
//! checks each one's shape against the configuration before converting it to the
//! compute dtype, so a wrong checkpoint fails with the tensor's name and both shapes.

mod safetensors;

pub use self::safetensors::SafetensorsSource;

use tch::{Kind, Tensor};

use crate::error::{Error, Result, TorchOp};

/// A checkpoint's tensors, addressed by Hugging Face names.
pub trait WeightSource: Send + Sync {
    /// The row-major shape of `name`, or `None` if the checkpoint lacks it.
    fn shape(&self, name: &str) -> Option<Vec<usize>>;

    /// Loads `name` as a contiguous CPU tensor of `kind`.
    ///
    /// # Errors
    /// [`Error::MissingTensor`] if absent; format errors (unsupported dtype, corrupt data).
    fn load(&self, name: &str, kind: Kind) -> Result<Tensor>;

    /// One line naming the source (path and format) for messages.
    fn describe(&self) -> String;
}

/// Shape-checked access to a [`WeightSource`], converting to one compute dtype.
#[derive(Clone, Copy)]
pub struct Weights<'a> {
    src: &'a dyn WeightSource,
    kind: Kind,
}

impl<'a> Weights<'a> {
    /// Wraps `src`; every tensor is returned as `kind` (f32 for parity and calibration).
    pub fn new(src: &'a dyn WeightSource, kind: Kind) -> Self {
        Self { src, kind }
    }

    /// The compute dtype.
    pub fn kind(&self) -> Kind {
        self.kind
    }

    /// Loads `name`, which must have exactly `shape`.
    ///
    /// # Errors
    /// [`Error::MissingTensor`] or [`Error::TensorShape`]; the source's load errors.
    pub fn get(&self, name: &str, shape: &[usize]) -> Result<Tensor> {
        self.get_opt(name, shape)?.ok_or_else(|| Error::MissingTensor { name: name.to_string() })
    }

    /// Loads `name` if present (it must then have `shape`).
    ///
    /// # Errors
    /// As [`Weights::get`], except that absence is `Ok(None)`.
    pub fn get_opt(&self, name: &str, shape: &[usize]) -> Result<Option<Tensor>> {
        let Some(got) = self.src.shape(name) else { return Ok(None) };
        if got != shape {
            return Err(Error::TensorShape {
                name: name.to_string(),
                expected: shape.to_vec(),
                got,
            });
        }
        let t = self.src.load(name, self.kind)?;
        let size: Vec<usize> = t.size().iter().map(|&d| d as usize).collect();
        if size != shape {
            return Err(Error::TensorShape {
                name: name.to_string(),
                expected: shape.to_vec(),
                got: size,
            });
        }
        Ok(Some(t))
    }

    /// Whether the checkpoint has `name`.
    pub fn contains(&self, name: &str) -> bool {
        self.src.shape(name).is_some()
    }
}

/// Builds a CPU tensor of `kind` and `shape` from little-endian `bytes` of `stored`.
pub(crate) fn tensor_from_bytes(
    bytes: &[u8],
    shape: &[usize],
    stored: Kind,
    kind: Kind,
) -> Result<Tensor> {
    let numel: usize = shape.iter().product();
    if numel.checked_mul(stored.elt_size_in_bytes()) != Some(bytes.len()) {
        return Err(crate::error::invalid(
            "tensor from bytes",
            format!("{} bytes for {shape:?} of {stored:?}", bytes.len()),
        ));
    }
    let dims: Vec<i64> = shape.iter().map(|&d| d as i64).collect();
    // libtorch copies exactly numel × element-size bytes: the length was checked above.
    Tensor::f_from_data_size(bytes, &dims, stored)
        .op("from_data_size")?
        .f_to_kind(kind)
        .op("to_kind")
}
