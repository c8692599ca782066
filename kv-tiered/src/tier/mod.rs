//! Storage tiers: where K/V bytes live (WnW §2.3 "tidal heads keep a portion on GPU and the
//! complement on CPU"; DESIGN.md "Tiers and devices").
//!
//! A [`Tier`] owns two kinds of memory, both cut into fixed-size **pages**:
//!
//! * the **device arena** — one per `(pool, layer)`; attention kernels read it. On the host
//!   tier ([`HostTier`], the default for tests and CPU runs) it is ordinary memory; on the CUDA
//!   tier (`kv-tiered/src/cuda`, feature `cuda`) it is a `DeviceBuffer`.
//! * the **host pool** — one per pool, shared by all layers; it holds the recallable CPU copies
//!   (pinned `LockedBuffer` on CUDA). Host pages are written once at prefill and only read
//!   afterwards; the store never frees them while it lives, so a CPU copy cannot be lost.
//!
//! # Pools and layout
//! A tier is built with a list of [`PoolSpec`]s (pool 0: dense rows; pool 1: SWAN sparse rows
//! when enabled — see `rows`). A page of pool `p` holds `page_rows` rows. Keys and values
//! live in **separate** arenas so that row `r` of a `(pool, layer)` arena starts at byte
//! `r · key_row_bytes` of the key arena and `r · value_row_bytes` of the value arena, where
//! `r = page.index() · page_rows + slot`. Kernels therefore address rows with a flat row id —
//! no page table walk — and the store hands them sorted `(position, row id)` lists.
//!
//! # Contract for implementors (read this before writing a tier)
//! 1. **Ownership.** [`DevicePage`] is a move-only handle: exactly one owner (the store's
//!    residency tables, or an in-flight recall). [`Tier::free_device`] consumes it. A failing
//!    [`Tier::copy_to_device`] must hand the destination page back inside [`MoveError`]
//!    (crossbeam's `SendError<T>` style) and leave the source host page untouched. Never
//!    drop a page silently, never free a page you were not given.
//! 2. **Writes.** `write_device` / `write_host` copy `rows` whole rows starting at
//!    `first_row` of the page; the byte slices hold exactly `rows · key_row_bytes` and
//!    `rows · value_row_bytes` bytes. Out-of-range rows → [`TierError::Bounds`], nothing
//!    written. `write_device` is synchronous: when it returns, kernels may read the rows.
//! 3. **Recall.** `copy_to_device(src, dst, rows)` copies rows `0..rows` of host page `src`
//!    to rows `0..rows` of device page `dst` (keys and values). It may be asynchronous: it
//!    returns the page together with a [`CopyEvent`]; the rows are readable by kernels only
//!    after `event.wait()` returned `Ok`. It is called from the store's recall worker thread,
//!    concurrently with `arena()` reads of *other* layers and with other copies — hence
//!    `Send + Sync`. The store never reads a layer's arena while a copy into it is in flight.
//! 4. **Allocation failure** is an ordinary error ([`TierError::OutOfDeviceMemory`] /
//!    [`TierError::OutOfHostMemory`]): during decode the store skips that recall and retries
//!    it on a later step; during prefill or append it reports the error. Residency tables are
//!    never changed by a failed allocation or move.
//! 5. **Reads.** `arena(pool, layer)` gives kernels read access to one `(pool, layer)` arena
//!    ([`ArenaRead`]). Host-addressable tiers return the bytes; a device tier returns `None`
//!    from [`ArenaRead::host_bytes`] and exposes device pointers on its own arena type.
//! 6. **Lifetime and sizing.** The store frees every device and host page it holds when it is
//!    dropped ([`Tier::free_host`] only then). [`Tier::reserve_device`] is a capacity hint
//!    sent once after prefill; allocate-once tiers may ignore it and size themselves from
//!    `StoreConfig::bounded_tier_config`, whose limits a store never exceeds.
//!
//! Both tiers take page indices from one [`PagePool`] per arena and per host pool (free list,
//! reuse, capacity accounting); a new tier can do the same and keep only the bytes.
//!
//! A fault-injecting wrapper ([`FaultyTier`]) shows how to decorate any tier; hardening tests
//! use it to prove that failed moves lose neither a CPU copy nor a residency entry.
//! [`contract::check_contract`] is a conformance check to run against any new tier.

