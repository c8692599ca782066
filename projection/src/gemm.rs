//! Bounds-checked safe wrappers over `matrixmultiply`'s strided GEMM.
//!
//! Every dense product in the crate — second-moment accumulation (`XᵀX`, SWAN §4
//! calibration), absorption of `P_VO` (SWAN §4 / Appendix A.1 Lemma 2) and batched runtime
//! rotation by `P_QK` — goes through these two functions, so the one `unsafe` call site per
//! element type is checked here.

/// A strided read-only view of a `rows × cols` matrix inside a slice:
/// element `(r, c)` is `data[offset + r * rs + c * cs]`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct View<'a, T> {
    pub data: &'a [T],
    pub offset: usize,
    pub rs: usize,
    pub cs: usize,
}

impl<'a, T> View<'a, T> {
    /// Row-major contiguous view with `cols` columns, starting at `offset`.
    pub fn row_major(data: &'a [T], offset: usize, cols: usize) -> Self {
        Self { data, offset, rs: cols, cs: 1 }
    }

    /// The transpose of a row-major matrix with `cols` columns (no copy).
    pub fn transposed(data: &'a [T], offset: usize, cols: usize) -> Self {
        Self { data, offset, rs: 1, cs: cols }
    }
}

/// Asserts that every element of a `rows × cols` strided view lies inside `len`.
///
/// The callers build views from shapes they have already validated, so a failure here is
/// an internal bug, not bad user input; it panics rather than letting `unsafe` read out of
/// bounds.
fn assert_in_bounds(len: usize, offset: usize, rows: usize, cols: usize, rs: usize, cs: usize) {
    if rows == 0 || cols == 0 {
        return;
    }
    let last = (rows - 1)
        .checked_mul(rs)
        .and_then(|a| (cols - 1).checked_mul(cs).and_then(|b| a.checked_add(b)))
        .and_then(|x| x.checked_add(offset));
    assert!(
        matches!(last, Some(l) if l < len),
        "gemm view out of bounds: offset {offset}, {rows}×{cols}, strides ({rs},{cs}), len {len}"
    );
    assert!(
        isize::try_from(rs).is_ok() && isize::try_from(cs).is_ok(),
        "gemm stride overflows isize"
    );
}

macro_rules! gemm_fn {
    ($name:ident, $t:ty, $mm:path) => {
        /// `C = A·B + beta·C` for `A: m×k`, `B: k×n` and `C: m×n` (row stride `rsc`,
        /// column stride 1, starting at `c_offset`).
        #[allow(clippy::too_many_arguments)]
        pub(crate) fn $name(
            m: usize,
            k: usize,
            n: usize,
            a: View<'_, $t>,
            b: View<'_, $t>,
            beta: $t,
            c: &mut [$t],
            c_offset: usize,
            rsc: usize,
        ) {
            assert_in_bounds(a.data.len(), a.offset, m, k, a.rs, a.cs);
            assert_in_bounds(b.data.len(), b.offset, k, n, b.rs, b.cs);
            assert_in_bounds(c.len(), c_offset, m, n, rsc, 1);
            if m == 0 || n == 0 {
                return;
            }
            if k == 0 {
                for r in 0..m {
                    c[c_offset + r * rsc..][..n].iter_mut().for_each(|x| *x *= beta);
                }
                return;
            }
            let a_ptr = a.data[a.offset..].as_ptr();
            let b_ptr = b.data[b.offset..].as_ptr();
            let c_ptr = c[c_offset..].as_mut_ptr();
            // SAFETY: `assert_in_bounds` proved that every (row, col) element addressed by
            // the three views lies inside its slice, strides fit in isize, and `c` is a
            // unique `&mut` borrow so it cannot alias `a` or `b` (shared borrows).
            unsafe {
                $mm(
                    m,
                    k,
                    n,
                    1.0,
                    a_ptr,
                    a.rs as isize,
                    a.cs as isize,
                    b_ptr,
                    b.rs as isize,
                    b.cs as isize,
                    beta,
                    c_ptr,
                    rsc as isize,
                    1,
                );
            }
        }
    };
}

gemm_fn!(sgemm, f32, matrixmultiply::sgemm);
gemm_fn!(dgemm, f64, matrixmultiply::dgemm);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strided_product_matches_loops() {
        // A = 2×3 row-major, B = transpose of a 2×3 row-major (so 3×2).
        let a = [1.0f64, 2.0, 3.0, 4.0, 5.0, 6.0];
        let bt = [1.0f64, 0.0, -1.0, 2.0, 1.0, 0.5];
        let mut c = [1.0f64; 4];
        dgemm(2, 3, 2, View::row_major(&a, 0, 3), View::transposed(&bt, 0, 3), 1.0, &mut c, 0, 2);
        let want = [1.0 + (1.0 - 3.0), 1.0 + (2.0 + 2.0 + 1.5), 1.0 + (4.0 - 6.0), 1.0 + 16.0];
        assert_eq!(c, want);
    }

    #[test]
    #[should_panic(expected = "out of bounds")]
    fn out_of_bounds_view_panics_instead_of_reading() {
        let a = [0.0f32; 5];
        let mut c = [0.0f32; 4];
        sgemm(2, 3, 2, View::row_major(&a, 0, 3), View::row_major(&a, 0, 2), 0.0, &mut c, 0, 2);
    }
}
