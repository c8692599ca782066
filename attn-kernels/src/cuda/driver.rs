//! The cust-backed GPU backend: one process-wide context, a compute stream, PTX modules
//! loaded once per family, device-resident caches and the one checked launch path
//! (SWAN §3 / WnW §2.3 kernels; see the `cuda` module primer).

use std::ffi::c_void;
use std::sync::{Arc, OnceLock};

use cust::CudaFlags;
use cust::context::{Context, CurrentContext};
use cust::device::{Device, DeviceAttribute};
use cust::error::{CudaError, CudaResult};
use cust::event::{Event, EventFlags};
use cust::function::{BlockSize, GridSize};
use cust::memory::{CopyDestination, DeviceBuffer, DeviceCopy};
use cust::module::Module;
use cust::stream::{Stream, StreamFlags};

use super::DecodeDevice;
use super::cache::LayerCache;
use super::encoded::{CodedHeadsArgs, PackedCoded, PackedQuant};
use super::kernels::{COMBINE_KERNEL, Family, WEIGHTS_KERNEL, kernel_for};
use super::layout::{
    CsrHeadsArgs, DecodeArgs, DenseHeadsArgs, PackedCsr, PackedDense, Plan, WARPS, check_gpu,
    group_passes,
};
use crate::{AttnConfig, Error, Result};

// SAFETY: plain `#[repr(C)]` blocks of integers and floats (device addresses are carried as
// u64, never dereferenced on the host); any bit pattern is a valid value.
unsafe impl DeviceCopy for CsrHeadsArgs {}
// SAFETY: as above.
unsafe impl DeviceCopy for DenseHeadsArgs {}
// SAFETY: as above.
unsafe impl DeviceCopy for DecodeArgs {}
// SAFETY: as above.
unsafe impl DeviceCopy for CodedHeadsArgs {}

fn cuda(op: &'static str) -> impl Fn(CudaError) -> Error {
    move |e| Error::Cuda { op, detail: format!("{e:?}") }
}

struct Inner {
    ctx: Context,
    stream: Stream,
    sm90: bool,
    sm_count: usize,
    name: String,
    modules: [OnceLock<Module>; Family::ALL.len()],
}

/// Handle to the process-wide CUDA context (device 0). Cheap to clone.
#[derive(Clone)]
pub struct Gpu {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Gpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gpu")
            .field("name", &self.inner.name)
            .field("sm_count", &self.inner.sm_count)
            .finish()
    }
}

static GPU: OnceLock<std::result::Result<Gpu, (bool, String)>> = OnceLock::new();

impl Gpu {
    /// The process-wide GPU (initialised on first call, then shared), made current on the
    /// calling thread.
    ///
    /// # Errors
    /// [`Error::NoDevice`] when the driver finds no device (the message is cust's `{:?}`);
    /// [`Error::GpuUnsupported`] below compute capability 8.0; [`Error::Cuda`] otherwise.
    pub fn new() -> Result<Self> {
        const OP: &str = "Gpu::new";
        let r = GPU
            .get_or_init(|| Self::init().map_err(|e| (e == CudaError::NoDevice, format!("{e:?}"))));
        match r {
            Ok(g) => {
                g.make_current()?;
                Ok(g.clone())
            }
            Err((true, detail)) => Err(Error::NoDevice { op: OP, detail: detail.clone() }),
            Err((false, detail)) if detail.starts_with("compute capability") => {
                Err(Error::GpuUnsupported { op: OP, what: detail.clone() })
            }
            Err((false, detail)) => Err(Error::Cuda { op: OP, detail: detail.clone() }),
        }
    }

    fn init() -> CudaResult<Self> {
        cust::init(CudaFlags::empty())?;
        let dev = Device::get_device(0)?;
        let ctx = Context::new(dev)?;
        let major = dev.get_attribute(DeviceAttribute::ComputeCapabilityMajor)?;
        if major < 8 {
            return Err(CudaError::InvalidDevice);
        }
        let sm_count = dev.get_attribute(DeviceAttribute::MultiprocessorCount)? as usize;
        let stream = Stream::new(StreamFlags::NON_BLOCKING, None)?;
        let name = dev.name()?;
        let modules = Default::default();
        Ok(Self {
            inner: Arc::new(Inner { ctx, stream, sm90: major >= 9, sm_count, name, modules }),
        })
    }