pub mod contract;
mod fault;
mod host;
mod pool;

pub use fault::{FaultOp, FaultPlan, FaultRates, FaultSchedule, FaultyEvent, FaultyTier};
pub use host::HostTier;
pub use pool::{PageGrant, PagePool};

/// Geometry of one page pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct PoolSpec {
    /// Rows per page.
    pub page_rows: usize,
    /// Bytes of one key row.
    pub key_row_bytes: usize,
    /// Bytes of one value row.
    pub value_row_bytes: usize,
}

impl PoolSpec {
    /// Key bytes of one page.
    pub fn page_key_bytes(&self) -> usize {
        self.page_rows * self.key_row_bytes
    }
    /// Value bytes of one page.
    pub fn page_value_bytes(&self) -> usize {
        self.page_rows * self.value_row_bytes
    }
    /// Key + value bytes of `rows` rows.
    pub fn rows_bytes(&self, rows: usize) -> usize {
        rows * (self.key_row_bytes + self.value_row_bytes)
    }
}

/// Sizes of a tier: layers, pools and optional page limits (None = grow on demand).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TierConfig {
    /// Decoder layers (one device arena per pool and layer).
    pub layers: usize,
    /// Page pools.
    pub pools: Vec<PoolSpec>,
    /// Maximum device pages per `(pool, layer)`; `None` = unlimited (host tier grows).
    pub device_pages_per_layer: Option<usize>,
    /// Maximum host pages per pool; `None` = unlimited.
    pub host_pages: Option<usize>,
}

/// A page of one `(pool, layer)` device arena. Move-only: see the module contract.
#[derive(Debug, PartialEq, Eq, Hash)]
#[must_use = "a device page must be stored or handed back to Tier::free_device"]
pub struct DevicePage {
    pool: u16,
    layer: u32,
    index: u32,
}

impl DevicePage {
    /// A handle for page `index` of arena `(pool, layer)`. Only tier implementations create
    /// pages (in `alloc_device`); anyone else forging one breaks the ownership contract.
    pub fn from_parts(pool: usize, layer: usize, index: u32) -> Self {
        Self { pool: pool as u16, layer: layer as u32, index }
    }
    /// Pool of the page.
    pub fn pool(&self) -> usize {
        usize::from(self.pool)
    }
    /// Layer of the page.
    pub fn layer(&self) -> usize {
        self.layer as usize
    }
    /// Page index inside its arena; its rows are `index · page_rows ..`.
    pub fn index(&self) -> u32 {
        self.index
    }
}

/// A page of one pool's host memory (the recallable CPU copy). `Copy`: host pages are
/// immutable after prefill and live as long as the store, so ids can be shared freely.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct HostPage {
    pool: u16,
    index: u32,
}

impl HostPage {
    /// A handle for host page `index` of `pool` (tier implementations only).
    pub fn from_parts(pool: usize, index: u32) -> Self {
        Self { pool: pool as u16, index }
    }
    /// Pool of the page.
    pub fn pool(&self) -> usize {
        usize::from(self.pool)
    }
    /// Page index inside the pool.
    pub fn index(&self) -> u32 {
        self.index
    }
}

