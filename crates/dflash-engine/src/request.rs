//! The OpenAI-style chat and completion requests and the usage figures of their answers:
//! parsed, checked and turned into the core's `GenerateRequest`.

use dflash_core::chat::{ChatTemplate, Message};
use dflash_core::generate::{GenerateRequest, GenerateResult};
use dflash_core::grammar::GrammarSpec;
use dflash_core::sampling::SamplingParams;
use dflash_core::speculative::SpeculativeResult;
use dflash_core::tokenizer::TextTokenizer;
use dflash_core::tools::{ToolChoice, ToolSpec};
use dflash_core::Error;
use serde::Deserialize;

#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Stop {
    One(String),
    Many(Vec<String>),
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: bool,
}

/// `block`: a number of rows or "auto".
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum BlockArg {
    Rows(usize),
    Named(String),
}

/// `engine.chat.completions.create(...)`'s argument (fields the engine does not use,
/// such as `model` or `stream`, which the JS side handles, are ignored). An explicit
/// null in any optional field means its default; a field the API does not have is
/// ignored and listed in `ignored_fields` (answered in the response's `ignored_fields`:
/// the whole answer's, or the first chunk's). The struct itself denies unknown fields:
/// `request_fields()` is what reaches it.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChatRequest {
    pub messages: Vec<Message>,
    #[serde(default)]
    pub model: Option<String>,
    #[serde(default)]
    pub stream: Option<bool>,
    /// `include_usage`: a last chunk with empty `choices` and the usage, as OpenAI sends
    /// (the finish chunk carries the usage either way).
    #[serde(default)]
    pub stream_options: Option<StreamOptions>,
    #[serde(default, alias = "max_completion_tokens")]
    pub max_tokens: Option<usize>,
    /// OpenAI's default is 1.
    #[serde(default)]
    pub temperature: Option<f32>,
    #[serde(default)]
    pub top_p: Option<f32>,
    #[serde(default)]
    pub top_k: Option<usize>,
    #[serde(default)]
    pub min_p: Option<f32>,
    /// OpenAI's penalties and the CTRL repetition penalty (the CPU engine has them; the
    /// GPU sampler refuses them with `Unsupported`).
    #[serde(default)]
    pub frequency_penalty: Option<f32>,
    #[serde(default)]
    pub presence_penalty: Option<f32>,
    #[serde(default)]
    pub repetition_penalty: Option<f32>,
    #[serde(default)]
    pub seed: Option<u64>,
    #[serde(default)]
    pub stop: Option<Stop>,
    /// Speculative decoding on (the default when a drafter is loaded) or off.
    #[serde(default)]
    pub dflash: Option<bool>,
    #[serde(default)]
    pub block: Option<BlockArg>,
    /// At T > 0, verify drafts by rejection sampling (accept with min(1, p/q), else draw
    /// from max(0, p - q)): the output has the model's distribution and more drafts are
    /// accepted, but it is not the plain sampler's token sequence for the seed.
    #[serde(default)]
    pub rejection_sampling: Option<bool>,
    /// With rejection sampling: a DFlash drafter's drafts drawn from its distribution
    /// (its top 16 at the temperature) instead of its argmax.
    #[serde(default)]
    pub sampled_drafts: Option<bool>,
    /// `{"type": "text" | "json_object" | "json_schema", ...}` (`grammar_spec`).
    #[serde(default)]
    pub response_format: Option<serde_json::Value>,
    /// Our extension: `{"type": "lark", "grammar": "..."}` or `{"type": "regex",
    /// "pattern": "..."}`.
    #[serde(default)]
    pub grammar: Option<serde_json::Value>,
    /// Chat: true or false; `/v1/completions`: the number of alternatives (OpenAI's
    /// legacy form).
    #[serde(default)]
    pub logprobs: Option<serde_json::Value>,
    /// Alternatives per position, 0 to 20 (with `logprobs: true`).
    #[serde(default)]
    pub top_logprobs: Option<usize>,
    /// OpenAI's tools: `[{type: "function", function: {name, description, parameters}}]`.
    #[serde(default)]
    pub tools: Option<Vec<serde_json::Value>>,
    /// "none", "auto" (the default with tools), "required", or `{type: "function",
    /// function: {name}}`.
    #[serde(default)]
    pub tool_choice: Option<serde_json::Value>,
    /// Whether one answer may hold several calls (default true).
    #[serde(default)]
    pub parallel_tool_calls: Option<bool>,
    /// The top-level fields the API does not have, ignored.
    #[serde(skip)]
    pub ignored_fields: Vec<String>,
}

