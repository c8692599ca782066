//! The §3.3 baselines behind the one `Policy` interface, run by the same harness as WnW
//! (audio-only constraint: text always resident), plus the WnW anchor-signal path from a real
//! gathered kernel's weights.

mod common;

use common::{Model, rng};
use kv_tiered::policy::{
    AdaKvConfig, AdaKvPolicy, ArkValeConfig, ArkValePolicy, AudioKvConfig, AudioKvPolicy,
    FullPolicy, StepSignal, WnwConfig, WnwPolicy,
};
use kv_tiered::{
    AudioLayout, DensePromptKv, HeadRoles, Policy, RetentionSchedule, Role, RunMetrics, TieredStore,
};
use rand::Rng;

/// One harness for every policy: feeds the signal the policy asks for, audits every step.
fn harness(
    m: &Model,
    kv: &DensePromptKv,
    policy: Box<dyn Policy>,
    steps: usize,
    seed: u64,
) -> (TieredStore, RunMetrics) {
    let mut store = TieredStore::prefill_host(m.config(steps), policy, kv, &m.scores).unwrap();
    let mut r = rng(seed);
    let d = m.head_dim;
    for _ in 0..steps {
        for l in 0..m.layers {
            let row: Vec<f32> = (0..m.kv_heads * d).map(|_| r.random_range(-1.0..1.0)).collect();
            store.append(l, &row, &row).unwrap();
            let q: Vec<f32> = (0..m.q_heads * d).map(|_| r.random_range(-1.0..1.0)).collect();
            store.observe_queries(l, &q).unwrap();
        }
        if store.policy().step_signal() == StepSignal::AnchorWeights {
            let w: Vec<f32> = (0..m.layout.audio_len()).map(|_| r.random_range(0.0..1.0)).collect();
            store.add_audio_weights(&w).unwrap();
        }
        store.end_step().unwrap();
        let audit = store.audit().unwrap();
        assert!(audit.violations.is_empty(), "{}: {:?}", store.policy().name(), audit.violations);
        assert!((audit.r_gpu - store.r_gpu()).abs() < 1e-12);
    }
    let run = store.run_metrics().clone();
    (store, run)
}

fn model(seed: u64) -> Model {
    Model::random(seed, 2, 4, 2, 8, AudioLayout::new(140, 6..134, 8, 16).unwrap())
}

#[test]
fn every_policy_runs_in_one_harness_near_its_target() {
    let m = model(1);
    let target = 0.4;
    let vs: Vec<f32> = (0..m.heads()).map(|h| 0.1 + h as f32 * 0.1).collect();
    let roles = HeadRoles::triage(
        m.layers,
        m.kv_heads,
        &vs,
        &vec![1.0; m.heads()],
        kv_tiered::TriageConfig { n_voice: 5, n_anchor: 1, ..Default::default() },
    )
    .unwrap();
    let policies: Vec<Box<dyn Policy>> = vec![
        Box::new(FullPolicy),
        Box::new(AdaKvPolicy::new(AdaKvConfig::ada_kv(target)).unwrap()),
        Box::new(AdaKvPolicy::new(AdaKvConfig::snap_kv(target)).unwrap()),
        Box::new(AudioKvPolicy::new(AudioKvConfig::new(target, vs.clone())).unwrap()),
        Box::new(ArkValePolicy::new(ArkValeConfig::new(target)).unwrap()),
        Box::new(
            kv_tiered::policy::AffPoolPolicy::new(kv_tiered::policy::AffPoolConfig::new(target))
                .unwrap(),
        ),
        // 8 heads × 8-token segments: r_GPU moves in 1/64 steps, so a 0.5 pp tolerance is out
        // of reach here (the solver says so, typed); allow 2 pp.
        Box::new(
            WnwPolicy::new(
                roles.clone(),
                RetentionSchedule::solve_with_tolerance(&roles, &m.layout, target, 0.02).unwrap(),
                m.layout,
                WnwConfig::default(),
            )
            .unwrap(),
        ),
    ];
    for p in policies {
        let name = p.name().to_string();
        let (_, run) = harness(&m, &m.kv, p, 12, 2);
        let (want_gpu, want_cpu) = match name.as_str() {
            "full" => (1.0, 1.0),
            // B = 0.4 · 128 / 32 = 1.6 pages a head: round(1.6 · 8 heads) = 13 of 32 pages.
            "arkvale" => (13.0 / 32.0, 1.0),
            _ => (target, f64::NAN),
        };
        assert!(
            (run.prefill_r_gpu - want_gpu).abs() <= 0.02,
            "{name}: prefill r_GPU {} vs {want_gpu}",
            run.prefill_r_gpu
        );
        if want_cpu.is_finite() {
            assert_eq!(run.prefill_r_gpu_cpu, want_cpu, "{name}");
        }
        match name.as_str() {
            "full" | "adakv" | "snapkv" | "audiokv" | "affpool" => {
                assert_eq!(run.recalls, 0, "{name} is static");
                assert_eq!(
                    run.prefill_r_gpu, run.prefill_r_gpu_cpu,
                    "{name} keeps nothing on the host"
                );
            }
            _ => assert!(run.recalls > 0, "{name} recalls"),
        }
    }
}