    /// Makes this GPU's context current on the calling thread (needed once per thread
    /// before any other cust call, e.g. by the CUDA tier's recall worker).
    ///
    /// # Errors
    /// [`Error::Cuda`] if the driver refuses.
    pub fn make_current(&self) -> Result<()> {
        CurrentContext::set_current(&self.inner.ctx).map_err(cuda("Gpu::make_current"))
    }

    /// Device name as the driver reports it.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// Streaming multiprocessors (the plan targets 4 blocks per SM).
    pub fn sm_count(&self) -> usize {
        self.inner.sm_count
    }

    fn module(&self, family: Family) -> Result<&Module> {
        let slot = &self.inner.modules[family.slot()];
        if slot.get().is_none() {
            let m =
                Module::from_ptx(family.ptx(self.inner.sm90), &[]).map_err(cuda("Gpu::module"))?;
            let _ = slot.set(m);
        }
        slot.get().ok_or(Error::Cuda {
            op: "Gpu::module",
            detail: "module cache empty after load".into(),
        })
    }

    /// Uploads a checked cache once; decode it any number of times with [`Gpu::decode_resident`].
    ///
    /// # Errors
    /// [`LayerCache::check`] failures, unsupported format pairs, driver errors.
    pub fn upload(&self, cfg: &AttnConfig, cache: LayerCache<'_>) -> Result<DeviceCache> {
        const OP: &str = "Gpu::upload";
        let n = cfg.q_len();
        cache.check(OP, cfg, &vec![0.0; n], n, None)?;
        self.make_current()?;
        let (family, kernel) = kernel_for(&cache)?;
        let sparse = cache
            .sparse()
            .map(|(k, v)| Ok::<_, Error>((CsrDev::new(k)?, CsrDev::new(v)?)))
            .transpose()?;
        let coded = cache
            .coded()
            .map(|(k, v)| Ok::<_, Error>((CodedDev::new(k)?, CodedDev::new(v)?)))
            .transpose()?;
        let quant = cache
            .quant()
            .map(|(k, v)| Ok::<_, Error>((DenseDev::quant(k)?, DenseDev::quant(v)?)))
            .transpose()?;
        let dense = cache
            .dense()
            .map(|(k, v)| Ok::<_, Error>((DenseDev::new(k)?, DenseDev::new(v)?)))
            .transpose()?
            .or(quant);
        let rows: Vec<usize> = (0..cfg.kv_heads()).map(|h| cache.rows_of(h)).collect();
        Ok(DeviceCache {
            cfg: *cfg,
            family,
            kernel,
            max_rows: rows.iter().copied().max().unwrap_or(0),
            total_rows: rows.iter().sum(),
            bytes_read: cache.bytes_read(),
            sparse,
            coded,
            dense,
        })
    }

    /// Decodes a resident cache: copies `q` in, runs the decode, combine (and anchor-weights)
    /// kernels on the compute stream, synchronises, copies `out` (and `weights`) back.
    ///
    /// # Errors
    /// Shape or length mismatches with the uploaded cache; driver errors.
    pub fn decode_resident(
        &self,
        cfg: &AttnConfig,
        q: &[f32],
        cache: &DeviceCache,
        out: &mut [f32],
        weights: Option<&mut [f32]>,
    ) -> Result<()> {
        const OP: &str = "Gpu::decode_resident";
        cache.check_call(OP, cfg, q, out.len(), weights.as_deref().map(<[f32]>::len))?;
        self.make_current()?;
        let run = Prepared::new(self, cache, q, weights.is_some())?;
        run.enqueue(self)?;
        self.inner.stream.synchronize().map_err(cuda(OP))?;
        // The stream is idle: the device buffers below are complete.
        run.scratch.out.copy_to(out).map_err(cuda(OP))?;
        if let (Some(w), Some(dw)) = (weights, run.scratch.weights.as_ref()) {
            dw.copy_to(w).map_err(cuda(OP))?;
        }
        Ok(())
    }

