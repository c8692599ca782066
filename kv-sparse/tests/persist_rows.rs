//! Persisted whole-row hybrids (dense quantized rows, KIVI, TurboQuant-style behind a dense
//! buffer; `CacheImage::rows` / `MappedCache::load_rows`):
//! * round trip: every format, buffer format and token count (KIVI keys waiting for their
//!   group included) reopens to the same coded bytes, waiting rows and buffer, and the
//!   reopened cache continues exactly as the original (the same rows appended to both give
//!   the same bytes);
//! * wrong type: a file of another history or buffer format is a typed error naming both;
//! * fuzz: arbitrary byte edits and cuts of a valid file, re-sealed so that the checksums
//!   pass, never panic — opening or loading fails with an error, or what loads decodes to
//!   finite rows of the right shape. 2 000 cases per format (`PROPTEST_CASES` changes it).

use half::f16;
use kv_sparse::decoded::DecodeRows;
use kv_sparse::hybrid::{Hybrid, HybridConfig, WholeRowStore};
use kv_sparse::kivi::KiviRows;
use kv_sparse::persist::{self, CacheImage, MappedCache};
use kv_sparse::quant::{Fp8Rows, Int4Blocks, Int8Blocks, QuantRows};
use kv_sparse::turbo::{TurboQjlRows, TurboRows};
use kv_sparse::{Error, Value};
use proptest::prelude::*;

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(2_000)
}

/// Deterministic rows with an outlier channel.
fn rows(n: usize, d: usize, seed: u64) -> Vec<f32> {
    (0..n * d)
        .map(|i| {
            let x = (i as u64).wrapping_mul(2654435761).wrapping_add(seed * 97) >> 7;
            (x % 2001) as f32 / 500.0 - 2.0 + if i % d == 5 { 6.0 } else { 0.0 }
        })
        .collect()
}

/// Two heads of `tokens` tokens each, buffer `b`, KIVI group 8.
fn heads<S: WholeRowStore, D: Value>(d: usize, b: usize, tokens: usize) -> Vec<Hybrid<S, D>> {
    let mut cfg = HybridConfig::new(d, b, d).for_store::<S>();
    cfg.rows_per_block = if cfg.rows_per_block > 1 { 8 } else { 1 };
    (0..2u64)
        .map(|h| {
            let mut c = Hybrid::<S, D>::new(cfg).unwrap();
            c.extend(&rows(tokens, d, h), &rows(tokens, d, h + 10)).unwrap();
            c
        })
        .collect()
}

fn same<S: WholeRowStore, D: Value>(a: &Hybrid<S, D>, b: &Hybrid<S, D>, what: &str) {
    let ((ak, av), (bk, bv)) = (a.history_stores(), b.history_stores());
    assert_eq!(ak.coded_bytes(), bk.coded_bytes(), "{what}: key codes");
    assert_eq!(av.coded_bytes(), bv.coded_bytes(), "{what}: value codes");
    assert_eq!(ak.waiting_rows(), bk.waiting_rows(), "{what}: waiting keys");
    let flat = |(x, y): (&[D], &[D])| [x, y].concat().iter().map(|v| v.to_f32()).collect();
    let (ka, kb): (Vec<f32>, Vec<f32>) = (flat(a.buffer_keys()), flat(b.buffer_keys()));
    assert_eq!(ka, kb, "{what}: buffer keys");
    let (va, vb): (Vec<f32>, Vec<f32>) = (flat(a.buffer_values()), flat(b.buffer_values()));
    assert_eq!(va, vb, "{what}: buffer values");
    assert_eq!((a.sparse_len(), a.buffer_len()), (b.sparse_len(), b.buffer_len()), "{what}");
}

fn round_trip<S: WholeRowStore, D: Value>(d: usize, name: &str) {
    for (b, tokens) in [(0, 0), (0, 13), (4, 3), (4, 21), (16, 40)] {
        let what = format!("{name} b={b} tokens={tokens}");
        let mut original = heads::<S, D>(d, b, tokens);
        let refs: Vec<&Hybrid<S, D>> = original.iter().collect();
        let bytes = CacheImage::rows(1, 2, &refs).unwrap().with_identity(b"id").encode().unwrap();
        let file = MappedCache::from_bytes(&bytes).unwrap();
        file.validate_all().unwrap();
        assert_eq!(file.tokens(0, 1).unwrap(), tokens, "{what}");
        let mut loaded: Vec<Hybrid<S, D>> =
            (0..2).map(|h| file.load_rows::<S, D>(0, h).unwrap()).collect();
        for (a, l) in original.iter().zip(&loaded) {
            same(a, l, &what);
        }
        // Both continue alike: 11 more tokens cross a KIVI group and evict from the buffer.
        for (h, (a, l)) in original.iter_mut().zip(loaded.iter_mut()).enumerate() {
            let (k, v) = (rows(11, d, 50 + h as u64), rows(11, d, 60 + h as u64));
            a.extend(&k, &v).unwrap();
            l.extend(&k, &v).unwrap();
            same(a, l, &format!("{what}, continued"));
        }
    }
}

