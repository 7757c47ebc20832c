//! Chat templates: the model's own Jinja template rendered with minijinja, with the
//! variables and Python string methods Hugging Face templates use.

use crate::error::{Error, Result};
use crate::limits::{CHAT_TEMPLATE_FUEL, MAX_CHAT_PROMPT_BYTES};
use minijinja::{Environment, ErrorKind, Value};
use serde::{Deserialize, Serialize};

/// One message of a conversation as templates see it (Hugging Face's convention): an
/// assistant's `tool_calls` as `[{id, type, function: {name, arguments}}]` with the
/// arguments an object, a tool's answer with the `tool_call_id` it answers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Message {
    pub role: String,
    pub content: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
}

impl Message {
    pub fn new(role: &str, content: &str) -> Self {
        Message {
            role: role.into(),
            content: content.into(),
            tool_calls: None,
            tool_call_id: None,
        }
    }
}

pub struct ChatTemplate {
    env: Environment<'static>,
    /// The template's text (what a host inspects, such as its tool-call format).
    pub source: String,
    pub bos_token: String,
    pub eos_token: String,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate").finish_non_exhaustive()
    }
}

fn raise_exception(msg: String) -> std::result::Result<Value, minijinja::Error> {
    Err(minijinja::Error::new(ErrorKind::InvalidOperation, msg))
}

impl ChatTemplate {
    pub fn new(source: &str, bos_token: &str, eos_token: &str) -> Result<Self> {
        let mut env = Environment::new();
        // Hugging Face renders with trim_blocks and lstrip_blocks.
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        // A template is code from the model file: it runs on a budget, so that a loop
        // that never ends (or runs for hours) is an error, not a hung worker.
        env.set_fuel(Some(CHAT_TEMPLATE_FUEL));
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", |fmt: String| -> String {
            // Templates use it for a "today" line; a fixed date keeps rendering deterministic.
            fmt.replace("%Y", "2026")
                .replace("%m", "01")
                .replace("%d", "01")
                .replace("%B", "January")
                .replace("%b", "Jan")
        });
        env.add_template_owned("chat", source.to_string())
            .map_err(|e| Error::ChatTemplate(format!("{e:#}")))?;
        Ok(ChatTemplate {
            env,
            source: source.to_string(),
            bos_token: bos_token.into(),
            eos_token: eos_token.into(),
        })
    }

    pub fn render(&self, messages: &[Message], add_generation_prompt: bool) -> Result<String> {
        self.render_with_tools(messages, add_generation_prompt, None)
    }

    /// `render` with the request's `tools` (OpenAI's `[{type, function}]`) in the
    /// template's context, as transformers passes them.
    pub fn render_with_tools(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
        tools: Option<&serde_json::Value>,
    ) -> Result<String> {
        let t = self
            .env
            .get_template("chat")
            .map_err(|e| Error::ChatTemplate(e.to_string()))?;
        let mut out = CappedWriter(Vec::new());
        let rendered = t.render_captured_to(
            minijinja::context! {
                messages => messages,
                add_generation_prompt => add_generation_prompt,
                tools => tools.map(minijinja::Value::from_serialize),
                bos_token => self.bos_token,
                eos_token => self.eos_token,
            },
            &mut out,
        );
        match rendered {
            Ok(_) => String::from_utf8(out.0)
                .map_err(|_| Error::ChatTemplate("the rendered prompt is not UTF-8".into())),
            Err(e) if e.kind() == ErrorKind::OutOfFuel => Err(Error::ChatTemplate(format!(
                "the template ran past its budget (limit CHAT_TEMPLATE_FUEL = {CHAT_TEMPLATE_FUEL} instructions)"
            ))),
            Err(e) if e.kind() == ErrorKind::WriteFailure => Err(Error::ChatTemplate(format!(
                "the rendered prompt is over the limit MAX_CHAT_PROMPT_BYTES = {MAX_CHAT_PROMPT_BYTES} bytes"
            ))),
            Err(e) => Err(Error::ChatTemplate(format!("{e:#}"))),
        }
    }
}

/// The rendered prompt, refusing to grow past `MAX_CHAT_PROMPT_BYTES`.
struct CappedWriter(Vec<u8>);

impl std::io::Write for CappedWriter {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        if self.0.len() + b.len() > MAX_CHAT_PROMPT_BYTES {
            return Err(std::io::Error::other("prompt too long"));
        }
        self.0.extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
