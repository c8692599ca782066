//! Every cache the spec language names runs through prefill and decode on the tiny models
//! with finite logits, reports sensible bytes, and bad specs are typed errors.

mod common;

use common::fixtures;
use models::cache::spec::CacheSpec;
use models::{Checkpoint, Error, Session};

/// The tiny fixture with 32-wide heads (one int8 / int4 block per row).
const WIDE_HEADS: &str = "tiny/llama-mha";

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
    for index in ["list", "bitmask"] {
        for value in ["fp8", "int8", "int4"] {
            let spec = format!("swan:k=8,index={index},value={value},b=8,basis=random:2");
            let (s, _) = run(&ckpt, &spec);
            assert!(s.cache().bytes().total() < dense_bytes, "{spec}");
        }
    }
    // Quantized dense formats need whole 32-element blocks: the d = 16 model refuses them
    // with a typed error, the d = 32 model runs them at a quarter (int8) or an eighth (int4)
    // of the f32 bytes plus scales.
    let spec: CacheSpec = "dense:format=int8".parse().unwrap();
    assert!(spec.build(&ckpt.model).is_err(), "int8 blocks need head_dim % 32 == 0");
    let wide = Checkpoint::load(&fixtures().join(WIDE_HEADS)).unwrap();
    let (f32_cache, _) = run(&wide, "dense:format=f32");
    let f32_bytes = f32_cache.cache().bytes().total();
    for (format, ratio) in [("int8", 34.0 / 128.0), ("int4", 18.0 / 128.0), ("fp8", 34.0 / 128.0)] {
        for rotate in ["none", "hadamard"] {
            let (s, _) = run(&wide, &format!("dense:format={format},rotate={rotate}"));
            let got = s.cache().bytes().total() as f64 / f32_bytes as f64;
            assert!((got - ratio).abs() < 1e-9, "{format}: {got} of f32, expected {ratio}");
        }
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
        "swan:value=int3",
        "swan:index=tree",
        "dense:rotate=spiral",
        "swan:basis=spiral",
        "dense:format=fp4",
        "tiered",
        "tiered:span=9..3",
        "tiered:span=0..8,r_gpu=0",
        "tiered:span=0..8,delta=-1",
        "swan:k=8,k=9",
        "dense:threads=0",
        "dense:format=int8,queries=int4",
        "swan:select=largest",
        "swan+tiered:span=0..8,select=query",
        "swan:norm=whiten",
        "swan+tiered:span=0..8,norm=eigen",
        "swan:ring=int4,ring_rotate=calibrated",
        "dense:ring_rotate=kv-shuffle",
        "dense:ring_rotate=sideways",
        "dense:format=f16,sink=1",
        "dense:format=int4,sink=x",
        "dense:format=int8,sink=-1",
        "swan:sink=x",
        "swan+tiered:span=0..8,sink=1",
        "dense:format=f16,values=int4",
        "dense:values=int8",
        "dense:format=int8,values=f16",
        "dense:format=int8,values=int3",
        "swan:values=int4",
        "swan:ring_values=int4",
        "dense:ring=f16,ring_values=int4",
        "swan:ring=int8,ring_values=bf16",
        "swan:ring=int8,ring_values=q5_1",
        "dense:format=f16,b=128",
        "dense:b=4",
        "dense:format=int8,values=int4,b=128",
        "dense:format=int4,b=x",
        "dense:format=int4,buffer=f16",
        "dense:format=int4,b=8,buffer=fp8",
        "dense:format=int4,b=8,buffer=int8",
        "kivi:bits=3",
        "kivi:bits=8",
        "kivi:group=0",
        "kivi:group=x",
        "kivi:bits=2,b=x",
        "kivi:buffer=fp8",
        "kivi:k=4",
        "turbo:bits=5",
        "turbo:bits=1",
        "turbo:rotate=spiral",
        "turbo:group=32",
        "turbo:qjl=yes",
    ] {
        assert!(matches!(bad.parse::<CacheSpec>(), Err(Error::CacheSpec { .. })), "{bad} parsed");
    }
    let ckpt = Checkpoint::load(&fixtures().join("tiny/llama-gqa")).unwrap();
    let too_big: CacheSpec = "swan:k=17,basis=identity".parse().unwrap();
    assert!(too_big.build(&ckpt.model).is_err(), "k > head_dim must be rejected");
    let missing: CacheSpec = "swan:proj=/nonexistent.safetensors".parse().unwrap();
    assert!(matches!(missing.build(&ckpt.model), Err(Error::CacheSpec { .. })));
    // The fixture's context is 512 positions: a buffer beyond it is a spec error naming it.
    for spec in ["dense:format=int4,b=513", "swan:k=8,b=513,basis=identity"] {
        let spec: CacheSpec = spec.parse().unwrap();
        match spec.build(&ckpt.model) {
            Err(Error::CacheSpec { reason, .. }) => assert!(reason.contains("512"), "{reason}"),
            Err(other) => panic!("{spec}: {other}"),
            Ok(_) => panic!("{spec}: a buffer past the context was accepted"),
        }
    }
    // A KIVI group must divide the head (16 here), checked when the cache is built.
    for (spec, what) in [("kivi:group=32", "group = 32"), ("kivi:bits=4,group=6", "group = 6")] {
        let parsed: CacheSpec = spec.parse().unwrap();
        match parsed.build(&ckpt.model) {
            Err(Error::CacheSpec { reason, .. }) => assert!(reason.contains(what), "{reason}"),
            Err(other) => panic!("{spec}: {other}"),
            Ok(_) => panic!("{spec}: a group not dividing head_dim was accepted"),
        }
    }
    let outside: CacheSpec = "tiered:span=60..100".parse().unwrap();
    let (model, cache) = outside.build(&ckpt.model).unwrap();
    let mut session = Session::new(model, cache).unwrap();
    assert!(session.prefill(&[1, 2, 3, 4]).is_err(), "span outside the prompt");
}

