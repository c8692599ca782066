//! Top-k selection over score slices, shared by prefill selection (§2.3), chunk selection
//! (§2.3 "Dynamic Chunk Selection"), the voice-score hit ratio (Appendix E) and the baselines.
//!
//! Order: larger score first, ties to the lower index (deterministic). Callers validate that
//! scores are finite; NaN would still give *a* deterministic order via `total_cmp`.

/// Writes into `out` the indices (offset by `base`) of the `k` largest entries of `scores`,
/// ascending by index. `k ≥ scores.len()` selects everything. `out` is cleared first; no
/// allocation happens once `out` has capacity `scores.len()`.
///
/// # Examples
/// ```
/// let mut out = Vec::new();
/// kv_tiered::topk::top_k_into(&[0.1, 0.7, 0.7, 0.3], 2, 10, &mut out);
/// assert_eq!(out, [11, 12]);
/// ```
pub fn top_k_into(scores: &[f32], k: usize, base: u32, out: &mut Vec<u32>) {
    out.clear();
    let n = scores.len();
    out.extend((0..n as u32).map(|i| base + i));
    if k < n {
        let cmp = |a: &u32, b: &u32| {
            let (sa, sb) = (scores[(a - base) as usize], scores[(b - base) as usize]);
            sb.total_cmp(&sa).then(a.cmp(b))
        };
        if k > 0 {
            out.select_nth_unstable_by(k - 1, cmp);
        }
        out.truncate(k);
        out.sort_unstable();
    }
}

/// Marks in `selected` (resized to `scores.len()`) the `k` largest entries; returns how many
/// were marked. Uses `order` as scratch.
pub fn top_k_mask(
    scores: &[f32],
    k: usize,
    order: &mut Vec<u32>,
    selected: &mut Vec<bool>,
) -> usize {
    top_k_into(scores, k, 0, order);
    selected.clear();
    selected.resize(scores.len(), false);
    for &i in order.iter() {
        selected[i as usize] = true;
    }
    order.len()
}
