//! GGUF loading end to end: a tiny Llama written as GGUF the way llama.cpp's converter
//! writes it (q/k rows permuted for its GPT-J RoPE) must give the safetensors model's
//! logits; and every truncation and single-byte corruption of a GGUF file is a typed error
//! or a valid file — never a panic.

mod common;

use common::{fixtures, max_abs};
use models::llama::NoObserver;
use models::load::gguf::{GgmlType, GgufError, GgufFile, GgufSource, GgufWriter, MetaValue};
use models::load::weights::{SafetensorsSource, WeightSource};
use models::{Checkpoint, Error, Llama};
use tch::{Kind, Tensor};

fn str_meta(s: &str) -> MetaValue {
    MetaValue::String(s.into())
}

/// llama.cpp's `permute`: rows of each head from `[2, d/2]` to `[d/2, 2]` order.
fn permute(t: &Tensor, heads: i64) -> Tensor {
    let size = t.size();
    t.reshape([heads, 2, size[0] / heads / 2, size[1]]).transpose(1, 2).reshape(&size[..])
}

fn gguf_name(hf: &str) -> String {
    let fixed = [
        ("model.embed_tokens.weight", "token_embd.weight"),
        ("model.norm.weight", "output_norm.weight"),
        ("lm_head.weight", "output.weight"),
    ];
    if let Some((_, g)) = fixed.iter().find(|(h, _)| *h == hf) {
        return g.to_string();
    }
    let rest = hf.strip_prefix("model.layers.").unwrap();
    let (layer, rest) = rest.split_once('.').unwrap();
    let module = [
        ("input_layernorm.", "attn_norm."),
        ("self_attn.q_proj.", "attn_q."),
        ("self_attn.k_proj.", "attn_k."),
        ("self_attn.v_proj.", "attn_v."),
        ("self_attn.o_proj.", "attn_output."),
        ("post_attention_layernorm.", "ffn_norm."),
        ("mlp.gate_proj.", "ffn_gate."),
        ("mlp.up_proj.", "ffn_up."),
        ("mlp.down_proj.", "ffn_down."),
    ];
    let (h, g) = module.iter().find(|(h, _)| rest.starts_with(h)).unwrap();
    format!("blk.{layer}.{g}{}", &rest[h.len()..])
}

/// How the tiny Llama's matrices are stored in GGUF.
#[derive(Clone, Copy, PartialEq)]
enum Matrices {
    /// F32, the safetensors values.
    F32,
    /// F16.
    F16,
    /// F32 holding the values rounded to f16 (what an exact F16 loader must reproduce).
    F32RoundedToF16,
}

/// The tiny GQA Llama as a GGUF file, its matrices stored as `mat` (1-D tensors in F32).
fn tiny_llama_gguf(mat: Matrices) -> (Vec<u8>, Checkpoint) {
    let dir = fixtures().join("tiny/llama-gqa");
    let ckpt = Checkpoint::load(&dir).unwrap();
    let c = &ckpt.config;
    let src = SafetensorsSource::open_dir(&dir).unwrap();
    let mut w = GgufWriter::new()
        .metadata("general.architecture", str_meta("llama"))
        .metadata("general.name", str_meta("tiny"))
        .metadata("llama.block_count", MetaValue::U32(c.num_layers as u32))
        .metadata("llama.embedding_length", MetaValue::U32(c.hidden_size as u32))
        .metadata("llama.feed_forward_length", MetaValue::U32(c.intermediate_size as u32))
        .metadata("llama.attention.head_count", MetaValue::U32(c.q_heads as u32))
        .metadata("llama.attention.head_count_kv", MetaValue::U32(c.kv_heads as u32))
        .metadata("llama.context_length", MetaValue::U32(512))
        .metadata("llama.rope.freq_base", MetaValue::F32(c.rope.theta as f32))
        .metadata("llama.attention.layer_norm_rms_epsilon", MetaValue::F32(c.rms_norm_eps as f32))
        .metadata("llama.vocab_size", MetaValue::U32(c.vocab_size as u32));
    for name in src.names() {
        let mut t = src.load(name, Kind::Float).unwrap();
        if name.contains("q_proj") {
            t = permute(&t, c.q_heads as i64);
        } else if name.contains("k_proj") {
            t = permute(&t, c.kv_heads as i64);
        }
        let shape: Vec<usize> = t.size().iter().map(|&d| d as usize).collect();
        let mut values = Vec::<f32>::try_from(t.flatten(0, -1)).unwrap();
        if mat == Matrices::F32RoundedToF16 && shape.len() == 2 {
            values.iter_mut().for_each(|v| *v = half::f16::from_f32(*v).to_f32());
        }
        w = if mat == Matrices::F16 && shape.len() == 2 {
            let bytes = values.iter().flat_map(|&v| half::f16::from_f32(v).to_le_bytes()).collect();
            w.tensor(&gguf_name(name), &shape, GgmlType::F16, bytes)
        } else {
            w.tensor_f32(&gguf_name(name), &shape, &values)
        };
    }
    (w.to_bytes(), ckpt)
}

