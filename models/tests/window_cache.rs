//! The sliding-window caches against their definition: a [`WindowCache`] of `w` positions
//! attends exactly like a dense cache holding only the last `w` positions (prefills shorter
//! and longer than the window, then decode steps that wrap the ring several times), and a
//! [`WindowedCache`] sends local layers to the ring and global ones to its inner cache,
//! reporting the bytes of each.

use models::cache::{
    CacheShape, DenseCache, KvCache, LayerKv, StepQkv, WindowCache, WindowedCache,
};
use models::{LocalAttention, RopeConfig, RopeScaling};

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

#[test]
fn windowed_cache_routes_layers_and_counts_bytes_per_kind() {
    let (d, window) = (4, 3);
    let shape = CacheShape::new(2, attn_kernels::AttnConfig::new(1, 1, d).unwrap());
    let rope = RopeConfig { theta: 10_000.0, scaling: RopeScaling::None };
    let layers = LocalAttention { window, rope, local: vec![true, false] };
    // The global part serves the one global layer alone.
    let one = CacheShape::new(1, shape.attn);
    let global = Box::new(DenseCache::<f32>::new(one, 1).unwrap());
    let mut cache = WindowedCache::new(&layers, kv_sparse::ValueFormat::F16, global, 1).unwrap();
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
    for bad in ["dense:ring=fp8", "swan:ring=int8", "dense:ring"] {
        assert!(bad.parse::<models::cache::CacheSpec>().is_err(), "{bad}");
    }
    assert!(
        cache
            .decode(2, StepQkv { q: &out.clone(), k: &out.clone(), v: &out.clone() }, &mut out)
            .is_err()
    );
    let bad = LocalAttention { local: vec![true, true], ..layers };
    let global = Box::new(DenseCache::<f32>::new(one, 1).unwrap());
    assert!(WindowedCache::new(&bad, kv_sparse::ValueFormat::F16, global, 1).is_err());
}
