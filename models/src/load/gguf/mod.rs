//! GGUF, llama.cpp's model format: a hardened parser ([`GgufFile`]), de-quantisation of
//! float, 32-element block and K-quant tensors at load ([`dequantize`],
//! [`GgmlType::SUPPORTED`]), the model view that maps
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
pub use quant::{
    BlockQ2K, BlockQ3K, BlockQ4_0, BlockQ4_1, BlockQ4K, BlockQ5_0, BlockQ5_1, BlockQ5K, BlockQ6K,
    BlockQ8_0, BlockQ8K, GgmlType, QK, QK_K, dequantize,
};
pub use value::MetaValue;
pub use writer::GgufWriter;

pub(crate) use model::meta;
