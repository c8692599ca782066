//! SWAN rows inside WnW (beyond the paper): non-anchor audio stored and recalled as SWAN
//! sparse fp8 rows. Checks the codecs, where rows land, that every resident sparse row
//! decodes to exactly the codec's image of the prompt row, that recall decisions are
//! unchanged while recall bytes shrink by `(2k_K + 2k_V) / (2·head_dim·4)`, and that attention
//! stays close to dense.

mod common;

use common::{Model, attend, attend_view, max_abs_diff, rng};
use kv_sparse::ValueFormat;
use kv_tiered::policy::{WnwConfig, WnwPolicy};
use kv_tiered::{
    AudioLayout, Error, HeadRoles, RetentionSchedule, Role, RowCodec, RowLayout, StoreConfig,
    TieredStore,
};
use proptest::prelude::*;
use rand::Rng;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn codecs_round_trip(x in prop::collection::vec(-300.0f32..300.0, 1..64), k_frac in 0.0f64..1.0) {
        let d = x.len();
        let (mut bytes, mut scratch, mut out) = (Vec::new(), Vec::new(), vec![0.0; d]);
        let f32c = RowCodec::Dense { format: ValueFormat::F32 };
        f32c.encode(&x, &mut bytes, &mut scratch).unwrap();
        f32c.decode(&bytes, &mut out).unwrap();
        prop_assert_eq!(&out, &x);
        for (format, rel) in [(ValueFormat::F16, 1e-3f32), (ValueFormat::Bf16, 8e-3)] {
            let c = RowCodec::Dense { format };
            bytes.clear();
            c.encode(&x, &mut bytes, &mut scratch).unwrap();
            prop_assert_eq!(bytes.len(), c.row_bytes(d));
            c.decode(&bytes, &mut out).unwrap();
            for (a, b) in out.iter().zip(&x) { prop_assert!((a - b).abs() <= rel * b.abs() + 1e-6); }
        }
        let k = 1 + ((d - 1) as f64 * k_frac) as usize;
        let c = RowCodec::SparseFp8 { k, scale: 1.0 };
        bytes.clear();
        c.encode(&x, &mut bytes, &mut scratch).unwrap();
        prop_assert_eq!(bytes.len(), 2 * k);
        c.decode(&bytes, &mut out).unwrap();
        let kept: Vec<usize> = (0..d).filter(|&i| out[i] != 0.0 || bytes[..k].contains(&(i as u8))).collect();
        prop_assert!(kept.len() <= k);
        let min_kept = bytes[..k].iter().map(|&i| x[i as usize].abs()).fold(f32::INFINITY, f32::min);
        for i in 0..d {
            if bytes[..k].contains(&(i as u8)) {
                prop_assert!((out[i] - x[i]).abs() <= x[i].abs() / 16.0 + 1e-2, "fp8 precision at {}", i);
            } else {
                prop_assert_eq!(out[i], 0.0);
                prop_assert!(x[i].abs() <= min_kept, "dropped a larger magnitude");
            }
        }
    }
}

#[test]
fn codec_validation() {
    let bad = [
        RowCodec::Dense { format: ValueFormat::Fp8E4M3 },
        RowCodec::SparseFp8 { k: 0, scale: 1.0 },
        RowCodec::SparseFp8 { k: 9, scale: 1.0 },
        RowCodec::SparseFp8 { k: 2, scale: 0.0 },
    ];
    for c in bad {
        assert!(matches!(c.validate(8), Err(Error::Param { .. })), "{c:?}");
    }
    assert!(matches!(
        RowCodec::SparseFp8 { k: 4, scale: 1.0 }.validate(300),
        Err(Error::Param { .. })
    ));
}

const ROLES: [Role; 4] = [Role::Anchor, Role::Tidal, Role::Fixed, Role::Tidal];

fn store(m: &Model, rows: RowLayout) -> TieredStore {
    let roles: Vec<Role> = (0..m.heads()).map(|h| ROLES[h % 4]).collect();
    let hr = HeadRoles::from_roles(m.layers, m.kv_heads, &roles).unwrap();
    let sched = RetentionSchedule::uniform(&hr, 0.3).unwrap();
    let policy = WnwPolicy::new(hr, sched, m.layout, WnwConfig::default()).unwrap();
    let config = StoreConfig { rows, ..m.config(8) };
    TieredStore::prefill_host(config, Box::new(policy), &m.kv, &m.scores).unwrap()
}

