//! A parsed GGUF file (llama.cpp's format, versions 2 and 3): header, metadata and tensor
//! directory, with the tensor data left in place (memory-mapped or owned bytes).
//!
//! Parsing validates everything before trusting it: magic and version, every count against
//! the bytes left (so no allocation exceeds what the file could encode), duplicate keys and
//! tensor names, dimensions (1–4, non-zero, no overflow, whole blocks along the first
//! axis), the alignment (a power of two) and that every tensor's data lies inside the file.

use std::collections::HashMap;
use std::path::Path;

use memmap2::Mmap;

use super::cursor::Cursor;
use super::error::GgufError;
use super::quant::{GgmlType, dequantize};
use super::value::{MetaValue, read_value};
use crate::error::{Error, Result};

const MAGIC: &[u8; 4] = b"GGUF";
const DEFAULT_ALIGNMENT: u64 = 32;
const MAX_DIMS: u32 = 4;
/// Smallest possible encodings, used to bound counts before allocating.
const MIN_KV_BYTES: u64 = 8 + 4 + 1;
const MIN_TENSOR_INFO_BYTES: u64 = 8 + 4 + 8 + 4 + 8;

/// One tensor's directory entry.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorInfo {
    /// Name in the file (`blk.0.attn_q.weight`).
    pub name: String,
    /// Row-major shape (ggml's `ne` reversed: `[rows, cols]` for a matrix).
    pub shape: Vec<usize>,
    /// Storage type.
    pub ty: GgmlType,
    /// Absolute byte offset of the data in the file.
    pub offset: u64,
    /// Bytes of data.
    pub n_bytes: u64,
}

impl TensorInfo {
    /// Number of elements.
    pub fn n_elements(&self) -> usize {
        self.shape.iter().product()
    }
}

enum Backing {
    Mapped(Mmap),
    Owned(Vec<u8>),
}

impl Backing {
    fn bytes(&self) -> &[u8] {
        match self {
            Self::Mapped(m) => m,
            Self::Owned(v) => v,
        }
    }
}

/// A validated GGUF file.
pub struct GgufFile {
    backing: Backing,
    version: u32,
    metadata: HashMap<String, MetaValue>,
    tensors: Vec<TensorInfo>,
    by_name: HashMap<String, usize>,
}

/// What the header declares, parsed from bytes.
struct Parsed {
    version: u32,
    metadata: HashMap<String, MetaValue>,
    tensors: Vec<TensorInfo>,
}

impl GgufFile {
    /// Reads the file at `path` into memory and parses it (safe; one copy of the file).
    ///
    /// # Errors
    /// [`Error::Io`] if it cannot be read; the parse errors of [`GgufFile::from_bytes`].
    pub fn open(path: &Path) -> Result<Self> {
        Self::from_bytes(crate::error::read_file(path)?)
    }

    /// Memory-maps the file at `path` read-only and parses it, without copying it.
    ///
    /// # Safety
    /// A memory map aliases the file: the file must not be modified or truncated (by this
    /// or any other process) while the returned value, or any slice borrowed from it, is
    /// alive — otherwise reads see changed bytes or fault (`SIGBUS`), which is undefined
    /// behaviour. [`GgufFile::open`] is the safe alternative.
    ///
    /// # Errors
    /// [`Error::Io`] if it cannot be opened or mapped; the parse errors of
    /// [`GgufFile::from_bytes`].
    pub unsafe fn map(path: &Path) -> Result<Self> {
        let io = |op| move |source| Error::Io { op, path: path.to_path_buf(), source };
        let file = std::fs::File::open(path).map_err(io("open"))?;
        // SAFETY: the caller guarantees the file is not modified or truncated while mapped
        // (this function's contract). The map is read-only and owned by the returned value;
        // every slice borrows it, so none outlives the mapping.
        let map = unsafe { Mmap::map(&file) }.map_err(io("map"))?;
        let parsed = parse(&map)?;
        Ok(Self::assemble(Backing::Mapped(map), parsed))
    }

