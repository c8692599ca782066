//! A small persistent thread pool that runs one borrowed closure on every thread.
//!
//! A decode step is short (tens of microseconds to a few milliseconds per layer), so the
//! kernels cannot afford to spawn threads per call, and the steady-state decode path must
//! not allocate. [`ThreadPool::broadcast`] hands a *borrowed* `Fn(thread_index)` to the
//! parked workers, runs it on the calling thread too, and returns only when every thread
//! has finished — which is what makes lending a borrowed closure sound (the same contract
//! as a scoped thread, without the spawn). Work distribution (an atomic work-item counter)
//! is the caller's business.
//!
//! Waking a parked thread is a futex call that interrupts the sleeping core — tens of
//! microseconds on a virtual machine, as long as a layer's attention at a few thousand
//! tokens. So an idle worker first spins (yielding to any other runnable thread) for
//! [`ThreadPool::SPIN`] — longer than the rest of a decode layer takes — and the caller
//! spins while the workers finish; only then do they park, and a broadcast or a finished
//! worker calls into the kernel only when someone is parked. A worker stops spinning as soon
//! as another pool broadcasts: a batch of caches, each with its own pool, then keeps at most
//! the latest pool's workers spinning instead of one spinner per cache.
//!
//! One broadcast runs at a time: a pool may be shared (by reference) between the kernels
//! and other per-token work of a decode step — a model's one-row products run on the same
//! threads as its attention, so the workers are still spinning when the next call comes —
//! and concurrent broadcasts from several threads wait for one another. A job that
//! broadcasts on its own pool would wait for itself; it panics instead.
//!
//! No paper section: this is the execution substrate of the CPU kernels (SWAN's decode
//! step, method section and Appendix A.2, and WnW's gathered decode, §2.3).

use std::cell::Cell;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::error::{Error, Result};

/// Broadcasts with workers, over every pool of the process: a spinning worker parks when
/// another pool starts one.
static BROADCASTS: AtomicU64 = AtomicU64::new(0);

thread_local! {
    /// The pools (their `Shared` addresses) whose job this thread is running, innermost
    /// last — at most a few entries, so a fixed array without allocation.
    static RUNNING: Cell<[usize; 4]> = const { Cell::new([0; 4]) };
}

/// Marks this thread as running a job of the pool at `id` until dropped.
struct Running {
    previous: [usize; 4],
}

impl Running {
    /// Enters a job of pool `id`; `None` when this thread already runs one of its jobs.
    fn enter(id: usize) -> Option<Self> {
        let previous = RUNNING.get();
        if previous.contains(&id) {
            return None;
        }
        let mut now = previous;
        // A fifth nested pool forgets the outermost; only re-entry of the latest four is
        // then detected.
        now.rotate_left(1);
        now[3] = id;
        RUNNING.set(now);
        Some(Self { previous })
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        RUNNING.set(self.previous);
    }
}

/// A job as the workers see it: the borrowed closure with its lifetime erased.
#[derive(Clone, Copy)]
struct JobPtr(*const (dyn Fn(usize) + Sync + 'static));

// SAFETY: the pointee is `Sync`, so sharing the pointer between threads is sound; it is
// dereferenced only while `broadcast` keeps the closure alive (see `ThreadPool::broadcast`).
unsafe impl Send for JobPtr {}

#[derive(Default)]
struct State {
    /// Incremented once per broadcast; a worker runs each generation once.
    generation: u64,
    job: Option<JobPtr>,
    /// Workers that have not finished the current generation.
    pending: usize,
    /// A worker's closure panicked during the current generation.
    panicked: bool,
    shutdown: bool,
    /// Workers parked on `work`.
    parked: usize,
    /// The caller is parked on `done`.
    caller_parked: bool,
}

#[derive(Default)]
struct Shared {
    state: Mutex<State>,
    work: Condvar,
    done: Condvar,
    /// `generation`, bumped also at shutdown, readable by spinning workers without the lock.
    epoch: AtomicU64,
    /// `pending`, readable by the spinning caller without the lock.
    remaining: AtomicUsize,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // The state is plain counters, consistent between statements: a poisoned lock
        // (impossible here, closures run outside it) carries no broken invariant.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A fixed set of worker threads that each run the same borrowed closure per
/// [`broadcast`](ThreadPool::broadcast). Thread 0 is always the caller.
pub struct ThreadPool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
    /// Held for the whole of a broadcast, so broadcasts from several threads run one after
    /// the other (the workers serve one job at a time).
    gate: Mutex<()>,
}

impl std::fmt::Debug for ThreadPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ThreadPool").field("threads", &self.threads()).finish()
    }
}

