//! Plain prose from the plays' markdown, by one fixed rule shared with the fixture
//! generator (`scripts/fixtures/common.py`, `strip_markdown`), so token ids agree:
//!
//! Per line (split on `\n`, trimmed of surrounding whitespace): drop empty lines; drop
//! headings (start with `#`); drop speaker lines (start *and* end with `**`); drop stage
//! directions — a line starting with `_` is dropped, and when it does not also end with
//! `_`, every following line is dropped up to and including the first that ends with `_`.
//! In kept lines every backslash is deleted (markdown escapes such as `\--`). Kept lines
//! are joined with single spaces.

use std::path::Path;

use crate::error::Result;

/// Applies the rule above to one play's markdown.
///
/// # Examples
/// ```
/// let md = "# Hamlet\n\n**BERNARDO**  \nWho's there?\n\n_Enter HORATIO\nand MARCELLUS_\nNay\\--answer me";
/// assert_eq!(models::load::text::strip_markdown(md), "Who's there? Nay--answer me");
/// ```
pub fn strip_markdown(md: &str) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut in_stage = false;
    for raw in md.split('\n') {
        let s = raw.trim();
        if in_stage {
            in_stage = !s.ends_with('_');
            continue;
        }
        if s.is_empty() || s.starts_with('#') {
            continue;
        }
        if s.starts_with('_') {
            in_stage = !(s.chars().count() > 1 && s.ends_with('_'));
            continue;
        }
        if s.chars().count() >= 4 && s.starts_with("**") && s.ends_with("**") {
            continue;
        }
        out.push(s.replace('\\', ""));
    }
    out.join(" ")
}

/// Reads a text file; `.md` files go through [`strip_markdown`], others are used as is.
///
/// # Errors
/// [`crate::Error::Io`] if the file cannot be read.
pub fn read_text(path: &Path) -> Result<String> {
    let raw = crate::error::read_text_file(path)?;
    Ok(if path.extension().is_some_and(|e| e == "md") { strip_markdown(&raw) } else { raw })
}
