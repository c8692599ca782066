//! The studies' batched teacher forcing (`kvtide::reproduce::decode`): one model step for
//! several caches scores each as one cache at a time does, over one text and over several.

use std::path::PathBuf;

use kvtide::Error;
use models::cache::spec::CacheSpec;
use models::{Checkpoint, Session};

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../fixtures")
}

/// `teacher_force_batch` (one batched model step for several caches of one model) scores
/// every cache as `teacher_force` does one at a time, and `same_weights` tells which caches
/// may share a batch.
#[test]
fn batched_decode_matches_one_cache_at_a_time() {
    use kvtide::reproduce::decode::{teacher_force, teacher_force_batch};
    let ckpt = Checkpoint::load(&fixtures().join("tiny/llama-gqa")).unwrap();
    let ids: Vec<u32> = (0..48u32).map(|i| (i * 37 + 11) % 256).collect();
    let (prompt, targets) = ids.split_at(8);
    let groups: [&[&str]; 2] = [
        &["dense:format=f32", "dense:format=f16", "dense:format=bf16"],
        &[
            "swan:k=16,value=f32,b=0,basis=random:3",
            "swan:k=8,value=f16,b=4,basis=random:3",
            "swan:k=6,value=fp8,b=0,basis=random:3",
        ],
    ];
    let mut group_models = Vec::new();
    for specs in groups {
        let built: Vec<_> = specs
            .iter()
            .map(|s| s.parse::<CacheSpec>().unwrap().build(&ckpt.model).unwrap())
            .collect();
        let model = built[0].0.clone();
        for (m, _) in &built[1..] {
            assert!(model.same_weights(m).unwrap(), "{specs:?} share one model");
        }
        let mut caches: Vec<_> = built.into_iter().map(|(_, c)| c).collect();
        let batched = teacher_force_batch(&model, &mut caches, prompt, targets, true).unwrap();
        for (spec, b) in specs.iter().zip(&batched) {
            let (m, c) = spec.parse::<CacheSpec>().unwrap().build(&ckpt.model).unwrap();
            let mut session = Session::new(m, c).unwrap();
            let one = teacher_force(&mut session, prompt, targets, false).unwrap();
            assert_eq!(b.nll.len(), one.nll.len());
            assert_eq!(b.batch, specs.len());
            assert!(b.cache_s.is_some_and(|s| s > 0.0 && s <= b.decode_s + 1e-9));
            let worst = b.nll.iter().zip(&one.nll).map(|(x, y)| (x - y).abs()).fold(0.0, f64::max);
            assert!(worst < 1e-4, "{spec}: batched NLL differs by {worst:e}");
            assert_eq!(b.at_end.total(), one.at_end.total(), "{spec}: same bytes held");
            assert_eq!(b.samples.len(), b.steps, "{spec}: one sample per step");
        }
        group_models.push(model);
    }
    // Dense and SWAN-absorbed models differ (P_VO absorbed into W_V/W_O): no shared batch.
    assert!(!group_models[0].same_weights(&group_models[1]).unwrap());
    let build = |s: &str| s.parse::<CacheSpec>().unwrap().build(&ckpt.model).unwrap().0;
    let mixed = [groups[0][0], groups[1][0], groups[0][1], groups[1][2], "swan:k=8,basis=random:4"];
    let grouped = kvtide::reproduce::decode::group_by_weights(mixed.map(|s| Ok(build(s)))).unwrap();
    let members: Vec<Vec<usize>> = grouped.into_iter().map(|(_, m)| m).collect();
    assert_eq!(members, [vec![0, 2], vec![1, 3], vec![4]]);
    // A model that fails to build fails the grouping with its own error.
    let bad = "dense:format=nope".parse::<CacheSpec>().map_err(Error::from).map(|_| build("dense"));
    let failed = kvtide::reproduce::decode::group_by_weights([Ok(build("dense")), bad]);
    assert!(matches!(failed, Err(Error::Model(_))), "{:?}", failed.map(|g| g.len()));
    // A cache that already holds tokens, or an empty batch, is refused.
    let (m, mut c) = "dense:format=f32".parse::<CacheSpec>().unwrap().build(&ckpt.model).unwrap();
    let logits = m.prefill(prompt, Some(c.as_mut()), &mut models::llama::NoObserver, false);
    assert!(logits.is_ok() && !c.is_empty());
    let mut used = [c];
    for caches in [&mut used[..], &mut []] {
        assert!(matches!(
            teacher_force_batch(&m, caches, prompt, targets, false),
            Err(Error::InvalidInput { .. })
        ));
    }
}

