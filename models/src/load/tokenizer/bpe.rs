//! GPT-2 style byte-level BPE from GGUF metadata (`tokenizer.ggml.model = "gpt2"`), rebuilt
//! exactly as transformers builds it from the same file, with the `tokenizers` crate: a BPE
//! model over `tokenizer.ggml.tokens` and `tokenizer.ggml.merges` (each merge split on its
//! one space; no unknown token, dropout or byte fallback), the byte-level pre-tokenizer with
//! the GPT-2 regex and no prefix space, the byte-level decoder, and every token of
//! `token_type == 3` (control) registered as a special token. No digit splitting (llama.cpp's
//! `smollm` pre-tokenizer splits digits; transformers does not, and ids would differ).

use tokenizers::models::bpe::{BPE, Vocab};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::{AddedToken, Tokenizer as HfTokenizer};

use super::{CONTROL_TOKEN, strings, tok_err, token_types};
use crate::error::Result;
use crate::load::gguf::GgufFile;

/// The byte-level BPE tokenizer of a `gpt2` GGUF vocabulary.
pub(super) fn from_gguf(file: &GgufFile) -> Result<HfTokenizer> {
    let tokens = strings(file, "tokenizer.ggml.tokens")?;
    let merges = strings(file, "tokenizer.ggml.merges")?
        .iter()
        .map(|m| m.split_once(' ').map(|(a, b)| (a.to_string(), b.to_string())))
        .collect::<Option<Vec<_>>>()
        .ok_or_else(|| tok_err("build", "a merge is not two tokens separated by one space"))?;
    let vocab: Vocab = tokens.iter().enumerate().map(|(i, t)| (t.to_string(), i as u32)).collect();
    let bpe =
        BPE::builder().vocab_and_merges(vocab, merges).build().map_err(|e| tok_err("build", e))?;
    let mut inner = HfTokenizer::new(bpe);
    inner.with_pre_tokenizer(Some(ByteLevel::new(false, true, true)));
    inner.with_decoder(Some(ByteLevel::default()));
    let control: Vec<AddedToken> = match token_types(file, tokens.len())? {
        None => Vec::new(),
        Some(types) => types
            .iter()
            .zip(&tokens)
            .filter(|(t, _)| **t == CONTROL_TOKEN)
            .map(|(_, tok)| AddedToken::from(tok.to_string(), true).normalized(false))
            .collect(),
    };
    inner.add_special_tokens(control).map_err(|e| tok_err("build", e))?;
    Ok(inner)
}
