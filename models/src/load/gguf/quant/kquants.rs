//! ggml's K-quantisations: 256-element super-blocks (`Q2_K`, `Q3_K`, `Q4_K`, `Q5_K`,
//! `Q6_K`, `Q8_K`) split into sub-blocks of 16 or 32 elements, each with its own small
//! integer scale (and, for `Q2_K`/`Q4_K`/`Q5_K`, minimum) multiplied by the super-block's
//! f16 `d` (and `dmin`). Codes are bit-planes: for the 2-bit planes of `Q2_K`/`Q3_K`/`Q6_K`,
//! element `128·c + 32·s + l` is bits `2s..2s+2` of byte `32·c + l`; for the nibbles of
//! `Q4_K`/`Q5_K`, element `64·c + 32·h + l` is nibble `h` of byte `32·c + l`; single high
//! bits (`Q3_K`'s `hmask`, `Q5_K`'s `qh`) of element `32·b + l` are bit `b` of byte `l`.
//!
//! Every value is computed as ggml's reference dequantiser computes it — the sub-block
//! scale `d·sc` (and minimum `dmin·m`) rounded to f32 first, then one product (and one
//! difference) — so results are bit-exact.

use bytemuck::{Pod, Zeroable};

use super::{Block, half};

/// Elements per K-quant super-block.
pub const QK_K: usize = 256;

/// `Q2_K`: 16 sub-blocks of 16; byte `scales[i]` holds the 4-bit scale (low nibble) and
/// 4-bit minimum (high nibble) of sub-block `i`; `x = d·sc·q − dmin·m` with 2-bit `q`.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
pub struct BlockQ2K {
    scales: [u8; QK_K / 16],
    qs: [u8; QK_K / 4],
    d: [u8; 2],
    dmin: [u8; 2],
}

/// `Q3_K`: 16 sub-blocks of 16 with signed 6-bit scales (packed in 12 bytes, offset 32);
/// `x = d·sc·(q − 4·(1 − h))` with 2-bit `q` and the high bit `h` from `hmask`.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
pub struct BlockQ3K {
    hmask: [u8; QK_K / 8],
    qs: [u8; QK_K / 4],
    scales: [u8; 12],
    d: [u8; 2],
}

/// `Q4_K`: 8 sub-blocks of 32 with 6-bit scales and minima (packed in 12 bytes);
/// `x = d·sc·q − dmin·m` with 4-bit `q`.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
pub struct BlockQ4K {
    d: [u8; 2],
    dmin: [u8; 2],
    scales: [u8; 12],
    qs: [u8; QK_K / 2],
}

/// `Q5_K`: `Q4_K` plus a fifth bit per element from `qh`.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
pub struct BlockQ5K {
    d: [u8; 2],
    dmin: [u8; 2],
    scales: [u8; 12],
    qh: [u8; QK_K / 8],
    qs: [u8; QK_K / 2],
}

/// `Q6_K`: 16 sub-blocks of 16 with signed 8-bit scales; 6-bit codes from 4 low bits
/// (`ql`) and 2 high bits (`qh`); `x = d·sc·(q − 32)`.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
pub struct BlockQ6K {
    ql: [u8; QK_K / 2],
    qh: [u8; QK_K / 4],
    scales: [i8; QK_K / 16],
    d: [u8; 2],
}

/// `Q8_K`: an f32 scale `d`, 256 signed 8-bit codes and 16 i16 partial sums (used by
/// ggml's dot products, not needed to dequantise); `x = d·q`.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
pub struct BlockQ8K {
    d: [u8; 4],
    qs: [i8; QK_K],
    bsums: [u8; QK_K / 8],
}

const _: () = assert!(std::mem::size_of::<BlockQ2K>() == 84);
const _: () = assert!(std::mem::size_of::<BlockQ3K>() == 110);
const _: () = assert!(std::mem::size_of::<BlockQ4K>() == 144);
const _: () = assert!(std::mem::size_of::<BlockQ5K>() == 176);
const _: () = assert!(std::mem::size_of::<BlockQ6K>() == 210);
const _: () = assert!(std::mem::size_of::<BlockQ8K>() == 292);

/// Bits `2s..2s+2` of byte `32·c + l` for element `128·c + 32·s + l`.
fn two_bit_planes(qs: &[u8; QK_K / 4]) -> [u8; QK_K] {
    let mut q = [0u8; QK_K];
    for (e, v) in q.iter_mut().enumerate() {
        let (c, s, l) = (e / 128, (e / 32) % 4, e % 32);
        *v = (qs[32 * c + l] >> (2 * s)) & 3;
    }
    q
}

/// Nibble `h` of byte `32·c + l` for element `64·c + 32·h + l`.
fn nibble_planes(qs: &[u8; QK_K / 2]) -> [u8; QK_K] {
    let mut q = [0u8; QK_K];
    for (e, v) in q.iter_mut().enumerate() {
        let (c, h, l) = (e / 64, (e / 32) % 2, e % 32);
        *v = (qs[32 * c + l] >> (4 * h)) & 0x0f;
    }
    q
}

/// Bit `b` of byte `l` for element `32·b + l`.
fn bit_planes(bits: &[u8; QK_K / 8]) -> [u8; QK_K] {
    let mut q = [0u8; QK_K];
    for (e, v) in q.iter_mut().enumerate() {
        *v = (bits[e % 32] >> (e / 32)) & 1;
    }
    q
}

