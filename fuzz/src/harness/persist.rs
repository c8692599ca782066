//! Fuzz harness for the `kv-sparse` on-disk cache format ([`MappedCache::from_bytes`]).
//!
//! Oracle: a file image (format version 1, 2 or 3, any layout) either gives a typed error
//! at open, or a cache whose heads each either fail their first use with a typed
//! `BadHead` error (and fail every later use the same way) or can be viewed (types taken from the file's layout), decoded
//! token by token to finite values, loaded into an owned cache (CSR or coded hybrid, or
//! quantized rows) that accepts a further append, and re-encoded — with the file's
//! identity and extra blocks — into an image that parses again and re-encodes to the same
//! bytes. Any panic, abort or UB is a bug.
//!
//! Every image is tried twice: as given, and with its checksums and length field
//! recomputed ([`with_valid_checksums`]) so that mutations reach the validation behind
//! the CRC-32s (directory, section layout, CSR invariants). The oracle exercises a file
//! only once `validate_all` accepts every head.

use half::{bf16, f16};
use kv_sparse::coded::{
    Bitmask, CodedStore, Elems, IndexCode, IndexKind, Int4Values, Int8Values, List, ValueCode,
    ValueKind,
};
use kv_sparse::fp8::Fp8E4M3;
use kv_sparse::hybrid::{
    CodedHybridCache, CodedHybridView, HybridCache, HybridConfig, HybridView, NonFinitePolicy,
};
use kv_sparse::persist::{self, CacheImage, CacheLayout, MappedCache};
use kv_sparse::quant::{DenseCodec, DenseFormat, Fp8Rows, Int4Blocks, Int8Blocks, QuantRows};
use kv_sparse::{SparseIndex, Value, ValueFormat};

/// Header size (every format version).
const HEADER_BYTES: usize = 128;
/// Byte offset of the header's `file_bytes` field (u64).
const FILE_BYTES_AT: usize = 56;

/// Runs the oracle on `data` as given and with repaired checksums.
pub fn check(data: &[u8]) {
    check_image(data);
    if let Some(fixed) = with_valid_checksums(data) {
        check_image(&fixed);
    }
}

/// `data` with the header's length field and every CRC-32 recomputed
/// ([`persist::reseal`]; `None` when it is shorter than a header).
pub fn with_valid_checksums(data: &[u8]) -> Option<Vec<u8>> {
    if data.len() < HEADER_BYTES {
        return None;
    }
    let mut v = data.to_vec();
    v[FILE_BYTES_AT..FILE_BYTES_AT + 8].copy_from_slice(&(data.len() as u64).to_le_bytes());
    persist::reseal(&mut v);
    Some(v)
}

/// Parses one image and, if it is accepted, exercises everything a reader can do with it.
pub fn check_image(data: &[u8]) {
    match MappedCache::from_bytes(data) {
        Ok(cache) => match cache.validate_all() {
            Ok(()) => exercise(&cache),
            Err(e) => check_bad_heads(&cache, &e),
        },
        Err(e) => assert!(!e.to_string().is_empty()),
    }
}

/// A file that opened but holds invalid heads: each head fails every use the same way or
/// passes, and the first failing one is what `validate_all` reported.
fn check_bad_heads(cache: &MappedCache, first: &kv_sparse::Error) {
    assert!(matches!(first, kv_sparse::Error::BadHead { .. }), "validate_all: {first}");
    let (layers, kv_heads) = (cache.num_layers(), cache.kv_heads());
    let outcomes: Vec<_> = (0..layers * kv_heads)
        .map(|h| cache.validate_head(h / kv_heads, h % kv_heads).map_err(|e| e.to_string()))
        .collect();
    let again: Vec<_> = (0..layers * kv_heads)
        .map(|h| cache.validate_head(h / kv_heads, h % kv_heads).map_err(|e| e.to_string()))
        .collect();
    assert!(outcomes == again, "a head's check changed between uses");
    assert!(outcomes.iter().any(Result::is_err), "validate_all failed but no head does");
}

