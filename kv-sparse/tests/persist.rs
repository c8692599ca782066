//! On-disk format: round trips (safe read, mmap, re-load and keep appending), and every
//! kind of bad file — truncated, bit-flipped, wrong magic/version, hostile counts, wrong
//! dims, format mismatch — giving a typed error, never a panic or a huge allocation.

use half::{bf16, f16};
use kv_sparse::fp8::Fp8E4M3;
use kv_sparse::hybrid::{HybridCache, HybridConfig, HybridView, MultiHeadCache};
use kv_sparse::persist::{self, MappedCache};
use kv_sparse::{Error, SparseIndex, Value};

fn row(t: usize, d: usize, salt: usize) -> Vec<f32> {
    (0..d).map(|i| ((t * 31 + i * 17 + salt * 7) % 41) as f32 * 0.21 - 4.0).collect()
}

fn cache<I: SparseIndex, V: Value, D: Value>(cfg: HybridConfig, n: usize) -> HybridCache<I, V, D> {
    let mut c = HybridCache::new(cfg).unwrap();
    for t in 0..n {
        c.append(&row(t, cfg.head_dim, 0), &row(t, cfg.head_dim, 1)).unwrap();
    }
    c
}

fn bits<V: Value>(v: &[V]) -> Vec<u8> {
    kv_sparse::value_bytes(v).to_vec()
}

/// Bit-exact comparison of two views (raw CSR arrays and buffer rows in token order).
fn assert_same<I: SparseIndex, V: Value, D: Value>(
    a: HybridView<'_, I, V, D>,
    b: HybridView<'_, I, V, D>,
) {
    assert_eq!(a.head_dim, b.head_dim);
    assert_eq!(a.value_scale, b.value_scale);
    for (x, y) in [(a.sparse_keys, b.sparse_keys), (a.sparse_values, b.sparse_values)] {
        assert_eq!(x.rows_per_block(), y.rows_per_block());
        assert_eq!(x.block_bases(), y.block_bases());
        assert_eq!(x.offsets(), y.offsets());
        assert_eq!(x.indices(), y.indices());
        assert_eq!(bits(x.values()), bits(y.values()));
    }
    assert_eq!(a.buffer_len(), b.buffer_len());
    for j in 0..a.buffer_len() {
        assert_eq!(bits(a.buffer_key(j).unwrap()), bits(b.buffer_key(j).unwrap()));
        assert_eq!(bits(a.buffer_value(j).unwrap()), bits(b.buffer_value(j).unwrap()));
    }
}

#[test]
fn single_cache_round_trips_through_read_and_mmap() {
    let cfg = HybridConfig { k_value: 5, rows_per_block: 7, ..HybridConfig::new(16, 6, 3) };
    let c = cache::<u8, Fp8E4M3, bf16>(cfg, 40);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.kvs");
    persist::write_cache(&path, &c).unwrap();
    let read = MappedCache::read(&path).unwrap();
    assert_same(c.view(), read.view(0, 0).unwrap());
    // SAFETY: the file lives in a private temp dir that nothing else modifies.
    let mapped = unsafe { MappedCache::open(&path) }.unwrap();
    assert_same(c.view(), mapped.view(0, 0).unwrap());
    assert_eq!(mapped.config(0, 0).unwrap(), cfg);
    assert_eq!(mapped.file_bytes() as u64, std::fs::metadata(&path).unwrap().len());
    // Reload, keep appending: identical to the original continuing.
    let mut a = c.clone();
    let mut b = mapped.load::<u8, Fp8E4M3, bf16>(0, 0).unwrap();
    for t in 40..55 {
        a.append(&row(t, 16, 0), &row(t, 16, 1)).unwrap();
        b.append(&row(t, 16, 0), &row(t, 16, 1)).unwrap();
    }
    assert_same(a.view(), b.view());
}

#[test]
fn edge_shapes_round_trip() {
    let empty = cache::<u8, f16, f16>(HybridConfig::new(8, 4, 2), 0);
    let b0 = cache::<u8, f32, f32>(HybridConfig::lossless(8, 0), 9);
    let bytes = persist::encode_views(1, 1, &[(*empty.config(), empty.view())]).unwrap();
    assert_same(empty.view(), MappedCache::from_bytes(&bytes).unwrap().view(0, 0).unwrap());
    let bytes = persist::encode_views(1, 1, &[(*b0.config(), b0.view())]).unwrap();
    assert_same(b0.view(), MappedCache::from_bytes(&bytes).unwrap().view(0, 0).unwrap());
    let wide = cache::<u16, f16, f32>(HybridConfig::new(300, 2, 40), 5);
    let bytes = persist::encode_views(1, 1, &[(*wide.config(), wide.view())]).unwrap();
    let m = MappedCache::from_bytes(&bytes).unwrap();
    assert_same(wide.view(), m.view(0, 0).unwrap());
    assert!(matches!(m.layout(), persist::CacheLayout::Csr { index_bytes: 2, .. }));
    let scaled = HybridConfig { fp8_scale: Some((0.5, 2.0)), ..HybridConfig::new(4, 1, 2) };
    let s = cache::<u8, Fp8E4M3, f16>(scaled, 6);
    let bytes = persist::encode_views(1, 1, &[(*s.config(), s.view())]).unwrap();
    let m = MappedCache::from_bytes(&bytes).unwrap();
    assert_same(s.view(), m.view(0, 0).unwrap());
    assert_eq!(m.config(0, 0).unwrap(), scaled);
}

