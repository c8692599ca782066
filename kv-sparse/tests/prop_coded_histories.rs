//! Property tests of the whole-row histories behind a buffer (dense quantized, KIVI,
//! TurboQuant-style), through kv-sparse's one hybrid cache:
//! * token order and counts: the `b` newest rows stay in the buffer exactly (as stored in
//!   the buffer format), the history holds the rest, in order;
//! * lossless setting: with `b` at least the number of tokens nothing is coded and every row
//!   reads back bit for bit;
//! * bytes: the history holds exactly its formula (codes, parameters, KIVI's waiting keys);
//! * error: every decoded KIVI element lies within half a quantization step of its group
//!   (plus the f16 rounding of its scale and zero point); a TurboQuant-style row's error is
//!   at most its norm times the codebook's largest cell half-width;
//! * a rejected row (NaN) changes nothing.

use half::f16;
use kv_sparse::decoded::{DecodeRows, packed_bytes};
use kv_sparse::hybrid::{Hybrid, HybridConfig, QuantHybridCache};
use kv_sparse::kivi::KiviRows;
use kv_sparse::quant::{DenseCodec, Int4Blocks, QuantRows};
use kv_sparse::turbo::{TurboRows, codebook};
use proptest::prelude::*;

fn rows(n: usize, d: usize) -> impl Strategy<Value = Vec<f32>> {
    proptest::collection::vec(-8.0f32..8.0, n * d)
}

/// `(d, group, tokens, buffer, rows)`.
fn case() -> impl Strategy<Value = (usize, usize, usize, usize, Vec<f32>)> {
    (
        prop_oneof![Just(32usize), Just(64)],
        prop_oneof![Just(8usize), Just(16), Just(32)],
        0usize..80,
        0usize..24,
    )
        .prop_flat_map(|(d, g, n, b)| (Just(d), Just(g), Just(n), Just(b), rows(n, d)))
}

/// The buffered rows in token order, as `f32`.
fn buffered<S: kv_sparse::hybrid::RowStore>(c: &Hybrid<S, f16>) -> Vec<f32> {
    let (a, b) = c.buffer_keys();
    a.iter().chain(b).map(|x| x.to_f32()).collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn kivi_history_keeps_order_bytes_and_bounds((d, g, n, b, x) in case()) {
        let cfg = HybridConfig { rows_per_block: g, ..HybridConfig::lossless(d, b) };
        let mut c = Hybrid::<KiviRows<2>, f16>::new(cfg).unwrap();
        c.extend(&x, &x).unwrap();
        let h = n.saturating_sub(b);
        prop_assert_eq!((c.sparse_len(), c.buffer_len()), (h, n.min(b)));
        let rounded: Vec<f32> = x.iter().map(|&v| f16::from_f32(v).to_f32()).collect();
        prop_assert_eq!(buffered(&c), rounded[h * d..].to_vec());
        let (keys, values) = c.history();
        let codes = packed_bytes(d, 2);
        let key_bytes = h / g * (4 * d + g * codes) + h % g * 2 * d;
        let value_bytes = h * (4 * d / g + codes);
        let buffer_bytes = 2 * n.min(b) * d * 2;
        prop_assert_eq!(c.memory().held_bytes(), key_bytes + value_bytes + buffer_bytes);
        let mut out = vec![0.0f32; d];
        for j in 0..h {
            keys.decode_row(j, &mut out);
            let group = j / g * g;
            for ch in 0..d {
                let col = (group..(group + g).min(h)).map(|t| rounded[t * d + ch]);
                let (lo, hi) = col.fold((f32::MAX, f32::MIN), |(a, z), v| (a.min(v), z.max(v)));
                let tol = (hi - lo) / 6.0 + (hi.abs() + lo.abs()) * 2e-3 + 1e-6;
                prop_assert!((out[ch] - rounded[j * d + ch]).abs() <= tol);
            }
            values.decode_row(j, &mut out);
            for ch in 0..d {
                let grp = &rounded[j * d + ch / g * g..j * d + ch / g * g + g];
                let (lo, hi) = grp.iter().fold((f32::MAX, f32::MIN), |(a, z), &v| (a.min(v), z.max(v)));
                let tol = (hi - lo) / 6.0 + (hi.abs() + lo.abs()) * 2e-3 + 1e-6;
                prop_assert!((out[ch] - rounded[j * d + ch]).abs() <= tol);
            }
        }
        let before = c.memory().held_bytes();
        prop_assert!(c.append(&vec![f32::NAN; d], &vec![0.0; d]).is_err());
        prop_assert_eq!(c.memory().held_bytes(), before);
    }

    #[test]
    fn turbo_and_quant_histories_keep_order_bytes_and_bounds((d, _g, n, b, x) in case()) {
        let cfg = HybridConfig::lossless(d, b).for_store::<TurboRows<3>>();
        let mut c = Hybrid::<TurboRows<3>, f16>::new(cfg).unwrap();
        c.extend(&x, &x).unwrap();
        let h = n.saturating_sub(b);
        prop_assert_eq!((c.sparse_len(), c.buffer_len()), (h, n.min(b)));
        prop_assert_eq!(c.memory().held_bytes(), h * 2 * (2 + packed_bytes(d, 3)) + 2 * n.min(b) * d * 2);
        let levels = codebook(d, 3);
        let widest = levels.windows(2).map(|w| (w[1] - w[0]) / 2.0).fold(0.0f32, f32::max)
            .max(1.0 - levels[levels.len() - 1]);
        let (keys, _) = c.history();
        let mut out = vec![0.0f32; d];
        for j in 0..h {
            keys.decode_row(j, &mut out);
            let row: Vec<f32> = x[j * d..(j + 1) * d].iter().map(|&v| f16::from_f32(v).to_f32()).collect();
            let norm = row.iter().map(|v| v * v).sum::<f32>().sqrt();
            for ch in 0..d {
                prop_assert!((out[ch] - row[ch]).abs() <= norm * (widest + 1e-3) + 1e-3);
            }
        }
        let qcfg = HybridConfig::lossless(d, b).for_store::<QuantRows<Int4Blocks>>();
        let mut q = QuantHybridCache::<Int4Blocks, f16>::new(qcfg).unwrap();
        q.extend(&x, &x).unwrap();
        prop_assert_eq!(q.memory().held_bytes(), h * 2 * Int4Blocks::row_bytes(d) + 2 * n.min(b) * d * 2);
        prop_assert_eq!(buffered(&q), buffered(&c));
    }

    /// With `b` ≥ tokens nothing is coded: every row reads back bit for bit from an f32
    /// buffer, whatever the history format.
    #[test]
    fn a_buffer_holding_every_token_is_lossless((d, g, n, _b, x) in case()) {
        let b = n.max(1);
        let kivi = HybridConfig { rows_per_block: g, ..HybridConfig::lossless(d, b) };
        let mut k = Hybrid::<KiviRows<4>, f32>::new(kivi).unwrap();
        let mut t = Hybrid::<TurboRows<2>, f32>::new(HybridConfig::lossless(d, b).for_store::<TurboRows<2>>()).unwrap();
        k.extend(&x, &x).unwrap();
        t.extend(&x, &x).unwrap();
        for c in [k.buffer_keys(), k.buffer_values(), t.buffer_keys(), t.buffer_values()] {
            let all: Vec<f32> = c.0.iter().chain(c.1).copied().collect();
            prop_assert_eq!(&all, &x);
        }
        prop_assert_eq!((k.sparse_len(), t.sparse_len()), (0, 0));
    }
}
