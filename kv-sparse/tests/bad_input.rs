//! Bad input gets a clear typed error — never a panic — and leaves caches unchanged:
//! NaN/∞ (both policies), wrong lengths, k > head_dim, head_dim out of range, bad block
//! sizes and scales, overflowing values, invalid sparse rows and raw CSR parts, bad layers.

use half::{bf16, f16};
use kv_sparse::csr::{CsrStore, CsrView};
use kv_sparse::fp8::{self, Fp8E4M3};
use kv_sparse::hybrid::{HybridCache, HybridConfig, MultiHeadCache, NonFinitePolicy};
use kv_sparse::ring::DenseRing;
use kv_sparse::topk::top_k_magnitude;
use kv_sparse::{Error, ValueFormat};

type Cache = HybridCache<u8, f16, f16>;

fn filled(cfg: HybridConfig, n: usize) -> Cache {
    let mut c = Cache::new(cfg).unwrap();
    for t in 0..n {
        let r: Vec<f32> = (0..cfg.head_dim).map(|i| (i + t) as f32).collect();
        c.append(&r, &r).unwrap();
    }
    c
}

/// Asserts `f` fails with an error matching `pat` and leaves the cache's contents unchanged.
macro_rules! rejects {
    ($cache:expr, $call:expr, $pat:pat) => {{
        let before = format!("{:?}", $cache.view().sparse_keys.values());
        let (len, sparse) = ($cache.len(), $cache.sparse_len());
        let err = $call.unwrap_err();
        assert!(matches!(err, $pat), "unexpected error: {err}");
        assert!(!err.to_string().is_empty());
        assert_eq!(($cache.len(), $cache.sparse_len()), (len, sparse));
        assert_eq!(format!("{:?}", $cache.view().sparse_keys.values()), before);
        err
    }};
}

#[test]
fn non_finite_keys_or_values_are_rejected_under_the_error_policy() {
    let mut c = filled(HybridConfig::new(4, 2, 2), 5);
    for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
        let err = rejects!(
            c,
            c.append(&[0.0, 1.0, bad, 3.0], &[0.0; 4]),
            Error::NonFinite { position: 2, .. }
        );
        assert!(err.to_string().contains("key"), "{err}");
        let err = rejects!(
            c,
            c.append(&[0.0; 4], &[bad, 0.0, 0.0, 0.0]),
            Error::NonFinite { position: 0, .. }
        );
        assert!(err.to_string().contains("value"), "{err}");
        let mut keys = vec![1.0; 12];
        keys[9] = bad;
        rejects!(c, c.extend(&keys, &[1.0; 12]), Error::NonFinite { position: 9, .. });
    }
}

#[test]
fn non_finite_values_become_zero_under_the_zero_policy() {
    let cfg = HybridConfig { non_finite: NonFinitePolicy::Zero, ..HybridConfig::lossless(3, 0) };
    let mut c = HybridCache::<u8, f32, f32>::new(cfg).unwrap();
    c.append(&[f32::NAN, 2.0, f32::NEG_INFINITY], &[1.0, f32::INFINITY, 3.0]).unwrap();
    c.extend(&[f32::INFINITY, 5.0, 6.0], &[7.0, 8.0, f32::NAN]).unwrap();
    let v = c.view();
    let mut out = [9.0; 3];
    v.key_into(0, &mut out).unwrap();
    assert_eq!(out, [0.0, 2.0, 0.0]);
    v.value_into(0, &mut out).unwrap();
    assert_eq!(out, [1.0, 0.0, 3.0]);
    v.key_into(1, &mut out).unwrap();
    assert_eq!(out, [0.0, 5.0, 6.0]);
    v.value_into(1, &mut out).unwrap();
    assert_eq!(out, [7.0, 8.0, 0.0]);
}

