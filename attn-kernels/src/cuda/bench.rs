//! GPU decode benchmark behind `scripts/gpu-check.sh` (SWAN §3 hybrid decode over CSR and
//! coded rows, and the dense quantized baselines, vs the dense f16 baseline): synthetic caches
//! in the kernels' layout, timed with CUDA events, reported as bytes as stored (every byte is
//! read once per step) ÷ time — achieved HBM bandwidth and its fraction of the peak — and as
//! ratios against the dense f16 decode of the same sequence length measured in the same run.

use kv_sparse::ValueFormat;
use kv_sparse::coded::{
    Bitmask, CodedStore, CodedView, Elems, IndexCode, IndexKind, Int4Values, Int8Values, List,
    ValueCode, ValueKind,
};
use kv_sparse::fp8::Fp8E4M3;
use kv_sparse::quant::{DenseFormat, INT4_BLOCK_BYTES, INT8_BLOCK_BYTES};

use super::encoded::{PackedCoded, PackedQuant};
use super::layout::{PackedCsr, PackedDense};
use super::{DecodeDevice, Gpu, LayerCache};
use crate::{AttnConfig, Error, Reference, Result};

/// What to measure.
#[derive(Clone, Debug, PartialEq)]
pub struct BenchConfig {
    /// Sequence lengths (rows per kv-head).
    pub lengths: Vec<usize>,
    /// The attention layer measured (q-heads, kv-heads, head_dim, scale).
    pub attn: AttnConfig,
    /// Stored dims per sparse row.
    pub k: usize,
    /// Dense buffer rows of the hybrid cache.
    pub buffer: usize,
    /// Sparse value formats to measure (hybrid caches use an f16 buffer).
    pub formats: Vec<ValueFormat>,
    /// Dense quantized formats to measure (`quant_decode_<format>`, all `len` rows quantized).
    pub quant: Vec<DenseFormat>,
    /// Coded-row encodings to measure as hybrid histories (f16 buffer of `buffer` rows).
    pub coded: Vec<(IndexKind, ValueKind)>,
    /// Timed launches per measurement.
    pub iters: usize,
    /// Peak bandwidth (bytes/s) the fractions are reported against.
    pub peak_bytes_per_s: f64,
}

impl Default for BenchConfig {
    /// The measured configuration: L ∈ {4k, 32k, 128k}, 32 q / 8 kv heads, d_h 128, k 64,
    /// buffer 128; CSR fp8 and f16; dense int8, int4 and fp8; coded u8-list and bitmask rows
    /// with fp8, int8 and int4 values; H200 HBM peak 4.8 TB/s.
    fn default() -> Self {
        Self {
            lengths: vec![4096, 32_768, 131_072],
            attn: AttnConfig::new(32, 8, 128).expect("32 q / 8 kv heads of 128 is a valid layout"),
            k: 64,
            buffer: 128,
            formats: vec![ValueFormat::Fp8E4M3, ValueFormat::F16],
            quant: vec![DenseFormat::Int8, DenseFormat::Int4, DenseFormat::Fp8],
            coded: [IndexKind::ListU8, IndexKind::Bitmask]
                .into_iter()
                .flat_map(|x| {
                    [ValueKind::Elems(ValueFormat::Fp8E4M3), ValueKind::Int8, ValueKind::Int4]
                        .map(|v| (x, v))
                })
                .collect(),
            iters: 50,
            peak_bytes_per_s: 4.8e12,
        }
    }
}

/// One measured kernel.
#[derive(Clone, Debug, PartialEq)]
pub struct BenchRow {
    /// `dense-f16`, `hybrid-<format>`, `quant-<format>` or `coded-<index>-<values>`.
    pub kernel: String,
    /// Entry point.
    pub entry: String,
    /// Rows per kv-head.
    pub len: usize,
    /// Bytes of the cache as stored (K and V, indices, offsets, scales); one decode step
    /// reads each once.
    pub bytes: usize,
    /// Seconds per decode step.
    pub seconds: f64,
    /// Dense f16 time ÷ this time, same length (1 for the baseline itself).
    pub speedup_vs_dense_f16: f64,
    /// Max |GPU − CPU reference| over the outputs of one step.
    pub max_abs_err: f32,
    /// Why this leg has no measurement (upload, launch or check failed); `None` when measured.
    pub error: Option<String>,
}