#[test]
fn adakv_floor_and_adaptive_share() {
    let layout = AudioLayout::new(100, 0..100, 10, 20).unwrap();
    let mut m = Model::random(3, 1, 2, 1, 4, layout);
    // Head 0 spreads its attention, head 1 concentrates it on 5 positions.
    m.scores = (0..200).map(|i| if i < 105 { 1.0 } else { 0.0 }).collect();
    let alpha = 0.5;
    let cfg = AdaKvConfig { target_r_gpu: 0.3, window: 4, pool_kernel: 1, floor_alpha: alpha };
    let (mut store, _) = harness(&m, &m.kv, Box::new(AdaKvPolicy::new(cfg).unwrap()), 1, 3);
    let audit = store.audit().unwrap();
    let (a, b) = (audit.heads[0].device_audio, audit.heads[1].device_audio);
    assert_eq!(a + b, 60, "layer budget round(0.3·2·100)");
    assert!(b >= 15, "floor ⌊α·B/H⌋ = 15 for every head");
    assert!(a > b, "the dispersed head gets the adaptive share ({a} vs {b})");
    // SnapKV (α = 1): uniform.
    let (mut snap, _) = harness(
        &m,
        &m.kv,
        Box::new(AdaKvPolicy::new(AdaKvConfig { floor_alpha: 1.0, ..cfg }).unwrap()),
        1,
        3,
    );
    let audit = snap.audit().unwrap();
    assert_eq!((audit.heads[0].device_audio, audit.heads[1].device_audio), (30, 30));
}

#[test]
fn audiokv_budget_follows_voice_score() {
    let layout = AudioLayout::new(100, 0..100, 10, 20).unwrap();
    let m = Model::random(4, 1, 4, 1, 4, layout);
    let cfg = AudioKvConfig::new(0.5, vec![0.0, 0.0, 1.0, 1.0]);
    let (mut store, _) = harness(&m, &m.kv, Box::new(AudioKvPolicy::new(cfg).unwrap()), 1, 4);
    let audit = store.audit().unwrap();
    let kept: Vec<usize> = audit.heads.iter().map(|a| a.device_audio).collect();
    // B = 200; β = 0.5 → 25 uniform each, plus 50 each for the two voiced heads.
    assert_eq!(kept, [25, 25, 75, 75]);
}

