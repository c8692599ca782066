//! SentencePiece BPE from GGUF metadata (`tokenizer.ggml.model = "llama"`): the vocabulary
//! `tokenizer.ggml.tokens`, merge priorities from `tokenizer.ggml.scores` (or, for Gemma,
//! from the file order), `tokenizer.ggml.token_type` (control and user-defined tokens are
//! matched whole in the text; `<0xNN>` byte tokens are the fallback for characters outside
//! the vocabulary) and the `▁` space marker.
//!
//! Encoding a text, the way transformers' tokenizer for the same file does:
//! 1. Split the text at control and user-defined tokens, leftmost-longest (`<bos>`,
//!    `<start_of_turn>`, `\n\n`, `\t`, `</div>` each become one id wherever they appear).
//! 2. In every other piece, replace each space with `▁` (with `add_space_prefix`, also put
//!    one `▁` in front of the text's first piece); no other normalisation, no splitting at
//!    whitespace.
//! 3. Start from one symbol per character, or one `<0xNN>` symbol per UTF-8 byte of a
//!    character the vocabulary lacks.
//! 4. Repeatedly merge the adjacent pair whose concatenation is a token with the best
//!    priority — the merged token's rank (by score, highest first; for Gemma by file
//!    position, whose order its scores follow for every normal token), then the longer left
//!    part, then the leftmost pair — until no adjacent pair forms a token. This is
//!    SentencePiece's BPE (as in llama.cpp's `llm_tokenizer_spm`), with the tie-breaks of
//!    the merge list transformers derives from the vocabulary.
//!
//! Only Gemma 3's vocabulary is checked against a reference (transformers, every play and
//! fuzzed strings); other `llama` vocabularies (Llama 2, Mistral) get the same algorithm
//! with score order and llama.cpp's `add_space_prefix`, unverified against transformers.
//!
//! Gemma stores its whitespace-run tokens (`"  "` … 31 spaces) with real spaces; they are
//! respelled as `▁` runs so step 4 can reach them, as transformers does, and are not matched
//! in step 1. Decoding concatenates the pieces with `▁` read as a space and runs of `<0xNN>`
//! tokens read as UTF-8 bytes (an invalid run gives one U+FFFD per byte). Text containing no
//! `▁` therefore decodes back to itself; a literal `▁` comes back as a space.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

use super::{CONTROL_TOKEN, strings, tok_err, token_id, token_types};
use crate::error::Result;
use crate::load::gguf::{GgufFile, MetaValue};

/// GGUF token type of user-defined tokens (matched whole, not special).
const USER_DEFINED_TOKEN: i64 = 4;
/// The SentencePiece space marker.
const SPACE: char = '\u{2581}';
/// Architectures whose merge order is the file order (transformers' Gemma builder).
const FILE_ORDER_ARCHS: [&str; 3] = ["gemma", "gemma2", "gemma3"];

/// A SentencePiece BPE vocabulary ready to encode and decode.
pub(crate) struct Spm {
    /// Token strings by id, in the form BPE sees them (`▁` for spaces).
    pieces: Vec<String>,
    /// Id of every piece (a repeated piece maps to its last id, as in transformers).
    ids: HashMap<String, u32>,
    /// Merge rank of every token (smaller merges first).
    rank: Vec<u32>,
    /// The `<0xNN>` token of every byte, if the vocabulary has it.
    bytes: [Option<u32>; 256],
    unk: Option<u32>,
    added: AddedTokens,
    space_prefix: bool,
}

/// Tokens matched whole in the raw text, grouped by first byte for a leftmost-longest scan.
struct AddedTokens {
    ids: HashMap<String, u32>,
    /// Distinct byte lengths of the tokens starting with each byte, longest first.
    lengths: Vec<Vec<usize>>,
}

impl AddedTokens {
    fn new(tokens: impl IntoIterator<Item = (String, u32)>) -> Self {
        let mut ids = HashMap::new();
        let mut lengths = vec![Vec::new(); 256];
        for (t, id) in tokens {
            let Some(&first) = t.as_bytes().first() else { continue };
            let lens: &mut Vec<usize> = &mut lengths[first as usize];
            if !lens.contains(&t.len()) {
                lens.push(t.len());
            }
            ids.insert(t, id);
        }
        lengths.iter_mut().for_each(|l| l.sort_unstable_by(|a, b| b.cmp(a)));
        Self { ids, lengths }
    }

    /// The longest added token at the start of `text`, with its byte length.
    fn match_at(&self, text: &str) -> Option<(u32, usize)> {
        let first = *text.as_bytes().first()?;
        self.lengths[first as usize].iter().find_map(|&len| {
            let candidate = text.get(..len)?;
            self.ids.get(candidate).map(|&id| (id, len))
        })
    }
}

/// One symbol of the word being merged: a token id, linked to its neighbours.
#[derive(Clone, Copy)]
struct Symbol {
    id: u32,
    prev: Option<usize>,
    next: Option<usize>,
    alive: bool,
}

