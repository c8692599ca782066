//! `kvtide generate`: greedy generation through any cache, streaming the text, with the
//! instruct chat template applied unless `--raw`; `--save-cache` writes the cache after the
//! prompt, `--load-cache` continues from such a file instead of running the prefill
//! (prefix reuse, `models::cache::persist`).

use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

use crate::Result;
use clap::Args;
use kv_sparse::persist::MappedCache;
use models::cache::persist::{self, CacheIdentity, Prefix};
use models::cache::spec::CacheSpec;
use models::session::generate::Generation;
use models::{ChatMessage, Session};
use serde_json::json;

use crate::cli::common::{ModelArgs, human_bytes, print_json, tokenizer};

/// Arguments of `kvtide generate`.
#[derive(Args, Debug)]
pub struct GenerateArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// The prompt (a user message, or raw text with `--raw`).
    #[arg(long, default_value = "Who wrote Hamlet? Answer in one sentence.")]
    prompt: String,
    /// Feed the prompt as is instead of through the chat template.
    #[arg(long)]
    raw: bool,
    /// System message for the chat template (default: the template's own).
    #[arg(long)]
    system: Option<String>,
    /// Most tokens to generate.
    #[arg(long, default_value_t = 128)]
    max_new_tokens: usize,
    /// Cache specification (see `models::cache::spec`), e.g. `dense`, `swan:k=32,value=fp8`.
    #[arg(long, default_value = "dense")]
    cache: CacheSpec,
    /// Print one JSON object instead of streaming text.
    #[arg(long)]
    json: bool,
    /// After the prompt's prefill, write the whole cache (every layer and kv-head, with
    /// the model, projection and cache format in its header) to FILE.
    #[arg(long, value_name = "FILE")]
    save_cache: Option<PathBuf>,
    /// Continue from a cache FILE written by `--save-cache` for the same prompt, model,
    /// projection and cache spec, instead of running the prefill (the file is memory-mapped
    /// and validated; a file for another model, projection or format is an error). The
    /// caches read the saved rows from the map for the whole run: FILE must not be
    /// rewritten in place meanwhile.
    #[arg(long, value_name = "FILE", conflicts_with = "save_cache")]
    load_cache: Option<PathBuf>,
}

fn prompt_text(a: &GenerateArgs, ckpt: &models::Checkpoint) -> Result<String> {
    if a.raw {
        return Ok(a.prompt.clone());
    }
    let template = ckpt.chat_template.as_ref().ok_or_else(|| crate::Error::InvalidInput {
        op: "generate",
        reason: "the checkpoint has no chat template: use --raw".into(),
    })?;
    let mut messages = Vec::new();
    if let Some(system) = &a.system {
        messages.push(ChatMessage::new("system", system));
    }
    messages.push(ChatMessage::new("user", &a.prompt));
    Ok(template.render(&messages, true)?)
}