/// Dispatches on the file's layout and formats.
fn exercise(cache: &MappedCache) {
    macro_rules! csr_dense {
        ($i:ty, $v:ty, $d:expr) => {
            match $d {
                ValueFormat::F32 => exercise_typed::<$i, $v, f32>(cache),
                ValueFormat::F16 => exercise_typed::<$i, $v, f16>(cache),
                ValueFormat::Bf16 => exercise_typed::<$i, $v, bf16>(cache),
                ValueFormat::Fp8E4M3 => exercise_typed::<$i, $v, Fp8E4M3>(cache),
            }
        };
    }
    macro_rules! csr_value {
        ($i:ty, $v:expr, $d:expr) => {
            match $v {
                ValueFormat::F32 => csr_dense!($i, f32, $d),
                ValueFormat::F16 => csr_dense!($i, f16, $d),
                ValueFormat::Bf16 => csr_dense!($i, bf16, $d),
                ValueFormat::Fp8E4M3 => csr_dense!($i, Fp8E4M3, $d),
            }
        };
    }
    macro_rules! coded_dense {
        ($x:ty, $y:ty, $d:expr) => {
            match $d {
                ValueFormat::F32 => exercise_coded::<$x, $y, f32>(cache),
                ValueFormat::F16 => exercise_coded::<$x, $y, f16>(cache),
                ValueFormat::Bf16 => exercise_coded::<$x, $y, bf16>(cache),
                ValueFormat::Fp8E4M3 => exercise_coded::<$x, $y, Fp8E4M3>(cache),
            }
        };
    }
    macro_rules! coded_value {
        ($x:ty, $v:expr, $d:expr) => {
            match $v {
                ValueKind::Elems(ValueFormat::F32) => coded_dense!($x, Elems<f32>, $d),
                ValueKind::Elems(ValueFormat::F16) => coded_dense!($x, Elems<f16>, $d),
                ValueKind::Elems(ValueFormat::Bf16) => coded_dense!($x, Elems<bf16>, $d),
                ValueKind::Elems(ValueFormat::Fp8E4M3) => coded_dense!($x, Elems<Fp8E4M3>, $d),
                ValueKind::Int8 => coded_dense!($x, Int8Values, $d),
                ValueKind::Int4 => coded_dense!($x, Int4Values, $d),
                other => panic!("validated file reports value code {other}"),
            }
        };
    }
    match cache.layout() {
        CacheLayout::Csr { index_bytes: 1, value, dense } => csr_value!(u8, value, dense),
        CacheLayout::Csr { index_bytes: 2, value, dense } => csr_value!(u16, value, dense),
        CacheLayout::Coded { index, value, dense } => match index {
            IndexKind::ListU8 => coded_value!(List<u8>, value, dense),
            IndexKind::ListU16 => coded_value!(List<u16>, value, dense),
            IndexKind::Bitmask => coded_value!(Bitmask, value, dense),
            other => panic!("validated file reports index kind {other}"),
        },
        CacheLayout::Dense { format } => match format {
            ValueFormat::F32 => exercise_dense::<f32>(cache),
            ValueFormat::F16 => exercise_dense::<f16>(cache),
            ValueFormat::Bf16 => exercise_dense::<bf16>(cache),
            ValueFormat::Fp8E4M3 => exercise_dense::<Fp8E4M3>(cache),
        },
        CacheLayout::Quant { format } => match format {
            DenseFormat::Int8 => exercise_quant::<Int8Blocks>(cache),
            DenseFormat::Int4 => exercise_quant::<Int4Blocks>(cache),
            DenseFormat::Fp8 => exercise_quant::<Fp8Rows>(cache),
        },
        other => panic!("validated file reports layout {other}"),
    }
}

