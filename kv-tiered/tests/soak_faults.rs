//! Fault-injection soak (WnW §2.3 recall path under failures): many short WnW episodes
//! (random shapes, roles, retention, δ and top-k) on the crate's [`FaultyTier`] with a random
//! [`FaultRates`] plan per episode — device allocations, copy issues and copy completions
//! fail at random — with the store's invariants checked after **every** step:
//!
//! * no lost CPU copy: anchors hold all audio on the device, tidal heads cover all audio
//!   (device ∪ host), fixed heads never recall ([`TieredStore::audit`] also checks the
//!   residency tables against the flags and the r_GPU counters against a recount);
//! * attention is served from what is resident: every head's view holds exactly the text,
//!   generated tokens, retained audio and recalled segments — before the step's failures are
//!   applied it may only miss recalled rows — and every row decodes to the exact prompt or
//!   generated row (f32 rows, so bit-exact; a corrupt or stale page would show);
//! * failures are reported: injected faults = failed appends + failed prefills + recalls
//!   reported failed (by `sync` and in `StepMetrics::failed_recalls`), exactly;
//! * retry / degrade: after any step without a fault, every selected segment of every tidal
//!   head is resident — failed recalls were retried;
//! * nothing leaks: after each episode the tier has no device or host page in use;
//! * bounded time: a watchdog fails the run if it stalls.
//!
//! `SOAK_STEPS` sets the number of steps (CI default 100 000). Full run:
//! `SOAK_STEPS=1000000 cargo test -p kv-tiered --release --test soak_faults -- --nocapture`
//! (figures in `docs/bad-inputs.md`).

mod common;

use std::collections::BTreeSet;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{Model, random_roles, rng};
use kv_tiered::policy::{EvictionLag, SegmentQuota, WnwConfig, WnwPolicy};
use kv_tiered::tier::{FaultOp, FaultRates, FaultyTier, TierError};
use kv_tiered::{AudioLayout, HeadRoles, HostTier, RetentionSchedule, Role, Tier, TieredStore};
use rand::Rng;
use rand::rngs::StdRng;

/// Steps per episode (a fresh prefill each time).
const EPISODE_STEPS: usize = 400;

/// The crate's one fault injector, fed a random plan per episode: draws are a hash of
/// (seed, operation, call number), so a run is reproducible — allocations happen on the
/// store's thread and copies on its worker, each in a deterministic order.
type Faulty = FaultyTier<HostTier>;

/// Faults injected so far, per operation.
fn injected(tier: &Faulty) -> [u64; 3] {
    FaultOp::ALL.map(|op| tier.injected_of(op))
}

type Store = TieredStore<Faulty>;

/// One episode's model, roles, policy knobs and the rows of its generated tokens.
struct Episode {
    model: Model,
    roles: Vec<Role>,
    top_chunks: usize,
    /// Per head: audio positions kept on the device at prefill (never released).
    retained: Vec<BTreeSet<u32>>,
    /// Generated tokens per layer so far.
    generated: Vec<usize>,
    max_new: usize,
}

/// Row `i` of a generated token: deterministic in (layer, kv-head, token, value/key).
fn generated_row(
    layer: usize,
    kv_head: usize,
    token: usize,
    head_dim: usize,
    value: bool,
) -> Vec<f32> {
    let salt = layer * 7 + kv_head * 3 + token * 5 + usize::from(value) * 11;
    (0..head_dim).map(|j| ((salt + j * 13) % 17) as f32 * 0.25 - 2.0).collect()
}

/// Totals over the whole soak.
#[derive(Debug, Default)]
struct Figures {
    steps: u64,
    episodes: u64,
    injected: [u64; 3],
    failed_prefills: u64,
    failed_appends: u64,
    reported_failed_recalls: u64,
    recalls: u64,
    releases: u64,
    retry_checks: u64,
    views_checked: u64,
}

