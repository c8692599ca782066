//! Coded rows inside WnW (beyond the paper): non-anchor audio stored and recalled as rows
//! of the equal-footing codes that stand alone per row — TurboQuant-style codebook rows
//! (QJL keys included) and per-token channel groups. Checks the codecs against their
//! `kv-sparse` images, that recall decisions are unchanged while recall bytes shrink by
//! the codec's row bytes, that every resident coded row is the codec's image of the prompt
//! row, and that the gathered dense + coded kernel reads the views in place: optimized and
//! reference kernels equal attention over the decoded resident rows, weights included.

mod common;

use attn_kernels::{AttnConfig, CpuAttention, GatheredCodedAttention, Reference};
use common::{Model, attend_view, max_abs_diff, rng};
use kv_sparse::ValueFormat;
use kv_tiered::policy::{WnwConfig, WnwPolicy};
use kv_tiered::{
    AudioLayout, Error, GatheredLists, HeadRoles, RetentionSchedule, Role, RowCodec, RowLayout,
    StoreConfig, TieredStore,
};
use rand::Rng;

const ROLES: [Role; 4] = [Role::Anchor, Role::Tidal, Role::Fixed, Role::Tidal];

/// The coded layouts under test: (keys, values).
const CODECS: [(RowCodec, RowCodec); 4] = [
    (RowCodec::Turbo { bits: 3 }, RowCodec::Turbo { bits: 3 }),
    (RowCodec::TurboQjl { bits: 3 }, RowCodec::Turbo { bits: 2 }),
    (RowCodec::Groups { bits: 4, group: 16 }, RowCodec::Groups { bits: 2, group: 8 }),
    (RowCodec::Groups { bits: 8, group: 32 }, RowCodec::Turbo { bits: 4 }),
];

fn store(m: &Model, rows: RowLayout) -> TieredStore {
    let roles: Vec<Role> = (0..m.heads()).map(|h| ROLES[h % 4]).collect();
    let hr = HeadRoles::from_roles(m.layers, m.kv_heads, &roles).unwrap();
    let sched = RetentionSchedule::uniform(&hr, 0.3).unwrap();
    let policy = WnwPolicy::new(hr, sched, m.layout, WnwConfig::default()).unwrap();
    let config = StoreConfig { rows, ..m.config(8) };
    TieredStore::prefill_host(config, Box::new(policy), &m.kv, &m.scores).unwrap()
}

#[test]
fn codecs_write_the_kv_sparse_rows_and_reject_what_they_cannot_hold() {
    let d = 32;
    let x: Vec<f32> = (0..d).map(|i| ((i * 37 % 19) as f32 - 9.0) * 0.3).collect();
    let (mut bytes, mut scratch, mut out) = (Vec::new(), Vec::new(), vec![0.0; d]);
    for c in CODECS.iter().flat_map(|&(k, v)| [k, v]) {
        c.validate(d).unwrap();
        bytes.clear();
        c.encode(&x, &mut bytes, &mut scratch).unwrap();
        assert_eq!(bytes.len(), c.row_bytes(d), "{c:?}");
        c.decode(&bytes, &mut out).unwrap();
        let err: f32 = x.iter().zip(&out).map(|(a, b)| (a - b) * (a - b)).sum();
        let norm: f32 = x.iter().map(|a| a * a).sum();
        assert!(err / norm < 0.2, "{c:?}: relative error {}", err / norm);
        // A row that cannot be held leaves what was written before untouched.
        let before = bytes.clone();
        let mut nan = x.clone();
        nan[1] = f32::NAN;
        assert!(c.encode(&nan, &mut bytes, &mut scratch).is_err());
        let huge = vec![1e30f32; d];
        assert!(c.encode(&huge, &mut bytes, &mut scratch).is_err(), "{c:?}");
        assert_eq!(bytes, before);
    }
    let levels = kv_sparse::turbo::codebook(d, 3);
    let mut want = vec![0; 2 + d * 3 / 8];
    kv_sparse::turbo::encode_row(3, &levels, &x, &mut want).unwrap();
    bytes.clear();
    RowCodec::Turbo { bits: 3 }.encode(&x, &mut bytes, &mut scratch).unwrap();
    assert_eq!(bytes, want, "the kv-sparse row, byte for byte");
    let bad = [
        RowCodec::Turbo { bits: 5 },
        RowCodec::TurboQjl { bits: 1 },
        RowCodec::Groups { bits: 3, group: 8 },
        RowCodec::Groups { bits: 4, group: 5 },
        RowCodec::Groups { bits: 8, group: 0 },
    ];
    for c in bad {
        assert!(c.validate(d).is_err(), "{c:?}");
    }
    assert!(RowCodec::TurboQjl { bits: 3 }.validate(20).is_err(), "sign bits fill bytes");
    // Coded and sparse rows do not mix; QJL rows are keys only.
    let mixed = [
        (RowCodec::Turbo { bits: 3 }, RowCodec::SparseFp8 { k: 4, scale: 1.0 }),
        (RowCodec::Turbo { bits: 3 }, RowCodec::TurboQjl { bits: 3 }),
    ];
    for (k, v) in mixed {
        let layout = RowLayout::with_coded(d, ValueFormat::F32, k, v);
        assert!(matches!(layout.validate(), Err(Error::Param { .. })), "{k:?} {v:?}");
    }
}

