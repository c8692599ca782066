//! Fuzz harness for GGUF files (`models::load::gguf::GgufFile::from_bytes`) and everything read
//! from their metadata: the model config (`config_from_gguf`), the byte-level BPE
//! tokenizer (`Tokenizer::from_gguf`) and the chat template (`ChatTemplate::from_gguf`).
//!
//! Oracle: bytes either give a typed error, or a file whose every tensor's data lies inside
//! it and dequantises (supported types) to exactly its element count — unsupported types
//! give `UnsupportedTensorType`; a config read from it passes `validate()`; a tokenizer
//! built from it encodes and decodes a short text without panicking. Any panic, abort or
//! UB is a bug.

use models::load::gguf::GgufError;
use models::load::gguf::{GgmlType, GgufFile, GgufWriter, MetaValue, config_from_gguf};
use models::{ChatMessage, ChatTemplate, Error, Tokenizer};

/// Tensors up to this many elements are dequantised (keeps each fuzz input fast; the
/// parser still validates every tensor).
const DEQUANT_LIMIT: usize = 1 << 16;

/// Parses `data` and, if it is accepted, exercises everything read from it.
pub fn check(data: &[u8]) {
    match GgufFile::from_bytes(data.to_vec()) {
        Ok(file) => exercise(&file),
        Err(e) => assert!(!e.to_string().is_empty()),
    }
}

fn exercise(file: &GgufFile) {
    assert!(matches!(file.version(), 2 | 3));
    for t in file.tensors() {
        assert_eq!(file.tensor_data(t).len() as u64, t.n_bytes);
        assert_eq!(file.tensor_info(&t.name), Some(t));
        if t.n_elements() > DEQUANT_LIMIT {
            continue;
        }
        match file.dequantize(&t.name) {
            Ok((values, shape)) => {
                assert_eq!(values.len(), t.n_elements());
                assert_eq!(shape, t.shape);
            }
            Err(Error::Gguf(GgufError::UnsupportedTensorType { .. })) => {
                assert!(!t.ty.is_supported())
            }
            Err(e) => panic!("dequantising `{}` ({}): {e}", t.name, t.ty),
        }
    }
    if let Ok(cfg) = config_from_gguf(file) {
        cfg.validate().expect("a config from GGUF validates");
    }
    if let Ok(tok) = Tokenizer::from_gguf(file)
        && let Ok(ids) = tok.encode("To be, or not to be")
    {
        let _ = tok.decode(&ids);
        let _ = tok.tokens(&ids);
    }
    if let Some(template) = ChatTemplate::from_gguf(file) {
        let _ = template.render(&[ChatMessage::new("user", "Who is there?")], true);
    }
}

fn string(s: &str) -> MetaValue {
    MetaValue::String(s.into())
}

fn strings(items: &[&str]) -> MetaValue {
    MetaValue::Array(items.iter().map(|s| string(s)).collect())
}

/// A toy byte-level BPE vocabulary with merges, special tokens and a chat template.
fn with_tokenizer(w: GgufWriter) -> GgufWriter {
    let tokens = [
        "<|endoftext|>",
        "<|im_start|>",
        "<|im_end|>",
        "T",
        "o",
        "Ġ",
        "b",
        "e",
        ",",
        "r",
        "n",
        "t",
        "To",
        "Ġb",
        "Ġbe",
        "Ġt",
        "Ġto",
    ];
    let types: Vec<MetaValue> =
        (0..tokens.len()).map(|i| MetaValue::I32(if i < 3 { 3 } else { 1 })).collect();
    let template = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}\
                    <|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n\
                    {% endif %}";
    w.metadata("tokenizer.ggml.model", string("gpt2"))
        .metadata("tokenizer.ggml.tokens", strings(&tokens))
        .metadata("tokenizer.ggml.merges", strings(&["T o", "Ġ b", "Ġb e", "Ġ t", "Ġt o"]))
        .metadata("tokenizer.ggml.token_type", MetaValue::Array(types))
        .metadata("tokenizer.ggml.bos_token_id", MetaValue::U32(1))
        .metadata("tokenizer.ggml.eos_token_id", MetaValue::U32(2))
        .metadata("tokenizer.ggml.add_bos_token", MetaValue::Bool(false))
        .metadata("tokenizer.chat_template", string(template))
}

