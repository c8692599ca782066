//! On-disk format for persisted caches (e.g. prefix reuse across requests), read back
//! zero-copy through memmap2.
//!
//! Persists SWAN's hybrid cache (method section, hybrid KV-cache; CSR and coded rows from
//! "Memory footprint") so a prompt prefix's sparse history and dense buffer can be
//! reopened without recomputation and read by the same kernels — and the full caches SWAN
//! is compared with (dense f32/f16/bf16 rows, dense int8/int4/fp8 quantized rows) and
//! the buffered whole-row histories (dense quantized rows, KIVI, TurboQuant-style behind a
//! dense buffer) — so every cache a runtime runs can be saved and reopened the same way.
//!
//! ## Format (version 3, little-endian)
//! | bytes | content |
//! |---|---|
//! | 0..128 | header: magic `KVSPARSE`, version, byte-order mark, head_dim, index / value / dense codes, layers, kv heads, entry size, section alignment, layout code, file length, metadata CRC-32, header CRC-32, identity-block length, extra-block length |
//! | 128.. | directory: one 64-byte entry per (layer, kv-head), layer-major: sparse rows, key/value nnz (CSR entries, or coded row bytes), buffer rows (or the rows of a dense head) and capacity, `k_key`, `k_value`, rows per block, non-finite policy, scales |
//! | then | head-checksum table (at a multiple of 64): one `u32` CRC-32 per head, layer-major |
//! | then | identity block, extra block (opaque caller bytes, each at a multiple of 64) |
//! | then | per head, each section at a multiple of 64 bytes, by layout (below) |
//!
//! | layout (code) | header codes (index, value, dense) | sections per head |
//! |---|---|---|
//! | CSR hybrid (0) | index bytes 1 / 2, [`crate::ValueFormat`], buffer format | key CSR (block bases `u64`, row offsets `u16`, indices, values), value CSR (same), buffer keys, buffer values (token order) |
//! | coded hybrid (1) | list-u8 1 / list-u16 2 / bitmask 3; f32 0, f16 1, bf16 2, fp8 3, int8 16, int4 17; buffer format | key rows (block bases `u64`, row offsets `u16`, row bytes — index part then value part with its f16 row scale), value rows (same), buffer keys, buffer values |
//! | dense (2) | 0, 0, element format | key rows, value rows (`[rows][head_dim]`) |
//! | quantized (3) | 0, 0, int8 0 / int4 1 / fp8 2 | key rows, value rows ([`crate::quant::DenseCodec`] rows, scales inside) |
//! | whole-row hybrid (4) | history family: quantized 1 / KIVI 2 / TurboQuant-style 3 / its QJL-keyed form 4; its row format (int8 0 / int4 1 / fp8 2) or bits; buffer format | key codes, keys waiting in f16 (KIVI), value codes ([`crate::hybrid::WholeRowStore`] bytes as held), buffer keys, buffer values |
//!
//! Checksums: the header CRC-32 covers the header (with its own field zeroed); the
//! metadata CRC-32 covers the bytes from the header's end to the end of the extra block;
//! head `h`'s CRC-32 covers the bytes from the end of head `h - 1` (or of the extra block)
//! to the end of its last section. Every byte of the file is thus covered by exactly one
//! checksum, and a reader checks the header and metadata on open — O(header + directory)
//! — and each head on its first use.
//!
//! Older versions still open. Version 2 had no head-checksum table; its header field held
//! one CRC-32 over everything after the header, so opening a version-2 file reads it all.
//! Version 1 (CSR hybrid only, no blocks) also had no table, and its layout and
//! block-length words were reserved zeros. Section offsets are not stored: writer and
//! reader derive them from the counts with checked arithmetic, and the sections must tile
//! the file exactly. See [`MappedCache`] for what opening and first use validate and the
//! allocation bound, [`CacheImage`] for writing, [`reseal`] for re-sealing an edited
//! image.

mod header;
mod kinds;
mod layout;
mod mapped;
mod seal;
mod write;

pub use header::{CacheLayout, MAGIC, OLDEST_VERSION, SECTION_ALIGN, VERSION};
pub use mapped::MappedCache;
pub use seal::reseal;
pub use write::{CacheImage, encode_views, write_cache, write_multi, write_views};
