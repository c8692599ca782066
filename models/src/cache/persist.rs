//! Prefix reuse: a whole model cache (every layer, every kv-head) saved after a prompt
//! and reopened, memory-mapped and validated, to continue decoding without the prefill.
//!
//! The file is `kv-sparse`'s persisted-cache format (`kv_sparse::persist`, version 3):
//! dense f16/bf16/f32 rows, dense int8/int4/fp8 quantized rows, or SWAN's hybrid cache
//! (`papers/swan.txt`, method section and Algorithm 1: CSR or coded sparse history plus
//! dense buffer). Its identity block holds a [`CacheIdentity`] — model fingerprint,
//! projection fingerprint, cache format — which [`load`] checks against the run
//! reopening it; its extra block holds the [`Prefix`] (the prompt's token ids and the
//! logits of its last position, so the first new token needs no forward pass).
//!
//! What is copied on load: `kv_sparse::persist::MappedCache` checks the mapped file's
//! header and directory on open; the load checks every head's checksum and rows in place,
//! on the cache's attention threads at once (`MappedCache::validate_all_on`). SWAN caches then keep the file and attend each head's sparse
//! history where it is mapped (zero-copy), copying only the buffer rows and the last few
//! history rows (fewer than one kernel tile or CSR block) into the owned stores decoding
//! appends to; saving such a cache again writes the mapped rows straight from the map.
//! Dense and quantized caches keep the file too and attend each head as two parts (mapped
//! rows, then the rows appended since): nothing is copied. A head that
//! fails its check fails the whole load before the cache changes.

use std::path::Path;

use kv_sparse::persist::MappedCache;
use projection::ProjectionSet;

use super::KvCache;
use crate::error::{Error, Result, invalid};
use crate::llama::Llama;

const IDENTITY_TAG: &str = "kvtide-cache/1";
const PREFIX_MAGIC: [u8; 8] = *b"KVTPFX01";

/// Who computed a persisted cache, compared field by field when it is reopened.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CacheIdentity {
    /// [`Llama::fingerprint`] of the model the prompt ran through (before any absorption).
    pub model: String,
    /// [`projection_fingerprint`] of the cache's rotation (`none` without one).
    pub projection: String,
    /// The cache's format, as its [`KvCache::label`] names it.
    pub format: String,
}

impl CacheIdentity {
    /// The identity of `cache` filled by `model` (the checkpoint's model, not the one with
    /// `P_VO` absorbed: the projection fingerprint covers the absorption).
    ///
    /// # Errors
    /// [`Error::Torch`] if a weight cannot be read for the fingerprint.
    pub fn of(model: &Llama, cache: &dyn KvCache) -> Result<Self> {
        Ok(Self {
            model: model.fingerprint()?,
            projection: projection_fingerprint(cache.projection()),
            format: cache.label(),
        })
    }

    /// The bytes of the identity block.
    pub fn to_bytes(&self) -> Vec<u8> {
        format!(
            "{IDENTITY_TAG}\nmodel={}\nprojection={}\nformat={}\n",
            self.model, self.projection, self.format
        )
        .into_bytes()
    }

    /// Parses an identity block.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] when the block is not a kvtide cache identity.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self> {
        const OP: &str = "cache identity";
        let text = std::str::from_utf8(bytes).map_err(|e| invalid(OP, e.to_string()))?;
        let mut lines = text.lines();
        if lines.next() != Some(IDENTITY_TAG) {
            return Err(invalid(OP, "the file carries no kvtide cache identity"));
        }
        let mut field = |key: &str| {
            lines
                .next()
                .and_then(|l| l.strip_prefix(key))
                .and_then(|l| l.strip_prefix('='))
                .map(str::to_string)
                .ok_or_else(|| invalid(OP, format!("missing `{key}=` line")))
        };
        Ok(Self {
            model: field("model")?,
            projection: field("projection")?,
            format: field("format")?,
        })
    }

    /// Checks a file's identity against this run's.
    ///
    /// # Errors
    /// [`Error::CacheMismatch`] naming the first field that differs (`model`,
    /// `projection`, `format`).
    pub fn check(&self, file: &Self) -> Result<()> {
        let fields = [
            ("model", &self.model, &file.model),
            ("projection", &self.projection, &file.projection),
            ("format", &self.format, &file.format),
        ];
        for (what, expected, got) in fields {
            if expected != got {
                return Err(Error::CacheMismatch {
                    op: "load cache",
                    what,
                    expected: expected.clone(),
                    got: got.clone(),
                });
            }
        }
        Ok(())
    }
}

/// A fingerprint of a projection set: its kind, the model it was calibrated for, the
/// calibration token count, and a CRC-32 over every `P_QK` and `P_VO` basis (`none` for
/// no set).
pub fn projection_fingerprint(set: Option<&ProjectionSet>) -> String {
    let Some(set) = set else { return "none".into() };
    let p = set.provenance();
    let dims = set.dims();
    let mut hasher = crc32fast::Hasher::new();
    for l in 0..dims.layers() {
        for h in 0..dims.kv_heads() {
            for basis in [set.qk(l, h), set.vo(l, h)].into_iter().flatten() {
                hasher.update(bytemuck::cast_slice(basis.as_slice()));
            }
        }
    }
    format!(
        "{} model:{} tokens:{} bases:{:08x}",
        p.kind,
        p.model,
        p.calibration_tokens,
        hasher.finalize()
    )
}

