//! Every tier in the crate passes the one conformance check of the `Tier` contract — the
//! GPU portion / CPU complement storage of WnW §2.3 (the CUDA tier runs the same body on a
//! device: `kv_tiered::tier::contract::check_contract`).

use kv_tiered::tier::contract::check_contract;
use kv_tiered::tier::{FaultSchedule, FaultyTier, HostTier, TierConfig};

#[test]
fn host_tier_meets_the_contract() {
    check_contract(&HostTier::new).unwrap();
}

#[test]
fn disarmed_fault_tier_meets_the_contract() {
    let make = |c: TierConfig| {
        let t = FaultyTier::new(
            HostTier::new(c)?,
            FaultSchedule {
                alloc_device_every: Some(1),
                copy_every: Some(1),
                event_every: Some(1),
            },
        );
        t.set_armed(false);
        Ok(t)
    };
    check_contract(&make).unwrap();
}

#[test]
fn armed_fault_tier_is_caught() {
    let make = |c: TierConfig| {
        Ok(FaultyTier::new(
            HostTier::new(c)?,
            FaultSchedule { alloc_device_every: Some(2), ..Default::default() },
        ))
    };
    let err = check_contract(&make).unwrap_err();
    assert!(err.contains("tier contract violated") || err.contains("injected"), "{err}");
}
