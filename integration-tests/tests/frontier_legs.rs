//! The frontier study's per-model legs end to end without the Gemma file: in a cache
//! directory holding only SmolLM2, `kvtide reproduce --only frontier --further-models-only`
//! skips the Gemma 3 leg with its reason written into the report (never silently), and the
//! completeness check covers only the legs that ran. (Its own test binary: it sets
//! `KVTIDE_CACHE`.)

use kvtide::reproduce::{ReproduceArgs, run};

#[test]
fn a_missing_gemma_model_is_a_reported_skip() {
    let smollm2 = kvtide::paths::default_model();
    if !smollm2.exists() {
        eprintln!("skipping: {} not fetched (scripts/setup.sh)", smollm2.display());
        return;
    }
    let cache = std::env::temp_dir().join(format!("kvtide-frontier-legs-{}", std::process::id()));
    std::fs::create_dir_all(cache.join("models")).expect("cache dir");
    // SAFETY: this test binary runs this one test; nothing else reads the environment.
    unsafe { std::env::set_var("KVTIDE_CACHE", &cache) };
    let gemma = kvtide::paths::gemma_model();
    assert!(gemma.starts_with(&cache) && !gemma.exists());
    let out = cache.join("out");
    let args = ReproduceArgs {
        quick: true,
        reduced: false,
        out: out.clone(),
        model: Some(smollm2),
        llama_cpp: None,
        further_models_only: true,
        primary_model_only: false,
        frontier_external_only: false,
        frontier_equal_footing: false,
        frontier_rotation_draws: None,
        frontier_draw_bases: Vec::new(),
        frontier_play: kvtide::reproduce::corpus::SWAN_EVAL_PLAY.into(),
        frontier_windows: None,
        frontier_grid: Default::default(),
        frontier_reuse: Default::default(),
        only: vec!["frontier".into()],
    };
    let outcome = run(&args).expect("reproduce --only frontier --further-models-only");
    assert!(outcome.passed(), "{:?}", outcome.checks);
    let report = std::fs::read_to_string(out.join("report.md")).expect("report.md");
    assert!(report.contains("Frontier on Gemma 3 270M: skipped"), "{report}");
    assert!(report.contains("frontier: the Gemma 3 270M leg is skipped: "), "{report}");
    assert!(report.contains("scripts/setup.sh gemma"), "{report}");
    assert!(!report.contains("perplexity vs KV bytes against quantized dense KV"), "{report}");
    std::fs::remove_dir_all(&cache).ok();
}
