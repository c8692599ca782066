//! Tests of the GPU path (SWAN §3 dense, sparse and hybrid decode; WnW §2.3 gathered decode
//! with anchor weights), written once over a decode device: every case runs on the CPU kernel
//! emulation (two plans: one split and many) and, when a GPU is present, on the GPU — all
//! compared to the f64 [`Reference`] the CPU kernels are tested against. Without a GPU the GPU
//! leg prints `SKIPPED: <reason>`.

use kv_sparse::fp8::Fp8E4M3;
use kv_sparse::hybrid::{HybridCache, HybridConfig};
use kv_sparse::{SparseIndex, Value, ValueFormat};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::*;
use crate::{AttnConfig, Error, Reference};

/// GPU (and emulation) vs the f64 reference, per value format: |got − want| ≤ tol·(1 + |want|).
/// Stored values decode exactly in every format on both sides (the kernels' fp8 decode is exact,
/// native or arithmetic), so the table only has to cover f32 summation order and `expf`.
const TOLERANCE: [(ValueFormat, f32); 4] = [
    (ValueFormat::F32, 2e-5),
    (ValueFormat::F16, 2e-5),
    (ValueFormat::Bf16, 2e-5),
    (ValueFormat::Fp8E4M3, 2e-5),
];

fn tolerance(f: ValueFormat) -> f32 {
    TOLERANCE.iter().find(|(g, _)| *g == f).map_or(1e-4, |(_, t)| *t)
}

/// The GPU if this build and machine have one; otherwise says why and returns `None`.
fn gpu_or_skip() -> Option<Gpu> {
    match Gpu::new() {
        Ok(g) => Some(g),
        Err(e) => {
            println!("SKIPPED: GPU leg of this test: {e}");
            None
        }
    }
}

fn devices() -> Vec<Box<dyn DecodeDevice>> {
    let mut d: Vec<Box<dyn DecodeDevice>> = vec![
        Box::new(KernelEmulation { target_blocks: 1 }),
        Box::new(KernelEmulation { target_blocks: 64 }),
    ];
    if let Some(g) = gpu_or_skip() {
        d.push(Box::new(g));
    }
    d
}

fn format_of(cache: &LayerCache<'_>) -> ValueFormat {
    cache
        .sparse()
        .map(|(k, _)| k.format)
        .or(cache.dense().map(|(k, _)| k.format))
        .unwrap_or(ValueFormat::F32)
}

/// Runs `cache` on every device and compares outputs (and gathered weights) to the reference.
fn check_case(what: &str, cfg: &AttnConfig, cache: LayerCache<'_>, seed: u64) {
    let mut rng = StdRng::seed_from_u64(seed);
    let q: Vec<f32> = (0..cfg.q_len()).map(|_| rng.random_range(-2.0..2.0)).collect();
    let gathered = matches!(cache, LayerCache::Gathered { .. });
    let n = q.len();
    let mut want = vec![0f32; n];
    let mut want_w = vec![0f32; if gathered { cache.total_rows() } else { 0 }];
    Reference.decode(cfg, &q, cache, &mut want, gathered.then_some(&mut want_w[..])).unwrap();
    let tol = tolerance(format_of(&cache));
    for dev in devices() {
        let mut got = vec![f32::NAN; n];
        let mut got_w = vec![f32::NAN; want_w.len()];
        dev.decode(cfg, &q, cache, &mut got, gathered.then_some(&mut got_w[..])).unwrap();
        for (i, (g, w)) in got.iter().zip(&want).chain(got_w.iter().zip(&want_w)).enumerate() {
            assert!(
                (g - w).abs() <= tol * (1.0 + w.abs()),
                "{what} on {}: element {i}: got {g}, want {w}",
                dev.describe()
            );
        }
    }
}

fn random_rows(rng: &mut StdRng, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.random_range(-1.5..1.5)).collect()
}