/// Llama hyper-parameters for a 1-layer toy model.
fn with_llama_config(w: GgufWriter) -> GgufWriter {
    w.metadata("general.architecture", string("llama"))
        .metadata("general.name", string("toy"))
        .metadata("llama.block_count", MetaValue::U32(1))
        .metadata("llama.context_length", MetaValue::U32(64))
        .metadata("llama.embedding_length", MetaValue::U32(8))
        .metadata("llama.feed_forward_length", MetaValue::U32(16))
        .metadata("llama.attention.head_count", MetaValue::U32(2))
        .metadata("llama.attention.head_count_kv", MetaValue::U32(1))
        .metadata("llama.rope.freq_base", MetaValue::F32(10_000.0))
        .metadata("llama.attention.layer_norm_rms_epsilon", MetaValue::F32(1e-5))
}

/// Raw bytes of `blocks` blocks of `ty`, deterministic and finite (f16 scales of 1/64).
fn quant_bytes(ty: GgmlType, blocks: usize) -> Vec<u8> {
    let block = ty.block_bytes() as usize;
    let scale = half::f16::from_f32(1.0 / 64.0).to_le_bytes();
    (0..blocks)
        .flat_map(|b| {
            (0..block).map(move |i| match i {
                0 | 1 => scale[i],
                2 | 3 if ty == GgmlType::Q4_1 => scale[i - 2],
                _ => (b * 31 + i * 7) as u8,
            })
        })
        .collect()
}

/// One tensor of several supported types, plus an unsupported one (`IQ2_XXS`).
fn with_tensors(w: GgufWriter) -> GgufWriter {
    let f16: Vec<u8> =
        (0..16).flat_map(|i| half::f16::from_f32(i as f32 * 0.5).to_le_bytes()).collect();
    let bf16: Vec<u8> =
        (0..16).flat_map(|i| half::bf16::from_f32(i as f32 - 8.0).to_le_bytes()).collect();
    let iq2 = GgmlType::from_id(16).expect("IQ2_XXS");
    w.tensor_f32(
        "token_embd.weight",
        &[17, 8],
        &(0..136).map(|i| i as f32 * 0.01).collect::<Vec<_>>(),
    )
    .tensor("blk.0.attn_norm.weight", &[16], GgmlType::F16, f16)
    .tensor("blk.0.ffn_norm.weight", &[16], GgmlType::BF16, bf16)
    .tensor("blk.0.attn_q.weight", &[2, 32], GgmlType::Q8_0, quant_bytes(GgmlType::Q8_0, 2))
    .tensor("blk.0.attn_k.weight", &[1, 64], GgmlType::Q4_0, quant_bytes(GgmlType::Q4_0, 2))
    .tensor("blk.0.attn_v.weight", &[2, 32], GgmlType::Q4_1, quant_bytes(GgmlType::Q4_1, 2))
    .tensor("blk.0.ffn_up.weight", &[1, 256], iq2, quant_bytes(iq2, 1))
}

/// Valid files: a toy Llama with tokenizer, template and every tensor type; metadata of
/// every value type (incl. nested arrays); an empty file; a tensor-only file.
pub fn seeds() -> Vec<Vec<u8>> {
    let all_types = GgufWriter::new()
        .metadata("u8", MetaValue::U8(1))
        .metadata("i8", MetaValue::I8(-1))
        .metadata("u16", MetaValue::U16(2))
        .metadata("i16", MetaValue::I16(-2))
        .metadata("u32", MetaValue::U32(3))
        .metadata("i32", MetaValue::I32(-3))
        .metadata("f32", MetaValue::F32(0.5))
        .metadata("bool", MetaValue::Bool(true))
        .metadata("u64", MetaValue::U64(4))
        .metadata("i64", MetaValue::I64(-4))
        .metadata("f64", MetaValue::F64(0.25))
        .metadata("general.alignment", MetaValue::U32(64))
        .metadata(
            "nested",
            MetaValue::Array(vec![strings(&["a", "b"]), MetaValue::Array(vec![MetaValue::U8(7)])]),
        )
        .tensor_f32("x", &[2, 2], &[1.0, 2.0, 3.0, 4.0]);
    vec![
        with_tensors(with_tokenizer(with_llama_config(GgufWriter::new()))).to_bytes(),
        with_tokenizer(with_llama_config(GgufWriter::new())).to_bytes(),
        all_types.to_bytes(),
        GgufWriter::new().to_bytes(),
        with_tensors(GgufWriter::new()).to_bytes(),
    ]
}
