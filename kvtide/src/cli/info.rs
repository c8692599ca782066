//! `kvtide info`: the model's shape and what one token costs in KV memory for every cache
//! format — dense rows (`2·d_h` bytes per vector at 16 bits; fp8 with a 2-byte per-token
//! scale; int8 / int4 in 34- / 18-byte blocks of 32, also int8 keys with int4 values and the
//! reverse) and SWAN sparse rows in every encoding
//! (`3k+2` bytes at 16 bits with u8 indices, `2k+2` at fp8; `⌈d_h/8⌉ + k + 4` for a bitmask
//! with int8 values; `papers/swan.txt`, memory section) — with SWAN's compute break-even
//! length `b + d_h²/(d_h − k)` for `b = 128`. On a model with sliding-window layers
//! (Gemma 3) the per-token figures are those of the global layers, and the local layers'
//! windows are a fixed cost of their own (a dense ring of `window` positions each), listed
//! for every ring format a spec takes (`ring=`, with `ring_values=` for value rows of their
//! own).

use crate::Result;
use clap::Args;
use kv_sparse::ValueFormat;
use kv_sparse::coded::ValueKind;
use kv_sparse::memory::{break_even_len, dense_row_bytes};
use kv_sparse::quant::{DenseCodec, Fp8Rows, Int4Blocks, Int8Blocks};
use models::cache::{SwanConfig, SwanIndex};
use models::{Architecture, LayerKind, ModelConfig};
use serde_json::json;

use crate::cli::common::{ModelArgs, print_json};

/// Arguments of `kvtide info`.
#[derive(Args, Debug)]
pub struct InfoArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
}

const BUFFER: usize = 128;

/// Parameters implied by the configuration.
fn parameters(c: &ModelConfig) -> usize {
    let (h, d, i) = (c.hidden_size, c.head_dim, c.intermediate_size);
    let attn = h * d * (2 * c.q_heads + 2 * c.kv_heads);
    let norms = if c.arch == Architecture::Gemma3 { 2 * d + 2 * h } else { 0 };
    let layer = attn + 3 * h * i + 2 * h + norms;
    let embed = c.vocab_size * h * if c.tie_word_embeddings { 1 } else { 2 };
    embed + c.num_layers * layer + h
}

/// Layers that keep every position (all of them unless the model has local layers).
fn global_layers(c: &ModelConfig) -> usize {
    (0..c.num_layers).filter(|&i| c.layer_kind(i) == LayerKind::Global).count()
}

/// `(local layers, window, bytes of all their full windows in f32, f16)`, if any.
fn windows(c: &ModelConfig) -> Option<(usize, usize, usize, usize)> {
    let window = c.local_attention.as_ref()?.window;
    let local = c.num_layers - global_layers(c);
    let full = |f| 2 * local * c.kv_heads * window * dense_row_bytes(c.head_dim, f);
    Some((local, window, full(ValueFormat::F32), full(ValueFormat::F16)))
}

/// `(key format, value format when it differs, bytes of one key row + one value row)` for
/// every dense format a spec takes for a cache (`format=`, `values=`) or a ring (`ring=`,
/// `ring_values=`) of heads of width `d`: the quantized block formats only where `d` is a
/// whole number of blocks.
fn pair_formats(d: usize) -> Vec<(String, Option<&'static str>, usize)> {
    let mut out: Vec<_> = [ValueFormat::F32, ValueFormat::F16, ValueFormat::Bf16]
        .into_iter()
        .map(|f| (f.to_string(), None, 2 * dense_row_bytes(d, f)))
        .collect();
    out.push(("fp8".into(), None, 2 * Fp8Rows::row_bytes(d)));
    if d.is_multiple_of(kv_sparse::quant::BLOCK) {
        let (q8, q4) = (Int8Blocks::row_bytes(d), Int4Blocks::row_bytes(d));
        out.push(("int8".into(), None, 2 * q8));
        out.push(("int4".into(), None, 2 * q4));
        out.push(("int8".into(), Some("int4"), q8 + q4));
        out.push(("int4".into(), Some("int8"), q4 + q8));
    }
    out
}

