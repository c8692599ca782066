//! Pieces every command shares: the model argument and its loading, text loading,
//! progress bars (indicatif, on stderr so `--json` output stays clean) and byte formatting.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::Result;
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use models::Checkpoint;

/// Which model to load.
#[derive(Args, Debug, Clone)]
pub struct ModelArgs {
    /// A `.gguf` file or an HF checkpoint directory (default: the SmolLM2 GGUF set-up fetched).
    #[arg(long)]
    pub model: Option<PathBuf>,
}

impl ModelArgs {
    /// The path to load.
    pub fn path(&self) -> PathBuf {
        self.model.clone().unwrap_or_else(crate::paths::default_model)
    }

    /// Loads the model with a spinner.
    pub fn load(&self) -> Result<Checkpoint> {
        let path = self.path();
        let bar = spinner(&format!("loading {}", path.display()));
        let ckpt = Checkpoint::load(&path);
        bar.finish_and_clear();
        Ok(ckpt?)
    }
}

/// A spinner for a step of unknown length.
pub fn spinner(msg: &str) -> ProgressBar {
    let bar = ProgressBar::new_spinner().with_message(msg.to_string());
    bar.enable_steady_tick(Duration::from_millis(120));
    bar
}

/// A bar of `len` steps.
pub fn bar(len: usize, msg: &str) -> ProgressBar {
    let bar = ProgressBar::new(len as u64).with_message(msg.to_string());
    let style =
        ProgressStyle::with_template("{msg:>28} [{bar:30}] {pos}/{len} {per_sec} eta {eta}")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> ");
    bar.set_style(style);
    bar
}

/// The tokenizer of a checkpoint, or an error naming the command.
pub fn tokenizer<'a>(ckpt: &'a Checkpoint, command: &'static str) -> Result<&'a models::Tokenizer> {
    ckpt.tokenizer.as_ref().ok_or_else(|| crate::Error::InvalidInput {
        op: command,
        reason: "the checkpoint has no tokenizer (tokenizer.json or GGUF vocabulary)".into(),
    })
}

/// A text file (markdown stripped) or the default play.
pub fn read_text(path: Option<&Path>) -> Result<(PathBuf, String)> {
    let path = path.map_or_else(crate::paths::default_play, Path::to_path_buf);
    let text = models::load::text::read_text(&path)?;
    Ok((path, text))
}

/// `1234567` → `1.18 MiB`.
pub fn human_bytes(bytes: f64) -> String {
    let units = ["B", "KiB", "MiB", "GiB"];
    let mut v = bytes;
    let mut i = 0;
    while v >= 1024.0 && i + 1 < units.len() {
        v /= 1024.0;
        i += 1;
    }
    format!("{v:.2} {}", units[i])
}

/// Prints a JSON value on stdout.
pub fn print_json(v: &serde_json::Value) {
    println!("{}", serde_json::to_string_pretty(v).unwrap_or_else(|_| v.to_string()));
}