fn random_episode(r: &mut StdRng, max_new: usize) -> (Episode, WnwPolicy, kv_tiered::StoreConfig) {
    let (before, audio, after) =
        (r.random_range(0..8), r.random_range(6..60), r.random_range(1..8));
    let seg = r.random_range(2..8);
    let layout = AudioLayout::new(
        before + audio + after,
        before..before + audio,
        seg,
        seg + r.random_range(0..6),
    )
    .unwrap();
    let (layers, kv_heads, group) =
        (r.random_range(1..3), r.random_range(1..4), r.random_range(1..3));
    let model = Model::random(r.random(), layers, kv_heads, group, 4, layout);
    let roles = random_roles(r, model.heads());
    let hr = HeadRoles::from_roles(layers, kv_heads, &roles).unwrap();
    let sched = RetentionSchedule::uniform(&hr, r.random_range(0.0..0.7)).unwrap();
    let top_chunks = r.random_range(1..4);
    let lag = EvictionLag::Steps(NonZeroU32::new(r.random_range(1..5)).unwrap());
    let cfg = WnwConfig { top_chunks, lag, quota: SegmentQuota::PerSegment };
    let policy = WnwPolicy::new(hr, sched, layout, cfg).unwrap();
    let mut config = model.config(max_new);
    config.queue_capacity = r.random_range(1..32);
    let episode = Episode {
        model,
        roles,
        top_chunks,
        retained: Vec::new(),
        generated: vec![0; layers],
        max_new,
    };
    (episode, policy, config)
}

/// Prefill under faults: a failure must be a tier error that leaks no page; then retry.
fn prefill(
    ep: &Episode,
    policy: WnwPolicy,
    config: kv_tiered::StoreConfig,
    tier: &Arc<Faulty>,
    figures: &mut Figures,
) -> Store {
    let m = &ep.model;
    let first =
        TieredStore::prefill(config, Arc::clone(tier), Box::new(policy.clone()), &m.kv, &m.scores);
    match first {
        Ok(store) => store,
        Err(e) => {
            assert!(matches!(e, kv_tiered::Error::Tier(TierError::Injected { .. })), "{e}");
            assert_no_pages(tier, m.layers);
            figures.failed_prefills += 1;
            tier.set_armed(false);
            let store =
                TieredStore::prefill(config, Arc::clone(tier), Box::new(policy), &m.kv, &m.scores)
                    .unwrap();
            tier.set_armed(true);
            store
        }
    }
}

fn assert_no_pages(tier: &Faulty, layers: usize) {
    for pool in 0..tier.pools().len() {
        for l in 0..layers {
            assert_eq!(tier.inner().device_pages_in_use(pool, l), 0, "device pages leaked");
        }
        assert_eq!(tier.inner().host_pages_in_use(pool), 0, "host pages leaked");
    }
}

/// Audio positions of head `h` on the device right after prefill (no unit is recalled yet).
fn retained_audio(store: &Store, ep: &Episode) -> Vec<BTreeSet<u32>> {
    let (m, units) = (&ep.model, store.residency().units());
    let mut out = Vec::new();
    for l in 0..m.layers {
        let view = store.layer_view(l).unwrap();
        for k in 0..m.kv_heads {
            let h = l * m.kv_heads + k;
            assert!((0..units).all(|u| !store.residency().resident(h, u)), "recalled at prefill");
            let v = view.head(k).unwrap();
            let audio = v.dense.positions.iter().chain(v.sparse.positions);
            out.push(audio.copied().filter(|&p| m.layout.is_audio(p as usize)).collect());
        }
    }
    out
}

/// The exact resident set of head `h` from the residency flags (valid after `sync`).
fn expected_positions(store: &Store, ep: &Episode, h: usize) -> BTreeSet<u32> {
    let m = &ep.model;
    let (layout, l) = (m.layout, h / m.kv_heads);
    let end = layout.seq_len() + ep.generated[l];
    let mut set: BTreeSet<u32> =
        (0..end).filter(|&p| !layout.is_audio(p)).map(|p| p as u32).collect();
    set.extend(&ep.retained[h]);
    for u in 0..store.residency().units() {
        if store.residency().resident(h, u) {
            let seg = layout.segment(u);
            let a0 = layout.audio_start();
            set.extend((a0 + seg.start..a0 + seg.end).map(|p| p as u32));
        }
    }
    set
}

