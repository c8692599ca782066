//! Residency tables: for one kv-head and one pool, the sorted resident positions and the arena
//! row holding each (WnW §2.3: what the device holds after prefill, recall and release). These
//! are the lists attention kernels gather through; they are guarded by a per-layer
//! `parking_lot::RwLock` in the store and edited in place without allocating (capacity is
//! reserved at prefill for the whole prompt plus the configured decode length).

/// Sorted positions with their arena rows (parallel vectors).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PosRows {
    positions: Vec<u32>,
    rows: Vec<u32>,
}

impl PosRows {
    /// Empty lists with room for `capacity` entries.
    pub fn with_capacity(capacity: usize) -> Self {
        Self { positions: Vec::with_capacity(capacity), rows: Vec::with_capacity(capacity) }
    }
    /// Resident positions, strictly ascending.
    pub fn positions(&self) -> &[u32] {
        &self.positions
    }
    /// Arena row of each position.
    pub fn rows(&self) -> &[u32] {
        &self.rows
    }
    /// Number of resident positions.
    pub fn len(&self) -> usize {
        self.positions.len()
    }
    /// Whether nothing is resident.
    pub fn is_empty(&self) -> bool {
        self.positions.is_empty()
    }

    /// Appends `pos` (must exceed every resident position; checked in debug builds).
    pub fn push(&mut self, pos: u32, row: u32) {
        debug_assert!(self.positions.last().is_none_or(|&p| p < pos));
        self.positions.push(pos);
        self.rows.push(row);
    }

    /// Index range of the entries with positions in `lo..hi`.
    fn span(&self, lo: u32, hi: u32) -> std::ops::Range<usize> {
        let a = self.positions.partition_point(|&p| p < lo);
        let b = a + self.positions[a..].partition_point(|&p| p < hi);
        a..b
    }

    /// Inserts the sorted, currently absent `positions` with row ids `first_row + i`, in place:
    /// the tail is shifted once and the two sorted runs are merged from the back.
    pub fn merge_in(&mut self, positions: &[u32], first_row: u32) {
        let n = positions.len();
        if n == 0 {
            return;
        }
        let (lo, hi) = (positions[0], positions[n - 1] + 1);
        let range = self.span(lo, hi);
        let old_len = self.positions.len();
        self.positions.resize(old_len + n, 0);
        self.rows.resize(old_len + n, 0);
        self.positions.copy_within(range.end..old_len, range.end + n);
        self.rows.copy_within(range.end..old_len, range.end + n);
        // Merge [range] (old) with `positions` (new) into [range.start, range.end + n).
        let (mut i, mut j, mut w) = (range.end, n, range.end + n);
        while j > 0 {
            w -= 1;
            if i > range.start && self.positions[i - 1] > positions[j - 1] {
                i -= 1;
                self.positions[w] = self.positions[i];
                self.rows[w] = self.rows[i];
            } else {
                j -= 1;
                self.positions[w] = positions[j];
                self.rows[w] = first_row + j as u32;
            }
        }
    }

    /// Removes the entries with positions in `lo..hi` whose row lies in `rows`; returns how
    /// many were removed.
    pub fn remove_rows(&mut self, lo: u32, hi: u32, rows: std::ops::Range<u32>) -> usize {
        let range = self.span(lo, hi);
        let mut w = range.start;
        for r in range.clone() {
            if !rows.contains(&self.rows[r]) {
                self.positions[w] = self.positions[r];
                self.rows[w] = self.rows[r];
                w += 1;
            }
        }
        let removed = range.end - w;
        if removed > 0 {
            let len = self.positions.len();
            self.positions.copy_within(range.end..len, w);
            self.rows.copy_within(range.end..len, w);
            self.positions.truncate(len - removed);
            self.rows.truncate(len - removed);
        }
        removed
    }

    /// Number of resident positions in `lo..hi`.
    pub fn count_in(&self, lo: u32, hi: u32) -> usize {
        self.span(lo, hi).len()
    }
}

#[cfg(test)]
mod tests {
    //! Merging recalled rows into a residency list and removing them again keep the positions
    //! sorted and each paired with its arena row.

    use super::*;

    #[test]
    fn merge_and_remove_round_trip() {
        let mut t = PosRows::with_capacity(16);
        for (p, r) in [(0, 100), (3, 101), (5, 102), (9, 103), (20, 104)] {
            t.push(p, r);
        }
        t.merge_in(&[4, 6, 7], 200);
        assert_eq!(t.positions(), [0, 3, 4, 5, 6, 7, 9, 20]);
        assert_eq!(t.rows(), [100, 101, 200, 102, 201, 202, 103, 104]);
        t.merge_in(&[1, 30], 300);
        assert_eq!(t.positions(), [0, 1, 3, 4, 5, 6, 7, 9, 20, 30]);
        assert_eq!(t.remove_rows(0, 10, 200..203), 3);
        assert_eq!(t.positions(), [0, 1, 3, 5, 9, 20, 30]);
        assert_eq!(t.rows(), [100, 300, 101, 102, 103, 104, 301]);
        assert_eq!(t.remove_rows(0, 100, 300..302), 2);
        assert_eq!(t.positions(), [0, 3, 5, 9, 20]);
        assert_eq!(t.count_in(3, 10), 3);
    }
}
