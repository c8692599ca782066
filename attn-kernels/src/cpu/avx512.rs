//! AVX-512 tile kernels (x86-64) for the products over dense rows (f32, f16, bf16),
//! byte-coded rows (fp8, int8, `q8_0`, `q4_0`) and bitmask rows of fp8 or int8 codes read
//! where they are stored — the dense baseline and SWAN's sparse-dense products (method
//! section: scores `q̂·k_j`, output `Σ a_j v_j`) with the contracts of
//! [`super::tile::Kernels`] and the layouts of [`super::codes`].
//!
//! Sixteen components per vector. A row is decoded 64 components at a time (then 32, 16)
//! and multiplied into every head of the pass. For the weighted sum of rows, the
//! accumulators of up to four heads × 64 components (16 of the 32 vector registers) stay in
//! registers while a tile's rows stream past: per row and 64 components, four vectors of
//! decoded values, one broadcast weight per head and `4·G` multiply-adds. Rows whose length
//! is not a multiple of 16, and dense element types other than these three, take the AVX2
//! kernels.
//!
//! A bitmask row of 8-bit codes whose length is a multiple of 64 is not placed into a
//! per-thread row first: each 64-bit word of its mask expands the row's next codes into one
//! register (`vpexpandb`, VBMI2), decoded there into the four vectors the products take —
//! the placement of [`super::avx512_codes`] without its store and reload.

use std::any::TypeId;
use std::arch::x86_64::*;
use std::marker::PhantomData;

use half::{bf16, f16};
use kv_sparse::Value;

use super::avx2::store_sums;
use super::avx2_codes::{block_bytes, scale_at, unit};
use super::avx512_codes::expand_word;
use super::codes::{BLOCK, CodeKind, CodeRow, Codes, MaskedRow, NO_MASK};

fn same<A: 'static, B: 'static>() -> bool {
    TypeId::of::<A>() == TypeId::of::<B>()
}

/// Whether dense rows of `D` with `d` components have a kernel here.
pub(super) fn dense_supported<D: Value>(d: usize) -> bool {
    d.is_multiple_of(16) && (same::<D, f32>() || same::<D, f16>() || same::<D, bf16>())
}

/// A row read 16 components at a time, as f32 lanes without the row's own factor.
trait Row: Copy {
    /// Components `c..c + 16`.
    ///
    /// # Safety
    /// The row holds components `c..c + 16`, `c` a multiple of 16; AVX-512 F, AVX2 and F16C
    /// are available.
    unsafe fn load16(self, c: usize) -> __m512;

    /// Components `c..c + 32`.
    ///
    /// # Safety
    /// As [`Row::load16`], for components `c..c + 32` with `c` a multiple of 32.
    #[inline(always)]
    unsafe fn load32(self, c: usize) -> [__m512; 2] {
        // SAFETY: the caller's contract covers both halves.
        unsafe { [self.load16(c), self.load16(c + 16)] }
    }

    /// Components `c..c + 64`.
    ///
    /// # Safety
    /// As [`Row::load16`], for components `c..c + 64` with `c` a multiple of 64.
    #[inline(always)]
    unsafe fn load64(self, c: usize) -> [__m512; 4] {
        // SAFETY: the caller's contract covers both halves.
        let ([a, b], [x, y]) = unsafe { (self.load32(c), self.load32(c + 32)) };
        [a, b, x, y]
    }
}

/// A dense row of `D` (f32, f16 or bf16: [`dense_supported`]).
#[derive(Clone, Copy)]
struct DenseRow<D>(*const D);

impl<D: Value> Row for DenseRow<D> {
    #[inline(always)]
    unsafe fn load16(self, c: usize) -> __m512 {
        // SAFETY: the caller guarantees 16 elements of `D` at `c` and the features; each
        // branch reads exactly 16 · size_of::<D>() bytes (the TypeId test identifies `D`;
        // the entry points admit only the three types).
        unsafe {
            let p = self.0.add(c);
            if same::<D, f32>() {
                _mm512_loadu_ps(p.cast())
            } else if same::<D, f16>() {
                _mm512_cvtph_ps(_mm256_loadu_si256(p.cast()))
            } else {
                let wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256(p.cast()));
                _mm512_castsi512_ps(_mm512_slli_epi32::<16>(wide))
            }
        }
    }
}