/// Checks every head's view: rows decode to the source rows; `exact` demands exactly the
/// expected set, otherwise only that the permanent rows are there (failures pending).
fn check_views(store: &Store, ep: &Episode, exact: bool, figures: &mut Figures) {
    let m = &ep.model;
    let d = m.head_dim;
    let (mut pos, mut keys, mut values) = (Vec::new(), Vec::new(), Vec::new());
    for l in 0..m.layers {
        let view = store.layer_view(l).unwrap();
        for k in 0..m.kv_heads {
            let h = l * m.kv_heads + k;
            view.head(k).unwrap().decode_into(&mut pos, &mut keys, &mut values).unwrap();
            let expected = expected_positions(store, ep, h);
            let got: BTreeSet<u32> = pos.iter().copied().collect();
            assert_eq!(got.len(), pos.len(), "head {h}: duplicate positions");
            if exact {
                assert_eq!(got, expected, "head {h}: view differs from residency");
            } else {
                let permanent = expected
                    .iter()
                    .filter(|&&p| !m.layout.is_audio(p as usize) || ep.retained[h].contains(&p));
                assert!(permanent.clone().all(|p| got.contains(p)), "head {h}: lost a row");
                assert!(got.is_subset(&expected), "head {h}: row not planned resident");
            }
            for (i, &p) in pos.iter().enumerate() {
                let p = p as usize;
                let (kr, vr) = (&keys[i * d..(i + 1) * d], &values[i * d..(i + 1) * d]);
                if p < m.layout.seq_len() {
                    assert_eq!(kr, m.row(false, h, p), "head {h} key {p}");
                    assert_eq!(vr, m.row(true, h, p), "head {h} value {p}");
                } else {
                    let t = p - m.layout.seq_len();
                    assert_eq!(kr, generated_row(l, k, t, d, false), "head {h} key {p}");
                    assert_eq!(vr, generated_row(l, k, t, d, true), "head {h} value {p}");
                }
            }
            figures.views_checked += 1;
        }
    }
}

/// §2.3 chunk selection, modelled independently: segments of the top-k chunks.
fn selected_segments(layout: &AudioLayout, w: &[f32], k: usize) -> Vec<bool> {
    let mut chunks: Vec<(f64, usize)> = (0..layout.num_chunks())
        .map(|c| {
            let r = layout.chunk(c);
            (r.clone().map(|i| f64::from(w[i])).sum::<f64>() / r.len() as f64, c)
        })
        .collect();
    chunks.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
    let mut sel = vec![false; layout.num_segments()];
    for &(_, c) in chunks.iter().take(k) {
        let r = layout.chunk(c);
        for (s, flag) in sel.iter_mut().enumerate() {
            let seg = layout.segment(s);
            *flag |= seg.start < r.end && r.start < seg.end;
        }
    }
    sel
}

/// Appends one token to every layer, retrying refused appends (each refusal must be an
/// injected fault and leave the store unchanged — checked by the next audit and views).
fn append_token(store: &mut Store, ep: &mut Episode, figures: &mut Figures) {
    let (m, d) = (&ep.model, ep.model.head_dim);
    for l in 0..m.layers {
        let t = ep.generated[l];
        let keys: Vec<f32> =
            (0..m.kv_heads).flat_map(|k| generated_row(l, k, t, d, false)).collect();
        let values: Vec<f32> =
            (0..m.kv_heads).flat_map(|k| generated_row(l, k, t, d, true)).collect();
        let mut attempts = 0;
        while let Err(e) = store.append(l, &keys, &values) {
            assert!(matches!(e, kv_tiered::Error::Tier(TierError::Injected { .. })), "{e}");
            figures.failed_appends += 1;
            attempts += 1;
            assert!(attempts < 1000, "append never succeeds");
        }
        ep.generated[l] += 1;
    }
}

