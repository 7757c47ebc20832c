//! `dflash bench --turns N`: the time to first token of each turn of a conversation with
//! multi-turn KV reuse (the prompt's longest common prefix with the rows the cache holds
//! is kept, only the rest is prefilled) against the same turn prefilled whole, on the
//! GPU engine, plain or with DFlash (`--drafter`). The user messages are the `chat`
//! fields of `--prompts`, one per turn; each reply joins the conversation as the
//! assistant's message. Both runs of a turn must give the same tokens.

use super::{bench_request, gpu_options, model_label, BenchArgs};
use crate::generate::block_policy;
use crate::{load, CliError};
use dflash_core::chat::Message;
use dflash_core::drafter::{load_drafter_dir, DrafterWeights};
use dflash_core::generate::{GenerateRequest, GenerateResult};
use dflash_core::model_files::LoadedModel;
use dflash_core::sampling::SamplingParams;
use dflash_core::speculative::BlockSize;
use dflash_engine::device::gpu_target;
use dflash_gpu::model::MAX_ROWS;
use dflash_gpu::speculative::Speculative;
use dflash_gpu::GpuModel;
use std::time::Instant;

/// The engine a conversation runs on.
enum Engine {
    Plain(Box<GpuModel>),
    DFlash(Box<Speculative>, BlockSize),
}

impl Engine {
    /// Plain decoding, or with a drafter DFlash at `block` (`auto`: on the step costs
    /// measured here).
    fn new(
        block: &str,
        target: GpuModel,
        drafter: Option<&DrafterWeights>,
        clock: &dyn Fn() -> f64,
    ) -> Result<Self, CliError> {
        Ok(match drafter {
            Some(weights) => {
                let mut spec = Speculative::new(target, weights)?;
                let costs = match block == "auto" {
                    true => Some(spec.measure_step_costs(16, clock)?),
                    false => None,
                };
                let policy = block_policy(block, spec.max_block(), costs)?;
                Engine::DFlash(Box::new(spec), policy)
            }
            None => Engine::Plain(Box::new(target)),
        })
    }

    fn target(&mut self) -> &mut GpuModel {
        match self {
            Engine::Plain(m) => m,
            Engine::DFlash(s, _) => &mut s.target,
        }
    }

    fn generate(
        &mut self,
        m: &LoadedModel,
        req: &GenerateRequest,
        clock: &dyn Fn() -> f64,
    ) -> Result<GenerateResult, CliError> {
        Ok(match self {
            Engine::Plain(g) => g.generate(&m.tokenizer, req, clock, &mut |_| {})?,
            Engine::DFlash(s, block) => {
                s.generate(&m.tokenizer, req, block, clock, &mut |_| {})?
                    .result
            }
        })
    }
}

/// The user messages of the turns: the `chat` field of the first `turns` prompts.
fn user_messages(a: &BenchArgs, turns: usize) -> Result<Vec<String>, CliError> {
    let path = a
        .prompts
        .as_ref()
        .ok_or_else(|| CliError::Usage("--turns needs --prompts (the user messages)".into()))?;
    let text = std::fs::read_to_string(path)
        .map_err(|e| CliError::Usage(format!("{}: {e}", path.display())))?;
    let mut out = Vec::new();
    for (i, line) in text.lines().filter(|l| !l.trim().is_empty()).enumerate() {
        let v: serde_json::Value = serde_json::from_str(line)
            .map_err(|e| CliError::Usage(format!("{} line {}: {e}", path.display(), i + 1)))?;
        if let Some(c) = v.get("chat").and_then(|c| c.as_str()) {
            out.push(c.to_string());
        }
    }
    let out: Vec<String> = out.into_iter().skip(a.skip).take(turns).collect();
    if out.len() < turns {
        return Err(CliError::Usage(format!(
            "--turns {turns}: --prompts has only {} `chat` messages after --skip",
            out.len()
        )));
    }
    Ok(out)
}

pub(super) fn run(a: BenchArgs, turns: usize) -> Result<(), CliError> {
    check_usage(&a, turns)?;
    let users = user_messages(&a, turns)?;
    let (m, _) = load(a.model.as_ref().expect("clap requires --model"))?;
    let drafter = match &a.drafter {
        Some(d) => Some(load_drafter_dir(d, a.drafter_precision.into())?),
        None => None,
    };
    let ctx = std::rc::Rc::new(dflash_gpu::GpuContext::new(&gpu_options(&a, false))?);
    let context = a.context.min(m.config().max_position_embeddings);
    let target = gpu_target(ctx.clone(), &m, drafter.as_ref(), context)?;
    let t0 = Instant::now();
    let clock = move || t0.elapsed().as_secs_f64();
    let mut chat = Chat {
        model: &m,
        engine: Engine::new(&a.block, target, drafter.as_ref(), &clock)?,
        sampling: SamplingParams {
            temperature: a.temperature,
            top_p: a.top_p,
            seed: a.seed,
            ..Default::default()
        },
        context,
        clock: &clock,
    };
    chat.warm_up(&users[0])?;
    let (rows, same) = chat.turns(&users, a.max_new_tokens, a.json)?;
    if a.json {
        let out = serde_json::json!({
            "bench": "conversation",
            "model": model_label(&a),
            "drafter": a.drafter.as_ref().map(|d| d.display().to_string()),
            "block": drafter.as_ref().map(|_| a.block.clone()),
            "adapter": ctx.summary.name,
            "temperature": a.temperature,
            "turns": rows,
            "all_same_tokens": same,
        });
        outln!("{}", serde_json::to_string_pretty(&out).unwrap())?;
    }
    if !same {
        return Err(CliError::Usage(
            "a turn with KV reuse gave other tokens than the turn prefilled whole".into(),
        ));
    }
    Ok(())
}

