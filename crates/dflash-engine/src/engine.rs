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
    CpuGeneration, CpuSession, GenerateRequest, GenerateResult, Interrupt, OnPiece,
};
use dflash_core::grammar::{Constraint, GrammarSpec, Grammars};
use dflash_core::speculative::{
    BlockSize, DFlashCpu, DraftState, SpeculativeGeneration, SpeculativeResult,
};
use dflash_core::tokenizer::TextTokenizer;
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
}

impl Answer {
    fn plain(result: GenerateResult) -> Self {
        let usage = usage(&result, None);
        Answer { result, usage }
    }

    fn speculative(r: SpeculativeResult, label: &str) -> Self {
        let usage = usage(&r.result, Some((&r, label)));
        Answer {
            result: r.result,
            usage,
        }
    }

    /// `stop`, `length` or `abort` (an interrupt).
    pub fn finish_reason(&self) -> &'static str {
        self.result.finish_reason.name()
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
        let job = Job {
            gen: &gen,
            dflash: req.chat.dflash != Some(false),
            block: req.chat.block.as_ref(),
        };
        self.generate(&job, host, on_piece).await
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
