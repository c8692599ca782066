//! Parity with transformers' `Gemma3ForCausalLM` on the real Gemma 3 270M Q4_K_M GGUF
//! (`fixtures/gemma3/parity.json`, written by `scripts/fixtures/gen_gemma3_parity.py` from
//! the same file): the configuration read from GGUF metadata, the chat template, logits
//! of a teacher-forced prefill and of the decode path (short, chat and a 600-token prompt
//! that outruns the 512-position sliding window) within 1e-3, greedy continuations, and
//! the sliding-window caches: lossless settings equal dense, per-kind byte accounting, and
//! a full-history cache refused past the window; a SWAN sink reaches the quantized rings.

mod common;

use std::sync::{Mutex, MutexGuard, OnceLock};

use common::{fixtures, ids, read_json};
use models::cache::{CacheShape, CacheSpec, DenseCache, KvCache};
use models::llama::PrefillObserver;
use models::session::generate::greedy;
use models::{Architecture, ChatMessage, Checkpoint, LayerKind, Session};
use serde_json::Value;
use tch::{Kind, Tensor};

/// Max abs logit error allowed (f32, the same dequantised weights as transformers).
const TOL: f64 = 1e-3;

/// The model, loaded once for all tests (libtorch tensors are `Send` but not `Sync`).
fn checkpoint() -> MutexGuard<'static, Checkpoint> {
    static CKPT: OnceLock<Mutex<Checkpoint>> = OnceLock::new();
    let ckpt = CKPT.get_or_init(|| {
        let path = common::gemma_model();
        assert!(path.is_file(), "{} missing: run scripts/setup.sh gemma", path.display());
        Mutex::new(Checkpoint::load(&path).unwrap())
    });
    ckpt.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn fixture() -> Value {
    read_json(&fixtures().join("gemma3/parity.json"))
}

fn case<'a>(f: &'a Value, name: &str) -> &'a Value {
    f["cases"].as_array().unwrap().iter().find(|c| c["name"] == name).unwrap()
}

fn floats(v: &Value) -> Vec<f64> {
    v.as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect()
}

/// Max abs difference between `logits` (`[vocab]`) and a fixture row at its top-k ids and
/// at the shared vocabulary slice.
fn row_error(logits: &Tensor, row: &Value, slice: &[u32]) -> f64 {
    let got: Vec<f32> = Vec::<f32>::try_from(logits.to_kind(Kind::Float).contiguous()).unwrap();
    let pairs = ids(row, "top_ids").into_iter().zip(floats(&row["top_logits"]));
    let pairs = pairs.chain(slice.iter().copied().zip(floats(&row["slice_logits"])));
    pairs.map(|(id, want)| (f64::from(got[id as usize]) - want).abs()).fold(0.0, f64::max)
}

fn row_at(c: &Value, position: usize) -> &Value {
    c["rows"].as_array().unwrap().iter().find(|r| r["position"] == position).unwrap()
}

/// Keeps the residual stream after the last layer.
struct LastHidden(usize, Option<Tensor>);

impl PrefillObserver for LastHidden {
    fn hidden(&mut self, name: &str, h: &Tensor) -> models::Result<()> {
        if name == format!("layer{}.out", self.0) {
            self.1 = Some(h.shallow_clone());
        }
        Ok(())
    }
}

#[test]
fn config_comes_from_gguf_metadata() {
    let f = fixture();
    let ckpt = checkpoint();
    let c = &ckpt.config;
    assert_eq!(c.arch, Architecture::Gemma3);
    let want = &f["config"];
    assert_eq!(c.num_layers as u64, want["num_hidden_layers"].as_u64().unwrap());
    assert_eq!(c.head_dim as u64, want["head_dim"].as_u64().unwrap());
    assert_eq!((c.q_heads, c.kv_heads, c.hidden_size), (4, 1, 640));
    assert!(c.tie_word_embeddings);
    let scalar = want["query_pre_attn_scalar"].as_f64().unwrap();
    assert_eq!(c.attention_scale(), 1.0 / scalar.sqrt());
    let window = want["sliding_window"].as_u64().unwrap() as usize;
    for (i, kind) in want["layer_types"].as_array().unwrap().iter().enumerate() {
        let expect = match kind.as_str().unwrap() {
            "sliding_attention" => LayerKind::Local { window },
            _ => LayerKind::Global,
        };
        assert_eq!(c.layer_kind(i), expect, "layer {i}");
    }
    let rope = &want["rope_parameters"];
    assert_eq!(c.rope.theta, rope["full_attention"]["rope_theta"].as_f64().unwrap());
    let local = c.local_attention.as_ref().unwrap();
    assert_eq!(local.rope.theta, rope["sliding_attention"]["rope_theta"].as_f64().unwrap());
}