fn load(bytes: Vec<u8>) -> models::Result<Llama> {
    let (src, cfg) = GgufSource::from_file(GgufFile::from_bytes(bytes)?, "test".into())?;
    Llama::load(&src, &cfg)
}

fn logits(model: &Llama) -> Tensor {
    let ids: Vec<u32> = (0..24).map(|i| (i * 29 + 3) % 256).collect();
    model.prefill(&ids, None, &mut NoObserver, true).unwrap()
}

#[test]
fn llama_written_as_gguf_matches_safetensors() {
    let (bytes, ckpt) = tiny_llama_gguf(Matrices::F32);
    let err = max_abs(&logits(&load(bytes).unwrap()), &logits(&ckpt.model));
    assert!(err <= 1e-5, "F32 GGUF vs safetensors: max abs {err:e}");
    // F16 dequantisation is exact: the F16 file gives the logits of f16-rounded weights.
    let (bytes, _) = tiny_llama_gguf(Matrices::F16);
    let f16 = logits(&load(bytes).unwrap());
    let (bytes, _) = tiny_llama_gguf(Matrices::F32RoundedToF16);
    let err = max_abs(&f16, &logits(&load(bytes).unwrap()));
    assert!(err <= 1e-5, "F16 GGUF vs the same weights in F32: max abs {err:e}");
}

#[test]
fn every_truncation_and_corruption_is_typed() {
    let bytes = GgufWriter::new()
        .metadata("general.architecture", str_meta("llama"))
        .metadata("tokens", MetaValue::Array(vec![str_meta("a"), str_meta("bc")]))
        .metadata("flag", MetaValue::Bool(true))
        .tensor_f32("t", &[2, 32], &[0.5; 64])
        .tensor("q", &[1, 32], GgmlType::Q8_0, vec![0; 34])
        .to_bytes();
    let full = GgufFile::from_bytes(bytes.clone()).unwrap();
    assert_eq!(full.tensors().len(), 2);
    for n in 0..bytes.len() {
        match GgufFile::from_bytes(bytes[..n].to_vec()) {
            Err(
                Error::Gguf(GgufError::Truncated { .. }) | Error::Gguf(GgufError::Invalid { .. }),
            ) => {}
            other => panic!("truncated at {n}: {:?}", other.map(|f| f.tensors().len())),
        }
    }
    for i in 0..bytes.len() {
        for flip in [0xff, 0x80, 0x01] {
            let mut bad = bytes.clone();
            bad[i] ^= flip;
            if let Ok(f) = GgufFile::from_bytes(bad) {
                for t in f.tensors().to_vec() {
                    let _ = f.dequantize(&t.name); // may fail (unsupported type), must not panic
                }
            }
        }
    }
}

