//! The generation loop of the CPU reference engine: prefill, sample, stop on stop ids,
//! stop strings or the token budget, and stream text as it becomes whole characters.
//!
//! # Ending a request early
//!
//! Every engine's loop feeds its tokens to the one `generate::TokenSink`, which checks
//! the request's `Interrupt` switch (shared by clones) before it takes a token and then
//! ends generation with `FinishReason::Interrupted` (`"abort"` in the API). In the
//! browser the worker handles an `interrupt` message outside its request queue and sets
//! the running request's switch; the GPU engine yields to the worker at every step's map
//! and the CPU engine between tokens of plain decoding (`generate::CpuGeneration`) and
//! between DFlash steps (`speculative::SpeculativeGeneration`): the engine calls its
//! `Host::pause` (`crates/dflash-engine/src/engine.rs`), which the worker's host
//! implements as a `MessageChannel` yield in `dflash_web::wasm`, so a request stops
//! within one step. The package's `create(request, { signal })` rejects with `Aborted`
//! and sends the interrupt for that request (dropped from the queue if it has not
//! started). `dflash serve` sets a job's `Interrupt` when its client leaves
//! (`crates/dflash-cli/src/serve.rs`).

use crate::cpu::{CpuModel, LogitRows};
use crate::error::{Error, Result};
use crate::grammar::{Constraint, TokenMask, TokenSpeller};
use crate::sampling::{sample_masked, token_logprob, SamplingParams, TokenLogprob};
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
    /// The grammar the output keeps to, in its start state (`crate::grammar`).
    pub grammar: Option<Constraint>,
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
    /// Leading prompt tokens whose keys and values were kept from the previous request
    /// (multi-turn KV reuse) and not computed again.
    pub cached_tokens: usize,
    pub finish_reason: FinishReason,
    pub prefill_s: f64,
    pub decode_s: f64,
    /// With `SamplingParams::logprobs`: one per token of `tokens`.
    pub logprobs: Vec<SpelledLogprob>,
}

/// A generated token's log-probability as answers report it (`sampling::token_logprob`
/// with each token's bytes and text; `top` empty in the alternatives themselves).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct SpelledLogprob {
    pub token: u32,
    /// The token's text (its bytes read as UTF-8, lossily for part of a character).
    pub text: String,
    pub bytes: Vec<u8>,
    pub logprob: f32,
    pub top: Vec<SpelledLogprob>,
}

impl SpelledLogprob {
    fn new(speller: &TokenSpeller<'_>, lp: &TokenLogprob) -> Result<Self> {
        let spell = |token: u32, logprob: f32, top| -> Result<SpelledLogprob> {
            let (bytes, _) = speller.spell(token)?;
            Ok(SpelledLogprob {
                token,
                text: String::from_utf8_lossy(&bytes).into_owned(),
                bytes,
                logprob,
                top,
            })
        };
        let top = lp
            .top
            .iter()
            .map(|&(t, l)| spell(t, l, Vec::new()))
            .collect::<Result<_>>()?;
        spell(lp.token, lp.logprob, top)
    }
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

/// A piece of generated text as it streams out, with the tokens it came from.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Piece<'a> {
    /// Whole characters, never cut inside one.
    pub text: &'a str,
    /// The tokens committed since the previous piece, in order: every generated token
    /// is in exactly one piece. A piece can come from several tokens (a character split
    /// across tokens, text a stop string held back), or from none (held-back text
    /// released at the end, after its tokens went out); the last piece takes the tokens
    /// not sent yet, even if their text is empty (cut by a stop string, or bytes that
    /// never completed a character).
    pub ids: &'a [u32],
    /// Whether the last of `ids` was an accepted draft (false for plain decoding, for a
    /// speculative step's anchor and bonus tokens, and without ids): what the demo
    /// highlights.
    pub drafted: bool,
    /// With `SamplingParams::logprobs`: one per id of `ids` (else empty).
    pub logprobs: &'a [SpelledLogprob],
    /// Tool calls completed with this piece (the engine parses them out of the text,
    /// which then holds only the content: `crate::tools::ToolStream`).
    pub tool_calls: &'a [crate::tools::ToolCall],
}

/// The callback that receives a generation's pieces.
pub type OnPiece<'a> = dyn FnMut(Piece<'_>) + 'a;

/// Where generated tokens go, whichever engine produced them: stop ids end the text
/// (the id is not kept), text streams out in whole characters with its token ids, stop
/// strings cut it, and the token budget ends it.
pub struct TokenSink<'a> {
    tok: &'a TextTokenizer,
    on_piece: &'a mut OnPiece<'a>,
    budget: usize,
    pub tokens: Vec<u32>,
    /// How many of `tokens` went out in pieces.
    sent: usize,
    drafted: bool,
    stream: StreamDecoder,
    stops: StopMatcher,
    interrupt: Interrupt,
    pub finish: FinishReason,
    /// Spells the tokens' log-probabilities, where the request asks for them.
    speller: Option<TokenSpeller<'a>>,
    pub logprobs: Vec<SpelledLogprob>,
}