    /// Parses a GGUF file held in memory.
    ///
    /// # Errors
    /// [`GgufError::Truncated`] when a field runs past the end and [`GgufError::Invalid`]
    /// for a bad magic, unsupported version, duplicate key or tensor, bad dimensions or
    /// alignment, unknown type, or data outside the file.
    ///
    /// # Examples
    /// ```
    /// let e = models::load::gguf::GgufFile::from_bytes(b"GGUF".to_vec()).err().unwrap();
    /// use models::{Error, load::gguf::GgufError};
    /// assert!(matches!(e, Error::Gguf(GgufError::Truncated { what: "version", .. })));
    /// ```
    pub fn from_bytes(bytes: Vec<u8>) -> Result<Self> {
        let parsed = parse(&bytes)?;
        Ok(Self::assemble(Backing::Owned(bytes), parsed))
    }

    fn assemble(backing: Backing, p: Parsed) -> Self {
        let by_name = p.tensors.iter().enumerate().map(|(i, t)| (t.name.clone(), i)).collect();
        Self { backing, version: p.version, metadata: p.metadata, tensors: p.tensors, by_name }
    }

    /// Format version (2 or 3).
    pub fn version(&self) -> u32 {
        self.version
    }

    /// All metadata.
    pub fn metadata(&self) -> &HashMap<String, MetaValue> {
        &self.metadata
    }

    /// One metadata value.
    pub fn get(&self, key: &str) -> Option<&MetaValue> {
        self.metadata.get(key)
    }

    /// The tensor directory in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    /// The directory entry of `name`.
    pub fn tensor_info(&self, name: &str) -> Option<&TensorInfo> {
        self.by_name.get(name).map(|&i| &self.tensors[i])
    }

    /// The raw bytes of a tensor (validated to lie inside the file at parse time).
    pub fn tensor_data(&self, info: &TensorInfo) -> &[u8] {
        &self.backing.bytes()[info.offset as usize..(info.offset + info.n_bytes) as usize]
    }

    /// Dequantises tensor `name` to f32, returning the values and the row-major shape.
    ///
    /// # Errors
    /// [`Error::MissingTensor`] if absent, [`GgufError::UnsupportedTensorType`] for a type
    /// outside [`GgmlType::SUPPORTED`].
    pub fn dequantize(&self, name: &str) -> Result<(Vec<f32>, Vec<usize>)> {
        let info = self
            .tensor_info(name)
            .ok_or_else(|| Error::MissingTensor { name: name.to_string() })?;
        if !info.ty.is_supported() {
            return Err(GgufError::UnsupportedTensorType {
                tensor: name.to_string(),
                dtype: info.ty.name().into(),
            }
            .into());
        }
        let mut out = vec![0f32; info.n_elements()];
        dequantize(name, info.ty, self.tensor_data(info), &mut out)?;
        Ok((out, info.shape.clone()))
    }
}

fn invalid(what: &str, offset: usize, reason: impl Into<String>) -> Error {
    GgufError::Invalid { what: what.to_string(), offset: offset as u64, reason: reason.into() }
        .into()
}

/// Checks `count` items of at least `min` bytes each could fit in what remains.
fn bounded_count(c: &Cursor<'_>, count: u64, min: u64, what: &'static str) -> Result<usize> {
    let fits = count.checked_mul(min).is_some_and(|need| need <= c.remaining() as u64);
    if !fits {
        return Err(GgufError::Truncated {
            what,
            offset: c.pos() as u64,
            needed: count.saturating_mul(min),
            available: c.remaining() as u64,
        }
        .into());
    }
    Ok(count as usize)
}

fn parse(bytes: &[u8]) -> Result<Parsed> {
    let mut c = Cursor::new(bytes);
    let magic = c.take(4, "magic")?;
    if magic != MAGIC {
        return Err(invalid("magic", 0, format!("expected \"GGUF\", got {magic:?}")));
    }
    let version = c.u32("version")?;
    if !(2..=3).contains(&version) {
        return Err(invalid("version", 4, format!("version {version} is not supported (2 or 3)")));
    }
    let n_tensors = c.u64("tensor count")?;
    let n_meta = c.u64("metadata count")?;
    let n_meta = bounded_count(&c, n_meta, MIN_KV_BYTES, "metadata entries")?;
    let metadata = parse_metadata(&mut c, n_meta)?;
    let alignment = alignment(&metadata)?;
    let n_tensors = bounded_count(&c, n_tensors, MIN_TENSOR_INFO_BYTES, "tensor directory")?;
    let mut tensors = Vec::with_capacity(n_tensors);
    for _ in 0..n_tensors {
        tensors.push(parse_tensor_info(&mut c, alignment)?);
    }
    let data_start = (c.pos() as u64).div_ceil(alignment) * alignment;
    place_tensors(&mut tensors, data_start, bytes.len() as u64)?;
    Ok(Parsed { version, metadata, tensors })
}

