//! Page pools: which page indices of one arena or host pool are handed out and which are
//! free (WnW §2.3: the GPU portion and the CPU complement of the tidal heads, both cut into
//! pages). One [`PagePool`] serves every tier — the host tier's growable arenas and the
//! CUDA tier's fixed ones — so allocation, reuse and capacity accounting are written once.
//!
//! A pool owns only indices, never bytes: the tier keeps the page storage and asks the
//! pool for an index ([`PagePool::alloc`]), growing its storage when the index is
//! [`fresh`](PageGrant::fresh). Freed indices go to a free list and are reused, most recently
//! freed first, before the pool hands out an index it never gave before.

use parking_lot::Mutex;

/// An index handed out by [`PagePool::alloc`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PageGrant {
    /// The page index, unique among the pages in use.
    pub index: u32,
    /// `true` when the index was never handed out before (the storage behind it may need to
    /// grow); `false` when a freed page is reused.
    pub fresh: bool,
}

#[derive(Debug, Default)]
struct State {
    /// Freed indices, reused last-in first-out.
    free: Vec<u32>,
    /// Indices ever handed out: `0..next`.
    next: u32,
    /// `in_use[i]` for every `i < next`.
    in_use: Vec<bool>,
}

/// The free list of one arena's (or one host pool's) pages: hands out page indices up to an
/// optional capacity, takes them back, reuses freed ones first. Thread-safe.
///
/// # Examples
/// ```
/// use kv_tiered::tier::PagePool;
/// let pool = PagePool::new(Some(2));
/// let a = pool.alloc().unwrap();
/// let b = pool.alloc().unwrap();
/// assert!(a.fresh && b.fresh && a.index != b.index);
/// assert!(pool.alloc().is_none()); // capacity 2
/// assert!(pool.free(a.index));
/// assert!(!pool.free(a.index)); // a double free is refused
/// let c = pool.alloc().unwrap();
/// assert_eq!((c.index, c.fresh), (a.index, false)); // reused
/// assert_eq!(pool.in_use(), 2);
/// ```
#[derive(Debug)]
pub struct PagePool {
    capacity: Option<usize>,
    state: Mutex<State>,
}

impl PagePool {
    /// An empty pool of at most `capacity` pages (`None`: unlimited).
    pub fn new(capacity: Option<usize>) -> Self {
        Self { capacity, state: Mutex::new(State::default()) }
    }

    /// The page limit (`None`: unlimited).
    pub fn capacity(&self) -> Option<usize> {
        self.capacity
    }

    /// A free page index: the most recently freed one, else the next never-used one; `None`
    /// when every page up to the capacity is in use.
    pub fn alloc(&self) -> Option<PageGrant> {
        let mut s = self.state.lock();
        if let Some(index) = s.free.pop() {
            s.in_use[index as usize] = true;
            return Some(PageGrant { index, fresh: false });
        }
        if self.capacity.is_some_and(|c| s.next as usize >= c) || s.next == u32::MAX {
            return None;
        }
        let index = s.next;
        s.next += 1;
        s.in_use.push(true);
        Some(PageGrant { index, fresh: true })
    }

    /// Returns page `index` to the pool. Returns `false`, changing nothing, when the index is
    /// not in use (never handed out, or already freed): a double free can never give one page
    /// to two owners.
    pub fn free(&self, index: u32) -> bool {
        let mut s = self.state.lock();
        match s.in_use.get_mut(index as usize) {
            Some(used) if *used => {
                *used = false;
                s.free.push(index);
                true
            }
            _ => false,
        }
    }

    /// Reserves bookkeeping for `more` pages beyond those handed out so far, so that
    /// allocating them does not allocate memory. Returns the number of pages the pool then
    /// covers (handed out so far + `more`), for the tier to reserve its storage.
    pub fn reserve(&self, more: usize) -> usize {
        let mut guard = self.state.lock();
        let s = &mut *guard;
        let want = s.next as usize + more;
        s.free.reserve(want.saturating_sub(s.free.len()));
        s.in_use.reserve(want.saturating_sub(s.in_use.len()));
        want
    }

    /// Pages currently in use.
    pub fn in_use(&self) -> usize {
        let s = self.state.lock();
        s.next as usize - s.free.len()
    }

    /// Pages ever handed out (indices `0..high_water()`; in use or on the free list).
    pub fn high_water(&self) -> usize {
        self.state.lock().next as usize
    }