#[test]
fn coded_rows_cut_recall_bytes_with_the_same_decisions() {
    let layout = AudioLayout::new(160, 10..150, 5, 10).unwrap();
    let d = 32;
    let m = Model::random(9, 2, 4, 2, d, layout);
    for (kc, vc) in CODECS {
        let mut dense = store(&m, RowLayout::dense_f32(d));
        let mut coded = store(&m, RowLayout::with_coded(d, ValueFormat::F32, kc, vc));
        let mut r = rng(10);
        let (mut bd, mut bc) = (0, 0);
        for _ in 0..8 {
            let frontier = r.random_range(0..140);
            let w: Vec<f32> =
                (0..140).map(|i| if i / 10 == frontier / 10 { 1.0 } else { 0.01 }).collect();
            dense.add_audio_weights(&w).unwrap();
            coded.add_audio_weights(&w).unwrap();
            let (a, b) = (*dense.end_step().unwrap(), *coded.end_step().unwrap());
            assert_eq!((a.recalls, a.releases, a.r_gpu), (b.recalls, b.releases, b.r_gpu));
            (bd, bc) = (bd + a.bytes_h2d, bc + b.bytes_h2d);
        }
        assert!(bd > 0);
        let coded_row = (kc.row_bytes(d) + vc.row_bytes(d)) as u64;
        assert_eq!(bc * (2 * d as u64 * 4), bd * coded_row, "{kc:?}/{vc:?}: bytes ratio");
        let audit = coded.audit().unwrap();
        assert!(audit.violations.is_empty(), "{:?}", audit.violations);
    }
}

/// Every resident coded row is the codec's image of its prompt row, and the gathered dense +
/// coded kernel (optimized and reference) over `LayerView::with_coded_parts` equals attention
/// over the decoded resident rows, outputs and per-row weights, through recalls and releases.
#[test]
fn gathered_coded_kernel_reads_coded_views_in_place() {
    let layout = AudioLayout::new(120, 8..112, 8, 16).unwrap();
    let d = 32;
    let m = Model::random(21, 2, 4, 2, d, layout);
    let g = m.q_heads / m.kv_heads;
    let cfg = AttnConfig::new(m.q_heads, m.kv_heads, d).unwrap();
    let mut cpu = CpuAttention::new(2).unwrap();
    for (kc, vc) in CODECS {
        let rows = RowLayout::with_coded(d, ValueFormat::F32, kc, vc);
        let mut st = store(&m, rows);
        let mut r = rng(22);
        let (mut saw_coded, mut lists) = (false, GatheredLists::<f32>::default());
        let (mut bytes, mut scratch, mut expect) = (Vec::new(), Vec::new(), vec![0.0f32; d]);
        for _step in 0..4 {
            for l in 0..m.layers {
                let q: Vec<f32> = (0..m.q_heads * d).map(|_| r.random_range(-2.0..2.0)).collect();
                let view = st.layer_view(l).unwrap();
                let total: usize = (0..m.kv_heads).map(|k| view.head(k).unwrap().len()).sum();
                let (mut out, mut w) = (vec![0.0; m.q_heads * d], vec![0.0; total]);
                let (mut ref_out, mut ref_w) = (vec![0.0; m.q_heads * d], vec![0.0; total]);
                view.with_coded_parts(&mut lists, |dense, coded| {
                    saw_coded |= coded.iter().any(|c| c.num_rows() > 0);
                    cpu.gathered_coded(&cfg, &q, dense, coded, &mut out, Some(&mut w)).unwrap();
                    let rw = Some(&mut ref_w[..]);
                    Reference.gathered_coded(&cfg, &q, dense, coded, &mut ref_out, rw).unwrap();
                })
                .unwrap();
                let mut off = 0;
                for k in 0..m.kv_heads {
                    let (h, hv) = (l * m.kv_heads + k, view.head(k).unwrap());
                    for (i, &p) in hv.sparse.positions.iter().enumerate() {
                        let mut pos = Vec::new();
                        let (mut keys, mut values) = (Vec::new(), Vec::new());
                        hv.decode_into(&mut pos, &mut keys, &mut values).unwrap();
                        let j = pos.binary_search(&p).unwrap();
                        for (codec, side, got) in [(kc, false, &keys), (vc, true, &values)] {
                            bytes.clear();
                            codec
                                .encode(m.row(side, h, p as usize), &mut bytes, &mut scratch)
                                .unwrap();
                            codec.decode(&bytes, &mut expect).unwrap();
                            assert_eq!(&got[j * d..(j + 1) * d], &expect[..], "{h} {p} {i}");
                        }
                    }
                    let qk = &q[k * g * d..(k + 1) * g * d];
                    let (pos, want, want_w) = attend_view(qk, &hv);
                    for (name, o) in [("cpu", &out), ("reference", &ref_out)] {
                        let err = max_abs_diff(&o[k * g * d..(k + 1) * g * d], &want);
                        assert!(err <= 5e-5, "{name} {kc:?}/{vc:?} layer {l} head {k}: {err}");
                    }
                    let order = hv.dense.positions.iter().chain(hv.sparse.positions.iter());
                    for (i, &p) in order.enumerate() {
                        let j = pos.binary_search(&p).unwrap();
                        assert!((w[off + i] - want_w[j]).abs() <= 5e-5, "weight of {p}");
                    }
                    off += hv.len();
                }
                drop(view);
                st.add_gathered_weights(l, &w).unwrap();
            }
            st.end_step().unwrap();
            st.sync().unwrap();
        }
        assert!(saw_coded, "{kc:?}/{vc:?}: the test must exercise coded rows");
        // The SWAN-rows hand-over refuses coded rows instead of reading them as fp8.
        let view = st.layer_view(0).unwrap();
        let (mut dense, mut sparse) = (Vec::new(), Vec::new());
        let refused = view.gathered_parts_into::<f32>(&mut dense, &mut sparse);
        assert!(matches!(refused, Err(Error::Param { .. })));
    }
}
