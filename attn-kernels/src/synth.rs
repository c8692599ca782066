//! Synthetic, seeded KV caches for tests and benchmarks: Gaussian rows stored in any value
//! format, pruned to SWAN's top-`k` CSR rows (method section: magnitude pruning of evicted
//! vectors) or kept in a hybrid cache with a dense buffer of `b` recent rows, or as the
//! fixed-width `u8` + fp8 slab rows of a tiered store ([`crate::SparseSlab`]).
//!
//! Same seed, same data — on every machine — so benchmark runs and failing test cases can
//! be reproduced.

use kv_sparse::csr::CsrStore;
use kv_sparse::fp8::Fp8E4M3;
use kv_sparse::hybrid::{HybridCache, HybridConfig};
use kv_sparse::{SparseIndex, Value};
use rand::SeedableRng;
use rand::rngs::StdRng;
use rand_distr::{Distribution, StandardNormal};

use crate::error::Result;

/// `n` standard-normal `f32` values from `seed`.
///
/// # Examples
/// ```
/// let a = attn_kernels::synth::values(4, 1);
/// assert_eq!(a, attn_kernels::synth::values(4, 1));
/// assert_ne!(a, attn_kernels::synth::values(4, 2));
/// ```
pub fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..n).map(|_| StandardNormal.sample(&mut rng)).collect()
}

/// `rows × head_dim` standard-normal values stored as `D`.
///
/// # Examples
/// ```
/// let k: Vec<half::f16> = attn_kernels::synth::dense_rows(3, 8, 5);
/// assert_eq!(k.len(), 24);
/// ```
pub fn dense_rows<D: Value>(rows: usize, head_dim: usize, seed: u64) -> Vec<D> {
    values(rows * head_dim, seed).into_iter().map(D::from_f32).collect()
}

/// A CSR store of `rows` standard-normal vectors, each pruned to its `k` largest-magnitude
/// components.
///
/// # Errors
/// [`crate::Error::Sparse`] if `head_dim` does not fit `I` or `k > head_dim`.
///
/// # Examples
/// ```
/// let s = attn_kernels::synth::csr_store::<u8, half::f16>(16, 10, 4, 3)?;
/// assert_eq!((s.len(), s.nnz()), (10, 40));
/// # Ok::<(), attn_kernels::Error>(())
/// ```
pub fn csr_store<I: SparseIndex, V: Value>(
    head_dim: usize,
    rows: usize,
    k: usize,
    seed: u64,
) -> Result<CsrStore<I, V>> {
    let mut store = CsrStore::new(head_dim)?;
    store.reserve(rows, rows * k);
    for row in values(rows * head_dim, seed).chunks_exact(head_dim) {
        store.push_dense(row, k)?;
    }
    Ok(store)
}

/// A hybrid cache holding `len` standard-normal tokens: the last `buffer` dense, the rest
/// pruned to `k` components (keys and values).
///
/// # Errors
/// [`crate::Error::Sparse`] for an invalid configuration (see `HybridConfig::validate`).
pub fn hybrid_cache<I: SparseIndex, V: Value, D: Value>(
    head_dim: usize,
    buffer: usize,
    k: usize,
    len: usize,
    seed: u64,
) -> Result<HybridCache<I, V, D>> {
    hybrid_cache_with(HybridConfig::new(head_dim, buffer, k), len, seed)
}

/// A hybrid cache with configuration `cfg` holding `len` standard-normal tokens.
///
/// # Errors
/// [`crate::Error::Sparse`] for an invalid configuration.
pub fn hybrid_cache_with<I: SparseIndex, V: Value, D: Value>(
    cfg: HybridConfig,
    len: usize,
    seed: u64,
) -> Result<HybridCache<I, V, D>> {
    let mut cache = HybridCache::new(cfg)?;
    let keys = values(len * cfg.head_dim, seed);
    let vals = values(len * cfg.head_dim, seed ^ 0x9e37_79b9_7f4a_7c15);
    cache.extend(&keys, &vals)?;
    Ok(cache)
}

/// A [`crate::SparseSlab`]'s bytes: `rows` standard-normal vectors, each pruned to its `k`
/// largest-magnitude components and stored as `k` `u8` indices then `k` fp8 E4M3FN codes
/// of `value / scale` (`kv-tiered`'s sparse row format).
///
/// # Errors
/// [`crate::Error::Sparse`] if `k > head_dim`.
///
/// # Examples
/// ```
/// let bytes = attn_kernels::synth::sparse_slab(5, 64, 16, 0.5, 1)?;
/// assert_eq!(bytes.len(), 5 * 2 * 16);
/// assert!(bytes.chunks(32).all(|r| r[..16].iter().all(|&i| i < 64)));
/// # Ok::<(), attn_kernels::Error>(())
/// ```
pub fn sparse_slab(
    rows: usize,
    head_dim: usize,
    k: usize,
    scale: f32,
    seed: u64,
) -> Result<Vec<u8>> {
    let mut out = Vec::with_capacity(rows * 2 * k);
    let mut top = Vec::with_capacity(k);
    for row in values(rows * head_dim, seed).chunks_exact(head_dim.max(1)) {
        kv_sparse::topk::top_k_magnitude(row, k, &mut top)?;
        out.extend(top.iter().map(|&i| i as u8));
        out.extend(top.iter().map(|&i| Fp8E4M3::from_f32(row[i] / scale).to_bits()));
    }
    Ok(out)
}