impl ThreadPool {
    /// How long an idle worker, or a caller waiting for the workers, spins before parking.
    pub const SPIN: Duration = Duration::from_millis(2);

    /// A pool of `threads` threads in total: the caller plus `threads - 1` workers.
    ///
    /// # Errors
    /// [`Error::Threads`] if `threads == 0` or the OS refuses to start a worker.
    ///
    /// # Examples
    /// ```
    /// use std::sync::atomic::{AtomicUsize, Ordering};
    /// let pool = attn_kernels::ThreadPool::new(2)?;
    /// let hits = AtomicUsize::new(0);
    /// pool.broadcast(&|_thread| {
    ///     hits.fetch_add(1, Ordering::Relaxed);
    /// });
    /// assert_eq!(hits.load(Ordering::Relaxed), 2);
    /// # Ok::<(), attn_kernels::Error>(())
    /// ```
    pub fn new(threads: usize) -> Result<Self> {
        const OP: &str = "ThreadPool::new";
        if threads == 0 {
            return Err(Error::Threads { op: OP, threads, reason: "need at least one".into() });
        }
        let shared = Arc::new(Shared::default());
        let mut pool =
            Self { shared, workers: Vec::with_capacity(threads - 1), gate: Mutex::new(()) };
        for index in 1..threads {
            let shared = Arc::clone(&pool.shared);
            let handle = std::thread::Builder::new()
                .name(format!("attn-kernels-{index}"))
                .spawn(move || worker_loop(&shared, index))
                .map_err(|e| Error::Threads { op: OP, threads, reason: e.to_string() })?;
            pool.workers.push(handle);
        }
        Ok(pool)
    }

    /// Total threads, the caller included.
    pub fn threads(&self) -> usize {
        self.workers.len() + 1
    }

    /// Runs `job(t)` once on every thread `t ∈ 0..threads()` (0 = the calling thread) and
    /// returns when all have finished. Does not allocate. Broadcasts from several threads
    /// at once run one after the other.
    ///
    /// # Panics
    /// Re-raises (as a new panic) if `job` panicked on any thread; the pool stays usable.
    /// Panics if called from inside a job of the same pool (which would wait for itself).
    pub fn broadcast(&self, job: &(dyn Fn(usize) + Sync)) {
        let Some(_running) = Running::enter(Arc::as_ptr(&self.shared) as usize) else {
            panic!("ThreadPool::broadcast: called from inside a job of the same pool");
        };
        if self.workers.is_empty() {
            job(0);
            return;
        }
        // The job's closure outlives every worker's use of it only if no other broadcast
        // replaces `state.job` meanwhile.
        let _gate = self.gate.lock().unwrap_or_else(PoisonError::into_inner);
        let ptr: *const (dyn Fn(usize) + Sync + '_) = job;
        // SAFETY: only the lifetime bound of the trait object changes (same layout). The
        // erased pointer is dereferenced by workers strictly between reading it from
        // `state.job` and decrementing `state.pending`; `WaitForWorkers` (dropped on every
        // exit path of this function, unwinding included) blocks until `pending == 0` and
        // clears `state.job`, so `job` outlives every dereference.
        let ptr: *const (dyn Fn(usize) + Sync + 'static) = unsafe { std::mem::transmute(ptr) };
        let parked = {
            let mut st = self.shared.lock();
            st.job = Some(JobPtr(ptr));
            st.pending = self.workers.len();
            st.panicked = false;
            st.generation = st.generation.wrapping_add(1);
            self.shared.remaining.store(st.pending, Ordering::Release);
            self.shared.epoch.store(st.generation, Ordering::Release);
            st.parked
        };
        BROADCASTS.fetch_add(1, Ordering::Release);
        // A worker parks only after checking `generation` under the lock, so one that is
        // not counted in `parked` here sees the new generation without a notification.
        if parked > 0 {
            self.shared.work.notify_all();
        }
        let wait = WaitForWorkers(&self.shared);
        job(0);
        let worker_panicked = wait.finish();
        assert!(!worker_panicked, "ThreadPool::broadcast: a worker thread panicked");
    }
}

/// Blocks until every worker has finished the current generation (also while unwinding).
struct WaitForWorkers<'a>(&'a Shared);

impl WaitForWorkers<'_> {
    /// Waits, and reports whether a worker panicked.
    fn finish(self) -> bool {
        let panicked = self.wait();
        std::mem::forget(self);
        panicked
    }

