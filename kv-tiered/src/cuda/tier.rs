//! [`CudaTier`]: the [`Tier`] contract on a GPU (WnW §2.3 tidal heads; beyond the paper, its
//! "Limitations": recall overlapped with attention through CUDA streams).
//!
//! * Device arenas: one `DeviceBuffer<u8>` pair (keys, values) per `(pool, layer)`, allocated
//!   once at `device_pages_per_layer` pages; page indices come from the crate's one
//!   [`PagePool`] (free list and capacity accounting shared with the host tier).
//! * Host pool: one pinned `LockedBuffer<u8>` pair per pool, allocated once at `host_pages`
//!   pages ("use pinned memory sparingly": one pool, reused, never reallocated).
//! * Recall: `copy_to_device` issues two `cuMemcpyHtoDAsync` on a dedicated copy stream and
//!   records an event; attention kernels run on the GPU's compute stream meanwhile, so the
//!   recall for step s+1 overlaps the attention of step s. A copy that cannot be issued
//!   hands the destination page back ([`MoveError`]).

use cust::event::{Event, EventFlags};
use cust::memory::{
    AsyncCopyDestination, CopyDestination, DeviceBuffer, DeviceSlice, LockedBuffer,
};
use cust::stream::{Stream, StreamFlags};
use parking_lot::RwLock;

use attn_kernels::cuda::Gpu;

use super::CudaArena;
use crate::tier::{
    CopyEvent, DevicePage, HostPage, MoveError, PagePool, PoolSpec, Tier, TierConfig, TierError,
    check_rows,
};

fn backend(op: &'static str) -> impl Fn(cust::error::CudaError) -> TierError {
    move |e| TierError::Backend { op, message: format!("{e:?}") }
}

fn gpu_err(op: &'static str, e: attn_kernels::Error) -> TierError {
    TierError::Backend { op, message: e.to_string() }
}

struct DeviceArena {
    keys: DeviceBuffer<u8>,
    values: DeviceBuffer<u8>,
    pages: PagePool,
}

struct HostPool {
    /// Pinned (keys, values). Written under the write lock (prefill), read by async copies.
    bytes: RwLock<(LockedBuffer<u8>, LockedBuffer<u8>)>,
    pages: PagePool,
}

/// Completion of one recall on the copy stream.
pub struct CudaCopyEvent(Event);

impl std::fmt::Debug for CudaCopyEvent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CudaCopyEvent")
    }
}

impl CopyEvent for CudaCopyEvent {
    fn wait(self) -> Result<(), TierError> {
        self.0.synchronize().map_err(backend("CudaCopyEvent::wait"))
    }
}

/// A [`Tier`] whose device arenas live in GPU memory and whose host pool is pinned memory.
pub struct CudaTier {
    gpu: Gpu,
    layers: usize,
    pools: Vec<PoolSpec>,
    /// Pages of every `(pool, layer)` arena.
    device_pages: usize,
    /// Pages of every host pool.
    host_pages: usize,
    device: Vec<DeviceArena>,
    host: Vec<HostPool>,
    copy_stream: Stream,
}

impl CudaTier {
    /// Allocates every arena and the pinned host pool once.
    ///
    /// # Errors
    /// [`TierError::Bounds`] when `device_pages_per_layer` or `host_pages` is `None` (a GPU
    /// tier is sized up front) or the geometry is empty; [`TierError::Backend`] when there is
    /// no GPU or an allocation fails.
    pub fn new(config: TierConfig) -> Result<Self, TierError> {
        const OP: &str = "CudaTier::new";
        let (Some(dev_pages), Some(host_pages)) =
            (config.device_pages_per_layer, config.host_pages)
        else {
            return Err(TierError::Bounds {
                op: OP,
                what: "page limits (None = unbounded)",
                got: 0,
                limit: 1,
            });
        };
        if config.layers == 0
            || config.pools.is_empty()
            || config.pools.iter().any(|s| s.page_key_bytes() == 0 || s.page_value_bytes() == 0)
        {
            return Err(TierError::Bounds {
                op: OP,
                what: "layers·pools·page bytes",
                got: 0,
                limit: 1,
            });
        }
        let gpu = Gpu::new().map_err(|e| gpu_err(OP, e))?;
        let zeroed = |n: usize| DeviceBuffer::<u8>::zeroed(n.max(1)).map_err(backend(OP));
        let pinned = |n: usize| LockedBuffer::<u8>::new(&0, n.max(1)).map_err(backend(OP));
        let mut device = Vec::with_capacity(config.pools.len() * config.layers);
        for i in 0..config.pools.len() * config.layers {
            let s = config.pools[i / config.layers];
            device.push(DeviceArena {
                keys: zeroed(dev_pages * s.page_key_bytes())?,
                values: zeroed(dev_pages * s.page_value_bytes())?,
                pages: PagePool::new(Some(dev_pages)),
            });
        }
        let host = config
            .pools
            .iter()
            .map(|s| {
                let bytes = (
                    pinned(host_pages * s.page_key_bytes())?,
                    pinned(host_pages * s.page_value_bytes())?,
                );
                Ok(HostPool { bytes: RwLock::new(bytes), pages: PagePool::new(Some(host_pages)) })
            })
            .collect::<Result<Vec<_>, TierError>>()?;
        let copy_stream = Stream::new(StreamFlags::NON_BLOCKING, None).map_err(backend(OP))?;
        Ok(Self {
            gpu,
            layers: config.layers,
            pools: config.pools,
            device_pages: dev_pages,
            host_pages,
            device,
            host,
            copy_stream,
        })
    }