impl<'a> TokenSink<'a> {
    /// The sink of `req`: its stop strings and interrupt switch, `budget` tokens.
    pub fn new(
        tok: &'a TextTokenizer,
        req: &GenerateRequest,
        budget: usize,
        on_piece: &'a mut OnPiece<'a>,
    ) -> Self {
        TokenSink {
            tok,
            on_piece,
            budget,
            tokens: Vec::new(),
            sent: 0,
            drafted: false,
            stream: StreamDecoder::default(),
            stops: StopMatcher::new(&req.stop_strings),
            interrupt: req.interrupt.clone(),
            finish: FinishReason::Length,
            speller: None,
            logprobs: Vec::new(),
        }
    }

    /// Tokens the budget still allows.
    pub fn remaining(&self) -> usize {
        self.budget.saturating_sub(self.tokens.len())
    }

    /// Takes the next token (not an accepted draft); true when generation is over.
    pub fn push(&mut self, t: u32) -> Result<bool> {
        self.push_token(t, false)
    }

    /// Takes the next token, `drafted` if it was an accepted draft; true when
    /// generation is over.
    pub fn push_token(&mut self, t: u32, drafted: bool) -> Result<bool> {
        self.push_scored(t, drafted, None)
    }

    /// `push_token` with the token's log-probability (where the request asks for them).
    pub fn push_scored(
        &mut self,
        t: u32,
        drafted: bool,
        logprob: Option<&TokenLogprob>,
    ) -> Result<bool> {
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
        if let Some(lp) = logprob {
            let speller = match self.speller.take() {
                Some(s) => s,
                None => TokenSpeller::new(self.tok)?,
            };
            self.logprobs.push(SpelledLogprob::new(&speller, lp)?);
            self.speller = Some(speller);
        }
        self.tokens.push(t);
        self.drafted = drafted;
        let (text, stopped) = self.stops.push(&self.stream.push(self.tok, t)?);
        self.send(&text, false);
        if stopped {
            self.finish = FinishReason::Stop;
            return Ok(true);
        }
        Ok(self.tokens.len() >= self.budget)
    }

    /// Sends `text` with the tokens not yet sent: if there is text, or (the last piece)
    /// if `last` and tokens are left.
    fn send(&mut self, text: &str, last: bool) {
        if text.is_empty() && !(last && self.sent < self.tokens.len()) {
            return;
        }
        let ids = &self.tokens[self.sent..];
        let logprobs = self.logprobs.get(self.sent..).unwrap_or(&[]);
        (self.on_piece)(Piece {
            text,
            ids,
            drafted: self.drafted && !ids.is_empty(),
            logprobs,
            tool_calls: &[],
        });
        self.sent = self.tokens.len();
    }

    /// Releases held-back text and builds the result.
    pub fn finish(mut self, prompt_tokens: usize, prefill_s: f64, decode_s: f64) -> GenerateResult {
        let rest = self.stops.flush();
        self.send(&rest, true);
        GenerateResult {
            text: self.stops.text().to_string(),
            tokens: self.tokens,
            prompt_tokens,
            cached_tokens: 0,
            finish_reason: self.finish,
            prefill_s,
            decode_s,
            logprobs: self.logprobs,
        }
    }
}

/// How many leading positions of `prompt` a KV cache holding the rows of `cached` can
/// keep: their longest common prefix, less the prompt's last token (its pass gives the
/// logits of the first new token, so at least one row is always computed). Kept rows are
/// the same bits as recomputed ones, since every kernel is batch invariant.
pub fn reusable_prefix(cached: &[u32], prompt: &[u32]) -> usize {
    let common = cached
        .iter()
        .zip(prompt)
        .take_while(|(a, b)| a == b)
        .count();
    common.min(prompt.len().saturating_sub(1))
}

/// What the CPU engine keeps between the requests of a conversation: the target's KV
/// cache and the token id of each of its rows, and how many leading rows the drafter's
/// context (kept by the host, see `DFlashCpu::resume`) agrees with. A new prompt's
/// longest common prefix with the rows is kept; only the rest is prefilled.
#[derive(Clone, Default)]
pub struct CpuSession {
    cache: Option<crate::cpu::KvCache>,
    /// The token of each cached row that is known (at most `cache.len()` of them).
    ids: Vec<u32>,
    /// Leading rows whose drafter context matches the cache.
    pub(crate) drafted: usize,
}

impl CpuSession {
    /// Forgets every row (`resetChat`).
    pub fn reset(&mut self) {
        *self = CpuSession::default();
    }

    /// Rows kept from the last request.
    pub fn cached_tokens(&self) -> usize {
        self.ids.len()
    }

    /// Keeps the rows `prompt` can reuse (none unless the cache has `context` rows of
    /// room) and returns how many; `drafted_too` limits them to the rows the drafter's
    /// context also holds.
    pub(crate) fn keep_prefix(
        &mut self,
        model: &CpuModel,
        prompt: &[u32],
        context: usize,
        drafted_too: bool,
    ) -> usize {
        if self.cache.as_ref().map(|c| c.capacity()) != Some(context) {
            self.reset();
            self.cache = Some(model.new_cache(context));
        }
        let mut k = reusable_prefix(&self.ids, prompt);
        if drafted_too {
            k = k.min(self.drafted);
        }
        self.truncate(k);
        k
    }

