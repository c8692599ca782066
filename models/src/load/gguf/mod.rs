//! GGUF, llama.cpp's model format: a hardened parser ([`GgufFile`]), de-quantisation of
//! F32/F16/BF16/Q8_0/Q4_0/Q4_1 tensors at load ([`dequantize`]), the model view that maps
//! GGUF names and metadata onto the Hugging Face ones ([`GgufSource`],
//! [`config_from_gguf`]) and a small writer ([`GgufWriter`]) for tests and exports.

mod cursor;
mod error;
mod file;
mod model;
mod quant;
mod value;
mod writer;

pub use error::GgufError;
pub use file::{GgufFile, TensorInfo};
pub use model::{GgufSource, config_from_gguf};
pub use quant::{BlockQ4_0, BlockQ4_1, BlockQ8_0, GgmlType, QK, dequantize};
pub use value::MetaValue;
pub use writer::GgufWriter;

pub(crate) use model::meta;
