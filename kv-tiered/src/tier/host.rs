//! The host-memory tier: "device" arenas and the host pool are ordinary heap memory. It is the
//! default tier for tests and CPU runs (DESIGN.md "Tiers and devices") and the reference
//! implementation of the [`Tier`] contract. Copies are synchronous memcpys performed on the
//! calling thread (the store's recall worker), so events are always ready.
//!
//! Each arena is a `parking_lot::RwLock` over word-aligned byte storage (so dense f32 rows can
//! be viewed as `&[f32]` without copying); readers (kernels) and writers (prefill, recall)
//! never alias. Page indices come from a [`PagePool`] (shared with the CUDA tier): freed pages
//! are reused before the arena grows.

use parking_lot::{RwLock, RwLockReadGuard};

use super::{
    ArenaRead, DevicePage, HostPage, MoveError, PagePool, PoolSpec, ReadyEvent, Tier, TierConfig,
    TierError, check_rows,
};

#[derive(Default)]
struct Region {
    keys: Vec<u64>,
    values: Vec<u64>,
    pages: usize,
}

impl Region {
    fn grow(&mut self, spec: &PoolSpec, pages: usize) {
        if pages > self.pages {
            self.keys.resize((pages * spec.page_key_bytes()).div_ceil(8), 0);
            self.values.resize((pages * spec.page_value_bytes()).div_ceil(8), 0);
            self.pages = pages;
        }
    }
    fn key_bytes(&self, spec: &PoolSpec) -> &[u8] {
        &bytemuck::cast_slice(&self.keys)[..self.pages * spec.page_key_bytes()]
    }
    fn value_bytes(&self, spec: &PoolSpec) -> &[u8] {
        &bytemuck::cast_slice(&self.values)[..self.pages * spec.page_value_bytes()]
    }
    fn write(
        &mut self,
        spec: &PoolSpec,
        page: usize,
        first_row: usize,
        keys: &[u8],
        values: &[u8],
    ) {
        let k0 = page * spec.page_key_bytes() + first_row * spec.key_row_bytes;
        let v0 = page * spec.page_value_bytes() + first_row * spec.value_row_bytes;
        bytemuck::cast_slice_mut::<u64, u8>(&mut self.keys)[k0..k0 + keys.len()]
            .copy_from_slice(keys);
        bytemuck::cast_slice_mut::<u64, u8>(&mut self.values)[v0..v0 + values.len()]
            .copy_from_slice(values);
    }
    fn read(
        &self,
        spec: &PoolSpec,
        page: usize,
        first_row: usize,
        keys: &mut [u8],
        values: &mut [u8],
    ) {
        let k0 = page * spec.page_key_bytes() + first_row * spec.key_row_bytes;
        let v0 = page * spec.page_value_bytes() + first_row * spec.value_row_bytes;
        keys.copy_from_slice(&self.key_bytes(spec)[k0..k0 + keys.len()]);
        values.copy_from_slice(&self.value_bytes(spec)[v0..v0 + values.len()]);
    }
}

/// A growable paged byte arena; its pages come from a [`PagePool`].
struct Paged {
    spec: PoolSpec,
    region: RwLock<Region>,
    pages: PagePool,
}

impl Paged {
    fn new(spec: PoolSpec, capacity: Option<usize>) -> Self {
        Self { spec, region: RwLock::new(Region::default()), pages: PagePool::new(capacity) }
    }

    /// A free page index, or `None` when the capacity is reached. A page never handed out
    /// before grows the region (the pool's lock is released by then).
    fn alloc(&self) -> Option<u32> {
        let grant = self.pages.alloc()?;
        if grant.fresh {
            self.region.write().grow(&self.spec, grant.index as usize + 1);
        }
        Some(grant.index)
    }

    fn reserve(&self, more: usize) {
        let want = self.pages.reserve(more);
        let mut guard = self.region.write();
        let r = &mut *guard;
        let keys = (want * self.spec.page_key_bytes()).div_ceil(8);
        let values = (want * self.spec.page_value_bytes()).div_ceil(8);
        r.keys.reserve(keys.saturating_sub(r.keys.len()));
        r.values.reserve(values.saturating_sub(r.values.len()));
    }

    fn capacity(&self) -> usize {
        self.pages.capacity().unwrap_or(0)
    }
}