/// Parses a re-encoded image and re-encodes it again: the bytes must not change.
fn assert_idempotent(image: &[u8], again: impl Fn(&MappedCache) -> Vec<u8>) {
    let parsed = MappedCache::from_bytes(image).expect("a re-encoded file parses");
    assert!(again(&parsed) == image, "re-encoding is not idempotent");
}

/// Every head's (config, view) of a validated coded file, layer-major.
fn coded_views<X: IndexCode, Y: ValueCode, D: Value>(
    c: &MappedCache,
) -> Vec<(HybridConfig, CodedHybridView<'_, X, Y, D>)> {
    let kv_heads = c.kv_heads();
    (0..c.num_layers() * kv_heads)
        .map(|h| {
            let (l, k) = (h / kv_heads, h % kv_heads);
            let view = c.coded_view::<X, Y, D>(l, k).expect("view of a validated file");
            (c.config(l, k).expect("config of a validated file"), view)
        })
        .collect()
}

/// A coded file re-encoded with its own identity and extra blocks.
fn encode_coded<X: IndexCode, Y: ValueCode, D: Value>(c: &MappedCache) -> Vec<u8> {
    CacheImage::coded(c.num_layers(), c.kv_heads(), &coded_views::<X, Y, D>(c))
        .expect("re-encode a valid file")
        .with_identity(c.identity())
        .with_extra(c.extra())
        .encode()
        .expect("encode")
}

fn exercise_coded<X: IndexCode, Y: ValueCode, D: Value>(cache: &MappedCache) {
    let kv_heads = cache.kv_heads();
    for (h, (cfg, view)) in coded_views::<X, Y, D>(cache).iter().enumerate() {
        check_decodes(
            view.len(),
            cfg.head_dim,
            |t, out| view.key_into(t, out),
            |t, out| view.value_into(t, out),
        );
        let mut owned = cache.load_coded::<X, Y, D>(h / kv_heads, h % kv_heads).expect("load");
        let zeros = vec![0.0f32; cfg.head_dim];
        owned.append(&zeros, &zeros).expect("append to a loaded cache");
        assert_eq!(owned.len(), view.len() + 1);
    }
    assert_idempotent(&encode_coded::<X, Y, D>(cache), encode_coded::<X, Y, D>);
}

fn exercise_dense<D: Value>(cache: &MappedCache) {
    let (layers, kv_heads, d) = (cache.num_layers(), cache.kv_heads(), cache.head_dim());
    let rows = |c: &MappedCache| -> Vec<(Vec<D>, Vec<D>)> {
        (0..layers * kv_heads)
            .map(|h| {
                let (k, v) = c.dense_rows::<D>(h / kv_heads, h % kv_heads).expect("dense rows");
                (k.to_vec(), v.to_vec())
            })
            .collect()
    };
    let encode = |c: &MappedCache| {
        let owned = rows(c);
        for (k, v) in &owned {
            assert_eq!(k.len(), v.len());
            assert!(k.iter().chain(v).all(|x| x.to_f32().is_finite()));
        }
        let heads: Vec<(&[D], &[D])> = owned.iter().map(|(k, v)| (&k[..], &v[..])).collect();
        CacheImage::dense(layers, kv_heads, d, &heads)
            .expect("re-encode")
            .with_identity(c.identity())
            .with_extra(c.extra())
            .encode()
            .expect("encode")
    };
    assert_idempotent(&encode(cache), encode);
}

fn exercise_quant<C: DenseCodec>(cache: &MappedCache) {
    let (layers, kv_heads, d) = (cache.num_layers(), cache.kv_heads(), cache.head_dim());
    let mut out = vec![0.0f32; d];
    for h in 0..layers * kv_heads {
        let (k, v) = cache.quant_rows::<C>(h / kv_heads, h % kv_heads).expect("quant rows");
        for view in [k, v] {
            for r in 0..view.num_rows() {
                view.decode_row(r, &mut out).expect("decode a validated row");
                assert!(out.iter().all(|x| x.is_finite()));
            }
        }
        let (mut lk, _): (QuantRows<C>, _) =
            cache.load_quant::<C>(h / kv_heads, h % kv_heads).expect("load");
        lk.push(&vec![0.5; d]).expect("append to loaded rows");
        assert_eq!(lk.len(), k.num_rows() + 1);
    }
    let encode = |c: &MappedCache| {
        let heads: Vec<_> = (0..layers * kv_heads)
            .map(|h| c.quant_rows::<C>(h / kv_heads, h % kv_heads).expect("quant rows"))
            .collect();
        CacheImage::quant(layers, kv_heads, &heads)
            .expect("re-encode")
            .with_identity(c.identity())
            .with_extra(c.extra())
            .encode()
            .expect("encode")
    };
    assert_idempotent(&encode(cache), encode);
}

