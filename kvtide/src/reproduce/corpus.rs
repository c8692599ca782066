//! The text the reproduction reads, and which part of it plays which role.
//!
//! Plays are the Shakespeare markdown files of `$KVTIDE_CACHE/text/plays`, reduced to plain
//! prose by [`models::load::text::strip_markdown`] (the rule documented in
//! `fixtures/README.md`) and tokenised whole, with no special tokens (SmolLM2 adds no BOS).
//!
//! * SWAN (`papers/swan.txt` §6, Table 1): projections are calibrated on
//!   [`SWAN_CALIBRATION_PLAYS`]; perplexity is evaluated on [`SWAN_EVAL_PLAY`] (disjoint), in
//!   consecutive windows from its first token.
//! * WnW text "transcription" (`papers/wnw.txt` §3, by analogy): a passage is
//!   `ids[1000 .. 1000 + N]` of a play (the fixtures' rule, so the Full-cache figures can be
//!   compared with transformers'); head roles are calibrated on [`WNW_CALIBRATION_PLAYS`] and
//!   evaluated on [`WNW_EVAL_PLAYS`] (disjoint; the same three plays as `fixtures/premise`).

use std::collections::HashMap;
use std::ops::Range;

use crate::error::{Result, invalid};
use crate::paths;
use models::load::text::read_text;
use models::load::tokenizer::Tokenizer;

/// Plays the SWAN projections are calibrated on.
pub const SWAN_CALIBRATION_PLAYS: [&str; 6] = [
    "as-you-like-it",
    "julius-caesar",
    "king-lear",
    "othello",
    "romeo-and-juliet",
    "twelfth-night",
];

/// The play SWAN perplexity is evaluated on.
pub const SWAN_EVAL_PLAY: &str = "hamlet";

/// Plays whose passages calibrate WnW head roles (voice score, head sensitivity).
pub const WNW_CALIBRATION_PLAYS: [&str; 3] =
    ["coriolanus", "much-ado-about-nothing", "the-merchant-of-venice"];

/// Plays whose passages evaluate the WnW comparison (the premise fixtures' plays).
pub const WNW_EVAL_PLAYS: [&str; 3] = ["hamlet", "macbeth", "the-tempest"];

/// Token offset of a copy-task passage inside its play.
pub const PASSAGE_OFFSET: usize = 1000;

/// The copy task's instruction (fixtures' `ASK`).
const ASK: &str = "\n\nRepeat the passage above exactly, word for word.";

/// Tokenised plays, loaded on demand.
pub struct Corpus {
    tokenizer: Tokenizer,
    plays: HashMap<String, Vec<u32>>,
}

impl Corpus {
    /// A corpus over the plays directory, tokenised with `tokenizer`.
    pub fn new(tokenizer: Tokenizer) -> Self {
        Self { tokenizer, plays: HashMap::new() }
    }

    /// The tokenizer.
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// Token ids of a whole play (stripped markdown, no special tokens).
    ///
    /// # Errors
    /// [`crate::Error::Io`] if the play is missing (run `scripts/setup.sh text`); tokenizer
    /// errors.
    pub fn play(&mut self, name: &str) -> Result<&[u32]> {
        if !self.plays.contains_key(name) {
            let text = read_text(&paths::plays_dir().join(format!("{name}.md")))?;
            let ids = self.tokenizer.encode(&text)?;
            self.plays.insert(name.to_owned(), ids);
        }
        Ok(&self.plays[name])
    }

    /// `count` consecutive windows of `len` tokens of `play` starting at token `start`.
    ///
    /// # Errors
    /// [`crate::Error::InvalidInput`] if the play is too short.
    pub fn windows(
        &mut self,
        play: &str,
        start: usize,
        len: usize,
        count: usize,
    ) -> Result<Vec<Vec<u32>>> {
        let ids = self.play(play)?;
        let end = start + len * count;
        if end > ids.len() {
            return Err(invalid(
                "reproduce corpus",
                format!("{play} has {} tokens, need {end}", ids.len()),
            ));
        }
        Ok(ids[start..end].chunks_exact(len).map(<[u32]>::to_vec).collect())
    }

