//! What is fuzzed: every parser a user's file or request reaches, each with seeds from
//! the tests' synthetic models and, where they are on this machine, the real files.

use crate::{Input, Part};
use dflash_core::chat::{ChatTemplate, Message};
use dflash_core::config::Arch;
use dflash_core::cpu::{CpuModel, LogitRows};
use dflash_core::drafter::{DrafterPrecision, DrafterWeights};
use dflash_core::formats::ggml::GgmlType;
use dflash_core::formats::gguf::{parse_header, GgufHeader};
use dflash_core::formats::gguf_weights_stream::{HostSink, WeightStream};
use dflash_core::model_files::{load_gguf, load_hf, HfFiles, LoadedModel};
use dflash_core::testutil::{random_weights, tiny_config, write_gguf, write_hf, CHATML_TEMPLATE};
use dflash_core::tokenizer::TextTokenizer;
use dflash_engine::request::ChatRequest;
use std::path::{Path, PathBuf};

/// What one execution gave: `key` names the outcome (ok, or the error with its numbers
/// blanked) so that inputs reaching a new outcome join the corpus; `finding` is a defect
/// other than a panic (two loaders disagreeing).
pub struct Verdict {
    pub key: String,
    pub finding: Option<String>,
}

impl Verdict {
    fn of<T, E: std::fmt::Display + std::fmt::Debug>(r: &Result<T, E>) -> Self {
        let key = match r {
            Ok(_) => "ok".to_string(),
            Err(e) => error_kind(&format!("{e:?}"), &e.to_string()),
        };
        Verdict { key, finding: None }
    }
}

/// A successful run's outcome by the size of what it made (a power of two), so inputs
/// that make something larger or smaller join the corpus.
fn ok_by_size<E: std::fmt::Display + std::fmt::Debug>(r: Result<usize, E>) -> Verdict {
    match r {
        Ok(n) => Verdict {
            key: format!("ok, about 2^{} long", usize::BITS - n.leading_zeros()),
            finding: None,
        },
        Err(e) => Verdict::of::<(), E>(&Err(e)),
    }
}

/// An error's kind: its variant and the start of its message, numbers blanked and cut
/// at the first quoted or listed part, or the second colon (names and values taken
/// from the input follow them).
fn error_kind(debug: &str, message: &str) -> String {
    let variant: String = debug.chars().take_while(|c| c.is_alphanumeric()).collect();
    let mut text = String::new();
    let mut colons = 0;
    for c in message
        .chars()
        .take_while(|c| !matches!(c, '"' | '`' | '\'' | '[' | '('))
        .take_while(|&c| {
            colons += (c == ':') as usize;
            colons < 2
        })
        .take(48)
    {
        let c = if c.is_ascii_digit() { '#' } else { c };
        if !(c == '#' && text.ends_with('#')) {
            text.push(c);
        }
    }
    format!("{variant}: {text}")
}

pub struct Target {
    pub name: &'static str,
    pub seeds: Vec<Input>,
    pub dictionary: &'static [&'static str],
    pub run: Box<dyn Fn(&Input) -> Verdict>,
}

pub const NAMES: [&str; 9] = [
    "gguf-header",
    "gguf-load",
    "hf-folder",
    "drafter",
    "tokenizer",
    "chat-template",
    "request",
    "grammar",
    "tool-calls",
];

pub fn target(name: &str) -> Option<Target> {
    Some(match name {
        "gguf-header" => gguf_header(),
        "gguf-load" => gguf_load(),
        "hf-folder" => hf_folder(),
        "drafter" => drafter(),
        "tokenizer" => tokenizer(),
        "chat-template" => chat_template(),
        "request" => request(),
        "grammar" => grammar(),
        "tool-calls" => tool_calls(),
        _ => return None,
    })
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn one(name: &str, bytes: Vec<u8>) -> Input {
    Input {
        parts: vec![Part {
            name: name.into(),
            bytes,
        }],
    }
}

/// The tiny synthetic models of the tests, in the quantized types real files use.
fn tiny_ggufs() -> Vec<Vec<u8>> {
    let kinds = [
        (Arch::Llama, GgmlType::Q4_1),
        (Arch::Qwen2, GgmlType::Q8_0),
        (Arch::Qwen3, GgmlType::Q4_0),
        (Arch::Llama, GgmlType::F16),
    ];
    kinds
        .iter()
        .enumerate()
        .map(|(i, &(arch, t))| {
            let c = tiny_config(arch);
            write_gguf(&c, &random_weights(&c, i as u64), t)
        })
        .collect()
}

/// The header of each real GGUF file in the model cache (tensor data left out).
fn real_gguf_headers() -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    for f in [
        "SmolLM2-135M-Instruct.Q4_1.gguf",
        "Qwen2.5-Coder-0.5B-Instruct.gguf",
    ] {
        let Some(path) = dflash_core::testutil::cached_model(f) else {
            continue;
        };
        let Ok(bytes) = std::fs::read(&path) else {
            continue;
        };
        if let Ok(h) = parse_header(&bytes, bytes.len() as u64) {
            out.push(bytes[..h.data_offset as usize].to_vec());
        }
    }
    out
}

