//! Bad input gets a typed error from the reference and the optimized kernels alike, and
//! leaves `out` untouched.

use attn_kernels::{
    AttnConfig, CpuAttention, DecodeAttention, DenseKv, Error, GatheredKv, Reference, SparseKv,
    synth,
};
use half::f16;
use kv_sparse::csr::CsrStore;
use kv_sparse::hybrid::{HybridCache, HybridConfig};

/// Recognises the expected error.
type Check = fn(&Error) -> bool;

/// Which implementation a check runs.
#[derive(Clone, Copy, Debug)]
enum Which {
    Reference,
    Cpu,
}

fn run_dense(
    w: Which,
    cfg: &AttnConfig,
    q: &[f32],
    kv: &[DenseKv<'_, f16>],
    out: &mut [f32],
) -> attn_kernels::Result<()> {
    match w {
        Which::Reference => Reference.dense(cfg, q, kv, out),
        Which::Cpu => CpuAttention::new(2)?.dense(cfg, q, kv, out),
    }
}

fn expect_dense_err(
    cfg: &AttnConfig,
    q: &[f32],
    kv: &[DenseKv<'_, f16>],
    out_len: usize,
    check: impl Fn(&Error) -> bool,
) {
    for w in [Which::Reference, Which::Cpu] {
        let mut out = vec![7.0f32; out_len];
        let err = run_dense(w, cfg, q, kv, &mut out).expect_err("bad input must fail");
        assert!(check(&err), "{w:?}: unexpected error {err}");
        assert!(out.iter().all(|&x| x == 7.0), "{w:?}: out written on error");
    }
}

#[test]
fn dense_shape_errors() {
    let cfg = AttnConfig::new(4, 2, 8).unwrap();
    let rows: Vec<f16> = synth::dense_rows(5, 8, 1);
    let good = DenseKv::new(8, &rows, &rows);
    let q = synth::values(32, 2);
    expect_dense_err(&cfg, &q[..31], &[good, good], 32, |e| {
        matches!(e, Error::LengthMismatch { what: "q", .. })
    });
    expect_dense_err(&cfg, &q, &[good, good], 31, |e| {
        matches!(e, Error::LengthMismatch { what: "out", .. })
    });
    expect_dense_err(&cfg, &q, &[good], 32, |e| {
        matches!(e, Error::LengthMismatch { what: "kv-head caches", .. })
    });
    let wrong_d = DenseKv::new(4, &rows, &rows);
    expect_dense_err(&cfg, &q, &[good, wrong_d], 32, |e| {
        matches!(e, Error::HeadDimMismatch { kv_head: 1, .. })
    });
    let ragged = DenseKv::new(8, &rows[..39], &rows);
    expect_dense_err(&cfg, &q, &[ragged, good], 32, |e| {
        matches!(e, Error::RaggedRows { kv_head: 0, .. })
    });
    let short = DenseKv::new(8, &rows, &rows[..32]);
    expect_dense_err(&cfg, &q, &[good, short], 32, |e| {
        matches!(e, Error::RowCountMismatch { keys: 5, values: 4, .. })
    });
    let empty = DenseKv::new(8, &rows[..0], &rows[..0]);
    expect_dense_err(&cfg, &q, &[good, empty], 32, |e| {
        matches!(e, Error::EmptyCache { kv_head: 1, .. })
    });
}

#[test]
fn non_finite_query_is_rejected() {
    let cfg = AttnConfig::new(4, 2, 8).unwrap();
    let rows: Vec<f16> = synth::dense_rows(5, 8, 1);
    let kv = [DenseKv::new(8, &rows, &rows), DenseKv::new(8, &rows, &rows)];
    for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
        let mut q = synth::values(32, 2);
        q[19] = bad;
        expect_dense_err(&cfg, &q, &kv, 32, |e| {
            matches!(e, Error::NonFiniteQuery { q_head: 2, dim: 3, .. })
        });
    }
}

#[test]
fn layout_and_scale_errors() {
    assert!(matches!(AttnConfig::new(0, 1, 8), Err(Error::InvalidLayout { .. })));
    assert!(matches!(AttnConfig::new(4, 0, 8), Err(Error::InvalidLayout { .. })));
    assert!(matches!(AttnConfig::new(4, 4, 0), Err(Error::InvalidLayout { .. })));
    assert!(matches!(AttnConfig::new(6, 4, 8), Err(Error::InvalidLayout { .. })));
    assert!(matches!(AttnConfig::new(4, 4, 70_000), Err(Error::InvalidLayout { .. })));
    let cfg = AttnConfig::new(4, 4, 8).unwrap();
    for s in [0.0, -1.0, f32::NAN, f32::INFINITY] {
        assert!(matches!(cfg.with_scale(s), Err(Error::InvalidScale { .. })), "{s}");
    }
    assert!(matches!(CpuAttention::new(0), Err(Error::Threads { .. })));
    assert!(matches!(CpuAttention::new(1).unwrap().with_split_rows(0), Err(Error::Param { .. })));
}

#[test]
fn sparse_errors() {
    let cfg = AttnConfig::new(2, 1, 16).unwrap();
    let q = synth::values(32, 3);
    let ks = synth::csr_store::<u8, f16>(16, 4, 8, 1).unwrap();
    let vs = synth::csr_store::<u8, f16>(16, 3, 8, 2).unwrap();
    let other_d = synth::csr_store::<u8, f16>(12, 4, 8, 3).unwrap();
    let empty = CsrStore::<u8, f16>::new(16).unwrap();
    let cases: Vec<(SparseKv<'_, u8, f16>, Check)> = vec![
        (SparseKv::new(ks.view(), vs.view()), |e| {
            matches!(e, Error::RowCountMismatch { part: "sparse", .. })
        }),
        (SparseKv::new(ks.view(), other_d.view()), |e| matches!(e, Error::HeadDimMismatch { .. })),
        (SparseKv::new(empty.view(), empty.view()), |e| matches!(e, Error::EmptyCache { .. })),
        (SparseKv { value_scale: 0.0, ..SparseKv::new(ks.view(), ks.view()) }, |e| {
            matches!(e, Error::InvalidValueScale { what: "value", .. })
        }),
        (SparseKv { key_scale: f32::NAN, ..SparseKv::new(ks.view(), ks.view()) }, |e| {
            matches!(e, Error::InvalidValueScale { what: "key", .. })
        }),
    ];
    for (kv, check) in cases {
        let mut out = vec![7.0; 32];
        let e = Reference.sparse(&cfg, &q, &[kv], &mut out).unwrap_err();
        assert!(check(&e), "reference: {e}");
        let e = CpuAttention::new(1).unwrap().sparse(&cfg, &q, &[kv], &mut out).unwrap_err();
        assert!(check(&e), "cpu: {e}");
        assert!(out.iter().all(|&x| x == 7.0));
    }
}

#[test]
fn hybrid_empty_is_an_error_but_empty_parts_are_not() {
    let cfg = AttnConfig::new(1, 1, 8).unwrap();
    let q = synth::values(8, 3);
    let empty = HybridCache::<u8, f16, f16>::new(HybridConfig::new(8, 4, 4)).unwrap();
    let mut out = vec![0.0; 8];
    let e = CpuAttention::new(1).unwrap().hybrid(&cfg, &q, &[empty], &mut out).unwrap_err();
    assert!(matches!(e, Error::EmptyCache { kv_head: 0, .. }), "{e}");
    let only_buffer = synth::hybrid_cache::<u8, f16, f16>(8, 4, 4, 3, 1).unwrap();
    let only_sparse = synth::hybrid_cache::<u8, f16, f16>(8, 0, 4, 3, 1).unwrap();
    for c in [only_buffer, only_sparse] {
        CpuAttention::new(1).unwrap().hybrid(&cfg, &q, &[c], &mut out).unwrap();
        assert!(out.iter().all(|x| x.is_finite()));
    }
}

#[test]
fn gathered_errors() {
    let cfg = AttnConfig::new(2, 1, 4).unwrap();
    let q = synth::values(8, 3);
    let slab: Vec<f32> = synth::values(5 * 4, 1);
    let cases: Vec<(GatheredKv<'_, f32>, Check)> = vec![
        (GatheredKv::new(4, &[1, 1], &slab, &slab), |e| {
            matches!(e, Error::PositionsNotAscending { row: 1, .. })
        }),
        (GatheredKv::new(4, &[1, 0], &slab, &slab), |e| {
            matches!(e, Error::PositionsNotAscending { .. })
        }),
        (GatheredKv::with_slots(4, &[1, 2], &[0, 5], &slab, &slab), |e| {
            matches!(e, Error::SlotOutOfRange { row: 1, slot: 5, slab_rows: 5, .. })
        }),
        (GatheredKv::with_slots(4, &[1, 2], &[0], &slab, &slab), |e| {
            matches!(e, Error::LengthMismatch { what: "slots", .. })
        }),
        (GatheredKv::new(4, &[1, 2, 3, 4, 5, 6], &slab, &slab), |e| {
            matches!(e, Error::LengthMismatch { .. })
        }),
        (GatheredKv::new(4, &[], &slab, &slab), |e| matches!(e, Error::EmptyCache { .. })),
        (GatheredKv::new(4, &[0], &slab[..19], &slab[..19]), |e| {
            matches!(e, Error::RaggedRows { .. })
        }),
    ];
    for (kv, check) in cases {
        let mut out = vec![7.0; 8];
        let e = Reference.gathered(&cfg, &q, &[kv], &mut out, None).unwrap_err();
        assert!(check(&e), "reference: {e}");
        let e =
            CpuAttention::new(1).unwrap().gathered(&cfg, &q, &[kv], &mut out, None).unwrap_err();
        assert!(check(&e), "cpu: {e}");
        assert!(out.iter().all(|&x| x == 7.0));
    }
    let kv = [GatheredKv::new(4, &[3, 9], &slab, &slab)];
    let mut w = vec![0.0; 3];
    let mut out = vec![0.0; 8];
    let e =
        CpuAttention::new(1).unwrap().gathered(&cfg, &q, &kv, &mut out, Some(&mut w)).unwrap_err();
    assert!(matches!(e, Error::LengthMismatch { what: "weights", expected: 2, got: 3, .. }), "{e}");
}

#[test]
fn unavailable_isa_is_an_error_not_ub() {
    use attn_kernels::Isa;
    for isa in [Isa::Avx512, Isa::Avx2Vbmi2, Isa::Avx2, Isa::Portable] {
        let r = CpuAttention::new(1).unwrap().with_isa(isa);
        assert_eq!(r.is_ok(), isa.is_available());
    }
}