#[test]
fn wrong_lengths() {
    let mut c = filled(HybridConfig::new(4, 2, 2), 3);
    rejects!(c, c.append(&[0.0; 3], &[0.0; 4]), Error::LengthMismatch { expected: 4, got: 3, .. });
    rejects!(c, c.append(&[0.0; 4], &[0.0; 5]), Error::LengthMismatch { expected: 4, got: 5, .. });
    rejects!(c, c.extend(&[0.0; 7], &[0.0; 7]), Error::LengthMismatch { .. });
    rejects!(c, c.extend(&[0.0; 8], &[0.0; 4]), Error::LengthMismatch { expected: 8, got: 4, .. });
    let mut out = [0.0; 3];
    assert!(matches!(c.view().key_into(0, &mut out), Err(Error::LengthMismatch { .. })));
    let mut out = [0.0; 4];
    assert!(matches!(
        c.view().key_into(3, &mut out),
        Err(Error::OutOfRange { index: 3, len: 3, .. })
    ));

    let mut s = CsrStore::<u8, f32>::new(4).unwrap();
    assert!(matches!(s.push_dense(&[1.0; 5], 2), Err(Error::LengthMismatch { .. })));
    assert!(matches!(s.push_sparse(&[0, 1], &[1.0]), Err(Error::LengthMismatch { .. })));
    s.push_dense(&[1.0; 4], 2).unwrap();
    assert!(matches!(s.to_dense_row(0, &mut [0.0; 3]), Err(Error::LengthMismatch { .. })));
    assert!(matches!(s.to_dense_row(1, &mut [0.0; 4]), Err(Error::OutOfRange { .. })));
    assert!(matches!(s.row(0).unwrap().dot(&[1.0]), Err(Error::LengthMismatch { .. })));
    assert_eq!(s.len(), 1);

    let mut ring = DenseRing::<f16>::new(4, 2);
    assert!(matches!(ring.push(&[0.0; 2], &mut Vec::new()), Err(Error::LengthMismatch { .. })));
    assert!(ring.is_empty());
    let mut dst = [Fp8E4M3::ZERO; 2];
    assert!(fp8::encode_slice(&[0.0; 3], &mut dst).is_err());
}

#[test]
fn k_larger_than_head_dim() {
    let e = Cache::new(HybridConfig::new(8, 4, 9)).unwrap_err();
    assert!(matches!(e, Error::KTooLarge { k: 9, head_dim: 8, .. }), "{e}");
    let e = Cache::new(HybridConfig { k_value: 100, ..HybridConfig::new(8, 4, 2) }).unwrap_err();
    assert!(matches!(e, Error::KTooLarge { k: 100, .. }));
    let mut s = CsrStore::<u8, f16>::new(8).unwrap();
    assert!(matches!(s.push_dense(&[1.0; 8], 9), Err(Error::KTooLarge { .. })));
    assert!(matches!(top_k_magnitude(&[1.0; 8], 9, &mut Vec::new()), Err(Error::KTooLarge { .. })));
    assert!(s.is_empty());
}

#[test]
fn head_dim_out_of_range() {
    let e = HybridCache::<u16, f16, f16>::new(HybridConfig::new(65536, 0, 1)).unwrap_err();
    assert!(matches!(e, Error::HeadDimOutOfRange { head_dim: 65536, max: 65535, .. }), "{e}");
    assert!(HybridCache::<u16, f16, f16>::new(HybridConfig::new(65535, 0, 1)).is_ok());
    let e = Cache::new(HybridConfig::new(257, 0, 1)).unwrap_err();
    assert!(matches!(e, Error::HeadDimOutOfRange { head_dim: 257, max: 256, .. }));
    assert!(Cache::new(HybridConfig::new(256, 0, 1)).is_ok());
    assert!(matches!(Cache::new(HybridConfig::new(0, 0, 0)), Err(Error::HeadDimOutOfRange { .. })));
    assert!(CsrStore::<u16, f32>::new(70_000).is_err());
    assert!(CsrStore::<u8, f32>::new(0).is_err());
}

#[test]
fn rows_per_block_and_scales() {
    for rpb in [0, 512] {
        let cfg = HybridConfig { rows_per_block: rpb, ..HybridConfig::new(128, 0, 8) };
        assert!(matches!(Cache::new(cfg), Err(Error::RowsPerBlockOutOfRange { max: 511, .. })));
    }
    assert!(CsrStore::<u8, f16>::with_block_rows(128, 511).is_ok());
    for s in [0.0, -1.0, f32::NAN, f32::INFINITY, 1e-40] {
        let cfg = HybridConfig { fp8_scale: Some((1.0, s)), ..HybridConfig::new(8, 0, 8) };
        assert!(matches!(Cache::new(cfg), Err(Error::InvalidScale { .. })), "scale {s}");
    }
}

