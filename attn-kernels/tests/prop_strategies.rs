//! Property tests over the exported strategies (`attn_kernels::strategies`): every optimized
//! engine equals the reference within `attn_kernels::accuracy`'s tolerance on random cases of
//! every kernel, format, index width and GQA layout (SWAN's sparse and hybrid decode, the dense
//! baseline, WnW's gathered decode with anchor weights, dense + sparse fp8 resident rows), and
//! the lossless hybrid cache equals dense attention.

mod common;

use std::cell::RefCell;

use attn_kernels::accuracy::{Kernel, LOSSLESS_RELATIVE, output_error, tolerance};
use attn_kernels::strategies::{
    Limits, dense_case, gathered_case, gathered_sparse_case, hybrid_case, lossless_hybrid_case,
    sparse_case,
};
use attn_kernels::{CpuAttention, DecodeAttention, GatheredSparseAttention, Reference};
use half::{bf16, f16};
use kv_sparse::fp8::Fp8E4M3;
use kv_sparse::{SparseIndex, Value};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};

/// Cases per property: every engine of the machine runs each one.
const CASES: u32 = 64;

fn runner() -> TestRunner {
    TestRunner::new(Config::with_cases(CASES))
}

/// Runs `f` on every engine of [`common::engines`] (shared across cases).
fn on_engines(
    engines: &RefCell<Vec<(String, CpuAttention)>>,
    mut f: impl FnMut(&str, &mut CpuAttention) -> Result<(), TestCaseError>,
) -> Result<(), TestCaseError> {
    for (name, e) in engines.borrow_mut().iter_mut() {
        f(name, e)?;
    }
    Ok(())
}

fn check(
    kernel: Kernel,
    format: kv_sparse::ValueFormat,
    got: &[f32],
    want: &[f32],
    bound: f32,
) -> Result<(), TestCaseError> {
    let tol = tolerance(kernel, format).output;
    let err = output_error(got, want, bound.max(1e-3));
    prop_assert!(err <= tol, "{kernel:?}/{format}: error {err:e} > {tol:e}");
    Ok(())
}

fn dense<D: Value>() {
    let engines = RefCell::new(common::engines());
    runner()
        .run(&dense_case::<D>(Limits::default()), |case| {
            let (kv, n) = (case.views(), case.cfg.q_len());
            let mut want = vec![0.0; n];
            Reference.dense(&case.cfg, &case.q, &kv, &mut want).unwrap();
            on_engines(&engines, |_, e| {
                let mut got = vec![f32::NAN; n];
                e.dense(&case.cfg, &case.q, &kv, &mut got).unwrap();
                check(Kernel::Dense, D::FORMAT, &got, &want, case.value_bound())
            })
        })
        .unwrap();
}

fn sparse<I: SparseIndex, V: Value>(limits: Limits) {
    let engines = RefCell::new(common::engines());
    runner()
        .run(&sparse_case::<I, V>(limits), |case| {
            let (kv, n) = (case.views(), case.cfg.q_len());
            let mut want = vec![0.0; n];
            Reference.sparse(&case.cfg, &case.q, &kv, &mut want).unwrap();
            on_engines(&engines, |_, e| {
                let mut got = vec![f32::NAN; n];
                e.sparse(&case.cfg, &case.q, &kv, &mut got).unwrap();
                check(Kernel::Sparse, V::FORMAT, &got, &want, case.value_bound())
            })
        })
        .unwrap();
}

fn hybrid<I: SparseIndex, V: Value, D: Value>(limits: Limits) {
    let engines = RefCell::new(common::engines());
    runner()
        .run(&hybrid_case::<I, V, D>(limits), |case| {
            let n = case.cfg.q_len();
            let mut want = vec![0.0; n];
            Reference.hybrid(&case.cfg, &case.q, &case.caches, &mut want).unwrap();
            let views = case.views();
            on_engines(&engines, |_, e| {
                let (mut got, mut via_views) = (vec![f32::NAN; n], vec![f32::NAN; n]);
                e.hybrid(&case.cfg, &case.q, &case.caches, &mut got).unwrap();
                e.hybrid(&case.cfg, &case.q, &views, &mut via_views).unwrap();
                prop_assert_eq!(&got, &via_views);
                check(Kernel::Hybrid, V::FORMAT, &got, &want, case.value_bound())
            })
        })
        .unwrap();
}

