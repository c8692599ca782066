//! Lossless mode (team standard: every lossy knob has a lossless setting proven equal to
//! dense): with δ = ∞, every chunk selected and retention 1, attention over the store's
//! gathered views equals dense attention over the full cache (WnW §3.3's Full Cache) — and,
//! stronger, with any retention once every tidal segment has been recalled (this exercises
//! the recall path).

mod common;

use attn_kernels::{AttnConfig, CpuAttention, DecodeAttention, Reference};
use common::{Model, attend, attend_view, max_abs_diff, rng};
use kv_tiered::policy::{EvictionLag, FullPolicy, SegmentQuota, WnwConfig};
use kv_tiered::{AudioLayout, Role, TieredStore};
use rand::Rng;

/// Appends `steps` random tokens to every layer (recording them), running `end_step` with
/// uniform anchor weights; returns the appended rows per layer: `[layer][step] → (k, v)`.
fn decode(
    store: &mut TieredStore,
    m: &Model,
    steps: usize,
    seed: u64,
) -> Vec<Vec<(Vec<f32>, Vec<f32>)>> {
    let mut r = rng(seed);
    let mut added = vec![Vec::new(); m.layers];
    for _ in 0..steps {
        for (l, rows) in added.iter_mut().enumerate() {
            let k: Vec<f32> =
                (0..m.kv_heads * m.head_dim).map(|_| r.random_range(-1.0..1.0)).collect();
            let v: Vec<f32> =
                (0..m.kv_heads * m.head_dim).map(|_| r.random_range(-1.0..1.0)).collect();
            store.append(l, &k, &v).unwrap();
            rows.push((k, v));
        }
        store.add_audio_weights(&vec![1.0; m.layout.audio_len()]).unwrap();
        store.end_step().unwrap();
    }
    store.sync().unwrap();
    added
}

/// Dense keys/values of head `(l, k)`: prompt rows then the added rows.
fn dense_rows(
    m: &Model,
    added: &[Vec<(Vec<f32>, Vec<f32>)>],
    l: usize,
    k: usize,
) -> (Vec<f32>, Vec<f32>) {
    let (d, h) = (m.head_dim, l * m.kv_heads + k);
    let (mut keys, mut values) = (Vec::new(), Vec::new());
    for p in 0..m.layout.seq_len() {
        keys.extend_from_slice(m.row(false, h, p));
        values.extend_from_slice(m.row(true, h, p));
    }
    for (kr, vr) in &added[l] {
        keys.extend_from_slice(&kr[k * d..(k + 1) * d]);
        values.extend_from_slice(&vr[k * d..(k + 1) * d]);
    }
    (keys, values)
}

/// Asserts every head's gathered attention — the test reference over the decoded view, and
/// `attn-kernels`' optimized and reference `gathered` kernels over the zero-copy
/// `GatheredKv` slabs — equals dense attention over prompt + added rows.
fn assert_matches_dense(
    store: &TieredStore,
    m: &Model,
    added: &[Vec<(Vec<f32>, Vec<f32>)>],
    seed: u64,
) {
    let (d, g) = (m.head_dim, m.q_heads / m.kv_heads);
    let mut r = rng(seed);
    let cfg = AttnConfig::new(m.q_heads, m.kv_heads, d).unwrap();
    let mut cpu = CpuAttention::new(2).unwrap();
    for (l, rows) in added.iter().enumerate() {
        let view = store.layer_view(l).unwrap();
        let q: Vec<f32> = (0..m.q_heads * d).map(|_| r.random_range(-2.0..2.0)).collect();
        let n = m.layout.seq_len() + rows.len();
        let mut gathered = Vec::new();
        view.gathered_into::<f32>(&mut gathered).unwrap();
        let (mut out, mut w) = (vec![0.0; m.q_heads * d], vec![0.0; m.kv_heads * n]);
        cpu.gathered(&cfg, &q, &gathered, &mut out, Some(&mut w)).unwrap();
        let (mut ref_out, mut ref_w) = (vec![0.0; m.q_heads * d], vec![0.0; m.kv_heads * n]);
        Reference.gathered(&cfg, &q, &gathered, &mut ref_out, Some(&mut ref_w)).unwrap();
        for k in 0..m.kv_heads {
            let (keys, values) = dense_rows(m, added, l, k);
            let qk = &q[k * g * d..(k + 1) * g * d];
            let (dense, dense_w) = attend(qk, &keys, &values, d);
            let (pos, mine, mine_w) = attend_view(qk, &view.head(k).unwrap());
            assert_eq!(pos, (0..n as u32).collect::<Vec<_>>(), "layer {l} head {k}: resident set");
            assert!(max_abs_diff(&mine, &dense) <= 1e-6, "layer {l} head {k}: output differs");
            assert!(max_abs_diff(&mine_w, &dense_w) <= 1e-6, "layer {l} head {k}: weights differ");
            for (name, o, wt) in [("cpu", &out, &w), ("reference", &ref_out, &ref_w)] {
                assert!(
                    max_abs_diff(&o[k * g * d..(k + 1) * g * d], &dense) <= 2e-5,
                    "{name} kernel, layer {l} head {k}"
                );
                assert!(
                    max_abs_diff(&wt[k * n..(k + 1) * n], &dense_w) <= 2e-5,
                    "{name} weights, layer {l} head {k}"
                );
            }
        }
    }
}

