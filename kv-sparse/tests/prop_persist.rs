//! Property: a persisted cache reads back equal to the in-memory one — the same raw CSR
//! arrays and buffer rows through `MappedCache` — and a reloaded cache keeps appending
//! exactly like the original.

use half::{bf16, f16};
use kv_sparse::fp8::Fp8E4M3;
use kv_sparse::hybrid::HybridView;
use kv_sparse::persist::{self, MappedCache};
use kv_sparse::strategies::cache_case;
use kv_sparse::{SparseIndex, Value, value_bytes};
use proptest::prelude::*;

fn same<I: SparseIndex, V: Value, D: Value>(
    a: HybridView<'_, I, V, D>,
    b: HybridView<'_, I, V, D>,
) -> Result<(), TestCaseError> {
    for (x, y) in [(a.sparse_keys, b.sparse_keys), (a.sparse_values, b.sparse_values)] {
        prop_assert_eq!(x.block_bases(), y.block_bases());
        prop_assert_eq!(x.offsets(), y.offsets());
        prop_assert_eq!(x.indices(), y.indices());
        prop_assert_eq!(value_bytes(x.values()), value_bytes(y.values()));
    }
    prop_assert_eq!(a.buffer_len(), b.buffer_len());
    for j in 0..a.buffer_len() {
        prop_assert_eq!(
            value_bytes(a.buffer_key(j).unwrap()),
            value_bytes(b.buffer_key(j).unwrap())
        );
        prop_assert_eq!(
            value_bytes(a.buffer_value(j).unwrap()),
            value_bytes(b.buffer_value(j).unwrap())
        );
    }
    Ok(())
}

fn round_trip<I: SparseIndex, V: Value, D: Value>(
    case: &kv_sparse::strategies::CacheCase,
) -> Result<(), TestCaseError> {
    let cache = case.build::<I, V, D>().unwrap();
    let bytes = persist::encode_views(1, 1, &[(*cache.config(), cache.view())]).unwrap();
    let file = MappedCache::from_bytes(&bytes).unwrap();
    same(cache.view(), file.view::<I, V, D>(0, 0).unwrap())?;
    prop_assert_eq!(file.config(0, 0).unwrap(), *cache.config());
    // Continue both with the same tokens (the case's rows again).
    let (mut a, mut b) = (cache.clone(), file.load::<I, V, D>(0, 0).unwrap());
    for t in 0..case.rows() {
        a.append(case.key(t), case.value(t)).unwrap();
        b.append(case.key(t), case.value(t)).unwrap();
    }
    same(a.view(), b.view())
}

proptest! {
    #[test]
    fn persistence_round_trip_equals_memory(case in cache_case(32, 30)) {
        round_trip::<u8, f16, f16>(&case)?;
        round_trip::<u8, Fp8E4M3, bf16>(&case)?;
        round_trip::<u16, f32, f32>(&case)?;
    }
}
