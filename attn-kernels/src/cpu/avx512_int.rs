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

    /// The f16 bits of block `b`'s scale ([`IntRow::BLOCKED`] rows; 1.0 otherwise).
    ///
    /// # Safety
    /// The row holds block `b`.
    unsafe fn scale_bits(self, b: usize) -> i16 {
        let _ = b;
        0x3c00
    }
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

    #[inline(always)]
    unsafe fn scale_bits(self, b: usize) -> i16 {
        // SAFETY: the caller guarantees block `b`, which starts with its f16 scale.
        unsafe { self.block(b * BLOCK).cast::<i16>().read_unaligned() }
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
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi2,avx512vnni,popcnt,avx2,fma,f16c")]
#[inline]
fn fold(v: __m512) -> __m256 {
    let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v)));
    _mm256_add_ps(_mm512_castps512_ps256(v), hi)
}

/// `s[t][lane0 + h] = factor_t · σ_h · Σ_i c_{h,i} · κ_i(row_t) · s_i(row_t)` for the `G`
/// heads of `q`, one row at a time (each row's sums reduced on their own).
///
/// # Safety
/// Every row holds `q.d` components (`q.d` a multiple of 64); `q` holds `G` heads; `s` has
/// `lane0 + G ≤ W` lanes.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi2,avx512vnni,popcnt,avx2,fma,f16c")]
unsafe fn row_scores_g<R: IntRow, const G: usize, const W: usize>(
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

/// Per 128-bit lane `L`, the four heads' partial sums `[h0, h1, h2, h3]` over the lane's
/// 32-bit sums of one row (`a[h]`: head `h`'s sixteen).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi2,avx512vnni,popcnt,avx2,fma,f16c")]
#[inline]
fn heads4(a: &[__m512i; 4]) -> __m512i {
    let p01 =
        _mm512_add_epi32(_mm512_unpacklo_epi32(a[0], a[1]), _mm512_unpackhi_epi32(a[0], a[1]));
    let p23 =
        _mm512_add_epi32(_mm512_unpacklo_epi32(a[2], a[3]), _mm512_unpackhi_epi32(a[2], a[3]));
    _mm512_add_epi32(_mm512_unpacklo_epi64(p01, p23), _mm512_unpackhi_epi64(p01, p23))
}

/// `[x₀ + x₁, x₂ + x₃, y₀ + y₁, y₂ + y₃]` over the 128-bit lanes of `x` and `y`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi2,avx512vnni,popcnt,avx2,fma,f16c")]
#[inline]
fn pair_lanes(x: __m512i, y: __m512i) -> __m512i {
    _mm512_add_epi32(_mm512_shuffle_i32x4::<0x88>(x, y), _mm512_shuffle_i32x4::<0xdd>(x, y))
}

/// [`pair_lanes`] on f32 lanes.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi2,avx512vnni,popcnt,avx2,fma,f16c")]
#[inline]
fn pair_lanes_ps(x: __m512, y: __m512) -> __m512 {
    _mm512_add_ps(_mm512_shuffle_f32x4::<0x88>(x, y), _mm512_shuffle_f32x4::<0xdd>(x, y))
}

/// Four f32 values, each broadcast over one 128-bit lane.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi2,avx512vnni,popcnt,avx2,fma,f16c")]
#[inline]
fn per_lane(v: __m128) -> __m512 {
    let idx = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
    _mm512_permutexvar_ps(idx, _mm512_castps128_ps512(v))
}

/// [`row_scores_g`] for four rows at once: their `4 × G` integer products reduce together
/// in one transposing tree (45 vector operations for sixteen sums, against a fold and a
/// horizontal sum per row and head), leaving row `r`'s heads in 128-bit lane `r`. Row `r`'s
/// factor is lane `r` of `factors`.
///
/// # Safety
/// As [`row_scores_g`], for the four rows of `rows` and the four rows of `s`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi2,avx512vnni,popcnt,avx2,fma,f16c")]
unsafe fn quad_scores_g<R: IntRow, const G: usize, const W: usize>(
    q: QueryView<'_>,
    rows: [R; 4],
    factors: __m128,
    lane0: usize,
    s: &mut [[f32; W]],
) {
    let d = q.d;
    let chunks = d / CHUNK;
    let flip = _mm512_set1_epi8(i8::MIN);
    let zero = _mm512_setzero_si512();
    let (qp, bp) = (q.codes.as_ptr(), q.bias.as_ptr());
    let sigma = _mm512_broadcast_f32x4(_mm_set_ps(
        if G > 3 { q.scales[3] } else { 0.0 },
        if G > 2 { q.scales[2] } else { 0.0 },
        if G > 1 { q.scales[1] } else { 0.0 },
        q.scales[0],
    ));
    let factors = per_lane(factors);
    // SAFETY: the caller's contract: every row holds `d` components (`d/32` blocks), read 64
    // at a time at multiples of 64 below `d`; `q.codes` holds `G·d` codes, `q.bias`
    // `G·chunks·16` lanes and `q.total` `16·G`; every `s[r]` has `lane0 + G ≤ W` lanes, and
    // each store writes lanes `lane0..lane0 + G` of it.
    unsafe {
        let sums = if R::BLOCKED {
            let (mut y01, mut y23) = (_mm512_setzero_ps(), _mm512_setzero_ps());
            for ch in 0..chunks {
                let c = ch * CHUNK;
                let mut a = [[zero; 4]; 4];
                for (r, ar) in a.iter_mut().enumerate() {
                    let k = _mm512_xor_si512(rows[r].codes64(c), flip);
                    for (h, ah) in ar.iter_mut().enumerate().take(G) {
                        let b = _mm512_loadu_si512(bp.add((h * chunks + ch) * 16).cast());
                        let qh = _mm512_loadu_si512(qp.add(h * d + c).cast());
                        *ah = _mm512_dpbusd_epi32(b, k, qh);
                    }
                }
                // Lanes 0–1 of a row hold block 2·ch, lanes 2–3 block 2·ch + 1.
                let x01 = _mm512_cvtepi32_ps(pair_lanes(heads4(&a[0]), heads4(&a[1])));
                let x23 = _mm512_cvtepi32_ps(pair_lanes(heads4(&a[2]), heads4(&a[3])));
                let (b0, b1) = (2 * ch, 2 * ch + 1);
                let scales = |x: R, y: R| {
                    let bits = _mm_set_epi16(
                        0,
                        0,
                        0,
                        0,
                        y.scale_bits(b1),
                        y.scale_bits(b0),
                        x.scale_bits(b1),
                        x.scale_bits(b0),
                    );
                    per_lane(_mm_cvtph_ps(bits))
                };
                y01 = _mm512_fmadd_ps(x01, scales(rows[0], rows[1]), y01);
                y23 = _mm512_fmadd_ps(x23, scales(rows[2], rows[3]), y23);
            }
            pair_lanes_ps(y01, y23)
        } else {
            let total: [__m512i; 4] = std::array::from_fn(|h| {
                if h < G { _mm512_loadu_si512(q.total.as_ptr().add(16 * h).cast()) } else { zero }
            });
            let mut a = [total; 4];
            for ch in 0..chunks {
                let c = ch * CHUNK;
                for (r, ar) in a.iter_mut().enumerate() {
                    let k = _mm512_xor_si512(rows[r].codes64(c), flip);
                    for (h, ah) in ar.iter_mut().enumerate().take(G) {
                        let qh = _mm512_loadu_si512(qp.add(h * d + c).cast());
                        *ah = _mm512_dpbusd_epi32(*ah, k, qh);
                    }
                }
            }
            let x01 = pair_lanes(heads4(&a[0]), heads4(&a[1]));
            let x23 = pair_lanes(heads4(&a[2]), heads4(&a[3]));
            _mm512_cvtepi32_ps(pair_lanes(x01, x23))
        };
        let v = _mm512_mul_ps(sums, _mm512_mul_ps(factors, sigma));
        let mask = (1u8 << G) - 1;
        let lanes = [
            _mm512_castps512_ps128(v),
            _mm512_extractf32x4_ps::<1>(v),
            _mm512_extractf32x4_ps::<2>(v),
            _mm512_extractf32x4_ps::<3>(v),
        ];
        for (st, x) in s.iter_mut().zip(lanes) {
            _mm_mask_storeu_ps(st.as_mut_ptr().add(lane0), mask, x);
        }
    }
}

/// Integer scores of rows `row(t)`, `t < n`, into `s[t]`: four rows at a time
/// ([`quad_scores_g`]), the last `n mod 4` one by one ([`row_scores_g`]).
///
/// # Safety
/// As [`row_scores_g`], for rows `0..n` and `s[..n]`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi2,avx512vnni,popcnt,avx2,fma,f16c")]
unsafe fn scores_g<R: IntRow, const G: usize, const W: usize>(
    q: QueryView<'_>,
    n: usize,
    row: impl Fn(usize) -> (R, f32),
    lane0: usize,
    s: &mut [[f32; W]],
) {
    let quads = n / 4 * 4;
    // SAFETY: the caller's contract, for every group of four rows and the rest.
    unsafe {
        for (t, st) in (0..quads).step_by(4).zip(s.chunks_exact_mut(4)) {
            let [(r0, f0), (r1, f1), (r2, f2), (r3, f3)] =
                [row(t), row(t + 1), row(t + 2), row(t + 3)];
            // The row factors go straight into one vector: an array of (row, factor) pairs
            // built on the stack and reloaded as one vector stalls on store forwarding.
            quad_scores_g::<R, G, W>(q, [r0, r1, r2, r3], _mm_set_ps(f3, f2, f1, f0), lane0, st);
        }
        row_scores_g::<R, G, W>(q, (quads..n).map(row), lane0, &mut s[quads..]);
    }
}

/// `scores_g` for the number of heads in `q`.
///
/// # Safety
/// As [`scores_g`], with 1 to 4 heads in `q`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi2,avx512vnni,popcnt,avx2,fma,f16c")]
unsafe fn scores<R: IntRow, const W: usize>(
    q: QueryView<'_>,
    n: usize,
    row: impl Fn(usize) -> (R, f32),
    lane0: usize,
    s: &mut [[f32; W]],
) {
    // SAFETY: the caller's contract.
    unsafe {
        match q.heads() {
            1 => scores_g::<R, 1, W>(q, n, row, lane0, s),
            2 => scores_g::<R, 2, W>(q, n, row, lane0, s),
            3 => scores_g::<R, 3, W>(q, n, row, lane0, s),
            _ => scores_g::<R, 4, W>(q, n, row, lane0, s),
        }
    }
}

/// Integer scores over coded rows (see `Kernels::code_scores_i8`).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi2,avx512vnni,popcnt,avx2,fma,f16c")]
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
                let row = |t: usize| (Flat(rows[t].bytes.as_ptr()), rows[t].scale);
                scores::<_, W>(q, rows.len(), row, lane0, s)
            }
            CodeKind::Q8Blocks => {
                let row = |t: usize| (Blocks(rows[t].bytes.as_ptr()), rows[t].scale);
                scores::<_, W>(q, rows.len(), row, lane0, s)
            }
            _ => unreachable!("integer products take int8 keys only"),
        }
    }
}

/// Integer scores over bitmask rows of int8 codes read in place (see
/// `Kernels::masked_scores_i8`).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi2,avx512vnni,popcnt,avx2,fma,f16c")]
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
    unsafe { scores::<_, W>(q, rows.len(), |t| (Masked(rows[t]), rows[t].scale), lane0, s) }
}
