//! Concurrency stress of the WnW §2.3 recall path: the recall worker and the residency
//! tables, with many threads hammering views while recalls complete. Why this is a stress
//! test and not a loom model is argued in `docs/bad-inputs.md` ("Concurrency"); in short, loom can
//! only model code written against loom's own primitives, and the store's worker protocol
//! runs on `parking_lot` locks, a `parking_lot::Condvar` with a timed wait and a crossbeam
//! channel — none of which loom can substitute without rewriting the store. These tests
//! therefore hammer the real code:
//!
//! * [`stores_on_one_shared_tier`]: several stores, each on its own thread with its own recall
//!   worker, share ONE growable host tier — so page allocation (free-list mutex, arena write
//!   lock on growth), recall copies and layer views (arena read locks) of all stores interleave
//!   on the same locks. Every step, every layer view of every store is decoded and each row
//!   must equal its source row bit for bit (a page handed to two owners, a torn copy or a
//!   view taken before its layer's recalls landed would show); the audit (tables vs flags,
//!   counters vs recount, no lost tidal CPU copy) runs periodically; after all stores are
//!   dropped the tier holds no device page. A watchdog bounds the time (deadlock = failure).
//! * [`tier_pages_hammered_by_threads`]: threads allocate, write, copy, read back and free
//!   pages of one tier concurrently, each checking its own bytes survive everyone else's
//!   traffic and arena growth.
//!
//! `CONCURRENCY_STEPS` scales the first test (CI default 1 500 steps per store).

mod common;

use std::num::NonZeroU32;
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

use common::{Model, rng};
use kv_tiered::policy::{EvictionLag, SegmentQuota, WnwConfig, WnwPolicy};
use kv_tiered::tier::{ArenaRead, CopyEvent, PoolSpec, TierConfig};
use kv_tiered::{AudioLayout, HeadRoles, HostTier, RetentionSchedule, Role, Tier, TieredStore};
use rand::Rng;

/// Stores (threads) sharing the tier; each also runs a recall worker thread.
const STORES: usize = 6;
/// Audit period in steps.
const AUDIT_EVERY: usize = 97;

fn steps() -> usize {
    std::env::var("CONCURRENCY_STEPS").ok().and_then(|s| s.parse().ok()).unwrap_or(1_500)
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
        Ok(()) | Err(mpsc::RecvTimeoutError::Disconnected) => handle.join().unwrap(),
        Err(mpsc::RecvTimeoutError::Timeout) => panic!("exceeded {limit:?}: deadlock?"),
    }
}

fn roles(heads: usize) -> Vec<Role> {
    (0..heads).map(|h| [Role::Tidal, Role::Anchor, Role::Tidal, Role::Fixed][h % 4]).collect()
}

fn layout() -> AudioLayout {
    AudioLayout::new(96, 6..90, 4, 8).unwrap()
}

/// Every store has the same geometry (so they can share one tier) and its own data.
fn model(seed: u64) -> Model {
    Model::random(seed, 2, 4, 2, 8, layout())
}

fn policy(m: &Model, seed: u64) -> WnwPolicy {
    let hr = HeadRoles::from_roles(m.layers, m.kv_heads, &roles(m.heads())).unwrap();
    let sched = RetentionSchedule::uniform(&hr, 0.25).unwrap();
    let cfg = WnwConfig {
        top_chunks: 1 + (seed % 3) as usize,
        lag: EvictionLag::Steps(NonZeroU32::new(1 + (seed % 3) as u32).unwrap()),
        quota: SegmentQuota::PerSegment,
    };
    WnwPolicy::new(hr, sched, m.layout, cfg).unwrap()
}

/// Row of generated token `t` (deterministic per store, layer, head).
fn generated_row(
    store: usize,
    layer: usize,
    head: usize,
    t: usize,
    head_dim: usize,
    v: bool,
) -> Vec<f32> {
    let salt = store * 131 + layer * 17 + head * 7 + t * 3 + usize::from(v);
    (0..head_dim).map(|j| ((salt + j * 11) % 23) as f32 * 0.125 - 1.0).collect()
}

