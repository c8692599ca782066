//! SWAN's hybrid KV cache: a dense buffer of recent tokens over a sparse CSR history.
//!
//! SWAN (method section, "hybrid KV-cache strategy" and Algorithm 1): each (layer,
//! kv-head) keeps its `b` most recent key/value vectors dense; older vectors are pruned to
//! their top-k magnitude components and stored as CSR rows. Keys and values may keep
//! different `k` (Appendix A.3's TopK_R/TopV_R ablation).
//!
//! * [`HybridConfig`], [`NonFinitePolicy`] — the knobs.
//! * [`HybridCache`] — one (layer, kv-head).
//! * [`HybridView`] — what kernels read (same type for mapped files).
//! * [`MultiHeadCache`] — `[layer][kv_head]` of hybrid caches for a whole model.

mod buffer;
mod cache;
mod config;
mod history;
mod input;
mod multi;
mod view;

pub use cache::HybridCache;
pub use config::{HybridConfig, NonFinitePolicy};
pub use multi::MultiHeadCache;
pub use view::HybridView;