/// `(ring spec, bytes of every local layer's full window)` for each format a spec's `ring=`
/// (and `ring_values=`) takes: a key row and a value row per position, each in its format
/// (empty without local layers). A spec's `sink=N` adds `N` f32 key/value rows per layer and
/// kv-head to a quantized ring while the window holds them; not counted here.
fn ring_rows(c: &ModelConfig) -> Vec<(String, usize)> {
    let Some(local) = &c.local_attention else { return Vec::new() };
    let positions = (c.num_layers - global_layers(c)) * c.kv_heads * local.window;
    pair_formats(c.head_dim)
        .into_iter()
        .map(|(keys, values, pair)| {
            let values = values.map_or(String::new(), |v| format!(",ring_values={v}"));
            (format!("ring={keys}{values}"), positions * pair)
        })
        .collect()
}

/// `(label, bytes per token, break-even L)` rows: dense formats, then SWAN settings.
fn rows(c: &ModelConfig) -> Vec<(String, usize, Option<f64>)> {
    let vectors = 2 * global_layers(c) * c.kv_heads;
    let d = c.head_dim;
    // A key and a value vector per (global layer, kv-head), each in its format.
    let mut out: Vec<_> = pair_formats(d)
        .into_iter()
        .map(|(keys, values, pair)| {
            let values = values.map_or(String::new(), |v| format!(" values={v}"));
            (format!("dense {keys}{values}"), vectors / 2 * pair, None)
        })
        .collect();
    let values = [
        ValueKind::Elems(ValueFormat::F16),
        ValueKind::Elems(ValueFormat::Fp8E4M3),
        ValueKind::Int8,
        ValueKind::Int4,
    ];
    for index in [SwanIndex::List, SwanIndex::Bitmask] {
        if index == SwanIndex::List && d > 256 {
            continue; // u8 indices name at most 256 components
        }
        for value in values {
            for k in [d / 8, d / 4, d / 2, 3 * d / 4, d] {
                let mut cfg = SwanConfig::lossless(d, BUFFER);
                (cfg.k_key, cfg.k_value, cfg.index, cfg.value) = (k, k, index, value);
                let label = format!("swan k={k}/{d} {index} {value}");
                let bytes = vectors / 2 * cfg.sparse_token_bytes(d);
                out.push((label, bytes, break_even_len(d, BUFFER, k)));
            }
        }
    }
    out
}

