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
