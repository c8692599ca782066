//! `kvtide eval-ppl` (and the no-argument demo): teacher-forced perplexity through the
//! decode path for several cache configurations on one text, with the KV bytes each holds
//! at the end, the ratio to dense 16-bit K/V of the same tokens, and decode tokens/s —
//! all measured in one run. Also `kvtide bench-attn`, which runs `crate::bench_attn`.

use std::path::PathBuf;

use crate::Result;
use clap::Args;
use kv_sparse::ValueFormat;
use kv_sparse::memory::dense_row_bytes;
use models::cache::Footprint;
use models::cache::spec::{CacheKind, CacheSpec};
use models::{Checkpoint, Session};
use serde_json::{Value, json};

use crate::cli::calibrate::CalibrateArgs;
use crate::cli::common::{ModelArgs, bar, human_bytes, print_json, read_text, tokenizer};
use crate::cli::generate::stats_json;

/// Arguments of `kvtide eval-ppl`.
#[derive(Args, Debug)]
pub struct EvalArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Text to score (`.md` plays are stripped; default: the default play).
    #[arg(long)]
    text: Option<PathBuf>,
    /// Tokens scored (from the start of the text).
    #[arg(long, default_value_t = 1024)]
    tokens: usize,
    /// Tokens prefilled with libtorch before the decode path takes over; 0 feeds every
    /// position through the decode path, the first included (each stored in the cache's
    /// format before it attends), as llama.cpp's perplexity tool runs a text.
    #[arg(long, default_value_t = 128)]
    prefix: usize,
    /// Cache specifications, each evaluated in turn (repeatable).
    #[arg(long = "cache", default_values_t = default_caches())]
    caches: Vec<CacheSpec>,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
}

fn default_caches() -> Vec<CacheSpec> {
    ["dense", "swan"].iter().filter_map(|s| s.parse().ok()).collect()
}

/// The demo's configurations, every compressed one on the same footing — the same 128-row
/// f16 buffer of the newest positions, no sink: dense f16; dense int8 and int4 blocks in the
/// Walsh–Hadamard basis (llama.cpp's rotation); KIVI at 2 bits (groups of 32); the
/// TurboQuant-style 3-bit codes in a seeded random basis; SWAN's bitmask rows with int8
/// values (half the components) and with int4 values (half the components).
const DEMO_CACHES: [&str; 7] = [
    "dense:format=f16",
    "dense:format=int8,rotate=hadamard,b=128",
    "dense:format=int4,rotate=hadamard,b=128",
    "kivi:bits=2,b=128",
    "turbo:bits=3,b=128",
    "swan:k=32,index=bitmask,value=int8,b=128",
    "swan:k=32,index=bitmask,value=int4,b=128",
];

/// The recent-token buffer every compressed demo configuration keeps (`b=`).
const DEMO_BUFFER: usize = 128;

/// Tokens the demo scores, and how many of them libtorch prefills: 384 decode steps per
/// configuration keep the whole demo within a few minutes on a 2-core CPU while the SWAN
/// caches still evict (the prompt exceeds the b = 128 buffer by 256 tokens at the first step).
const DEMO_TOKENS: usize = 640;
/// See [`DEMO_TOKENS`].
const DEMO_PREFIX: usize = 256;

/// One configuration's results.
struct Row {
    label: String,
    ppl: f64,
    bytes: usize,
    tokens_per_s: f64,
    stats: Value,
    /// The exact per-position costs of the cache's parts, where it reports them.
    footprint: Option<Footprint>,
}

/// The length at which bytes per token are also reported, the buffer amortized over it.
const AMORTIZED_TOKENS: usize = 4096;

fn evaluate(ckpt: &Checkpoint, spec: &CacheSpec, ids: &[u32], prefix: usize) -> Result<Row> {
    let proj = crate::paths::projection_file(&ckpt.config.name);
    let (model, cache) = spec.clone().with_default_projection(&proj).build(&ckpt.model)?;
    let mut session = Session::new(model, cache)?;
    let progress = bar(ids.len() - prefix.max(1), &format!("{spec}"));
    let scores = models::score(&mut session, ids, prefix, &mut |_, _| Ok(()), &mut |n| {
        progress.set_position(n as u64)
    })?;
    progress.finish_and_clear();
    let cache = session.cache();
    Ok(Row {
        label: cache.label(),
        ppl: scores.perplexity(),
        bytes: cache.bytes().total(),
        tokens_per_s: scores.decode_tokens_per_s(),
        stats: stats_json(cache),
        footprint: Footprint::from_stats(&cache.stats()),
    })
}

