//! The gathered kernel over a tiered store's dense *and* SWAN sparse fp8 rows
//! (`GatheredSparseAttention`): every optimized engine × dense format × GQA layout × edge
//! case against the reference, weights included; sparse rows with `k = d_h` against the
//! plain gathered kernel over the same rows decoded; bad input as typed errors; buffers
//! reserved up front (`CpuAttention::reserve`) change no result.

mod common;

use attn_kernels::accuracy::{Kernel, tolerance};
use attn_kernels::{
    AttnConfig, DecodeAttention, Error, GatheredKv, GatheredSparseAttention, GatheredSparseKv,
    Reference, SparseSlab, synth,
};
use common::{LAYOUTS, assert_close, cfg, dense_bound, engines};
use half::{bf16, f16};
use kv_sparse::Value;
use kv_sparse::fp8::Fp8E4M3;

/// One kv-head's data: dense slab, sparse key/value slabs, position lists and slots.
struct Head<D> {
    keys: Vec<D>,
    values: Vec<D>,
    dense_pos: Vec<u32>,
    dense_slots: Vec<u32>,
    sk: Vec<u8>,
    sv: Vec<u8>,
    sparse_pos: Vec<u32>,
    sparse_slots: Vec<u32>,
}

/// A case: `nd` dense and `ns` sparse resident rows interleaved in position, `k` kept
/// dims (keys, values), slabs larger than the lists with scrambled slots.
#[derive(Clone, Copy, Debug)]
struct Case {
    d: usize,
    nd: usize,
    ns: usize,
    k: (usize, usize),
}

const SCALES: (f32, f32) = (0.5, 1.25);

fn head<D: Value>(c: Case, seed: u64) -> Head<D> {
    let (dslab, sslab) = (c.nd + 3, c.ns + 2);
    let slots = |n: usize, slab: usize| -> Vec<u32> {
        (0..n as u32).map(|i| (i * 5 + 1) % slab as u32).collect()
    };
    // Every third position sparse (while both lists last): the two lists interleave.
    let (mut dense_pos, mut sparse_pos) = (Vec::new(), Vec::new());
    let mut p = 7u32;
    while dense_pos.len() < c.nd || sparse_pos.len() < c.ns {
        let to_sparse = sparse_pos.len() < c.ns && (p.is_multiple_of(3) || dense_pos.len() == c.nd);
        if to_sparse {
            sparse_pos.push(p)
        } else {
            dense_pos.push(p)
        }
        p += 1 + (p % 2);
    }
    Head {
        keys: synth::dense_rows(dslab, c.d, seed),
        values: synth::dense_rows(dslab, c.d, seed + 1),
        dense_slots: slots(c.nd, dslab),
        dense_pos,
        sk: synth::sparse_slab(sslab, c.d, c.k.0, SCALES.0, seed + 2).unwrap(),
        sv: synth::sparse_slab(sslab, c.d, c.k.1, SCALES.1, seed + 3).unwrap(),
        sparse_slots: slots(c.ns, sslab),
        sparse_pos,
    }
}

/// The views of kv-head `h` (even heads through slot tables, odd heads compact).
fn views<D: Value>(h: usize, x: &Head<D>, c: Case) -> (GatheredKv<'_, D>, GatheredSparseKv<'_>) {
    let (sk, sv) =
        (SparseSlab::new(&x.sk, c.k.0, SCALES.0), SparseSlab::new(&x.sv, c.k.1, SCALES.1));
    if h.is_multiple_of(2) {
        (
            GatheredKv::with_slots(c.d, &x.dense_pos, &x.dense_slots, &x.keys, &x.values),
            GatheredSparseKv::with_slots(c.d, &x.sparse_pos, &x.sparse_slots, sk, sv),
        )
    } else {
        (
            GatheredKv::new(c.d, &x.dense_pos, &x.keys, &x.values),
            GatheredSparseKv::new(c.d, &x.sparse_pos, sk, sv),
        )
    }
}

/// Largest |decoded value · scale| of a slab.
fn slab_bound(bytes: &[u8], k: usize, scale: f32) -> f32 {
    let codes = bytes.chunks(2 * k.max(1)).flat_map(|r| r.get(k..).unwrap_or(&[]));
    codes.map(|&c| (Fp8E4M3::from_bits(c).to_f32() * scale).abs()).fold(0.0, f32::max)
}

