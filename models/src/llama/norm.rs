//! RMSNorm (`x / √(mean(x²) + ε) · w`), the Llama family's only normalisation.

use tch::Tensor;

use crate::error::{Result, TorchOp};
use crate::load::weights::Weights;

/// Root-mean-square normalisation over the last dimension.
pub struct RmsNorm {
    weight: Tensor,
    eps: f64,
    width: i64,
}

/// Clones share the (immutable) weight storage.
impl Clone for RmsNorm {
    fn clone(&self) -> Self {
        Self { weight: self.weight.shallow_clone(), eps: self.eps, width: self.width }
    }
}

impl RmsNorm {
    /// Loads `{prefix}.weight` of length `width`.
    ///
    /// # Errors
    /// Missing or mis-shaped weight.
    pub fn load(w: &Weights<'_>, prefix: &str, width: usize, eps: f64) -> Result<Self> {
        Ok(Self { weight: w.get(&format!("{prefix}.weight"), &[width])?, eps, width: width as i64 })
    }

    /// The scale vector.
    pub(crate) fn weight(&self) -> &Tensor {
        &self.weight
    }

    /// Normalises `x` (`[..., width]`).
    ///
    /// # Errors
    /// [`crate::Error::Torch`] on a shape mismatch.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        x.f_rms_norm([self.width], Some(&self.weight), self.eps).op("rms_norm")
    }
}
