//! `kvtide reproduce` end to end at the smallest size: the Figure 2(a) study on the
//! real model writes its report, JSON and figures, and every enforced check passes. The
//! studies that decode thousands of tokens run in `kvtide reproduce --quick` (CI script).

use kvtide::reproduce::{ReproduceArgs, run};

#[test]
fn memory_study_writes_a_complete_report() {
    let model = kvtide::paths::default_model();
    if !model.exists() {
        eprintln!("skipping: {} not fetched (scripts/setup.sh)", model.display());
        return;
    }
    let out = std::env::temp_dir().join(format!("kvtide-reproduce-{}", std::process::id()));
    let args = ReproduceArgs {
        quick: true,
        reduced: false,
        out: out.clone(),
        model: Some(model),
        llama_cpp: None,
        further_models_only: false,
        primary_model_only: false,
        frontier_external_only: false,
        frontier_equal_footing: false,
        frontier_rotation_draws: None,
        frontier_draw_bases: Vec::new(),
        frontier_play: kvtide::reproduce::corpus::SWAN_EVAL_PLAY.into(),
        frontier_windows: None,
        frontier_grid: Default::default(),
        frontier_reuse: Default::default(),
        only: vec!["memory".into()],
    };
    let outcome = run(&args).expect("reproduce --only memory");
    assert!(outcome.passed(), "{:?}", outcome.checks);
    assert!(outcome.checks.iter().any(|c| c.name.contains("table and figure is present")));
    let report = std::fs::read_to_string(out.join("report.md")).expect("report.md");
    assert!(report.contains("figures/fig2a_bytes_per_vector.svg"), "{report}");
    for f in ["results.json", "figures/fig2a_bytes_per_vector.svg"] {
        assert!(std::fs::metadata(out.join(f)).is_ok_and(|m| m.len() > 0), "{f}");
    }
    std::fs::remove_dir_all(&out).ok();
}

#[test]
fn unknown_study_is_a_typed_error() {
    let args = ReproduceArgs {
        quick: true,
        reduced: false,
        out: std::env::temp_dir().join("kvtide-reproduce-unused"),
        model: Some("/nonexistent/model.gguf".into()),
        llama_cpp: None,
        further_models_only: false,
        primary_model_only: false,
        frontier_external_only: false,
        frontier_equal_footing: false,
        frontier_rotation_draws: None,
        frontier_draw_bases: Vec::new(),
        frontier_play: kvtide::reproduce::corpus::SWAN_EVAL_PLAY.into(),
        frontier_windows: None,
        frontier_grid: Default::default(),
        frontier_reuse: Default::default(),
        only: vec!["nonsense".into()],
    };
    assert!(run(&args).is_err());
}
