//! The sliding-window caches against their definition: a [`WindowCache`] of `w` positions
//! attends exactly like a dense cache holding only the last `w` positions (prefills shorter
//! and longer than the window, then decode steps that wrap the ring several times), and a
//! The same holds for a [`QuantWindowCache`] against a quantized cache of the last `w`
//! positions, rotated or not, with or without f32 sink rows, keys and values in one codec or
//! two; a [`WindowedCache`] sends local layers to the ring and global
//! ones to its inner cache, reporting the bytes of each.

use std::sync::Arc;

use kv_sparse::ValueFormat;
use kv_sparse::quant::{DenseCodec, Fp8Rows, Int4Blocks, Int8Blocks};
use models::cache::spec::DenseStorage;
use models::cache::{
    CacheShape, DenseCache, KvCache, LayerKv, QuantCache, QuantWindowCache, StepQkv, WindowCache,
    WindowedCache,
};
use models::{LocalAttention, RopeConfig, RopeScaling};
use projection::{ModelDims, ProjectionSet};

/// Deterministic values in (-1, 1).
fn values(seed: u64, n: usize) -> Vec<f32> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        })
        .collect()
}

/// `[kv_heads][tokens][d]` from per-token rows `[tokens][kv_heads][d]`.
fn head_major(rows: &[Vec<f32>], kv_heads: usize, d: usize) -> Vec<f32> {
    let mut out = Vec::with_capacity(rows.len() * kv_heads * d);
    for h in 0..kv_heads {
        for r in rows {
            out.extend_from_slice(&r[h * d..(h + 1) * d]);
        }
    }
    out
}

#[test]
fn window_cache_equals_dense_over_the_last_window() {
    let (q_heads, kv_heads, d, window) = (4, 2, 8, 5);
    let shape = CacheShape::new(1, attn_kernels::AttnConfig::new(q_heads, kv_heads, d).unwrap());
    for prompt in [3, 5, 9, 12] {
        let total = prompt + 3 * window;
        let keys: Vec<Vec<f32>> = (0..total).map(|t| values(t as u64, kv_heads * d)).collect();
        let vals: Vec<Vec<f32>> =
            (0..total).map(|t| values(1000 + t as u64, kv_heads * d)).collect();
        let mut ring = WindowCache::<f32>::new(shape, window, 1).unwrap();
        let (k, v) =
            (head_major(&keys[..prompt], kv_heads, d), head_major(&vals[..prompt], kv_heads, d));
        ring.prefill(0, LayerKv { keys: &k, values: &v, tokens: prompt }).unwrap();
        assert_eq!(ring.len(), prompt.min(window));
        for t in prompt..total {
            let q = values(5000 + t as u64, q_heads * d);
            let mut got = vec![0.0; q_heads * d];
            ring.decode(0, StepQkv { q: &q, k: &keys[t], v: &vals[t] }, &mut got).unwrap();
            // The definition: a dense cache holding positions t-w+1 ..= t.
            let start = (t + 1).saturating_sub(window);
            let mut dense = DenseCache::<f32>::new(shape, 1).unwrap();
            if start < t {
                let (k, v) = (
                    head_major(&keys[start..t], kv_heads, d),
                    head_major(&vals[start..t], kv_heads, d),
                );
                dense.prefill(0, LayerKv { keys: &k, values: &v, tokens: t - start }).unwrap();
            }
            let mut want = vec![0.0; q_heads * d];
            dense.decode(0, StepQkv { q: &q, k: &keys[t], v: &vals[t] }, &mut want).unwrap();
            let err = got.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0.0, f32::max);
            assert!(err < 1e-6, "prompt {prompt}, position {t}: error {err}");
            assert_eq!(ring.len(), window.min(t + 1));
            assert_eq!(ring.bytes().total(), 2 * window.min(t + 1) * kv_heads * d * 4);
        }
    }
}

/// A quantized ring of `window` positions against a [`QuantCache`] given only the last
/// `window` positions (same codec, same rotation): the rows are encoded identically, so the
/// outputs differ by the order of summation alone.
fn quant_ring_equals_quant_cache_over_the_last_window<C: DenseCodec>(rotate: bool, sink: usize) {
    mixed_ring_equals_mixed_cache::<C, C>(rotate, sink);
}

