//! Instruction-set selection for the optimized CPU kernels, detected at run time.
//!
//! The decode kernels (SWAN's sparse-dense products, method section; dense attention as
//! the baseline) have an AVX2 + FMA + F16C (+ POPCNT) implementation and a portable one with the same
//! results up to the [`crate::accuracy`] tolerances. On CPUs with AVX-512 F + BW + VBMI2 the
//! bitmask rows are placed with its byte expansion instead of byte shuffles (the same bytes
//! either way), and [`Isa::Avx512`] also runs the dense and coded-row products on 16-lane
//! vectors. [`Isa::detect`] picks the best one this CPU supports; a slower one can be forced
//! for comparisons and tests.

use std::fmt;

/// An instruction set the optimized CPU kernels can run on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Isa {
    /// [`Isa::Avx2Vbmi2`]'s kernels, with the products over dense rows (f32, f16, bf16) and
    /// byte-coded rows (fp8, int8, `q8_0`, `q4_0`, placed bitmask rows) on 512-bit vectors:
    /// sixteen components per multiply-add, and a GQA group's accumulators for 64
    /// components held in registers while a tile's rows stream past. Needs the same CPU
    /// features as [`Isa::Avx2Vbmi2`].
    Avx512,
    /// [`Isa::Avx2`]'s kernels, with bitmask rows placed by AVX-512 VBMI2's masked byte
    /// expansion (`vpexpandb`: 64 components per instruction; needs AVX-512 F and BW too).
    Avx2Vbmi2,
    /// x86-64 AVX2 with FMA and F16C (f16 → f32 conversion in hardware).
    Avx2,
    /// Plain Rust, any target.
    Portable,
}

impl Isa {
    /// The fastest instruction set this CPU supports.
    ///
    /// # Examples
    /// ```
    /// let isa = attn_kernels::Isa::detect();
    /// assert!(isa.is_available());
    /// ```
    pub fn detect() -> Self {
        Self::available().next().unwrap_or(Self::Portable)
    }

    /// Whether this CPU can run kernels built for `self`.
    pub fn is_available(self) -> bool {
        match self {
            Self::Portable => true,
            #[cfg(target_arch = "x86_64")]
            Self::Avx2 => {
                std::arch::is_x86_feature_detected!("avx2")
                    && std::arch::is_x86_feature_detected!("fma")
                    && std::arch::is_x86_feature_detected!("f16c")
                    && std::arch::is_x86_feature_detected!("popcnt")
            }
            #[cfg(target_arch = "x86_64")]
            Self::Avx2Vbmi2 | Self::Avx512 => {
                Self::Avx2.is_available()
                    && std::arch::is_x86_feature_detected!("avx512f")
                    && std::arch::is_x86_feature_detected!("avx512bw")
                    && std::arch::is_x86_feature_detected!("avx512vbmi2")
            }
            #[cfg(not(target_arch = "x86_64"))]
            Self::Avx2 | Self::Avx2Vbmi2 | Self::Avx512 => false,
        }
    }

    /// Every instruction set this CPU supports (fastest first).
    pub fn available() -> impl Iterator<Item = Self> {
        [Self::Avx512, Self::Avx2Vbmi2, Self::Avx2, Self::Portable]
            .into_iter()
            .filter(|i| i.is_available())
    }
}

impl fmt::Display for Isa {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Avx512 => "avx512f+bw+vbmi2+fma+f16c",
            Self::Avx2Vbmi2 => "avx2+fma+f16c+avx512vbmi2",
            Self::Avx2 => "avx2+fma+f16c",
            Self::Portable => "portable",
        })
    }
}

/// How the CPU kernels take the queries in the score products: over keys of int8 codes
/// (dense `q8_0` rows and int8-valued sparse rows) for [`QueryPrecision::Int8`], over keys
/// of every format for [`QueryPrecision::Q8Blocks`].
///
/// # Examples
/// ```
/// use attn_kernels::{CpuAttention, QueryPrecision};
/// let attn = CpuAttention::new(1)?;
/// assert_eq!(attn.query_precision(), QueryPrecision::F32); // lossless by default
/// assert_eq!("int8".parse::<QueryPrecision>(), Ok(QueryPrecision::Int8));
/// if QueryPrecision::Int8.is_available() {
///     let attn = attn.with_query_precision(QueryPrecision::Int8)?;
///     assert_eq!(attn.query_precision(), QueryPrecision::Int8);
/// }
/// # Ok::<(), attn_kernels::Error>(())
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum QueryPrecision {
    /// f32 queries: every score is the product of the query with the values the cache
    /// stores (the lossless setting).
    #[default]
    F32,
    /// Queries rounded to int8 codes with one scale per head and step, `σ_h =
    /// max|q_h| / 127`, and int8 and 4-bit keys (`q8_0`, `q4_0`, int8-valued sparse rows)
    /// scored by exact integer products (AVX2's `vpmaddubsw` / `vpmaddwd`, AVX-512 VNNI's
    /// `vpdpbusd` where present; `d_h` a multiple of 64 up to 512), as llama.cpp scores its
    /// `q8_0` and `q4_0` caches. Lossy: a score moves by at most `σ_h / 2 · Σ_i |k_i|`. Keys
    /// of other formats keep f32 products.
    Int8,
    /// Queries rounded as ggml's `q8_0` blocks round them — each run of 32 elements of a
    /// head to int8 codes with an f16 scale `max|q|/127`, byte for byte
    /// `kv_sparse::quant::Int8Blocks` (a short last run as if zero-padded) — then scored
    /// in f32 against keys of any format: the queries llama.cpp's CPU flash attention
    /// scores its `q8_0` and `q4_0` caches with. Lossy (a score moves by at most
    /// `Σ_blocks σ_b / 2 · Σ_{i∈b} |k_i|` plus the f16 scale's rounding); for reproducing
    /// that engine's arithmetic, not for speed. A block with a non-finite element, or one
    /// whose scale would not be a finite f16, stays in f32.
    Q8Blocks,
}

impl QueryPrecision {
    /// Whether this CPU runs it ([`QueryPrecision::Int8`] needs [`Isa::Avx2`]).
    pub fn is_available(self) -> bool {
        match self {
            Self::F32 | Self::Q8Blocks => true,
            Self::Int8 => Isa::Avx2.is_available(),
        }
    }
}

impl fmt::Display for QueryPrecision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::F32 => "f32",
            Self::Int8 => "int8",
            Self::Q8Blocks => "q8_0",
        })
    }
}

impl std::str::FromStr for QueryPrecision {
    type Err = String;

    /// `f32`, `int8` or `q8_0`.
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "f32" => Ok(Self::F32),
            "int8" => Ok(Self::Int8),
            "q8_0" => Ok(Self::Q8Blocks),
            _ => Err(format!("query precision {s:?}: expected f32, int8 or q8_0")),
        }
    }
}