#[test]
fn sparse_rows_cut_recall_bytes_with_the_same_decisions() {
    let layout = AudioLayout::new(160, 10..150, 5, 10).unwrap();
    let m = Model::random(9, 2, 4, 2, 32, layout);
    let (kk, kv) = (16, 8);
    let mut dense = store(&m, RowLayout::dense_f32(32));
    let mut sparse = store(&m, RowLayout::with_sparse(32, ValueFormat::F32, kk, kv));
    let mut r = rng(10);
    let (mut bd, mut bs) = (0, 0);
    for _ in 0..8 {
        let frontier = r.random_range(0..140);
        let w: Vec<f32> =
            (0..140).map(|i| if i / 10 == frontier / 10 { 1.0 } else { 0.01 }).collect();
        dense.add_audio_weights(&w).unwrap();
        sparse.add_audio_weights(&w).unwrap();
        let (a, b) = (*dense.end_step().unwrap(), *sparse.end_step().unwrap());
        assert_eq!((a.recalls, a.releases, a.r_gpu), (b.recalls, b.releases, b.r_gpu));
        (bd, bs) = (bd + a.bytes_h2d, bs + b.bytes_h2d);
    }
    assert!(bd > 0);
    assert_eq!(
        bs * (2 * 32 * 4),
        bd * (2 * kk + 2 * kv) as u64,
        "bytes ratio (2k_K + 2k_V)/(2·d·4)"
    );
    for s in [&mut dense, &mut sparse] {
        let audit = s.audit().unwrap();
        assert!(audit.violations.is_empty(), "{:?}", audit.violations);
    }
}

#[test]
fn sparse_views_hold_the_codec_image_of_the_prompt() {
    let layout = AudioLayout::new(80, 5..75, 7, 14).unwrap();
    let d = 16;
    let m = Model::random(11, 2, 4, 2, d, layout);
    let rows = RowLayout::with_sparse(d, ValueFormat::F32, d, d);
    let mut st = store(&m, rows);
    st.add_audio_weights(&vec![1.0; 70]).unwrap();
    st.end_step().unwrap();
    st.sync().unwrap();
    let (kc, vc) = rows.sparse.unwrap();
    let (mut bytes, mut scratch, mut expect) = (Vec::new(), Vec::new(), vec![0.0f32; d]);
    let mut r = rng(12);
    for l in 0..m.layers {
        let view = st.layer_view(l).unwrap();
        for k in 0..m.kv_heads {
            let h = l * m.kv_heads + k;
            let hv = view.head(k).unwrap();
            let exact = ROLES[h % 4] == Role::Anchor;
            assert_eq!(hv.sparse.positions.is_empty(), exact, "head {h}: anchors stay dense");
            assert!(
                hv.dense.positions.iter().all(|&p| exact || !layout.is_audio(p as usize)),
                "head {h}: only text is dense"
            );
            for (i, &p) in hv.sparse.positions.iter().enumerate() {
                for (codec, values) in [(kc, false), (vc, true)] {
                    let (row, scale) =
                        if values { hv.sparse_value(i) } else { hv.sparse_key(i) }.unwrap();
                    let mut got = vec![0.0f32; d];
                    for (&j, v) in row.indices.iter().zip(row.values) {
                        got[usize::from(j)] = v.to_f32() * scale;
                    }
                    bytes.clear();
                    codec.encode(m.row(values, h, p as usize), &mut bytes, &mut scratch).unwrap();
                    codec.decode(&bytes, &mut expect).unwrap();
                    assert_eq!(got, expect, "head {h} position {p} values={values}");
                }
            }
            // Attention over the view stays close to dense over the same resident positions.
            let g = m.q_heads / m.kv_heads;
            let q: Vec<f32> = (0..g * d).map(|_| r.random_range(-1.0..1.0)).collect();
            let (pos, out, _) = attend_view(&q, &hv);
            let (mut kd, mut vd) = (Vec::new(), Vec::new());
            for &p in &pos {
                kd.extend_from_slice(m.row(false, h, p as usize));
                vd.extend_from_slice(m.row(true, h, p as usize));
            }
            let (dense, _) = attend(&q, &kd, &vd, d);
            assert!(
                max_abs_diff(&out, &dense) < 0.05,
                "head {h}: fp8 attention drifted {}",
                max_abs_diff(&out, &dense)
            );
        }
    }
}

