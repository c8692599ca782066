//! AVX2 score products of int8 keys with int8 query codes (x86-64, no VNNI needed): the
//! integer form of SWAN's scores `q̂·k_j` (method section) over dense `q8_0` rows, `q4_0`
//! rows and per-component int8 rows (placed bitmask rows among them), with the contracts
//! of [`super::qcodes`] — the products llama.cpp's AVX2 path scores its `q8_0` / `q4_0`
//! caches with.
//!
//! Per row and 32 components: the row's codes in one register (a `q4_0` block's nibbles
//! split and re-centred to −8..=7), their magnitudes `|κ|` taken once; per head the query
//! codes take the key's signs (`vpsignb`), so that `vpmaddubsw(|κ|, sign(c, κ))` forms
//! pairs of exact products `κ·c` without the unsigned × signed overflow (`|κ| ≤ 128`,
//! `|c| ≤ 127`: a pair sums to at most 32 512 < 2¹⁵), and `vpmaddwd` against ones widens
//! them to eight 32-bit sums — two integer multiplies per head for 32 components, against
//! four float multiply-adds and eight conversions for the f32 products. Rows with one
//! scale keep the integer sums across chunks; blocked rows convert each block's sums and
//! multiply them by the block's scale.

use std::arch::x86_64::*;

use super::avx2::store_sums;
use super::avx2_codes::{block_bytes, scale_at};
use super::codes::{BLOCK, CodeKind, CodeRow, Codes};
use super::qcodes::QueryView;

/// The 32 signed codes of components `c..c + 32` of a row of format `C`.
///
/// # Safety
/// The row at `p` holds components `c..c + 32`, `c` a multiple of 32; `C::KIND` is `I8`,
/// `Q8Blocks` or `Q4Blocks`; AVX2 is available.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn codes32<C: Codes>(p: *const u8, c: usize) -> __m256i {
    let codes = p.wrapping_add(c / BLOCK * block_bytes::<C>() + 2);
    // SAFETY: the caller guarantees the row holds components `c..c + 32`: 32 codes at `c`
    // (per-component rows), or block `c/32` (34 bytes for `q8_0`, 18 for `q4_0`, codes 2
    // bytes in); unaligned loads.
    unsafe {
        match C::KIND {
            CodeKind::Q8Blocks => _mm256_loadu_si256(codes.cast()),
            CodeKind::Q4Blocks => {
                let b = _mm_loadu_si128(codes.cast());
                // Element j in the low nibble of byte j, element j + 16 in its high nibble.
                let both = _mm256_set_m128i(_mm_srli_epi16::<4>(b), b);
                let low = _mm256_and_si256(both, _mm256_set1_epi8(0x0f));
                _mm256_sub_epi8(low, _mm256_set1_epi8(8))
            }
            _ => _mm256_loadu_si256(p.add(c).cast()),
        }
    }
}

/// The f16 scale of block `c/32` of a blocked row at `p`, as f32.
///
/// # Safety
/// As [`codes32`], for a blocked `C`.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn block_scale<C: Codes>(p: *const u8, c: usize) -> f32 {
    // SAFETY: the caller guarantees block `c/32`, which starts with its f16 scale.
    unsafe { scale_at(p.add(c / BLOCK * block_bytes::<C>())) }
}

/// Eight 32-bit sums of the products of 32 key codes `k` (magnitudes `ak`) with 32 query
/// codes at `qp`.
///
/// # Safety
/// `qp` is valid for reading 32 bytes; AVX2 is available.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn dot32(k: __m256i, ak: __m256i, qp: *const i8) -> __m256i {
    // SAFETY: 32 readable bytes at `qp` (the caller's contract); unaligned load.
    let qh = unsafe { _mm256_loadu_si256(qp.cast()) };
    let pairs = _mm256_maddubs_epi16(ak, _mm256_sign_epi8(qh, k));
    _mm256_madd_epi16(pairs, _mm256_set1_epi16(1))
}

