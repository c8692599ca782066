//! State shared between the store and its recall worker (WnW §2.3 "tidal heads recall the
//! segments … from the CPU complement"): per-layer residency tables behind
//! `parking_lot::RwLock`s, the immutable host index, per-layer pending-recall counters with a
//! condition variable, and the worker loop fed by a bounded crossbeam channel.
//!
//! Ordering: the store issues recall jobs layer by layer; the worker copies (through the
//! tier), waits for the copy event, then merges the rows into the layer's tables under the
//! write lock and only then decrements the layer's pending counter. A reader that waited for
//! the counter to reach zero therefore sees complete rows. A failed move frees the page it got
//! back and records the failure; tables are untouched.

use std::sync::Arc;
use std::time::Duration;

use crossbeam::channel::Receiver;
use parking_lot::{Condvar, Mutex, RwLock};

use crate::residency::PosRows;
use crate::tier::{CopyEvent, DevicePage, HostPage, MoveError, Tier};

/// One head's tables in one layer.
#[derive(Debug)]
pub(crate) struct HeadTables {
    /// Resident positions and rows per pool (0 dense, 1 sparse).
    pub lists: [PosRows; 2],
    /// Device page of each recalled unit.
    pub recalled: Vec<Option<DevicePage>>,
    /// Pages of permanent rows (text, retained audio, generated tokens).
    pub permanent: Vec<DevicePage>,
    /// Per pool: `(index into permanent, rows used)` of the page being filled.
    pub tails: [Option<(usize, usize)>; 2],
}

/// Host copies: for each `(head, unit)` its page and its sorted absolute positions.
#[derive(Debug, Default)]
pub(crate) struct HostIndex {
    pub units: usize,
    pub pages: Vec<Option<HostPage>>,
    pub offsets: Vec<u32>,
    pub positions: Vec<u32>,
}

impl HostIndex {
    pub fn positions(&self, head: usize, unit: usize) -> &[u32] {
        let i = head * self.units + unit;
        &self.positions[self.offsets[i] as usize..self.offsets[i + 1] as usize]
    }
    pub fn page(&self, head: usize, unit: usize) -> Option<HostPage> {
        self.pages[head * self.units + unit]
    }
}

/// A recall request.
#[derive(Debug)]
pub(crate) struct Job {
    pub head: u32,
    pub unit: u32,
    pub src: HostPage,
    pub dst: DevicePage,
}

/// A recall that did not land.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Failure {
    pub head: u32,
    pub unit: u32,
}

#[derive(Debug, Default)]
pub(crate) struct Pending {
    pub per_layer: Vec<usize>,
    pub failures: Vec<Failure>,
}

pub(crate) struct Shared<T> {
    pub tier: Arc<T>,
    pub kv_heads: usize,
    pub page_rows: usize,
    pub layers: Vec<RwLock<Vec<HeadTables>>>,
    pub host: HostIndex,
    pub pending: Mutex<Pending>,
    pub done: Condvar,
}

impl<T: Tier> Shared<T> {
    /// Copies, waits, merges; always decrements the layer's pending count.
    fn execute(&self, job: Job) {
        let (head, unit) = (job.head as usize, job.unit as usize);
        let layer = head / self.kv_heads;
        let positions = self.host.positions(head, unit);
        let landed = match self.tier.copy_to_device(job.src, job.dst, positions.len()) {
            Ok((page, event)) => match event.wait() {
                Ok(()) => Ok(page),
                Err(error) => Err(MoveError { page, error }),
            },
            Err(e) => Err(e),
        };
        let ok = match landed {
            Ok(page) => {
                let first = page.index() * self.page_rows as u32;
                let mut tables = self.layers[layer].write();
                let t = &mut tables[head % self.kv_heads];
                t.lists[page.pool()].merge_in(positions, first);
                debug_assert!(t.recalled[unit].is_none());
                t.recalled[unit] = Some(page);
                true
            }
            Err(MoveError { page, .. }) => {
                self.tier.free_device(page);
                false
            }
        };
        let mut p = self.pending.lock();
        p.per_layer[layer] -= 1;
        if !ok {
            p.failures.push(Failure { head: job.head, unit: job.unit });
        }
        drop(p);
        self.done.notify_all();
    }

    /// Blocks until `pred(pending)` holds; `alive()` is polled so a dead worker is reported
    /// instead of waiting forever. Returns the outstanding count on failure.
    pub fn wait_until(
        &self,
        pred: impl Fn(&Pending) -> bool,
        alive: impl Fn() -> bool,
    ) -> Result<(), usize> {
        let mut p = self.pending.lock();
        while !pred(&p) {
            let timed_out = self.done.wait_for(&mut p, Duration::from_millis(20)).timed_out();
            if timed_out && !pred(&p) && !alive() {
                return Err(p.per_layer.iter().sum());
            }
        }
        Ok(())
    }
}

/// The recall worker: runs jobs until the channel closes.
///
/// Before the loop it waits once on the job channel with a short deadline. crossbeam
/// allocates lazily the first time a thread blocks (its per-thread context and the slot in
/// the channel's receiver list); when no job is queued yet, that one-time cost is paid here,
/// while the store is starting, instead of the first time the worker runs dry mid-decode.
/// Best effort: if jobs are already queued the wait returns at once without blocking.
pub(crate) fn worker_loop<T: Tier>(shared: Arc<Shared<T>>, jobs: Receiver<Job>) {
    match jobs.recv_timeout(Duration::from_millis(2)) {
        Ok(job) => shared.execute(job),
        Err(crossbeam::channel::RecvTimeoutError::Timeout) => {}
        Err(crossbeam::channel::RecvTimeoutError::Disconnected) => return,
    }
    for job in jobs {
        shared.execute(job);
    }
}
