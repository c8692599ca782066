//! [`reseal`]: recomputes the CRC-32s of a cache file image in place, for images edited on
//! purpose (tests, fuzzers, repair tools) whose edits should reach the validation behind
//! the checksums. Part of the persisted SWAN cache format (method section, hybrid
//! KV-cache), see [`super`].

use super::header::{ENTRY_BYTES, FileHeader, HEADER_BYTES, HeadEntry};
use super::layout::{place_head, place_meta};

/// Recomputes the checksums of a cache file image in place: every head checksum whose
/// head the directory places inside the image (version 3), the metadata CRC (version 3)
/// or the payload CRC (versions 1 and 2), then the header CRC. Parts whose structure does
/// not parse are left as they are, and the header's length field is not touched, so
/// whatever is inconsistent still fails [`super::MappedCache`]'s checks — only the
/// checksums no longer hide it.
///
/// # Examples
/// ```
/// use kv_sparse::persist::{self, CacheImage, MappedCache};
/// let k = [half::f16::from_f32(1.0); 8];
/// let mut image = CacheImage::dense(1, 1, 8, &[(&k[..], &k[..])])?.encode()?;
/// let n = image.len();
/// image[n - 2..].copy_from_slice(&half::f16::NAN.to_le_bytes()); // the last value row
/// persist::reseal(&mut image);
/// let file = MappedCache::from_bytes(&image)?; // checksums pass, the structure is intact
/// assert!(file.validate_all().unwrap_err().to_string().contains("non-finite"));
/// # Ok::<(), kv_sparse::Error>(())
/// ```
pub fn reseal(image: &mut [u8]) {
    let Some(raw) = image.get(..HEADER_BYTES) else { return };
    let mut header: FileHeader = bytemuck::pod_read_unaligned(raw);
    if header.version >= 3 {
        if let Some(crc) = seal_heads(image) {
            header.payload_crc32 = crc;
        }
    } else {
        header.payload_crc32 = crc32fast::hash(&image[HEADER_BYTES..]);
    }
    header.header_crc32 = header.crc();
    image[..HEADER_BYTES].copy_from_slice(bytemuck::bytes_of(&header));
}

/// Writes the head checksums of a version-3 image; returns its metadata CRC (`None` when
/// the header or the metadata does not parse).
fn seal_heads(image: &mut [u8]) -> Option<u32> {
    let (_, format) = FileHeader::parse_unsealed(image)?;
    let limit = image.len() as u64;
    let meta = place_meta(&format, limit).ok()?;
    let mut cursor = meta.end;
    for (h, slot) in meta.head_crcs.clone().step_by(4).enumerate() {
        let at = HEADER_BYTES + h * ENTRY_BYTES;
        let entry: HeadEntry = bytemuck::pod_read_unaligned(&image[at..at + ENTRY_BYTES]);
        let Ok((_, end)) = place_head(&entry, &format, cursor, limit) else { break };
        // Both ends lie inside the image (placement checked them against `limit`).
        let crc = crc32fast::hash(&image[cursor as usize..end as usize]);
        image[slot..slot + 4].copy_from_slice(&crc.to_le_bytes());
        cursor = end;
    }
    Some(crc32fast::hash(&image[HEADER_BYTES..meta.end as usize]))
}