/// Every token decodes to finite values and one past the end is an error.
fn check_decodes(
    len: usize,
    d: usize,
    key: impl Fn(usize, &mut [f32]) -> kv_sparse::Result<()>,
    value: impl Fn(usize, &mut [f32]) -> kv_sparse::Result<()>,
) {
    let mut out = vec![0.0f32; d];
    for t in 0..len {
        key(t, &mut out).expect("key of an in-range token");
        assert!(out.iter().all(|x| x.is_finite()));
        value(t, &mut out).expect("value of an in-range token");
        assert!(out.iter().all(|x| x.is_finite()));
    }
    assert!(key(len, &mut out).is_err());
}

fn exercise_typed<I: SparseIndex, V: Value, D: Value>(cache: &MappedCache) {
    let (layers, kv_heads) = (cache.num_layers(), cache.kv_heads());
    let mut heads = Vec::with_capacity(layers * kv_heads);
    for layer in 0..layers {
        for kv_head in 0..kv_heads {
            let view = cache.view::<I, V, D>(layer, kv_head).expect("view of a validated file");
            let cfg = cache.config(layer, kv_head).expect("config of a validated file");
            check_view(&view);
            let mut owned =
                cache.load::<I, V, D>(layer, kv_head).expect("load of a validated file");
            let zeros = vec![0.0f32; cfg.head_dim];
            owned.append(&zeros, &zeros).expect("append to a loaded cache");
            assert_eq!(owned.len(), view.len() + 1);
            heads.push((cfg, view));
        }
    }
    let image = CacheImage::csr(layers, kv_heads, &heads)
        .expect("re-encode a valid file")
        .with_identity(cache.identity())
        .with_extra(cache.extra())
        .encode()
        .expect("encode");
    let again = MappedCache::from_bytes(&image).expect("a re-encoded file parses");
    let mut heads2 = Vec::with_capacity(heads.len());
    for layer in 0..layers {
        for kv_head in 0..kv_heads {
            let view = again.view::<I, V, D>(layer, kv_head).expect("view of a re-encoded file");
            heads2.push((again.config(layer, kv_head).expect("config"), view));
        }
    }
    let image2 = CacheImage::csr(layers, kv_heads, &heads2)
        .expect("re-encode again")
        .with_identity(again.identity())
        .with_extra(again.extra())
        .encode()
        .expect("encode");
    assert!(image == image2, "re-encoding is not idempotent");
}

/// Every token decodes to finite values; sparse rows are in bounds and ascending.
fn check_view<I: SparseIndex, V: Value, D: Value>(view: &HybridView<'_, I, V, D>) {
    let d = view.head_dim;
    for csr in [view.sparse_keys, view.sparse_values] {
        assert_eq!(csr.rows().len(), csr.num_rows());
        for row in csr.rows() {
            assert_eq!(row.indices.len(), row.values.len());
            assert!(row.indices.windows(2).all(|w| w[0].to_usize() < w[1].to_usize()));
            assert!(row.indices.iter().all(|i| i.to_usize() < d));
        }
    }
    let mut out = vec![0.0f32; d];
    for t in 0..view.len() {
        view.key_into(t, &mut out).expect("key of an in-range token");
        assert!(out.iter().all(|x| x.is_finite()));
        view.value_into(t, &mut out).expect("value of an in-range token");
        assert!(out.iter().all(|x| x.is_finite()));
    }
    assert!(view.key_into(view.len(), &mut out).is_err());
}

