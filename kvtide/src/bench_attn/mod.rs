//! `kvtide bench-attn`: decode-attention speed of kvtide's CPU kernels against libtorch,
//! against the machine's memory bandwidth and against SWAN's compute break-even
//! (`papers/swan.txt`, Appendix A.2: SWAN is cheaper once `L > b + d_h²/(d_h − k)`), all
//! measured side by side in one process and printed as one JSON object of figures and
//! ratios.
//!
//! For every thread count, head dimension `d` and cache length `L` of the grid, one decode
//! step of a `q_heads` / `kv_heads` layer is timed (best of interleaved rounds) for:
//! * `dense_f16` — our dense kernel over f16 K/V (the baseline of the ratios);
//! * `torch_f32`, `torch_bf16` — libtorch's dense attention on CPU tensors, `matmul →
//!   softmax → matmul`, same shapes;
//! * `hybrid` — our SWAN hybrid kernel: `b` dense f16 rows plus the rest as CSR rows with `k`
//!   kept dims, f16 or fp8 values;
//! * `gathered_f16` — WnW's gathered kernel over all `L` rows resident (f16, with the anchor
//!   weights requested, as a tiered store's decode step does);
//! * `gathered_sparse` — the gathered kernel over a tiered store holding the newest `b` rows
//!   dense (f16) and the rest as SWAN sparse rows in `kv-tiered`'s slab format (`k` `u8`
//!   indices + `k` fp8 codes per row), weights requested;
//! * `dense_int8`, `dense_int4`, `dense_fp8` — dense quantized K/V as stored (`q8_0` and
//!   `q4_0` blocks, fp8 with a per-token scale), the formats engines ship today;
//! * `bitmask` — SWAN's hybrid cache with coded rows: a `d_h`-bit mask of the kept dims and
//!   fp8 or int8 values (one f16 scale per row), `b` dense f16 rows.
//!
//! Each kernel's effective bandwidth is the cache bytes one step reads divided by its time,
//! also given as a fraction of the measured copy and read bandwidth on the same threads.
//! The crossover experiment times a full SWAN step (runtime rotation of q and k by
//! `P_QK`, then the hybrid kernel) against the dense kernel over a ladder of `L` and reports
//! where SWAN becomes faster, next to the formula.

use std::time::Instant;

use attn_kernels::{
    AttnConfig, CpuAttention, DecodeAttention, DecodedKv, DenseKv, EncodedAttention, GatheredKv,
    GatheredSparseAttention, GatheredSparseKv, QuantKv, QueryPrecision, SparseSlab, synth,
};
use half::f16;
use kv_sparse::Value;
use kv_sparse::coded::{Bitmask, CodedStore, Elems, IndexCode, Int8Values, ValueCode};
use kv_sparse::decoded::DecodeRows;
use kv_sparse::fp8::Fp8E4M3;
use kv_sparse::hybrid::HybridCache;
use kv_sparse::hybrid::{CodedHybridCache, Hybrid, HybridConfig, RowStore};
use kv_sparse::kivi::KiviRows;
use kv_sparse::quant::{DenseCodec, Fp8Rows, Int4Blocks, Int8Blocks, QuantRows};
use kv_sparse::turbo::TurboRows;
use serde::Serialize;

use crate::bandwidth;
use serde_json::{Value as Json, json};
use tch::{Kind, Tensor};

use crate::error::{Error, Result, TorchOp, invalid};

/// Value format of the sparse history in the hybrid caches.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SparseValues {
    /// IEEE half precision (`3k + 2` bytes per row).
    F16,
    /// OCP E4M3FN (`2k + 2` bytes per row).
    Fp8,
}

/// What `kvtide bench-attn` measures.
#[derive(Clone, Debug, Serialize)]
pub struct BenchAttnOptions {
    /// Query heads of the layer.
    pub q_heads: usize,
    /// Key/value heads of the layer.
    pub kv_heads: usize,
    /// Head dimensions `d`.
    pub head_dims: Vec<usize>,
    /// Cache lengths `L` (tokens).
    pub lengths: Vec<usize>,
    /// Dense buffer rows `b` of the hybrid caches.
    pub buffer: usize,
    /// Kept dims `k = d · num / den`, as `(num, den)`.
    pub k_fractions: Vec<(usize, usize)>,
    /// Sparse value formats.
    pub formats: Vec<SparseValues>,
    /// Thread counts (ours and libtorch's intra-op threads).
    pub threads: Vec<usize>,
    /// Interleaved timing rounds; each figure is the best round.
    pub rounds: usize,
    /// Smallest time of one timing sample, seconds (short calls are repeated).
    pub min_sample_secs: f64,
    /// Time libtorch in f32.
    pub torch_f32: bool,
    /// Time libtorch in bf16.
    pub torch_bf16: bool,
    /// Buffer size of the bandwidth measurement, MiB.
    pub bandwidth_mib: usize,
    /// Longest `L` of the crossover ladder (0: no crossover experiment).
    pub crossover_max_len: usize,
    /// Seed of the synthetic caches.
    pub seed: u64,
    /// Also time the kernels over int8 and 4-bit keys (dense int8 and int4, bitmask int8)
    /// with int8 queries (`attn_kernels::QueryPrecision::Int8`, lossy) where this CPU runs
    /// them.
    pub int8_queries: bool,
}

impl Default for BenchAttnOptions {
    fn default() -> Self {
        Self::full()
    }
}

