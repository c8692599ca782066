//! On-disk format for persisted caches (e.g. prefix reuse across requests), read back
//! zero-copy through memmap2.
//!
//! Persists SWAN's hybrid cache (method section, hybrid KV-cache; CSR and coded rows from
//! "Memory footprint") so a prompt prefix's sparse history and dense buffer can be
//! reopened without recomputation and read by the same kernels — and the full caches SWAN
//! is compared with (dense f32/f16/bf16 rows, dense int8/int4/fp8 quantized rows), so
//! every cache a runtime runs can be saved and reopened the same way.
//!
//! ## Format (version 2, little-endian)
//! | bytes | content |
//! |---|---|
//! | 0..128 | header: magic `KVSPARSE`, version, byte-order mark, head_dim, index / value / dense codes, layers, kv heads, entry size, section alignment, layout code, file length, payload CRC-32, header CRC-32, identity-block length, extra-block length |
//! | 128.. | directory: one 64-byte entry per (layer, kv-head), layer-major: sparse rows, key/value nnz (CSR entries, or coded row bytes), buffer rows (or the rows of a dense head) and capacity, `k_key`, `k_value`, rows per block, non-finite policy, scales |
//! | then | identity block, extra block (opaque caller bytes, each at a multiple of 64) |
//! | then | per head, each section at a multiple of 64 bytes, by layout (below) |
//!
//! | layout (code) | header codes (index, value, dense) | sections per head |
//! |---|---|---|
//! | CSR hybrid (0) | index bytes 1 / 2, [`crate::ValueFormat`], buffer format | key CSR (block bases `u64`, row offsets `u16`, indices, values), value CSR (same), buffer keys, buffer values (token order) |
//! | coded hybrid (1) | list-u8 1 / list-u16 2 / bitmask 3; f32 0, f16 1, bf16 2, fp8 3, int8 16, int4 17; buffer format | key rows (block bases `u64`, row offsets `u16`, row bytes — index part then value part with its f16 row scale), value rows (same), buffer keys, buffer values |
//! | dense (2) | 0, 0, element format | key rows, value rows (`[rows][head_dim]`) |
//! | quantized (3) | 0, 0, int8 0 / int4 1 / fp8 2 | key rows, value rows ([`crate::quant::DenseCodec`] rows, scales inside) |
//!
//! Version 1 files (CSR hybrid only, no blocks; the layout and block-length words were
//! reserved zeros) still open. Section offsets are not stored: writer and reader derive
//! them from the counts with checked arithmetic, and the sections must tile the file
//! exactly. The payload CRC-32 covers everything after the header. See [`MappedCache`]
//! for what opening validates and its allocation bound, [`CacheImage`] for writing.

mod header;
mod kinds;
mod layout;
mod mapped;
mod write;

pub use header::{CacheLayout, MAGIC, OLDEST_VERSION, SECTION_ALIGN, VERSION};
pub use mapped::MappedCache;
pub use write::{CacheImage, encode_views, write_cache, write_multi, write_views};
