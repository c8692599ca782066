//! [`AttnConfig`]: the head layout of one attention layer and its softmax scale.
//!
//! Grouped-query attention (GQA): `q_heads = group · kv_heads`, and q-head `h`
//! reads kv-head `h / group`. Every kernel of this crate runs one decode step of all heads
//! of a layer, and one pass over a kv-head's rows serves all `group` q-heads that share it
//! (SWAN's decode step, method section; WnW's anchor q-heads, §2.3 Eq. 2, are summed over the
//! same groups). The scale defaults to `1/√d_h` and may be set to anything finite and
//! positive (models with a custom attention multiplier).

use crate::error::{Error, Result};

/// Head layout and softmax scale of one attention layer's decode step.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AttnConfig {
    q_heads: usize,
    kv_heads: usize,
    head_dim: usize,
    scale: f32,
}

impl AttnConfig {
    /// A layout with the default scale `1/√head_dim`.
    ///
    /// # Errors
    /// [`Error::InvalidLayout`] if a count is zero, `head_dim > 65535` (the largest head any
    /// `kv-sparse` cache supports), or `q_heads` is not a multiple of `kv_heads`.
    ///
    /// # Examples
    /// ```
    /// let cfg = attn_kernels::AttnConfig::new(32, 8, 128)?;
    /// assert_eq!(cfg.group_size(), 4);
    /// assert_eq!(cfg.kv_head_of(13), 3);
    /// assert!((cfg.scale() - 1.0 / 128f32.sqrt()).abs() < 1e-9);
    /// assert!(attn_kernels::AttnConfig::new(9, 2, 64).is_err());
    /// # Ok::<(), attn_kernels::Error>(())
    /// ```
    pub fn new(q_heads: usize, kv_heads: usize, head_dim: usize) -> Result<Self> {
        let bad = |reason| {
            Err(Error::InvalidLayout { op: "AttnConfig::new", q_heads, kv_heads, head_dim, reason })
        };
        if q_heads == 0 || kv_heads == 0 || head_dim == 0 {
            return bad("head counts and head_dim must be ≥ 1");
        }
        if head_dim > kv_sparse::MAX_HEAD_DIM {
            return bad("head_dim must be ≤ 65535");
        }
        if !q_heads.is_multiple_of(kv_heads) {
            return bad("q-heads must be a multiple of kv-heads");
        }
        let scale = 1.0 / (head_dim as f32).sqrt();
        Ok(Self { q_heads, kv_heads, head_dim, scale })
    }

    /// The same layout with softmax scale `scale` (logits are `scale · q·k`).
    ///
    /// # Errors
    /// [`Error::InvalidScale`] unless `scale` is finite and positive.
    ///
    /// # Examples
    /// ```
    /// let cfg = attn_kernels::AttnConfig::new(4, 4, 64)?.with_scale(0.5)?;
    /// assert_eq!(cfg.scale(), 0.5);
    /// assert!(cfg.with_scale(f32::NAN).is_err());
    /// # Ok::<(), attn_kernels::Error>(())
    /// ```
    pub fn with_scale(self, scale: f32) -> Result<Self> {
        if !(scale.is_finite() && scale > 0.0) {
            return Err(Error::InvalidScale { op: "AttnConfig::with_scale", scale });
        }
        Ok(Self { scale, ..self })
    }

    /// Query heads.
    pub fn q_heads(&self) -> usize {
        self.q_heads
    }

    /// Key/value heads.
    pub fn kv_heads(&self) -> usize {
        self.kv_heads
    }

    /// Elements per head vector.
    pub fn head_dim(&self) -> usize {
        self.head_dim
    }

    /// Softmax scale applied to `q·k`.
    pub fn scale(&self) -> f32 {
        self.scale
    }

    /// Query heads per kv-head (GQA group size; 1 for multi-head attention).
    pub fn group_size(&self) -> usize {
        self.q_heads / self.kv_heads
    }

    /// The kv-head that q-head `q_head` reads.
    pub fn kv_head_of(&self, q_head: usize) -> usize {
        q_head / self.group_size()
    }

    /// Length of the query and output slices: `q_heads · head_dim`.
    pub fn q_len(&self) -> usize {
        self.q_heads * self.head_dim
    }
}
