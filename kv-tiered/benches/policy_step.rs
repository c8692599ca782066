//! Per-step policy cost at Voxtral-mini scale (WnW §2.3 decode step; Table 4 runtime): 30
//! layers × 8 kv-heads, 32 q-heads, head_dim = 128, 5 anchors, 90 voice heads, 3000 audio
//! tokens, r_GPU = 0.2. One iteration = report the step's anchor weights + `end_step` (chunk scores, top-3, recall and
//! release decisions, bookkeeping, issuing recall jobs); the copies themselves run on the
//! recall worker and are waited for *outside* the timed region. Baseline in the same run:
//! the Full-cache policy through the same store (the harness's fixed per-step cost).
//!
//! Run: `cargo bench -p kv-tiered --bench policy_step`

use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use kv_sparse::ValueFormat;
use kv_tiered::policy::{FullPolicy, WnwConfig};
use kv_tiered::sim::{SimConfig, SimModel, SplitMix, frontier_signal};
use kv_tiered::{RowLayout, TieredStore};

fn timed_steps(
    store: &mut TieredStore,
    rng: &mut SplitMix,
    step: &mut usize,
    steps: usize,
    w: &mut [f32],
    iters: u64,
) -> Duration {
    let mut total = Duration::ZERO;
    for _ in 0..iters {
        frontier_signal(rng, *step % steps, steps, w);
        store.sync().expect("recall worker alive");
        let t0 = Instant::now();
        store.add_audio_weights(w).expect("valid weights");
        store.end_step().expect("valid step");
        total += t0.elapsed();
        *step += 1;
    }
    total
}

fn bench(c: &mut Criterion) {
    let cfg = SimConfig::voxtral_mini();
    let model = SimModel::new(cfg).expect("synthetic model");
    let d = cfg.head_dim;
    let mut group = c.benchmark_group("policy_step_voxtral_mini");
    group.sample_size(40).measurement_time(Duration::from_secs(4));
    let mut summary = Vec::new();
    let configs: [(&str, Option<RowLayout>); 3] = [
        ("full", None),
        ("wnw", Some(RowLayout::dense_f32(d))),
        ("wnw_swan_fp8_k64", Some(RowLayout::with_sparse(d, ValueFormat::F32, 64, 64))),
    ];
    for (name, rows) in configs {
        let mut store = match rows {
            None => TieredStore::prefill_host(
                cfg.store_config(RowLayout::dense_f32(d)).expect("config"),
                Box::new(FullPolicy),
                &model.kv,
                &[],
            ),
            Some(rows) => model.wnw_store(rows, WnwConfig::default()),
        }
        .expect("prefill");
        let (mut rng, mut step, mut w) = (SplitMix::new(7), 0usize, vec![0.0f32; cfg.audio_len]);
        group.bench_function(name, |b| {
            b.iter_custom(|iters| {
                timed_steps(&mut store, &mut rng, &mut step, cfg.steps, &mut w, iters)
            })
        });
        let run = store.run_metrics().clone();
        summary.push((name, run));
    }
    group.finish();
    let base = summary[0].1.mean_policy_time().as_secs_f64();
    for (name, run) in &summary {
        let t = run.mean_policy_time().as_secs_f64();
        println!(
            "{name:>18}: policy {:7.2} µs/step (×{:.2} vs full), {:8.1} KB/step recalled, {:.2} recalls/step, r_GPU {:.4}, r_GPU+CPU {:.4} over {} steps",
            t * 1e6,
            t / base,
            run.mean_bytes_per_step() / 1e3,
            run.recalls as f64 / run.steps.max(1) as f64,
            run.mean_r_gpu(),
            run.mean_r_gpu_cpu(),
            run.steps
        );
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