    fn wait(&self) -> bool {
        spin_until(|| self.0.remaining.load(Ordering::Acquire) == 0);
        let mut st = self.0.lock();
        while st.pending > 0 {
            st.caller_parked = true;
            st = self.0.done.wait(st).unwrap_or_else(PoisonError::into_inner);
        }
        st.caller_parked = false;
        st.job = None;
        st.panicked
    }
}

impl Drop for WaitForWorkers<'_> {
    fn drop(&mut self) {
        self.wait();
    }
}

/// Spins until `ready()` or [`ThreadPool::SPIN`] has passed (yielding the core every few
/// checks, so a spinning thread does not starve a runnable one). The caller re-checks its
/// condition under the lock either way.
fn spin_until(ready: impl Fn() -> bool) {
    let start = Instant::now();
    let mut checks = 0u32;
    while !ready() {
        checks = checks.wrapping_add(1);
        if checks.is_multiple_of(64) {
            if start.elapsed() > ThreadPool::SPIN {
                return;
            }
            std::thread::yield_now();
        } else {
            std::hint::spin_loop();
        }
    }
}

fn worker_loop(shared: &Shared, index: usize) {
    let mut seen = 0u64;
    loop {
        let others = BROADCASTS.load(Ordering::Acquire);
        spin_until(|| {
            shared.epoch.load(Ordering::Acquire) != seen
                || BROADCASTS.load(Ordering::Acquire) != others
        });
        let job = {
            let mut st = shared.lock();
            while st.generation == seen && !st.shutdown {
                st.parked += 1;
                st = shared.work.wait(st).unwrap_or_else(PoisonError::into_inner);
                st.parked -= 1;
            }
            if st.shutdown {
                return;
            }
            seen = st.generation;
            st.job
        };
        let ok = job.is_none_or(|j| {
            // A worker serves one pool, so it is never inside a job of it here.
            let _running = Running::enter(std::ptr::from_ref(shared) as usize);
            // SAFETY: `broadcast` set `job` for this generation and keeps the closure alive
            // until this worker decrements `pending` below (see `ThreadPool::broadcast`).
            catch_unwind(AssertUnwindSafe(|| unsafe { (*j.0)(index) })).is_ok()
        });
        let mut st = shared.lock();
        st.panicked |= !ok;
        st.pending -= 1;
        shared.remaining.store(st.pending, Ordering::Release);
        if st.pending == 0 && st.caller_parked {
            shared.done.notify_all();
        }
    }
}

impl Drop for ThreadPool {
    fn drop(&mut self) {
        {
            let mut st = self.shared.lock();
            st.shutdown = true;
            self.shared.epoch.store(st.generation.wrapping_add(1), Ordering::Release);
        }
        self.shared.work.notify_all();
        for w in self.workers.drain(..) {
            // A worker never panics outside `catch_unwind`; a join error carries nothing
            // to report from a destructor.
            let _ = w.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn every_thread_runs_once_per_broadcast() {
        for threads in 1..=4 {
            let pool = ThreadPool::new(threads).unwrap();
            let seen: Vec<AtomicUsize> = (0..threads).map(|_| AtomicUsize::new(0)).collect();
            for _ in 0..50 {
                pool.broadcast(&|t| {
                    seen[t].fetch_add(1, Ordering::Relaxed);
                });
            }
            assert!(seen.iter().all(|s| s.load(Ordering::Relaxed) == 50), "threads={threads}");
        }
    }

    #[test]
    fn parked_and_spinning_workers_both_take_the_next_broadcast() {
        // Gaps shorter than the spin (workers still spinning), longer (workers parked), and
        // a slow worker (the caller spins, then parks until it is done).
        let pool = ThreadPool::new(3).unwrap();
        let hits = AtomicUsize::new(0);
        for round in 0..12u64 {
            pool.broadcast(&|t| {
                if t == 2 && round % 3 == 0 {
                    std::thread::sleep(ThreadPool::SPIN * 2);
                }
                hits.fetch_add(1, Ordering::Relaxed);
            });
            assert_eq!(hits.load(Ordering::Relaxed), 3 * (round as usize + 1));
            if round % 2 == 1 {
                std::thread::sleep(ThreadPool::SPIN * 3);
            }
        }
    }

    #[test]
    fn pools_taking_turns_each_run_every_broadcast() {
        // Each pool's broadcast stops the other's spinning worker, which must still wake
        // for its own pool's next broadcast.
        let pools = [ThreadPool::new(2).unwrap(), ThreadPool::new(2).unwrap()];
        let hits = [AtomicUsize::new(0), AtomicUsize::new(0)];
        for round in 0..40 {
            let p = round % 2;
            pools[p].broadcast(&|_| {
                hits[p].fetch_add(1, Ordering::Relaxed);
            });
        }
        assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 40));
    }