/// `sink=N` keeps a quantized cache's first `N` positions in f32 before its quantized rows:
/// with every position inside the sink it scores as the dense f32 cache does and holds its
/// bytes; a sink of 3 holds 3 f32 rows and quantized rows after them; the label says so, and
/// the file format (quantized rows only) refuses to save or load such a cache.
#[test]
fn a_sink_keeps_the_first_positions_in_full() {
    let wide = Checkpoint::load(&fixtures().join(WIDE_HEADS)).unwrap();
    let (f32_cache, f32_ppl) = run(&wide, "dense:format=f32");
    let f32_bytes = f32_cache.cache().bytes().total() as f64;
    for (format, row) in [("int8", 34.0), ("int4", 18.0), ("fp8", 34.0)] {
        let (all, ppl) = run(&wide, &format!("dense:format={format},sink=64"));
        assert!((ppl - f32_ppl).abs() <= 1e-6 * f32_ppl, "{format}: {ppl} vs f32 {f32_ppl}");
        assert_eq!(all.cache().bytes().total() as f64, f32_bytes, "{format}");
        let (s, _) = run(&wide, &format!("dense:format={format},rotate=hadamard,sink=3"));
        // 63 positions held: 3 in f32 (128 bytes a 32-wide row), 60 quantized.
        let want = f32_bytes / 63.0 * (3.0 + 60.0 * row / 128.0);
        assert_eq!(s.cache().bytes().total() as f64, want, "{format}");
        assert!(s.cache().label().contains(" rotate=hadamard sink=3"), "{}", s.cache().label());
        assert!(matches!(s.cache().image(), Err(Error::NotPersistable { .. })), "{format}");
    }
    // A sink of 0 is the plain quantized cache.
    let (plain, p0) = run(&wide, "dense:format=int4");
    let (zero, p1) = run(&wide, "dense:format=int4,sink=0");
    assert_eq!((p0, plain.cache().label()), (p1, zero.cache().label()));
}

