//! Proptest strategies for rows and caches, exported behind the `proptest` feature so
//! users can property-test their own runtimes against `kv-sparse` (e.g. SWAN's lossless
//! setting, method section and Appendix A.1: with `k = d_h` and `f32` storage the cache
//! must reproduce dense attention exactly).
//!
//! Generated values are finite, bounded by 1000 in magnitude (inside every format's range;
//! fp8 saturates above 448 by design), and deliberately include zeros, signed zeros and
//! repeated magnitudes so that top-k tie-breaking is exercised.
//!
//! ```
//! use kv_sparse::strategies::cache_case;
//! use proptest::prelude::*;
//! use proptest::test_runner::TestRunner;
//!
//! let mut runner = TestRunner::default();
//! runner.run(&cache_case(16, 20), |case| {
//!     let cache = case.build::<u8, f32, f32>().unwrap();
//!     prop_assert_eq!(cache.len(), case.rows());
//!     Ok(())
//! }).unwrap();
//! ```

use proptest::collection::vec;
use proptest::prelude::*;

use crate::csr::max_rows_per_block;
use crate::hybrid::{HybridCache, HybridConfig, NonFinitePolicy};
use crate::{Result, SparseIndex, Value};

/// Largest magnitude produced by [`value`].
pub const MAX_ABS: f32 = 1000.0;

/// A finite value: mostly uniform in `[-MAX_ABS, MAX_ABS]`, often a small integer (so
/// magnitudes repeat), sometimes `±0`.
pub fn value() -> impl Strategy<Value = f32> {
    prop_oneof![
        6 => -MAX_ABS..MAX_ABS,
        3 => (-4i8..=4).prop_map(f32::from),
        1 => prop_oneof![Just(0.0f32), Just(-0.0f32)],
    ]
}

/// A dense row of `head_dim` values.
pub fn dense_row(head_dim: usize) -> impl Strategy<Value = Vec<f32>> {
    vec(value(), head_dim)
}

/// `rows` dense rows of `head_dim` values, flattened row-major (rows drawn from `rows`).
pub fn dense_rows(
    head_dim: usize,
    rows: std::ops::Range<usize>,
) -> impl Strategy<Value = (usize, Vec<f32>)> {
    rows.prop_flat_map(move |n| (Just(n), vec(value(), n * head_dim)))
}

/// A valid sparse row for `head_dim`: strictly ascending indices and one value each.
pub fn sparse_row(head_dim: usize) -> impl Strategy<Value = (Vec<usize>, Vec<f32>)> {
    proptest::sample::subsequence((0..head_dim).collect::<Vec<_>>(), 0..=head_dim).prop_flat_map(
        |idx| {
            let n = idx.len();
            (Just(idx), vec(value(), n))
        },
    )
}

/// A valid [`HybridConfig`] for `head_dim`: buffer `0..=8`, any `k_key`/`k_value` in
/// `0..=head_dim`, small blocks (to cross block boundaries often), either non-finite policy,
/// and no scale.
pub fn hybrid_config(head_dim: usize) -> impl Strategy<Value = HybridConfig> {
    let max_rpb = max_rows_per_block(head_dim).clamp(1, 8);
    (0usize..=8, 0..=head_dim, 0..=head_dim, 1..=max_rpb, any::<bool>()).prop_map(
        move |(buffer, k_key, k_value, rows_per_block, zero)| HybridConfig {
            head_dim,
            buffer,
            k_key,
            k_value,
            rows_per_block,
            non_finite: if zero { NonFinitePolicy::Zero } else { NonFinitePolicy::Error },
            fp8_scale: None,
        },
    )
}

/// A config plus the key and value rows of a sequence of tokens.
#[derive(Clone, Debug)]
pub struct CacheCase {
    /// The cache configuration.
    pub cfg: HybridConfig,
    /// Keys, `rows × head_dim` row-major.
    pub keys: Vec<f32>,
    /// Values, `rows × head_dim` row-major.
    pub values: Vec<f32>,
}

impl CacheCase {
    /// Number of tokens.
    pub fn rows(&self) -> usize {
        self.keys.len() / self.cfg.head_dim
    }

    /// Key row of token `t`.
    pub fn key(&self, t: usize) -> &[f32] {
        let d = self.cfg.head_dim;
        &self.keys[t * d..(t + 1) * d]
    }

    /// Value row of token `t`.
    pub fn value(&self, t: usize) -> &[f32] {
        let d = self.cfg.head_dim;
        &self.values[t * d..(t + 1) * d]
    }

    /// A cache built by appending every token in order.
    ///
    /// # Errors
    /// Any error of [`HybridCache::new`] or [`HybridCache::append`] (e.g. a format or index
    /// type that does not fit `head_dim`).
    pub fn build<I: SparseIndex, V: Value, D: Value>(&self) -> Result<HybridCache<I, V, D>> {
        let mut cache = HybridCache::new(self.cfg)?;
        for t in 0..self.rows() {
            cache.append(self.key(t), self.value(t))?;
        }
        Ok(cache)
    }
}

/// A [`CacheCase`] with `head_dim` in `1..=max_head_dim` and `0..=max_rows` tokens.
pub fn cache_case(max_head_dim: usize, max_rows: usize) -> impl Strategy<Value = CacheCase> {
    (1..=max_head_dim, 0..=max_rows).prop_flat_map(|(d, n)| {
        (hybrid_config(d), vec(value(), n * d), vec(value(), n * d))
            .prop_map(|(cfg, keys, values)| CacheCase { cfg, keys, values })
    })
}

/// Like [`cache_case`] but with `k_key = k_value = head_dim` (the lossless setting).
pub fn lossless_case(max_head_dim: usize, max_rows: usize) -> impl Strategy<Value = CacheCase> {
    cache_case(max_head_dim, max_rows).prop_map(|mut case| {
        case.cfg.k_key = case.cfg.head_dim;
        case.cfg.k_value = case.cfg.head_dim;
        case
    })
}