/// Fields that take a non-negative integer (serde's own error would not name the field).
const COUNT_FIELDS: [&str; 5] = [
    "max_tokens",
    "max_completion_tokens",
    "top_k",
    "seed",
    "top_logprobs",
];
const FLOAT_FIELDS: [&str; 6] = [
    "temperature",
    "top_p",
    "min_p",
    "frequency_penalty",
    "presence_penalty",
    "repetition_penalty",
];
const BOOL_FIELDS: [&str; 5] = [
    "stream",
    "dflash",
    "rejection_sampling",
    "sampled_drafts",
    "parallel_tool_calls",
];

/// `ChatRequest`'s own fields and the alias `max_completion_tokens`.
const CHAT_FIELDS: [&str; 26] = [
    "messages",
    "model",
    "stream",
    "stream_options",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "frequency_penalty",
    "presence_penalty",
    "repetition_penalty",
    "seed",
    "stop",
    "dflash",
    "block",
    "rejection_sampling",
    "sampled_drafts",
    "response_format",
    "grammar",
    "logprobs",
    "top_logprobs",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
];

/// Every top-level field a request may have: `CHAT_FIELDS`, `NEUTRAL_FIELDS`,
/// `CHOICE_FIELDS` and `IGNORED_FIELDS`. The package's `index.d.ts` declares exactly
/// these (tests on both sides).
pub fn request_fields() -> impl Iterator<Item = &'static str> {
    CHAT_FIELDS
        .into_iter()
        .chain(NEUTRAL_FIELDS.map(|(k, _)| k))
        .chain(CHOICE_FIELDS)
        .chain(IGNORED_FIELDS)
}

/// Fields OpenAI clients (and WebLLM code) send that change nothing at these values.
const NEUTRAL_FIELDS: [(&str, &str); 3] = [("n", "1"), ("logit_bias", "{}"), ("functions", "[]")];

/// The legacy function calling, accepted only as "none" or "auto" (without functions).
const CHOICE_FIELDS: [&str; 1] = ["function_call"];

/// Fields that never change the answer (who asks, what to store, how to bill).
const IGNORED_FIELDS: [&str; 5] = ["user", "metadata", "store", "service_tier", "modalities"];

/// Accepts and drops what OpenAI's API allows and that changes nothing here: the
/// neutral values of `NEUTRAL_FIELDS` (or null), `tool_choice` / `function_call`
/// "none" or "auto" (without tools), `IGNORED_FIELDS`, a message's `name`, content given as text parts (joined),
/// and the `developer` role (a system message). Any other value of those fields would
/// change the answer in a way the engine does not implement: `BadRequest` naming it.
fn accept_openai_defaults(v: &mut serde_json::Value) -> Result<(), Error> {
    let Some(obj) = v.as_object_mut() else {
        return Ok(());
    };
    for (k, neutral) in NEUTRAL_FIELDS {
        if let Some(x) = obj.remove(k) {
            let want: serde_json::Value = serde_json::from_str(neutral).expect("neutral value");
            if !x.is_null() && x != want && !(k == "n" && x == 1.0) {
                return Err(Error::BadRequest(format!(
                    "`{k}` is not supported except as {neutral}, not {x}"
                )));
            }
        }
    }
    for k in CHOICE_FIELDS {
        if let Some(x) = obj.remove(k) {
            if !(x.is_null() || x == "none" || x == "auto") {
                return Err(Error::BadRequest(format!(
                    "`{k}` {x}: function calling is not supported"
                )));
            }
        }
    }
    for k in IGNORED_FIELDS {
        obj.remove(k);
    }
    if let Some(serde_json::Value::Array(ms)) = obj.get_mut("messages") {
        for (i, m) in ms.iter_mut().enumerate() {
            openai_message(i, m)?;
        }
    }
    Ok(())
}

