//! Tests of the GPU path (SWAN §3 dense, sparse and hybrid decode over CSR or coded rows; the
//! dense quantized baselines; WnW §2.3 gathered decode with anchor weights), written once over
//! a decode device: every case runs on the CPU kernel emulation (two plans: one split and
//! many) and, when a GPU is present, on the GPU — all compared to the f64 [`Reference`] the
//! CPU kernels are tested against. Without a GPU the GPU leg prints `SKIPPED: <reason>`.

use kv_sparse::coded::{
    Bitmask, CodedStore, Elems, IndexCode, IndexKind, Int4Values, Int8Values, List, ValueCode,
    ValueKind,
};
use kv_sparse::fp8::Fp8E4M3;
use kv_sparse::hybrid::{CodedHybridCache, HybridCache, HybridConfig};
use kv_sparse::quant::{DenseCodec, DenseFormat, Fp8Rows, Int4Blocks, Int8Blocks, QuantRows};
use kv_sparse::{SparseIndex, Value, ValueFormat};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::*;
use crate::{
    AttnConfig, CodedHybridSource, EncodedAttention, Error, PrefixedCodedHybrid, QuantKv, Reference,
};

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

/// Tolerance of a cache: its value format's, or for quantized and coded caches the table's
/// entry for the codes' storage (every code decodes exactly, so again only summation order
/// and `expf` differ from the reference).
fn tolerance_of(cache: &LayerCache<'_>) -> f32 {
    if cache.quant().is_some() || cache.coded().is_some() {
        return QUANT_TOLERANCE;
    }
    tolerance(format_of(cache))
}

/// GPU (and emulation) vs the f64 reference for dense quantized and coded caches.
const QUANT_TOLERANCE: f32 = 2e-5;

/// Runs `cache` on every device and compares outputs (and gathered weights) to the reference.
fn query(cfg: &AttnConfig, seed: u64) -> Vec<f32> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..cfg.q_len()).map(|_| rng.random_range(-2.0..2.0)).collect()
}

