//! Fuzz harness for the `kv-sparse` on-disk cache format ([`MappedCache::from_bytes`]).
//!
//! Oracle: a file image either gives a typed error, or a cache whose every head can be
//! viewed (types taken from the file), decoded token by token, loaded into an owned
//! [`HybridCache`] that accepts a further append, and re-encoded into an image that
//! parses again and re-encodes to the same bytes. Any panic, abort or UB is a bug.
//!
//! Every image is tried twice: as given, and with its checksums and length field
//! recomputed ([`with_valid_checksums`]) so that mutations reach the validation behind
//! the CRC-32s (directory, section layout, CSR invariants).

use half::{bf16, f16};
use kv_sparse::fp8::Fp8E4M3;
use kv_sparse::hybrid::{HybridCache, HybridConfig, HybridView, NonFinitePolicy};
use kv_sparse::persist::{self, MappedCache};
use kv_sparse::{SparseIndex, Value, ValueFormat};

/// Header size of format version 1.
const HEADER_BYTES: usize = 128;
/// Byte offset of the header's `file_bytes` field (u64).
const FILE_BYTES_AT: usize = 56;
/// Byte offset of the header's `payload_crc32` field (u32).
const PAYLOAD_CRC_AT: usize = 64;
/// Byte offset of the header's `header_crc32` field (u32).
const HEADER_CRC_AT: usize = 68;

/// Runs the oracle on `data` as given and with repaired checksums.
pub fn check(data: &[u8]) {
    check_image(data);
    if let Some(fixed) = with_valid_checksums(data) {
        check_image(&fixed);
    }
}

/// `data` with the header's length field and both CRC-32s recomputed (`None` when it is
/// shorter than a header).
pub fn with_valid_checksums(data: &[u8]) -> Option<Vec<u8>> {
    if data.len() < HEADER_BYTES {
        return None;
    }
    let mut v = data.to_vec();
    v[FILE_BYTES_AT..FILE_BYTES_AT + 8].copy_from_slice(&(data.len() as u64).to_le_bytes());
    let payload = crc32fast::hash(&v[HEADER_BYTES..]);
    v[PAYLOAD_CRC_AT..PAYLOAD_CRC_AT + 4].copy_from_slice(&payload.to_le_bytes());
    v[HEADER_CRC_AT..HEADER_CRC_AT + 4].fill(0);
    let header = crc32fast::hash(&v[..HEADER_BYTES]);
    v[HEADER_CRC_AT..HEADER_CRC_AT + 4].copy_from_slice(&header.to_le_bytes());
    Some(v)
}

/// Parses one image and, if it is accepted, exercises everything a reader can do with it.
pub fn check_image(data: &[u8]) {
    match MappedCache::from_bytes(data) {
        Ok(cache) => exercise(&cache),
        Err(e) => assert!(!e.to_string().is_empty()),
    }
}

/// Dispatches on the file's index, value and dense formats.
fn exercise(cache: &MappedCache) {
    macro_rules! with_dense {
        ($i:ty, $v:ty) => {
            match cache.dense_format() {
                ValueFormat::F32 => exercise_typed::<$i, $v, f32>(cache),
                ValueFormat::F16 => exercise_typed::<$i, $v, f16>(cache),
                ValueFormat::Bf16 => exercise_typed::<$i, $v, bf16>(cache),
                ValueFormat::Fp8E4M3 => exercise_typed::<$i, $v, Fp8E4M3>(cache),
            }
        };
    }
    macro_rules! with_value {
        ($i:ty) => {
            match cache.value_format() {
                ValueFormat::F32 => with_dense!($i, f32),
                ValueFormat::F16 => with_dense!($i, f16),
                ValueFormat::Bf16 => with_dense!($i, bf16),
                ValueFormat::Fp8E4M3 => with_dense!($i, Fp8E4M3),
            }
        };
    }
    match cache.index_bytes() {
        1 => with_value!(u8),
        2 => with_value!(u16),
        other => panic!("validated file reports index width {other}"),
    }
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
    let image = persist::encode_views(layers, kv_heads, &heads).expect("re-encode a valid file");
    let again = MappedCache::from_bytes(&image).expect("a re-encoded file parses");
    let mut heads2 = Vec::with_capacity(heads.len());
    for layer in 0..layers {
        for kv_head in 0..kv_heads {
            let view = again.view::<I, V, D>(layer, kv_head).expect("view of a re-encoded file");
            heads2.push((again.config(layer, kv_head).expect("config"), view));
        }
    }
    let image2 = persist::encode_views(layers, kv_heads, &heads2).expect("re-encode again");
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

/// Valid files covering every index width, value format and dense format, empty caches,
/// `b = 0`, lossless `k = d`, fp8 scales, small blocks and several heads.
pub fn seeds() -> Vec<Vec<u8>> {
    let scaled = HybridConfig { fp8_scale: Some((0.5, 4.0)), ..HybridConfig::new(16, 3, 4) };
    let small_blocks = HybridConfig { k_value: 2, rows_per_block: 3, ..HybridConfig::new(8, 2, 3) };
    let zeroing = HybridConfig { non_finite: NonFinitePolicy::Zero, ..HybridConfig::new(8, 1, 8) };
    vec![
        image::<u8, Fp8E4M3, f16>(1, 1, HybridConfig::new(8, 2, 3), 9),
        image::<u8, f16, f16>(1, 1, HybridConfig::new(8, 4, 2), 0),
        image::<u8, f32, f32>(1, 1, HybridConfig::lossless(8, 0), 6),
        image::<u8, bf16, bf16>(2, 2, small_blocks, 10),
        image::<u8, Fp8E4M3, f32>(1, 2, scaled, 12),
        image::<u16, f16, f32>(1, 1, HybridConfig::new(300, 2, 40), 4),
        image::<u16, Fp8E4M3, bf16>(1, 1, HybridConfig::new(260, 1, 5), 3),
        image::<u8, f32, f16>(2, 1, zeroing, 5),
    ]
}
