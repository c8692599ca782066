//! Format version 2: round trips of every layout (CSR, every coded index × value code,
//! dense float rows, every dense quantized codec) with identity and extra blocks;
//! version-1 files written by the previous writer still open and read the same rows;
//! truncated, bit-flipped and hostile v2 files are typed errors; a failed write leaves
//! the file already on disk intact.

use half::{bf16, f16};
use kv_sparse::coded::{
    Bitmask, CodedStore, Elems, IndexCode, Int4Values, Int8Values, List, ValueCode,
};
use kv_sparse::fp8::Fp8E4M3;
use kv_sparse::hybrid::{CodedHybridCache, CodedHybridView, HybridCache, HybridConfig};
use kv_sparse::persist::{CacheImage, CacheLayout, MappedCache};
use kv_sparse::quant::{DenseCodec, Fp8Rows, Int4Blocks, Int8Blocks, QuantRows};
use kv_sparse::{Error, Value, ValueFormat};

fn row(t: usize, d: usize, salt: usize) -> Vec<f32> {
    (0..d).map(|i| ((t * 31 + i * 17 + salt * 7) % 41) as f32 * 0.21 - 4.0).collect()
}

fn bits<V: Value>(v: &[V]) -> Vec<u8> {
    kv_sparse::value_bytes(v).to_vec()
}

