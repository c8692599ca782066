//! WnW at Voxtral-mini scale on the synthetic frontier workload (`kv_tiered::sim`): r_GPU,
//! r_GPU+CPU, recall traffic and policy time per step for dense f32 / dense bf16 rows and
//! SWAN fp8 sparse rows inside WnW (recall bytes/step with and without sparse rows).
//!
//! Run: `cargo run --release -p kv-tiered --example wnw_voxtral`

use kv_sparse::ValueFormat;
use kv_tiered::policy::WnwConfig;
use kv_tiered::sim::{SimConfig, SimModel, SplitMix, frontier_signal};
use kv_tiered::{Result, RowLayout};

fn main() -> Result<()> {
    let cfg = SimConfig::voxtral_mini();
    let model = SimModel::new(cfg)?;
    let d = cfg.head_dim;
    println!(
        "Voxtral-mini scale: {}×{} kv-heads, {} q-heads, d={}, {} audio tokens, n_voice {}, n_anchor {}, target r_GPU {}, {} decode steps",
        cfg.layers,
        cfg.kv_heads,
        cfg.q_heads,
        d,
        cfg.audio_len,
        cfg.n_voice,
        cfg.n_anchor,
        cfg.target_r_gpu,
        cfg.steps
    );
    let rows = [
        ("dense f32", RowLayout::dense_f32(d)),
        ("dense bf16", RowLayout { head_dim: d, dense: ValueFormat::Bf16, sparse: None }),
        ("SWAN fp8 k=64/64", RowLayout::with_sparse(d, ValueFormat::Bf16, 64, 64)),
        ("SWAN fp8 k=32/32", RowLayout::with_sparse(d, ValueFormat::Bf16, 32, 32)),
    ];
    println!(
        "{:>18} | {:>8} {:>10} | {:>10} {:>9} {:>9} | {:>10}",
        "rows", "r_GPU", "r_GPU+CPU", "KB/step", "recalls", "releases", "policy µs"
    );
    for (name, layout) in rows {
        let mut store = model.wnw_store(layout, WnwConfig::default())?;
        let (mut rng, mut w) = (SplitMix::new(7), vec![0.0f32; cfg.audio_len]);
        for step in 0..cfg.steps {
            frontier_signal(&mut rng, step, cfg.steps, &mut w);
            store.add_audio_weights(&w)?;
            store.end_step()?;
        }
        let audit = store.audit()?;
        assert!(audit.violations.is_empty(), "{:?}", audit.violations);
        let run = store.run_metrics();
        let per = |x: u64| x as f64 / run.steps as f64;
        println!(
            "{name:>18} | {:8.4} {:10.4} | {:10.1} {:9.2} {:9.2} | {:10.2}",
            run.mean_r_gpu(),
            run.mean_r_gpu_cpu(),
            run.mean_bytes_per_step() / 1e3,
            per(run.recalls),
            per(run.releases),
            run.mean_policy_time().as_secs_f64() * 1e6
        );
        println!(
            "{:>18}   prefill r_GPU {:.4}, r_GPU+CPU {:.4}, λ-solved",
            "", run.prefill_r_gpu, run.prefill_r_gpu_cpu
        );
    }
    Ok(())
}
