//! AVX-512 VBMI2 placement of bitmask rows (x86-64) — SWAN's sparse rows (method section)
//! in the bitmask format, made dense for the coded-row kernels of [`super::avx2_codes`]
//! (and expanded in registers by those of [`super::avx512`], through [`expand_word`]).
//!
//! `vpexpandb` loads the next `popcount(m)` codes of a row and puts them at the set bits of
//! a 64-bit mask `m`, zeros at its clear bits: 64 components per instruction, where the
//! AVX2 placement needs four `pshufb` with their pattern loads and popcounts. The contract
//! is that of [`super::codes`]' portable placement, bytes for bytes: codes beyond `src`
//! read as zero (only a malformed row reaches them).

use std::arch::x86_64::*;

/// Places the codes of a bitmask row (see `Kernels::place_masked`): 64 components per
/// masked byte expansion, stored with a byte mask, so a row of any length writes only `out`.
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi2,popcnt")]
#[inline]
pub(super) fn place_masked(mask: &[u8], src: &[u8], at: usize, out: &mut [u8]) {
    place_words(mask, src, at, out);
}

/// [`place_masked`], returning the union of the mask's bits (zero when the row keeps
/// nothing): each 64-component word of the mask by [`expand_word`].
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi2,popcnt")]
#[inline]
fn place_words(mask: &[u8], src: &[u8], at: usize, out: &mut [u8]) -> u64 {
    let mut pos = at;
    let mut union = 0;
    for (m, o) in mask.chunks(8).zip(out.chunks_mut(64)) {
        let bits = match <[u8; 8]>::try_from(m) {
            Ok(word) => u64::from_le_bytes(word),
            Err(_) => {
                let mut word = [0u8; 8];
                word[..m.len()].copy_from_slice(m);
                u64::from_le_bytes(word)
            }
        };
        union |= bits;
        let codes = expand_word(bits, src, pos);
        if o.len() == 64 {
            // SAFETY: `o` holds 64 bytes.
            unsafe { _mm512_storeu_si512(o.as_mut_ptr().cast(), codes) };
        } else {
            let store = (1u64 << o.len()) - 1;
            // SAFETY: the byte mask selects the first `o.len() < 64` bytes, all inside `o`.
            unsafe { _mm512_mask_storeu_epi8(o.as_mut_ptr().cast(), store, codes) };
        }
        pos += bits.count_ones() as usize;
    }
    union
}

/// The next `popcount(bits)` codes of `src` from `pos` on, at the set bits of `bits` (zeros
/// at its clear bits; codes beyond `src` read as zero). A whole 64-byte load followed by an
/// in-register expansion when 64 bytes from `pos` lie inside `src` (the usual case: later
/// rows follow); an expand-load of exactly the kept codes near the end of `src`.
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi2,popcnt")]
#[inline]
pub(super) fn expand_word(bits: u64, src: &[u8], pos: usize) -> __m512i {
    let n = bits.count_ones() as usize;
    if pos.checked_add(64).is_some_and(|end| end <= src.len()) {
        // SAFETY: `pos + 64 ≤ src.len()`: 64 readable bytes at `pos`.
        let v = unsafe { _mm512_loadu_si512(src.as_ptr().add(pos).cast()) };
        _mm512_maskz_expand_epi8(bits, v)
    } else if pos.checked_add(n).is_some_and(|end| end <= src.len()) {
        // SAFETY: an expand-load reads only the `n = popcount(bits)` contiguous bytes it
        // places (the elements at clear bits are not accessed), and `pos + n ≤ src.len()`.
        unsafe { _mm512_maskz_expandloadu_epi8(bits, src.as_ptr().add(pos).cast()) }
    } else {
        let mut tail = [0u8; 64];
        let rest = src.get(pos..).unwrap_or(&[]);
        let r = rest.len().min(n);
        tail[..r].copy_from_slice(&rest[..r]);
        // SAFETY: `tail` holds 64 bytes, and `n ≤ 64`.
        unsafe { _mm512_maskz_expandloadu_epi8(bits, tail.as_ptr().cast()) }
    }
}

/// The tile form of [`place_masked`] (see `Kernels::place_bitmask_rows`): one call per
/// tile, the scale converted by F16C, every row placed by the inlined expansions.
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi2,popcnt,f16c")]
pub(super) fn place_bitmask_rows(
    bytes: &[u8],
    starts: &[usize],
    d: usize,
    scale_bytes: usize,
    factor: f32,
    out: &mut [u8],
    scales: &mut [f32],
) {
    use super::codes::bitmask_scale;
    let mask_bytes = d / 8;
    for ((&start, o), sc) in starts.iter().zip(out.chunks_exact_mut(d)).zip(scales) {
        let Some(mask) = start.checked_add(mask_bytes).and_then(|end| bytes.get(start..end)) else {
            o.fill(0);
            *sc = factor;
            continue;
        };
        let at = start + mask_bytes + scale_bytes;
        let any = place_words(mask, bytes, at, o) != 0;
        let f16 = |b: [u8; 2]| {
            let bits = i32::from(u16::from_le_bytes(b));
            _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bits)))
        };
        *sc = bitmask_scale(bytes, at, scale_bytes, any, f16) * factor;
    }
}