/// Removes the top-level fields that are null (their default) and those the API does
/// not have (returned, sorted); in each message, null fields too.
fn drop_nulls_and_unknown_fields(v: &mut serde_json::Value) -> Vec<String> {
    let Some(obj) = v.as_object_mut() else {
        return Vec::new();
    };
    obj.retain(|_, x| !x.is_null());
    let known: Vec<&str> = request_fields().collect();
    let mut ignored: Vec<String> = obj
        .keys()
        .filter(|k| !known.contains(&k.as_str()))
        .cloned()
        .collect();
    ignored.sort();
    for k in &ignored {
        obj.remove(k);
    }
    if let Some(serde_json::Value::Array(ms)) = obj.get_mut("messages") {
        for m in ms.iter_mut().filter_map(|m| m.as_object_mut()) {
            m.retain(|_, x| !x.is_null());
        }
    }
    ignored
}

/// One message in OpenAI's forms: `name` dropped, text parts joined, `developer` as
/// `system`.
fn openai_message(i: usize, m: &mut serde_json::Value) -> Result<(), Error> {
    let Some(m) = m.as_object_mut() else {
        return Ok(());
    };
    if m.get("name").is_some_and(|n| n.is_string()) {
        m.remove("name");
    }
    if m.get("role").is_some_and(|r| r == "developer") {
        m.insert("role".into(), "system".into());
    }
    if let Some(calls) = m.get_mut("tool_calls") {
        assistant_tool_calls(i, calls)?;
        m.entry("content").or_insert_with(|| "".into());
    }
    if let Some(serde_json::Value::Array(parts)) = m.get("content") {
        let mut text = String::new();
        for (j, p) in parts.iter().enumerate() {
            match (p.get("type").and_then(|t| t.as_str()), p.get("text")) {
                (Some("text"), Some(serde_json::Value::String(t))) => text.push_str(t),
                (kind, _) => {
                    return Err(Error::BadRequest(format!(
                        "`messages[{i}].content[{j}]` of type {} is not supported: only text parts",
                        kind.unwrap_or("(none)")
                    )))
                }
            }
        }
        m.insert("content".into(), text.into());
    }
    Ok(())
}

/// An assistant message's `tool_calls` as templates take them (Hugging Face's
/// convention): each call's `function.arguments`, a JSON string in OpenAI's form, as
/// the object it holds.
fn assistant_tool_calls(i: usize, calls: &mut serde_json::Value) -> Result<(), Error> {
    let bad = |m: String| Err(Error::BadRequest(format!("`messages[{i}].tool_calls{m}")));
    let Some(list) = calls.as_array_mut() else {
        return bad("` must be an array".into());
    };
    for (j, call) in list.iter_mut().enumerate() {
        let args = call.pointer_mut("/function/arguments");
        let Some(args) = args else {
            return bad(format!("[{j}].function.arguments` is missing"));
        };
        if let serde_json::Value::String(text) = args {
            match serde_json::from_str::<serde_json::Value>(text) {
                Ok(v) => *args = v,
                Err(e) => return bad(format!("[{j}].function.arguments` is not JSON: {e}")),
            }
        }
    }
    Ok(())
}

