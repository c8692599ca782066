//! What every study of a `kvtide reproduce` run shares: the plan, the model (decode path
//! and, through its key-offset forward, the differentiable one), the tokenised corpus, the calibrated SWAN projection file,
//! a scratch directory, and a log that prints above the progress bar.

use std::path::{Path, PathBuf};
use std::time::Instant;

use indicatif::ProgressBar;

use super::corpus::{Corpus, SWAN_CALIBRATION_PLAYS};
use super::grid::{Plan, Size};
use crate::error::{Error, Result, invalid};
use models::calibrate::swan::{CalibrationStats, calibrate};
use models::llama::Llama;
use models::load::config::ModelConfig;
use models::load::gguf::GgufSource;
use models::load::tokenizer::Tokenizer;

/// Shared state of one run.
pub struct Context {
    /// The plan.
    pub plan: Plan,
    /// The model (decode path).
    pub model: Llama,
    /// Tokenised plays.
    pub corpus: Corpus,
    /// Scratch directory (projection and roles files), outside the results.
    pub work: PathBuf,
    /// `fixtures/` of this repository.
    pub fixtures: PathBuf,
    config: ModelConfig,
    model_path: PathBuf,
    projection: Option<(PathBuf, CalibrationStats)>,
    started: Instant,
    progress: ProgressBar,
}

impl Context {
    /// Loads the GGUF model at `model_path` and prepares a run of `size`.
    ///
    /// # Errors
    /// Loading errors; [`Error::Io`] if the scratch directory cannot be created.
    pub fn new(model_path: &Path, size: Size, progress: ProgressBar) -> Result<Self> {
        let (source, config) = GgufSource::open(model_path)?;
        let tokenizer = Tokenizer::from_gguf(source.file())?;
        let model = Llama::load(&source, &config)?;
        let mut plan = Plan::new(size, config.head_dim, config.num_layers * config.kv_heads);
        plan.fit_kv_heads(config.kv_heads);
        // One scratch directory per model: its projection file must not overwrite another's.
        let mut scratch = size.name().to_owned();
        if model_path.file_name() != Some(std::ffi::OsStr::new(crate::paths::DEFAULT_MODEL)) {
            let stem = model_path.file_stem().map_or("model".into(), |s| s.to_string_lossy());
            scratch = format!("{scratch}-{stem}");
        }
        let work = crate::paths::cache_dir().join("reproduce").join(scratch);
        std::fs::create_dir_all(&work).map_err(|source| Error::Io {
            op: "create directory",
            path: work.clone(),
            source,
        })?;
        let fixtures = std::env::var_os("KVTIDE_FIXTURES")
            .map(PathBuf::from)
            .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join("fixtures"));
        Ok(Self {
            plan,
            model,
            corpus: Corpus::new(tokenizer),
            work,
            fixtures,
            config,
            model_path: model_path.to_path_buf(),
            projection: None,
            started: Instant::now(),
            progress,
        })
    }

    /// A context of the same size and progress bar for another model (a further leg of a
    /// study that runs on every model set up).
    ///
    /// # Errors
    /// As [`Context::new`].
    pub fn for_model(&self, model_path: &Path) -> Result<Self> {
        Self::new(model_path, self.plan.size, self.progress.clone())
    }

    /// Prints `msg` with the elapsed time (above the progress bar).
    pub fn log(&self, msg: &str) {
        let line = format!("[{:>6.0} s] {msg}", self.started.elapsed().as_secs_f64());
        // A hidden bar (stderr not a terminal, e.g. CI logs) drops `println`.
        if self.progress.is_hidden() {
            eprintln!("{line}");
        } else {
            self.progress.println(line);
        }
    }

    /// Advances the progress bar.
    pub fn tick(&self, what: &str) {
        self.progress.inc(1);
        self.progress.set_message(what.to_owned());
    }

    /// Seconds since the run started.
    pub fn elapsed(&self) -> f64 {
        self.started.elapsed().as_secs_f64()
    }

    /// The calibrated SWAN projection file (calibrated on first use).
    ///
    /// # Errors
    /// Corpus and calibration errors; [`Error::Projection`] if the file cannot be written.
    pub fn projection(&mut self) -> Result<PathBuf> {
        if self.projection.is_none() {
            let (per_play, len) = self.plan.swan_calibration;
            let mut windows = Vec::new();
            for play in SWAN_CALIBRATION_PLAYS {
                windows.extend(self.corpus.windows(play, 0, len, per_play)?);
            }
            self.log(&format!(
                "calibrating SWAN projections on {} windows of {len} tokens",
                windows.len()
            ));
            let (set, stats) = calibrate(
                &self.model,
                &windows,
                projection::CalibrationConfig::default(),
                &mut |_| {},
            )?;
            let path = self.work.join("projection.safetensors");
            set.save(&path)?;
            self.projection = Some((path, stats));
        }
        self.projection
            .as_ref()
            .map(|(p, _)| p.clone())
            .ok_or_else(|| invalid("reproduce", "projection"))
    }

    /// Statistics of the projection calibration, once it ran.
    pub fn calibration_stats(&self) -> Option<&CalibrationStats> {
        self.projection.as_ref().map(|(_, s)| s)
    }

    /// The GGUF file the model was loaded from.
    pub fn model_path(&self) -> &Path {
        &self.model_path
    }

    /// Bytes a dense f16 cache holds for `tokens` tokens (keys and values, all layers).
    pub fn dense_f16_bytes(&self, tokens: usize) -> usize {
        let c = &self.config;
        2 * c.num_layers * c.kv_heads * tokens * c.head_dim * 2
    }
}
