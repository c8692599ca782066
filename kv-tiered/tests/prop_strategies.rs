//! Property tests over the exported strategies (`kv_tiered::strategies`): role maps survive
//! their JSON round trip with consistent counts (WnW §2.2), layouts partition the audio into
//! segments and cover it with chunks (§2.3), every drawn store of every policy and row layout
//! prefills, decodes and passes its own audit, and the lossless store equals dense attention
//! over prompt and generated rows.

use attn_kernels::accuracy::{Kernel, output_error, tolerance};
use attn_kernels::{CpuAttention, DecodeAttention, DenseKv, Reference, synth};
use kv_tiered::policy::StepSignal;
use kv_tiered::strategies::{
    StoreLimits, audio_layout, head_roles, lossless_store_case, store_case,
};
use kv_tiered::{HeadRoles, PromptKv, Role, TieredStore};
use proptest::prelude::*;

/// Appends one random token to every layer, feeds the policy's step signal, ends the step;
/// returns the appended `(keys, values)` per layer.
fn step(store: &mut TieredStore, seed: u64) -> Vec<(Vec<f32>, Vec<f32>)> {
    let cfg = store.config().attn;
    let (layers, n) = (store.config().layers, cfg.kv_heads() * cfg.head_dim());
    let signal = store.policy().step_signal();
    let mut added = Vec::with_capacity(layers);
    for l in 0..layers {
        let s = seed.wrapping_add(3 * l as u64);
        let (k, v) = (synth::values(n, s), synth::values(n, s + 1));
        store.append(l, &k, &v).unwrap();
        if signal == StepSignal::Queries {
            store.observe_queries(l, &synth::values(cfg.q_len(), s + 2)).unwrap();
        }
        added.push((k, v));
    }
    if signal == StepSignal::AnchorWeights {
        let t = store.config().layout.audio_len();
        store
            .add_audio_weights(&synth::values(t, seed).iter().map(|x| x.abs()).collect::<Vec<_>>())
            .unwrap();
    }
    store.end_step().unwrap();
    added
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn roles_round_trip_with_consistent_counts(
        roles in (1usize..=4, 1usize..=4).prop_flat_map(|(l, k)| head_roles(l, k))
    ) {
        prop_assert_eq!(&HeadRoles::from_json(&roles.to_json().unwrap()).unwrap(), &roles);
        let anchors = roles.heads_with(Role::Anchor).count();
        let tidal = roles.heads_with(Role::Tidal).count();
        prop_assert_eq!(roles.config().n_anchor, anchors);
        prop_assert_eq!(roles.config().n_voice, anchors + tidal);
    }

    #[test]
    fn layouts_partition_segments_and_cover_with_chunks(l in audio_layout(80)) {
        let mut next = 0;
        for j in 0..l.num_segments() {
            let s = l.segment(j);
            prop_assert_eq!(s.start, next);
            prop_assert!(!s.is_empty());
            next = s.end;
        }
        prop_assert_eq!(next, l.audio_len());
        let mut covered = 0;
        for c in 0..l.num_chunks() {
            let r = l.chunk(c);
            prop_assert!(r.start <= covered && r.end > covered, "chunk {} leaves a gap", c);
            covered = r.end;
        }
        prop_assert_eq!(covered, l.audio_len());
        prop_assert_eq!(l.kept_per_segment_quota(1.0), l.audio_len());
        prop_assert_eq!(l.kept_per_segment_quota(0.0), 0);
    }

    #[test]
    fn any_store_prefills_decodes_and_audits(case in store_case(StoreLimits::default())) {
        let mut store = case.build().unwrap();
        let steps = case.config.max_new_tokens;
        for s in 0..steps {
            step(&mut store, case.seed.wrapping_add(100 * s as u64));
            let audit = store.audit().unwrap();
            prop_assert!(audit.violations.is_empty(), "step {}: {:?}", s, audit.violations);
        }
        prop_assert!((0.0..=1.0).contains(&store.r_gpu()));
        prop_assert!(store.r_gpu() <= store.r_gpu_cpu() + 1e-12);
    }

    #[test]
    fn lossless_store_equals_dense_attention(case in lossless_store_case(StoreLimits::default())) {
        let mut store = case.build().unwrap();
        prop_assert_eq!(store.r_gpu(), 1.0);
        let added = step(&mut store, case.seed);
        let cfg = case.config.attn;
        let d = cfg.head_dim();
        let q = synth::values(cfg.q_len(), case.seed ^ 7);
        let tol = tolerance(Kernel::Gathered, kv_sparse::ValueFormat::F32).output;
        let mut cpu = CpuAttention::new(2).unwrap();
        for (layer, (k_new, v_new)) in added.iter().enumerate() {
            let view = store.layer_view(layer).unwrap();
            let mut gathered = Vec::new();
            view.gathered_into::<f32>(&mut gathered).unwrap();
            let mut got = vec![0.0; cfg.q_len()];
            cpu.gathered(&cfg, &q, &gathered, &mut got, None).unwrap();
            let rows: Vec<(Vec<f32>, Vec<f32>)> = (0..cfg.kv_heads())
                .map(|h| {
                    let mut k = case.kv.keys(layer, h).to_vec();
                    let mut v = case.kv.values(layer, h).to_vec();
                    k.extend_from_slice(&k_new[h * d..(h + 1) * d]);
                    v.extend_from_slice(&v_new[h * d..(h + 1) * d]);
                    (k, v)
                })
                .collect();
            let dense: Vec<DenseKv<'_, f32>> =
                rows.iter().map(|(k, v)| DenseKv::new(d, k, v)).collect();
            let mut want = vec![0.0; cfg.q_len()];
            Reference.dense(&cfg, &q, &dense, &mut want).unwrap();
            let bound = rows.iter().flat_map(|(_, v)| v).fold(0.0f32, |m, x| m.max(x.abs()));
            prop_assert!(output_error(&got, &want, bound) <= tol, "layer {}", layer);
        }
    }
}