/// The prompt a cache was filled with and the logits of its last position.
#[derive(Clone, Debug, PartialEq)]
pub struct Prefix {
    /// Prompt token ids.
    pub ids: Vec<u32>,
    /// Next-token logits after the prompt (`[vocab]`).
    pub logits: Vec<f32>,
}

impl Prefix {
    /// The bytes of the extra block: magic, id count, ids, logit count, logits (LE).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(24 + 4 * (self.ids.len() + self.logits.len()));
        out.extend_from_slice(&PREFIX_MAGIC);
        out.extend_from_slice(&(self.ids.len() as u64).to_le_bytes());
        self.ids.iter().for_each(|id| out.extend_from_slice(&id.to_le_bytes()));
        out.extend_from_slice(&(self.logits.len() as u64).to_le_bytes());
        self.logits.iter().for_each(|x| out.extend_from_slice(&x.to_le_bytes()));
        out
    }

    /// Parses an extra block.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] for a block that is not a prefix, truncated or with
    /// trailing bytes, or non-finite logits.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self> {
        const OP: &str = "cache prefix";
        let bad = |why: &str| invalid(OP, why.to_string());
        let rest = bytes.strip_prefix(&PREFIX_MAGIC[..]).ok_or_else(|| bad("no prefix block"))?;
        let (ids, rest) = words(rest).ok_or_else(|| bad("truncated ids"))?;
        let (logits, rest) = words(rest).ok_or_else(|| bad("truncated logits"))?;
        if !rest.is_empty() {
            return Err(bad("trailing bytes"));
        }
        let logits: Vec<f32> = logits.into_iter().map(f32::from_bits).collect();
        if logits.iter().any(|x| !x.is_finite()) {
            return Err(bad("non-finite logits"));
        }
        Ok(Self { ids, logits })
    }
}

/// A u64 count then that many little-endian u32 words, and the bytes after them.
fn words(bytes: &[u8]) -> Option<(Vec<u32>, &[u8])> {
    let (n, rest) = bytes.split_first_chunk::<8>()?;
    let n = usize::try_from(u64::from_le_bytes(*n)).ok()?;
    let body = rest.get(..n.checked_mul(4)?)?;
    let words = body.chunks_exact(4).map(|w| u32::from_le_bytes(w.try_into().unwrap())).collect();
    Some((words, &rest[n * 4..]))
}

/// Writes `cache` (every layer, every kv-head) with `identity` and `prefix` to `path`
/// (atomically: a temporary sibling renamed into place).
///
/// # Errors
/// [`Error::NotPersistable`] for caches without a persisted form; [`Error::Sparse`] on
/// I/O or encoding errors; [`Error::InvalidInput`] when the cache holds another number of
/// tokens than the prefix.
pub fn save(
    path: &Path,
    identity: &CacheIdentity,
    cache: &dyn KvCache,
    prefix: &Prefix,
) -> Result<()> {
    if cache.len() != prefix.ids.len() {
        return Err(invalid(
            "save cache",
            format!("the cache holds {} tokens, the prefix {}", cache.len(), prefix.ids.len()),
        ));
    }
    let (identity, extra) = (identity.to_bytes(), prefix.to_bytes());
    cache.image()?.with_identity(&identity).with_extra(&extra).write(path)?;
    Ok(())
}

/// Checks an opened file's identity against `identity`, then replaces `cache`'s state
/// by the file's and returns the prefix. On error `cache` is unchanged.
///
/// # Errors
/// [`Error::CacheMismatch`] for a file of another model, projection or format;
/// [`Error::InvalidInput`] for a file without a kvtide identity or prefix, or whose
/// prefix disagrees with the rows; the cache's [`KvCache::load_image`] errors.
pub fn load(
    file: &std::sync::Arc<MappedCache>,
    identity: &CacheIdentity,
    cache: &mut dyn KvCache,
) -> Result<Prefix> {
    identity.check(&CacheIdentity::from_bytes(file.identity())?)?;
    let prefix = Prefix::from_bytes(file.extra())?;
    let tokens = common_tokens("load cache", file)?;
    if tokens != prefix.ids.len() {
        return Err(invalid(
            "load cache",
            format!("the file holds {tokens} tokens per head, its prefix {}", prefix.ids.len()),
        ));
    }
    cache.load_image(file)?;
    Ok(prefix)
}

/// The token count every (layer, kv-head) of `file` holds.
///
/// # Errors
/// [`Error::InvalidInput`] when heads hold different counts.
pub(crate) fn common_tokens(op: &'static str, file: &MappedCache) -> Result<usize> {
    let first = file.tokens(0, 0)?;
    for l in 0..file.num_layers() {
        for h in 0..file.kv_heads() {
            let n = file.tokens(l, h)?;
            if n != first {
                return Err(invalid(
                    op,
                    format!("layer {l} head {h} holds {n} tokens, head 0 {first}"),
                ));
            }
        }
    }
    Ok(first)
}
