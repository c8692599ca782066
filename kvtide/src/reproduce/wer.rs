//! Truncated word error rate, the quality metric of WnW (`papers/wnw.txt` §3.5).
//!
//! Normalisation ("light text normalization"): lower-case, then delete every Unicode
//! punctuation character (general category `P*`, as jiwer's `RemovePunctuation`) except the
//! apostrophe `'` and the period `.`, then split on whitespace. The hypothesis is truncated
//! to `⌊1.2 · N_ref⌋` words ([`TRUNCATION_RATIO`]) before scoring, so a hypothesis that never
//! terminates costs at most `0.2 · N_ref` insertions instead of an unbounded number.
//! Scoring is the word-level Levenshtein alignment: `WER = (S + D + I) / N_ref`. Corpus
//! figures sum the counts of every utterance before dividing (jiwer's corpus WER).
//!
//! The same alignment works on any token type ([`align`]): the audio run scores generated
//! token ids against the full-cache output when the checkpoint has no tokenizer.

use std::sync::LazyLock;

use regex::Regex;
use serde::Serialize;

/// Hypotheses are truncated to this multiple of the reference length (§3.5).
pub const TRUNCATION_RATIO: f64 = 1.2;

/// Unicode punctuation except `'` and `.`.
static PUNCTUATION: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"[\p{P}&&[^'.]]").expect("the punctuation class is a valid regex")
});

/// Edit counts of one alignment (or a sum of them).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct EditCounts {
    /// Aligned words that agree.
    pub hits: usize,
    /// Substitutions `S`.
    pub substitutions: usize,
    /// Deletions `D` (reference words the hypothesis lacks).
    pub deletions: usize,
    /// Insertions `I` (hypothesis words the reference lacks).
    pub insertions: usize,
    /// Reference words `N_ref`.
    pub reference_words: usize,
    /// Hypothesis words scored (after truncation).
    pub hypothesis_words: usize,
}

impl EditCounts {
    /// `S + D + I`.
    pub fn errors(&self) -> usize {
        self.substitutions + self.deletions + self.insertions
    }

    /// `(S + D + I) / N_ref`; 0 when the reference is empty (the truncated hypothesis is
    /// then empty too, so there are no errors).
    ///
    /// # Examples
    /// ```
    /// use kvtide::reproduce::wer::truncated_wer;
    /// assert_eq!(truncated_wer("hello world", "Hello, duck!").wer(), 0.5);
    /// ```
    pub fn wer(&self) -> f64 {
        if self.reference_words == 0 {
            0.0
        } else {
            self.errors() as f64 / self.reference_words as f64
        }
    }

    /// Adds another utterance's counts (corpus WER = summed errors / summed references).
    pub fn add(&mut self, other: &EditCounts) {
        self.hits += other.hits;
        self.substitutions += other.substitutions;
        self.deletions += other.deletions;
        self.insertions += other.insertions;
        self.reference_words += other.reference_words;
        self.hypothesis_words += other.hypothesis_words;
    }
}

/// Lower-cases `text`, deletes punctuation except `'` and `.`, and splits it into words.
///
/// # Examples
/// ```
/// use kvtide::reproduce::wer::normalize;
/// assert_eq!(normalize("Well—it's 3.5, \"Sir\"!"), ["wellit's", "3.5", "sir"]);
/// ```
pub fn normalize(text: &str) -> Vec<String> {
    let lower = text.to_lowercase();
    PUNCTUATION.replace_all(&lower, "").split_whitespace().map(str::to_owned).collect()
}

/// Words kept of a hypothesis scored against `reference_words` words: `⌊1.2 · N_ref⌋`.
///
/// # Examples
/// ```
/// use kvtide::reproduce::wer::truncation_len;
/// assert_eq!(truncation_len(10), 12);
/// assert_eq!(truncation_len(7), 8); // ⌊8.4⌋
/// ```
pub fn truncation_len(reference_words: usize) -> usize {
    // Exact integer form of ⌊1.2·n⌋ (no float rounding at multiples of 5).
    reference_words * 6 / 5
}

/// Word-level Levenshtein alignment of `hypothesis` against `reference` (no truncation).
/// Among alignments of minimal cost, the backtrace prefers a match/substitution, then a
/// deletion, then an insertion, so the split into `S`, `D`, `I` is deterministic.
///
/// # Examples
/// ```
/// use kvtide::reproduce::wer::align;
/// let c = align(&["the", "cat", "sat", "down"], &["the", "bat", "sat", "down", "now"]);
/// assert_eq!((c.substitutions, c.deletions, c.insertions), (1, 0, 1));
/// let c = align(&["a", "b", "c"], &["a", "c"]);
/// assert_eq!((c.substitutions, c.deletions, c.insertions), (0, 1, 0));
/// // Equal-cost alignments resolve toward substitutions: a·b→x·c→d·d→e, not b→x, −c, +e.
/// let c = align(&["a", "b", "c", "d"], &["a", "x", "d", "e"]);
/// assert_eq!((c.substitutions, c.deletions, c.insertions), (3, 0, 0));
/// ```
pub fn align<T: PartialEq>(reference: &[T], hypothesis: &[T]) -> EditCounts {
    let (n, m) = (reference.len(), hypothesis.len());
    // cost[i][j]: edit distance of reference[..i] and hypothesis[..j], row-major.
    let w = m + 1;
    let mut cost = vec![0usize; (n + 1) * w];
    for (j, c) in cost.iter_mut().take(w).enumerate() {
        *c = j;
    }
    for i in 1..=n {
        cost[i * w] = i;
        for j in 1..=m {
            let diag =
                cost[(i - 1) * w + j - 1] + usize::from(reference[i - 1] != hypothesis[j - 1]);
            let del = cost[(i - 1) * w + j] + 1;
            let ins = cost[i * w + j - 1] + 1;
            cost[i * w + j] = diag.min(del).min(ins);
        }
    }
    let mut counts =
        EditCounts { reference_words: n, hypothesis_words: m, ..EditCounts::default() };
    let (mut i, mut j) = (n, m);
    while i > 0 || j > 0 {
        let here = cost[i * w + j];
        if i > 0 && j > 0 {
            let same = reference[i - 1] == hypothesis[j - 1];
            if cost[(i - 1) * w + j - 1] + usize::from(!same) == here {
                if same {
                    counts.hits += 1;
                } else {
                    counts.substitutions += 1;
                }
                (i, j) = (i - 1, j - 1);
                continue;
            }
        }
        if i > 0 && cost[(i - 1) * w + j] + 1 == here {
            counts.deletions += 1;
            i -= 1;
        } else {
            counts.insertions += 1;
            j -= 1;
        }
    }
    counts
}

