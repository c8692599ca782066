//! AVX2 + FMA + F16C kernels over rows of packed 2- to 4-bit codes (x86-64), read in place
//! with head-major queries and accumulators as the dense kernels keep them: the
//! TurboQuant-style rows of [`kv_sparse::decoded::RowCodes::Codebook`] (arXiv 2504.19874,
//! §3.1) — an f16 norm, then `d` codes — and KIVI's rows (arXiv 2402.02750, §3): keys per
//! channel over token groups ([`kv_sparse::decoded::RowCodes::TokenGroups`]), values per
//! token over channel groups ([`kv_sparse::decoded::RowCodes::ChannelGroups`]).
//!
//! Eight codes sit in `bits` bytes: one 32-bit load, a per-lane shift (`vpsrlvd`) and a mask
//! turn them into eight indices, and one `vpermps` against the codebook held in a register
//! (two and a blend for the sixteen levels of 4-bit codes) into eight levels — no table in
//! memory, no byte per code on the stack; KIVI's codes are their own levels (the identity
//! book). The levels then meet every head of the pass as a dense row's decoded values do:
//! * codebook keys: `s = norm · Σ_c q_c · levels[code_c]`;
//! * KIVI keys: `s = q·z + Σ_c (q_c · scale_c) · code_c`, the prepared queries `q_c · scale_c`
//!   and `q·z` formed once per token group by the caller;
//! * codebook values: `acc_c += (p · norm) · levels[code_c]`;
//! * KIVI values: `acc_c += p · (zero_g + scale_g · code_c)`, eight channels of one group
//!   turned into values by one FMA.

use std::arch::x86_64::*;

use super::avx2::store_sums;
use super::avx2_codes::scale_at;
use super::tile::TILE;

/// A codebook of up to sixteen levels in two registers (levels 0–7, 8–15), with the shifts
/// and mask that turn a 32-bit word of eight packed codes into eight indices.
#[derive(Clone, Copy)]
pub(super) struct Book {
    lo: __m256,
    hi: __m256,
    shifts: __m256i,
    mask: __m256i,
    bits: usize,
}

impl Book {
    /// The book of `levels` (`2^bits` of them, `bits` in 2..=4).
    ///
    /// # Panics
    /// If `bits` is outside 2..=4 or `levels` holds other than `2^bits` values.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) fn new(levels: &[f32], bits: usize) -> Self {
        assert!((2..=4).contains(&bits) && levels.len() == 1 << bits, "a 2- to 4-bit codebook");
        let mut table = [0.0f32; 16];
        table[..levels.len()].copy_from_slice(levels);
        let b = bits as i32;
        // SAFETY: `table` holds 16 floats: two unaligned 8-float loads.
        let (lo, hi) =
            unsafe { (_mm256_loadu_ps(table.as_ptr()), _mm256_loadu_ps(table.as_ptr().add(8))) };
        Self {
            lo,
            hi,
            shifts: _mm256_setr_epi32(0, b, 2 * b, 3 * b, 4 * b, 5 * b, 6 * b, 7 * b),
            mask: _mm256_set1_epi32((1 << bits) - 1),
            bits,
        }
    }

    /// The levels of the eight codes of components `c..c + 8` of a row whose codes are
    /// `codes` (`c` a multiple of 8, `codes` holding `(c + 8) · bits / 8` bytes).
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    fn levels8(&self, codes: &[u8], c: usize) -> __m256 {
        let at = c * self.bits / 8;
        let word = match codes.get(at..at + 4) {
            // SAFETY: the slice holds 4 bytes; unaligned read.
            Some(w) => u32::from_le(unsafe { w.as_ptr().cast::<u32>().read_unaligned() }),
            None => {
                let mut w = [0u8; 4];
                w[..self.bits].copy_from_slice(&codes[at..at + self.bits]);
                u32::from_le_bytes(w)
            }
        };
        let idx = _mm256_and_si256(
            _mm256_srlv_epi32(_mm256_set1_epi32(word as i32), self.shifts),
            self.mask,
        );
        let lo = _mm256_permutevar8x32_ps(self.lo, idx);
        if self.bits < 4 {
            return lo;
        }
        let hi = _mm256_permutevar8x32_ps(self.hi, idx);
        _mm256_blendv_ps(lo, hi, _mm256_castsi256_ps(_mm256_slli_epi32::<28>(idx)))
    }
}

