//! AVX-512 VNNI score products of int8 keys with int8 query codes (x86-64): the integer
//! form of SWAN's scores `q̂·k_j` (method section) over dense `q8_0` rows, per-component
//! int8 rows and bitmask rows of int8 codes read in place, with the contracts of
//! [`super::qcodes`].
//!
//! Per row and 64 components: the row's codes in one register (two 32-byte block loads for
//! `q8_0`; a `vpexpandb` of the next kept codes for a bitmask word), their sign bits
//! flipped once, then one `vpdpbusd` per head — 64 multiply-adds into sixteen exact 32-bit
//! sums, against 4 float multiply-adds and 8 conversions per head for the f32 products.
//! Rows with one scale keep the integer sums across chunks; `q8_0` rows convert each
//! chunk's sums and multiply them by their block's scale.

use std::arch::x86_64::*;

use super::avx2::store_sums;
use super::avx512_codes::expand_word;
use super::codes::{BLOCK, CodeKind, CodeRow, Codes, MaskedRow};
use super::qcodes::{CHUNK, QueryView};

/// A key row read 64 int8 codes at a time.
trait IntRow: Copy {
    /// Whether its codes carry a scale per block of 32 ([`IntRow::scales64`]).
    const BLOCKED: bool;

    /// The codes of components `c..c + 64`.
    ///
    /// # Safety
    /// The row holds components `c..c + 64`, `c` a multiple of 64; AVX-512 F + BW + VBMI2
    /// and POPCNT are available.
    unsafe fn codes64(self, c: usize) -> __m512i;

    /// Scales of components `c..c + 64` per 32-bit lane of a product (lanes 0–7: the block
    /// at `c`, lanes 8–15: the next); 1 for rows without block scales.
    ///
    /// # Safety
    /// As [`IntRow::codes64`]; F16C is available.
    unsafe fn scales64(self, c: usize) -> __m512;
}

/// Per-component int8 codes (a placed row).
#[derive(Clone, Copy)]
struct Flat(*const u8);

impl IntRow for Flat {
    const BLOCKED: bool = false;

    #[inline(always)]
    unsafe fn codes64(self, c: usize) -> __m512i {
        // SAFETY: the caller guarantees 64 code bytes at `c`; unaligned load.
        unsafe { _mm512_loadu_si512(self.0.add(c).cast()) }
    }

    #[inline(always)]
    unsafe fn scales64(self, _c: usize) -> __m512 {
        // SAFETY: the caller guarantees AVX-512 F.
        unsafe { _mm512_set1_ps(1.0) }
    }
}

/// `q8_0` blocks: an f16 scale, then 32 codes.
#[derive(Clone, Copy)]
struct Blocks(*const u8);

impl Blocks {
    /// The block holding component `c`.
    #[inline(always)]
    fn block(self, c: usize) -> *const u8 {
        self.0.wrapping_add(c / BLOCK * (2 + BLOCK))
    }
}

impl IntRow for Blocks {
    const BLOCKED: bool = true;

    #[inline(always)]
    unsafe fn codes64(self, c: usize) -> __m512i {
        // SAFETY: the caller guarantees components `c..c + 64`: blocks `c/32` and `c/32 + 1`,
        // 34 bytes each, whose codes start 2 bytes in.
        unsafe {
            let (a, b) = (self.block(c), self.block(c + BLOCK));
            let lo = _mm256_loadu_si256(a.add(2).cast());
            let hi = _mm256_loadu_si256(b.add(2).cast());
            _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi)
        }
    }

    #[inline(always)]
    unsafe fn scales64(self, c: usize) -> __m512 {
        // SAFETY: as in `codes64`: each block starts with its f16 scale (unaligned reads).
        unsafe {
            let s0 = self.block(c).cast::<i16>().read_unaligned();
            let s1 = self.block(c + BLOCK).cast::<i16>().read_unaligned();
            _mm512_cvtph_ps(_mm256_set_m128i(_mm_set1_epi16(s1), _mm_set1_epi16(s0)))
        }
    }
}

/// A bitmask row of int8 codes read where it is stored (as `avx512::InPlace`).
#[derive(Clone, Copy)]
struct Masked<'a>(MaskedRow<'a>);