impl BenchRow {
    /// Achieved bandwidth in bytes/s.
    pub fn bytes_per_s(&self) -> f64 {
        self.bytes as f64 / self.seconds
    }

    /// A leg that could not be measured, with its reason.
    fn failed(kernel: String, len: usize, bytes: usize, e: &Error) -> Self {
        Self {
            kernel,
            entry: String::new(),
            len,
            bytes,
            seconds: f64::NAN,
            speedup_vs_dense_f16: f64::NAN,
            max_abs_err: f32::NAN,
            error: Some(e.to_string()),
        }
    }

    /// This row as a JSON object (`peak` = bandwidth the fraction refers to; `bytes_stored`
    /// and `bytes_read` are the same count: the kernels read every stored byte once). A leg
    /// that failed is `{kernel, len, bytes_stored, error}`.
    pub fn to_json(&self, peak: f64) -> String {
        if let Some(e) = &self.error {
            return format!(
                "{{\"kernel\":\"{}\",\"len\":{},\"bytes_stored\":{},\"error\":{:?}}}",
                self.kernel, self.len, self.bytes, e
            );
        }
        format!(
            "{{\"kernel\":\"{}\",\"entry\":\"{}\",\"len\":{},\"bytes_stored\":{},\"bytes_read\":{},\"us_per_step\":{:.3},\"gb_per_s\":{:.1},\"fraction_of_peak\":{:.4},\"speedup_vs_dense_f16\":{:.3},\"max_abs_err_vs_cpu\":{:e}}}",
            self.kernel,
            self.entry,
            self.len,
            self.bytes,
            self.bytes,
            self.seconds * 1e6,
            self.bytes_per_s() / 1e9,
            self.bytes_per_s() / peak,
            self.speedup_vs_dense_f16,
            self.max_abs_err
        )
    }
}

/// A small deterministic generator (xorshift64*), so benches need no RNG dependency.
struct Gen(u64);

impl Gen {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }
}

fn encode(format: ValueFormat, x: f32, out: &mut Vec<u8>) {
    match format {
        ValueFormat::F32 => out.extend_from_slice(&x.to_le_bytes()),
        ValueFormat::F16 => out.extend_from_slice(&half::f16::from_f32(x).to_le_bytes()),
        ValueFormat::Bf16 => out.extend_from_slice(&half::bf16::from_f32(x).to_le_bytes()),
        ValueFormat::Fp8E4M3 => out.push(Fp8E4M3::from_f32(x).to_bits()),
    }
}

/// A synthetic sparse store: `rows` rows per head, each with `k` distinct ascending u8
/// indices below `head_dim` and values uniform in (−1, 1), in blocks of 256 rows.
pub fn synthetic_csr(
    kv_heads: usize,
    rows: usize,
    head_dim: usize,
    k: usize,
    format: ValueFormat,
    seed: u64,
) -> PackedCsr {
    let rpb = 256;
    let n_blocks = rows.div_ceil(rpb);
    let mut g = Gen(seed | 1);
    let mut p = PackedCsr {
        format,
        index_bytes: 1,
        head_dim,
        rows,
        rows_per_block: rpb,
        n_blocks,
        indices: Vec::with_capacity(kv_heads * rows * k),
        values: Vec::with_capacity(kv_heads * rows * k * format.bytes()),
        offsets: Vec::with_capacity(kv_heads * rows),
        block_base: Vec::with_capacity(kv_heads * (n_blocks + 1)),
        head_nnz: Vec::with_capacity(kv_heads),
        scale: 1.0,
    };
    let k = k.min(head_dim);
    let mut dims: Vec<u8> = (0..head_dim.min(256)).map(|i| i as u8).collect();
    for h in 0..kv_heads {
        p.head_nnz.push((h * rows * k) as u64);
        for r in 0..rows {
            if r % rpb == 0 {
                p.block_base.push((r * k) as u64);
            }
            p.offsets.push(((r % rpb) * k) as u16);
            for i in 0..k {
                let j = i + (g.next() as usize) % (dims.len() - i);
                dims.swap(i, j);
            }
            let mut row = dims[..k].to_vec();
            row.sort_unstable();
            p.indices.extend_from_slice(&row);
            for _ in 0..k {
                encode(format, g.unit(), &mut p.values);
            }
        }
        p.block_base.push((rows * k) as u64);
    }
    p
}