fn check_case<D: Value>(layout: (usize, usize), c: Case, seed: u64) {
    let cfg = cfg(layout, c.d);
    let heads: Vec<Head<D>> = (0..layout.1 as u64).map(|h| head(c, seed + 10 * h)).collect();
    let (dense, sparse): (Vec<_>, Vec<_>) =
        heads.iter().enumerate().map(|(h, x)| views(h, x, c)).unzip();
    let rows = layout.1 * (c.nd + c.ns);
    let bound = heads
        .iter()
        .map(|x| dense_bound(&[&x.values]).max(slab_bound(&x.sv, c.k.1, SCALES.1)))
        .fold(0.0, f32::max);
    let q = synth::values(cfg.q_len(), seed + 99);
    let (mut want, mut want_w) = (vec![0.0; cfg.q_len()], vec![0.0; rows]);
    Reference.gathered_sparse(&cfg, &q, &dense, &sparse, &mut want, Some(&mut want_w)).unwrap();
    let tol_w = tolerance(Kernel::GatheredSparse, D::FORMAT).weights;
    for (name, mut e) in engines() {
        let (mut got, mut got_w) = (vec![f32::NAN; cfg.q_len()], vec![f32::NAN; rows]);
        e.gathered_sparse(&cfg, &q, &dense, &sparse, &mut got, Some(&mut got_w)).unwrap();
        let what = format!("{name} {layout:?} {c:?}");
        assert_close(Kernel::GatheredSparse, D::FORMAT, &got, &want, bound, &what);
        for (a, b) in got_w.iter().zip(&want_w) {
            assert!((a - b).abs() <= tol_w, "{what}: weight {a} vs {b}");
        }
        let mut plain = vec![f32::NAN; cfg.q_len()];
        e.gathered_sparse(&cfg, &q, &dense, &sparse, &mut plain, None).unwrap();
        assert_eq!(plain, got, "{what}: weights must not change the output");
        e.reserve(&cfg, 5000);
        let (mut again, mut again_w) = (vec![f32::NAN; cfg.q_len()], vec![f32::NAN; rows]);
        e.gathered_sparse(&cfg, &q, &dense, &sparse, &mut again, Some(&mut again_w)).unwrap();
        assert_eq!((again, again_w), (got, got_w), "{what}: reserve must not change results");
    }
    for per_head in want_w.chunks(c.nd + c.ns) {
        let total: f32 = per_head.iter().sum();
        assert!((total - cfg.group_size() as f32).abs() < 1e-4, "weights sum to the group");
    }
}

fn edge_cases<D: Value>(layout: (usize, usize), seed: u64) {
    let cases = [
        Case { d: 64, nd: 40, ns: 70, k: (32, 32) }, // typical, both parts
        Case { d: 128, nd: 5, ns: 90, k: (64, 16) }, // mostly sparse, mixed k
        Case { d: 64, nd: 0, ns: 33, k: (16, 48) },  // no dense rows
        Case { d: 32, nd: 20, ns: 0, k: (8, 8) },    // no sparse rows
        Case { d: 32, nd: 0, ns: 1, k: (32, 32) },   // L = 1, k = d
        Case { d: 64, nd: 3, ns: 30, k: (0, 8) },    // k = 0 keys
        Case { d: 24, nd: 9, ns: 12, k: (24, 0) },   // k = 0 values, d % 8 ≠ 0
        Case { d: 256, nd: 2, ns: 9, k: (256, 100) }, // the widest u8 head
    ];
    for (j, c) in cases.into_iter().enumerate() {
        check_case::<D>(layout, c, seed + 100 * j as u64);
    }
}

#[test]
fn every_dense_format_layout_and_edge_case() {
    for (i, &layout) in LAYOUTS.iter().enumerate() {
        let seed = 5000 + 1000 * i as u64;
        edge_cases::<f32>(layout, seed);
        edge_cases::<f16>(layout, seed + 1);
        edge_cases::<bf16>(layout, seed + 2);
        edge_cases::<Fp8E4M3>(layout, seed + 3);
    }
}