/// A deterministic row of `d` values for token `t`.
fn row(t: usize, d: usize, salt: usize) -> Vec<f32> {
    (0..d).map(|i| ((t * 31 + i * 17 + salt * 7) % 41) as f32 * 0.21 - 4.0).collect()
}

fn image<I: SparseIndex, V: Value, D: Value>(
    layers: usize,
    kv_heads: usize,
    cfg: HybridConfig,
    tokens: usize,
) -> Vec<u8> {
    let caches: Vec<HybridCache<I, V, D>> = (0..layers * kv_heads)
        .map(|h| {
            let mut c = HybridCache::new(cfg).expect("seed config");
            for t in 0..tokens + h {
                c.append(&row(t, cfg.head_dim, h), &row(t, cfg.head_dim, h + 1)).expect("append");
            }
            c
        })
        .collect();
    let heads: Vec<_> = caches.iter().map(|c| (*c.config(), c.view())).collect();
    persist::encode_views(layers, kv_heads, &heads).expect("encode seed")
}

fn coded_image<X: IndexCode, Y: ValueCode, D: Value>(
    layers: usize,
    kv_heads: usize,
    cfg: HybridConfig,
    tokens: usize,
) -> Vec<u8> {
    let cfg = cfg.for_store::<CodedStore<X, Y>>();
    let caches: Vec<CodedHybridCache<X, Y, D>> = (0..layers * kv_heads)
        .map(|h| {
            let mut c = CodedHybridCache::new(cfg).expect("seed config");
            for t in 0..tokens + h {
                c.append(&row(t, cfg.head_dim, h), &row(t, cfg.head_dim, h + 1)).expect("append");
            }
            c
        })
        .collect();
    let heads: Vec<_> = caches.iter().map(|c| (*c.config(), c.view())).collect();
    CacheImage::coded(layers, kv_heads, &heads)
        .expect("seed")
        .with_identity(b"kvtide-cache/1\nmodel=seed\nprojection=none\nformat=seed\n")
        .with_extra(&[7; 13])
        .encode()
        .expect("encode seed")
}

fn dense_image<D: Value>(layers: usize, kv_heads: usize, d: usize, tokens: usize) -> Vec<u8> {
    let heads: Vec<(Vec<D>, Vec<D>)> = (0..layers * kv_heads)
        .map(|h| {
            let k = (0..tokens + h).flat_map(|t| row(t, d, h)).map(D::from_f32).collect();
            let v = (0..tokens + h).flat_map(|t| row(t, d, h + 1)).map(D::from_f32).collect();
            (k, v)
        })
        .collect();
    let borrowed: Vec<(&[D], &[D])> = heads.iter().map(|(k, v)| (&k[..], &v[..])).collect();
    CacheImage::dense(layers, kv_heads, d, &borrowed)
        .expect("seed")
        .with_identity(b"dense seed")
        .encode()
        .expect("encode seed")
}

fn quant_image<C: DenseCodec>(layers: usize, kv_heads: usize, d: usize, tokens: usize) -> Vec<u8> {
    let rows: Vec<(QuantRows<C>, QuantRows<C>)> = (0..layers * kv_heads)
        .map(|h| {
            let (mut k, mut v) =
                (QuantRows::new(d).expect("seed"), QuantRows::new(d).expect("seed"));
            for t in 0..tokens + h {
                k.push(&row(t, d, h)).expect("push");
                v.push(&row(t, d, h + 1)).expect("push");
            }
            (k, v)
        })
        .collect();
    let views: Vec<_> = rows.iter().map(|(k, v)| (k.view(), v.view())).collect();
    CacheImage::quant(layers, kv_heads, &views)
        .expect("seed")
        .with_extra(b"prefix")
        .encode()
        .expect("encode seed")
}

