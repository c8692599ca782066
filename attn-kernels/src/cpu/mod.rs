//! [`CpuAttention`]: the optimized CPU decode kernels (dense, sparse, hybrid, gathered).
//!
//! Per call: validate ([`crate::validate`]), split into work items per (kv-head, lane
//! block, row range), run them on a persistent [`ThreadPool`] over AVX-512, AVX2 (or
//! portable) tile kernels with an online softmax, merge. One pass over a kv-head's rows
//! serves every q-head of its GQA group: dense rows are decoded once per 16 dims for up to
//! four heads held in registers; sparse rows fetch the query values of all group heads per
//! index from a transposed query table (SWAN's sparse-dense products, method section and
//! Appendix A.2). Steady state allocates nothing.

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx2_books;
#[cfg(target_arch = "x86_64")]
mod avx2_codes;
#[cfg(target_arch = "x86_64")]
mod avx2_int;
#[cfg(target_arch = "x86_64")]
mod avx512;
#[cfg(target_arch = "x86_64")]
mod avx512_codes;
#[cfg(target_arch = "x86_64")]
mod avx512_int;
mod codes;
mod engine;
mod isa;
mod portable;
mod qcodes;
mod rowcodes;
mod segment;
mod sources;
mod tile;

pub use isa::{Isa, QueryPrecision};

use kv_sparse::coded::{IndexCode, ValueCode};
use kv_sparse::decoded::DecodeRows;
use kv_sparse::quant::DenseCodec;
use kv_sparse::{SparseIndex, Value};

use crate::api::{
    DecodeAttention, EncodedAttention, GatheredCodedAttention, GatheredSparseAttention,
};
use crate::config::AttnConfig;
use crate::error::{Error, Result};
use crate::pool::ThreadPool;
use crate::validate;
use crate::views::{
    CodedHybridSource, DecodedKv, DenseKv, GatheredCodedKv, GatheredKv, GatheredSparseKv,
    HybridSource, QuantKv, SparseKv,
};
use engine::{Engine, Job, Workspace};
use sources::{
    CodedHybridSrc, DecodedSrc, DenseSrc, GatheredPartSrc, GatheredSrc, HybridSrc, QuantSrc,
    SparseSrc,
};
use tile::Kernels;

/// The optimized CPU implementation of [`DecodeAttention`], with its thread pool and
/// reusable buffers.
///
/// # Examples
/// ```
/// use attn_kernels::{AttnConfig, CpuAttention, DecodeAttention, DenseKv};
/// let cfg = AttnConfig::new(4, 2, 8)?; // two q-heads per kv-head
/// let rows: Vec<f32> = (0..3 * 8).map(|i| (i as f32).sin()).collect(); // 3 tokens
/// let kv = [DenseKv::new(8, &rows, &rows), DenseKv::new(8, &rows, &rows)];
/// let q = vec![0.1f32; 4 * 8];
/// let mut out = vec![0.0f32; 4 * 8];
/// let mut attn = CpuAttention::new(2)?;
/// attn.dense(&cfg, &q, &kv, &mut out)?;
/// assert!(out.iter().all(|x| x.is_finite()));
/// # Ok::<(), attn_kernels::Error>(())
/// ```
#[derive(Debug)]
pub struct CpuAttention {
    engine: Engine,
}

impl CpuAttention {
    /// Rows per work item unless [`CpuAttention::with_split_rows`] says otherwise.
    pub const DEFAULT_SPLIT_ROWS: usize = 4096;

    /// Rows per tile. A history split into a prefix and the rest
    /// ([`crate::PrefixedHybrid`], [`crate::PrefixedCodedHybrid`]) attends bit for bit as
    /// the contiguous history does when the prefix holds whole tiles (and, for CSR rows,
    /// whole blocks: CSR tiles also end where a block does) and the rows per work item are
    /// a multiple of this too (the default is); [`CpuAttention::exact_prefix_rows`].
    pub const TILE_ROWS: usize = tile::TILE;

