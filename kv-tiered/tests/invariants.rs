//! Property tests of the WnW store's invariants (§2.2 roles, §2.3 prefill and chunk swap)
//! over random roles, lengths and score streams: anchors always hold every audio position; tidal
//! heads never lose one (device ∪ host = all audio); fixed heads never recall; text and
//! generated tokens are always resident; a recalled segment is released exactly after δ
//! consecutive unselected steps (checked against an independent model of §2.3); r_GPU equals
//! a recount.

mod common;

use std::num::NonZeroU32;

use common::{Model, random_roles, rng};
use kv_tiered::layout::quota;
use kv_tiered::policy::{EvictionLag, SegmentQuota, WnwConfig};
use kv_tiered::{AudioLayout, Role, TieredStore};
use proptest::prelude::*;
use rand::Rng;

#[derive(Clone, Debug)]
struct Case {
    seed: u64,
    layers: usize,
    kv_heads: usize,
    group: usize,
    head_dim: usize,
    before: usize,
    audio: usize,
    after: usize,
    seg: usize,
    chunk_extra: usize,
    retention: f64,
    top_chunks: usize,
    lag: u32,
    steps: usize,
    global: bool,
}

fn case() -> impl Strategy<Value = Case> {
    let shape = (
        any::<u64>(),
        1..3usize,
        1..4usize,
        1..3usize,
        1..5usize,
        0..6usize,
        1..90usize,
        0..6usize,
    );
    let policy =
        (1..10usize, 0..12usize, 0.0..1.0f64, 1..4usize, 1..5u32, 0..20usize, any::<bool>());
    (shape, policy).prop_map(
        |(
            (seed, layers, kv_heads, group, head_dim, before, audio, after),
            (seg, chunk_extra, retention, top_chunks, lag, steps, global),
        )| Case {
            seed,
            layers,
            kv_heads,
            group,
            head_dim,
            before,
            audio,
            after,
            seg,
            chunk_extra,
            retention,
            top_chunks,
            lag,
            steps,
            global,
        },
    )
}

/// Independent model of §2.3 chunk selection: segments of the top-k chunks by mean weight.
fn selected_segments(layout: &AudioLayout, w: Option<&[f32]>, k: usize) -> Vec<bool> {
    let mut sel = vec![false; layout.num_segments()];
    let Some(w) = w else { return sel };
    let mut chunks: Vec<(f64, usize)> = (0..layout.num_chunks())
        .map(|c| {
            let r = layout.chunk(c);
            (r.clone().map(|i| f64::from(w[i])).sum::<f64>() / r.len() as f64, c)
        })
        .collect();
    chunks.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
    for &(_, c) in chunks.iter().take(k) {
        let r = layout.chunk(c);
        for (s, flag) in sel.iter_mut().enumerate() {
            let seg = layout.segment(s);
            *flag |= seg.start < r.end && r.start < seg.end;
        }
    }
    sel
}

/// Independent model of §2.3 prefill selection for one non-anchor head: per segment the
/// top `⌊r·|seg|⌋` by score, or (A2) the same total by global top-k; ties to the lower index.
fn expected_kept(scores: &[f32], layout: &AudioLayout, r: f64, global: bool) -> Vec<bool> {
    let mut kept = vec![false; scores.len()];
    let top = |range: std::ops::Range<usize>, k: usize, kept: &mut Vec<bool>| {
        let mut idx: Vec<usize> = range.collect();
        idx.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]).then(a.cmp(&b)));
        idx.iter().take(k).for_each(|&i| kept[i] = true);
    };
    let segs = (0..layout.num_segments()).map(|j| layout.segment(j));
    if global {
        let k = segs.map(|s| quota(r, s.len())).sum();
        top(0..scores.len(), k, &mut kept);
    } else {
        segs.for_each(|s| top(s.clone(), quota(r, s.len()), &mut kept));
    }
    kept
}

fn check_audit(
    store: &mut TieredStore,
    roles: &[Role],
    kept: &[Vec<bool>],
    c: &Case,
    layout: &AudioLayout,
) -> Result<(), TestCaseError> {
    let audit = store.audit().unwrap();
    prop_assert!(audit.violations.is_empty(), "{:?}", audit.violations);
    prop_assert!((audit.r_gpu - store.r_gpu()).abs() < 1e-12);
    prop_assert!((audit.r_gpu_cpu - store.r_gpu_cpu()).abs() < 1e-12);
    let t = layout.audio_len();
    for (h, (a, role)) in audit.heads.iter().zip(roles).enumerate() {
        match role {
            Role::Anchor => prop_assert_eq!(a.device_audio, t, "anchor {} lost audio", h),
            Role::Tidal => prop_assert_eq!(a.covered, t, "tidal {} lost audio", h),
            Role::Fixed => {
                prop_assert_eq!(a.recalled_units, 0);
                prop_assert_eq!(a.host_audio, 0);
                prop_assert_eq!(a.device_audio, kept[h].iter().filter(|&&k| k).count());
            }
        }
    }
    // Fixed heads hold exactly the positions the model selects (tidal heads: at least them).
    for (h, role) in roles.iter().enumerate() {
        if *role == Role::Anchor {
            continue;
        }
        let view = store.layer_view(h / c.kv_heads).unwrap();
        let hv = view.head(h % c.kv_heads).unwrap();
        let audio: Vec<usize> =
            hv.dense.positions.iter().filter_map(|&p| layout.audio_index(p as usize)).collect();
        let expect: Vec<usize> = (0..t).filter(|&i| kept[h][i]).collect();
        if *role == Role::Fixed {
            prop_assert_eq!(&audio, &expect, "fixed head {} retained set", h);
        } else {
            prop_assert!(expect.iter().all(|i| audio.binary_search(i).is_ok()), "tidal {}", h);
        }
    }
    Ok(())
}