    /// Mean seconds per decode of a resident cache over `iters` back-to-back launches
    /// (CUDA events on the compute stream, after one warm-up).
    ///
    /// # Errors
    /// As [`Gpu::decode_resident`].
    pub fn time_decode(
        &self,
        cfg: &AttnConfig,
        q: &[f32],
        cache: &DeviceCache,
        iters: usize,
    ) -> Result<f64> {
        const OP: &str = "Gpu::time_decode";
        cache.check_call(OP, cfg, q, q.len(), None)?;
        self.make_current()?;
        let run = Prepared::new(self, cache, q, false)?;
        let s = &self.inner.stream;
        run.enqueue(self)?;
        let (start, stop) = (
            Event::new(EventFlags::DEFAULT).map_err(cuda(OP))?,
            Event::new(EventFlags::DEFAULT).map_err(cuda(OP))?,
        );
        start.record(s).map_err(cuda(OP))?;
        for _ in 0..iters.max(1) {
            run.enqueue(self)?;
        }
        stop.record(s).map_err(cuda(OP))?;
        stop.synchronize().map_err(cuda(OP))?;
        let ms = stop.elapsed_time_f32(&start).map_err(cuda(OP))?;
        Ok(f64::from(ms) * 1e-3 / iters.max(1) as f64)
    }

    /// The one launch path. Checks the launch geometry, resolves the kernel in its cached
    /// module and enqueues it on the compute stream.
    fn launch(
        &self,
        family: Family,
        name: &str,
        grid: (u32, u32),
        block: u32,
        shared: u32,
        args: Launch,
    ) -> Result<()> {
        const OP: &str = "Gpu::launch";
        if grid.0 == 0
            || grid.1 == 0
            || grid.1 > 65_535
            || block == 0
            || block > 1024
            || shared > 48 * 1024
        {
            return Err(Error::Param {
                op: OP,
                what: "launch geometry",
                value: format!("{grid:?} x {block}, {shared} B"),
                expected: "grid y <= 65535, block <= 1024, shared <= 48 KiB",
            });
        }
        let f = self.module(family)?.get_function(name).map_err(cuda(OP))?;
        let s = &self.inner.stream;
        let (g, b): (GridSize, BlockSize) = (grid.into(), block.into());
        let ptrs: Vec<*mut c_void> = match &args {
            Launch::Dense(k, v, a) => vec![arg(k), arg(v), arg(a)],
            Launch::Sparse(k, v, a) => vec![arg(k), arg(v), arg(a)],
            Launch::Hybrid(k, v, bk, bv, a) => vec![arg(k), arg(v), arg(bk), arg(bv), arg(a)],
            Launch::Coded(k, v, bk, bv, a) => vec![arg(k), arg(v), arg(bk), arg(bv), arg(a)],
            Launch::Combine(p, n, d) => {
                vec![arg(&p[0]), arg(&p[1]), arg(&p[2]), arg(&p[3]), arg(n), arg(d)]
            }
            Launch::Weights(p, group, max_rows) => {
                vec![arg(&p[0]), arg(&p[1]), arg(&p[2]), arg(&p[3]), arg(group), arg(max_rows)]
            }
        };
        // SAFETY: `ptrs` point at the fields of `args`, alive until this call returns (cuLaunchKernel
        // copies parameter values at enqueue). Each variant matches its kernel's C signature
        // field for field (the `#[repr(C)]` blocks are size-checked against common.cuh). Every
        // device address inside them comes from a `DeviceCache` built from a cache that passed
        // `LayerCache::check` (row ranges, indices < head_dim, list slots < capacity, coded and
        // quantized rows re-read through kv-sparse's validating views) or from
        // `Scratch` buffers sized by the same `Plan` the kernels index with, and all of them
        // stay alive until the stream is synchronised by the caller (`Prepared` outlives it).
        unsafe { s.launch(&f, g, b, shared, &ptrs) }.map_err(cuda(OP))
    }
}

impl DecodeDevice for Gpu {
    fn describe(&self) -> String {
        format!(
            "{} ({} SMs, PTX {})",
            self.inner.name,
            self.inner.sm_count,
            if self.inner.sm90 { "compute_90" } else { "compute_80" }
        )
    }