const GGUF_WORDS: &[&str] = &["GGUF", "\u{0}\u{0}\u{0}\u{0}", "general.architecture"];

fn gguf_header() -> Target {
    let mut seeds: Vec<Input> = tiny_ggufs()
        .into_iter()
        .map(|b| one("model.gguf", b))
        .collect();
    seeds.extend(
        real_gguf_headers()
            .into_iter()
            .map(|b| one("model.gguf", b)),
    );
    Target {
        name: "gguf-header",
        seeds,
        dictionary: GGUF_WORDS,
        run: Box::new(|i| {
            let b = &i.parts[0].bytes;
            Verdict::of(&parse_header(b, b.len() as u64).map(|h| check_header(&h)))
        }),
    }
}

/// Uses every part of a parsed header the loaders use.
fn check_header(h: &GgufHeader) -> u64 {
    h.tensors
        .iter()
        .map(|t| t.shape().len() as u64 + t.n_elements())
        .fold(0, u64::wrapping_add)
}

/// The in-memory loader against the streaming one fed in chunks of random sizes: both
/// must accept the same files; a model that loads runs two tokens.
fn gguf_load() -> Target {
    Target {
        name: "gguf-load",
        seeds: tiny_ggufs()
            .into_iter()
            .map(|b| one("model.gguf", b))
            .collect(),
        dictionary: GGUF_WORDS,
        run: Box::new(|i| {
            let b = &i.parts[0].bytes;
            let whole = load_gguf(b);
            let streamed = stream(b, b.len() as u64 ^ 0x5eed);
            let mut v = Verdict::of(&whole);
            if whole.is_ok() != streamed.is_ok() {
                v.finding = Some(format!(
                    "load_gguf {} but the stream {}",
                    outcome(&whole),
                    outcome(&streamed)
                ));
            }
            if let Ok(m) = whole {
                v = Verdict::of(&two_tokens(&m)).or(v);
            }
            v
        }),
    }
}

impl Verdict {
    fn or(self, earlier: Verdict) -> Verdict {
        Verdict {
            key: format!("{} / {}", earlier.key, self.key),
            finding: earlier.finding.or(self.finding),
        }
    }
}

fn outcome<T>(r: &dflash_core::Result<T>) -> String {
    match r {
        Ok(_) => "loads".into(),
        Err(e) => format!("fails ({e})"),
    }
}

fn stream(bytes: &[u8], seed: u64) -> dflash_core::Result<()> {
    let mut rng = crate::mutate::Rng::new(seed);
    let mut s = WeightStream::new(HostSink, bytes.len() as u64);
    let mut at = 0;
    while at < bytes.len() {
        let n = (1 + rng.below(4096)).min(bytes.len() - at);
        s.push(&bytes[at..at + n])?;
        at += n;
    }
    s.finish().map(|_| ())
}

fn two_tokens(m: &LoadedModel) -> dflash_core::Result<()> {
    let model = CpuModel::new(&m.weights);
    let mut cache = model.new_cache(8);
    model.forward(&[0, 1], &mut cache, LogitRows::Last, &[])?;
    Ok(())
}

const JSON_WORDS: &[&str] = &[
    "null",
    "true",
    "false",
    "-1",
    "0",
    "1e400",
    "-0",
    "1.5",
    "\"\"",
    "[]",
    "{}",
    "\"a\"",
    ",",
    ":",
    "\"\\u0000\"",
    "4294967296",
    "18446744073709551616",
    "NaN",
];

fn hf_folder() -> Target {
    let c = tiny_config(Arch::Qwen3);
    let w = random_weights(&c, 3);
    let seeds = [1, 2]
        .iter()
        .map(|&shards| {
            let files = write_hf(&c, &w, safetensors::Dtype::F16, shards);
            Input {
                parts: files
                    .into_iter()
                    .map(|(name, bytes)| Part { name, bytes })
                    .collect(),
            }
        })
        .collect();
    Target {
        name: "hf-folder",
        seeds,
        dictionary: JSON_WORDS,
        run: Box::new(|i| {
            let files: HfFiles = i
                .parts
                .iter()
                .map(|p| (p.name.clone(), &p.bytes[..]))
                .collect();
            Verdict::of(&load_hf(&files))
        }),
    }
}

