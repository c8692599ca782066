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