/// Errors of a storage tier.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum TierError {
    /// No free device page in `(pool, layer)`.
    #[error("device arena (pool {pool}, layer {layer}) full: {capacity} pages")]
    OutOfDeviceMemory {
        /// Pool.
        pool: usize,
        /// Layer.
        layer: usize,
        /// Page capacity of the arena.
        capacity: usize,
    },
    /// No free host page in `pool`.
    #[error("host pool {pool} full: {capacity} pages")]
    OutOfHostMemory {
        /// Pool.
        pool: usize,
        /// Page capacity of the pool.
        capacity: usize,
    },
    /// A row range or byte length does not fit a page, or a pool/layer does not exist.
    #[error("{op}: {what} = {got}, limit {limit}")]
    Bounds {
        /// Operation.
        op: &'static str,
        /// What was out of range.
        what: &'static str,
        /// Value received.
        got: usize,
        /// Limit it had to respect.
        limit: usize,
    },
    /// The backend (CUDA driver, …) reported an error.
    #[error("{op}: backend error: {message}")]
    Backend {
        /// Operation.
        op: &'static str,
        /// Backend message.
        message: String,
    },
    /// A fault injected by [`FaultyTier`].
    #[error("{op}: injected fault")]
    Injected {
        /// Operation that was failed on purpose.
        op: &'static str,
    },
}

/// A failed move: the destination page handed back with the reason.
#[derive(Debug, PartialEq, thiserror::Error)]
#[error("moving a page to the device failed: {error}")]
pub struct MoveError {
    /// The page the move was going to fill; still owned by the caller.
    pub page: DevicePage,
    /// Why the move failed.
    pub error: TierError,
}

/// Completion handle of an asynchronous host→device copy.
pub trait CopyEvent: Send + 'static {
    /// Blocks until the copy has landed.
    ///
    /// # Errors
    /// The backend's error if the copy failed after being issued.
    fn wait(self) -> Result<(), TierError>;
}

/// An event that is already complete (synchronous tiers).
#[derive(Debug, Clone, Copy, Default)]
pub struct ReadyEvent;

impl CopyEvent for ReadyEvent {
    fn wait(self) -> Result<(), TierError> {
        Ok(())
    }
}

/// Read access to one `(pool, layer)` device arena for attention kernels.
pub trait ArenaRead {
    /// `(keys, values)` bytes of the whole arena if it is host-addressable; `None` for device
    /// memory. Row `r` starts at `r · key_row_bytes` / `r · value_row_bytes`.
    fn host_bytes(&self) -> Option<(&[u8], &[u8])>;
}

