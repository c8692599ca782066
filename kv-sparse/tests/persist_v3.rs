//! Format version 3: opening checks the header and the metadata only, each head's
//! checksum and rows are checked on its first use. A corrupt head is a typed error on
//! every use of that head while the others stay usable; every byte of a file is covered by
//! exactly one checksum; truncations fail at open; version-2 files written by the previous
//! writer still open and read the same rows.

use half::f16;
use kv_sparse::coded::{Bitmask, CodedStore, Int8Values};
use kv_sparse::hybrid::{CodedHybridCache, HybridConfig};
use kv_sparse::persist::{self, CacheImage, CacheLayout, MappedCache};
use kv_sparse::{Error, ValueFormat};

type Coded = CodedHybridCache<Bitmask, Int8Values, f16>;

const LAYERS: usize = 2;
const KV_HEADS: usize = 3;

fn row(t: usize, d: usize, salt: usize) -> Vec<f32> {
    (0..d).map(|i| ((t * 31 + i * 17 + salt * 7) % 41) as f32 * 0.21 - 4.0).collect()
}

/// Head `h` holds `tokens + h` rows of `row(t, 16, h)` keys and `row(t, 16, h + 1)` values.
fn heads(count: usize, tokens: usize) -> Vec<Coded> {
    let cfg = HybridConfig::new(16, 2, 6).for_store::<CodedStore<Bitmask, Int8Values>>();
    (0..count)
        .map(|h| {
            let mut c = Coded::new(cfg).unwrap();
            for t in 0..tokens + h {
                c.append(&row(t, 16, h), &row(t, 16, h + 1)).unwrap();
            }
            c
        })
        .collect()
}

fn image(caches: &[Coded]) -> Vec<u8> {
    let views: Vec<_> = caches.iter().map(|c| (*c.config(), c.view())).collect();
    CacheImage::coded(LAYERS, KV_HEADS, &views).unwrap().with_extra(b"prompt").encode().unwrap()
}

/// The one offset where `needle` occurs in `haystack`.
fn unique_offset(haystack: &[u8], needle: &[u8]) -> usize {
    let mut hits = haystack.windows(needle.len()).enumerate().filter(|(_, w)| *w == needle);
    let (at, _) = hits.next().expect("needle present");
    assert!(hits.next().is_none(), "needle occurs more than once");
    at
}

/// The cause behind a head's `BadHead`, or the error itself.
fn cause(e: &Error) -> &Error {
    match e {
        Error::BadHead { source, .. } => source,
        e => e,
    }
}

fn assert_bad_head(e: &Error, layer: usize, kv_head: usize) {
    match e {
        Error::BadHead { layer: l, kv_head: h, .. } => {
            assert_eq!((*l, *h), (layer, kv_head), "{e}")
        }
        other => panic!("expected BadHead, got {other}"),
    }
}

/// Every head but `bad` views, compares equal to its cache, and validates.
fn assert_others_usable(file: &MappedCache, caches: &[Coded], bad: usize) {
    for (h, c) in caches.iter().enumerate().filter(|(h, _)| *h != bad) {
        let (l, k) = (h / KV_HEADS, h % KV_HEADS);
        let view = file.coded_view::<Bitmask, Int8Values, f16>(l, k).unwrap();
        assert_eq!(view.sparse_keys.bytes(), c.view().sparse_keys.bytes());
        assert_eq!(view.sparse_values.bytes(), c.view().sparse_values.bytes());
        file.validate_head(l, k).unwrap();
        file.load_coded::<Bitmask, Int8Values, f16>(l, k).unwrap();
    }
}

