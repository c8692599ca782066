//! Writes GGUF v3 files: metadata and raw tensor bytes, aligned as the format requires.
//! Used to build test files (valid, truncated, corrupted) and to export small models.

use super::quant::GgmlType;
use super::value::MetaValue;

const ALIGNMENT: usize = 32;

/// Builds a GGUF v3 file in memory.
#[derive(Default)]
pub struct GgufWriter {
    metadata: Vec<(String, MetaValue)>,
    tensors: Vec<(String, Vec<usize>, GgmlType, Vec<u8>)>,
}

impl GgufWriter {
    /// An empty file.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a metadata entry (written in insertion order).
    pub fn metadata(mut self, key: &str, value: MetaValue) -> Self {
        self.metadata.push((key.to_string(), value));
        self
    }

    /// Adds a tensor of row-major `shape` whose data is `bytes` in the layout of `ty`.
    pub fn tensor(mut self, name: &str, shape: &[usize], ty: GgmlType, bytes: Vec<u8>) -> Self {
        self.tensors.push((name.to_string(), shape.to_vec(), ty, bytes));
        self
    }

    /// Adds an F32 tensor.
    pub fn tensor_f32(self, name: &str, shape: &[usize], values: &[f32]) -> Self {
        let bytes = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.tensor(name, shape, GgmlType::F32, bytes)
    }

    /// The encoded file.
    ///
    /// # Examples
    /// ```
    /// use models::load::gguf::{GgufFile, GgufWriter, MetaValue};
    /// let bytes = GgufWriter::new()
    ///     .metadata("general.architecture", MetaValue::String("llama".into()))
    ///     .tensor_f32("t", &[2, 2], &[1.0, 2.0, 3.0, 4.0])
    ///     .to_bytes();
    /// let file = GgufFile::from_bytes(bytes).unwrap();
    /// assert_eq!(file.dequantize("t").unwrap(), (vec![1.0, 2.0, 3.0, 4.0], vec![2, 2]));
    /// ```
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = b"GGUF".to_vec();
        out.extend(3u32.to_le_bytes());
        out.extend((self.tensors.len() as u64).to_le_bytes());
        out.extend((self.metadata.len() as u64).to_le_bytes());
        for (key, value) in &self.metadata {
            put_string(&mut out, key);
            out.extend(type_tag(value).to_le_bytes());
            put_value(&mut out, value);
        }
        let mut offset = 0usize;
        for (name, shape, ty, bytes) in &self.tensors {
            put_string(&mut out, name);
            out.extend((shape.len() as u32).to_le_bytes());
            for &d in shape.iter().rev() {
                out.extend((d as u64).to_le_bytes());
            }
            out.extend(ty.id().to_le_bytes());
            out.extend((offset as u64).to_le_bytes());
            offset += bytes.len().div_ceil(ALIGNMENT) * ALIGNMENT;
        }
        for (_, _, _, bytes) in &self.tensors {
            pad(&mut out);
            out.extend(bytes);
        }
        out
    }
}

fn pad(out: &mut Vec<u8>) {
    out.resize(out.len().div_ceil(ALIGNMENT) * ALIGNMENT, 0);
}

fn put_string(out: &mut Vec<u8>, s: &str) {
    out.extend((s.len() as u64).to_le_bytes());
    out.extend(s.as_bytes());
}

fn type_tag(v: &MetaValue) -> u32 {
    match v {
        MetaValue::U8(_) => 0,
        MetaValue::I8(_) => 1,
        MetaValue::U16(_) => 2,
        MetaValue::I16(_) => 3,
        MetaValue::U32(_) => 4,
        MetaValue::I32(_) => 5,
        MetaValue::F32(_) => 6,
        MetaValue::Bool(_) => 7,
        MetaValue::String(_) => 8,
        MetaValue::Array(_) => 9,
        MetaValue::U64(_) => 10,
        MetaValue::I64(_) => 11,
        MetaValue::F64(_) => 12,
    }
}

fn put_value(out: &mut Vec<u8>, v: &MetaValue) {
    match v {
        MetaValue::U8(x) => out.push(*x),
        MetaValue::I8(x) => out.extend(x.to_le_bytes()),
        MetaValue::U16(x) => out.extend(x.to_le_bytes()),
        MetaValue::I16(x) => out.extend(x.to_le_bytes()),
        MetaValue::U32(x) => out.extend(x.to_le_bytes()),
        MetaValue::I32(x) => out.extend(x.to_le_bytes()),
        MetaValue::F32(x) => out.extend(x.to_le_bytes()),
        MetaValue::Bool(x) => out.push(u8::from(*x)),
        MetaValue::String(s) => put_string(out, s),
        MetaValue::Array(items) => {
            // An empty array is written with element type u8.
            out.extend(items.first().map_or(0, type_tag).to_le_bytes());
            out.extend((items.len() as u64).to_le_bytes());
            items.iter().for_each(|i| put_value(out, i));
        }
        MetaValue::U64(x) => out.extend(x.to_le_bytes()),
        MetaValue::I64(x) => out.extend(x.to_le_bytes()),
        MetaValue::F64(x) => out.extend(x.to_le_bytes()),
    }
}
