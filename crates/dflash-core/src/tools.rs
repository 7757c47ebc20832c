//! Tool calls in the model's own format: which format a chat template speaks, the
//! grammar that constrains a call's arguments to its tool's parameter schema (lazily
//! under `auto`: free text until the model opens a call), and the parser that turns
//! the generated text into OpenAI's `tool_calls` as it streams.
//!
//! Formats:
//! - Hermes (Qwen2.5, Qwen3, and every template that writes `<tool_call>`): a call is
//!   `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`, calls one per line.
//! - Llama 3.1 JSON: the whole answer is `{"name": ..., "parameters": {...}}` (after
//!   the `<|python_tag|>` special token where the model writes one); text answers may not
//!   start with `{`.

use crate::error::{Error, Result};
use crate::grammar::GrammarSpec;
use serde_json::{json, Value as Json};

/// How a model writes tool calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolFormat {
    Hermes,
    Llama3Json,
}

const HERMES_OPEN: &str = "<tool_call>";
const HERMES_CLOSE: &str = "</tool_call>";

impl ToolFormat {
    /// The format a chat template renders tool calls in, or None for a template that
    /// knows no tools.
    pub fn of_template(source: &str) -> Option<Self> {
        if source.contains(HERMES_OPEN) {
            Some(ToolFormat::Hermes)
        } else if source.contains("<|python_tag|>") || source.contains("ipython") {
            Some(ToolFormat::Llama3Json)
        } else {
            None
        }
    }

    /// The key a call's arguments go under.
    fn arguments_key(self) -> &'static str {
        match self {
            ToolFormat::Hermes => "arguments",
            ToolFormat::Llama3Json => "parameters",
        }
    }
}

/// One function the model may call.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolSpec {
    pub name: String,
    /// Its parameters' JSON schema (an object schema).
    pub parameters: Json,
}

/// OpenAI's `tool_choice`.
#[derive(Debug, Clone, PartialEq)]
pub enum ToolChoice {
    /// Text only: no call is parsed.
    None,
    /// Text or calls: the grammar constrains a call once the model opens one.
    Auto,
    /// One call or more.
    Required,
    /// Calls of this function only.
    Named(String),
}

/// A call as OpenAI answers it.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct ToolCall {
    pub index: usize,
    pub id: String,
    pub name: String,
    /// The arguments as a JSON string.
    pub arguments: String,
}