/// Runs `kvtide generate`.
pub fn run(a: &GenerateArgs) -> Result<()> {
    let ckpt = a.model.load()?;
    let tok = tokenizer(&ckpt, "generate")?;
    // A rendered chat template writes its own BOS where the model wants one.
    let ids = tok.encode_with(&prompt_text(a, &ckpt)?, a.raw)?;
    let proj = crate::paths::projection_file(&ckpt.config.name);
    let (model, cache) = a.cache.clone().with_default_projection(&proj).build(&ckpt.model)?;
    let identity = if a.save_cache.is_some() || a.load_cache.is_some() {
        Some(CacheIdentity::of(&ckpt.model, cache.as_ref())?)
    } else {
        None
    };
    let mut session = Session::new(model, cache)?;
    let mut shown = String::new();
    let mut generated = Vec::new();
    let mut first_token_s = None;
    let t0 = Instant::now();
    let mut stream = |id: u32| -> models::Result<()> {
        first_token_s.get_or_insert_with(|| t0.elapsed().as_secs_f64());
        generated.push(id);
        if !a.json {
            // Print once the bytes decode to whole characters (byte-level BPE can split them).
            let text = tok.decode(&generated)?;
            if !text.ends_with('\u{FFFD}') {
                if let Some(rest) = text.strip_prefix(shown.as_str()) {
                    print!("{rest}");
                    let _ = std::io::stdout().flush();
                }
                shown = text;
            }
        }
        Ok(())
    };
    let eos = &ckpt.config.eos_token_ids;
    let (out, load_s) = match (&a.load_cache, &a.save_cache, &identity) {
        (Some(path), _, Some(identity)) => {
            let (prefix, load_s) = resume(&mut session, path, identity, &ids)?;
            let out = models::session::generate::greedy_from(
                &mut session,
                &prefix.logits,
                a.max_new_tokens,
                eos,
                &mut stream,
            )?;
            (out, Some(load_s))
        }
        (None, Some(path), Some(identity)) => {
            (prefill_and_save(&mut session, path, identity, &ids, a, &mut stream)?, None)
        }
        _ => (
            models::session::generate::greedy(
                &mut session,
                &ids,
                a.max_new_tokens,
                eos,
                &mut stream,
            )?,
            None,
        ),
    };
    let bytes = session.cache().bytes();
    if a.json {
        print_json(&json!({
            "cache": session.cache().label(), "prompt_tokens": ids.len(), "generated_tokens": out.ids.len(),
            "text": tok.decode(&out.ids)?, "stop": format!("{:?}", out.stop), "prefill_s": out.prefill_s,
            "load_cache_s": load_s, "first_token_s": first_token_s,
            "decode_tokens_per_s": out.decode_tokens_per_s(), "kv_bytes": bytes.total(), "stats": stats_json(session.cache()),
        }));
    } else {
        println!();
        let start = match load_s {
            Some(s) => format!("cache loaded in {:.3} s", s),
            None => format!("prefill {:.2} s", out.prefill_s),
        };
        eprintln!(
            "[{}] {} prompt + {} generated tokens, {start}, first token after {:.3} s, decode {:.1} tok/s, KV {}",
            session.cache().label(),
            ids.len(),
            out.ids.len(),
            first_token_s.unwrap_or(0.0),
            out.decode_tokens_per_s(),
            human_bytes(bytes.total() as f64)
        );
    }
    Ok(())
}

/// Reopens a saved prompt cache (memory-mapped, validated) into the fresh `session`;
/// returns the saved prefix and the seconds it took.
fn resume(
    session: &mut Session,
    path: &std::path::Path,
    identity: &CacheIdentity,
    ids: &[u32],
) -> Result<(Prefix, f64)> {
    let t = Instant::now();
    // SAFETY: the file must not change while it is mapped, and the cache keeps the map for
    // the rest of the session (it attends the saved rows where they lie).
    // kvtide replaces cache files only by renaming a new file over them, which leaves this
    // mapping's inode intact; the remaining hazard, another program truncating or
    // rewriting the file in place while this run decodes, is excluded by the documented
    // use of the flag.
    let file =
        std::sync::Arc::new(unsafe { MappedCache::open(path) }.map_err(models::Error::from)?);
    let prefix = session.resume(&file, identity)?;
    if prefix.ids != ids {
        return Err(crate::Error::InvalidInput {
            op: "generate --load-cache",
            reason: format!(
                "the cache was saved for a prompt of {} tokens that differs from this one ({} tokens)",
                prefix.ids.len(),
                ids.len()
            ),
        });
    }
    Ok((prefix, t.elapsed().as_secs_f64()))
}

/// Runs the prefill, writes the cache with the prompt and its last logits, then decodes.
fn prefill_and_save(
    session: &mut Session,
    path: &std::path::Path,
    identity: &CacheIdentity,
    ids: &[u32],
    a: &GenerateArgs,
    stream: &mut dyn FnMut(u32) -> models::Result<()>,
) -> Result<Generation> {
    session.reserve(ids.len() + a.max_new_tokens)?;
    let t = Instant::now();
    let logits = session.prefill(ids)?;
    let prefill_s = t.elapsed().as_secs_f64();
    let logits = models::llama::host::to_f32_vec(&logits)?;
    let prefix = Prefix { ids: ids.to_vec(), logits };
    persist::save(path, identity, session.cache(), &prefix)?;
    let eos = &session.model().config().eos_token_ids.clone();
    let mut out = models::session::generate::greedy_from(
        session,
        &prefix.logits,
        a.max_new_tokens,
        eos,
        stream,
    )?;
    out.prefill_s = prefill_s;
    Ok(out)
}

/// A cache's extra figures as a JSON object.
pub fn stats_json(cache: &dyn models::KvCache) -> serde_json::Value {
    cache
        .stats()
        .into_iter()
        .map(|(k, v)| (k.to_string(), json!(v)))
        .collect::<serde_json::Map<_, _>>()
        .into()
}