fn parse_metadata(c: &mut Cursor<'_>, n_kv: usize) -> Result<HashMap<String, MetaValue>> {
    let mut metadata = HashMap::with_capacity(n_kv);
    for _ in 0..n_kv {
        let at = c.pos();
        let key = c.string("metadata key")?;
        let ty = c.u32("metadata value type")?;
        let value = read_value(c, ty, 0)?;
        if metadata.insert(key.clone(), value).is_some() {
            return Err(invalid("metadata key", at, format!("duplicate key `{key}`")));
        }
    }
    Ok(metadata)
}

fn alignment(metadata: &HashMap<String, MetaValue>) -> Result<u64> {
    let Some(v) = metadata.get("general.alignment") else { return Ok(DEFAULT_ALIGNMENT) };
    match v.as_u64() {
        Some(a) if a.is_power_of_two() && a <= 1 << 20 => Ok(a),
        _ => Err(GgufError::MetadataType {
            key: "general.alignment".into(),
            expected: "a power of two ≤ 2^20".into(),
            got: format!("{v:?}"),
        }
        .into()),
    }
}

fn parse_tensor_info(c: &mut Cursor<'_>, alignment: u64) -> Result<TensorInfo> {
    let at = c.pos();
    let name = c.string("tensor name")?;
    let n_dims = c.u32("tensor dimension count")?;
    if n_dims == 0 || n_dims > MAX_DIMS {
        return Err(invalid(
            "tensor dimensions",
            at,
            format!("`{name}`: {n_dims} dimensions (1..=4 allowed)"),
        ));
    }
    let mut ne = Vec::with_capacity(n_dims as usize);
    for _ in 0..n_dims {
        ne.push(c.u64("tensor dimension")?);
    }
    let type_id = c.u32("tensor type")?;
    let offset = c.u64("tensor offset")?;
    let ty = GgmlType::from_id(type_id).ok_or_else(|| {
        invalid("tensor type", at, format!("`{name}`: unknown ggml type id {type_id}"))
    })?;
    let n_bytes =
        tensor_bytes(&name, &ne, ty).map_err(|reason| invalid("tensor dimensions", at, reason))?;
    if offset % alignment != 0 {
        return Err(invalid(
            "tensor offset",
            at,
            format!("`{name}`: offset {offset} not aligned to {alignment}"),
        ));
    }
    let shape = ne.iter().rev().map(|&d| d as usize).collect();
    Ok(TensorInfo { name, shape, ty, offset, n_bytes })
}

/// Bytes of a tensor with ggml dims `ne`, validating the dims.
fn tensor_bytes(name: &str, ne: &[u64], ty: GgmlType) -> std::result::Result<u64, String> {
    if ne.contains(&0) {
        return Err(format!("`{name}`: zero-sized dimension in {ne:?}"));
    }
    if !ne[0].is_multiple_of(ty.block_size()) {
        return Err(format!(
            "`{name}`: first dimension {} is not a multiple of the {ty} block {}",
            ne[0],
            ty.block_size()
        ));
    }
    let n = ne
        .iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(d))
        .filter(|&n| usize::try_from(n).is_ok() && n <= i64::MAX as u64)
        .ok_or_else(|| format!("`{name}`: element count of {ne:?} overflows"))?;
    ty.storage_bytes(n).ok_or_else(|| format!("`{name}`: byte size of {n} {ty} elements overflows"))
}

/// Turns relative offsets into absolute ones and checks every tensor lies in the file and
/// every name is unique.
fn place_tensors(tensors: &mut [TensorInfo], data_start: u64, file_len: u64) -> Result<()> {
    let mut seen = HashMap::with_capacity(tensors.len());
    for t in tensors.iter_mut() {
        let end = data_start.checked_add(t.offset).and_then(|s| s.checked_add(t.n_bytes));
        if end.is_none_or(|e| e > file_len) {
            return Err(GgufError::Truncated {
                what: "tensor data",
                offset: data_start.saturating_add(t.offset),
                needed: t.n_bytes,
                available: file_len.saturating_sub(data_start.saturating_add(t.offset)),
            }
            .into());
        }
        t.offset += data_start;
        if seen.insert(t.name.clone(), ()).is_some() {
            return Err(invalid("tensor name", 0, format!("duplicate tensor `{}`", t.name)));
        }
    }
    Ok(())
}
