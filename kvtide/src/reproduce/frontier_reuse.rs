//! Figures of earlier frontier runs taken into a new one (`kvtide reproduce --only frontier
//! --frontier-reuse FILE…`): the frontier study's full grid on a model with `d_h = 256` is
//! hundreds of SWAN configurations at ~40 s each on two cores, more than one sitting holds,
//! so a grid can be measured in parts (each restricted with [`super::frontier::SwanGrid`])
//! and assembled into one frontier, one budget table and one plot.
//!
//! What is reused, and what keeps it honest:
//! * only SWAN configurations (`papers/swan.txt`, method section) of this run's plan, matched
//!   by their spec string (projection path elided) and label, from a `results.json` leg of
//!   the same model, play, windows (count, length, prefix) and head size (a file without
//!   one is an error in a run of one leg, and a printed skip where it may hold another leg);
//! * the dense rows always run again; the dense f16 perplexity must agree with each file's
//!   within [`DENSE_F16_AGREEMENT`] (checked before any SWAN configuration runs), otherwise
//!   the run stops with a typed error — a different model file, text or code path;
//! * every reused point names its file, the report lists each file's command, start time and
//!   count, and how far its dense rows lie from this run's (quantized rows do not repeat
//!   exactly across runs: libtorch's batched products sum in an order that depends on which
//!   configurations share a batch, and a rounding flip in a 4-bit code moves a perplexity);
//! * reused bytes are checked against this build's formulas like measured ones
//!   ([`super::frontier::formula_bytes`]).

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result, invalid};

/// How far (relative) a reused file's dense f16 perplexity may lie from this run's. Repeated
/// runs of the same build agree to ~1e-5 (the batch composition changes the summation
/// order); another text, model file or window layout differs by percents.
pub const DENSE_F16_AGREEMENT: f64 = 1e-3;

const OP: &str = "reproduce --frontier-reuse";

/// The reuse options of `kvtide reproduce` (flattened into its arguments).
#[derive(clap::Args, Clone, Debug, Default, PartialEq)]
pub struct ReuseArgs {
    /// `results.json` files of earlier frontier runs (comma-separated or repeated): each SWAN
    /// configuration of this run's plan that one of them measured on the same model, play and
    /// windows takes its figures instead of running again (the first file listed wins). The
    /// dense rows always run and must agree with each file's; the report names every file.
    #[arg(
        id = "frontier_reuse",
        long = "frontier-reuse",
        value_delimiter = ',',
        conflicts_with = "frontier_external_only"
    )]
    pub files: Vec<PathBuf>,
    /// With `--frontier-reuse`: the plan's SWAN configurations no file measured are left out
    /// (the report lists them) instead of run — to assemble a grid measured in parts.
    #[arg(id = "frontier_reuse_only", long = "frontier-reuse-only", requires = "frontier_reuse")]
    pub only: bool,
}

/// A SWAN configuration's figures as an earlier run measured them.
#[derive(Clone, Debug, PartialEq)]
pub struct Measured {
    /// Perplexity over the scored tokens of every window.
    pub perplexity: f64,
    /// Arg-max accuracy.
    pub top1: f64,
    /// Bytes held at the end of a window (mean over windows).
    pub window_bytes: f64,
    /// The file it came from (as given on the command line).
    pub file: String,
}

/// Where a run's reused figures came from (recorded with the study).
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct ReuseSource {
    /// The `results.json` file, as given.
    pub file: String,
    /// The command of the run that wrote it.
    pub command: String,
    /// When that run started (Unix seconds), if recorded.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unix_start: Option<u64>,
    /// SWAN configurations of this run taken from it.
    pub configurations: usize,
    /// The dense row of both runs whose perplexities differ most, and by how much
    /// (relative, this run over the file's minus one).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dense_spread: Option<(String, f64)>,
}

#[derive(Deserialize)]
struct FileRun {
    #[serde(default)]
    command: String,
    #[serde(default)]
    unix_start: Option<u64>,
}

#[derive(Deserialize)]
struct FileFamily {
    family: String,
}

#[derive(Deserialize)]
struct FilePoint {
    run: FileFamily,
    label: String,
    spec: String,
    perplexity: f64,
    top1: f64,
    window_bytes: f64,
}

