//! Proptest strategies for decode-attention cases, exported behind the `proptest` feature so
//! users can property-test their own kernels and runtimes against this crate's: an
//! [`AttnConfig`] in every GQA layout (MHA, GQA, MQA; default or custom softmax scale), a
//! query, and one cache per kv-head in every layout and format the kernels take — dense rows
//! (`f32`, `f16`, `bf16`, fp8; ring buffers split anywhere), SWAN's CSR rows and hybrid caches
//! (method section and Appendix A.2; `u8` or `u16` indices), and WnW's gathered resident rows
//! (§2.3; with and without a slot table, dense alone or dense + sparse fp8 slabs).
//!
//! Every case is owned data with a `views` method that borrows what the kernels read, and a
//! `value_bound` for the [`crate::accuracy`] metric. Shapes (heads, head size, rows, `k`,
//! buffer, block size, splits, slots) are drawn by proptest and shrink towards the smallest
//! case; row data is standard-normal from a seed ([`crate::synth`]), so cases stay cheap at
//! realistic sizes and a failure is reproduced from its printed seed. Every kv-head has at
//! least one row (a kv-head with no rows at all is [`crate::Error::EmptyCache`]), while any one
//! part may be empty (no sparse history, `b = 0`, `k = 0`, no dense resident rows).
//!
//! ```
//! use attn_kernels::accuracy::{Kernel, output_error, tolerance};
//! use attn_kernels::strategies::{Limits, hybrid_case};
//! use attn_kernels::{CpuAttention, DecodeAttention, Reference};
//! use kv_sparse::{Value, fp8::Fp8E4M3};
//! use proptest::test_runner::{Config, TestRunner};
//!
//! // The optimized CPU kernels equal the reference within the accuracy table's tolerance,
//! // here over SWAN hybrid caches with fp8 history and an f16 dense buffer.
//! let cases = hybrid_case::<u8, Fp8E4M3, half::f16>(Limits::default());
//! TestRunner::new(Config::with_cases(32)).run(&cases, |case| {
//!     let n = case.cfg.q_len();
//!     let (mut fast, mut slow) = (vec![0.0; n], vec![0.0; n]);
//!     CpuAttention::new(1).unwrap().hybrid(&case.cfg, &case.q, &case.caches, &mut fast).unwrap();
//!     Reference.hybrid(&case.cfg, &case.q, &case.caches, &mut slow).unwrap();
//!     let tol = tolerance(Kernel::Hybrid, Fp8E4M3::FORMAT).output;
//!     proptest::prop_assert!(output_error(&fast, &slow, case.value_bound()) <= tol);
//!     Ok(())
//! }).unwrap();
//! ```

use kv_sparse::coded::{CodedStore, Elems, IndexCode, ValueCode};
use kv_sparse::csr::{CsrStore, CsrView, max_rows_per_block};
use kv_sparse::fp8::Fp8E4M3;
use kv_sparse::hybrid::{CodedHybridCache, HybridCache, HybridConfig, HybridView};
use kv_sparse::quant::{DenseCodec, QuantRows};
use kv_sparse::{SparseIndex, Value};
use proptest::collection::vec;
use proptest::prelude::*;

use crate::config::AttnConfig;
use crate::synth;
use crate::views::{DenseKv, GatheredKv, GatheredSparseKv, QuantKv, SparseKv, SparseSlab};

/// Upper bounds of the cases a strategy draws (each drawn from `1..=bound`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Most kv-heads.
    pub kv_heads: usize,
    /// Most q-heads per kv-head (the GQA group).
    pub group: usize,
    /// Largest head size (further capped by what a format takes: 256 for `u8` indices and
    /// gathered sparse slabs, 65 535 otherwise).
    pub head_dim: usize,
    /// Most rows (tokens) per kv-head.
    pub rows: usize,
}

impl Default for Limits {
    /// Up to 3 kv-heads, groups of 4, `head_dim` 40 (not a multiple of the SIMD width, so
    /// remainders are exercised) and 40 rows.
    fn default() -> Self {
        Self { kv_heads: 3, group: 4, head_dim: 40, rows: 40 }
    }
}

/// An [`AttnConfig`]: `1..=kv_heads` kv-heads, groups of `1..=group` (so MHA, GQA and MQA),
/// `head_dim` in `1..=head_dim`, and the default scale `1/√d_h` or that scale times a factor
/// in `[0.25, 2)` (logits stay in the range the accuracy table covers).
///
/// # Examples
/// ```
/// use attn_kernels::strategies::{Limits, attn_config};
/// use proptest::test_runner::TestRunner;
/// TestRunner::default().run(&attn_config(Limits::default()), |cfg| {
///     proptest::prop_assert_eq!(cfg.q_heads(), cfg.kv_heads() * cfg.group_size());
///     Ok(())
/// }).unwrap();
/// ```
pub fn attn_config(limits: Limits) -> impl Strategy<Value = AttnConfig> {
    let d = limits.head_dim.clamp(1, kv_sparse::MAX_HEAD_DIM);
    let factor = prop_oneof![3 => Just(1.0f32), 1 => 0.25f32..2.0];
    (1..=limits.kv_heads.max(1), 1..=limits.group.max(1), 1..=d, factor).prop_map(
        |(kv, group, d, factor)| {
            let cfg = AttnConfig::new(kv * group, kv, d).expect("a valid layout");
            cfg.with_scale(cfg.scale() * factor).expect("a positive finite scale")
        },
    )
}

