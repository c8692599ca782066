//! Exhaustive tests of the OCP E4M3FN codec: every one of the 256 codes, and the rounding
//! midpoints between every pair of neighbouring codes (ties to even), checked against an
//! independent f64 reference decoder and nearest-value search.

use kv_sparse::fp8::{DECODE_TABLE, Fp8E4M3};

/// Reference decode straight from the spec (f64 arithmetic; NaN for S.1111.111).
fn reference_decode(code: u8) -> f64 {
    let sign = if code & 0x80 != 0 { -1.0 } else { 1.0 };
    let exp = i32::from((code >> 3) & 0xf);
    let man = f64::from(code & 0x7);
    if exp == 15 && man == 7.0 {
        return f64::NAN;
    }
    let magnitude =
        if exp == 0 { man / 8.0 * 2f64.powi(-6) } else { (1.0 + man / 8.0) * 2f64.powi(exp - 7) };
    sign * magnitude
}

#[test]
fn every_code_decodes_to_the_spec_value_and_round_trips() {
    for code in 0..=255u8 {
        let x = Fp8E4M3::from_bits(code);
        let reference = reference_decode(code);
        let got = x.to_f32();
        assert_eq!(got.to_bits(), DECODE_TABLE[code as usize].to_bits());
        if reference.is_nan() {
            assert!(got.is_nan() && x.is_nan(), "code {code:#04x}");
            assert_eq!(got.is_sign_negative(), code & 0x80 != 0);
        } else {
            assert_eq!(f64::from(got), reference, "code {code:#04x}");
            assert_eq!(got.is_sign_negative(), code & 0x80 != 0, "sign of {code:#04x}");
            assert!(!x.is_nan());
        }
        assert_eq!(Fp8E4M3::from_f32(got).to_bits(), code, "round trip of {code:#04x}");
        assert_eq!(x.to_bits(), code);
    }
    assert_eq!(reference_decode(0x7e), 448.0);
    assert_eq!((0..=255u8).filter(|c| reference_decode(*c).is_nan()).count(), 2);
}

/// The positive finite codes 0x00..=0x7E are strictly increasing in value.
fn positive_codes() -> Vec<(u8, f32)> {
    (0..=0x7eu8).map(|c| (c, Fp8E4M3::from_bits(c).to_f32())).collect()
}

fn next_up(x: f32) -> f32 {
    f32::from_bits(x.to_bits() + 1)
}

fn next_down(x: f32) -> f32 {
    f32::from_bits(x.to_bits() - 1)
}

#[test]
fn midpoints_between_neighbours_round_to_even_both_signs() {
    let codes = positive_codes();
    for pair in codes.windows(2) {
        let ((lo, a), (hi, b)) = (pair[0], pair[1]);
        assert!(a < b, "codes not increasing at {lo:#04x}");
        let mid = ((f64::from(a) + f64::from(b)) / 2.0) as f32;
        assert_eq!(f64::from(mid), (f64::from(a) + f64::from(b)) / 2.0, "mid is exact");
        let even = if lo & 1 == 0 { lo } else { hi };
        for sign in [0u8, 0x80] {
            let s = if sign == 0 { 1.0 } else { -1.0 };
            assert_eq!(Fp8E4M3::from_f32(s * mid).to_bits(), even | sign, "tie {mid} -> even");
            assert_eq!(Fp8E4M3::from_f32(s * next_down(mid)).to_bits(), lo | sign, "below {mid}");
            assert_eq!(Fp8E4M3::from_f32(s * next_up(mid)).to_bits(), hi | sign, "above {mid}");
        }
    }
}

#[test]
fn edges_saturate_and_flush() {
    // Half the smallest subnormal ties to the even code 0; just above goes to 0x01.
    let half_min = 2f32.powi(-10);
    assert_eq!(Fp8E4M3::from_f32(half_min).to_bits(), 0x00);
    assert_eq!(Fp8E4M3::from_f32(-half_min).to_bits(), 0x80);
    assert_eq!(Fp8E4M3::from_f32(next_up(half_min)).to_bits(), 0x01);
    assert_eq!(Fp8E4M3::from_f32(f32::MIN_POSITIVE).to_bits(), 0x00);
    // Above the largest finite value: saturate (464 is the would-be tie with 480).
    for x in [next_up(448.0), 464.0, 479.0, 480.0, 1e9, f32::MAX, f32::INFINITY] {
        assert_eq!(Fp8E4M3::from_f32(x), Fp8E4M3::MAX, "{x}");
        assert_eq!(Fp8E4M3::from_f32(-x), Fp8E4M3::MIN, "-{x}");
    }
    assert_eq!(Fp8E4M3::from_f32(f32::NAN).to_bits(), 0x7f);
    assert_eq!(Fp8E4M3::from_f32(-f32::NAN).to_bits(), 0xff);
}

/// Nearest code by search (ties to even), the specification of `from_f32` for finite x.
fn reference_encode(x: f32, codes: &[(u8, f32)]) -> u8 {
    let sign = if x.is_sign_negative() { 0x80 } else { 0 };
    let a = f64::from(x.abs());
    if a >= 448.0 {
        return 0x7e | sign;
    }
    let i = codes.partition_point(|(_, v)| f64::from(*v) <= a) - 1;
    let (lo, vlo) = codes[i];
    let (hi, vhi) = codes[i + 1];
    let (dlo, dhi) = (a - f64::from(vlo), f64::from(vhi) - a);
    let code = if dlo < dhi || (dlo == dhi && lo & 1 == 0) { lo } else { hi };
    code | sign
}

#[test]
fn dense_sweep_matches_nearest_even_reference() {
    let codes = positive_codes();
    let mut bits = 0u32;
    while bits < 0x4400_0000 {
        let x = f32::from_bits(bits);
        assert_eq!(Fp8E4M3::from_f32(x).to_bits(), reference_encode(x, &codes), "{x:e}");
        assert_eq!(Fp8E4M3::from_f32(-x).to_bits(), reference_encode(-x, &codes), "-{x:e}");
        bits += 0x3f1;
    }
}
