//! `dflash generate`.

use crate::{load, CliError, Device};
use dflash_core::chat::Message;
use dflash_core::cpu::CpuModel;
use dflash_core::generate::{generate_cpu, FinishReason, GenerateRequest, GenerateResult, TokenSink};
use dflash_core::model_files::LoadedModel;
use dflash_core::sampling::SamplingParams;
use dflash_gpu::model::Head;
use dflash_gpu::{GpuContext, GpuModel, GpuModelOptions, GpuOptions};
use std::io::Write;
use std::path::PathBuf;
use std::rc::Rc;
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
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Stop strings (repeatable).
    #[arg(long)]
    stop: Vec<String>,
    /// Context length (KV capacity) to run with.
    #[arg(long, default_value_t = 4096)]
    context: usize,
    /// gpu (default when an adapter exists) or cpu.
    #[arg(long, value_enum)]
    device: Option<Device>,
    /// Choose the GPU adapter whose name contains this.
    #[arg(long)]
    adapter: Option<String>,
    /// Keep the KV cache in f32 even where the adapter has shader-f16.
    #[arg(long)]
    no_f16: bool,
    /// Print one JSON object instead of streaming text.
    #[arg(long)]
    json: bool,
}

fn prompt_ids(m: &LoadedModel, a: &GenerateArgs) -> Result<Vec<u32>, CliError> {
    Ok(match (&a.prompt, &a.chat) {
        (Some(p), _) => m.tokenizer.encode(p, true)?,
        (None, Some(c)) => {
            let tpl = m.chat_template.as_ref().ok_or_else(|| dflash_core::Error::ChatTemplate("the model has no chat template".into()))?;
            let mut msgs = Vec::new();
            if let Some(s) = &a.system {
                msgs.push(Message::new("system", s));
            }
            msgs.push(Message::new("user", c));
            m.tokenizer.encode(&tpl.render(&msgs, true)?, true)?
        }
        (None, None) => return Err(CliError::Usage("--prompt or --chat is required".into())),
    })
}

/// The GPU context, or None for the CPU device. Without --device, a missing adapter
/// falls back to the CPU with a note.
pub fn open_device(device: Option<Device>, adapter: &Option<String>, no_f16: bool) -> Result<Option<Rc<GpuContext>>, CliError> {
    let opts = GpuOptions { adapter: adapter.clone(), no_f16, ..Default::default() };
    match device {
        Some(Device::Cpu) => Ok(None),
        Some(Device::Gpu) => Ok(Some(Rc::new(GpuContext::new(&opts)?))),
        None => match GpuContext::new(&opts) {
            Ok(c) => Ok(Some(Rc::new(c))),
            Err(e) => {
                eprintln!("note: no GPU adapter ({e}); using the CPU reference engine");
                Ok(None)
            }
        },
    }
}

/// Generation on the GPU engine (argmax or the GPU sampler; only token ids come back)
/// with the same stop handling as the CPU loop.
fn generate_gpu(g: &mut GpuModel, m: &LoadedModel, req: &GenerateRequest, on_text: &mut dyn FnMut(&str)) -> Result<GenerateResult, CliError> {
    let budget = dflash_core::generate::token_budget(req.prompt_ids.len(), req.max_new_tokens, g.context)?;
    let head = if req.sampling.is_greedy() { Head::Argmax } else { Head::Sample };
    g.set_sampling(&req.sampling)?;
    let t0 = Instant::now();
    let mut next = g.prefill_with(&req.prompt_ids, head)?;
    let prefill_s = t0.elapsed().as_secs_f64();
    let t1 = Instant::now();
    let mut sink = TokenSink::new(&m.tokenizer, &req.stop_strings, budget, on_text);
    while !sink.push(next)? {
        next = g.step_with(&[next], head)?[0];
    }
    Ok(sink.finish(req.prompt_ids.len(), prefill_s, t1.elapsed().as_secs_f64()))
}

pub fn run(a: GenerateArgs) -> Result<(), CliError> {
    let (m, load_s) = load(&a.model)?;
    let ids = prompt_ids(&m, &a)?;
    let sampling = SamplingParams {
        temperature: a.temperature,
        top_k: a.top_k,
        top_p: a.top_p,
        min_p: a.min_p,
        repetition_penalty: a.repetition_penalty,
        seed: a.seed,
    };
    sampling.validate()?;
    let req = GenerateRequest { prompt_ids: ids, max_new_tokens: a.max_new_tokens, sampling, stop_strings: a.stop.clone(), context: a.context };
    let json = a.json;
    let mut out = std::io::stdout();
    let mut on_text = |s: &str| {
        if !json {
            let _ = out.write_all(s.as_bytes());
            let _ = out.flush();
        }
    };
    let t_prep = Instant::now();
    let mut device_choice = a.device;
    if req.sampling.repetition_penalty != 1.0 {
        match device_choice {
            Some(Device::Gpu) => return Err(CliError::Usage("the GPU sampler has no repetition penalty yet; use --device cpu".into())),
            None => {
                eprintln!("note: --repetition-penalty runs on the CPU reference engine");
                device_choice = Some(Device::Cpu);
            }
            Some(Device::Cpu) => {}
        }
    }
    let gpu = open_device(device_choice, &a.adapter, a.no_f16)?;
    let (r, device, adapter) = match gpu {
        Some(ctx) => {
            let adapter = ctx.summary.name.clone();
            let context = a.context.min(m.config().max_position_embeddings);
            let mut g = GpuModel::new(ctx, &m.weights, &GpuModelOptions { context, ..Default::default() })?;
            let prep = t_prep.elapsed().as_secs_f64();
            (generate_gpu(&mut g, &m, &req, &mut on_text).map(|r| (r, prep))?, "gpu", Some(adapter))
        }
        None => {
            let cpu = CpuModel::new(&m.weights);
            let prep = t_prep.elapsed().as_secs_f64();
            let t0 = Instant::now();
            let clock = move || t0.elapsed().as_secs_f64();
            (generate_cpu(&cpu, &m.tokenizer, &req, &clock, &mut on_text).map(|r| (r, prep))?, "cpu", None)
        }
    };
    let (r, prep_s) = r;
    if json {
        let n = r.tokens.len();
        let v = serde_json::json!({
            "tokens": r.tokens,
            "text": r.text,
            "prompt_tokens": r.prompt_tokens,
            "completion_tokens": n,
            "finish_reason": match r.finish_reason { FinishReason::Stop => "stop", FinishReason::Length => "length" },
            "device": device,
            "adapter": adapter,
            "model": {"format": m.format, "arch": m.config().arch, "layers": m.config().num_layers, "hidden": m.config().hidden_size, "weight_bytes": m.weights.n_bytes()},
            "timings": {
                "load_s": load_s + prep_s,
                "prefill_s": r.prefill_s,
                "decode_s": r.decode_s,
                "prefill_tok_s": r.prompt_tokens as f64 / r.prefill_s.max(1e-9),
                "decode_tok_s": if n > 1 { (n - 1) as f64 / r.decode_s.max(1e-9) } else { 0.0 },
            }
        });
        println!("{}", serde_json::to_string_pretty(&v).unwrap());
    } else {
        println!();
    }
    Ok(())
}