/// A layout, rows per kv-head and a data seed.
fn shape(
    limits: Limits,
    max_head_dim: usize,
) -> impl Strategy<Value = (AttnConfig, Vec<usize>, u64)> {
    let limits = Limits { head_dim: limits.head_dim.min(max_head_dim), ..limits };
    let rows = limits.rows.max(1);
    attn_config(limits)
        .prop_flat_map(move |cfg| (Just(cfg), vec(1..=rows, cfg.kv_heads()), any::<u64>()))
}

/// The seed of part `part` of kv-head `head`'s data.
fn seed_of(seed: u64, head: usize, part: u64) -> u64 {
    seed.wrapping_mul(0x9e37_79b9_7f4a_7c15).wrapping_add(16 * head as u64 + part)
}

/// A scale: mostly 1, sometimes in `[0.25, 2)`.
fn scale() -> impl Strategy<Value = f32> {
    prop_oneof![2 => Just(1.0f32), 1 => 0.25f32..2.0]
}

/// Largest `|decoded value · scale|` of a CSR view.
fn csr_bound<I: SparseIndex, V: Value>(view: &CsrView<'_, I, V>, scale: f32) -> f32 {
    view.values().iter().fold(0.0, |m, x| m.max((x.to_f32() * scale).abs()))
}

/// Largest `|decoded value|` of dense rows.
fn dense_bound<D: Value>(rows: &[D]) -> f32 {
    rows.iter().fold(0.0, |m, x| m.max(x.to_f32().abs()))
}

/// One kv-head's dense rows in token order, stored as ring halves: keys split after
/// `key_split` rows, values after `value_split` rows.
#[derive(Clone, Debug)]
pub struct DenseHead<D> {
    /// Key rows, row-major.
    pub keys: Vec<D>,
    /// Value rows, row-major (as many rows as `keys`).
    pub values: Vec<D>,
    /// Rows in the older half of the keys.
    pub key_split: usize,
    /// Rows in the older half of the values.
    pub value_split: usize,
}

impl<D: Value> DenseHead<D> {
    /// The kernel view of these rows.
    pub fn view(&self, head_dim: usize) -> DenseKv<'_, D> {
        DenseKv {
            head_dim,
            keys: self.keys.split_at(self.key_split * head_dim),
            values: self.values.split_at(self.value_split * head_dim),
        }
    }
}

/// A decode step over dense caches: [`crate::DecodeAttention::dense`]'s inputs, owned.
#[derive(Clone, Debug)]
pub struct DenseCase<D> {
    /// Head layout and scale.
    pub cfg: AttnConfig,
    /// The query, `q_heads × head_dim`.
    pub q: Vec<f32>,
    /// One entry per kv-head.
    pub heads: Vec<DenseHead<D>>,
    /// Seed of the row data.
    pub seed: u64,
}

impl<D: Value> DenseCase<D> {
    /// One [`DenseKv`] per kv-head.
    pub fn views(&self) -> Vec<DenseKv<'_, D>> {
        self.heads.iter().map(|h| h.view(self.cfg.head_dim())).collect()
    }

    /// Largest `|value|` attended over (the [`crate::accuracy`] bound).
    pub fn value_bound(&self) -> f32 {
        self.heads.iter().map(|h| dense_bound(&h.values)).fold(0.0, f32::max)
    }
}

/// Dense caches in format `D` (`f32`, `f16`, `bf16` or fp8), each side split into ring
/// halves at any row.
///
/// # Examples
/// ```
/// use attn_kernels::strategies::{Limits, dense_case};
/// use attn_kernels::{DecodeAttention, Reference};
/// use proptest::test_runner::TestRunner;
/// TestRunner::default().run(&dense_case::<half::bf16>(Limits::default()), |case| {
///     let mut out = vec![0.0; case.cfg.q_len()];
///     Reference.dense(&case.cfg, &case.q, &case.views(), &mut out).unwrap();
///     // Softmax outputs are convex combinations of value rows.
///     proptest::prop_assert!(out.iter().all(|x| x.abs() <= case.value_bound() * 1.0001));
///     Ok(())
/// }).unwrap();
/// ```
pub fn dense_case<D: Value>(limits: Limits) -> impl Strategy<Value = DenseCase<D>> {
    shape(limits, kv_sparse::MAX_HEAD_DIM)
        .prop_flat_map(|(cfg, rows, seed)| {
            let splits: Vec<_> = rows.iter().map(|&n| (0..=n, 0..=n)).collect();
            (Just(cfg), Just(rows), splits, Just(seed))
        })
        .prop_map(|(cfg, rows, splits, seed)| {
            let d = cfg.head_dim();
            let heads = rows
                .iter()
                .zip(splits)
                .enumerate()
                .map(|(h, (&n, (key_split, value_split)))| DenseHead {
                    keys: synth::dense_rows(n, d, seed_of(seed, h, 0)),
                    values: synth::dense_rows(n, d, seed_of(seed, h, 1)),
                    key_split,
                    value_split,
                })
                .collect();
            DenseCase { q: synth::values(cfg.q_len(), seed), cfg, heads, seed }
        })
}

/// One kv-head's CSR keys and values with their scales.
#[derive(Clone, Debug)]
pub struct SparseHead<I, V> {
    /// Sparse key rows.
    pub keys: CsrStore<I, V>,
    /// Sparse value rows (as many as `keys`).
    pub values: CsrStore<I, V>,
    /// Multiplies every decoded key.
    pub key_scale: f32,
    /// Multiplies every decoded value.
    pub value_scale: f32,
}