fn multi() -> MultiHeadCache<u8, f16, f16> {
    let cfg = HybridConfig::new(8, 3, 4);
    let mut m = MultiHeadCache::new(2, 3, cfg).unwrap();
    for t in 0..11 {
        for layer in 0..2 {
            let k: Vec<f32> = (0..3).flat_map(|h| row(t, 8, h + layer)).collect();
            let v: Vec<f32> = (0..3).flat_map(|h| row(t, 8, h + 10 * layer)).collect();
            m.append_token(layer, &k, &v).unwrap();
        }
    }
    m
}

#[test]
fn multi_head_round_trip_and_shape_checks() {
    let m = multi();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.kvs");
    persist::write_multi(&path, &m).unwrap();
    let f = MappedCache::read(&path).unwrap();
    f.check_shape(2, 3, 8).unwrap();
    for (layer, h) in [(0, 0), (0, 2), (1, 1)] {
        assert_same(m.view(layer, h).unwrap(), f.view(layer, h).unwrap());
    }
    let loaded = f.load_multi::<u8, f16, f16>().unwrap();
    assert_eq!(loaded.memory().held_bytes(), m.memory().held_bytes());
    let e = f.check_shape(2, 3, 16).unwrap_err();
    assert!(
        matches!(e, Error::ShapeMismatch { what: "head_dim", expected: 16, got: 8, .. }),
        "{e}"
    );
    assert!(matches!(
        f.check_shape(30, 3, 8),
        Err(Error::ShapeMismatch { what: "num_layers", .. })
    ));
    assert!(matches!(f.view::<u8, f16, f16>(2, 0), Err(Error::OutOfRange { .. })));
    assert!(matches!(f.view::<u8, f16, f16>(0, 3), Err(Error::OutOfRange { .. })));
}

#[test]
fn format_mismatch_on_reopen() {
    let bytes = encoded();
    let f = MappedCache::from_bytes(&bytes).unwrap();
    let e = f.view::<u8, Fp8E4M3, f16>(0, 0).unwrap_err();
    assert!(matches!(e, Error::FormatMismatch { what: "sparse value", .. }), "{e}");
    assert!(e.to_string().contains("fp8") && e.to_string().contains("f16"));
    assert!(matches!(
        f.view::<u16, f16, f16>(0, 0),
        Err(Error::FormatMismatch { what: "index", .. })
    ));
    assert!(matches!(
        f.view::<u8, f16, f32>(0, 0),
        Err(Error::FormatMismatch { what: "dense buffer", .. })
    ));
    assert!(matches!(f.load::<u8, bf16, f16>(0, 0), Err(Error::FormatMismatch { .. })));
}

fn encoded() -> Vec<u8> {
    let m = multi();
    let heads: Vec<_> = m.heads().iter().map(|h| (*h.config(), h.view())).collect();
    persist::encode_views(2, 3, &heads).unwrap()
}

/// Recomputes every checksum after a deliberate edit, so deeper validation is reached.
fn fix_crcs(bytes: &mut [u8]) {
    persist::reseal(bytes);
}

/// Opens an image and checks every head's contents (what `open` defers to first use).
fn validated(bytes: &[u8]) -> Result<MappedCache, Error> {
    let file = MappedCache::from_bytes(bytes)?;
    file.validate_all()?;
    Ok(file)
}

/// The cause behind a head's `BadHead`, or the error itself.
fn cause(e: &Error) -> &Error {
    match e {
        Error::BadHead { source, .. } => source,
        e => e,
    }
}