#[test]
fn arkvale_keeps_a_fractional_page_budget_on_average_over_the_heads() {
    // 8 heads × 4 pages of 32: r_GPU moves in steps of one page of one head (1/32), not
    // one page of every head (1/4), and stays within half a step of the target.
    let m = model(3);
    let mut last = 0.0;
    for i in 1..=20 {
        let target = f64::from(i) * 0.05;
        let policy = Box::new(ArkValePolicy::new(ArkValeConfig::new(target)).unwrap());
        let (store, run) = harness(&m, &m.kv, policy, 1, 4);
        let want = (target * 4.0 * 8.0).round().clamp(8.0, 32.0) / 32.0;
        assert!((run.prefill_r_gpu - want).abs() < 1e-12, "{target}: {}", run.prefill_r_gpu);
        if (0.25..=1.0).contains(&target) {
            assert!((run.prefill_r_gpu - target).abs() <= 1.0 / 64.0 + 1e-12, "{target}");
        }
        assert!(run.prefill_r_gpu >= last, "monotone in the target");
        last = run.prefill_r_gpu;
        // Every head holds ⌊B⌋ or ⌈B⌉ pages, also after a decode step.
        let b = (target * 4.0).clamp(1.0, 4.0);
        for h in 0..8 {
            let n = store.residency().resident_units(h).len() as f64;
            assert!(n == b.floor() || n == b.ceil(), "{target}: head {h} holds {n}");
        }
    }
}

#[test]
fn arkvale_recalls_the_page_the_query_points_at() {
    // 1 layer, 1 kv-head, 128 audio positions = 4 pages; page 3's keys point along dim 0.
    let layout = AudioLayout::new(128, 0..128, 32, 64).unwrap();
    let d = 4;
    let mut keys = vec![0.0f32; 128 * d];
    for p in 0..128 {
        keys[p * d + 1] = 0.1;
        if p >= 96 {
            keys[p * d] = 1.0;
        }
    }
    let kv = DensePromptKv::new(1, 1, 128, d, keys, vec![0.5; 128 * d]).unwrap();
    let m = Model {
        layers: 1,
        kv_heads: 1,
        q_heads: 1,
        head_dim: d,
        layout,
        kv: kv.clone(),
        keys: Vec::new(),
        values: Vec::new(),
        scores: (0..128).map(|i| if i < 32 { 1.0 } else { 0.0 }).collect(),
    };
    let mut store = TieredStore::prefill_host(
        m.config(2),
        Box::new(ArkValePolicy::new(ArkValeConfig::new(0.25)).unwrap()),
        &kv,
        &m.scores,
    )
    .unwrap();
    assert!(store.residency().resident(0, 0), "initial page from the window mass");
    store.observe_queries(0, &[1.0, 0.0, 0.0, 0.0]).unwrap();
    let step = *store.end_step().unwrap();
    assert_eq!((step.recalls, step.releases), (1, 1));
    assert!(store.residency().resident(0, 3) && !store.residency().resident(0, 0));
    assert_eq!(step.bytes_h2d, 32 * 2 * (d as u64) * 4);
    assert_eq!(store.r_gpu_cpu(), 1.0, "full CPU mirror");
}

#[test]
fn anchor_signal_from_gathered_kernel_weights() {
    use attn_kernels::{AttnConfig, CpuAttention, DecodeAttention};
    let m = model(5);
    let roles: Vec<Role> = (0..m.heads())
        .map(|h| [Role::Anchor, Role::Tidal, Role::Fixed, Role::Tidal][h % 4])
        .collect();
    let hr = HeadRoles::from_roles(m.layers, m.kv_heads, &roles).unwrap();
    let sched = RetentionSchedule::uniform(&hr, 0.25).unwrap();
    let policy = WnwPolicy::new(hr, sched, m.layout, WnwConfig::default()).unwrap();
    let mut a =
        TieredStore::prefill_host(m.config(1), Box::new(policy.clone()), &m.kv, &m.scores).unwrap();
    let mut b = TieredStore::prefill_host(m.config(1), Box::new(policy), &m.kv, &m.scores).unwrap();
    let cfg = AttnConfig::new(m.q_heads, m.kv_heads, m.head_dim).unwrap();
    let mut cpu = CpuAttention::new(1).unwrap();
    let mut r = rng(6);
    let mut summed = vec![0.0f32; m.layout.audio_len()];
    for l in 0..m.layers {
        let q: Vec<f32> = (0..m.q_heads * m.head_dim).map(|_| r.random_range(-3.0..3.0)).collect();
        let view = a.layer_view(l).unwrap();
        let mut g = Vec::new();
        view.gathered_into::<f32>(&mut g).unwrap();
        let total: usize = g.iter().map(|x| x.num_rows()).sum();
        let (mut out, mut w) = (vec![0.0; q.len()], vec![0.0; total]);
        cpu.gathered(&cfg, &q, &g, &mut out, Some(&mut w)).unwrap();
        let mut off = 0;
        for (k, head) in g.iter().enumerate() {
            if roles[l * m.kv_heads + k] == Role::Anchor {
                for (i, &p) in head.positions.iter().enumerate() {
                    if let Some(t) = m.layout.audio_index(p as usize) {
                        summed[t] += w[off + i];
                    }
                }
            }
            off += head.num_rows();
        }
        drop(g);
        drop(view);
        a.add_gathered_weights(l, &w).unwrap();
    }
    b.add_audio_weights(&summed).unwrap();
    let (sa, sb) = (*a.end_step().unwrap(), *b.end_step().unwrap());
    assert_eq!((sa.recalls, sa.bytes_h2d), (sb.recalls, sb.bytes_h2d));
    assert!(sa.recalls > 0);
    for h in 0..m.heads() {
        for u in 0..m.layout.num_segments() {
            assert_eq!(a.residency().resident(h, u), b.residency().resident(h, u));
        }
    }
}

