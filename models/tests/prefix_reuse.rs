//! Prefix reuse: a cache saved after the prompt and reopened (memory-mapped, validated)
//! continues with exactly the tokens and logits of the in-memory session, for dense,
//! quantized and SWAN caches on the tiny fixtures and on SmolLM2 (reading their saved rows
//! where the file maps them), also after being saved again
//! mid-continuation; a file for another model, projection or format, a truncated or
//! corrupt file, are typed errors; a failed load leaves the cache it targeted as it was.

mod common;

use std::sync::Arc;

use common::fixtures;
use kv_sparse::persist::MappedCache;
use models::cache::persist::{self, CacheIdentity, Prefix};
use models::cache::spec::CacheSpec;
use models::cache::{KvCache, StepQkv};
use models::llama::NoObserver;
use models::llama::host::to_f32_vec;
use models::session::generate::argmax;
use models::{Checkpoint, Error, Session};

/// Greedy tokens and every step's logits after `logits`, for `steps` decode steps.
fn continue_greedy(
    session: &mut Session,
    logits: Vec<f32>,
    steps: usize,
) -> (Vec<u32>, Vec<Vec<f32>>) {
    let (mut ids, mut all) = (Vec::new(), vec![logits]);
    for _ in 0..steps {
        let t = tch::Tensor::from_slice(all.last().unwrap());
        let id = argmax(&t).unwrap();
        ids.push(id);
        all.push(to_f32_vec(&session.decode(id).unwrap()).unwrap());
    }
    (ids, all)
}

fn session(ckpt: &Checkpoint, spec: &str) -> (Session, CacheIdentity) {
    let spec: CacheSpec = spec.parse().unwrap_or_else(|e| panic!("{spec}: {e}"));
    let (model, cache) = spec.build(&ckpt.model).unwrap_or_else(|e| panic!("{spec}: {e}"));
    let identity = CacheIdentity::of(&ckpt.model, cache.as_ref()).unwrap();
    (Session::new(model, cache).unwrap(), identity)
}

/// Saves after the prefill of `prompt`, reopens through the memory map into a fresh
/// session, and checks both continuations agree bit for bit; then saves the reopened,
/// continued cache again and checks a third session continuing from that file agrees
/// too. Returns the first file's bytes.
fn round_trip(ckpt: &Checkpoint, spec: &str, prompt: &[u32], steps: usize) -> Vec<u8> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("prefix.kvs");
    let (mut a, identity) = session(ckpt, spec);
    let logits = to_f32_vec(&a.prefill(prompt).unwrap()).unwrap();
    let prefix = Prefix { ids: prompt.to_vec(), logits: logits.clone() };
    persist::save(&path, &identity, a.cache(), &prefix).unwrap();
    let (ids_a, logits_a) = continue_greedy(&mut a, logits, steps);

    let (mut b, identity_b) = session(ckpt, spec);
    assert_eq!(identity, identity_b, "{spec}: the identity is a function of model, set and spec");
    // SAFETY: the file lives in a private temporary directory nothing else writes.
    let file = Arc::new(unsafe { MappedCache::open(&path) }.unwrap());
    let saved = b.resume(&file, &identity).unwrap_or_else(|e| panic!("{spec}: {e}"));
    drop(file);
    assert_eq!(saved, prefix);
    assert_eq!(b.position(), prompt.len());
    assert_eq!(b.cache().len(), prompt.len());
    assert_eq!(b.cache().bytes(), {
        let (mut c, _) = session(ckpt, spec);
        let _ = c.prefill(prompt).unwrap();
        c.cache().bytes()
    });
    let half = steps / 2;
    let (mut ids_b, mut logits_b) = continue_greedy(&mut b, saved.logits, half);
    // Save the reopened cache after `half` steps (its history partly still in the first
    // file's map), reopen that into a third session, and continue both.
    let again = dir.path().join("continued.kvs");
    let mut ids = prompt.to_vec();
    ids.extend(&ids_b);
    let last = logits_b.pop().unwrap();
    persist::save(&again, &identity, b.cache(), &Prefix { ids: ids.clone(), logits: last.clone() })
        .unwrap_or_else(|e| panic!("{spec}: saving a reopened cache: {e}"));
    let (mut c, _) = session(ckpt, spec);
    // SAFETY: as above.
    let file = Arc::new(unsafe { MappedCache::open(&again) }.unwrap());
    let resumed = c.resume(&file, &identity).unwrap_or_else(|e| panic!("{spec}: {e}"));
    assert_eq!(resumed.ids, ids);
    let (ids_rest, logits_rest) = continue_greedy(&mut b, last.clone(), steps - half);
    let (ids_c, logits_c) = continue_greedy(&mut c, last, steps - half);
    ids_b.extend(ids_rest);
    logits_b.extend(logits_rest);
    assert_eq!(ids_a, ids_b, "{spec}: tokens");
    for (step, (x, y)) in logits_a.iter().zip(&logits_b).enumerate() {
        let same = x.iter().zip(y).all(|(p, q)| p.to_bits() == q.to_bits());
        assert!(same, "{spec}: logits of step {step} differ");
    }
    assert_eq!(ids_c, ids_a[half..], "{spec}: tokens after the second reopen");
    for (step, (x, y)) in logits_a[half..].iter().zip(&logits_c).enumerate() {
        let same = x.iter().zip(y).all(|(p, q)| p.to_bits() == q.to_bits());
        assert!(same, "{spec}: logits of step {} after the second reopen differ", half + step);
    }
    std::fs::read(&path).unwrap()
}