/// The identity book of `bits`-bit codes: level `i` is `i` (KIVI's codes are read as the
/// integers they are).
///
/// # Panics
/// If `bits` is outside 2..=4.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn identity_book(bits: usize) -> Book {
    let levels: [f32; 16] = std::array::from_fn(|i| i as f32);
    Book::new(&levels[..1 << bits], bits)
}

/// Most parameter groups per value row the AVX2 value kernel takes (KIVI's groups of 32
/// channels up to `d = 256`); rows with more go through the portable kernels.
pub(super) const MAX_VALUE_GROUPS: usize = 8;

/// How a row of values is laid out and turned into values.
#[derive(Clone, Copy)]
pub(super) enum ValueRows {
    /// A codebook row: its f16 norm, then `d` codes of the book's levels.
    Codebook(Book),
    /// A KIVI value row: `d / group` pairs of (f16 scale, f16 zero), then `d` codes (the
    /// book is the identity); element `c` is `zero_g + scale_g · code_c`, `g = c / group`.
    Groups {
        /// The identity book of the codes' width.
        book: Book,
        /// Channels per group (a multiple of 8).
        group: usize,
    },
}

impl ValueRows {
    /// The book the codes are looked up in.
    fn book(&self) -> &Book {
        match self {
            ValueRows::Codebook(book) | ValueRows::Groups { book, .. } => book,
        }
    }

    /// Parameter groups per row of `d` elements and the channels of each.
    fn groups(&self, d: usize) -> (usize, usize) {
        match *self {
            ValueRows::Codebook(_) => (1, d),
            ValueRows::Groups { group, .. } => (d / group, group),
        }
    }

    /// Bytes of a row's parameters before its codes.
    fn header(&self, d: usize) -> usize {
        match *self {
            ValueRows::Codebook(_) => 2,
            ValueRows::Groups { group, .. } => 4 * (d / group),
        }
    }

    /// The scale and zero of group `g` of `row` (a codebook row: its norm and 0).
    ///
    /// # Safety
    /// `row` holds [`ValueRows::header`] bytes and `g` is one of its groups.
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    unsafe fn params(&self, row: &[u8], g: usize) -> (f32, f32) {
        // SAFETY: the caller guarantees the header's bytes: a norm at 0, or group `g`'s scale
        // and zero at `4g` and `4g + 2`.
        unsafe {
            match self {
                ValueRows::Codebook(_) => (norm(row), 0.0),
                ValueRows::Groups { .. } => {
                    (scale_at(row.as_ptr().add(4 * g)), scale_at(row.as_ptr().add(4 * g + 2)))
                }
            }
        }
    }
}

