//! Shared test helpers: random models, a reference attention, store builders — the inputs of
//! the WnW tests (§2.2 roles, §2.3 store).
#![allow(dead_code)]

use kv_tiered::policy::{WnwConfig, WnwPolicy};
use kv_tiered::{
    AudioLayout, DensePromptKv, HeadRoles, HeadView, RetentionSchedule, Role, StoreConfig,
    TieredStore,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// A small random model and prompt.
pub struct Model {
    pub layers: usize,
    pub kv_heads: usize,
    pub q_heads: usize,
    pub head_dim: usize,
    pub layout: AudioLayout,
    pub kv: DensePromptKv,
    pub keys: Vec<f32>,
    pub values: Vec<f32>,
    pub scores: Vec<f32>,
}

impl Model {
    pub fn random(
        seed: u64,
        layers: usize,
        kv_heads: usize,
        group: usize,
        head_dim: usize,
        layout: AudioLayout,
    ) -> Self {
        let mut rng = StdRng::seed_from_u64(seed);
        let n = layers * kv_heads * layout.seq_len() * head_dim;
        let keys: Vec<f32> = (0..n).map(|_| rng.random_range(-1.0..1.0)).collect();
        let values: Vec<f32> = (0..n).map(|_| rng.random_range(-1.0..1.0)).collect();
        let scores = (0..layers * kv_heads * layout.audio_len())
            .map(|_| rng.random_range(0.0..1.0))
            .collect();
        let kv = DensePromptKv::new(
            layers,
            kv_heads,
            layout.seq_len(),
            head_dim,
            keys.clone(),
            values.clone(),
        )
        .unwrap();
        Self {
            layers,
            kv_heads,
            q_heads: kv_heads * group,
            head_dim,
            layout,
            kv,
            keys,
            values,
            scores,
        }
    }

    pub fn heads(&self) -> usize {
        self.layers * self.kv_heads
    }

    pub fn config(&self, max_new_tokens: usize) -> StoreConfig {
        let attn =
            attn_kernels::AttnConfig::new(self.q_heads, self.kv_heads, self.head_dim).unwrap();
        StoreConfig::new(self.layers, attn, self.layout, max_new_tokens)
    }

    /// Row `pos` of head `h` (keys or values) of the prompt.
    pub fn row(&self, values: bool, h: usize, pos: usize) -> &[f32] {
        let d = self.head_dim;
        let base = (h * self.layout.seq_len() + pos) * d;
        let src = if values { &self.values } else { &self.keys };
        &src[base..base + d]
    }

    /// A WnW store with explicit roles and uniform retention.
    pub fn wnw_store(
        &self,
        roles: &[Role],
        retention: f64,
        config: WnwConfig,
        max_new: usize,
    ) -> TieredStore {
        let roles = HeadRoles::from_roles(self.layers, self.kv_heads, roles).unwrap();
        let sched = RetentionSchedule::uniform(&roles, retention).unwrap();
        let policy = WnwPolicy::new(roles, sched, self.layout, config).unwrap();
        TieredStore::prefill_host(self.config(max_new), Box::new(policy), &self.kv, &self.scores)
            .unwrap()
    }
}

/// Random roles with at least one of each where possible.
pub fn random_roles(rng: &mut StdRng, heads: usize) -> Vec<Role> {
    (0..heads)
        .map(|_| match rng.random_range(0..3) {
            0 => Role::Anchor,
            1 => Role::Tidal,
            _ => Role::Fixed,
        })
        .collect()
}

/// Softmax attention of `q` (group × head_dim) over `(keys, values)` rows; returns outputs and
/// the per-row weights summed over the group.
pub fn attend(q: &[f32], keys: &[f32], values: &[f32], head_dim: usize) -> (Vec<f32>, Vec<f32>) {
    let d = head_dim;
    let n = keys.len() / d;
    let g = q.len() / d;
    let scale = 1.0 / (d as f32).sqrt();
    let mut out = vec![0.0f32; g * d];
    let mut wsum = vec![0.0f32; n];
    for (qi, qrow) in q.chunks_exact(d).enumerate() {
        let logits: Vec<f64> = keys
            .chunks_exact(d)
            .map(|k| f64::from(qrow.iter().zip(k).map(|(a, b)| a * b).sum::<f32>() * scale))
            .collect();
        let m = logits.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let e: Vec<f64> = logits.iter().map(|&l| (l - m).exp()).collect();
        let z: f64 = e.iter().sum();
        for (r, v) in values.chunks_exact(d).enumerate() {
            let w = (e[r] / z) as f32;
            wsum[r] += w;
            for j in 0..d {
                out[qi * d + j] += w * v[j];
            }
        }
    }
    (out, wsum)
}

/// Gathered attention over a store view (reference: decodes the rows, then [`attend`]).
pub fn attend_view<A: kv_tiered::tier::ArenaRead>(
    q: &[f32],
    view: &HeadView<'_, A>,
) -> (Vec<u32>, Vec<f32>, Vec<f32>) {
    let (mut pos, mut k, mut v) = (Vec::new(), Vec::new(), Vec::new());
    view.decode_into(&mut pos, &mut k, &mut v).unwrap();
    let (out, w) = attend(q, &k, &v, view.head_dim());
    (pos, out, w)
}

pub fn rng(seed: u64) -> StdRng {
    StdRng::seed_from_u64(seed)
}

pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}
