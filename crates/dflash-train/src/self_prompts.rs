//! Prompts the target writes itself (`data --mix self`, the "Magpie" recipe of Xu et al.,
//! 2024): the chat template rendered up to where a user's message begins, then sampled
//! until the turn ends. An instruct model fills that slot with the kind of request it
//! was tuned on, so the data covers what its users ask far more widely than templates
//! do, from nothing but the model's own files (no corpus, no evaluation set).

use crate::data::{distill, existing_ids, read_samples, Answerer, DataOptions};
use crate::prompts::{Mix, Prompt};
use crate::TrainError;
use dflash_core::chat::Message;
use dflash_core::cpu::{CpuModel, LogitRows};
use dflash_core::model_files::LoadedModel;
use dflash_core::sampling::{sample, SamplingParams};
use std::collections::HashSet;
use std::path::Path;

/// What the target is asked to write: any request, one a programmer would make, or a
/// Python function to complete.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Topic {
    /// The user turn after the template's own system prompt (`--mix self`).
    Any,
    /// The user turn after a system prompt that says the users ask about Python
    /// (`--mix self-code`): coding requests in the model's own words.
    Code,
    /// After the coding system prompt, the user turn begun with a request to complete a
    /// Python function and the function's first word (`--mix self-stub`): the target
    /// writes the signature and docstring itself.
    Stub,
    /// The user turn after a system prompt that names one kind of chat request of
    /// `CHAT_SYSTEMS` (writing, role-play, reasoning, math, extraction, science,
    /// humanities), prompt `i` after kind `i % 7` (`--mix self-chat`): the requests of a
    /// general assistant's users, spread over those kinds in the model's own words.
    Chat,
}

impl Topic {
    /// The mix's name: the prefix of its prompt ids and their `source`.
    pub fn name(self) -> &'static str {
        match self {
            Topic::Any => "self",
            Topic::Code => "self-code",
            Topic::Stub => "self-stub",
            Topic::Chat => "self-chat",
        }
    }

    /// The system messages prompt indices take in turn (none: the template's default).
    pub fn systems(self) -> &'static [&'static str] {
        match self {
            Topic::Any => &[],
            Topic::Code | Topic::Stub => &[CODE_SYSTEM],
            Topic::Chat => &CHAT_SYSTEMS,
        }
    }

    /// The system message prompt `index` is drawn after (None: the template's default).
    fn system(self, index: u64) -> Option<&'static str> {
        let systems = self.systems();
        (!systems.is_empty()).then(|| systems[(index % systems.len() as u64) as usize])
    }

    /// Tokens a drawn query may have before it is dropped: a function's signature and
    /// docstring take more than a request in words.
    pub fn query_tokens(self) -> usize {
        match self {
            Topic::Any | Topic::Code | Topic::Chat => 96,
            Topic::Stub => 192,
        }
    }

    /// The start of the user's message, written before the target continues it.
    fn lead(self) -> &'static str {
        match self {
            Topic::Any | Topic::Code | Topic::Chat => "",
            Topic::Stub => STUB_LEAD,
        }
    }
}

/// Steers the drawn user turns to programming; the answers are written without it.
const CODE_SYSTEM: &str = "You are a helpful AI assistant for Python programmers. \
Users ask you to write Python functions and classes from a description, to complete, \
fix, test or explain their code, and to solve programming exercises.";

/// Steer the drawn user turns of `Topic::Chat` to one kind of request each (the kinds a
/// general assistant is asked for; no evaluation set's text); the answers are written
/// without them.
const CHAT_SYSTEMS: [&str; 7] = [
    "You are a helpful AI assistant for writers. Users ask you to write or edit essays, \
emails, stories, poems, blog posts, speeches and letters.",
    "You are a helpful AI assistant that plays characters. Users ask you to imagine you \
are someone, a famous person, a professional or a fictional character, and to answer as \
they would.",
    "You are a helpful AI assistant for careful thinking. Users ask you logic puzzles, \
riddles and questions that take step-by-step reasoning.",
    "You are a helpful AI assistant for mathematics. Users ask you to solve arithmetic, \
algebra, geometry and probability problems and to explain the steps.",
    "You are a helpful AI assistant for working with documents. Users give you a text, \
such as a review, a report, a table or an article, and ask you to extract, summarize or \
reformat information from it.",
    "You are a helpful AI assistant for science and technology. Users ask you questions \
about physics, chemistry, biology, medicine, engineering and computers.",
    "You are a helpful AI assistant for the humanities. Users ask you about history, \
economics, philosophy, law, art, literature and society.",
];