#[test]
fn chat_template_renders_the_published_gemma3_template() {
    let f = fixture();
    let ckpt = checkpoint();
    let template = ckpt.chat_template.as_ref().expect("Gemma 3 falls back to its template");
    let m = &f["chat"]["messages"][0];
    let messages = [ChatMessage::new(m["role"].as_str().unwrap(), m["content"].as_str().unwrap())];
    let text = template.render(&messages, true).unwrap();
    assert_eq!(text, f["chat"]["text"].as_str().unwrap());
    let tok = ckpt.tokenizer.as_ref().unwrap();
    // The rendered text starts with `<bos>` itself; the tokenizer adds none in front of it.
    let got = tok.encode_with(&text, false).unwrap();
    assert_eq!(got, ids(case(&f, "chat"), "input_ids"));
}

#[test]
fn prefill_logits_match_transformers() {
    let f = fixture();
    let slice = ids(&f, "vocab_slice");
    let ckpt = checkpoint();
    let last = ckpt.config.num_layers - 1;
    let mut worst = 0.0f64;
    for c in f["cases"].as_array().unwrap() {
        let seq: Vec<u32> = [ids(c, "input_ids"), ids(c, "greedy_ids")].concat();
        let mut obs = LastHidden(last, None);
        let _ = ckpt.model.prefill(&seq, None, &mut obs, false).unwrap();
        let h = obs.1.unwrap();
        for row in c["rows"].as_array().unwrap() {
            let p = row["position"].as_i64().unwrap();
            let logits = ckpt.model.head(&h.narrow(0, p, 1)).unwrap().squeeze_dim(0);
            let err = row_error(&logits, row, &slice);
            assert!(err < TOL, "{} position {p}: max abs logit error {err:e}", c["name"]);
            worst = worst.max(err);
        }
    }
    eprintln!("gemma3 prefill: max abs logit error {worst:.3e}");
}

#[test]
fn decode_path_logits_and_greedy_match_transformers() {
    let f = fixture();
    let slice = ids(&f, "vocab_slice");
    let ckpt = checkpoint();
    let spec: CacheSpec = "dense:format=f32,threads=2".parse().unwrap();
    let mut worst = 0.0f64;
    for c in f["cases"].as_array().unwrap() {
        let (prompt, want) = (ids(c, "input_ids"), ids(c, "greedy_ids"));
        let (model, cache) = spec.build(&ckpt.model).unwrap();
        let mut s = Session::new(model, cache).unwrap();
        let mut logits = s.prefill(&prompt).unwrap();
        for (i, &id) in want.iter().enumerate() {
            let row = row_at(c, prompt.len() - 1 + i);
            let err = row_error(&logits, row, &slice);
            assert!(err < TOL, "{} decode step {i}: max abs logit error {err:e}", c["name"]);
            worst = worst.max(err);
            logits = s.decode(id).unwrap();
        }
        let (model, cache) = spec.build(&ckpt.model).unwrap();
        let mut s = Session::new(model, cache).unwrap();
        let got = greedy(&mut s, &prompt, want.len(), &[], &mut |_| Ok(())).unwrap();
        assert_eq!(got.ids, want, "{} greedy continuation", c["name"]);
    }
    eprintln!("gemma3 decode path: max abs logit error {worst:.3e}");
}