    fn decode(
        &self,
        cfg: &AttnConfig,
        q: &[f32],
        cache: LayerCache<'_>,
        out: &mut [f32],
        weights: Option<&mut [f32]>,
    ) -> Result<()> {
        cache.check("Gpu::decode", cfg, q, out.len(), weights.as_deref().map(<[f32]>::len))?;
        let dev = self.upload(cfg, cache)?;
        self.decode_resident(cfg, q, &dev, out, weights)
    }
}

/// Kernel arguments by signature (see `cuda/*.cu`).
enum Launch {
    Dense(DenseHeadsArgs, DenseHeadsArgs, DecodeArgs),
    Sparse(CsrHeadsArgs, CsrHeadsArgs, DecodeArgs),
    Hybrid(CsrHeadsArgs, CsrHeadsArgs, DenseHeadsArgs, DenseHeadsArgs, DecodeArgs),
    Coded(CodedHeadsArgs, CodedHeadsArgs, DenseHeadsArgs, DenseHeadsArgs, DecodeArgs),
    /// part_acc, part_ml, out, lse; n_parts; d
    Combine([u64; 4], u32, u32),
    /// scores, lse, pos_off, weights; group; max_rows
    Weights([u64; 4], u32, u32),
}

/// A kernel parameter's address, as cuLaunchKernel takes it; `DeviceCopy` is required like
/// cust's `launch!` requires it.
fn arg<T: DeviceCopy>(x: &T) -> *mut c_void {
    x as *const T as *mut c_void
}

fn upload<T: DeviceCopy>(op: &'static str, data: &[T]) -> Result<DeviceBuffer<T>> {
    DeviceBuffer::from_slice(data).map_err(cuda(op))
}

fn ptr<T: DeviceCopy>(b: &DeviceBuffer<T>) -> u64 {
    b.as_device_ptr().as_raw()
}

/// indices, values, offsets, block bases, head nnz.
type CsrBuffers =
    (DeviceBuffer<u8>, DeviceBuffer<u8>, DeviceBuffer<u16>, DeviceBuffer<u64>, DeviceBuffer<u64>);
/// rows, optional (position list, offsets).
type DenseBuffers = (DeviceBuffer<u8>, Option<(DeviceBuffer<u32>, DeviceBuffer<u32>)>);

struct CsrDev {
    _buffers: CsrBuffers,
    args: CsrHeadsArgs,
}

impl CsrDev {
    fn new(p: &PackedCsr) -> Result<Self> {
        const OP: &str = "Gpu::upload(csr)";
        let b = (
            upload(OP, &p.indices)?,
            upload(OP, &p.values)?,
            upload(OP, &p.offsets)?,
            upload(OP, &p.block_base)?,
            upload(OP, &p.head_nnz)?,
        );
        let u = |x: usize| {
            u32::try_from(x).map_err(|_| Error::GpuUnsupported {
                op: OP,
                what: format!("{x} rows/blocks (> u32)"),
            })
        };
        let args = CsrHeadsArgs {
            indices: ptr(&b.0),
            values: ptr(&b.1),
            offsets: ptr(&b.2),
            block_base: ptr(&b.3),
            head_nnz: ptr(&b.4),
            rows: u(p.rows)?,
            rows_per_block: u(p.rows_per_block)?,
            n_blocks: u(p.n_blocks)?,
            value_scale: p.scale,
        };
        Ok(Self { _buffers: b, args })
    }
}

/// bytes, offsets, block bases, head bases.
type CodedBuffers = (DeviceBuffer<u8>, DeviceBuffer<u16>, DeviceBuffer<u64>, DeviceBuffer<u64>);

struct CodedDev {
    _buffers: CodedBuffers,
    args: CodedHeadsArgs,
}

impl CodedDev {
    fn new(p: &PackedCoded) -> Result<Self> {
        const OP: &str = "Gpu::upload(coded)";
        let b = (
            upload(OP, &p.bytes)?,
            upload(OP, &p.offsets)?,
            upload(OP, &p.block_base)?,
            upload(OP, &p.head_base)?,
        );
        let args = CodedHeadsArgs {
            bytes: ptr(&b.0),
            offsets: ptr(&b.1),
            block_base: ptr(&b.2),
            head_base: ptr(&b.3),
            rows: to_u32(OP, p.rows)?,
            rows_per_block: to_u32(OP, p.rows_per_block)?,
            n_blocks: to_u32(OP, p.n_blocks)?,
            value_scale: p.scale,
        };
        Ok(Self { _buffers: b, args })
    }
}

