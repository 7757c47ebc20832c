//! `dflash generate`: one generation from the command line, run by the engine
//! (`dflash_engine`), its text streamed to stdout or its result printed as JSON.

use crate::device_args::DeviceArgs;
use crate::{load, CliError};
use dflash_core::cpu::CpuKernels;
use dflash_core::drafter::{load_drafter_dir, DrafterPrecision};
use dflash_core::generate::GenerateRequest;
use dflash_core::grammar::GrammarSpec;
use dflash_core::model_files::LoadedModel;
use dflash_core::sampling::SamplingParams;
use dflash_core::speculative::BlockSize;
use dflash_engine::device::{DeviceChoice, NativeHost};
use dflash_engine::policy::StepCostMemory;
use dflash_engine::request::{BlockArg, Request};
use dflash_engine::{Answer, Engine, Job};
use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

#[derive(clap::Args)]
pub struct GenerateArgs {
    /// A .gguf file or a Hugging Face model folder.
    #[arg(long)]
    model: PathBuf,
    /// Raw prompt text, tokenized as is.
    #[arg(long, conflicts_with = "chat", required_unless_present = "chat")]
    prompt: Option<String>,
    /// A user message, rendered through the model's chat template.
    #[arg(long)]
    chat: Option<String>,
    /// A system message for --chat.
    #[arg(long, requires = "chat")]
    system: Option<String>,
    #[arg(long, default_value_t = 128)]
    max_new_tokens: usize,
    #[arg(long, default_value_t = 0.0)]
    temperature: f32,
    #[arg(long, default_value_t = 0)]
    top_k: usize,
    #[arg(long, default_value_t = 1.0)]
    top_p: f32,
    #[arg(long, default_value_t = 0.0)]
    min_p: f32,
    #[arg(long, default_value_t = 1.0)]
    repetition_penalty: f32,
    /// OpenAI's frequency penalty (CPU engine): a token's logit minus this times its count.
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    frequency_penalty: f32,
    /// OpenAI's presence penalty (CPU engine): a token's logit minus this if it occurred.
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    presence_penalty: f32,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Stop strings (repeatable).
    #[arg(long)]
    stop: Vec<String>,
    /// Context length (KV capacity) to run with.
    #[arg(long, default_value_t = 4096)]
    context: usize,
    #[command(flatten)]
    device: DeviceArgs,
    /// A DFlash drafter folder (z-lab format): speculative decoding, lossless.
    #[arg(long)]
    pub drafter: Option<PathBuf>,
    /// Block size of speculative decoding: a number (1 = plain decoding through the
    /// speculative loop) or `auto`.
    #[arg(long, default_value = "auto")]
    pub block: String,
    /// Print one JSON object instead of streaming text.
    #[arg(long)]
    json: bool,
    /// With --drafter at T > 0: verify drafts by rejection sampling (the target's
    /// distribution, more drafts accepted, not token for token plain sampling); DFlash2
    /// drafts are drawn through its selector's walk.
    #[arg(long, requires = "drafter")]
    rejection_sampling: bool,
    /// With --rejection-sampling: a DFlash drafter's drafts drawn from its distribution
    /// (each slot among its top 16 draft logits at --temperature, as z-lab's reference
    /// does) instead of its argmax proposed with certainty.
    #[arg(long, requires = "rejection_sampling")]
    sampled_drafts: bool,
    /// How the drafter's matrices are kept: `q4` (4-bit groups, the default: a little
    /// over half the bytes of `q8` per step for ~1% of tau), `q8`, or `f32` (the file's
    /// values: the drafts of z-lab's reference itself; the CPU engines only, the GPU
    /// refuses it).
    #[arg(long, value_enum, default_value = "q4", requires = "drafter")]
    drafter_precision: DrafterPrecisionArg,
    /// Constrain the output to JSON valid against the schema in this file (strict:
    /// schema keywords the grammar engine lacks are an error).
    #[arg(long, group = "constraint")]
    json_schema: Option<PathBuf>,
    /// Constrain the output to the Lark grammar in this file (llguidance's dialect).
    #[arg(long, group = "constraint")]
    grammar: Option<PathBuf>,
    /// Constrain the output to match this regular expression.
    #[arg(long, group = "constraint")]
    regex: Option<String>,
    /// OpenAI tools (a JSON file holding the `tools` array) for --chat: the model's
    /// calls are constrained to each tool's parameter schema and printed as
    /// `tool_calls`.
    #[arg(long, requires = "chat", group = "constraint")]
    tools: Option<PathBuf>,
    /// With --tools: `auto`, `required`, `none`, or a tool's name.
    #[arg(long, requires = "tools", default_value = "auto")]
    tool_choice: String,
    /// With --json: each token's log-probability and this many alternatives (0-20).
    #[arg(long, requires = "json")]
    logprobs: Option<usize>,
}

/// `--drafter-precision`.
#[derive(Clone, Copy, clap::ValueEnum)]
pub enum DrafterPrecisionArg {
    Q8,
    Q4,
    F32,
}