/// Sparse rows with `k = d` hold every component: the kernel must equal the plain
/// gathered kernel over the same rows decoded to dense `f32` (one list, merged in
/// position order), outputs and weights.
#[test]
fn full_rank_sparse_rows_equal_dense_gathered_rows() {
    let (d, nd, ns) = (64, 30, 50);
    let c = Case { d, nd, ns, k: (d, d) };
    let cfg = AttnConfig::new(8, 2, d).unwrap();
    let heads: Vec<Head<f32>> = (0..2).map(|h| head(c, 40 + h)).collect();
    let (dense, sparse): (Vec<_>, Vec<_>) =
        heads.iter().enumerate().map(|(h, x)| views(h, x, c)).unzip();
    // Decode each kv-head's resident rows (dense list, then sparse list) to compact f32.
    let decoded: Vec<(Vec<u32>, Vec<f32>, Vec<f32>)> = dense
        .iter()
        .zip(&sparse)
        .map(|(g, s)| {
            let (mut pos, mut k, mut v) = (Vec::new(), Vec::new(), Vec::new());
            for i in 0..g.num_rows() {
                let r = g.slab_row(i);
                pos.push(g.positions[i]);
                k.extend_from_slice(&g.keys[r * d..(r + 1) * d]);
                v.extend_from_slice(&g.values[r * d..(r + 1) * d]);
            }
            for i in 0..s.num_rows() {
                pos.push(s.positions[i]);
                k.extend(decode_row(&s.keys, s.slab_row(i), d));
                v.extend(decode_row(&s.values, s.slab_row(i), d));
            }
            (pos, k, v)
        })
        .collect();
    // The plain gathered kernel wants ascending positions: relabel rows 0..n in list order
    // (softmax does not depend on positions, only on the rows).
    let labels: Vec<u32> = (0..(nd + ns) as u32).collect();
    let plain: Vec<GatheredKv<'_, f32>> =
        decoded.iter().map(|(_, k, v)| GatheredKv::new(d, &labels, k, v)).collect();
    let q = synth::values(cfg.q_len(), 3);
    let n = 2 * (nd + ns);
    for (name, mut e) in engines() {
        let (mut a, mut aw) = (vec![0.0; cfg.q_len()], vec![0.0; n]);
        let (mut b, mut bw) = (vec![0.0; cfg.q_len()], vec![0.0; n]);
        e.gathered_sparse(&cfg, &q, &dense, &sparse, &mut a, Some(&mut aw)).unwrap();
        e.gathered(&cfg, &q, &plain, &mut b, Some(&mut bw)).unwrap();
        let scale = b.iter().fold(0.0f32, |m, x| m.max(x.abs()));
        let err = a.iter().zip(&b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max);
        assert!(err <= 1e-6 * scale.max(1.0), "{name}: {err:e}");
        assert!(aw.iter().zip(&bw).all(|(x, y)| (x - y).abs() <= 1e-6), "{name}: weights");
    }
}

fn decode_row(s: &SparseSlab<'_>, row: usize, d: usize) -> Vec<f32> {
    let mut out = vec![0.0; d];
    let bytes = &s.bytes[row * 2 * s.k..(row + 1) * 2 * s.k];
    for (&i, &c) in bytes[..s.k].iter().zip(&bytes[s.k..]) {
        out[usize::from(i)] = Fp8E4M3::from_bits(c).to_f32() * s.scale;
    }
    out
}

