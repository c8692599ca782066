//! Zero-copy hand-over between libtorch tensors and our kernels' `&[f32]` slices.
//!
//! The decode step computes q/k/v with one libtorch matmul and must hand those rows to
//! the cache, then feed the cache's attention output back to libtorch's `W_O` matmul.
//! [`f32_slice`] borrows a fresh tensor's storage directly; [`HostTensor`] is a tensor this
//! crate allocates once, never shares, and lets kernels write into in place. No per-step
//! copies or allocations cross the boundary.

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

/// Borrows the elements of a contiguous f32 CPU tensor.
///
/// The tensor must not be written through another handle (a shallow clone) while the
/// slice is alive; tensors returned by libtorch ops and not yet shared satisfy this.
///
/// # Errors
/// [`crate::Error::InvalidInput`] if the tensor is not f32, not on the CPU, or strided.
pub fn f32_slice(t: &Tensor) -> Result<&[f32]> {
    let n = check_f32_cpu_contiguous(t, "borrow tensor data")?;
    if n == 0 {
        return Ok(&[]);
    }
    // SAFETY: the tensor is a contiguous CPU f32 tensor of `n` elements, so `data_ptr`
    // points to `n` initialised, properly aligned f32 values; the storage lives at least
    // as long as `t`, which the returned borrow is tied to; the caller contract above
    // rules out concurrent writes.
    Ok(unsafe { std::slice::from_raw_parts(t.data_ptr() as *const f32, n) })
}

/// A contiguous f32 CPU tensor owned by one user and writable as a slice, so a kernel can
/// fill it and libtorch can read it without a copy.
pub struct HostTensor {
    tensor: Tensor,
}

impl HostTensor {
    /// A zero-filled tensor of `shape`.
    ///
    /// # Errors
    /// [`crate::Error::Torch`] if libtorch cannot allocate it.
    pub fn zeros(shape: &[i64]) -> Result<Self> {
        Ok(Self {
            tensor: Tensor::f_zeros(shape, (Kind::Float, Device::Cpu))
                .op("allocate host tensor")?,
        })
    }

    /// The tensor, for reading by libtorch ops (which never keep a handle to it).
    pub fn tensor(&self) -> &Tensor {
        &self.tensor
    }

    /// Read access to the elements.
    pub fn as_slice(&self) -> &[f32] {
        let n = self.tensor.numel();
        if n == 0 {
            return &[];
        }
        // SAFETY: allocated by `zeros` as a contiguous CPU f32 tensor of `n` elements that is
        // never handed out as an owned handle, so no other writer exists.
        unsafe { std::slice::from_raw_parts(self.tensor.data_ptr() as *const f32, n) }
    }

    /// Write access to the elements.
    pub fn as_mut_slice(&mut self) -> &mut [f32] {
        let n = self.tensor.numel();
        if n == 0 {
            return &mut [];
        }
        // SAFETY: as in `as_slice`; `&mut self` makes this the only live borrow of the
        // storage, and libtorch only reads it during ops that borrow `&self.tensor`, which
        // cannot overlap with this `&mut` borrow.
        unsafe { std::slice::from_raw_parts_mut(self.tensor.data_ptr() as *mut f32, n) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn borrow_and_write_without_copies() {
        let t = Tensor::from_slice(&[1f32, 2.0, 3.0]);
        assert_eq!(f32_slice(&t).unwrap(), &[1.0, 2.0, 3.0]);
        assert!(f32_slice(&t.to_kind(Kind::Double)).is_err());
        let strided = Tensor::from_slice(&[1f32, 2.0, 3.0, 4.0]).reshape([2, 2]).tr();
        assert!(f32_slice(&strided).is_err());
        let mut h = HostTensor::zeros(&[1, 3]).unwrap();
        h.as_mut_slice().copy_from_slice(&[4.0, 5.0, 6.0]);
        let sum = h.tensor().sum(Kind::Float).double_value(&[]);
        assert_eq!(sum, 15.0);
        assert_eq!(h.as_slice(), &[4.0, 5.0, 6.0]);
    }
}
