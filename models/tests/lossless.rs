//! Losslessness end to end (the project's core property, DESIGN.md): SWAN with every
//! component kept (k = d_h), f32 values and any orthogonal basis, and the WnW store in its
//! lossless mode (retention 1, every chunk selected, δ = ∞), score a text through the
//! decode path with the same next-token arg-max at every position as the dense cache and
//! logits within 1e-3. Checked on the tiny fixtures (every architecture, every basis kind
//! that needs no calibration file) and on SmolLM2-135M over a 512-token play excerpt.

mod common;

use common::fixtures;
use models::{Checkpoint, Session};
use tch::Tensor;

const TOL: f64 = 1e-3;

/// Logits `[vocab]` predicting `ids[p]` for every `p ≥ prefix`, through the decode path.
fn logits(ckpt: &Checkpoint, spec: &str, ids: &[u32], prefix: usize) -> Vec<Tensor> {
    let spec: models::cache::spec::CacheSpec = spec.parse().unwrap();
    let (model, cache) = spec.build(&ckpt.model).unwrap();
    let mut session = Session::new(model, cache).unwrap();
    let mut out = Vec::new();
    models::score(
        &mut session,
        ids,
        prefix,
        &mut |_, l| {
            out.push(l.copy());
            Ok(())
        },
        &mut |_| (),
    )
    .unwrap();
    out
}

/// Compares `got` against the dense logits `want` (aligned at their ends) and returns the
/// largest deviation.
fn compare(what: &str, want: &[Tensor], got: &[Tensor]) -> f64 {
    let want = &want[want.len() - got.len()..];
    let mut worst = 0f64;
    for (p, (a, b)) in want.iter().zip(got).enumerate() {
        assert_eq!(
            a.argmax(0, false).int64_value(&[]),
            b.argmax(0, false).int64_value(&[]),
            "{what}: arg-max differs at step {p}"
        );
        worst = worst.max((a - b).abs().max().double_value(&[]));
    }
    assert!(worst <= TOL, "{what}: max abs logit difference {worst:e}");
    worst
}

#[test]
fn tiny_models_every_lossless_cache_matches_dense() {
    for name in ["llama-gqa", "llama-mha", "llama3-rope", "qwen2", "qwen2-tied"] {
        let ckpt = Checkpoint::load(&fixtures().join("tiny").join(name)).unwrap();
        let ids: Vec<u32> =
            (0..48u32).map(|i| (i * 37 + 11) % ckpt.config.vocab_size as u32).collect();
        let d = ckpt.config.head_dim;
        let dense = logits(&ckpt, "dense:format=f32,threads=1", &ids, 1);
        for basis in ["identity", "random:3", "hadamard"] {
            for index in ["list", "bitmask"] {
                let spec = format!(
                    "swan:k={d},kv={d},index={index},value=f32,buffer=f32,b=4,basis={basis},threads=1"
                );
                compare(&format!("{name} {spec}"), &dense, &logits(&ckpt, &spec, &ids, 1));
            }
        }
        // SWAN's sink keeps its first positions in f32 beside the buffer: lossless with every
        // component kept (the sink spans the prefill and the first steps), and lossless
        // whatever the sparse rows round when every position stays inside the sink.
        for spec in [
            format!(
                "swan:k={d},kv={d},index=bitmask,value=f32,buffer=f32,b=4,basis=random:3,sink=3,threads=1"
            ),
            "swan:k=2,kv=2,index=bitmask,value=int4,buffer=f32,b=2,basis=random:3,sink=48,threads=1"
                .to_string(),
        ] {
            compare(&format!("{name} {spec}"), &dense, &logits(&ckpt, &spec, &ids, 1));
        }
        // A rotated dense cache is the same attention in another orthonormal basis.
        for rotate in [
            "hadamard",
            "hadamard-v",
            "hadamard-signs:2",
            "hadamard-value-signs:3",
            "hadamard-jitter:1",
            "random:4",
        ] {
            let spec = format!("dense:format=f32,rotate={rotate},threads=1");
            compare(&format!("{name} {spec}"), &dense, &logits(&ckpt, &spec, &ids, 1));
        }
        let tiered = logits(
            &ckpt,
            "tiered:span=4..20,segment=4,chunk=8,format=f32,lossless,threads=1",
            &ids,
            24,
        );
        compare(&format!("{name} tiered lossless"), &dense, &tiered);
        let spec = format!(
            "swan+tiered:k={d},value=f32,buffer=f32,basis=random:5,span=4..20,segment=4,chunk=8,format=f32,lossless,threads=1"
        );
        compare(&format!("{name} {spec}"), &dense, &logits(&ckpt, &spec, &ids, 24));
    }
}