/// Prepares KIVI keys' queries for one token group whose header holds a (f16 scale, f16
/// zero) pair per channel: `qs_h[c] = q_h[c] · scale_c` for every head-major query of `q`,
/// and `qz[h] = Σ_c q_h[c] · zero_c`; `d` a multiple of 8.
///
/// # Panics
/// If `header` holds fewer than `4d` bytes or the buffers do not fit the queries.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn prepare_key_group(
    q: &[f32],
    header: &[u8],
    d: usize,
    qs: &mut [f32],
    qz: &mut [f32],
) {
    let heads = q.len() / d;
    assert!(d.is_multiple_of(8) && header.len() >= 4 * d && qs.len() >= q.len());
    assert!(qz.len() >= heads);
    let hp = header.as_ptr();
    let mut z = [_mm256_setzero_ps(); super::tile::MAX_LANES];
    let z = &mut z[..heads];
    let mut c = 0;
    while c < d {
        // SAFETY: channels `c..c + 8` take header bytes `4c..4c + 32`, inside `4d` (asserted).
        let (a, b) = unsafe {
            (
                _mm256_cvtph_ps(_mm_loadu_si128(hp.add(4 * c).cast())),
                _mm256_cvtph_ps(_mm_loadu_si128(hp.add(4 * c + 16).cast())),
            )
        };
        // a = s0 z0 s1 z1 | s2 z2 s3 z3, b = s4 z4 s5 z5 | s6 z6 s7 z7: the even lanes are the
        // scales, the odd ones the zeros, each pair of 64-bit halves then put in order.
        let scale =
            _mm256_castpd_ps(_mm256_permute4x64_pd::<0xD8>(_mm256_castps_pd(_mm256_shuffle_ps::<
                0x88,
            >(a, b))));
        let zero =
            _mm256_castpd_ps(_mm256_permute4x64_pd::<0xD8>(_mm256_castps_pd(_mm256_shuffle_ps::<
                0xDD,
            >(a, b))));
        for (h, zh) in z.iter_mut().enumerate() {
            // SAFETY: `q` and `qs` hold `heads · d` floats (asserted) and `c + 8 ≤ d`.
            unsafe {
                let qh = _mm256_loadu_ps(q.as_ptr().add(h * d + c));
                _mm256_storeu_ps(qs.as_mut_ptr().add(h * d + c), _mm256_mul_ps(qh, scale));
                *zh = _mm256_fmadd_ps(qh, zero, *zh);
            }
        }
        c += 8;
    }
    for (o, zh) in qz.iter_mut().zip(z.iter()) {
        *o = super::avx2::hsum(*zh);
    }
}

/// A codebook row: its f16 norm, then its packed codes.
///
/// # Safety
/// `row` holds at least 2 bytes.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn norm(row: &[u8]) -> f32 {
    // SAFETY: the caller guarantees the 2 bytes of the norm.
    unsafe { scale_at(row.as_ptr()) }
}

/// `s[t][lane0 + h] = norm_t · Σ_c q_h[c] · levels[code_c(rows[t])]` for the `q.len() / d`
/// (1 to 4) head-major queries in `q`; every row holds `2 + d · bits / 8` bytes, `d` a
/// multiple of 8.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn book_scores<const W: usize>(
    book: &Book,
    q: &[f32],
    d: usize,
    rows: &[&[u8]],
    lane0: usize,
    s: &mut [[f32; W]],
) {
    scores::<W, true>(book, q, d, rows, &[], lane0, s);
}

/// `s[t][lane0 + h] = bias[h] + Σ_c q_h[c] · levels[code_c(codes[t])]` for the
/// `q.len() / d` (1 to 4) head-major queries in `q` and as many biases; every row of
/// `codes` holds its `d · bits / 8` bytes of codes alone, `d` a multiple of 8 (KIVI's keys:
/// the identity book, the queries times the group's channel scales, the bias `q·z`).
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn code_scores<const W: usize>(
    book: &Book,
    q: &[f32],
    d: usize,
    codes: &[&[u8]],
    bias: &[f32],
    lane0: usize,
    s: &mut [[f32; W]],
) {
    scores::<W, false>(book, q, d, codes, bias, lane0, s);
}

/// [`scores_g`] for the `q.len() / d` (1 to 4) heads of `q`.
#[target_feature(enable = "avx2,fma,f16c")]
fn scores<const W: usize, const NORM: bool>(
    book: &Book,
    q: &[f32],
    d: usize,
    rows: &[&[u8]],
    bias: &[f32],
    lane0: usize,
    s: &mut [[f32; W]],
) {
    match q.len() / d {
        1 => scores_g::<1, W, NORM>(book, q, d, rows, bias, lane0, s),
        2 => scores_g::<2, W, NORM>(book, q, d, rows, bias, lane0, s),
        3 => scores_g::<3, W, NORM>(book, q, d, rows, bias, lane0, s),
        _ => scores_g::<4, W, NORM>(book, q, d, rows, bias, lane0, s),
    }
}