/// Synthetic dense rows `[kv_heads][rows][head_dim]` uniform in (−1, 1).
pub fn synthetic_dense(
    kv_heads: usize,
    rows: usize,
    head_dim: usize,
    format: ValueFormat,
    seed: u64,
) -> PackedDense {
    let mut g = Gen(seed | 1);
    let mut data = Vec::with_capacity(kv_heads * rows * head_dim * format.bytes());
    for _ in 0..kv_heads * rows * head_dim {
        encode(format, g.unit(), &mut data);
    }
    PackedDense { format, head_dim, kv_heads, rows, data, gather: None }
}

/// Synthetic dense quantized rows `[kv_heads][rows]` of `format`: random codes (fp8 codes
/// never NaN) under f16 scales in [0.004, 0.02), so every row passes kv-sparse's checks.
///
/// # Examples
/// ```
/// use kv_sparse::quant::DenseFormat;
/// let p = attn_kernels::cuda::bench::synthetic_quant(2, 3, 64, DenseFormat::Int4, 1);
/// assert_eq!(p.data.len(), 2 * 3 * 2 * 18);
/// assert!(p.check("example").is_ok());
/// ```
pub fn synthetic_quant(
    kv_heads: usize,
    rows: usize,
    head_dim: usize,
    format: DenseFormat,
    seed: u64,
) -> PackedQuant {
    let mut g = Gen(seed | 1);
    let scale = |g: &mut Gen| half::f16::from_f32(0.012 + 0.008 * g.unit()).to_le_bytes();
    let (chunk, codes) = match format {
        DenseFormat::Int8 => (INT8_BLOCK_BYTES, INT8_BLOCK_BYTES - 2),
        DenseFormat::Int4 => (INT4_BLOCK_BYTES, INT4_BLOCK_BYTES - 2),
        DenseFormat::Fp8 => (2 + head_dim, head_dim),
    };
    let n = kv_heads * rows * format.row_bytes(head_dim) / chunk.max(1);
    let mut data = Vec::with_capacity(n * chunk);
    for _ in 0..n {
        data.extend_from_slice(&scale(&mut g));
        for _ in 0..codes {
            let b = g.next() as u8;
            // 0x7f / 0xff are E4M3FN's NaNs.
            data.push(if format == DenseFormat::Fp8 && b & 0x7f == 0x7f { b ^ 1 } else { b });
        }
    }
    PackedQuant { format, head_dim, kv_heads, rows, data }
}

/// Synthetic coded rows `[kv_heads][rows]`: `k` distinct ascending components per row (as
/// [`synthetic_csr`] draws them), values uniform in (−1, 1), encoded by kv-sparse's own
/// [`CodedStore`] in the given index × value code.
///
/// # Errors
/// [`Error::GpuUnsupported`] for a code pair outside [`super::CODED_INDICES`] ×
/// [`super::CODED_VALUES`]; kv-sparse's errors (e.g. odd `k` with int4 values).
///
/// # Examples
/// ```
/// use kv_sparse::coded::{IndexKind, ValueKind};
/// let p = attn_kernels::cuda::bench::synthetic_coded(2, 5, 64, 16, IndexKind::Bitmask, ValueKind::Int4, 3)?;
/// assert_eq!(p.bytes.len(), 2 * 5 * (8 + 2 + 8)); // mask + scale + 16 nibbles per row
/// assert!(p.check("example").is_ok());
/// # Ok::<(), attn_kernels::Error>(())
/// ```
pub fn synthetic_coded(
    kv_heads: usize,
    rows: usize,
    head_dim: usize,
    k: usize,
    index: IndexKind,
    value: ValueKind,
    seed: u64,
) -> Result<PackedCoded> {
    macro_rules! by_value {
        ($x:ty) => {
            match value {
                ValueKind::Elems(ValueFormat::Fp8E4M3) => {
                    coded_of::<$x, Elems<Fp8E4M3>>(kv_heads, rows, head_dim, k, seed)
                }
                ValueKind::Int8 => coded_of::<$x, Int8Values>(kv_heads, rows, head_dim, k, seed),
                ValueKind::Int4 => coded_of::<$x, Int4Values>(kv_heads, rows, head_dim, k, seed),
                _ => Err(coded_unsupported(index, value)),
            }
        };
    }
    match index {
        IndexKind::ListU8 => by_value!(List<u8>),
        IndexKind::ListU16 => by_value!(List<u16>),
        IndexKind::Bitmask => by_value!(Bitmask),
        _ => Err(coded_unsupported(index, value)),
    }
}

