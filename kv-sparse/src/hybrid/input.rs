//! Input checks for appended K/V rows: lengths, non-finite policy and overflow limits.
//!
//! SWAN's cache is fed by model code; a NaN or an out-of-range value must be caught at
//! the door (method section, hybrid KV-cache), before any state changes, so that
//! `append`/`extend` are all-or-nothing.

use super::NonFinitePolicy;
use super::RowStore;
use crate::value::{check_overflow, max_magnitude_bits};
use crate::{Error, Result, Value};

/// Scans a row under `policy`: the largest finite magnitude and whether any element is
/// non-finite (only possible under [`NonFinitePolicy::Zero`]).
pub(crate) fn scan(policy: NonFinitePolicy, op: &'static str, row: &[f32]) -> Result<(f32, bool)> {
    let max = max_magnitude_bits(row);
    if max < 0x7f80_0000 {
        return Ok((f32::from_bits(max), false)); // all finite: the common, vectorized path
    }
    let mut max_abs = 0.0f32;
    let mut dirty = false;
    for (position, &value) in row.iter().enumerate() {
        if value.is_finite() {
            max_abs = max_abs.max(value.abs());
        } else if policy == NonFinitePolicy::Error {
            return Err(Error::NonFinite { op, position, value });
        } else {
            dirty = true;
        }
    }
    Ok((max_abs, dirty))
}

/// Copies `row` into `dst` with every non-finite element replaced by 0.
pub(crate) fn sanitize_into(row: &[f32], dst: &mut Vec<f32>) {
    dst.clear();
    dst.extend(row.iter().map(|&x| if x.is_finite() { x } else { 0.0 }));
}

/// Copies `row` into `dst` rounded through the dense format `D` (what a trip through the
/// dense buffer does to a row).
pub(crate) fn round_through<D: Value>(row: &[f32], dst: &mut Vec<f32>) {
    dst.clear();
    dst.extend(row.iter().map(|&x| D::from_f32(x).to_f32()));
}

/// Overflow limits of one cache: checks that a row whose largest magnitude is `max_abs`
/// fits the dense buffer (`D`) and, after the buffer's rounding and the scale, the sparse
/// rows (`S`). Rounding and division are monotone, so checking the maximum is exact.
pub(crate) fn check_limits<S: RowStore, D: Value>(
    op: &'static str,
    max_abs: f32,
    buffered: bool,
    keeps_entries: bool,
    scale: f32,
) -> Result<()> {
    let stored = if buffered {
        check_overflow::<D>(op, max_abs)?;
        D::from_f32(max_abs).to_f32()
    } else {
        max_abs
    };
    if keeps_entries {
        S::check_overflow(op, stored / scale)?;
    }
    Ok(())
}