/// `b=N` keeps a quantized cache's `N` newest positions exact in the buffer format and
/// every older one quantized: the bytes are the buffer's float rows plus the quantized rows
/// (with a sink, its f32 rows first), the history cost per position is the codec's row,
/// the label says so, a buffer of 0 is the plain quantized cache, and the cache is
/// persisted (as kv-sparse's whole-row hybrid).
#[test]
fn a_buffer_keeps_the_newest_positions_exact() {
    let wide = Checkpoint::load(&fixtures().join(WIDE_HEADS)).unwrap();
    let (f32_cache, f32_ppl) = run(&wide, "dense:format=f32");
    let f32_bytes = f32_cache.cache().bytes().total() as f64;
    // 63 positions held, a 32-wide row of f32 is 128 bytes.
    let per_row = f32_bytes / 63.0 / 128.0;
    let kv_rows = f32_bytes / 63.0 / 128.0 / 2.0; // (layer, kv-head) pairs
    for (format, row) in [("int8", 34.0), ("int4", 18.0), ("fp8", 34.0)] {
        let (s, ppl) = run(&wide, &format!("dense:format={format},rotate=hadamard,b=16"));
        let want = per_row * (16.0 * 64.0 + 47.0 * row);
        assert_eq!(s.cache().bytes().total() as f64, want, "{format}");
        let label = s.cache().label();
        assert_eq!(label, format!("dense {format} rotate=hadamard b=16 (f16)"));
        let history = s.cache().stats().into_iter().find(|(k, _)| *k == "history_bytes_per_token");
        assert_eq!(history, Some(("history_bytes_per_token", kv_rows * 2.0 * row)), "{format}");
        assert!(s.cache().image().is_ok(), "{format}: persisted as a whole-row hybrid");
        let (unbuffered, p0) = run(&wide, &format!("dense:format={format},rotate=hadamard"));
        assert!(ppl != p0, "{format}: the buffer changed nothing");
        let (zero, p1) = run(&wide, &format!("dense:format={format},rotate=hadamard,b=0"));
        assert_eq!((p0, unbuffered.cache().label()), (p1, zero.cache().label()));
        // A sink before the buffer: 2 f32 rows, 16 bf16 rows, 45 quantized rows.
        let (sunk, _) = run(&wide, &format!("dense:format={format},b=16,buffer=bf16,sink=2"));
        let want = per_row * (2.0 * 128.0 + 16.0 * 64.0 + 45.0 * row);
        assert_eq!(sunk.cache().bytes().total() as f64, want, "{format} sink");
        assert_eq!(sunk.cache().label(), format!("dense {format} b=16 (bf16) sink=2"));
        // A buffer holding every position: the f32 cache's scores.
        let (all, ppl) = run(&wide, &format!("dense:format={format},b=64,buffer=f32"));
        assert_eq!(ppl, f32_ppl, "{format}: an f32 buffer holding everything is lossless");
        assert_eq!(all.cache().bytes().total() as f64, f32_bytes, "{format}");
    }
}

/// `kivi:` and `turbo:` keep the newest positions in the buffer and the older ones as codes:
/// bytes are the buffer's f16 rows plus the codes and their parameters (a KIVI key group's
/// per-channel scale and zero once its group is complete, its waiting keys in f16), the
/// label names the format, and the history cost per position is the format's formula.
#[test]
fn coded_histories_keep_their_bytes_and_labels() {
    let wide = Checkpoint::load(&fixtures().join(WIDE_HEADS)).unwrap();
    let (f32_cache, _) = run(&wide, "dense:format=f32");
    // 63 positions held, a 32-wide row of f32 is 128 bytes.
    let pairs = f32_cache.cache().bytes().total() as f64 / 63.0 / 128.0 / 2.0;
    // b = 16: 47 history positions. KIVI-2, groups of 8: 5 complete key groups (40 rows:
    // 8 codes bytes + 5 groups × 128 bytes of parameters), 7 keys waiting in f16; 47 value
    // rows of 8 code bytes + 4 groups × 4 bytes.
    let (kivi, _) = run(&wide, "kivi:bits=2,group=8,b=16");
    let keys = 40.0 * 8.0 + 5.0 * 128.0 + 7.0 * 64.0;
    let values = 47.0 * (8.0 + 16.0);
    let buffer = 16.0 * 2.0 * 64.0;
    assert_eq!(kivi.cache().bytes().total() as f64, pairs * (keys + values + buffer));
    assert_eq!(kivi.cache().label(), "kivi2 group=8 b=16 (f16)");
    let footprint = models::cache::Footprint::from_stats(&kivi.cache().stats()).unwrap();
    assert_eq!(footprint.history, pairs * 2.0 * (8.0 + 16.0));
    // Turbo-3: 2 bytes of norm + 12 code bytes a row, rotated by the default random basis.
    let (turbo, _) = run(&wide, "turbo:b=16");
    assert_eq!(turbo.cache().bytes().total() as f64, pairs * (47.0 * 2.0 * 14.0 + buffer));
    assert_eq!(turbo.cache().label(), "turbo3 rotate=random:0 b=16 (f16)");
    // QJL keys at 3 bits: norm, γ, 32 codes of 2 bits, 32 sign bits; values 14 bytes.
    let (qjl, _) = run(&wide, "turbo:qjl=on,b=16");
    let want = pairs * (47.0 * ((4.0 + 8.0 + 4.0) + 14.0) + buffer);
    assert_eq!(qjl.cache().bytes().total() as f64, want);
    assert_eq!(qjl.cache().label(), "turbo3 qjl rotate=random:0 b=16 (f16)");
    let footprint = models::cache::Footprint::from_stats(&qjl.cache().stats()).unwrap();
    assert_eq!(footprint.history, pairs * 30.0);
    let (sunk, _) = run(&wide, "turbo:bits=2,rotate=none,b=16,sink=1");
    assert_eq!(sunk.cache().label(), "turbo2 b=16 (f16) sink=1");
    assert!(matches!(sunk.cache().image(), Err(Error::NotPersistable { .. })));
}

