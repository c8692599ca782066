//! Instruct chat templates: the model's own Jinja template (GGUF
//! `tokenizer.chat_template`, or `chat_template` in an HF `tokenizer_config.json`)
//! rendered with minijinja under the settings transformers uses (`trim_blocks`,
//! `lstrip_blocks`, loop controls, a `raise_exception` function, `bos_token`/`eos_token`
//! variables), so the prompt text — and therefore the ids — match transformers'.

use std::path::Path;

use minijinja::{Environment, ErrorKind, context, syntax::SyntaxConfig};
use serde::Serialize;

use crate::error::{Error, Result};
use crate::load::gguf::{GgufFile, MetaValue};

/// One turn of a conversation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ChatMessage {
    /// `system`, `user` or `assistant`.
    pub role: String,
    /// The text of the turn.
    pub content: String,
}

impl ChatMessage {
    /// A message with `role` and `content`.
    pub fn new(role: &str, content: &str) -> Self {
        Self { role: role.to_string(), content: content.to_string() }
    }
}

/// A model's chat template with the special-token strings it may reference.
#[derive(Clone, Debug)]
pub struct ChatTemplate {
    source: String,
    bos_token: String,
    eos_token: String,
}

fn tmpl_err(e: impl std::fmt::Display) -> Error {
    Error::ChatTemplate { reason: e.to_string() }
}

impl ChatTemplate {
    /// Gemma 3's published chat template (`user` / `model` turns between
    /// `<start_of_turn>` and `<end_of_turn>`, a system message prefixed to the first user
    /// turn); GGUF files of Gemma 3 often carry none.
    pub const GEMMA3: &'static str = include_str!("gemma3_chat.jinja");

    /// A template from its Jinja source.
    pub fn new(source: &str, bos_token: &str, eos_token: &str) -> Self {
        Self {
            source: source.to_string(),
            bos_token: bos_token.to_string(),
            eos_token: eos_token.to_string(),
        }
    }

    /// The template stored in a GGUF file, if it has one; for a Gemma 3 file without one,
    /// the template Google publishes with the Gemma 3 instruct checkpoints
    /// ([`ChatTemplate::GEMMA3`]).
    pub fn from_gguf(file: &GgufFile) -> Option<Self> {
        let stored = file.get("tokenizer.chat_template").and_then(MetaValue::as_str);
        let gemma3 = file.get("general.architecture").and_then(MetaValue::as_str) == Some("gemma3");
        let source = stored.or(gemma3.then_some(Self::GEMMA3))?;
        let tokens = file.get("tokenizer.ggml.tokens").and_then(MetaValue::as_array);
        let token = |key: &str| {
            let id = file.get(key)?.as_u64()?;
            tokens?.get(usize::try_from(id).ok()?)?.as_str().map(str::to_string)
        };
        let bos = token("tokenizer.ggml.bos_token_id").unwrap_or_default();
        let eos = token("tokenizer.ggml.eos_token_id").unwrap_or_default();
        Some(Self::new(source, &bos, &eos))
    }

    /// The template of an HF checkpoint directory (`tokenizer_config.json`), if any.
    ///
    /// # Errors
    /// [`Error::Json`] if `tokenizer_config.json` exists but is not JSON.
    pub fn from_hf_dir(dir: &Path) -> Result<Option<Self>> {
        let path = dir.join("tokenizer_config.json");
        let Ok(text) = std::fs::read_to_string(&path) else { return Ok(None) };
        let cfg: serde_json::Value = serde_json::from_str(&text)
            .map_err(|source| Error::Json { what: path.display().to_string(), source })?;
        let token = |key: &str| match cfg.get(key) {
            Some(serde_json::Value::String(s)) => s.clone(),
            Some(v) => v.get("content").and_then(|c| c.as_str()).unwrap_or_default().to_string(),
            None => String::new(),
        };
        let source = match cfg.get("chat_template") {
            Some(serde_json::Value::String(s)) => s.clone(),
            _ => match std::fs::read_to_string(dir.join("chat_template.jinja")) {
                Ok(s) => s,
                Err(_) => return Ok(None),
            },
        };
        Ok(Some(Self::new(&source, &token("bos_token"), &token("eos_token"))))
    }

    /// The Jinja source.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Renders a conversation; with `add_generation_prompt` the text ends where the
    /// assistant's reply begins.
    ///
    /// # Errors
    /// [`Error::ChatTemplate`] if the template does not parse, raises, or fails to render.
    ///
    /// # Examples
    /// ```
    /// use models::{ChatMessage, ChatTemplate};
    /// let t = ChatTemplate::new(
    ///     "{% for m in messages %}<{{ m.role }}>{{ m.content }}\n{% endfor %}\
    ///      {% if add_generation_prompt %}<assistant>{% endif %}", "", "");
    /// let text = t.render(&[ChatMessage::new("user", "Hi")], true).unwrap();
    /// assert_eq!(text, "<user>Hi\n<assistant>");
    /// ```
    pub fn render(&self, messages: &[ChatMessage], add_generation_prompt: bool) -> Result<String> {
        let mut env = Environment::new();
        let syntax = SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()
            .map_err(tmpl_err)?;
        env.set_syntax(syntax);
        env.add_function(
            "raise_exception",
            |msg: String| -> std::result::Result<String, minijinja::Error> {
                Err(minijinja::Error::new(ErrorKind::InvalidOperation, msg))
            },
        );
        let template = env.template_from_str(&self.source).map_err(tmpl_err)?;
        template
            .render(context! {
                messages => messages
                    .iter()
                    .map(|m| context! { role => m.role.clone(), content => m.content.clone() })
                    .collect::<minijinja::Value>(),
                add_generation_prompt => add_generation_prompt,
                bos_token => self.bos_token.as_str(),
                eos_token => self.eos_token.as_str(),
            })
            .map_err(tmpl_err)
    }
}