/// Sixteen `i8` codes as f32 lanes.
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi2,popcnt,avx2,fma,f16c")]
#[inline]
fn i8x16(v: __m128i) -> __m512 {
    _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(v))
}

/// Sixteen fp8 E4M3FN codes as f32 lanes divided by 2⁸, through f16 as the AVX2 kernels
/// do (`avx2_codes::fp8x8_unscaled`; the factor is in [`unit`]).
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi2,popcnt,avx2,fma,f16c")]
#[inline]
fn fp8x16_unscaled(v: __m128i) -> __m512 {
    let h = _mm256_and_si256(
        _mm256_slli_epi16::<7>(_mm256_cvtepi8_epi16(v)),
        _mm256_set1_epi16(0xbf80u16 as i16),
    );
    _mm512_cvtph_ps(h)
}

/// A byte-coded row of format `C` (see [`super::codes`] for the layouts).
#[derive(Clone, Copy)]
struct CodedRow<C>(*const u8, PhantomData<C>);

impl<C: Codes> Row for CodedRow<C> {
    #[inline(always)]
    unsafe fn load16(self, c: usize) -> __m512 {
        // SAFETY: the caller guarantees components `c..c + 16` and the features: 16 code
        // bytes at `c` for the per-component formats; for blocks, `c..c + 16` lies in block
        // `c / 32`, which `load32` reads whole.
        unsafe {
            match C::KIND {
                CodeKind::Fp8 => fp8x16_unscaled(_mm_loadu_si128(self.0.add(c).cast())),
                CodeKind::I8 => i8x16(_mm_loadu_si128(self.0.add(c).cast())),
                CodeKind::Q8Blocks | CodeKind::Q4Blocks => {
                    let [lo, hi] = self.load32(c & !(BLOCK - 1));
                    if c.is_multiple_of(BLOCK) { lo } else { hi }
                }
            }
        }
    }

    #[inline(always)]
    unsafe fn load32(self, c: usize) -> [__m512; 2] {
        // SAFETY: the caller guarantees components `c..c + 32` (`c` a multiple of 32) and
        // the features. Per-component formats: 32 code bytes at `c`. Blocks: block `c / 32`
        // spans `block_bytes` bytes from `c / 32 · block_bytes` — its f16 scale, then 32
        // (`q8_0`) or 16 (`q4_0`) code bytes.
        unsafe {
            match C::KIND {
                CodeKind::Fp8 | CodeKind::I8 => [self.load16(c), self.load16(c + 16)],
                CodeKind::Q8Blocks => {
                    let bp = self.0.add(c / BLOCK * block_bytes::<C>());
                    let s = _mm512_set1_ps(scale_at(bp));
                    let lo = i8x16(_mm_loadu_si128(bp.add(2).cast()));
                    let hi = i8x16(_mm_loadu_si128(bp.add(18).cast()));
                    [_mm512_mul_ps(lo, s), _mm512_mul_ps(hi, s)]
                }
                CodeKind::Q4Blocks => {
                    let bp = self.0.add(c / BLOCK * block_bytes::<C>());
                    let s = _mm512_set1_ps(scale_at(bp));
                    let b = _mm_loadu_si128(bp.add(2).cast());
                    let (low, eight) = (_mm_set1_epi8(0x0f), _mm_set1_epi8(8));
                    let lo = _mm_sub_epi8(_mm_and_si128(b, low), eight);
                    let hi = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16::<4>(b), low), eight);
                    [_mm512_mul_ps(i8x16(lo), s), _mm512_mul_ps(i8x16(hi), s)]
                }
            }
        }
    }
}

/// A bitmask row of fp8 or int8 codes `C` read where it is stored: each 64-component word
/// of its mask expands the next codes into one register (`vpexpandb`), which decodes into
/// four vectors of f32 lanes — the placement of [`super::avx512_codes`] without the store
/// and reload of a placed row.
#[derive(Clone, Copy)]
struct InPlace<'a, C>(MaskedRow<'a>, PhantomData<C>);

impl<C: Codes> InPlace<'_, C> {
    /// Mask word `w` (components `64w..64w + 64`).
    ///
    /// # Safety
    /// The mask holds `8w + 8` bytes.
    #[inline(always)]
    unsafe fn word(self, w: usize) -> u64 {
        // SAFETY: the caller guarantees 8 mask bytes at `8w`; unaligned read.
        u64::from_le(unsafe { self.0.mask.as_ptr().add(8 * w).cast::<u64>().read_unaligned() })
    }
}