/// `values=` keeps a quantized cache's value rows in another format than its keys
/// (llama.cpp's `-ctk` / `-ctv`): the bytes are the keys' rows plus the values' rows, the
/// label names both, equal formats are the plain cache, a mixed cache runs with a sink, and
/// the file format (one quantized format) refuses to save it.
#[test]
fn keys_and_values_may_take_different_formats() {
    let wide = Checkpoint::load(&fixtures().join(WIDE_HEADS)).unwrap();
    let (f32_cache, _) = run(&wide, "dense:format=f32");
    let f32_bytes = f32_cache.cache().bytes().total() as f64;
    let row = |f: &str| match f {
        "int4" => 18.0,
        _ => 34.0,
    };
    for (keys, values) in [("int8", "int4"), ("int4", "int8"), ("fp8", "int4"), ("int8", "fp8")] {
        let spec = format!("dense:format={keys},values={values},rotate=hadamard");
        let (s, _) = run(&wide, &spec);
        // 63 positions held, a 32-wide row of f32 is 128 bytes: keys' row + values' row.
        let want = f32_bytes * (row(keys) + row(values)) / 256.0;
        assert_eq!(s.cache().bytes().total() as f64, want, "{spec}");
        let label = s.cache().label();
        assert!(label.starts_with(&format!("dense {keys} values={values} rotate=")), "{label}");
        assert!(matches!(s.cache().image(), Err(Error::NotPersistable { .. })), "{spec}");
        let (sunk, _) = run(&wide, &format!("{spec},sink=2"));
        assert!(sunk.cache().label().ends_with(" sink=2"), "{}", sunk.cache().label());
    }
    let (plain, p0) = run(&wide, "dense:format=int4");
    let (same, p1) = run(&wide, "dense:format=int4,values=q4_0");
    assert_eq!((p0, plain.cache().label()), (p1, same.cache().label()));
    assert!(same.cache().image().is_ok(), "one format: persisted as before");
}

