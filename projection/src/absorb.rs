//! Absorption of `P_VO` into `W_V` (and its bias) and `W_O`: zero run-time cost for V/O.
//!
//! SWAN §4 and Appendix A.1 (Lemma 2). The paper writes row vectors and `[in, out]`
//! weights (`v = x·W_V`, `Ŵ_V = W_V·P_VO`, `Ŵ_O^(h) = P_VOᵀ·W_O^(h)`). Here every weight is
//! in Hugging Face `nn.Linear` layout **`[out, in]` row-major** (`y = x·Wᵀ + b`), so:
//!
//! * `W_V`: `[kv_heads·d, hidden]`. Rows `j·d .. (j+1)·d` produce kv-head `j`'s value
//!   `v_j = W_V[j]·x`. We want `v̂_j = v_j·P` (row-vector convention), i.e.
//!   `v̂_j[b] = Σ_a P[a][b]·v_j[a]`, hence **`Ŵ_V[j] = Pᵀ·W_V[j]`** (`d × hidden`) and
//!   **`b̂_j = b_j·P`** (Qwen2's `v_proj` bias).
//! * `W_O`: `[hidden, q_heads·d]`. Columns `h·d .. (h+1)·d` consume head `h`'s output
//!   `o_h`. The rotated model produces `ô_h = o_h·P` with `P` = `P_VO` of kv-head
//!   `h / group` (values are rotated, and `o_h` is an attention-weighted sum of them), so
//!   `o_h = ô_h·Pᵀ` and `y = Σ_h W_O[:, h]·o_h = Σ_h (W_O[:, h]·P)·ô_h`, hence
//!   **`Ŵ_O[:, h] = W_O[:, h]·P`** — the same `P` repeated over the GQA group
//!   (`P_VO,expanded`).
//!
//! `o_proj` biases (none in Llama/Qwen2) are added after `W_O` and need no change; Q/K
//! biases act before RoPE and are untouched (`P_QK` is applied at run time).

use crate::dims::Stream;
use crate::error::{Result, check_finite, check_len, check_product};
use crate::gemm::{View, sgemm};
use crate::mat::Mat;
use crate::set::ProjectionSet;

fn check_bases(op: &'static str, bases: &[&Mat]) -> Result<usize> {
    let d = bases.first().map_or(0, |p| p.rows());
    for p in bases {
        check_len(op, "basis rows", d, p.rows())?;
        check_len(op, "basis cols", d, p.cols())?;
    }
    Ok(d)
}

/// Absorbs per-kv-head bases into a value projection, in place: `Ŵ_V[j] = Pⱼᵀ·W_V[j]` and
/// `b̂_j = b_j·Pⱼ`. `w_v` is `[bases.len()·d, hidden]` (`[out, in]`), `bias` is
/// `[bases.len()·d]`.
///
/// # Errors
/// [`crate::Error::Shape`] for inconsistent sizes (including an empty `bases`),
/// [`crate::Error::NonFinite`] for NaN/∞ weights. Nothing is modified on error.
///
/// # Examples
/// ```
/// use projection::{absorb_value_weights, Mat};
/// // One kv-head, d = 2, hidden = 1; P swaps the two coordinates.
/// let p = Mat::from_vec(2, 2, vec![0.0, 1.0, 1.0, 0.0])?;
/// let (mut w, mut b) = (vec![3.0f32, 5.0], vec![0.5f32, -0.5]);
/// absorb_value_weights(&[&p], &mut w, 1, Some(&mut b))?;
/// assert_eq!((w, b), (vec![5.0, 3.0], vec![-0.5, 0.5]));
/// # Ok::<(), projection::Error>(())
/// ```
pub fn absorb_value_weights(
    bases: &[&Mat],
    w_v: &mut [f32],
    hidden: usize,
    bias: Option<&mut [f32]>,
) -> Result<()> {
    const OP: &str = "absorb_value_weights";
    let d = check_bases(OP, bases)?;
    check_len(OP, "bases", bases.len().max(1), bases.len())?;
    check_product(OP, "w_v", &[bases.len(), d, hidden], w_v.len())?;
    check_finite(OP, "w_v", w_v)?;
    if let Some(b) = bias.as_deref() {
        check_len(OP, "bias", bases.len() * d, b.len())?;
        check_finite(OP, "bias", b)?;
    }
    let mut tmp = vec![0.0f32; d * hidden];
    for (j, p) in bases.iter().enumerate() {
        let block = j * d * hidden;
        let pt = View::transposed(p.as_slice(), 0, d);
        sgemm(d, d, hidden, pt, View::row_major(w_v, block, hidden), 0.0, &mut tmp, 0, hidden);
        w_v[block..block + d * hidden].copy_from_slice(&tmp);
    }
    if let Some(b) = bias {
        for (j, p) in bases.iter().enumerate() {
            let src = b[j * d..(j + 1) * d].to_vec();
            crate::rotate::rotate_rows(&src, p, &mut b[j * d..(j + 1) * d])?;
        }
    }
    Ok(())
}