/// An index ≥ head_dim (a corrupt slab) is ignored by every implementation alike.
#[test]
fn out_of_range_indices_are_ignored() {
    let d = 16;
    let cfg = AttnConfig::new(4, 1, d).unwrap();
    let mut bytes = synth::sparse_slab(20, d, 4, 1.0, 8).unwrap();
    for row in bytes.chunks_mut(8).step_by(3) {
        row[1] = 200; // second index of every third row points past d
    }
    let slab = SparseSlab::new(&bytes, 4, 1.0);
    let pos: Vec<u32> = (0..20).collect();
    let sparse = [GatheredSparseKv::new(d, &pos, slab, slab)];
    let none: [GatheredKv<'_, f32>; 1] = [GatheredKv::new(d, &[], &[], &[])];
    let q = synth::values(cfg.q_len(), 1);
    let mut want = vec![0.0; cfg.q_len()];
    Reference.gathered_sparse(&cfg, &q, &none, &sparse, &mut want, None).unwrap();
    for (name, mut e) in engines() {
        let mut got = vec![0.0; cfg.q_len()];
        e.gathered_sparse(&cfg, &q, &none, &sparse, &mut got, None).unwrap();
        let bound = slab_bound(&bytes, 4, 1.0);
        assert_close(
            Kernel::GatheredSparse,
            kv_sparse::ValueFormat::F32,
            &got,
            &want,
            bound,
            &name,
        );
    }
}

#[test]
fn bad_input_is_a_typed_error() {
    let d = 16;
    let cfg = AttnConfig::new(2, 1, d).unwrap();
    let q = vec![0.1; cfg.q_len()];
    let mut out = vec![0.0; cfg.q_len()];
    let bytes = synth::sparse_slab(4, d, 4, 1.0, 1).unwrap();
    let slab = SparseSlab::new(&bytes, 4, 1.0);
    let rows: Vec<f32> = synth::dense_rows(4, d, 2);
    let pos = [1u32, 5, 9, 12];
    let dense = [GatheredKv::new(d, &pos[..2], &rows, &rows)];
    let run = |dense: &[GatheredKv<'_, f32>], sparse: &[GatheredSparseKv<'_>], out: &mut [f32]| {
        let cpu = attn_kernels::CpuAttention::new(1)
            .unwrap()
            .gathered_sparse(&cfg, &q, dense, sparse, out, None);
        let reference = Reference.gathered_sparse(&cfg, &q, dense, sparse, out, None);
        assert_eq!(
            format!("{cpu:?}"),
            format!("{reference:?}").replace("Reference", "CpuAttention")
        );
        cpu
    };
    let ok = [GatheredSparseKv::new(d, &pos[2..], slab, slab)];
    assert!(run(&dense, &ok, &mut out).is_ok());
    let overlap = [GatheredSparseKv::new(d, &pos[1..3], slab, slab)];
    assert!(matches!(
        run(&dense, &overlap, &mut out),
        Err(Error::PositionsOverlap { position: 5, .. })
    ));
    let ragged = [GatheredSparseKv::new(d, &pos[2..], SparseSlab::new(&bytes[..31], 4, 1.0), slab)];
    assert!(matches!(run(&dense, &ragged, &mut out), Err(Error::InvalidSlab { what: "key", .. })));
    let wide = [GatheredSparseKv::new(d, &pos[2..], slab, SparseSlab::new(&bytes, 17, 1.0))];
    assert!(matches!(
        run(&dense, &wide, &mut out),
        Err(Error::InvalidSlab { what: "value", k: 17, .. })
    ));
    let scale = [GatheredSparseKv::new(d, &pos[2..], slab, SparseSlab::new(&bytes, 4, f32::NAN))];
    assert!(matches!(run(&dense, &scale, &mut out), Err(Error::InvalidValueScale { .. })));
    let slots = [GatheredSparseKv::with_slots(d, &pos[2..], &[0, 4], slab, slab)];
    assert!(matches!(run(&dense, &slots, &mut out), Err(Error::SlotOutOfRange { slot: 4, .. })));
    let unsorted = [GatheredSparseKv::new(d, &[9, 3], slab, slab)];
    assert!(matches!(run(&dense, &unsorted, &mut out), Err(Error::PositionsNotAscending { .. })));
    let none: [GatheredKv<'_, f32>; 1] = [GatheredKv::new(d, &[], &[], &[])];
    let empty = [GatheredSparseKv::empty(d)];
    assert!(matches!(run(&none, &empty, &mut out), Err(Error::EmptyCache { .. })));
    assert!(matches!(run(&dense, &[], &mut out), Err(Error::LengthMismatch { .. })));
    let other_d = [GatheredSparseKv::new(8, &pos[2..], slab, slab)];
    assert!(matches!(run(&dense, &other_d, &mut out), Err(Error::HeadDimMismatch { .. })));
    // head_dim 300 cannot be reached by u8 indices.
    let cfg300 = AttnConfig::new(1, 1, 300).unwrap();
    let (q300, mut out300) = (vec![0.0; 300], vec![0.0; 300]);
    let rows300 = vec![0.0f32; 300];
    let d300 = [GatheredKv::new(300, &pos[..1], &rows300, &rows300)];
    let s300 = [GatheredSparseKv::new(300, &pos[2..], slab, slab)];
    let r = Reference.gathered_sparse(&cfg300, &q300, &d300, &s300, &mut out300, None);
    assert!(matches!(r, Err(Error::InvalidSlab { .. })), "{r:?}");
    // Weights must cover dense and sparse rows.
    let mut w = vec![0.0; 3];
    let mut cpu = attn_kernels::CpuAttention::new(1).unwrap();
    let r = cpu.gathered_sparse(&cfg, &q, &dense, &ok, &mut out, Some(&mut w));
    assert!(matches!(r, Err(Error::LengthMismatch { what: "weights", expected: 4, got: 3, .. })));
    // NaN in q.
    let mut bad_q = q.clone();
    bad_q[3] = f32::NAN;
    let r = cpu.gathered_sparse(&cfg, &bad_q, &dense, &ok, &mut out, None);
    assert!(matches!(r, Err(Error::NonFiniteQuery { dim: 3, .. })));
}