impl<I: SparseIndex, V: Value> SparseHead<I, V> {
    /// The kernel view of these rows.
    pub fn view(&self) -> SparseKv<'_, I, V> {
        SparseKv {
            keys: self.keys.view(),
            values: self.values.view(),
            key_scale: self.key_scale,
            value_scale: self.value_scale,
        }
    }
}

/// A decode step over CSR caches: [`crate::DecodeAttention::sparse`]'s inputs, owned.
#[derive(Clone, Debug)]
pub struct SparseCase<I, V> {
    /// Head layout and scale.
    pub cfg: AttnConfig,
    /// The query, `q_heads × head_dim`.
    pub q: Vec<f32>,
    /// One entry per kv-head.
    pub heads: Vec<SparseHead<I, V>>,
    /// Seed of the row data.
    pub seed: u64,
}

impl<I: SparseIndex, V: Value> SparseCase<I, V> {
    /// One [`SparseKv`] per kv-head.
    pub fn views(&self) -> Vec<SparseKv<'_, I, V>> {
        self.heads.iter().map(SparseHead::view).collect()
    }

    /// Largest `|decoded value · value_scale|` attended over.
    pub fn value_bound(&self) -> f32 {
        self.heads.iter().map(|h| csr_bound(&h.values.view(), h.value_scale)).fold(0.0, f32::max)
    }
}

/// A CSR store of `n` standard-normal rows pruned to `k`, in blocks of `rows_per_block`.
fn csr<I: SparseIndex, V: Value>(
    d: usize,
    n: usize,
    k: usize,
    rows_per_block: usize,
    seed: u64,
) -> CsrStore<I, V> {
    let mut store = CsrStore::with_block_rows(d, rows_per_block).expect("a head size I takes");
    for row in synth::values(n * d, seed).chunks_exact(d) {
        store.push_dense(row, k).expect("finite rows inside every format's range");
    }
    store
}

/// CSR caches with `I` indices (`u8`: `head_dim ≤ 256`; `u16` above) and `V` values: per
/// kv-head its own `k` for keys and values (`0..=head_dim`), block size and scales.
///
/// # Examples
/// ```
/// use attn_kernels::strategies::{Limits, sparse_case};
/// use proptest::test_runner::TestRunner;
/// // u16 indices: head sizes above 256.
/// let limits = Limits { head_dim: 300, ..Limits::default() };
/// TestRunner::default().run(&sparse_case::<u16, half::f16>(limits), |case| {
///     proptest::prop_assert_eq!(case.views().len(), case.cfg.kv_heads());
///     Ok(())
/// }).unwrap();
/// ```
pub fn sparse_case<I: SparseIndex, V: Value>(
    limits: Limits,
) -> impl Strategy<Value = SparseCase<I, V>> {
    shape(limits, I::MAX_HEAD_DIM.min(kv_sparse::MAX_HEAD_DIM))
        .prop_flat_map(|(cfg, rows, seed)| {
            let d = cfg.head_dim();
            let rpb = max_rows_per_block(d).clamp(1, 16);
            let per_head: Vec<_> =
                rows.iter().map(|_| (0..=d, 0..=d, 1..=rpb, scale(), scale())).collect();
            (Just(cfg), Just(rows), per_head, Just(seed))
        })
        .prop_map(|(cfg, rows, per_head, seed)| {
            let d = cfg.head_dim();
            let heads = rows
                .iter()
                .zip(per_head)
                .enumerate()
                .map(|(h, (&n, (k_key, k_value, rpb, key_scale, value_scale)))| SparseHead {
                    keys: csr(d, n, k_key, rpb, seed_of(seed, h, 0)),
                    values: csr(d, n, k_value, rpb, seed_of(seed, h, 1)),
                    key_scale,
                    value_scale,
                })
                .collect();
            SparseCase { q: synth::values(cfg.q_len(), seed), cfg, heads, seed }
        })
}

/// A decode step over SWAN hybrid caches: [`crate::DecodeAttention::hybrid`]'s inputs, with
/// the rows that were appended (so the same step can be run densely).
#[derive(Clone, Debug)]
pub struct HybridCase<I, V, D> {
    /// Head layout and scale.
    pub cfg: AttnConfig,
    /// The query, `q_heads × head_dim`.
    pub q: Vec<f32>,
    /// One cache per kv-head, all with the same [`HybridConfig`].
    pub caches: Vec<HybridCache<I, V, D>>,
    /// The key rows appended to each cache, row-major `f32`.
    pub keys: Vec<Vec<f32>>,
    /// The value rows appended to each cache, row-major `f32`.
    pub values: Vec<Vec<f32>>,
    /// Seed of the row data.
    pub seed: u64,
}

