//! The generation loop of the CPU reference engine: prefill, sample, stop on stop ids,
//! stop strings or the token budget, and stream text as it becomes whole characters.

use crate::cpu::{CpuModel, LogitRows};
use crate::error::{Error, Result};
use crate::sampling::{sample, SamplingParams};
use crate::tokenizer::{StreamDecoder, TextTokenizer};

#[derive(Debug, Clone)]
pub struct GenerateRequest {
    pub prompt_ids: Vec<u32>,
    pub max_new_tokens: usize,
    pub sampling: SamplingParams,
    pub stop_strings: Vec<String>,
    /// Context length to run with (KV capacity); clipped to the model's maximum.
    pub context: usize,
    /// Set from elsewhere to end generation early.
    pub interrupt: Interrupt,
}

/// A request's interrupt switch: whoever holds a clone (the browser worker's message
/// handler, a caller's other task) sets it, and generation ends before the next token is
/// taken, with `FinishReason::Interrupted`. Clones share the switch.
#[derive(Debug, Clone, Default)]
pub struct Interrupt(std::sync::Arc<std::sync::atomic::AtomicBool>);

impl Interrupt {
    pub fn set(&self) {
        self.0.store(true, std::sync::atomic::Ordering::Relaxed);
    }
    pub fn clear(&self) {
        self.0.store(false, std::sync::atomic::Ordering::Relaxed);
    }
    pub fn is_set(&self) -> bool {
        self.0.load(std::sync::atomic::Ordering::Relaxed)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FinishReason {
    /// A stop id or stop string ended the text.
    Stop,
    /// `max_new_tokens` or the context ran out.
    Length,
    /// The request's `Interrupt` was set.
    Interrupted,
}

impl FinishReason {
    /// The OpenAI-style name (`abort` for an interrupted request, as WebLLM says).
    pub fn name(&self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::Interrupted => "abort",
        }
    }
}

#[derive(Debug, Clone)]
pub struct GenerateResult {
    pub tokens: Vec<u32>,
    pub text: String,
    pub prompt_tokens: usize,
    pub finish_reason: FinishReason,
    pub prefill_s: f64,
    pub decode_s: f64,
}

/// Holds back streamed text that might be the start of a stop string.
#[derive(Debug, Default)]
pub struct StopMatcher {
    stops: Vec<String>,
    text: String,
    emitted: usize,
}

impl StopMatcher {
    pub fn new(stops: &[String]) -> Self {
        StopMatcher {
            stops: stops.iter().filter(|s| !s.is_empty()).cloned().collect(),
            ..Default::default()
        }
    }
    /// Adds text; returns (text safe to emit, whether a stop string was found).
    pub fn push(&mut self, piece: &str) -> (String, bool) {
        self.text.push_str(piece);
        if let Some(cut) = self
            .stops
            .iter()
            .filter_map(|s| self.text.find(s.as_str()))
            .min()
        {
            let out = self.text[self.emitted.min(cut)..cut].to_string();
            self.text.truncate(cut);
            self.emitted = cut;
            return (out, true);
        }
        // Longest suffix of the text that is a proper prefix of a stop string.
        let mut hold = 0;
        for s in &self.stops {
            for (i, _) in s.char_indices().skip(1) {
                if self.text.ends_with(&s[..i]) {
                    hold = hold.max(i);
                }
            }
        }
        let safe = self.text.len() - hold;
        let safe = if safe < self.emitted {
            self.emitted
        } else {
            safe
        };
        let out = self.text[self.emitted..safe].to_string();
        self.emitted = safe;
        (out, false)
    }
    /// Text held back at the end of generation.
    pub fn flush(&mut self) -> String {
        let out = self.text[self.emitted..].to_string();
        self.emitted = self.text.len();
        out
    }
    pub fn text(&self) -> &str {
        &self.text
    }
}

/// Checks the prompt against the context and returns how many tokens may be generated.
pub fn token_budget(prompt_tokens: usize, max_new_tokens: usize, context: usize) -> Result<usize> {
    if prompt_tokens == 0 {
        return Err(Error::EmptyPrompt);
    }
    if prompt_tokens >= context {
        return Err(Error::ContextOverflow {
            prompt_tokens,
            max_new_tokens,
            context,
        });
    }
    Ok(max_new_tokens.min(context - prompt_tokens))
}

/// Checks a request against the model: sampling parameters, token ids, the context.
/// Returns (context, token budget).
pub fn prepare(req: &GenerateRequest, cfg: &crate::config::ModelConfig) -> Result<(usize, usize)> {
    req.sampling.validate()?;
    crate::check_limit!("context", req.context, MAX_CONTEXT_TOKENS);
    let context = req.context.min(cfg.max_position_embeddings).max(1);
    let budget = token_budget(req.prompt_ids.len(), req.max_new_tokens, context)?;
    if let Some(&bad) = req
        .prompt_ids
        .iter()
        .find(|&&t| t as usize >= cfg.vocab_size)
    {
        return Err(Error::TokenOutOfRange {
            id: bad,
            vocab: cfg.vocab_size,
        });
    }
    Ok((context, budget))
}

/// Where generated tokens go, whichever engine produced them: stop ids end the text
/// (the id is not kept), text streams out in whole characters, stop strings cut it, and
/// the token budget ends it.
pub struct TokenSink<'a> {
    tok: &'a TextTokenizer,
    on_text: &'a mut dyn FnMut(&str),
    budget: usize,
    pub tokens: Vec<u32>,
    stream: StreamDecoder,
    stops: StopMatcher,
    interrupt: Interrupt,
    pub finish: FinishReason,
}

