//! The frontier study assembled from parts, end to end on SmolLM2 (quick size): a run
//! restricted to int8 SWAN rows, then a run over int8 and fp8 rows with
//! `--frontier-reuse <first results.json> --frontier-reuse-only` — the int8 rows take the
//! first run's figures (named per point), the fp8 rows no file measured are listed as left
//! out, the dense rows run again and agree, and the report says where the figures came from.

use kvtide::reproduce::frontier::SwanGrid;
use kvtide::reproduce::frontier_reuse::ReuseArgs;
use kvtide::reproduce::{ReproduceArgs, run};
use serde_json::Value;

fn args(out: std::path::PathBuf, values: &[&str], reuse: ReuseArgs) -> ReproduceArgs {
    ReproduceArgs {
        quick: true,
        reduced: false,
        out,
        model: None,
        llama_cpp: None,
        further_models_only: false,
        primary_model_only: true,
        frontier_external_only: false,
        frontier_equal_footing: false,
        frontier_rotation_draws: None,
        frontier_draw_bases: Vec::new(),
        frontier_play: kvtide::reproduce::corpus::SWAN_EVAL_PLAY.into(),
        frontier_windows: None,
        frontier_grid: SwanGrid {
            k_eighths: vec![2],
            values: values.iter().map(|v| (*v).to_owned()).collect(),
            ..SwanGrid::default()
        },
        frontier_reuse: reuse,
        only: vec!["frontier".into()],
    }
}

fn points(dir: &std::path::Path) -> (Value, Vec<Value>) {
    let text = std::fs::read_to_string(dir.join("results.json")).expect("results.json");
    let doc: Value = serde_json::from_str(&text).expect("json");
    let leg = doc["frontier"].clone();
    let points = leg["points"].as_array().expect("points").clone();
    (leg, points)
}

#[test]
fn a_grid_measured_in_parts_is_assembled_with_its_sources_named() {
    if !kvtide::paths::default_model().exists() {
        eprintln!("skipping: the SmolLM2 GGUF is not fetched (scripts/setup.sh)");
        return;
    }
    let dir = std::env::temp_dir().join(format!("kvtide-frontier-reuse-{}", std::process::id()));
    let (first, second) = (dir.join("int8"), dir.join("assembled"));
    let outcome = run(&args(first.clone(), &["int8"], ReuseArgs::default())).expect("first part");
    assert!(outcome.passed(), "{:?}", outcome.checks);
    let (_, measured) = points(&first);
    let swan = |p: &&Value| p["run"]["family"] == "swan";
    assert!(measured.iter().filter(swan).count() >= 2, "{measured:?}");

    let file = first.join("results.json");
    let reuse = ReuseArgs { files: vec![file.clone()], only: true };
    let outcome = run(&args(second.clone(), &["int8", "fp8"], reuse)).expect("assembled run");
    assert!(outcome.passed(), "{:?}", outcome.checks);
    let (leg, assembled) = points(&second);
    // Every int8 SWAN point is the first run's, named; no fp8 point was measured.
    for p in measured.iter().filter(swan) {
        let q = assembled.iter().find(|q| q["label"] == p["label"]).expect("reused point");
        assert_eq!(q["perplexity"], p["perplexity"], "{}", p["label"]);
        assert_eq!(q["window_bytes"], p["window_bytes"], "{}", p["label"]);
        assert_eq!(q["reused_from"].as_str(), Some(file.to_str().unwrap()));
    }
    assert_eq!(assembled.iter().filter(swan).count(), measured.iter().filter(swan).count());
    assert!(assembled.iter().all(|p| p["run"]["values"] != "fp8" || p["run"]["family"] != "swan"));
    let not_run: Vec<&str> =
        leg["not_run"].as_array().expect("not_run").iter().filter_map(Value::as_str).collect();
    assert!(!not_run.is_empty() && not_run.iter().all(|l| l.contains("fp8")), "{not_run:?}");
    // The dense rows ran again, and agree with the first run's.
    let dense = |pts: &[Value]| -> Vec<(String, f64)> {
        pts.iter()
            .filter(|p| p["run"]["family"] == "dense")
            .map(|p| (p["label"].to_string(), p["perplexity"].as_f64().unwrap()))
            .collect()
    };
    let (a, b) = (dense(&measured), dense(&assembled));
    assert_eq!(a.len(), b.len());
    for ((la, pa), (lb, pb)) in a.iter().zip(&b) {
        assert_eq!(la, lb);
        assert!((pa / pb - 1.0).abs() < 1e-3, "{la}: {pa} vs {pb}");
    }
    assert!(b.iter().all(|(_, p)| p.is_finite()));
    let source = &leg["reused"][0];
    assert_eq!(
        source["configurations"].as_u64(),
        Some(measured.iter().filter(swan).count() as u64)
    );
    let report = std::fs::read_to_string(second.join("report.md")).expect("report.md");
    assert!(report.contains("take their figures from earlier runs"), "{report}");
    assert!(report.contains("left out (`--frontier-reuse-only`)"), "{report}");
    std::fs::remove_dir_all(&dir).ok();
}