impl<C: Codes> Row for InPlace<'_, C> {
    #[inline(always)]
    unsafe fn load16(self, c: usize) -> __m512 {
        // SAFETY: the caller's contract, for the 64 components around `c`.
        let v = unsafe { self.load64(c & !63) };
        v[(c % 64) / 16]
    }

    #[inline(always)]
    unsafe fn load64(self, c: usize) -> [__m512; 4] {
        let w = c / 64;
        // SAFETY: the caller guarantees components `c..c + 64` of the row, so its mask
        // (`d/8` bytes, checked by `Kernels::masked_*`) holds words `0..=w`; VBMI2 and POPCNT
        // come with the AVX-512 kernels' token.
        unsafe {
            let mut pos = 0usize;
            for i in 0..w {
                pos += self.word(i).count_ones() as usize;
            }
            let v = expand_word(self.word(w), self.0.codes, pos);
            let lane = |i: usize| match i {
                0 => _mm512_castsi512_si128(v),
                1 => _mm512_extracti32x4_epi32::<1>(v),
                2 => _mm512_extracti32x4_epi32::<2>(v),
                _ => _mm512_extracti32x4_epi32::<3>(v),
            };
            let decode = |x: __m128i| match C::KIND {
                CodeKind::Fp8 => fp8x16_unscaled(x),
                _ => i8x16(x),
            };
            [decode(lane(0)), decode(lane(1)), decode(lane(2)), decode(lane(3))]
        }
    }
}

/// The sum of the two 256-bit halves of `v`.
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi2,popcnt,avx2,fma,f16c")]
#[inline]
fn fold(v: __m512) -> __m256 {
    let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v)));
    _mm256_add_ps(_mm512_castps512_ps256(v), hi)
}

/// `s[t][lane0 + h] = factor_t · q_h · row_t` for `G` head-major queries (`q`: `G × d`).
///
/// # Safety
/// Every row holds `d` components (`d` a multiple of 16) and `q.len() ≥ G·d`; `s` has
/// `lane0 + G ≤ W` lanes.
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi2,popcnt,avx2,fma,f16c")]
unsafe fn scores_g<R: Row, const G: usize, const W: usize>(
    q: &[f32],
    d: usize,
    rows: impl Iterator<Item = (R, f32)>,
    lane0: usize,
    s: &mut [[f32; W]],
) {
    let (d64, d32) = (d & !63, d & !31);
    let qp = q.as_ptr();
    for ((row, factor), st) in rows.zip(s.iter_mut()) {
        let mut a = [[_mm512_setzero_ps(); 2]; G];
        // SAFETY: the caller's contract: the row holds `d` components and `q` holds `G·d`
        // floats; every access covers components `c..c + 64 ≤ d64`, `c..c + 32 ≤ d32` or
        // `c..c + 16 ≤ d`.
        unsafe {
            let mut c = 0;
            while c < d64 {
                let k = row.load64(c);
                for (h, ah) in a.iter_mut().enumerate() {
                    let qh = qp.add(h * d + c);
                    for (i, ki) in k.iter().enumerate() {
                        let qi = _mm512_loadu_ps(qh.add(16 * i));
                        ah[i % 2] = _mm512_fmadd_ps(qi, *ki, ah[i % 2]);
                    }
                }
                c += 64;
            }
            while c < d32 {
                let [k0, k1] = row.load32(c);
                for (h, ah) in a.iter_mut().enumerate() {
                    let qh = qp.add(h * d + c);
                    ah[0] = _mm512_fmadd_ps(_mm512_loadu_ps(qh), k0, ah[0]);
                    ah[1] = _mm512_fmadd_ps(_mm512_loadu_ps(qh.add(16)), k1, ah[1]);
                }
                c += 32;
            }
            if c < d {
                let k0 = row.load16(c);
                for (h, ah) in a.iter_mut().enumerate() {
                    ah[0] = _mm512_fmadd_ps(_mm512_loadu_ps(qp.add(h * d + c)), k0, ah[0]);
                }
            }
        }
        let f = _mm256_set1_ps(factor);
        let mut sums = [_mm256_setzero_ps(); G];
        for (sh, ah) in sums.iter_mut().zip(&a) {
            *sh = _mm256_mul_ps(fold(_mm512_add_ps(ah[0], ah[1])), f);
        }
        store_sums(&sums, &mut st[lane0..lane0 + G]);
    }
}