fn coded_unsupported(index: IndexKind, value: ValueKind) -> Error {
    Error::GpuUnsupported {
        op: "bench::synthetic_coded",
        what: format!("coded rows with {index} indices and {value} values"),
    }
}

fn coded_of<X: IndexCode, Y: ValueCode>(
    kv_heads: usize,
    rows: usize,
    head_dim: usize,
    k: usize,
    seed: u64,
) -> Result<PackedCoded> {
    let mut g = Gen(seed | 1);
    let k = k.min(head_dim);
    let mut dims: Vec<usize> = (0..head_dim).collect();
    let mut values = vec![0f32; k];
    let mut stores = Vec::with_capacity(kv_heads);
    for _ in 0..kv_heads {
        let mut s = CodedStore::<X, Y>::new(head_dim)?;
        s.reserve(rows, rows * k);
        for _ in 0..rows {
            for i in 0..k {
                let j = i + (g.next() as usize) % (dims.len() - i);
                dims.swap(i, j);
            }
            let mut row = dims[..k].to_vec();
            row.sort_unstable();
            values.iter_mut().for_each(|v| *v = g.unit());
            s.push_sparse(&row, &values)?;
        }
        stores.push(s);
    }
    let views: Vec<CodedView<'_, X, Y>> = stores.iter().map(CodedStore::view).collect();
    PackedCoded::from_views(&views, 1.0)
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

fn measure(
    gpu: &Gpu,
    cfg: &BenchConfig,
    kernel: String,
    cache: LayerCache<'_>,
    q: &[f32],
    check: bool,
) -> Result<BenchRow> {
    let dev = gpu.upload(&cfg.attn, cache)?;
    let seconds = gpu.time_decode(&cfg.attn, q, &dev, cfg.iters)?;
    let mut max_abs_err = f32::NAN;
    if check {
        let (mut a, mut b) = (vec![0f32; q.len()], vec![0f32; q.len()]);
        gpu.decode_resident(&cfg.attn, q, &dev, &mut a, None)?;
        Reference.decode(&cfg.attn, q, cache, &mut b, None)?;
        max_abs_err = max_abs_diff(&a, &b);
    }
    let len = cache.rows_of(0);
    Ok(BenchRow {
        kernel,
        entry: dev.kernel().to_string(),
        len,
        bytes: dev.bytes_read(),
        seconds,
        speedup_vs_dense_f16: 1.0,
        max_abs_err,
        error: None,
    })
}

/// One measured leg that never aborts the run: a failure (including building its cache)
/// becomes a row carrying the error, so the other legs of the same run are still reported.
fn leg<'c>(
    gpu: &Gpu,
    cfg: &BenchConfig,
    kernel: String,
    cache: std::result::Result<LayerCache<'c>, &Error>,
    (q, check, base_s): (&[f32], bool, f64),
) -> BenchRow {
    let cache = match cache {
        Ok(c) => c,
        Err(e) => return BenchRow::failed(kernel, 0, 0, e),
    };
    match measure(gpu, cfg, kernel.clone(), cache, q, check) {
        Ok(mut row) => {
            row.speedup_vs_dense_f16 = if base_s.is_nan() { 1.0 } else { base_s / row.seconds };
            row
        }
        Err(e) => BenchRow::failed(kernel, cache.rows_of(0), cache.bytes_read(), &e),
    }
}

