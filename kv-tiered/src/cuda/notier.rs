//! [`CudaTier`] of a build without the `cuda` feature: same API, [`CudaTier::new`] fails with a
//! clear [`TierError::Backend`]; no value of these types can exist (WnW §2.3 GPU tier absent).

use std::convert::Infallible;

use super::CudaArena;
use crate::tier::{
    CopyEvent, DevicePage, HostPage, MoveError, PoolSpec, Tier, TierConfig, TierError,
};

/// Completion of a recall. Uninhabited without the `cuda` feature.
#[derive(Debug)]
pub struct CudaCopyEvent(Infallible);

impl CopyEvent for CudaCopyEvent {
    fn wait(self) -> Result<(), TierError> {
        match self.0 {}
    }
}

/// The GPU tier. Uninhabited without the `cuda` feature.
pub struct CudaTier(Infallible);

impl CudaTier {
    /// Always fails in this build.
    ///
    /// # Errors
    /// [`TierError::Backend`] naming the missing feature.
    ///
    /// # Examples
    /// ```
    /// use kv_tiered::tier::{PoolSpec, TierConfig};
    /// let cfg = TierConfig { layers: 1, pools: vec![PoolSpec { page_rows: 4, key_row_bytes: 8, value_row_bytes: 8 }], device_pages_per_layer: Some(4), host_pages: Some(4) };
    /// # #[cfg(not(feature = "cuda"))]
    /// assert!(kv_tiered::cuda::CudaTier::new(cfg).is_err());
    /// ```
    pub fn new(_config: TierConfig) -> Result<Self, TierError> {
        Err(TierError::Backend {
            op: "CudaTier::new",
            message: "kv-tiered was built without the `cuda` feature".into(),
        })
    }
}

impl CudaTier {
    /// Reads rows of a device page back (unreachable in this build).
    ///
    /// # Errors
    /// Never returns.
    pub fn read_device(
        &self,
        _page: &DevicePage,
        _first_row: usize,
        _keys: &mut [u8],
        _values: &mut [u8],
    ) -> Result<(), TierError> {
        match self.0 {}
    }
}

impl Tier for CudaTier {
    type Event = CudaCopyEvent;
    type Arena<'a> = CudaArena;

    fn layers(&self) -> usize {
        match self.0 {}
    }
    fn pools(&self) -> &[PoolSpec] {
        match self.0 {}
    }
    fn alloc_device(&self, _pool: usize, _layer: usize) -> Result<DevicePage, TierError> {
        match self.0 {}
    }
    fn free_device(&self, _page: DevicePage) {
        match self.0 {}
    }
    fn write_device(
        &self,
        _page: &DevicePage,
        _first_row: usize,
        _keys: &[u8],
        _values: &[u8],
    ) -> Result<(), TierError> {
        match self.0 {}
    }
    fn alloc_host(&self, _pool: usize) -> Result<HostPage, TierError> {
        match self.0 {}
    }
    fn write_host(
        &self,
        _page: HostPage,
        _first_row: usize,
        _keys: &[u8],
        _values: &[u8],
    ) -> Result<(), TierError> {
        match self.0 {}
    }
    fn read_host(
        &self,
        _page: HostPage,
        _first_row: usize,
        _keys: &mut [u8],
        _values: &mut [u8],
    ) -> Result<(), TierError> {
        match self.0 {}
    }
    fn copy_to_device(
        &self,
        _src: HostPage,
        _dst: DevicePage,
        _rows: usize,
    ) -> Result<(DevicePage, Self::Event), MoveError> {
        match self.0 {}
    }
    fn arena(&self, _pool: usize, _layer: usize) -> Self::Arena<'_> {
        match self.0 {}
    }
}