/// Truncated WER of token sequences: the hypothesis is cut to [`truncation_len`] tokens,
/// then aligned against the reference.
///
/// # Examples
/// ```
/// use kvtide::reproduce::wer::truncated_tokens;
/// let reference = [1u32, 2, 3, 4, 5];
/// let looping = [1u32, 2, 3, 4, 5, 5, 5, 5, 5, 5, 5, 5];
/// assert_eq!(truncated_tokens(&reference, &looping).insertions, 1); // 6 tokens kept
/// ```
pub fn truncated_tokens<T: PartialEq>(reference: &[T], hypothesis: &[T]) -> EditCounts {
    let keep = truncation_len(reference.len()).min(hypothesis.len());
    align(reference, &hypothesis[..keep])
}

/// Truncated WER of two texts after [`normalize`] (WnW §3.5).
///
/// # Examples
/// ```
/// use kvtide::reproduce::wer::truncated_wer;
/// // 8 reference words: the looping hypothesis is cut to 9 words ("ill-disposed" →
/// // "illdisposed"), so 4 edits remain however they are split: WER 4 / 8.
/// let c = truncated_wer("He was not an ill disposed young man",
///                       "he was not an ill-disposed young man man man man man man");
/// assert_eq!((c.hypothesis_words, c.substitutions + c.deletions + c.insertions), (9, 4));
/// assert_eq!(c.wer(), 0.5);
/// ```
pub fn truncated_wer(reference: &str, hypothesis: &str) -> EditCounts {
    truncated_tokens(&normalize(reference), &normalize(hypothesis))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sdi(c: EditCounts) -> (usize, usize, usize) {
        (c.substitutions, c.deletions, c.insertions)
    }

    #[test]
    fn known_values() {
        // jiwer's documentation example.
        assert_eq!(truncated_wer("hello world", "hello duck").wer(), 0.5);
        // One substitution and one deletion out of six words.
        let c = truncated_wer("the cat sat on the mat", "the cat sit on mat");
        assert_eq!(sdi(c), (1, 1, 0));
        assert!((c.wer() - 2.0 / 6.0).abs() < 1e-12);
        // Identity and the empty hypothesis.
        assert_eq!(truncated_wer("a b c", "A, b; c!").wer(), 0.0);
        assert_eq!(sdi(truncated_wer("a b c", "")), (0, 3, 0));
        assert_eq!(truncated_wer("", "").wer(), 0.0);
        assert_eq!(truncated_wer("", "anything at all").errors(), 0);
    }

    #[test]
    fn levenshtein_matches_textbook_distances() {
        let chars = |s: &str| s.chars().collect::<Vec<_>>();
        for (a, b, d) in
            [("kitten", "sitting", 3), ("flaw", "lawn", 2), ("", "abc", 3), ("abc", "abc", 0)]
        {
            let c = align(&chars(a), &chars(b));
            assert_eq!(c.errors(), d, "{a} → {b}");
            assert_eq!(c.hits + c.substitutions + c.deletions, a.len());
            assert_eq!(c.hits + c.substitutions + c.insertions, b.len());
        }
    }

    #[test]
    fn truncation_caps_runaway_hypotheses() {
        let reference = "one two three four five six seven eight nine ten";
        let runaway = format!("{reference} {}", "again ".repeat(100));
        let c = truncated_wer(reference, &runaway);
        assert_eq!((c.hypothesis_words, c.insertions), (12, 2));
        assert!((c.wer() - 0.2).abs() < 1e-12);
        // Untruncated it would be 10.0.
        assert_eq!(align(&normalize(reference), &normalize(&runaway)).wer(), 10.0);
        assert_eq!(truncation_len(0), 0);
        assert_eq!(truncation_len(5), 6);
        assert_eq!(truncation_len(4), 4);
    }

    #[test]
    fn normalisation_keeps_apostrophes_and_periods_only() {
        assert_eq!(
            normalize("Don't STOP—now: (p.m.) «¿qué?» a-b_c"),
            ["don't", "stopnow", "p.m.", "qué", "abc"]
        );
        assert_eq!(normalize("  \t\n "), Vec::<String>::new());
        // Symbols are not punctuation (jiwer keeps them too).
        assert_eq!(normalize("$5 + 3"), ["$5", "+", "3"]);
    }

    #[test]
    fn corpus_wer_sums_counts() {
        let mut total = EditCounts::default();
        total.add(&truncated_wer("a b", "a c"));
        total.add(&truncated_wer("d e f g h i", "d e f g h i"));
        assert_eq!((total.errors(), total.reference_words), (1, 8));
        assert_eq!(total.wer(), 0.125);
    }
}
