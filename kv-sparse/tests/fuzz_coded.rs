//! Untrusted coded rows and dense quantized rows (raw parts from a file, another process or
//! a device): `CodedView::from_parts` and `QuantView::from_bytes` never panic on arbitrary or
//! mutated-valid input, and whatever they accept decodes to finite values of the right
//! shape. 10 000 cases each (`PROPTEST_CASES` raises it).

use kv_sparse::coded::{
    Bitmask, CodedStore, CodedView, Elems, IndexCode, Int4Values, Int8Values, List, ValueCode,
};
use kv_sparse::fp8::Fp8E4M3;
use kv_sparse::quant::{DenseCodec, Fp8Rows, Int4Blocks, Int8Blocks, QuantRows, QuantView};
use proptest::prelude::*;

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(10_000)
}

/// A valid store's parts for `rows` rows of `d` with a varying `k`.
fn valid<X: IndexCode, Y: ValueCode>(d: usize, rows: usize, seed: u64) -> CodedStore<X, Y> {
    let mut s =
        CodedStore::<X, Y>::with_block_rows(d, 3.min(CodedStore::<X, Y>::max_rows_per_block(d)))
            .unwrap();
    for r in 0..rows {
        let x: Vec<f32> =
            (0..d).map(|i| (((i as u64 * 31 + r as u64 * 7 + seed) % 17) as f32) - 8.0).collect();
        let k = ((r + seed as usize) % (d + 1)) & !1;
        s.push_dense(&x, k).unwrap();
    }
    s
}

/// Applies byte edits to `bytes` and reads the result as coded parts.
fn check<X: IndexCode, Y: ValueCode>(
    d: usize,
    rows: usize,
    seed: u64,
    edits: &[(usize, u8)],
    cut: usize,
    offs: &[(usize, u16)],
) {
    let s = valid::<X, Y>(d, rows, seed);
    let v = s.view();
    let mut bytes = v.bytes().to_vec();
    for &(at, b) in edits {
        if !bytes.is_empty() {
            let n = bytes.len();
            bytes[at % n] = b;
        }
    }
    bytes.truncate(bytes.len().saturating_sub(cut));
    let mut offsets = v.offsets().to_vec();
    for &(at, o) in offs {
        if !offsets.is_empty() {
            let n = offsets.len();
            offsets[at % n] = o;
        }
    }
    if let Ok(view) =
        CodedView::<X, Y>::from_parts(d, v.rows_per_block(), v.block_bases(), &offsets, &bytes)
    {
        let mut out = vec![0.0; d];
        for row in view.rows() {
            row.scatter_into(&mut out).unwrap();
            assert!(out.iter().all(|x| x.is_finite()));
            assert!(row.k() <= d);
        }
    }
}

fn check_quant<C: DenseCodec>(d: usize, rows: usize, edits: &[(usize, u8)], cut: usize) {
    let mut q = QuantRows::<C>::new(d).unwrap();
    let x: Vec<f32> = (0..rows * d).map(|i| (i % 13) as f32 - 6.0).collect();
    q.push(&x).unwrap();
    let mut bytes = q.view().bytes().to_vec();
    for &(at, b) in edits {
        if !bytes.is_empty() {
            let n = bytes.len();
            bytes[at % n] = b;
        }
    }
    bytes.truncate(bytes.len().saturating_sub(cut));
    if let Ok(view) = QuantView::<C>::from_bytes(d, &bytes) {
        let mut out = vec![0.0; d];
        for r in 0..view.num_rows() {
            view.decode_row(r, &mut out).unwrap();
            assert!(out.iter().all(|x| x.is_finite()));
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases()))]

    #[test]
    fn mutated_coded_rows_never_panic(
        d in 1usize..40,
        rows in 0usize..8,
        seed in 0u64..1000,
        which in 0usize..6,
        edits in prop::collection::vec((any::<usize>(), any::<u8>()), 0..4),
        cut in prop_oneof![Just(0usize), 0usize..8],
        offs in prop::collection::vec((any::<usize>(), any::<u16>()), 0..2),
    ) {
        match which {
            0 => check::<Bitmask, Int8Values>(d, rows, seed, &edits, cut, &offs),
            1 => check::<Bitmask, Int4Values>(d, rows, seed, &edits, cut, &offs),
            2 => check::<Bitmask, Elems<Fp8E4M3>>(d, rows, seed, &edits, cut, &offs),
            3 => check::<List<u8>, Int8Values>(d, rows, seed, &edits, cut, &offs),
            4 => check::<List<u16>, Elems<half::f16>>(d, rows, seed, &edits, cut, &offs),
            _ => check::<List<u8>, Int4Values>(d, rows, seed, &edits, cut, &offs),
        }
    }

    #[test]
    fn arbitrary_coded_parts_never_panic(
        d in 1usize..300,
        rpb in 0usize..8,
        bases in prop::collection::vec(any::<u64>(), 0..4),
        offsets in prop::collection::vec(any::<u16>(), 0..8),
        bytes in prop::collection::vec(any::<u8>(), 0..200),
    ) {
        let _ = CodedView::<Bitmask, Int8Values>::from_parts(d, rpb, &bases, &offsets, &bytes);
        let _ = CodedView::<List<u8>, Int4Values>::from_parts(d, rpb, &bases, &offsets, &bytes);
        let _ = QuantView::<Int8Blocks>::from_bytes(d, &bytes);
        let _ = QuantView::<Fp8Rows>::from_bytes(d, &bytes);
    }

    #[test]
    fn mutated_quant_rows_never_panic(
        blocks in 1usize..4,
        rows in 0usize..4,
        which in 0usize..3,
        edits in prop::collection::vec((any::<usize>(), any::<u8>()), 0..4),
        cut in prop_oneof![Just(0usize), 0usize..40],
    ) {
        let d = 32 * blocks;
        match which {
            0 => check_quant::<Int8Blocks>(d, rows, &edits, cut),
            1 => check_quant::<Int4Blocks>(d, rows, &edits, cut),
            _ => check_quant::<Fp8Rows>(d, rows, &edits, cut),
        }
    }
}