/// As above, keys encoded by `K` and values by `V`.
fn mixed_ring_equals_mixed_cache<K: DenseCodec, V: DenseCodec>(rotate: bool, sink: usize) {
    let (q_heads, kv_heads, d, window) = (4, 2, 64, 5);
    let shape = CacheShape::new(2, attn_kernels::AttnConfig::new(q_heads, kv_heads, d).unwrap());
    let set = rotate.then(|| {
        let dims = ModelDims::new(2, q_heads, kv_heads, d).unwrap();
        Arc::new(ProjectionSet::hadamard(dims, "test").unwrap())
    });
    let layer = 1;
    for prompt in [0, 3, 5, 9, 12] {
        let total = prompt + 3 * window;
        let keys: Vec<Vec<f32>> = (0..total).map(|t| values(t as u64, kv_heads * d)).collect();
        let vals: Vec<Vec<f32>> =
            (0..total).map(|t| values(1000 + t as u64, kv_heads * d)).collect();
        let ring = QuantWindowCache::<K, V>::new(shape, window, set.clone(), 1).unwrap();
        let mut ring = ring.with_sink(sink).unwrap();
        // A prefill longer than the window skips positions before it, sink ones included.
        let skipped = prompt.saturating_sub(window);
        if prompt > 0 {
            let (k, v) = (
                head_major(&keys[..prompt], kv_heads, d),
                head_major(&vals[..prompt], kv_heads, d),
            );
            ring.prefill(layer, LayerKv { keys: &k, values: &v, tokens: prompt }).unwrap();
        }
        assert_eq!(ring.len(), prompt.min(window));
        for t in prompt..total {
            let q = values(5000 + t as u64, q_heads * d);
            let mut got = vec![0.0; q_heads * d];
            ring.decode(layer, StepQkv { q: &q, k: &keys[t], v: &vals[t] }, &mut got).unwrap();
            let start = (t + 1).saturating_sub(window);
            // The sink positions still inside the window are the cache's first, in f32.
            let want_cache = QuantCache::<K, V>::new(shape, set.clone(), 1).unwrap();
            let mut want_cache = want_cache.with_sink(sink.saturating_sub(start)).unwrap();
            if start < t {
                let (k, v) = (
                    head_major(&keys[start..t], kv_heads, d),
                    head_major(&vals[start..t], kv_heads, d),
                );
                want_cache
                    .prefill(layer, LayerKv { keys: &k, values: &v, tokens: t - start })
                    .unwrap();
            }
            let mut want = vec![0.0; q_heads * d];
            let step = StepQkv { q: &q, k: &keys[t], v: &vals[t] };
            want_cache.decode(layer, step, &mut want).unwrap();
            let err = got.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0.0, f32::max);
            assert!(
                err < 1e-5,
                "{}/{} rotate {rotate}, sink {sink}, prompt {prompt}, position {t}: {err}",
                K::FORMAT,
                V::FORMAT
            );
            let sink_rows = if sink > skipped { sink.min(t + 1) } else { 0 };
            assert_eq!(
                ring.bytes().total(),
                kv_heads
                    * (window.min(t + 1) * (K::row_bytes(d) + V::row_bytes(d))
                        + 2 * sink_rows * 4 * d)
            );
        }
    }
}

#[test]
fn quantized_window_caches_equal_quantized_caches_over_the_last_window() {
    for rotate in [false, true] {
        for sink in [0, 2] {
            quant_ring_equals_quant_cache_over_the_last_window::<Int8Blocks>(rotate, sink);
            quant_ring_equals_quant_cache_over_the_last_window::<Int4Blocks>(rotate, sink);
            quant_ring_equals_quant_cache_over_the_last_window::<Fp8Rows>(rotate, sink);
            mixed_ring_equals_mixed_cache::<Int8Blocks, Int4Blocks>(rotate, sink);
            mixed_ring_equals_mixed_cache::<Fp8Rows, Int8Blocks>(rotate, sink);
        }
    }
    // A sink longer than the window, or set on a ring that holds positions, is refused.
    let shape = CacheShape::new(1, attn_kernels::AttnConfig::new(1, 1, 32).unwrap());
    let ring = QuantWindowCache::<Int8Blocks>::new(shape, 4, None, 1).unwrap();
    assert!(ring.with_sink(5).is_err());
    let mut ring = QuantWindowCache::<Int8Blocks>::new(shape, 4, None, 1).unwrap();
    let mut out = [0.0; 32];
    ring.decode(0, StepQkv { q: &[0.0; 32], k: &[0.1; 32], v: &[0.2; 32] }, &mut out).unwrap();
    assert!(ring.with_sink(1).is_err());
}