/// Dense 16-bit K/V bytes for `tokens` tokens — the reference of every ratio. A local
/// (sliding-window) layer holds at most its window.
fn dense16_bytes(cfg: &models::ModelConfig, tokens: usize) -> usize {
    let positions: usize = (0..cfg.num_layers)
        .map(|i| match cfg.layer_kind(i) {
            models::LayerKind::Local { window } => tokens.min(window),
            models::LayerKind::Global => tokens,
        })
        .sum();
    2 * cfg.kv_heads * positions * dense_row_bytes(cfg.head_dim, ValueFormat::F16)
}

fn print_rows(rows: &[Row], dense: usize, header: &str) {
    println!("{header}");
    println!(
        "{:<58} {:>10} {:>12} {:>8} {:>9} {:>8} {:>8}",
        "cache", "perplexity", "KV bytes", "vs f16", "hist/f16", "@4k/f16", "tok/s"
    );
    for r in rows {
        let ratio = r.bytes as f64 / dense as f64;
        let (hist, at4k) = match r.footprint {
            Some(f) => (
                format!("{:.3}", f.history / f.dense_f16),
                format!("{:.3}", f.ratio_to_f16(AMORTIZED_TOKENS)),
            ),
            None => ("-".into(), "-".into()),
        };
        println!(
            "{:<58} {:>10.3} {:>12} {:>8.3} {:>9} {:>8} {:>8.1}",
            r.label,
            r.ppl,
            human_bytes(r.bytes as f64),
            ratio,
            hist,
            at4k,
            r.tokens_per_s
        );
    }
    println!(
        "vs f16: the bytes held now over dense f16's; hist/f16: one position past the buffer \
         and sink; @4k/f16: per position of a {AMORTIZED_TOKENS}-position cache, the buffer \
         amortized (layers the cache serves; sliding-window rings apart)."
    );
}

fn rows_json(rows: &[Row], dense: usize) -> Vec<Value> {
    rows.iter()
        .map(|r| {
            let history = r.footprint.map(|f| f.history);
            let history_ratio = r.footprint.map(|f| f.history / f.dense_f16);
            let amortized = r.footprint.map(|f| f.bytes(AMORTIZED_TOKENS) / AMORTIZED_TOKENS as f64);
            let amortized_ratio = r.footprint.map(|f| f.ratio_to_f16(AMORTIZED_TOKENS));
            json!({"cache": r.label, "perplexity": r.ppl, "kv_bytes": r.bytes, "ratio_to_dense_f16": r.bytes as f64 / dense as f64, "history_bytes_per_token": history, "history_ratio_to_dense_f16": history_ratio, "amortized_tokens": AMORTIZED_TOKENS, "amortized_bytes_per_token": amortized, "amortized_ratio_to_dense_f16": amortized_ratio, "decode_tokens_per_s": r.tokens_per_s, "stats": r.stats})
        })
        .collect()
}

fn eval_all(
    ckpt: &Checkpoint,
    caches: &[CacheSpec],
    text: (&PathBuf, &str),
    tokens: usize,
    prefix: usize,
    json_out: bool,
) -> Result<()> {
    let ids = tokenizer(ckpt, "eval-ppl")?.encode(text.1)?;
    let n = tokens.min(ids.len());
    models::session::score::check_prefix("eval-ppl", prefix, n)?;
    let rows =
        caches.iter().map(|c| evaluate(ckpt, c, &ids[..n], prefix)).collect::<Result<Vec<_>>>()?;
    let dense = dense16_bytes(&ckpt.config, n);
    if json_out {
        print_json(
            &json!({"model": ckpt.config.name, "text": text.0, "tokens": n, "prefix": prefix, "dense_f16_bytes": dense, "results": rows_json(&rows, dense)}),
        );
    } else {
        let how = if prefix == 0 {
            format!("none prefilled: every position through the decode path, {} scored", n - 1)
        } else {
            format!("{prefix} prefilled, {} scored through the decode path", n - prefix)
        };
        let header = format!("{} on {} — {n} tokens ({how})", ckpt.config.name, text.0.display());
        print_rows(&rows, dense, &header);
    }
    Ok(())
}