fn dense_layer<D: Value>(
    cfg: &AttnConfig,
    rows: usize,
    rng: &mut StdRng,
) -> (PackedDense, PackedDense) {
    let d = cfg.head_dim();
    let make = |rng: &mut StdRng| -> Vec<Vec<D>> {
        (0..cfg.kv_heads())
            .map(|_| random_rows(rng, rows * d).into_iter().map(D::from_f32).collect())
            .collect()
    };
    let (k, v) = (make(rng), make(rng));
    (PackedDense::from_rows(d, &pairs(&k)).unwrap(), PackedDense::from_rows(d, &pairs(&v)).unwrap())
}

fn pairs<D>(x: &[Vec<D>]) -> Vec<(&[D], &[D])> {
    x.iter().map(|h| (&h[..], &[][..])).collect()
}

fn hybrid_layer<I: SparseIndex, V: Value, D: Value>(
    cfg: &AttnConfig,
    rows: usize,
    buffer: usize,
    k: usize,
    seed: u64,
) -> PackedHybrid {
    let mut rng = StdRng::seed_from_u64(seed);
    let d = cfg.head_dim();
    let mut hybrid = HybridConfig::new(d, buffer, k);
    hybrid.rows_per_block = 16;
    let caches: Vec<HybridCache<I, V, D>> = (0..cfg.kv_heads())
        .map(|_| {
            let mut c = HybridCache::new(hybrid).unwrap();
            c.extend(&random_rows(&mut rng, rows * d), &random_rows(&mut rng, rows * d)).unwrap();
            c
        })
        .collect();
    let views: Vec<_> = caches.iter().map(|c| c.view()).collect();
    PackedHybrid::from_views(&views).unwrap()
}

const SHAPES: [(usize, usize, usize); 4] = [(4, 1, 64), (8, 8, 32), (12, 1, 40), (16, 2, 128)];

fn each_shape(mut f: impl FnMut(AttnConfig)) {
    for (q, kv, d) in SHAPES {
        f(AttnConfig::new(q, kv, d).unwrap());
    }
}

fn dense_cases<D: Value>() {
    let mut rng = StdRng::seed_from_u64(1);
    each_shape(|s| {
        for rows in [1, 37, 300] {
            let (k, v) = dense_layer::<D>(&s, rows, &mut rng);
            check_case(
                &format!("dense {} {s:?} L={rows}", D::FORMAT),
                &s,
                LayerCache::Dense { keys: &k, values: &v },
                rows as u64,
            );
        }
    });
}

#[test]
fn dense_matches_reference_for_every_format() {
    dense_cases::<f32>();
    dense_cases::<half::f16>();
    dense_cases::<half::bf16>();
}

fn sparse_cases<I: SparseIndex, V: Value>() {
    each_shape(|s| {
        for k in [0, 1, s.head_dim() / 2, s.head_dim()] {
            let p = hybrid_layer::<I, V, half::f16>(&s, 150, 0, k, k as u64);
            let cache = LayerCache::Sparse { keys: &p.keys, values: &p.values };
            check_case(&format!("sparse {}/{} {s:?} k={k}", V::FORMAT, I::BYTES), &s, cache, 3);
        }
    });
}

#[test]
fn sparse_matches_reference_for_every_format_and_index() {
    sparse_cases::<u8, half::f16>();
    sparse_cases::<u8, half::bf16>();
    sparse_cases::<u8, Fp8E4M3>();
    sparse_cases::<u8, f32>();
    sparse_cases::<u16, Fp8E4M3>();
    sparse_cases::<u16, f32>();
}

fn hybrid_cases<I: SparseIndex, V: Value, D: Value>() {
    each_shape(|s| {
        // (rows, buffer): buffer only, sparse only, both with a partial last tile.
        for (rows, buffer) in [(5, 16), (50, 0), (300, 16), (1, 1)] {
            let p = hybrid_layer::<I, V, D>(&s, rows, buffer, s.head_dim() / 2, rows as u64);
            check_case(
                &format!(
                    "hybrid {}/{}/{} {s:?} L={rows} b={buffer}",
                    V::FORMAT,
                    I::BYTES,
                    D::FORMAT
                ),
                &s,
                p.as_cache(),
                5,
            );
        }
    });
}

