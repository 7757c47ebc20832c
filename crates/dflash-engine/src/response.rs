//! OpenAI's response objects: a whole `chat.completion` (or `text_completion`), and the
//! chunks of a streamed one: the role first, a chunk per text piece (with whether its
//! token was an accepted draft), the finish reason with the usage, and with
//! `stream_options.include_usage` a last chunk with no choices.

use crate::engine::Answer;
use crate::request::{Endpoint, Request};
use dflash_core::generate::{Piece, SpelledLogprob};
use serde_json::{json, Value};

/// Adds `grammar_warnings` to `v` where the request's grammar left something
/// unenforced (a schema's keywords the grammar engine lacks, not strict): the answer
/// is not held to them.
fn with_grammar_warnings(mut v: Value, answer: &Answer) -> Value {
    if !answer.grammar_warnings.is_empty() {
        v["grammar_warnings"] = json!(answer.grammar_warnings);
    }
    v
}

/// A chat answer's message: the text, or with tools the content and the calls.
fn message(text: &str, answer: &Answer) -> Value {
    match &answer.tools {
        Some(t) if !t.calls.is_empty() => json!({
            "role": "assistant",
            "content": t.content,
            "tool_calls": t.calls.iter().map(|c| c.to_json(false)).collect::<Vec<_>>(),
        }),
        Some(t) => json!({"role": "assistant", "content": t.content.as_deref().unwrap_or("")}),
        None => json!({"role": "assistant", "content": text}),
    }
}

/// The envelope of one request's answer.
#[derive(Debug, Clone)]
pub struct Reply {
    pub id: String,
    /// Unix seconds.
    pub created: u64,
    pub model: String,
    pub endpoint: Endpoint,
    /// `stream_options.include_usage`.
    pub include_usage: bool,
    /// The request's fields the API does not have, ignored: answered in the whole
    /// answer and the first chunk (when there are any).
    pub ignored_fields: Vec<String>,
    /// Whether the request asked for log-probabilities.
    pub logprobs: bool,
}

impl Reply {
    /// The envelope of `req`'s answer, named `id`.
    pub fn new(req: &Request, id: String, created: u64, model: String) -> Self {
        Reply {
            id,
            created,
            model,
            endpoint: if req.raw_prompt.is_some() {
                Endpoint::Completion
            } else {
                Endpoint::Chat
            },
            include_usage: req.include_usage(),
            ignored_fields: req.chat.ignored_fields.clone(),
            logprobs: req.chat.logprobs_wanted().is_some(),
        }
    }

    /// A choice's `logprobs` for `lps`: chat's `{content: [...]}`, a completion's
    /// legacy lists; null where the request did not ask.
    fn logprobs_json(&self, lps: &[SpelledLogprob]) -> Value {
        if !self.logprobs {
            return Value::Null;
        }
        let entry =
            |l: &SpelledLogprob| json!({"token": l.text, "logprob": l.logprob, "bytes": l.bytes});
        match self.endpoint {
            Endpoint::Chat => {
                let content: Vec<Value> = lps
                    .iter()
                    .map(|l| {
                        let mut e = entry(l);
                        e["top_logprobs"] = l.top.iter().map(entry).collect();
                        e
                    })
                    .collect();
                json!({ "content": content })
            }
            Endpoint::Completion => {
                let top: Vec<Value> = lps
                    .iter()
                    .map(|l| {
                        l.top
                            .iter()
                            .map(|a| (a.text.clone(), json!(a.logprob)))
                            .collect()
                    })
                    .collect();
                json!({
                    "tokens": lps.iter().map(|l| &l.text).collect::<Vec<_>>(),
                    "token_logprobs": lps.iter().map(|l| l.logprob).collect::<Vec<_>>(),
                    "top_logprobs": top,
                })
            }
        }
    }