fn check_case(what: &str, cfg: &AttnConfig, cache: LayerCache<'_>, seed: u64) {
    let q = query(cfg, seed);
    let gathered = matches!(cache, LayerCache::Gathered { .. });
    let n = q.len();
    let mut want = vec![0f32; n];
    let mut want_w = vec![0f32; if gathered { cache.total_rows() } else { 0 }];
    Reference.decode(cfg, &q, cache, &mut want, gathered.then_some(&mut want_w[..])).unwrap();
    let tol = tolerance_of(&cache);
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
    for f in [DenseFormat::Int8, DenseFormat::Int4, DenseFormat::Fp8] {
        let d = bench::synthetic_quant(1, 4, 32, f, 1);
        let (fam, name) = kernel_for(&LayerCache::Quant { keys: &d, values: &d }).unwrap();
        names.push((fam, name, 3));
    }
    for x in CODED_INDICES {
        for y in CODED_VALUES {
            let c = bench::synthetic_coded(1, 4, 16, 4, x, y, 1).unwrap();
            for f in CODED_BUFFERS {
                let b = bench::synthetic_dense(1, 4, 16, f, 2);
                let cache =
                    LayerCache::Coded { keys: &c, values: &c, buffer_keys: &b, buffer_values: &b };
                names.push((Family::Coded, kernel_for(&cache).unwrap().1, 5));
            }
        }
    }
    assert_eq!(names.len(), 2 + 6 + 8 + 10 + 3 + 18);
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
    for family in [Family::Sparse, Family::Quant, Family::Coded] {
        assert!(family.ptx(true).contains("cvt.rn.f16x2.e4m3x2"), "{family:?}");
        assert!(!family.ptx(false).contains("e4m3x2"), "{family:?}");
    }
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

// ---------------------------------------------------------------- dense quantized rows

/// GQA group 1, 4, 8 and 12 (two passes of the kernels' 8-head limit) at head_dim 64, 128,
/// 256 and 32 (one block per row).
const QUANT_SHAPES: [(usize, usize, usize); 4] =
    [(2, 2, 64), (8, 2, 128), (8, 1, 256), (12, 1, 32)];

/// One kv-head's quantized key and value rows: `rows` random rows (odd magnitudes, a few
/// all-zero rows so the codecs' scale-1 path is covered).
fn quant_rows<C: DenseCodec>(d: usize, rows: usize, rng: &mut StdRng) -> [QuantRows<C>; 2] {
    [(); 2].map(|_| {
        let mut q = QuantRows::<C>::new(d).unwrap();
        for r in 0..rows {
            let x: Vec<f32> = if r % 17 == 5 { vec![0.0; d] } else { random_rows(rng, d) };
            q.push(&x).unwrap();
        }
        q
    })
}

/// Every shape and length of `C`: the packed cache on every device vs the reference, and the
/// reference over the packed form vs the reference over kv-sparse's own views (so the packing
/// and its decoding are checked independently of the code that mirrors the kernels).
fn quant_cases<C: DenseCodec>(shapes: &[(usize, usize, usize)]) {
    let mut rng = StdRng::seed_from_u64(21);
    for &(qh, kvh, d) in shapes {
        let s = AttnConfig::new(qh, kvh, d).unwrap();
        for rows in [1, 31, 33, 300] {
            let heads: Vec<[QuantRows<C>; 2]> =
                (0..kvh).map(|_| quant_rows::<C>(d, rows, &mut rng)).collect();
            let kv: Vec<QuantKv<'_, C>> =
                heads.iter().map(|[k, v]| QuantKv::new(k.view(), v.view())).collect();
            let (k, v) = PackedQuant::pair(&kv).unwrap();
            let cache = LayerCache::Quant { keys: &k, values: &v };
            let what = format!("quant {} {s:?} L={rows}", C::FORMAT);
            let q = query(&s, rows as u64);
            let (mut packed, mut views) = (vec![0f32; q.len()], vec![0f32; q.len()]);
            Reference.decode(&s, &q, cache, &mut packed, None).unwrap();
            Reference.quantized(&s, &q, &kv, &mut views).unwrap();
            assert_eq!(packed, views, "{what}: packed vs kv-sparse views");
            check_case(&what, &s, cache, rows as u64);
        }
    }
}

#[test]
fn quant_int8_matches_reference_for_every_gqa_layout_and_length() {
    quant_cases::<Int8Blocks>(&QUANT_SHAPES);
}

#[test]
fn quant_int4_matches_reference_for_every_gqa_layout_and_length() {
    quant_cases::<Int4Blocks>(&QUANT_SHAPES);
}

#[test]
fn quant_fp8_matches_reference_including_odd_head_dims() {
    // fp8 rows take any head_dim: odd ones read codes bytewise, even ones in pairs.
    quant_cases::<Fp8Rows>(&[
        QUANT_SHAPES[0],
        QUANT_SHAPES[1],
        QUANT_SHAPES[2],
        (4, 1, 33),
        (8, 8, 7),
    ]);
}

#[test]
fn quant_rows_in_two_parts_pack_as_one() {
    let s = AttnConfig::new(4, 1, 64).unwrap();
    let mut rng = StdRng::seed_from_u64(5);
    let [pk, pv] = quant_rows::<Int8Blocks>(64, 40, &mut rng);
    let [k, v] = quant_rows::<Int8Blocks>(64, 9, &mut rng);
    let kv = [QuantKv::continuing((pk.view(), pv.view()), k.view(), v.view())];
    let (pk2, pv2) = PackedQuant::pair(&kv).unwrap();
    assert_eq!(pk2.rows, 49);
    let q = query(&s, 2);
    let (mut want, mut got) = (vec![0f32; 256], vec![0f32; 256]);
    Reference.quantized(&s, &q, &kv, &mut want).unwrap();
    for dev in devices() {
        dev.decode(&s, &q, LayerCache::Quant { keys: &pk2, values: &pv2 }, &mut got, None).unwrap();
        for (g, w) in got.iter().zip(&want) {
            assert!((g - w).abs() <= QUANT_TOLERANCE * (1.0 + w.abs()), "{}", dev.describe());
        }
    }
}

#[test]
fn corrupt_quantized_rows_are_typed_errors_before_any_kernel_runs() {
    let s = AttnConfig::new(2, 1, 32).unwrap();
    let k = bench::synthetic_quant(1, 10, 32, DenseFormat::Int8, 1);
    let v = bench::synthetic_quant(1, 10, 32, DenseFormat::Int8, 2);
    let run = |k: &PackedQuant, v: &PackedQuant| {
        KernelEmulation { target_blocks: 4 }
            .decode(&s, &[0.1; 64], LayerCache::Quant { keys: k, values: v }, &mut [0.0; 64], None)
            .unwrap_err()
    };
    let mut bad = k.clone();
    bad.data[34 * 3..34 * 3 + 2].copy_from_slice(&half::f16::ZERO.to_le_bytes()); // zero scale
    let e = run(&bad, &v);
    assert!(matches!(e, Error::Sparse(kv_sparse::Error::InvalidRowScale { row: 3, .. })), "{e:?}");
    let mut bad = k.clone();
    bad.data.pop();
    assert!(matches!(run(&bad, &v), Error::LengthMismatch { what: "quantized bytes", .. }));
    let other = bench::synthetic_quant(1, 10, 32, DenseFormat::Int4, 2);
    assert!(matches!(run(&k, &other), Error::Param { what: "quantized formats", .. }));
    let short = bench::synthetic_quant(1, 9, 32, DenseFormat::Int8, 2);
    assert!(matches!(run(&k, &short), Error::RowCountMismatch { .. }));
    let mut fp8 = bench::synthetic_quant(1, 10, 32, DenseFormat::Fp8, 2);
    fp8.data[2 + 5] = 0x7f; // an E4M3FN NaN code
    let e = run(&fp8, &fp8.clone());
    assert!(matches!(e, Error::Sparse(kv_sparse::Error::NonFinite { .. })), "{e:?}");
    let wide = AttnConfig::new(2, 1, 64).unwrap();
    let e = KernelEmulation { target_blocks: 4 }
        .decode(
            &wide,
            &[0.1; 128],
            LayerCache::Quant { keys: &k, values: &v },
            &mut [0.0; 128],
            None,
        )
        .unwrap_err();
    assert!(matches!(e, Error::HeadDimMismatch { .. }), "{e:?}");
}

// ---------------------------------------------------------------- coded hybrid rows

/// GQA group 1, 4, 8 and 12 at head_dim 64, 128, 256 and 36 (a mask with a partial last
/// byte, list indices not a multiple of 8).
const CODED_SHAPES: [(usize, usize, usize); 4] =
    [(2, 2, 64), (8, 2, 128), (8, 1, 256), (12, 1, 36)];

fn coded_layer<X: IndexCode, Y: ValueCode, D: Value>(
    cfg: &AttnConfig,
    rows: usize,
    buffer: usize,
    k: usize,
    seed: u64,
) -> Vec<CodedHybridCache<X, Y, D>> {
    let mut rng = StdRng::seed_from_u64(seed);
    let d = cfg.head_dim();
    let mut hybrid = HybridConfig::new(d, buffer, k);
    hybrid.rows_per_block = 16;
    if Y::KIND == ValueKind::Elems(ValueFormat::Fp8E4M3) {
        hybrid.fp8_scale = Some((0.5, 2.0)); // a per-head scale the kernels must apply
    }
    (0..cfg.kv_heads())
        .map(|_| {
            let mut c = CodedHybridCache::new(hybrid).unwrap();
            c.extend(&random_rows(&mut rng, rows * d), &random_rows(&mut rng, rows * d)).unwrap();
            c
        })
        .collect()
}

/// Packs `caches`, checks the reference over the packed form against the reference over
/// kv-sparse's own coded views, then every device against the reference.
fn check_coded<X: IndexCode, Y: ValueCode, D: Value, H: CodedHybridSource<X, Y, D>>(
    what: &str,
    s: &AttnConfig,
    caches: &[H],
    seed: u64,
) {
    let p = PackedCodedHybrid::from_sources(caches).unwrap();
    let q = query(s, seed);
    let (mut packed, mut views) = (vec![0f32; q.len()], vec![0f32; q.len()]);
    Reference.decode(s, &q, p.as_cache(), &mut packed, None).unwrap();
    Reference.coded_hybrid(s, &q, caches, &mut views).unwrap();
    for (a, b) in packed.iter().zip(&views) {
        assert!((a - b).abs() <= 1e-6 * (1.0 + b.abs()), "{what}: packed {a} vs kv-sparse {b}");
    }
    check_case(what, s, p.as_cache(), seed);
}

fn coded_cases<X: IndexCode, Y: ValueCode, D: Value>() {
    for (qh, kvh, d) in CODED_SHAPES {
        let s = AttnConfig::new(qh, kvh, d).unwrap();
        // (rows, buffer): empty history (buffer only), history only, both with partial last
        // tiles, one token, a history of one full tile plus one row.
        for (rows, buffer) in [(5, 16), (50, 0), (301, 16), (1, 1), (34, 1)] {
            let caches = coded_layer::<X, Y, D>(&s, rows, buffer, d / 2, rows as u64);
            let what =
                format!("coded {}/{}/{} {s:?} L={rows} b={buffer}", X::KIND, Y::KIND, D::FORMAT);
            check_coded(&what, &s, &caches, 5);
        }
    }
}

#[test]
fn coded_u8_list_matches_reference_for_every_value_code_and_buffer() {
    coded_cases::<List<u8>, Elems<Fp8E4M3>, half::f16>();
    coded_cases::<List<u8>, Int8Values, half::f16>();
    coded_cases::<List<u8>, Int4Values, half::f16>();
    coded_cases::<List<u8>, Elems<Fp8E4M3>, half::bf16>();
    coded_cases::<List<u8>, Int8Values, half::bf16>();
    coded_cases::<List<u8>, Int4Values, half::bf16>();
}

#[test]
fn coded_u16_list_matches_reference_for_every_value_code_and_buffer() {
    coded_cases::<List<u16>, Elems<Fp8E4M3>, half::f16>();
    coded_cases::<List<u16>, Int8Values, half::f16>();
    coded_cases::<List<u16>, Int4Values, half::bf16>();
}

#[test]
fn coded_bitmask_matches_reference_for_every_value_code_and_buffer() {
    coded_cases::<Bitmask, Elems<Fp8E4M3>, half::f16>();
    coded_cases::<Bitmask, Int8Values, half::f16>();
    coded_cases::<Bitmask, Int4Values, half::f16>();
    coded_cases::<Bitmask, Elems<Fp8E4M3>, half::bf16>();
    coded_cases::<Bitmask, Int8Values, half::bf16>();
    coded_cases::<Bitmask, Int4Values, half::bf16>();
}

#[test]
fn coded_rows_keeping_nothing_or_everything_match_reference() {
    let s = AttnConfig::new(8, 2, 64).unwrap();
    for k in [0, 2, 64] {
        let what = |x: &str| format!("coded {x} k={k}");
        check_coded(
            &what("mask/int4"),
            &s,
            &coded_layer::<Bitmask, Int4Values, half::f16>(&s, 70, 8, k, 1),
            3,
        );
        check_coded(
            &what("u8/int8"),
            &s,
            &coded_layer::<List<u8>, Int8Values, half::f16>(&s, 70, 8, k, 2),
            3,
        );
        check_coded(
            &what("mask/fp8"),
            &s,
            &coded_layer::<Bitmask, Elems<Fp8E4M3>, half::bf16>(&s, 70, 0, k, 3),
            3,
        );
    }
}

/// Rows of every length in one store: `k` from 0 to `head_dim` (even, for int4), so blocks
/// hold rows of many sizes and masks of every popcount.
fn coded_rows_of_every_k<X: IndexCode, Y: ValueCode>() {
    let s = AttnConfig::new(8, 2, 64).unwrap();
    let mut rng = StdRng::seed_from_u64(13);
    let stores: Vec<[CodedStore<X, Y>; 2]> = (0..2)
        .map(|_| {
            [(); 2].map(|_| {
                let mut st = CodedStore::<X, Y>::with_block_rows(64, 16).unwrap();
                for r in 0..133 {
                    st.push_dense(&random_rows(&mut rng, 64), (r * 2) % 66).unwrap();
                }
                st
            })
        })
        .collect();
    let buffer: Vec<Vec<half::bf16>> = (0..2)
        .map(|_| random_rows(&mut rng, 5 * 64).into_iter().map(half::bf16::from_f32).collect())
        .collect();
    let views: Vec<_> = stores
        .iter()
        .zip(&buffer)
        .map(|([k, v], b)| kv_sparse::hybrid::CodedHybridView {
            head_dim: 64,
            sparse_keys: k.view(),
            sparse_values: v.view(),
            buffer_keys: (&b[..], &[][..]),
            buffer_values: (&b[..], &[][..]),
            value_scale: (1.0, 1.0),
        })
        .collect();
    check_coded(&format!("coded {}/{} every k", X::KIND, Y::KIND), &s, &views, 7);
}

#[test]
fn coded_rows_of_every_length_in_one_store_match_reference() {
    coded_rows_of_every_k::<Bitmask, Int4Values>();
    coded_rows_of_every_k::<Bitmask, Int8Values>();
    coded_rows_of_every_k::<Bitmask, Elems<Fp8E4M3>>();
    coded_rows_of_every_k::<List<u8>, Int4Values>();
    coded_rows_of_every_k::<List<u16>, Int8Values>();
    coded_rows_of_every_k::<List<u8>, Elems<Fp8E4M3>>();
}

#[test]
fn coded_history_in_two_parts_packs_as_one() {
    let s = AttnConfig::new(4, 1, 64).unwrap();
    let mut rng = StdRng::seed_from_u64(8);
    let mut prefix =
        [(); 2].map(|_| CodedStore::<Bitmask, Int8Values>::with_block_rows(64, 16).unwrap());
    for p in &mut prefix {
        for _ in 0..37 {
            p.push_dense(&random_rows(&mut rng, 64), 20).unwrap();
        }
    }
    let cache = &coded_layer::<Bitmask, Int8Values, half::f16>(&s, 45, 8, 20, 9)[0];
    let src =
        [PrefixedCodedHybrid { prefix: (prefix[0].view(), prefix[1].view()), view: cache.view() }];
    let p = PackedCodedHybrid::from_sources(&src).unwrap();
    assert_eq!(p.keys.rows, 37 + 37);
    let q = query(&s, 4);
    let mut want = vec![0f32; q.len()];
    Reference.coded_hybrid(&s, &q, &src, &mut want).unwrap();
    for dev in devices() {
        let mut got = vec![f32::NAN; q.len()];
        dev.decode(&s, &q, p.as_cache(), &mut got, None).unwrap();
        for (g, w) in got.iter().zip(&want) {
            assert!(
                (g - w).abs() <= QUANT_TOLERANCE * (1.0 + w.abs()),
                "{}: {g} vs {w}",
                dev.describe()
            );
        }
    }
}

#[test]
fn corrupt_coded_rows_are_typed_errors_before_any_kernel_runs() {
    let s = AttnConfig::new(2, 1, 64).unwrap();
    let caches = coded_layer::<Bitmask, Int8Values, half::f16>(&s, 40, 4, 16, 6);
    let good = PackedCodedHybrid::from_sources(&caches).unwrap();
    let run = |p: &PackedCodedHybrid| {
        KernelEmulation { target_blocks: 4 }
            .decode(&s, &[0.1; 128], p.as_cache(), &mut [0.0; 128], None)
            .unwrap_err()
    };
    let (start, _) = good.keys.row_range(0, 3);
    let mut p = good.clone();
    p.keys.bytes[start] ^= 0x01; // popcount no longer matches the row's length
    let e = run(&p);
    assert!(matches!(e, Error::Sparse(kv_sparse::Error::MaskCountMismatch { .. })), "{e:?}");
    let mut p = good.clone();
    p.keys.bytes[start + 8..start + 10].copy_from_slice(&half::f16::INFINITY.to_le_bytes());
    let e = run(&p);
    assert!(matches!(e, Error::Sparse(kv_sparse::Error::InvalidRowScale { .. })), "{e:?}");
    let mut p = good.clone();
    p.keys.offsets[5] = 60_000; // row past its block
    let e = run(&p);
    assert!(matches!(e, Error::Sparse(kv_sparse::Error::InvalidCsr { .. })), "{e:?}");
    let mut p = good.clone();
    p.values.bytes.pop(); // the head's extent no longer ends at the byte count
    assert!(matches!(run(&p), Error::Param { what: "coded head extent", .. }));
    let mut p = good.clone();
    let n = p.values.bytes.len() as u64;
    p.values.block_base[p.values.n_blocks] += n; // head 0 claims twice the bytes there are
    p.values.head_base.push(2 * n);
    p.values.block_base.extend(std::iter::repeat_n(0, p.values.n_blocks + 1));
    p.values.offsets.extend(vec![0; p.values.rows]);
    assert!(matches!(p.values.check("test"), Err(Error::Param { what: "coded head extent", .. })));
    let mut p = good.clone();
    p.keys.head_base.push(0);
    assert!(matches!(run(&p), Error::LengthMismatch { what: "coded kv-heads", .. }));
    let mut p = good.clone();
    p.values.value = ValueKind::Int4;
    assert!(matches!(run(&p), Error::Param { what: "coded formats", .. } | Error::Sparse(_)));
    let mut p = good.clone();
    p.keys.scale = 0.0;
    assert!(matches!(run(&p), Error::InvalidValueScale { .. }));
    // A list whose indices are not ascending would double-count on the GPU: rejected.
    let lists = coded_layer::<List<u8>, Int8Values, half::f16>(&s, 40, 4, 16, 6);
    let mut p = PackedCodedHybrid::from_sources(&lists).unwrap();
    let (start, _) = p.keys.row_range(0, 2);
    p.keys.bytes[start + 1] = p.keys.bytes[start];
    let e = run(&p);
    assert!(matches!(e, Error::Sparse(kv_sparse::Error::InvalidSparseIndex { .. })), "{e:?}");
}

#[test]
fn unsupported_coded_combinations_are_typed_errors() {
    let s = AttnConfig::new(2, 1, 16).unwrap();
    let f32_buffer =
        PackedCodedHybrid::from_sources(&coded_layer::<Bitmask, Int8Values, f32>(&s, 40, 8, 8, 3))
            .unwrap();
    assert!(matches!(kernel_for(&f32_buffer.as_cache()), Err(Error::GpuUnsupported { .. })));
    let f16_values =
        PackedCodedHybrid::from_sources(&coded_layer::<List<u8>, Elems<half::f16>, half::f16>(
            &s, 40, 8, 8, 3,
        ))
        .unwrap();
    assert!(matches!(kernel_for(&f16_values.as_cache()), Err(Error::GpuUnsupported { .. })));
    // The emulation and the reference still read them (they are valid kv-sparse rows).
    check_case("coded u8/f16 values", &s, f16_values.as_cache(), 1);
}

/// The synthetic caches of the GPU benchmark are valid and attend like the reference.
#[test]
fn bench_synthetic_caches_pass_the_checks_and_match_reference() {
    let s = AttnConfig::new(8, 2, 128).unwrap();
    for f in [DenseFormat::Int8, DenseFormat::Int4, DenseFormat::Fp8] {
        let (k, v) =
            (bench::synthetic_quant(2, 70, 128, f, 1), bench::synthetic_quant(2, 70, 128, f, 2));
        check_case(&format!("bench quant {f}"), &s, LayerCache::Quant { keys: &k, values: &v }, 1);
    }
    let b = bench::synthetic_dense(2, 16, 128, ValueFormat::F16, 3);
    for x in CODED_INDICES {
        for y in CODED_VALUES {
            let k = bench::synthetic_coded(2, 90, 128, 64, x, y, 4).unwrap();
            let v = bench::synthetic_coded(2, 90, 128, 64, x, y, 5).unwrap();
            let cache =
                LayerCache::Coded { keys: &k, values: &v, buffer_keys: &b, buffer_values: &b };
            check_case(&format!("bench coded {x}/{y}"), &s, cache, 2);
        }
    }
    let e = bench::synthetic_coded(
        1,
        4,
        16,
        4,
        IndexKind::Bitmask,
        ValueKind::Elems(ValueFormat::F16),
        1,
    );
    assert!(matches!(e, Err(Error::GpuUnsupported { .. })));
}

#[test]
fn gpu_encoded_attention_matches_reference_or_skips() {
    let Some(mut gpu) = gpu_or_skip() else { return };
    let s = AttnConfig::new(8, 2, 128).unwrap();
    let caches = coded_layer::<Bitmask, Int4Values, half::f16>(&s, 200, 16, 64, 1);
    let q = query(&s, 1);
    let (mut got, mut want) = (vec![0f32; q.len()], vec![0f32; q.len()]);
    gpu.coded_hybrid(&s, &q, &caches, &mut got).unwrap();
    Reference.coded_hybrid(&s, &q, &caches, &mut want).unwrap();
    let mut rng = StdRng::seed_from_u64(2);
    let heads: Vec<[QuantRows<Int4Blocks>; 2]> =
        (0..2).map(|_| quant_rows(128, 99, &mut rng)).collect();
    let kv: Vec<_> = heads.iter().map(|[k, v]| QuantKv::new(k.view(), v.view())).collect();
    let (mut got2, mut want2) = (vec![0f32; q.len()], vec![0f32; q.len()]);
    gpu.quantized(&s, &q, &kv, &mut got2).unwrap();
    Reference.quantized(&s, &q, &kv, &mut want2).unwrap();
    for (g, w) in got.iter().zip(&want).chain(got2.iter().zip(&want2)) {
        assert!((g - w).abs() <= QUANT_TOLERANCE * (1.0 + w.abs()), "{g} vs {w}");
    }
}