#[test]
fn quantized_window_cache_refuses_bad_input_and_keeps_its_rows() {
    let shape = CacheShape::new(1, attn_kernels::AttnConfig::new(1, 1, 32).unwrap());
    assert!(QuantWindowCache::<Int8Blocks>::new(shape, 0, None, 1).is_err(), "window 0");
    let odd = CacheShape::new(1, attn_kernels::AttnConfig::new(1, 1, 24).unwrap());
    assert!(QuantWindowCache::<Int4Blocks>::new(odd, 4, None, 1).is_err(), "24 not blocks of 32");
    let other = ModelDims::new(2, 1, 1, 32).unwrap();
    let set = Arc::new(ProjectionSet::hadamard(other, "test").unwrap());
    assert!(QuantWindowCache::<Int8Blocks>::new(shape, 4, Some(set), 1).is_err(), "2-layer set");
    let mut ring = QuantWindowCache::<Int8Blocks>::new(shape, 2, None, 1).unwrap();
    let mut out = [0.0; 32];
    for t in 0..3 {
        let row = values(t, 32);
        ring.decode(0, StepQkv { q: &row, k: &row, v: &row }, &mut out).unwrap();
    }
    let before = (ring.len(), ring.bytes());
    let mut nan = values(9, 32);
    nan[3] = f32::NAN;
    let q = values(10, 32);
    assert!(ring.decode(0, StepQkv { q: &q, k: &nan, v: &q }, &mut out).is_err(), "NaN key");
    let huge = [1e30f32; 32];
    assert!(ring.decode(0, StepQkv { q: &q, k: &q, v: &huge }, &mut out).is_err(), "overflow");
    let prefill = [values(11, 32), nan.clone()].concat();
    let kv = LayerKv { keys: &prefill, values: &prefill, tokens: 2 };
    assert!(ring.prefill(0, kv).is_err(), "NaN in a prefill");
    assert_eq!((ring.len(), ring.bytes()), before, "nothing stored on an error");
    // The ring still attends its last two positions (rows 1 and 2).
    let mut again = [0.0; 32];
    let row = values(2, 32);
    let mut fresh = QuantWindowCache::<Int8Blocks>::new(shape, 2, None, 1).unwrap();
    for t in 0..4u64 {
        let r = if t < 3 { values(t, 32) } else { row.clone() };
        fresh.decode(0, StepQkv { q: &r, k: &r, v: &r }, &mut again).unwrap();
    }
    ring.decode(0, StepQkv { q: &row, k: &row, v: &row }, &mut out).unwrap();
    assert_eq!(out, again);
}

