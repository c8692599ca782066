//! `kvtide generate`: greedy generation through any cache, streaming the text, with the
//! instruct chat template applied unless `--raw`.

use std::io::Write;

use crate::Result;
use clap::Args;
use models::cache::spec::CacheSpec;
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
    let mut session = Session::new(model, cache)?;
    let mut shown = String::new();
    let mut generated = Vec::new();
    let mut stream = |id: u32| -> models::Result<()> {
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
    let out = models::session::generate::greedy(
        &mut session,
        &ids,
        a.max_new_tokens,
        &ckpt.config.eos_token_ids,
        &mut stream,
    )?;
    let bytes = session.cache().bytes();
    if a.json {
        print_json(&json!({
            "cache": session.cache().label(), "prompt_tokens": ids.len(), "generated_tokens": out.ids.len(),
            "text": tok.decode(&out.ids)?, "stop": format!("{:?}", out.stop), "prefill_s": out.prefill_s,
            "decode_tokens_per_s": out.decode_tokens_per_s(), "kv_bytes": bytes.total(), "stats": stats_json(session.cache()),
        }));
    } else {
        println!();
        eprintln!(
            "[{}] {} prompt + {} generated tokens, prefill {:.2} s, decode {:.1} tok/s, KV {}",
            session.cache().label(),
            ids.len(),
            out.ids.len(),
            out.prefill_s,
            out.decode_tokens_per_s(),
            human_bytes(bytes.total() as f64)
        );
    }
    Ok(())
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
