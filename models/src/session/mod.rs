//! A decoding session: one model (possibly with SWAN-absorbed `W_V`/`W_O`), one cache, the
//! host buffers a decode step reuses, and the current position. Prefill fills the cache
//! from a libtorch pass; every later token goes through [`Session::decode`] (the decode
//! step of `papers/swan.txt` §4 and `papers/wnw.txt` §2.3). What runs on a session:
//! teacher-forced [`score`] (perplexity) and [`generate`] (greedy generation).

pub mod generate;
pub mod score;

use tch::Tensor;

use crate::cache::{CacheShape, KvCache};
use crate::error::{Result, TorchOp, invalid};
use crate::llama::{DecodeScratch, Llama, NoObserver};

/// A model, a cache and a position.
pub struct Session {
    model: Llama,
    cache: Box<dyn KvCache>,
    scratch: DecodeScratch,
    position: usize,
}

impl Session {
    /// Pairs `model` with an empty `cache` built for the same attention shape.
    ///
    /// The cache must match the model's value basis: a SWAN cache needs the model returned
    /// built alongside it, which has `P_VO` absorbed.
    ///
    /// # Errors
    /// [`crate::Error::InvalidInput`] if the shapes differ or the cache is not empty.
    pub fn new(model: Llama, cache: Box<dyn KvCache>) -> Result<Self> {
        let want = CacheShape::of(model.config())?;
        if cache.shape() != want {
            return Err(invalid(
                "session",
                format!("cache shape {:?} does not match model {want:?}", cache.shape()),
            ));
        }
        if !cache.is_empty() {
            return Err(invalid("session", format!("cache already holds {} tokens", cache.len())));
        }
        let scratch = DecodeScratch::new(model.config())?;
        Ok(Self { model, cache, scratch, position: 0 })
    }

    /// The model.
    pub fn model(&self) -> &Llama {
        &self.model
    }

    /// The cache.
    pub fn cache(&self) -> &dyn KvCache {
        self.cache.as_ref()
    }

    /// Tokens consumed so far (the position of the next token).
    pub fn position(&self) -> usize {
        self.position
    }

    /// Reserves cache room for `tokens` more tokens.
    ///
    /// # Errors
    /// The cache's allocation errors.
    pub fn reserve(&mut self, tokens: usize) -> Result<()> {
        self.cache.reserve(tokens)
    }

    /// Runs the prompt with libtorch, fills the cache, and returns the logits of its last
    /// position (`[vocab]`).
    ///
    /// # Errors
    /// [`crate::Error::InvalidInput`] if the session already holds tokens; forward errors.
    pub fn prefill(&mut self, ids: &[u32]) -> Result<Tensor> {
        if self.position != 0 {
            return Err(invalid(
                "prefill",
                format!("session is at position {}; prefill starts at 0", self.position),
            ));
        }
        let logits = self.model.prefill(ids, Some(self.cache.as_mut()), &mut NoObserver, false)?;
        self.position = ids.len();
        logits.f_squeeze_dim(0).op("squeeze")
    }

    /// Continues from a persisted prompt cache: checks `file`'s identity against
    /// `identity` (this session's model, projection and cache format), replaces the fresh
    /// cache's state by the file's and moves to the position after the saved prompt.
    /// Returns the saved prompt and its last logits (feed them to
    /// [`generate::greedy_from`]). The cache may keep `file` (the dense, quantized and SWAN
    /// caches attend the saved rows where they are mapped), so the file must stay unchanged
    /// while the session lives.
    ///
    /// # Errors
    /// [`crate::Error::InvalidInput`] if the session already holds tokens; the errors of
    /// [`crate::cache::persist::load`] (a file of another model, projection or format is
    /// [`crate::Error::CacheMismatch`]). On error the session is unchanged.
    pub fn resume(
        &mut self,
        file: &std::sync::Arc<kv_sparse::persist::MappedCache>,
        identity: &crate::cache::persist::CacheIdentity,
    ) -> Result<crate::cache::persist::Prefix> {
        if self.position != 0 || !self.cache.is_empty() {
            return Err(invalid(
                "resume",
                format!("session is at position {}; resuming starts fresh", self.position),
            ));
        }
        let prefix = crate::cache::persist::load(file, identity, self.cache.as_mut())?;
        let vocab = self.model.config().vocab_size;
        if prefix.logits.len() != vocab {
            return Err(invalid(
                "resume",
                format!("{} saved logits for a vocabulary of {vocab}", prefix.logits.len()),
            ));
        }
        self.position = prefix.ids.len();
        Ok(prefix)
    }

    /// Feeds one token through the decode path and returns the next-token logits (`[vocab]`).
    ///
    /// # Errors
    /// Forward and cache errors.
    pub fn decode(&mut self, id: u32) -> Result<Tensor> {
        let logits =
            self.model.decode(id, self.position, self.cache.as_mut(), &mut self.scratch)?;
        self.position += 1;
        logits.f_squeeze_dim(0).op("squeeze")
    }
}