/// `teacher_force_texts` (a different text per member of one batched step — the SWAN
/// study's evaluation windows) scores each member as `teacher_force` does on its own text,
/// and refuses texts that would decode at different positions.
#[test]
fn batched_decode_over_different_texts_matches_one_at_a_time() {
    use kvtide::reproduce::decode::{PromptPath, teacher_force, teacher_force_texts};
    let ckpt = Checkpoint::load(&fixtures().join("tiny/llama-gqa")).unwrap();
    let text =
        |seed: u32| -> Vec<u32> { (0..40u32).map(|i| (i * 37 + seed * 101) % 256).collect() };
    let windows = [text(1), text(2), text(3), text(1)];
    let texts: Vec<(&[u32], &[u32])> = windows.iter().map(|w| w.split_at(6)).collect();
    let specs = [
        "swan:k=16,value=f32,b=0,basis=random:3",
        "swan:k=8,value=f16,b=4,basis=random:3",
        "swan:k=6,value=fp8,b=0,basis=random:3",
        "swan:k=16,value=f32,b=0,basis=random:3",
    ];
    let built: Vec<_> =
        specs.iter().map(|s| s.parse::<CacheSpec>().unwrap().build(&ckpt.model).unwrap()).collect();
    let model = built[0].0.clone();
    let mut caches: Vec<_> = built.into_iter().map(|(_, c)| c).collect();
    let batched =
        teacher_force_texts(&model, &mut caches, &texts, PromptPath::Prefill, false, 1).unwrap();
    for ((spec, &(prompt, targets)), b) in specs.iter().zip(&texts).zip(&batched) {
        let (m, c) = spec.parse::<CacheSpec>().unwrap().build(&ckpt.model).unwrap();
        let mut session = Session::new(m, c).unwrap();
        let one = teacher_force(&mut session, prompt, targets, false).unwrap();
        let worst = b.nll.iter().zip(&one.nll).map(|(x, y)| (x - y).abs()).fold(0.0, f64::max);
        // f32 rows agree to matmul rounding; 16-bit and fp8 rows may round one stored
        // value to the neighbouring code when the batched matmul's last bit differs.
        let tol = if spec.contains("f32") { 1e-4 } else { 1e-3 };
        assert!(worst < tol, "{spec}: batched NLL differs by {worst:e}");
        assert_eq!(b.hit, one.hit, "{spec}: same arg-max hits");
        assert_eq!(b.batch, 4);
    }
    // Different texts give different scores (the rows really carry their own tokens).
    assert_ne!(batched[0].nll, batched[1].nll);
    // Serving the members from several threads (an even and an uneven split) changes
    // nothing: each cache attends on its own thread over the same matmul rows.
    for workers in [2, 3, 9] {
        let mut caches: Vec<_> = specs
            .iter()
            .map(|s| s.parse::<CacheSpec>().unwrap().build(&ckpt.model).unwrap().1)
            .collect();
        let threaded =
            teacher_force_texts(&model, &mut caches, &texts, PromptPath::Prefill, false, workers)
                .unwrap();
        for ((spec, t), b) in specs.iter().zip(&threaded).zip(&batched) {
            assert_eq!(t.nll, b.nll, "{spec}: {workers} workers");
            assert_eq!(t.hit, b.hit, "{spec}: {workers} workers");
            assert_eq!(t.at_end.total(), b.at_end.total(), "{spec}: {workers} workers");
        }
    }
    // Texts of unequal length, or fewer texts than caches, are refused.
    let short = &windows[0][..30];
    let uneven: Vec<(&[u32], &[u32])> = vec![texts[0], short.split_at(6)];
    let two = |s: &str| -> Vec<_> {
        (0..2).map(|_| s.parse::<CacheSpec>().unwrap().build(&ckpt.model).unwrap().1).collect()
    };
    let mut caches = two("dense:format=f32");
    assert!(matches!(
        teacher_force_texts(&model, &mut caches, &uneven, PromptPath::Prefill, false, 1),
        Err(Error::InvalidInput { .. })
    ));
    let mut caches = two("dense:format=f32");
    assert!(matches!(
        teacher_force_texts(&model, &mut caches, &texts[..1], PromptPath::Prefill, false, 1),
        Err(Error::InvalidInput { .. })
    ));
}

/// `PromptPath::Decode` feeds the prompt through the caches as the targets are fed: a text
/// split after 1 or after 6 tokens scores the shared positions identically (each position
/// is the same decode step either way), a lossless cache agrees with an exact prefill, and
/// an fp8 cache does not — its first position attends to its own rounded value row.
#[test]
fn a_prompt_through_the_decode_path_is_decoded_as_the_targets_are() {
    use kvtide::reproduce::decode::{PromptPath, teacher_force_texts};
    let ckpt = Checkpoint::load(&fixtures().join("tiny/llama-gqa")).unwrap();
    let window: Vec<u32> = (0..40u32).map(|i| (i * 37 + 5) % 256).collect();
    let run = |spec: &str, split: usize, path: PromptPath| {
        let (model, cache) = spec.parse::<CacheSpec>().unwrap().build(&ckpt.model).unwrap();
        let mut caches = vec![cache];
        let texts = [window.split_at(split)];
        teacher_force_texts(&model, &mut caches, &texts, path, false, 1).unwrap().remove(0).nll
    };
    for spec in ["dense:format=f32", "dense:format=fp8,rotate=hadamard"] {
        let one = run(spec, 1, PromptPath::Decode);
        let six = run(spec, 6, PromptPath::Decode);
        assert_eq!(one.len(), 39);
        let worst = one[5..].iter().zip(&six).map(|(x, y)| (x - y).abs()).fold(0.0, f64::max);
        assert!(worst < 1e-9, "{spec}: decoded prompts of 1 and 6 tokens differ by {worst:e}");
    }
    let exact = run("dense:format=f32", 1, PromptPath::Prefill);
    let decoded = run("dense:format=f32", 1, PromptPath::Decode);
    let worst = exact.iter().zip(&decoded).map(|(x, y)| (x - y).abs()).fold(0.0, f64::max);
    assert!(worst < 1e-4, "lossless cache: prefill and decoded prompt differ by {worst:e}");
    let exact = run("dense:format=fp8", 1, PromptPath::Prefill);
    let decoded = run("dense:format=fp8", 1, PromptPath::Decode);
    assert_ne!(exact, decoded, "the first position's own fp8 value reaches the scores");
}