/// The first field of `v` with the wrong JSON type, as an error naming it.
fn check_types(v: &serde_json::Value) -> Result<(), Error> {
    let bad = |k: &str, want: &str| {
        Err(Error::BadRequest(format!(
            "`{k}` must be {want}, not {}",
            v[k]
        )))
    };
    if !v.is_object() {
        return Err(Error::BadRequest(format!(
            "the request must be an object, not {v}"
        )));
    }
    for k in COUNT_FIELDS {
        if v.get(k).is_some_and(|x| !x.is_u64()) {
            return bad(k, "a non-negative integer");
        }
    }
    for k in FLOAT_FIELDS {
        if v.get(k).is_some_and(|x| !x.is_number()) {
            return bad(k, "a number");
        }
    }
    for k in BOOL_FIELDS {
        if v.get(k).is_some_and(|x| !x.is_boolean()) {
            return bad(k, "true or false");
        }
    }
    if v.get("block").is_some_and(|x| !x.is_u64() && x != "auto") {
        return bad("block", "a positive integer or \"auto\"");
    }
    match v.get("messages") {
        None => return Err(Error::BadRequest("`messages` is missing".into())),
        Some(serde_json::Value::Array(ms)) => {
            for (i, m) in ms.iter().enumerate() {
                for k in ["role", "content"] {
                    if !m.get(k).is_some_and(|x| x.is_string()) {
                        return Err(Error::BadRequest(format!(
                            "`messages[{i}].{k}` must be a string, not {}",
                            m.get(k).unwrap_or(&serde_json::Value::Null)
                        )));
                    }
                }
            }
        }
        Some(_) => return bad("messages", "an array of { role, content }"),
    }
    Ok(())
}

/// `response_format`: none for text; any JSON object (WebLLM's `json_object` may carry
/// a `schema`, as an object or a string); OpenAI's `json_schema` (`{name, schema,
/// strict}`).
fn response_format_spec(f: &serde_json::Value) -> Result<Option<GrammarSpec>, Error> {
    use serde_json::Value;
    let bad = |m: String| Err(Error::BadRequest(format!("`response_format{m}")));
    let schema = |place: &str, x: Option<&Value>, strict: bool| match x {
        None => Ok(Some(GrammarSpec::JsonObject)),
        Some(Value::String(text)) => match serde_json::from_str::<Value>(text) {
            Ok(schema) => Ok(Some(GrammarSpec::JsonSchema { schema, strict })),
            Err(e) => bad(format!("{place}` is not JSON: {e}")),
        },
        Some(schema @ (Value::Object(_) | Value::Bool(_))) => Ok(Some(GrammarSpec::JsonSchema {
            schema: schema.clone(),
            strict,
        })),
        Some(other) => bad(format!(
            "{place}` must be a JSON schema (an object), not {other}"
        )),
    };
    let Some(obj) = f.as_object() else {
        return bad(format!("` must be an object, not {f}"));
    };
    match obj.get("type").and_then(Value::as_str) {
        Some("text") => Ok(None),
        Some("json_object") => schema(".schema", obj.get("schema").filter(|x| !x.is_null()), true),
        Some("json_schema") => {
            let Some(js) = obj.get("json_schema").and_then(Value::as_object) else {
                return bad(".json_schema` must be an object {name, schema, strict}".into());
            };
            let strict = js.get("strict").and_then(Value::as_bool).unwrap_or(false);
            let s = js.get("schema").filter(|x| !x.is_null());
            schema(".json_schema.schema", s, strict)
        }
        Some(other) => bad(format!(
            ".type` {other:?} is not supported (text, json_object, json_schema; Lark and regex grammars through `grammar`)"
        )),
        None => bad(".type` is missing (text, json_object or json_schema)".into()),
    }
}