impl<'a> TokenSink<'a> {
    /// The sink of `req`: its stop strings and interrupt switch, `budget` tokens.
    pub fn new(
        tok: &'a TextTokenizer,
        req: &GenerateRequest,
        budget: usize,
        on_text: &'a mut dyn FnMut(&str),
    ) -> Self {
        TokenSink {
            tok,
            on_text,
            budget,
            tokens: Vec::new(),
            stream: StreamDecoder::default(),
            stops: StopMatcher::new(&req.stop_strings),
            interrupt: req.interrupt.clone(),
            finish: FinishReason::Length,
        }
    }

    /// Tokens the budget still allows.
    pub fn remaining(&self) -> usize {
        self.budget.saturating_sub(self.tokens.len())
    }

    /// Takes the next token; true when generation is over.
    pub fn push(&mut self, t: u32) -> Result<bool> {
        if self.tokens.len() >= self.budget {
            return Ok(true);
        }
        if self.interrupt.is_set() {
            self.finish = FinishReason::Interrupted;
            return Ok(true);
        }
        if self.tok.is_stop(t) {
            self.finish = FinishReason::Stop;
            return Ok(true);
        }
        self.tokens.push(t);
        let (text, stopped) = self.stops.push(&self.stream.push(self.tok, t)?);
        if !text.is_empty() {
            (self.on_text)(&text);
        }
        if stopped {
            self.finish = FinishReason::Stop;
            return Ok(true);
        }
        Ok(self.tokens.len() >= self.budget)
    }

    /// Releases held-back text and builds the result.
    pub fn finish(mut self, prompt_tokens: usize, prefill_s: f64, decode_s: f64) -> GenerateResult {
        let rest = self.stops.flush();
        if !rest.is_empty() {
            (self.on_text)(&rest);
        }
        GenerateResult {
            text: self.stops.text().to_string(),
            tokens: self.tokens,
            prompt_tokens,
            finish_reason: self.finish,
            prefill_s,
            decode_s,
        }
    }
}

/// Generates with the CPU reference model. `clock` returns seconds (the host's clock:
/// wasm has no `Instant`); `on_text` receives text as it is produced.
pub fn generate_cpu(
    model: &CpuModel,
    tok: &TextTokenizer,
    req: &GenerateRequest,
    clock: &dyn Fn() -> f64,
    on_text: &mut dyn FnMut(&str),
) -> Result<GenerateResult> {
    let mut g = CpuGeneration::start(model, tok, req, clock, on_text)?;
    while !g.step()? {}
    Ok(g.finish(clock))
}

/// `generate_cpu` one token at a time, for hosts that must yield between tokens (the
/// browser worker, so that an interrupt can arrive while the CPU engine generates).
pub struct CpuGeneration<'a> {
    model: &'a CpuModel,
    req: &'a GenerateRequest,
    cache: crate::cpu::KvCache,
    logits: Vec<f32>,
    history: Vec<u32>,
    sink: TokenSink<'a>,
    /// Start and end of the prefill.
    times: (f64, f64),
}

impl<'a> CpuGeneration<'a> {
    /// Checks the request and runs the prefill.
    pub fn start(
        model: &'a CpuModel,
        tok: &'a TextTokenizer,
        req: &'a GenerateRequest,
        clock: &dyn Fn() -> f64,
        on_text: &'a mut dyn FnMut(&str),
    ) -> Result<Self> {
        let (context, budget) = prepare(req, &model.config)?;
        let mut cache = model.new_cache(context);
        let t0 = clock();
        let logits = model
            .forward(&req.prompt_ids, &mut cache, LogitRows::Last, &[])?
            .logits;
        Ok(CpuGeneration {
            model,
            req,
            cache,
            logits,
            history: req.prompt_ids.clone(),
            sink: TokenSink::new(tok, req, budget, on_text),
            times: (t0, clock()),
        })
    }

    /// Takes the next token (and runs the pass that scores the one after); true when
    /// generation is over.
    pub fn step(&mut self) -> Result<bool> {
        let next = sample(
            &self.logits,
            &self.req.sampling,
            &self.history,
            self.history.len(),
        );
        self.history.push(next);
        if self.sink.push(next)? {
            return Ok(true);
        }
        self.logits = self
            .model
            .forward(&[next], &mut self.cache, LogitRows::Last, &[])?
            .logits;
        Ok(false)
    }

    pub fn finish(self, clock: &dyn Fn() -> f64) -> GenerateResult {
        let (t0, t1) = self.times;
        self.sink
            .finish(self.req.prompt_ids.len(), t1 - t0, clock() - t1)
    }
}
