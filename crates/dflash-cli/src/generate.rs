//! `dflash generate`.

use crate::{load, CliError, Device};
use dflash_core::cpu::{CpuKernels, CpuModel};
use dflash_core::drafter::{load_drafter_dir, CpuDrafter, DrafterPrecision, DrafterWeights};
use dflash_core::generate::{generate_cpu, GenerateRequest, GenerateResult};
use dflash_core::model_files::LoadedModel;
use dflash_core::sampling::SamplingParams;
use dflash_core::speculative::{
    generate_speculative_cpu, BlockSize, SpeculativeResult, StepCostPrior,
};
use dflash_gpu::speculative::Speculative;
use dflash_gpu::{GpuContext, GpuModel, GpuModelOptions, GpuOptions};
use std::io::Write;
use std::path::PathBuf;
use std::rc::Rc;
use std::time::Instant;

/// Where a model runs: `--device`, `--adapter`, `--no-f16`.
#[derive(clap::Args)]
pub struct DeviceArgs {
    /// gpu (default when an adapter exists) or cpu.
    #[arg(long, value_enum)]
    pub device: Option<Device>,
    /// Choose the GPU adapter whose name contains this.
    #[arg(long)]
    pub adapter: Option<String>,
    /// Keep the KV cache in f32 even where the adapter has shader-f16.
    #[arg(long)]
    pub no_f16: bool,
}

impl DeviceArgs {
    pub fn gpu_options(&self) -> GpuOptions {
        GpuOptions {
            adapter: self.adapter.clone(),
            no_f16: self.no_f16,
            ..Default::default()
        }
    }
}

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

/// `--block N|auto` for a device: auto uses the measured (GPU) or linear (CPU) cost of
/// verifying b rows, up to the drafter's own block (`max_block`). A fixed block may
/// exceed it, as in z-lab's reference; the engine clamps it to what its step holds.
pub fn block_policy(
    arg: &str,
    max_block: usize,
    row_costs: Option<Vec<f64>>,
) -> Result<BlockSize, CliError> {
    if arg == "auto" {
        return Ok(match row_costs {
            Some(verify_cost) => BlockSize::Auto { verify_cost },
            None => BlockSize::auto_linear(max_block, 1.0),
        });
    }
    match arg.parse::<usize>() {
        Ok(b) if b >= 1 => Ok(BlockSize::Fixed(b)),
        _ => Err(CliError::Usage(format!(
            "--block takes a positive number or `auto`, not {arg:?}"
        ))),
    }
}

/// The JSON of a speculative run's statistics.
pub fn dflash_json(r: &SpeculativeResult, block: &str) -> serde_json::Value {
    serde_json::json!({
        "block": block,
        "steps": r.steps,
        "mean_tau": r.mean_tau(),
        "acceptance_by_position": r.acceptance.rates(),
        "accepted_tokens": r.taus.iter().map(|t| t - 1).sum::<usize>(),
    })
}

fn prompt_ids(m: &LoadedModel, a: &GenerateArgs) -> Result<Vec<u32>, CliError> {
    Ok(match (&a.prompt, &a.chat) {
        (Some(p), _) => m.tokenizer.encode(p, true)?,
        (None, Some(c)) => m.chat_ids(a.system.as_deref(), c)?,
        (None, None) => return Err(CliError::Usage("--prompt or --chat is required".into())),
    })
}

/// The GPU context, or None for the CPU device. Without --device, a missing adapter
/// falls back to the CPU with a note.
pub fn open_device(
    device: Option<Device>,
    opts: &GpuOptions,
) -> Result<Option<Rc<GpuContext>>, CliError> {
    match device {
        Some(Device::Cpu | Device::Reference) => Ok(None),
        Some(Device::Gpu) => Ok(Some(Rc::new(GpuContext::new(opts)?))),
        None => match GpuContext::new(opts) {
            Ok(c) => Ok(Some(Rc::new(c))),
            Err(e) => {
                let _ = writeln!(
                    std::io::stderr(),
                    "note: no GPU adapter ({e}); using the CPU engine"
                );
                Ok(None)
            }
        },
    }
}

