//! Property: the lossless setting reads back exactly. With `k = head_dim`, `f32` values and
//! an `f32` buffer every row is bit-exact; with 16-bit storage every row equals the 16-bit
//! rounding of the input (SWAN's only approximation is pruning, Appendix A.1).

use half::{bf16, f16};
use kv_sparse::hybrid::HybridView;
use kv_sparse::strategies::{CacheCase, lossless_case};
use kv_sparse::{SparseIndex, Value};
use proptest::prelude::*;

/// Decodes every token and compares bit patterns with `expect(input)`.
fn check_rows<I: SparseIndex, V: Value, D: Value>(
    case: &CacheCase,
    view: HybridView<'_, I, V, D>,
    expect: impl Fn(f32) -> f32,
) -> Result<(), TestCaseError> {
    let d = case.cfg.head_dim;
    prop_assert_eq!(view.len(), case.rows());
    prop_assert_eq!(view.buffer_len(), case.rows().min(case.cfg.buffer));
    let mut out = vec![0.0; d];
    for t in 0..case.rows() {
        for (decode, input) in [(0, case.key(t)), (1, case.value(t))] {
            if decode == 0 {
                view.key_into(t, &mut out).unwrap();
            } else {
                view.value_into(t, &mut out).unwrap();
            }
            let want: Vec<u32> = input.iter().map(|&x| expect(x).to_bits()).collect();
            let got: Vec<u32> = out.iter().map(|x| x.to_bits()).collect();
            prop_assert_eq!(got, want, "token {}", t);
        }
    }
    Ok(())
}

proptest! {
    #[test]
    fn f32_lossless_is_bit_exact(case in lossless_case(48, 40)) {
        let cache = case.build::<u8, f32, f32>().unwrap();
        check_rows(&case, cache.view(), |x| x)?;
        let wide = case.build::<u16, f32, f32>().unwrap();
        check_rows(&case, wide.view(), |x| x)?;
    }

    #[test]
    fn f16_lossless_equals_f16_rounding(case in lossless_case(48, 40)) {
        let round = |x: f32| f16::from_f32(x).to_f32();
        check_rows(&case, case.build::<u8, f16, f16>().unwrap().view(), round)?;
        // An f32 buffer with f16 history rounds the history only.
        let mixed = case.build::<u8, f16, f32>().unwrap();
        let sparse = mixed.sparse_len();
        let view = mixed.view();
        let mut out = vec![0.0; case.cfg.head_dim];
        for t in 0..case.rows() {
            view.key_into(t, &mut out).unwrap();
            let want: Vec<f32> = case.key(t).iter().map(|&x| if t < sparse { round(x) } else { x }).collect();
            prop_assert_eq!(&out, &want);
        }
    }

    #[test]
    fn bf16_lossless_equals_bf16_rounding(case in lossless_case(32, 30)) {
        let round = |x: f32| bf16::from_f32(x).to_f32();
        check_rows(&case, case.build::<u8, bf16, bf16>().unwrap().view(), round)?;
    }
}