fn prompt(n: u32) -> Vec<u32> {
    (0..n).map(|i| (i * 53 + 7) % 256).collect()
}

#[test]
fn reopened_caches_continue_exactly_as_in_memory_on_the_tiny_models() {
    let gqa = Checkpoint::load(&fixtures().join("tiny/llama-gqa")).unwrap();
    let wide = Checkpoint::load(&fixtures().join("tiny/llama-mha")).unwrap();
    let p = prompt(24);
    for spec in ["dense", "dense:format=f32", "dense:format=bf16,rotate=hadamard"] {
        round_trip(&gqa, spec, &p, 8);
    }
    for spec in ["dense:format=int8", "dense:format=int4,rotate=hadamard", "dense:format=fp8"] {
        round_trip(&wide, spec, &p, 8);
    }
    // b = 4 with a 24-token prompt: most of the prompt sits in the sparse history, and
    // the decode steps evict reopened buffer rows onto the reopened history.
    for index in ["list", "bitmask"] {
        for value in ["f32", "f16", "bf16", "fp8", "int8", "int4"] {
            let spec = format!("swan:k=8,index={index},value={value},b=4,basis=random:5");
            round_trip(&gqa, &spec, &p, 8);
        }
    }
    round_trip(&gqa, "swan:k=6,kv=4,value=fp8,scale=auto,buffer=f32,b=0,basis=random:1", &p, 6);
    round_trip(&wide, "swan:k=16,index=bitmask,value=int8,b=3,basis=hadamard", &p, 6);
    // The whole-row histories behind a buffer: the decode steps evict reopened buffer rows
    // onto the reopened history; KIVI's groups of 8 leave keys waiting across the reopen.
    for spec in [
        "dense:format=int8,rotate=hadamard,b=4",
        "dense:format=int4,b=5,buffer=bf16",
        "dense:format=fp8,b=3,buffer=f32",
        "kivi:bits=2,group=8,b=4",
        "kivi:bits=4,group=16,b=6,rotate=hadamard",
        "turbo:bits=3,b=4",
        "turbo:bits=2,b=0,rotate=hadamard",
        "turbo:bits=4,b=4,buffer=f32",
        "turbo:bits=3,qjl=on,b=4",
    ] {
        round_trip(&wide, spec, &p, 8);
    }
}

