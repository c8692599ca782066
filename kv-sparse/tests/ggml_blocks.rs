//! Dense `int8` / `int4` rows against ggml's own `q8_0` / `q4_0` quantizers: the bytes kvtide
//! stores for a row are the bytes llama.cpp's KV cache would hold for it (reference:
//! `fixtures/kv_quant/`, PyPI `gguf`'s bit-exact quantizer, made by
//! `scripts/fixtures/gen_kv_quant_blocks.py`).

use std::path::PathBuf;

use kv_sparse::quant::{DenseCodec, Int4Blocks, Int8Blocks, QuantRows};

fn fixture(name: &str) -> Vec<u8> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../fixtures/kv_quant").join(name);
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn rows() -> Vec<f32> {
    fixture("rows.f32")
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

const WIDTH: usize = 256;

/// Encodes the fixture's rows one push at a time and compares every row's bytes.
fn check<C: DenseCodec>(reference: &str) {
    let x = rows();
    let expected = fixture(reference);
    let mut store = QuantRows::<C>::new(WIDTH).unwrap();
    for row in x.chunks_exact(WIDTH) {
        store.push(row).unwrap();
    }
    let got = store.view().bytes();
    assert_eq!(got.len(), expected.len(), "{reference}: byte count");
    let row_bytes = expected.len() / (x.len() / WIDTH);
    for (r, (g, e)) in got.chunks(row_bytes).zip(expected.chunks(row_bytes)).enumerate() {
        assert_eq!(g, e, "{reference}: row {r} differs from ggml's");
    }
}

#[test]
fn int8_rows_are_ggml_q8_0_blocks() {
    check::<Int8Blocks>("Q8_0.blocks");
}

#[test]
fn int4_rows_are_ggml_q4_0_blocks() {
    check::<Int4Blocks>("Q4_0.blocks");
}