#[derive(Deserialize)]
struct FileLeg {
    model: String,
    eval_play: String,
    windows: (usize, usize, usize),
    head_dim: usize,
    points: Vec<FilePoint>,
}

/// One file's leg that matches this run's.
struct Source {
    file: String,
    run: FileRun,
    /// `(label, perplexity)` of its dense rows.
    dense: Vec<(String, f64)>,
    /// `(spec, label, figures)` of its SWAN rows.
    swan: Vec<(String, String, Measured)>,
    used: usize,
}

/// What this run's study leg is: a file's leg is reused only if it is the same.
#[derive(Clone, Copy, Debug)]
pub struct LegKey<'a> {
    /// The model as the study names it (configuration name and GGUF file name).
    pub model: &'a str,
    /// The play scored.
    pub play: &'a str,
    /// Windows, their length, the prefix prefilled.
    pub windows: (usize, usize, usize),
    /// Head dimension.
    pub head_dim: usize,
}

/// The figures loaded for one leg of the study.
pub struct Reused {
    sources: Vec<Source>,
    skipped: Vec<String>,
}

impl Reused {
    /// Nothing to reuse.
    pub fn none() -> Self {
        Self { sources: Vec::new(), skipped: Vec::new() }
    }

    /// Reads every file of `args` and keeps the frontier leg matching `key` from each. With
    /// `strict` (a run of one leg) a file without such a leg is an error; otherwise (it may
    /// hold another leg of the run) it is skipped and said so by [`Reused::skipped`].
    ///
    /// # Errors
    /// [`Error::Io`] / [`Error::Json`] for a file that cannot be read or parsed;
    /// [`Error::InvalidInput`] for a point with a non-finite or non-positive figure, and with
    /// `strict` for a file with no frontier leg of this model, play, windows and head size.
    pub fn load(args: &ReuseArgs, key: LegKey<'_>, strict: bool) -> Result<Self> {
        let mut out = Self::none();
        for path in &args.files {
            match Self::read(path, key)? {
                Ok(source) => out.sources.push(source),
                Err(why) if strict => return Err(invalid(OP, why)),
                Err(why) => out.skipped.push(why),
            }
        }
        Ok(out)
    }

    /// Why each file skipped for this leg was (non-strict loads only).
    pub fn skipped(&self) -> &[String] {
        &self.skipped
    }

    /// The file's leg matching `key`, or (inner `Err`) why it has none.
    fn read(path: &Path, key: LegKey<'_>) -> Result<std::result::Result<Source, String>> {
        let text = std::fs::read_to_string(path).map_err(|source| Error::Io {
            op: "read",
            path: path.to_owned(),
            source,
        })?;
        let json = |source| Error::Json { what: path.display().to_string(), source };
        let doc: serde_json::Value = serde_json::from_str(&text).map_err(json)?;
        let run: FileRun = match doc.get("run") {
            Some(r) => serde_json::from_value(r.clone()).map_err(json)?,
            None => FileRun { command: String::new(), unix_start: None },
        };
        let mut found = Vec::new();
        if let Some(map) = doc.as_object() {
            for (name, leg) in map.iter().filter(|(name, _)| name.starts_with("frontier")) {
                if let Ok(leg) = serde_json::from_value::<FileLeg>(leg.clone()) {
                    found.push(format!(
                        "{name}: {} on {}, windows {:?}, d_h {}",
                        leg.model, leg.eval_play, leg.windows, leg.head_dim
                    ));
                    if leg.model == key.model
                        && leg.eval_play == key.play
                        && leg.windows == key.windows
                        && leg.head_dim == key.head_dim
                    {
                        return Self::source(path, run, leg).map(Ok);
                    }
                }
            }
        }
        Ok(Err(format!(
            "{} has no frontier leg of {} on {}, windows {:?}, d_h {} (it has: {})",
            path.display(),
            key.model,
            key.play,
            key.windows,
            key.head_dim,
            if found.is_empty() { "none".to_owned() } else { found.join("; ") }
        )))
    }

