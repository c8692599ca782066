//! The gathered kernel over a tiered store's dense rows *and* rows of a per-row code
//! (`GatheredCodedAttention`): TurboQuant-style codebook rows (2/3/4 bits, QJL-sketched
//! keys) and per-token channel-group rows (2/4/8 bits), every optimized engine × GQA
//! layout × edge case against the f64 reference, weights included; bad layouts, slabs and
//! lists as typed errors.

mod common;

use attn_kernels::accuracy::{Kernel, tolerance};
use attn_kernels::{
    AttnConfig, Error, GatheredCodedAttention, GatheredCodedKv, GatheredKv, Reference, synth,
};
use common::{LAYOUTS, assert_close, cfg, dense_bound, engines};
use half::f16;
use kv_sparse::ValueFormat;
use kv_sparse::decoded::{RowCodes, Side};
use kv_sparse::turbo::{TurboQjlRows, codebook, encode_row};

/// How one side of the coded rows is coded.
#[derive(Clone, Copy, Debug)]
enum Code {
    /// Codebook rows at this many bits.
    Turbo(usize),
    /// QJL-sketched key rows at this many bits (keys only).
    Qjl(usize),
    /// Per-token channel groups: (bits, group).
    Groups(usize, usize),
}

/// Coded slab bytes of `rows` rows of `x` and what the layout needs beside them.
struct Slab {
    bytes: Vec<u8>,
    levels: std::sync::Arc<[f32]>,
    sketch: std::sync::Arc<[f32]>,
    code: Code,
}

impl Slab {
    fn new(code: Code, x: &[f32], d: usize) -> Self {
        let (mut bytes, mut levels, mut sketch) = (Vec::new(), codebook(d, 2), [].into());
        for row in x.chunks_exact(d) {
            match code {
                Code::Turbo(bits) => {
                    levels = codebook(d, bits);
                    let mut out = vec![0; 2 + d * bits / 8];
                    encode_row(bits, &levels, row, &mut out).unwrap();
                    bytes.extend(out);
                }
                Code::Qjl(bits) => {
                    let mut rows = TurboQjlRows::<3>::new(Side::Keys, d).unwrap();
                    assert_eq!(bits, 3);
                    rows.push(row).unwrap();
                    levels = codebook(d, bits - 1);
                    sketch = kv_sparse::turbo::sketch(d);
                    bytes.extend_from_slice(rows.bytes());
                }
                Code::Groups(bits, group) => {
                    let mut out = vec![0; 4 * d / group + d * bits / 8];
                    kv_sparse::kivi::encode_token_row(bits, group, row, &mut out).unwrap();
                    bytes.extend(out);
                }
            }
        }
        Self { bytes, levels, sketch, code }
    }

    fn codes(&self) -> RowCodes<'_> {
        let (levels, bytes) = (&self.levels[..], &self.bytes[..]);
        match self.code {
            Code::Turbo(bits) => RowCodes::Codebook { bits, levels, bytes },
            Code::Qjl(bits) => {
                RowCodes::CodebookSketch { bits: bits - 1, levels, sketch: &self.sketch, bytes }
            }
            Code::Groups(bits, group) => RowCodes::ChannelGroups { bits, group, bytes },
        }
    }
}

/// One kv-head: dense f16 slab, coded slabs, position lists and slots.
struct Head {
    keys: Vec<f16>,
    values: Vec<f16>,
    dense_pos: Vec<u32>,
    dense_slots: Vec<u32>,
    ck: Slab,
    cv: Slab,
    coded_pos: Vec<u32>,
    coded_slots: Vec<u32>,
}

/// `nd` dense and `nc` coded resident rows interleaved in position, slabs larger than the
/// lists with scrambled slots.
#[derive(Clone, Copy, Debug)]
struct Case {
    d: usize,
    nd: usize,
    nc: usize,
    keys: Code,
    values: Code,
}