/// A history longer than one block (256 rows at d = 16): the reopened SWAN cache attends
/// its first 256 rows of every head where the file maps them and copies only the rest; a
/// reopened dense or quantized cache reads all its saved rows from the map.
#[test]
fn long_histories_are_read_from_the_map() {
    let gqa = Checkpoint::load(&fixtures().join("tiny/llama-gqa")).unwrap();
    // head_dim 32: whole int8 / int4 blocks.
    let wide = Checkpoint::load(&fixtures().join("tiny/llama-mha")).unwrap();
    let p = prompt(300);
    for (ckpt, spec) in [
        (&gqa, "dense"),
        (&gqa, "dense:format=bf16,rotate=hadamard"),
        (&wide, "dense:format=int8"),
        (&wide, "dense:format=int4,rotate=hadamard"),
        (&wide, "dense:format=fp8"),
        (&gqa, "swan:k=8,value=f16,b=4,basis=random:5"),
        (&gqa, "swan:k=8,index=bitmask,value=int8,b=4,basis=random:5"),
        (&gqa, "swan:k=6,kv=4,value=fp8,scale=auto,b=16,basis=random:1"),
        (&gqa, "swan:k=8,index=bitmask,value=int4,b=0,basis=random:2"),
    ] {
        round_trip(ckpt, spec, &p, 6);
        // The reopened cache holds only the unmapped rows in memory.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("long.kvs");
        let (mut a, identity) = session(ckpt, spec);
        let logits = to_f32_vec(&a.prefill(&p).unwrap()).unwrap();
        persist::save(&path, &identity, a.cache(), &Prefix { ids: p.clone(), logits }).unwrap();
        let file = Arc::new(MappedCache::read(&path).unwrap());
        let (mut b, _) = session(ckpt, spec);
        b.resume(&file, &identity).unwrap();
        assert!(Arc::strong_count(&file) > 1, "{spec}: the reopened cache keeps the file");
        assert_eq!(b.cache().len(), p.len(), "{spec}");
        assert_eq!(b.cache().bytes(), a.cache().bytes(), "{spec}: the same rows, wherever held");
    }
}

fn saved(ckpt: &Checkpoint, spec: &str, dir: &std::path::Path) -> std::path::PathBuf {
    let path = dir.join(format!("{}.kvs", spec.replace([':', ',', '='], "_")));
    let (mut s, identity) = session(ckpt, spec);
    let p = prompt(12);
    let logits = to_f32_vec(&s.prefill(&p).unwrap()).unwrap();
    persist::save(&path, &identity, s.cache(), &Prefix { ids: p, logits }).unwrap();
    path
}

fn resume_err(ckpt: &Checkpoint, spec: &str, bytes: &[u8]) -> Error {
    let (mut s, identity) = session(ckpt, spec);
    let file = MappedCache::from_bytes(bytes).map_err(Error::from);
    let e = match file {
        Ok(file) => s.resume(&Arc::new(file), &identity).unwrap_err(),
        Err(e) => e,
    };
    assert_eq!((s.position(), s.cache().len()), (0, 0), "a failed resume changes nothing");
    e
}

