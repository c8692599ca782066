//! A fault-injecting tier decorator for hardening tests: it fails device allocations, copy
//! issues and copy completions on a deterministic schedule and otherwise delegates to the
//! wrapped tier. It shows the intended failure semantics of the [`Tier`] contract: a failed
//! copy hands its destination page back ([`MoveError`]); a copy whose event fails leaves the
//! page with the caller, who must free it.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use super::{CopyEvent, DevicePage, HostPage, MoveError, PoolSpec, Tier, TierError};

/// When to inject faults: every `n`-th call of an operation fails (`None`: never). Counting
/// starts at 1, so `Some(1)` fails every call.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FaultSchedule {
    /// Fail every n-th `alloc_device`.
    pub alloc_device_every: Option<u64>,
    /// Fail every n-th `copy_to_device` at issue time (page handed back in `MoveError`).
    pub copy_every: Option<u64>,
    /// Make every n-th successfully issued copy fail at `wait()`.
    pub event_every: Option<u64>,
}

/// Wraps a tier and injects faults per a [`FaultSchedule`].
pub struct FaultyTier<T> {
    inner: T,
    schedule: FaultSchedule,
    armed: AtomicBool,
    allocs: AtomicU64,
    copies: AtomicU64,
    events: AtomicU64,
    injected: AtomicU64,
}

impl<T: Tier> FaultyTier<T> {
    /// Decorates `inner`; faults are armed from the start.
    pub fn new(inner: T, schedule: FaultSchedule) -> Self {
        Self {
            inner,
            schedule,
            armed: AtomicBool::new(true),
            allocs: AtomicU64::new(0),
            copies: AtomicU64::new(0),
            events: AtomicU64::new(0),
            injected: AtomicU64::new(0),
        }
    }
    /// Turns injection on or off (calls are only counted while armed), e.g. to let prefill
    /// succeed and fail only decode-time moves.
    pub fn set_armed(&self, armed: bool) {
        self.armed.store(armed, Ordering::Relaxed);
    }
    /// The wrapped tier.
    pub fn inner(&self) -> &T {
        &self.inner
    }
    /// Faults injected so far.
    pub fn injected(&self) -> u64 {
        self.injected.load(Ordering::Relaxed)
    }
    fn hit(&self, counter: &AtomicU64, every: Option<u64>) -> bool {
        if !self.armed.load(Ordering::Relaxed) {
            return false;
        }
        let n = counter.fetch_add(1, Ordering::Relaxed) + 1;
        let hit = every.is_some_and(|e| e > 0 && n.is_multiple_of(e));
        if hit {
            self.injected.fetch_add(1, Ordering::Relaxed);
        }
        hit
    }
}

/// Event of a [`FaultyTier`] copy: the inner event, or an injected failure.
pub enum FaultyEvent<E> {
    /// Delegates to the wrapped tier's event.
    Inner(E),
    /// Fails at `wait()` (after waiting for the inner copy).
    Fail(E),
}

impl<E: CopyEvent> CopyEvent for FaultyEvent<E> {
    fn wait(self) -> Result<(), TierError> {
        match self {
            Self::Inner(e) => e.wait(),
            Self::Fail(e) => {
                e.wait()?;
                Err(TierError::Injected { op: "CopyEvent::wait" })
            }
        }
    }
}

impl<T: Tier> Tier for FaultyTier<T> {
    type Event = FaultyEvent<T::Event>;
    type Arena<'a> = T::Arena<'a>;

    fn layers(&self) -> usize {
        self.inner.layers()
    }
    fn pools(&self) -> &[PoolSpec] {
        self.inner.pools()
    }
    fn alloc_device(&self, pool: usize, layer: usize) -> Result<DevicePage, TierError> {
        if self.hit(&self.allocs, self.schedule.alloc_device_every) {
            return Err(TierError::Injected { op: "alloc_device" });
        }
        self.inner.alloc_device(pool, layer)
    }
    fn free_device(&self, page: DevicePage) {
        self.inner.free_device(page);
    }
    fn reserve_device(&self, pool: usize, layer: usize, pages: usize) {
        self.inner.reserve_device(pool, layer, pages);
    }
    fn write_device(
        &self,
        page: &DevicePage,
        first_row: usize,
        keys: &[u8],
        values: &[u8],
    ) -> Result<(), TierError> {
        self.inner.write_device(page, first_row, keys, values)
    }
    fn alloc_host(&self, pool: usize) -> Result<HostPage, TierError> {
        self.inner.alloc_host(pool)
    }
    fn free_host(&self, page: HostPage) {
        self.inner.free_host(page);
    }
    fn write_host(
        &self,
        page: HostPage,
        first_row: usize,
        keys: &[u8],
        values: &[u8],
    ) -> Result<(), TierError> {
        self.inner.write_host(page, first_row, keys, values)
    }
    fn read_host(
        &self,
        page: HostPage,
        first_row: usize,
        keys: &mut [u8],
        values: &mut [u8],
    ) -> Result<(), TierError> {
        self.inner.read_host(page, first_row, keys, values)
    }
    fn copy_to_device(
        &self,
        src: HostPage,
        dst: DevicePage,
        rows: usize,
    ) -> Result<(DevicePage, Self::Event), MoveError> {
        if self.hit(&self.copies, self.schedule.copy_every) {
            return Err(MoveError {
                page: dst,
                error: TierError::Injected { op: "copy_to_device" },
            });
        }
        let (page, event) = self.inner.copy_to_device(src, dst, rows)?;
        let fail = self.hit(&self.events, self.schedule.event_every);
        Ok((page, if fail { FaultyEvent::Fail(event) } else { FaultyEvent::Inner(event) }))
    }
    fn arena(&self, pool: usize, layer: usize) -> Self::Arena<'_> {
        self.inner.arena(pool, layer)
    }
}
