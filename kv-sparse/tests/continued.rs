//! A history continued from a prefix held elsewhere — a reopened file's mapped rows, then
//! the rows evicted since into a cache rebuilt with `from_view_after` — is the same
//! history: its first rows view (`first_rows`) and the rebuilt cache read back every row,
//! and `CacheImage::{csr,coded}_continued` writes the very bytes the contiguous cache
//! writes, for every split point.

use half::f16;
use kv_sparse::Error;
use kv_sparse::coded::{
    Bitmask, CodedStore, Elems, IndexCode, Int4Values, Int8Values, List, ValueCode,
};
use kv_sparse::csr::CsrStore;
use kv_sparse::fp8::Fp8E4M3;
use kv_sparse::hybrid::{CodedHybridCache, HybridCache, HybridConfig};
use kv_sparse::persist::{CacheImage, MappedCache};

fn rows(n: usize, d: usize, seed: u64) -> Vec<f32> {
    (0..n * d)
        .map(|i| {
            let x = (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15).wrapping_add(seed * 7919);
            ((x >> 40) % 2001) as f32 / 500.0 - 2.0
        })
        .collect()
}

const D: usize = 16;
const TOKENS: usize = 70;
const SPLITS: [usize; 7] = [0, 1, 7, 8, 9, 31, 66];

fn csr_heads(cfg: HybridConfig) -> Vec<HybridCache<u8, f16, f16>> {
    (0..2u64)
        .map(|h| {
            let mut c = HybridCache::new(cfg).unwrap();
            c.extend(&rows(TOKENS, D, 2 * h), &rows(TOKENS, D, 2 * h + 1)).unwrap();
            c
        })
        .collect()
}

#[test]
fn csr_histories_continued_from_a_prefix_write_the_contiguous_bytes() {
    // 8 rows per block: splits inside, at and after block boundaries.
    let cfg = HybridConfig { rows_per_block: 8, ..HybridConfig::new(D, 4, 5) };
    let whole = csr_heads(cfg);
    let views: Vec<_> = whole.iter().map(|c| (*c.config(), c.view())).collect();
    let want = CacheImage::csr(1, 2, &views).unwrap().encode().unwrap();
    for p in SPLITS {
        let rest: Vec<_> =
            whole.iter().map(|c| HybridCache::from_view_after(cfg, c.view(), p).unwrap()).collect();
        for (w, r) in whole.iter().zip(&rest) {
            let (v, older) = (w.view(), w.view().sparse_keys.first_rows(p));
            assert_eq!(older.num_rows(), p);
            assert_eq!(r.sparse_len(), v.sparse_len() - p);
            for i in 0..v.sparse_len() {
                let row = if i < p { older.row(i) } else { r.view().sparse_keys.row(i - p) };
                assert_eq!(
                    row.unwrap().indices,
                    v.sparse_keys.row(i).unwrap().indices,
                    "p={p} row {i}"
                );
            }
        }
        let heads: Vec<_> = whole
            .iter()
            .zip(&rest)
            .map(|(w, r)| {
                let v = w.view();
                (cfg, Some((v.sparse_keys.first_rows(p), v.sparse_values.first_rows(p))), r.view())
            })
            .collect();
        let got = CacheImage::csr_continued(1, 2, &heads).unwrap().encode().unwrap();
        assert!(got == want, "p={p}: the continued history writes other bytes");
        MappedCache::from_bytes(&got).unwrap().validate_all().unwrap();
    }
}