/// A candidate merge of `symbols[left]` and its right neighbour `right`.
#[derive(PartialEq, Eq, PartialOrd, Ord)]
struct Candidate {
    /// (merged token's rank, longer left part first, leftmost first).
    key: (u32, Reverse<usize>, usize),
    left_id: u32,
    right: usize,
    right_id: u32,
    merged: u32,
}

impl Spm {
    /// Reads the vocabulary of a `llama`-model GGUF.
    ///
    /// # Errors
    /// Missing or mistyped `tokens`/`scores`/`token_type` arrays or ids, arrays whose
    /// lengths differ, NaN scores, or an `unknown_token_id` outside the vocabulary.
    pub(crate) fn from_gguf(file: &GgufFile) -> Result<Self> {
        let tokens = strings(file, "tokenizer.ggml.tokens")?;
        let n = tokens.len();
        if n == 0 || u32::try_from(n).is_err() {
            return Err(tok_err("build", format!("a vocabulary of {n} tokens")));
        }
        let types = token_types(file, n)?.unwrap_or_else(|| vec![1; n]);
        let arch = file.get("general.architecture").and_then(MetaValue::as_str).unwrap_or("");
        let file_order = FILE_ORDER_ARCHS.contains(&arch);
        let pieces: Vec<String> = tokens
            .iter()
            .map(|t| {
                if file_order && t.contains(' ') && t.trim().is_empty() {
                    SPACE.to_string().repeat(t.chars().count())
                } else {
                    t.to_string()
                }
            })
            .collect();
        let rank = if file_order { (0..n as u32).collect() } else { score_ranks(file, n)? };
        let ids: HashMap<String, u32> =
            pieces.iter().enumerate().map(|(i, p)| (p.clone(), i as u32)).collect();
        let mut bytes = [None; 256];
        for (b, slot) in bytes.iter_mut().enumerate() {
            *slot = ids.get(&format!("<0x{b:02X}>")).copied();
        }
        let unk = match file.get("tokenizer.ggml.unknown_token_id") {
            Some(_) => Some(token_id(file, "tokenizer.ggml.unknown_token_id", n)?),
            None => None,
        };
        let added =
            AddedTokens::new(tokens.iter().zip(&types).enumerate().filter_map(|(i, (t, &ty))| {
                let whole = ty == CONTROL_TOKEN || ty == USER_DEFINED_TOKEN;
                (whole && ids.contains_key(*t)).then(|| (t.to_string(), i as u32))
            }));
        let space_prefix = !file_order
            && file.get("tokenizer.ggml.add_space_prefix").and_then(MetaValue::as_bool)
                != Some(false);
        Ok(Self { pieces, ids, rank, bytes, unk, added, space_prefix })
    }

    /// Vocabulary size.
    pub(crate) fn vocab_size(&self) -> usize {
        self.pieces.len()
    }

    /// The piece of `id` (`▁` form).
    pub(crate) fn piece(&self, id: u32) -> Option<&str> {
        self.pieces.get(id as usize).map(String::as_str)
    }

    /// The id of a piece.
    pub(crate) fn id(&self, piece: &str) -> Option<u32> {
        self.ids.get(piece).copied()
    }

    /// Appends the ids of `text` (no BOS/EOS) to `out`.
    pub(crate) fn encode_into(&self, text: &str, out: &mut Vec<u32>) -> Result<()> {
        let mut rest = text;
        let mut pending = 0; // bytes of `rest` before the next added token
        let mut first = true;
        while pending < rest.len() {
            match self.added.match_at(&rest[pending..]) {
                Some((id, len)) => {
                    self.encode_piece(&rest[..pending], first, out)?;
                    first = false;
                    out.push(id);
                    rest = &rest[pending + len..];
                    pending = 0;
                }
                None => {
                    let c = rest[pending..].chars().next().map_or(1, char::len_utf8);
                    pending += c;
                }
            }
        }
        self.encode_piece(rest, first, out)
    }

    /// BPE of one stretch of text between added tokens.
    fn encode_piece(&self, text: &str, first: bool, out: &mut Vec<u32>) -> Result<()> {
        if text.is_empty() {
            return Ok(());
        }
        let mut symbols = Vec::with_capacity(text.len() + 1);
        let mut buf = [0u8; 4];
        let mut after_unk = false;
        let prefix = (first && self.space_prefix).then_some(SPACE);
        for c in prefix.into_iter().chain(text.chars().map(|c| if c == ' ' { SPACE } else { c })) {
            if let Some(&id) = self.ids.get(&*c.encode_utf8(&mut buf)) {
                symbols.push(id);
                after_unk = false;
                continue;
            }
            let bytes = c.encode_utf8(&mut buf).as_bytes();
            if let Some(ids) =
                bytes.iter().map(|&b| self.bytes[b as usize]).collect::<Option<Vec<_>>>()
            {
                symbols.extend(ids);
                after_unk = false;
                continue;
            }
            let unk = self.unk.ok_or_else(|| {
                tok_err(
                    "encode",
                    format!("{c:?} is outside the vocabulary, which has neither its bytes nor an unknown token"),
                )
            })?;
            // Consecutive unknown characters fuse into one unknown token.
            if !after_unk {
                symbols.push(unk);
            }
            after_unk = true;
        }
        self.merge(&symbols, out);
        Ok(())
    }

