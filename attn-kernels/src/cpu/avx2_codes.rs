//! AVX2 + FMA + F16C kernels over byte-coded rows (x86-64) — SWAN's sparse-dense products
//! (method section) over placed bitmask rows, and the dense 8- and 4-bit baselines — with
//! the same contracts as the portable ones in [`super::codes`], which also describes the
//! layouts.
//!
//! Codes are widened eight at a time in registers: fp8 through the f16 converter
//! ([`fp8x8_unscaled`]), `i8` by sign extension and one integer-to-float conversion,
//! `q4_0` nibbles by a mask, a shift and a subtraction of 8 on 16 bytes at once. A row is
//! decoded once per eight components and multiplied into every head of the pass. Bitmask
//! rows are placed with one `pshufb` per mask byte.

use std::arch::x86_64::*;

use super::avx2::store_sums;
use super::codes::{BLOCK, CodeKind, CodeRow, Codes, MASK_SHUFFLE};

/// Converts an f16 bit pattern to f32 with the F16C converter.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn f16_bits(bits: u16) -> f32 {
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(bits))))
}

/// The f16 scale at `p`, as f32.
///
/// # Safety
/// `p` must be valid for reading 2 bytes.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) unsafe fn scale_at(p: *const u8) -> f32 {
    // SAFETY: the caller guarantees 2 readable bytes; unaligned read.
    f16_bits(unsafe { p.cast::<u16>().read_unaligned() })
}

/// The low eight bytes of `v` as `i8`, widened to f32 lanes.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn widen(v: __m128i) -> __m256 {
    _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v))
}

/// Eight fp8 E4M3FN codes (low 8 bytes of `v`) as f32 lanes **divided by 2⁸**: each code
/// is sign-extended to 16 bits and shifted so that its sign lands on bit 15 and its
/// exponent and mantissa on bits 7–13 (the spurious copy of the sign on bit 14 masked
/// off) — an f16 with bias 15 instead of 7, which the F16C converter widens exactly,
/// subnormals included. The factor 2⁸ is folded into the row's scale ([`unit`]). The NaN
/// code is not special-cased: validated rows hold finite codes only.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn fp8x8_unscaled(v: __m128i) -> __m256 {
    let h =
        _mm_and_si128(_mm_slli_epi16::<7>(_mm_cvtepi8_epi16(v)), _mm_set1_epi16(0xbf80u16 as i16));
    _mm256_cvtph_ps(h)
}

/// The factor [`load8`]'s lanes miss: 2⁸ for fp8 (see [`fp8x8_unscaled`]), else 1.
pub(super) const fn unit<C: Codes>() -> f32 {
    match C::KIND {
        CodeKind::Fp8 => 256.0,
        _ => 1.0,
    }
}

/// Eight 8-bit codes of a per-component format at `p`, as f32 lanes (fp8 divided by
/// [`unit`]).
///
/// # Safety
/// `p` must be valid for reading 8 bytes; `C::KIND` is `Fp8` or `I8`.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn load8<C: Codes>(p: *const u8) -> __m256 {
    // SAFETY: reads exactly 8 bytes at `p`, which the caller guarantees are readable.
    let v = unsafe { _mm_loadl_epi64(p.cast()) };
    match C::KIND {
        CodeKind::Fp8 => fp8x8_unscaled(v),
        _ => widen(v),
    }
}

/// The 32 elements of a `q8_0` / `q4_0` block whose codes start at `p`, without the block
/// scale, as four vectors of eight lanes.
///
/// # Safety
/// `p` must be valid for reading the block's codes (32 bytes for `Q8Blocks`, 16 for
/// `Q4Blocks`).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn load32<C: Codes>(p: *const u8) -> [__m256; 4] {
    match C::KIND {
        CodeKind::Q4Blocks => {
            // SAFETY: 16 readable bytes at `p` (the caller's contract).
            let b = unsafe { _mm_loadu_si128(p.cast()) };
            let low = _mm_set1_epi8(0x0f);
            let eight = _mm_set1_epi8(8);
            let lo = _mm_sub_epi8(_mm_and_si128(b, low), eight);
            let hi = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16::<4>(b), low), eight);
            [widen(lo), widen(_mm_srli_si128::<8>(lo)), widen(hi), widen(_mm_srli_si128::<8>(hi))]
        }
        _ => {
            // SAFETY: 32 readable bytes at `p` (the caller's contract), read 8 at a time.
            unsafe {
                [
                    widen(_mm_loadl_epi64(p.cast())),
                    widen(_mm_loadl_epi64(p.add(8).cast())),
                    widen(_mm_loadl_epi64(p.add(16).cast())),
                    widen(_mm_loadl_epi64(p.add(24).cast())),
                ]
            }
        }
    }
}

