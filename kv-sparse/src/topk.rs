//! Magnitude top-k selection: the pruning step of SWAN's hybrid cache.
//!
//! SWAN (method section, "The pruning process is based on magnitude"): when a vector leaves
//! the dense buffer, keep the k dimensions with the largest absolute values and discard the
//! rest. Selection is O(d) with no sort, no scratch and no data-dependent branches in its
//! loops. For non-NaN floats, `bits & 0x7fff_ffff` (the "key") orders exactly like `|x|`,
//! so the k-th largest key is found radix-style, fixing its bits from the top, each bit by
//! one vectorizable counting pass (`#{i : key_i ≥ candidate}`) and stopping early once
//! exactly k keys lie at or above the candidate (typically after ~12 passes for d ≤ 128).
//! One branch-free compaction pass then emits the indices ascending. Ties at the threshold
//! go to the lower index, so the result is a deterministic function of `x`.

use crate::{Error, Result};

/// Magnitudes as ordered integers: for non-NaN floats, `bits & 0x7fff_ffff` orders exactly
/// like `|x|` (and `-0.0` equals `0.0`).
#[inline(always)]
fn magnitude_key(x: f32) -> u32 {
    x.to_bits() & 0x7fff_ffff
}

const NAN_THRESHOLD: u32 = 0x7f80_0000;

/// Number of elements whose key is at least `threshold`. Counts in `u32` lanes so the loop
/// vectorizes (callers guarantee `x.len() < 2³²`).
#[inline(always)]
fn count_at_least(x: &[f32], threshold: u32) -> usize {
    let mut n = 0u32;
    for v in x {
        n += u32::from(magnitude_key(*v) >= threshold);
    }
    n as usize
}

/// The largest key (vectorizes).
fn max_key(x: &[f32]) -> u32 {
    x.iter().fold(0, |m, v| m.max(magnitude_key(*v)))
}

/// The selection for `1 ≤ k < x.len()` given the largest key `max`: `(t, ties)` such that
/// the kept set is every key `> t` plus the first `ties` keys `== t` (in index order).
fn threshold(x: &[f32], k: usize, max: u32) -> (u32, usize) {
    // Invariant: count(key ≥ t) ≥ k. Bits above the largest key's top bit stay 0.
    let mut t = 0u32;
    for bit in (0..32 - max.leading_zeros()).rev() {
        let candidate = t | (1 << bit);
        let count = count_at_least(x, candidate);
        if count >= k {
            t = candidate;
            if count == k {
                return (t - 1, 0); // exactly the keys ≥ t, i.e. all keys > t - 1
            }
        }
    }
    // t is now the k-th largest key itself; keep the lowest-index ties.
    (t, k - count_at_least(x, t + 1))
}

/// Appends to `out` (cleared) the indices of keys `> t` and of the first `ties` keys
/// `== t`, ascending, without branching on the data.
fn emit(x: &[f32], t: u32, mut ties: usize, out: &mut Vec<usize>) {
    out.clear();
    out.resize(x.len(), 0);
    let mut n = 0;
    for (i, v) in x.iter().enumerate() {
        let m = magnitude_key(*v);
        let tie = usize::from(m == t) & usize::from(ties > 0);
        out[n] = i;
        n += usize::from(m > t) | tie;
        ties -= tie;
    }
    out.truncate(n);
}

/// Writes into `out` the indices of the `k` entries of `x` with largest `|x|` (ties → lower
/// index), ascending. `k = 0` gives an empty list, `k = x.len()` all indices.
///
/// O(d) time (at most 33 vectorized passes and one compaction pass). Once `out`'s capacity reaches `x.len()`
/// the call does not allocate, so a reused `out` keeps hot paths allocation-free.
///
/// # Errors
/// [`Error::NonFinite`] when `x` contains a NaN (infinities are ordinary, largest
/// magnitudes); [`Error::KTooLarge`] when `k > x.len()`. On error `out` is left empty.
///
/// # Examples
/// ```
/// let mut idx = Vec::new();
/// kv_sparse::topk::top_k_magnitude(&[0.1, -3.0, 2.0, 0.5, -2.0], 3, &mut idx)?;
/// assert_eq!(idx, [1, 2, 4]); // |-2.0| ties |2.0|; both kept here
/// kv_sparse::topk::top_k_magnitude(&[1.0, -1.0, 1.0], 2, &mut idx)?;
/// assert_eq!(idx, [0, 1]); // ties -> lower index
/// # Ok::<(), kv_sparse::Error>(())
/// ```
pub fn top_k_magnitude(x: &[f32], k: usize, out: &mut Vec<usize>) -> Result<()> {
    out.clear();
    let d = x.len();
    if k > d {
        return Err(Error::KTooLarge { op: "top_k_magnitude", k, head_dim: d });
    }
    if x.len() > u32::MAX as usize {
        // Counting passes use u32 lanes; no head dimension comes near this.
        return Err(Error::HeadDimOutOfRange {
            op: "top_k_magnitude",
            head_dim: d,
            max: u32::MAX as usize,
        });
    }
    let max = max_key(x);
    if max > NAN_THRESHOLD {
        let position = x.iter().position(|v| v.is_nan()).unwrap_or_default();
        return Err(Error::NonFinite { op: "top_k_magnitude", position, value: x[position] });
    }
    if k == 0 {
        return Ok(());
    }
    if k == d {
        out.extend(0..d);
        return Ok(());
    }
    let (t, ties) = threshold(x, k, max);
    emit(x, t, ties, out);
    debug_assert_eq!(out.len(), k);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn edge_cases() {
        let mut out = vec![7];
        top_k_magnitude(&[1.0, 2.0], 0, &mut out).unwrap();
        assert!(out.is_empty());
        top_k_magnitude(&[1.0, -0.0, 2.0], 3, &mut out).unwrap();
        assert_eq!(out, [0, 1, 2]);
        top_k_magnitude(&[], 0, &mut out).unwrap();
        assert!(out.is_empty());
        assert!(matches!(top_k_magnitude(&[1.0], 2, &mut out), Err(Error::KTooLarge { .. })));
        assert!(matches!(
            top_k_magnitude(&[1.0, f32::NAN], 1, &mut out),
            Err(Error::NonFinite { position: 1, .. })
        ));
        top_k_magnitude(&[1.0, f32::NEG_INFINITY, 3.0], 1, &mut out).unwrap();
        assert_eq!(out, [1]);
    }

    #[test]
    fn zero_signs_tie() {
        let mut out = Vec::new();
        top_k_magnitude(&[-0.0, 0.0, 0.0, 1.0], 2, &mut out).unwrap();
        assert_eq!(out, [0, 3]);
    }
}
