//! The dense buffer of one hybrid cache: key and value [`DenseRing`]s moved in lockstep,
//! and the eviction step that feeds the sparse history.
//!
//! SWAN (method section, Algorithm 1): "When the buffer exceeds its capacity, the oldest
//! dense vectors are evicted, pruned, and added to the main sparse cache."

use super::RowStore;
use super::history::SparseHistory;
use super::input::round_through;
use crate::memory::MemoryReport;
use crate::ring::DenseRing;
use crate::{Result, Value};

/// Key and value rings plus the scratch rows used for eviction.
#[derive(Clone, Debug)]
pub(crate) struct DenseBuffer<D> {
    pub(crate) keys: DenseRing<D>,
    pub(crate) values: DenseRing<D>,
    evicted_key: Vec<f32>,
    evicted_value: Vec<f32>,
}

impl<D: Value> DenseBuffer<D> {
    /// A buffer of `capacity` rows with storage for `allocated` of them reserved now (see
    /// [`DenseRing::with_allocated`]).
    pub(crate) fn new(head_dim: usize, capacity: usize, allocated: usize) -> Self {
        Self {
            keys: DenseRing::with_allocated(head_dim, capacity, allocated),
            values: DenseRing::with_allocated(head_dim, capacity, allocated),
            evicted_key: Vec::with_capacity(head_dim),
            evicted_value: Vec::with_capacity(head_dim),
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.keys.len()
    }

    pub(crate) fn capacity(&self) -> usize {
        self.keys.capacity()
    }

    /// Appends one (key, value) pair, evicting the oldest pair into `sparse` when full
    /// (with capacity 0 the pair goes to `sparse` directly). All-or-nothing.
    pub(crate) fn push<S: RowStore>(
        &mut self,
        k: &[f32],
        v: &[f32],
        sparse: &mut SparseHistory<S>,
    ) -> Result<()> {
        if self.capacity() == 0 {
            return sparse.push(k, v);
        }
        if self.keys.is_full() {
            self.spill_oldest(sparse)?;
        }
        self.push_within_capacity(k, v);
        Ok(())
    }

    /// Moves the oldest buffered pair into `sparse`; the buffer keeps it on error.
    pub(crate) fn spill_oldest<S: RowStore>(
        &mut self,
        sparse: &mut SparseHistory<S>,
    ) -> Result<()> {
        if !self.keys.oldest_into(&mut self.evicted_key) {
            return Ok(());
        }
        self.values.oldest_into(&mut self.evicted_value);
        sparse.push(&self.evicted_key, &self.evicted_value)?;
        self.keys.pop_oldest();
        self.values.pop_oldest();
        Ok(())
    }

    /// Sends a pair to `sparse` exactly as if it had passed through the buffer: rounded
    /// to `D` first, unless the buffer has capacity 0 (then rows never touch it).
    pub(crate) fn spill_through<S: RowStore>(
        &mut self,
        k: &[f32],
        v: &[f32],
        sparse: &mut SparseHistory<S>,
    ) -> Result<()> {
        if self.capacity() == 0 {
            return sparse.push(k, v);
        }
        round_through::<D>(k, &mut self.evicted_key);
        round_through::<D>(v, &mut self.evicted_value);
        sparse.push(&self.evicted_key, &self.evicted_value)
    }

    /// Writes a pair as the newest rows (the caller ensured there is room or accepts
    /// overwriting the oldest).
    pub(crate) fn push_within_capacity(&mut self, k: &[f32], v: &[f32]) {
        self.keys.push_within_capacity(k);
        self.values.push_within_capacity(v);
    }

    pub(crate) fn clear(&mut self) {
        self.keys.clear();
        self.values.clear();
    }

    pub(crate) fn memory(&self) -> MemoryReport {
        let scratch = (self.evicted_key.capacity() + self.evicted_value.capacity()) * 4;
        let scratch = MemoryReport { capacity_slack_bytes: scratch, ..MemoryReport::default() };
        self.keys.memory() + self.values.memory() + scratch
    }
}
