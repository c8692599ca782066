//! CUDA tier tests: they run on a GPU and print `SKIPPED: <reason>` elsewhere (WnW §2.3
//! recall path: pinned host pool → device arena on the copy stream, failed moves hand back).

use super::CudaTier;
use crate::tier::{CopyEvent, PoolSpec, Tier, TierConfig, TierError};

fn tier_or_skip(device_pages: usize, host_pages: usize) -> Option<CudaTier> {
    let spec = PoolSpec { page_rows: 4, key_row_bytes: 16, value_row_bytes: 8 };
    let cfg = TierConfig {
        layers: 2,
        pools: vec![spec],
        device_pages_per_layer: Some(device_pages),
        host_pages: Some(host_pages),
    };
    match CudaTier::new(cfg) {
        Ok(t) => Some(t),
        Err(e) => {
            println!("SKIPPED: CUDA tier test: {e}");
            None
        }
    }
}

#[test]
fn unbounded_geometry_is_rejected_before_touching_the_driver() {
    let spec = PoolSpec { page_rows: 4, key_row_bytes: 16, value_row_bytes: 8 };
    let cfg = TierConfig {
        layers: 1,
        pools: vec![spec],
        device_pages_per_layer: None,
        host_pages: Some(1),
    };
    let err = CudaTier::new(cfg).err().expect("must fail");
    #[cfg(feature = "cuda")]
    assert!(matches!(err, TierError::Bounds { .. }), "{err:?}");
    #[cfg(not(feature = "cuda"))]
    assert!(matches!(err, TierError::Backend { .. }), "{err:?}");
}

#[test]
fn recall_round_trips_bytes_and_failed_moves_hand_the_page_back() {
    let Some(tier) = tier_or_skip(2, 3) else { return };
    let keys: Vec<u8> = (0..64).collect();
    let values: Vec<u8> = (100..132).collect();
    let host = tier.alloc_host(0).unwrap();
    tier.write_host(host, 0, &keys, &values).unwrap();
    let page = tier.alloc_device(0, 1).unwrap();
    let (page, event) = tier.copy_to_device(host, page, 4).map_err(|e| e.error).unwrap();
    event.wait().unwrap();
    let (mut k, mut v) = (vec![0u8; 64], vec![0u8; 32]);
    tier.read_device(&page, 0, &mut k, &mut v).unwrap();
    assert_eq!((k, v), (keys, values));
    // Too many rows: the move fails and the page comes back to its owner.
    let back = tier.copy_to_device(host, page, 5).unwrap_err();
    assert!(matches!(back.error, TierError::Bounds { what: "rows", .. }));
    tier.free_device(back.page);
    // The arena is bounded: a third page of (pool 0, layer 0) does not exist.
    let a = tier.alloc_device(0, 0).unwrap();
    let b = tier.alloc_device(0, 0).unwrap();
    assert!(matches!(
        tier.alloc_device(0, 0),
        Err(TierError::OutOfDeviceMemory { capacity: 2, .. })
    ));
    tier.free_device(a);
    tier.free_device(b);
}

/// The tier contract suite the host tiers pass (`tests/tier_contract.rs`), on the GPU.
#[test]
fn the_cuda_tier_meets_the_tier_contract() {
    use crate::tier::contract::{check_contract, contract_config};
    if let Err(e) = CudaTier::new(contract_config()) {
        println!("SKIPPED: CUDA tier contract: {e}");
        return;
    }
    check_contract(&CudaTier::new).unwrap();
}

fn sim_for_store() -> crate::sim::SimModel {
    crate::sim::SimModel::new(crate::sim::SimConfig {
        layers: 2,
        kv_heads: 2,
        q_heads: 4,
        head_dim: 16,
        text_before: 8,
        audio_len: 300,
        text_after: 8,
        n_voice: 3,
        n_anchor: 1,
        target_r_gpu: 0.3,
        steps: 24,
        seed: 3,
    })
    .unwrap()
}

/// Decodes the same WnW run on a host tier and on `second`: the same decisions (recalls,
/// releases, bytes, r_GPU) step by step, and `second`'s store passes its audit every step.
fn decode_alongside_the_host_tier<T: Tier>(
    model: &crate::sim::SimModel,
    second: std::sync::Arc<T>,
) {
    use std::sync::Arc;

    use crate::RowLayout;
    use crate::policy::{WnwConfig, WnwPolicy};
    use crate::sim::{SplitMix, frontier_signal};
    use crate::tier::HostTier;

    let cfg = model.config;
    let rows = RowLayout::dense_f32(cfg.head_dim);
    let policy = || {
        let layout = cfg.layout().unwrap();
        let wnw = WnwConfig::default();
        Box::new(WnwPolicy::for_target(model.roles.clone(), layout, cfg.target_r_gpu, wnw).unwrap())
    };
    let host = Arc::new(HostTier::new(model.bounded_tier_config(rows).unwrap()).unwrap());
    let mut on_host = model.store_on(rows, host, policy()).unwrap();
    let mut other = model.store_on(rows, second, policy()).unwrap();
    let (mut rng, d) = (SplitMix::new(9), cfg.head_dim);
    let mut weights = vec![0.0f32; cfg.audio_len];
    let mut recalls = 0;
    for step in 0..cfg.steps {
        for layer in 0..cfg.layers {
            let row: Vec<f32> = (0..cfg.kv_heads * d).map(|_| rng.unit() - 0.5).collect();
            on_host.append(layer, &row, &row).unwrap();
            other.append(layer, &row, &row).unwrap();
            drop(on_host.layer_view(layer).unwrap());
            drop(other.layer_view(layer).unwrap());
        }
        frontier_signal(&mut rng, step, cfg.steps, &mut weights);
        on_host.add_audio_weights(&weights).unwrap();
        other.add_audio_weights(&weights).unwrap();
        let (a, b) = (*on_host.end_step().unwrap(), *other.end_step().unwrap());
        assert_eq!((a.recalls, a.releases, a.bytes_h2d), (b.recalls, b.releases, b.bytes_h2d));
        assert_eq!(on_host.r_gpu(), other.r_gpu(), "step {step}");
        let audit = other.audit().unwrap();
        assert!(audit.violations.is_empty(), "step {step}: {:?}", audit.violations);
        recalls += b.recalls;
    }
    assert!(recalls > 0, "the frontier sweep makes the tidal heads recall");
}

/// The comparison body itself, on two host tiers (runs everywhere).
#[test]
fn the_store_comparison_holds_between_two_host_tiers() {
    let model = sim_for_store();
    let cfg = model.bounded_tier_config(crate::RowLayout::dense_f32(16)).unwrap();
    let second = std::sync::Arc::new(crate::tier::HostTier::new(cfg).unwrap());
    decode_alongside_the_host_tier(&model, second);
}

/// A WnW decode through a [`crate::TieredStore`] on the CUDA tier decides exactly as on the
/// host tier and passes the audit every step.
#[test]
fn a_tiered_store_decodes_on_the_cuda_tier_as_on_the_host_tier() {
    let model = sim_for_store();
    let cfg = model.bounded_tier_config(crate::RowLayout::dense_f32(16)).unwrap();
    match CudaTier::new(cfg) {
        Ok(t) => decode_alongside_the_host_tier(&model, std::sync::Arc::new(t)),
        Err(e) => println!("SKIPPED: TieredStore on the CUDA tier: {e}"),
    }
}