#[test]
fn missing_misshaped_and_unsupported_tensors_are_typed() {
    let (bytes, _) = tiny_llama_gguf(Matrices::F32);
    let file = GgufFile::from_bytes(bytes).unwrap();
    let rebuild = |skip: &str, reshape: Option<&str>, retype: Option<&str>| {
        let mut w = GgufWriter::new();
        for (k, v) in file.metadata() {
            w = w.metadata(k, v.clone());
        }
        for t in file.tensors() {
            if t.name == skip {
                continue;
            }
            let data = file.tensor_data(t).to_vec();
            w = if reshape == Some(t.name.as_str()) {
                w.tensor(&t.name, &[t.shape[1], t.shape[0]], t.ty, data)
            } else if retype == Some(t.name.as_str()) {
                w.tensor(&t.name, &[256], GgmlType::from_id(16).unwrap(), vec![0; 66])
            } else {
                w.tensor(&t.name, &t.shape, t.ty, data)
            };
        }
        w.to_bytes()
    };
    let e = load(rebuild("blk.1.ffn_up.weight", None, None)).err().unwrap();
    assert!(
        matches!(e, Error::MissingTensor { ref name } if name == "model.layers.1.mlp.up_proj.weight"),
        "{e}"
    );
    let e = load(rebuild("", Some("blk.0.ffn_down.weight"), None)).err().unwrap();
    assert!(matches!(e, Error::TensorShape { .. }), "{e}");
    let e = load(rebuild("", None, Some("blk.0.attn_norm.weight"))).err().unwrap();
    assert!(
        matches!(
            e,
            Error::TensorShape { .. } | Error::Gguf(GgufError::UnsupportedTensorType { .. })
        ),
        "{e}"
    );
    let iq2 = GgufWriter::new()
        .tensor("k", &[256], GgmlType::from_id(16).unwrap(), vec![0; 66])
        .to_bytes();
    let e = GgufFile::from_bytes(iq2).unwrap().dequantize("k").err().unwrap();
    assert!(
        matches!(e, Error::Gguf(GgufError::UnsupportedTensorType { ref dtype, .. }) if dtype == "IQ2_XXS"),
        "{e}"
    );
}