impl BenchAttnOptions {
    /// The default grid: 32 q / 8 kv heads, d ∈ {64, 128}, L ∈ {1k, 4k, 16k, 32k}, b = 128,
    /// k ∈ {d/4, d/2, 3d/4}, f16 and fp8, 1 and 2 threads, libtorch f32 and bf16.
    pub fn full() -> Self {
        Self {
            q_heads: 32,
            kv_heads: 8,
            head_dims: vec![64, 128],
            lengths: vec![1024, 4096, 16384, 32768],
            buffer: 128,
            k_fractions: vec![(1, 4), (1, 2), (3, 4)],
            formats: vec![SparseValues::F16, SparseValues::Fp8],
            threads: vec![1, 2],
            rounds: 5,
            min_sample_secs: 0.02,
            torch_f32: true,
            torch_bf16: true,
            bandwidth_mib: 512,
            crossover_max_len: 16384,
            seed: 1,
            int8_queries: true,
        }
    }

    /// A smoke test that runs in seconds: one small shape of everything.
    pub fn quick() -> Self {
        Self {
            q_heads: 8,
            kv_heads: 2,
            head_dims: vec![64],
            lengths: vec![512, 2048],
            k_fractions: vec![(1, 2)],
            formats: vec![SparseValues::Fp8],
            threads: vec![1],
            rounds: 2,
            min_sample_secs: 0.002,
            torch_bf16: false,
            bandwidth_mib: 16,
            crossover_max_len: 1024,
            ..Self::full()
        }
    }

    fn validate(&self) -> Result<()> {
        const OP: &str = "bench-attn";
        let empty = [
            ("head_dims", self.head_dims.is_empty()),
            ("lengths", self.lengths.is_empty()),
            ("k_fractions", self.k_fractions.is_empty()),
            ("formats", self.formats.is_empty()),
            ("threads", self.threads.is_empty()),
        ];
        if let Some((what, _)) = empty.iter().find(|(_, e)| *e) {
            return Err(invalid(OP, format!("{what} must not be empty")));
        }
        if self.rounds == 0
            || self.bandwidth_mib == 0
            || self.min_sample_secs.is_nan()
            || self.min_sample_secs < 0.0
        {
            return Err(invalid(OP, "rounds, bandwidth_mib must be ≥ 1 and min_sample_secs ≥ 0"));
        }
        if let Some(&(n, d)) = self.k_fractions.iter().find(|(n, d)| *d == 0 || n > d) {
            return Err(invalid(OP, format!("k fraction {n}/{d} must lie in [0, 1]")));
        }
        if let Some(&l) = self.lengths.iter().find(|&&l| l == 0) {
            return Err(invalid(OP, format!("cache length {l} must be ≥ 1")));
        }
        AttnConfig::new(self.q_heads, self.kv_heads, self.head_dims[0]).map_err(kernel_err)?;
        Ok(())
    }

    fn ks(&self, d: usize) -> Vec<usize> {
        self.k_fractions.iter().map(|&(n, den)| d * n / den).collect()
    }
}

fn kernel_err(e: attn_kernels::Error) -> Error {
    invalid("bench-attn", e.to_string())
}

/// Runs the whole benchmark and returns one JSON object of figures and ratios.
///
/// # Errors
/// [`Error::InvalidInput`] for an empty or out-of-range option or a kernel error;
/// [`Error::Torch`] if libtorch fails.
pub fn run(opts: &BenchAttnOptions) -> Result<Json> {
    opts.validate()?;
    let _guard = tch::no_grad_guard();
    let mut engines = Vec::new();
    for &t in &opts.threads {
        let attn = CpuAttention::new(t).map_err(kernel_err)?;
        let bw = bandwidth::measure(attn.pool(), opts.bandwidth_mib << 20, 3)?;
        engines.push(Engine { attn, bw });
    }
    let mut points = Vec::new();
    for &d in &opts.head_dims {
        for &len in &opts.lengths {
            let inputs = Inputs::build(opts, d, len)?;
            for e in &mut engines {
                points.push(measure_point(opts, e, &inputs)?);
            }
        }
    }
    let crossover = crossover::run(opts, &mut engines[0].attn)?;
    let targets = targets(opts, &points, &crossover);
    Ok(json!({
        "machine": machine(&engines),
        "options": opts,
        "results": points,
        "crossover": crossover,
        "targets": targets,
    }))
}

/// Our kernels on one thread count, with the bandwidth measured on the same threads.
struct Engine {
    attn: CpuAttention,
    bw: bandwidth::Bandwidth,
}

fn machine(engines: &[Engine]) -> Json {
    let bw: Vec<Json> = engines
        .iter()
        .map(|e| {
            json!({
                "threads": e.bw.threads,
                "copy_gb_per_s": e.bw.copy_bytes_per_s / 1e9,
                "read_gb_per_s": e.bw.read_bytes_per_s / 1e9,
                "buffer_bytes": e.bw.bytes,
            })
        })
        .collect();
    json!({
        "cpus": std::thread::available_parallelism().map_or(0, |n| n.get()),
        "isa": engines.first().map(|e| e.attn.isa().to_string()),
        "libtorch_threads_default": tch::get_num_threads(),
        "bandwidth": bw,
    })
}

/// The hybrid caches of one (k, format) for every kv-head.
enum HybridSet {
    F16(Vec<HybridCache<u8, f16, f16>>),
    Fp8(Vec<HybridCache<u8, Fp8E4M3, f16>>),
}

impl HybridSet {
    fn build(
        opts: &BenchAttnOptions,
        d: usize,
        len: usize,
        k: usize,
        fmt: SparseValues,
    ) -> Result<Self> {
        fn heads<V: Value>(
            o: &BenchAttnOptions,
            d: usize,
            len: usize,
            k: usize,
        ) -> Result<Vec<HybridCache<u8, V, f16>>> {
            (0..o.kv_heads as u64)
                .map(|h| synth::hybrid_cache(d, o.buffer, k, len, o.seed + h).map_err(kernel_err))
                .collect()
        }
        Ok(match fmt {
            SparseValues::F16 => Self::F16(heads(opts, d, len, k)?),
            SparseValues::Fp8 => Self::Fp8(heads(opts, d, len, k)?),
        })
    }