/// Per-step role checks on the audit, plus the exact r_GPU recount.
fn check_audit(store: &mut Store, ep: &Episode) {
    let audit = store.audit().unwrap();
    assert!(audit.violations.is_empty(), "{:?}", audit.violations);
    assert!((audit.r_gpu - store.r_gpu()).abs() < 1e-12);
    assert!((audit.r_gpu_cpu - store.r_gpu_cpu()).abs() < 1e-12);
    let t = ep.model.layout.audio_len();
    for (h, (a, role)) in audit.heads.iter().zip(&ep.roles).enumerate() {
        match role {
            Role::Anchor => assert_eq!(a.device_audio, t, "anchor {h} lost audio"),
            Role::Tidal => assert_eq!(a.covered, t, "tidal {h} lost its CPU copy"),
            Role::Fixed => assert_eq!(a.recalled_units, 0, "fixed {h} recalled"),
        }
    }
}

fn step(store: &mut Store, ep: &mut Episode, r: &mut StdRng, tier: &Faulty, f: &mut Figures) {
    let before = tier.injected();
    if ep.generated[0] < ep.max_new && r.random_bool(0.05) {
        append_token(store, ep, f);
    }
    let layout = ep.model.layout;
    let frontier = r.random_range(0..layout.audio_len());
    let w: Vec<f32> = (0..layout.audio_len())
        .map(|i| if i.abs_diff(frontier) < 4 { 1.0 } else { r.random_range(0.0..0.1) })
        .collect();
    store.add_audio_weights(&w).unwrap();
    let m = *store.end_step().unwrap();
    f.reported_failed_recalls += u64::from(m.failed_recalls);
    (f.recalls, f.releases) =
        (f.recalls + u64::from(m.recalls), f.releases + u64::from(m.releases));
    // Recalls landed or failed, failures not applied yet: attention must still be served
    // from what is resident (a failed recall's rows are simply missing).
    check_views(store, ep, false, f);
    f.reported_failed_recalls += u64::from(store.sync().unwrap());
    check_audit(store, ep);
    check_views(store, ep, true, f);
    if tier.injected() == before {
        let sel = selected_segments(&layout, &w, ep.top_chunks);
        for (h, role) in ep.roles.iter().enumerate() {
            for (s, &on) in sel.iter().enumerate() {
                if *role == Role::Tidal && on && store.residency().recallable(h, s) {
                    assert!(store.residency().resident(h, s), "head {h} segment {s} not retried");
                    f.retry_checks += 1;
                }
            }
        }
    }
    f.steps += 1;
}

fn run_soak(total_steps: u64, seed: u64) -> Figures {
    let mut r = rng(seed);
    let mut f = Figures::default();
    // Fault probabilities per episode, in parts per 2^16 (the seed is drawn per episode).
    let rate_sets = [
        FaultRates::default(),
        FaultRates { alloc_device: 3000, copy: 3000, event: 3000, seed: 0 },
        FaultRates { alloc_device: 20_000, copy: 10_000, event: 20_000, seed: 0 },
    ];
    while f.steps < total_steps {
        let (mut ep, policy, config) = random_episode(&mut r, 24);
        let rates = rate_sets[f.episodes as usize % rate_sets.len()];
        let inner = HostTier::new(config.tier_config(&policy)).unwrap();
        let plan = FaultRates { seed: r.random(), ..rates };
        let tier = Arc::new(FaultyTier::new(inner, plan));
        let mut store = prefill(&ep, policy, config, &tier, &mut f);
        ep.retained = retained_audio(&store, &ep);
        check_audit(&mut store, &ep);
        let steps = (EPISODE_STEPS as u64).min(total_steps - f.steps);
        for _ in 0..steps {
            step(&mut store, &mut ep, &mut r, &tier, &mut f);
        }
        let injected = injected(&tier);
        let accounted = f.failed_prefills + f.failed_appends + f.reported_failed_recalls;
        drop(store);
        assert_no_pages(&tier, ep.model.layers);
        for (total, now) in f.injected.iter_mut().zip(injected) {
            *total += now;
        }
        assert_eq!(f.injected.iter().sum::<u64>(), accounted, "a fault went unreported");
        f.episodes += 1;
    }
    f
}