/// Absorbs per-kv-head bases into an output projection, in place: `Ŵ_O[:, h] = W_O[:, h]·Pⱼ`
/// for every query head `h`, `j = h / (q_heads / bases.len())`. `w_o` is
/// `[hidden, q_heads·d]` (`[out, in]`).
///
/// # Errors
/// [`crate::Error::Shape`] for inconsistent sizes or `q_heads` not a multiple of
/// `bases.len()`; [`crate::Error::NonFinite`] for NaN/∞ weights. Nothing is modified on
/// error.
///
/// # Examples
/// ```
/// use projection::{absorb_output_weights, Mat};
/// // Two q-heads share one kv-head (GQA), d = 2, hidden = 1.
/// let p = Mat::from_vec(2, 2, vec![0.0, 1.0, 1.0, 0.0])?;
/// let mut w = vec![1.0f32, 2.0, 3.0, 4.0];
/// absorb_output_weights(&[&p], 2, &mut w, 1)?;
/// assert_eq!(w, vec![2.0, 1.0, 4.0, 3.0]);
/// # Ok::<(), projection::Error>(())
/// ```
pub fn absorb_output_weights(
    bases: &[&Mat],
    q_heads: usize,
    w_o: &mut [f32],
    hidden: usize,
) -> Result<()> {
    const OP: &str = "absorb_output_weights";
    let d = check_bases(OP, bases)?;
    check_len(OP, "bases", bases.len().max(1), bases.len())?;
    check_len(OP, "q_heads (mod kv-heads)", 0, q_heads % bases.len())?;
    check_product(OP, "w_o", &[hidden, q_heads, d], w_o.len())?;
    check_finite(OP, "w_o", w_o)?;
    let group = q_heads / bases.len();
    let mut tmp = vec![0.0f32; hidden * d];
    for h in 0..q_heads {
        let p = bases[h / group];
        let slice = View { data: &*w_o, offset: h * d, rs: q_heads * d, cs: 1 };
        sgemm(hidden, d, d, slice, View::row_major(p.as_slice(), 0, d), 0.0, &mut tmp, 0, d);
        for (r, row) in tmp.chunks_exact(d).enumerate() {
            w_o[r * q_heads * d + h * d..][..d].copy_from_slice(row);
        }
    }
    Ok(())
}

impl ProjectionSet {
    /// [`absorb_value_weights`] with this set's `P_VO` of `layer`: `w_v` is the layer's
    /// `v_proj.weight` `[kv_heads·head_dim, hidden]`, `bias` its optional `v_proj.bias`.
    ///
    /// # Errors
    /// [`crate::Error::OutOfRange`] for a bad layer, otherwise as [`absorb_value_weights`].
    ///
    /// # Examples
    /// ```
    /// use projection::{ModelDims, ProjectionSet};
    /// let set = ProjectionSet::identity(ModelDims::new(1, 4, 2, 4)?, "toy")?;
    /// let mut w_v = vec![1.0f32; 2 * 4 * 16];
    /// set.absorb_value(0, &mut w_v, 16, None)?;
    /// assert_eq!(w_v, vec![1.0; 2 * 4 * 16]);
    /// # Ok::<(), projection::Error>(())
    /// ```
    pub fn absorb_value(
        &self,
        layer: usize,
        w_v: &mut [f32],
        hidden: usize,
        bias: Option<&mut [f32]>,
    ) -> Result<()> {
        self.dims().check_layer("ProjectionSet::absorb_value", layer)?;
        let bases: Vec<&Mat> =
            self.layer_bases(Stream::Vo, layer).iter().map(|b| b.matrix()).collect();
        absorb_value_weights(&bases, w_v, hidden, bias)
    }

    /// [`absorb_output_weights`] with this set's `P_VO` of `layer`: `w_o` is the layer's
    /// `o_proj.weight` `[hidden, q_heads·head_dim]`.
    ///
    /// # Errors
    /// [`crate::Error::OutOfRange`] for a bad layer, otherwise as [`absorb_output_weights`].
    ///
    /// # Examples
    /// ```
    /// use projection::{ModelDims, ProjectionSet};
    /// let set = ProjectionSet::random(ModelDims::new(1, 4, 2, 4)?, "toy", 1)?;
    /// let mut w_o = vec![0.5f32; 16 * 4 * 4];
    /// set.absorb_output(0, &mut w_o, 16)?;
    /// assert!(set.absorb_output(0, &mut w_o[1..], 16).is_err());
    /// # Ok::<(), projection::Error>(())
    /// ```
    pub fn absorb_output(&self, layer: usize, w_o: &mut [f32], hidden: usize) -> Result<()> {
        self.dims().check_layer("ProjectionSet::absorb_output", layer)?;
        let bases: Vec<&Mat> =
            self.layer_bases(Stream::Vo, layer).iter().map(|b| b.matrix()).collect();
        absorb_output_weights(&bases, self.dims().q_heads(), w_o, hidden)
    }
}