#[test]
fn every_whole_row_format_round_trips_and_continues() {
    round_trip::<QuantRows<Int8Blocks>, f16>(32, "int8");
    round_trip::<QuantRows<Int4Blocks>, f32>(64, "int4");
    round_trip::<QuantRows<Fp8Rows>, half::bf16>(32, "fp8");
    round_trip::<KiviRows<2>, f16>(32, "kivi2");
    round_trip::<KiviRows<4>, f32>(64, "kivi4");
    round_trip::<TurboRows<2>, f16>(32, "turbo2");
    round_trip::<TurboRows<3>, f16>(64, "turbo3");
    round_trip::<TurboRows<4>, f32>(32, "turbo4");
    round_trip::<TurboQjlRows<3>, f16>(32, "turbo3 qjl");
    round_trip::<TurboQjlRows<2>, f32>(64, "turbo2 qjl");
}

#[test]
fn a_file_of_another_format_is_a_typed_error() {
    let heads = heads::<KiviRows<2>, f16>(32, 4, 20);
    let refs: Vec<_> = heads.iter().collect();
    let bytes = CacheImage::rows(1, 2, &refs).unwrap().encode().unwrap();
    let file = MappedCache::from_bytes(&bytes).unwrap();
    let err = file.load_rows::<TurboRows<2>, f16>(0, 0).unwrap_err();
    assert!(
        matches!(&err, Error::FormatMismatch { expected, got, .. }
            if expected.contains("turbo2") && got.contains("kivi2")),
        "{err}"
    );
    assert!(matches!(file.load_rows::<KiviRows<2>, f32>(0, 0), Err(Error::FormatMismatch { .. })));
    assert!(matches!(file.load_rows::<KiviRows<2>, f16>(1, 0), Err(Error::OutOfRange { .. })));
    assert!(matches!(file.view::<u8, f16, f16>(0, 0), Err(Error::FormatMismatch { .. })));
    assert!(matches!(file.load_quant::<Int8Blocks>(0, 0), Err(Error::FormatMismatch { .. })));
}

/// Opens and loads an edited, re-sealed image: errors are fine, panics are not; what loads
/// decodes finite.
fn fuzz<S: WholeRowStore>(edits: &[(usize, u8)], cut: usize)
where
    for<'a> HistoryOf<'a, S>: Views,
{
    let heads = heads::<S, f16>(32, 4, 27);
    let refs: Vec<_> = heads.iter().collect();
    let mut bytes = CacheImage::rows(1, 2, &refs).unwrap().encode().unwrap();
    let n = bytes.len();
    for &(at, b) in edits {
        bytes[at % n] = b;
    }
    bytes.truncate(n - cut % n);
    persist::reseal(&mut bytes);
    let Ok(file) = MappedCache::from_bytes(&bytes) else { return };
    for h in 0..2 {
        if let Ok(head) = file.load_rows::<S, f16>(0, h) {
            HistoryOf(&head).check_finite();
        }
    }
}

/// A loaded head's history, read back through the kernels' decoders.
struct HistoryOf<'a, S>(&'a Hybrid<S, f16>);

/// Decodes every history row and checks it finite.
trait Views {
    fn check_finite(&self);
}

fn all_finite<K: DecodeRows>(rows: &K) {
    let mut out = vec![0.0; rows.head_dim()];
    for j in 0..rows.num_rows() {
        rows.decode_into(j, &mut out).unwrap();
        assert!(out.iter().all(|x| x.is_finite()), "row {j}");
    }
}

impl<const B: usize> Views for HistoryOf<'_, KiviRows<B>> {
    fn check_finite(&self) {
        let (k, v) = self.0.history();
        all_finite(&k);
        all_finite(&v);
    }
}

impl<const B: usize> Views for HistoryOf<'_, TurboRows<B>> {
    fn check_finite(&self) {
        let (k, v) = self.0.history();
        all_finite(&k);
        all_finite(&v);
    }
}

impl Views for HistoryOf<'_, QuantRows<Int4Blocks>> {
    fn check_finite(&self) {
        let (k, v) = self.0.history();
        let mut out = vec![0.0; k.head_dim()];
        for view in [k, v] {
            for j in 0..view.num_rows() {
                view.decode_row(j, &mut out).unwrap();
                assert!(out.iter().all(|x| x.is_finite()), "row {j}");
            }
        }
    }
}

fn edits() -> impl Strategy<Value = (Vec<(usize, u8)>, usize)> {
    (proptest::collection::vec((any::<usize>(), any::<u8>()), 1..6), 0usize..64)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases()))]

    #[test]
    fn edited_kivi_files_never_panic((e, cut) in edits()) {
        fuzz::<KiviRows<2>>(&e, cut);
    }

    #[test]
    fn edited_turbo_files_never_panic((e, cut) in edits()) {
        fuzz::<TurboRows<3>>(&e, cut);
    }

    #[test]
    fn edited_quantized_files_never_panic((e, cut) in edits()) {
        fuzz::<QuantRows<Int4Blocks>>(&e, cut);
    }
}