fn to_u32(op: &'static str, x: usize) -> Result<u32> {
    u32::try_from(x)
        .map_err(|_| Error::GpuUnsupported { op, what: format!("{x} rows/blocks (> u32)") })
}

struct DenseDev {
    _buffers: DenseBuffers,
    args: DenseHeadsArgs,
}

impl DenseDev {
    fn new(p: &PackedDense) -> Result<Self> {
        const OP: &str = "Gpu::upload(dense)";
        let data = upload(OP, &p.data)?;
        let lists = p
            .gather
            .as_ref()
            .map(|(pos, off)| Ok::<_, Error>((upload(OP, pos)?, upload(OP, off)?)))
            .transpose()?;
        let rows = u32::try_from(p.rows).map_err(|_| Error::GpuUnsupported {
            op: OP,
            what: format!("{} rows (> u32)", p.rows),
        })?;
        let args = DenseHeadsArgs {
            rows: ptr(&data),
            pos: lists.as_ref().map_or(0, |l| ptr(&l.0)),
            pos_off: lists.as_ref().map_or(0, |l| ptr(&l.1)),
            n_rows: rows,
            capacity: rows,
        };
        Ok(Self { _buffers: (data, lists), args })
    }

    /// Dense quantized rows: the same parameter block, rows of the codec's byte size.
    fn quant(p: &PackedQuant) -> Result<Self> {
        const OP: &str = "Gpu::upload(quant)";
        let data = upload(OP, &p.data)?;
        let rows = to_u32(OP, p.rows)?;
        let args =
            DenseHeadsArgs { rows: ptr(&data), pos: 0, pos_off: 0, n_rows: rows, capacity: rows };
        Ok(Self { _buffers: (data, None), args })
    }
}

/// A layer cache resident in device memory (see [`Gpu::upload`]).
pub struct DeviceCache {
    cfg: AttnConfig,
    family: Family,
    kernel: String,
    max_rows: usize,
    total_rows: usize,
    bytes_read: usize,
    sparse: Option<(CsrDev, CsrDev)>,
    coded: Option<(CodedDev, CodedDev)>,
    dense: Option<(DenseDev, DenseDev)>,
}

impl std::fmt::Debug for DeviceCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceCache")
            .field("kernel", &self.kernel)
            .field("rows", &self.total_rows)
            .field("bytes_read", &self.bytes_read)
            .finish()
    }
}

impl DeviceCache {
    /// Bytes one decode step reads from device memory (K, V, indices, offsets, lists).
    pub fn bytes_read(&self) -> usize {
        self.bytes_read
    }

    /// The decode kernel's entry point.
    pub fn kernel(&self) -> &str {
        &self.kernel
    }

    fn check_call(
        &self,
        op: &'static str,
        cfg: &AttnConfig,
        q: &[f32],
        out: usize,
        weights: Option<usize>,
    ) -> Result<()> {
        if *cfg != self.cfg {
            return Err(Error::Param {
                op,
                what: "shape",
                value: format!("{cfg:?}"),
                expected: "the shape the cache was uploaded with",
            });
        }
        check_gpu(op, cfg, q, out)?;
        match weights {
            Some(n) if self.family != Family::Gathered => Err(Error::Param {
                op,
                what: "weights",
                value: n.to_string(),
                expected: "None (only gathered decode returns weights)",
            }),
            Some(n) if n != self.total_rows => Err(Error::LengthMismatch {
                op,
                what: "anchor weights",
                expected: self.total_rows,
                got: n,
            }),
            _ => Ok(()),
        }
    }
}

/// Scratch buffers of one decode (partials, output, optional scores and weights).
struct Scratch {
    q: DeviceBuffer<f32>,
    part_acc: DeviceBuffer<f32>,
    part_ml: DeviceBuffer<f32>,
    out: DeviceBuffer<f32>,
    lse: DeviceBuffer<f32>,
    scores: Option<DeviceBuffer<f32>>,
    weights: Option<DeviceBuffer<f32>>,
}

