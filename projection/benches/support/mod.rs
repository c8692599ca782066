//! Model shapes and seeded activations shared by the projection benches (a `mod` of each
//! bench, not a bench target of its own).
#![allow(dead_code)]

use projection::ModelDims;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::StandardNormal;

/// A named attention geometry.
pub struct Shape {
    pub name: &'static str,
    pub layers: usize,
    pub q_heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
}

impl Shape {
    pub fn dims(&self) -> ModelDims {
        ModelDims::new(self.layers, self.q_heads, self.kv_heads, self.head_dim).unwrap()
    }
}

/// SmolLM2-135M: 30 layers, 9 q-heads / 3 kv-heads (group 3), d_h 64.
pub const SMOL: Shape =
    Shape { name: "smollm2-135m", layers: 30, q_heads: 9, kv_heads: 3, head_dim: 64 };
/// Llama-3.1-8B: 32 layers, 32 q-heads / 8 kv-heads (group 4), d_h 128.
pub const LLAMA: Shape =
    Shape { name: "llama-3.1-8b", layers: 32, q_heads: 32, kv_heads: 8, head_dim: 128 };

/// `n` seeded standard-normal floats.
pub fn gaussian(n: usize, seed: u64) -> Vec<f32> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    (0..n).map(|_| rng.sample::<f32, _>(StandardNormal)).collect()
}