impl From<DrafterPrecisionArg> for DrafterPrecision {
    fn from(p: DrafterPrecisionArg) -> Self {
        match p {
            DrafterPrecisionArg::Q8 => DrafterPrecision::Q8,
            DrafterPrecisionArg::Q4 => DrafterPrecision::Q4,
            DrafterPrecisionArg::F32 => DrafterPrecision::F32,
        }
    }
}

/// `--block N|auto`, auto from `row_costs` (measured, or a device's prior; without
/// them the linear prior up to `max_block`).
pub fn block_policy(
    arg: &str,
    max_block: usize,
    row_costs: Option<Vec<f64>>,
) -> Result<BlockSize, CliError> {
    let block = parse_block(arg)?;
    // The linear prior: verifying b rows costs b one-row steps.
    let linear = || (0..=max_block).map(|b| b.max(1) as f64).collect();
    let prior = || row_costs.unwrap_or_else(linear);
    let (policy, _) =
        dflash_engine::policy::block_policy(Some(&block), &mut StepCostMemory::default(), prior)?;
    Ok(policy)
}

/// `--block N|auto`.
fn parse_block(arg: &str) -> Result<BlockArg, CliError> {
    BlockArg::parse(arg).ok_or_else(|| {
        CliError::Usage(format!(
            "--block takes a positive number or `auto`, not {arg:?}"
        ))
    })
}

fn prompt_ids(m: &LoadedModel, a: &GenerateArgs) -> Result<Vec<u32>, CliError> {
    Ok(match (&a.prompt, &a.chat) {
        (Some(p), _) => m.tokenizer.encode(p, true)?,
        (None, Some(c)) => m.chat_ids(a.system.as_deref(), c)?,
        (None, None) => return Err(CliError::Usage("--prompt or --chat is required".into())),
    })
}

/// The model's figures in the JSON result (read before the engine takes the model).
fn model_json(m: &LoadedModel) -> serde_json::Value {
    let config = m.config();
    serde_json::json!({"format": m.format, "arch": config.arch, "layers": config.num_layers, "hidden": config.hidden_size, "weight_bytes": m.weights.n_bytes()})
}

pub fn run(a: GenerateArgs) -> Result<(), CliError> {
    let (m, load_s) = load(&a.model)?;
    let ids = prompt_ids(&m, &a)?;
    let sampling = sampling_params(&a, ids.len());
    sampling.validate()?;
    let block = parse_block(&a.block)?;
    let spec = grammar_spec(&a)?;
    let choice = device_for(a.device.choice(), &sampling)?;
    let drafter = match &a.drafter {
        Some(p) => Some(load_drafter_dir(p, a.drafter_precision.into())?),
        None => None,
    };
    let model = model_json(&m);
    let t_prep = Instant::now();
    let mut note = |n: &str| {
        let _ = writeln!(std::io::stderr(), "note: {n}");
    };
    let opts = a.device.gpu_options();
    let mut engine = Engine::on_device(m, drafter.as_ref(), choice, &opts, a.context, &mut note)?;
    let prep_s = t_prep.elapsed().as_secs_f64();
    let req = GenerateRequest {
        prompt_ids: ids,
        max_new_tokens: a.max_new_tokens,
        sampling,
        stop_strings: a.stop.clone(),
        context: engine.context,
        interrupt: Default::default(),
        grammar: spec.map(|s| engine.constraint(&s)).transpose()?,
    };
    let mut on_text = text_printer(a.json);
    let answer = match &a.tools {
        Some(path) => {
            let tools = tools_request(&a, path, &req)?;
            let interrupt = Default::default();
            engine.answer_blocking(&tools, &interrupt, &NativeHost::default(), &mut |p| {
                on_text(p.text)
            })?
        }
        None => {
            let job = Job {
                gen: &req,
                dflash: true,
                block: Some(&block),
            };
            engine.generate_blocking(&job, &NativeHost::default(), &mut |p| on_text(p.text))?
        }
    };
    let calls = answer.tools.as_ref().map(|t| &t.calls[..]).unwrap_or(&[]);
    if !a.json {
        for c in calls {
            outln!("\n{}", c.to_json(false))?;
        }
    }
    if a.json {
        let report = result_json(&engine, &answer, model, load_s + prep_s);
        outln!("{}", serde_json::to_string_pretty(&report).unwrap())?;
    } else {
        outln!()?;
    }
    Ok(())
}