    fn bytes(&self) -> usize {
        match self {
            Self::F16(c) => c.iter().map(|c| c.memory().held_bytes()).sum(),
            Self::Fp8(c) => c.iter().map(|c| c.memory().held_bytes()).sum(),
        }
    }

    fn decode(
        &self,
        attn: &mut CpuAttention,
        cfg: &AttnConfig,
        q: &[f32],
        out: &mut [f32],
    ) -> Result<()> {
        match self {
            Self::F16(c) => attn.hybrid(cfg, q, c, out),
            Self::Fp8(c) => attn.hybrid(cfg, q, c, out),
        }
        .map_err(kernel_err)
    }
}

/// The dense cache quantized per kv-head, one variant per format (the kernels are generic).
enum QuantSet {
    Int8(Vec<(QuantRows<Int8Blocks>, QuantRows<Int8Blocks>)>),
    Int4(Vec<(QuantRows<Int4Blocks>, QuantRows<Int4Blocks>)>),
    Fp8(Vec<(QuantRows<Fp8Rows>, QuantRows<Fp8Rows>)>),
}

type QuantHeads<C> = Vec<(QuantRows<C>, QuantRows<C>)>;

impl QuantSet {
    /// `keys`/`values`: `kv_heads × L × d`, head-major; one pair of row sets per head.
    fn build<C: DenseCodec>(
        keys: &[f32],
        values: &[f32],
        len: usize,
        d: usize,
        wrap: fn(QuantHeads<C>) -> Self,
    ) -> Result<Self> {
        let sparse = |e: kv_sparse::Error| invalid("bench-attn", e.to_string());
        let rows = |x: &[f32]| -> Result<QuantRows<C>> {
            let mut r = QuantRows::<C>::new(d).map_err(sparse)?;
            r.reserve(len);
            r.push(x).map_err(sparse)?;
            Ok(r)
        };
        let head = (len * d).max(1);
        let heads = keys
            .chunks(head)
            .zip(values.chunks(head))
            .map(|(k, v)| Ok((rows(k)?, rows(v)?)))
            .collect::<Result<Vec<_>>>()?;
        Ok(wrap(heads))
    }

    fn bytes(&self) -> usize {
        fn sum<C: DenseCodec>(h: &QuantHeads<C>) -> usize {
            h.iter().map(|(k, v)| k.memory().held_bytes() + v.memory().held_bytes()).sum()
        }
        match self {
            Self::Int8(h) => sum(h),
            Self::Int4(h) => sum(h),
            Self::Fp8(h) => sum(h),
        }
    }

    fn decode(
        &self,
        attn: &mut CpuAttention,
        cfg: &AttnConfig,
        q: &[f32],
        out: &mut [f32],
    ) -> Result<()> {
        fn run<C: DenseCodec>(
            attn: &mut CpuAttention,
            cfg: &AttnConfig,
            q: &[f32],
            h: &QuantHeads<C>,
            out: &mut [f32],
        ) -> Result<()> {
            let kv: Vec<QuantKv<'_, C>> =
                h.iter().map(|(k, v)| QuantKv::new(k.view(), v.view())).collect();
            attn.quantized(cfg, q, &kv, out).map_err(kernel_err)
        }
        match self {
            Self::Int8(h) => run(attn, cfg, q, h, out),
            Self::Int4(h) => run(attn, cfg, q, h, out),
            Self::Fp8(h) => run(attn, cfg, q, h, out),
        }
    }
}

/// KIVI-2 (groups of 32 tokens / channels) and TurboQuant-style 3-bit histories behind the
/// same `b`-row f16 buffer, per kv-head, read in place (`EncodedAttention::decoded`).
enum CodedSet {
    Kivi2(Vec<Hybrid<KiviRows<2>, f16>>),
    Turbo3(Vec<Hybrid<TurboRows<3>, f16>>),
}