/// A buffered quantized dense cache whose `f32` buffer holds every position never quantizes
/// a row: its logits are the dense `f32` cache's bit for bit (in the same basis), for every
/// codec, rotated or not (with a sink, within rounding); a shorter buffer is not.
#[test]
fn tiny_buffered_quantized_cache_holding_every_position_is_dense_bit_for_bit() {
    let ckpt = Checkpoint::load(&fixtures().join("tiny").join("llama-mha")).unwrap();
    let ids: Vec<u32> = (0..48u32).map(|i| (i * 37 + 11) % ckpt.config.vocab_size as u32).collect();
    for rotate in ["none", "hadamard"] {
        let dense = logits(&ckpt, &format!("dense:format=f32,rotate={rotate},threads=1"), &ids, 1);
        for format in ["int8", "int4", "fp8"] {
            let spec = format!("dense:format={format},rotate={rotate},b=48,buffer=f32,threads=1");
            let got = logits(&ckpt, &spec, &ids, 1);
            assert_eq!(got.len(), dense.len(), "{spec}");
            for (p, (a, b)) in dense.iter().zip(&got).enumerate() {
                assert!(a.equal(b), "{spec}: logits at step {p} differ from dense f32");
            }
            // A sink's rows stream apart from the buffer's: the same attention, another
            // summation order.
            let sunk = format!("{spec},sink=2");
            compare(&sunk, &dense, &logits(&ckpt, &sunk, &ids, 1));
            let short = format!("dense:format={format},rotate={rotate},b=8,buffer=f32,threads=1");
            let got = logits(&ckpt, &short, &ids, 1);
            assert!(dense.iter().zip(&got).any(|(a, b)| !a.equal(b)), "{short}: nothing quantized");
        }
    }
}

/// KIVI and TurboQuant-style caches whose `f32` buffer holds every position never code a
/// row: their logits are the dense `f32` cache's (in the same basis) bit for bit; a shorter
/// buffer codes rows and is not.
#[test]
fn tiny_coded_caches_holding_every_position_are_dense_bit_for_bit() {
    let ckpt = Checkpoint::load(&fixtures().join("tiny").join("llama-mha")).unwrap();
    let ids: Vec<u32> = (0..48u32).map(|i| (i * 37 + 11) % ckpt.config.vocab_size as u32).collect();
    let plain = logits(&ckpt, "dense:format=f32,threads=1", &ids, 1);
    let random = logits(&ckpt, "dense:format=f32,rotate=random:0,threads=1", &ids, 1);
    for (spec, dense) in [
        ("kivi:bits=2,group=8", &plain),
        ("kivi:bits=4,group=32", &plain),
        ("turbo:bits=2", &random),
        ("turbo:bits=3", &random),
        ("turbo:bits=4,rotate=none", &plain),
        ("turbo:bits=3,qjl=on", &random),
    ] {
        let full = format!("{spec},b=48,buffer=f32,threads=1");
        let got = logits(&ckpt, &full, &ids, 1);
        for (p, (a, b)) in dense.iter().zip(&got).enumerate() {
            assert!(a.equal(b), "{full}: logits at step {p} differ from dense f32");
        }
        let short = format!("{spec},b=8,buffer=f32,threads=1");
        let got = logits(&ckpt, &short, &ids, 1);
        assert!(dense.iter().zip(&got).any(|(a, b)| !a.equal(b)), "{short}: nothing coded");
    }
}