/// Our `grammar` extension: `{"type": "lark", "grammar": "..."}` or `{"type": "regex",
/// "pattern": "..."}`.
fn grammar_extension_spec(g: &serde_json::Value) -> Result<GrammarSpec, Error> {
    let text = |k: &str| match g.get(k) {
        Some(serde_json::Value::String(s)) => Ok(s.clone()),
        _ => Err(Error::BadRequest(format!("`grammar.{k}` must be a string"))),
    };
    match g.get("type").and_then(|t| t.as_str()) {
        Some("lark") => Ok(GrammarSpec::Lark(text("grammar")?)),
        Some("regex") => Ok(GrammarSpec::Regex(text("pattern")?)),
        _ => Err(Error::BadRequest(format!(
            "`grammar` must be {{\"type\": \"lark\", \"grammar\": ...}} or {{\"type\": \"regex\", \"pattern\": ...}}, not {g}"
        ))),
    }
}

/// A request's tools: what the grammar constrains and the template renders.
#[derive(Debug, Clone)]
pub struct ToolRequest {
    pub tools: Vec<ToolSpec>,
    pub choice: ToolChoice,
    pub parallel: bool,
    /// The `tools` as the request gave them (what the chat template renders).
    pub openai: serde_json::Value,
}

/// `tools[i]`: `{type: "function", function: {name, description, parameters, strict}}`.
fn tool_spec(i: usize, t: &serde_json::Value) -> Result<ToolSpec, Error> {
    let bad = |m: &str| Err(Error::BadRequest(format!("`tools[{i}]{m}")));
    if t.get("type").is_some_and(|x| x != "function") {
        return bad(".type` must be \"function\"");
    }
    let Some(f) = t.get("function").filter(|f| f.is_object()) else {
        return bad(".function` must be an object {name, description, parameters}");
    };
    let name = match f.get("name").and_then(|n| n.as_str()) {
        Some(n) if valid_tool_name(n) => n.to_string(),
        _ => return bad(".function.name` must be 1-64 letters, digits, `_` or `-`"),
    };
    let parameters = match f.get("parameters") {
        None | Some(serde_json::Value::Null) => {
            serde_json::json!({"type": "object", "properties": {}})
        }
        Some(p) if p.is_object() => p.clone(),
        Some(p) => {
            return bad(&format!(
                ".function.parameters` must be a JSON schema object, not {p}"
            ))
        }
    };
    Ok(ToolSpec { name, parameters })
}

