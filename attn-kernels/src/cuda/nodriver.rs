//! The GPU backend of a build without the `cuda` feature: the same API as the cust-backed one,
//! where [`Gpu::new`] reports [`Error::CudaNotCompiled`] — so callers never write `cfg`
//! (SWAN §3 / WnW §2.3 kernels are only available with the feature).

use std::convert::Infallible;

use super::DecodeDevice;
use super::cache::LayerCache;
use crate::{AttnConfig, Error, Result};

/// Handle to the GPU. Without the `cuda` feature no value of this type can exist.
#[derive(Clone, Debug)]
pub struct Gpu {
    never: Infallible,
}

/// A layer cache resident in device memory. Uninhabited without the `cuda` feature.
#[derive(Debug)]
pub struct DeviceCache {
    never: Infallible,
}

impl DeviceCache {
    /// Bytes one decode step reads from device memory.
    pub fn bytes_read(&self) -> usize {
        match self.never {}
    }

    /// The decode kernel's entry point.
    pub fn kernel(&self) -> &str {
        match self.never {}
    }
}

impl Gpu {
    /// Always fails: this build has no GPU support.
    ///
    /// # Errors
    /// [`Error::CudaNotCompiled`].
    ///
    /// # Examples
    /// ```
    /// # #[cfg(not(feature = "cuda"))]
    /// assert!(matches!(attn_kernels::cuda::Gpu::new(), Err(attn_kernels::Error::CudaNotCompiled { .. })));
    /// ```
    pub fn new() -> Result<Self> {
        Err(Error::CudaNotCompiled { op: "Gpu::new" })
    }

    /// Makes the context current (unreachable without the feature).
    ///
    /// # Errors
    /// Never returns.
    pub fn make_current(&self) -> Result<()> {
        match self.never {}
    }

    /// Device name.
    pub fn name(&self) -> &str {
        match self.never {}
    }

    /// Streaming multiprocessors.
    pub fn sm_count(&self) -> usize {
        match self.never {}
    }

    /// Uploads a cache.
    ///
    /// # Errors
    /// Never returns.
    pub fn upload(&self, _cfg: &AttnConfig, _cache: LayerCache<'_>) -> Result<DeviceCache> {
        match self.never {}
    }

    /// Decodes a resident cache.
    ///
    /// # Errors
    /// Never returns.
    pub fn decode_resident(
        &self,
        _cfg: &AttnConfig,
        _q: &[f32],
        _cache: &DeviceCache,
        _out: &mut [f32],
        _weights: Option<&mut [f32]>,
    ) -> Result<()> {
        match self.never {}
    }

    /// Times a resident decode.
    ///
    /// # Errors
    /// Never returns.
    pub fn time_decode(
        &self,
        _cfg: &AttnConfig,
        _q: &[f32],
        _cache: &DeviceCache,
        _iters: usize,
    ) -> Result<f64> {
        match self.never {}
    }
}

impl DecodeDevice for Gpu {
    fn describe(&self) -> String {
        match self.never {}
    }

    fn decode(
        &self,
        _cfg: &AttnConfig,
        _q: &[f32],
        _cache: LayerCache<'_>,
        _out: &mut [f32],
        _weights: Option<&mut [f32]>,
    ) -> Result<()> {
        match self.never {}
    }
}