/// Runs `kvtide info`.
pub fn run(a: &InfoArgs) -> Result<()> {
    let ckpt = a.model.load()?;
    let c = &ckpt.config;
    let dense16 =
        (2 * global_layers(c) * c.kv_heads * dense_row_bytes(c.head_dim, ValueFormat::F16)) as f64;
    let windows = windows(c);
    let table = rows(c);
    let rings = ring_rows(c);
    let ring16 = windows.map_or(0, |w| w.3) as f64;
    if a.json {
        let formats: Vec<_> = table
            .iter()
            .map(|(l, b, be)| json!({"format": l, "bytes_per_token": b, "ratio_to_dense_f16": *b as f64 / dense16, "break_even_len": be}))
            .collect();
        print_json(&json!({
            "model": c.name, "source": ckpt.source, "architecture": c.arch.name(), "layers": c.num_layers,
            "hidden": c.hidden_size, "q_heads": c.q_heads, "kv_heads": c.kv_heads, "head_dim": c.head_dim,
            "vocab": c.vocab_size, "rope_theta": c.rope.theta, "tied_embeddings": c.tie_word_embeddings,
            "parameters": parameters(c), "kv_bytes_per_token": formats, "swan_buffer": BUFFER,
            "global_layers": global_layers(c),
            "local_layers": windows.map(|w| json!({"layers": w.0, "window": w.1, "full_window_bytes_f32": w.2, "full_window_bytes_f16": w.3})),
            "ring_formats": rings.iter().map(|(r, b)| json!({"ring": r, "full_window_bytes": b, "ratio_to_f16": *b as f64 / ring16})).collect::<Vec<_>>(),
        }));
        return Ok(());
    }
    println!("{} ({}), {}", c.name, c.arch.name(), ckpt.source);
    println!(
        "{} layers, hidden {}, {} q heads / {} kv heads (group {}), head_dim {}, vocab {}, rope θ {}, {:.1} M parameters{}",
        c.num_layers,
        c.hidden_size,
        c.q_heads,
        c.kv_heads,
        c.group_size(),
        c.head_dim,
        c.vocab_size,
        c.rope.theta,
        parameters(c) as f64 / 1e6,
        if c.tie_word_embeddings { ", tied embeddings" } else { "" }
    );
    let scope = match windows {
        Some(_) => format!("the {} global layers", global_layers(c)),
        None => "all layers".to_string(),
    };
    if let Some((local, window, f32_bytes, f16_bytes)) = windows {
        println!(
            "{local} local layers attend to the last {window} positions and keep only them: a full window costs {f16_bytes} bytes at f16 ({f32_bytes} at f32), whatever the length"
        );
    }
    println!(
        "\nKV bytes per token ({scope}, keys + values; SWAN = sparse history rows, b = {BUFFER}):"
    );
    let w = table.iter().map(|r| r.0.chars().count()).max().unwrap_or(0).max(30);
    println!("{:<w$} {:>10} {:>10} {:>14}", "format", "bytes", "vs f16", "break-even L");
    for (label, bytes, be) in table {
        let be = be.map_or("—".to_string(), |l| format!("{l:.0}"));
        println!("{label:<w$} {bytes:>10} {:>10.3} {be:>14}", bytes as f64 / dense16);
    }
    if let Some((local, window, _, _)) = windows {
        println!(
            "\nLocal rings: the {local} local layers' full windows of {window} positions, keys + values (a spec's `sink=N` adds N f32 rows each):"
        );
        println!("{:<w$} {:>10} {:>10}", "ring", "bytes", "vs f16");
        for (ring, bytes) in rings {
            println!("{ring:<w$} {bytes:>10} {:>10.3}", bytes as f64 / ring16);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The dense rows of a 32-wide model: one q8_0 block (34 bytes) or q4_0 block (18) per
    /// vector, and a mixed pair one of each per key/value pair.
    #[test]
    fn dense_rows_count_each_vector_in_its_own_format() {
        let dir =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/tiny/llama-mha");
        let c = ModelConfig::from_hf_file(&dir.join("config.json")).unwrap();
        let table = rows(&c);
        let bytes = |label: &str| table.iter().find(|(l, _, _)| l == label).map(|r| r.1);
        // 2 layers × 4 kv-heads, a key and a value vector each.
        let pairs = 2 * 4;
        assert_eq!(bytes("dense int8"), Some(2 * pairs * 34));
        assert_eq!(bytes("dense int4"), Some(2 * pairs * 18));
        assert_eq!(bytes("dense int8 values=int4"), Some(pairs * (34 + 18)));
        assert_eq!(bytes("dense int4 values=int8"), Some(pairs * (18 + 34)));
        assert!(ring_rows(&c).is_empty(), "no local layers, no rings");
    }

    /// A windowed model's rings: a key row and a value row per position of every local
    /// layer's window and kv-head, each in its own format.
    #[test]
    fn ring_rows_count_every_local_window_in_each_format() {
        let dir =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/tiny/llama-mha");
        let mut c = ModelConfig::from_hf_file(&dir.join("config.json")).unwrap();
        let rope = c.rope.clone();
        // Layer 0 local with a window of 8, layer 1 global; 4 kv-heads of 32.
        c.local_attention = Some(models::load::config::LocalAttention {
            window: 8,
            rope,
            local: vec![true, false],
        });
        let rings = ring_rows(&c);
        let bytes = |ring: &str| rings.iter().find(|(r, _)| r == ring).map(|r| r.1);
        let positions = 4 * 8;
        assert_eq!(bytes("ring=f16"), Some(positions * 2 * 32 * 2));
        assert_eq!(bytes("ring=f32"), Some(positions * 2 * 32 * 4));
        assert_eq!(bytes("ring=fp8"), Some(positions * 2 * (32 + 2)));
        assert_eq!(bytes("ring=int8"), Some(positions * 2 * 34));
        assert_eq!(bytes("ring=int4"), Some(positions * 2 * 18));
        assert_eq!(bytes("ring=int8,ring_values=int4"), Some(positions * (34 + 18)));
        assert_eq!(windows(&c).map(|w| w.3), bytes("ring=f16"), "the headline's f16 window");
        // Every listed ring parses as a spec option.
        for (ring, _) in &rings {
            let spec = format!("dense:{ring}");
            assert!(spec.parse::<models::cache::CacheSpec>().is_ok(), "{spec}");
        }
        // And takes the table's layer count: the global layer is not a ring.
        assert_eq!(global_layers(&c), 1);
    }
}
