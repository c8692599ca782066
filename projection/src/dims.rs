//! Attention geometry of a model: layers, query heads, KV heads (GQA), head dimension, and
//! the per-head positions ([`Site`]: layer, kv-head, [`Stream`]) that index its bases.
//!
//! SWAN keeps one `P_QK` and one `P_VO` per (layer, kv-head) (SWAN §4, "projection
//! matrices"); query head `h` uses the bases of kv-head `h / group` where
//! `group = q_heads / kv_heads` (GQA; `group == 1` is MHA), the same mapping Hugging Face's
//! `repeat_kv` uses.

use std::fmt;

use crate::error::{Error, Result, check_index};

/// Which of the two per-head bases a matrix or an accumulator belongs to.
///
/// SWAN learns one basis for the joint query/key distribution (`P_QK`, applied at run time
/// after RoPE) and one for the joint value/attention-output distribution (`P_VO`, absorbed
/// into `W_V`/`W_O`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Stream {
    /// Queries (after RoPE) and keys (after RoPE): basis `P_QK`.
    Qk,
    /// Values and per-q-head attention outputs: basis `P_VO`.
    Vo,
}

impl Stream {
    /// Both streams, QK first (the order used in files and loops).
    pub const ALL: [Stream; 2] = [Stream::Qk, Stream::Vo];

    /// Position of the stream in [`Stream::ALL`].
    pub const fn index(self) -> usize {
        match self {
            Stream::Qk => 0,
            Stream::Vo => 1,
        }
    }
}

impl fmt::Display for Stream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Stream::Qk => "QK",
            Stream::Vo => "VO",
        })
    }
}

/// One (layer, kv-head, stream) position of a model: labels errors and indexes bases.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Site {
    /// Decoder layer index.
    pub layer: usize,
    /// KV-head index inside the layer.
    pub kv_head: usize,
    /// QK or VO basis.
    pub stream: Stream,
}

impl fmt::Display for Site {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "layer {} kv-head {} {}", self.layer, self.kv_head, self.stream)
    }
}

/// Attention dimensions shared by every layer of a decoder.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ModelDims {
    layers: usize,
    q_heads: usize,
    kv_heads: usize,
    head_dim: usize,
}

impl ModelDims {
    /// Validates and builds the dimensions.
    ///
    /// # Errors
    /// [`Error::InvalidDims`] if any count is zero or `q_heads` is not a multiple of
    /// `kv_heads`.
    ///
    /// # Examples
    /// ```
    /// // SmolLM2-135M: 30 layers, 9 query heads sharing 3 kv-heads, head_dim 64.
    /// let dims = projection::ModelDims::new(30, 9, 3, 64)?;
    /// assert_eq!(dims.group(), 3);
    /// assert_eq!(dims.kv_of(5), 1);
    /// assert!(projection::ModelDims::new(30, 8, 3, 64).is_err());
    /// # Ok::<(), projection::Error>(())
    /// ```
    pub fn new(layers: usize, q_heads: usize, kv_heads: usize, head_dim: usize) -> Result<Self> {
        let invalid = |reason: String| Err(Error::InvalidDims { reason });
        if layers == 0 || q_heads == 0 || kv_heads == 0 || head_dim == 0 {
            return invalid(format!(
                "all counts must be > 0 (layers {layers}, q_heads {q_heads}, \
                 kv_heads {kv_heads}, head_dim {head_dim})"
            ));
        }
        if !q_heads.is_multiple_of(kv_heads) {
            return invalid(format!("q_heads {q_heads} is not a multiple of kv_heads {kv_heads}"));
        }
        let per_layer = q_heads.checked_mul(head_dim).and_then(|x| x.checked_mul(head_dim));
        if per_layer.and_then(|x| x.checked_mul(layers)).is_none() {
            return invalid("sizes overflow usize".to_owned());
        }
        Ok(Self { layers, q_heads, kv_heads, head_dim })
    }

    /// Number of decoder layers.
    pub const fn layers(&self) -> usize {
        self.layers
    }

    /// Number of query heads per layer.
    pub const fn q_heads(&self) -> usize {
        self.q_heads
    }

    /// Number of key/value heads per layer.
    pub const fn kv_heads(&self) -> usize {
        self.kv_heads
    }

    /// Dimension of one head (`d_h`).
    pub const fn head_dim(&self) -> usize {
        self.head_dim
    }

    /// Query heads per kv-head (GQA group size; 1 for MHA).
    pub const fn group(&self) -> usize {
        self.q_heads / self.kv_heads
    }

    /// The kv-head whose K/V (and whose bases) query head `q_head` uses: `q_head / group`.
    ///
    /// The result is meaningless for `q_head >= q_heads`; use [`ModelDims::check_q_head`].
    pub const fn kv_of(&self, q_head: usize) -> usize {
        q_head / self.group()
    }

    /// Number of (layer, kv-head) positions (= bases per stream).
    pub const fn sites(&self) -> usize {
        self.layers * self.kv_heads
    }

    /// Flat index of (layer, kv-head) in layer-major order.
    pub(crate) const fn site_index(&self, layer: usize, kv_head: usize) -> usize {
        layer * self.kv_heads + kv_head
    }

    /// Errors unless `layer < layers`.
    ///
    /// # Errors
    /// [`Error::OutOfRange`].
    ///
    /// # Examples
    /// ```
    /// let dims = projection::ModelDims::new(2, 4, 2, 8)?;
    /// assert!(dims.check_layer("example", 1).is_ok());
    /// assert!(dims.check_layer("example", 2).is_err());
    /// # Ok::<(), projection::Error>(())
    /// ```
    pub fn check_layer(&self, op: &'static str, layer: usize) -> Result<()> {
        check_index(op, "layer", layer, self.layers)
    }

    /// Errors unless `kv_head < kv_heads`.
    ///
    /// # Errors
    /// [`Error::OutOfRange`].
    ///
    /// # Examples
    /// ```
    /// let dims = projection::ModelDims::new(2, 4, 2, 8)?;
    /// assert!(dims.check_kv_head("example", 2).is_err());
    /// # Ok::<(), projection::Error>(())
    /// ```
    pub fn check_kv_head(&self, op: &'static str, kv_head: usize) -> Result<()> {
        check_index(op, "kv-head", kv_head, self.kv_heads)
    }

    /// Errors unless `q_head < q_heads`.
    ///
    /// # Errors
    /// [`Error::OutOfRange`].
    ///
    /// # Examples
    /// ```
    /// let dims = projection::ModelDims::new(2, 4, 2, 8)?;
    /// assert!(dims.check_q_head("example", 3).is_ok());
    /// # Ok::<(), projection::Error>(())
    /// ```
    pub fn check_q_head(&self, op: &'static str, q_head: usize) -> Result<()> {
        check_index(op, "q-head", q_head, self.q_heads)
    }
}

impl std::fmt::Display for ModelDims {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} layers × {} q-heads / {} kv-heads × d_h {}",
            self.layers, self.q_heads, self.kv_heads, self.head_dim
        )
    }
}
