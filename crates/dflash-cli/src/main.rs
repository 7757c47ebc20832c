//! `dflash`: generate text with a model file, on the CPU reference engine (the GPU
//! engine and the benchmarks join with their issues).

use clap::{Parser, Subcommand, ValueEnum};
use dflash_core::chat::Message;
use dflash_core::generate::{generate_cpu, FinishReason, GenerateRequest};
use dflash_core::model_files::{load_path, LoadedModel};
use dflash_core::sampling::SamplingParams;
use dflash_core::cpu::CpuModel;
use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

#[derive(Parser)]
#[command(name = "dflash", version, about = "dflash-web: fast LLM decoding with DFlash speculative decoding")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Clone, Copy, ValueEnum)]
enum Device {
    /// The plain-Rust CPU reference engine.
    Cpu,
}

#[derive(Subcommand)]
enum Cmd {
    /// Generate text from a prompt or a chat message.
    Generate(GenerateArgs),
    /// Print the token ids of a text (special tokens in the text are recognised).
    Tokenize {
        #[arg(long)]
        model: PathBuf,
        #[arg(long)]
        text: String,
    },
}

#[derive(clap::Args)]
struct GenerateArgs {
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
    #[arg(long, value_enum, default_value_t = Device::Cpu)]
    device: Device,
    /// Print one JSON object instead of streaming text.
    #[arg(long)]
    json: bool,
}

fn main() {
    let cli = Cli::parse();
    let result = match cli.cmd {
        Cmd::Generate(a) => generate(a),
        Cmd::Tokenize { model, text } => tokenize(&model, &text),
    };
    if let Err(e) = result {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

fn load(path: &PathBuf) -> Result<(LoadedModel, f64), dflash_core::Error> {
    let t = Instant::now();
    let m = load_path(path)?;
    Ok((m, t.elapsed().as_secs_f64()))
}

fn tokenize(model: &PathBuf, text: &str) -> Result<(), dflash_core::Error> {
    let (m, _) = load(model)?;
    let ids = m.tokenizer.encode(text, true)?;
    println!("{}", serde_json::to_string(&ids).unwrap());
    Ok(())
}

fn prompt_ids(m: &LoadedModel, a: &GenerateArgs) -> Result<Vec<u32>, dflash_core::Error> {
    match (&a.prompt, &a.chat) {
        (Some(p), _) => m.tokenizer.encode(p, true),
        (None, Some(c)) => {
            let tpl = m.chat_template.as_ref().ok_or_else(|| dflash_core::Error::ChatTemplate("the model has no chat template".into()))?;
            let mut msgs = Vec::new();
            if let Some(s) = &a.system {
                msgs.push(Message::new("system", s));
            }
            msgs.push(Message::new("user", c));
            let text = tpl.render(&msgs, true)?;
            m.tokenizer.encode(&text, true)
        }
        (None, None) => unreachable!("clap requires --prompt or --chat"),
    }
}

fn generate(a: GenerateArgs) -> Result<(), dflash_core::Error> {
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
    let req = GenerateRequest { prompt_ids: ids, max_new_tokens: a.max_new_tokens, sampling, stop_strings: a.stop.clone(), context: a.context };
    let t0 = Instant::now();
    let clock = move || t0.elapsed().as_secs_f64();
    let Device::Cpu = a.device;
    let t_model = Instant::now();
    let cpu = CpuModel::new(&m.weights);
    let prepare_s = t_model.elapsed().as_secs_f64();
    let json = a.json;
    let mut out = std::io::stdout();
    let mut on_text = |s: &str| {
        if !json {
            let _ = out.write_all(s.as_bytes());
            let _ = out.flush();
        }
    };
    let r = generate_cpu(&cpu, &m.tokenizer, &req, &clock, &mut on_text)?;
    if json {
        let n = r.tokens.len();
        let v = serde_json::json!({
            "tokens": r.tokens,
            "text": r.text,
            "prompt_tokens": r.prompt_tokens,
            "completion_tokens": n,
            "finish_reason": match r.finish_reason { FinishReason::Stop => "stop", FinishReason::Length => "length" },
            "device": "cpu",
            "model": {"format": m.format, "arch": m.config().arch, "layers": m.config().num_layers, "hidden": m.config().hidden_size, "weight_bytes": m.weights.n_bytes()},
            "timings": {
                "load_s": load_s + prepare_s,
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