/// The eight 6-bit (scale, minimum) pairs of `Q4_K`/`Q5_K`: bytes 0–3 hold scales 0–3 in
/// their low 6 bits, bytes 4–7 minima 0–3; scales and minima 4–7 take their low nibble
/// from bytes 8–11 (low and high nibble) and their top 2 bits from the top of bytes 0–7.
fn scale_min_k4(s: &[u8; 12]) -> ([u8; 8], [u8; 8]) {
    let (mut sc, mut m) = ([0u8; 8], [0u8; 8]);
    for j in 0..4 {
        sc[j] = s[j] & 63;
        m[j] = s[j + 4] & 63;
        sc[j + 4] = (s[j + 8] & 0x0f) | ((s[j] >> 6) << 4);
        m[j + 4] = (s[j + 8] >> 4) | ((s[j + 4] >> 6) << 4);
    }
    (sc, m)
}

/// The sixteen signed 6-bit scales of `Q3_K`: low nibbles from bytes 0–7 (scales 0–7 in
/// the low nibble, 8–15 in the high), top 2 bits of scale `i` from bits `2·(i/4)` of byte
/// `8 + i % 4`; stored with an offset of 32.
fn scales_q3k(s: &[u8; 12]) -> [i8; 16] {
    let mut out = [0i8; 16];
    for (i, o) in out.iter_mut().enumerate() {
        let low = (s[i % 8] >> (4 * (i / 8))) & 0x0f;
        let high = (s[8 + i % 4] >> (2 * (i / 4))) & 3;
        *o = (low | (high << 4)) as i8 - 32;
    }
    out
}

impl Block for BlockQ2K {
    const ELEMENTS: usize = QK_K;

    fn dequantize(&self, out: &mut [f32]) {
        let (d, dmin) = (half(self.d), half(self.dmin));
        for (e, (o, q)) in out.iter_mut().zip(two_bit_planes(&self.qs)).enumerate() {
            let s = self.scales[e / 16];
            let (dl, ml) = (d * (s & 0x0f) as f32, dmin * (s >> 4) as f32);
            *o = dl * q as f32 - ml;
        }
    }
}

impl Block for BlockQ3K {
    const ELEMENTS: usize = QK_K;

    fn dequantize(&self, out: &mut [f32]) {
        let d = half(self.d);
        let scales = scales_q3k(&self.scales);
        let high = bit_planes(&self.hmask);
        for (e, (o, q)) in out.iter_mut().zip(two_bit_planes(&self.qs)).enumerate() {
            let dl = d * scales[e / 16] as f32;
            let q = q as i32 - if high[e] == 1 { 0 } else { 4 };
            *o = dl * q as f32;
        }
    }
}

impl Block for BlockQ4K {
    const ELEMENTS: usize = QK_K;

    fn dequantize(&self, out: &mut [f32]) {
        let (d, dmin) = (half(self.d), half(self.dmin));
        let (sc, m) = scale_min_k4(&self.scales);
        for (e, (o, q)) in out.iter_mut().zip(nibble_planes(&self.qs)).enumerate() {
            let (d1, m1) = (d * sc[e / 32] as f32, dmin * m[e / 32] as f32);
            *o = d1 * q as f32 - m1;
        }
    }
}

impl Block for BlockQ5K {
    const ELEMENTS: usize = QK_K;

    fn dequantize(&self, out: &mut [f32]) {
        let (d, dmin) = (half(self.d), half(self.dmin));
        let (sc, m) = scale_min_k4(&self.scales);
        let high = bit_planes(&self.qh);
        for (e, (o, q)) in out.iter_mut().zip(nibble_planes(&self.qs)).enumerate() {
            let (d1, m1) = (d * sc[e / 32] as f32, dmin * m[e / 32] as f32);
            *o = d1 * (q | (high[e] << 4)) as f32 - m1;
        }
    }
}

impl Block for BlockQ6K {
    const ELEMENTS: usize = QK_K;

    fn dequantize(&self, out: &mut [f32]) {
        let d = half(self.d);
        let high = two_bit_planes(&self.qh);
        for (e, o) in out.iter_mut().enumerate() {
            // Low 4 bits: nibble `h` of byte `64·c + l` for element `128·c + 64·h + l`.
            let (c, h, l) = (e / 128, (e / 64) % 2, e % 64);
            let low = (self.ql[64 * c + l] >> (4 * h)) & 0x0f;
            let q = (low | (high[e] << 4)) as i32 - 32;
            *o = d * self.scales[e / 16] as f32 * q as f32;
        }
    }
}

impl Block for BlockQ8K {
    const ELEMENTS: usize = QK_K;

    fn dequantize(&self, out: &mut [f32]) {
        let d = f32::from_le_bytes(self.d);
        for (o, &q) in out.iter_mut().zip(&self.qs) {
            *o = d * q as f32;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn q4k_scale_packing_round_trips() {
        // Pack eight 6-bit scales and minima the way the layout describes, then unpack.
        let sc: [u8; 8] = [1, 17, 33, 63, 0, 42, 5, 60];
        let m: [u8; 8] = [62, 3, 48, 7, 21, 63, 0, 36];
        let mut s = [0u8; 12];
        for j in 0..4 {
            s[j] = sc[j] | ((sc[j + 4] >> 4) << 6);
            s[j + 4] = m[j] | ((m[j + 4] >> 4) << 6);
            s[j + 8] = (sc[j + 4] & 0x0f) | ((m[j + 4] & 0x0f) << 4);
        }
        assert_eq!(scale_min_k4(&s), (sc, m));
    }

    #[test]
    fn q3k_scales_cover_the_signed_range() {
        // All low nibbles 0xf and all high pairs 3: every scale is 63 − 32 = 31; all zero: −32.
        assert_eq!(scales_q3k(&[0xff; 12]), [31; 16]);
        assert_eq!(scales_q3k(&[0; 12]), [-32; 16]);
    }
}