/// Reports `w` as this step's anchor signal: pre-summed, or split across random anchor heads
/// as (positions, weights) lists that also carry text positions (which must be ignored).
fn report(
    store: &mut TieredStore,
    r: &mut impl Rng,
    anchors: &[usize],
    layout: &AudioLayout,
    kv_heads: usize,
    w: &[f32],
) {
    if anchors.is_empty() || r.random_bool(0.5) {
        store.add_audio_weights(w).unwrap();
        return;
    }
    let a0 = layout.audio_start();
    let mut split: Vec<Vec<(u32, f32)>> = vec![Vec::new(); anchors.len()];
    for (i, &x) in w.iter().enumerate() {
        // Halves are exact in binary floating point: the store must sum them back to `x`.
        let (a, b) = (r.random_range(0..anchors.len()), r.random_range(0..anchors.len()));
        split[a].push(((a0 + i) as u32, x * 0.5));
        split[b].push(((a0 + i) as u32, x * 0.5));
    }
    for (n, &h) in anchors.iter().enumerate() {
        let mut list = std::mem::take(&mut split[n]);
        list.push((layout.seq_len() as u32 + 3, 9.0)); // a generated (text) position
        let (pos, wt): (Vec<u32>, Vec<f32>) = list.into_iter().unzip();
        store.add_anchor_weights(h / kv_heads, h % kv_heads, &pos, &wt).unwrap();
    }
}

/// Independent model of §2.3 chunk swap for one step: a recallable tidal segment that is
/// selected becomes resident with lag 0; a resident one left unselected ages by one step and
/// is released when its lag reaches δ. `resident[h·units + s] = (resident, lag)`.
fn model_step(
    resident: &mut [(bool, u32)],
    sel: &[bool],
    roles: &[Role],
    kept: &[Vec<bool>],
    layout: &AudioLayout,
    delta: u32,
) {
    for (h, role) in roles.iter().enumerate() {
        for (s, &selected) in sel.iter().enumerate() {
            let recallable = *role == Role::Tidal && layout.segment(s).any(|i| !kept[h][i]);
            let slot = &mut resident[h * sel.len() + s];
            if recallable && selected {
                *slot = (true, 0);
            } else if slot.0 {
                slot.1 += 1;
                if slot.1 >= delta {
                    slot.0 = false;
                }
            }
        }
    }
}

fn run_case(c: &Case) -> Result<(), TestCaseError> {
    let layout = AudioLayout::new(
        c.before + c.audio + c.after,
        c.before..c.before + c.audio,
        c.seg,
        c.seg + c.chunk_extra,
    )
    .unwrap();
    let model = Model::random(c.seed, c.layers, c.kv_heads, c.group, c.head_dim, layout);
    let mut r = rng(c.seed ^ 0x5eed);
    let roles = random_roles(&mut r, model.heads());
    let lag = NonZeroU32::new(c.lag).unwrap();
    let config = WnwConfig {
        top_chunks: c.top_chunks,
        lag: EvictionLag::Steps(lag),
        quota: if c.global { SegmentQuota::Global } else { SegmentQuota::PerSegment },
    };
    let mut store = model.wnw_store(&roles, c.retention, config, c.steps);
    let (units, t, d) = (layout.num_segments(), layout.audio_len(), c.head_dim);
    let kept: Vec<Vec<bool>> = (0..model.heads())
        .map(|h| expected_kept(&model.scores[h * t..(h + 1) * t], &layout, c.retention, c.global))
        .collect();
    check_audit(&mut store, &roles, &kept, c, &layout)?;
    let anchors: Vec<usize> = (0..model.heads()).filter(|&h| roles[h] == Role::Anchor).collect();
    let mut resident = vec![(false, 0u32); model.heads() * units];
    for _ in 0..c.steps {
        if r.random_bool(0.7) {
            for l in 0..c.layers {
                let row: Vec<f32> =
                    (0..c.kv_heads * d).map(|_| r.random_range(-1.0..1.0)).collect();
                store.append(l, &row, &row).unwrap();
            }
        }
        let weights: Option<Vec<f32>> =
            r.random_bool(0.85).then(|| (0..t).map(|_| r.random_range(0.0..1.0f32)).collect());
        if let Some(w) = &weights {
            report(&mut store, &mut r, &anchors, &layout, c.kv_heads, w);
        }
        let sel = selected_segments(&layout, weights.as_deref(), c.top_chunks);
        store.end_step().unwrap();
        model_step(&mut resident, &sel, &roles, &kept, &layout, c.lag);
        for (h, role) in roles.iter().enumerate() {
            for s in 0..units {
                let (got, want) = (store.residency().resident(h, s), resident[h * units + s].0);
                prop_assert_eq!(got, want, "head {} segment {} role {:?}", h, s, role);
            }
        }
        check_audit(&mut store, &roles, &kept, c, &layout)?;
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn wnw_invariants_hold_over_random_runs(c in case()) {
        run_case(&c)?;
    }
}