/// Valid files covering, for the CSR layout, every index width, value format and dense
/// format, empty caches, `b = 0`, lossless `k = d`, fp8 scales, small blocks and several
/// heads; for the coded layout every index kind × value code (row scales included);
/// dense rows of every float format; quantized rows of every codec; identity and extra
/// blocks; and the version-1 layout of the previous writer.
pub fn seeds() -> Vec<Vec<u8>> {
    let scaled = HybridConfig { fp8_scale: Some((0.5, 4.0)), ..HybridConfig::new(16, 3, 4) };
    let small_blocks = HybridConfig { k_value: 2, rows_per_block: 3, ..HybridConfig::new(8, 2, 3) };
    let zeroing = HybridConfig { non_finite: NonFinitePolicy::Zero, ..HybridConfig::new(8, 1, 8) };
    let coded = HybridConfig::new(16, 2, 6);
    let mut seeds = vec![
        image::<u8, Fp8E4M3, f16>(1, 1, HybridConfig::new(8, 2, 3), 9),
        image::<u8, f16, f16>(1, 1, HybridConfig::new(8, 4, 2), 0),
        image::<u8, f32, f32>(1, 1, HybridConfig::lossless(8, 0), 6),
        image::<u8, bf16, bf16>(2, 2, small_blocks, 10),
        image::<u8, Fp8E4M3, f32>(1, 2, scaled, 12),
        image::<u16, f16, f32>(1, 1, HybridConfig::new(300, 2, 40), 4),
        image::<u16, Fp8E4M3, bf16>(1, 1, HybridConfig::new(260, 1, 5), 3),
        image::<u8, f32, f16>(2, 1, zeroing, 5),
        coded_image::<List<u8>, Elems<f32>, f32>(1, 1, HybridConfig::lossless(8, 1), 5),
        coded_image::<List<u8>, Elems<f16>, f16>(1, 2, coded, 7),
        coded_image::<List<u8>, Elems<bf16>, bf16>(1, 1, coded, 6),
        coded_image::<List<u8>, Elems<Fp8E4M3>, f16>(1, 1, scaled, 8),
        coded_image::<List<u8>, Int8Values, f16>(2, 1, coded, 6),
        coded_image::<List<u8>, Int4Values, f32>(1, 1, coded, 5),
        coded_image::<List<u16>, Int8Values, f16>(1, 1, HybridConfig::new(300, 2, 40), 4),
        coded_image::<List<u16>, Elems<f16>, bf16>(1, 1, coded, 4),
        coded_image::<Bitmask, Elems<f32>, f32>(1, 1, coded, 5),
        coded_image::<Bitmask, Elems<f16>, f16>(1, 1, coded, 0),
        coded_image::<Bitmask, Elems<bf16>, f16>(1, 1, HybridConfig::new(16, 0, 6), 4),
        coded_image::<Bitmask, Elems<Fp8E4M3>, bf16>(1, 2, scaled, 6),
        coded_image::<Bitmask, Int8Values, f16>(2, 2, coded, 6),
        coded_image::<Bitmask, Int4Values, f16>(1, 1, HybridConfig { k_key: 4, ..small_blocks }, 9),
        dense_image::<f32>(1, 1, 8, 3),
        dense_image::<f16>(2, 1, 8, 4),
        dense_image::<bf16>(1, 2, 4, 0),
        quant_image::<Int8Blocks>(1, 1, 32, 3),
        quant_image::<Int4Blocks>(1, 2, 64, 2),
        quant_image::<Fp8Rows>(2, 1, 8, 3),
    ];
    seeds.push(VERSION_1_SEED.to_vec());
    seeds
}

/// A version-1 file of the previous writer (CSR, u8 indices, fp8 values, f16 buffer):
/// `kv-sparse/tests/data/v1-u8-fp8-f16.kvs`.
const VERSION_1_SEED: &[u8] = include_bytes!("../../../kv-sparse/tests/data/v1-u8-fp8-f16.kvs");