fn valid_tool_name(n: &str) -> bool {
    (1..=64).contains(&n.len())
        && n.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// `tool_choice` against the tools.
fn tool_choice(c: Option<&serde_json::Value>, tools: &[ToolSpec]) -> Result<ToolChoice, Error> {
    use serde_json::Value;
    match c {
        None => Ok(ToolChoice::Auto),
        Some(Value::String(s)) => match s.as_str() {
            "none" => Ok(ToolChoice::None),
            "auto" => Ok(ToolChoice::Auto),
            "required" => Ok(ToolChoice::Required),
            other => Err(Error::BadRequest(format!(
                "`tool_choice` {other:?} is not one of none, auto, required or {{type: \"function\", function: {{name}}}}"
            ))),
        },
        Some(v) => match v.pointer("/function/name").and_then(Value::as_str) {
            Some(n) if tools.iter().any(|t| t.name == n) => Ok(ToolChoice::Named(n.into())),
            Some(n) => Err(Error::BadRequest(format!(
                "`tool_choice.function.name` {n:?} names no tool of `tools`"
            ))),
            None => Err(Error::BadRequest(format!(
                "`tool_choice` must be none, auto, required or {{type: \"function\", function: {{name}}}}, not {v}"
            ))),
        },
    }
}

/// Tokens generated when the request does not say.
pub const DEFAULT_MAX_TOKENS: usize = 256;

impl ChatRequest {
    pub fn from_json(v: serde_json::Value) -> Result<Self, Error> {
        let mut v = v;
        let ignored_fields = drop_nulls_and_unknown_fields(&mut v);
        accept_openai_defaults(&mut v)?;
        check_types(&v)?;
        let mut r: ChatRequest =
            serde_json::from_value(v).map_err(|e| Error::BadRequest(e.to_string()))?;
        r.ignored_fields = ignored_fields;
        if r.messages.is_empty() {
            return Err(Error::BadRequest("`messages` is empty".into()));
        }
        if let Some(m) = r
            .messages
            .iter()
            .find(|m| !["system", "user", "assistant", "tool"].contains(&m.role.as_str()))
        {
            return Err(Error::BadRequest(format!("unknown role {:?}", m.role)));
        }
        Ok(r)
    }

    /// Everything that can be checked without the model: the fields (`from_json`), the
    /// sampling parameters and the block size. The wasm exports it as `validateRequest`
    /// (for tests and tools; the engine's `chat` runs the same checks).
    pub fn validate(&self) -> Result<(), Error> {
        self.check_logprobs()?;
        self.sampling(0)?;
        self.grammar_spec()?;
        self.tool_request()?;
        if let Some(BlockArg::Rows(0)) = self.block {
            return Err(Error::BadRequest("`block` must be at least 1".into()));
        }
        Ok(())
    }

    /// Sampling parameters; `fallback_seed` when the request gives none.
    pub fn sampling(&self, fallback_seed: u64) -> Result<SamplingParams, Error> {
        let sp = SamplingParams {
            temperature: self.temperature.unwrap_or(1.0),
            top_k: self.top_k.unwrap_or(0),
            top_p: self.top_p.unwrap_or(1.0),
            min_p: self.min_p.unwrap_or(0.0),
            repetition_penalty: self.repetition_penalty.unwrap_or(1.0),
            frequency_penalty: self.frequency_penalty.unwrap_or(0.0),
            presence_penalty: self.presence_penalty.unwrap_or(0.0),
            penalized_from: 0,
            seed: self.seed.unwrap_or(fallback_seed),
            speculative_rejection: self.rejection_sampling.unwrap_or(false),
            sampled_drafts: self.sampled_drafts.unwrap_or(false),
            logprobs: self.logprobs_wanted(),
        };
        sp.validate()?;
        Ok(sp)
    }

    /// The grammar the request asks for (`response_format` or `grammar`), checked for
    /// its shape; the engine compiles it.
    pub fn grammar_spec(&self) -> Result<Option<GrammarSpec>, Error> {
        let format = match &self.response_format {
            Some(f) => response_format_spec(f)?,
            None => None,
        };
        let grammar = match &self.grammar {
            Some(g) => Some(grammar_extension_spec(g)?),
            None => None,
        };
        match (format, grammar) {
            (Some(_), Some(_)) => Err(Error::BadRequest(
                "give `response_format` or `grammar`, not both".into(),
            )),
            (f, g) => Ok(f.or(g)),
        }
    }

    /// The request's tools, checked: None without tools (or with an empty list).
    pub fn tool_request(&self) -> Result<Option<ToolRequest>, Error> {
        let tools = match &self.tools {
            Some(t) if !t.is_empty() => t,
            _ => {
                return match self.tool_choice.as_ref().and_then(|c| c.as_str()) {
                    None | Some("none") | Some("auto") => Ok(None),
                    _ => Err(Error::BadRequest(
                        "`tool_choice` asks for a call but there are no `tools`".into(),
                    )),
                }
            }
        };
        let specs = tools
            .iter()
            .enumerate()
            .map(|(i, t)| tool_spec(i, t))
            .collect::<Result<Vec<_>, _>>()?;
        if let Some((i, t)) = specs
            .iter()
            .enumerate()
            .find(|(i, t)| specs[..*i].iter().any(|u| u.name == t.name))
        {
            return Err(Error::BadRequest(format!(
                "`tools[{i}].function.name` {:?} is given twice",
                t.name
            )));
        }
        if self
            .response_format
            .as_ref()
            .is_some_and(|f| f["type"] != "text")
            || self.grammar.is_some()
        {
            return Err(Error::BadRequest(
                "`tools` with `response_format` or `grammar` is not supported: give one".into(),
            ));
        }
        let choice = tool_choice(self.tool_choice.as_ref(), &specs)?;
        Ok(Some(ToolRequest {
            tools: specs,
            choice,
            parallel: self.parallel_tool_calls.unwrap_or(true),
            openai: serde_json::Value::Array(tools.clone()),
        }))
    }

    /// `logprobs` and `top_logprobs` as the sampler's request: None, or Some(alternatives).
    pub fn logprobs_wanted(&self) -> Option<usize> {
        match &self.logprobs {
            Some(serde_json::Value::Bool(true)) => Some(self.top_logprobs.unwrap_or(0)),
            Some(serde_json::Value::Number(n)) => n.as_u64().map(|n| n as usize),
            _ => None,
        }
    }

    /// `logprobs` is true or false (or, for completions, a count); `top_logprobs` needs
    /// it.
    fn check_logprobs(&self) -> Result<(), Error> {
        let bad = |m: &str| Err(Error::BadRequest(m.into()));
        match &self.logprobs {
            None | Some(serde_json::Value::Bool(_)) => {}
            Some(n) if n.is_u64() => {}
            Some(x) => return bad(&format!("`logprobs` must be true or false, not {x}")),
        }
        if self.top_logprobs.is_some_and(|n| n > 0) && self.logprobs_wanted().is_none() {
            return bad("`top_logprobs` needs `logprobs: true`");
        }
        Ok(())
    }

    pub fn stop_strings(&self) -> Vec<String> {
        match &self.stop {
            None => vec![],
            Some(Stop::One(s)) => vec![s.clone()],
            Some(Stop::Many(v)) => v.clone(),
        }
    }

    /// The prompt through the model's own chat template, and the engine's request.
    pub fn to_generate(
        &self,
        tok: &TextTokenizer,
        tpl: Option<&ChatTemplate>,
        context: usize,
        fallback_seed: u64,
    ) -> Result<GenerateRequest, Error> {
        let tpl =
            tpl.ok_or_else(|| Error::ChatTemplate("the model has no chat template".into()))?;
        let tools = self.tool_request()?.map(|t| t.openai);
        let text = tpl.render_with_tools(&self.messages, true, tools.as_ref())?;
        self.generate_for(tok.encode(&text, true)?, context, fallback_seed)
    }

    /// The core's request for the prompt's tokens, within the token budget.
    fn generate_for(
        &self,
        prompt_ids: Vec<u32>,
        context: usize,
        fallback_seed: u64,
    ) -> Result<GenerateRequest, Error> {
        let max_new_tokens = self.max_tokens.unwrap_or(DEFAULT_MAX_TOKENS);
        let sampling = SamplingParams {
            penalized_from: prompt_ids.len(),
            ..self.sampling(fallback_seed)?
        };
        let req = GenerateRequest {
            prompt_ids,
            max_new_tokens,
            sampling,
            stop_strings: self.stop_strings(),
            context,
            interrupt: Default::default(),
            grammar: None,
        };
        dflash_core::generate::token_budget(req.prompt_ids.len(), req.max_new_tokens, context)?;
        Ok(req)
    }
}

/// Which OpenAI endpoint a request came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    /// `/v1/chat/completions`: messages through the model's chat template.
    Chat,
    /// `/v1/completions`: a raw `prompt`, tokenized as is.
    Completion,
}