impl<I: SparseIndex, V: Value, D: Value> HybridCase<I, V, D> {
    /// One [`HybridView`] per kv-head (the caches themselves are
    /// [`crate::HybridSource`]s too).
    pub fn views(&self) -> Vec<HybridView<'_, I, V, D>> {
        self.caches.iter().map(HybridCache::view).collect()
    }

    /// Largest `|decoded value|` attended over (sparse history times its scale, and buffer).
    pub fn value_bound(&self) -> f32 {
        self.caches
            .iter()
            .map(|c| {
                let v = c.view();
                let buffer = dense_bound(v.buffer_values.0).max(dense_bound(v.buffer_values.1));
                csr_bound(&v.sparse_values, v.value_scale.1).max(buffer)
            })
            .fold(0.0, f32::max)
    }

    /// The same step over the appended rows kept dense in `f32`: what the hybrid caches
    /// approximate, and equal in the lossless setting ([`lossless_hybrid_case`]).
    ///
    /// # Examples
    /// ```
    /// use attn_kernels::accuracy::{Kernel, LOSSLESS_RELATIVE, output_error, tolerance};
    /// use attn_kernels::strategies::{Limits, lossless_hybrid_case};
    /// use attn_kernels::{CpuAttention, DecodeAttention, Reference};
    /// use kv_sparse::ValueFormat;
    /// use proptest::prop_assert;
    /// use proptest::test_runner::TestRunner;
    /// // k = head_dim and f32 storage: SWAN's hybrid attention is dense attention.
    /// TestRunner::default().run(&lossless_hybrid_case::<u8>(Limits::default()), |case| {
    ///     let (dense, n) = (case.dense(), case.cfg.q_len());
    ///     let (mut want, mut exact, mut fast) = (vec![0.0; n], vec![0.0; n], vec![0.0; n]);
    ///     Reference.dense(&dense.cfg, &dense.q, &dense.views(), &mut want).unwrap();
    ///     Reference.hybrid(&case.cfg, &case.q, &case.caches, &mut exact).unwrap();
    ///     CpuAttention::new(1).unwrap().hybrid(&case.cfg, &case.q, &case.caches, &mut fast).unwrap();
    ///     // Exactly (to f32 rounding) in the reference, to kernel accuracy on the CPU.
    ///     let scale = want.iter().fold(1e-3f32, |m, x| m.max(x.abs()));
    ///     prop_assert!(exact.iter().zip(&want).all(|(a, b)| (a - b).abs() <= LOSSLESS_RELATIVE * scale));
    ///     let tol = tolerance(Kernel::Hybrid, ValueFormat::F32).output;
    ///     prop_assert!(output_error(&fast, &want, dense.value_bound()) <= tol);
    ///     Ok(())
    /// }).unwrap();
    /// ```
    pub fn dense(&self) -> DenseCase<f32> {
        dense_of(self.cfg, &self.q, &self.keys, &self.values, self.seed)
    }
}

fn hybrid_from<I: SparseIndex, V: Value, D: Value>(
    cfg: AttnConfig,
    hc: HybridConfig,
    rows: &[usize],
    seed: u64,
) -> HybridCase<I, V, D> {
    let d = cfg.head_dim();
    let keys: Vec<Vec<f32>> =
        rows.iter().enumerate().map(|(h, &n)| synth::values(n * d, seed_of(seed, h, 0))).collect();
    let values: Vec<Vec<f32>> =
        rows.iter().enumerate().map(|(h, &n)| synth::values(n * d, seed_of(seed, h, 1))).collect();
    let caches = keys
        .iter()
        .zip(&values)
        .map(|(k, v)| {
            let mut cache = HybridCache::new(hc).expect("a valid hybrid configuration");
            cache.extend(k, v).expect("finite rows inside every format's range");
            cache
        })
        .collect();
    HybridCase { q: synth::values(cfg.q_len(), seed), cfg, caches, keys, values, seed }
}

/// SWAN hybrid caches with `I` indices, `V` sparse values and a `D` dense buffer: one
/// [`kv_sparse::strategies::hybrid_config`] per case (buffer `0..=8`, any `k` for keys and
/// values, small blocks), so caches hold sparse history only, buffer only, or both.
///
/// # Examples
/// See the [module docs](self).
pub fn hybrid_case<I: SparseIndex, V: Value, D: Value>(
    limits: Limits,
) -> impl Strategy<Value = HybridCase<I, V, D>> {
    shape(limits, I::MAX_HEAD_DIM.min(kv_sparse::MAX_HEAD_DIM))
        .prop_flat_map(|(cfg, rows, seed)| {
            let hc = kv_sparse::strategies::hybrid_config(cfg.head_dim());
            (Just(cfg), hc, Just(rows), Just(seed))
        })
        .prop_map(|(cfg, hc, rows, seed)| hybrid_from(cfg, hc, &rows, seed))
}

/// [`hybrid_case`] in the lossless setting: `f32` values and buffer, `k = head_dim` for keys
/// and values (SWAN Appendix A.1), so [`HybridCase::dense`] is the same attention.
pub fn lossless_hybrid_case<I: SparseIndex>(
    limits: Limits,
) -> impl Strategy<Value = HybridCase<I, f32, f32>> {
    shape(limits, I::MAX_HEAD_DIM.min(kv_sparse::MAX_HEAD_DIM))
        .prop_flat_map(|(cfg, rows, seed)| {
            let hc = kv_sparse::strategies::hybrid_config(cfg.head_dim());
            (Just(cfg), hc, Just(rows), Just(seed))
        })
        .prop_map(|(cfg, mut hc, rows, seed)| {
            (hc.k_key, hc.k_value) = (hc.head_dim, hc.head_dim);
            hybrid_from(cfg, hc, &rows, seed)
        })
}

/// Strictly ascending positions: a start in `0..8`, then gaps of 1 to 3.
fn positions(n: usize) -> impl Strategy<Value = Vec<u32>> {
    (0u32..8, vec(1u32..=3, n)).prop_map(|(start, gaps)| {
        gaps.iter()
            .scan(start, |p, g| {
                let here = *p;
                *p += g;
                Some(here)
            })
            .collect()
    })
}