fn put_u32(bytes: &mut [u8], at: usize, v: u32) {
    bytes[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

fn put_u64(bytes: &mut [u8], at: usize, v: u64) {
    bytes[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

#[test]
fn every_truncation_is_a_typed_error() {
    let bytes = encoded();
    for len in 0..bytes.len() {
        let e = MappedCache::from_bytes(&bytes[..len]).unwrap_err();
        assert!(matches!(e, Error::Truncated { .. }), "len {len}: {e}");
    }
    let mut longer = bytes.clone();
    longer.push(0);
    assert!(matches!(MappedCache::from_bytes(&longer), Err(Error::Corrupt { .. })));
    // A real truncated file, through both readers.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.kvs");
    std::fs::write(&path, &bytes[..bytes.len() - 10]).unwrap();
    assert!(matches!(MappedCache::read(&path), Err(Error::Truncated { .. })));
    // SAFETY: private temp file, not modified while mapped.
    assert!(matches!(unsafe { MappedCache::open(&path) }, Err(Error::Truncated { .. })));
    std::fs::write(&path, &bytes[..5]).unwrap();
    // SAFETY: as above.
    assert!(matches!(unsafe { MappedCache::open(&path) }, Err(Error::Truncated { .. })));
    let missing = dir.path().join("missing.kvs");
    assert!(matches!(MappedCache::read(&missing), Err(Error::Io { .. })));
}

#[test]
fn every_flipped_byte_is_detected() {
    let bytes = encoded();
    for at in 0..bytes.len() {
        let mut bad = bytes.clone();
        bad[at] ^= 0x5a;
        let e = validated(&bad).unwrap_err();
        let expected = matches!(
            cause(&e),
            Error::ChecksumMismatch { .. }
                | Error::BadMagic { .. }
                | Error::VersionMismatch { .. }
                | Error::UnknownCode { .. }
                | Error::Corrupt { .. }
        );
        assert!(expected, "byte {at}: {e}");
    }
}

#[test]
fn wrong_magic_and_version() {
    let mut bad = encoded();
    bad[0] = b'X';
    assert!(matches!(MappedCache::from_bytes(&bad), Err(Error::BadMagic { .. })));
    let mut bad = encoded();
    put_u32(&mut bad, 8, 4);
    let e = MappedCache::from_bytes(&bad).unwrap_err();
    assert!(matches!(e, Error::VersionMismatch { expected: 3, got: 4 }), "{e}");
    let mut bad = encoded();
    put_u32(&mut bad, 8, 0);
    let e = MappedCache::from_bytes(&bad).unwrap_err();
    assert!(matches!(e, Error::VersionMismatch { expected: 3, got: 0 }), "{e}");
}

#[test]
fn hostile_counts_are_rejected_without_allocating() {
    // Header claims u32::MAX × u32::MAX heads: the directory cannot fit the file.
    let mut bad = encoded();
    put_u32(&mut bad, 36, u32::MAX);
    put_u32(&mut bad, 40, u32::MAX);
    fix_crcs(&mut bad);
    let e = MappedCache::from_bytes(&bad).unwrap_err();
    assert!(matches!(e, Error::Corrupt { .. }), "{e}");
    // A head entry claiming absurd rows / nnz / buffer rows.
    for (field, value) in
        [(0, u64::MAX), (0, 1 << 40), (8, u64::MAX / 2), (24, u64::MAX / 3), (32, u64::MAX)]
    {
        let mut bad = encoded();
        put_u64(&mut bad, 128 + field, value);
        fix_crcs(&mut bad);
        let e = MappedCache::from_bytes(&bad).unwrap_err();
        assert!(matches!(e, Error::Corrupt { .. }), "field {field}: {e}");
    }
    // Bad k, rows per block, policy and scale codes.
    for (at, value) in [(40, 99u32), (48, 0), (48, 100_000), (52, 7), (60, 0)] {
        let mut bad = encoded();
        put_u32(&mut bad, 128 + at, value);
        fix_crcs(&mut bad);
        assert!(matches!(MappedCache::from_bytes(&bad), Err(Error::Corrupt { .. })), "at {at}");
    }
}

#[test]
fn wrong_dims_and_formats_in_a_checksummed_header() {
    for (at, value) in [
        (20, 4u32),
        (20, 16),
        (20, 0),
        (20, 300),
        (24, 2),
        (24, 3),
        (28, 9),
        (32, 3),
        (36, 1),
        (40, 0),
    ] {
        let mut bad = encoded();
        put_u32(&mut bad, at, value);
        fix_crcs(&mut bad);
        // Relabelled formats fail at open or, where the structure still fits, on rows.
        let e = validated(&bad).unwrap_err();
        let typed = matches!(cause(&e), Error::Corrupt { .. } | Error::UnknownCode { .. })
            || matches!(e, Error::BadHead { .. });
        assert!(typed, "header field {at} = {value}: {e}");
    }
}

#[test]
fn invalid_contents_with_valid_checksums() {
    let c =
        cache::<u8, f16, f16>(HybridConfig { rows_per_block: 4, ..HybridConfig::new(8, 2, 3) }, 12);
    let clean = persist::encode_views(1, 1, &[(*c.config(), c.view())]).unwrap();
    // Sections of the single head start at 256 (header 128, one 64-byte entry, the
    // head-checksum table padded to 64 bytes).
    let bases = 256;
    let offsets = bases + 64;
    let indices = offsets + 64;
    let values = indices + 64;
    let edits: [(usize, &[u8]); 5] = [
        (indices, &[9]),              // index >= head_dim
        (indices + 1, &[0]),          // not ascending within row 0
        (offsets + 2, &[0xff, 0x00]), // row offset past its block
        (bases, &[1]),                // first block base not 0
        (values, &[0x00, 0x7c]),      // f16 infinity
    ];
    for (at, patch) in edits {
        let mut bad = clean.clone();
        bad[at..at + patch.len()].copy_from_slice(patch);
        fix_crcs(&mut bad);
        // The structure is intact: the file opens, and the head fails on first use.
        let file = MappedCache::from_bytes(&bad).unwrap();
        let e = file.view::<u8, f16, f16>(0, 0).unwrap_err();
        let rows = matches!(e, Error::BadHead { .. })
            && !matches!(cause(&e), Error::ChecksumMismatch { .. });
        assert!(rows, "edit at {at}: {e}");
    }
    assert!(validated(&clean).is_ok());
}

/// Regression (found by `fuzz/` in-tree property fuzzing): a checksummed file whose f32
/// buffer holds a finite value too large for the f16 sparse format used to be accepted, and
/// the loaded cache then refused every append (evicting that row overflowed).
#[test]
fn buffer_rows_that_cannot_be_evicted_are_rejected() {
    let c = cache::<u8, f16, f32>(HybridConfig::new(8, 2, 3), 5);
    let clean = persist::encode_views(1, 1, &[(*c.config(), c.view())]).unwrap();
    let mut loaded = MappedCache::from_bytes(&clean).unwrap().load::<u8, f16, f32>(0, 0).unwrap();
    loaded.append(&row(5, 8, 0), &row(5, 8, 1)).unwrap();
    // The last buffered key row starts 32 bytes before the buffer values (the file's end).
    let newest_key = clean.len() - 64 - 32;
    let mut bad = clean.clone();
    bad[newest_key..newest_key + 4].copy_from_slice(&1.0e6f32.to_le_bytes());
    fix_crcs(&mut bad);
    let e = validated(&bad).unwrap_err();
    assert!(matches!(e, Error::BadHead { .. }) && e.to_string().contains("f16"), "{e}");
}

/// Regression (found by the in-tree property fuzzing): a checksummed file claiming a buffer
/// capacity of 2^40 rows made `load` allocate the whole ring up front and abort the
/// process; the loaded buffer now holds storage for its rows only and grows on append.
#[test]
fn a_huge_claimed_buffer_capacity_is_not_allocated_on_load() {
    let c = cache::<u8, f16, f16>(HybridConfig::new(8, 2, 3), 5);
    let mut bytes = persist::encode_views(1, 1, &[(*c.config(), c.view())]).unwrap();
    put_u64(&mut bytes, 128 + 32, 1 << 40); // the head entry's buffer_capacity
    fix_crcs(&mut bytes);
    let mapped = MappedCache::from_bytes(&bytes).unwrap();
    assert_eq!(mapped.config(0, 0).unwrap().buffer, 1 << 40);
    let mut loaded = mapped.load::<u8, f16, f16>(0, 0).unwrap();
    for t in 5..40 {
        loaded.append(&row(t, 8, 0), &row(t, 8, 1)).unwrap();
    }
    assert_eq!((loaded.sparse_len(), loaded.buffer_len()), (3, 37));
}

/// Regression (found by the in-tree property fuzzing): a checksummed file with an fp8 key
/// scale near `f32::MAX` was accepted, and its sparse keys then decoded to ∞.
#[test]
fn scales_that_overflow_decoded_values_are_rejected() {
    let cfg = HybridConfig { fp8_scale: Some((0.5, 2.0)), ..HybridConfig::new(8, 1, 3) };
    let c = cache::<u8, Fp8E4M3, f16>(cfg, 6);
    let mut bytes = persist::encode_views(1, 1, &[(*c.config(), c.view())]).unwrap();
    // The head entry's key_scale (f32) sits 56 bytes into the entry at 128.
    bytes[128 + 56..128 + 60].copy_from_slice(&1.0e38f32.to_le_bytes());
    fix_crcs(&mut bytes);
    let e = validated(&bytes).unwrap_err();
    assert!(matches!(cause(&e), Error::Corrupt { .. }) && e.to_string().contains("scale"), "{e}");
}