/// Generation on the GPU engine (argmax or the GPU sampler; only token ids come back)
/// with the same stop handling as the CPU loop.
pub fn generate_gpu(
    g: &mut GpuModel,
    m: &LoadedModel,
    req: &GenerateRequest,
    on_text: &mut dyn FnMut(&str),
) -> Result<GenerateResult, CliError> {
    let t0 = Instant::now();
    Ok(g.generate(
        &m.tokenizer,
        req,
        &move || t0.elapsed().as_secs_f64(),
        on_text,
    )?)
}

/// The target on the GPU for `context` tokens, with the taps the drafter reads.
pub fn gpu_target(
    ctx: Rc<GpuContext>,
    m: &LoadedModel,
    drafter: Option<&DrafterWeights>,
    context: usize,
) -> Result<GpuModel, CliError> {
    let taps = drafter
        .map(|d| d.config.target_layer_ids.clone())
        .unwrap_or_default();
    let options = GpuModelOptions {
        context,
        taps,
        ..Default::default()
    };
    Ok(GpuModel::new(ctx, &m.weights, &options)?)
}

pub fn run(a: GenerateArgs) -> Result<(), CliError> {
    let (m, load_s) = load(&a.model)?;
    let ids = prompt_ids(&m, &a)?;
    let sampling = sampling_params(&a, ids.len());
    sampling.validate()?;
    let req = GenerateRequest {
        prompt_ids: ids,
        max_new_tokens: a.max_new_tokens,
        sampling,
        stop_strings: a.stop.clone(),
        context: a.context,
        interrupt: Default::default(),
    };
    let json = a.json;
    let mut on_text = text_printer(json);
    let t_prep = Instant::now();
    let device_choice = device_for(a.device.device, &req.sampling)?;
    let gpu = open_device(device_choice, &a.device.gpu_options())?;
    let drafter = match &a.drafter {
        Some(p) => Some(load_drafter_dir(p, a.drafter_precision.into())?),
        None => None,
    };
    let t0 = Instant::now();
    let clock = move || t0.elapsed().as_secs_f64();
    let job = Job {
        args: &a,
        model: &m,
        drafter: drafter.as_ref(),
        req: &req,
        t_prep,
        clock: &clock,
    };
    let (generated, device, adapter) = match gpu {
        Some(ctx) => {
            let adapter = ctx.summary.name.clone();
            (job.on_gpu(ctx, &mut on_text)?, "gpu", Some(adapter))
        }
        None => {
            let kernels = device_choice
                .and_then(Device::cpu_kernels)
                .unwrap_or(CpuKernels::Quantized);
            let generated = job.on_cpu(kernels, &mut on_text)?;
            (generated, kernels.device_name(), None)
        }
    };
    if json {
        let report = result_json(&m, &generated, device, adapter, load_s);
        outln!("{}", serde_json::to_string_pretty(&report).unwrap())?;
    } else {
        outln!()?;
    }
    Ok(())
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

/// --device, but where the sampler has penalties (the GPU sampler has none): an error
/// with --device gpu, and without --device the CPU engine, with a note.
fn device_for(
    choice: Option<Device>,
    sampling: &SamplingParams,
) -> Result<Option<Device>, CliError> {
    if !sampling.has_penalties() {
        return Ok(choice);
    }
    match choice {
        Some(Device::Gpu) => Err(CliError::Usage(
            "the GPU sampler has no penalties yet; use --device cpu".into(),
        )),
        None => {
            let _ = writeln!(std::io::stderr(), "note: penalties run on the CPU engine");
            Ok(Some(Device::Cpu))
        }
        Some(Device::Cpu | Device::Reference) => Ok(choice),
    }
}

/// What a generation runs: the arguments, the model and the drafter, the request, when
/// the device's preparation began (after the model's load) and the engine's clock.
struct Job<'a> {
    args: &'a GenerateArgs,
    model: &'a LoadedModel,
    drafter: Option<&'a DrafterWeights>,
    req: &'a GenerateRequest,
    t_prep: Instant,
    clock: &'a dyn Fn() -> f64,
}

/// A generation's result, the seconds its device took to prepare, and its DFlash
/// statistics when a drafter ran.
struct Generated {
    result: GenerateResult,
    prep_s: f64,
    dflash: Option<serde_json::Value>,
}

