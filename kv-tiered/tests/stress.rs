//! Concurrency stress of the WnW §2.3 decode loop — 10⁵ random steps with the recall worker,
//! checked invariants, no deadlock (bounded time), no lost segment: a runtime-shaped loop —
//! per layer append, wait for the layer's view and read it, then end the step — under random
//! anchor weights, with the recall worker copying concurrently. A watchdog bounds the wall time.

mod common;

use std::num::NonZeroU32;
use std::sync::mpsc;
use std::time::Duration;

use common::{Model, rng};
use kv_tiered::policy::{EvictionLag, SegmentQuota, WnwConfig};
use kv_tiered::tier::{FaultSchedule, FaultyTier};
use kv_tiered::{AudioLayout, HeadRoles, RetentionSchedule, Role, TieredStore, policy::WnwPolicy};
use rand::Rng;

const STEPS: usize = 100_000;
const AUDIT_EVERY: usize = 4_999;

fn roles(heads: usize) -> Vec<Role> {
    (0..heads).map(|h| [Role::Anchor, Role::Tidal, Role::Tidal, Role::Fixed][h % 4]).collect()
}

fn run<T: kv_tiered::Tier>(
    mut store: TieredStore<T>,
    m: &Model,
    steps: usize,
    seed: u64,
    tolerate_faults: bool,
) -> (u64, u64) {
    let mut r = rng(seed);
    let t = m.layout.audio_len();
    let role = roles(m.heads());
    let mut weights = vec![0.0f32; t];
    let row = vec![0.25f32; m.kv_heads * m.head_dim];
    for step in 0..steps {
        let append = r.random_bool(0.02);
        for l in 0..m.layers {
            if append {
                // An injected allocation fault may refuse the token; the store stays consistent.
                let appended = store.append(l, &row, &row);
                assert!(appended.is_ok() || tolerate_faults, "{appended:?}");
            }
            let view = store.layer_view(l).unwrap();
            for k in 0..m.kv_heads {
                let h = view.head(k).unwrap();
                assert!(h.dense.positions.len() >= m.layout.text_len());
            }
        }
        let frontier = r.random_range(0..t);
        weights.iter_mut().enumerate().for_each(|(i, w)| {
            *w = if i.abs_diff(frontier) < 8 { 1.0 } else { r.random_range(0.0..0.05) }
        });
        store.add_audio_weights(&weights).unwrap();
        store.end_step().unwrap();
        if step % AUDIT_EVERY == 0 || step + 1 == steps {
            let audit = store.audit().unwrap();
            assert!(audit.violations.is_empty(), "step {step}: {:?}", audit.violations);
            for (a, role) in audit.heads.iter().zip(&role) {
                match role {
                    Role::Anchor => assert_eq!(a.device_audio, t),
                    Role::Tidal => assert_eq!(a.covered, t, "lost segment at step {step}"),
                    Role::Fixed => assert_eq!(a.recalled_units, 0),
                }
            }
        }
    }
    let run = store.run_metrics();
    (run.recalls, run.failed_recalls)
}

fn store_for(m: &Model) -> (WnwPolicy, kv_tiered::StoreConfig) {
    let hr = HeadRoles::from_roles(m.layers, m.kv_heads, &roles(m.heads())).unwrap();
    let sched = RetentionSchedule::uniform(&hr, 0.3).unwrap();
    let cfg = WnwConfig {
        top_chunks: 3,
        lag: EvictionLag::Steps(NonZeroU32::new(2).unwrap()),
        quota: SegmentQuota::PerSegment,
    };
    let mut config = m.config(STEPS / 20);
    config.queue_capacity = 16; // small queue: end_step must block on a full channel without deadlocking
    (WnwPolicy::new(hr, sched, m.layout, cfg).unwrap(), config)
}

/// Runs `f` on a thread and fails if it does not finish within `limit`.
fn with_watchdog<R: Send + 'static>(limit: Duration, f: impl FnOnce() -> R + Send + 'static) -> R {
    let (tx, rx) = mpsc::channel();
    let handle = std::thread::spawn(move || {
        let r = f();
        let _ = tx.send(());
        r
    });
    match rx.recv_timeout(limit) {
        Ok(()) => handle.join().unwrap(),
        Err(mpsc::RecvTimeoutError::Disconnected) => handle.join().unwrap(), // panicked: re-raise
        Err(mpsc::RecvTimeoutError::Timeout) => panic!("stress run exceeded {limit:?}: deadlock?"),
    }
}

#[test]
fn hundred_thousand_steps_with_recall_worker() {
    let (recalls, failed) = with_watchdog(Duration::from_secs(300), || {
        let layout = AudioLayout::new(230, 10..210, 5, 10).unwrap();
        let m = Model::random(7, 2, 4, 2, 4, layout);
        let (policy, config) = store_for(&m);
        let store = TieredStore::prefill_host(config, Box::new(policy), &m.kv, &m.scores).unwrap();
        run(store, &m, STEPS, 7, false)
    });
    assert!(recalls > STEPS as u64, "the recall path was exercised ({recalls} recalls)");
    assert_eq!(failed, 0);
}

#[test]
fn failing_moves_lose_nothing() {
    let (recalls, failed) = with_watchdog(Duration::from_secs(120), || {
        let layout = AudioLayout::new(120, 10..110, 5, 10).unwrap();
        let m = Model::random(8, 2, 4, 2, 4, layout);
        let (policy, config) = store_for(&m);
        let inner = kv_tiered::HostTier::new(config.tier_config(&policy)).unwrap();
        let schedule = FaultSchedule {
            alloc_device_every: Some(7),
            copy_every: Some(5),
            event_every: Some(11),
        };
        let tier = std::sync::Arc::new(FaultyTier::new(inner, schedule));
        tier.set_armed(false);
        let store = TieredStore::prefill(
            config,
            std::sync::Arc::clone(&tier),
            Box::new(policy),
            &m.kv,
            &m.scores,
        )
        .unwrap();
        tier.set_armed(true);
        let counts = run(store, &m, 10_000, 8, true);
        assert!(tier.injected() > 0);
        // Dropping the store returned every page: nothing leaked on failed moves.
        for l in 0..m.layers {
            assert_eq!(tier.inner().device_pages_in_use(0, l), 0, "layer {l} leaked device pages");
        }
        assert_eq!(tier.inner().host_pages_in_use(0), 0);
        counts
    });
    assert!(failed > 0 && recalls > failed, "faults were injected ({failed} of {recalls})");
}