#[test]
fn overflowing_values() {
    // f16 buffer: 70000 does not fit.
    let mut c = filled(HybridConfig::new(2, 2, 2), 3);
    let e = rejects!(
        c,
        c.append(&[70000.0, 0.0], &[0.0; 2]),
        Error::Overflow { format: ValueFormat::F16, .. }
    );
    assert!(e.to_string().contains("f16"));
    // 65519 rounds to 65504 and fits.
    c.append(&[65519.0, 0.0], &[0.0; 2]).unwrap();
    // f32 buffer, b = 0, f16 sparse values: the sparse format is checked.
    let mut c = HybridCache::<u8, f16, f32>::new(HybridConfig::new(2, 0, 1)).unwrap();
    assert!(matches!(c.append(&[0.0; 2], &[-1e6, 0.0]), Err(Error::Overflow { .. })));
    // ... unless nothing is kept (k = 0).
    let mut c0 = HybridCache::<u8, f16, f32>::new(HybridConfig::new(2, 0, 0)).unwrap();
    c0.append(&[1e6; 2], &[1e6; 2]).unwrap();
    // bf16 overflows only near f32::MAX.
    let mut b = HybridCache::<u8, bf16, bf16>::new(HybridConfig::new(2, 1, 1)).unwrap();
    assert!(b.append(&[f32::MAX, 0.0], &[0.0; 2]).is_err());
    b.append(&[1e38, 0.0], &[0.0; 2]).unwrap();
    // fp8 saturates (OCP saturation mode): no error.
    let mut f = HybridCache::<u8, Fp8E4M3, f32>::new(HybridConfig::new(2, 0, 2)).unwrap();
    f.append(&[1e6, 0.0], &[0.0; 2]).unwrap();
    assert_eq!(f.view().sparse_keys.row(0).unwrap().values[0], Fp8E4M3::MAX);
    // A scale that pushes f16 sparse values past the range is caught too.
    let cfg = HybridConfig { fp8_scale: Some((1e-3, 1.0)), ..HybridConfig::new(2, 1, 2) };
    let mut s = HybridCache::<u8, f16, f32>::new(cfg).unwrap();
    assert!(matches!(s.append(&[100.0, 0.0], &[0.0; 2]), Err(Error::Overflow { .. })));
    assert!(s.is_empty());
}

#[test]
fn invalid_sparse_rows() {
    let mut s = CsrStore::<u8, f32>::new(8).unwrap();
    let e = s.push_sparse(&[1, 1], &[1.0, 1.0]).unwrap_err();
    assert!(matches!(e, Error::InvalidSparseIndex { position: 1, index: 1, .. }), "{e}");
    assert!(matches!(s.push_sparse(&[3, 2], &[1.0, 1.0]), Err(Error::InvalidSparseIndex { .. })));
    assert!(matches!(s.push_sparse(&[8], &[1.0]), Err(Error::InvalidSparseIndex { index: 8, .. })));
    assert!(matches!(s.push_sparse(&[0], &[f32::NAN]), Err(Error::NonFinite { .. })));
    assert!(matches!(s.push_dense(&[f32::INFINITY; 8], 1), Err(Error::NonFinite { .. })));
    assert!(s.is_empty());
}

#[test]
fn invalid_raw_csr_parts() {
    type V<'a> = CsrView<'a, u8, f32>;
    type Parts<'a> = (&'a [u64], &'a [u16], &'a [u8], &'a [f32]);
    let ok = V::from_parts(4, 2, &[0, 3], &[0, 1, 0], &[0, 1, 2, 3], &[1.0; 4]);
    assert!(ok.is_ok());
    let cases: [Parts<'_>; 9] = [
        (&[0, 3], &[0, 1, 0], &[0, 1, 2, 3], &[1.0; 3]), // value count
        (&[0], &[0, 1, 0], &[0, 1, 2, 3], &[1.0; 4]),    // block count
        (&[1, 3], &[0, 1, 0], &[0, 1, 2, 3], &[1.0; 4]), // first base
        (&[0, 5], &[0, 1, 0], &[0, 1, 2, 3], &[1.0; 4]), // base past the end
        (&[0, 3], &[1, 1, 0], &[0, 1, 2, 3], &[1.0; 4]), // first offset
        (&[0, 3], &[0, 4, 0], &[0, 1, 2, 3], &[1.0; 4]), // offset past the block
        (&[0, 3], &[0, 1, 0], &[0, 1, 0, 3], &[1.0; 4]), // index not ascending (row 1)
        (&[0, 3], &[0, 1, 0], &[0, 1, 2, 4], &[1.0; 4]), // index >= head_dim
        (&[0, 3], &[0, 1, 0], &[0, 1, 2, 3], &[1.0, f32::NAN, 1.0, 1.0]), // non-finite
    ];
    for (i, (bases, offsets, indices, values)) in cases.into_iter().enumerate() {
        let e = V::from_parts(4, 2, bases, offsets, indices, values).unwrap_err();
        assert!(matches!(e, Error::InvalidCsr { .. }), "case {i}: {e}");
    }
    assert!(matches!(
        V::from_parts(4, 0, &[], &[], &[], &[]),
        Err(Error::RowsPerBlockOutOfRange { .. })
    ));
}