/// Runs `kvtide eval-ppl`.
pub fn run(a: &EvalArgs) -> Result<()> {
    let ckpt = a.model.load()?;
    let (path, text) = read_text(a.text.as_deref())?;
    ensure_projection(&ckpt, &a.caches)?;
    eval_all(&ckpt, &a.caches, (&path, &text), a.tokens, a.prefix, a.json)
}

/// Whether a basis kind is loaded from (or derived from) a calibrated projection file.
fn needs_file(basis: projection::BasisKind) -> bool {
    basis.needs_calibration()
}

/// Calibrates the default projection file if a cache needs it and it is missing, or if a
/// cache selects keys by the queries' energy and the file (calibrated before those were
/// stored) does not carry them.
fn ensure_projection(ckpt: &Checkpoint, caches: &[CacheSpec]) -> Result<()> {
    let needs = caches.iter().any(|c| match &c.kind {
        CacheKind::Swan(s) | CacheKind::SwanTiered(s, _) => s.proj.is_none() && needs_file(s.basis),
        CacheKind::Dense(d) => d.proj.is_none() && d.rotate.is_some_and(needs_file),
        CacheKind::Coded(c) | CacheKind::CodedTiered(c, _) => {
            c.proj.is_none() && c.rotate.is_some_and(needs_file)
        }
        _ => false,
    });
    let query = caches.iter().any(|c| match &c.kind {
        CacheKind::Swan(s) => s.proj.is_none() && s.key_select == models::cache::KeySelect::Query,
        _ => false,
    });
    let path = crate::paths::projection_file(&ckpt.config.name);
    let stale = query
        && path.is_file()
        && projection::ProjectionSet::load(&path).is_ok_and(|set| {
            set.basis(projection::Stream::Qk, 0, 0).is_ok_and(|b| b.query_energy().is_none())
        });
    let shown = path.display();
    let why = if stale {
        format!(
            "the projection file at {shown} predates the queries' energies select=query needs: \
             calibrating again"
        )
    } else if needs && !path.is_file() {
        format!("no projection file at {shown}: calibrating first")
    } else {
        return Ok(());
    };
    eprintln!("{why}");
    let args = CalibrateArgs {
        model: ModelArgs { model: None },
        texts: Vec::new(),
        // Half of `kvtide calibrate`'s default: about a CPU-minute on SmolLM2-135M.
        tokens: 8192,
        window: 512,
        out: Some(path),
        json: false,
    };
    crate::cli::calibrate::calibrate(&args, ckpt)?;
    Ok(())
}

/// The no-argument demo: dense, KIVI, TurboQuant-style and SWAN caches on equal footing on
/// the default model and play.
pub fn demo() -> Result<()> {
    println!(
        "kvtide {} — KV formats on equal footing (same {DEMO_BUFFER}-row buffer) on the default model and play (see `kvtide --help`)",
        env!("CARGO_PKG_VERSION")
    );
    let ckpt = ModelArgs { model: None }.load()?;
    let caches: Vec<CacheSpec> =
        DEMO_CACHES.iter().map(|s| s.parse()).collect::<models::Result<_>>()?;
    ensure_projection(&ckpt, &caches)?;
    let (path, text) = read_text(None)?;
    eval_all(&ckpt, &caches, (&path, &text), DEMO_TOKENS, DEMO_PREFIX, false)?;
    println!("\n{}", demo_note());
    Ok(())
}