/// The z-lab-format drafters of the conformance fixtures and the repository's own.
fn drafter() -> Target {
    let mut seeds = Vec::new();
    let dirs = std::fs::read_dir(repo().join("fixtures/zlab"))
        .into_iter()
        .flatten();
    for d in dirs.flatten() {
        let dir = d.path().join("drafter");
        let (Ok(config), Ok(weights)) = (
            std::fs::read(dir.join("config.json")),
            std::fs::read(dir.join("model.safetensors")),
        ) else {
            continue;
        };
        seeds.push(Input {
            parts: vec![
                Part {
                    name: "config.json".into(),
                    bytes: config,
                },
                Part {
                    name: "model.safetensors".into(),
                    bytes: weights,
                },
            ],
        });
    }
    Target {
        name: "drafter",
        seeds,
        dictionary: JSON_WORDS,
        run: Box::new(|i| {
            let config = String::from_utf8_lossy(&i.parts[0].bytes);
            let files = vec![("model.safetensors", &i.parts[1].bytes[..])];
            Verdict::of(&DrafterWeights::load(&config, files, DrafterPrecision::Q8))
        }),
    }
}

/// The tokenizer built from GGUF metadata, then a round trip of mixed text.
fn tokenizer() -> Target {
    let mut seeds: Vec<Input> = real_gguf_headers()
        .into_iter()
        .map(|b| one("header", b))
        .collect();
    seeds.extend(tiny_ggufs().into_iter().take(2).map(|b| one("header", b)));
    Target {
        name: "tokenizer",
        seeds,
        dictionary: GGUF_WORDS,
        run: Box::new(|i| {
            let r = parse_header(&i.parts[0].bytes, 1 << 40).and_then(|h| {
                let t = TextTokenizer::from_gguf(&h)?;
                let ids = t.encode("Hello, wörld! 12 + 3\n\tdef f(x): return x", true)?;
                t.decode(&ids, false)
            });
            Verdict::of(&r)
        }),
    }
}

const JINJA_WORDS: &[&str] = &[
    "{%",
    "%}",
    "{{",
    "}}",
    "{% for m in messages %}",
    "{% endfor %}",
    "{% if ",
    "{% endif %}",
    "range(",
    "loop.index",
    "messages",
    "raise_exception(",
    "| join",
    "* 99999",
    "~",
    "[::-1]",
    "namespace(",
    "{% set x = ",
    "{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}",
    "|tojson",
];

fn chat_template() -> Target {
    let mut seeds = vec![one("template", CHATML_TEMPLATE.as_bytes().to_vec())];
    for h in real_gguf_headers() {
        if let Ok(h) = parse_header(&h, 1 << 40) {
            if let Some(t) = h.get_str("tokenizer.chat_template") {
                seeds.push(one("template", t.as_bytes().to_vec()));
            }
        }
    }
    let messages = vec![
        Message::new("system", "Be brief."),
        Message::new("user", "hi"),
        Message::new("assistant", "hello"),
        Message::new("user", "again"),
    ];
    Target {
        name: "chat-template",
        seeds,
        dictionary: JINJA_WORDS,
        run: Box::new(move |i| {
            let text = String::from_utf8_lossy(&i.parts[0].bytes);
            let r = ChatTemplate::new(&text, "<s>", "</s>").and_then(|t| t.render(&messages, true));
            ok_by_size(r.map(|s| s.len()))
        }),
    }
}

/// The web API's request: parsed, checked and turned into the engine's request against
/// the tiny model's tokenizer and template.
fn request() -> Target {
    let c = tiny_config(Arch::Qwen2);
    let m = load_gguf(&write_gguf(&c, &random_weights(&c, 1), GgmlType::Q8_0)).expect("tiny model");
    let seeds = [
        r#"{"messages":[{"role":"user","content":"hi"}]}"#,
        r#"{"messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"hi"}],"max_tokens":7,"temperature":0.8,"top_p":0.9,"top_k":5,"min_p":0.1,"seed":3,"stop":["a","b"],"stream":true,"model":"x"}"#,
        r#"{"messages":[{"role":"user","content":"x"}],"dflash":true,"block":"auto","rejection_sampling":true,"sampled_drafts":true,"stop":"\n"}"#,
        r#"{"messages":[{"role":"user","content":"x"}],"block":4,"max_completion_tokens":2}"#,
    ]
    .iter()
    .map(|s| one("request.json", s.as_bytes().to_vec()))
    .collect();
    Target {
        name: "request",
        seeds,
        dictionary: JSON_WORDS,
        run: Box::new(move |i| {
            let r = serde_json::from_slice::<serde_json::Value>(&i.parts[0].bytes)
                .map_err(|e| dflash_core::Error::BadRequest(e.to_string()))
                .and_then(ChatRequest::from_json)
                .and_then(|r| r.to_generate(&m.tokenizer, m.chat_template.as_ref(), 64, 0));
            ok_by_size(r.map(|g| g.prompt_ids.len()))
        }),
    }
}