impl ToolCall {
    /// OpenAI's `{id, type, function: {name, arguments}}` (with `index` in a stream).
    pub fn to_json(&self, with_index: bool) -> Json {
        let mut v = json!({"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}});
        if with_index {
            v["index"] = json!(self.index);
        }
        v
    }
}

/// The grammar of a request's tool calls, or None where nothing is constrained
/// (`tool_choice: "none"`).
pub fn tool_grammar(
    format: ToolFormat,
    tools: &[ToolSpec],
    choice: &ToolChoice,
    parallel: bool,
) -> Result<Option<GrammarSpec>> {
    let allowed: Vec<&ToolSpec> = match choice {
        ToolChoice::None => return Ok(None),
        ToolChoice::Named(n) => tools.iter().filter(|t| &t.name == n).collect(),
        ToolChoice::Auto | ToolChoice::Required => tools.iter().collect(),
    };
    if allowed.is_empty() {
        return Err(Error::BadRequest("no tool to call".into()));
    }
    let key = format.arguments_key();
    let calls: Vec<Json> = allowed
        .iter()
        .map(|t| {
            json!({
                "type": "object",
                "properties": {"name": {"const": t.name}, key: t.parameters},
                "required": ["name", key],
                "additionalProperties": false
            })
        })
        .collect();
    let mut schema = match calls.len() {
        1 => calls[0].clone(),
        _ => json!({ "anyOf": calls }),
    };
    schema["x-guidance"] =
        json!({"item_separator": ", ", "key_separator": ": ", "whitespace_flexible": false});
    let free_text = matches!(choice, ToolChoice::Auto);
    let lark = match format {
        ToolFormat::Hermes => {
            // Under auto, free text until the first `<tool_call>` (a lazy lexeme: it
            // ends at the marker's first occurrence), or text alone (which never holds
            // the marker).
            let more = if parallel { " (\"\\n\" call)*" } else { "" };
            let start = match free_text {
                true => format!("TEXT | text_then_open call_body{more}"),
                false => format!("call{more}"),
            };
            format!(
                "start: {start}\n\
                 call: \"{HERMES_OPEN}\" call_body\n\
                 call_body: \"\\n\" %json {schema} \"\\n{HERMES_CLOSE}\"\n\
                 text_then_open[lazy]: /(.|\\n)*{open}/\n\
                 TEXT: /(.|\\n)+/ & ~/(.|\\n)*{open}(.|\\n)*/\n",
                open = regex_syntax_escape(HERMES_OPEN)
            )
        }
        ToolFormat::Llama3Json => {
            let start = if free_text { "TEXT | call" } else { "call" };
            format!("start: {start}\ncall: %json {schema}\nTEXT: /[^{{](.|\\n)*/\n")
        }
    };
    Ok(Some(GrammarSpec::Lark(lark)))
}

/// `s` with the regex metacharacters escaped.
fn regex_syntax_escape(s: &str) -> String {
    s.chars()
        .flat_map(|c| {
            let meta = "\\.+*?()|[]{}^$#&-~/".contains(c);
            meta.then_some('\\').into_iter().chain([c])
        })
        .collect()
}

/// Splits a generation's text into content and tool calls as it streams: content goes
/// out as soon as it cannot be the start of a call, each call once it is whole.
#[derive(Debug, Clone)]
pub struct ToolStream {
    format: ToolFormat,
    text: String,
    /// Bytes of `text` sent as content.
    sent: usize,
    /// Bytes of `text` parsed into calls.
    parsed: usize,
    /// Whether the content has ended (a call has begun).
    in_calls: bool,
    calls: Vec<ToolCall>,
    id_prefix: String,
}

impl ToolStream {
    /// `id_prefix` names the calls (`{prefix}{index}`).
    pub fn new(format: ToolFormat, id_prefix: &str) -> Self {
        ToolStream {
            format,
            text: String::new(),
            sent: 0,
            parsed: 0,
            in_calls: false,
            calls: Vec::new(),
            id_prefix: id_prefix.into(),
        }
    }

    /// Takes a piece of text; returns the content that can go out and the calls
    /// completed.
    pub fn push(&mut self, piece: &str) -> (String, Vec<ToolCall>) {
        self.text.push_str(piece);
        match self.format {
            ToolFormat::Hermes => self.hermes(false),
            ToolFormat::Llama3Json => self.llama(false),
        }
    }

    /// The end of the text: what was held back, as content or calls.
    pub fn finish(&mut self) -> (String, Vec<ToolCall>) {
        match self.format {
            ToolFormat::Hermes => self.hermes(true),
            ToolFormat::Llama3Json => self.llama(true),
        }
    }

    /// Every call parsed so far.
    pub fn calls(&self) -> &[ToolCall] {
        &self.calls
    }

    /// The content: the text before the first call (what `push` and `finish` sent),
    /// None if it is empty and there are calls.
    pub fn content(&self) -> Option<String> {
        let c = &self.text[..self.sent];
        (!c.is_empty() || self.calls.is_empty()).then(|| c.to_string())
    }

    fn hermes(&mut self, end: bool) -> (String, Vec<ToolCall>) {
        let mut content = String::new();
        if !self.in_calls {
            // Content goes out up to a call's start, holding back what may begin one
            // and the whitespace that would end the content before one.
            let (upto, call) = match self.text[self.sent..].find(HERMES_OPEN) {
                Some(i) => (self.sent + i, true),
                None if end => (self.text.len(), false),
                None => (
                    self.text.len() - partial_suffix(&self.text, HERMES_OPEN),
                    false,
                ),
            };
            let upto = match call || !end {
                true => self.text[..upto].trim_end().len().max(self.sent),
                false => upto,
            };
            content = self.text[self.sent..upto].to_string();
            self.sent = upto;
            if call {
                self.in_calls = true;
                self.parsed = self.sent;
            }
        }
        let mut done = Vec::new();
        while self.in_calls {
            let rest = &self.text[self.parsed..];
            let Some(open) = rest.find(HERMES_OPEN) else {
                break;
            };
            let Some(close) = rest[open..].find(HERMES_CLOSE) else {
                break;
            };
            let body = rest[open + HERMES_OPEN.len()..open + close].to_string();
            self.parsed += open + close + HERMES_CLOSE.len();
            if let Some(call) = self.parse_call(&body) {
                done.push(call);
            }
        }
        (content, done)
    }

    fn llama(&mut self, end: bool) -> (String, Vec<ToolCall>) {
        let body = self.text.trim_start();
        if body.is_empty() && !end {
            return (String::new(), Vec::new());
        }
        if !body.starts_with('{') {
            let content = self.text[self.sent..].to_string();
            self.sent = self.text.len();
            return (content, Vec::new());
        }
        self.in_calls = true;
        if !end || self.parsed > 0 {
            return (String::new(), Vec::new());
        }
        self.parsed = self.text.len();
        let call = self.parse_call(&self.text.clone());
        (String::new(), call.into_iter().collect())
    }

    /// One call's JSON, or None if it is not one (cut by the budget).
    fn parse_call(&mut self, body: &str) -> Option<ToolCall> {
        let v: Json = serde_json::from_str(body.trim()).ok()?;
        let name = v.get("name")?.as_str()?.to_string();
        let arguments = v.get(self.format.arguments_key())?.to_string();
        let index = self.calls.len();
        let call = ToolCall {
            index,
            id: format!("{}{index}", self.id_prefix),
            name,
            arguments,
        };
        self.calls.push(call.clone());
        Some(call)
    }
}

/// The length of the longest suffix of `text` that is a proper prefix of `marker`.
fn partial_suffix(text: &str, marker: &str) -> usize {
    (1..marker.len())
        .rev()
        .find(|&n| text.ends_with(&marker[..n]))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hermes_stream_splits_content_and_calls_piece_by_piece() {
        let text = "Let me look.\n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n</tool_call>\n<tool_call>\n{\"name\": \"g\", \"arguments\": {}}\n</tool_call>";
        for step in [1, 3, 7, text.len()] {
            let mut s = ToolStream::new(ToolFormat::Hermes, "call_x");
            let (mut content, mut calls) = (String::new(), Vec::new());
            let chars: Vec<char> = text.chars().collect();
            for piece in chars.chunks(step) {
                let (c, k) = s.push(&piece.iter().collect::<String>());
                content.push_str(&c);
                calls.extend(k);
            }
            let (c, k) = s.finish();
            content.push_str(&c);
            calls.extend(k);
            assert_eq!(content, "Let me look.", "step {step}");
            assert_eq!(s.content().as_deref(), Some("Let me look."));
            let names: Vec<_> = calls
                .iter()
                .map(|c| (c.index, c.name.as_str(), c.arguments.as_str()))
                .collect();
            assert_eq!(names, vec![(0, "f", "{\"a\":1}"), (1, "g", "{}")]);
            assert_eq!(calls[1].id, "call_x1");
        }
        let mut s = ToolStream::new(ToolFormat::Hermes, "c");
        assert_eq!(
            s.push("a <tool").0,
            "a",
            "a possible call's start is held back"
        );
        assert_eq!(s.push("box> b ").0, " <toolbox> b");
        assert_eq!(s.finish(), (" ".to_string(), vec![]));
        assert_eq!(s.content().as_deref(), Some("a <toolbox> b "));
    }

    #[test]
    fn llama_json_is_a_call_or_text() {
        let mut s = ToolStream::new(ToolFormat::Llama3Json, "c");
        assert_eq!(s.push("{\"name\": \"f\", ").0, "");
        s.push("\"parameters\": {\"x\": \"y\"}}");
        let (_, calls) = s.finish();
        assert_eq!(calls[0].arguments, "{\"x\":\"y\"}");
        assert_eq!(s.content(), None);
        let mut s = ToolStream::new(ToolFormat::Llama3Json, "c");
        assert_eq!(s.push("Hello").0, "Hello");
        assert_eq!(s.finish().1, vec![]);
    }
}