/// A storage tier: device arenas, host pool and the copies between them. See the module
/// documentation for the full contract.
pub trait Tier: Send + Sync + 'static {
    /// Completion handle of [`copy_to_device`](Tier::copy_to_device).
    type Event: CopyEvent;
    /// Read guard/handle of one arena.
    type Arena<'a>: ArenaRead
    where
        Self: 'a;

    /// Number of layers (device arenas per pool).
    fn layers(&self) -> usize;
    /// The pools, indexed by pool id.
    fn pools(&self) -> &[PoolSpec];

    /// Allocates a device page in `(pool, layer)`.
    ///
    /// # Errors
    /// [`TierError::OutOfDeviceMemory`] when the arena is full; [`TierError::Bounds`] for a
    /// bad pool or layer.
    fn alloc_device(&self, pool: usize, layer: usize) -> Result<DevicePage, TierError>;
    /// Returns a device page to its arena.
    fn free_device(&self, page: DevicePage);
    /// Capacity hint: `(pool, layer)` will hold up to `pages` more pages than now. Growable
    /// tiers reserve memory so later allocations stay allocation-free on the host; fixed-size
    /// tiers ignore it (the default).
    fn reserve_device(&self, pool: usize, layer: usize, pages: usize) {
        let _ = (pool, layer, pages);
    }
    /// Synchronously writes `keys.len() / key_row_bytes` rows at `first_row` of `page`.
    ///
    /// # Errors
    /// [`TierError::Bounds`] if the rows do not fit or the byte lengths disagree.
    fn write_device(
        &self,
        page: &DevicePage,
        first_row: usize,
        keys: &[u8],
        values: &[u8],
    ) -> Result<(), TierError>;

    /// Allocates a host page in `pool`.
    ///
    /// # Errors
    /// [`TierError::OutOfHostMemory`] when the pool is full.
    fn alloc_host(&self, pool: usize) -> Result<HostPage, TierError>;
    /// Returns a host page to its pool. The store calls it only when it is dropped (a CPU copy
    /// lives as long as its store). The default keeps the page allocated until the tier itself
    /// is dropped, which is right for a tier serving one store; tiers shared by several stores
    /// should override it to recycle pages.
    fn free_host(&self, page: HostPage) {
        let _ = page;
    }
    /// Writes rows of a host page (prefill only).
    ///
    /// # Errors
    /// As [`write_device`](Tier::write_device).
    fn write_host(
        &self,
        page: HostPage,
        first_row: usize,
        keys: &[u8],
        values: &[u8],
    ) -> Result<(), TierError>;
    /// Reads rows of a host page back (verification and CPU-side fallbacks).
    ///
    /// # Errors
    /// As [`write_device`](Tier::write_device).
    fn read_host(
        &self,
        page: HostPage,
        first_row: usize,
        keys: &mut [u8],
        values: &mut [u8],
    ) -> Result<(), TierError>;

    /// Reads rows of a device page back (verification; not on any hot path). The default
    /// copies from [`ArenaRead::host_bytes`]; device tiers override it with a D2H copy.
    ///
    /// # Errors
    /// As [`write_device`](Tier::write_device); [`TierError::Backend`] if the arena is not
    /// host-addressable and the tier does not override this method.
    fn read_device(
        &self,
        page: &DevicePage,
        first_row: usize,
        keys: &mut [u8],
        values: &mut [u8],
    ) -> Result<(), TierError> {
        const OP: &str = "read_device";
        let spec = *self.pools().get(page.pool()).ok_or(TierError::Bounds {
            op: OP,
            what: "pool",
            got: page.pool(),
            limit: self.pools().len(),
        })?;
        check_rows(OP, &spec, first_row, keys.len(), values.len())?;
        let arena = self.arena(page.pool(), page.layer());
        let (kb, vb) = arena.host_bytes().ok_or(TierError::Backend {
            op: OP,
            message: "arena is not host-addressable".into(),
        })?;
        let row = page.index() as usize * spec.page_rows + first_row;
        let (k0, v0) = (row * spec.key_row_bytes, row * spec.value_row_bytes);
        let (k, v) = (kb.get(k0..k0 + keys.len()), vb.get(v0..v0 + values.len()));
        let (Some(k), Some(v)) = (k, v) else {
            return Err(TierError::Bounds {
                op: OP,
                what: "page",
                got: page.index() as usize,
                limit: kb.len() / spec.page_key_bytes().max(1),
            });
        };
        keys.copy_from_slice(k);
        values.copy_from_slice(v);
        Ok(())
    }

    /// Copies rows `0..rows` of `src` into rows `0..rows` of `dst`, possibly asynchronously.
    ///
    /// # Errors
    /// [`MoveError`] carrying `dst` back if the copy cannot be issued.
    fn copy_to_device(
        &self,
        src: HostPage,
        dst: DevicePage,
        rows: usize,
    ) -> Result<(DevicePage, Self::Event), MoveError>;

    /// Read access to the `(pool, layer)` arena.
    ///
    /// # Panics
    /// May panic for a pool or layer out of range (the store only asks for valid ones).
    fn arena(&self, pool: usize, layer: usize) -> Self::Arena<'_>;
}

pub(crate) fn check_rows(
    op: &'static str,
    spec: &PoolSpec,
    first_row: usize,
    keys: usize,
    values: usize,
) -> Result<usize, TierError> {
    if spec.key_row_bytes == 0 || !keys.is_multiple_of(spec.key_row_bytes) {
        return Err(TierError::Bounds {
            op,
            what: "key bytes",
            got: keys,
            limit: spec.page_key_bytes(),
        });
    }
    let rows = keys / spec.key_row_bytes;
    if values != rows * spec.value_row_bytes {
        return Err(TierError::Bounds {
            op,
            what: "value bytes",
            got: values,
            limit: rows * spec.value_row_bytes,
        });
    }
    if first_row + rows > spec.page_rows {
        return Err(TierError::Bounds {
            op,
            what: "rows end",
            got: first_row + rows,
            limit: spec.page_rows,
        });
    }
    Ok(rows)
}
