//! Magnitude top-k selection: the pruning step of SWAN's hybrid cache.
//!
//! SWAN (method section, "The pruning process is based on magnitude"): when a vector leaves
//! the dense buffer, keep the k dimensions with the largest absolute values and discard the
//! rest. Selection is O(d): a linear-time partition (`select_nth_unstable`) finds the k-th
//! largest magnitude, then one ordered pass emits the indices ascending — no sort. Ties at
//! the threshold go to the lower index, so the result is a deterministic function of `x`.

use crate::{Error, Result};

/// Magnitudes as ordered integers: for non-NaN floats, `bits & 0x7fff_ffff` orders exactly
/// like `|x|` (and `-0.0` equals `0.0`).
#[inline(always)]
fn magnitude_key(x: f32) -> u32 {
    x.to_bits() & 0x7fff_ffff
}

const NAN_THRESHOLD: u32 = 0x7f80_0000;

/// Writes into `out` the indices of the `k` entries of `x` with largest `|x|` (ties → lower
/// index), ascending. `k = 0` gives an empty list, `k = x.len()` all indices.
///
/// O(d) expected time. `out` doubles as scratch: once its capacity reaches `x.len()` the
/// call does not allocate, so a reused `out` keeps hot paths allocation-free.
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
    if let Some(position) = x.iter().position(|v| magnitude_key(*v) > NAN_THRESHOLD) {
        return Err(Error::NonFinite { op: "top_k_magnitude", position, value: x[position] });
    }
    if k == 0 {
        return Ok(());
    }
    if k == d {
        out.extend(0..d);
        return Ok(());
    }
    // Use `out` as the magnitude scratch, find the k-th largest key, then emit indices.
    out.extend(x.iter().map(|v| magnitude_key(*v) as usize));
    let (_, &mut threshold, _) = out.select_nth_unstable_by(k - 1, |a, b| b.cmp(a));
    let threshold = threshold as u32;
    let above = x.iter().filter(|v| magnitude_key(**v) > threshold).count();
    let mut ties_left = k - above;
    out.clear();
    for (i, v) in x.iter().enumerate() {
        let m = magnitude_key(*v);
        if m > threshold {
            out.push(i);
        } else if m == threshold && ties_left > 0 {
            out.push(i);
            ties_left -= 1;
        }
    }
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
