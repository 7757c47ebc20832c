//! A model's metadata checked together: the config, the tokenizer and the chat template
//! of a GGUF header, shared by the loaders of whole files (`model_files`) and of
//! streamed ones (`formats::gguf_weights_stream`).

use crate::chat::ChatTemplate;
use crate::config::ModelConfig;
use crate::error::{Error, Result};
use crate::tokenizer::TextTokenizer;

/// The tokenizer covers the model's vocabulary (a typed error where it does not).
pub fn check_vocab(cfg: &ModelConfig, tok: &TextTokenizer) -> Result<()> {
    if tok.vocab_size() > cfg.vocab_size {
        return Err(Error::BadConfig(format!(
            "tokenizer has {} tokens but the model's vocabulary is {}",
            tok.vocab_size(),
            cfg.vocab_size
        )));
    }
    Ok(())
}

/// What a GGUF header alone gives: the config, the tokenizer and the chat template
/// (`rope_freqs.weight`, a tensor, is the caller's to add to the config).
pub fn gguf_meta(
    h: &crate::formats::gguf::GgufHeader,
) -> Result<(ModelConfig, TextTokenizer, Option<ChatTemplate>)> {
    let config = ModelConfig::from_gguf(h)?;
    let tokenizer = TextTokenizer::from_gguf(h)?;
    check_vocab(&config, &tokenizer)?;
    let token_str = |key: &str| {
        h.get_u64(key)
            .and_then(|i| tokenizer.id_to_token(i as u32))
            .unwrap_or_default()
    };
    let chat_template = match h.get_str("tokenizer.chat_template") {
        Some(t) => Some(ChatTemplate::new(
            t,
            &token_str("tokenizer.ggml.bos_token_id"),
            &token_str("tokenizer.ggml.eos_token_id"),
        )?),
        None => None,
    };
    Ok((config, tokenizer, chat_template))
}