fn head(c: Case, seed: u64) -> Head {
    let (dslab, cslab) = (c.nd + 3, c.nc + 2);
    let slots = |n: usize, slab: usize| -> Vec<u32> {
        (0..n as u32).map(|i| (i * 5 + 1) % slab as u32).collect()
    };
    let (mut dense_pos, mut coded_pos) = (Vec::new(), Vec::new());
    let mut p = 3u32;
    while dense_pos.len() < c.nd || coded_pos.len() < c.nc {
        if coded_pos.len() < c.nc && (!p.is_multiple_of(3) || dense_pos.len() == c.nd) {
            coded_pos.push(p)
        } else {
            dense_pos.push(p)
        }
        p += 1 + (p % 2);
    }
    let raw = |seed| synth::dense_rows::<f32>(cslab, c.d, seed);
    Head {
        keys: synth::dense_rows(dslab, c.d, seed),
        values: synth::dense_rows(dslab, c.d, seed + 1),
        dense_slots: slots(c.nd, dslab),
        dense_pos,
        ck: Slab::new(c.keys, &raw(seed + 2), c.d),
        cv: Slab::new(c.values, &raw(seed + 3), c.d),
        coded_slots: slots(c.nc, cslab),
        coded_pos,
    }
}

fn views(c: Case, x: &Head) -> (GatheredKv<'_, f16>, GatheredCodedKv<'_>) {
    (
        GatheredKv::with_slots(c.d, &x.dense_pos, &x.dense_slots, &x.keys, &x.values),
        GatheredCodedKv::with_slots(c.d, &x.coded_pos, &x.coded_slots, x.ck.codes(), x.cv.codes()),
    )
}

/// Largest |decoded value| of a head's value rows.
fn bound(c: Case, x: &Head) -> f32 {
    let mut row = vec![0.0; c.d];
    let mut max = dense_bound(&[&x.values]);
    for j in 0..c.nc + 2 {
        x.cv.codes().decode_row(j, &mut row);
        max = row.iter().fold(max, |m, v| m.max(v.abs()));
    }
    max
}

fn check_case(layout: (usize, usize), c: Case, seed: u64) {
    let cfg: AttnConfig = cfg(layout, c.d);
    let heads: Vec<Head> = (0..layout.1 as u64).map(|h| head(c, seed + 10 * h)).collect();
    let (dense, coded): (Vec<_>, Vec<_>) = heads.iter().map(|x| views(c, x)).unzip();
    let rows = layout.1 * (c.nd + c.nc);
    let max = heads.iter().map(|x| bound(c, x)).fold(0.0, f32::max);
    let q = synth::values(cfg.q_len(), seed + 99);
    let (mut want, mut want_w) = (vec![0.0; cfg.q_len()], vec![0.0; rows]);
    Reference.gathered_coded(&cfg, &q, &dense, &coded, &mut want, Some(&mut want_w)).unwrap();
    let tol_w = tolerance(Kernel::GatheredSparse, ValueFormat::F16).weights;
    for (name, mut e) in engines() {
        let (mut got, mut got_w) = (vec![f32::NAN; cfg.q_len()], vec![f32::NAN; rows]);
        e.gathered_coded(&cfg, &q, &dense, &coded, &mut got, Some(&mut got_w)).unwrap();
        let what = format!("{name} {layout:?} {c:?}");
        assert_close(Kernel::GatheredSparse, ValueFormat::F16, &got, &want, max, &what);
        for (a, b) in got_w.iter().zip(&want_w) {
            assert!((a - b).abs() <= tol_w, "{what}: weight {a} vs {b}");
        }
        let mut plain = vec![f32::NAN; cfg.q_len()];
        e.gathered_coded(&cfg, &q, &dense, &coded, &mut plain, None).unwrap();
        assert_eq!(plain, got, "{what}: weights must not change the output");
    }
    for per_head in want_w.chunks(c.nd + c.nc) {
        let total: f32 = per_head.iter().sum();
        assert!((total - cfg.group_size() as f32).abs() < 1e-4, "weights sum to the group");
    }
}

