//! [`Engine`]: a loaded model answering one request at a time. A host (the browser
//! worker, `dflash serve`, `dflash generate`) builds it, then hands it requests: each
//! streams its text pieces to a callback as they are generated and ends in an [`Answer`]
//! (the result, its `usage` and the DFlash figures), or in a typed error.

use crate::policy::{block_policy, StepCostMemory};
use crate::request::{usage, BlockArg, Request};
use crate::runner::{CpuRunner, Runner};
use dflash_core::chat::ChatTemplate;
use dflash_core::cpu::CpuModel;
use dflash_core::drafter::CpuDrafter;
use dflash_core::generate::{
    CpuGeneration, CpuSession, FinishReason, GenerateRequest, GenerateResult, Interrupt, OnPiece,
    Piece,
};
use dflash_core::grammar::{Constraint, GrammarSpec, Grammars};
use dflash_core::speculative::{
    BlockSize, DFlashCpu, DraftState, SpeculativeGeneration, SpeculativeResult,
};
use dflash_core::tokenizer::TextTokenizer;
use dflash_core::tools::{tool_grammar, ToolCall, ToolChoice, ToolFormat, ToolSpec, ToolStream};
use dflash_core::Error as CoreError;
use dflash_gpu::speculative::Speculative;
use dflash_gpu::GpuModel;
use std::future::Future;

pub type Result<T> = std::result::Result<T, crate::Error>;

/// What a host gives the engine.
pub trait Host {
    /// Seconds on the host's clock (for the timings in `usage`).
    fn now_s(&self) -> f64;
    /// A seed for a request that names none.
    fn random_seed(&self) -> u64;
    /// Lets the host run between steps of the CPU engine (the browser worker's event
    /// loop, where an interrupt arrives); natively nothing.
    fn pause(&self) -> impl Future<Output = Result<()>>;
}

/// One generation: what to generate, and whether and how DFlash drafts it.
pub struct Job<'a> {
    pub gen: &'a GenerateRequest,
    /// DFlash where the engine has a drafter (`"dflash": false` turns it off).
    pub dflash: bool,
    /// The block: rows, or auto (None or "auto").
    pub block: Option<&'a BlockArg>,
}

/// A finished generation.
pub struct Answer {
    pub result: GenerateResult,
    /// OpenAI's `usage` plus speeds and the DFlash figures (`usage.dflash`).
    pub usage: serde_json::Value,
    /// With tools: the content and the calls parsed out of the text.
    pub tools: Option<ToolAnswer>,
    /// What the request's grammar left unenforced (`Constraint::warnings`).
    pub grammar_warnings: Vec<String>,
}

/// An answer's text split into content and tool calls.
#[derive(Debug, Clone)]
pub struct ToolAnswer {
    /// The text before the first call; None when it is empty and there are calls.
    pub content: Option<String>,
    pub calls: Vec<ToolCall>,
}

impl Answer {
    fn plain(result: GenerateResult) -> Self {
        let usage = usage(&result, None);
        Answer {
            result,
            usage,
            tools: None,
            grammar_warnings: Vec::new(),
        }
    }

    fn speculative(r: SpeculativeResult, label: &str) -> Self {
        let usage = usage(&r.result, Some((&r, label)));
        Answer {
            result: r.result,
            usage,
            tools: None,
            grammar_warnings: Vec::new(),
        }
    }

    /// `stop`, `length` or `abort` (an interrupt), and `tool_calls` when an answer that
    /// stopped holds calls.
    pub fn finish_reason(&self) -> &'static str {
        let calls = self.tools.as_ref().is_some_and(|t| !t.calls.is_empty());
        match self.result.finish_reason {
            FinishReason::Stop if calls => "tool_calls",
            ref f => f.name(),
        }
    }

    /// The DFlash figures, where a drafter ran.
    pub fn dflash(&self) -> Option<&serde_json::Value> {
        let d = &self.usage["dflash"];
        (d["enabled"] == true).then_some(d)
    }
}

/// A loaded model (and drafter) on its device.
pub struct Engine {
    pub runner: Runner,
    pub tokenizer: TextTokenizer,
    pub chat_template: Option<ChatTemplate>,
    /// The context, in tokens, every request runs with.
    pub context: usize,
    /// Where it runs, in words: the adapter's name or the CPU engine's.
    pub device: String,
    costs: StepCostMemory,
    /// The grammar compiler over the model's tokens, built on the first grammar.
    grammars: Option<Grammars>,
}

impl Engine {
    pub fn new(
        runner: Runner,
        tokenizer: TextTokenizer,
        chat_template: Option<ChatTemplate>,
        context: usize,
        device: String,
    ) -> Self {
        Engine {
            runner,
            tokenizer,
            chat_template,
            context,
            device,
            costs: StepCostMemory::default(),
            grammars: None,
        }
    }