/// `acc_h = factor[lane0 + h] · acc_h + Σ_t p[t][lane0 + h] · f_t · row_t` over components
/// `c..c + 16·N`, for `rows(t) = (row_t, f_t)`, `t < n`.
///
/// # Safety
/// `acc` holds `G·d` floats, every row `d` components; `c + 16·N ≤ d` with `c` a multiple
/// of 32 when `N ≥ 2` (of 16 otherwise); `p` has `n` rows of `lane0 + G ≤ W` lanes.
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi2,popcnt,avx2,fma,f16c")]
#[inline]
#[allow(clippy::too_many_arguments)]
unsafe fn accumulate_chunk<R: Row, const G: usize, const N: usize, const W: usize>(
    p: &[[f32; W]],
    rows: &impl Fn(usize) -> (R, f32),
    n: usize,
    lane0: usize,
    factor: &[f32; W],
    acc: &mut [f32],
    d: usize,
    c: usize,
) {
    let ap = acc.as_mut_ptr();
    let mut a = [[_mm512_setzero_ps(); N]; G];
    // SAFETY: the caller's contract: accumulator components `c..c + 16·N` of every head
    // and row components `c..c + 16·N` exist, and `load32` starts at multiples of 32.
    unsafe {
        for (h, ah) in a.iter_mut().enumerate() {
            let f = _mm512_set1_ps(factor[lane0 + h]);
            for (i, x) in ah.iter_mut().enumerate() {
                *x = _mm512_mul_ps(_mm512_loadu_ps(ap.add(h * d + c + 16 * i)), f);
            }
        }
        for (t, pt) in p[..n].iter().enumerate() {
            let (row, sc) = rows(t);
            let mut v = [_mm512_setzero_ps(); N];
            if N == 1 {
                v[0] = row.load16(c);
            } else if N == 4 && c.is_multiple_of(64) {
                v[..4].copy_from_slice(&row.load64(c));
            } else {
                for j in (0..N).step_by(2) {
                    let [x, y] = row.load32(c + 16 * j);
                    v[j] = x;
                    v[j + 1] = y;
                }
            }
            for (h, ah) in a.iter_mut().enumerate() {
                let wh = _mm512_set1_ps(pt[lane0 + h] * sc);
                for (x, vi) in ah.iter_mut().zip(&v) {
                    *x = _mm512_fmadd_ps(wh, *vi, *x);
                }
            }
        }
        for (h, ah) in a.iter().enumerate() {
            for (i, x) in ah.iter().enumerate() {
                _mm512_storeu_ps(ap.add(h * d + c + 16 * i), *x);
            }
        }
    }
}

/// [`accumulate_chunk`] over all `d` components: 64 at a time, then 32, then 16.
///
/// # Safety
/// As [`accumulate_chunk`], with `d` a multiple of 16.
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi2,popcnt,avx2,fma,f16c")]
unsafe fn accumulate_g<R: Row, const G: usize, const W: usize>(
    p: &[[f32; W]],
    rows: impl Fn(usize) -> (R, f32),
    n: usize,
    lane0: usize,
    factor: &[f32; W],
    acc: &mut [f32],
    d: usize,
) {
    let mut c = 0;
    // SAFETY: the caller's contract; every chunk ends at or before `d`, and `c` stays a
    // multiple of 64 until the last two chunks (so multiples of 32 there).
    unsafe {
        while c + 64 <= d {
            accumulate_chunk::<R, G, 4, W>(p, &rows, n, lane0, factor, acc, d, c);
            c += 64;
        }
        if c + 32 <= d {
            accumulate_chunk::<R, G, 2, W>(p, &rows, n, lane0, factor, acc, d, c);
            c += 32;
        }
        if c < d {
            accumulate_chunk::<R, G, 1, W>(p, &rows, n, lane0, factor, acc, d, c);
        }
    }
}