/// Runs the benchmark: per length, the dense f16 baseline, then one CSR hybrid cache per
/// format (`len − buffer` sparse rows + `buffer` dense f16 rows), one dense quantized cache
/// per quantized format (`len` rows) and one coded hybrid cache per coded encoding (as the CSR
/// ones). Outputs of the shortest length are checked against the f64 [`Reference`]. A leg
/// that fails is reported as a row with its error ([`BenchRow::error`]) and the run goes on.
///
/// # Errors
/// [`crate::Error::CudaNotCompiled`] / [`crate::Error::NoDevice`] without a GPU.
pub fn run(cfg: &BenchConfig) -> Result<Vec<BenchRow>> {
    let gpu = Gpu::new()?;
    let (s, mut rows) = (cfg.attn, Vec::new());
    let mut g = Gen(7);
    let q: Vec<f32> = (0..s.q_len()).map(|_| g.unit()).collect();
    let (kv, d) = (s.kv_heads(), s.head_dim());
    for (i, &len) in cfg.lengths.iter().enumerate() {
        let check = i == 0;
        let dk = synthetic_dense(kv, len, d, ValueFormat::F16, 11);
        let dv = synthetic_dense(kv, len, d, ValueFormat::F16, 12);
        let dense = Ok(LayerCache::Dense { keys: &dk, values: &dv });
        let base = leg(&gpu, cfg, "dense-f16".into(), dense, (&q, check, f64::NAN));
        let run = (&q[..], check, base.seconds);
        rows.push(base);
        drop((dk, dv));
        let sparse_rows = len.saturating_sub(cfg.buffer);
        let bk = synthetic_dense(kv, len - sparse_rows, d, ValueFormat::F16, 13);
        let bv = synthetic_dense(kv, len - sparse_rows, d, ValueFormat::F16, 14);
        for &f in &cfg.formats {
            let k = synthetic_csr(kv, sparse_rows, d, cfg.k, f, 21);
            let v = synthetic_csr(kv, sparse_rows, d, cfg.k, f, 22);
            let cache =
                LayerCache::Hybrid { keys: &k, values: &v, buffer_keys: &bk, buffer_values: &bv };
            rows.push(leg(&gpu, cfg, format!("hybrid-{f}"), Ok(cache), run));
        }
        for &f in &cfg.quant {
            let k = synthetic_quant(kv, len, d, f, 31);
            let v = synthetic_quant(kv, len, d, f, 32);
            let cache = LayerCache::Quant { keys: &k, values: &v };
            rows.push(leg(&gpu, cfg, format!("quant-{f}"), Ok(cache), run));
        }
        for &(x, y) in &cfg.coded {
            let k = synthetic_coded(kv, sparse_rows, d, cfg.k, x, y, 41);
            let v = synthetic_coded(kv, sparse_rows, d, cfg.k, x, y, 42);
            let cache = match (&k, &v) {
                (Ok(k), Ok(v)) => Ok(LayerCache::Coded {
                    keys: k,
                    values: v,
                    buffer_keys: &bk,
                    buffer_values: &bv,
                }),
                (Err(e), _) | (_, Err(e)) => Err(e),
            };
            rows.push(leg(&gpu, cfg, format!("coded-{x}-{y}"), cache, run));
        }
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A failed leg is still one JSON object, without the NaN a measurement would print.
    #[test]
    fn failed_legs_serialise_without_numbers() {
        let e = Error::NoDevice { op: "test", detail: "none".into() };
        let json = BenchRow::failed("coded-bitmask-int4".into(), 4096, 123, &e).to_json(4.8e12);
        assert!(json.starts_with("{\"kernel\":\"coded-bitmask-int4\",\"len\":4096"), "{json}");
        assert!(json.contains("\"error\":") && !json.contains("NaN"), "{json}");
        let ok = BenchRow {
            seconds: 1e-4,
            error: None,
            ..BenchRow::failed("x".into(), 1, 480_000_000, &e)
        };
        let json = ok.to_json(4.8e12);
        assert!(json.contains("\"bytes_stored\":480000000,\"bytes_read\":480000000"), "{json}");
        assert!(json.contains("\"fraction_of_peak\":1.0000"), "{json}");
    }
}
