//! SWAN's memory arithmetic for the reproduction (`papers/swan.txt`, "memory footprint",
//! Figure 2(a)): bytes per stored sparse vector (`3k+2` with 16-bit values, `2k+2` with
//! fp8, u8 indices, 2-byte offset) against `2·d_h` for a dense f16 vector, from
//! `kv_sparse::memory`; and the equal-budget rule the reproduction uses to compare 16-bit
//! and fp8 values: fp8 gets the `k'` with `2k'+2 ≤ 3k+2`, i.e. `k' = ⌊3k/2⌋` (capped at `d_h`).

use kv_sparse::ValueFormat;
use kv_sparse::memory::{dense_row_bytes, max_k_saving_memory, sparse_row_bytes};
use serde::Serialize;

use super::plot::Plot;
use super::report::{Table, num, pct};

/// The fp8 `k'` whose row costs at most a 16-bit row of `k` entries: `⌊3k/2⌋`, capped at
/// `head_dim`.
///
/// # Examples
/// ```
/// use kvtide::reproduce::memory::fp8_equal_budget_k;
/// assert_eq!(fp8_equal_budget_k(32, 64), 48); // 2·48+2 = 98 = 3·32+2
/// assert_eq!(fp8_equal_budget_k(19, 64), 28); // 58 ≤ 59
/// assert_eq!(fp8_equal_budget_k(48, 64), 64); // capped
/// ```
pub fn fp8_equal_budget_k(k: usize, head_dim: usize) -> usize {
    (3 * k / 2).min(head_dim)
}

/// One point of Figure 2(a).
#[derive(Clone, Copy, Debug, Serialize, PartialEq)]
pub struct BytesPoint {
    /// Head dimension.
    pub head_dim: usize,
    /// Kept entries.
    pub k: usize,
    /// `k / d_h`.
    pub retained: f64,
    /// Bytes of a sparse row with 16-bit values.
    pub bytes_16bit: usize,
    /// Bytes of a sparse row with fp8 values.
    pub bytes_fp8: usize,
    /// Bytes of a dense f16 row.
    pub bytes_dense: usize,
}

/// Figure 2(a)'s curve for one head dimension: every `k` in `1..=head_dim`.
pub fn bytes_per_vector(head_dim: usize) -> Vec<BytesPoint> {
    (1..=head_dim)
        .map(|k| BytesPoint {
            head_dim,
            k,
            retained: k as f64 / head_dim as f64,
            bytes_16bit: sparse_row_bytes(k, ValueFormat::F16, 1),
            bytes_fp8: sparse_row_bytes(k, ValueFormat::Fp8E4M3, 1),
            bytes_dense: dense_row_bytes(head_dim, ValueFormat::F16),
        })
        .collect()
}

/// The plot (memory ratio to dense f16 vs retained fraction, 16-bit and fp8, for each
/// head dimension) and a table of selected points with the memory break-even `k`.
pub fn figure(head_dims: &[usize]) -> (Plot, Table) {
    let mut plot = Plot::new(
        "fig2a_bytes_per_vector",
        "SWAN Fig. 2(a): bytes per stored vector / dense f16",
        "retained dimensions k / d_h",
        "memory ratio (sparse row / dense f16 row)",
    )
    .reference("dense f16", 1.0);
    let mut table = Table::new(
        "memory_bytes_per_vector",
        "Bytes per stored K or V vector (u8 indices, 2-byte offset) vs a dense f16 vector",
        &[
            "d_h",
            "k / d_h",
            "k",
            "16-bit: bytes (ratio)",
            "fp8: bytes (ratio)",
            "fp8 k' at equal budget",
        ],
    );
    for &d in head_dims {
        let curve = bytes_per_vector(d);
        let ratio = |b: usize| b as f64 / dense_row_bytes(d, ValueFormat::F16) as f64;
        plot = plot
            .series(
                &format!("16-bit values, d_h={d}"),
                curve.iter().map(|p| (p.retained, ratio(p.bytes_16bit))).collect(),
            )
            .series(
                &format!("fp8 values, d_h={d}"),
                curve.iter().map(|p| (p.retained, ratio(p.bytes_fp8))).collect(),
            );
        for frac in [1.0, 0.75, 0.5, 0.3] {
            let k = retained_k(frac, d);
            let p = curve[k - 1];
            table.row(vec![
                d.to_string(),
                num(frac, 2),
                k.to_string(),
                format!("{} ({})", p.bytes_16bit, num(ratio(p.bytes_16bit), 3)),
                format!("{} ({})", p.bytes_fp8, num(ratio(p.bytes_fp8), 3)),
                fp8_equal_budget_k(k, d).to_string(),
            ]);
        }
        for (label, fmt) in [("16-bit", ValueFormat::F16), ("fp8", ValueFormat::Fp8E4M3)] {
            if let Some(k) = max_k_saving_memory(d, fmt, 1, ValueFormat::F16) {
                table.note(format!(
                    "d_h = {d}, {label} values: memory breaks even below k = {} (retain < {} of the dimensions).",
                    k + 1,
                    pct((k + 1) as f64 / d as f64, 1)
                ));
            }
        }
    }
    (plot, table)
}

/// `k = round(frac · d_h)`, at least 1 (the grid's retention → kept entries).
///
/// # Examples
/// ```
/// use kvtide::reproduce::memory::retained_k;
/// assert_eq!(retained_k(0.3, 64), 19);
/// assert_eq!(retained_k(0.75, 64), 48);
/// ```
pub fn retained_k(frac: f64, head_dim: usize) -> usize {
    ((frac * head_dim as f64).round() as usize).clamp(1, head_dim)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paper_break_even_and_equal_budget() {
        // d_h = 128: 16-bit rows save memory only below 66 % retention ("prune over 34 %").
        let curve = bytes_per_vector(128);
        let first_saving = curve.iter().find(|p| p.bytes_16bit >= p.bytes_dense).map(|p| p.k);
        assert_eq!(first_saving, Some(85));
        assert_eq!(curve[63].bytes_16bit, 194);
        assert_eq!(curve[63].bytes_fp8, 130);
        for k in 1..=64 {
            let kp = fp8_equal_budget_k(k, 64);
            assert!(
                sparse_row_bytes(kp, ValueFormat::Fp8E4M3, 1)
                    <= sparse_row_bytes(k, ValueFormat::F16, 1)
            );
            if kp < 64 {
                assert!(
                    sparse_row_bytes(kp + 1, ValueFormat::Fp8E4M3, 1)
                        > sparse_row_bytes(k, ValueFormat::F16, 1)
                );
            }
        }
        let (plot, table) = figure(&[64, 128]);
        assert_eq!(plot.series.len(), 4);
        assert_eq!(table.rows.len(), 8);
    }
}