/// The scores of [`book_scores`] (`NORM`: rows open with an f16 norm that scales their
/// sums) or [`code_scores`] (rows of codes alone, a bias per head added).
#[target_feature(enable = "avx2,fma,f16c")]
fn scores_g<const G: usize, const W: usize, const NORM: bool>(
    book: &Book,
    q: &[f32],
    d: usize,
    rows: &[&[u8]],
    bias: &[f32],
    lane0: usize,
    s: &mut [[f32; W]],
) {
    assert!(d.is_multiple_of(8) && q.len() == G * d && lane0 + G <= W && s.len() >= rows.len());
    let header = if NORM { 2 } else { 0 };
    assert!(NORM || bias.len() == G, "a bias per head");
    assert!(rows.iter().all(|r| r.len() >= header + d * book.bits / 8), "a short code row");
    let qp = q.as_ptr();
    for (row, st) in rows.iter().zip(s.iter_mut()) {
        let codes = &row[header..];
        let mut a = [[_mm256_setzero_ps(); 2]; G];
        let mut c = 0;
        while c < d {
            let k = book.levels8(codes, c);
            let half = (c / 8) % 2;
            for (h, ah) in a.iter_mut().enumerate() {
                // SAFETY: `q` holds `G · d` floats (asserted) and `c + 8 ≤ d`.
                let qh = unsafe { _mm256_loadu_ps(qp.add(h * d + c)) };
                ah[half] = _mm256_fmadd_ps(qh, k, ah[half]);
            }
            c += 8;
        }
        let mut sums = a.map(|ah| _mm256_add_ps(ah[0], ah[1]));
        if NORM {
            // SAFETY: the row holds its 2 norm bytes (asserted).
            let n = _mm256_set1_ps(unsafe { norm(row) });
            sums = sums.map(|sh| _mm256_mul_ps(sh, n));
        }
        store_sums(&sums, &mut st[lane0..lane0 + G]);
        for (x, b) in st[lane0..lane0 + G].iter_mut().zip(bias) {
            *x += b;
        }
    }
}

/// `acc_h = factor[lane0 + h] · acc_h + Σ_t p[t][lane0 + h] · v(rows[t])` for the
/// `acc.len() / d` (1 to 4) head-major accumulators in `acc`, `v` the row's values as
/// `layout` reads them (`norm_t · levels[code]` for codebook rows, `zero_g + scale_g · code`
/// for KIVI's).
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn book_accumulate<const W: usize>(
    layout: &ValueRows,
    p: &[[f32; W]],
    rows: &[&[u8]],
    lane0: usize,
    factor: &[f32; W],
    acc: &mut [f32],
    d: usize,
) {
    // The row weights are kept per group: sized for the groups the layout has (one for
    // codebook rows), so that the common cases fill no more than they use.
    match layout.groups(d).0 {
        1 => accumulate_n::<1, W>(layout, p, rows, lane0, factor, acc, d),
        2 => accumulate_n::<2, W>(layout, p, rows, lane0, factor, acc, d),
        3 | 4 => accumulate_n::<4, W>(layout, p, rows, lane0, factor, acc, d),
        _ => accumulate_n::<MAX_VALUE_GROUPS, W>(layout, p, rows, lane0, factor, acc, d),
    }
}