    #[test]
    fn broadcasts_from_several_threads_take_turns() {
        // Each caller's job must run exactly once on every thread, with its own borrowed
        // state, however the callers interleave.
        let pool = ThreadPool::new(3).unwrap();
        let rounds = 300;
        let counts: Vec<Vec<AtomicUsize>> =
            (0..3).map(|_| (0..3).map(|_| AtomicUsize::new(0)).collect()).collect();
        std::thread::scope(|s| {
            for mine in &counts {
                let pool = &pool;
                s.spawn(move || {
                    for _ in 0..rounds {
                        pool.broadcast(&|t| {
                            mine[t].fetch_add(1, Ordering::Relaxed);
                        });
                    }
                });
            }
        });
        for mine in &counts {
            assert!(mine.iter().all(|c| c.load(Ordering::Relaxed) == rounds));
        }
    }

    #[test]
    fn a_job_broadcasting_on_its_own_pool_panics_and_the_pool_survives() {
        for threads in [1, 2] {
            let pool = ThreadPool::new(threads).unwrap();
            for inner in 0..threads {
                let r = catch_unwind(AssertUnwindSafe(|| {
                    pool.broadcast(&|t| {
                        if t == inner {
                            pool.broadcast(&|_| {});
                        }
                    });
                }));
                assert!(r.is_err(), "threads={threads}, nested on thread {inner}");
            }
            // Another pool inside a job is fine.
            let other = ThreadPool::new(2).unwrap();
            let hits = AtomicUsize::new(0);
            pool.broadcast(&|_| {
                other.broadcast(&|_| {
                    hits.fetch_add(1, Ordering::Relaxed);
                });
            });
            assert_eq!(hits.load(Ordering::Relaxed), 2 * threads);
        }
    }

    #[test]
    fn borrowed_state_is_visible_after_return() {
        let pool = ThreadPool::new(3).unwrap();
        let mut out = vec![0usize; 3];
        {
            let cells: Vec<Mutex<&mut usize>> = out.iter_mut().map(Mutex::new).collect();
            pool.broadcast(&|t| **cells[t].lock().unwrap() = t + 10);
        }
        assert_eq!(out, vec![10, 11, 12]);
    }

    #[test]
    fn zero_threads_is_an_error() {
        assert!(matches!(ThreadPool::new(0), Err(Error::Threads { threads: 0, .. })));
    }

    #[test]
    fn worker_panic_is_reported_and_pool_survives() {
        let pool = ThreadPool::new(2).unwrap();
        let r = catch_unwind(AssertUnwindSafe(|| {
            pool.broadcast(&|t| assert_ne!(t, 1, "worker fails on purpose"));
        }));
        assert!(r.is_err());
        let hits = AtomicUsize::new(0);
        pool.broadcast(&|_| {
            hits.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(hits.load(Ordering::Relaxed), 2);
    }

    #[test]
    fn caller_panic_waits_for_workers() {
        let pool = ThreadPool::new(2).unwrap();
        let finished = AtomicUsize::new(0);
        let r = catch_unwind(AssertUnwindSafe(|| {
            pool.broadcast(&|t| {
                if t == 0 {
                    panic!("caller fails on purpose");
                }
                std::thread::sleep(std::time::Duration::from_millis(20));
                finished.fetch_add(1, Ordering::Relaxed);
            });
        }));
        assert!(r.is_err());
        // The worker had finished before broadcast unwound out of its frame.
        assert_eq!(finished.load(Ordering::Relaxed), 1);
    }
}
