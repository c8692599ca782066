//! Qwen2.5-Omni's multimodal rotary embedding (M-RoPE) for audio + text prompts (WnW §3.1,
//! the Qwen2.5-Omni backbone). Every token carries three position ids (temporal, height,
//! width); the `head_dim / 2` rotary frequencies are split into sections `[s_t, s_h, s_w]`
//! and section `r` takes its angle from position row `r`; cos/sin are then duplicated to
//! `head_dim` (NeoX `rotate_half` layout, like Qwen2). For audio + text, `get_rope_index`
//! gives every token the same id in all three rows (`0..T−1`, audio included), so M-RoPE
//! reduces to plain RoPE — [`audio_text_positions`] builds those rows and
//! [`cos_sin`] handles arbitrary rows.

use tch::{Kind, Tensor};

use super::audio_err;
use crate::Result;

/// Position rows `[3, len]` for an audio + text sequence starting at `start`
/// (`start..start+len` in all three rows), what `get_rope_index` returns without vision.
pub fn audio_text_positions(start: i64, len: i64) -> Tensor {
    Tensor::arange_start(start, start + len, (Kind::Int64, tch::Device::Cpu))
        .unsqueeze(0)
        .expand([3, len], false)
        .contiguous()
}

/// Rotary cos and sin `[len, head_dim]` for position rows `positions` `[3, len]`, inverse
/// frequencies `θ^{−2i/head_dim}` and `sections` (summing to `head_dim / 2`).
///
/// # Errors
/// [`crate::Error::Audio`] if the shapes or sections do not fit.
///
/// # Examples
/// ```
/// use models::audio::mrope::{audio_text_positions, cos_sin};
/// let (cos, _sin) = cos_sin(&audio_text_positions(0, 5), 16, 1e6, &[2, 3, 3])?;
/// assert_eq!(cos.size(), [5, 16]);
/// # Ok::<(), models::Error>(())
/// ```
pub fn cos_sin(
    positions: &Tensor,
    head_dim: usize,
    theta: f64,
    sections: &[usize],
) -> Result<(Tensor, Tensor)> {
    let size = positions.size();
    let half = head_dim / 2;
    if size.len() != 2
        || size[0] != 3
        || sections.len() != 3
        || sections.iter().sum::<usize>() != half
        || !head_dim.is_multiple_of(2)
    {
        return Err(audio_err(
            "mrope::cos_sin",
            format!(
                "positions {size:?} (want [3, len]), sections {sections:?} (want 3 summing to head_dim/2 = {half})"
            ),
        ));
    }
    let inv: Vec<f32> =
        (0..half).map(|i| (1.0 / theta.powf(2.0 * i as f64 / head_dim as f64)) as f32).collect();
    let inv = Tensor::from_slice(&inv);
    // freqs[r, t, i] = pos[r, t] · inv[i], in f32 like transformers.
    let freqs = positions.to_kind(Kind::Float).unsqueeze(-1) * inv.view([1, 1, half as i64]);
    let mut parts = Vec::with_capacity(3);
    let mut start = 0i64;
    for (r, &s) in sections.iter().enumerate() {
        parts.push(freqs.get(r as i64).narrow(1, start, s as i64));
        start += s as i64;
    }
    let f = Tensor::cat(&parts, 1);
    let f = Tensor::cat(&[&f, &f], 1);
    Ok((f.cos(), f.sin()))
}
