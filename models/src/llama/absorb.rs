//! SWAN's absorption of `P_VO` into the weights (`papers/swan.txt`: "the projection for the
//! Value and Output components, `P_VO`, can be pre-applied"): `Ŵ_V = W_V·P_VO` per kv-head
//! (bias rotated too) and each q-head's slice of `W_O` premultiplied by `P_VOᵀ` of its
//! kv-head, so values are produced in the rotated basis and the output projection undoes it
//! with zero run-time cost. The arithmetic is `projection`'s; this file moves the weights
//! between libtorch and its row-major slices.

use projection::ProjectionSet;
use tch::Tensor;

use super::{Block, Llama};
use crate::error::{Result, TorchOp};

fn to_vec(t: &Tensor) -> Result<Vec<f32>> {
    let t = t.f_contiguous().op("contiguous")?;
    crate::llama::host::to_f32_vec(&t)
}

fn to_tensor(data: &[f32], shape: &[i64]) -> Result<Tensor> {
    Tensor::f_from_slice(data).op("from_slice")?.f_reshape(shape).op("reshape")
}

impl Llama {
    /// The same model with `set`'s `P_VO` absorbed into every layer's `W_V` (and bias) and
    /// `W_O`. Other weights are shared, not copied.
    ///
    /// # Errors
    /// [`crate::Error::InvalidInput`] if `set` was built for other dimensions;
    /// [`crate::Error::Projection`] from the absorption itself.
    pub fn absorb_vo(&self, set: &ProjectionSet) -> Result<Self> {
        let cfg = self.config();
        crate::cache::CacheShape::of(cfg)?.check_projection("absorb P_VO", set.dims())?;
        let blocks = self
            .blocks()
            .iter()
            .enumerate()
            .map(|(layer, block)| absorb_block(block, set, layer, cfg.hidden_size))
            .collect::<Result<Vec<_>>>()?;
        self.with_blocks(blocks)
    }
}

fn absorb_block(block: &Block, set: &ProjectionSet, layer: usize, hidden: usize) -> Result<Block> {
    let attn = block.attention();
    let (w_v, b_v) = attn.v_proj()?;
    let (v_shape, o_shape) = (w_v.size(), attn.o_proj().size());
    let mut v = to_vec(&w_v)?;
    let mut bias = b_v.as_ref().map(to_vec).transpose()?;
    set.absorb_value(layer, &mut v, hidden, bias.as_deref_mut())?;
    let mut o = to_vec(attn.o_proj())?;
    set.absorb_output(layer, &mut o, hidden)?;
    let v = to_tensor(&v, &v_shape)?;
    let bias = bias.map(|b| to_tensor(&b, &[b.len() as i64])).transpose()?;
    let attn = attn.with_vo(&v, bias.as_ref(), to_tensor(&o, &o_shape)?)?;
    Ok(block.with_attention(attn))
}
