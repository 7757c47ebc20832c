//! Prompt files of the benchmarks and evaluations: JSON lines, each with `chat` (a user
//! message rendered through the model's chat template) or `prompt` (raw text); other
//! fields (`id`, `category`, ...) travel with the prompt.

use crate::error::{Error, Result};
use crate::model_files::LoadedModel;

/// Every non-empty line as (its JSON object, the prompt's token ids).
pub fn parse(text: &str, m: &LoadedModel) -> Result<Vec<(serde_json::Value, Vec<u32>)>> {
    let mut out = Vec::new();
    for (i, line) in text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        let bad = |reason: String| Error::PromptFile {
            line: i + 1,
            reason,
        };
        let v: serde_json::Value = serde_json::from_str(line).map_err(|e| bad(e.to_string()))?;
        let ids = match (
            v.get("chat").and_then(|c| c.as_str()),
            v.get("prompt").and_then(|c| c.as_str()),
        ) {
            (Some(c), _) => m.chat_ids(None, c)?,
            (None, Some(p)) => m.tokenizer.encode(p, true)?,
            _ => return Err(bad("needs `chat` or `prompt`".into())),
        };
        out.push((v, ids));
    }
    Ok(out)
}

/// A prompt's `id` as text, or its 1-based line number.
pub fn id_of(v: &serde_json::Value, index: usize) -> String {
    match v.get("id") {
        Some(serde_json::Value::String(s)) => s.clone(),
        Some(x) => x.to_string(),
        None => (index + 1).to_string(),
    }
}