fn gathered<D: Value>() {
    let engines = RefCell::new(common::engines());
    let tol_w = tolerance(Kernel::Gathered, D::FORMAT).weights;
    runner()
        .run(&gathered_case::<D>(Limits::default()), |case| {
            let (kv, n, m) = (case.views(), case.cfg.q_len(), case.weights_len());
            let (mut want, mut want_w) = (vec![0.0; n], vec![0.0; m]);
            Reference.gathered(&case.cfg, &case.q, &kv, &mut want, Some(&mut want_w)).unwrap();
            on_engines(&engines, |name, e| {
                let (mut got, mut got_w) = (vec![f32::NAN; n], vec![f32::NAN; m]);
                e.gathered(&case.cfg, &case.q, &kv, &mut got, Some(&mut got_w)).unwrap();
                for (a, b) in got_w.iter().zip(&want_w) {
                    prop_assert!((a - b).abs() <= tol_w, "{name}: weight {a} vs {b}");
                }
                check(Kernel::Gathered, D::FORMAT, &got, &want, case.value_bound())
            })
        })
        .unwrap();
}

fn gathered_sparse<D: Value>() {
    let engines = RefCell::new(common::engines());
    let tol_w = tolerance(Kernel::GatheredSparse, D::FORMAT).weights;
    runner()
        .run(&gathered_sparse_case::<D>(Limits::default()), |case| {
            let ((dense, sparse), n, m) = (case.views(), case.cfg.q_len(), case.weights_len());
            let (mut want, mut want_w) = (vec![0.0; n], vec![0.0; m]);
            Reference
                .gathered_sparse(&case.cfg, &case.q, &dense, &sparse, &mut want, Some(&mut want_w))
                .unwrap();
            on_engines(&engines, |name, e| {
                let (mut got, mut got_w) = (vec![f32::NAN; n], vec![f32::NAN; m]);
                e.gathered_sparse(&case.cfg, &case.q, &dense, &sparse, &mut got, Some(&mut got_w))
                    .unwrap();
                for (a, b) in got_w.iter().zip(&want_w) {
                    prop_assert!((a - b).abs() <= tol_w, "{name}: weight {a} vs {b}");
                }
                check(Kernel::GatheredSparse, D::FORMAT, &got, &want, case.value_bound())
            })
        })
        .unwrap();
}

/// Head sizes above 256: the `u16` index path.
const WIDE: Limits = Limits { kv_heads: 2, group: 3, head_dim: 300, rows: 24 };

#[test]
fn dense_every_format() {
    dense::<f32>();
    dense::<f16>();
    dense::<bf16>();
    dense::<Fp8E4M3>();
}

#[test]
fn sparse_every_format_and_index() {
    sparse::<u8, f32>(Limits::default());
    sparse::<u8, f16>(Limits::default());
    sparse::<u8, bf16>(Limits::default());
    sparse::<u8, Fp8E4M3>(Limits::default());
    sparse::<u16, f16>(WIDE);
    sparse::<u16, Fp8E4M3>(WIDE);
}

#[test]
fn hybrid_every_format_and_index() {
    hybrid::<u8, f32, f32>(Limits::default());
    hybrid::<u8, f16, f16>(Limits::default());
    hybrid::<u8, bf16, bf16>(Limits::default());
    hybrid::<u8, Fp8E4M3, f16>(Limits::default());
    hybrid::<u8, Fp8E4M3, bf16>(Limits::default());
    hybrid::<u16, f16, f32>(WIDE);
}

#[test]
fn gathered_every_format_with_weights() {
    gathered::<f32>();
    gathered::<f16>();
    gathered::<bf16>();
    gathered::<Fp8E4M3>();
}

#[test]
fn gathered_sparse_every_dense_format_with_weights() {
    gathered_sparse::<f32>();
    gathered_sparse::<f16>();
    gathered_sparse::<bf16>();
}

#[test]
fn lossless_hybrid_is_dense_attention() {
    let engines = RefCell::new(common::engines());
    for limits in [Limits::default(), WIDE] {
        let run = |case: attn_kernels::strategies::HybridCase<u16, f32, f32>| {
            let dense = case.dense();
            let n = case.cfg.q_len();
            let (mut want, mut exact) = (vec![0.0; n], vec![0.0; n]);
            Reference.dense(&dense.cfg, &dense.q, &dense.views(), &mut want).unwrap();
            Reference.hybrid(&case.cfg, &case.q, &case.caches, &mut exact).unwrap();
            let scale = want.iter().fold(0.0f32, |m, x| m.max(x.abs())).max(1e-3);
            for (a, b) in exact.iter().zip(&want) {
                prop_assert!((a - b).abs() <= LOSSLESS_RELATIVE * scale, "reference: {a} vs {b}");
            }
            on_engines(&engines, |_, e| {
                let mut got = vec![f32::NAN; n];
                e.hybrid(&case.cfg, &case.q, &case.caches, &mut got).unwrap();
                let format = kv_sparse::ValueFormat::F32;
                check(Kernel::Hybrid, format, &got, &want, dense.value_bound())
            })
        };
        runner().run(&lossless_hybrid_case::<u16>(limits), run).unwrap();
    }
}
