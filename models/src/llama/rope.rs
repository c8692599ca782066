//! Rotary position embeddings in the Hugging Face "rotate half" form:
//! `x' = x·cos + rotate_half(x)·sin`, where `rotate_half([a, b]) = [−b, a]` on the two
//! halves of a head and the angle of pair `i` at position `p` is `p·ω_i`,
//! `ω_i = θ^(−2i/d)` (rescaled for Llama 3 / linear scaling). Prefill applies it to whole
//! tensors with libtorch; decode applies it to one token's rows on the host, in place, so
//! the rotated rows go straight to the cache. This is the RoPE that SWAN's P_QK follows
//! (`papers/swan.txt`, "the projection must also occur after RoPE").

use tch::{Kind, Tensor};

use crate::error::{Result, TorchOp};
use crate::load::config::{RopeConfig, RopeScaling};

/// Inverse frequencies of one model, in f32 as transformers computes them.
#[derive(Clone, Debug)]
pub struct Rope {
    inv_freq: Vec<f32>,
    head_dim: usize,
}

impl Rope {
    /// Frequencies for heads of width `head_dim` (even).
    pub fn new(cfg: &RopeConfig, head_dim: usize) -> Self {
        let half = head_dim / 2;
        let base: Vec<f32> = (0..half)
            .map(|i| 1.0 / (cfg.theta as f32).powf((2 * i) as f32 / head_dim as f32))
            .collect();
        let inv_freq = match &cfg.scaling {
            RopeScaling::None => base,
            RopeScaling::Linear { factor } => base.iter().map(|f| f / *factor as f32).collect(),
            RopeScaling::Factors(factors) => {
                base.iter().zip(factors).map(|(f, s)| f / *s as f32).collect()
            }
            RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings,
            } => {
                let p = [
                    *factor,
                    *low_freq_factor,
                    *high_freq_factor,
                    *original_max_position_embeddings,
                ]
                .map(|v| v as f32);
                base.iter().map(|&f| llama3_freq(f, p[0], p[1], p[2], p[3])).collect()
            }
        };
        Self { inv_freq, head_dim }
    }

    /// Head width.
    pub fn head_dim(&self) -> usize {
        self.head_dim
    }

    /// The `head_dim / 2` inverse frequencies.
    pub fn inv_freq(&self) -> &[f32] {
        &self.inv_freq
    }

    /// `(cos, sin)` tables of shape `[positions, head_dim]` (each angle repeated for both
    /// halves) for positions `start..start + len`.
    ///
    /// # Errors
    /// [`crate::Error::Torch`] if libtorch fails.
    pub fn tables(&self, start: usize, len: usize) -> Result<(Tensor, Tensor)> {
        let pos = Tensor::f_arange_start(
            start as i64,
            (start + len) as i64,
            (Kind::Float, tch::Device::Cpu),
        )
        .op("rope positions")?;
        let inv = Tensor::f_from_slice(&self.inv_freq).op("rope inv_freq")?;
        let freqs = pos.f_outer(&inv).op("rope outer")?;
        let emb = Tensor::f_cat(&[&freqs, &freqs], -1).op("rope cat")?;
        Ok((emb.f_cos().op("rope cos")?, emb.f_sin().op("rope sin")?))
    }

    /// Rotates `x` of shape `[tokens, heads, head_dim]` with tables from [`Rope::tables`].
    ///
    /// # Errors
    /// [`crate::Error::Torch`] on a shape mismatch.
    pub fn apply(&self, x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
        let half = (self.head_dim / 2) as i64;
        let (cos, sin) =
            (cos.f_unsqueeze(1).op("rope unsqueeze")?, sin.f_unsqueeze(1).op("rope unsqueeze")?);
        let x1 = x.f_narrow(-1, 0, half).op("rope narrow")?;
        let x2 = x.f_narrow(-1, half, half).op("rope narrow")?;
        let rotated = Tensor::f_cat(&[&x2.f_neg().op("rope neg")?, &x1], -1).op("rope cat")?;
        x.f_mul(&cos).op("rope mul")?.f_add(&rotated.f_mul(&sin).op("rope mul")?).op("rope add")
    }

    /// Rotates, in place, `rows` (a whole number of heads of one token) at `position`.
    pub fn apply_rows(&self, rows: &mut [f32], position: usize) {
        let half = self.head_dim / 2;
        for head in rows.chunks_exact_mut(self.head_dim) {
            let (a, b) = head.split_at_mut(half);
            for ((x1, x2), &w) in a.iter_mut().zip(b.iter_mut()).zip(&self.inv_freq) {
                let angle = position as f32 * w;
                let (s, c) = angle.sin_cos();
                let (u, v) = (*x1, *x2);
                *x1 = u * c + (-v) * s;
                *x2 = v * c + u * s;
            }
        }
    }
}

/// Llama 3.1's rescaling of one inverse frequency (transformers' `_compute_llama3_parameters`).
fn llama3_freq(f: f32, factor: f32, low: f32, high: f32, old_ctx: f32) -> f32 {
    let low_wavelen = old_ctx / low;
    let high_wavelen = old_ctx / high;
    let wavelen = 2.0 * std::f32::consts::PI / f;
    if wavelen > low_wavelen {
        f / factor
    } else if wavelen < high_wavelen {
        f
    } else {
        let smooth = (old_ctx / wavelen - low) / (high - low);
        (1.0 - smooth) * f / factor + smooth * f
    }
}
