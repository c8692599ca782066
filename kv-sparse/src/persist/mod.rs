//! On-disk format for persisted caches (e.g. prefix reuse across requests), read back
//! zero-copy through memmap2.
//!
//! Persists SWAN's hybrid cache (method section, hybrid KV-cache; CSR rows from "Memory
//! footprint") so a prompt prefix's sparse history and dense buffer can be reopened
//! without recomputation and read by the same kernels.
//!
//! ## Format (version 1, little-endian)
//! | bytes | content |
//! |---|---|
//! | 0..128 | header: magic `KVSPARSE`, version, byte-order mark, head_dim, index width, value and dense formats, layers, kv heads, file length, payload CRC-32, header CRC-32 |
//! | 128.. | directory: one 64-byte entry per (layer, kv-head), layer-major: sparse rows, key/value nnz, buffer rows and capacity, `k_key`, `k_value`, rows per block, non-finite policy, scales |
//! | then | per head, each section at a multiple of 64 bytes: key CSR (block bases `u64`, row offsets `u16`, indices, values), value CSR (same), buffer keys, buffer values (token order) |
//!
//! Section offsets are not stored: writer and reader derive them from the counts with
//! checked arithmetic, and the sections must tile the file exactly. The payload CRC-32
//! covers everything after the header. See [`MappedCache`] for what opening validates and
//! its allocation bound.

mod header;
mod layout;
mod mapped;
mod write;

pub use header::{MAGIC, SECTION_ALIGN, VERSION};
pub use mapped::MappedCache;
pub use write::{encode_views, write_cache, write_multi, write_views};
