//! ggml tensor types and dequantisation to f32 at load time.
//!
//! Every ggml type id is known (so a file with, say, `Q5_K` tensors still parses and its
//! extents are validated), but only F32, F16, BF16, Q8_0, Q4_0 and Q4_1 dequantise; the
//! others give [`GgufError::UnsupportedTensorType`]. Block layouts are `#[repr(C)]` structs of
//! bytes with compile-time size checks, cast from the mapped file with `bytemuck`.

use bytemuck::{Pod, Zeroable};
use half::{bf16, f16};

use super::error::GgufError;
use crate::error::Result;

/// Elements per block of the 32-wide legacy quantisations.
pub const QK: usize = 32;

/// `Q4_0`: one f16 scale `d`, 32 4-bit codes; `x = (q − 8)·d`.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
pub struct BlockQ4_0 {
    d: [u8; 2],
    qs: [u8; QK / 2],
}

/// `Q4_1`: f16 scale `d` and minimum `m`, 32 4-bit codes; `x = q·d + m`.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
pub struct BlockQ4_1 {
    d: [u8; 2],
    m: [u8; 2],
    qs: [u8; QK / 2],
}

/// `Q8_0`: f16 scale `d`, 32 signed 8-bit codes; `x = q·d`.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
pub struct BlockQ8_0 {
    d: [u8; 2],
    qs: [i8; QK],
}

const _: () = assert!(std::mem::size_of::<BlockQ4_0>() == 18);
const _: () = assert!(std::mem::size_of::<BlockQ4_1>() == 20);
const _: () = assert!(std::mem::size_of::<BlockQ8_0>() == 34);

fn half(b: [u8; 2]) -> f32 {
    f16::from_le_bytes(b).to_f32()
}

impl BlockQ4_0 {
    fn dequantize(&self, out: &mut [f32]) {
        let d = half(self.d);
        for (j, &q) in self.qs.iter().enumerate() {
            out[j] = ((q & 0x0f) as i32 - 8) as f32 * d;
            out[j + QK / 2] = ((q >> 4) as i32 - 8) as f32 * d;
        }
    }
}

impl BlockQ4_1 {
    fn dequantize(&self, out: &mut [f32]) {
        let (d, m) = (half(self.d), half(self.m));
        for (j, &q) in self.qs.iter().enumerate() {
            out[j] = (q & 0x0f) as f32 * d + m;
            out[j + QK / 2] = (q >> 4) as f32 * d + m;
        }
    }
}

impl BlockQ8_0 {
    fn dequantize(&self, out: &mut [f32]) {
        let d = half(self.d);
        for (o, &q) in out.iter_mut().zip(&self.qs) {
            *o = q as f32 * d;
        }
    }
}

/// A ggml tensor type, by its id in the file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GgmlType(u32);

/// (id, name, elements per block, bytes per block) of every ggml type.
const TYPES: &[(u32, &str, u64, u64)] = &[
    (0, "F32", 1, 4),
    (1, "F16", 1, 2),
    (2, "Q4_0", 32, 18),
    (3, "Q4_1", 32, 20),
    (6, "Q5_0", 32, 22),
    (7, "Q5_1", 32, 24),
    (8, "Q8_0", 32, 34),
    (9, "Q8_1", 32, 40),
    (10, "Q2_K", 256, 84),
    (11, "Q3_K", 256, 110),
    (12, "Q4_K", 256, 144),
    (13, "Q5_K", 256, 176),
    (14, "Q6_K", 256, 210),
    (15, "Q8_K", 256, 292),
    (16, "IQ2_XXS", 256, 66),
    (17, "IQ2_XS", 256, 74),
    (18, "IQ3_XXS", 256, 98),
    (19, "IQ1_S", 256, 50),
    (20, "IQ4_NL", 32, 18),
    (21, "IQ3_S", 256, 110),
    (22, "IQ2_S", 256, 82),
    (23, "IQ4_XS", 256, 136),
    (24, "I8", 1, 1),
    (25, "I16", 1, 2),
    (26, "I32", 1, 4),
    (27, "I64", 1, 8),
    (28, "F64", 1, 8),
    (29, "IQ1_M", 256, 56),
    (30, "BF16", 1, 2),
    (34, "TQ1_0", 256, 54),
    (35, "TQ2_0", 256, 66),
    (39, "MXFP4", 32, 17),
    (40, "NVFP4", 64, 36),
    (41, "Q1_0", 128, 18),
];