/// A SWAN spec's `sink=N` keeps the first `N` positions of every head in f32 beside the
/// buffer: a sink of 3 holds 3 f32 rows and the hybrid rows of the positions after them
/// (three sparse rows fewer), the sink changes the scores, the label says so, and the file
/// format refuses to save or load such a cache; `sink=0` is the plain cache.
#[test]
fn a_swan_sink_holds_its_first_positions_in_f32() {
    use kv_sparse::coded::ValueKind;
    use models::cache::{SwanConfig, SwanIndex};
    let wide = Checkpoint::load(&fixtures().join(WIDE_HEADS)).unwrap();
    let base = "swan:k=8,index=bitmask,value=int8,b=4,basis=random:2";
    let (plain, p_plain) = run(&wide, base);
    let (zero, p_zero) = run(&wide, &format!("{base},sink=0"));
    assert_eq!((p_plain, plain.cache().label()), (p_zero, zero.cache().label()));
    let (s, p_sink) = run(&wide, &format!("{base},sink=3"));
    assert_ne!(p_sink, p_plain, "the sink rows must change the scores");
    let shape = s.cache().shape();
    let (d, heads) = (shape.head_dim(), shape.layers * shape.kv_heads());
    let mut c = SwanConfig::lossless(d, 4);
    (c.k_key, c.k_value, c.index, c.value) = (8, 8, SwanIndex::Bitmask, ValueKind::Int8);
    let sparse_row = c.sparse_token_bytes(d);
    let want = plain.cache().bytes().total() + heads * 3 * (2 * 4 * d - sparse_row);
    assert_eq!(s.cache().bytes().total(), want, "3 f32 rows for 3 sparse rows per head");
    assert_eq!(s.cache().len(), plain.cache().len());
    assert!(s.cache().label().contains(" sink=3"), "{}", s.cache().label());
    assert!(matches!(s.cache().image(), Err(Error::NotPersistable { .. })));
}

/// `queries=int8` is for caches with int8 or 4-bit keys: others refuse it with a typed error; with
/// int8 keys it builds where the CPU runs it (and is a typed error where it does not).
/// Heads narrower than 64 components keep f32 products, so these 32-wide heads score
/// exactly as with `queries=f32` (the integer products are checked in attn-kernels).
#[test]
fn int8_queries_need_int8_keys() {
    let wide = Checkpoint::load(&fixtures().join(WIDE_HEADS)).unwrap();
    for text in ["dense:format=f32,queries=int8", "swan:k=8,value=fp8,basis=random:2,queries=int8"]
    {
        let spec: CacheSpec = text.parse().unwrap();
        let err = spec.build(&wide.model).err().unwrap_or_else(|| panic!("{text} built"));
        assert!(matches!(err, Error::InvalidInput { .. }), "{text}: {err}");
        assert!(err.to_string().contains("no int8 keys"), "{text}: {err}");
    }
    for (text, f32_text) in [
        ("dense:format=int8,queries=int8", "dense:format=int8,queries=f32"),
        ("dense:format=int4,queries=int8", "dense:format=int4"),
        (
            "swan:k=8,index=bitmask,value=int8,basis=random:2,queries=int8",
            "swan:k=8,index=bitmask,value=int8,basis=random:2",
        ),
    ] {
        let spec: CacheSpec = text.parse().unwrap();
        assert_eq!(spec.queries, Some(attn_kernels::QueryPrecision::Int8));
        if !attn_kernels::QueryPrecision::Int8.is_available() {
            assert!(matches!(spec.build(&wide.model), Err(Error::Attention(_))), "{text}");
            continue;
        }
        let ((_, a), (_, b)) = (run(&wide, text), run(&wide, f32_text));
        assert_eq!(a, b, "{text}: 32-wide heads keep f32 products");
    }
}