/// The usage checks of a conversation: a chat on the GPU engine with one --block, at
/// least one turn.
fn check_usage(args: &BenchArgs, turns: usize) -> Result<(), CliError> {
    let cpu = args.device().cpu_kernels().is_some();
    if args.synthetic.is_some() || cpu || args.block.contains(',') {
        return Err(CliError::Usage(
            "--turns runs a chat on the GPU engine: a --model with a chat template, one --block"
                .into(),
        ));
    }
    if turns == 0 {
        return Err(CliError::Usage("--turns must be at least 1".into()));
    }
    Ok(())
}

/// A conversation's engine with what each of its runs needs: the model, the sampler,
/// the context and the clock.
struct Chat<'a> {
    model: &'a LoadedModel,
    engine: Engine,
    sampling: SamplingParams,
    context: usize,
    clock: &'a dyn Fn() -> f64,
}

impl Chat<'_> {
    /// Up to `max_new_tokens` after `ids` (no stop strings), on the cache as it is.
    fn generate(
        &mut self,
        ids: Vec<u32>,
        max_new_tokens: usize,
    ) -> Result<GenerateResult, CliError> {
        let request = bench_request(ids, max_new_tokens, &self.sampling, self.context);
        self.engine.generate(self.model, &request, self.clock)
    }

    /// Warm-up on the first turn's prompt: the plans of every prefill chunk size (1 to 16
    /// rows) and of decoding compiled, so that no turn's time to first token includes a
    /// pipeline compile; then an empty cache for turn 1.
    fn warm_up(&mut self, first_user: &str) -> Result<(), CliError> {
        let warm = self
            .model
            .conversation_ids(&[Message::new("user", first_user)])?;
        for n in 1..=MAX_ROWS.min(warm.len()) {
            self.engine.target().forget_cached();
            self.generate(warm[..n].to_vec(), 2)?;
        }
        self.engine.target().forget_cached();
        Ok(())
    }

    /// Every turn of `users` (each reply joining the conversation) run twice, on the cache
    /// the last turn left and then prefilled whole; the second run leaves the cache as
    /// the first would (the same rows, bit for bit). The turns' rows (printed unless
    /// `json`), and whether every turn's two runs gave the same tokens.
    fn turns(
        &mut self,
        users: &[String],
        max_new_tokens: usize,
        json: bool,
    ) -> Result<(Vec<serde_json::Value>, bool), CliError> {
        let mut messages = Vec::new();
        let mut rows = Vec::new();
        let mut same = true;
        for (turn, user) in users.iter().enumerate() {
            messages.push(Message::new("user", user));
            let ids = self.model.conversation_ids(&messages)?;
            let reused = self.generate(ids.clone(), max_new_tokens)?;
            self.engine.target().forget_cached();
            let whole = self.generate(ids.clone(), max_new_tokens)?;
            same &= reused.tokens == whole.tokens;
            rows.push(turn_row(turn + 1, ids.len(), &reused, &whole, json)?);
            messages.push(Message::new("assistant", &reused.text));
        }
        Ok((rows, same))
    }
}

/// The row of turn `number` (`prompt_tokens` long): its time to first token with KV
/// reuse (`reused`) and prefilled whole (`whole`), its line printed unless `json`.
fn turn_row(
    number: usize,
    prompt_tokens: usize,
    reused: &GenerateResult,
    whole: &GenerateResult,
    json: bool,
) -> Result<serde_json::Value, CliError> {
    let row = serde_json::json!({
        "turn": number,
        "prompt_tokens": prompt_tokens,
        "cached_tokens": reused.cached_tokens,
        "completion_tokens": reused.tokens.len(),
        "ttft_reuse_s": reused.prefill_s,
        "ttft_whole_s": whole.prefill_s,
        "ttft_speedup": whole.prefill_s / reused.prefill_s.max(1e-9),
        "same_tokens": reused.tokens == whole.tokens,
    });
    if !json {
        outln!(
            "turn {}: {} prompt tokens, {} kept; first token {:.1} ms with reuse, {:.1} ms prefilled whole ({:.2}x){}",
            number,
            prompt_tokens,
            reused.cached_tokens,
            reused.prefill_s * 1e3,
            whole.prefill_s * 1e3,
            row["ttft_speedup"].as_f64().unwrap_or(0.0),
            if reused.tokens == whole.tokens { "" } else { " DIFFERENT TOKENS" }
        )?;
    }
    Ok(row)
}