/// Dense scores (see `Kernels::dense_scores`); `D` and `d` as [`dense_supported`] admits.
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi2,popcnt,avx2,fma,f16c")]
pub(super) fn dense_scores<D: Value, const W: usize>(
    q: &[f32],
    d: usize,
    rows: &[&[D]],
    lane0: usize,
    s: &mut [[f32; W]],
) {
    assert!(dense_supported::<D>(d), "no 512-bit dense kernel for this row type or length");
    let it = rows.iter().map(|r| (DenseRow(r.as_ptr()), 1.0f32));
    // SAFETY: `Kernels::dense_scores` asserted `lane0 + heads ≤ W` and every `row.len() ≥ d`;
    // `q` holds `heads · d` floats (`heads = q.len() / d`); `d` is a multiple of 16 (above).
    unsafe {
        match q.len() / d {
            1 => scores_g::<_, 1, W>(q, d, it, lane0, s),
            2 => scores_g::<_, 2, W>(q, d, it, lane0, s),
            3 => scores_g::<_, 3, W>(q, d, it, lane0, s),
            _ => scores_g::<_, 4, W>(q, d, it, lane0, s),
        }
    }
}

/// Dense accumulation (see `Kernels::dense_accumulate`); `D` and `d` as
/// [`dense_supported`] admits.
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi2,popcnt,avx2,fma,f16c")]
pub(super) fn dense_accumulate<D: Value, const W: usize>(
    p: &[[f32; W]],
    rows: &[&[D]],
    lane0: usize,
    factor: &[f32; W],
    acc: &mut [f32],
    d: usize,
) {
    assert!(dense_supported::<D>(d), "no 512-bit dense kernel for this row type or length");
    let n = rows.len().min(p.len());
    let at = |t: usize| (DenseRow(rows[t].as_ptr()), 1.0f32);
    // SAFETY: `Kernels::dense_accumulate` asserted `acc.len() == heads · d`,
    // `lane0 + heads ≤ W` and every `row.len() ≥ d`; `d` is a multiple of 16 (above).
    unsafe {
        match acc.len() / d {
            1 => accumulate_g::<_, 1, W>(p, at, n, lane0, factor, acc, d),
            2 => accumulate_g::<_, 2, W>(p, at, n, lane0, factor, acc, d),
            3 => accumulate_g::<_, 3, W>(p, at, n, lane0, factor, acc, d),
            _ => accumulate_g::<_, 4, W>(p, at, n, lane0, factor, acc, d),
        }
    }
}

/// Coded-row scores (see `Kernels::code_scores`), `d` a multiple of 16.
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi2,popcnt,avx2,fma,f16c")]
pub(super) fn code_scores<C: Codes, const W: usize>(
    q: &[f32],
    d: usize,
    rows: &[CodeRow<'_>],
    lane0: usize,
    s: &mut [[f32; W]],
) {
    assert!(d.is_multiple_of(16), "no 512-bit coded-row kernel for this length");
    let it =
        rows.iter().map(|r| (CodedRow::<C>(r.bytes.as_ptr(), PhantomData), r.scale * unit::<C>()));
    // SAFETY: `Kernels::code_scores` asserted `q.len() == heads · d`, `lane0 + heads ≤ W`
    // and that every row holds `C::row_bytes(d)` bytes (so `d` components); `d` is a
    // multiple of 16 (above; of 32 for the blocked formats, which `C::supports` checked).
    unsafe {
        match q.len() / d {
            1 => scores_g::<_, 1, W>(q, d, it, lane0, s),
            2 => scores_g::<_, 2, W>(q, d, it, lane0, s),
            3 => scores_g::<_, 3, W>(q, d, it, lane0, s),
            _ => scores_g::<_, 4, W>(q, d, it, lane0, s),
        }
    }
}

/// Coded-row accumulation (see `Kernels::code_accumulate`), `d` a multiple of 16.
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi2,popcnt,avx2,fma,f16c")]
pub(super) fn code_accumulate<C: Codes, const W: usize>(
    p: &[[f32; W]],
    rows: &[CodeRow<'_>],
    lane0: usize,
    factor: &[f32; W],
    acc: &mut [f32],
    d: usize,
) {
    assert!(d.is_multiple_of(16), "no 512-bit coded-row kernel for this length");
    let n = rows.len().min(p.len());
    let at = |t: usize| {
        let r = &rows[t];
        (CodedRow::<C>(r.bytes.as_ptr(), PhantomData), r.scale * unit::<C>())
    };
    // SAFETY: `Kernels::code_accumulate` asserted `acc.len() == heads · d`,
    // `lane0 + heads ≤ W` and that every row holds `C::row_bytes(d)` bytes; `d` is a
    // multiple of 16 (above; of 32 for the blocked formats).
    unsafe {
        match acc.len() / d {
            1 => accumulate_g::<_, 1, W>(p, at, n, lane0, factor, acc, d),
            2 => accumulate_g::<_, 2, W>(p, at, n, lane0, factor, acc, d),
            3 => accumulate_g::<_, 3, W>(p, at, n, lane0, factor, acc, d),
            _ => accumulate_g::<_, 4, W>(p, at, n, lane0, factor, acc, d),
        }
    }
}

/// The bitmask rows of `bytes` at `starts` as rows read in place (see
/// `Kernels::masked_rows`; `d` a multiple of 64 up to `MASKED_MAX_DIM`), the f16 scale
/// converted by F16C.
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi2,popcnt,avx2,fma,f16c")]
pub(super) fn masked_rows<'a>(
    bytes: &'a [u8],
    starts: &[usize],
    d: usize,
    scale_bytes: usize,
    factor: f32,
    rows: &mut [MaskedRow<'a>],
) {
    use super::codes::{bitmask_row, bitmask_scale};
    for (&start, row) in starts.iter().zip(rows.iter_mut()) {
        *row = match bitmask_row(bytes, start, d, scale_bytes) {
            Some((mask, at, any)) => {
                let f16 = |b: [u8; 2]| {
                    let bits = i32::from(u16::from_le_bytes(b));
                    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bits)))
                };
                let scale = bitmask_scale(bytes, at, scale_bytes, any, f16) * factor;
                MaskedRow { mask, codes: bytes.get(at..).unwrap_or(&[]), scale }
            }
            None => MaskedRow { mask: &NO_MASK[..d / 8], codes: &[], scale: factor },
        };
    }
}

