//! AVX2 + FMA + F16C kernels over codebook rows (x86-64): the TurboQuant-style rows of
//! [`kv_sparse::decoded::RowCodes::Codebook`] (arXiv 2504.19874, §3.1) — an f16 norm, then
//! `d` codes of 2, 3 or 4 bits — read in place, with head-major queries and accumulators as
//! the dense kernels keep them.
//!
//! Eight codes sit in `bits` bytes: one 32-bit load, a per-lane shift (`vpsrlvd`) and a mask
//! turn them into eight indices, and one `vpermps` against the codebook held in a register
//! (two and a blend for the sixteen levels of 4-bit codes) into eight levels — no table in
//! memory, no byte per code on the stack. The levels then meet every head of the pass as a
//! dense row's decoded values do: `s = norm · Σ_c q_c · levels[code_c]` for the scores,
//! `acc_c += (p · norm) · levels[code_c]` for the values.

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
    match q.len() / d {
        1 => scores_g::<1, W>(book, q, d, rows, lane0, s),
        2 => scores_g::<2, W>(book, q, d, rows, lane0, s),
        3 => scores_g::<3, W>(book, q, d, rows, lane0, s),
        _ => scores_g::<4, W>(book, q, d, rows, lane0, s),
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
fn scores_g<const G: usize, const W: usize>(
    book: &Book,
    q: &[f32],
    d: usize,
    rows: &[&[u8]],
    lane0: usize,
    s: &mut [[f32; W]],
) {
    assert!(d.is_multiple_of(8) && q.len() == G * d && lane0 + G <= W && s.len() >= rows.len());
    assert!(rows.iter().all(|r| r.len() >= 2 + d * book.bits / 8), "a short codebook row");
    let qp = q.as_ptr();
    for (row, st) in rows.iter().zip(s.iter_mut()) {
        let codes = &row[2..];
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
        // SAFETY: the row holds its 2 norm bytes (asserted).
        let n = _mm256_set1_ps(unsafe { norm(row) });
        let mut sums = [_mm256_setzero_ps(); G];
        for (sh, ah) in sums.iter_mut().zip(&a) {
            *sh = _mm256_mul_ps(_mm256_add_ps(ah[0], ah[1]), n);
        }
        store_sums(&sums, &mut st[lane0..lane0 + G]);
    }
}

/// `acc_h = factor[lane0 + h] · acc_h + Σ_t p[t][lane0 + h] · norm_t · levels[code(rows[t])]`
/// for the `acc.len() / d` (1 to 4) head-major accumulators in `acc`; rows as in
/// [`book_scores`].
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn book_accumulate<const W: usize>(
    book: &Book,
    p: &[[f32; W]],
    rows: &[&[u8]],
    lane0: usize,
    factor: &[f32; W],
    acc: &mut [f32],
    d: usize,
) {
    match acc.len() / d {
        1 => accumulate_g::<1, W>(book, p, rows, lane0, factor, acc, d),
        2 => accumulate_g::<2, W>(book, p, rows, lane0, factor, acc, d),
        3 => accumulate_g::<3, W>(book, p, rows, lane0, factor, acc, d),
        _ => accumulate_g::<4, W>(book, p, rows, lane0, factor, acc, d),
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
fn accumulate_g<const G: usize, const W: usize>(
    book: &Book,
    p: &[[f32; W]],
    rows: &[&[u8]],
    lane0: usize,
    factor: &[f32; W],
    acc: &mut [f32],
    d: usize,
) {
    assert!(d.is_multiple_of(8) && acc.len() == G * d && lane0 + G <= W);
    assert!(rows.len() <= TILE && p.len() >= rows.len());
    assert!(rows.iter().all(|r| r.len() >= 2 + d * book.bits / 8), "a short codebook row");
    let mut w = [[0.0f32; G]; TILE];
    for ((wt, pt), row) in w.iter_mut().zip(p).zip(rows) {
        // SAFETY: every row holds its 2 norm bytes (asserted).
        let n = unsafe { norm(row) };
        for (h, x) in wt.iter_mut().enumerate() {
            *x = pt[lane0 + h] * n;
        }
    }
    let ap = acc.as_mut_ptr();
    let mut c = 0;
    while c < d {
        let wide = c + 16 <= d;
        let mut a = [[_mm256_setzero_ps(); 2]; G];
        // SAFETY: `acc` holds `G · d` floats (asserted); every access covers components
        // `c..c + 8`, or `c + 8..c + 16` when `wide`, of one head, inside `d`.
        unsafe {
            for (h, ah) in a.iter_mut().enumerate() {
                let f = _mm256_set1_ps(factor[lane0 + h]);
                ah[0] = _mm256_mul_ps(_mm256_loadu_ps(ap.add(h * d + c)), f);
                if wide {
                    ah[1] = _mm256_mul_ps(_mm256_loadu_ps(ap.add(h * d + c + 8)), f);
                }
            }
            for (wt, row) in w.iter().zip(rows) {
                let codes = &row[2..];
                let v0 = book.levels8(codes, c);
                let v1 = if wide { book.levels8(codes, c + 8) } else { _mm256_setzero_ps() };
                for (h, ah) in a.iter_mut().enumerate() {
                    let wh = _mm256_set1_ps(wt[h]);
                    ah[0] = _mm256_fmadd_ps(wh, v0, ah[0]);
                    ah[1] = _mm256_fmadd_ps(wh, v1, ah[1]);
                }
            }
            for (h, ah) in a.iter().enumerate() {
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