impl Job<'_> {
    /// The generation on the GPU engine: plain, or DFlash (auto block sizes from the
    /// adapter's prior step costs, which the steps refine).
    fn on_gpu(
        &self,
        ctx: Rc<GpuContext>,
        on_text: &mut dyn FnMut(&str),
    ) -> Result<Generated, CliError> {
        let context = self
            .args
            .context
            .min(self.model.config().max_position_embeddings);
        let mut target = gpu_target(ctx, self.model, self.drafter, context)?;
        let prep_s = self.t_prep.elapsed().as_secs_f64();
        let (result, dflash) = match self.drafter {
            Some(weights) => {
                let mut spec = Speculative::new(target, weights)?;
                // Auto starts from the device's prior; the steps refine it.
                let summary = &spec.target.ctx.summary;
                let prior = StepCostPrior::for_adapter(&summary.device_type, &summary.name);
                let costs = Some(prior.costs(spec.max_block()));
                let policy = block_policy(&self.args.block, spec.max_block(), costs)?;
                let tokenizer = &self.model.tokenizer;
                let run = spec.generate(tokenizer, self.req, &policy, self.clock, on_text)?;
                let stats = dflash_json(&run, &self.args.block);
                (run.result, Some(stats))
            }
            None => (
                generate_gpu(&mut target, self.model, self.req, on_text)?,
                None,
            ),
        };
        Ok(Generated {
            result,
            prep_s,
            dflash,
        })
    }

    /// The generation on a CPU engine (`kernels`): plain, or DFlash (auto block sizes
    /// from the CPU engine's linear step costs).
    fn on_cpu(
        &self,
        kernels: CpuKernels,
        on_text: &mut dyn FnMut(&str),
    ) -> Result<Generated, CliError> {
        let cpu = CpuModel::with_kernels(&self.model.weights, kernels);
        let prep_s = self.t_prep.elapsed().as_secs_f64();
        let tokenizer = &self.model.tokenizer;
        let (result, dflash) = match self.drafter {
            Some(weights) => {
                let drafter = CpuDrafter::with_kernels(weights, kernels);
                let block_size = weights.config.block_size;
                let costs = Some(StepCostPrior::CpuEngine.costs(block_size));
                let policy = block_policy(&self.args.block, block_size, costs)?;
                let run = generate_speculative_cpu(
                    &cpu, &drafter, tokenizer, self.req, &policy, self.clock, on_text,
                )?;
                let stats = dflash_json(&run, &self.args.block);
                (run.result, Some(stats))
            }
            None => (
                generate_cpu(&cpu, tokenizer, self.req, self.clock, on_text)?,
                None,
            ),
        };
        Ok(Generated {
            result,
            prep_s,
            dflash,
        })
    }
}

/// The JSON of a generation: its tokens and text, where it ran, the model, the DFlash
/// statistics and the timings (the load including the device's preparation).
fn result_json(
    model: &LoadedModel,
    generated: &Generated,
    device: &str,
    adapter: Option<String>,
    load_s: f64,
) -> serde_json::Value {
    let result = &generated.result;
    let completion_tokens = result.tokens.len();
    let config = model.config();
    serde_json::json!({
        "tokens": result.tokens,
        "text": result.text,
        "prompt_tokens": result.prompt_tokens,
        "completion_tokens": completion_tokens,
        "finish_reason": result.finish_reason.name(),
        "device": device,
        "adapter": adapter,
        "model": {"format": model.format, "arch": config.arch, "layers": config.num_layers, "hidden": config.hidden_size, "weight_bytes": model.weights.n_bytes()},
        "dflash": generated.dflash,
        "timings": {
            "load_s": load_s + generated.prep_s,
            "prefill_s": result.prefill_s,
            "decode_s": result.decode_s,
            "prefill_tok_s": result.prompt_tokens as f64 / result.prefill_s.max(1e-9),
            "decode_tok_s": if completion_tokens > 1 { (completion_tokens - 1) as f64 / result.decode_s.max(1e-9) } else { 0.0 },
        }
    })
}