/// Scores over bitmask rows read in place (see `Kernels::masked_scores`).
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi2,popcnt,avx2,fma,f16c")]
pub(super) fn masked_scores<C: Codes, const W: usize>(
    q: &[f32],
    d: usize,
    rows: &[MaskedRow<'_>],
    lane0: usize,
    s: &mut [[f32; W]],
) {
    assert!(d.is_multiple_of(64) && matches!(C::KIND, CodeKind::Fp8 | CodeKind::I8));
    let it = rows.iter().map(|r| (InPlace::<C>(*r, PhantomData), r.scale * unit::<C>()));
    // SAFETY: `Kernels::masked_scores` asserted `q.len() == heads · d`, `lane0 + heads ≤ W`
    // and that every mask holds `d/8` bytes (so every row `d` components, read by `load64`
    // at multiples of 64); its codes are read inside their slice (`expand_word`).
    unsafe {
        match q.len() / d {
            1 => scores_g::<_, 1, W>(q, d, it, lane0, s),
            2 => scores_g::<_, 2, W>(q, d, it, lane0, s),
            3 => scores_g::<_, 3, W>(q, d, it, lane0, s),
            _ => scores_g::<_, 4, W>(q, d, it, lane0, s),
        }
    }
}

/// Accumulation over bitmask rows read in place (see `Kernels::masked_accumulate`).
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi2,popcnt,avx2,fma,f16c")]
pub(super) fn masked_accumulate<C: Codes, const W: usize>(
    p: &[[f32; W]],
    rows: &[MaskedRow<'_>],
    lane0: usize,
    factor: &[f32; W],
    acc: &mut [f32],
    d: usize,
) {
    assert!(d.is_multiple_of(64) && matches!(C::KIND, CodeKind::Fp8 | CodeKind::I8));
    let n = rows.len().min(p.len());
    let at = |t: usize| {
        let r = rows[t];
        (InPlace::<C>(r, PhantomData), r.scale * unit::<C>())
    };
    // SAFETY: `Kernels::masked_accumulate` asserted `acc.len() == heads · d`,
    // `lane0 + heads ≤ W` and that every mask holds `d/8` bytes; `d` is a multiple of 64,
    // so `accumulate_g` reads every row in 64-component chunks.
    unsafe {
        match acc.len() / d {
            1 => accumulate_g::<_, 1, W>(p, at, n, lane0, factor, acc, d),
            2 => accumulate_g::<_, 2, W>(p, at, n, lane0, factor, acc, d),
            3 => accumulate_g::<_, 3, W>(p, at, n, lane0, factor, acc, d),
            _ => accumulate_g::<_, 4, W>(p, at, n, lane0, factor, acc, d),
        }
    }
}
