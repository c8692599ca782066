//! Text ↔ token ids. GGUF models carry their vocabulary in metadata; for the GPT-2 style
//! byte-level BPE (`tokenizer.ggml.model = "gpt2"`) we rebuild exactly what transformers
//! builds from the same file, with the `tokenizers` crate: a BPE model over
//! `tokenizer.ggml.tokens` and `tokenizer.ggml.merges` (each merge split on its one space;
//! no unknown token, dropout or byte fallback), the byte-level pre-tokenizer with the GPT-2
//! regex and no prefix space, the byte-level decoder, no BOS added, and every token of
//! `token_type == 3` (control) registered as a special token. No digit splitting (llama.cpp's
//! `smollm` pre-tokenizer splits digits; transformers does not, and ids would differ).
//! Hugging Face directories use their `tokenizer.json`.

use std::path::Path;

use tokenizers::models::bpe::{BPE, Vocab};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::{AddedToken, Tokenizer as HfTokenizer};

use crate::error::{Error, Result};
use crate::load::gguf::GgufError;
use crate::load::gguf::{GgufFile, MetaValue, meta};

/// GGUF token type of control tokens (`<|im_start|>` and friends).
const CONTROL_TOKEN: i64 = 3;

fn tok_err(op: &'static str, e: impl std::fmt::Display) -> Error {
    Error::Tokenizer { op, reason: e.to_string() }
}

/// A tokenizer plus the ids generation needs.
pub struct Tokenizer {
    inner: HfTokenizer,
    add_bos: Option<u32>,
}

impl Tokenizer {
    /// Builds the tokenizer stored in a GGUF file's metadata.
    ///
    /// # Errors
    /// [`GgufError::MissingMetadata`]/[`GgufError::MetadataType`] for absent or mistyped keys,
    /// [`Error::Tokenizer`] for a tokenizer model other than `gpt2` or a malformed merge.
    pub fn from_gguf(file: &GgufFile) -> Result<Self> {
        let model = meta(file, "tokenizer.ggml.model")?.as_str().unwrap_or_default();
        if model != "gpt2" {
            return Err(tok_err(
                "build",
                format!("tokenizer model `{model}` is not supported (only gpt2 byte-level BPE)"),
            ));
        }
        let tokens = strings(file, "tokenizer.ggml.tokens")?;
        let merges = strings(file, "tokenizer.ggml.merges")?
            .iter()
            .map(|m| m.split_once(' ').map(|(a, b)| (a.to_string(), b.to_string())))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| tok_err("build", "a merge is not two tokens separated by one space"))?;
        let vocab: Vocab =
            tokens.iter().enumerate().map(|(i, t)| (t.to_string(), i as u32)).collect();
        let bpe = BPE::builder()
            .vocab_and_merges(vocab, merges)
            .build()
            .map_err(|e| tok_err("build", e))?;
        let mut inner = HfTokenizer::new(bpe);
        inner.with_pre_tokenizer(Some(ByteLevel::new(false, true, true)));
        inner.with_decoder(Some(ByteLevel::default()));
        inner
            .add_special_tokens(control_tokens(file, &tokens)?)
            .map_err(|e| tok_err("build", e))?;
        let add_bos = match file.get("tokenizer.ggml.add_bos_token").and_then(MetaValue::as_bool) {
            Some(true) => {
                let v = meta(file, "tokenizer.ggml.bos_token_id")?;
                Some(v.as_u64().and_then(|id| u32::try_from(id).ok()).ok_or_else(|| {
                    GgufError::MetadataType {
                        key: "tokenizer.ggml.bos_token_id".into(),
                        expected: "a token id".into(),
                        got: v.type_name().into(),
                    }
                })?)
            }
            _ => None,
        };
        Ok(Self { inner, add_bos })
    }

    /// Loads a Hugging Face `tokenizer.json` (its post-processor decides about BOS).
    ///
    /// # Errors
    /// [`Error::Tokenizer`] if the file is missing or invalid.
    pub fn from_file(path: &Path) -> Result<Self> {
        let inner = HfTokenizer::from_file(path)
            .map_err(|e| tok_err("load", format!("{}: {e}", path.display())))?;
        Ok(Self { inner, add_bos: None })
    }

    /// Token ids of `text`. Special-token strings in the text (`<|im_start|>`) become their
    /// ids; BOS is prepended only if the model asks for it.
    ///
    /// # Errors
    /// [`Error::Tokenizer`] if encoding fails.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let enc = self.inner.encode(text, true).map_err(|e| tok_err("encode", e))?;
        let mut ids = Vec::with_capacity(enc.len() + 1);
        ids.extend(self.add_bos);
        ids.extend_from_slice(enc.get_ids());
        Ok(ids)
    }

    /// Text of `ids`, special tokens included.
    ///
    /// # Errors
    /// [`Error::Tokenizer`] if decoding fails.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        self.inner.decode(ids, false).map_err(|e| tok_err("decode", e))
    }

    /// The token strings of `ids` (byte-level form, `Ġ` for a space).
    pub fn tokens(&self, ids: &[u32]) -> Vec<String> {
        ids.iter().map(|&i| self.inner.id_to_token(i).unwrap_or_default()).collect()
    }

    /// The id of a token string.
    pub fn token_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// Vocabulary size including added tokens.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }
}

fn strings<'a>(file: &'a GgufFile, key: &str) -> Result<Vec<&'a str>> {
    let v = meta(file, key)?;
    let bad = || {
        GgufError::MetadataType {
            key: key.into(),
            expected: "an array of strings".into(),
            got: v.type_name().into(),
        }
        .into()
    };
    v.as_array().ok_or_else(bad)?.iter().map(|s| s.as_str().ok_or_else(bad)).collect()
}

fn control_tokens(file: &GgufFile, tokens: &[&str]) -> Result<Vec<AddedToken>> {
    let Some(types) = file.get("tokenizer.ggml.token_type") else { return Ok(Vec::new()) };
    let types = types.as_array().ok_or_else(|| GgufError::MetadataType {
        key: "tokenizer.ggml.token_type".into(),
        expected: "an array of integers".into(),
        got: types.type_name().into(),
    })?;
    if types.len() != tokens.len() {
        return Err(tok_err(
            "build",
            format!("{} token types for {} tokens", types.len(), tokens.len()),
        ));
    }
    Ok(types
        .iter()
        .zip(tokens)
        .filter(|(t, _)| t.as_i64() == Some(CONTROL_TOKEN))
        .map(|(_, tok)| AddedToken::from(tok.to_string(), true).normalized(false))
        .collect())
}
