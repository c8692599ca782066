//! Every cache the spec language names runs through prefill and decode on the tiny models
//! with finite logits, reports sensible bytes, and bad specs are typed errors.

mod common;

use common::fixtures;
use models::spec::CacheSpec;
use models::{Checkpoint, Error, Session};

fn run(ckpt: &Checkpoint, spec: &str) -> (Session, f64) {
    let spec: CacheSpec = spec.parse().unwrap_or_else(|e| panic!("{spec}: {e}"));
    let (model, cache) = spec.build(&ckpt.model).unwrap_or_else(|e| panic!("{spec}: {e}"));
    let mut session = Session::new(model, cache).unwrap();
    let ids: Vec<u32> = (0..64u32).map(|i| (i * 53 + 7) % 256).collect();
    let scores = models::score(&mut session, &ids, 40, &mut |_, _| Ok(()), &mut |_| ())
        .unwrap_or_else(|e| panic!("{spec}: {e}"));
    assert!(scores.nll.iter().all(|x| x.is_finite()), "{spec}: non-finite loss");
    (session, scores.perplexity())
}

#[test]
fn every_policy_and_format_runs() {
    let ckpt = Checkpoint::load(&fixtures().join("tiny/llama-gqa")).unwrap();
    let (dense, _) = run(&ckpt, "dense:format=f32");
    let dense_bytes = dense.cache().bytes().total();
    // layers · kv_heads · 63 tokens held (the last one is only predicted) · d · f32 · (K, V)
    assert_eq!(dense_bytes, 2 * 2 * 63 * 16 * 4 * 2);
    for value in ["fp8", "f16", "bf16"] {
        let (s, _) = run(&ckpt, &format!("swan:k=8,value={value},b=8,basis=random:2"));
        assert!(
            s.cache().bytes().total() < dense_bytes,
            "swan {value} holds {}",
            s.cache().bytes().total()
        );
    }
    for policy in ["wnw", "full", "snapkv", "adakv", "audiokv", "arkvale"] {
        let spec = format!(
            "tiered:span=4..36,segment=4,chunk=8,policy={policy},r_gpu=0.5,n_voice=3,n_anchor=1,format=f32"
        );
        let (s, _) = run(&ckpt, &spec);
        let stats: std::collections::HashMap<_, _> = s.cache().stats().into_iter().collect();
        // Current r_GPU counts recalled chunks too; the target is the prefill retention.
        let (r, r0) = (stats["r_gpu"], stats["prefill_r_gpu"]);
        println!("{policy}: prefill r_gpu {r0:.3}, final r_gpu {r:.3}");
        assert!(r > 0.0 && r <= 1.0, "{policy}: r_gpu {r}");
        // ArkVale keeps whole 32-token pages: this 32-token span is one page, always kept.
        if policy != "full" && policy != "arkvale" {
            assert!((r0 - 0.5).abs() < 0.15, "{policy}: prefill r_gpu {r0} for target 0.5");
        }
    }
    let spec = "swan+tiered:k=8,basis=random:4,span=4..36,segment=4,chunk=8,r_gpu=0.5,n_voice=3,n_anchor=1";
    let (s, _) = run(&ckpt, spec);
    assert!(s.cache().bytes().offloaded > 0, "tidal heads keep a host copy");
}

#[test]
fn bad_specs_are_typed_errors() {
    for bad in [
        "lru",
        "swan:k=x",
        "swan:value=int4",
        "swan:basis=spiral",
        "dense:format=fp8",
        "tiered",
        "tiered:span=9..3",
        "tiered:span=0..8,r_gpu=0",
        "tiered:span=0..8,delta=-1",
        "swan:k=8,k=9",
        "dense:threads=0",
    ] {
        assert!(matches!(bad.parse::<CacheSpec>(), Err(Error::CacheSpec { .. })), "{bad} parsed");
    }
    let ckpt = Checkpoint::load(&fixtures().join("tiny/llama-gqa")).unwrap();
    let too_big: CacheSpec = "swan:k=17,basis=identity".parse().unwrap();
    assert!(too_big.build(&ckpt.model).is_err(), "k > head_dim must be rejected");
    let missing: CacheSpec = "swan:proj=/nonexistent.safetensors".parse().unwrap();
    assert!(matches!(missing.build(&ckpt.model), Err(Error::CacheSpec { .. })));
    let outside: CacheSpec = "tiered:span=60..100".parse().unwrap();
    let (model, cache) = outside.build(&ckpt.model).unwrap();
    let mut session = Session::new(model, cache).unwrap();
    assert!(session.prefill(&[1, 2, 3, 4]).is_err(), "span outside the prompt");
}

/// `teacher_force_batch` (one batched model step for several caches of one model) scores
/// every cache as `teacher_force` does one at a time, and `same_weights` tells which caches
/// may share a batch.
#[test]
fn batched_decode_matches_one_cache_at_a_time() {
    use models::reproduce::decode::{teacher_force, teacher_force_batch};
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
    let grouped = models::reproduce::decode::group_by_weights(mixed.map(build)).unwrap();
    let members: Vec<Vec<usize>> = grouped.into_iter().map(|(_, m)| m).collect();
    assert_eq!(members, [vec![0, 2], vec![1, 3], vec![4]]);
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
    use models::reproduce::decode::{teacher_force, teacher_force_texts};
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
    let batched = teacher_force_texts(&model, &mut caches, &texts, false).unwrap();
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
    // Texts of unequal length, or fewer texts than caches, are refused.
    let short = &windows[0][..30];
    let uneven: Vec<(&[u32], &[u32])> = vec![texts[0], short.split_at(6)];
    let two = |s: &str| -> Vec<_> {
        (0..2).map(|_| s.parse::<CacheSpec>().unwrap().build(&ckpt.model).unwrap().1).collect()
    };
    let mut caches = two("dense:format=f32");
    assert!(matches!(
        teacher_force_texts(&model, &mut caches, &uneven, false),
        Err(Error::InvalidInput { .. })
    ));
    let mut caches = two("dense:format=f32");
    assert!(matches!(
        teacher_force_texts(&model, &mut caches, &texts[..1], false),
        Err(Error::InvalidInput { .. })
    ));
}

/// `CacheSpec::build_many` gives `n` fresh caches for one model equal to `build`'s.
#[test]
fn build_many_gives_fresh_caches_for_one_model() {
    let ckpt = Checkpoint::load(&fixtures().join("tiny/llama-gqa")).unwrap();
    for text in ["dense:format=f16", "swan:k=8,value=fp8,b=4,basis=random:3"] {
        let spec: CacheSpec = text.parse().unwrap();
        let (one, _) = spec.build(&ckpt.model).unwrap();
        let (model, caches) = spec.build_many(&ckpt.model, 3).unwrap();
        assert_eq!(caches.len(), 3, "{text}");
        assert!(caches.iter().all(|c| c.is_empty()), "{text}: fresh caches");
        assert!(model.same_weights(&one).unwrap(), "{text}: same model as build");
    }
}