impl Masked<'_> {
    /// Mask word `w`.
    ///
    /// # Safety
    /// The mask holds `8w + 8` bytes.
    #[inline(always)]
    unsafe fn word(self, w: usize) -> u64 {
        // SAFETY: the caller guarantees 8 mask bytes at `8w`; unaligned read.
        u64::from_le(unsafe { self.0.mask.as_ptr().add(8 * w).cast::<u64>().read_unaligned() })
    }
}

impl IntRow for Masked<'_> {
    const BLOCKED: bool = false;

    #[inline(always)]
    unsafe fn codes64(self, c: usize) -> __m512i {
        let w = c / 64;
        // SAFETY: the caller guarantees components `c..c + 64`, so the mask (`d/8` bytes,
        // checked by `Kernels::masked_scores_i8`) holds words `0..=w`; `expand_word` reads
        // codes inside their slice; VBMI2 and POPCNT come with the caller's features.
        unsafe {
            let mut pos = 0usize;
            for i in 0..w {
                pos += self.word(i).count_ones() as usize;
            }
            expand_word(self.word(w), self.0.codes, pos)
        }
    }

    #[inline(always)]
    unsafe fn scales64(self, _c: usize) -> __m512 {
        // SAFETY: the caller guarantees AVX-512 F.
        unsafe { _mm512_set1_ps(1.0) }
    }
}

/// The sum of the two 256-bit halves of `v`.
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi2,avx512vnni,popcnt,avx2,fma,f16c")]
#[inline]
fn fold(v: __m512) -> __m256 {
    let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v)));
    _mm256_add_ps(_mm512_castps512_ps256(v), hi)
}

/// `s[t][lane0 + h] = factor_t · σ_h · Σ_i c_{h,i} · κ_i(row_t) · s_i(row_t)` for the `G`
/// heads of `q`.
///
/// # Safety
/// Every row holds `q.d` components (`q.d` a multiple of 64); `q` holds `G` heads; `s` has
/// `lane0 + G ≤ W` lanes.
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi2,avx512vnni,popcnt,avx2,fma,f16c")]
unsafe fn scores_g<R: IntRow, const G: usize, const W: usize>(
    q: QueryView<'_>,
    rows: impl Iterator<Item = (R, f32)>,
    lane0: usize,
    s: &mut [[f32; W]],
) {
    let d = q.d;
    let chunks = d / CHUNK;
    let flip = _mm512_set1_epi8(i8::MIN);
    let (qp, bp) = (q.codes.as_ptr(), q.bias.as_ptr());
    let sigma: [f32; G] = std::array::from_fn(|h| q.scales[h]);
    // SAFETY: `q.total` holds 16 lanes per head (`QueryCodes::view`).
    let total: [__m512i; G] =
        std::array::from_fn(|h| unsafe { _mm512_loadu_si512(q.total.as_ptr().add(16 * h).cast()) });
    for ((row, factor), st) in rows.zip(s.iter_mut()) {
        let mut sums = [_mm256_setzero_ps(); G];
        // SAFETY: the caller's contract: every row holds `d` components, read 64 at a time
        // at multiples of 64 below `d`; `q.codes` holds `G·d` codes and `q.bias` `G·chunks·16`
        // lanes.
        unsafe {
            if R::BLOCKED {
                let mut f = [_mm512_setzero_ps(); G];
                for ch in 0..chunks {
                    let c = ch * CHUNK;
                    let k = _mm512_xor_si512(row.codes64(c), flip);
                    let sc = row.scales64(c);
                    for (h, fh) in f.iter_mut().enumerate() {
                        let b = _mm512_loadu_si512(bp.add((h * chunks + ch) * 16).cast());
                        let qh = _mm512_loadu_si512(qp.add(h * d + c).cast());
                        let t = _mm512_dpbusd_epi32(b, k, qh);
                        *fh = _mm512_fmadd_ps(_mm512_cvtepi32_ps(t), sc, *fh);
                    }
                }
                for ((sh, fh), sg) in sums.iter_mut().zip(&f).zip(&sigma) {
                    *sh = _mm256_mul_ps(fold(*fh), _mm256_set1_ps(factor * sg));
                }
            } else {
                let mut a = total;
                for ch in 0..chunks {
                    let c = ch * CHUNK;
                    let k = _mm512_xor_si512(row.codes64(c), flip);
                    for (h, ah) in a.iter_mut().enumerate() {
                        let qh = _mm512_loadu_si512(qp.add(h * d + c).cast());
                        *ah = _mm512_dpbusd_epi32(*ah, k, qh);
                    }
                }
                for ((sh, ah), sg) in sums.iter_mut().zip(&a).zip(&sigma) {
                    let lo = _mm512_castsi512_si256(*ah);
                    let x = _mm256_add_epi32(lo, _mm512_extracti64x4_epi64::<1>(*ah));
                    *sh = _mm256_mul_ps(_mm256_cvtepi32_ps(x), _mm256_set1_ps(factor * sg));
                }
            }
        }
        store_sums(&sums, &mut st[lane0..lane0 + G]);
    }
}

