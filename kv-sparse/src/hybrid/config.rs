//! [`HybridConfig`] and [`NonFinitePolicy`]: the knobs of one hybrid cache.
//!
//! SWAN (method section; Figure 2(b) and the TopK_R/TopV_R ablation, Appendix A.3): the
//! dense buffer size `b`, the number of kept key and value components (`k_key`, `k_value`,
//! which may differ), and the value format (a type parameter of the cache). Lossless
//! setting: `k_key = k_value = head_dim` with `f32` values.

use super::RowStore;
use crate::csr::CsrStore;
use crate::csr::default_rows_per_block;
use crate::{Error, Result, SparseIndex, Value, ValueFormat};

/// What to do with NaN or ±∞ in an appended key or value row.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum NonFinitePolicy {
    /// Reject the row with [`Error::NonFinite`]; the cache is unchanged (default).
    #[default]
    Error,
    /// Replace each non-finite element by 0 and store the row.
    Zero,
}

impl NonFinitePolicy {
    pub(crate) const fn code(self) -> u32 {
        match self {
            NonFinitePolicy::Error => 0,
            NonFinitePolicy::Zero => 1,
        }
    }

    pub(crate) fn from_code(code: u32) -> Option<Self> {
        match code {
            0 => Some(NonFinitePolicy::Error),
            1 => Some(NonFinitePolicy::Zero),
            _ => None,
        }
    }
}

/// Configuration of one (layer, kv-head) hybrid cache.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct HybridConfig {
    /// Elements per key/value vector (`d_h`), 1..=256 with `u8` indices, ≤ 65 535 with `u16`.
    pub head_dim: usize,
    /// Dense buffer rows `b` (0 allowed: every row is pruned immediately).
    pub buffer: usize,
    /// Kept key components per sparse row (`0..=head_dim`).
    pub k_key: usize,
    /// Kept value components per sparse row (`0..=head_dim`).
    pub k_value: usize,
    /// Handling of NaN/±∞ in appended rows.
    pub non_finite: NonFinitePolicy,
    /// Rows per CSR block (see [`crate::csr::max_rows_per_block`]).
    pub rows_per_block: usize,
    /// Optional per-head `(key, value)` scales: sparse values are stored as
    /// `V::from_f32(x / scale)` and read back multiplied by the scale. Meant for fp8 (see
    /// [`crate::fp8`] for when it is needed); must be positive, normal and finite.
    /// `None` means 1.
    pub fp8_scale: Option<(f32, f32)>,
}

impl HybridConfig {
    /// A config keeping `k` components of both keys and values, with default policy
    /// (error on non-finite), block size and no scale.
    ///
    /// # Examples
    /// ```
    /// let cfg = kv_sparse::hybrid::HybridConfig::new(128, 64, 32);
    /// assert_eq!((cfg.k_key, cfg.k_value, cfg.rows_per_block), (32, 32, 256));
    /// ```
    pub fn new(head_dim: usize, buffer: usize, k: usize) -> Self {
        Self {
            head_dim,
            buffer,
            k_key: k,
            k_value: k,
            non_finite: NonFinitePolicy::Error,
            rows_per_block: default_rows_per_block(head_dim).max(1),
            fp8_scale: None,
        }
    }

    /// The lossless setting for the index/value formats chosen: `k = head_dim`.
    /// (With `f32` values and an `f32` buffer every row reads back bit-exact.)
    pub fn lossless(head_dim: usize, buffer: usize) -> Self {
        Self::new(head_dim, buffer, head_dim)
    }

    /// The `(key, value)` scales, `(1, 1)` when none is set.
    pub fn scales(&self) -> (f32, f32) {
        self.fp8_scale.unwrap_or((1.0, 1.0))
    }

    /// Checks the config for a cache with index type `I` and dense type `D`.
    ///
    /// # Errors
    /// [`Error::HeadDimOutOfRange`], [`Error::KTooLarge`], [`Error::RowsPerBlockOutOfRange`],
    /// [`Error::InvalidScale`], or [`Error::OutOfRange`] when the buffer cannot be allocated.
    pub fn validate<I: SparseIndex, D: Value>(&self) -> Result<()> {
        self.validate_formats::<CsrStore<I, f32>>(D::FORMAT)
    }

    /// [`HybridConfig::validate`] for a cache whose sparse rows live in `S`.
    ///
    /// # Errors
    /// As [`HybridConfig::validate`], plus [`Error::OddK`] for 4-bit coded values.
    pub fn validate_store<S: RowStore, D: Value>(&self) -> Result<()> {
        self.validate_formats::<S>(D::FORMAT)
    }

    /// The same config with the default block size of rows stored in `S` (coded rows are
    /// larger than CSR entries, so their blocks hold fewer rows).
    pub fn for_store<S: RowStore>(mut self) -> Self {
        self.rows_per_block = S::default_rows_per_block(self.head_dim).max(1);
        self
    }

    /// [`HybridConfig::validate_store`] with the dense format given at run time.
    pub(crate) fn validate_formats<S: RowStore>(&self, dense: ValueFormat) -> Result<()> {
        const OP: &str = "HybridConfig::validate";
        S::check_config(OP, self.head_dim, self.rows_per_block, [self.k_key, self.k_value])?;
        let (sk, sv) = self.scales();
        for scale in [sk, sv] {
            if !(scale.is_normal() && scale > 0.0) {
                return Err(Error::InvalidScale { op: OP, scale });
            }
        }
        let max_buffer = isize::MAX as usize / (self.head_dim * dense.bytes());
        if self.buffer > max_buffer {
            return Err(Error::OutOfRange {
                op: OP,
                what: "buffer rows",
                index: self.buffer,
                len: max_buffer,
            });
        }
        Ok(())
    }
}
