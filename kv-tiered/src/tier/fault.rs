//! A fault-injecting tier decorator for hardening tests (WnW §2.3 recall path: a recall that
//! cannot get a page or whose copy fails must lose neither the CPU copy nor a residency
//! entry). [`FaultyTier`] fails device allocations, copy issues and copy completions as its
//! [`FaultPlan`] says — every n-th call ([`FaultSchedule`]), at random rates drawn
//! reproducibly ([`FaultRates`]), or by any rule ([`FaultPlan::from_fn`]) — and otherwise
//! delegates to the wrapped tier. It shows the intended failure semantics of the [`Tier`]
//! contract: a failed copy hands its destination page back ([`MoveError`]); a copy whose
//! event fails leaves the page with the caller, who must free it.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use super::{CopyEvent, DevicePage, HostPage, MoveError, PoolSpec, Tier, TierError};

/// An operation a [`FaultyTier`] can fail.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FaultOp {
    /// `alloc_device` returns [`TierError::Injected`].
    AllocDevice,
    /// `copy_to_device` fails at issue time (the page is handed back in [`MoveError`]).
    Copy,
    /// A successfully issued copy fails at [`CopyEvent::wait`].
    Event,
}

impl FaultOp {
    /// Every operation, in the order of [`FaultOp::index`].
    pub const ALL: [Self; 3] = [Self::AllocDevice, Self::Copy, Self::Event];

    /// Position of the operation in [`FaultOp::ALL`].
    pub fn index(self) -> usize {
        match self {
            Self::AllocDevice => 0,
            Self::Copy => 1,
            Self::Event => 2,
        }
    }

    /// The `op` of the [`TierError::Injected`] this operation's fault reports.
    fn name(self) -> &'static str {
        match self {
            Self::AllocDevice => "alloc_device",
            Self::Copy => "copy_to_device",
            Self::Event => "CopyEvent::wait",
        }
    }
}

/// Every `n`-th call of an operation fails (`None`: never). Counting starts at 1, so
/// `Some(1)` fails every call.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FaultSchedule {
    /// Fail every n-th `alloc_device`.
    pub alloc_device_every: Option<u64>,
    /// Fail every n-th `copy_to_device` at issue time (page handed back in `MoveError`).
    pub copy_every: Option<u64>,
    /// Make every n-th successfully issued copy fail at `wait()`.
    pub event_every: Option<u64>,
}

impl FaultSchedule {
    fn fails(&self, op: FaultOp, call: u64) -> bool {
        let every = match op {
            FaultOp::AllocDevice => self.alloc_device_every,
            FaultOp::Copy => self.copy_every,
            FaultOp::Event => self.event_every,
        };
        every.is_some_and(|e| e > 0 && call.is_multiple_of(e))
    }
}

/// Random faults: call `n` of an operation fails with probability `rate / 2^16`, decided by
/// a hash of `(seed, operation, n)`. A run is therefore reproducible whenever each
/// operation's calls come in a deterministic order (the store allocates on its own thread
/// and copies on its worker, each in order).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FaultRates {
    /// Seed of the draws.
    pub seed: u64,
    /// `alloc_device` failures per 2^16 calls.
    pub alloc_device: u64,
    /// `copy_to_device` issue failures per 2^16 calls.
    pub copy: u64,
    /// Copy-completion failures per 2^16 successfully issued copies.
    pub event: u64,
}

impl FaultRates {
    fn fails(&self, op: FaultOp, call: u64) -> bool {
        let rate = match op {
            FaultOp::AllocDevice => self.alloc_device,
            FaultOp::Copy => self.copy,
            FaultOp::Event => self.event,
        };
        let n = call - 1;
        splitmix(self.seed ^ splitmix(n * 3 + op.index() as u64)) & 0xffff < rate
    }
}

/// SplitMix64's output function: a cheap, well-mixed hash of one word.
fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// Which calls a [`FaultyTier`] fails. The tier numbers each operation's calls from 1,
/// counting only while it is armed, and asks the plan about every such call.
///
/// # Examples
/// ```
/// use kv_tiered::tier::{FaultOp, FaultPlan, FaultRates, FaultSchedule};
/// let every_third = FaultPlan::from(FaultSchedule { copy_every: Some(3), ..Default::default() });
/// assert!(!every_third.fails(FaultOp::Copy, 2) && every_third.fails(FaultOp::Copy, 3));
/// let first_alloc = FaultPlan::from_fn(|op, call| op == FaultOp::AllocDevice && call == 1);
/// assert!(first_alloc.fails(FaultOp::AllocDevice, 1));
/// assert!(!first_alloc.fails(FaultOp::AllocDevice, 2));
/// let always = FaultPlan::Random(FaultRates { seed: 7, event: 1 << 16, ..Default::default() });
/// assert!(always.fails(FaultOp::Event, 5) && !always.fails(FaultOp::Copy, 5));
/// ```
#[derive(Clone, Default)]
pub enum FaultPlan {
    /// Nothing fails.
    #[default]
    Never,
    /// Every n-th call of an operation fails.
    Every(FaultSchedule),
    /// Calls fail at random, reproducibly.
    Random(FaultRates),
    /// Calls fail when the rule, given the operation and its call number, says so.
    Custom(Arc<dyn Fn(FaultOp, u64) -> bool + Send + Sync>),
}

