//! Deterministic tests of the hybrid cache: token order, eviction, `b = 0`, `k = head_dim`,
//! bulk insert equal to sequential appends, the non-finite policy and scales.

use half::{bf16, f16};
use kv_sparse::fp8::Fp8E4M3;
use kv_sparse::hybrid::{HybridCache, HybridConfig, HybridView, NonFinitePolicy};
use kv_sparse::{Error, SparseIndex, Value};

fn row(t: usize, d: usize) -> Vec<f32> {
    (0..d).map(|i| ((t * 31 + i * 17) % 23) as f32 * 0.37 - 4.0).collect()
}

fn decode_all<I: SparseIndex, V: Value, D: Value>(
    view: HybridView<'_, I, V, D>,
) -> (Vec<Vec<f32>>, Vec<Vec<f32>>) {
    let d = view.head_dim;
    let mut keys = Vec::new();
    let mut values = Vec::new();
    for t in 0..view.len() {
        let (mut k, mut v) = (vec![0.0; d], vec![0.0; d]);
        view.key_into(t, &mut k).unwrap();
        view.value_into(t, &mut v).unwrap();
        keys.push(k);
        values.push(v);
    }
    (keys, values)
}

#[test]
fn lossless_mode_reads_back_bit_exact() {
    for buffer in [0, 1, 3, 8] {
        let cfg = HybridConfig { rows_per_block: 2, ..HybridConfig::lossless(6, buffer) };
        let mut cache = HybridCache::<u8, f32, f32>::new(cfg).unwrap();
        for t in 0..10 {
            cache.append(&row(t, 6), &row(t + 100, 6)).unwrap();
        }
        assert_eq!(cache.len(), 10);
        assert_eq!(cache.buffer_len(), buffer.min(10));
        let (keys, values) = decode_all(cache.view());
        for t in 0..10 {
            assert_eq!(keys[t], row(t, 6), "buffer {buffer}, token {t}");
            assert_eq!(values[t], row(t + 100, 6));
        }
    }
}

#[test]
fn pruned_rows_keep_top_k_in_token_order() {
    let cfg = HybridConfig { k_value: 1, ..HybridConfig::new(5, 2, 2) };
    let mut cache = HybridCache::<u16, f32, f32>::new(cfg).unwrap();
    for t in 0..6 {
        cache.append(&row(t, 5), &row(t, 5)).unwrap();
    }
    let view = cache.view();
    assert_eq!((view.sparse_len(), view.buffer_len()), (4, 2));
    for t in 0..4 {
        let r = row(t, 5);
        let keys = view.sparse_keys.row(t).unwrap();
        assert_eq!(keys.len(), 2);
        let kept_min = keys.iter().map(|(_, v)| v.abs()).fold(f32::MAX, f32::min);
        let dropped_max = (0..5)
            .filter(|i| !keys.indices.contains(&(*i as u16)))
            .map(|i| r[i].abs())
            .fold(0.0, f32::max);
        assert!(kept_min >= dropped_max);
        assert_eq!(view.sparse_values.row(t).unwrap().len(), 1);
    }
}

#[test]
fn extend_equals_sequential_appends() {
    for buffer in [0, 2, 5] {
        for pre in [0, 1, 4] {
            let cfg = HybridConfig { rows_per_block: 3, ..HybridConfig::new(4, buffer, 2) };
            let mut a = HybridCache::<u8, Fp8E4M3, bf16>::new(cfg).unwrap();
            let mut b = a.clone();
            for t in 0..pre {
                a.append(&row(t, 4), &row(t + 7, 4)).unwrap();
                b.append(&row(t, 4), &row(t + 7, 4)).unwrap();
            }
            let keys: Vec<f32> = (pre..pre + 9).flat_map(|t| row(t, 4)).collect();
            let values: Vec<f32> = (pre..pre + 9).flat_map(|t| row(t + 7, 4)).collect();
            for t in pre..pre + 9 {
                a.append(&row(t, 4), &row(t + 7, 4)).unwrap();
            }
            b.extend(&keys, &values).unwrap();
            assert_eq!(decode_all(a.view()), decode_all(b.view()), "b={buffer} pre={pre}");
        }
    }
}

#[test]
fn non_finite_policy() {
    let mut strict = HybridCache::<u8, f16, f16>::new(HybridConfig::new(3, 1, 3)).unwrap();
    let err = strict.append(&[1.0, f32::NAN, 0.0], &[0.0; 3]).unwrap_err();
    assert!(matches!(err, Error::NonFinite { position: 1, .. }), "{err}");
    assert!(strict.is_empty());
    let cfg = HybridConfig { non_finite: NonFinitePolicy::Zero, ..HybridConfig::new(3, 1, 3) };
    let mut zero = HybridCache::<u8, f16, f16>::new(cfg).unwrap();
    zero.append(&[1.0, f32::INFINITY, 2.0], &[f32::NAN, 1.0, 1.0]).unwrap();
    zero.append(&[0.0; 3], &[0.0; 3]).unwrap();
    let (keys, values) = decode_all(zero.view());
    assert_eq!(keys[0], [1.0, 0.0, 2.0]);
    assert_eq!(values[0], [0.0, 1.0, 1.0]);
}

#[test]
fn fp8_scale_round_trips_large_values() {
    let cfg = HybridConfig { fp8_scale: Some((4.0, 0.25)), ..HybridConfig::new(2, 0, 2) };
    let mut cache = HybridCache::<u8, Fp8E4M3, f32>::new(cfg).unwrap();
    cache.append(&[1000.0, -8.0], &[0.0625, 100.0]).unwrap(); // 100 / 0.25 = 400: tie -> 384
    let (keys, values) = decode_all(cache.view());
    assert_eq!(keys[0], [1024.0, -8.0]); // 250 -> 256 in fp8, times 4
    assert_eq!(values[0], [0.0625, 96.0]);
    assert_eq!(cache.view().value_scale, (4.0, 0.25));
}
