//! Text ↔ token ids behind one [`Tokenizer`] type. GGUF models carry their vocabulary in
//! metadata and `tokenizer.ggml.model` picks the algorithm: `gpt2` is byte-level BPE
//! (`bpe`, built with the `tokenizers` crate as transformers builds it), `llama` is
//! SentencePiece BPE with byte fallback (`spm`; checked against transformers on Gemma 3).
//! Hugging Face directories use their `tokenizer.json`.

mod bpe;
mod spm;

use std::path::Path;

use tokenizers::Tokenizer as HfTokenizer;

use crate::error::{Error, Result};
use crate::load::gguf::GgufError;
use crate::load::gguf::{GgufFile, MetaValue, meta};

/// GGUF token type of control tokens (`<|im_start|>`, `<bos>` and friends).
const CONTROL_TOKEN: i64 = 3;

fn tok_err(op: &'static str, e: impl std::fmt::Display) -> Error {
    Error::Tokenizer { op, reason: e.to_string() }
}

/// The algorithm behind a [`Tokenizer`].
enum Inner {
    /// A `tokenizers` pipeline (GGUF `gpt2`, or a `tokenizer.json`).
    Hf(Box<HfTokenizer>),
    /// SentencePiece BPE from GGUF metadata.
    Spm(Box<spm::Spm>),
}

/// A tokenizer plus the ids generation needs.
pub struct Tokenizer {
    inner: Inner,
    add_bos: Option<u32>,
    add_eos: Option<u32>,
}

impl Tokenizer {
    /// Builds the tokenizer stored in a GGUF file's metadata: byte-level BPE for
    /// `tokenizer.ggml.model = "gpt2"`, SentencePiece for `"llama"`.
    ///
    /// # Errors
    /// [`GgufError::MissingMetadata`]/[`GgufError::MetadataType`] for absent or mistyped keys,
    /// [`Error::Tokenizer`] for another tokenizer model or inconsistent metadata (a malformed
    /// merge, arrays of different lengths, a special token id outside the vocabulary).
    pub fn from_gguf(file: &GgufFile) -> Result<Self> {
        let v = meta(file, "tokenizer.ggml.model")?;
        let model = v.as_str().ok_or_else(|| type_err("tokenizer.ggml.model", "a string", v))?;
        let inner = match model {
            "gpt2" => Inner::Hf(Box::new(bpe::from_gguf(file)?)),
            "llama" => Inner::Spm(Box::new(spm::Spm::from_gguf(file)?)),
            other => {
                return Err(tok_err(
                    "build",
                    format!(
                        "tokenizer model `{other}` is not supported (gpt2 byte-level BPE or llama SentencePiece)"
                    ),
                ));
            }
        };
        let vocab = match &inner {
            Inner::Hf(t) => t.get_vocab_size(true),
            Inner::Spm(s) => s.vocab_size(),
        };
        let add_bos = flagged_id(file, "add_bos_token", "bos_token_id", vocab)?;
        let add_eos = flagged_id(file, "add_eos_token", "eos_token_id", vocab)?;
        Ok(Self { inner, add_bos, add_eos })
    }

    /// Loads a Hugging Face `tokenizer.json` (its post-processor decides about BOS).
    ///
    /// # Errors
    /// [`Error::Tokenizer`] if the file is missing or invalid.
    pub fn from_file(path: &Path) -> Result<Self> {
        let inner = HfTokenizer::from_file(path)
            .map_err(|e| tok_err("load", format!("{}: {e}", path.display())))?;
        Ok(Self { inner: Inner::Hf(Box::new(inner)), add_bos: None, add_eos: None })
    }