    /// The longest prefix of a history of `rows` sparse rows stored `rows_per_block` to a
    /// block that these kernels attend, split from the rest, bit for bit as the
    /// contiguous history (a multiple of both [`CpuAttention::TILE_ROWS`] and
    /// `rows_per_block`, 0 when `rows_per_block` is 0).
    ///
    /// # Examples
    /// ```
    /// use attn_kernels::CpuAttention;
    /// assert_eq!(CpuAttention::exact_prefix_rows(1000, 256), 768);
    /// assert_eq!(CpuAttention::exact_prefix_rows(1000, 48), 960); // lcm(32, 48) = 96
    /// ```
    pub fn exact_prefix_rows(rows: usize, rows_per_block: usize) -> usize {
        let (mut a, mut b) = (Self::TILE_ROWS, rows_per_block);
        while b != 0 {
            (a, b) = (b, a % b);
        }
        let step = (Self::TILE_ROWS / a).saturating_mul(rows_per_block);
        rows.checked_div(step).map_or(0, |n| n * step)
    }

    /// Kernels on `threads` threads (the caller plus `threads − 1` workers), using the
    /// fastest instruction set this CPU supports.
    ///
    /// # Errors
    /// [`Error::Threads`] if `threads == 0` or a worker cannot be started.
    pub fn new(threads: usize) -> Result<Self> {
        let kernels = Kernels::new(Isa::detect()).unwrap_or(Kernels::Portable);
        let pool = ThreadPool::new(threads)?;
        let split_rows = Self::DEFAULT_SPLIT_ROWS;
        let (round_queries, rounded) = (false, Vec::new());
        Ok(Self {
            engine: Engine {
                pool,
                ws: Workspace::default(),
                kernels,
                split_rows,
                round_queries,
                rounded,
            },
        })
    }

    /// The same kernels restricted to instruction set `isa`.
    ///
    /// # Errors
    /// [`Error::Param`] if this CPU cannot run `isa`.
    ///
    /// # Examples
    /// ```
    /// let attn = attn_kernels::CpuAttention::new(1)?.with_isa(attn_kernels::Isa::Portable)?;
    /// assert_eq!(attn.isa(), attn_kernels::Isa::Portable);
    /// # Ok::<(), attn_kernels::Error>(())
    /// ```
    pub fn with_isa(mut self, isa: Isa) -> Result<Self> {
        let int8 = self.engine.kernels.int8_queries();
        let kernels = Kernels::new(isa).ok_or_else(|| Error::Param {
            op: "CpuAttention::with_isa",
            what: "isa",
            value: isa.to_string(),
            expected: "an instruction set this CPU supports",
        })?;
        self.engine.kernels = kernels.with_int8_queries(int8).ok_or_else(|| Error::Param {
            op: "CpuAttention::with_isa",
            what: "isa",
            value: isa.to_string(),
            expected: "avx2 or avx512 (the query precision is int8)",
        })?;
        Ok(self)
    }

    /// The same kernels taking the queries at `precision` in the score products
    /// ([`QueryPrecision`]; [`QueryPrecision::F32`], the lossless setting, unless set).
    ///
    /// # Errors
    /// [`Error::Param`] if the kernels cannot run it: [`QueryPrecision::Int8`] needs the
    /// [`Isa::Avx2`] kernels or faster (not [`Isa::Portable`]).
    pub fn with_query_precision(mut self, precision: QueryPrecision) -> Result<Self> {
        self.set_query_precision(precision)?;
        Ok(self)
    }

    /// [`CpuAttention::with_query_precision`] in place (the threads and buffers stay); on
    /// error nothing changes.
    ///
    /// # Errors
    /// As [`CpuAttention::with_query_precision`].
    pub fn set_query_precision(&mut self, precision: QueryPrecision) -> Result<()> {
        let on = precision == QueryPrecision::Int8;
        self.engine.kernels =
            self.engine.kernels.with_int8_queries(on).ok_or_else(|| Error::Param {
                op: "CpuAttention::set_query_precision",
                what: "precision",
                value: precision.to_string(),
                expected: "f32, q8_0, or int8 with the avx2 or avx512 kernels",
            })?;
        self.engine.round_queries = precision == QueryPrecision::Q8Blocks;
        Ok(())
    }

    /// The query precision of the score products.
    pub fn query_precision(&self) -> QueryPrecision {
        if self.engine.round_queries {
            QueryPrecision::Q8Blocks
        } else if self.engine.kernels.int8_queries() {
            QueryPrecision::Int8
        } else {
            QueryPrecision::F32
        }
    }

    /// The same kernels with at most `rows` consecutive rows per work item. Smaller items
    /// balance threads better on few kv-heads; outputs depend on this (summation order),
    /// never on the thread count.
    ///
    /// # Errors
    /// [`Error::Param`] if `rows == 0`.
    pub fn with_split_rows(mut self, rows: usize) -> Result<Self> {
        if rows == 0 {
            let (op, what, value) = ("CpuAttention::with_split_rows", "rows", "0".into());
            return Err(Error::Param { op, what, value, expected: "≥ 1" });
        }
        self.engine.split_rows = rows;
        Ok(self)
    }