#[test]
fn affpool_pools_similar_neighbours_into_their_mean_at_the_target_ratio() {
    use kv_tiered::policy::{AffPoolConfig, AffPoolPolicy};
    // 1 layer, 2 kv-heads, audio 8..72 (64 tokens) in runs of 4 near-identical keys.
    let layout = AudioLayout::new(80, 8..72, 8, 16).unwrap();
    let (d, t) = (4, 80);
    let mut r = rng(11);
    let mut keys = vec![0.0f32; 2 * t * d];
    let values: Vec<f32> = (0..2 * t * d).map(|_| r.random_range(-1.0..1.0)).collect();
    for h in 0..2 {
        for p in 0..t {
            let run = p / 4;
            for j in 0..d {
                let dir = if (run + j + h) % 3 == 0 { 1.0 } else { -0.5 };
                keys[(h * t + p) * d + j] = dir * (1.0 + j as f32) + 1e-3 * (p % 4) as f32;
            }
        }
    }
    let kv = DensePromptKv::new(1, 2, t, d, keys.clone(), values.clone()).unwrap();
    let m = Model {
        layers: 1,
        kv_heads: 2,
        q_heads: 2,
        head_dim: d,
        layout,
        kv: kv.clone(),
        keys: keys.clone(),
        values: values.clone(),
        scores: Vec::new(),
    };
    let policy = AffPoolPolicy::new(AffPoolConfig { r_gpu: 0.25, max_run: 4 }).unwrap();
    let (mut store, run) = harness(&m, &kv, Box::new(policy), 2, 12);
    assert!((run.prefill_r_gpu - 0.25).abs() < 1e-12, "prefill r_GPU {}", run.prefill_r_gpu);
    assert_eq!(run.prefill_r_gpu, run.prefill_r_gpu_cpu, "nothing on the host");
    assert_eq!(run.recalls, 0);
    let view = store.layer_view(0).unwrap();
    let head = view.head(1).unwrap();
    let (mut pos, mut k, mut v) = (Vec::new(), Vec::new(), Vec::new());
    head.decode_into(&mut pos, &mut k, &mut v).unwrap();
    // Text 0..8, 16 pooled audio rows at 8, 12, …, 68, text 72..80, then 2 decoded tokens.
    let audio: Vec<u32> = pos.iter().copied().filter(|&p| (8..72).contains(&p)).collect();
    assert_eq!(audio, (8..72).step_by(4).collect::<Vec<u32>>());
    let i = pos.iter().position(|&p| p == 12).unwrap();
    for j in 0..d {
        let mean_k: f32 = (12..16).map(|p| keys[(t + p) * d + j]).sum::<f32>() / 4.0;
        let mean_v: f32 = (12..16).map(|p| values[(t + p) * d + j]).sum::<f32>() / 4.0;
        assert!((k[i * d + j] - mean_k).abs() < 1e-3, "key {j}");
        assert!((v[i * d + j] - mean_v).abs() < 1e-3, "value {j}");
    }
    drop(view);
    store.audit().unwrap();
}
