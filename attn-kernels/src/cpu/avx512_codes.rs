//! AVX-512 VBMI2 placement of bitmask rows (x86-64) — SWAN's sparse rows (method section)
//! in the bitmask format, made dense for the coded-row kernels of [`super::avx2_codes`].
//!
//! `vpexpandb` loads the next `popcount(m)` codes of a row and puts them at the set bits of
//! a 64-bit mask `m`, zeros at its clear bits: 64 components per instruction, where the
//! AVX2 placement needs four `pshufb` with their pattern loads and popcounts. The contract
//! is that of [`super::codes`]' portable placement, bytes for bytes: codes beyond `src`
//! read as zero (only a malformed row reaches them).

use std::arch::x86_64::*;

/// Places the codes of a bitmask row (see `Kernels::place_masked`): 64 components per
/// masked expand-load, stored with a byte mask, so a row of any length writes only `out`.
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi2,popcnt")]
#[inline]
pub(super) fn place_masked(mask: &[u8], src: &[u8], at: usize, out: &mut [u8]) {
    let mut pos = at;
    for (m, o) in mask.chunks(8).zip(out.chunks_mut(64)) {
        let mut bytes = [0u8; 8];
        bytes[..m.len()].copy_from_slice(m);
        let bits = u64::from_le_bytes(bytes);
        let n = bits.count_ones() as usize;
        let codes = if pos.checked_add(n).is_some_and(|end| end <= src.len()) {
            // SAFETY: an expand-load reads only the `n = popcount(bits)` contiguous bytes
            // it places (the elements at clear bits are not accessed), and
            // `pos + n ≤ src.len()`.
            unsafe { _mm512_maskz_expandloadu_epi8(bits, src.as_ptr().add(pos).cast()) }
        } else {
            let mut tail = [0u8; 64];
            let rest = src.get(pos..).unwrap_or(&[]);
            let r = rest.len().min(n);
            tail[..r].copy_from_slice(&rest[..r]);
            // SAFETY: `tail` holds 64 bytes, and `n ≤ 64`.
            unsafe { _mm512_maskz_expandloadu_epi8(bits, tail.as_ptr().cast()) }
        };
        let store = if o.len() == 64 { u64::MAX } else { (1u64 << o.len()) - 1 };
        // SAFETY: the byte mask selects the first `o.len() ≤ 64` bytes, all inside `o`.
        unsafe { _mm512_mask_storeu_epi8(o.as_mut_ptr().cast(), store, codes) };
        pos += n;
    }
}

/// The tile form of [`place_masked`] (see `Kernels::place_bitmask_rows`): one call per
/// tile, the scale converted by F16C, every row placed by the inlined expand-loads.
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
    use super::codes::{bitmask_row, bitmask_scale};
    for ((&start, o), sc) in starts.iter().zip(out.chunks_exact_mut(d)).zip(scales) {
        let Some((mask, at, any)) = bitmask_row(bytes, start, d, scale_bytes) else {
            o.fill(0);
            *sc = factor;
            continue;
        };
        place_masked(mask, bytes, at, o);
        let f16 = |b: [u8; 2]| {
            let bits = i32::from(u16::from_le_bytes(b));
            _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bits)))
        };
        *sc = bitmask_scale(bytes, at, scale_bytes, any, f16) * factor;
    }
}