/// A request to either endpoint: the chat request's fields, and a completion's prompt.
#[derive(Debug, Clone)]
pub struct Request {
    pub chat: ChatRequest,
    /// `/v1/completions`: the raw prompt instead of the chat template.
    pub raw_prompt: Option<String>,
}

impl Request {
    /// A chat request, parsed and checked.
    pub fn chat(v: serde_json::Value) -> Result<Self, Error> {
        let chat = ChatRequest::from_json(v)?;
        chat.validate()?;
        Ok(Request {
            chat,
            raw_prompt: None,
        })
    }

    /// A request body (JSON) to `endpoint`, parsed and checked.
    pub fn from_body(body: &[u8], endpoint: Endpoint) -> Result<Self, Error> {
        let bad = |m: String| Error::BadRequest(m);
        let mut v: serde_json::Value =
            serde_json::from_slice(body).map_err(|e| bad(format!("the body is not JSON: {e}")))?;
        let Some(obj) = v.as_object_mut() else {
            return Err(bad("the body must be a JSON object".into()));
        };
        if endpoint == Endpoint::Chat {
            return Self::chat(v);
        }
        let prompt = match obj.remove("prompt") {
            Some(serde_json::Value::String(p)) => p,
            Some(_) => return Err(bad("`prompt` must be a string".into())),
            None => return Err(bad("`prompt` is required".into())),
        };
        // The other fields are the chat request's; the message only passes its checks.
        obj.insert(
            "messages".into(),
            serde_json::json!([{"role": "user", "content": ""}]),
        );
        Ok(Request {
            raw_prompt: Some(prompt),
            ..Self::chat(v)?
        })
    }