#[test]
fn a_corrupt_head_fails_on_its_first_use_and_the_others_stay_usable() {
    let caches = heads(LAYERS * KV_HEADS, 9);
    let clean = image(&caches);
    let bad = 4; // layer 1, kv head 1
    let at = unique_offset(&clean, caches[bad].view().sparse_keys.bytes());
    let mut flipped = clean.clone();
    flipped[at + 3] ^= 0x10;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("flipped.kvs");
    std::fs::write(&path, &flipped).unwrap();
    // SAFETY: the file lives in a private temporary directory nobody else writes.
    let mapped = unsafe { MappedCache::open(&path) }.unwrap();
    for file in [MappedCache::from_bytes(&flipped).unwrap(), mapped] {
        // Directory facts need no head check.
        assert_eq!(file.tokens(1, 1).unwrap(), caches[bad].len());
        assert_eq!(file.config(1, 1).unwrap(), *caches[bad].config());
        assert_eq!(file.extra(), b"prompt");
        for _ in 0..2 {
            let e = file.coded_view::<Bitmask, Int8Values, f16>(1, 1).unwrap_err();
            assert_bad_head(&e, 1, 1);
            let typed = matches!(cause(&e), Error::ChecksumMismatch { what: "head", .. });
            assert!(typed, "{e}");
        }
        assert_bad_head(&file.load_coded::<Bitmask, Int8Values, f16>(1, 1).unwrap_err(), 1, 1);
        assert_bad_head(&file.validate_head(1, 1).unwrap_err(), 1, 1);
        assert_bad_head(&file.validate_all().unwrap_err(), 1, 1);
        assert_others_usable(&file, &caches, bad);
    }
}

#[test]
fn validating_on_threads_reports_the_first_bad_head_in_layer_major_order() {
    let caches = heads(LAYERS * KV_HEADS, 9);
    let clean = image(&caches);
    let file = MappedCache::from_bytes(&clean).unwrap();
    for threads in [1, 2, 3, 64] {
        file.validate_all_on(threads).unwrap();
    }
    // Two corrupt heads: layer 1 head 2 (slot 5) and layer 1 head 0 (slot 3).
    let mut flipped = clean.clone();
    for bad in [5, 3] {
        let at = unique_offset(&clean, caches[bad].view().sparse_keys.bytes());
        flipped[at + 1] ^= 0x04;
    }
    for threads in [1, 2, 4] {
        let file = MappedCache::from_bytes(&flipped).unwrap();
        assert_bad_head(&file.validate_all_on(threads).unwrap_err(), 1, 0);
        assert_bad_head(&file.validate_head(1, 2).unwrap_err(), 1, 2);
        for good in [0, 1, 2, 4] {
            file.validate_head(good / KV_HEADS, good % KV_HEADS).unwrap();
        }
    }
}

#[test]
fn bad_rows_behind_valid_checksums_fail_their_head_only() {
    let caches = heads(LAYERS * KV_HEADS, 9);
    let mut bytes = image(&caches);
    let bad = 2; // layer 0, kv head 2
    let view = caches[bad].view();
    let newest_buffered = view.buffer_key(view.buffer_len() - 1).unwrap();
    let at = unique_offset(&bytes, kv_sparse::value_bytes(newest_buffered));
    bytes[at..at + 2].copy_from_slice(&f16::NAN.to_le_bytes());
    persist::reseal(&mut bytes);
    let file = MappedCache::from_bytes(&bytes).unwrap();
    let e = file.coded_view::<Bitmask, Int8Values, f16>(0, 2).unwrap_err();
    assert_bad_head(&e, 0, 2);
    assert!(matches!(cause(&e), Error::Corrupt { .. }), "{e}");
    assert!(e.to_string().contains("non-finite"), "{e}");
    assert_others_usable(&file, &caches, bad);
}

#[test]
fn every_byte_is_covered_by_exactly_one_checksum() {
    let caches = heads(LAYERS * KV_HEADS, 5);
    let clean = image(&caches);
    let (mut at_open, mut in_a_head) = (0, 0);
    for at in 0..clean.len() {
        let mut bad = clean.clone();
        bad[at] ^= 0x5a;
        let Ok(file) = MappedCache::from_bytes(&bad) else {
            at_open += 1;
            continue;
        };
        // Opened: the byte lies in exactly one head's span, which alone fails.
        let failing: Vec<_> = (0..LAYERS * KV_HEADS)
            .filter(|h| file.validate_head(h / KV_HEADS, h % KV_HEADS).is_err())
            .collect();
        assert_eq!(failing.len(), 1, "byte {at}: heads {failing:?} fail");
        let e = file.validate_all().unwrap_err();
        let typed = matches!(cause(&e), Error::ChecksumMismatch { what: "head", .. });
        assert!(typed, "byte {at}: {e}");
        in_a_head += 1;
    }
    assert!(at_open > 128 && in_a_head > 1000, "{at_open} at open, {in_a_head} in heads");
}

