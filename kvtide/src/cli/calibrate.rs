//! `kvtide calibrate`: runs the model over calibration text and writes the SWAN
//! `ProjectionSet` (`papers/swan.txt`, "projection matrices"), by default to
//! `$KVTIDE_CACHE/projections/<model>.safetensors` where `swan` caches look for it.
//! Default text: plays other than the default evaluation play (so perplexity is measured on
//! text the bases never saw).

use std::path::{Path, PathBuf};

use crate::Result;
use clap::Args;
use projection::{CalibrationConfig, Stream};
use serde_json::json;

use crate::cli::common::{ModelArgs, bar, print_json, tokenizer};

/// Arguments of `kvtide calibrate`.
#[derive(Args, Debug)]
pub struct CalibrateArgs {
    /// Which model to load.
    #[command(flatten)]
    pub model: ModelArgs,
    /// Calibration text files (`.md` plays are stripped); default: three plays other than the
    /// default evaluation play.
    #[arg(long = "text")]
    pub texts: Vec<PathBuf>,
    /// Calibration tokens in total.
    #[arg(long, default_value_t = 16384)]
    pub tokens: usize,
    /// Tokens per prefill window.
    #[arg(long, default_value_t = 512)]
    pub window: usize,
    /// Output file (default: the path `swan` caches load).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
}

/// Plays used when no `--text` is given.
pub const DEFAULT_PLAYS: [&str; 3] = ["macbeth.md", "othello.md", "the-tempest.md"];

/// Calibration token ids: each text's tokens in turn until `limit`.
fn calibration_ids(texts: &[PathBuf], tok: &models::Tokenizer, limit: usize) -> Result<Vec<u32>> {
    let mut ids = Vec::new();
    for path in texts {
        if ids.len() >= limit {
            break;
        }
        ids.extend(tok.encode(&models::load::text::read_text(path)?)?);
    }
    ids.truncate(limit);
    Ok(ids)
}

/// Calibrates and writes the file; returns its path (used by the demo too).
pub fn calibrate(a: &CalibrateArgs, ckpt: &models::Checkpoint) -> Result<PathBuf> {
    let texts: Vec<PathBuf> = if a.texts.is_empty() {
        DEFAULT_PLAYS.iter().map(|p| crate::paths::plays_dir().join(p)).collect()
    } else {
        a.texts.clone()
    };
    let ids = calibration_ids(&texts, tokenizer(ckpt, "calibrate")?, a.tokens)?;
    let windows = models::calibrate::swan::windows(&ids, a.window, a.tokens);
    let progress = bar(windows.len(), "calibrating (windows)");
    let (set, stats) = models::calibrate::swan::calibrate(
        &ckpt.model,
        &windows,
        CalibrationConfig::default(),
        &mut |i| progress.set_position(i as u64),
    )?;
    progress.finish_and_clear();
    let out = a.out.clone().unwrap_or_else(|| crate::paths::projection_file(&ckpt.config.name));
    if let Some(dir) = out.parent() {
        std::fs::create_dir_all(dir).map_err(|source| crate::Error::Io {
            op: "create",
            path: dir.to_path_buf(),
            source,
        })?;
    }
    set.save(&out)?;
    report(a, &set, &stats, &out, &texts)?;
    Ok(out)
}

/// Mean fraction of energy in the first `k` rotated dims, over heads, per stream.
fn mean_energy(set: &projection::ProjectionSet, stream: Stream, k: usize) -> Result<f64> {
    let dims = set.dims();
    let mut sum = 0.0;
    for l in 0..dims.layers() {
        for h in 0..dims.kv_heads() {
            sum += set
                .energy_curve(stream, l, h)?
                .and_then(|c| c.get(k - 1).copied())
                .unwrap_or(f64::NAN);
        }
    }
    Ok(sum / (dims.layers() * dims.kv_heads()) as f64)
}

fn report(
    a: &CalibrateArgs,
    set: &projection::ProjectionSet,
    stats: &models::calibrate::swan::CalibrationStats,
    out: &Path,
    texts: &[PathBuf],
) -> Result<()> {
    let half = set.dims().head_dim() / 2;
    let (eqk, evo) = (mean_energy(set, Stream::Qk, half)?, mean_energy(set, Stream::Vo, half)?);
    if a.json {
        print_json(&json!({
            "out": out, "texts": texts, "windows": stats.windows, "tokens": stats.tokens, "seconds": stats.seconds,
            "max_abs_key": stats.max_abs_key, "max_abs_value": stats.max_abs_value,
            "energy_at_half_qk": eqk, "energy_at_half_vo": evo, "max_orthogonality_error": set.max_orthogonality_error(),
        }));
    } else {
        println!(
            "wrote {} ({} tokens in {} windows, {:.1} s)",
            out.display(),
            stats.tokens,
            stats.windows,
            stats.seconds
        );
        println!(
            "energy in the first {half} of {} dims: QK {:.3}, VO {:.3}; max |key| {:.1}, max |value| {:.2}",
            2 * half,
            eqk,
            evo,
            stats.max_abs_key,
            stats.max_abs_value
        );
    }
    Ok(())
}

/// Runs `kvtide calibrate`.
pub fn run(a: &CalibrateArgs) -> Result<()> {
    let ckpt = a.model.load()?;
    calibrate(a, &ckpt).map(|_| ())
}