#[test]
fn soak_random_faults_every_step_checked() {
    let steps: u64 =
        std::env::var("SOAK_STEPS").ok().and_then(|s| s.parse().ok()).unwrap_or(100_000);
    let (tx, rx) = std::sync::mpsc::channel();
    let start = Instant::now();
    let worker = std::thread::spawn(move || {
        let f = run_soak(steps, 0x50a6);
        let _ = tx.send(());
        f
    });
    let limit = Duration::from_secs(60 + steps / 500);
    match rx.recv_timeout(limit) {
        Ok(()) | Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {}
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => panic!("soak exceeded {limit:?}"),
    }
    let f = worker.join().unwrap();
    let secs = start.elapsed().as_secs_f64();
    println!("soak: {f:?}");
    println!("soak: {:.1} s, {:.0} steps/s", secs, f.steps as f64 / secs);
    assert_eq!(f.steps, steps);
    assert!(f.injected.iter().all(|&n| n > 0), "every fault kind was injected: {f:?}");
    assert!(f.retry_checks > 0 && f.recalls > f.reported_failed_recalls);
}

/// Regression for the leak the soak found: a device allocation failing part-way through a
/// head's permanent rows at prefill leaked the pages that head had already taken. Fails
/// the n-th allocation for every n a prefill makes (dense and SWAN sparse rows) and checks
/// that every page comes back.
#[test]
fn prefill_failing_at_any_allocation_returns_every_page() {
    use kv_tiered::tier::FaultSchedule;
    let layout = AudioLayout::new(70, 5..65, 4, 8).unwrap();
    let model = Model::random(3, 2, 2, 2, 8, layout);
    let roles = [Role::Anchor, Role::Tidal, Role::Tidal, Role::Fixed];
    for sparse in [false, true] {
        let hr = HeadRoles::from_roles(2, 2, &roles).unwrap();
        let sched = RetentionSchedule::uniform(&hr, 0.4).unwrap();
        let policy = WnwPolicy::new(hr, sched, layout, WnwConfig::default()).unwrap();
        let mut config = model.config(40);
        if sparse {
            config.rows = kv_tiered::RowLayout::with_sparse(8, kv_sparse::ValueFormat::F32, 3, 3);
        }
        let mut failures = 0;
        for n in 1..200 {
            let inner = HostTier::new(config.tier_config(&policy)).unwrap();
            let schedule = FaultSchedule { alloc_device_every: Some(n), ..Default::default() };
            let tier = Arc::new(FaultyTier::new(inner, schedule));
            let built = TieredStore::prefill(
                config,
                Arc::clone(&tier),
                Box::new(policy.clone()),
                &model.kv,
                &model.scores,
            );
            match built {
                Ok(store) => drop(store),
                Err(e) => {
                    assert!(matches!(e, kv_tiered::Error::Tier(TierError::Injected { .. })), "{e}");
                    failures += 1;
                }
            }
            for pool in 0..tier.pools().len() {
                for l in 0..2 {
                    let left = tier.inner().device_pages_in_use(pool, l);
                    assert_eq!(left, 0, "sparse {sparse}, fail #{n}: pool {pool} layer {l}");
                }
                assert_eq!(tier.inner().host_pages_in_use(pool), 0);
            }
        }
        assert!(failures > 10, "prefill allocations were failed ({failures})");
    }
}