/// The user turn of `Topic::Stub` up to the function's name: a request to complete a
/// function, its code block opened.
const STUB_LEAD: &str = "Complete the following Python function:\n```python\ndef";

/// How the target's queries are drawn and which are kept.
#[derive(Debug, Clone)]
pub struct QueryOptions {
    pub topic: Topic,
    /// Prompt indices: `{topic}:0 .. {topic}:prompts-1`.
    pub prompts: u64,
    pub seed: u64,
    /// Sampling temperature and nucleus of the draws.
    pub temperature: f32,
    pub top_p: f32,
    /// Tokens a query may have: one whose turn has not ended by then is dropped.
    pub max_tokens: usize,
    /// Characters a kept query has at least, once trimmed.
    pub min_chars: usize,
    /// Draws per prompt index (each its own seed) before the index is given up.
    pub attempts: u32,
}

impl Default for QueryOptions {
    fn default() -> Self {
        QueryOptions {
            topic: Topic::Any,
            prompts: 1000,
            seed: 1,
            temperature: 1.0,
            top_p: 0.95,
            max_tokens: Topic::Any.query_tokens(),
            min_chars: 12,
            attempts: 4,
        }
    }
}

/// Prompts written per chunk: an interruption loses at most one chunk's work.
const CHUNK: usize = 16;
/// A user message no template escapes or drops, to find where the message begins.
const MARK: &str = "\u{E000}dflash-query\u{E000}";

/// The id of prompt `index` of a self-written mix.
pub fn prompt_id(topic: Topic, index: u64) -> String {
    format!("{}:{index}", topic.name())
}

/// The template's text of a chat (`system`'s message if any, then a user's) before and
/// after the user's message, with or without the generation prompt.
fn around_user_message(
    model: &LoadedModel,
    system: Option<&str>,
    generation_prompt: bool,
) -> Result<(String, String), TrainError> {
    let tpl = model
        .chat_template
        .as_ref()
        .ok_or_else(|| TrainError::Data("the model has no chat template".into()))?;
    let mut chat: Vec<Message> = system
        .map(|s| Message::new("system", s))
        .into_iter()
        .collect();
    chat.push(Message::new("user", MARK));
    let text = tpl.render(&chat, generation_prompt)?;
    let (before, after) = text.split_once(MARK).ok_or_else(|| {
        TrainError::Data("the chat template does not write the user's message".into())
    })?;
    Ok((before.to_string(), after.to_string()))
}

/// Token ids of the chat of prompt `index` up to where the user's message begins: the
/// template with one user message, cut before it (the default system prompt of a
/// template that adds one is kept, as in every chat the model answers; the topic's own
/// system message for `index` replaces it), then the topic's lead.
pub fn query_prefix(model: &LoadedModel, topic: Topic, index: u64) -> Result<Vec<u32>, TrainError> {
    let (before, _) = around_user_message(model, topic.system(index), false)?;
    Ok(model.tokenizer.encode(&(before + topic.lead()), true)?)
}

/// The queries of `topic` already answered in `out`, read back from their prompts (the
/// plain chat of each query: the text between the template's prefix and what it writes
/// after a user's message), so that a resumed run keeps its new queries distinct.
pub fn written_queries(
    model: &LoadedModel,
    topic: Topic,
    out: &Path,
) -> Result<HashSet<String>, TrainError> {
    let mut seen = HashSet::new();
    if !out.exists() {
        return Ok(seen);
    }
    let plain = query_prefix(model, Topic::Any, 0)?;
    let (_, after_message) = around_user_message(model, None, true)?;
    let own = format!("{}:", topic.name());
    for sample in read_samples(out)? {
        if !sample.id.starts_with(&own) {
            continue;
        }
        let Some(rest) = sample.prompt_ids.strip_prefix(plain.as_slice()) else {
            continue;
        };
        let text = model.tokenizer.decode(rest, false)?;
        if let Some(query) = text.strip_suffix(after_message.as_str()) {
            seen.insert(query.trim().to_string());
        }
    }
    Ok(seen)
}

/// The sampling of draw `attempt` of prompt `index`: a seed of its own for each.
fn draw_params(opts: &QueryOptions, index: u64, attempt: u32) -> SamplingParams {
    SamplingParams {
        temperature: opts.temperature,
        top_p: opts.top_p,
        seed: (opts.seed << 40) ^ (index << 8) ^ attempt as u64,
        ..SamplingParams::default()
    }
}