/// Sixteen elements `16·half .. 16·half + 16` of a block whose codes start at `p`, without
/// the block scale.
///
/// # Safety
/// As [`load32`]; `half` is 0 or 1.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn load16<C: Codes>(p: *const u8, half: usize) -> [__m256; 2] {
    match C::KIND {
        CodeKind::Q4Blocks => {
            // SAFETY: 16 readable bytes at `p` (the caller's contract).
            let b = unsafe { _mm_loadu_si128(p.cast()) };
            let b = if half == 1 { _mm_srli_epi16::<4>(b) } else { b };
            let x = _mm_sub_epi8(_mm_and_si128(b, _mm_set1_epi8(0x0f)), _mm_set1_epi8(8));
            [widen(x), widen(_mm_srli_si128::<8>(x))]
        }
        _ => {
            // SAFETY: 32 readable bytes at `p`; this reads bytes 16·half .. 16·half + 16.
            unsafe {
                let q = p.add(16 * half);
                [widen(_mm_loadl_epi64(q.cast())), widen(_mm_loadl_epi64(q.add(8).cast()))]
            }
        }
    }
}

/// Bytes of one block (scale and codes).
pub(super) const fn block_bytes<C: Codes>() -> usize {
    match C::KIND {
        CodeKind::Q4Blocks => 2 + BLOCK / 2,
        _ => 2 + BLOCK,
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn code_scores<C: Codes, const W: usize>(
    q: &[f32],
    d: usize,
    rows: &[CodeRow<'_>],
    lane0: usize,
    s: &mut [[f32; W]],
) {
    match (q.len() / d, C::KIND) {
        (1, CodeKind::Fp8 | CodeKind::I8) => scores_g::<C, 1, W>(q, d, rows, lane0, s),
        (2, CodeKind::Fp8 | CodeKind::I8) => scores_g::<C, 2, W>(q, d, rows, lane0, s),
        (3, CodeKind::Fp8 | CodeKind::I8) => scores_g::<C, 3, W>(q, d, rows, lane0, s),
        (_, CodeKind::Fp8 | CodeKind::I8) => scores_g::<C, 4, W>(q, d, rows, lane0, s),
        (1, _) => block_scores_g::<C, 1, W>(q, d, rows, lane0, s),
        (2, _) => block_scores_g::<C, 2, W>(q, d, rows, lane0, s),
        (3, _) => block_scores_g::<C, 3, W>(q, d, rows, lane0, s),
        _ => block_scores_g::<C, 4, W>(q, d, rows, lane0, s),
    }
}

/// Scores of `G` heads over rows of per-component codes (`d` a multiple of 8): each row is
/// decoded once per 16 components into all `G` dot products, then scaled once.
#[target_feature(enable = "avx2,fma,f16c")]
fn scores_g<C: Codes, const G: usize, const W: usize>(
    q: &[f32],
    d: usize,
    rows: &[CodeRow<'_>],
    lane0: usize,
    s: &mut [[f32; W]],
) {
    let d16 = d & !15;
    let qp = q.as_ptr();
    for (row, st) in rows.iter().zip(s.iter_mut()) {
        let kp = row.bytes.as_ptr();
        let mut a = [[_mm256_setzero_ps(); 2]; G];
        // SAFETY: `Kernels::code_scores` asserted `q.len() == G·d`, `d % 8 == 0` and
        // `row.bytes.len() ≥ d`; every access covers components `c..c + 8` with `c + 8 ≤ d`.
        unsafe {
            let mut c = 0;
            while c < d16 {
                let k0 = load8::<C>(kp.add(c));
                let k1 = load8::<C>(kp.add(c + 8));
                for (h, ah) in a.iter_mut().enumerate() {
                    let qh = qp.add(h * d + c);
                    ah[0] = _mm256_fmadd_ps(_mm256_loadu_ps(qh), k0, ah[0]);
                    ah[1] = _mm256_fmadd_ps(_mm256_loadu_ps(qh.add(8)), k1, ah[1]);
                }
                c += 16;
            }
            if c < d {
                let k0 = load8::<C>(kp.add(c));
                for (h, ah) in a.iter_mut().enumerate() {
                    ah[0] = _mm256_fmadd_ps(_mm256_loadu_ps(qp.add(h * d + c)), k0, ah[0]);
                }
            }
        }
        let scale = _mm256_set1_ps(row.scale * unit::<C>());
        let mut sums = [_mm256_setzero_ps(); G];
        for (sh, ah) in sums.iter_mut().zip(&a) {
            *sh = _mm256_mul_ps(_mm256_add_ps(ah[0], ah[1]), scale);
        }
        store_sums(&sums, &mut st[lane0..lane0 + G]);
    }
}

/// Scores of `G` heads over `q8_0` / `q4_0` rows: per block, the 32 elements are decoded
/// and scaled once, then multiplied into all `G` queries (two accumulators per head hide
/// the FMA latency).
#[target_feature(enable = "avx2,fma,f16c")]
fn block_scores_g<C: Codes, const G: usize, const W: usize>(
    q: &[f32],
    d: usize,
    rows: &[CodeRow<'_>],
    lane0: usize,
    s: &mut [[f32; W]],
) {
    let qp = q.as_ptr();
    for (row, st) in rows.iter().zip(s.iter_mut()) {
        let mut a = [[_mm256_setzero_ps(); 2]; G];
        // SAFETY: `Kernels::code_scores` asserted `q.len() == G·d`, `d % 32 == 0` and
        // `row.bytes.len() ≥ (d/32) · block_bytes`; block `b` spans
        // `b·block_bytes .. (b + 1)·block_bytes` and its queries `32b .. 32b + 32 ≤ d`.
        unsafe {
            for b in 0..d / BLOCK {
                let bp = row.bytes.as_ptr().add(b * block_bytes::<C>());
                let scale = _mm256_set1_ps(scale_at(bp) * row.scale);
                let mut k = load32::<C>(bp.add(2));
                for x in &mut k {
                    *x = _mm256_mul_ps(*x, scale);
                }
                for (h, ah) in a.iter_mut().enumerate() {
                    let qh = qp.add(h * d + b * BLOCK);
                    ah[0] = _mm256_fmadd_ps(_mm256_loadu_ps(qh), k[0], ah[0]);
                    ah[1] = _mm256_fmadd_ps(_mm256_loadu_ps(qh.add(8)), k[1], ah[1]);
                    ah[0] = _mm256_fmadd_ps(_mm256_loadu_ps(qh.add(16)), k[2], ah[0]);
                    ah[1] = _mm256_fmadd_ps(_mm256_loadu_ps(qh.add(24)), k[3], ah[1]);
                }
            }
        }
        let mut sums = [_mm256_setzero_ps(); G];
        for (sh, ah) in sums.iter_mut().zip(&a) {
            *sh = _mm256_add_ps(ah[0], ah[1]);
        }
        store_sums(&sums, &mut st[lane0..lane0 + G]);
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn code_accumulate<C: Codes, const W: usize>(
    p: &[[f32; W]],
    rows: &[CodeRow<'_>],
    lane0: usize,
    factor: &[f32; W],
    acc: &mut [f32],
    d: usize,
) {
    match acc.len() / d {
        1 => accumulate_g::<C, 1, W>(p, rows, lane0, factor, acc, d),
        2 => accumulate_g::<C, 2, W>(p, rows, lane0, factor, acc, d),
        3 => accumulate_g::<C, 3, W>(p, rows, lane0, factor, acc, d),
        _ => accumulate_g::<C, 4, W>(p, rows, lane0, factor, acc, d),
    }
}

/// Accumulation of `G` heads: 16 output components of all heads stay in registers while
/// the tile's rows stream past; each row's weight carries its scale (and, for blocked
/// rows, its block's scale).
#[target_feature(enable = "avx2,fma,f16c")]
fn accumulate_g<C: Codes, const G: usize, const W: usize>(
    p: &[[f32; W]],
    rows: &[CodeRow<'_>],
    lane0: usize,
    factor: &[f32; W],
    acc: &mut [f32],
    d: usize,
) {
    let n = rows.len().min(p.len());
    let mut w = [[0.0f32; G]; super::tile::TILE];
    for ((wt, pt), row) in w.iter_mut().zip(p).zip(rows) {
        for (h, x) in wt.iter_mut().enumerate() {
            *x = pt[lane0 + h] * (row.scale * unit::<C>());
        }
    }
    let blocked = matches!(C::KIND, CodeKind::Q8Blocks | CodeKind::Q4Blocks);
    let ap = acc.as_mut_ptr();
    // SAFETY: `Kernels::code_accumulate` asserted `acc.len() == G·d`, that `d` is a
    // multiple of 8 (of 32 for blocked rows) and that every row holds its layout's bytes;
    // each access covers components `c..c + 8` (`c + 8 ≤ d`) of the accumulators, codes
    // `c..c + 8` of a per-component row, or block `c/32` of a blocked row.
    unsafe {
        let mut c = 0;
        while c < d {
            let wide = c + 16 <= d;
            let mut a = [[_mm256_setzero_ps(); 2]; G];
            for (h, ah) in a.iter_mut().enumerate() {
                let f = _mm256_set1_ps(factor[lane0 + h]);
                ah[0] = _mm256_mul_ps(_mm256_loadu_ps(ap.add(h * d + c)), f);
                if wide {
                    ah[1] = _mm256_mul_ps(_mm256_loadu_ps(ap.add(h * d + c + 8)), f);
                }
            }
            for (wt, row) in w[..n].iter().zip(rows) {
                let rp = row.bytes.as_ptr();
                let v = if blocked {
                    let bp = rp.add(c / BLOCK * block_bytes::<C>());
                    let bs = _mm256_set1_ps(scale_at(bp));
                    let [v0, v1] = load16::<C>(bp.add(2), c % BLOCK / 16);
                    [_mm256_mul_ps(v0, bs), _mm256_mul_ps(v1, bs)]
                } else if wide {
                    [load8::<C>(rp.add(c)), load8::<C>(rp.add(c + 8))]
                } else {
                    [load8::<C>(rp.add(c)), _mm256_setzero_ps()]
                };
                for (h, ah) in a.iter_mut().enumerate() {
                    let wh = _mm256_set1_ps(wt[h]);
                    ah[0] = _mm256_fmadd_ps(wh, v[0], ah[0]);
                    ah[1] = _mm256_fmadd_ps(wh, v[1], ah[1]);
                }
            }
            for (h, ah) in a.iter().enumerate() {
                _mm256_storeu_ps(ap.add(h * d + c), ah[0]);
                if wide {
                    _mm256_storeu_ps(ap.add(h * d + c + 8), ah[1]);
                }
            }
            c += if wide { 16 } else { 8 };
        }
    }
}

/// `N` (8 or 16) bytes of `src` from `pos`, zeros past its end.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn load_codes<const N: usize>(src: &[u8], pos: usize) -> __m128i {
    if pos.checked_add(16).is_some_and(|end| end <= src.len()) {
        // SAFETY: `pos + 16 ≤ src.len()`: 16 readable bytes.
        return unsafe { _mm_loadu_si128(src.as_ptr().add(pos).cast()) };
    }
    let mut tail = [0u8; 16];
    let rest = src.get(pos..).unwrap_or(&[]);
    let n = rest.len().min(N);
    tail[..n].copy_from_slice(&rest[..n]);
    // SAFETY: `tail` holds 16 bytes.
    unsafe { _mm_loadu_si128(tail.as_ptr().cast()) }
}

/// The tile form of [`place_masked`] (see `Kernels::place_bitmask_rows`): one call per
/// tile, the scale converted by F16C, every row placed by the inlined shuffle loop.
#[target_feature(enable = "avx2,fma,f16c,popcnt")]
pub(super) fn place_bitmask_rows(
    bytes: &[u8],
    starts: &[usize],
    d: usize,
    scale_bytes: usize,
    factor: f32,
    out: &mut [u8],
    scales: &mut [f32],
) {
    use super::codes::{bitmask_row, bitmask_scale};
    for ((&start, o), sc) in starts.iter().zip(out.chunks_exact_mut(d)).zip(scales) {
        let Some((mask, at, any)) = bitmask_row(bytes, start, d, scale_bytes) else {
            o.fill(0);
            *sc = factor;
            continue;
        };
        place_masked(mask, bytes, at, o);
        let f16 = |b: [u8; 2]| f16_bits(u16::from_le_bytes(b));
        *sc = bitmask_scale(bytes, at, scale_bytes, any, f16) * factor;
    }
}

/// Places two mask bytes (16 components) per shuffle: the second byte's pattern is
/// offset by the first byte's popcount (its unkept lanes stay ≥ `0x80`, so zero). When
/// every load of the row stays inside `src` (the usual case: later rows follow), the loop
/// runs without a bounds test per load.
#[target_feature(enable = "avx2,fma,f16c,popcnt")]
#[inline]
pub(super) fn place_masked(mask: &[u8], src: &[u8], at: usize, out: &mut [u8]) {
    // A row's codes never extend past `at + 8 · mask.len()`.
    let inside = at.checked_add(8 * mask.len() + 16).is_some_and(|end| end <= src.len());
    if inside {
        // SAFETY: every load starts at `pos ≤ at + 8 · mask.len()` and reads 16 bytes, so
        // it ends at or before `at + 8 · mask.len() + 16 ≤ src.len()`.
        unsafe {
            place_pairs(mask, src.as_ptr(), at, out, |p, pos| _mm_loadu_si128(p.add(pos).cast()))
        }
    } else {
        // SAFETY: `load_codes` checks every load against `src`.
        unsafe { place_pairs(mask, src.as_ptr(), at, out, |_, pos| load_codes::<16>(src, pos)) }
    }
}

/// The loop of [`place_masked`], with the code load as a parameter.
///
/// # Safety
/// `load(src, pos)` must be sound for every `pos` in `at ..= at + 8 · mask.len()`;
/// `out.len() == 8 · mask.len()`.
#[target_feature(enable = "avx2,fma,f16c,popcnt")]
#[inline]
unsafe fn place_pairs(
    mask: &[u8],
    src: *const u8,
    at: usize,
    out: &mut [u8],
    load: impl Fn(*const u8, usize) -> __m128i,
) {
    const ONES: u64 = 0x0101_0101_0101_0101;
    let mut pos = at;
    let (pairs, rest) = mask.as_chunks::<2>();
    for (p, &[m0, m1]) in pairs.iter().enumerate() {
        let c0 = m0.count_ones();
        let lo = MASK_SHUFFLE[usize::from(m0)];
        let hi = MASK_SHUFFLE[usize::from(m1)] + u64::from(c0) * ONES;
        let pattern = _mm_set_epi64x(hi as i64, lo as i64);
        let placed = _mm_shuffle_epi8(load(src, pos), pattern);
        // SAFETY: `out.len() == 8 · mask.len()` (the caller's contract), so bytes
        // `16p .. 16p + 16` are inside `out`.
        unsafe { _mm_storeu_si128(out.as_mut_ptr().add(16 * p).cast(), placed) };
        pos += (c0 + m1.count_ones()) as usize;
    }
    if let [m] = *rest {
        let pattern = _mm_cvtsi64_si128(MASK_SHUFFLE[usize::from(m)] as i64);
        let placed = _mm_shuffle_epi8(load(src, pos), pattern);
        // SAFETY: as above; the last 8 bytes of `out`.
        unsafe { _mm_storel_epi64(out.as_mut_ptr().add(16 * pairs.len()).cast(), placed) };
    }
}

#[cfg(test)]
mod tests {
    use kv_sparse::fp8::DECODE_TABLE;

    use super::*;

    #[test]
    fn every_finite_fp8_code_widens_like_the_table() {
        if !crate::Isa::Avx2.is_available() {
            eprintln!("skipped: this CPU has no AVX2 + FMA + F16C");
            return;
        }
        for code in 0..=255u8 {
            let want = DECODE_TABLE[usize::from(code)];
            if want.is_nan() {
                continue;
            }
            let mut lanes = [0.0f32; 8];
            // SAFETY: the CPU supports AVX2 + FMA + F16C (checked above); `lanes` holds 8
            // floats.
            unsafe {
                let v = fp8x8_unscaled(_mm_set1_epi8(code as i8));
                _mm256_storeu_ps(lanes.as_mut_ptr(), v);
            }
            let got = lanes[0] * unit::<super::super::codes::Fp8Codes>();
            assert_eq!(got.to_bits(), want.to_bits(), "code {code:#04x}");
        }
    }
}