/// A slot table for `n` rows and the slab size it needs: `None` over a compact slab of `n`
/// rows, or distinct slab rows in scrambled order from a slab up to 3 rows larger.
fn slot_table(n: usize) -> impl Strategy<Value = (Option<Vec<u32>>, usize)> {
    let slotted = (0usize..=3).prop_flat_map(move |extra| {
        let slab = n + extra;
        Just((0..slab as u32).collect::<Vec<u32>>()).prop_shuffle().prop_map(move |mut p| {
            p.truncate(n);
            (Some(p), slab)
        })
    });
    prop_oneof![Just((None, n)), slotted]
}

/// One kv-head's resident dense rows: positions, optional slots and the key/value slabs.
#[derive(Clone, Debug)]
pub struct GatheredHead<D> {
    /// Absolute positions, strictly ascending.
    pub positions: Vec<u32>,
    /// Slab row of each position (`None`: row `i` is slab row `i`).
    pub slots: Option<Vec<u32>>,
    /// Key slab, row-major.
    pub keys: Vec<D>,
    /// Value slab, row-major (as many rows as `keys`).
    pub values: Vec<D>,
}

impl<D: Value> GatheredHead<D> {
    /// The kernel view of these rows.
    pub fn view(&self, head_dim: usize) -> GatheredKv<'_, D> {
        GatheredKv {
            head_dim,
            positions: &self.positions,
            slots: self.slots.as_deref(),
            keys: &self.keys,
            values: &self.values,
        }
    }

    fn draw(
        d: usize,
        positions: Vec<u32>,
        (slots, slab): (Option<Vec<u32>>, usize),
        seed: u64,
    ) -> Self {
        Self {
            positions,
            slots,
            keys: synth::dense_rows(slab, d, seed),
            values: synth::dense_rows(slab, d, seed ^ 1),
        }
    }
}

/// A decode step over a tiered store's resident rows: [`crate::DecodeAttention::gathered`]'s
/// inputs, owned.
#[derive(Clone, Debug)]
pub struct GatheredCase<D> {
    /// Head layout and scale.
    pub cfg: AttnConfig,
    /// The query, `q_heads × head_dim`.
    pub q: Vec<f32>,
    /// One entry per kv-head.
    pub heads: Vec<GatheredHead<D>>,
    /// Seed of the row data.
    pub seed: u64,
}

impl<D: Value> GatheredCase<D> {
    /// One [`GatheredKv`] per kv-head.
    pub fn views(&self) -> Vec<GatheredKv<'_, D>> {
        self.heads.iter().map(|h| h.view(self.cfg.head_dim())).collect()
    }

    /// Length of the `weights` output: resident rows over all kv-heads.
    pub fn weights_len(&self) -> usize {
        self.heads.iter().map(|h| h.positions.len()).sum()
    }

    /// Largest `|value|` in the slabs.
    pub fn value_bound(&self) -> f32 {
        self.heads.iter().map(|h| dense_bound(&h.values)).fold(0.0, f32::max)
    }
}

/// Gathered dense rows in format `D`: per kv-head, ascending positions with gaps, read
/// through a scrambled slot table into a larger slab or from a compact slab.
///
/// # Examples
/// ```
/// use attn_kernels::strategies::{Limits, gathered_case};
/// use attn_kernels::{DecodeAttention, Reference};
/// use proptest::test_runner::TestRunner;
/// TestRunner::default().run(&gathered_case::<f32>(Limits::default()), |case| {
///     let (mut out, mut w) = (vec![0.0; case.cfg.q_len()], vec![0.0; case.weights_len()]);
///     Reference.gathered(&case.cfg, &case.q, &case.views(), &mut out, Some(&mut w)).unwrap();
///     // Each kv-head's weights sum to its group size (one softmax per q-head).
///     let total: f32 = w.iter().sum();
///     let want = case.cfg.q_heads() as f32;
///     proptest::prop_assert!((total - want).abs() <= 1e-4 * want);
///     Ok(())
/// }).unwrap();
/// ```
pub fn gathered_case<D: Value>(limits: Limits) -> impl Strategy<Value = GatheredCase<D>> {
    shape(limits, kv_sparse::MAX_HEAD_DIM)
        .prop_flat_map(|(cfg, rows, seed)| {
            let per_head: Vec<_> = rows.iter().map(|&n| (positions(n), slot_table(n))).collect();
            (Just(cfg), per_head, Just(seed))
        })
        .prop_map(|(cfg, per_head, seed)| {
            let d = cfg.head_dim();
            let heads = per_head
                .into_iter()
                .enumerate()
                .map(|(h, (pos, slots))| GatheredHead::draw(d, pos, slots, seed_of(seed, h, 0)))
                .collect();
            GatheredCase { q: synth::values(cfg.q_len(), seed), cfg, heads, seed }
        })
}

/// One slab of fixed-width sparse fp8 rows (keys or values) as a tiered store keeps them.
#[derive(Clone, Debug)]
pub struct SlabRows {
    /// Rows of `2k` bytes: `k` `u8` indices, then `k` fp8 E4M3FN codes.
    pub bytes: Vec<u8>,
    /// Kept dimensions per row (`0..=head_dim`).
    pub k: usize,
    /// Multiplies every decoded value.
    pub scale: f32,
}

impl SlabRows {
    /// The kernel view of the slab.
    pub fn view(&self) -> SparseSlab<'_> {
        SparseSlab::new(&self.bytes, self.k, self.scale)
    }

    fn bound(&self) -> f32 {
        let k = self.k;
        self.bytes
            .chunks_exact(2 * k.max(1))
            .flat_map(|row| &row[k..])
            .fold(0.0, |m, &c| m.max((Fp8E4M3::from_bits(c).to_f32() * self.scale).abs()))
    }
}

