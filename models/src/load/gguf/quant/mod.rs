//! ggml tensor types and dequantisation to f32 at load time.
//!
//! Every ggml type id is known (so a file with, say, `IQ2_XS` tensors still parses and its
//! extents are validated); F32, F16, BF16, the 32-element block types (`legacy`: Q4_0,
//! Q4_1, Q5_0, Q5_1, Q8_0) and the K-quants (`kquants`: Q2_K, Q3_K, Q4_K, Q5_K, Q6_K,
//! Q8_K) dequantise; the others give [`GgufError::UnsupportedTensorType`]. Block layouts are
//! `#[repr(C)]` structs of bytes with compile-time size checks (against ggml's sizes and
//! against this module's type table), cast from the mapped file with `bytemuck`. Results
//! equal ggml's reference dequantisers bit for bit (tested against PyPI `gguf`).

mod kquants;
mod legacy;

use bytemuck::Pod;
use half::{bf16, f16};

pub use kquants::{BlockQ2K, BlockQ3K, BlockQ4K, BlockQ5K, BlockQ6K, BlockQ8K, QK_K};
pub use legacy::{BlockQ4_0, BlockQ4_1, BlockQ5_0, BlockQ5_1, BlockQ8_0, QK};

use super::error::GgufError;
use crate::error::Result;

/// One quantised block: `ELEMENTS` values from `size_of::<Self>()` bytes.
trait Block: Pod {
    /// Elements the block encodes.
    const ELEMENTS: usize;
    /// Writes the block's `ELEMENTS` values to `out` (exactly that long).
    fn dequantize(&self, out: &mut [f32]);
}