/// The gathered kernel over dense + SWAN sparse fp8 rows reads a store's views in place:
/// `LayerView::gathered_parts_into` feeds `attn-kernels`' optimized and reference
/// `gathered_sparse`, which must equal attention over the decoded resident rows, and the
/// kernel's weights must drive the anchor signal exactly like the per-position call.
/// `LayerView::with_gathered_parts` over one `GatheredLists` reused for every step and
/// layer hands the kernel the same lists (bit-identical outputs and weights).
#[test]
fn gathered_sparse_kernel_reads_sparse_views_in_place() {
    use attn_kernels::{AttnConfig, CpuAttention, GatheredSparseAttention, Reference};
    let layout = AudioLayout::new(120, 8..112, 8, 16).unwrap();
    let d = 32;
    let m = Model::random(21, 2, 4, 2, d, layout);
    let g = m.q_heads / m.kv_heads;
    let mut via_kernel = store(&m, RowLayout::with_sparse(d, ValueFormat::F32, 12, 8));
    let mut via_positions = store(&m, RowLayout::with_sparse(d, ValueFormat::F32, 12, 8));
    let cfg = AttnConfig::new(m.q_heads, m.kv_heads, d).unwrap();
    let mut cpu = CpuAttention::new(2).unwrap();
    let mut r = rng(22);
    let mut saw_sparse = false;
    let mut lists = kv_tiered::GatheredLists::<f32>::default();
    for _step in 0..4 {
        for l in 0..m.layers {
            let q: Vec<f32> = (0..m.q_heads * d).map(|_| r.random_range(-2.0..2.0)).collect();
            let view = via_kernel.layer_view(l).unwrap();
            let (mut dense_parts, mut sparse_parts) = (Vec::new(), Vec::new());
            view.gathered_parts_into::<f32>(&mut dense_parts, &mut sparse_parts).unwrap();
            saw_sparse |= sparse_parts.iter().any(|s| !s.positions.is_empty());
            let rows: usize = (0..m.kv_heads).map(|k| view.head(k).unwrap().len()).sum();
            let (mut out, mut w) = (vec![0.0; m.q_heads * d], vec![0.0; rows]);
            cpu.gathered_sparse(&cfg, &q, &dense_parts, &sparse_parts, &mut out, Some(&mut w))
                .unwrap();
            let (mut reused, mut reused_w) = (vec![0.0; m.q_heads * d], vec![0.0; rows]);
            view.with_gathered_parts(&mut lists, |dense, sparse| {
                let w = Some(&mut reused_w[..]);
                cpu.gathered_sparse(&cfg, &q, dense, sparse, &mut reused, w)
            })
            .unwrap()
            .unwrap();
            assert_eq!((&reused, &reused_w), (&out, &w), "reused lists, layer {l}");
            let (mut ref_out, mut ref_w) = (vec![0.0; m.q_heads * d], vec![0.0; rows]);
            Reference
                .gathered_sparse(
                    &cfg,
                    &q,
                    &dense_parts,
                    &sparse_parts,
                    &mut ref_out,
                    Some(&mut ref_w),
                )
                .unwrap();
            let mut per_head: Vec<(Vec<u32>, Vec<f32>)> = Vec::new();
            for k in 0..m.kv_heads {
                let hv = view.head(k).unwrap();
                let qk = &q[k * g * d..(k + 1) * g * d];
                let (pos, want, want_w) = attend_view(qk, &hv);
                for (name, o) in [("cpu", &out), ("reference", &ref_out)] {
                    let err = max_abs_diff(&o[k * g * d..(k + 1) * g * d], &want);
                    assert!(err <= 2e-5, "{name} kernel, layer {l} head {k}: {err}");
                }
                // Kernel weights per head: dense rows in list order, then sparse rows.
                let off = dense_parts[..k].iter().map(|p| p.positions.len()).sum::<usize>()
                    + sparse_parts[..k].iter().map(|p| p.positions.len()).sum::<usize>();
                let order = hv.dense.positions.iter().chain(hv.sparse.positions.iter());
                let (mut positions, mut pos_w) = (Vec::new(), Vec::new());
                for (i, &p) in order.enumerate() {
                    let j = pos.binary_search(&p).unwrap();
                    assert!((w[off + i] - want_w[j]).abs() <= 2e-5, "weight of {p}, head {k}");
                    positions.push(p);
                    pos_w.push(w[off + i]);
                }
                per_head.push((positions, pos_w));
            }
            drop(dense_parts);
            drop(sparse_parts);
            drop(view);
            via_kernel.add_gathered_weights(l, &w).unwrap();
            for (k, (positions, pos_w)) in per_head.iter().enumerate() {
                if ROLES[(l * m.kv_heads + k) % 4] == Role::Anchor {
                    via_positions.add_anchor_weights(l, k, positions, pos_w).unwrap();
                }
            }
        }
        let (a, b) = (*via_kernel.end_step().unwrap(), *via_positions.end_step().unwrap());
        assert_eq!((a.recalls, a.releases, a.r_gpu), (b.recalls, b.releases, b.r_gpu));
        via_kernel.sync().unwrap();
        via_positions.sync().unwrap();
    }
    assert!(saw_sparse, "the test must exercise sparse rows");
}
