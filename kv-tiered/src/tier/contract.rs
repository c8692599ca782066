//! A conformance check of the [`Tier`] contract (module docs of [`crate::tier`], points 1–6;
//! the GPU portion / CPU complement storage of WnW §2.3),
//! written once over any tier so every implementation — [`HostTier`](super::HostTier), the
//! CUDA tier on a device, a fault-injecting wrapper with faults disarmed — runs the same
//! body: page allocation limits and reuse, row writes and read-back, bounds errors that write
//! nothing, host→device recall through the event, and failed moves that hand the page back.

use super::{CopyEvent, PoolSpec, Tier, TierConfig, TierError};

/// The geometry [`check_contract`] builds its tier with: 2 layers, 2 pools with odd row sizes,
/// 3 device pages per `(pool, layer)`, 4 host pages per pool.
pub fn contract_config() -> TierConfig {
    TierConfig {
        layers: 2,
        pools: vec![
            PoolSpec { page_rows: 4, key_row_bytes: 8, value_row_bytes: 12 },
            PoolSpec { page_rows: 4, key_row_bytes: 6, value_row_bytes: 10 },
        ],
        device_pages_per_layer: Some(3),
        host_pages: Some(4),
    }
}

fn ensure(ok: bool, what: &str) -> Result<(), String> {
    if ok { Ok(()) } else { Err(format!("tier contract violated: {what}")) }
}

fn pattern(seed: u8, n: usize) -> Vec<u8> {
    (0..n).map(|i| seed.wrapping_mul(31).wrapping_add(i as u8)).collect()
}

/// Runs the contract against a tier built by `make` from [`contract_config`].
///
/// # Errors
/// A message naming the first violated point.
///
/// # Examples
/// ```
/// use kv_tiered::tier::{HostTier, contract::check_contract};
/// check_contract(&HostTier::new).unwrap();
/// ```
pub fn check_contract<T: Tier>(
    make: &dyn Fn(TierConfig) -> Result<T, TierError>,
) -> Result<(), String> {
    let tier = make(contract_config()).map_err(|e| format!("constructing the tier: {e}"))?;
    ensure(
        tier.layers() == 2 && tier.pools() == contract_config().pools.as_slice(),
        "geometry as configured",
    )?;
    allocation(&tier)?;
    writes(&tier)?;
    recall(&tier)?;
    failed_moves(&tier)
}

fn allocation<T: Tier>(tier: &T) -> Result<(), String> {
    let pages: Vec<_> = (0..3)
        .map(|_| tier.alloc_device(1, 1))
        .collect::<Result<_, _>>()
        .map_err(|e| format!("3 pages fit: {e}"))?;
    ensure(
        pages.iter().all(|p| p.pool() == 1 && p.layer() == 1),
        "pages carry their pool and layer",
    )?;
    ensure(
        matches!(tier.alloc_device(1, 1), Err(TierError::OutOfDeviceMemory { .. })),
        "a 4th page is OutOfDeviceMemory",
    )?;
    let other =
        tier.alloc_device(0, 1).map_err(|e| format!("arenas are per (pool, layer): {e}"))?;
    tier.free_device(other);
    let mut pages = pages.into_iter();
    let first = pages.next().ok_or("three pages")?;
    let index = first.index();
    tier.free_device(first);
    let again = tier.alloc_device(1, 1).map_err(|e| format!("a freed page is reusable: {e}"))?;
    ensure(again.index() == index, "the freed page is the one reused")?;
    ensure(
        matches!(tier.alloc_device(2, 0), Err(TierError::Bounds { .. })),
        "a bad pool is Bounds",
    )?;
    ensure(
        matches!(tier.alloc_device(0, 2), Err(TierError::Bounds { .. })),
        "a bad layer is Bounds",
    )?;
    for p in pages.chain([again]) {
        tier.free_device(p);
    }
    Ok(())
}