    fn source(path: &Path, run: FileRun, leg: FileLeg) -> Result<Source> {
        let file = path.display().to_string();
        let (mut dense, mut swan) = (Vec::new(), Vec::new());
        for p in leg.points {
            let figures = [p.perplexity, p.top1, p.window_bytes];
            if figures.iter().any(|x| !x.is_finite()) || p.perplexity <= 0.0 {
                return Err(invalid(
                    OP,
                    format!(
                        "{file}: point {} has a non-finite or non-positive figure \
                         (perplexity {}, top-1 {}, bytes {})",
                        p.label, p.perplexity, p.top1, p.window_bytes
                    ),
                ));
            }
            match p.run.family.as_str() {
                "swan" => swan.push((
                    p.spec,
                    p.label,
                    Measured {
                        perplexity: p.perplexity,
                        top1: p.top1,
                        window_bytes: p.window_bytes,
                        file: file.clone(),
                    },
                )),
                _ => dense.push((p.label, p.perplexity)),
            }
        }
        Ok(Source { file, run, dense, swan, used: 0 })
    }

    /// Whether nothing was loaded.
    pub fn is_empty(&self) -> bool {
        self.sources.is_empty()
    }

    /// Whether some file measured the SWAN configuration with this spec and label.
    pub fn has(&self, spec: &str, label: &str) -> bool {
        self.sources.iter().any(|s| s.swan.iter().any(|(sp, l, _)| sp == spec && l == label))
    }

    /// The figures of the SWAN configuration with this spec and label from the first file
    /// that measured it (counted for that file's record).
    pub fn take(&mut self, spec: &str, label: &str) -> Option<Measured> {
        for s in &mut self.sources {
            if let Some((_, _, m)) = s.swan.iter().find(|(sp, l, _)| sp == spec && l == label) {
                s.used += 1;
                return Some(m.clone());
            }
        }
        None
    }

    /// Checks this run's dense f16 perplexity against every file's.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] when a file has no dense f16 row or its perplexity lies more
    /// than [`DENSE_F16_AGREEMENT`] (relative) from `perplexity`.
    pub fn check_dense_f16(&self, perplexity: f64) -> Result<()> {
        for s in &self.sources {
            let Some(&(_, theirs)) = s.dense.iter().find(|(l, _)| l == "dense f16") else {
                return Err(invalid(OP, format!("{} has no dense f16 row to check", s.file)));
            };
            let off = (perplexity / theirs - 1.0).abs();
            if off.is_nan() || off > DENSE_F16_AGREEMENT {
                return Err(invalid(
                    OP,
                    format!(
                        "dense f16 perplexity {perplexity} in this run, {theirs} in {} \
                         (relative difference {off:.2e} > {DENSE_F16_AGREEMENT:e}): another \
                         model file, text or code path — its figures are not comparable",
                        s.file
                    ),
                ));
            }
        }
        Ok(())
    }