#[test]
fn hybrid_matches_reference_for_every_compiled_pair() {
    hybrid_cases::<u8, half::f16, half::f16>();
    hybrid_cases::<u8, half::bf16, half::bf16>();
    hybrid_cases::<u8, Fp8E4M3, half::f16>();
    hybrid_cases::<u8, Fp8E4M3, half::bf16>();
    hybrid_cases::<u8, f32, f32>();
    hybrid_cases::<u16, Fp8E4M3, half::f16>();
}

fn gathered_cases<D: Value>() {
    let mut rng = StdRng::seed_from_u64(9);
    each_shape(|s| {
        let cap = 200;
        let (mut k, mut v) = dense_layer::<D>(&s, cap, &mut rng);
        let lists: Vec<Vec<u32>> = (0..s.kv_heads())
            .map(|h| {
                (0..cap as u32)
                    .filter(|r| h == 0 && *r == 7 || h > 0 && r % (h as u32 + 1) == 0)
                    .collect()
            })
            .collect();
        let (mut pos, mut off) = (Vec::new(), vec![0u32]);
        for l in &lists {
            pos.extend_from_slice(l);
            off.push(pos.len() as u32);
        }
        k.gather = Some((pos.clone(), off.clone()));
        v.gather = Some((pos, off));
        check_case(
            &format!("gathered {} {s:?}", D::FORMAT),
            &s,
            LayerCache::Gathered { keys: &k, values: &v },
            11,
        );
    });
}

#[test]
fn gathered_matches_reference_with_anchor_weights() {
    gathered_cases::<f32>();
    gathered_cases::<half::f16>();
    gathered_cases::<half::bf16>();
}

#[test]
fn gathered_constructor_checks_slots_and_weights_sum_to_group_size() {
    let s = AttnConfig::new(4, 2, 8).unwrap();
    let arena: Vec<f32> = (0..8 * 10).map(|i| (i % 7) as f32 * 0.1).collect();
    let err = PackedDense::gathered::<f32>(8, &[&arena, &arena], &[&[0, 10], &[1]]).unwrap_err();
    assert!(matches!(err, Error::SlotOutOfRange { slot: 10, .. }), "{err:?}");
    let k = PackedDense::gathered::<f32>(8, &[&arena, &arena], &[&[0, 3, 9], &[1]]).unwrap();
    let q = vec![0.3f32; 32];
    let (mut out, mut w) = (vec![0f32; 32], vec![0f32; 4]);
    KernelEmulation { target_blocks: 8 }
        .decode(&s, &q, LayerCache::Gathered { keys: &k, values: &k }, &mut out, Some(&mut w))
        .unwrap();
    // Each q-head's weights sum to 1, so each kv-head's rows sum to its group size (2).
    assert!((w[..3].iter().sum::<f32>() - 2.0).abs() < 1e-5 && (w[3] - 2.0).abs() < 1e-5, "{w:?}");
}

#[test]
fn lossless_mode_hybrid_f32_full_k_equals_dense_attention() {
    let s = AttnConfig::new(8, 2, 64).unwrap();
    let (rows, d) = (333, 64);
    let p = hybrid_layer::<u8, f32, f32>(&s, rows, 16, d, 77);
    let mut rng = StdRng::seed_from_u64(77);
    // The same draws, in the same order, as `hybrid_layer` (per head: keys then values).
    let (mut keys, mut values) = (Vec::new(), Vec::new());
    for _ in 0..2 {
        keys.push(random_rows(&mut rng, rows * d));
        values.push(random_rows(&mut rng, rows * d));
    }
    let (dk, dv) = (
        PackedDense::from_rows(d, &pairs(&keys)).unwrap(),
        PackedDense::from_rows(d, &pairs(&values)).unwrap(),
    );
    let q = random_rows(&mut rng, 8 * d);
    let (mut sparse, mut dense) = (vec![0f32; 8 * d], vec![0f32; 8 * d]);
    Reference
        .decode(&s, &q, LayerCache::Dense { keys: &dk, values: &dv }, &mut dense, None)
        .unwrap();
    let mut devs = devices();
    devs.insert(0, Box::new(Reference));
    for dev in devs {
        dev.decode(&s, &q, p.as_cache(), &mut sparse, None).unwrap();
        for (a, b) in sparse.iter().zip(&dense) {
            assert!((a - b).abs() <= 1e-5 * (1.0 + b.abs()), "{}: {a} vs {b}", dev.describe());
        }
    }
}