#[test]
fn every_code_layout_and_edge_case_matches_the_reference() {
    use Code::{Groups, Qjl, Turbo};
    let cases = [
        Case { d: 64, nd: 40, nc: 70, keys: Turbo(3), values: Turbo(3) },
        Case { d: 128, nd: 5, nc: 90, keys: Turbo(2), values: Turbo(4) },
        Case { d: 64, nd: 0, nc: 33, keys: Qjl(3), values: Turbo(3) },
        Case { d: 32, nd: 20, nc: 0, keys: Turbo(3), values: Turbo(3) },
        Case { d: 32, nd: 0, nc: 1, keys: Groups(4, 32), values: Groups(2, 8) },
        Case { d: 64, nd: 7, nc: 50, keys: Groups(8, 32), values: Turbo(2) },
        Case { d: 24, nd: 9, nc: 12, keys: Turbo(4), values: Groups(4, 8) },
        Case { d: 256, nd: 2, nc: 9, keys: Turbo(3), values: Groups(8, 64) },
        Case { d: 264, nd: 3, nc: 7, keys: Turbo(3), values: Groups(4, 8) }, // past 256
    ];
    for (i, &layout) in LAYOUTS.iter().enumerate() {
        for (j, c) in cases.into_iter().enumerate() {
            check_case(layout, c, 7000 + 1000 * i as u64 + 100 * j as u64);
        }
    }
}

#[test]
fn bad_layouts_slabs_and_lists_are_typed_errors() {
    let c = Case { d: 32, nd: 4, nc: 6, keys: Code::Turbo(3), values: Code::Turbo(3) };
    let x = head(c, 1);
    let cfg = cfg((2, 1), c.d);
    let q = synth::values(cfg.q_len(), 2);
    let mut out = vec![0.0; cfg.q_len()];
    let (dense, coded) = views(c, &x);
    let mut run = |coded: GatheredCodedKv<'_>| {
        let r = Reference.gathered_coded(&cfg, &q, &[dense], &[coded], &mut out, None);
        let e = engines().remove(0).1.gathered_coded(&cfg, &q, &[dense], &[coded], &mut out, None);
        assert_eq!(format!("{r:?}").replace("Reference", "CpuAttention"), format!("{e:?}"));
        r
    };
    assert!(run(coded).is_ok());
    // Token groups do not stand alone per row; sketched values are not read in place.
    let waiting = [f16::ZERO; 0];
    let tokens =
        RowCodes::TokenGroups { bits: 2, group: 4, bytes: &[], coded: 0, waiting: &waiting };
    let sketched = Slab::new(Code::Qjl(3), &[0.5; 32 * 8], 32);
    let bad = [
        GatheredCodedKv { keys: tokens, ..coded },
        GatheredCodedKv { values: sketched.codes(), ..coded },
        GatheredCodedKv {
            keys: RowCodes::Codebook { bits: 3, levels: &x.ck.levels, bytes: &x.ck.bytes[1..] },
            ..coded
        },
    ];
    for b in bad {
        assert!(matches!(run(b), Err(Error::Sparse(_))), "{b:?}");
    }
    // A slot past the slab, a position shared with the dense rows, a short slot list.
    let far = [0, 1, 2, 3, 4, 99];
    let shared = [x.dense_pos[0], 1000, 1001, 1002, 1003, 1004];
    let short = [0, 1];
    assert!(matches!(
        run(GatheredCodedKv { slots: Some(&far), ..coded }),
        Err(Error::SlotOutOfRange { .. })
    ));
    assert!(matches!(
        run(GatheredCodedKv { positions: &shared, ..coded }),
        Err(Error::PositionsOverlap { .. })
    ));
    assert!(matches!(
        run(GatheredCodedKv { slots: Some(&short), ..coded }),
        Err(Error::LengthMismatch { .. })
    ));
    // No rows at all is an empty cache; an empty coded part beside dense rows is fine.
    let none = GatheredKv::<f16>::new(c.d, &[], &[], &[]);
    let empty = GatheredCodedKv::empty(c.d);
    let r = Reference.gathered_coded(&cfg, &q, &[none], &[empty], &mut out, None);
    assert!(matches!(r, Err(Error::EmptyCache { .. })));
    assert!(Reference.gathered_coded(&cfg, &q, &[dense], &[empty], &mut out, None).is_ok());
}