fn half(b: [u8; 2]) -> f32 {
    f16::from_le_bytes(b).to_f32()
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

/// The table entry of type `id` (const, so block structs can be checked against it).
const fn table_entry(id: u32) -> Option<(u64, u64)> {
    let mut i = 0;
    while i < TYPES.len() {
        if TYPES[i].0 == id {
            return Some((TYPES[i].2, TYPES[i].3));
        }
        i += 1;
    }
    None
}

/// Whether block type `B` is exactly what the table says type `id` occupies.
const fn matches_table<B: Block>(id: u32) -> bool {
    match table_entry(id) {
        Some((elements, bytes)) => {
            elements == B::ELEMENTS as u64 && bytes == std::mem::size_of::<B>() as u64
        }
        None => false,
    }
}

const _: () = assert!(matches_table::<BlockQ4_0>(GgmlType::Q4_0.0));
const _: () = assert!(matches_table::<BlockQ4_1>(GgmlType::Q4_1.0));
const _: () = assert!(matches_table::<BlockQ5_0>(GgmlType::Q5_0.0));
const _: () = assert!(matches_table::<BlockQ5_1>(GgmlType::Q5_1.0));
const _: () = assert!(matches_table::<BlockQ8_0>(GgmlType::Q8_0.0));
const _: () = assert!(matches_table::<BlockQ2K>(GgmlType::Q2_K.0));
const _: () = assert!(matches_table::<BlockQ3K>(GgmlType::Q3_K.0));
const _: () = assert!(matches_table::<BlockQ4K>(GgmlType::Q4_K.0));
const _: () = assert!(matches_table::<BlockQ5K>(GgmlType::Q5_K.0));
const _: () = assert!(matches_table::<BlockQ6K>(GgmlType::Q6_K.0));
const _: () = assert!(matches_table::<BlockQ8K>(GgmlType::Q8_K.0));

/// Dequantises whole bytes of one type into exactly as many elements.
type Dequantizer = fn(&[u8], &mut [f32]);

impl GgmlType {
    /// `F32`
    pub const F32: Self = Self(0);
    /// `F16`
    pub const F16: Self = Self(1);
    /// `Q4_0`
    pub const Q4_0: Self = Self(2);
    /// `Q4_1`
    pub const Q4_1: Self = Self(3);
    /// `Q5_0`
    pub const Q5_0: Self = Self(6);
    /// `Q5_1`
    pub const Q5_1: Self = Self(7);
    /// `Q8_0`
    pub const Q8_0: Self = Self(8);
    /// `Q2_K`
    pub const Q2_K: Self = Self(10);
    /// `Q3_K`
    pub const Q3_K: Self = Self(11);
    /// `Q4_K`
    pub const Q4_K: Self = Self(12);
    /// `Q5_K`
    pub const Q5_K: Self = Self(13);
    /// `Q6_K`
    pub const Q6_K: Self = Self(14);
    /// `Q8_K`
    pub const Q8_K: Self = Self(15);
    /// `BF16`
    pub const BF16: Self = Self(30);

    /// Every type [`dequantize`] handles, in id order.
    pub const SUPPORTED: [Self; 14] = [
        Self::F32,
        Self::F16,
        Self::Q4_0,
        Self::Q4_1,
        Self::Q5_0,
        Self::Q5_1,
        Self::Q8_0,
        Self::Q2_K,
        Self::Q3_K,
        Self::Q4_K,
        Self::Q5_K,
        Self::Q6_K,
        Self::Q8_K,
        Self::BF16,
    ];

    /// The type with this id, if ggml defines one.
    pub fn from_id(id: u32) -> Option<Self> {
        TYPES.iter().any(|t| t.0 == id).then_some(Self(id))
    }

    /// The type with this ggml name (`"Q4_K"`), if ggml defines one.
    pub fn from_name(name: &str) -> Option<Self> {
        TYPES.iter().find(|t| t.1 == name).map(|t| Self(t.0))
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

    /// Whether [`dequantize`] handles this type (one of [`GgmlType::SUPPORTED`]).
    pub fn is_supported(self) -> bool {
        self.dequantizer().is_some()
    }

    fn dequantizer(self) -> Option<Dequantizer> {
        let f: Dequantizer = match self {
            Self::F32 => |b, o| scalar(b, o, f32::from_le_bytes),
            Self::F16 => |b, o| scalar(b, o, |h: [u8; 2]| f16::from_le_bytes(h).to_f32()),
            Self::BF16 => |b, o| scalar(b, o, |h: [u8; 2]| bf16::from_le_bytes(h).to_f32()),
            Self::Q4_0 => blocks::<BlockQ4_0>,
            Self::Q4_1 => blocks::<BlockQ4_1>,
            Self::Q5_0 => blocks::<BlockQ5_0>,
            Self::Q5_1 => blocks::<BlockQ5_1>,
            Self::Q8_0 => blocks::<BlockQ8_0>,
            Self::Q2_K => blocks::<BlockQ2K>,
            Self::Q3_K => blocks::<BlockQ3K>,
            Self::Q4_K => blocks::<BlockQ4K>,
            Self::Q5_K => blocks::<BlockQ5K>,
            Self::Q6_K => blocks::<BlockQ6K>,
            Self::Q8_K => blocks::<BlockQ8K>,
            _ => return None,
        };
        Some(f)
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
/// [`GgufError::UnsupportedTensorType`] for a type outside [`GgmlType::SUPPORTED`] (the
/// IQ, TQ, FP4 and integer types), and [`crate::Error::InvalidInput`] when `bytes` is not
/// exactly `out.len()` elements of `ty`.
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
    let Some(f) = ty.dequantizer() else {
        return Err(GgufError::UnsupportedTensorType {
            tensor: tensor.to_string(),
            dtype: ty.name().into(),
        }
        .into());
    };
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
    f(bytes, out);
    Ok(())
}

fn scalar<const N: usize>(bytes: &[u8], out: &mut [f32], f: impl Fn([u8; N]) -> f32) {
    for (o, chunk) in out.iter_mut().zip(bytes.chunks_exact(N)) {
        let mut b = [0u8; N];
        b.copy_from_slice(chunk);
        *o = f(b);
    }
}

fn blocks<B: Block>(bytes: &[u8], out: &mut [f32]) {
    let blocks: &[B] = bytemuck::cast_slice(bytes);
    for (b, o) in blocks.iter().zip(out.chunks_exact_mut(B::ELEMENTS)) {
        b.dequantize(o);
    }
}