#[test]
fn multi_head_routing_errors_leave_the_layer_unchanged() {
    let mut m = MultiHeadCache::<u8, f16, f16>::new(2, 3, HybridConfig::new(2, 1, 1)).unwrap();
    m.append_token(1, &[1.0; 6], &[1.0; 6]).unwrap();
    assert!(matches!(m.append_token(2, &[1.0; 6], &[1.0; 6]), Err(Error::OutOfRange { .. })));
    assert!(matches!(m.append_token(0, &[1.0; 5], &[1.0; 6]), Err(Error::LengthMismatch { .. })));
    let mut k = [1.0; 6];
    k[5] = f32::NAN; // last head's key: nothing may be appended to the first two heads
    assert!(matches!(m.append_token(1, &k, &[1.0; 6]), Err(Error::NonFinite { .. })));
    assert_eq!(m.layer_len(1).unwrap(), 1);
    assert!(m.layer(1).unwrap().iter().all(|h| h.len() == 1));
    let mut keys = vec![1.0; 3 * 4 * 2];
    keys[23] = f32::INFINITY;
    assert!(m.extend_layer(0, &keys, &[1.0; 24]).is_err());
    assert_eq!(m.layer_len(0).unwrap(), 0);
    assert!(matches!(m.layer_len(5), Err(Error::OutOfRange { .. })));
    assert!(MultiHeadCache::<u8, f16, f16>::new(0, 3, HybridConfig::new(2, 1, 1)).is_err());
    let heads = vec![
        Cache::new(HybridConfig::new(2, 1, 1)).unwrap(),
        Cache::new(HybridConfig::new(3, 1, 1)).unwrap(),
    ];
    assert!(matches!(MultiHeadCache::from_heads(1, 2, heads), Err(Error::ShapeMismatch { .. })));
}

#[test]
fn multi_head_routes_rows_to_heads() {
    let cfg = HybridConfig::lossless(2, 1);
    let mut m = MultiHeadCache::<u8, f32, f32>::new(1, 2, cfg).unwrap();
    m.append_token(0, &[1.0, 2.0, 3.0, 4.0], &[5.0, 6.0, 7.0, 8.0]).unwrap();
    // head-major prefill: head 0 gets tokens (9,10),(11,12); head 1 gets (13,14),(15,16).
    let keys = [9.0, 10.0, 11.0, 12.0, 13.0, 14.0, 15.0, 16.0];
    m.extend_layer(0, &keys, &keys).unwrap();
    let mut out = [0.0; 2];
    let expect =
        [[[1.0, 2.0], [9.0, 10.0], [11.0, 12.0]], [[3.0, 4.0], [13.0, 14.0], [15.0, 16.0]]];
    for (h, rows) in expect.iter().enumerate() {
        let v = m.view(0, h).unwrap();
        for (t, r) in rows.iter().enumerate() {
            v.key_into(t, &mut out).unwrap();
            assert_eq!(&out, r, "head {h} token {t}");
        }
    }
    let mut vals = [0.0; 2];
    m.view(0, 1).unwrap().value_into(0, &mut vals).unwrap();
    assert_eq!(vals, [7.0, 8.0]);
}

/// A head keeping no key components (k = 0) with a tiny per-head scale: a large buffered
/// key divided by the scale overflows f32, which must not stop its eviction (nothing of
/// it is kept). The fuzzer found the reloaded form of this state
/// (`fuzz/regressions/persist/coded-k0-scaled-eviction`).
#[test]
fn a_head_keeping_nothing_evicts_rows_that_would_overflow_once_scaled() {
    use kv_sparse::coded::{Bitmask, CodedStore, Elems};
    use kv_sparse::hybrid::CodedHybridCache;
    let cfg =
        HybridConfig { k_key: 0, fp8_scale: Some((1e-30, 1.0)), ..HybridConfig::new(8, 1, 4) };
    let big = [1e10f32; 8];
    let mut csr = HybridCache::<u8, f32, f32>::new(cfg).unwrap();
    let coded_cfg = cfg.for_store::<CodedStore<Bitmask, Elems<f32>>>();
    let mut coded = CodedHybridCache::<Bitmask, Elems<f32>, f32>::new(coded_cfg).unwrap();
    for _ in 0..3 {
        csr.append(&big, &[0.5; 8]).unwrap();
        coded.append(&big, &[0.5; 8]).unwrap();
    }
    assert_eq!((csr.sparse_len(), coded.sparse_len()), (2, 2));
    let mut k = [1.0f32; 8];
    coded.view().key_into(0, &mut k).unwrap();
    assert_eq!(k, [0.0; 8], "no key component is kept");
}