    /// Sizes the reusable buffers for calls with layout `cfg` over up to `rows` rows per
    /// kv-head, softmax weights included, so that a cache growing toward `rows` — a decode
    /// loop appending one row per step — allocates nothing on the way. Without it the
    /// buffers grow on demand: a call with more rows than any before may allocate.
    ///
    /// # Examples
    /// ```
    /// use attn_kernels::{AttnConfig, CpuAttention, DecodeAttention, GatheredKv};
    /// let cfg = AttnConfig::new(2, 1, 4)?;
    /// let mut attn = CpuAttention::new(1)?;
    /// attn.reserve(&cfg, 1000); // later calls over ≤ 1000 rows per kv-head reuse buffers
    /// let rows = [0.5f32; 8]; // two rows of 4
    /// let kv = [GatheredKv::new(4, &[0, 1], &rows, &rows)];
    /// let (mut out, mut w) = ([0.0f32; 8], [0.0f32; 2]);
    /// attn.gathered(&cfg, &[1.0; 8], &kv, &mut out, Some(&mut w))?;
    /// assert!((w[0] - 1.0).abs() < 1e-6); // two q-heads, half of each on either row
    /// # Ok::<(), attn_kernels::Error>(())
    /// ```
    pub fn reserve(&mut self, cfg: &AttnConfig, rows: usize) {
        self.engine.reserve(cfg, rows);
    }

    /// Threads the kernels run on.
    pub fn threads(&self) -> usize {
        self.engine.pool.threads()
    }

    /// The instruction set in use.
    pub fn isa(&self) -> Isa {
        self.engine.kernels.isa()
    }

    /// The thread pool (e.g. to measure memory bandwidth on the same threads).
    pub fn pool(&self) -> &ThreadPool {
        &self.engine.pool
    }
}