/// SmolLM2-135M and the first `tokens` token ids of the first `chars` characters of Macbeth.
fn smollm2_macbeth(chars: usize, tokens: usize) -> (Checkpoint, Vec<u32>) {
    let path = common::default_model();
    assert!(path.is_file(), "{} missing: run scripts/setup.sh", path.display());
    let ckpt = Checkpoint::load(&path).unwrap();
    let text = models::load::text::read_text(&common::plays_dir().join("macbeth.md")).unwrap();
    let mut ids = ckpt.tokenizer.as_ref().unwrap().encode(&text[..chars]).unwrap();
    ids.truncate(tokens);
    assert_eq!(ids.len(), tokens, "{chars} characters of Macbeth give too few tokens");
    (ckpt, ids)
}

#[test]
fn smollm2_512_tokens_swan_and_tiered_lossless_match_dense() {
    let (ckpt, ids) = smollm2_macbeth(6000, 512);
    let ids = &ids[..];
    // Dense attention over the full K/V: the libtorch prefill (whose decode path matches it
    // and transformers, see parity tests); row p − 1 predicts ids[p].
    let all = ckpt.model.prefill(ids, None, &mut models::llama::NoObserver, true).unwrap();
    let dense: Vec<Tensor> = (0..511).map(|p| all.get(p)).collect();
    // Prefill 256 tokens (224 of them pruned into sparse rows behind a 32-token buffer), then
    // decode 256 steps that attend over them: both store paths are checked, in half the
    // decode steps of a 1-token prefix.
    let swan = logits(&ckpt, "swan:k=64,kv=64,value=f32,buffer=f32,b=32,basis=random:11", ids, 256);
    let e1 = compare("swan k=64 f32 random basis", &dense, &swan);
    let spec = "swan:k=64,kv=64,index=bitmask,value=f32,buffer=f32,b=32,basis=hadamard";
    let e3 =
        compare("swan bitmask k=64 f32 hadamard basis", &dense, &logits(&ckpt, spec, ids, 256));
    let tiered = logits(&ckpt, "tiered:span=16..240,format=f32,lossless", ids, 256);
    let e2 = compare("tiered lossless", &dense, &tiered);
    println!(
        "SmolLM2 512 tokens: swan max |Δlogit| {e1:.2e}, swan bitmask {e3:.2e}, tiered {e2:.2e}"
    );
}

#[test]
fn smollm2_decode_logits_do_not_depend_on_the_cache_threads() {
    // The decode step runs its matrix–vector products on the cache's attention threads;
    // like the attention kernels, they give the same bits on one thread as on two.
    let (ckpt, ids) = smollm2_macbeth(1000, 96);
    let ids = &ids[..];
    for spec in ["dense:format=f16", "swan:k=32,kv=32,index=bitmask,value=int8,b=16,basis=hadamard"]
    {
        let one = logits(&ckpt, &format!("{spec},threads=1"), ids, 64);
        let two = logits(&ckpt, &format!("{spec},threads=2"), ids, 64);
        assert_eq!(one.len(), two.len());
        for (p, (a, b)) in one.iter().zip(&two).enumerate() {
            assert!(a.equal(b), "{spec}: logits at step {p} differ between 1 and 2 threads");
        }
    }
}