/// `scores_g` for the number of heads in `q`.
///
/// # Safety
/// As [`scores_g`], with 1 to 4 heads in `q`.
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi2,avx512vnni,popcnt,avx2,fma,f16c")]
unsafe fn scores<R: IntRow, const W: usize>(
    q: QueryView<'_>,
    rows: impl Iterator<Item = (R, f32)>,
    lane0: usize,
    s: &mut [[f32; W]],
) {
    // SAFETY: the caller's contract.
    unsafe {
        match q.heads() {
            1 => scores_g::<R, 1, W>(q, rows, lane0, s),
            2 => scores_g::<R, 2, W>(q, rows, lane0, s),
            3 => scores_g::<R, 3, W>(q, rows, lane0, s),
            _ => scores_g::<R, 4, W>(q, rows, lane0, s),
        }
    }
}

/// Integer scores over coded rows (see `Kernels::code_scores_i8`).
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi2,avx512vnni,popcnt,avx2,fma,f16c")]
pub(super) fn code_scores<C: Codes, const W: usize>(
    q: QueryView<'_>,
    rows: &[CodeRow<'_>],
    lane0: usize,
    s: &mut [[f32; W]],
) {
    assert!(q.d.is_multiple_of(CHUNK) && (1..=4).contains(&q.heads()));
    assert!(rows.iter().all(|r| r.bytes.len() >= C::row_bytes(q.d)));
    // SAFETY: every row holds `C::row_bytes(d)` bytes, so `d` components (asserted above,
    // as `Kernels::code_scores_i8` did); `d` is a multiple of 64 and `q` holds 1–4 heads;
    // `Kernels::code_scores_i8` asserted `lane0 + heads ≤ W`.
    unsafe {
        match C::KIND {
            CodeKind::I8 => {
                scores::<_, W>(q, rows.iter().map(|r| (Flat(r.bytes.as_ptr()), r.scale)), lane0, s)
            }
            CodeKind::Q8Blocks => {
                let it = rows.iter().map(|r| (Blocks(r.bytes.as_ptr()), r.scale));
                scores::<_, W>(q, it, lane0, s)
            }
            _ => unreachable!("integer products take int8 keys only"),
        }
    }
}

/// Integer scores over bitmask rows of int8 codes read in place (see
/// `Kernels::masked_scores_i8`).
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi2,avx512vnni,popcnt,avx2,fma,f16c")]
pub(super) fn masked_scores<const W: usize>(
    q: QueryView<'_>,
    rows: &[MaskedRow<'_>],
    lane0: usize,
    s: &mut [[f32; W]],
) {
    assert!(q.d.is_multiple_of(CHUNK) && (1..=4).contains(&q.heads()));
    assert!(rows.iter().all(|r| r.mask.len() == q.d / 8));
    // SAFETY: every mask holds `d/8` bytes (asserted), so every row `d` components, read at
    // multiples of 64; its codes are read inside their slice (`expand_word`);
    // `Kernels::masked_scores_i8` asserted `lane0 + heads ≤ W`.
    unsafe { scores::<_, W>(q, rows.iter().map(|r| (Masked(*r), r.scale)), lane0, s) }
}