/// The OpenAI request of `--chat` with `--tools`: the engine renders the tools through
/// the chat template, constrains the calls and parses them (one request path with
/// `dflash serve` and the browser).
fn tools_request(
    a: &GenerateArgs,
    path: &PathBuf,
    gen: &GenerateRequest,
) -> Result<Request, CliError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| CliError::Usage(format!("cannot read {}: {e}", path.display())))?;
    let tools: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| CliError::Usage(format!("--tools {} is not JSON: {e}", path.display())))?;
    let choice = match a.tool_choice.as_str() {
        c @ ("auto" | "required" | "none") => serde_json::json!(c),
        name => serde_json::json!({"type": "function", "function": {"name": name}}),
    };
    let mut messages = Vec::new();
    if let Some(s) = &a.system {
        messages.push(serde_json::json!({"role": "system", "content": s}));
    }
    messages.push(serde_json::json!({"role": "user", "content": a.chat}));
    let sp = &gen.sampling;
    let block = match a.block.parse::<usize>() {
        Ok(n) => serde_json::json!(n),
        Err(_) => serde_json::json!(a.block),
    };
    let body = serde_json::json!({
        "messages": messages, "tools": tools, "tool_choice": choice,
        "max_tokens": gen.max_new_tokens, "temperature": sp.temperature, "top_p": sp.top_p,
        "top_k": sp.top_k, "min_p": sp.min_p, "seed": sp.seed, "stop": gen.stop_strings,
        "block": block,
    });
    Ok(Request::chat(body)?)
}

/// The sampler of the arguments, the penalties counting tokens from `penalized_from`
/// (the prompt's length: the generated tokens only).
fn sampling_params(args: &GenerateArgs, penalized_from: usize) -> SamplingParams {
    SamplingParams {
        temperature: args.temperature,
        top_k: args.top_k,
        top_p: args.top_p,
        min_p: args.min_p,
        repetition_penalty: args.repetition_penalty,
        frequency_penalty: args.frequency_penalty,
        presence_penalty: args.presence_penalty,
        penalized_from,
        seed: args.seed,
        speculative_rejection: args.rejection_sampling,
        sampled_drafts: args.sampled_drafts,
        logprobs: args.logprobs,
    }
}

/// The streaming text callback: unless `json`, each piece written to stdout as it comes.
fn text_printer(json: bool) -> impl FnMut(&str) {
    let mut out = std::io::stdout();
    move |text: &str| {
        if !json {
            match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
                // The reader is gone (`dflash generate ... | head`): nothing more to do.
                Err(e) if crate::is_broken_pipe(&e) => std::process::exit(0),
                _ => {}
            }
        }
    }
}

/// The grammar of `--json-schema`, `--grammar` or `--regex`, read from its file.
fn grammar_spec(a: &GenerateArgs) -> Result<Option<GrammarSpec>, CliError> {
    let read = |p: &PathBuf| {
        std::fs::read_to_string(p)
            .map_err(|e| CliError::Usage(format!("cannot read {}: {e}", p.display())))
    };
    Ok(if let Some(p) = &a.json_schema {
        let schema = serde_json::from_str(&read(p)?).map_err(|e| {
            CliError::Usage(format!("--json-schema {} is not JSON: {e}", p.display()))
        })?;
        Some(GrammarSpec::JsonSchema {
            schema,
            strict: true,
        })
    } else if let Some(p) = &a.grammar {
        Some(GrammarSpec::Lark(read(p)?))
    } else {
        a.regex.clone().map(GrammarSpec::Regex)
    })
}

/// The device choice, but where the sampler has penalties (the GPU sampler has none
/// yet): an error with --device gpu, and in auto mode the CPU engine, with a note.
fn device_for(choice: DeviceChoice, sampling: &SamplingParams) -> Result<DeviceChoice, CliError> {
    if !sampling.has_penalties() {
        return Ok(choice);
    }
    let what = "penalties";
    match choice {
        DeviceChoice::Gpu => Err(CliError::Usage(format!(
            "the GPU sampler has no {what} yet; use --device cpu"
        ))),
        DeviceChoice::Auto => {
            let _ = writeln!(std::io::stderr(), "note: {what} run on the CPU engine");
            Ok(DeviceChoice::Cpu(CpuKernels::Quantized))
        }
        DeviceChoice::Cpu(_) => Ok(choice),
    }
}

/// The JSON of a generation: its tokens and text, where it ran, the model, the DFlash
/// statistics and the timings (the load including the device's preparation).
fn result_json(
    engine: &Engine,
    answer: &Answer,
    model: serde_json::Value,
    load_s: f64,
) -> serde_json::Value {
    let result = &answer.result;
    let completion_tokens = result.tokens.len();
    let on_gpu = engine.runner.gpu_context().is_some();
    serde_json::json!({
        "tokens": result.tokens,
        "text": result.text,
        "prompt_tokens": result.prompt_tokens,
        "completion_tokens": completion_tokens,
        "finish_reason": answer.finish_reason(),
        "device": if on_gpu { "gpu" } else { engine.device.as_str() },
        "adapter": on_gpu.then_some(&engine.device),
        "model": model,
        "dflash": answer.dflash(),
        "logprobs": (!result.logprobs.is_empty()).then_some(&result.logprobs),
        "tool_calls": answer.tools.as_ref().map(|t| t.calls.iter().map(|c| c.to_json(false)).collect::<Vec<_>>()),
        "timings": {
            "load_s": load_s,
            "prefill_s": result.prefill_s,
            "decode_s": result.decode_s,
            "prefill_tok_s": result.prompt_tokens as f64 / result.prefill_s.max(1e-9),
            "decode_tok_s": if completion_tokens > 1 { (completion_tokens - 1) as f64 / result.decode_s.max(1e-9) } else { 0.0 },
        }
    })
}