/// Decode-path logits of the long prompt's greedy continuation under `spec`.
fn decode_logits(
    ckpt: &Checkpoint,
    spec: &str,
    c: &Value,
) -> (Vec<Tensor>, Vec<(&'static str, f64)>) {
    let spec: CacheSpec = spec.parse().unwrap();
    let (model, cache) = spec.build(&ckpt.model).unwrap();
    let mut s = Session::new(model, cache).unwrap();
    let mut out = vec![s.prefill(&ids(c, "input_ids")).unwrap()];
    for id in ids(c, "greedy_ids") {
        out.push(s.decode(id).unwrap());
    }
    (out, s.cache().stats())
}

#[test]
fn lossless_caches_equal_dense_on_global_layers_and_windows() {
    let f = fixture();
    let c = case(&f, "long");
    let ckpt = checkpoint();
    let (dense, stats) = decode_logits(&ckpt, "dense:format=f32,threads=2", c);
    // Memory per layer kind: 15 local layers keep 512 positions, 3 global layers keep
    // every one; one kv-head of 256 f32 for k and for v.
    let n = ids(c, "input_ids").len() + ids(c, "greedy_ids").len();
    let row = 2 * 256 * 4;
    let stat = |k: &str| stats.iter().find(|(name, _)| *name == k).unwrap().1;
    assert_eq!(stat("window_bytes"), (15 * 512 * row) as f64);
    assert_eq!(stat("global_bytes"), (3 * n * row) as f64);
    for spec in [
        // head_dim 256: u8 list indices at their limit, 32-byte bitmask rows.
        "swan:k=256,kv=256,index=bitmask,value=f32,buffer=f32,b=16,basis=identity,threads=2",
        "swan:k=256,kv=256,value=f32,buffer=f32,b=16,basis=hadamard,threads=2",
        "dense:format=f32,rotate=hadamard,threads=2",
        "tiered:span=64..576,lossless,format=f32,ring=f32,threads=2",
        // The rings in a basis of their own (values absorbed, keys rotated by a float ring
        // or not): still lossless.
        "swan:k=256,kv=256,value=f32,buffer=f32,b=16,basis=hadamard,ring=f32,ring_rotate=hadamard-v,threads=2",
        "dense:format=f32,ring_rotate=hadamard,threads=2",
    ] {
        let (got, _) = decode_logits(&ckpt, spec, c);
        for (i, (a, b)) in dense.iter().zip(&got).enumerate() {
            let err = (a - b).abs().max().double_value(&[]);
            assert!(err < 1e-3, "{spec} step {i}: max abs logit difference {err:e} vs dense");
        }
    }
}

/// A quantized ring stores its keys and values in `ring_rotate`'s basis, whatever the global
/// layers' basis. int8 rings in Walsh–Hadamard coordinates beside unrotated f32 global
/// layers attend as a Hadamard-rotated cache with the same rings does, and unrotated rings
/// beside Hadamard-rotated global layers as an unrotated cache — up to the int8 rounding
/// flips that f32 rounding in the other basis causes, well under what the rings' basis
/// itself changes; naming the spec's own basis changes nothing at all.
#[test]
fn a_ring_rotation_stores_the_rings_in_its_own_basis() {
    let f = fixture();
    let c = case(&f, "long");
    let ckpt = checkpoint();
    let run = |spec: &str| decode_logits(&ckpt, spec, c).0;
    let rotated = run("dense:format=f32,rotate=hadamard,ring=int8,threads=2");
    let plain = run("dense:format=f32,ring=int8,threads=2");
    let diff = |x: &[Tensor], y: &[Tensor]| {
        x.iter().zip(y).map(|(a, b)| (a - b).abs().max().double_value(&[])).fold(0.0, f64::max)
    };
    let basis = diff(&rotated, &plain);
    let to_hadamard =
        diff(&rotated, &run("dense:format=f32,ring=int8,ring_rotate=hadamard,threads=2"));
    let to_plain =
        diff(&plain, &run("dense:format=f32,rotate=hadamard,ring=int8,ring_rotate=none,threads=2"));
    let own = diff(
        &rotated,
        &run("dense:format=f32,rotate=hadamard,ring=int8,ring_rotate=hadamard,threads=2"),
    );
    eprintln!(
        "int8 rings: the basis moves logits by {basis:e}; ring_rotate=hadamard {to_hadamard:e}, ring_rotate=none {to_plain:e} from the cache with those rings; the spec's own basis {own:e}"
    );
    assert_eq!(own, 0.0, "ring_rotate naming the spec's own basis changed the logits");
    assert!(to_hadamard < 0.3 * basis, "ring_rotate=hadamard: {to_hadamard:e} vs {basis:e}");
    assert!(to_plain < 0.3 * basis, "ring_rotate=none: {to_plain:e} vs {basis:e}");
}

#[test]
fn full_history_cache_is_refused_past_the_window() {
    let f = fixture();
    let c = case(&f, "long");
    let ckpt = checkpoint();
    let shape = CacheShape::of(&ckpt.config).unwrap();
    let cache: Box<dyn KvCache> = Box::new(DenseCache::<f32>::new(shape, 2).unwrap());
    let mut s = Session::new(ckpt.model.clone(), cache).unwrap();
    let _ = s.prefill(&ids(c, "input_ids")).unwrap();
    let e = s.decode(ids(c, "greedy_ids")[0]).unwrap_err();
    assert!(e.to_string().contains("attends to the last 512 positions"), "{e}");
}

/// A SWAN spec's `sink=N` holds in its global layers and, as a dense spec's does, in its
/// quantized local rings; a float ring keeps every position already.
#[test]
fn a_swan_sink_reaches_the_global_layers_and_the_quantized_rings() {
    let ckpt = checkpoint();
    for (spec, in_rings) in [
        ("swan:k=64,index=bitmask,value=int8,basis=hadamard,ring=int4,sink=1", true),
        ("swan:k=64,index=bitmask,value=int8,basis=hadamard,ring=f16,sink=1", false),
    ] {
        let (_, cache) = spec.parse::<CacheSpec>().unwrap().build(&ckpt.model).unwrap();
        let label = cache.label();
        let (global, local) = label.split_once(" (global layers) + ").unwrap();
        assert!(global.contains(" sink=1"), "{spec}: {label}");
        assert_eq!(local.contains(" sink=1"), in_rings, "{spec}: {label}");
    }
}

/// `ring=int8,ring_values=int4` keeps the local layers' rings as q8_0 keys and q4_0 values
/// beside a SWAN spec's global layers (llama.cpp's `-ctk q8_0 -ctv q4_0` on the rings alone):
/// the label names both formats, the rings hold one key row and one value row per position
/// of the window, and the spec's sink reaches them.
#[test]
fn a_swan_spec_keeps_its_rings_in_two_formats() {
    let f = fixture();
    let c = case(&f, "long");
    let ckpt = checkpoint();
    let n = ids(c, "input_ids").len() + ids(c, "greedy_ids").len();
    let base = "swan:k=128,index=bitmask,value=int8,basis=hadamard,ring=int8,ring_values=int4,ring_rotate=hadamard-v,threads=2";
    let (_, stats) = decode_logits(&ckpt, base, c);
    let stat = |k: &str| stats.iter().find(|(name, _)| *name == k).unwrap().1;
    // 15 local layers, one kv-head of 256: a q8_0 key row (8 blocks of 34 bytes) and a q4_0
    // value row (8 blocks of 18 bytes) per position of the 512-position window.
    assert_eq!(stat("window_bytes"), (15 * n.min(512) * (8 * 34 + 8 * 18)) as f64);
    let (_, same) = decode_logits(&ckpt, &base.replace("ring_values=int4", "ring_values=int8"), c);
    let same = same.iter().find(|(name, _)| *name == "window_bytes").unwrap().1;
    assert_eq!(same, (15 * n.min(512) * 2 * 8 * 34) as f64, "equal formats: a plain int8 ring");
    let sink = format!("{base},sink=1");
    let (_, cache) = sink.parse::<CacheSpec>().unwrap().build(&ckpt.model).unwrap();
    let label = cache.label();
    let (global, local) = label.split_once(" (global layers) + ").unwrap();
    assert!(global.contains(" sink=1") && local.contains(" sink=1"), "{label}");
    assert!(local.contains("int8 values=int4"), "{label}");
}