/// A decode ready to enqueue: scratch sized by its plan.
struct Prepared<'c> {
    cache: &'c DeviceCache,
    plan: Plan,
    scratch: Scratch,
}

impl<'c> Prepared<'c> {
    fn new(gpu: &Gpu, cache: &'c DeviceCache, q: &[f32], weights: bool) -> Result<Self> {
        const OP: &str = "Gpu::prepare";
        let s = cache.cfg;
        let plan = Plan::new(cache.max_rows, s.kv_heads(), 4 * gpu.sm_count());
        let zeros = |n: usize| DeviceBuffer::<f32>::zeroed(n.max(1)).map_err(cuda(OP));
        let scratch = Scratch {
            q: upload(OP, q)?,
            part_acc: zeros(s.q_heads() * plan.n_parts * s.head_dim())?,
            part_ml: zeros(s.q_heads() * plan.n_parts * 2)?,
            out: zeros(s.q_heads() * s.head_dim())?,
            lse: zeros(s.q_heads())?,
            scores: if weights { Some(zeros(s.q_heads() * cache.max_rows)?) } else { None },
            weights: if weights { Some(zeros(cache.total_rows)?) } else { None },
        };
        Ok(Self { cache, plan, scratch })
    }

    fn enqueue(&self, gpu: &Gpu) -> Result<()> {
        let (c, s, p) = (self.cache, self.cache.cfg, self.plan);
        let u = |x: usize| x as u32;
        for (g0, gc) in group_passes(s.group_size()) {
            let a = DecodeArgs {
                q: ptr(&self.scratch.q),
                part_acc: ptr(&self.scratch.part_acc),
                part_ml: ptr(&self.scratch.part_ml),
                scores: self.scratch.scores.as_ref().map_or(0, ptr),
                d: u(s.head_dim()),
                group: u(s.group_size()),
                g0: u(g0),
                gc: u(gc),
                rows_per_split: u(p.rows_per_split),
                n_parts: u(p.n_parts),
                scale: s.scale(),
                max_rows: u(c.max_rows),
            };
            let args = match (&c.sparse, &c.coded, &c.dense) {
                (Some((k, v)), None, Some((bk, bv))) => {
                    Launch::Hybrid(k.args, v.args, bk.args, bv.args, a)
                }
                (None, Some((k, v)), Some((bk, bv))) => {
                    Launch::Coded(k.args, v.args, bk.args, bv.args, a)
                }
                (Some((k, v)), None, None) => Launch::Sparse(k.args, v.args, a),
                (None, None, Some((k, v))) => Launch::Dense(k.args, v.args, a),
                _ => return Err(Error::EmptyCache { op: "Gpu::enqueue", kv_head: 0 }),
            };
            let shared = Plan::shared_bytes(gc, s.head_dim());
            gpu.launch(
                c.family,
                &c.kernel,
                (u(p.n_splits), u(s.kv_heads())),
                u(WARPS * 32),
                u(shared),
                args,
            )?;
        }
        let sc = &self.scratch;
        let combine = Launch::Combine(
            [ptr(&sc.part_acc), ptr(&sc.part_ml), ptr(&sc.out), ptr(&sc.lse)],
            u(p.n_parts),
            u(s.head_dim()),
        );
        gpu.launch(
            Family::Combine,
            COMBINE_KERNEL,
            (u(s.q_heads()), 1),
            256,
            u(4 * p.n_parts),
            combine,
        )?;
        if let (Some(scores), Some(w), Some((k, _))) = (&sc.scores, &sc.weights, &c.dense) {
            let args = Launch::Weights(
                [ptr(scores), ptr(&sc.lse), k.args.pos_off, ptr(w)],
                u(s.group_size()),
                u(c.max_rows),
            );
            gpu.launch(
                Family::Gathered,
                WEIGHTS_KERNEL,
                (u(c.max_rows.div_ceil(256)), u(s.kv_heads())),
                256,
                0,
                args,
            )?;
        }
        Ok(())
    }
}