impl FaultPlan {
    /// A plan that fails the calls for which `rule(op, call)` is `true`.
    pub fn from_fn(rule: impl Fn(FaultOp, u64) -> bool + Send + Sync + 'static) -> Self {
        Self::Custom(Arc::new(rule))
    }

    /// Whether call number `call` (from 1) of `op` fails.
    pub fn fails(&self, op: FaultOp, call: u64) -> bool {
        match self {
            Self::Never => false,
            Self::Every(s) => s.fails(op, call),
            Self::Random(r) => r.fails(op, call),
            Self::Custom(rule) => rule(op, call),
        }
    }
}

impl fmt::Debug for FaultPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Never => f.write_str("Never"),
            Self::Every(s) => f.debug_tuple("Every").field(s).finish(),
            Self::Random(r) => f.debug_tuple("Random").field(r).finish(),
            Self::Custom(_) => f.write_str("Custom(..)"),
        }
    }
}

impl From<FaultSchedule> for FaultPlan {
    fn from(schedule: FaultSchedule) -> Self {
        Self::Every(schedule)
    }
}

impl From<FaultRates> for FaultPlan {
    fn from(rates: FaultRates) -> Self {
        Self::Random(rates)
    }
}

/// Wraps a tier and injects faults per a [`FaultPlan`].
pub struct FaultyTier<T> {
    inner: T,
    plan: FaultPlan,
    armed: AtomicBool,
    calls: [AtomicU64; 3],
    injected: [AtomicU64; 3],
}