    /// Whether page `index` is in use.
    pub fn is_in_use(&self, index: u32) -> bool {
        self.state.lock().in_use.get(index as usize).copied().unwrap_or(false)
    }
}

#[cfg(test)]
mod tests {
    //! The pool's invariants against a model, and under concurrent allocation.

    use std::collections::BTreeSet;

    use proptest::prelude::*;

    use super::PagePool;

    /// One step of a random workload: allocate, or free the `n`-th held page (modulo), or
    /// free an arbitrary index (possibly never handed out or already free).
    #[derive(Clone, Debug)]
    enum Op {
        Alloc,
        FreeHeld(usize),
        FreeAny(u32),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            3 => Just(Op::Alloc),
            2 => any::<usize>().prop_map(Op::FreeHeld),
            1 => (0u32..40).prop_map(Op::FreeAny),
        ]
    }

    proptest! {
        /// Against a model (the set of held pages): no index is ever held twice, frees of
        /// pages not held are refused, `in_use` counts the held pages, allocation fails
        /// exactly at capacity, freed pages are reused (last freed first) before the pool
        /// grows, and a fresh index is always the high-water mark.
        #[test]
        fn pool_matches_a_model(
            capacity in prop::option::of(0usize..12),
            ops in prop::collection::vec(op(), 0..200),
        ) {
            let pool = PagePool::new(capacity);
            let mut held: BTreeSet<u32> = BTreeSet::new();
            let mut freed: Vec<u32> = Vec::new();
            let mut high = 0usize;
            for op in ops {
                match op {
                    Op::Alloc => match pool.alloc() {
                        Some(g) => {
                            prop_assert!(held.insert(g.index), "{} handed out twice", g.index);
                            if let Some(last) = freed.pop() {
                                prop_assert_eq!((g.index, g.fresh), (last, false));
                            } else {
                                prop_assert_eq!((g.index as usize, g.fresh), (high, true));
                                high += 1;
                            }
                        }
                        None => {
                            prop_assert!(freed.is_empty());
                            prop_assert_eq!(Some(held.len()), capacity);
                        }
                    },
                    Op::FreeHeld(n) => {
                        if let Some(&i) = held.iter().nth(n % held.len().max(1)) {
                            prop_assert!(pool.free(i));
                            held.remove(&i);
                            freed.push(i);
                            prop_assert!(!pool.free(i), "double free of {} accepted", i);
                        }
                    }
                    Op::FreeAny(i) => {
                        let was_held = held.remove(&i);
                        prop_assert_eq!(pool.free(i), was_held);
                        if was_held {
                            freed.push(i);
                        }
                    }
                }
                prop_assert_eq!(pool.in_use(), held.len());
                prop_assert_eq!(pool.high_water(), high);
                prop_assert!(capacity.is_none_or(|c| high <= c));
                for i in 0..high as u32 + 2 {
                    prop_assert_eq!(pool.is_in_use(i), held.contains(&i));
                }
            }
        }

        /// `reserve` reports the pages handed out so far plus the ones asked for and changes
        /// no accounting.
        #[test]
        fn reserve_covers_what_was_asked(allocs in 0usize..20, more in 0usize..50) {
            let pool = PagePool::new(None);
            for _ in 0..allocs {
                pool.alloc().unwrap();
            }
            prop_assert_eq!(pool.reserve(more), allocs + more);
            prop_assert_eq!((pool.in_use(), pool.high_water()), (allocs, allocs));
        }
    }

    #[test]
    fn concurrent_allocations_never_share_an_index() {
        let pool = PagePool::new(Some(4 * 260));
        let per_thread: Vec<Vec<u32>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..4)
                .map(|_| {
                    s.spawn(|| {
                        let mut mine = Vec::new();
                        for k in 0..500 {
                            let g = pool.alloc().expect("within capacity");
                            mine.push(g.index);
                            if k % 2 == 1 {
                                let i = mine.swap_remove(k % mine.len());
                                assert!(pool.free(i));
                            }
                        }
                        mine
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let all: Vec<u32> = per_thread.into_iter().flatten().collect();
        let distinct: BTreeSet<u32> = all.iter().copied().collect();
        assert_eq!(distinct.len(), all.len(), "an index is held by two threads");
        assert_eq!(pool.in_use(), all.len());
    }
}
