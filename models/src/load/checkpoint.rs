//! One entry point for every checkpoint layout: a `.gguf` file (weights, hyper-parameters,
//! tokenizer and chat template in one file) or a Hugging Face directory (`config.json`,
//! safetensors single or sharded, optional `tokenizer.json` / `tokenizer_config.json`).

use std::path::Path;

use crate::error::{Error, Result};
use crate::llama::Llama;
use crate::load::chat::ChatTemplate;
use crate::load::config::ModelConfig;
use crate::load::gguf::GgufSource;
use crate::load::tokenizer::Tokenizer;
use crate::load::weights::{SafetensorsSource, WeightSource};

/// A loaded model with everything needed to talk to it.
pub struct Checkpoint {
    /// Hyper-parameters.
    pub config: ModelConfig,
    /// The decoder.
    pub model: Llama,
    /// The tokenizer, when the checkpoint has one.
    pub tokenizer: Option<Tokenizer>,
    /// The chat template, when the checkpoint has one.
    pub chat_template: Option<ChatTemplate>,
    /// Where the weights came from (one line).
    pub source: String,
}

impl Checkpoint {
    /// Loads a GGUF file or an HF checkpoint directory.
    ///
    /// # Errors
    /// [`Error::Io`] if `path` does not exist; every loading error of the format.
    ///
    /// # Examples
    /// ```no_run
    /// let ckpt = models::Checkpoint::load(std::path::Path::new("SmolLM2-135M-Instruct.Q4_1.gguf"))?;
    /// println!("{} layers", ckpt.config.num_layers);
    /// # Ok::<(), models::Error>(())
    /// ```
    pub fn load(path: &Path) -> Result<Self> {
        if path.is_dir() {
            return Self::load_hf_dir(path);
        }
        if !path.is_file() {
            let source =
                std::io::Error::new(std::io::ErrorKind::NotFound, "no such file or directory");
            return Err(Error::Io { op: "open", path: path.to_path_buf(), source });
        }
        Self::load_gguf(path)
    }

    /// Loads a GGUF file.
    ///
    /// # Errors
    /// GGUF parse, metadata, tokenizer and weight errors.
    pub fn load_gguf(path: &Path) -> Result<Self> {
        let (src, config) = GgufSource::open(path)?;
        let tokenizer = match src.file().get("tokenizer.ggml.model") {
            Some(_) => Some(Tokenizer::from_gguf(src.file())?),
            None => None,
        };
        let chat_template = ChatTemplate::from_gguf(src.file());
        let model = Llama::load(&src, &config)?;
        Ok(Self { config, model, tokenizer, chat_template, source: src.describe() })
    }

    /// Loads an HF directory.
    ///
    /// # Errors
    /// Config, safetensors, tokenizer and weight errors.
    pub fn load_hf_dir(dir: &Path) -> Result<Self> {
        let config = ModelConfig::from_hf_file(&dir.join("config.json"))?;
        let src = SafetensorsSource::open_dir(dir)?;
        let tok_path = dir.join("tokenizer.json");
        let tokenizer =
            if tok_path.is_file() { Some(Tokenizer::from_file(&tok_path)?) } else { None };
        let chat_template = ChatTemplate::from_hf_dir(dir)?;
        let model = Llama::load(&src, &config)?;
        Ok(Self { config, model, tokenizer, chat_template, source: src.describe() })
    }
}
