//! CUDA storage tier (feature `cuda`; WnW §2.3 tidal recall, and the paper's "Limitations":
//! recall overlapped with attention via CUDA streams).
//!
//! [`CudaTier`] implements the crate's [`Tier`](crate::tier::Tier) contract with device arenas
//! in GPU memory, a pinned host pool allocated once, and asynchronous host→device recalls on a
//! copy stream whose events the store waits on before attention reads the recalled rows.
//! Without the feature the same types exist and [`CudaTier::new`] returns
//! [`TierError::Backend`](crate::tier::TierError::Backend) saying so — callers write no `cfg`.
//! [`bench::recall_overlap`] measures H2D recall throughput and how much of it hides behind
//! the attention kernels (used by `scripts/gpu-check.sh`).

pub mod bench;
#[cfg(not(feature = "cuda"))]
mod notier;
#[cfg(test)]
mod tests;
#[cfg(feature = "cuda")]
mod tier;

#[cfg(not(feature = "cuda"))]
pub use notier::{CudaCopyEvent, CudaTier};
#[cfg(feature = "cuda")]
pub use tier::{CudaCopyEvent, CudaTier};

use crate::tier::ArenaRead;

/// Device pointers of one `(pool, layer)` arena of a [`CudaTier`], for kernels: row `r`
/// starts at `keys + r · key_row_bytes` (and likewise for values). It has no host bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CudaArena {
    /// Device address of row 0 of the key arena.
    pub keys: u64,
    /// Device address of row 0 of the value arena.
    pub values: u64,
    /// Rows in the arena.
    pub rows: usize,
}

impl ArenaRead for CudaArena {
    fn host_bytes(&self) -> Option<(&[u8], &[u8])> {
        None
    }
}