fn writes<T: Tier>(tier: &T) -> Result<(), String> {
    let page = tier.alloc_device(1, 0).map_err(|e| e.to_string())?;
    let (k, v) = (pattern(1, 4 * 6), pattern(2, 4 * 10));
    tier.write_device(&page, 0, &k, &v).map_err(|e| format!("write 4 rows: {e}"))?;
    let bad = tier.write_device(&page, 2, &pattern(9, 3 * 6), &pattern(9, 3 * 10));
    ensure(matches!(bad, Err(TierError::Bounds { .. })), "rows past the page are Bounds")?;
    let ragged = tier.write_device(&page, 0, &pattern(9, 5), &pattern(9, 10));
    ensure(matches!(ragged, Err(TierError::Bounds { .. })), "partial rows are Bounds")?;
    let (mut rk, mut rv) = (vec![0; 4 * 6], vec![0; 4 * 10]);
    tier.read_device(&page, 0, &mut rk, &mut rv).map_err(|e| format!("read back: {e}"))?;
    ensure(rk == k && rv == v, "rows read back as written; failed writes wrote nothing")?;
    let host = tier.alloc_host(1).map_err(|e| e.to_string())?;
    tier.write_host(host, 1, &k[..2 * 6], &v[..2 * 10]).map_err(|e| e.to_string())?;
    let (mut hk, mut hv) = (vec![0; 2 * 6], vec![0; 2 * 10]);
    tier.read_host(host, 1, &mut hk, &mut hv).map_err(|e| e.to_string())?;
    ensure(hk == k[..12] && hv == v[..20], "host rows read back as written")?;
    tier.free_host(host);
    tier.free_device(page);
    Ok(())
}

fn recall<T: Tier>(tier: &T) -> Result<(), String> {
    let host = tier.alloc_host(0).map_err(|e| e.to_string())?;
    let (k, v) = (pattern(3, 4 * 8), pattern(4, 4 * 12));
    tier.write_host(host, 0, &k, &v).map_err(|e| e.to_string())?;
    let dst = tier.alloc_device(0, 1).map_err(|e| e.to_string())?;
    let index = dst.index();
    let (page, event) = tier.copy_to_device(host, dst, 3).map_err(|e| format!("recall: {e}"))?;
    event.wait().map_err(|e| format!("recall event: {e}"))?;
    ensure(page.index() == index && page.layer() == 1, "recall returns the destination page")?;
    let (mut rk, mut rv) = (vec![0; 3 * 8], vec![0; 3 * 12]);
    tier.read_device(&page, 0, &mut rk, &mut rv).map_err(|e| e.to_string())?;
    ensure(rk == k[..24] && rv == v[..36], "recalled rows equal the host rows")?;
    let (mut hk, mut hv) = (vec![0; 4 * 8], vec![0; 4 * 12]);
    tier.read_host(host, 0, &mut hk, &mut hv).map_err(|e| e.to_string())?;
    ensure(hk == k && hv == v, "the host copy survives the recall")?;
    tier.free_device(page);
    tier.free_host(host);
    Ok(())
}

fn failed_moves<T: Tier>(tier: &T) -> Result<(), String> {
    let host = tier.alloc_host(0).map_err(|e| e.to_string())?;
    for (pool, rows, what) in [(0, 5, "rows > page_rows"), (1, 2, "pool mismatch")] {
        let dst = tier.alloc_device(pool, 0).map_err(|e| e.to_string())?;
        let index = dst.index();
        match tier.copy_to_device(host, dst, rows) {
            Ok((page, event)) => {
                let failed = event.wait().is_err();
                tier.free_device(page);
                ensure(failed, &format!("a bad move ({what}) fails"))?;
            }
            Err(e) => {
                ensure(
                    e.page.index() == index && e.page.pool() == pool,
                    &format!("a failed move ({what}) hands its page back"),
                )?;
                tier.free_device(e.page);
            }
        }
    }
    let mut held = vec![host];
    loop {
        match tier.alloc_host(0) {
            Ok(p) if held.len() < 8 => held.push(p),
            Ok(_) => {
                return Err("tier contract violated: the host pool honours its page limit".into());
            }
            Err(e) => {
                ensure(
                    matches!(e, TierError::OutOfHostMemory { .. }) && held.len() == 4,
                    "the 5th host page is OutOfHostMemory",
                )?;
                break;
            }
        }
    }
    held.into_iter().for_each(|p| tier.free_host(p));
    Ok(())
}