/// Tokens sampled after `prefix` until (and with) the first stop token, or `max`.
fn sample_turn(
    cpu: &CpuModel,
    prefix: &[u32],
    params: &SamplingParams,
    max: usize,
    is_stop: &dyn Fn(u32) -> bool,
) -> Result<Vec<u32>, TrainError> {
    let vocab = cpu.config.vocab_size;
    let mut cache = cpu.new_cache(prefix.len() + max);
    let mut history = prefix.to_vec();
    let mut logits = cpu
        .forward(prefix, &mut cache, LogitRows::Last, &[])?
        .logits;
    while history.len() < prefix.len() + max {
        let t = sample(
            &logits[logits.len() - vocab..],
            params,
            &history,
            history.len(),
        );
        history.push(t);
        if is_stop(t) {
            break;
        }
        logits = cpu.forward(&[t], &mut cache, LogitRows::Last, &[])?.logits;
    }
    Ok(history.split_off(prefix.len()))
}

/// The query of prompt `index`: the topic's lead and the first of `opts.attempts` draws
/// that ends its turn within `max_tokens`, holds no special token (chat markup), has
/// `min_chars` characters once trimmed and is not in `seen`; `None` when none does.
pub fn write_query(
    model: &LoadedModel,
    cpu: &CpuModel,
    prefix: &[u32],
    index: u64,
    opts: &QueryOptions,
    seen: &HashSet<String>,
) -> Result<Option<String>, TrainError> {
    let is_stop = |t: u32| model.tokenizer.is_stop(t);
    for attempt in 0..opts.attempts {
        let params = draw_params(opts, index, attempt);
        let turn = sample_turn(cpu, prefix, &params, opts.max_tokens, &is_stop)?;
        let Some((_, body)) = turn.split_last().filter(|(&last, _)| is_stop(last)) else {
            continue;
        };
        let text = model.tokenizer.decode(body, false)?;
        if text != model.tokenizer.decode(body, true)? {
            continue;
        }
        let text = format!("{}{text}", opts.topic.lead());
        let text = text.trim();
        if text.chars().count() >= opts.min_chars && !seen.contains(text) {
            return Ok(Some(text.to_string()));
        }
    }
    Ok(None)
}

/// `data --mix self` / `self-code` / `self-stub` / `self-chat`: prompts `{topic}:0 .. {topic}:{queries.prompts - 1}`,
/// each written by the target (`write_query`, on the quantized CPU engine) and answered
/// by `answerer`, appended to `out` a chunk at a time. Indices already in `out` are
/// skipped (a resumed run draws the same queries for the rest, kept distinct from those
/// already written); an index whose every draw was dropped is left out.
/// Returns the samples written.
pub fn distill_self_written(
    model: &LoadedModel,
    cpu: &CpuModel,
    answerer: &dyn Answerer,
    out: &Path,
    opts: &DataOptions,
    queries: &QueryOptions,
    progress: &indicatif::ProgressBar,
) -> Result<usize, TrainError> {
    let n = queries.prompts;
    let done = existing_ids(out)?;
    let topic = queries.topic;
    // One prefix per system message the indices take in turn.
    let prefixes = (0..topic.systems().len().max(1) as u64)
        .map(|i| query_prefix(model, topic, i))
        .collect::<Result<Vec<_>, _>>()?;
    let todo: Vec<u64> = (0..n)
        .filter(|&i| !done.contains(&prompt_id(topic, i)))
        .collect();
    progress.set_length(n);
    progress.set_position(n - todo.len() as u64);
    let mut seen = written_queries(model, topic, out)?;
    let mut written = 0;
    for chunk in todo.chunks(CHUNK) {
        let mut prompts = Vec::new();
        for &i in chunk {
            let prefix = &prefixes[(i % prefixes.len() as u64) as usize];
            if let Some(text) = write_query(model, cpu, prefix, i, queries, &seen)? {
                seen.insert(text.clone());
                prompts.push(Prompt {
                    id: prompt_id(topic, i),
                    source: topic.name(),
                    text,
                });
            }
        }
        let hidden = indicatif::ProgressBar::hidden();
        written += distill(model, answerer, &prompts, out, opts, &hidden)?;
        progress.inc(chunk.len() as u64);
    }
    Ok(written)
}

impl Mix {
    /// The topic of a mix whose prompts the target writes; None for a built mix.
    pub fn self_written(self) -> Option<Topic> {
        match self {
            Mix::SelfWritten => Some(Topic::Any),
            Mix::SelfCode => Some(Topic::Code),
            Mix::SelfStub => Some(Topic::Stub),
            Mix::SelfChat => Some(Topic::Chat),
            Mix::Code | Mix::General => None,
        }
    }
}