impl GgmlType {
    /// `F32`
    pub const F32: Self = Self(0);
    /// `F16`
    pub const F16: Self = Self(1);
    /// `Q4_0`
    pub const Q4_0: Self = Self(2);
    /// `Q4_1`
    pub const Q4_1: Self = Self(3);
    /// `Q8_0`
    pub const Q8_0: Self = Self(8);
    /// `BF16`
    pub const BF16: Self = Self(30);

    /// The type with this id, if ggml defines one.
    pub fn from_id(id: u32) -> Option<Self> {
        TYPES.iter().any(|t| t.0 == id).then_some(Self(id))
    }

    /// The id stored in the file.
    pub fn id(self) -> u32 {
        self.0
    }

    fn entry(self) -> &'static (u32, &'static str, u64, u64) {
        TYPES.iter().find(|t| t.0 == self.0).expect("GgmlType is only built from TYPES")
    }

    /// ggml's name for the type (`"Q4_1"`).
    pub fn name(self) -> &'static str {
        self.entry().1
    }

    /// Elements per block.
    pub fn block_size(self) -> u64 {
        self.entry().2
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> u64 {
        self.entry().3
    }

    /// Whether [`dequantize`] handles this type.
    pub fn is_supported(self) -> bool {
        matches!(self, Self::F32 | Self::F16 | Self::BF16 | Self::Q8_0 | Self::Q4_0 | Self::Q4_1)
    }

    /// Bytes that `n_elements` of this type occupy, or `None` when `n_elements` is not a
    /// whole number of blocks or the size overflows.
    pub fn storage_bytes(self, n_elements: u64) -> Option<u64> {
        let bs = self.block_size();
        n_elements
            .is_multiple_of(bs)
            .then(|| (n_elements / bs).checked_mul(self.block_bytes()))
            .flatten()
    }
}

impl std::fmt::Display for GgmlType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Dequantises `bytes` of type `ty` into `out` (one f32 per element).
///
/// # Errors
/// [`GgufError::UnsupportedTensorType`] for a type other than F32/F16/BF16/Q8_0/Q4_0/Q4_1, and
/// [`crate::Error::InvalidInput`] when `bytes` is not exactly `out.len()` elements of `ty`.
///
/// # Examples
/// ```
/// use models::load::gguf::{GgmlType, dequantize};
/// // One Q8_0 block: scale 0.5 (f16 0x3800), codes 0, 1, ..., 31.
/// let mut block = vec![0x00, 0x38];
/// block.extend((0..32).map(|i| i as u8));
/// let mut out = [0f32; 32];
/// dequantize("t", GgmlType::Q8_0, &block, &mut out).unwrap();
/// assert_eq!(out[3], 1.5);
/// ```
pub fn dequantize(tensor: &str, ty: GgmlType, bytes: &[u8], out: &mut [f32]) -> Result<()> {
    if !ty.is_supported() {
        return Err(GgufError::UnsupportedTensorType {
            tensor: tensor.to_string(),
            dtype: ty.name().into(),
        }
        .into());
    }
    let expected = ty.storage_bytes(out.len() as u64);
    if expected != Some(bytes.len() as u64) {
        return Err(crate::error::invalid(
            "dequantize",
            format!(
                "tensor `{tensor}`: {} bytes of {ty} for {} elements (expected {expected:?})",
                bytes.len(),
                out.len()
            ),
        ));
    }
    match ty {
        GgmlType::F32 => scalar(bytes, out, |b: [u8; 4]| f32::from_le_bytes(b)),
        GgmlType::F16 => scalar(bytes, out, |b: [u8; 2]| f16::from_le_bytes(b).to_f32()),
        GgmlType::BF16 => scalar(bytes, out, |b: [u8; 2]| bf16::from_le_bytes(b).to_f32()),
        GgmlType::Q4_0 => blocks(bytes, out, BlockQ4_0::dequantize),
        GgmlType::Q4_1 => blocks(bytes, out, BlockQ4_1::dequantize),
        _ => blocks(bytes, out, BlockQ8_0::dequantize),
    }
    Ok(())
}

fn scalar<const N: usize>(bytes: &[u8], out: &mut [f32], f: impl Fn([u8; N]) -> f32) {
    for (o, chunk) in out.iter_mut().zip(bytes.chunks_exact(N)) {
        let mut b = [0u8; N];
        b.copy_from_slice(chunk);
        *o = f(b);
    }
}

fn blocks<B: Pod>(bytes: &[u8], out: &mut [f32], f: impl Fn(&B, &mut [f32])) {
    let blocks: &[B] = bytemuck::cast_slice(bytes);
    for (b, o) in blocks.iter().zip(out.chunks_exact_mut(QK)) {
        f(b, o);
    }
}
