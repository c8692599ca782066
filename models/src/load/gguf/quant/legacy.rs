//! ggml's 32-element block quantisations: `Q4_0`, `Q4_1`, `Q5_0`, `Q5_1` and `Q8_0`. Each
//! block is one or two f16 parameters (scale `d`, minimum `m`) and packed codes; element
//! `j < 16` of a 4/5-bit block sits in the low nibble of byte `j`, element `j + 16` in its
//! high nibble, and the fifth bit of element `j` is bit `j` of the little-endian `qh` word.
//! Every value is one f32 product (plus one f32 sum for the `_1` types), the same operations
//! in the same order as ggml's reference dequantiser, so results are bit-exact.

use bytemuck::{Pod, Zeroable};

use super::{Block, half};

/// Elements per block of the 32-wide legacy quantisations.
pub const QK: usize = 32;

/// `Q4_0`: one f16 scale `d`, 32 4-bit codes; `x = (q − 8)·d`.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
pub struct BlockQ4_0 {
    d: [u8; 2],
    qs: [u8; QK / 2],
}

/// `Q4_1`: f16 scale `d` and minimum `m`, 32 4-bit codes; `x = q·d + m`.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
pub struct BlockQ4_1 {
    d: [u8; 2],
    m: [u8; 2],
    qs: [u8; QK / 2],
}

/// `Q5_0`: f16 scale `d`, the 32 fifth bits `qh`, 32 low nibbles; `x = (q − 16)·d`.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
pub struct BlockQ5_0 {
    d: [u8; 2],
    qh: [u8; 4],
    qs: [u8; QK / 2],
}

/// `Q5_1`: f16 scale `d` and minimum `m`, fifth bits `qh`, low nibbles; `x = q·d + m`.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
pub struct BlockQ5_1 {
    d: [u8; 2],
    m: [u8; 2],
    qh: [u8; 4],
    qs: [u8; QK / 2],
}

/// `Q8_0`: f16 scale `d`, 32 signed 8-bit codes; `x = q·d`.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
pub struct BlockQ8_0 {
    d: [u8; 2],
    qs: [i8; QK],
}

const _: () = assert!(std::mem::size_of::<BlockQ4_0>() == 18);
const _: () = assert!(std::mem::size_of::<BlockQ4_1>() == 20);
const _: () = assert!(std::mem::size_of::<BlockQ5_0>() == 22);
const _: () = assert!(std::mem::size_of::<BlockQ5_1>() == 24);
const _: () = assert!(std::mem::size_of::<BlockQ8_0>() == 34);

/// The 5-bit codes of a block: low nibbles from `qs`, fifth bits from `qh`.
fn five_bit(qh: [u8; 4], qs: &[u8; QK / 2]) -> [u8; QK] {
    let qh = u32::from_le_bytes(qh);
    let mut q = [0u8; QK];
    for (j, &b) in qs.iter().enumerate() {
        q[j] = (b & 0x0f) | ((((qh >> j) & 1) as u8) << 4);
        q[j + QK / 2] = (b >> 4) | ((((qh >> (j + QK / 2)) & 1) as u8) << 4);
    }
    q
}

impl Block for BlockQ4_0 {
    const ELEMENTS: usize = QK;

    fn dequantize(&self, out: &mut [f32]) {
        let d = half(self.d);
        for (j, &q) in self.qs.iter().enumerate() {
            out[j] = ((q & 0x0f) as i32 - 8) as f32 * d;
            out[j + QK / 2] = ((q >> 4) as i32 - 8) as f32 * d;
        }
    }
}

impl Block for BlockQ4_1 {
    const ELEMENTS: usize = QK;

    fn dequantize(&self, out: &mut [f32]) {
        let (d, m) = (half(self.d), half(self.m));
        for (j, &q) in self.qs.iter().enumerate() {
            out[j] = (q & 0x0f) as f32 * d + m;
            out[j + QK / 2] = (q >> 4) as f32 * d + m;
        }
    }
}

impl Block for BlockQ5_0 {
    const ELEMENTS: usize = QK;

    fn dequantize(&self, out: &mut [f32]) {
        let d = half(self.d);
        for (o, q) in out.iter_mut().zip(five_bit(self.qh, &self.qs)) {
            *o = (q as i32 - 16) as f32 * d;
        }
    }
}

impl Block for BlockQ5_1 {
    const ELEMENTS: usize = QK;

    fn dequantize(&self, out: &mut [f32]) {
        let (d, m) = (half(self.d), half(self.m));
        for (o, q) in out.iter_mut().zip(five_bit(self.qh, &self.qs)) {
            *o = q as f32 * d + m;
        }
    }
}

impl Block for BlockQ8_0 {
    const ELEMENTS: usize = QK;

    fn dequantize(&self, out: &mut [f32]) {
        let d = half(self.d);
        for (o, &q) in out.iter_mut().zip(&self.qs) {
            *o = q as f32 * d;
        }
    }
}