#[test]
fn a_cache_for_another_model_projection_or_format_is_a_typed_error() {
    let gqa = Checkpoint::load(&fixtures().join("tiny/llama-gqa")).unwrap();
    let llama3 = Checkpoint::load(&fixtures().join("tiny/llama3-rope")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let swan = "swan:k=8,index=bitmask,value=int8,b=4,basis=random:5";
    let bytes = std::fs::read(saved(&gqa, swan, dir.path())).unwrap();
    // Same shape (2 layers, 4/2 heads × 16), other weights and rope.
    let e = resume_err(&llama3, swan, &bytes);
    assert!(matches!(e, Error::CacheMismatch { what: "model", .. }), "{e}");
    let e = resume_err(&gqa, "swan:k=8,index=bitmask,value=int8,b=4,basis=random:6", &bytes);
    assert!(matches!(e, Error::CacheMismatch { what: "projection", .. }), "{e}");
    let e = resume_err(&gqa, "swan:k=8,index=list,value=int8,b=4,basis=random:5", &bytes);
    assert!(matches!(e, Error::CacheMismatch { what: "format", .. }), "{e}");
    let e = resume_err(&gqa, "swan:k=7,index=bitmask,value=int8,b=4,basis=random:5", &bytes);
    assert!(matches!(e, Error::CacheMismatch { what: "format", .. }), "{e}");
    let dense = std::fs::read(saved(&gqa, "dense", dir.path())).unwrap();
    let e = resume_err(&gqa, "dense:format=f32", &dense);
    assert!(matches!(e, Error::CacheMismatch { what: "format", .. }), "{e}");
    let e = resume_err(&gqa, "dense:rotate=hadamard", &dense);
    assert!(matches!(e, Error::CacheMismatch { what: "projection" | "format", .. }), "{e}");
    // A file of one whole-row history read by a cache of another.
    let kivi = std::fs::read(saved(&gqa, "kivi:bits=2,group=8,b=4", dir.path())).unwrap();
    for other in ["kivi:bits=4,group=8,b=4", "turbo:bits=2,b=4", "dense:format=fp8,b=4"] {
        let e = resume_err(&gqa, other, &kivi);
        assert!(
            matches!(e, Error::CacheMismatch { what: "format" | "projection", .. }),
            "{other}: {e}"
        );
    }
    // Truncations and a flipped byte are kv-sparse's typed errors.
    for len in [0, 100, bytes.len() / 2, bytes.len() - 1] {
        let e = resume_err(&gqa, swan, &bytes[..len]);
        assert!(matches!(e, Error::Sparse(kv_sparse::Error::Truncated { .. })), "{len}: {e}");
    }
    let mut flipped = bytes.clone();
    let n = flipped.len();
    flipped[n - 3] ^= 0x40;
    let e = resume_err(&gqa, swan, &flipped);
    // The byte lies in the last head: its checksum fails when the load first reads it.
    let head_checksum = match &e {
        Error::Sparse(kv_sparse::Error::BadHead { source, .. }) => {
            matches!(**source, kv_sparse::Error::ChecksumMismatch { what: "head", .. })
        }
        _ => false,
    };
    assert!(head_checksum, "{e}");
    // A kv-sparse file without a kvtide identity.
    let plain = {
        let c = kv_sparse::hybrid::HybridCache::<u8, half::f16, half::f16>::new(
            kv_sparse::hybrid::HybridConfig::new(16, 2, 4),
        )
        .unwrap();
        kv_sparse::persist::encode_views(1, 1, &[(*c.config(), c.view())]).unwrap()
    };
    let e = resume_err(&gqa, swan, &plain);
    assert!(matches!(e, Error::InvalidInput { .. }), "{e}");
}

/// One decode step of a cache on a fixed synthetic q/k/v (layer 0), as its output.
fn probe(cache: &mut dyn KvCache) -> Vec<f32> {
    let s = cache.shape();
    let q: Vec<f32> = (0..s.q_heads() * s.head_dim()).map(|i| (i % 7) as f32 * 0.3 - 1.0).collect();
    let kv: Vec<f32> =
        (0..s.kv_heads() * s.head_dim()).map(|i| (i % 5) as f32 * 0.2 - 0.4).collect();
    let mut out = vec![0.0; q.len()];
    cache.decode(0, StepQkv { q: &q, k: &kv, v: &kv }, &mut out).unwrap();
    out
}

#[test]
fn a_failed_load_keeps_everything_the_cache_held() {
    let gqa = Checkpoint::load(&fixtures().join("tiny/llama-gqa")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let p = prompt(16);
    for (spec, other) in [
        (
            "swan:k=8,index=bitmask,value=int8,b=4,basis=random:5",
            "swan:k=8,value=int8,b=4,basis=random:5",
        ),
        ("swan:k=8,value=fp8,b=4,basis=random:5", "dense"),
        ("dense", "dense:format=f32"),
        ("kivi:bits=2,group=8,b=4", "turbo:bits=2,b=4"),
        ("turbo:bits=3,b=4", "kivi:bits=2,group=8,b=4"),
        ("kivi:bits=2,group=8,b=4", "kivi:bits=2,group=8,b=6"),
        ("dense:format=fp8,b=4", "dense:format=fp8"),
    ] {
        let build = || {
            let spec: CacheSpec = spec.parse().unwrap();
            spec.build(&gqa.model).unwrap()
        };
        let ((model, mut cache), (_, mut twin)) = (build(), build());
        for c in [&mut cache, &mut twin] {
            let _ = model.prefill(&p, Some(c.as_mut()), &mut NoObserver, false).unwrap();
        }
        let bytes = std::fs::read(saved(&gqa, other, dir.path())).unwrap();
        let file = Arc::new(MappedCache::from_bytes(&bytes).unwrap());
        // Straight to the cache, skipping the identity check: the layout check refuses it.
        let e = cache.load_image(&file).unwrap_err();
        assert!(
            matches!(e, Error::Sparse(_) | Error::InvalidInput { .. }),
            "{spec} ← {other}: {e}"
        );
        assert_eq!(cache.len(), p.len(), "{spec}");
        assert_eq!(cache.bytes(), twin.bytes(), "{spec}");
        assert_eq!(probe(cache.as_mut()), probe(twin.as_mut()), "{spec}: the state is intact");
    }
}

#[test]
fn reopened_caches_continue_exactly_as_in_memory_on_smollm2() {
    let path = common::default_model();
    assert!(path.is_file(), "{} missing: run scripts/setup.sh", path.display());
    let ckpt = Checkpoint::load(&path).unwrap();
    let tok = ckpt.tokenizer.as_ref().unwrap();
    let text = "To be, or not to be, that is the question: whether 'tis nobler in the mind to suffer \
                the slings and arrows of outrageous fortune, or to take arms against a sea of troubles";
    let p = tok.encode(text).unwrap();
    assert!(p.len() > 32);
    round_trip(&ckpt, "dense", &p, 6);
    round_trip(&ckpt, "dense:format=int8,rotate=hadamard", &p, 6);
    let bytes = round_trip(&ckpt, "swan:k=32,index=bitmask,value=int8,b=16,basis=hadamard", &p, 6);
    let file = MappedCache::from_bytes(&bytes).unwrap();
    assert_eq!((file.num_layers(), file.kv_heads(), file.head_dim()), (30, 3, 64));
    let identity = CacheIdentity::from_bytes(file.identity()).unwrap();
    assert!(identity.model.starts_with(&ckpt.config.name), "{}", identity.model);
    assert!(identity.format.contains("bitmask int8"), "{}", identity.format);
}

/// A SWAN cache with component scales (`norm=eigen`, a calibrated basis) stores rows divided
/// by them: reopened, it continues exactly (the scales come from the same projection file,
/// which the identity pins); reopening it as a cache without them is a format mismatch.
#[test]
fn component_scaled_caches_reopen_exactly_and_only_as_themselves() {
    let gqa = Checkpoint::load(&fixtures().join("tiny/llama-gqa")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (_, proj) = common::calibrated_projection(&gqa, &prompt(96), dir.path());
    let base =
        format!("swan:k=8,index=bitmask,value=int8,b=4,basis=calibrated,proj={}", proj.display());
    let scaled = format!("{base},norm=eigen,select=query");
    let bytes = round_trip(&gqa, &scaled, &prompt(24), 8);
    let e = resume_err(&gqa, &format!("{base},select=query"), &bytes);
    assert!(matches!(e, Error::CacheMismatch { what: "format", .. }), "{e}");
}