/// [`book_accumulate`] for rows of at most `NG` parameter groups.
#[target_feature(enable = "avx2,fma,f16c")]
fn accumulate_n<const NG: usize, const W: usize>(
    layout: &ValueRows,
    p: &[[f32; W]],
    rows: &[&[u8]],
    lane0: usize,
    factor: &[f32; W],
    acc: &mut [f32],
    d: usize,
) {
    match acc.len() / d {
        1 => accumulate_g::<1, NG, W>(layout, p, rows, lane0, factor, acc, d),
        2 => accumulate_g::<2, NG, W>(layout, p, rows, lane0, factor, acc, d),
        3 => accumulate_g::<3, NG, W>(layout, p, rows, lane0, factor, acc, d),
        _ => accumulate_g::<4, NG, W>(layout, p, rows, lane0, factor, acc, d),
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
fn accumulate_g<const G: usize, const NG: usize, const W: usize>(
    layout: &ValueRows,
    p: &[[f32; W]],
    rows: &[&[u8]],
    lane0: usize,
    factor: &[f32; W],
    acc: &mut [f32],
    d: usize,
) {
    let (groups, width) = layout.groups(d);
    let (book, header) = (layout.book(), layout.header(d));
    assert!(d.is_multiple_of(8) && acc.len() == G * d && lane0 + G <= W);
    assert!(rows.len() <= TILE && p.len() >= rows.len());
    assert!(groups <= NG && width.is_multiple_of(8) && groups * width == d);
    assert!(rows.iter().all(|r| r.len() >= header + d * book.bits / 8), "a short value row");
    // Each row's weight per group and head (`p · scale_g`), and per group and head the sum of
    // `p · zero_g` over the rows, added to the group's channels once.
    let mut w = [[[0.0f32; G]; NG]; TILE];
    let mut zs = [[0.0f32; G]; NG];
    for ((wt, pt), row) in w.iter_mut().zip(p).zip(rows) {
        for (g, (wg, zg)) in wt[..groups].iter_mut().zip(&mut zs).enumerate() {
            // SAFETY: every row holds its header (asserted) and `g` is one of its groups.
            let (scale, zero) = unsafe { layout.params(row, g) };
            for (h, (x, z)) in wg.iter_mut().zip(zg.iter_mut()).enumerate() {
                *x = pt[lane0 + h] * scale;
                *z += pt[lane0 + h] * zero;
            }
        }
    }
    let zeros = matches!(layout, ValueRows::Groups { .. });
    let ap = acc.as_mut_ptr();
    let mut c = 0;
    while c < d {
        let wide = c + 16 <= d;
        // One group (codebook rows, or KIVI rows of one channel group): group 0 throughout,
        // known at compile time.
        let g = if NG == 1 { 0 } else { c / width };
        let g1 = if NG == 1 { 0 } else { ((c + 8) / width).min(groups - 1) };
        let mut a = [[_mm256_setzero_ps(); 2]; G];
        // SAFETY: `acc` holds `G · d` floats (asserted); every access covers components
        // `c..c + 8`, or `c + 8..c + 16` when `wide`, of one head, inside `d`. Groups are
        // multiples of 8 channels, so `c..c + 8` lies in group `g` and `c + 8..c + 16` in
        // `g` or `g + 1`.
        unsafe {
            for (h, ah) in a.iter_mut().enumerate() {
                let f = _mm256_set1_ps(factor[lane0 + h]);
                ah[0] = _mm256_mul_ps(_mm256_loadu_ps(ap.add(h * d + c)), f);
                if wide {
                    ah[1] = _mm256_mul_ps(_mm256_loadu_ps(ap.add(h * d + c + 8)), f);
                }
            }
            for (wt, row) in w.iter().zip(rows) {
                let codes = &row[header..];
                let v0 = book.levels8(codes, c);
                let v1 = if wide { book.levels8(codes, c + 8) } else { _mm256_setzero_ps() };
                for (h, ah) in a.iter_mut().enumerate() {
                    ah[0] = _mm256_fmadd_ps(_mm256_set1_ps(wt[g][h]), v0, ah[0]);
                    ah[1] = _mm256_fmadd_ps(_mm256_set1_ps(wt[g1][h]), v1, ah[1]);
                }
            }
            for (h, ah) in a.iter_mut().enumerate() {
                if zeros {
                    ah[0] = _mm256_add_ps(ah[0], _mm256_set1_ps(zs[g][h]));
                    if wide {
                        ah[1] = _mm256_add_ps(ah[1], _mm256_set1_ps(zs[g1][h]));
                    }
                }
                _mm256_storeu_ps(ap.add(h * d + c), ah[0]);
                if wide {
                    _mm256_storeu_ps(ap.add(h * d + c + 8), ah[1]);
                }
            }
        }
        c += if wide { 16 } else { 8 };
    }
}

#[cfg(test)]
mod tests {
    use kv_sparse::decoded::{packed_bytes, unpack_row};

    use super::*;

    /// The prepared queries of a KIVI key group are the products the scalar formula gives:
    /// the interleaved (scale, zero) pairs are split in the right order for every chunk.
    #[test]
    fn key_group_preparation_matches_the_scalar_products() {
        if !crate::Isa::Avx2.is_available() {
            println!("SKIPPED: this CPU has no AVX2 + FMA + F16C");
            return;
        }
        for (d, heads) in [(8usize, 1usize), (64, 4), (128, 3), (256, 2)] {
            let pairs: Vec<half::f16> = (0..2 * d)
                .map(|i| half::f16::from_f32(((i * 37 % 101) as f32 - 50.0) / 16.0))
                .collect();
            let header: Vec<u8> = pairs.iter().flat_map(|x| x.to_le_bytes()).collect();
            let q: Vec<f32> = (0..heads * d).map(|i| ((i * 13 % 29) as f32 - 14.0) / 7.0).collect();
            let (mut qs, mut qz) = (vec![0.0f32; heads * d], vec![0.0f32; heads]);
            // SAFETY: AVX2, FMA and F16C are available (checked above).
            unsafe { prepare_key_group(&q, &header, d, &mut qs, &mut qz) };
            for h in 0..heads {
                let mut z = 0.0f64;
                for c in 0..d {
                    let (scale, zero) = (pairs[2 * c].to_f32(), pairs[2 * c + 1].to_f32());
                    assert_eq!(qs[h * d + c], q[h * d + c] * scale, "d={d} h={h} c={c}");
                    z += f64::from(q[h * d + c]) * f64::from(zero);
                }
                assert!((f64::from(qz[h]) - z).abs() <= 1e-4 * (1.0 + z.abs()), "d={d} h={h}");
            }
        }
    }

    /// Every code of every width reads as the level `unpack_row` gives it, at every chunk of
    /// a row — the last one included, where fewer than four bytes remain.
    #[test]
    fn levels_in_registers_match_the_unpacked_codes() {
        if !crate::Isa::Avx2.is_available() {
            println!("SKIPPED: this CPU has no AVX2 + FMA + F16C");
            return;
        }
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for bits in 2..=4usize {
            let levels: Vec<f32> = (0..1 << bits).map(|i| i as f32 * 0.75 - 3.0).collect();
            for d in [8usize, 24, 64, 128] {
                let packed: Vec<u8> = (0..packed_bytes(d, bits)).map(|_| next() as u8).collect();
                let mut codes = vec![0u8; d];
                unpack_row(&packed, bits, &mut codes);
                // SAFETY: AVX2, FMA and F16C are available (checked above).
                let book = unsafe { Book::new(&levels, bits) };
                for c in (0..d).step_by(8) {
                    let mut got = [0.0f32; 8];
                    // SAFETY: as above; `got` holds 8 floats.
                    unsafe { _mm256_storeu_ps(got.as_mut_ptr(), book.levels8(&packed, c)) };
                    let want: Vec<f32> =
                        codes[c..c + 8].iter().map(|&x| levels[usize::from(x)]).collect();
                    assert_eq!(got.to_vec(), want, "bits={bits} d={d} c={c}");
                }
            }
        }
    }
}