    /// The copy-task sequence for an `n`-token passage of `play` (fixtures' selection rule).
    ///
    /// # Errors
    /// As [`Corpus::windows`]; tokenizer errors.
    pub fn copy_task(&mut self, play: &str, n: usize, variant: Variant) -> Result<CopyTask> {
        let passage = self.windows(play, PASSAGE_OFFSET, n, 1)?.remove(0);
        let (prefix, instruction) = variant.texts();
        let prefix = if prefix.is_empty() { Vec::new() } else { self.tokenizer.encode(prefix)? };
        let instruction = self.tokenizer.encode(&instruction)?;
        Ok(CopyTask { play: play.to_owned(), variant, prefix, passage, instruction })
    }
}

/// How the copy task wraps its passage (the fixtures' two variants).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum Variant {
    /// No prefix: the span starts at position 0, so the attention sink lies inside it.
    Bare,
    /// Chat-wrapped: `<|im_start|>user\n` before the passage, the instruction closes the user
    /// turn and opens the assistant's — the sink sits before the span, as in an audio-LLM prompt.
    Chat,
}

impl Variant {
    fn texts(self) -> (&'static str, String) {
        match self {
            Self::Bare => ("", format!("{ASK}\n\n")),
            Self::Chat => {
                ("<|im_start|>user\n", format!("{ASK}<|im_end|>\n<|im_start|>assistant\n"))
            }
        }
    }

    /// `bare` or `chat`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Bare => "bare",
            Self::Chat => "chat",
        }
    }
}

/// Prefix + passage + instruction, then the passage again (the "transcript").
#[derive(Clone, Debug, serde::Serialize)]
pub struct CopyTask {
    /// Source play.
    pub play: String,
    /// Wrapping.
    pub variant: Variant,
    /// Tokens before the passage.
    pub prefix: Vec<u32>,
    /// The passage (the span the tiered store manages, and the tokens to reproduce).
    pub passage: Vec<u32>,
    /// The instruction between the copies.
    pub instruction: Vec<u32>,
}

impl CopyTask {
    /// The prompt: prefix + passage + instruction.
    pub fn prompt(&self) -> Vec<u32> {
        [&self.prefix[..], &self.passage, &self.instruction].concat()
    }

    /// The whole teacher-forced sequence: prompt + passage.
    pub fn sequence(&self) -> Vec<u32> {
        [self.prompt(), self.passage.clone()].concat()
    }

    /// Positions of the first copy (the managed span).
    pub fn span(&self) -> Range<usize> {
        self.prefix.len()..self.prefix.len() + self.passage.len()
    }

    /// Position of the query that predicts the `t`-th token of the second copy.
    pub fn answer_query(&self, t: usize) -> usize {
        self.prefix.len() + self.passage.len() + self.instruction.len() - 1 + t
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calibration_and_evaluation_sets_are_disjoint() {
        for p in SWAN_CALIBRATION_PLAYS {
            assert_ne!(p, SWAN_EVAL_PLAY);
        }
        for p in WNW_CALIBRATION_PLAYS {
            assert!(!WNW_EVAL_PLAYS.contains(&p));
        }
    }

    #[test]
    fn copy_task_geometry() {
        let t = CopyTask {
            play: "x".into(),
            variant: Variant::Chat,
            prefix: vec![1, 2],
            passage: vec![10, 11, 12],
            instruction: vec![7],
        };
        assert_eq!(t.prompt(), [1, 2, 10, 11, 12, 7]);
        assert_eq!(t.sequence().len(), 9);
        assert_eq!(t.span(), 2..5);
        // The last prompt position predicts the first token of the second copy.
        assert_eq!(t.answer_query(0), 5);
        assert_eq!(t.sequence()[t.answer_query(2) + 1], 12);
    }
}
