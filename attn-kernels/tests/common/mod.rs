//! Shared helpers of the kernel tests: engines to test, value bounds, tolerance checks.

#![allow(dead_code)]

use attn_kernels::accuracy::{Kernel, output_error, tolerance};
use attn_kernels::{AttnConfig, CpuAttention, Isa};
use kv_sparse::Value;
use kv_sparse::csr::CsrView;

/// The GQA layouts every kernel is tested on: (q-heads, kv-heads), group sizes
/// 1, 2, 3, 4, 5 (odd, 8 lanes), 8 and 12 (two lane blocks).
pub const LAYOUTS: [(usize, usize); 7] = [(2, 2), (4, 2), (3, 1), (8, 2), (5, 1), (8, 1), (12, 1)];

/// Every optimized engine this machine can run: each instruction set, on 1 and 2 threads,
/// with the default split and with small splits (many items to merge).
pub fn engines() -> Vec<(String, CpuAttention)> {
    let mut out = Vec::new();
    for isa in Isa::available() {
        for (threads, split) in [(1, CpuAttention::DEFAULT_SPLIT_ROWS), (2, 37)] {
            let e = CpuAttention::new(threads).unwrap().with_isa(isa).unwrap();
            let e = e.with_split_rows(split).unwrap();
            out.push((format!("{isa}/{threads}t/split{split}"), e));
        }
    }
    out
}

/// Largest |decoded value| of dense rows.
pub fn dense_bound<D: Value>(parts: &[&[D]]) -> f32 {
    parts.iter().flat_map(|p| p.iter()).map(|x| x.to_f32().abs()).fold(0.0, f32::max)
}

/// Largest |decoded value · scale| of a CSR view.
pub fn csr_bound<I: kv_sparse::SparseIndex, V: Value>(view: &CsrView<'_, I, V>, scale: f32) -> f32 {
    view.values().iter().map(|x| (x.to_f32() * scale).abs()).fold(0.0, f32::max)
}

/// Asserts `got` is within the table's tolerance of `want`.
pub fn assert_close(
    kernel: Kernel,
    format: kv_sparse::ValueFormat,
    got: &[f32],
    want: &[f32],
    bound: f32,
    what: &str,
) {
    let tol = tolerance(kernel, format).output;
    let err = output_error(got, want, bound.max(1e-3));
    assert!(err <= tol, "{what}: {kernel:?}/{format}: error {err:e} > tolerance {tol:e}");
}

/// A config for a layout and head dim.
pub fn cfg(layout: (usize, usize), d: usize) -> AttnConfig {
    AttnConfig::new(layout.0, layout.1, d).unwrap()
}