impl DecodeAttention for CpuAttention {
    fn dense<D: Value>(
        &mut self,
        cfg: &AttnConfig,
        q: &[f32],
        kv: &[DenseKv<'_, D>],
        out: &mut [f32],
    ) -> Result<()> {
        const OP: &str = "CpuAttention::dense";
        validate::call(OP, cfg, q, out, kv.len())?;
        for (h, c) in kv.iter().enumerate() {
            validate::dense(OP, cfg.head_dim(), h, c)?;
        }
        let job = Job { cfg, q, capture: false };
        self.engine.execute(&job, &DenseSrc(kv), out, None);
        Ok(())
    }

    fn sparse<I: SparseIndex, V: Value>(
        &mut self,
        cfg: &AttnConfig,
        q: &[f32],
        kv: &[SparseKv<'_, I, V>],
        out: &mut [f32],
    ) -> Result<()> {
        const OP: &str = "CpuAttention::sparse";
        validate::call(OP, cfg, q, out, kv.len())?;
        for (h, c) in kv.iter().enumerate() {
            validate::sparse(OP, cfg.head_dim(), h, c)?;
        }
        let job = Job { cfg, q, capture: false };
        self.engine.execute(&job, &SparseSrc(kv), out, None);
        Ok(())
    }

    fn hybrid<I: SparseIndex, V: Value, D: Value, H: HybridSource<I, V, D>>(
        &mut self,
        cfg: &AttnConfig,
        q: &[f32],
        kv: &[H],
        out: &mut [f32],
    ) -> Result<()> {
        const OP: &str = "CpuAttention::hybrid";
        validate::call(OP, cfg, q, out, kv.len())?;
        for (h, c) in kv.iter().enumerate() {
            let (view, prefix) = (c.hybrid_view(), c.history_prefix());
            validate::hybrid(OP, cfg.head_dim(), h, &view, prefix.as_ref(), c.sink_rows())?;
        }
        let job = Job { cfg, q, capture: false };
        let src = HybridSrc { heads: kv, types: std::marker::PhantomData };
        self.engine.execute(&job, &src, out, None);
        Ok(())
    }

    fn gathered<D: Value>(
        &mut self,
        cfg: &AttnConfig,
        q: &[f32],
        kv: &[GatheredKv<'_, D>],
        out: &mut [f32],
        weights: Option<&mut [f32]>,
    ) -> Result<()> {
        const OP: &str = "CpuAttention::gathered";
        validate::call(OP, cfg, q, out, kv.len())?;
        let mut total = 0;
        for (h, c) in kv.iter().enumerate() {
            total += validate::gathered(OP, cfg.head_dim(), h, c)?;
        }
        validate::weights(OP, weights.as_deref(), total)?;
        let job = Job { cfg, q, capture: weights.is_some() };
        let src = GatheredSrc(kv);
        self.engine.execute(&job, &src, out, weights);
        Ok(())
    }
}

impl GatheredSparseAttention for CpuAttention {
    fn gathered_sparse<D: Value>(
        &mut self,
        cfg: &AttnConfig,
        q: &[f32],
        dense: &[GatheredKv<'_, D>],
        sparse: &[GatheredSparseKv<'_>],
        out: &mut [f32],
        weights: Option<&mut [f32]>,
    ) -> Result<()> {
        const OP: &str = "CpuAttention::gathered_sparse";
        self.gathered_parts(OP, cfg, q, (dense, sparse), out, weights)
    }
}

impl CpuAttention {
    /// Gathered attention over dense rows and a second part of every kv-head, checked.
    fn gathered_parts<D: Value, P: sources::GatheredPart + validate::GatheredPart>(
        &mut self,
        op: &'static str,
        cfg: &AttnConfig,
        q: &[f32],
        (dense, parts): (&[GatheredKv<'_, D>], &[P]),
        out: &mut [f32],
        weights: Option<&mut [f32]>,
    ) -> Result<()> {
        let total = validate::gathered_parts_call(op, cfg, q, out, dense, parts)?;
        validate::weights(op, weights.as_deref(), total)?;
        let job = Job { cfg, q, capture: weights.is_some() };
        self.engine.execute(&job, &GatheredPartSrc { dense, parts }, out, weights);
        Ok(())
    }
}

impl GatheredCodedAttention for CpuAttention {
    fn gathered_coded<D: Value>(
        &mut self,
        cfg: &AttnConfig,
        q: &[f32],
        dense: &[GatheredKv<'_, D>],
        coded: &[GatheredCodedKv<'_>],
        out: &mut [f32],
        weights: Option<&mut [f32]>,
    ) -> Result<()> {
        const OP: &str = "CpuAttention::gathered_coded";
        self.gathered_parts(OP, cfg, q, (dense, coded), out, weights)
    }
}

impl EncodedAttention for CpuAttention {
    fn decoded<K: DecodeRows, V: DecodeRows>(
        &mut self,
        cfg: &AttnConfig,
        q: &[f32],
        kv: &[DecodedKv<'_, K, V>],
        out: &mut [f32],
    ) -> Result<()> {
        const OP: &str = "CpuAttention::decoded";
        validate::call(OP, cfg, q, out, kv.len())?;
        for (h, c) in kv.iter().enumerate() {
            validate::decoded(OP, cfg.head_dim(), h, c)?;
        }
        let job = Job { cfg, q, capture: false };
        self.engine.execute(&job, &DecodedSrc(kv), out, None);
        Ok(())
    }

    fn quantized<K: DenseCodec, V: DenseCodec>(
        &mut self,
        cfg: &AttnConfig,
        q: &[f32],
        kv: &[QuantKv<'_, K, V>],
        out: &mut [f32],
    ) -> Result<()> {
        const OP: &str = "CpuAttention::quantized";
        validate::call(OP, cfg, q, out, kv.len())?;
        for (h, c) in kv.iter().enumerate() {
            validate::quantized(OP, cfg.head_dim(), h, c)?;
        }
        let job = Job { cfg, q, capture: false };
        self.engine.execute(&job, &QuantSrc(kv), out, None);
        Ok(())
    }

    fn coded_hybrid<X: IndexCode, Y: ValueCode, D: Value, H: CodedHybridSource<X, Y, D>>(
        &mut self,
        cfg: &AttnConfig,
        q: &[f32],
        kv: &[H],
        out: &mut [f32],
    ) -> Result<()> {
        const OP: &str = "CpuAttention::coded_hybrid";
        validate::call(OP, cfg, q, out, kv.len())?;
        for (h, c) in kv.iter().enumerate() {
            validate::coded_hybrid(
                OP,
                cfg.head_dim(),
                h,
                &c.coded_view(),
                c.history_prefix().as_ref(),
                c.sink_rows(),
            )?;
        }
        let job = Job { cfg, q, capture: false };
        let src = CodedHybridSrc { heads: kv, types: std::marker::PhantomData };
        self.engine.execute(&job, &src, out, None);
        Ok(())
    }
}