#[test]
fn windowed_cache_routes_layers_and_counts_bytes_per_kind() {
    let (d, window) = (4, 3);
    let shape = CacheShape::new(2, attn_kernels::AttnConfig::new(1, 1, d).unwrap());
    let rope = RopeConfig { theta: 10_000.0, scaling: RopeScaling::None };
    let layers = LocalAttention { window, rope, local: vec![true, false] };
    // The global part serves the one global layer alone.
    let one = CacheShape::new(1, shape.attn);
    let global = Box::new(DenseCache::<f32>::new(one, 1).unwrap());
    let f16 = DenseStorage::Float(ValueFormat::F16);
    let mut cache = WindowedCache::new(&layers, f16, None, global, 1).unwrap();
    assert_eq!((cache.window(0), cache.window(1)), (Some(window), None));
    let mut out = vec![0.0; d];
    for t in 0..7 {
        let row = values(t, d);
        for layer in 0..2 {
            cache.decode(layer, StepQkv { q: &row, k: &row, v: &row }, &mut out).unwrap();
        }
        let held = (t as usize + 1).min(window);
        assert_eq!(cache.window_bytes().total(), 2 * held * d * 2, "f16 ring");
        assert_eq!(cache.global_bytes().total(), 2 * (t as usize + 1) * d * 4, "f32 dense");
        assert_eq!(cache.len(), t as usize + 1);
    }
    assert_eq!(cache.shape().layers, 2);
    for bad in ["dense:ring=int3", "swan:ring=q5_1", "dense:ring"] {
        assert!(bad.parse::<models::cache::CacheSpec>().is_err(), "{bad}");
    }
    let spec = |s: &str| s.parse::<models::cache::CacheSpec>().unwrap().ring_format().to_string();
    assert_eq!(spec("dense:format=int4,rotate=hadamard"), "int4", "a dense spec's own format");
    assert_eq!(spec("dense:format=int8,values=int4"), "int8,values=int4", "both its formats");
    assert_eq!(spec("swan:k=16,buffer=bf16,basis=identity"), "bf16", "a SWAN buffer's format");
    assert_eq!(spec("dense:format=int8,ring=f16"), "f16", "ring= wins");
    assert_eq!(spec("tiered:span=0..8,ring=fp8"), "fp8");
    let rings = "swan:k=16,basis=identity,ring=int8,ring_values=int4";
    assert_eq!(spec(rings), "int8,values=int4", "ring_values= beside ring=");
    assert_eq!(spec("dense:format=int4,ring=q8_0,ring_values=q8_0"), "int8", "equal: one format");
    assert!(
        cache
            .decode(2, StepQkv { q: &out.clone(), k: &out.clone(), v: &out.clone() }, &mut out)
            .is_err()
    );
    let bad = LocalAttention { local: vec![true, true], ..layers.clone() };
    let global = Box::new(DenseCache::<f32>::new(one, 1).unwrap());
    assert!(WindowedCache::new(&bad, f16, None, global, 1).is_err());
    // A quantized ring: q8_0 rows of the local layer, the global layer untouched.
    let global = Box::new(DenseCache::<f32>::new(one, 1).unwrap());
    let d32 = CacheShape::new(1, attn_kernels::AttnConfig::new(1, 1, 32).unwrap());
    let global32 = Box::new(DenseCache::<f32>::new(d32, 1).unwrap());
    let int8 = DenseStorage::Quant(kv_sparse::quant::DenseFormat::Int8);
    assert!(WindowedCache::new(&layers, int8, None, global, 1).is_err(), "d 4: not q8_0 blocks");
    let mut cache = WindowedCache::new(&layers, int8, None, global32, 1).unwrap();
    let mut out = vec![0.0; 32];
    for t in 0..5 {
        let row = values(t, 32);
        for layer in 0..2 {
            cache.decode(layer, StepQkv { q: &row, k: &row, v: &row }, &mut out).unwrap();
        }
        let held = (t as usize + 1).min(window);
        assert_eq!(cache.window_bytes().total(), 2 * held * Int8Blocks::row_bytes(32), "q8_0 ring");
    }
    // A mixed ring: q8_0 keys and q4_0 values (`format=int8,values=int4`).
    use kv_sparse::quant::DenseFormat;
    let mixed = DenseStorage::Mixed { keys: DenseFormat::Int8, values: DenseFormat::Int4 };
    let global32 = Box::new(DenseCache::<f32>::new(d32, 1).unwrap());
    let mut cache = WindowedCache::new(&layers, mixed, None, global32, 1).unwrap();
    for t in 0..5 {
        let row = values(t, 32);
        for layer in 0..2 {
            cache.decode(layer, StepQkv { q: &row, k: &row, v: &row }, &mut out).unwrap();
        }
        let held = (t as usize + 1).min(window);
        assert_eq!(cache.window_bytes().total(), held * (34 + 18), "q8_0 keys, q4_0 values");
    }
    assert!(
        cache.label().contains(&format!("window {window} int8 values=int4")),
        "{}",
        cache.label()
    );
}

/// A cache of q8_0 keys and q4_0 values attends as a dense f32 cache given the same rows
/// rounded through those codecs (keys by the key codec, values by the value codec): each
/// side is stored by its own codec, not the other's.
#[test]
fn a_mixed_cache_rounds_keys_and_values_each_by_its_own_codec() {
    let (q_heads, kv_heads, d) = (4, 2, 64);
    let shape = CacheShape::new(1, attn_kernels::AttnConfig::new(q_heads, kv_heads, d).unwrap());
    let mut mixed = QuantCache::<Int8Blocks, Int4Blocks>::new(shape, None, 1).unwrap();
    let mut dense = DenseCache::<f32>::new(shape, 1).unwrap();
    let rounded = |x: &[f32], int4: bool| -> Vec<f32> {
        let mut out = vec![0.0; x.len()];
        for (src, dst) in x.chunks(d).zip(out.chunks_mut(d)) {
            if int4 {
                let mut r = kv_sparse::quant::QuantRows::<Int4Blocks>::new(d).unwrap();
                r.push(src).unwrap();
                r.decode_row(0, dst).unwrap();
            } else {
                let mut r = kv_sparse::quant::QuantRows::<Int8Blocks>::new(d).unwrap();
                r.push(src).unwrap();
                r.decode_row(0, dst).unwrap();
            }
        }
        out
    };
    for t in 0..20u64 {
        let (k, v, q) =
            (values(t, kv_heads * d), values(100 + t, kv_heads * d), values(200 + t, q_heads * d));
        let (mut got, mut want) = (vec![0.0; q_heads * d], vec![0.0; q_heads * d]);
        mixed.decode(0, StepQkv { q: &q, k: &k, v: &v }, &mut got).unwrap();
        let (kr, vr) = (rounded(&k, false), rounded(&v, true));
        dense.decode(0, StepQkv { q: &q, k: &kr, v: &vr }, &mut want).unwrap();
        let err = got.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0.0, f32::max);
        assert!(err < 1e-5, "position {t}: {err}");
    }
}