fn lossless_config(layout: &AudioLayout) -> WnwConfig {
    WnwConfig {
        top_chunks: layout.num_chunks(),
        lag: EvictionLag::Never,
        quota: SegmentQuota::PerSegment,
    }
}

#[test]
fn retention_one_all_chunks_no_eviction_equals_dense() {
    for (seed, before, audio, after, seg) in
        [(1, 3, 40, 5, 4), (2, 0, 17, 0, 5), (3, 7, 1, 2, 3), (4, 2, 64, 9, 8)]
    {
        let layout =
            AudioLayout::new(before + audio + after, before..before + audio, seg, 2 * seg).unwrap();
        let m = Model::random(seed, 2, 2, 3, 8, layout);
        let roles = common::random_roles(&mut rng(seed), m.heads());
        let mut store = m.wnw_store(&roles, 1.0, lossless_config(&layout), 6);
        assert_eq!(store.r_gpu(), 1.0);
        let added = decode(&mut store, &m, 6, seed);
        assert_matches_dense(&store, &m, &added, seed + 100);
    }
}

#[test]
fn recall_restores_dense_attention_at_any_retention() {
    for (seed, retention) in [(11u64, 0.0), (12, 0.2), (13, 0.55), (14, 0.9)] {
        let layout = AudioLayout::new(60, 6..51, 5, 10).unwrap();
        let m = Model::random(seed, 2, 3, 2, 6, layout);
        let roles: Vec<Role> =
            (0..m.heads()).map(|h| if h % 3 == 0 { Role::Anchor } else { Role::Tidal }).collect();
        let mut store = m.wnw_store(&roles, retention, lossless_config(&layout), 3);
        if retention < 1.0 {
            assert!(store.r_gpu() < 1.0);
        }
        let added = decode(&mut store, &m, 3, seed);
        assert_eq!(store.r_gpu(), 1.0, "every tidal segment recalled");
        assert_matches_dense(&store, &m, &added, seed + 100);
    }
}

#[test]
fn full_policy_equals_dense() {
    let layout = AudioLayout::new(50, 10..40, 6, 12).unwrap();
    let m = Model::random(21, 2, 2, 2, 8, layout);
    let mut store =
        TieredStore::prefill_host(m.config(4), Box::new(FullPolicy), &m.kv, &[]).unwrap();
    let added = decode(&mut store, &m, 4, 21);
    assert_eq!((store.r_gpu(), store.r_gpu_cpu()), (1.0, 1.0));
    assert_matches_dense(&store, &m, &added, 121);
}

#[test]
fn bounded_tier_holds_a_full_recall() {
    // Worst case for the CUDA-style fixed tier: every head tidal at retention 0, every chunk
    // selected, never released, decode to capacity — the bounds must hold it all.
    let layout = AudioLayout::new(47, 3..44, 4, 8).unwrap();
    let m = Model::random(31, 2, 2, 2, 4, layout);
    let roles = vec![Role::Tidal; m.heads()];
    let hr = kv_tiered::HeadRoles::from_roles(m.layers, m.kv_heads, &roles).unwrap();
    let sched = kv_tiered::RetentionSchedule::uniform(&hr, 0.0).unwrap();
    let policy =
        kv_tiered::policy::WnwPolicy::new(hr, sched, layout, lossless_config(&layout)).unwrap();
    let config = m.config(9);
    let tier =
        std::sync::Arc::new(kv_tiered::HostTier::new(config.bounded_tier_config(&policy)).unwrap());
    let mut store = TieredStore::prefill(config, tier, Box::new(policy), &m.kv, &m.scores).unwrap();
    let added = decode(&mut store, &m, 9, 31);
    assert_eq!(store.run_metrics().failed_recalls, 0);
    assert_eq!(store.r_gpu(), 1.0);
    assert_matches_dense(&store, &m, &added, 131);
}