/// Decodes every head of every layer and checks each row against its source.
fn check_views(store: &TieredStore<HostTier>, m: &Model, id: usize, generated: usize) {
    let (d, n) = (m.head_dim, m.layout.seq_len());
    let (mut pos, mut keys, mut values) = (Vec::new(), Vec::new(), Vec::new());
    for l in 0..m.layers {
        let view = store.layer_view(l).unwrap();
        for k in 0..m.kv_heads {
            let h = l * m.kv_heads + k;
            view.head(k).unwrap().decode_into(&mut pos, &mut keys, &mut values).unwrap();
            assert!(pos.windows(2).all(|w| w[0] != w[1]), "store {id} head {h}: duplicate row");
            let text = pos.iter().filter(|&&p| !m.layout.is_audio(p as usize)).count();
            assert_eq!(text, n - m.layout.audio_len() + generated, "store {id} head {h}: text");
            for (i, &p) in pos.iter().enumerate() {
                let (p, r) = (p as usize, i * d..(i + 1) * d);
                if p < n {
                    assert_eq!(&keys[r.clone()], m.row(false, h, p), "store {id} head {h} key {p}");
                    assert_eq!(&values[r], m.row(true, h, p), "store {id} head {h} value {p}");
                } else {
                    let t = p - n;
                    assert_eq!(keys[r.clone()], generated_row(id, l, k, t, d, false)[..]);
                    assert_eq!(values[r], generated_row(id, l, k, t, d, true)[..]);
                }
            }
        }
    }
}

fn audit(store: &mut TieredStore<HostTier>, m: &Model, id: usize, step: usize) {
    let a = store.audit().unwrap();
    assert!(a.violations.is_empty(), "store {id} step {step}: {:?}", a.violations);
    for (head, role) in a.heads.iter().zip(roles(m.heads())) {
        match role {
            Role::Anchor => assert_eq!(head.device_audio, m.layout.audio_len()),
            Role::Tidal => assert_eq!(head.covered, m.layout.audio_len(), "lost a CPU copy"),
            Role::Fixed => assert_eq!(head.recalled_units, 0),
        }
    }
}

/// One store's life on a shared tier; returns the recalls it completed.
fn run_store(tier: Arc<HostTier>, id: usize, steps: usize) -> u64 {
    let m = model(100 + id as u64);
    let config = m.config(steps / 8 + 1);
    let mut store =
        TieredStore::prefill(config, tier, Box::new(policy(&m, id as u64)), &m.kv, &m.scores)
            .unwrap();
    let mut r = rng(id as u64);
    let (t, d) = (m.layout.audio_len(), m.head_dim);
    let mut weights = vec![0.0f32; t];
    let mut generated = 0;
    for step in 0..steps {
        if r.random_bool(0.1) && generated < steps / 8 {
            for l in 0..m.layers {
                let row = |v: bool| -> Vec<f32> {
                    (0..m.kv_heads).flat_map(|k| generated_row(id, l, k, generated, d, v)).collect()
                };
                let (keys, values) = (row(false), row(true));
                store.append(l, &keys, &values).unwrap();
            }
            generated += 1;
        }
        // Views are taken while the recalls issued by the previous `end_step` complete.
        check_views(&store, &m, id, generated);
        let frontier = r.random_range(0..t);
        weights.iter_mut().enumerate().for_each(|(i, w)| {
            *w = if i.abs_diff(frontier) < 6 { 1.0 } else { r.random_range(0.0..0.05) }
        });
        store.add_audio_weights(&weights).unwrap();
        store.end_step().unwrap();
        if step % AUDIT_EVERY == 0 {
            audit(&mut store, &m, id, step);
        }
    }
    let run = store.run_metrics();
    assert_eq!(run.failed_recalls, 0, "store {id}");
    run.recalls
}

#[test]
fn stores_on_one_shared_tier() {
    let steps = steps();
    let started = Instant::now();
    let recalls = with_watchdog(Duration::from_secs(600), move || {
        let m = model(0);
        let tier_config = m.config(steps / 8 + 1).tier_config(&policy(&m, 0));
        let tier = Arc::new(HostTier::new(tier_config).unwrap());
        let threads: Vec<_> = (0..STORES)
            .map(|id| {
                let tier = Arc::clone(&tier);
                std::thread::spawn(move || run_store(tier, id, steps))
            })
            .collect();
        let recalls: Vec<u64> = threads.into_iter().map(|t| t.join().unwrap()).collect();
        for pool in 0..tier.pools().len() {
            for l in 0..m.layers {
                assert_eq!(tier.device_pages_in_use(pool, l), 0, "device pages leaked");
            }
        }
        recalls
    });
    eprintln!(
        "{STORES} stores × {steps} steps on one tier: recalls {recalls:?} in {:?}",
        started.elapsed()
    );
    assert!(recalls.iter().all(|&r| r > steps as u64 / 4), "the recall path ran: {recalls:?}");
}