impl CodedSet {
    /// The history of every kv-head (`keys`/`values`: `kv_heads × L × d`, head-major).
    fn build<S: RowStore>(
        opts: &BenchAttnOptions,
        (keys, values): (&[f32], &[f32]),
        (len, d, group): (usize, usize, usize),
        wrap: fn(Vec<Hybrid<S, f16>>) -> Self,
    ) -> Result<Self> {
        let sparse = |e: kv_sparse::Error| invalid("bench-attn", e.to_string());
        let config = HybridConfig {
            rows_per_block: group,
            ..HybridConfig::lossless(d, opts.buffer.min(len))
        };
        let head = (len * d).max(1);
        let heads = keys
            .chunks(head)
            .zip(values.chunks(head))
            .map(|(k, v)| {
                let mut cache = Hybrid::<S, f16>::new(config).map_err(sparse)?;
                cache.extend(k, v).map_err(sparse)?;
                Ok(cache)
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(wrap(heads))
    }

    fn name(&self) -> &'static str {
        match self {
            Self::Kivi2(_) => "kivi2",
            Self::Turbo3(_) => "turbo3",
        }
    }

    /// Bytes held: codes, parameters, waiting rows and the buffer.
    fn bytes(&self) -> usize {
        fn held<S: RowStore>(h: &[Hybrid<S, f16>]) -> usize {
            h.iter().map(|c| c.memory().held_bytes()).sum()
        }
        match self {
            Self::Kivi2(h) => held(h),
            Self::Turbo3(h) => held(h),
        }
    }

    fn decode(
        &self,
        attn: &mut CpuAttention,
        cfg: &AttnConfig,
        q: &[f32],
        out: &mut [f32],
    ) -> Result<()> {
        /// Every head's history (keys, values by `history`) behind its buffer.
        fn run<'h, S: RowStore, K: DecodeRows, V: DecodeRows>(
            (attn, cfg, q, out): (&mut CpuAttention, &AttnConfig, &[f32], &mut [f32]),
            heads: &'h [Hybrid<S, f16>],
            history: impl Fn(&'h Hybrid<S, f16>) -> (K, V),
        ) -> Result<()> {
            let kv: Vec<_> = heads
                .iter()
                .map(|c| {
                    let (k, v) = history(c);
                    DecodedKv::new(k, v).with_buffer(c.buffer_keys(), c.buffer_values())
                })
                .collect();
            attn.decoded(cfg, q, &kv, out).map_err(kernel_err)
        }
        match self {
            Self::Kivi2(h) => run((attn, cfg, q, out), h, |c| c.history()),
            Self::Turbo3(h) => run((attn, cfg, q, out), h, |c| c.history()),
        }
    }
}

/// SWAN hybrid caches with bitmask rows per kv-head, fp8 or int8 values.
enum BitmaskSet {
    Fp8(Vec<CodedHybridCache<Bitmask, Elems<Fp8E4M3>, f16>>),
    Int8(Vec<CodedHybridCache<Bitmask, Int8Values, f16>>),
}

impl BitmaskSet {
    fn build<Y: ValueCode>(
        o: &BenchAttnOptions,
        d: usize,
        len: usize,
        k: usize,
        wrap: fn(Vec<CodedHybridCache<Bitmask, Y, f16>>) -> Self,
    ) -> Result<Self> {
        let sparse = |e: kv_sparse::Error| invalid("bench-attn", e.to_string());
        let heads = (0..o.kv_heads as u64)
            .map(|h| {
                let cfg = HybridConfig::new(d, o.buffer, k).for_store::<CodedStore<Bitmask, Y>>();
                let mut c = CodedHybridCache::<Bitmask, Y, f16>::new(cfg).map_err(sparse)?;
                let seed = o.seed + h;
                c.extend(
                    &synth::values(len * d, seed),
                    &synth::values(len * d, seed ^ 0x9e37_79b9_7f4a_7c15),
                )
                .map_err(sparse)?;
                Ok(c)
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(wrap(heads))
    }

    fn bytes(&self) -> usize {
        match self {
            Self::Fp8(c) => c.iter().map(|c| c.memory().held_bytes()).sum(),
            Self::Int8(c) => c.iter().map(|c| c.memory().held_bytes()).sum(),
        }
    }

    fn decode(
        &self,
        attn: &mut CpuAttention,
        cfg: &AttnConfig,
        q: &[f32],
        out: &mut [f32],
    ) -> Result<()> {
        fn run<X: IndexCode, Y: ValueCode>(
            attn: &mut CpuAttention,
            cfg: &AttnConfig,
            q: &[f32],
            c: &[CodedHybridCache<X, Y, f16>],
            out: &mut [f32],
        ) -> Result<()> {
            attn.coded_hybrid(cfg, q, c, out).map_err(kernel_err)
        }
        match self {
            Self::Fp8(c) => run(attn, cfg, q, c, out),
            Self::Int8(c) => run(attn, cfg, q, c, out),
        }
    }
}

/// libtorch copies of the dense cache: q `[kv, g, d]`, K and V `[kv, L, d]`.
struct TorchKv {
    q: Tensor,
    k: Tensor,
    v: Tensor,
}

impl TorchKv {
    fn new(q: &[f32], k: &[f32], v: &[f32], shape: [i64; 3], g: i64, kind: Kind) -> Result<Self> {
        let to = |x: &[f32], s: [i64; 3]| -> Result<Tensor> {
            Tensor::from_slice(x).f_view(s).op("view")?.f_to_kind(kind).op("to_kind")
        };
        Ok(Self { q: to(q, [shape[0], g, shape[2]])?, k: to(k, shape)?, v: to(v, shape)? })
    }

    /// `softmax(scale · q Kᵀ) V`, `[kv, g, d]`.
    fn attend(&self, scale: f64) -> Result<Tensor> {
        let kt = self.k.f_transpose(1, 2).op("transpose")?;
        let s = self.q.f_matmul(&kt).op("matmul")?.f_mul_scalar(scale).op("mul")?;
        let p = s.f_softmax(-1, s.kind()).op("softmax")?;
        p.f_matmul(&self.v).op("matmul")
    }

    fn bytes(&self) -> usize {
        2 * self.k.numel() * self.k.kind().elt_size_in_bytes()
    }
}

/// Keys and values of one kv-head, f16 row-major.
type DenseHead = (Vec<f16>, Vec<f16>);

/// A tiered store's view of every kv-head for one `k`: the newest `b` rows of the dense
/// cache stay dense, the older ones are fp8 sparse slab rows (keys, values).
struct GatheredSparseSet {
    k: usize,
    slabs: Vec<(Vec<u8>, Vec<u8>)>,
}

impl GatheredSparseSet {
    fn build(opts: &BenchAttnOptions, d: usize, len: usize, k: usize) -> Result<Self> {
        let rows = len.saturating_sub(opts.buffer);
        let slab = |seed| synth::sparse_slab(rows, d, k, 1.0, seed).map_err(kernel_err);
        let slabs = (0..opts.kv_heads as u64)
            .map(|h| Ok((slab(opts.seed + 2 * h)?, slab(opts.seed + 2 * h + 1)?)))
            .collect::<Result<_>>()?;
        Ok(Self { k, slabs })
    }

    /// Slab bytes plus the dense rows and every position read (4 bytes each).
    fn bytes(&self, x: &Inputs) -> usize {
        let slabs: usize = self.slabs.iter().map(|(k, v)| k.len() + v.len()).sum();
        let d = x.cfg.head_dim();
        let dense_rows = x.len - x.sparse_rows();
        slabs + self.slabs.len() * (dense_rows * d * 2 * 2 + x.len * 4)
    }

    fn decode(
        &self,
        attn: &mut CpuAttention,
        x: &Inputs,
        out: &mut [f32],
        w: &mut [f32],
    ) -> Result<()> {
        let (d, split) = (x.cfg.head_dim(), x.sparse_rows());
        let (sparse_pos, dense_pos) = x.positions.split_at(split);
        let dense: Vec<GatheredKv<'_, f16>> = x
            .dense
            .iter()
            .map(|(k, v)| GatheredKv::new(d, dense_pos, &k[split * d..], &v[split * d..]))
            .collect();
        let sparse: Vec<GatheredSparseKv<'_>> = self
            .slabs
            .iter()
            .map(|(k, v)| {
                let (k, v) = (SparseSlab::new(k, self.k, 1.0), SparseSlab::new(v, self.k, 1.0));
                GatheredSparseKv::new(d, sparse_pos, k, v)
            })
            .collect();
        attn.gathered_sparse(&x.cfg, &x.q, &dense, &sparse, out, Some(w)).map_err(kernel_err)
    }
}

/// Everything one grid point (d, L) times.
struct Inputs {
    cfg: AttnConfig,
    len: usize,
    q: Vec<f32>,
    dense: Vec<DenseHead>,
    torch: Vec<(&'static str, TorchKv)>,
    hybrids: Vec<(usize, SparseValues, HybridSet)>,
    /// `0..len`: every row's position.
    positions: Vec<u32>,
    /// Dense rows `b` of the hybrid and tiered caches.
    buffer: usize,
    gathered_sparse: Vec<GatheredSparseSet>,
    quant: Vec<(&'static str, QuantSet)>,
    bitmask: Vec<(usize, &'static str, BitmaskSet)>,
    /// KIVI-2 and TurboQuant-style 3-bit histories (timed last).
    coded: Vec<CodedSet>,
}

impl Inputs {
    fn build(opts: &BenchAttnOptions, d: usize, len: usize) -> Result<Self> {
        let cfg = AttnConfig::new(opts.q_heads, opts.kv_heads, d).map_err(kernel_err)?;
        let q = synth::values(cfg.q_len(), opts.seed ^ 0x51);
        let kv = opts.kv_heads as u64;
        let dense: Vec<DenseHead> = (0..kv)
            .map(|h| (synth::dense_rows(len, d, 2 * h), synth::dense_rows(len, d, 2 * h + 1)))
            .collect();
        let flat = |f: fn(&DenseHead) -> &Vec<f16>| -> Vec<f32> {
            dense.iter().flat_map(|p| f(p).iter().map(|x| x.to_f32())).collect()
        };
        let (kf, vf) = (flat(|p| &p.0), flat(|p| &p.1));
        let shape = [kv as i64, len as i64, d as i64];
        let g = cfg.group_size() as i64;
        let mut torch = Vec::new();
        for (name, on, kind) in [
            ("torch_f32", opts.torch_f32, Kind::Float),
            ("torch_bf16", opts.torch_bf16, Kind::BFloat16),
        ] {
            if on {
                torch.push((name, TorchKv::new(&q, &kf, &vf, shape, g, kind)?));
            }
        }
        let mut hybrids = Vec::new();
        let mut gathered_sparse = Vec::new();
        for k in opts.ks(d) {
            for &fmt in &opts.formats {
                hybrids.push((k, fmt, HybridSet::build(opts, d, len, k, fmt)?));
            }
            gathered_sparse.push(GatheredSparseSet::build(opts, d, len, k)?);
        }
        let quant = vec![
            ("dense_int8", QuantSet::build::<Int8Blocks>(&kf, &vf, len, d, QuantSet::Int8)?),
            ("dense_int4", QuantSet::build::<Int4Blocks>(&kf, &vf, len, d, QuantSet::Int4)?),
            ("dense_fp8", QuantSet::build::<Fp8Rows>(&kf, &vf, len, d, QuantSet::Fp8)?),
        ];
        let mut bitmask = Vec::new();
        for k in opts.ks(d) {
            let fp8 = BitmaskSet::build::<Elems<Fp8E4M3>>(opts, d, len, k, BitmaskSet::Fp8)?;
            bitmask.push((k, "fp8", fp8));
            let int8 = BitmaskSet::build::<Int8Values>(opts, d, len, k, BitmaskSet::Int8)?;
            bitmask.push((k, "int8", int8));
        }
        let coded = vec![
            CodedSet::build::<KiviRows<2>>(opts, (&kf, &vf), (len, d, 32), CodedSet::Kivi2)?,
            CodedSet::build::<TurboRows<3>>(opts, (&kf, &vf), (len, d, 1), CodedSet::Turbo3)?,
        ];
        let positions = (0..len as u32).collect();
        let buffer = opts.buffer;
        Ok(Self {
            cfg,
            len,
            q,
            dense,
            torch,
            hybrids,
            positions,
            buffer,
            gathered_sparse,
            quant,
            bitmask,
            coded,
        })
    }

    /// The dense sets whose keys int8 queries score by integer products (`q8_0`, `q4_0`),
    /// named.
    fn int8_quant(&self) -> Vec<(&'static str, &QuantSet)> {
        let int = |n: &str| matches!(n, "dense_int8" | "dense_int4");
        self.quant.iter().filter(|(n, _)| int(n)).map(|(n, q)| (*n, q)).collect()
    }

    /// The bitmask sets with int8 values, with their `k`.
    fn int8_bitmask(&self) -> Vec<(usize, &BitmaskSet)> {
        self.bitmask.iter().filter(|(_, v, _)| *v == "int8").map(|(k, _, b)| (*k, b)).collect()
    }

    /// Rows a tiered store keeps sparse (all but the newest `b`).
    fn sparse_rows(&self) -> usize {
        self.len.saturating_sub(self.buffer)
    }

    fn dense_bytes(&self) -> usize {
        self.dense.iter().map(|(k, v)| 2 * (k.len() + v.len())).sum()
    }
}

/// Best per-call seconds of `f` over `rounds`, each round repeating `f` for at least
/// `min_secs` (one call when `min_secs` is 0).
fn time_best(min_secs: f64, mut f: impl FnMut() -> Result<()>) -> Result<f64> {
    let start = Instant::now();
    let mut calls = 0u32;
    loop {
        f()?;
        calls += 1;
        let el = start.elapsed().as_secs_f64();
        if el >= min_secs {
            return Ok(el / f64::from(calls));
        }
    }
}

/// Times every kernel of a grid point on one engine, in interleaved rounds.
fn measure_point(opts: &BenchAttnOptions, e: &mut Engine, x: &Inputs) -> Result<Json> {
    tch::set_num_threads(e.bw.threads as i32);
    let d = x.cfg.head_dim();
    let kv: Vec<DenseKv<'_, f16>> = x.dense.iter().map(|(k, v)| DenseKv::new(d, k, v)).collect();
    let gathered: Vec<GatheredKv<'_, f16>> =
        x.dense.iter().map(|(k, v)| GatheredKv::new(d, &x.positions, k, v)).collect();
    let mut out = vec![0.0f32; x.cfg.q_len()];
    let mut weights = vec![0.0f32; x.len * x.cfg.kv_heads()];
    let int8q = int8_queries(opts);
    let (q8, b8) = (x.int8_quant(), x.int8_bitmask());
    let n = 2
        + x.torch.len()
        + x.hybrids.len()
        + x.gathered_sparse.len()
        + x.quant.len()
        + x.bitmask.len()
        + if int8q { q8.len() + b8.len() } else { 0 }
        + x.coded.len();
    let mut best = vec![f64::INFINITY; n];
    let scale = f64::from(x.cfg.scale());
    for _ in 0..opts.rounds {
        let mut i = 0;
        let mut record = |t: f64| {
            best[i] = best[i].min(t);
            i += 1;
        };
        record(time_best(opts.min_sample_secs, || {
            e.attn.dense(&x.cfg, &x.q, &kv, &mut out).map_err(kernel_err)
        })?);
        for (_, t) in &x.torch {
            record(time_best(opts.min_sample_secs, || t.attend(scale).map(drop))?);
        }
        for (_, _, h) in &x.hybrids {
            record(time_best(opts.min_sample_secs, || {
                h.decode(&mut e.attn, &x.cfg, &x.q, &mut out)
            })?);
        }
        record(time_best(opts.min_sample_secs, || {
            let w = Some(&mut weights[..]);
            e.attn.gathered(&x.cfg, &x.q, &gathered, &mut out, w).map_err(kernel_err)
        })?);
        for g in &x.gathered_sparse {
            record(time_best(opts.min_sample_secs, || {
                g.decode(&mut e.attn, x, &mut out, &mut weights)
            })?);
        }
        for (_, qs) in &x.quant {
            record(time_best(opts.min_sample_secs, || {
                qs.decode(&mut e.attn, &x.cfg, &x.q, &mut out)
            })?);
        }
        for (_, _, b) in &x.bitmask {
            record(time_best(opts.min_sample_secs, || {
                b.decode(&mut e.attn, &x.cfg, &x.q, &mut out)
            })?);
        }
        if int8q {
            e.attn.set_query_precision(QueryPrecision::Int8).map_err(kernel_err)?;
            for (_, qs) in &q8 {
                record(time_best(opts.min_sample_secs, || {
                    qs.decode(&mut e.attn, &x.cfg, &x.q, &mut out)
                })?);
            }
            for (_, b) in &b8 {
                record(time_best(opts.min_sample_secs, || {
                    b.decode(&mut e.attn, &x.cfg, &x.q, &mut out)
                })?);
            }
            e.attn.set_query_precision(QueryPrecision::F32).map_err(kernel_err)?;
        }
        for c in &x.coded {
            record(time_best(opts.min_sample_secs, || {
                c.decode(&mut e.attn, &x.cfg, &x.q, &mut out)
            })?);
        }
    }
    let torch_check = torch_agreement(e, x, &kv, scale)?;
    Ok(point_json(e, x, &best, torch_check, int8q))
}

/// Largest |ours − libtorch f32| over the outputs (a check that both compute the same).
fn torch_agreement(
    e: &mut Engine,
    x: &Inputs,
    kv: &[DenseKv<'_, f16>],
    scale: f64,
) -> Result<Option<f64>> {
    let Some((_, t)) = x.torch.iter().find(|(n, _)| *n == "torch_f32") else { return Ok(None) };
    let mut ours = vec![0.0f32; x.cfg.q_len()];
    e.attn.dense(&x.cfg, &x.q, kv, &mut ours).map_err(kernel_err)?;
    let theirs =
        Vec::<f32>::try_from(t.attend(scale)?.f_flatten(0, -1).op("flatten")?).op("to vec")?;
    Ok(Some(ours.iter().zip(&theirs).map(|(a, b)| f64::from((a - b).abs())).fold(0.0, f64::max)))
}

/// Time, bytes, bandwidth and its fractions of one kernel.
fn figures(e: &Engine, secs: f64, bytes: usize) -> Json {
    let rate = bytes as f64 / secs;
    json!({
        "ms": secs * 1e3,
        "bytes": bytes,
        "gb_per_s": rate / 1e9,
        "frac_copy_bw": rate / e.bw.copy_bytes_per_s,
        "frac_read_bw": rate / e.bw.read_bytes_per_s,
    })
}

fn point_json(e: &Engine, x: &Inputs, best: &[f64], torch_check: Option<f64>, int8q: bool) -> Json {
    let dense = best[0];
    let mut p = json!({
        "threads": e.bw.threads,
        "head_dim": x.cfg.head_dim(),
        "len": x.len,
        "isa": e.attn.isa().to_string(),
        "dense_f16": figures(e, dense, x.dense_bytes()),
        "dense_f16_vs_torch_f32_max_abs_diff": torch_check,
    });
    // The coded histories are timed last.
    let coded_at = best.len() - x.coded.len();
    for (c, &secs) in x.coded.iter().zip(&best[coded_at..]) {
        let mut f = figures(e, secs, c.bytes());
        f["speedup_vs_dense_f16"] = json!(dense / secs);
        p[c.name()] = f;
    }
    let mut torch_secs = serde_json::Map::new();
    for (i, (name, t)) in x.torch.iter().enumerate() {
        let secs = best[1 + i];
        let mut f = figures(e, secs, t.bytes());
        f["dense_f16_speedup"] = json!(secs / dense);
        p[*name] = f;
        torch_secs.insert((*name).to_string(), json!(secs));
    }
    let off = 1 + x.torch.len();
    let hybrids: Vec<Json> = x
        .hybrids
        .iter()
        .enumerate()
        .map(|(i, (k, fmt, h))| {
            let secs = best[off + i];
            let mut f = figures(e, secs, h.bytes());
            f["values"] = json!(fmt);
            f["k"] = json!(k);
            f["speedup_vs_dense_f16"] = json!(dense / secs);
            for (name, t) in &torch_secs {
                f[format!("speedup_vs_{name}")] = json!(t.as_f64().unwrap_or(f64::NAN) / secs);
            }
            f
        })
        .collect();
    p["hybrid"] = json!(hybrids);
    let off = off + x.hybrids.len();
    let mut g = figures(e, best[off], x.dense_bytes() + x.cfg.kv_heads() * x.len * 4);
    g["speedup_vs_dense_f16"] = json!(dense / best[off]);
    p["gathered_f16"] = g;
    let sparse: Vec<Json> = x
        .gathered_sparse
        .iter()
        .enumerate()
        .map(|(i, gs)| {
            let secs = best[off + 1 + i];
            let mut f = figures(e, secs, gs.bytes(x));
            f["values"] = json!("fp8");
            f["k"] = json!(gs.k);
            f["speedup_vs_dense_f16"] = json!(dense / secs);
            for (name, t) in &torch_secs {
                f[format!("speedup_vs_{name}")] = json!(t.as_f64().unwrap_or(f64::NAN) / secs);
            }
            f
        })
        .collect();
    p["gathered_sparse"] = json!(sparse);
    let mut off = off + 1 + x.gathered_sparse.len();
    let mut int8_secs = f64::NAN;
    for (name, qs) in &x.quant {
        let secs = best[off];
        let mut f = figures(e, secs, qs.bytes());
        f["speedup_vs_dense_f16"] = json!(dense / secs);
        if *name == "dense_int8" {
            int8_secs = secs;
        }
        p[*name] = f;
        off += 1;
    }
    let bitmask: Vec<Json> = x
        .bitmask
        .iter()
        .enumerate()
        .map(|(i, (k, values, b))| {
            let secs = best[off + i];
            let mut f = figures(e, secs, b.bytes());
            f["values"] = json!(values);
            f["k"] = json!(k);
            f["speedup_vs_dense_f16"] = json!(dense / secs);
            f["speedup_vs_dense_int8"] = json!(int8_secs / secs);
            f
        })
        .collect();
    p["bitmask"] = json!(bitmask);
    if !int8q {
        return p;
    }
    // The int8-keyed kernels again, with int8 queries.
    let mut off = off + x.bitmask.len();
    let mut q8_secs = f64::NAN;
    for (name, qs) in x.int8_quant() {
        let secs = best[off];
        let mut f = figures(e, secs, qs.bytes());
        f["speedup_vs_dense_f16"] = json!(dense / secs);
        let f32_ms = p[name]["ms"].as_f64().unwrap_or(f64::NAN);
        f["speedup_vs_f32_queries"] = json!(f32_ms / (secs * 1e3));
        if name == "dense_int8" {
            q8_secs = secs;
            f["speedup_vs_dense_int8"] = json!(int8_secs / secs);
        }
        p[format!("{name}_int8_queries")] = f;
        off += 1;
    }
    let bitmask: Vec<Json> = x
        .int8_bitmask()
        .into_iter()
        .enumerate()
        .map(|(i, (k, b))| {
            let secs = best[off + i];
            let mut f = figures(e, secs, b.bytes());
            f["values"] = json!("int8");
            f["k"] = json!(k);
            f["speedup_vs_dense_f16"] = json!(dense / secs);
            f["speedup_vs_dense_int8"] = json!(int8_secs / secs);
            f["speedup_vs_dense_int8_int8_queries"] = json!(q8_secs / secs);
            f
        })
        .collect();
    p["bitmask_int8_queries"] = json!(bitmask);
    p
}

mod crossover;
mod targets;

use targets::*;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crossing_interpolates_the_last_sign_change() {
        use crossover::crossing;
        assert_eq!(crossing(&[(100, 1.0, 0.5), (200, 2.0, 1.0)]), Some(100.0));
        assert_eq!(crossing(&[(100, 1.0, 2.0), (200, 2.0, 3.0)]), None);
        let x = crossing(&[(100, 1.0, 2.0), (400, 2.0, 1.0)]).unwrap();
        assert!((x - 200.0).abs() < 1e-9, "{x}");
    }

    #[test]
    fn bad_options_are_errors() {
        let mut o = BenchAttnOptions::quick();
        o.lengths.clear();
        assert!(matches!(run(&o), Err(Error::InvalidInput { .. })));
        let mut o = BenchAttnOptions::quick();
        o.k_fractions = vec![(3, 2)];
        assert!(matches!(run(&o), Err(Error::InvalidInput { .. })));
        let mut o = BenchAttnOptions::quick();
        o.kv_heads = 3;
        assert!(matches!(run(&o), Err(Error::InvalidInput { .. })));
    }

    /// The full grid, printed: `cargo test -p models --release --lib
    /// bench_attn::tests::full_grid -- --ignored --nocapture` (what `kvtide bench-attn`
    /// prints; `KVTIDE_BENCH_QUICK=1` for the quick grid).
    #[test]
    #[ignore = "takes minutes; prints the bench-attn JSON"]
    fn full_grid() {
        let quick = std::env::var_os("KVTIDE_BENCH_QUICK").is_some();
        let opts = if quick { BenchAttnOptions::quick() } else { BenchAttnOptions::full() };
        let r = run(&opts).unwrap();
        println!("{}", serde_json::to_string_pretty(&r).unwrap());
    }

    #[test]
    fn quick_run_reports_every_figure() {
        let mut o = BenchAttnOptions::quick();
        o.lengths = vec![300];
        o.crossover_max_len = 200;
        o.min_sample_secs = 0.0;
        o.rounds = 1;
        let r = run(&o).unwrap();
        assert!(r["machine"]["bandwidth"][0]["copy_gb_per_s"].as_f64().unwrap() > 0.0);
        let p = &r["results"][0];
        assert_eq!(p["len"], json!(300));
        assert!(p["dense_f16"]["ms"].as_f64().unwrap() > 0.0);
        assert!(p["torch_f32"]["dense_f16_speedup"].as_f64().unwrap() > 0.0);
        assert!(p["dense_f16_vs_torch_f32_max_abs_diff"].as_f64().unwrap() < 1e-3);
        assert_eq!(p["hybrid"][0]["k"], json!(32));
        assert!(p["hybrid"][0]["speedup_vs_torch_f32"].as_f64().unwrap() > 0.0);
        assert!(p["gathered_f16"]["ms"].as_f64().unwrap() > 0.0);
        assert_eq!(p["gathered_sparse"][0]["k"], json!(32));
        assert!(p["gathered_sparse"][0]["gb_per_s"].as_f64().unwrap() > 0.0);
        assert_eq!(r["crossover"][0]["formula_len"], json!(128.0 + 64.0 * 64.0 / 32.0));
        assert!(r["targets"]["hybrid_fp8_half_k_longest"][0]["met"].is_boolean());
        // The encoded formats, bytes counted as stored: q8_0 is 34 B per 32 elements.
        let (kv, d) = (2, 64);
        assert_eq!(p["dense_int8"]["bytes"], json!(2 * kv * 300 * d / 32 * 34));
        assert_eq!(p["dense_int4"]["bytes"], json!(2 * kv * 300 * d / 32 * 18));
        assert!(p["dense_fp8"]["ms"].as_f64().unwrap() > 0.0);
        let bitmask = p["bitmask"].as_array().unwrap();
        assert_eq!(bitmask.len(), 2);
        assert!(
            bitmask
                .iter()
                .all(|b| b["k"] == json!(32) && b["speedup_vs_dense_int8"].as_f64().unwrap() > 0.0)
        );
        for name in [
            "read_bandwidth_at_16k_or_more",
            "bitmask_fp8_half_k_vs_dense_f16",
            "bitmask_int8_half_k_vs_dense_f16",
            "bitmask_half_k_vs_dense_int8",
            "dense_int8_vs_dense_f16",
            "crossover_within_2x",
        ] {
            let t = &r["targets"][name];
            assert!(t.get("met").is_some(), "{name}: {t}");
        }
        let t = &r["targets"]["dense_int8_vs_dense_f16"];
        assert_eq!(t["target"], json!(1.6));
        assert!(t["measured"].as_f64().unwrap() > 0.0 && t["met"].is_boolean());
        // The int8-keyed kernels timed again with int8 queries, where this CPU runs them.
        let q8 = &r["targets"]["int8_queries"];
        if attn_kernels::QueryPrecision::Int8.is_available() {
            assert!(p["dense_int8_int8_queries"]["speedup_vs_dense_int8"].as_f64().unwrap() > 0.0);
            let b = p["bitmask_int8_queries"].as_array().unwrap();
            assert!(b.len() == 1 && b[0]["k"] == json!(32) && b[0]["values"] == json!("int8"));
            assert_eq!(b[0]["bytes"], bitmask[1]["bytes"]);
            assert!(b[0]["speedup_vs_dense_int8_int8_queries"].as_f64().unwrap() > 0.0);
            assert!(q8["dense_int8_vs_dense_f16"]["met"].is_boolean(), "{q8}");
            assert!(q8["dense_int4_vs_dense_f16"]["met"].is_boolean(), "{q8}");
            let int4 = &p["dense_int4_int8_queries"];
            assert_eq!(int4["bytes"], p["dense_int4"]["bytes"]);
            assert!(int4["speedup_vs_f32_queries"].as_f64().unwrap() > 0.0, "{int4}");
        } else {
            assert_eq!(q8["timed"], json!(false));
            assert!(p["dense_int8_int8_queries"].is_null());
        }
        o.int8_queries = false;
        let r = run(&o).unwrap();
        assert!(r["results"][0]["bitmask_int8_queries"].is_null());
    }
}