#[test]
fn bad_inputs_are_typed_errors_on_every_device() {
    let s = AttnConfig::new(4, 2, 16).unwrap();
    let p = hybrid_layer::<u8, half::f16, half::f16>(&s, 40, 8, 8, 1);
    let mut out = vec![0f32; 64];
    let mut devs = devices();
    devs.push(Box::new(Reference));
    for dev in &devs {
        let mut q = vec![0.5f32; 64];
        q[17] = f32::NAN;
        let e = dev.decode(&s, &q, p.as_cache(), &mut out, None).unwrap_err();
        assert!(matches!(e, Error::NonFiniteQuery { q_head: 1, dim: 1, .. }), "{e:?}");
        let e = dev.decode(&s, &[0.0; 63], p.as_cache(), &mut out, None).unwrap_err();
        assert!(matches!(e, Error::LengthMismatch { what: "q", .. }), "{e:?}");
        let wide = AttnConfig::new(4, 2, 300).unwrap();
        let e =
            dev.decode(&wide, &[0.0; 1200], p.as_cache(), &mut vec![0.0; 1200], None).unwrap_err();
        assert!(matches!(e, Error::InvalidLayout { .. }), "{e:?}");
        let empty = hybrid_layer::<u8, half::f16, half::f16>(&s, 0, 8, 8, 1);
        let e = dev.decode(&s, &[0.0; 64], empty.as_cache(), &mut out, None).unwrap_err();
        assert!(matches!(e, Error::EmptyCache { kv_head: 0, .. }), "{e:?}");
        let e =
            dev.decode(&s, &[0.0; 64], p.as_cache(), &mut out, Some(&mut [0.0; 3])).unwrap_err();
        assert!(matches!(e, Error::Param { what: "weights", .. }), "{e:?}");
    }
}

#[test]
fn corrupt_csr_is_rejected_before_any_kernel_runs() {
    let s = AttnConfig::new(2, 1, 16).unwrap();
    let mut p = hybrid_layer::<u8, half::f16, half::f16>(&s, 40, 0, 8, 2);
    p.keys.indices[5] = 200; // index past head_dim
    let e = Reference.decode(&s, &[0.1; 32], p.as_cache(), &mut [0.0; 32], None).unwrap_err();
    assert!(matches!(e, Error::Param { what: "CSR index", .. }), "{e:?}");
    let mut p = hybrid_layer::<u8, half::f16, half::f16>(&s, 40, 0, 8, 2);
    p.keys.offsets[3] = 60_000; // row range past the head's entries
    let e = KernelEmulation { target_blocks: 4 }
        .decode(&s, &[0.1; 32], p.as_cache(), &mut [0.0; 32], None)
        .unwrap_err();
    assert!(matches!(e, Error::Param { what: "CSR row range", .. }), "{e:?}");
}

#[test]
fn unsupported_hybrid_pair_is_a_typed_error() {
    let s = AttnConfig::new(2, 1, 16).unwrap();
    let p = hybrid_layer::<u8, Fp8E4M3, f32>(&s, 40, 8, 8, 3);
    assert!(matches!(kernel_for(&p.as_cache()), Err(Error::GpuUnsupported { .. })));
}