    /// Reads rows of a device page back (verification): waits for the copy stream first, so
    /// the host never reads device memory a recall is still writing.
    ///
    /// # Errors
    /// [`TierError::Bounds`] for rows outside the page; [`TierError::Backend`] on driver errors.
    pub fn read_device(
        &self,
        page: &DevicePage,
        first_row: usize,
        keys: &mut [u8],
        values: &mut [u8],
    ) -> Result<(), TierError> {
        const OP: &str = "CudaTier::read_device";
        let spec = self.spec(OP, page.pool())?;
        let rows = check_rows(OP, &spec, first_row, keys.len(), values.len())?;
        let a = self.arena_of(OP, page.pool(), page.layer())?;
        self.gpu.make_current().map_err(|e| gpu_err(OP, e))?;
        self.copy_stream.synchronize().map_err(backend(OP))?;
        let (k, v) = Self::host_range(&spec, page.index(), first_row, rows);
        a.keys.index(k).copy_to(keys).map_err(backend(OP))?;
        a.values.index(v).copy_to(values).map_err(backend(OP))
    }

    fn arena_of(
        &self,
        op: &'static str,
        pool: usize,
        layer: usize,
    ) -> Result<&DeviceArena, TierError> {
        if pool >= self.pools.len() || layer >= self.layers {
            return Err(TierError::Bounds {
                op,
                what: "pool/layer",
                got: pool * self.layers + layer,
                limit: self.pools.len() * self.layers,
            });
        }
        Ok(&self.device[pool * self.layers + layer])
    }

    fn spec(&self, op: &'static str, pool: usize) -> Result<PoolSpec, TierError> {
        self.pools.get(pool).copied().ok_or(TierError::Bounds {
            op,
            what: "pool",
            got: pool,
            limit: self.pools.len(),
        })
    }

    fn host_range(
        spec: &PoolSpec,
        page: u32,
        first_row: usize,
        rows: usize,
    ) -> (std::ops::Range<usize>, std::ops::Range<usize>) {
        let k0 = page as usize * spec.page_key_bytes() + first_row * spec.key_row_bytes;
        let v0 = page as usize * spec.page_value_bytes() + first_row * spec.value_row_bytes;
        (k0..k0 + rows * spec.key_row_bytes, v0..v0 + rows * spec.value_row_bytes)
    }

    fn check_host_page(&self, op: &'static str, page: HostPage) -> Result<(), TierError> {
        if page.index() as usize >= self.host_pages {
            return Err(TierError::Bounds {
                op,
                what: "host page",
                got: page.index() as usize,
                limit: self.host_pages,
            });
        }
        Ok(())
    }

    /// Issues the two async copies of a recall and records its event.
    fn issue(
        &self,
        spec: &PoolSpec,
        src: HostPage,
        dst: &DevicePage,
        rows: usize,
    ) -> Result<Event, TierError> {
        const OP: &str = "CudaTier::copy_to_device";
        self.gpu.make_current().map_err(|e| gpu_err(OP, e))?;
        let arena = self.arena_of(OP, dst.pool(), dst.layer())?;
        let (hk, hv) = Self::host_range(spec, src.index(), 0, rows);
        let (dk, dv) = Self::host_range(spec, dst.index(), 0, rows);
        let host = self.host[src.pool()].bytes.read();
        let mut dkeys: DeviceSlice<u8> = arena.keys.index(dk);
        let mut dvals: DeviceSlice<u8> = arena.values.index(dv);
        // SAFETY: source ranges lie inside the pinned host pool (page < capacity, rows ≤
        // page_rows, checked by the caller) and stay valid and unmodified until the copy
        // lands: host pages are immutable after prefill and live as long as the tier (Tier
        // contract 1/3), and the pool is never reallocated. Destination ranges lie inside the
        // arena buffer, owned by `self`; no kernel reads a page while a copy into it is in
        // flight (Tier contract 3: rows become readable only after `event.wait()`).
        unsafe {
            dkeys.async_copy_from(&host.0[hk], &self.copy_stream).map_err(backend(OP))?;
            dvals.async_copy_from(&host.1[hv], &self.copy_stream).map_err(backend(OP))?;
        }
        let event = Event::new(EventFlags::DISABLE_TIMING).map_err(backend(OP))?;
        event.record(&self.copy_stream).map_err(backend(OP))?;
        Ok(event)
    }
}

impl Tier for CudaTier {
    type Event = CudaCopyEvent;
    type Arena<'a> = CudaArena;