fn put_u32(bytes: &mut [u8], at: usize, v: u32) {
    bytes[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

/// Recomputes every checksum after an edit.
fn fix_crcs(bytes: &mut [u8]) {
    kv_sparse::persist::reseal(bytes);
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

fn coded_heads<X: IndexCode, Y: ValueCode, D: Value>(
    heads: usize,
    cfg: HybridConfig,
    tokens: usize,
) -> Vec<CodedHybridCache<X, Y, D>> {
    (0..heads)
        .map(|h| {
            let mut c = CodedHybridCache::new(cfg).unwrap();
            for t in 0..tokens + h {
                c.append(&row(t, cfg.head_dim, h), &row(t, cfg.head_dim, h + 1)).unwrap();
            }
            c
        })
        .collect()
}

fn assert_same_coded<X: IndexCode, Y: ValueCode, D: Value>(
    a: CodedHybridView<'_, X, Y, D>,
    b: CodedHybridView<'_, X, Y, D>,
) {
    assert_eq!((a.head_dim, a.value_scale), (b.head_dim, b.value_scale));
    for (x, y) in [(a.sparse_keys, b.sparse_keys), (a.sparse_values, b.sparse_values)] {
        assert_eq!(x.rows_per_block(), y.rows_per_block());
        assert_eq!(x.block_bases(), y.block_bases());
        assert_eq!(x.offsets(), y.offsets());
        assert_eq!(x.bytes(), y.bytes());
    }
    assert_eq!(a.buffer_len(), b.buffer_len());
    for j in 0..a.buffer_len() {
        assert_eq!(bits(a.buffer_key(j).unwrap()), bits(b.buffer_key(j).unwrap()));
        assert_eq!(bits(a.buffer_value(j).unwrap()), bits(b.buffer_value(j).unwrap()));
    }
    let (mut x, mut y) = (vec![0.0; a.head_dim], vec![0.0; a.head_dim]);
    for t in 0..a.len() {
        a.key_into(t, &mut x).unwrap();
        b.key_into(t, &mut y).unwrap();
        assert_eq!(x, y);
        a.value_into(t, &mut x).unwrap();
        b.value_into(t, &mut y).unwrap();
        assert_eq!(x, y);
    }
}

/// Writes 2 layers × 2 heads of coded rows, reopens (from bytes and through the map),
/// compares bit for bit, reloads into owned caches that take one more token exactly as
/// the originals do, and returns the image.
fn coded_round_trip<X: IndexCode, Y: ValueCode, D: Value>(cfg: HybridConfig) -> Vec<u8> {
    let cfg = HybridConfig { ..cfg.for_store::<CodedStore<X, Y>>() };
    let caches = coded_heads::<X, Y, D>(4, cfg, 11);
    let heads: Vec<_> = caches.iter().map(|c| (*c.config(), c.view())).collect();
    let image = CacheImage::coded(2, 2, &heads)
        .unwrap()
        .with_identity(b"model:abc proj:def spec:swan")
        .with_extra(&[1, 2, 3, 4, 5])
        .encode()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("coded.kvs");
    CacheImage::coded(2, 2, &heads)
        .unwrap()
        .with_identity(b"model:abc proj:def spec:swan")
        .with_extra(&[1, 2, 3, 4, 5])
        .write(&path)
        .unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), image, "write and encode give the same bytes");
    // SAFETY: the file lives in a private temporary directory nobody else writes.
    let mapped = unsafe { MappedCache::open(&path) }.unwrap();
    for file in [MappedCache::from_bytes(&image).unwrap(), mapped] {
        assert_eq!(file.version(), kv_sparse::persist::VERSION);
        let layout = CacheLayout::Coded { index: X::KIND, value: Y::KIND, dense: D::FORMAT };
        assert_eq!(file.layout(), layout);
        assert_eq!(file.identity(), b"model:abc proj:def spec:swan");
        assert_eq!(file.extra(), &[1, 2, 3, 4, 5]);
        for (h, c) in caches.iter().enumerate() {
            let view = file.coded_view::<X, Y, D>(h / 2, h % 2).unwrap();
            assert_same_coded(c.view(), view);
            assert_eq!(file.config(h / 2, h % 2).unwrap(), *c.config());
            assert_eq!(file.tokens(h / 2, h % 2).unwrap(), c.len());
            let mut loaded = file.load_coded::<X, Y, D>(h / 2, h % 2).unwrap();
            let mut original = c.clone();
            let (k, v) = (row(99, cfg.head_dim, 3), row(98, cfg.head_dim, 4));
            loaded.append(&k, &v).unwrap();
            original.append(&k, &v).unwrap();
            assert_same_coded(original.view(), loaded.view());
            assert_eq!(original.memory().held_bytes(), loaded.memory().held_bytes());
        }
        let multi = file.load_coded_multi::<X, Y, D>().unwrap();
        assert_eq!((multi.num_layers(), multi.kv_heads()), (2, 2));
    }
    image
}

#[test]
fn every_coded_index_and_value_code_round_trips() {
    let cfg = HybridConfig::new(16, 3, 6);
    coded_round_trip::<List<u8>, Elems<f32>, f32>(cfg);
    coded_round_trip::<List<u8>, Elems<f16>, f16>(cfg);
    coded_round_trip::<List<u8>, Elems<bf16>, bf16>(cfg);
    coded_round_trip::<List<u8>, Elems<Fp8E4M3>, f16>(cfg);
    coded_round_trip::<List<u8>, Int8Values, f16>(cfg);
    coded_round_trip::<List<u8>, Int4Values, f32>(cfg);
    coded_round_trip::<List<u16>, Elems<f16>, f16>(cfg);
    coded_round_trip::<List<u16>, Int8Values, bf16>(cfg);
    coded_round_trip::<List<u16>, Int4Values, f16>(cfg);
    coded_round_trip::<Bitmask, Elems<f32>, f32>(cfg);
    coded_round_trip::<Bitmask, Elems<f16>, f16>(cfg);
    coded_round_trip::<Bitmask, Elems<bf16>, f16>(cfg);
    coded_round_trip::<Bitmask, Elems<Fp8E4M3>, bf16>(cfg);
    coded_round_trip::<Bitmask, Int8Values, f16>(cfg);
    coded_round_trip::<Bitmask, Int4Values, f16>(cfg);
    // Per-head fp8 scales, b = 0, lossless k = d, wide heads, small blocks.
    let scaled = HybridConfig { fp8_scale: Some((0.5, 4.0)), ..HybridConfig::new(16, 2, 4) };
    coded_round_trip::<Bitmask, Elems<Fp8E4M3>, f16>(scaled);
    coded_round_trip::<List<u8>, Int8Values, f32>(HybridConfig::new(8, 0, 4));
    coded_round_trip::<Bitmask, Elems<f32>, f32>(HybridConfig::lossless(8, 2));
    coded_round_trip::<Bitmask, Int8Values, f16>(HybridConfig::new(300, 2, 40));
}

#[test]
fn lossless_coded_rows_read_back_bit_exact() {
    let cfg = HybridConfig::lossless(8, 1).for_store::<CodedStore<Bitmask, Elems<f32>>>();
    let mut c = CodedHybridCache::<Bitmask, Elems<f32>, f32>::new(cfg).unwrap();
    for t in 0..5 {
        c.append(&row(t, 8, 0), &row(t, 8, 1)).unwrap();
    }
    let image = CacheImage::coded(1, 1, &[(*c.config(), c.view())]).unwrap().encode().unwrap();
    let file = MappedCache::from_bytes(&image).unwrap();
    let view = file.coded_view::<Bitmask, Elems<f32>, f32>(0, 0).unwrap();
    let mut out = vec![0.0; 8];
    for t in 0..5 {
        view.key_into(t, &mut out).unwrap();
        assert_eq!(out, row(t, 8, 0));
    }
}

fn dense_round_trip<D: Value>() {
    let (d, tokens) = (8, [5usize, 0, 7]);
    let heads: Vec<(Vec<D>, Vec<D>)> = tokens
        .iter()
        .enumerate()
        .map(|(h, &n)| {
            let k = (0..n).flat_map(|t| row(t, d, h)).map(D::from_f32).collect();
            let v = (0..n).flat_map(|t| row(t, d, h + 1)).map(D::from_f32).collect();
            (k, v)
        })
        .collect();
    let borrowed: Vec<(&[D], &[D])> = heads.iter().map(|(k, v)| (&k[..], &v[..])).collect();
    let image =
        CacheImage::dense(1, 3, d, &borrowed).unwrap().with_identity(b"id").encode().unwrap();
    let file = MappedCache::from_bytes(&image).unwrap();
    assert_eq!(file.layout(), CacheLayout::Dense { format: D::FORMAT });
    assert_eq!(file.identity(), b"id");
    assert!(file.extra().is_empty());
    for (h, (k, v)) in heads.iter().enumerate() {
        let (fk, fv) = file.dense_rows::<D>(0, h).unwrap();
        assert_eq!((bits(fk), bits(fv)), (bits(k), bits(v)));
        assert_eq!(file.tokens(0, h).unwrap(), tokens[h]);
    }
    assert!(matches!(file.config(0, 0), Err(Error::FormatMismatch { .. })));
    assert!(matches!(file.view::<u8, f16, f16>(0, 0), Err(Error::FormatMismatch { .. })));
}

#[test]
fn dense_rows_of_every_float_format_round_trip() {
    dense_round_trip::<f32>();
    dense_round_trip::<f16>();
    dense_round_trip::<bf16>();
}

fn quant_round_trip<C: DenseCodec>() {
    let d = 64;
    let mut rows: Vec<(QuantRows<C>, QuantRows<C>)> = Vec::new();
    for h in 0..4 {
        let (mut k, mut v) = (QuantRows::<C>::new(d).unwrap(), QuantRows::<C>::new(d).unwrap());
        for t in 0..(3 + h) {
            k.push(&row(t, d, h)).unwrap();
            v.push(&row(t, d, h + 1)).unwrap();
        }
        rows.push((k, v));
    }
    let views: Vec<_> = rows.iter().map(|(k, v)| (k.view(), v.view())).collect();
    let image = CacheImage::quant(2, 2, &views).unwrap().with_extra(b"state").encode().unwrap();
    let file = MappedCache::from_bytes(&image).unwrap();
    assert_eq!(file.layout(), CacheLayout::Quant { format: C::FORMAT });
    assert_eq!(file.extra(), b"state");
    for (h, (k, v)) in rows.iter().enumerate() {
        let (fk, fv) = file.quant_rows::<C>(h / 2, h % 2).unwrap();
        assert_eq!((fk.bytes(), fv.bytes()), (k.view().bytes(), v.view().bytes()));
        let (mut lk, _) = file.load_quant::<C>(h / 2, h % 2).unwrap();
        let mut ok = k.clone();
        lk.push(&row(50, d, 9)).unwrap();
        ok.push(&row(50, d, 9)).unwrap();
        assert_eq!(lk.view().bytes(), ok.view().bytes());
    }
    let other = match C::FORMAT {
        kv_sparse::quant::DenseFormat::Int8 => file.quant_rows::<Int4Blocks>(0, 0).map(|_| ()),
        _ => file.quant_rows::<Int8Blocks>(0, 0).map(|_| ()),
    };
    assert!(matches!(other, Err(Error::FormatMismatch { what: "layout", .. })));
}

#[test]
fn quantized_rows_of_every_codec_round_trip() {
    quant_round_trip::<Int8Blocks>();
    quant_round_trip::<Int4Blocks>();
    quant_round_trip::<Fp8Rows>();
}

/// The rows the previous writer put into `tests/data/v1-*.kvs` (the fuzz seed generator's
/// row function and token counts).
fn v1_cache<V: Value, D: Value>(
    cfg: HybridConfig,
    tokens: usize,
    h: usize,
) -> HybridCache<u8, V, D> {
    let mut c = HybridCache::new(cfg).unwrap();
    for t in 0..tokens + h {
        c.append(&row(t, cfg.head_dim, h), &row(t, cfg.head_dim, h + 1)).unwrap();
    }
    c
}

#[test]
fn version_1_files_still_open_and_read_the_same_rows() {
    // Embedded at build time, so the binary does not depend on where the checkout lies (a
    // shared target directory can reuse a test binary built in another checkout).
    let v1: &[u8] = include_bytes!("data/v1-u8-fp8-f16.kvs");
    assert_eq!(u32::from_le_bytes(v1[8..12].try_into().unwrap()), 1);
    let file = MappedCache::from_bytes(v1).unwrap();
    assert_eq!(file.version(), 1);
    let want =
        CacheLayout::Csr { index_bytes: 1, value: ValueFormat::Fp8E4M3, dense: ValueFormat::F16 };
    assert_eq!(file.layout(), want);
    assert!(file.identity().is_empty() && file.extra().is_empty());
    let expected = v1_cache::<Fp8E4M3, f16>(HybridConfig::new(8, 2, 3), 9, 0);
    let view = file.view::<u8, Fp8E4M3, f16>(0, 0).unwrap();
    let (mut a, mut b) = (vec![0.0; 8], vec![0.0; 8]);
    assert_eq!(view.len(), expected.len());
    for t in 0..view.len() {
        view.key_into(t, &mut a).unwrap();
        expected.view().key_into(t, &mut b).unwrap();
        assert_eq!(a, b);
        view.value_into(t, &mut a).unwrap();
        expected.view().value_into(t, &mut b).unwrap();
        assert_eq!(a, b);
    }
    // Re-saving a v1 file writes the current version with the same rows.
    let resaved =
        kv_sparse::persist::encode_views(1, 1, &[(file.config(0, 0).unwrap(), view)]).unwrap();
    let again = MappedCache::from_bytes(&resaved).unwrap();
    assert_eq!(again.version(), kv_sparse::persist::VERSION);
    assert_eq!(
        again.view::<u8, Fp8E4M3, f16>(0, 0).unwrap().sparse_keys.indices(),
        view.sparse_keys.indices()
    );

    let v1: &[u8] = include_bytes!("data/v1-u8-bf16-bf16-2x2.kvs");
    let file = MappedCache::from_bytes(v1).unwrap();
    let cfg = HybridConfig { k_value: 2, rows_per_block: 3, ..HybridConfig::new(8, 2, 3) };
    for h in 0..4 {
        let expected = v1_cache::<bf16, bf16>(cfg, 10, h);
        let view = file.view::<u8, bf16, bf16>(h / 2, h % 2).unwrap();
        assert_eq!(view.sparse_keys.indices(), expected.view().sparse_keys.indices());
        assert_eq!(bits(view.sparse_values.values()), bits(expected.view().sparse_values.values()));
        assert_eq!(file.config(h / 2, h % 2).unwrap(), cfg);
    }
}

fn coded_image() -> Vec<u8> {
    let cfg = HybridConfig::new(16, 2, 6).for_store::<CodedStore<Bitmask, Int8Values>>();
    let caches = coded_heads::<Bitmask, Int8Values, f16>(2, cfg, 7);
    let heads: Vec<_> = caches.iter().map(|c| (*c.config(), c.view())).collect();
    CacheImage::coded(1, 2, &heads).unwrap().with_identity(b"identity").encode().unwrap()
}

#[test]
fn every_truncation_and_flipped_byte_of_a_v2_file_is_a_typed_error() {
    let bytes = coded_image();
    for len in 0..bytes.len() {
        let e = MappedCache::from_bytes(&bytes[..len]).unwrap_err();
        assert!(matches!(e, Error::Truncated { .. } | Error::Corrupt { .. }), "{len}: {e}");
    }
    for at in 0..bytes.len() {
        let mut bad = bytes.clone();
        bad[at] ^= 0x5a;
        let e = validated(&bad).unwrap_err();
        let typed = matches!(
            cause(&e),
            Error::ChecksumMismatch { .. }
                | Error::BadMagic { .. }
                | Error::VersionMismatch { .. }
                | Error::UnknownCode { .. }
                | Error::Corrupt { .. }
        );
        assert!(typed, "byte {at}: {e}");
    }
}

#[test]
fn unknown_codes_and_bad_rows_behind_valid_checksums_are_typed_errors() {
    // (field offset, value): layout, coded index kind, coded value kind, dense format.
    for (at, value) in [(52, 4u32), (52, 99), (24, 0), (24, 4), (28, 5), (28, 18), (32, 7)] {
        let mut bad = coded_image();
        put_u32(&mut bad, at, value);
        fix_crcs(&mut bad);
        let e = MappedCache::from_bytes(&bad).unwrap_err();
        assert!(matches!(e, Error::UnknownCode { .. }), "field {at} = {value}: {e}");
    }
    // A coded file relabelled as another coded kind fails the row validator.
    for value in [1u32, 2] {
        let mut bad = coded_image();
        put_u32(&mut bad, 24, value);
        fix_crcs(&mut bad);
        assert!(validated(&bad).is_err(), "index kind {value}");
    }
    // Reserved header words must stay zero since version 2.
    let mut bad = coded_image();
    bad[100] = 1;
    fix_crcs(&mut bad);
    assert!(matches!(MappedCache::from_bytes(&bad), Err(Error::Corrupt { .. })));
    // A zeroed row scale of a quantized file.
    let mut k = QuantRows::<Int8Blocks>::new(32).unwrap();
    k.push(&row(0, 32, 0)).unwrap();
    let v = k.clone();
    let mut image = CacheImage::quant(1, 1, &[(k.view(), v.view())]).unwrap().encode().unwrap();
    let at = image.len() - 34; // value rows: the last 34-byte q8_0 block; scale first
    image[at..at + 2].fill(0);
    fix_crcs(&mut image);
    let e = validated(&image).unwrap_err();
    assert!(e.to_string().contains("scale"), "{e}");
    // A non-finite dense row.
    let k = [f16::from_f32(1.0); 8];
    let mut image = CacheImage::dense(1, 1, 8, &[(&k[..], &k[..])]).unwrap().encode().unwrap();
    let n = image.len();
    image[n - 2..].copy_from_slice(&f16::NAN.to_le_bytes());
    fix_crcs(&mut image);
    let e = validated(&image).unwrap_err();
    assert!(matches!(cause(&e), Error::Corrupt { .. }), "{e}");
}

#[test]
fn a_failed_write_keeps_the_file_already_saved() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("prefix.kvs");
    let k = [f16::from_f32(0.5); 16];
    CacheImage::dense(1, 1, 8, &[(&k[..], &k[..])]).unwrap().write(&path).unwrap();
    let before = std::fs::read(&path).unwrap();
    // Wrong head count and ragged rows are refused before anything is written.
    assert!(CacheImage::dense(2, 1, 8, &[(&k[..], &k[..])]).is_err());
    assert!(CacheImage::dense(1, 1, 8, &[(&k[..], &k[..12])]).is_err());
    // Writing into a directory that does not exist fails without touching the old file.
    let image = CacheImage::dense(1, 1, 8, &[(&k[..8], &k[..8])]).unwrap();
    assert!(matches!(image.write(dir.path().join("missing/prefix.kvs")), Err(Error::Io { .. })));
    assert_eq!(std::fs::read(&path).unwrap(), before);
    let leftovers = std::fs::read_dir(dir.path()).unwrap().count();
    assert_eq!(leftovers, 1, "no temporary file is left behind");
}