/// `s[t][lane0 + h] = scale_t · σ_h · Σ_i c_{h,i} · κ_i(row_t) · s_i(row_t)` for the `G`
/// heads of `q`.
///
/// # Safety
/// Every row holds `C::row_bytes(q.d)` bytes (`q.d` a multiple of 32); `q` holds `G` heads;
/// `s` has `lane0 + G ≤ W` lanes per row; AVX2 is available.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn scores_g<C: Codes, const G: usize, const W: usize>(
    q: QueryView<'_>,
    rows: &[CodeRow<'_>],
    lane0: usize,
    s: &mut [[f32; W]],
) {
    let d = q.d;
    let qp = q.codes.as_ptr();
    let sigma: [f32; G] = std::array::from_fn(|h| q.scales[h]);
    let blocked = matches!(C::KIND, CodeKind::Q8Blocks | CodeKind::Q4Blocks);
    for (row, st) in rows.iter().zip(s.iter_mut()) {
        let rp = row.bytes.as_ptr();
        let mut sums = [_mm256_setzero_ps(); G];
        // SAFETY: the caller's contract: every row holds `d` components, read 32 at a time
        // at multiples of 32 below `d`; `q.codes` holds `G·d` codes.
        unsafe {
            if blocked {
                let mut f = [_mm256_setzero_ps(); G];
                for c in (0..d).step_by(BLOCK) {
                    let k = codes32::<C>(rp, c);
                    let ak = _mm256_sign_epi8(k, k);
                    let sc = _mm256_set1_ps(block_scale::<C>(rp, c));
                    for (h, fh) in f.iter_mut().enumerate() {
                        let t = dot32(k, ak, qp.add(h * d + c));
                        *fh = _mm256_fmadd_ps(_mm256_cvtepi32_ps(t), sc, *fh);
                    }
                }
                for ((sh, fh), sg) in sums.iter_mut().zip(&f).zip(&sigma) {
                    *sh = _mm256_mul_ps(*fh, _mm256_set1_ps(row.scale * sg));
                }
            } else {
                let mut a = [_mm256_setzero_si256(); G];
                for c in (0..d).step_by(32) {
                    let k = codes32::<C>(rp, c);
                    let ak = _mm256_sign_epi8(k, k);
                    for (h, ah) in a.iter_mut().enumerate() {
                        *ah = _mm256_add_epi32(*ah, dot32(k, ak, qp.add(h * d + c)));
                    }
                }
                for ((sh, ah), sg) in sums.iter_mut().zip(&a).zip(&sigma) {
                    *sh = _mm256_mul_ps(_mm256_cvtepi32_ps(*ah), _mm256_set1_ps(row.scale * sg));
                }
            }
        }
        store_sums(&sums, &mut st[lane0..lane0 + G]);
    }
}

/// Integer scores over coded rows (see `Kernels::code_scores_i8`).
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn code_scores<C: Codes, const W: usize>(
    q: QueryView<'_>,
    rows: &[CodeRow<'_>],
    lane0: usize,
    s: &mut [[f32; W]],
) {
    assert!(matches!(C::KIND, CodeKind::I8 | CodeKind::Q8Blocks | CodeKind::Q4Blocks));
    assert!(q.d.is_multiple_of(32) && (1..=4).contains(&q.heads()));
    assert!(q.codes.len() == q.heads() * q.d);
    assert!(rows.iter().all(|r| r.bytes.len() >= C::row_bytes(q.d)));
    assert!(s.len() >= rows.len() && lane0 + q.heads() <= W);
    // SAFETY: every row holds `C::row_bytes(d)` bytes, so `d` components, `d` a multiple of
    // 32; `q` holds 1–4 heads of `d` codes; `lane0 + heads ≤ W` (all asserted above); the
    // function's features are enabled.
    unsafe {
        match q.heads() {
            1 => scores_g::<C, 1, W>(q, rows, lane0, s),
            2 => scores_g::<C, 2, W>(q, rows, lane0, s),
            3 => scores_g::<C, 3, W>(q, rows, lane0, s),
            _ => scores_g::<C, 4, W>(q, rows, lane0, s),
        }
    }
}