/// A request's grammar: `KIND:TEXT` with KIND `schema` (strict), `lenient` (a schema
/// not strict), `regex` or `lark` (else any JSON object), compiled over the tiny model's
/// tokens, then walked for up to 16 tokens (the first each mask allows).
fn grammar() -> Target {
    use dflash_core::grammar::{GrammarSpec, Grammars};
    let c = tiny_config(Arch::Qwen2);
    let m = load_gguf(&write_gguf(&c, &random_weights(&c, 1), GgmlType::Q8_0)).expect("tiny model");
    let grammars = Grammars::new(&m.tokenizer, c.vocab_size).expect("a grammar compiler");
    let seeds = dflash_core::testutil::grammar_specs()
        .into_iter()
        .map(|g| match g {
            GrammarSpec::JsonSchema { schema, .. } => format!("schema:{schema}"),
            GrammarSpec::Regex(r) => format!("regex:{r}"),
            GrammarSpec::Lark(l) => format!("lark:{l}"),
            GrammarSpec::JsonObject => "json_object:".into(),
        })
        .map(|s| one("grammar", s.into_bytes()))
        .collect();
    Target {
        name: "grammar",
        seeds,
        dictionary: GRAMMAR_WORDS,
        run: Box::new(move |i| {
            let text = String::from_utf8_lossy(&i.parts[0].bytes);
            let (kind, body) = text.split_once(':').unwrap_or(("", &text));
            let spec = match kind {
                "schema" | "lenient" => match serde_json::from_str(body) {
                    Ok(schema) => GrammarSpec::JsonSchema {
                        schema,
                        strict: kind == "schema",
                    },
                    Err(_) => {
                        return Verdict {
                            key: "not JSON".into(),
                            finding: None,
                        }
                    }
                },
                "regex" => GrammarSpec::Regex(body.into()),
                "lark" => GrammarSpec::Lark(body.into()),
                _ => GrammarSpec::JsonObject,
            };
            let walked = grammars.compile(&spec).and_then(|mut g| {
                let mut n = 0;
                while n < 16 && !g.is_finished() {
                    let mask = g.mask()?;
                    let Some(t) = (0..c.vocab_size as u32).find(|&t| mask.allows(t)) else {
                        break;
                    };
                    g.commit(t)?;
                    n += 1;
                }
                Ok(n)
            });
            ok_by_size(walked)
        }),
    }
}

const GRAMMAR_WORDS: &[&str] = &[
    "schema:",
    "lenient:",
    "regex:",
    "lark:",
    "{\"type\":\"object\"}",
    "\"properties\"",
    "\"$ref\":\"#\"",
    "\"anyOf\"",
    "\"pattern\"",
    "\"minItems\": 99999",
    "(a|b)*",
    "[^x]{0,99999}",
    "start: ",
    "%json",
    "%ignore",
    "<[",
    "/x/",
];

/// A model's text parsed for tool calls as it streams (Hermes `<tool_call>` and
/// Llama 3's bare JSON), in pieces of 5 characters.
fn tool_calls() -> Target {
    use dflash_core::tools::{ToolFormat, ToolStream};
    let seeds = [
        "Let me check.<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
        "<tool_call>{\"name\": \"a\", \"arguments\": {}}</tool_call><tool_call>{\"name\": \"b\", \"arguments\": {\"x\": [1, 2]}}</tool_call>",
        "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}",
        "plain text, no call",
    ]
    .iter()
    .map(|s| one("text", s.as_bytes().to_vec()))
    .collect();
    Target {
        name: "tool-calls",
        seeds,
        dictionary: JSON_WORDS,
        run: Box::new(|i| {
            let text = String::from_utf8_lossy(&i.parts[0].bytes);
            let chars: Vec<char> = text.chars().collect();
            let mut calls = 0;
            for format in [ToolFormat::Hermes, ToolFormat::Llama3Json] {
                let mut s = ToolStream::new(format, "call");
                for piece in chars.chunks(5) {
                    calls += s.push(&piece.iter().collect::<String>()).1.len();
                }
                calls += s.finish().1.len();
            }
            ok_by_size(Ok::<_, dflash_core::Error>(calls))
        }),
    }
}