    /// A fresh constraint for `spec` over this model's tokens (the token table and
    /// parser factory built on the first call), or `BadGrammar` naming the fault.
    pub fn constraint(&mut self, spec: &GrammarSpec) -> Result<Constraint> {
        let grammars = match self.grammars.take() {
            Some(g) => g,
            None => Grammars::new(&self.tokenizer, self.runner.vocab_size())?,
        };
        let c = grammars.compile(spec);
        self.grammars = Some(grammars);
        Ok(c?)
    }

    /// Auto mode's step costs as the last auto request left them (None before one).
    pub fn step_costs(&self) -> Option<&[f64]> {
        self.costs.get()
    }

    /// Answers an OpenAI-style request (chat, or a completion's raw prompt), stopped by
    /// `interrupt` once it is set; `on_piece` receives the text as it is generated, with
    /// its token ids and whether its token was an accepted draft.
    pub async fn answer(
        &mut self,
        req: &Request,
        interrupt: &Interrupt,
        host: &impl Host,
        on_piece: &mut OnPiece<'_>,
    ) -> Result<Answer> {
        let mut gen = req.to_generate(
            &self.tokenizer,
            self.chat_template.as_ref(),
            self.context,
            host.random_seed(),
        )?;
        gen.interrupt = interrupt.clone();
        if let Some(spec) = req.chat.grammar_spec()? {
            gen.grammar = Some(self.constraint(&spec)?);
        }
        let tools = match req.chat.tool_request()? {
            Some(t) => Some((self.tool_format(req)?, t)),
            None => None,
        };
        if let Some((format, t)) = &tools {
            self.check_tool_schemas(&t.tools)?;
            if let Some(spec) = tool_grammar(*format, &t.tools, &t.choice, t.parallel)? {
                gen.grammar = Some(self.constraint(&spec)?);
            }
        }
        let job = Job {
            gen: &gen,
            dflash: req.chat.dflash != Some(false),
            block: req.chat.block.as_ref(),
        };
        let mut answer = match tools {
            Some((format, t)) if t.choice != ToolChoice::None => {
                let prefix = format!("call_{:012x}_", host.random_seed() & 0xffff_ffff_ffff);
                self.generate_with_tools(&job, host, ToolStream::new(format, &prefix), on_piece)
                    .await?
            }
            _ => self.generate(&job, host, on_piece).await?,
        };
        answer.grammar_warnings = gen.grammar.map(|g| g.warnings).unwrap_or_default();
        Ok(answer)
    }

    /// The format the model's chat template writes tool calls in, or BadRequest.
    fn tool_format(&self, req: &Request) -> Result<ToolFormat> {
        if req.raw_prompt.is_some() {
            return Err(CoreError::BadRequest("`tools` need the chat endpoint".into()).into());
        }
        let format = self
            .chat_template
            .as_ref()
            .and_then(|t| ToolFormat::of_template(&t.source));
        format.ok_or_else(|| {
            CoreError::BadRequest(
                "`tools`: the model's chat template renders no tool calls (Hermes `<tool_call>` or Llama 3.1 JSON)".into(),
            )
            .into()
        })
    }

    /// Each tool's parameters compile as a JSON schema: an error names the tool.
    fn check_tool_schemas(&mut self, tools: &[ToolSpec]) -> Result<()> {
        for (i, t) in tools.iter().enumerate() {
            let spec = GrammarSpec::JsonSchema {
                schema: t.parameters.clone(),
                strict: true,
            };
            if let Err(crate::Error::Core(e)) = self.constraint(&spec).map(|_| ()) {
                let why = match e {
                    CoreError::BadGrammar(m) => m,
                    other => other.to_string(),
                };
                let place = format!("`tools[{i}].function.parameters` ({})", t.name);
                return Err(CoreError::BadGrammar(format!("{place}: {why}")).into());
            }
        }
        Ok(())
    }