    fn layers(&self) -> usize {
        self.layers
    }

    fn pools(&self) -> &[PoolSpec] {
        &self.pools
    }

    fn alloc_device(&self, pool: usize, layer: usize) -> Result<DevicePage, TierError> {
        let a = self.arena_of("CudaTier::alloc_device", pool, layer)?;
        let grant = a.pages.alloc().ok_or(TierError::OutOfDeviceMemory {
            pool,
            layer,
            capacity: self.device_pages,
        })?;
        Ok(DevicePage::from_parts(pool, layer, grant.index))
    }

    fn free_device(&self, page: DevicePage) {
        if let Ok(a) = self.arena_of("CudaTier::free_device", page.pool(), page.layer()) {
            a.pages.free(page.index());
        }
    }

    fn write_device(
        &self,
        page: &DevicePage,
        first_row: usize,
        keys: &[u8],
        values: &[u8],
    ) -> Result<(), TierError> {
        const OP: &str = "CudaTier::write_device";
        let spec = self.spec(OP, page.pool())?;
        let rows = check_rows(OP, &spec, first_row, keys.len(), values.len())?;
        let a = self.arena_of(OP, page.pool(), page.layer())?;
        self.gpu.make_current().map_err(|e| gpu_err(OP, e))?;
        let (k, v) = Self::host_range(&spec, page.index(), first_row, rows);
        a.keys.index(k).copy_from(keys).map_err(backend(OP))?;
        a.values.index(v).copy_from(values).map_err(backend(OP))
    }

    fn alloc_host(&self, pool: usize) -> Result<HostPage, TierError> {
        let h = self.host.get(pool).ok_or(TierError::Bounds {
            op: "CudaTier::alloc_host",
            what: "pool",
            got: pool,
            limit: self.host.len(),
        })?;
        let grant = h
            .pages
            .alloc()
            .ok_or(TierError::OutOfHostMemory { pool, capacity: self.host_pages })?;
        Ok(HostPage::from_parts(pool, grant.index))
    }

    fn write_host(
        &self,
        page: HostPage,
        first_row: usize,
        keys: &[u8],
        values: &[u8],
    ) -> Result<(), TierError> {
        const OP: &str = "CudaTier::write_host";
        let spec = self.spec(OP, page.pool())?;
        let rows = check_rows(OP, &spec, first_row, keys.len(), values.len())?;
        self.check_host_page(OP, page)?;
        let (k, v) = Self::host_range(&spec, page.index(), first_row, rows);
        let mut h = self.host[page.pool()].bytes.write();
        h.0[k].copy_from_slice(keys);
        h.1[v].copy_from_slice(values);
        Ok(())
    }

    fn read_host(
        &self,
        page: HostPage,
        first_row: usize,
        keys: &mut [u8],
        values: &mut [u8],
    ) -> Result<(), TierError> {
        const OP: &str = "CudaTier::read_host";
        let spec = self.spec(OP, page.pool())?;
        let rows = check_rows(OP, &spec, first_row, keys.len(), values.len())?;
        self.check_host_page(OP, page)?;
        let (k, v) = Self::host_range(&spec, page.index(), first_row, rows);
        let h = self.host[page.pool()].bytes.read();
        keys.copy_from_slice(&h.0[k]);
        values.copy_from_slice(&h.1[v]);
        Ok(())
    }

    fn copy_to_device(
        &self,
        src: HostPage,
        dst: DevicePage,
        rows: usize,
    ) -> Result<(DevicePage, Self::Event), MoveError> {
        const OP: &str = "CudaTier::copy_to_device";
        let checked = self.spec(OP, dst.pool()).and_then(|spec| {
            if src.pool() != dst.pool() {
                return Err(TierError::Bounds {
                    op: OP,
                    what: "source pool",
                    got: src.pool(),
                    limit: dst.pool(),
                });
            }
            if rows > spec.page_rows {
                return Err(TierError::Bounds {
                    op: OP,
                    what: "rows",
                    got: rows,
                    limit: spec.page_rows,
                });
            }
            self.check_host_page(OP, src)?;
            self.arena_of(OP, dst.pool(), dst.layer())?;
            if dst.index() as usize >= self.device_pages {
                return Err(TierError::Bounds {
                    op: OP,
                    what: "device page",
                    got: dst.index() as usize,
                    limit: self.device_pages,
                });
            }
            Ok(spec)
        });
        match checked.and_then(|spec| self.issue(&spec, src, &dst, rows)) {
            Ok(event) => Ok((dst, CudaCopyEvent(event))),
            Err(error) => Err(MoveError { page: dst, error }),
        }
    }

    fn arena(&self, pool: usize, layer: usize) -> Self::Arena<'_> {
        let a = &self.device[pool * self.layers + layer];
        let rows = self.device_pages * self.pools[pool].page_rows;
        CudaArena {
            keys: a.keys.as_device_ptr().as_raw(),
            values: a.values.as_device_ptr().as_raw(),
            rows,
        }
    }
}