    /// Token ids of `text`. Special-token strings in the text (`<|im_start|>`) become their
    /// ids; BOS (EOS) is prepended (appended) only if the model asks for it.
    ///
    /// # Errors
    /// [`Error::Tokenizer`] if encoding fails.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        self.encode_with(text, true)
    }

    /// [`Tokenizer::encode`], adding the model's BOS/EOS only with `add_special` (off for
    /// a rendered chat template, which writes its own BOS — transformers'
    /// `add_special_tokens=False`).
    ///
    /// # Errors
    /// [`Error::Tokenizer`] if encoding fails.
    pub fn encode_with(&self, text: &str, add_special: bool) -> Result<Vec<u32>> {
        let mut ids = Vec::with_capacity(text.len() / 3 + 2);
        if add_special {
            ids.extend(self.add_bos);
        }
        match &self.inner {
            Inner::Hf(t) => {
                let enc = t.encode(text, true).map_err(|e| tok_err("encode", e))?;
                ids.extend_from_slice(enc.get_ids());
            }
            Inner::Spm(s) => s.encode_into(text, &mut ids)?,
        }
        if add_special {
            ids.extend(self.add_eos);
        }
        Ok(ids)
    }

    /// Text of `ids`, special tokens included.
    ///
    /// # Errors
    /// [`Error::Tokenizer`] if decoding fails (for SentencePiece: an id outside the vocabulary).
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        match &self.inner {
            Inner::Hf(t) => t.decode(ids, false).map_err(|e| tok_err("decode", e)),
            Inner::Spm(s) => s.decode(ids),
        }
    }

    /// The token strings of `ids` (byte-level form with `Ġ` for a space; SentencePiece form
    /// with `▁`); an unknown id gives an empty string.
    pub fn tokens(&self, ids: &[u32]) -> Vec<String> {
        match &self.inner {
            Inner::Hf(t) => ids.iter().map(|&i| t.id_to_token(i).unwrap_or_default()).collect(),
            Inner::Spm(s) => {
                ids.iter().map(|&i| s.piece(i).unwrap_or_default().to_string()).collect()
            }
        }
    }

    /// The id of a token string.
    pub fn token_id(&self, token: &str) -> Option<u32> {
        match &self.inner {
            Inner::Hf(t) => t.token_to_id(token),
            Inner::Spm(s) => s.id(token),
        }
    }

    /// Vocabulary size including added tokens.
    pub fn vocab_size(&self) -> usize {
        match &self.inner {
            Inner::Hf(t) => t.get_vocab_size(true),
            Inner::Spm(s) => s.vocab_size(),
        }
    }
}

fn type_err(key: &str, expected: &str, got: &MetaValue) -> Error {
    GgufError::MetadataType {
        key: key.into(),
        expected: expected.into(),
        got: got.type_name().into(),
    }
    .into()
}

/// `tokenizer.ggml.<id_key>` when `tokenizer.ggml.<flag>` is true (checked against the
/// vocabulary), else `None`.
fn flagged_id(file: &GgufFile, flag: &str, id_key: &str, vocab: usize) -> Result<Option<u32>> {
    if file.get(&format!("tokenizer.ggml.{flag}")).and_then(MetaValue::as_bool) != Some(true) {
        return Ok(None);
    }
    token_id(file, &format!("tokenizer.ggml.{id_key}"), vocab).map(Some)
}

/// A token id stored at `key`, which must be below `vocab`.
fn token_id(file: &GgufFile, key: &str, vocab: usize) -> Result<u32> {
    let v = meta(file, key)?;
    let id = v
        .as_u64()
        .and_then(|id| u32::try_from(id).ok())
        .ok_or_else(|| type_err(key, "a token id", v))?;
    if id as usize >= vocab {
        return Err(tok_err(
            "build",
            format!("`{key}` = {id} is outside the vocabulary of {vocab}"),
        ));
    }
    Ok(id)
}

/// The array of strings at `key`.
fn strings<'a>(file: &'a GgufFile, key: &str) -> Result<Vec<&'a str>> {
    let v = meta(file, key)?;
    let bad = || type_err(key, "an array of strings", v);
    v.as_array().ok_or_else(bad)?.iter().map(|s| s.as_str().ok_or_else(bad)).collect()
}

/// `tokenizer.ggml.token_type`, if present: one integer per token (`n` of them).
fn token_types(file: &GgufFile, n: usize) -> Result<Option<Vec<i64>>> {
    let key = "tokenizer.ggml.token_type";
    let Some(v) = file.get(key) else { return Ok(None) };
    let bad = || type_err(key, "an array of integers", v);
    let types: Vec<i64> = v
        .as_array()
        .ok_or_else(bad)?
        .iter()
        .map(|t| t.as_i64().ok_or_else(bad))
        .collect::<Result<_>>()?;
    if types.len() != n {
        return Err(tok_err("build", format!("{} token types for {n} tokens", types.len())));
    }
    Ok(Some(types))
}