/// Host-memory implementation of [`Tier`].
///
/// # Examples
/// ```
/// use kv_tiered::tier::{HostTier, PoolSpec, Tier, TierConfig};
/// let spec = PoolSpec { page_rows: 4, key_row_bytes: 8, value_row_bytes: 8 };
/// let tier = HostTier::new(TierConfig { layers: 1, pools: vec![spec], device_pages_per_layer: None, host_pages: None })?;
/// let host = tier.alloc_host(0)?;
/// tier.write_host(host, 0, &[1; 16], &[2; 16])?; // two rows
/// let page = tier.alloc_device(0, 0)?;
/// let (page, _event) = tier.copy_to_device(host, page, 2).map_err(|e| e.error)?;
/// tier.free_device(page);
/// # Ok::<(), kv_tiered::tier::TierError>(())
/// ```
pub struct HostTier {
    layers: usize,
    pools: Vec<PoolSpec>,
    device: Vec<Paged>,
    host: Vec<Paged>,
}

impl HostTier {
    /// A host tier with the given geometry.
    ///
    /// # Errors
    /// [`TierError::Bounds`] if there are no layers or pools, or a pool has zero-sized pages.
    pub fn new(config: TierConfig) -> Result<Self, TierError> {
        const OP: &str = "HostTier::new";
        if config.layers == 0
            || config.pools.is_empty()
            || config.pools.len() > usize::from(u16::MAX)
        {
            return Err(TierError::Bounds {
                op: OP,
                what: "layers·pools",
                got: config.layers * config.pools.len(),
                limit: 1,
            });
        }
        for s in &config.pools {
            if s.page_rows == 0 || s.key_row_bytes == 0 || s.value_row_bytes == 0 {
                return Err(TierError::Bounds { op: OP, what: "page size", got: 0, limit: 1 });
            }
        }
        let device = (0..config.pools.len() * config.layers)
            .map(|i| Paged::new(config.pools[i / config.layers], config.device_pages_per_layer))
            .collect();
        let host = config.pools.iter().map(|&s| Paged::new(s, config.host_pages)).collect();
        Ok(Self { layers: config.layers, pools: config.pools, device, host })
    }

    fn device_arena(
        &self,
        op: &'static str,
        pool: usize,
        layer: usize,
    ) -> Result<&Paged, TierError> {
        if pool >= self.pools.len() {
            return Err(TierError::Bounds { op, what: "pool", got: pool, limit: self.pools.len() });
        }
        if layer >= self.layers {
            return Err(TierError::Bounds { op, what: "layer", got: layer, limit: self.layers });
        }
        Ok(&self.device[pool * self.layers + layer])
    }

    fn host_pool(&self, op: &'static str, pool: usize) -> Result<&Paged, TierError> {
        self.host.get(pool).ok_or(TierError::Bounds {
            op,
            what: "pool",
            got: pool,
            limit: self.pools.len(),
        })
    }

    /// Device pages currently allocated in `(pool, layer)`.
    pub fn device_pages_in_use(&self, pool: usize, layer: usize) -> usize {
        self.device_arena("device_pages_in_use", pool, layer).map_or(0, |a| a.pages.in_use())
    }

    /// Host pages currently allocated in `pool`.
    pub fn host_pages_in_use(&self, pool: usize) -> usize {
        self.host_pool("host_pages_in_use", pool).map_or(0, |a| a.pages.in_use())
    }
}

/// Read guard over one host-tier arena.
pub struct HostArena<'a> {
    guard: RwLockReadGuard<'a, Region>,
    spec: PoolSpec,
}

impl ArenaRead for HostArena<'_> {
    fn host_bytes(&self) -> Option<(&[u8], &[u8])> {
        Some((self.guard.key_bytes(&self.spec), self.guard.value_bytes(&self.spec)))
    }
}

impl Tier for HostTier {
    type Event = ReadyEvent;
    type Arena<'a> = HostArena<'a>;

    fn layers(&self) -> usize {
        self.layers
    }

    fn pools(&self) -> &[PoolSpec] {
        &self.pools
    }

    fn alloc_device(&self, pool: usize, layer: usize) -> Result<DevicePage, TierError> {
        let arena = self.device_arena("alloc_device", pool, layer)?;
        match arena.alloc() {
            Some(i) => Ok(DevicePage::from_parts(pool, layer, i)),
            None => Err(TierError::OutOfDeviceMemory { pool, layer, capacity: arena.capacity() }),
        }
    }