/// Every entry point the launcher can ask for exists in both committed PTX modules of its
/// family, with the parameter count of its C signature.
#[test]
fn every_launchable_kernel_is_in_the_committed_ptx() {
    let mut names: Vec<(Family, String, usize)> = vec![
        (Family::Combine, COMBINE_KERNEL.into(), 6),
        (Family::Gathered, WEIGHTS_KERNEL.into(), 6),
    ];
    let mut rng = StdRng::seed_from_u64(4);
    let formats = [ValueFormat::F32, ValueFormat::F16, ValueFormat::Bf16];
    for f in formats {
        let d = bench::synthetic_dense(1, 4, 16, f, 1);
        let (fam, name) = kernel_for(&LayerCache::Dense { keys: &d, values: &d }).unwrap();
        names.push((fam, name, 3));
        let (fam, name) = kernel_for(&LayerCache::Gathered { keys: &d, values: &d }).unwrap();
        names.push((fam, name, 3));
    }
    for v in [ValueFormat::F32, ValueFormat::F16, ValueFormat::Bf16, ValueFormat::Fp8E4M3] {
        for ib in [1, 2] {
            let mut c = bench::synthetic_csr(1, 4, 16, 4, v, rng.random());
            c.index_bytes = ib;
            names.push((
                Family::Sparse,
                kernel_for(&LayerCache::Sparse { keys: &c, values: &c }).unwrap().1,
                3,
            ));
            for (pv, pb) in HYBRID_PAIRS.iter().filter(|(pv, _)| *pv == v) {
                let b = bench::synthetic_dense(1, 4, 16, *pb, 2);
                let cache =
                    LayerCache::Hybrid { keys: &c, values: &c, buffer_keys: &b, buffer_values: &b };
                assert_eq!(format_of(&cache), *pv);
                names.push((Family::Hybrid, kernel_for(&cache).unwrap().1, 5));
            }
        }
    }
    assert_eq!(names.len(), 2 + 6 + 8 + 10);
    for (fam, name, params) in names {
        for sm90 in [false, true] {
            let ptx = fam.ptx(sm90);
            let at = ptx
                .find(&format!(".entry {name}("))
                .unwrap_or_else(|| panic!("{name} missing from {fam:?} PTX"));
            let sig = &ptx[at..at + ptx[at..].find(')').unwrap()];
            assert_eq!(sig.matches(".param").count(), params, "{name}: {sig}");
        }
    }
}

/// The compute_90 PTX decodes fp8 with the native sm_89+ conversion, compute_80 arithmetically.
#[test]
fn fp8_decode_is_native_only_in_the_sm90_ptx() {
    assert!(Family::Sparse.ptx(true).contains("cvt.rn.f16x2.e4m3x2"));
    assert!(!Family::Sparse.ptx(false).contains("e4m3x2"));
}

#[test]
fn gpu_init_reports_why_it_is_unavailable() {
    match Gpu::new() {
        Ok(g) => println!("GPU present: {}", g.describe()),
        #[cfg(not(feature = "cuda"))]
        Err(e) => assert!(matches!(e, Error::CudaNotCompiled { .. }), "{e:?}"),
        #[cfg(feature = "cuda")]
        Err(e) => {
            assert!(
                matches!(
                    e,
                    Error::NoDevice { .. } | Error::Cuda { .. } | Error::GpuUnsupported { .. }
                ),
                "{e:?}"
            );
            println!("SKIPPED: no usable GPU: {e}");
        }
    }
}

#[test]
fn plan_covers_every_row_exactly_once() {
    for (rows, kv, blocks) in
        [(1, 1, 1), (129, 8, 528), (131_072, 8, 528), (5000, 3, 7), (100, 1, 100_000)]
    {
        let p = Plan::new(rows, kv, blocks);
        assert_eq!(p.rows_per_split % (TILE * WARPS), 0);
        assert!(
            p.n_splits * p.rows_per_split >= rows
                && (p.n_splits - 1) * p.rows_per_split < rows.max(1)
        );
        assert!(p.n_parts <= MAX_PARTS);
    }
    for g in [1, 4, 8, 9, 16, 17] {
        let passes: Vec<_> = group_passes(g).collect();
        assert_eq!(passes.iter().map(|p| p.1).sum::<usize>(), g);
        assert!(passes.iter().all(|p| p.1 <= MAX_GROUP_PASS));
    }
    assert!(Plan::shared_bytes(MAX_GROUP_PASS, MAX_HEAD_DIM) <= 48 * 1024);
}