#[test]
fn truncated_real_model_is_a_typed_error() {
    let path = common::default_model();
    let bytes = std::fs::read(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (run scripts/setup.sh)", path.display()));
    for cut in [8, 1 << 20, bytes.len() / 2, bytes.len() - 1] {
        let e = GgufFile::from_bytes(bytes[..cut].to_vec()).err().unwrap();
        assert!(matches!(e, Error::Gguf(GgufError::Truncated { .. })), "cut at {cut}: {e}");
    }
    let missing = Checkpoint::load(std::path::Path::new("/nonexistent/model.gguf")).err().unwrap();
    assert!(matches!(missing, Error::Io { .. }), "{missing}");
}

/// The Gemma 3 270M file mixes F32, Q8_0, Q5_0, Q4_K and Q6_K tensors: every one of them
/// dequantises to finite values, and one tensor of each type equals PyPI `gguf`'s
/// dequantisation bit for bit (FNV-1a 64 of the f32 bytes, `fixtures/gguf_quants/
/// gemma3_tensors.json`). Its metadata reads as Gemma 3: 512-position windows, 3 global layers.
#[test]
fn gemma3_k_quant_tensors_dequantise_like_pypi_gguf() {
    let path = common::gemma_model();
    if !path.exists() {
        eprintln!("SKIPPED: {} is absent (run scripts/setup.sh gemma)", path.display());
        return;
    }
    let file = GgufFile::open(&path).unwrap();
    let mut types = std::collections::BTreeSet::new();
    for t in file.tensors() {
        let (values, shape) = file.dequantize(&t.name).unwrap();
        assert_eq!((values.len(), &shape), (t.n_elements(), &t.shape), "{}", t.name);
        assert!(
            values.iter().all(|v| v.is_finite()),
            "{} ({}) has non-finite values",
            t.name,
            t.ty
        );
        types.insert(t.ty.name());
    }
    assert_eq!(types.into_iter().collect::<Vec<_>>(), ["F32", "Q4_K", "Q5_0", "Q6_K", "Q8_0"]);
    let reference = common::read_json(&common::fixtures().join("gguf_quants/gemma3_tensors.json"));
    for r in reference["tensors"].as_array().unwrap() {
        let name = r["name"].as_str().unwrap();
        let (values, _) = file.dequantize(name).unwrap();
        assert_eq!(file.tensor_info(name).unwrap().ty.name(), r["type"].as_str().unwrap());
        let hash = common::fnv1a64(values.iter().flat_map(|v| v.to_le_bytes()));
        assert_eq!(format!("{hash:016x}"), r["fnv1a64_f32_le"].as_str().unwrap(), "{name}");
    }
    let cfg = models::load::gguf::config_from_gguf(&file).unwrap();
    assert_eq!(cfg.arch, models::Architecture::Gemma3);
    let local = cfg.local_attention.as_ref().unwrap();
    assert_eq!((local.window, local.local.iter().filter(|&&l| !l).count()), (512, 3));
}

/// A GGUF v3 header with no tensors and one metadata entry whose key and (type tag, value)
/// bytes are given raw: the parser's metadata path through its public entry point.
fn one_entry(key: &[u8], entry: &[u8]) -> Vec<u8> {
    let mut b = b"GGUF".to_vec();
    b.extend_from_slice(&3u32.to_le_bytes());
    b.extend_from_slice(&0u64.to_le_bytes()); // tensors
    b.extend_from_slice(&1u64.to_le_bytes()); // metadata entries
    b.extend_from_slice(&(key.len() as u64).to_le_bytes());
    b.extend_from_slice(key);
    b.extend_from_slice(entry);
    b
}

/// Type tag 9 (array) of `len` elements of type `ty`, then `payload`.
fn array_entry(ty: u32, len: u64, payload: &[u8]) -> Vec<u8> {
    let mut b = 9u32.to_le_bytes().to_vec();
    b.extend_from_slice(&ty.to_le_bytes());
    b.extend_from_slice(&len.to_le_bytes());
    b.extend_from_slice(payload);
    b
}

fn gguf_err(bytes: Vec<u8>) -> GgufError {
    match GgufFile::from_bytes(bytes) {
        Err(Error::Gguf(e)) => e,
        other => panic!("expected a GGUF error, got {:?}", other.map(|f| f.version())),
    }
}

#[test]
fn metadata_strings_and_arrays_parse_and_report_truncation() {
    let mut entry = 8u32.to_le_bytes().to_vec();
    entry.extend_from_slice(&3u64.to_le_bytes());
    entry.extend_from_slice(b"abc");
    let file = GgufFile::from_bytes(one_entry(b"k", &entry)).unwrap();
    assert_eq!(file.get("k"), Some(&str_meta("abc")));
    let ints = array_entry(5, 2, &[1, 0, 0, 0, 0xff, 0xff, 0xff, 0xff]);
    let file = GgufFile::from_bytes(one_entry(b"k", &ints)).unwrap();
    let v = file.get("k").unwrap();
    assert_eq!(v, &MetaValue::Array(vec![MetaValue::I32(1), MetaValue::I32(-1)]));
    assert_eq!(
        (v.as_array().unwrap()[1].as_i64(), v.as_array().unwrap()[1].as_u64()),
        (Some(-1), None)
    );
    let cut = one_entry(b"k", &entry[..entry.len() - 1]);
    assert!(matches!(
        gguf_err(cut),
        GgufError::Truncated { what: "string value", needed: 3, available: 2, .. }
    ));
}

#[test]
fn huge_string_length_is_truncation_not_allocation() {
    let mut b = one_entry(b"", &[0; 32]);
    let at = b.len() - 40;
    b[at..at + 8].copy_from_slice(&u64::MAX.to_le_bytes()); // the key's length
    let e = gguf_err(b);
    assert!(matches!(e, GgufError::Truncated { needed: u64::MAX, .. }), "{e}");
}

#[test]
fn invalid_utf8_is_typed() {
    let mut entry = 8u32.to_le_bytes().to_vec();
    entry.extend_from_slice(&1u64.to_le_bytes());
    entry.push(b'x');
    assert!(matches!(gguf_err(one_entry(&[0xff], &entry)), GgufError::Invalid { .. }));
}

#[test]
fn huge_array_count_is_rejected_before_allocating() {
    let b = one_entry(b"k", &array_entry(8, u64::MAX / 2, &[]));
    assert!(matches!(gguf_err(b), GgufError::Truncated { what: "array elements", .. }));
}

#[test]
fn bad_bool_unknown_type_and_deep_nesting_are_typed() {
    let bad_bool = [7u32.to_le_bytes().as_slice(), &[2]].concat();
    assert!(matches!(gguf_err(one_entry(b"k", &bad_bool)), GgufError::Invalid { .. }));
    let unknown = [13u32.to_le_bytes().as_slice(), &[0; 8]].concat();
    assert!(matches!(gguf_err(one_entry(b"k", &unknown)), GgufError::Invalid { .. }));
    let mut nested = 9u32.to_le_bytes().to_vec();
    for _ in 0..8 {
        nested.extend_from_slice(&9u32.to_le_bytes());
        nested.extend_from_slice(&1u64.to_le_bytes());
    }
    nested.extend_from_slice(&[0; 64]);
    let e = gguf_err(one_entry(b"k", &nested));
    assert!(matches!(e, GgufError::Invalid { ref reason, .. } if reason.contains("nested")), "{e}");
}
