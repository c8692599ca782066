//! The gated MLP of a Llama block: `down(silu(gate(x)) · up(x))`, with gate and up fused
//! into one matmul; Gemma 3's GeGLU is the same with the tanh approximation of GELU.

use tch::Tensor;

use crate::error::{Result, TorchOp};
use attn_kernels::ThreadPool;

use crate::llama::linear::linear_on;
use crate::load::config::ModelConfig;
use crate::load::weights::Weights;

/// SwiGLU (GeGLU for Gemma 3) feed-forward network.
pub struct Mlp {
    gelu: bool,
    gate_up: Tensor,
    gate_up_bias: Option<Tensor>,
    down: Tensor,
    down_bias: Option<Tensor>,
    inner: i64,
}

/// Clones share the (immutable) weight storage.
impl Clone for Mlp {
    fn clone(&self) -> Self {
        Self {
            gelu: self.gelu,
            gate_up: self.gate_up.shallow_clone(),
            gate_up_bias: self.gate_up_bias.as_ref().map(Tensor::shallow_clone),
            down: self.down.shallow_clone(),
            down_bias: self.down_bias.as_ref().map(Tensor::shallow_clone),
            inner: self.inner,
        }
    }
}

impl Mlp {
    /// Loads `{prefix}.{gate,up,down}_proj`.
    ///
    /// # Errors
    /// Missing or mis-shaped weights.
    pub fn load(w: &Weights<'_>, cfg: &ModelConfig, prefix: &str) -> Result<Self> {
        let (h, i) = (cfg.hidden_size, cfg.intermediate_size);
        let gate = w.get(&format!("{prefix}.gate_proj.weight"), &[i, h])?;
        let up = w.get(&format!("{prefix}.up_proj.weight"), &[i, h])?;
        let down = w.get(&format!("{prefix}.down_proj.weight"), &[h, i])?;
        let (gate_up_bias, down_bias) = if cfg.mlp_bias {
            let gb = w.get(&format!("{prefix}.gate_proj.bias"), &[i])?;
            let ub = w.get(&format!("{prefix}.up_proj.bias"), &[i])?;
            (
                Some(Tensor::f_cat(&[gb, ub], 0).op("cat mlp bias")?),
                Some(w.get(&format!("{prefix}.down_proj.bias"), &[h])?),
            )
        } else {
            (None, None)
        };
        let gate_up = Tensor::f_cat(&[gate, up], 0).op("cat gate/up")?;
        let gelu = cfg.arch == crate::load::config::Architecture::Gemma3;
        Ok(Self { gelu, gate_up, gate_up_bias, down, down_bias, inner: i as i64 })
    }

    /// Every weight tensor of the MLP.
    pub(crate) fn tensors(&self) -> Vec<&Tensor> {
        let mut t = vec![&self.gate_up, &self.down];
        t.extend(self.gate_up_bias.iter().chain(&self.down_bias));
        t
    }

    /// Applies the MLP to `x` (`[..., hidden]`).
    ///
    /// # Errors
    /// [`crate::Error::Torch`] on a shape mismatch.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.forward_on(None, x)
    }

    /// [`Mlp::forward`] with one-row products split among `pool`'s threads
    /// ([`linear_on`]).
    ///
    /// # Errors
    /// As [`Mlp::forward`].
    pub fn forward_on(&self, pool: Option<&ThreadPool>, x: &Tensor) -> Result<Tensor> {
        let gu = linear_on(pool, x, &self.gate_up, self.gate_up_bias.as_ref(), "mlp gate_up")?;
        let gate = gu.f_narrow(-1, 0, self.inner).op("mlp narrow")?;
        let up = gu.f_narrow(-1, self.inner, self.inner).op("mlp narrow")?;
        let gate = if self.gelu {
            gate.f_gelu("tanh").op("mlp gelu")?
        } else {
            gate.f_silu().op("mlp silu")?
        };
        let act = gate.f_mul(&up).op("mlp mul")?;
        linear_on(pool, &act, &self.down, self.down_bias.as_ref(), "mlp down")
    }
}