/// `queries=q8_0` rounds the queries of a quantized dense or SWAN cache to `q8_0` blocks,
/// whatever its key format (a lossy setting: the scores move), and a dense float cache
/// refuses it with a typed error.
#[test]
fn q8_0_queries_round_the_queries_of_quantized_caches() {
    let wide = Checkpoint::load(&fixtures().join(WIDE_HEADS)).unwrap();
    let err = "dense:format=f32,queries=q8_0".parse::<CacheSpec>().unwrap().build(&wide.model);
    let err = err.err().expect("a float cache takes f32 queries only");
    assert!(matches!(err, Error::InvalidInput { .. }) && err.to_string().contains("q8_0"), "{err}");
    for base in [
        "dense:format=int4",
        "dense:format=int8,values=int4,rotate=hadamard",
        "swan:k=8,index=bitmask,value=int4,b=4,basis=random:2",
    ] {
        let text = format!("{base},queries=q8_0");
        let spec: CacheSpec = text.parse().unwrap();
        assert_eq!(spec.queries, Some(attn_kernels::QueryPrecision::Q8Blocks));
        let ((q8, a), (_, b)) = (run(&wide, &text), run(&wide, base));
        assert!(q8.cache().label().ends_with(" queries=q8_0"), "{}", q8.cache().label());
        assert_ne!(a, b, "{text}: the rounded queries move the scores");
        assert!((a / b - 1.0).abs() < 0.05, "{text}: {a} vs {b}");
    }
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

/// A decode step holding NaN or ∞ in its query, key or value is a typed error at every
/// cache, and the cache is left as it was: same length, and the next good step gives the
/// output a cache that never saw the bad step gives.
#[test]
fn non_finite_steps_are_rejected_and_change_nothing() {
    use models::cache::{LayerKv, StepQkv};
    let ckpt = Checkpoint::load(&fixtures().join("tiny/llama-gqa")).unwrap();
    for text in [
        "dense:format=f32",
        "swan:k=8,value=fp8,b=2,basis=random:3",
        "swan:k=8,value=fp8,b=2,basis=random:3,sink=20",
        "tiered:span=2..10,policy=wnw,r_gpu=0.5",
        "swan+tiered:k=8,value=fp8,basis=random:3,span=2..10,policy=wnw,r_gpu=0.5",
    ] {
        let spec: CacheSpec = text.parse().unwrap();
        let (_, mut caches) = spec.build_many(&ckpt.model, 2).unwrap();
        let shape = caches[0].shape();
        let (nq, nkv, tokens) =
            (shape.q_heads() * shape.head_dim(), shape.kv_heads() * shape.head_dim(), 12);
        let row = |n: usize, seed: usize| -> Vec<f32> {
            (0..n).map(|i| (((i * 31 + seed * 17) % 23) as f32 - 11.0) / 8.0).collect()
        };
        let kv = row(nkv * tokens, 1);
        for cache in caches.iter_mut() {
            cache.reserve(tokens + 4).unwrap();
            let request = cache.attention_request(tokens);
            for layer in 0..shape.layers {
                if let Some(r) = &request {
                    let received = row(shape.q_heads() * r.keys.len(), layer)
                        .iter()
                        .map(|x| x.abs())
                        .collect::<Vec<_>>();
                    cache.prefill_attention(layer, &received).unwrap();
                }
                let prompt = LayerKv { keys: &kv, values: &kv, tokens };
                cache.prefill(layer, prompt).unwrap();
            }
        }
        let (q, k, v) = (row(nq, 2), row(nkv, 3), row(nkv, 4));
        let mut out = vec![0f32; nq];
        for (which, bad) in [(0, f32::NAN), (1, f32::INFINITY), (2, f32::NEG_INFINITY)] {
            let mut rows = [q.clone(), k.clone(), v.clone()];
            rows[which][1] = bad;
            let step = StepQkv { q: &rows[0], k: &rows[1], v: &rows[2] };
            assert!(caches[0].decode(0, step, &mut out).is_err(), "{text}: row {which} = {bad}");
            assert_eq!(caches[0].len(), tokens, "{text}: a rejected step changed the length");
        }
        let mut outs = [vec![0f32; nq], vec![0f32; nq]];
        for (cache, out) in caches.iter_mut().zip(&mut outs) {
            for layer in 0..shape.layers {
                cache.decode(layer, StepQkv { q: &q, k: &k, v: &v }, out).unwrap();
            }
        }
        assert_eq!(outs[0], outs[1], "{text}: the rejected steps left a trace");
    }
}

/// One forward shared by several caches of the same prompt (`Llama::prefill_shared`) leaves
/// every cache exactly as its own prefill would: same bytes, same logits, and bit-identical
/// logits through the decode steps that follow — for dense, quantized and SWAN caches (no
/// prefill statistics) and for tiered caches, which ask for the prompt's attention and so
/// share a forward only with caches asking the same.
#[test]
fn a_shared_prefill_leaves_every_cache_as_its_own_prefill_would() {
    use models::llama::{DecodeScratch, NoObserver};
    let ckpt = Checkpoint::load(&fixtures().join("tiny/llama-gqa")).unwrap();
    let prompt: Vec<u32> = (0..40u32).map(|i| (i * 53 + 7) % 256).collect();
    let next: Vec<u32> = (0..6u32).map(|i| (i * 31 + 3) % 256).collect();
    let specs = [
        "dense:format=f32",
        "dense:format=f16",
        "swan:k=8,index=bitmask,value=int8,b=8,basis=random:2",
        "swan:k=8,value=fp8,b=8,basis=random:2",
        "tiered:span=4..36,segment=4,chunk=8,policy=wnw,r_gpu=0.5,n_voice=3,n_anchor=1,format=f32",
        "tiered:span=4..36,segment=4,chunk=8,policy=snapkv,r_gpu=0.5,n_voice=3,n_anchor=1,format=f32",
    ];
    for spec in specs {
        let parsed: CacheSpec = spec.parse().unwrap();
        let (model, mut caches) = parsed.build_many(&ckpt.model, 3).unwrap();
        let own = model.prefill(&prompt, Some(caches[0].as_mut()), &mut NoObserver, false).unwrap();
        let shared = {
            let mut rest: Vec<&mut dyn models::cache::KvCache> = caches[1..]
                .iter_mut()
                .map(|c| c.as_mut() as &mut dyn models::cache::KvCache)
                .collect();
            model.prefill_shared(&prompt, &mut rest).unwrap()
        };
        assert!(own.equal(&shared), "{spec}: prefill logits differ");
        let bytes = caches[0].bytes();
        assert!(caches.iter().all(|c| c.bytes() == bytes && c.len() == prompt.len()), "{spec}");
        let mut scratch = DecodeScratch::new(model.config()).unwrap();
        for (i, &id) in next.iter().enumerate() {
            let logits: Vec<_> = caches
                .iter_mut()
                .map(|c| model.decode(id, prompt.len() + i, c.as_mut(), &mut scratch).unwrap())
                .collect();
            assert!(logits.iter().all(|l| l.equal(&logits[0])), "{spec}: step {i} differs");
        }
    }
    let empty: &mut [&mut dyn models::cache::KvCache] = &mut [];
    let err = "dense"
        .parse::<CacheSpec>()
        .unwrap()
        .build(&ckpt.model)
        .unwrap()
        .0
        .prefill_shared(&prompt, empty);
    assert!(matches!(err, Err(Error::InvalidInput { .. })), "{err:?}");
}

/// `score` with prefix 0 feeds the first token through the decode path as well (as an engine
/// running the whole text through its cache does): a lossless cache scores what a one-token
/// prefill scores, an fp8 cache does not (its first position attends to its own rounded
/// value), and a prefix that leaves nothing to score is refused.
#[test]
fn score_with_no_prefix_decodes_the_first_token_too() {
    let ckpt = Checkpoint::load(&fixtures().join("tiny/llama-gqa")).unwrap();
    let ids: Vec<u32> = (0..48u32).map(|i| (i * 53 + 7) % 256).collect();
    let nlls = |spec: &str, prefix: usize| -> Vec<f64> {
        let spec: CacheSpec = spec.parse().unwrap();
        let (model, cache) = spec.build(&ckpt.model).unwrap();
        let mut session = Session::new(model, cache).unwrap();
        let s = models::score(&mut session, &ids, prefix, &mut |_, _| Ok(()), &mut |_| ()).unwrap();
        assert_eq!(s.decoded, ids.len() - 1 - prefix.max(1));
        s.nll
    };
    let (decoded, prefilled) = (nlls("dense:format=f32", 0), nlls("dense:format=f32", 1));
    assert_eq!(decoded.len(), ids.len() - 1);
    let worst = decoded.iter().zip(&prefilled).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
    assert!(worst < 1e-4, "lossless: {worst:e}");
    assert_ne!(nlls("dense:format=fp8", 0), nlls("dense:format=fp8", 1));
    let spec: CacheSpec = "dense:format=f32".parse().unwrap();
    let (model, cache) = spec.build(&ckpt.model).unwrap();
    let mut session = Session::new(model, cache).unwrap();
    for (text, prefix) in [(&ids[..], ids.len()), (&ids[..1], 0)] {
        assert!(matches!(
            models::score(&mut session, text, prefix, &mut |_, _| Ok(()), &mut |_| ()),
            Err(Error::InvalidInput { .. })
        ));
    }
}