/// One kv-head's resident rows in a tiered store with SWAN sparse rows: dense rows and
/// sparse fp8 rows at disjoint, interleaved positions.
#[derive(Clone, Debug)]
pub struct GatheredSparseHead<D> {
    /// The dense resident rows (may be none).
    pub dense: GatheredHead<D>,
    /// Positions of the sparse resident rows, strictly ascending (may be none).
    pub positions: Vec<u32>,
    /// Slab row of each sparse position (`None`: row `i` is slab row `i`).
    pub slots: Option<Vec<u32>>,
    /// Sparse key rows.
    pub keys: SlabRows,
    /// Sparse value rows (as many slab rows as `keys`).
    pub values: SlabRows,
}

impl<D: Value> GatheredSparseHead<D> {
    /// The kernel views of these rows: dense and sparse.
    pub fn view(&self, head_dim: usize) -> (GatheredKv<'_, D>, GatheredSparseKv<'_>) {
        let sparse = GatheredSparseKv {
            head_dim,
            positions: &self.positions,
            slots: self.slots.as_deref(),
            keys: self.keys.view(),
            values: self.values.view(),
        };
        (self.dense.view(head_dim), sparse)
    }
}

/// A decode step over dense and sparse resident rows:
/// [`crate::GatheredSparseAttention::gathered_sparse`]'s inputs, owned.
#[derive(Clone, Debug)]
pub struct GatheredSparseCase<D> {
    /// Head layout and scale (`head_dim ≤ 256`).
    pub cfg: AttnConfig,
    /// The query, `q_heads × head_dim`.
    pub q: Vec<f32>,
    /// One entry per kv-head.
    pub heads: Vec<GatheredSparseHead<D>>,
    /// Seed of the row data.
    pub seed: u64,
}

impl<D: Value> GatheredSparseCase<D> {
    /// The dense and the sparse views, one of each per kv-head.
    pub fn views(&self) -> (Vec<GatheredKv<'_, D>>, Vec<GatheredSparseKv<'_>>) {
        self.heads.iter().map(|h| h.view(self.cfg.head_dim())).unzip()
    }

    /// Length of the `weights` output: dense plus sparse resident rows over all kv-heads.
    pub fn weights_len(&self) -> usize {
        self.heads.iter().map(|h| h.dense.positions.len() + h.positions.len()).sum()
    }

    /// Largest `|decoded value|` in the dense and sparse value slabs.
    pub fn value_bound(&self) -> f32 {
        self.heads
            .iter()
            .map(|h| dense_bound(&h.dense.values).max(h.values.bound()))
            .fold(0.0, f32::max)
    }
}

fn gathered_sparse_head<D: Value>(
    d: usize,
    n: usize,
    seed: u64,
) -> impl Strategy<Value = GatheredSparseHead<D>> {
    (positions(n), vec(any::<bool>(), n)).prop_flat_map(move |(all, is_sparse)| {
        let (mut sparse, mut dense) = (Vec::new(), Vec::new());
        for (p, s) in all.into_iter().zip(is_sparse) {
            if s { sparse.push(p) } else { dense.push(p) }
        }
        let parts = (slot_table(dense.len()), slot_table(sparse.len()));
        (Just(dense), Just(sparse), parts, 0..=d, 0..=d, scale(), scale()).prop_map(
            move |(dense, sparse, (dense_slots, (slots, slab)), k_key, k_value, ks, vs)| {
                let slab_rows = |k, scale, part| SlabRows {
                    bytes: synth::sparse_slab(slab, d, k, scale, seed_of(seed, 0, part))
                        .expect("k ≤ head_dim"),
                    k,
                    scale,
                };
                GatheredSparseHead {
                    dense: GatheredHead::draw(d, dense, dense_slots, seed),
                    positions: sparse,
                    slots,
                    keys: slab_rows(k_key, ks, 2),
                    values: slab_rows(k_value, vs, 3),
                }
            },
        )
    })
}

/// Gathered dense rows in format `D` and sparse fp8 rows (`u8` indices, so
/// `head_dim ≤ 256`): per kv-head, at least one resident row, each either dense or sparse,
/// each part with or without a slot table; `k` of keys and values in `0..=head_dim` and
/// scales drawn independently.
///
/// # Examples
/// ```
/// use attn_kernels::accuracy::{Kernel, output_error, tolerance};
/// use attn_kernels::strategies::{Limits, gathered_sparse_case};
/// use attn_kernels::{CpuAttention, GatheredSparseAttention, Reference};
/// use proptest::test_runner::TestRunner;
/// TestRunner::default().run(&gathered_sparse_case::<f32>(Limits::default()), |case| {
///     let (dense, sparse) = case.views();
///     let n = case.cfg.q_len();
///     let (mut fast, mut slow) = (vec![0.0; n], vec![0.0; n]);
///     let mut cpu = CpuAttention::new(1).unwrap();
///     cpu.gathered_sparse(&case.cfg, &case.q, &dense, &sparse, &mut fast, None).unwrap();
///     Reference.gathered_sparse(&case.cfg, &case.q, &dense, &sparse, &mut slow, None).unwrap();
///     let tol = tolerance(Kernel::GatheredSparse, kv_sparse::ValueFormat::F32).output;
///     proptest::prop_assert!(output_error(&fast, &slow, case.value_bound()) <= tol);
///     Ok(())
/// }).unwrap();
/// ```
pub fn gathered_sparse_case<D: Value>(
    limits: Limits,
) -> impl Strategy<Value = GatheredSparseCase<D>> {
    shape(limits, 256)
        .prop_flat_map(|(cfg, rows, seed)| {
            let d = cfg.head_dim();
            let heads: Vec<_> = rows
                .iter()
                .enumerate()
                .map(|(h, &n)| gathered_sparse_head::<D>(d, n, seed_of(seed, h, 0)))
                .collect();
            (Just(cfg), heads, Just(seed))
        })
        .prop_map(|(cfg, heads, seed)| GatheredSparseCase {
            q: synth::values(cfg.q_len(), seed),
            cfg,
            heads,
            seed,
        })
}