    /// Merges the symbols of one word and appends the resulting ids to `out`.
    fn merge(&self, initial: &[u32], out: &mut Vec<u32>) {
        let n = initial.len();
        let mut symbols: Vec<Symbol> = initial
            .iter()
            .enumerate()
            .map(|(i, &id)| Symbol {
                id,
                prev: i.checked_sub(1),
                next: (i + 1 < n).then_some(i + 1),
                alive: true,
            })
            .collect();
        let mut heap = BinaryHeap::new();
        let mut concat = String::new();
        for i in 0..n.saturating_sub(1) {
            self.push_candidate(&symbols, i, &mut concat, &mut heap);
        }
        while let Some(Reverse(c)) = heap.pop() {
            let left = c.key.2;
            let (l, r) = (symbols[left], symbols[c.right]);
            let valid = l.alive
                && r.alive
                && l.next == Some(c.right)
                && l.id == c.left_id
                && r.id == c.right_id;
            if !valid {
                continue;
            }
            symbols[left].id = c.merged;
            symbols[left].next = r.next;
            symbols[c.right].alive = false;
            if let Some(next) = r.next {
                symbols[next].prev = Some(left);
            }
            if let Some(prev) = l.prev {
                self.push_candidate(&symbols, prev, &mut concat, &mut heap);
            }
            self.push_candidate(&symbols, left, &mut concat, &mut heap);
        }
        let mut at = (n > 0).then_some(0);
        while let Some(i) = at {
            out.push(symbols[i].id);
            at = symbols[i].next;
        }
    }

    /// Queues the merge of `symbols[left]` with its right neighbour if they form a token.
    fn push_candidate(
        &self,
        symbols: &[Symbol],
        left: usize,
        concat: &mut String,
        heap: &mut BinaryHeap<Reverse<Candidate>>,
    ) {
        let Some(right) = symbols[left].next else { return };
        let (l, r) = (symbols[left].id, symbols[right].id);
        let lp = &self.pieces[l as usize];
        concat.clear();
        concat.push_str(lp);
        concat.push_str(&self.pieces[r as usize]);
        if let Some(&merged) = self.ids.get(concat.as_str()) {
            let key = (self.rank[merged as usize], Reverse(lp.chars().count()), left);
            heap.push(Reverse(Candidate { key, left_id: l, right, right_id: r, merged }));
        }
    }

    /// Text of `ids`: pieces joined, `▁` read as a space, `<0xNN>` runs read as UTF-8.
    pub(crate) fn decode(&self, ids: &[u32]) -> Result<String> {
        let mut text = String::new();
        let mut bytes: Vec<u8> = Vec::new();
        for &id in ids {
            let piece = self.piece(id).ok_or_else(|| {
                tok_err(
                    "decode",
                    format!("id {id} is outside the vocabulary of {}", self.vocab_size()),
                )
            })?;
            if let Some(b) = byte_piece(piece) {
                bytes.push(b);
                continue;
            }
            flush_bytes(&mut bytes, &mut text);
            text.extend(piece.chars().map(|c| if c == SPACE { ' ' } else { c }));
        }
        flush_bytes(&mut bytes, &mut text);
        Ok(text)
    }
}

/// The byte of a `<0xNN>` piece (two upper- or lower-case hex digits).
fn byte_piece(piece: &str) -> Option<u8> {
    let hex = piece.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() != 2 {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
}

/// Appends pending fallback bytes as UTF-8, or one U+FFFD per byte if they are not UTF-8.
fn flush_bytes(bytes: &mut Vec<u8>, text: &mut String) {
    if bytes.is_empty() {
        return;
    }
    match std::str::from_utf8(bytes) {
        Ok(s) => text.push_str(s),
        Err(_) => text.extend(std::iter::repeat_n('\u{fffd}', bytes.len())),
    }
    bytes.clear();
}

/// Merge ranks from `tokenizer.ggml.scores`: highest score first, ties in file order.
fn score_ranks(file: &GgufFile, n: usize) -> Result<Vec<u32>> {
    let key = "tokenizer.ggml.scores";
    let v = crate::load::gguf::meta(file, key)?;
    let bad = || super::type_err(key, "an array of numbers (no NaN)", v);
    let scores: Vec<f64> = v
        .as_array()
        .ok_or_else(bad)?
        .iter()
        .map(|s| s.as_f64().filter(|x| !x.is_nan()).ok_or_else(bad))
        .collect::<Result<_>>()?;
    if scores.len() != n {
        return Err(tok_err("build", format!("{} scores for {n} tokens", scores.len())));
    }
    let mut order: Vec<u32> = (0..n as u32).collect();
    order.sort_by(|&a, &b| scores[b as usize].total_cmp(&scores[a as usize]).then(a.cmp(&b)));
    let mut rank = vec![0; n];
    for (r, &id) in order.iter().enumerate() {
        rank[id as usize] = r as u32;
    }
    Ok(rank)
}