    /// `generate`, the text split into content and tool calls as it streams: each piece
    /// goes out with its content and the calls it completed, a last piece with what
    /// was held back.
    async fn generate_with_tools(
        &mut self,
        job: &Job<'_>,
        host: &impl Host,
        mut stream: ToolStream,
        on_piece: &mut OnPiece<'_>,
    ) -> Result<Answer> {
        let mut split = |p: Piece<'_>| {
            let (content, calls) = stream.push(p.text);
            on_piece(Piece {
                text: &content,
                tool_calls: &calls,
                ..p
            })
        };
        let mut answer = self.generate(job, host, &mut split).await?;
        let (content, calls) = stream.finish();
        if !content.is_empty() || !calls.is_empty() {
            on_piece(Piece {
                text: &content,
                tool_calls: &calls,
                ..Piece::default()
            });
        }
        answer.tools = Some(ToolAnswer {
            content: stream.content(),
            calls: stream.calls().to_vec(),
        });
        Ok(answer)
    }

    /// Runs one generation on the engine: DFlash unless the job turns it off or there is
    /// no drafter.
    pub async fn generate(
        &mut self,
        job: &Job<'_>,
        host: &impl Host,
        on_piece: &mut OnPiece<'_>,
    ) -> Result<Answer> {
        let prior = self.runner.step_cost_prior();
        let mut policy = || match &prior {
            Some(p) => block_policy(job.block, &mut self.costs, || p.clone()),
            None => Ok((BlockSize::Fixed(1), String::new())),
        };
        let mut run = Run {
            gen: job.gen,
            tokenizer: &self.tokenizer,
            host,
            on_piece,
        };
        let answer = match &mut self.runner {
            Runner::Cpu(cpu) => {
                let CpuRunner {
                    target,
                    drafter,
                    session,
                    draft,
                } = &mut **cpu;
                match &*drafter {
                    Some(d) if job.dflash => {
                        let (p, label) = policy()?;
                        let r = run
                            .speculative_on_cpu(session, target, d, draft, &p)
                            .await?;
                        self.costs.remember(r.step_costs.as_ref());
                        Answer::speculative(r, &label)
                    }
                    _ => Answer::plain(run.plain_on_cpu(session, target).await?),
                }
            }
            Runner::Spec(spec) if job.dflash => {
                let (p, label) = policy()?;
                let r = run.speculative_on_gpu(spec, &p).await?;
                self.costs.remember(r.step_costs.as_ref());
                Answer::speculative(r, &label)
            }
            Runner::Spec(spec) => Answer::plain(run.plain_on_gpu(&mut spec.target).await?),
            Runner::Gpu(model) => Answer::plain(run.plain_on_gpu(model).await?),
        };
        Ok(answer)
    }
}

/// One generation as a runner's arm runs it.
struct Run<'a, H> {
    gen: &'a GenerateRequest,
    tokenizer: &'a TextTokenizer,
    host: &'a H,
    on_piece: &'a mut OnPiece<'a>,
}

impl<H: Host> Run<'_, H> {
    /// DFlash on the CPU engine, a step at a time, pausing for the host between steps.
    /// The drafter's context goes back to `draft` whether or not the run succeeds (its
    /// rows and the session's stay consistent on every error).
    async fn speculative_on_cpu(
        &mut self,
        session: &mut CpuSession,
        target: &CpuModel,
        drafter: &CpuDrafter,
        draft: &mut DraftState,
        policy: &BlockSize,
    ) -> Result<SpeculativeResult> {
        let host = self.host;
        let clock = || host.now_s();
        let mut p = DFlashCpu::resume(drafter, target, std::mem::take(draft))?;
        let run = async {
            let mut g = SpeculativeGeneration::start(
                session,
                target,
                &mut p,
                self.tokenizer,
                self.gen,
                policy,
                &clock,
                self.on_piece,
            )?;
            while !g.step(&clock)? {
                host.pause().await?;
            }
            Ok(g.finish(&clock))
        }
        .await;
        *draft = p.into_state();
        run
    }

    /// Plain decoding on the CPU engine, a token at a time, pausing for the host between
    /// tokens.
    async fn plain_on_cpu(
        &mut self,
        session: &mut CpuSession,
        target: &CpuModel,
    ) -> Result<GenerateResult> {
        let host = self.host;
        let clock = || host.now_s();
        let mut g = CpuGeneration::start(
            session,
            target,
            self.tokenizer,
            self.gen,
            &clock,
            self.on_piece,
        )?;
        while !g.step()? {
            host.pause().await?;
        }
        Ok(g.finish(&clock))
    }

    /// DFlash on the GPU engine (which yields to an event loop between steps itself).
    async fn speculative_on_gpu(
        &mut self,
        spec: &mut Speculative,
        policy: &BlockSize,
    ) -> Result<SpeculativeResult> {
        let host = self.host;
        let clock = || host.now_s();
        spec.generate_async(self.tokenizer, self.gen, policy, &clock, self.on_piece)
            .await
    }

    /// Plain decoding on the GPU engine: `model` alone (a drafter's target when the job
    /// turns DFlash off).
    async fn plain_on_gpu(&mut self, model: &mut GpuModel) -> Result<GenerateResult> {
        let host = self.host;
        let clock = || host.now_s();
        model
            .generate_async(self.tokenizer, self.gen, &clock, self.on_piece)
            .await
    }
}