    /// Whether the answer streams (`stream: true`).
    pub fn streams(&self) -> bool {
        self.chat.stream == Some(true)
    }

    /// `stream_options.include_usage`.
    pub fn include_usage(&self) -> bool {
        self.chat
            .stream_options
            .as_ref()
            .is_some_and(|o| o.include_usage)
    }

    /// The core's request: the chat template's prompt (or the raw prompt), the sampler
    /// (`fallback_seed` where the request names none) and the token budget.
    pub fn to_generate(
        &self,
        tok: &TextTokenizer,
        tpl: Option<&ChatTemplate>,
        context: usize,
        fallback_seed: u64,
    ) -> Result<GenerateRequest, Error> {
        let Some(prompt) = &self.raw_prompt else {
            return self.chat.to_generate(tok, tpl, context, fallback_seed);
        };
        let prompt_ids = tok.encode(prompt, true)?;
        if prompt_ids.is_empty() {
            return Err(Error::EmptyPrompt);
        }
        self.chat.generate_for(prompt_ids, context, fallback_seed)
    }
}

/// `usage` of an answer: OpenAI's token counts plus speeds and the DFlash figures.
pub fn usage(r: &GenerateResult, spec: Option<(&SpeculativeResult, &str)>) -> serde_json::Value {
    let completion = r.tokens.len();
    let mut u = serde_json::json!({
        "prompt_tokens": r.prompt_tokens,
        "completion_tokens": completion,
        "total_tokens": r.prompt_tokens + completion,
        // OpenAI's field for prompt tokens served from the cache (here: the KV rows kept
        // from the previous request of the conversation).
        "prompt_tokens_details": { "cached_tokens": r.cached_tokens },
        "prefill_s": r.prefill_s,
        "decode_s": r.decode_s,
        "prefill_tok_s": r.prompt_tokens as f64 / r.prefill_s.max(1e-9),
        // The first token comes from the prefill: its time is the time to first token
        // (from the start of this request's prefill; a queued request waited before).
        "time_to_first_token_s": r.prefill_s,
        "decode_tok_s": completion.saturating_sub(1) as f64 / r.decode_s.max(1e-9),
    });
    u["dflash"] = match spec {
        Some((s, block)) => serde_json::json!({
            "enabled": true,
            "block": block,
            "steps": s.steps,
            "mean_tau": s.mean_tau(),
            "accepted_tokens": s.taus.iter().map(|t| t - 1).sum::<usize>(),
            "acceptance_by_position": s.acceptance.rates(),
        }),
        None => serde_json::json!({ "enabled": false }),
    };
    u
}