/// A byte pattern unique to (thread, round, row slot).
fn pattern(thread: usize, round: usize, len: usize) -> Vec<u8> {
    (0..len).map(|i| (thread * 37 + round * 11 + i * 5) as u8).collect()
}

#[test]
fn tier_pages_hammered_by_threads() {
    const THREADS: usize = 8;
    const ROUNDS: usize = 2_000;
    let spec = PoolSpec { page_rows: 4, key_row_bytes: 16, value_row_bytes: 8 };
    let config =
        TierConfig { layers: 2, pools: vec![spec], device_pages_per_layer: None, host_pages: None };
    let tier = Arc::new(HostTier::new(config).unwrap());
    with_watchdog(Duration::from_secs(300), {
        let tier = Arc::clone(&tier);
        move || {
            let threads: Vec<_> = (0..THREADS)
                .map(|id| {
                    let tier = Arc::clone(&tier);
                    std::thread::spawn(move || hammer(&tier, spec, id, ROUNDS))
                })
                .collect();
            threads.into_iter().for_each(|t| t.join().unwrap());
        }
    });
    for l in 0..2 {
        assert_eq!(tier.device_pages_in_use(0, l), 0);
    }
    assert_eq!(tier.host_pages_in_use(0), 0);
}

/// One thread's traffic: hold a few pages, write them through host→device copies, check
/// them through the arena, free them, repeat.
fn hammer(tier: &HostTier, spec: PoolSpec, id: usize, rounds: usize) {
    let mut r = rng(1000 + id as u64);
    let (kb, vb) = (spec.page_key_bytes(), spec.page_value_bytes());
    let mut held = Vec::new();
    for round in 0..rounds {
        let layer = r.random_range(0..2);
        let host = tier.alloc_host(0).unwrap();
        let (keys, values) = (pattern(id, round, kb), pattern(id + 100, round, vb));
        tier.write_host(host, 0, &keys, &values).unwrap();
        let page = tier.alloc_device(0, layer).unwrap();
        let (page, event) =
            tier.copy_to_device(host, page, spec.page_rows).map_err(|e| e.error).unwrap();
        event.wait().unwrap();
        tier.free_host(host);
        held.push((page, keys, values));
        if held.len() > 6 || r.random_bool(0.3) {
            let (page, keys, values) = held.swap_remove(r.random_range(0..held.len()));
            let arena = tier.arena(0, page.layer());
            let (k, v) = arena.host_bytes().unwrap();
            let i = page.index() as usize;
            assert_eq!(&k[i * kb..(i + 1) * kb], &keys[..], "thread {id}: key page overwritten");
            assert_eq!(
                &v[i * vb..(i + 1) * vb],
                &values[..],
                "thread {id}: value page overwritten"
            );
            drop(arena);
            tier.free_device(page);
        }
    }
    for (page, ..) in held {
        tier.free_device(page);
    }
}

/// Regression for the caveat in `docs/bad-inputs.md`: on a shared tier, a thread holding a
/// layer view takes a second view of the same layer while another thread waits to grow that
/// layer's arena (a write lock). With plain `parking_lot` read locks the queued writer blocked
/// the second read and the two threads deadlocked (this test hung until the watchdog fired);
/// host-tier arena views now take recursive read locks.
#[test]
fn second_view_while_another_thread_waits_to_grow_the_arena() {
    with_watchdog(Duration::from_secs(20), || {
        let m = model(7);
        let config = m.config(4);
        let tier = Arc::new(HostTier::new(config.tier_config(&policy(&m, 0))).unwrap());
        let store = TieredStore::prefill(
            config,
            Arc::clone(&tier),
            Box::new(policy(&m, 0)),
            &m.kv,
            &m.scores,
        )
        .unwrap();
        let first = store.layer_view(0).unwrap();
        let grower = std::thread::spawn({
            let tier = Arc::clone(&tier);
            move || {
                // Exhaust the free list so the next allocation grows the arena.
                let pages: Vec<_> = (0..64).map(|_| tier.alloc_device(0, 0).unwrap()).collect();
                pages.into_iter().for_each(|p| tier.free_device(p));
            }
        });
        std::thread::sleep(Duration::from_millis(200)); // let the grower queue for the lock
        let second = store.layer_view(0).unwrap();
        assert_eq!(second.kv_heads(), first.kv_heads());
        drop((first, second));
        grower.join().unwrap();
    });
}