/// Dense rows of `keys`/`values` per kv-head as an f32 [`DenseCase`] (contiguous rings).
fn dense_of(
    cfg: AttnConfig,
    q: &[f32],
    keys: &[Vec<f32>],
    values: &[Vec<f32>],
    seed: u64,
) -> DenseCase<f32> {
    let d = cfg.head_dim();
    let heads = keys
        .iter()
        .zip(values)
        .map(|(k, v)| DenseHead {
            keys: k.clone(),
            values: v.clone(),
            key_split: k.len() / d,
            value_split: v.len() / d,
        })
        .collect();
    DenseCase { cfg, q: q.to_vec(), heads, seed }
}

/// A decode step over SWAN hybrid caches of coded rows (`X` index code, `Y` value code,
/// `D` buffer): [`crate::EncodedAttention::coded_hybrid`]'s inputs with the appended rows.
#[derive(Clone, Debug)]
pub struct CodedHybridCase<X, Y, D> {
    /// Head layout and scale.
    pub cfg: AttnConfig,
    /// The query, `q_heads × head_dim`.
    pub q: Vec<f32>,
    /// One cache per kv-head.
    pub caches: Vec<CodedHybridCache<X, Y, D>>,
    /// The key rows appended to each cache, row-major `f32`.
    pub keys: Vec<Vec<f32>>,
    /// The value rows appended to each cache, row-major `f32`.
    pub values: Vec<Vec<f32>>,
    /// Seed of the row data.
    pub seed: u64,
}

impl<X: IndexCode, Y: ValueCode, D: Value> CodedHybridCase<X, Y, D> {
    /// Largest `|value|` appended (a bound of what attention averages).
    pub fn value_bound(&self) -> f32 {
        self.values.iter().map(|v| dense_bound(v)).fold(0.0, f32::max)
    }

    /// The same step over the appended rows kept dense in `f32` (equal in the lossless
    /// setting, [`lossless_coded_hybrid_case`]).
    ///
    /// # Examples
    /// ```
    /// use attn_kernels::accuracy::{Kernel, output_error, tolerance};
    /// use attn_kernels::strategies::{Limits, lossless_coded_hybrid_case};
    /// use attn_kernels::{CpuAttention, DecodeAttention, EncodedAttention, Reference};
    /// use kv_sparse::ValueFormat;
    /// use kv_sparse::coded::Bitmask;
    /// use proptest::test_runner::TestRunner;
    /// // Bitmask rows keeping every component in f32: SWAN's attention is dense attention.
    /// TestRunner::default().run(&lossless_coded_hybrid_case::<Bitmask>(Limits::default()), |case| {
    ///     let (dense, n) = (case.dense(), case.cfg.q_len());
    ///     let (mut want, mut fast) = (vec![0.0; n], vec![0.0; n]);
    ///     Reference.dense(&dense.cfg, &dense.q, &dense.views(), &mut want).unwrap();
    ///     CpuAttention::new(1).unwrap().coded_hybrid(&case.cfg, &case.q, &case.caches, &mut fast).unwrap();
    ///     let tol = tolerance(Kernel::Hybrid, ValueFormat::F32).output;
    ///     proptest::prop_assert!(output_error(&fast, &want, dense.value_bound()) <= tol);
    ///     Ok(())
    /// }).unwrap();
    /// ```
    pub fn dense(&self) -> DenseCase<f32> {
        dense_of(self.cfg, &self.q, &self.keys, &self.values, self.seed)
    }
}

fn coded_from<X: IndexCode, Y: ValueCode, D: Value>(
    cfg: AttnConfig,
    mut hc: HybridConfig,
    rows: &[usize],
    seed: u64,
) -> CodedHybridCase<X, Y, D> {
    let d = cfg.head_dim();
    for k in [&mut hc.k_key, &mut hc.k_value] {
        if Y::check_k("strategy", *k).is_err() {
            *k -= 1; // 4-bit values: an even k
        }
    }
    hc.rows_per_block = hc.rows_per_block.min(CodedStore::<X, Y>::max_rows_per_block(d)).max(1);
    let keys: Vec<Vec<f32>> =
        rows.iter().enumerate().map(|(h, &n)| synth::values(n * d, seed_of(seed, h, 0))).collect();
    let values: Vec<Vec<f32>> =
        rows.iter().enumerate().map(|(h, &n)| synth::values(n * d, seed_of(seed, h, 1))).collect();
    let caches = keys
        .iter()
        .zip(&values)
        .map(|(k, v)| {
            let mut cache = CodedHybridCache::new(hc).expect("a valid coded configuration");
            cache.extend(k, v).expect("finite rows inside every code's range");
            cache
        })
        .collect();
    CodedHybridCase { q: synth::values(cfg.q_len(), seed), cfg, caches, keys, values, seed }
}