/// The demo's closing note: every figure in it follows from the demo's own constants.
fn demo_note() -> String {
    let share = 100 * DEMO_BUFFER / DEMO_TOKENS;
    format!(
        "KV bytes are measured at the end of this {DEMO_TOKENS}-token text, where the \
         {DEMO_BUFFER}-row buffer\nholds {share} % of the positions; @4k/f16 amortizes it over \
         {AMORTIZED_TOKENS} positions.\nFull comparison on equal footing: kvtide reproduce \
         --only frontier (results/README.md)."
    )
}

/// Arguments of `kvtide bench-attn`.
#[derive(Args, Debug)]
pub struct BenchArgs {
    /// A seconds-long smoke run of one small shape instead of the full grid.
    #[arg(long)]
    quick: bool,
    /// Output is always one JSON object; accepted for symmetry with the other commands.
    #[arg(long)]
    json: bool,
    /// Head dimensions to time instead of the grid's (comma-separated, e.g. `64,128`).
    #[arg(long, value_delimiter = ',')]
    head_dims: Option<Vec<usize>>,
    /// Cache lengths to time instead of the grid's (comma-separated tokens).
    #[arg(long, value_delimiter = ',')]
    lengths: Option<Vec<usize>>,
    /// Thread counts instead of the grid's (comma-separated).
    #[arg(long, value_delimiter = ',')]
    threads: Option<Vec<usize>>,
    /// Interleaved timing rounds instead of the grid's (each figure is the best round).
    #[arg(long)]
    rounds: Option<usize>,
    /// Leave out the second timing of the int8- and 4-bit-keyed kernels with int8 queries.
    #[arg(long)]
    no_int8_queries: bool,
}

/// Runs `kvtide bench-attn` (`crate::bench_attn`).
pub fn bench(a: &BenchArgs) -> Result<()> {
    let opts = if a.quick {
        crate::bench_attn::BenchAttnOptions::quick()
    } else {
        crate::bench_attn::BenchAttnOptions::full()
    };
    let opts = crate::bench_attn::BenchAttnOptions {
        head_dims: a.head_dims.clone().unwrap_or(opts.head_dims),
        lengths: a.lengths.clone().unwrap_or(opts.lengths),
        threads: a.threads.clone().unwrap_or(opts.threads),
        rounds: a.rounds.unwrap_or(opts.rounds),
        int8_queries: opts.int8_queries && !a.no_int8_queries,
        ..opts
    };
    let spinner = crate::cli::common::spinner("bench-attn: timing kernels");
    let out = crate::bench_attn::run(&opts);
    spinner.finish_and_clear();
    print_json(&out?);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The main job's configurations parse and stand on equal footing: dense f16 without a
    /// buffer, every compressed one with the same buffer and no sink, the families the README
    /// promises among them.
    #[test]
    fn demo_caches_parse_on_equal_footing() {
        let specs: Vec<CacheSpec> = DEMO_CACHES.iter().map(|s| s.parse().unwrap()).collect();
        for (text, spec) in DEMO_CACHES.iter().zip(&specs) {
            let want = if *text == "dense:format=f16" { 0 } else { DEMO_BUFFER };
            assert_eq!(spec.buffer_rows(), want, "{text}");
            assert!(!text.contains("sink"), "{text}");
        }
        for family in
            ["int8,rotate=hadamard", "int4,rotate=hadamard", "kivi:bits=2", "turbo:bits=3"]
        {
            assert!(DEMO_CACHES.iter().any(|s| s.contains(family)), "{family}");
        }
        assert!(DEMO_CACHES.iter().any(|s| s.starts_with("swan:")));
        const { assert!(DEMO_TOKENS > DEMO_PREFIX + DEMO_BUFFER, "the SWAN caches must evict") };
    }

    /// The closing note states no figure that is not the demo's own: every number in it is
    /// one of its constants or follows from them.
    #[test]
    fn demo_note_states_only_the_demos_figures() {
        let note = demo_note();
        let allowed =
            [DEMO_TOKENS, DEMO_BUFFER, 100 * DEMO_BUFFER / DEMO_TOKENS, AMORTIZED_TOKENS, 4, 16];
        let numbers = note.split(|c: char| !c.is_ascii_digit()).filter(|n| !n.is_empty());
        for n in numbers {
            assert!(allowed.contains(&n.parse().unwrap()), "{n} in {note:?}");
        }
    }
}