#[test]
fn truncated_files_fail_at_open() {
    let caches = heads(LAYERS * KV_HEADS, 5);
    let bytes = image(&caches);
    for len in 0..bytes.len() {
        let e = MappedCache::from_bytes(&bytes[..len]).unwrap_err();
        assert!(matches!(e, Error::Truncated { .. }), "len {len}: {e}");
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("short.kvs");
    for len in [0, 100, 128, 300, bytes.len() / 2, bytes.len() - 1] {
        std::fs::write(&path, &bytes[..len]).unwrap();
        // SAFETY: the file lives in a private temporary directory nobody else writes.
        let e = unsafe { MappedCache::open(&path) }.unwrap_err();
        assert!(matches!(e, Error::Truncated { .. }), "len {len}: {e}");
    }
}

#[test]
fn heads_are_checked_once_whichever_thread_uses_them_first() {
    fn shared<T: Send + Sync>(_: &T) {}
    let caches = heads(LAYERS * KV_HEADS, 7);
    let file = MappedCache::from_bytes(&image(&caches)).unwrap();
    shared(&file);
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| {
                for (h, c) in caches.iter().enumerate() {
                    let view =
                        file.coded_view::<Bitmask, Int8Values, f16>(h / KV_HEADS, h % KV_HEADS);
                    assert_eq!(view.unwrap().len(), c.len());
                }
            });
        }
    });
    file.validate_all().unwrap();
}

/// `tests/data/v2-*.kvs` were written by the version-2 writer from exactly these caches:
/// `bitmask-int8-f16-1x2` is `heads(2, 7)` (1 layer × 2 kv heads) with identity
/// `identity` and extra `extra`; `dense-f16-2x1` is 2 layers × 1 kv head of head_dim 8,
/// head `h` holding 5 rows of `row(t, 8, h)` keys and `row(t, 8, h + 1)` values as f16.
#[test]
fn version_2_files_still_open_and_read_the_same_rows() {
    // Embedded at build time, so the binary does not depend on where the checkout lies (a
    // shared target directory can reuse a test binary built in another checkout).
    let coded: &[u8] = include_bytes!("data/v2-bitmask-int8-f16-1x2.kvs");
    let file = MappedCache::from_bytes(coded).unwrap();
    assert_eq!(file.version(), 2);
    assert_eq!((file.identity(), file.extra()), (&b"identity"[..], &b"extra"[..]));
    file.validate_all().unwrap();
    for (h, c) in heads(2, 7).iter().enumerate() {
        let view = file.coded_view::<Bitmask, Int8Values, f16>(0, h).unwrap();
        assert_eq!(view.sparse_keys.bytes(), c.view().sparse_keys.bytes());
        assert_eq!(view.sparse_values.bytes(), c.view().sparse_values.bytes());
        assert_eq!(view.buffer_len(), c.buffer_len());
        assert_eq!(file.config(0, h).unwrap(), *c.config());
    }
    // Version 2 has one checksum over the whole payload, checked at open.
    let mut bad = coded.to_vec();
    let n = bad.len();
    bad[n - 1] ^= 1;
    let e = MappedCache::from_bytes(&bad).unwrap_err();
    assert!(matches!(e, Error::ChecksumMismatch { what: "payload", .. }), "{e}");

    let file = MappedCache::from_bytes(include_bytes!("data/v2-dense-f16-2x1.kvs")).unwrap();
    assert_eq!(
        (file.version(), file.layout()),
        (2, CacheLayout::Dense { format: ValueFormat::F16 })
    );
    for h in 0..2 {
        let (k, v) = file.dense_rows::<f16>(h, 0).unwrap();
        let want = |salt| -> Vec<f16> {
            (0..5).flat_map(|t| row(t, 8, salt)).map(f16::from_f32).collect()
        };
        assert_eq!((k.to_vec(), v.to_vec()), (want(h), want(h + 1)));
    }
}