/// Coded hybrid caches (`X` × `Y` rows, `D` buffer) drawn like [`hybrid_case`] (any buffer
/// and `k`, made even for 4-bit values).
pub fn coded_hybrid_case<X: IndexCode, Y: ValueCode, D: Value>(
    limits: Limits,
) -> impl Strategy<Value = CodedHybridCase<X, Y, D>> {
    shape(limits, X::MAX_HEAD_DIM)
        .prop_flat_map(|(cfg, rows, seed)| {
            let hc = kv_sparse::strategies::hybrid_config(cfg.head_dim());
            (Just(cfg), hc, Just(rows), Just(seed))
        })
        .prop_map(|(cfg, hc, rows, seed)| coded_from(cfg, hc, &rows, seed))
}

/// [`coded_hybrid_case`] in the lossless setting: `f32` values and buffer, `k = head_dim`.
pub fn lossless_coded_hybrid_case<X: IndexCode>(
    limits: Limits,
) -> impl Strategy<Value = CodedHybridCase<X, Elems<f32>, f32>> {
    shape(limits, X::MAX_HEAD_DIM)
        .prop_flat_map(|(cfg, rows, seed)| {
            let hc = kv_sparse::strategies::hybrid_config(cfg.head_dim());
            (Just(cfg), hc, Just(rows), Just(seed))
        })
        .prop_map(|(cfg, mut hc, rows, seed)| {
            (hc.k_key, hc.k_value) = (hc.head_dim, hc.head_dim);
            coded_from(cfg, hc, &rows, seed)
        })
}

/// A decode step over dense quantized rows ([`crate::EncodedAttention::quantized`]), keys
/// encoded by `K` and values by `V`.
#[derive(Clone, Debug)]
pub struct QuantCase<K, V = K> {
    /// Head layout and scale (`head_dim` a multiple of 32 for the blocked codecs).
    pub cfg: AttnConfig,
    /// The query.
    pub q: Vec<f32>,
    /// Per kv-head: key rows and value rows.
    pub heads: Vec<(QuantRows<K>, QuantRows<V>)>,
    /// The value rows appended, row-major `f32`.
    pub values: Vec<Vec<f32>>,
}

impl<K: DenseCodec, V: DenseCodec> QuantCase<K, V> {
    /// One [`QuantKv`] per kv-head.
    pub fn views(&self) -> Vec<QuantKv<'_, K, V>> {
        self.heads.iter().map(|(k, v)| QuantKv::new(k.view(), v.view())).collect()
    }

    /// Largest `|value|` appended.
    pub fn value_bound(&self) -> f32 {
        self.values.iter().map(|v| dense_bound(v)).fold(0.0, f32::max)
    }
}

/// Dense quantized rows encoded by `C`: a layout drawn like [`attn_config`] with
/// `head_dim` a multiple of 32 up to `limits.head_dim` (at least 32).
///
/// # Examples
/// ```
/// use attn_kernels::accuracy::{Kernel, output_error, tolerance};
/// use attn_kernels::strategies::{Limits, quant_case};
/// use attn_kernels::{CpuAttention, EncodedAttention, Reference};
/// use kv_sparse::quant::Int8Blocks;
/// use proptest::test_runner::TestRunner;
/// TestRunner::default().run(&quant_case::<Int8Blocks>(Limits::default()), |case| {
///     let n = case.cfg.q_len();
///     let (mut want, mut fast) = (vec![0.0; n], vec![0.0; n]);
///     Reference.quantized(&case.cfg, &case.q, &case.views(), &mut want).unwrap();
///     CpuAttention::new(2).unwrap().quantized(&case.cfg, &case.q, &case.views(), &mut fast).unwrap();
///     let tol = tolerance(Kernel::Dense, kv_sparse::ValueFormat::F32).output;
///     proptest::prop_assert!(output_error(&fast, &want, case.value_bound()) <= tol);
///     Ok(())
/// }).unwrap();
/// ```
pub fn quant_case<C: DenseCodec>(limits: Limits) -> impl Strategy<Value = QuantCase<C>> {
    mixed_quant_case::<C, C>(limits)
}

/// As [`quant_case`], keys encoded by `K` and values by `V` (llama.cpp's `-ctk` / `-ctv`
/// pairs, e.g. `Int8Blocks` keys with `Int4Blocks` values).
pub fn mixed_quant_case<K: DenseCodec, V: DenseCodec>(
    limits: Limits,
) -> impl Strategy<Value = QuantCase<K, V>> {
    let blocks = (limits.head_dim / 32).max(1);
    (shape(Limits { head_dim: 1, ..limits }, 1), 1..=blocks).prop_map(|((cfg, rows, seed), b)| {
        let d = 32 * b;
        let cfg = AttnConfig::new(cfg.q_heads(), cfg.kv_heads(), d)
            .and_then(|c| c.with_scale(c.scale()))
            .expect("a valid layout");
        let mut values = Vec::new();
        let heads = rows
            .iter()
            .enumerate()
            .map(|(h, &n)| {
                let (k, v) = (
                    synth::values(n * d, seed_of(seed, h, 0)),
                    synth::values(n * d, seed_of(seed, h, 1)),
                );
                let (mut kr, mut vr) = (
                    QuantRows::new(d).expect("d % 32 == 0"),
                    QuantRows::new(d).expect("d % 32 == 0"),
                );
                kr.push(&k).expect("finite rows");
                vr.push(&v).expect("finite rows");
                values.push(v);
                (kr, vr)
            })
            .collect();
        QuantCase { q: synth::values(cfg.q_len(), seed), cfg, heads, values }
    })
}
