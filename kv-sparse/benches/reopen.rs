//! Reopening a persisted SmolLM2-shaped prompt cache (prefix reuse): 32 768 tokens,
//! 30 layers × 3 kv heads of head_dim 64, as SWAN's demo configuration (bitmask indices,
//! int8 values with a per-row scale, k = 32, b = 128, f16 buffer: the coded hybrid cache
//! of the method section's "Memory footprint") and as dense f16 rows.
//!
//! Two measurements per file, each warm and cold:
//! * `open`: `MappedCache::open` — map the file and validate its structure (header CRC,
//!   directory and blocks CRC, every head's config and section bounds); the heads'
//!   checksums and rows are checked on first use, so this is the time to a usable cache;
//! * `open+validate_all`: the same, then `validate_all` — every head's CRC-32 and every
//!   row through the validator its in-memory type uses (what opening cost before per-head
//!   checks, and what a caller that wants everything checked up front pays);
//! * SWAN file only, the time to caches that can keep decoding (every head validated on
//!   first use): `open+continue copied` copies each head's history and buffer into owned
//!   stores (`MappedCache::load_coded`); `open+continue mapped` leaves each head's first
//!   `rows − rows mod 256` history rows in the map and copies the rest and the buffer
//!   (`CodedHybridCache::from_view_after`), as the `models` SWAN cache does when it
//!   attends a reopened history where it lies; `… all cores` first validates every head
//!   with `MappedCache::validate_all_on` on every core, as the `models` caches load.
//!
//! Throughput is the file's bytes per second (for `open` it only reads the metadata, so
//! compare times, not throughputs).
//! * `warm`: the file is in the page cache (the previous iteration read it);
//! * `cold`: before every open the file's pages are dropped with
//!   `posix_fadvise(POSIX_FADV_DONTNEED)` (the file was fsynced, so its pages are clean
//!   and the kernel drops them), so the open reads from disk.
//!
//! Run: `cargo bench -p kv-sparse --bench reopen` (writes two files, ~0.26 GB and
//! ~0.75 GB, in a temporary directory under `$CARGO_TARGET_DIR`, or the system's).

use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use half::f16;
use kv_sparse::coded::{Bitmask, CodedStore, Int8Values};
use kv_sparse::hybrid::{CodedHybridCache, HybridConfig};
use kv_sparse::persist::{CacheImage, MappedCache};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const TOKENS: usize = 32_768;
const LAYERS: usize = 30;
const KV_HEADS: usize = 3;
const HEAD_DIM: usize = 64;

/// Deterministic pseudo-activations of mixed magnitude for one head.
fn rows(seed: u64) -> Vec<f32> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..TOKENS * HEAD_DIM)
        .map(|_| (0..4).map(|_| rng.random_range(-1.0f32..1.0)).sum::<f32>() * 2.0)
        .collect()
}

fn dir() -> PathBuf {
    let base = std::env::var_os("CARGO_TARGET_DIR").map_or_else(std::env::temp_dir, PathBuf::from);
    std::fs::create_dir_all(&base).expect("bench directory");
    base
}

/// Writes the SWAN file head by head (one head's cache alive at a time) into `path`.
fn write_swan(path: &Path) -> u64 {
    let cfg = HybridConfig::new(HEAD_DIM, 128, 32).for_store::<CodedStore<Bitmask, Int8Values>>();
    let heads: Vec<CodedHybridCache<Bitmask, Int8Values, f16>> = (0..LAYERS * KV_HEADS)
        .map(|h| {
            let mut c = CodedHybridCache::new(cfg).expect("config");
            c.extend(&rows(2 * h as u64), &rows(2 * h as u64 + 1)).expect("prefill");
            c
        })
        .collect();
    let views: Vec<_> = heads.iter().map(|c| (*c.config(), c.view())).collect();
    let image = CacheImage::coded(LAYERS, KV_HEADS, &views).expect("image");
    image.with_identity(b"bench: smollm2-shaped swan").write(path).expect("write");
    std::fs::metadata(path).expect("size").len()
}

fn write_dense(path: &Path) -> u64 {
    let heads: Vec<(Vec<f16>, Vec<f16>)> = (0..LAYERS * KV_HEADS)
        .map(|h| {
            let k = rows(2 * h as u64).iter().map(|&x| f16::from_f32(x)).collect();
            let v = rows(2 * h as u64 + 1).iter().map(|&x| f16::from_f32(x)).collect();
            (k, v)
        })
        .collect();
    let borrowed: Vec<(&[f16], &[f16])> = heads.iter().map(|(k, v)| (&k[..], &v[..])).collect();
    let image = CacheImage::dense(LAYERS, KV_HEADS, HEAD_DIM, &borrowed).expect("image");
    image.with_identity(b"bench: smollm2-shaped dense f16").write(path).expect("write");
    std::fs::metadata(path).expect("size").len()
}

