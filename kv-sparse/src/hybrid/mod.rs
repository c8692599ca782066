//! SWAN's hybrid KV cache: a dense buffer of recent tokens over a sparse CSR history.
//!
//! SWAN (method section, "hybrid KV-cache strategy" and Algorithm 1): each (layer,
//! kv-head) keeps its `b` most recent key/value vectors dense; older vectors are pruned to
//! their top-k magnitude components and stored as CSR rows. Keys and values may keep
//! different `k` (Appendix A.3's TopK_R/TopV_R ablation).
//!
//! * [`HybridConfig`], [`NonFinitePolicy`] — the knobs.
//! * [`Hybrid`] — one (layer, kv-head) over any [`RowStore`]: [`HybridCache`] (CSR rows)
//!   or [`CodedHybridCache`] (bitmask / list rows with float or integer values), or
//!   [`QuantHybridCache`] (whole rows in `q8_0` / `q4_0` blocks or scaled fp8: a buffered
//!   quantized dense cache).
//! * [`HybridView`], [`CodedHybridView`] — what kernels read (same type for mapped files).
//! * [`MultiHead`] — `[layer][kv_head]` of hybrid caches for a whole model
//!   ([`MultiHeadCache`], [`CodedMultiHeadCache`]).

mod buffer;
mod cache;
mod config;
mod history;
mod input;
mod multi;
mod store;
mod view;

pub use cache::{CodedHybridCache, Hybrid, HybridCache, QuantHybridCache};
pub use config::{HybridConfig, NonFinitePolicy};
pub use multi::{CodedMultiHeadCache, MultiHead, MultiHeadCache};
pub use store::{HistoryFormat, RowStore, WholeRowStore};
pub use view::{CodedHybridView, HybridView};

pub(crate) use input::check_limits;