    /// The record of every file, with the largest relative difference between its dense rows
    /// and this run's (`dense`: this run's `(label, perplexity)` dense rows).
    pub fn sources(&self, dense: &[(String, f64)]) -> Vec<ReuseSource> {
        self.sources
            .iter()
            .map(|s| {
                let dense_spread = s
                    .dense
                    .iter()
                    .filter_map(|(l, theirs)| {
                        let (_, ours) = dense.iter().find(|(m, _)| m == l)?;
                        Some((l.clone(), ours / theirs - 1.0))
                    })
                    .max_by(|a, b| a.1.abs().total_cmp(&b.1.abs()));
                ReuseSource {
                    file: s.file.clone(),
                    command: s.run.command.clone(),
                    unix_start: s.run.unix_start,
                    configurations: s.used,
                    dense_spread,
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: LegKey<'static> =
        LegKey { model: "M (m.gguf)", play: "hamlet", windows: (8, 1024, 512), head_dim: 64 };

    fn point(family: &str, label: &str, spec: &str, ppl: f64) -> serde_json::Value {
        serde_json::json!({
            "run": {"family": family, "k": null},
            "label": label, "spec": spec, "perplexity": ppl, "top1": 0.25,
            "window_bytes": 1000.0, "window_formula_bytes": 1000.0,
        })
    }

    fn file(dir: &Path, name: &str, model: &str, points: Vec<serde_json::Value>) -> PathBuf {
        let doc = serde_json::json!({
            "run": {"command": "kvtide reproduce --only frontier", "unix_start": 7},
            "frontier": {
                "model": model, "eval_play": "hamlet", "windows": [8, 1024, 512],
                "head_dim": 64, "points": points,
            },
        });
        let path = dir.join(name);
        std::fs::write(&path, doc.to_string()).unwrap();
        path
    }

    fn dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("kvtide-reuse-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn swan_points_are_taken_from_the_first_file_and_counted() {
        let d = dir("take");
        let a = file(
            &d,
            "a.json",
            KEY.model,
            vec![
                point("dense", "dense f16", "dense:format=f16", 80.0),
                point("dense", "dense int4", "dense:format=int4", 90.0),
                point("swan", "swan k=32", "swan:k=32", 81.0),
            ],
        );
        let b = file(
            &d,
            "b.json",
            KEY.model,
            vec![
                point("dense", "dense f16", "dense:format=f16", 80.0001),
                point("swan", "swan k=32", "swan:k=32", 99.0),
                point("swan", "swan k=16", "swan:k=16", 85.0),
            ],
        );
        let args = ReuseArgs { files: vec![a, b], only: false };
        let mut r = Reused::load(&args, KEY, true).unwrap();
        assert!(r.has("swan:k=16", "swan k=16"));
        assert!(!r.has("swan:k=16", "another label"), "spec and label must both match");
        assert!(!r.has("dense:format=f16", "dense f16"), "dense rows are never reused");
        assert_eq!(r.take("swan:k=32", "swan k=32").unwrap().perplexity, 81.0);
        assert_eq!(r.take("swan:k=16", "swan k=16").unwrap().perplexity, 85.0);
        assert!(r.take("swan:k=8", "swan k=8").is_none());
        r.check_dense_f16(80.00005).unwrap();
        let ours = [("dense f16".to_owned(), 80.0), ("dense int4".to_owned(), 91.8)];
        let s = r.sources(&ours);
        assert_eq!((s[0].configurations, s[1].configurations), (1, 1));
        let (label, off) = s[0].dense_spread.clone().unwrap();
        assert_eq!(label, "dense int4");
        assert!((off - 0.02).abs() < 1e-12);
        assert_eq!(s[0].command, "kvtide reproduce --only frontier");
        assert_eq!(s[0].unix_start, Some(7));
    }

    #[test]
    fn a_disagreeing_dense_f16_or_another_leg_is_refused() {
        let d = dir("refuse");
        let a = file(&d, "a.json", KEY.model, vec![point("dense", "dense f16", "x", 80.0)]);
        let r =
            Reused::load(&ReuseArgs { files: vec![a.clone()], only: false }, KEY, true).unwrap();
        let e = r.check_dense_f16(80.5).unwrap_err().to_string();
        assert!(e.contains("80.5") && e.contains("not comparable"), "{e}");
        let other =
            file(&d, "o.json", "Other (o.gguf)", vec![point("dense", "dense f16", "x", 1.0)]);
        let others = ReuseArgs { files: vec![other], only: false };
        let e = Reused::load(&others, KEY, true).err().unwrap().to_string();
        assert!(e.contains("no frontier leg") && e.contains("Other (o.gguf)"), "{e}");
        // In a run of several legs the file may be another leg's: skipped, and said so.
        let r = Reused::load(&others, KEY, false).unwrap();
        assert!(r.is_empty() && r.skipped()[0].contains("Other (o.gguf)"));
        let missing = d.join("missing.json");
        let e = Reused::load(&ReuseArgs { files: vec![missing], only: false }, KEY, false)
            .err()
            .unwrap();
        assert!(matches!(e, Error::Io { .. }), "{e}");
        let bad = d.join("bad.json");
        std::fs::write(&bad, "{ not json").unwrap();
        let e =
            Reused::load(&ReuseArgs { files: vec![bad], only: false }, KEY, false).err().unwrap();
        assert!(matches!(e, Error::Json { .. }), "{e}");
        let nan = d.join("nan.json");
        let text = std::fs::read_to_string(&a).unwrap().replace("80.0", "-1.0");
        std::fs::write(&nan, text).unwrap();
        let e =
            Reused::load(&ReuseArgs { files: vec![nan], only: false }, KEY, false).err().unwrap();
        assert!(e.to_string().contains("non-positive"), "{e}");
    }
}
