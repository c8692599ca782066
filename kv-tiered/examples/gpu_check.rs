//! GPU decode + recall benchmark printed as one JSON object (run by `scripts/gpu-check.sh`):
//! attention kernels (`attn_kernels::cuda::bench`) and CUDA-tier recall overlap
//! (`kv_tiered::cuda::bench`). Each part reports its own error instead of aborting the other.

fn main() {
    let cfg = attn_kernels::cuda::bench::BenchConfig::default();
    let kernels = match attn_kernels::cuda::bench::run(&cfg) {
        Ok(rows) => format!(
            "[{}]",
            rows.iter().map(|r| r.to_json(cfg.peak_bytes_per_s)).collect::<Vec<_>>().join(",")
        ),
        Err(e) => format!("{{\"error\":{:?}}}", e.to_string()),
    };
    let recall = match kv_tiered::cuda::bench::recall_overlap(
        &kv_tiered::cuda::bench::RecallConfig::default(),
    ) {
        Ok(r) => r.to_json(),
        Err(e) => format!("{{\"error\":{e:?}}}"),
    };
    // A TieredStore decode on the CUDA tier (Voxtral-mini shape, r_GPU 0.2, 200 steps).
    let sim = kv_tiered::sim::SimModel::new(kv_tiered::sim::SimConfig {
        steps: 200,
        ..kv_tiered::sim::SimConfig::voxtral_mini()
    });
    let store = match sim
        .map_err(|e| e.to_string())
        .and_then(|s| kv_tiered::cuda::bench::store_steps(&s))
    {
        Ok(r) => r.to_json(),
        Err(e) => format!("{{\"error\":{e:?}}}"),
    };
    let device =
        attn_kernels::cuda::Gpu::new().map_or_else(|e| e.to_string(), |g| g.name().to_string());
    println!(
        "{{\"device\":{device:?},\"shape\":{{\"q_heads\":{},\"kv_heads\":{},\"head_dim\":{},\"k\":{},\"buffer\":{}}},\"peak_bytes_per_s\":{},\"kernels\":{kernels},\"recall\":{recall},\"store\":{store}}}",
        cfg.attn.q_heads(),
        cfg.attn.kv_heads(),
        cfg.attn.head_dim(),
        cfg.k,
        cfg.buffer,
        cfg.peak_bytes_per_s
    );
}