    fn free_device(&self, page: DevicePage) {
        if let Ok(arena) = self.device_arena("free_device", page.pool(), page.layer()) {
            arena.pages.free(page.index());
        }
    }

    fn reserve_device(&self, pool: usize, layer: usize, pages: usize) {
        if let Ok(arena) = self.device_arena("reserve_device", pool, layer) {
            arena.reserve(pages);
        }
    }

    fn write_device(
        &self,
        page: &DevicePage,
        first_row: usize,
        keys: &[u8],
        values: &[u8],
    ) -> Result<(), TierError> {
        let arena = self.device_arena("write_device", page.pool(), page.layer())?;
        check_rows("write_device", &arena.spec, first_row, keys.len(), values.len())?;
        arena.region.write().write(&arena.spec, page.index() as usize, first_row, keys, values);
        Ok(())
    }

    fn alloc_host(&self, pool: usize) -> Result<HostPage, TierError> {
        let p = self.host_pool("alloc_host", pool)?;
        match p.alloc() {
            Some(i) => Ok(HostPage::from_parts(pool, i)),
            None => Err(TierError::OutOfHostMemory { pool, capacity: p.capacity() }),
        }
    }

    fn free_host(&self, page: HostPage) {
        if let Ok(p) = self.host_pool("free_host", page.pool()) {
            p.pages.free(page.index());
        }
    }

    fn write_host(
        &self,
        page: HostPage,
        first_row: usize,
        keys: &[u8],
        values: &[u8],
    ) -> Result<(), TierError> {
        let p = self.host_pool("write_host", page.pool())?;
        check_rows("write_host", &p.spec, first_row, keys.len(), values.len())?;
        check_page("write_host", page.index(), p)?;
        p.region.write().write(&p.spec, page.index() as usize, first_row, keys, values);
        Ok(())
    }

    fn read_host(
        &self,
        page: HostPage,
        first_row: usize,
        keys: &mut [u8],
        values: &mut [u8],
    ) -> Result<(), TierError> {
        let p = self.host_pool("read_host", page.pool())?;
        check_rows("read_host", &p.spec, first_row, keys.len(), values.len())?;
        check_page("read_host", page.index(), p)?;
        p.region.read().read(&p.spec, page.index() as usize, first_row, keys, values);
        Ok(())
    }

    fn copy_to_device(
        &self,
        src: HostPage,
        dst: DevicePage,
        rows: usize,
    ) -> Result<(DevicePage, ReadyEvent), MoveError> {
        let checked = (|| {
            let p = self.host_pool("copy_to_device", src.pool())?;
            check_page("copy_to_device", src.index(), p)?;
            let arena = self.device_arena("copy_to_device", dst.pool(), dst.layer())?;
            if src.pool() != dst.pool() || rows > p.spec.page_rows {
                return Err(TierError::Bounds {
                    op: "copy_to_device",
                    what: "rows/pool",
                    got: rows,
                    limit: p.spec.page_rows,
                });
            }
            Ok((p, arena))
        })();
        let (p, arena) = match checked {
            Ok(x) => x,
            Err(error) => return Err(MoveError { page: dst, error }),
        };
        let spec = &p.spec;
        let (kb, vb) = (rows * spec.key_row_bytes, rows * spec.value_row_bytes);
        let (k0, v0) = (
            src.index() as usize * spec.page_key_bytes(),
            src.index() as usize * spec.page_value_bytes(),
        );
        let host = p.region.read();
        let keys = &host.key_bytes(spec)[k0..k0 + kb];
        let values = &host.value_bytes(spec)[v0..v0 + vb];
        arena.region.write().write(spec, dst.index() as usize, 0, keys, values);
        Ok((dst, ReadyEvent))
    }

    fn arena(&self, pool: usize, layer: usize) -> HostArena<'_> {
        let a = &self.device[pool * self.layers + layer];
        // Recursive: a thread may hold several views of one arena (two layer views, or a view
        // and `read_device`); a plain read would queue behind a writer waiting to grow the
        // arena (another store on a shared tier) while that writer waits for the first view.
        HostArena { guard: a.region.read_recursive(), spec: a.spec }
    }
}

fn check_page(op: &'static str, index: u32, p: &Paged) -> Result<(), TierError> {
    let pages = p.region.read().pages;
    if (index as usize) < pages {
        Ok(())
    } else {
        Err(TierError::Bounds { op, what: "page", got: index as usize, limit: pages })
    }
}