/// Query-weighted key selection (`select=query`) on a calibrated tiny model: at k = d_h it is
/// still the lossless setting (dense logits); at k = d_h/2 it keeps other components than the
/// magnitude rule (different logits); on a basis without query energies it is a typed error.
#[test]
fn tiny_query_selected_keys_are_lossless_at_full_k_and_need_query_energies() {
    let ckpt = Checkpoint::load(&fixtures().join("tiny").join("llama-gqa")).unwrap();
    let vocab = ckpt.config.vocab_size as u32;
    let calib: Vec<u32> = (0..96u32).map(|i| (i * 53 + 7) % vocab).collect();
    let dir = tempfile::tempdir().unwrap();
    let (set, proj) = common::calibrated_projection(&ckpt, &calib, dir.path());
    assert!(set.basis(projection::Stream::Qk, 0, 0).unwrap().query_energy().is_some());
    let proj = proj.display();

    let ids: Vec<u32> = (0..48u32).map(|i| (i * 37 + 11) % vocab).collect();
    let d = ckpt.config.head_dim;
    let dense = logits(&ckpt, "dense:format=f32,threads=1", &ids, 1);
    let full = format!(
        "swan:k={d},kv={d},value=f32,buffer=f32,b=4,basis=calibrated,proj={proj},select=query,threads=1"
    );
    compare("tiny select=query k=d_h", &dense, &logits(&ckpt, &full, &ids, 1));

    let half = |select: &str| {
        let spec = format!(
            "swan:k={},kv={d},value=f32,buffer=f32,b=4,basis=calibrated,proj={proj},select={select},threads=1",
            d / 2
        );
        logits(&ckpt, &spec, &ids, 1)
    };
    let (magnitude, query) = (half("magnitude"), half("query"));
    assert!(
        magnitude.iter().zip(&query).any(|(a, b)| !a.equal(b)),
        "query-weighted selection kept exactly the magnitude rule's components"
    );

    for basis in ["identity", "hadamard"] {
        let spec: models::cache::spec::CacheSpec =
            format!("swan:k=8,basis={basis},select=query").parse().unwrap();
        let err = spec.build(&ckpt.model).err().expect("a basis without query energies is refused");
        assert!(err.to_string().contains("select=query"), "{basis}: {err}");
    }
}

/// Component scaling (`norm=eigen`) on a calibrated tiny model: the scales are powers of two,
/// so with f32 rows the cache computes bit for bit what it computes without them — at k = d_h
/// (the lossless setting, equal to dense) and at k = d_h/2 (the same components kept: the
/// selection sees the original magnitudes) — while an int8 row code, whose one scale per row
/// now fits normalised components, rounds differently; a basis without eigenvalues is a typed
/// error.
#[test]
fn tiny_component_scaling_is_exact_with_f32_rows_and_needs_eigenvalues() {
    let ckpt = Checkpoint::load(&fixtures().join("tiny").join("llama-gqa")).unwrap();
    let vocab = ckpt.config.vocab_size as u32;
    let calib: Vec<u32> = (0..96u32).map(|i| (i * 53 + 7) % vocab).collect();
    let dir = tempfile::tempdir().unwrap();
    let (_, proj) = common::calibrated_projection(&ckpt, &calib, dir.path());
    let proj = proj.display();

    let ids: Vec<u32> = (0..48u32).map(|i| (i * 37 + 11) % vocab).collect();
    let d = ckpt.config.head_dim;
    let dense = logits(&ckpt, "dense:format=f32,threads=1", &ids, 1);
    let run = |k: usize, value: &str, extra: &str| {
        let spec = format!(
            "swan:k={k},kv={k},value={value},buffer=f32,b=4,basis=calibrated,proj={proj},threads=1{extra}"
        );
        logits(&ckpt, &spec, &ids, 1)
    };
    let same = |what: &str, a: &[Tensor], b: &[Tensor]| {
        assert_eq!(a.len(), b.len());
        for (p, (x, y)) in a.iter().zip(b).enumerate() {
            assert!(x.equal(y), "{what}: logits differ at step {p}");
        }
    };
    let full = run(d, "f32", ",norm=eigen");
    compare("tiny norm=eigen k=d_h", &dense, &full);
    same("norm=eigen k=d_h", &run(d, "f32", ""), &full);
    same("norm=eigen k=d_h/2", &run(d / 2, "f32", ""), &run(d / 2, "f32", ",norm=eigen"));
    same(
        "norm=eigen select=query k=d_h/2",
        &run(d / 2, "f32", ",select=query"),
        &run(d / 2, "f32", ",select=query,norm=eigen"),
    );
    let (plain, scaled) = (run(d, "int8", ""), run(d, "int8", ",norm=eigen"));
    assert!(
        plain.iter().zip(&scaled).any(|(a, b)| !a.equal(b)),
        "int8 rows rounded the same with and without component scales"
    );

    for basis in ["identity", "hadamard"] {
        let spec: models::cache::spec::CacheSpec =
            format!("swan:k=8,basis={basis},norm=eigen").parse().unwrap();
        let err = spec.build(&ckpt.model).err().expect("a basis without eigenvalues is refused");
        assert!(err.to_string().contains("norm=eigen"), "{basis}: {err}");
    }
}