    pub(crate) fn truncate(&mut self, len: usize) {
        if let Some(c) = &mut self.cache {
            c.truncate(len);
        }
        self.ids.truncate(len);
        self.drafted = self.drafted.min(len);
    }

    /// The target's pass over `tokens` at the next rows; their ids are recorded once it
    /// succeeds (a failed pass leaves rows without ids, which are never reused).
    pub(crate) fn forward(
        &mut self,
        model: &CpuModel,
        tokens: &[u32],
        rows: LogitRows,
        taps: &[usize],
    ) -> Result<crate::cpu::ForwardOutput> {
        let cache = self
            .cache
            .as_mut()
            .ok_or_else(|| Error::Internal("the session has no cache".into()))?;
        let at = cache.len();
        self.ids.truncate(at);
        let out = model.forward(tokens, cache, rows, taps)?;
        self.ids.extend_from_slice(tokens);
        Ok(out)
    }

    /// Cached rows.
    pub(crate) fn len(&self) -> usize {
        self.cache.as_ref().map_or(0, |c| c.len())
    }
}

/// The mask of the grammar's next position, if the request has a grammar.
pub fn next_mask(grammar: &mut Option<Constraint>) -> Result<Option<TokenMask>> {
    grammar.as_mut().map(Constraint::mask).transpose()
}

/// Commits a chosen token to the grammar, if the request has one.
pub fn commit_token(grammar: &mut Option<Constraint>, t: u32) -> Result<()> {
    match grammar {
        Some(g) => g.commit(t),
        None => Ok(()),
    }
}

/// Generates with the CPU reference model. `clock` returns seconds (the host's clock:
/// wasm has no `Instant`); `on_piece` receives text as it is produced.
pub fn generate_cpu(
    model: &CpuModel,
    tok: &TextTokenizer,
    req: &GenerateRequest,
    clock: &dyn Fn() -> f64,
    on_piece: &mut OnPiece<'_>,
) -> Result<GenerateResult> {
    let mut session = CpuSession::default();
    let mut g = CpuGeneration::start(&mut session, model, tok, req, clock, on_piece)?;
    while !g.step()? {}
    Ok(g.finish(clock))
}

/// `generate_cpu` one token at a time, for hosts that must yield between tokens (the
/// browser worker, so that an interrupt can arrive while the CPU engine generates), in a
/// session whose rows the prompt may reuse.
pub struct CpuGeneration<'a> {
    model: &'a CpuModel,
    req: &'a GenerateRequest,
    session: &'a mut CpuSession,
    logits: Vec<f32>,
    history: Vec<u32>,
    grammar: Option<Constraint>,
    sink: TokenSink<'a>,
    cached_tokens: usize,
    /// Start and end of the prefill.
    times: (f64, f64),
}

impl<'a> CpuGeneration<'a> {
    /// Checks the request and runs the prefill of the prompt past the rows `session`
    /// already holds.
    pub fn start(
        session: &'a mut CpuSession,
        model: &'a CpuModel,
        tok: &'a TextTokenizer,
        req: &'a GenerateRequest,
        clock: &dyn Fn() -> f64,
        on_piece: &'a mut OnPiece<'a>,
    ) -> Result<Self> {
        let (context, budget) = prepare(req, &model.config)?;
        let t0 = clock();
        let k = session.keep_prefix(model, &req.prompt_ids, context, false);
        let logits = session
            .forward(model, &req.prompt_ids[k..], LogitRows::Last, &[])?
            .logits;
        Ok(CpuGeneration {
            model,
            req,
            session,
            logits,
            history: req.prompt_ids.clone(),
            grammar: req.grammar.clone(),
            sink: TokenSink::new(tok, req, budget, on_piece),
            cached_tokens: k,
            times: (t0, clock()),
        })
    }

    /// Takes the next token (and runs the pass that scores the one after); true when
    /// generation is over.
    pub fn step(&mut self) -> Result<bool> {
        let mask = next_mask(&mut self.grammar)?;
        let next = sample_masked(
            &self.logits,
            &self.req.sampling,
            &self.history,
            self.history.len(),
            mask.as_ref(),
        );
        commit_token(&mut self.grammar, next)?;
        let sp = &self.req.sampling;
        let lp = sp
            .logprobs
            .map(|n| token_logprob(&self.logits, sp, &self.history, mask.as_ref(), next, n));
        self.history.push(next);
        if self.sink.push_scored(next, false, lp.as_ref())? {
            return Ok(true);
        }
        self.logits = self
            .session
            .forward(self.model, &[next], LogitRows::Last, &[])?
            .logits;
        Ok(false)
    }

    pub fn finish(self, clock: &dyn Fn() -> f64) -> GenerateResult {
        let (t0, t1) = self.times;
        let mut r = self
            .sink
            .finish(self.req.prompt_ids.len(), t1 - t0, clock() - t1);
        r.cached_tokens = self.cached_tokens;
        r
    }
}