impl<T: Tier> FaultyTier<T> {
    /// Decorates `inner`; faults are armed from the start.
    pub fn new(inner: T, plan: impl Into<FaultPlan>) -> Self {
        Self {
            inner,
            plan: plan.into(),
            armed: AtomicBool::new(true),
            calls: Default::default(),
            injected: Default::default(),
        }
    }
    /// Turns injection on or off (calls are only counted while armed), e.g. to let prefill
    /// succeed and fail only decode-time moves.
    pub fn set_armed(&self, armed: bool) {
        self.armed.store(armed, Ordering::SeqCst);
    }
    /// The wrapped tier.
    pub fn inner(&self) -> &T {
        &self.inner
    }
    /// The plan.
    pub fn plan(&self) -> &FaultPlan {
        &self.plan
    }
    /// Faults injected so far, all operations together.
    pub fn injected(&self) -> u64 {
        self.injected.iter().map(|n| n.load(Ordering::SeqCst)).sum()
    }
    /// Faults of `op` injected so far.
    pub fn injected_of(&self, op: FaultOp) -> u64 {
        self.injected[op.index()].load(Ordering::SeqCst)
    }
    /// Counts a call of `op` (while armed) and asks the plan whether it fails.
    fn hit(&self, op: FaultOp) -> bool {
        if !self.armed.load(Ordering::SeqCst) {
            return false;
        }
        let call = self.calls[op.index()].fetch_add(1, Ordering::SeqCst) + 1;
        let hit = self.plan.fails(op, call);
        if hit {
            self.injected[op.index()].fetch_add(1, Ordering::SeqCst);
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
                Err(TierError::Injected { op: FaultOp::Event.name() })
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
        if self.hit(FaultOp::AllocDevice) {
            return Err(TierError::Injected { op: FaultOp::AllocDevice.name() });
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
    fn read_device(
        &self,
        page: &DevicePage,
        first_row: usize,
        keys: &mut [u8],
        values: &mut [u8],
    ) -> Result<(), TierError> {
        // Forwarded: a device tier (CUDA) reads its pages with a D2H copy, not through the
        // host bytes the trait's default reads.
        self.inner.read_device(page, first_row, keys, values)
    }
    fn copy_to_device(
        &self,
        src: HostPage,
        dst: DevicePage,
        rows: usize,
    ) -> Result<(DevicePage, Self::Event), MoveError> {
        if self.hit(FaultOp::Copy) {
            return Err(MoveError {
                page: dst,
                error: TierError::Injected { op: FaultOp::Copy.name() },
            });
        }
        let (page, event) = self.inner.copy_to_device(src, dst, rows)?;
        let fail = self.hit(FaultOp::Event);
        Ok((page, if fail { FaultyEvent::Fail(event) } else { FaultyEvent::Inner(event) }))
    }
    fn arena(&self, pool: usize, layer: usize) -> Self::Arena<'_> {
        self.inner.arena(pool, layer)
    }
}

#[cfg(test)]
mod tests {
    //! Each kind of plan fails exactly the calls it names; disarmed calls are not counted.

    use std::sync::Mutex;

    use super::{FaultOp, FaultPlan, FaultRates, FaultSchedule, FaultyTier};
    use crate::tier::{CopyEvent, HostTier, PoolSpec, Tier, TierConfig, TierError};

    fn host() -> HostTier {
        let spec = PoolSpec { page_rows: 2, key_row_bytes: 4, value_row_bytes: 4 };
        HostTier::new(TierConfig {
            layers: 1,
            pools: vec![spec],
            device_pages_per_layer: None,
            host_pages: None,
        })
        .unwrap()
    }

    /// Runs `n` allocations and recalls; returns which calls of each operation failed.
    fn failures(tier: &FaultyTier<HostTier>, n: usize) -> [Vec<u64>; 3] {
        let src = tier.alloc_host(0).unwrap();
        tier.write_host(src, 0, &[1; 8], &[2; 8]).unwrap();
        let mut out: [Vec<u64>; 3] = Default::default();
        let (mut copies, mut events) = (0, 0);
        for call in 1..=n as u64 {
            match tier.alloc_device(0, 0) {
                Err(e) => {
                    assert_eq!(e, TierError::Injected { op: "alloc_device" });
                    out[0].push(call);
                }
                Ok(page) => {
                    copies += 1;
                    match tier.copy_to_device(src, page, 2) {
                        Err(e) => {
                            assert_eq!(e.error, TierError::Injected { op: "copy_to_device" });
                            out[1].push(copies);
                            tier.free_device(e.page);
                        }
                        Ok((page, event)) => {
                            events += 1;
                            if event.wait().is_err() {
                                out[2].push(events);
                            }
                            tier.free_device(page);
                        }
                    }
                }
            }
        }
        assert_eq!(tier.inner().device_pages_in_use(0, 0), 0);
        out
    }

    #[test]
    fn every_nth_call_fails_per_operation() {
        let schedule =
            FaultSchedule { alloc_device_every: Some(3), copy_every: Some(2), event_every: None };
        let tier = FaultyTier::new(host(), schedule);
        let [allocs, copies, events] = failures(&tier, 9);
        assert_eq!(allocs, [3, 6, 9]);
        assert_eq!(copies, [2, 4, 6]);
        assert!(events.is_empty());
        assert_eq!(tier.injected_of(FaultOp::AllocDevice), 3);
        assert_eq!(tier.injected(), 6);
    }

    #[test]
    fn random_plans_are_reproducible_and_follow_their_rates() {
        let rates = FaultRates { seed: 11, alloc_device: 1 << 14, copy: 1 << 14, event: 1 << 14 };
        let (a, b) = (FaultyTier::new(host(), rates), FaultyTier::new(host(), rates));
        let (fa, fb) = (failures(&a, 4000), failures(&b, 4000));
        assert_eq!(fa, fb, "same seed, same calls, same faults");
        // Each operation fails about a quarter of its calls.
        let allocs = 4000;
        let copies = allocs - fa[0].len();
        let events = copies - fa[1].len();
        for (f, calls) in fa.iter().zip([allocs, copies, events]) {
            let share = f.len() as f64 / calls as f64;
            assert!((0.2..0.3).contains(&share), "{} of {calls} calls failed", f.len());
        }
        let other = FaultyTier::new(host(), FaultRates { seed: 12, ..rates });
        assert_ne!(failures(&other, 4000), fa, "another seed, other faults");
        let never = FaultyTier::new(host(), FaultRates { seed: 11, ..Default::default() });
        assert!(failures(&never, 100).iter().all(Vec::is_empty));
    }

    #[test]
    fn custom_plans_see_each_operation_and_its_call_number() {
        let seen = std::sync::Arc::new(Mutex::new(Vec::new()));
        let log = std::sync::Arc::clone(&seen);
        let plan = FaultPlan::from_fn(move |op, call| {
            log.lock().unwrap().push((op, call));
            op == FaultOp::Event && call == 2
        });
        let tier = FaultyTier::new(host(), plan);
        let [allocs, copies, events] = failures(&tier, 3);
        assert!(allocs.is_empty() && copies.is_empty());
        assert_eq!(events, [2]);
        let calls: Vec<(FaultOp, u64)> =
            (1..=3).flat_map(|n| FaultOp::ALL.map(|op| (op, n))).collect();
        assert_eq!(*seen.lock().unwrap(), calls);
    }

    #[test]
    fn disarmed_calls_are_neither_failed_nor_counted() {
        let tier = FaultyTier::new(
            host(),
            FaultSchedule { alloc_device_every: Some(2), ..Default::default() },
        );
        tier.set_armed(false);
        assert!(failures(&tier, 5).iter().all(Vec::is_empty));
        tier.set_armed(true);
        assert_eq!(failures(&tier, 4)[0], [2, 4], "counting resumes at call 1");
        assert!(!FaultyTier::new(host(), FaultPlan::Never).plan().fails(FaultOp::Copy, 1));
    }
}