    /// The id's prefix OpenAI uses for the endpoint.
    pub fn id_prefix(endpoint: Endpoint) -> &'static str {
        match endpoint {
            Endpoint::Chat => "chatcmpl",
            Endpoint::Completion => "cmpl",
        }
    }

    fn object(&self, chunk: bool) -> &'static str {
        match (self.endpoint, chunk) {
            (Endpoint::Completion, _) => "text_completion",
            (Endpoint::Chat, false) => "chat.completion",
            (Endpoint::Chat, true) => "chat.completion.chunk",
        }
    }

    fn envelope(&self, choices: Value, chunk: bool) -> Value {
        json!({"id": self.id, "object": self.object(chunk), "created": self.created, "model": self.model, "choices": choices})
    }

    /// Adds `ignored_fields` to `v` where the request had fields the API does not have.
    fn with_ignored_fields(&self, mut v: Value) -> Value {
        if !self.ignored_fields.is_empty() {
            v["ignored_fields"] = json!(self.ignored_fields);
        }
        v
    }

    /// The whole answer: `text` and the answer's finish reason and usage.
    pub fn whole(&self, text: &str, answer: &Answer) -> Value {
        let finish = answer.finish_reason();
        let choice = match self.endpoint {
            Endpoint::Completion => {
                json!({"index": 0, "text": text, "finish_reason": finish})
            }
            Endpoint::Chat => {
                json!({"index": 0, "message": message(text, answer), "finish_reason": finish})
            }
        };
        let mut choice = choice;
        choice["logprobs"] = self.logprobs_json(&answer.result.logprobs);
        let mut v = self.envelope(json!([choice]), false);
        v["usage"] = answer.usage.clone();
        with_grammar_warnings(self.with_ignored_fields(v), answer)
    }

    /// A stream's chunk of one choice: `text` (None: nothing), `finish` (a reason or null).
    fn chunk(&self, text: Option<&str>, finish: Value) -> Value {
        let choice = match self.endpoint {
            Endpoint::Completion => {
                json!({"index": 0, "text": text.unwrap_or(""), "finish_reason": finish, "logprobs": null})
            }
            Endpoint::Chat => {
                let delta = text.map_or(json!({}), |t| json!({"content": t}));
                json!({"index": 0, "delta": delta, "finish_reason": finish})
            }
        };
        self.envelope(json!([choice]), true)
    }

    /// A stream's first chunk: the chat's role (none for a completion).
    pub fn first_chunk(&self) -> Option<Value> {
        (self.endpoint == Endpoint::Chat).then(|| {
            let role = json!({"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": null});
            self.with_ignored_fields(self.envelope(json!([role]), true))
        })
    }

    /// A stream's chunk of a text piece, with our extension `dflash`: the piece's
    /// `token_ids` and whether its last token was an accepted draft (`drafted`).
    pub fn piece_chunk(&self, piece: &Piece<'_>) -> Value {
        let mut v = self.chunk(Some(piece.text), Value::Null);
        if !piece.tool_calls.is_empty() && self.endpoint == Endpoint::Chat {
            let delta = &mut v["choices"][0]["delta"];
            if piece.text.is_empty() {
                *delta = json!({});
            }
            delta["tool_calls"] = piece.tool_calls.iter().map(|c| c.to_json(true)).collect();
        }
        if self.logprobs {
            v["choices"][0]["logprobs"] = self.logprobs_json(piece.logprobs);
        }
        v["dflash"] = json!({ "drafted": piece.drafted, "token_ids": piece.ids });
        v
    }

    /// A stream's last chunks: the finish reason with the usage, then with
    /// `include_usage` one with no choices and the usage.
    pub fn last_chunks(&self, answer: &Answer) -> Vec<Value> {
        let mut end = self.chunk(None, answer.finish_reason().into());
        end["usage"] = answer.usage.clone();
        let end = with_grammar_warnings(end, answer);
        let mut chunks = vec![end];
        if self.include_usage {
            let mut u = self.envelope(json!([]), true);
            u["usage"] = answer.usage.clone();
            chunks.push(u);
        }
        chunks
    }
}
