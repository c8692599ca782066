//! Zero-copy hand-over between libtorch tensors and our kernels' `&[f32]` slices.
//!
//! The decode step computes q/k/v with one libtorch matmul and must hand those rows to
//! the cache, then feed the cache's attention output back to libtorch's `W_O` matmul.
//! [`f32_slice`] (unsafe: the caller promises no writer) borrows a fresh tensor's storage
//! directly; [`to_f32_vec`] is the safe copy for paths that are not per-step; `HostTensor`
//! is a tensor this crate allocates once, never shares, and lets kernels write into in
//! place. No per-step copies or allocations cross the boundary.

use tch::{Device, Kind, Tensor};

use crate::error::{Result, TorchOp, invalid};

fn check_f32_cpu_contiguous(t: &Tensor, op: &'static str) -> Result<usize> {
    let kind = t.f_kind().op(op)?;
    if kind != Kind::Float || t.device() != Device::Cpu || !t.is_contiguous() {
        let reason = format!("need a contiguous f32 CPU tensor, got {kind:?} on {:?}", t.device());
        return Err(invalid(op, reason));
    }
    Ok(t.numel())
}

/// Borrows the elements of a contiguous f32 CPU tensor without a copy (the decode step's
/// q/k/v rows and prefill K/V go to the caches this way).
///
/// # Safety
/// Nothing may write to the tensor's storage while the returned slice is alive: not
/// through `t`, nor through another handle sharing the storage (a shallow clone, a view,
/// or libtorch holding it for an in-place op). A tensor just returned by a libtorch op
/// and not shared yet satisfies this. [`to_f32_vec`] is the safe, copying alternative.
///
/// # Errors
/// [`crate::Error::InvalidInput`] if the tensor is not f32, not on the CPU, or strided.
pub unsafe fn f32_slice(t: &Tensor) -> Result<&[f32]> {
    let n = check_f32_cpu_contiguous(t, "borrow tensor data")?;
    if n == 0 {
        return Ok(&[]);
    }
    // SAFETY: the tensor is a contiguous CPU f32 tensor of `n` elements, so `data_ptr`
    // points to `n` initialised, properly aligned f32 values; the storage lives at least
    // as long as `t`, which the returned borrow is tied to; the caller guarantees no
    // writes while the borrow lives (this function's contract).
    Ok(unsafe { std::slice::from_raw_parts(t.data_ptr() as *const f32, n) })
}

/// Copies the elements of a contiguous f32 CPU tensor (safe; one copy).
///
/// # Errors
/// [`crate::Error::InvalidInput`] if the tensor is not f32, not on the CPU, or strided.
pub fn to_f32_vec(t: &Tensor) -> Result<Vec<f32>> {
    let n = check_f32_cpu_contiguous(t, "copy tensor data")?;
    let mut out = vec![0f32; n];
    t.f_copy_data(&mut out, n).op("copy tensor data")?;
    Ok(out)
}

/// A contiguous f32 CPU tensor owned by one user and writable as a slice, so a kernel can
/// fill it and libtorch can read it without a copy. Crate-private: its soundness rests on
/// every reader of [`HostTensor::tensor`] being a libtorch op of this crate that keeps no
/// handle to it.
pub(crate) struct HostTensor {
    tensor: Tensor,
}

impl HostTensor {
    /// A zero-filled tensor of `shape`.
    ///
    /// # Errors
    /// [`crate::Error::Torch`] if libtorch cannot allocate it.
    pub(crate) fn zeros(shape: &[i64]) -> Result<Self> {
        Ok(Self {
            tensor: Tensor::f_zeros(shape, (Kind::Float, Device::Cpu))
                .op("allocate host tensor")?,
        })
    }

    /// The tensor, for reading by libtorch ops (which never keep a handle to it).
    pub(crate) fn tensor(&self) -> &Tensor {
        &self.tensor
    }

    /// Write access to the elements.
    pub(crate) fn as_mut_slice(&mut self) -> &mut [f32] {
        let n = self.tensor.numel();
        if n == 0 {
            return &mut [];
        }
        // SAFETY: allocated by `zeros` as a contiguous CPU f32 tensor of `n` elements that is
        // never handed out as an owned handle, so no other writer exists; `&mut self` makes this the only live borrow of the
        // storage, and libtorch only reads it during ops that borrow `&self.tensor`, which
        // cannot overlap with this `&mut` borrow.
        unsafe { std::slice::from_raw_parts_mut(self.tensor.data_ptr() as *mut f32, n) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_tensor_is_written_in_place_and_read_by_libtorch() {
        let mut h = HostTensor::zeros(&[1, 3]).unwrap();
        h.as_mut_slice().copy_from_slice(&[4.0, 5.0, 6.0]);
        assert_eq!(h.tensor().sum(Kind::Float).double_value(&[]), 15.0);
    }
}