/// Drops the file's pages from the page cache.
fn drop_cached(path: &Path) {
    let file = std::fs::File::open(path).expect("open for fadvise");
    // SAFETY: a plain syscall on a file descriptor this function owns for its duration;
    // it only advises the kernel and touches no memory of this process.
    let rc = unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    assert_eq!(rc, 0, "posix_fadvise failed");
}

fn open(path: &Path) -> MappedCache {
    // SAFETY: the bench owns the file in its own directory; nothing writes it while mapped.
    unsafe { MappedCache::open(path) }.expect("a valid file")
}

fn open_validated(path: &Path) -> MappedCache {
    let file = open(path);
    file.validate_all().expect("valid heads");
    file
}

type Swan = CodedHybridCache<Bitmask, Int8Values, f16>;

/// Opens the SWAN file and copies every head into an owned cache.
fn continue_copied(path: &Path) -> MappedCache {
    let file = open(path);
    let heads: Vec<Swan> = (0..LAYERS * KV_HEADS)
        .map(|h| file.load_coded(h / KV_HEADS, h % KV_HEADS).expect("valid head"))
        .collect();
    std::hint::black_box(&heads);
    file
}

/// Every head of `file` as a cache keeping its history in the map but its last rows.
fn mapped_heads(file: &MappedCache) -> Vec<Swan> {
    (0..LAYERS * KV_HEADS)
        .map(|h| {
            let (l, kv) = (h / KV_HEADS, h % KV_HEADS);
            let view = file.coded_view::<Bitmask, Int8Values, f16>(l, kv).expect("valid head");
            let skip = view.sparse_len() - view.sparse_len() % 256;
            let cfg = file.config(l, kv).expect("config");
            Swan::from_view_after(cfg, view, skip).expect("continuable head")
        })
        .collect()
}

/// Opens the SWAN file and keeps every head's history in the map but its last rows.
fn continue_mapped(path: &Path) -> MappedCache {
    let file = open(path);
    std::hint::black_box(&mapped_heads(&file));
    file
}

/// [`continue_mapped`] with every head validated first on all cores
/// (`MappedCache::validate_all_on`), as the `models` caches load.
fn continue_mapped_on_all_cores(path: &Path) -> MappedCache {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let file = open(path);
    file.validate_all_on(threads).expect("valid heads");
    std::hint::black_box(&mapped_heads(&file));
    file
}

/// Times `run` on `path` with the file's pages in the page cache and dropped before each
/// iteration.
fn warm_and_cold(
    g: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    label: &str,
    name: &str,
    path: &Path,
    run: fn(&Path) -> MappedCache,
) {
    g.bench_function(BenchmarkId::new(format!("warm {label}"), name), |b| b.iter(|| run(path)));
    g.bench_function(BenchmarkId::new(format!("cold {label}"), name), |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                drop_cached(path);
                let t = Instant::now();
                let file = run(path);
                total += t.elapsed();
                drop(file);
            }
            total
        })
    });
}

fn reopen(c: &mut Criterion) {
    let dir = tempfile::tempdir_in(dir()).expect("temporary directory");
    let mut g = c.benchmark_group("reopen_32k_tokens_30x3_heads");
    g.sample_size(10).measurement_time(Duration::from_secs(8)).warm_up_time(Duration::from_secs(1));
    let files = [
        (
            "swan bitmask int8 k=32 b=128",
            dir.path().join("swan.kvs"),
            write_swan as fn(&Path) -> u64,
        ),
        ("dense f16", dir.path().join("dense.kvs"), write_dense),
    ];
    for (name, path, write) in files {
        let bytes = write(&path);
        let file = open_validated(&path);
        assert_eq!((file.num_layers(), file.kv_heads()), (LAYERS, KV_HEADS));
        assert_eq!(file.tokens(LAYERS - 1, KV_HEADS - 1).expect("tokens"), TOKENS);
        drop(file);
        g.throughput(Throughput::Bytes(bytes));
        warm_and_cold(&mut g, "open", name, &path, open);
        warm_and_cold(&mut g, "open+validate_all", name, &path, open_validated);
        if name.starts_with("swan") {
            warm_and_cold(&mut g, "open+continue copied", name, &path, continue_copied);
            warm_and_cold(&mut g, "open+continue mapped", name, &path, continue_mapped);
            let all = "open+continue mapped, all cores";
            warm_and_cold(&mut g, all, name, &path, continue_mapped_on_all_cores);
        }
    }
    g.finish();
}

criterion_group!(benches, reopen);
criterion_main!(benches);