fn coded_case<X: IndexCode, Y: ValueCode>() {
    let cfg = HybridConfig { rows_per_block: 8, ..HybridConfig::new(D, 4, 6) }
        .for_store::<CodedStore<X, Y>>();
    let whole: Vec<CodedHybridCache<X, Y, f16>> = (0..2u64)
        .map(|h| {
            let mut c = CodedHybridCache::new(cfg).unwrap();
            c.extend(&rows(TOKENS, D, 10 + h), &rows(TOKENS, D, 20 + h)).unwrap();
            c
        })
        .collect();
    let views: Vec<_> = whole.iter().map(|c| (*c.config(), c.view())).collect();
    let want = CacheImage::coded(1, 2, &views).unwrap().encode().unwrap();
    for p in SPLITS {
        let rest: Vec<_> = whole
            .iter()
            .map(|c| CodedHybridCache::from_view_after(cfg, c.view(), p).unwrap())
            .collect();
        let heads: Vec<_> = whole
            .iter()
            .zip(&rest)
            .map(|(w, r)| {
                let v = w.view();
                (cfg, Some((v.sparse_keys.first_rows(p), v.sparse_values.first_rows(p))), r.view())
            })
            .collect();
        let got = CacheImage::coded_continued(1, 2, &heads).unwrap().encode().unwrap();
        let what = format!("{:?}×{:?} p={p}", X::KIND, Y::KIND);
        assert!(got == want, "{what}: the continued history writes other bytes");
        // The rebuilt cache copied the rows as stored: same bytes as the tail of the whole.
        for (w, r) in whole.iter().zip(&rest) {
            let (v, t) = (w.view().sparse_values, r.view().sparse_values);
            for i in p..v.num_rows() {
                assert_eq!(
                    t.row(i - p).unwrap().bytes(),
                    v.row(i).unwrap().bytes(),
                    "{what} row {i}"
                );
            }
            assert_eq!(r.memory().held_bytes() > 0, v.num_rows() > p || r.buffer_len() > 0);
        }
    }
}

#[test]
fn coded_histories_continued_from_a_prefix_write_the_contiguous_bytes() {
    coded_case::<Bitmask, Int8Values>();
    coded_case::<Bitmask, Elems<Fp8E4M3>>();
    coded_case::<Bitmask, Int4Values>();
    coded_case::<List<u8>, Elems<f16>>();
    coded_case::<List<u16>, Int8Values>();
}

#[test]
fn bad_prefixes_and_rows_are_typed_errors() {
    let cfg = HybridConfig { rows_per_block: 8, ..HybridConfig::new(D, 4, 5) };
    let whole = csr_heads(cfg);
    let v = whole[0].view();
    // Skipping more rows than the history holds.
    let e = HybridCache::from_view_after(cfg, v, v.sparse_len() + 1).unwrap_err();
    assert!(matches!(e, Error::OutOfRange { .. }), "{e}");
    // A prefix whose keys and values hold different numbers of rows.
    let ragged = [(cfg, Some((v.sparse_keys.first_rows(3), v.sparse_values.first_rows(2))), v)];
    let e = CacheImage::csr_continued(1, 1, &ragged).unwrap_err();
    assert!(matches!(e, Error::ShapeMismatch { .. }), "{e}");
    // A prefix of other blocks.
    let other = HybridConfig { rows_per_block: 16, ..cfg };
    let mut o = HybridCache::<u8, f16, f16>::new(other).unwrap();
    o.extend(&rows(30, D, 5), &rows(30, D, 6)).unwrap();
    let ov = o.view();
    let bad = [(cfg, Some((ov.sparse_keys, ov.sparse_values)), v)];
    let e = CacheImage::csr_continued(1, 1, &bad).unwrap_err();
    assert!(matches!(e, Error::ShapeMismatch { .. }), "{e}");
    // Raw rows: a row of another head width, out-of-range indices, non-finite values.
    let mut wide = CodedStore::<Bitmask, Int8Values>::new(2 * D).unwrap();
    wide.push_dense(&rows(1, 2 * D, 1), 4).unwrap();
    let mut narrow = CodedStore::<Bitmask, Int8Values>::new(D).unwrap();
    let e = narrow.push_row(wide.view().row(0).unwrap()).unwrap_err();
    assert!(matches!(e, Error::ShapeMismatch { .. }), "{e}");
    assert!(narrow.is_empty());
    let mut s = CsrStore::<u8, f32>::new(4).unwrap();
    let bad_index =
        kv_sparse::csr::SparseRow { indices: &[1u8, 4][..], values: &[1.0f32, 2.0][..] };
    assert!(matches!(s.push_row(bad_index), Err(Error::InvalidSparseIndex { .. })));
    let nan = kv_sparse::csr::SparseRow { indices: &[0u8, 2][..], values: &[1.0f32, f32::NAN][..] };
    assert!(matches!(s.push_row(nan), Err(Error::NonFinite { position: 1, .. })));
    let short = kv_sparse::csr::SparseRow { indices: &[0u8, 2][..], values: &[1.0f32][..] };
    assert!(matches!(s.push_row(short), Err(Error::LengthMismatch { .. })));
    assert!(s.is_empty(), "refused rows leave the store as it was");
}
