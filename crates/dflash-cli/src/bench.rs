//! `dflash bench`: prefill and decode speed on the GPU engine, the bandwidth the decode
//! GEMV reaches, and in the same run the bandwidth of a plain copy kernel on the same
//! adapter (the roofline), with the ratio between them. `--synthetic NAME` benches a
//! model of a real shape with random weights made on the device (no file, no
//! tokenizer: random token ids); `--accept-profile` simulates DFlash acceptance.
//! `--device cpu` measures the quantized CPU engine the same way (`bench/cpu.rs`);
//! `--turns N` the time to first token of a conversation's turns with and without
//! multi-turn KV reuse (`bench/conversation.rs`).

mod conversation;
mod cpu;

use crate::generate::open_device;
use crate::{load, CliError, Device};
use dflash_core::config::ModelConfig;
use dflash_core::drafter::{load_drafter_dir, DrafterPrecision, DrafterWeights};
use dflash_core::generate::GenerateRequest;
use dflash_core::model_files::LoadedModel;
use dflash_core::rng::Rng;
use dflash_core::sampling::SamplingParams;
use dflash_core::speculative::{AcceptProfile, Acceptance, BlockSize, SpeculativeResult};
use dflash_core::synthetic::SyntheticSpec;
use dflash_gpu::model::{OutputHead, MAX_ROWS};
use dflash_gpu::speculative::Speculative;
use dflash_gpu::synthetic::Planned;
use dflash_gpu::{GpuContext, GpuModel, GpuModelOptions};
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::Instant;

#[derive(clap::Args)]
pub struct BenchArgs {
    /// A .gguf file or a Hugging Face model folder.
    #[arg(
        long,
        required_unless_present = "synthetic",
        conflicts_with = "synthetic"
    )]
    model: Option<PathBuf>,
    /// Instead of --model: a model of this real shape with random Q4_K_M-like weights
    /// made on the device (smollm2-135m, qwen3-0.6b, qwen3-4b, qwen3-8b, llama-3.1-8b,
    /// qwen2.5-32b; test-tiny). No tokenizer: prompts are random token ids.
    #[arg(long)]
    synthetic: Option<String>,
    /// Prompt length for the prefill measurement (with --synthetic and --drafter: the
    /// length of each random prompt).
    #[arg(long, default_value_t = 128)]
    prompt_tokens: usize,
    /// Tokens to decode for the decode measurement.
    #[arg(long, default_value_t = 32)]
    decode_tokens: usize,
    /// Repetitions of the GEMV and copy kernels per timed submission.
    #[arg(long, default_value_t = 4)]
    reps: usize,
    /// gpu (default), cpu (the quantized CPU engine) or reference (the f32 oracle).
    #[arg(long, value_enum, default_value = "gpu")]
    device: Device,
    /// Choose the GPU adapter whose name contains this.
    #[arg(long)]
    adapter: Option<String>,
    /// Keep the KV cache in f32 even where the adapter has shader-f16.
    #[arg(long)]
    no_f16: bool,
    /// A DFlash drafter: benchmark plain against DFlash decoding on --prompts. With
    /// --synthetic: `synthetic`, a random drafter of the z-lab shape for that target.
    #[arg(long)]
    drafter: Option<PathBuf>,
    /// Simulated acceptance for the DFlash run: P1,P2,... the probability that draft
    /// slot i is right given the slots before it were (slots past the list: wrong). The
    /// engine replays the plain run's tokens as drafts and does the real step.
    #[arg(long, allow_hyphen_values = true)]
    accept_profile: Option<String>,
    /// Refuse to allocate (a typed error, before anything is allocated) when the planned
    /// GPU memory exceeds this: bytes, or with a K/M/G/T suffix (powers of 1024). With
    /// --synthetic on a CPU adapter the default is the host's MemAvailable.
    #[arg(long, value_parser = parse_bytes)]
    memory_budget: Option<u64>,
    /// JSON lines, each with `chat` (a user message, through the chat template) or
    /// `prompt` (raw text); other fields (`id`, ...) are carried into the rows.
    #[arg(long)]
    prompts: Option<PathBuf>,
    /// Skip the first N prompts of --prompts (with --limit: run a slice, so that a long
    /// sweep can be run and resumed in pieces).
    #[arg(long, default_value_t = 0)]
    skip: usize,
    /// Only the first N prompts of --prompts (after --skip); with --synthetic, the number
    /// of random prompts (default 1).
    #[arg(long)]
    limit: Option<usize>,
    /// Tokens per prompt in the DFlash benchmark.
    #[arg(long, default_value_t = 64)]
    max_new_tokens: usize,
    /// Block size: a number or `auto`; several, comma separated (`2,4,8,16,auto`), run
    /// each against the same plain outputs and print one result per block.
    #[arg(long, default_value = "auto")]
    block: String,
    #[arg(long, default_value_t = 0.0)]
    temperature: f32,
    /// With --drafter at T > 0: verify by rejection sampling, drafts sampled from the
    /// drafter (the target's distribution, more drafts accepted; not token for token
    /// plain sampling, so the runs are not checked equal).
    #[arg(long, requires = "drafter", conflicts_with = "accept_profile")]
    rejection_sampling: bool,
    /// With --rejection-sampling: a DFlash drafter's drafts drawn from its distribution
    /// (its top 16 at --temperature) instead of its argmax.
    #[arg(long, requires = "rejection_sampling")]
    sampled_drafts: bool,
    #[arg(long, default_value_t = 1.0)]
    top_p: f32,
    /// Seed of the sampler, and of the synthetic weights, prompts and simulated drafts.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Context length for the DFlash benchmark.
    #[arg(long, default_value_t = 2048)]
    context: usize,
    #[arg(long)]
    json: bool,
    /// Time every dispatch of a one-row and a 16-row step on the GPU (timestamps where
    /// the adapter has them) and print them per op family and shape, with the host's
    /// encode/submit/map times and the calibration kernels.
    #[arg(long)]
    profile: bool,
    /// The kernel knobs: this adapter's own (default), or those of a GPU, of an Intel
    /// Xe2 GPU or of a CPU adapter (to run the GPU plan on lavapipe, or the CPU plan on a
    /// GPU).
    #[arg(long, value_enum)]
    tuning: Option<TuningChoice>,
    /// A conversation of N turns (the `chat` messages of --prompts, each reply kept):
    /// the time to first token of every turn with multi-turn KV reuse against the same
    /// turn prefilled whole.
    #[arg(long, requires = "prompts")]
    turns: Option<usize>,
}

/// `--memory-budget`: bytes, or a number with a K/M/G/T suffix (powers of 1024).
pub fn parse_bytes(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let (num, mul) = match t.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let shift = match c.to_ascii_uppercase() {
                'K' => 10,
                'M' => 20,
                'G' => 30,
                'T' => 40,
                _ => return Err(format!("{s:?}: the suffix must be K, M, G or T")),
            };
            (&t[..i], 1u64 << shift)
        }
        _ => (t, 1),
    };
    let v: f64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a number of bytes"))?;
    if !(v >= 0.0) || !(v * mul as f64).is_finite() || v * mul as f64 > u64::MAX as f64 {
        return Err(format!("{s:?} is not a number of bytes"));
    }
    Ok((v * mul as f64) as u64)
}

/// The memory budget and where it came from: the flag; with --synthetic on a CPU adapter
/// (whose memory is the host's) the host's MemAvailable; otherwise none.
fn memory_budget(a: &BenchArgs, ctx: &GpuContext) -> (Option<u64>, serde_json::Value) {
    if let Some(b) = a.memory_budget {
        return (
            Some(b),
            serde_json::json!({"bytes": b, "source": "--memory-budget"}),
        );
    }
    if a.synthetic.is_some() && ctx.summary.device_type == "Cpu" {
        if let Some(b) = mem_available() {
            return (
                Some(b),
                serde_json::json!({"bytes": b, "source": "MemAvailable (CPU adapter)"}),
            );
        }
    }
    (None, serde_json::Value::Null)
}

/// The host's available memory (Linux: /proc/meminfo), in bytes.
fn mem_available() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// `n` random token ids below `vocab`.
fn random_ids(n: usize, vocab: usize, seed: u64) -> Vec<u32> {
    let mut rng = Rng(seed ^ 0x1D5_1D5);
    (0..n).map(|_| rng.below(vocab) as u32).collect()
}

/// What a synthetic run benches, for the JSON.
fn synthetic_json(s: &SyntheticSpec, with_drafter: bool) -> serde_json::Value {
    let mut v = serde_json::json!({
        "name": s.name,
        "weights": "random, made on the device",
        "formats": "as a Q4_K_M GGUF repacked: q4/32 (Q4_K) layers; attn_v and ffn_down q8/16 (Q6_K) on llama.cpp's use_more_bits layers; q8/16 (Q6_K) output (or tied embedding); rows not a multiple of 256 fall back to q8/32 (Q5_0/Q8_0)",
        "config": s.config,
        "weight_bytes": s.target_weight_bytes(),
    });
    if with_drafter {
        let d = &s.drafter;
        v["drafter"] = serde_json::json!({
            "layers": d.num_layers,
            "block_size": d.block_size,
            "target_layer_ids": d.target_layer_ids,
            "mask_token_id": d.mask_token_id,
            "formats": "q8/32 (a bf16 checkpoint as the bench loads it)",
            "weight_bytes": s.drafter_weight_bytes(),
        });
    }
    v
}

pub fn run(a: BenchArgs) -> Result<(), CliError> {
    // Every usage check before anything is loaded or allocated.
    if a.prompt_tokens == 0 || a.decode_tokens == 0 {
        return Err(CliError::Usage(
            "--prompt-tokens and --decode-tokens must be at least 1".into(),
        ));
    }
    let profile = match &a.accept_profile {
        Some(_) if a.drafter.is_none() => return Err(CliError::Usage(
            "--accept-profile needs --drafter (a drafter folder, or `synthetic` with --synthetic)"
                .into(),
        )),
        Some(p) => Some(AcceptProfile::parse(p, usize::MAX).map_err(CliError::Usage)?),
        None => None,
    };
    let synthetic = match &a.synthetic {
        Some(n) => Some(dflash_core::synthetic::spec(n).ok_or_else(|| {
            CliError::Usage(format!(
                "--synthetic: unknown shape {n:?} (known: {})",
                dflash_core::synthetic::NAMES.join(", ")
            ))
        })?),
        None => None,
    };
    if synthetic.is_some() {
        if a.prompts.is_some() {
            return Err(CliError::Usage(
                "--prompts needs a tokenizer; --synthetic decodes random token ids".into(),
            ));
        }
        if a.drafter
            .as_deref()
            .is_some_and(|d| d != Path::new("synthetic"))
        {
            return Err(CliError::Usage(
                "with --synthetic, --drafter takes `synthetic` (a random drafter of the z-lab shape for that target)".into(),
            ));
        }
    } else if a.drafter.as_deref() == Some(Path::new("synthetic")) {
        return Err(CliError::Usage(
            "--drafter synthetic needs --synthetic NAME".into(),
        ));
    } else if a.drafter.is_some() && a.prompts.is_none() {
        return Err(CliError::Usage("--drafter needs --prompts".into()));
    }
    if let (Some(p), Some(s)) = (&profile, &synthetic) {
        check_profile_len(p, s.drafter.block_size)?;
    }
    if let Some(turns) = a.turns {
        return conversation::run(a, turns);
    }
    if let Some(kernels) = a.device.cpu_kernels() {
        return cpu::run(a, kernels, synthetic.is_some(), profile.is_some());
    }
    if a.drafter.is_some() {
        return run_dflash(a, synthetic, profile);
    }
    run_plain(a, synthetic)
}

/// At most one entry per draft slot of the drafter's block.
fn check_profile_len(p: &AcceptProfile, block_size: usize) -> Result<(), CliError> {
    let slots = block_size.clamp(1, MAX_ROWS) - 1;
    if p.0.len() > slots {
        return Err(CliError::Usage(format!(
            "--accept-profile: {} entries, but a block of {} has {slots} draft slots",
            p.0.len(),
            block_size.clamp(1, MAX_ROWS)
        )));
    }
    Ok(())
}

/// `--model`'s path, or `synthetic:NAME`.
fn model_label(a: &BenchArgs) -> String {
    match (&a.synthetic, &a.model) {
        (Some(n), _) => format!("synthetic:{n}"),
        (None, Some(p)) => p.display().to_string(),
        (None, None) => String::new(),
    }
}

#[derive(Clone, Copy, clap::ValueEnum)]
pub enum TuningChoice {
    Gpu,
    IntelXe2,
    Cpu,
}

/// The device options of a bench: timestamps where asked, the knobs of `--tuning`.
fn gpu_options(a: &BenchArgs, timestamps: bool) -> dflash_gpu::GpuOptions {
    use dflash_gpu::context::Tuning;
    dflash_gpu::GpuOptions {
        adapter: a.adapter.clone(),
        no_f16: a.no_f16,
        profile: timestamps,
        tuning: a.tuning.map(|t| match t {
            TuningChoice::Gpu => Tuning::gpu(),
            TuningChoice::IntelXe2 => Tuning::intel_xe2(),
            TuningChoice::Cpu => Tuning::cpu(),
        }),
        ..Default::default()
    }
}

/// A prompt of `n` real tokens: a paragraph of English repeated.
fn bench_prompt(m: &dflash_core::model_files::LoadedModel, n: usize) -> Result<Vec<u32>, CliError> {
    let text = "The history of computing is a story of machines that learned to remember, to calculate and finally to speak. ";
    let one = m.tokenizer.encode(text, true)?;
    Ok(one.iter().cycle().take(n).copied().collect())
}

/// Prefill and decode speed of a plain model, the decode GEMV's bandwidth against a copy
/// kernel's on the same adapter, and with --profile every dispatch timed.
fn run_plain(a: BenchArgs, synthetic: Option<SyntheticSpec>) -> Result<(), CliError> {
    let t_load = Instant::now();
    let mut bench = plain_model(&a, synthetic.as_ref())?;
    let times = bench.time_decoding(&a, t_load)?;
    let roofline = bench.roofline(&a)?;
    let mut report = plain_json(&a, &bench, &times, &roofline);
    report["memory_budget"] = bench.budget_json;
    if let Some(shape) = &synthetic {
        report["synthetic"] = synthetic_json(shape, false);
    }
    if let Some(profile) = roofline.profile {
        if !a.json {
            crate::profile::print(&profile)?;
        }
        report["profile"] = profile;
    }
    if a.json {
        outln!("{}", serde_json::to_string_pretty(&report).unwrap())?;
    } else {
        let (gemv_gbps, copy_gbps) = (roofline.gemv_gbps, roofline.copy_gbps);
        outln!(
            "{}: prefill {:.1} tok/s, decode {:.2} tok/s; GEMV {:.2} GB/s vs copy {:.2} GB/s ({:.0}%)",
            bench.ctx.summary.name, report["prefill_tok_s"].as_f64().unwrap(), times.decode_tok_s, gemv_gbps, copy_gbps, 100.0 * gemv_gbps / copy_gbps
        )?;
    }
    Ok(())
}

/// A plain bench's model on the device, and what it was made from.
struct PlainBench {
    /// The model file; None for a synthetic model.
    loaded: Option<LoadedModel>,
    ctx: Rc<GpuContext>,
    vocab_size: usize,
    /// The memory budget and where it came from, for the JSON.
    budget_json: serde_json::Value,
    model: GpuModel,
}

/// A plain bench's times: the load (the warm-up included) and the prefill in seconds,
/// the decode in tokens per second.
struct PlainTimes {
    load_s: f64,
    prefill_s: f64,
    decode_tok_s: f64,
}

/// The decode GEMV's bandwidth against a plain copy kernel's on the same adapter, the
/// bytes of weights one token reads, and the --profile timings.
struct Roofline {
    gemv_gbps: f64,
    copy_gbps: f64,
    weight_bytes: u64,
    profile: Option<serde_json::Value>,
}

/// The target's config: the loaded file's, or the synthetic shape's.
fn model_config(loaded: Option<&LoadedModel>, synthetic: Option<&SyntheticSpec>) -> ModelConfig {
    match (loaded, synthetic) {
        (Some(model), _) => model.config().clone(),
        (None, Some(shape)) => shape.config.clone(),
        (None, None) => unreachable!("clap requires --model or --synthetic"),
    }
}

/// Loads --model (or plans and builds the --synthetic one) on the GPU with room for
/// --prompt-tokens and --decode-tokens, within the memory budget.
fn plain_model(
    args: &BenchArgs,
    synthetic: Option<&SyntheticSpec>,
) -> Result<PlainBench, CliError> {
    let loaded = match &args.model {
        Some(path) if synthetic.is_none() => Some(load(path)?.0),
        _ => None,
    };
    let ctx = open_device(Some(Device::Gpu), &gpu_options(args, true))?.expect("gpu");
    let config = model_config(loaded.as_ref(), synthetic);
    let context =
        (args.prompt_tokens + args.decode_tokens + 16).min(config.max_position_embeddings);
    let (budget, budget_json) = memory_budget(args, &ctx);
    let opts = GpuModelOptions {
        context,
        memory_budget: budget,
        ..Default::default()
    };
    let model = match (&loaded, synthetic) {
        (Some(file), _) => GpuModel::new(ctx.clone(), &file.weights, &opts)?,
        (None, Some(shape)) => {
            dflash_gpu::synthetic::plan(&ctx, shape, context, Planned::Plain, budget)?;
            let (weights, _) = dflash_gpu::synthetic::build(&ctx, shape, args.seed, false)?;
            GpuModel::from_gpu_weights(ctx.clone(), weights, &opts)?
        }
        (None, None) => unreachable!(),
    };
    Ok(PlainBench {
        loaded,
        ctx,
        vocab_size: config.vocab_size,
        budget_json,
        model,
    })
}

impl PlainBench {
    /// A prompt of `n` tokens: English text, or random ids for a synthetic model.
    fn prompt(&self, n: usize, seed: u64) -> Result<Vec<u32>, CliError> {
        match &self.loaded {
            Some(file) => bench_prompt(file, n),
            None => Ok(random_ids(n, self.vocab_size, seed)),
        }
    }

    /// Decoding as generation does it (pipelined on GPUs), greedy or sampled at
    /// --temperature: the plans compiled on a short prompt (the load time ends there),
    /// then the prefill of --prompt-tokens and the decode of --decode-tokens timed.
    fn time_decoding(&mut self, args: &BenchArgs, t_load: Instant) -> Result<PlainTimes, CliError> {
        let sampling = SamplingParams {
            temperature: args.temperature,
            top_p: args.top_p,
            seed: args.seed,
            ..Default::default()
        };
        let head = head_of(&sampling);
        self.model.set_sampling(&sampling)?;
        let warm_up = self.prompt(17, args.seed)?;
        let first = self.model.prefill_with(&warm_up, head)?;
        self.model.decode(first, 2, head, &mut |_| Ok(false))?;
        let load_s = t_load.elapsed().as_secs_f64();
        let prompt = self.prompt(args.prompt_tokens, args.seed)?;
        self.model.truncate(0);
        let t0 = Instant::now();
        let first = self.model.prefill_with(&prompt, head)?;
        let prefill_s = t0.elapsed().as_secs_f64();
        let t1 = Instant::now();
        self.model
            .decode(first, args.decode_tokens, head, &mut |_| Ok(false))?;
        let decode_s = t1.elapsed().as_secs_f64();
        Ok(PlainTimes {
            load_s,
            prefill_s,
            decode_tok_s: args.decode_tokens as f64 / decode_s,
        })
    }

    /// The GEMV and copy bandwidths (--reps kernels a submission, best of 3), and with
    /// --profile the profile of the cache the timed decode left.
    fn roofline(&mut self, args: &BenchArgs) -> Result<Roofline, CliError> {
        let t_start = Instant::now();
        let now = move || t_start.elapsed().as_secs_f64();
        let gemv_gbps = self.model.gemv_gbps(args.reps, 3, &now)?;
        let weight_bytes = self.model.weight_bytes_per_token();
        let copy_bytes = (4 * weight_bytes).max(64 << 20);
        let copy_gbps = dflash_gpu::profile::copy_gbps(&self.ctx, copy_bytes, &now)?;
        let profile = if args.profile {
            Some(crate::profile::profile(
                &self.ctx,
                &mut self.model,
                None,
                args.prompt_tokens,
                &now,
            )?)
        } else {
            None
        };
        Ok(Roofline {
            gemv_gbps,
            copy_gbps,
            weight_bytes,
            profile,
        })
    }
}

/// The JSON of a plain bench: the speeds, the bandwidths, the adapter and the GPU memory
/// (without the memory budget, the synthetic shape and the profile).
fn plain_json(
    args: &BenchArgs,
    bench: &PlainBench,
    times: &PlainTimes,
    roofline: &Roofline,
) -> serde_json::Value {
    let (ctx, memory) = (&bench.ctx, &bench.model.memory);
    let summary = &ctx.summary;
    let (gemv_gbps, copy_gbps) = (roofline.gemv_gbps, roofline.copy_gbps);
    serde_json::json!({
        "model": model_label(args),
        "prompt_tokens": args.prompt_tokens,
        "decode_tokens": args.decode_tokens,
        "temperature": args.temperature,
        "pipelined_decode": ctx.tuning.pipelined_decode,
        "prefill_tok_s": args.prompt_tokens as f64 / times.prefill_s,
        "decode_tok_s": times.decode_tok_s,
        "weight_bytes_per_token": roofline.weight_bytes,
        "decode_gbps": roofline.weight_bytes as f64 * times.decode_tok_s / 1e9,
        "gemv_gbps": gemv_gbps,
        "copy_gbps": copy_gbps,
        "gemv_copy_ratio": gemv_gbps / copy_gbps,
        "adapter": {
            "name": summary.name, "backend": summary.backend,
            "device_type": summary.device_type, "driver": summary.driver,
            "shader_f16": summary.shader_f16, "subgroups": summary.subgroups,
            "kv_cache_f16": ctx.f16,
            "max_storage_buffer_binding_size": summary.max_storage_buffer_binding_size,
            "max_buffer_size": summary.max_buffer_size,
            "max_compute_invocations_per_workgroup": summary.max_compute_invocations_per_workgroup,
        },
        "load_s": times.load_s,
        "gpu_memory_bytes": {
            "weights": memory.weights,
            "kv_cache": memory.kv_cache,
            "activations": memory.activations,
            "total": memory.total(),
        },
    })
}

/// The sampler's head for `sampling`.
fn head_of(sampling: &SamplingParams) -> OutputHead {
    if sampling.is_greedy() {
        OutputHead::Argmax
    } else {
        OutputHead::Sample
    }
}

/// Plain decoding of `n` tokens by token id (no tokenizer, no stop tokens): the tokens
/// and the decode time after the first token (prefill excluded).
fn plain_ids(
    g: &mut GpuModel,
    prompt: &[u32],
    n: usize,
    sampling: &SamplingParams,
) -> Result<(Vec<u32>, f64), CliError> {
    let n = dflash_core::generate::token_budget(prompt.len(), n, g.context)?;
    let head = head_of(sampling);
    g.set_sampling(sampling)?;
    let mut out = Vec::with_capacity(n);
    if n == 0 {
        return Ok((out, 0.0));
    }
    let first = g.prefill_with(prompt, head)?;
    let t0 = Instant::now();
    out.push(first);
    g.decode(first, n - 1, head, &mut |t| {
        out.push(t);
        Ok(false)
    })?;
    Ok((out, t0.elapsed().as_secs_f64()))
}

/// Simulated acceptance: the profile, the plain run's tokens (the truth the drafts
/// replay), and the generator of right/wrong.
struct Sim<'a> {
    profile: &'a AcceptProfile,
    plain: &'a [u32],
    rng: &'a mut Rng,
}

/// A DFlash run's tokens and statistics.
struct IdsRun {
    tokens: Vec<u32>,
    decode_s: f64,
    taus: Vec<usize>,
    acceptance: Acceptance,
}

impl From<SpeculativeResult> for IdsRun {
    /// A speculative generation's tokens and statistics.
    fn from(run: SpeculativeResult) -> Self {
        IdsRun {
            tokens: run.result.tokens,
            decode_s: run.result.decode_s,
            taus: run.taus,
            acceptance: run.acceptance,
        }
    }
}

impl IdsRun {
    fn mean_tau(&self) -> f64 {
        if self.taus.is_empty() {
            0.0
        } else {
            self.taus.iter().sum::<usize>() as f64 / self.taus.len() as f64
        }
    }
}

/// DFlash decoding of `n` tokens by token id, through the engine's own steps (context
/// extension, draft pass, verification, acceptance, rollback) and the same block choice
/// as `Speculative::generate`. With `sim`, before each step the host writes the block's
/// drafts (`set_host_drafts_at`, by absolute position): slot i is the plain run's token
/// with the profile's probability given slots < i were right, a wrong token otherwise;
/// the drafter's pass still runs, its drafts unused.
fn dflash_ids(
    spec: &mut Speculative,
    prompt: &[u32],
    n: usize,
    policy: &BlockSize,
    sampling: &SamplingParams,
    mut sim: Option<Sim<'_>>,
    clock: &dyn Fn() -> f64,
) -> Result<IdsRun, CliError> {
    use dflash_core::speculative::BlockLoop;
    let n = dflash_core::generate::token_budget(prompt.len(), n, spec.target.context)?;
    let head = head_of(sampling);
    spec.target.set_sampling(sampling)?;
    spec.host_drafts = false;
    spec.simulate = sim.is_some();
    let vocab = spec.target.config.vocab_size;
    let mut tokens = Vec::with_capacity(n + MAX_ROWS);
    let mut blocks = BlockLoop::new(policy, spec.block_capacity());
    let run = (|| {
        if n == 0 {
            return Ok(0.0);
        }
        tokens.push(spec.prefill(prompt, head)?);
        let t1 = clock();
        while tokens.len() < n {
            let b = blocks.next_block(spec.target.context - spec.target.len(), n - tokens.len());
            if let Some(s) = sim.as_mut() {
                // The block starts at the anchor's position; slot i is position start + i,
                // whose plain token is plain[start + i - prompt.len()].
                let start = spec.target.len();
                let truth: Vec<Option<u32>> = (1..b)
                    .map(|i| s.plain.get(start + i - prompt.len()).copied())
                    .collect();
                let drafts = s.profile.drafts(&truth, vocab, s.rng);
                spec.set_host_drafts_at(start + 1, &drafts);
            }
            let t_step = clock();
            let r = spec.step(b, head)?;
            blocks.commit_step(b, clock() - t_step, r.accepted, &r.tokens, |t, _| {
                tokens.push(t);
                Ok::<_, CliError>(false)
            })?;
        }
        Ok::<_, CliError>(clock() - t1)
    })();
    spec.host_drafts = false;
    spec.simulate = false;
    let decode_s = run?;
    tokens.truncate(n);
    Ok(IdsRun {
        tokens,
        decode_s,
        taus: blocks.taus,
        acceptance: blocks.acceptance,
    })
}

/// The rows of --prompts (each its fields and token ids), after --skip, at most --limit.
fn prompt_rows(
    a: &BenchArgs,
    m: &LoadedModel,
) -> Result<Vec<(serde_json::Value, Vec<u32>)>, CliError> {
    let path = a
        .prompts
        .as_ref()
        .expect("checked: --drafter needs --prompts");
    let text =
        std::fs::read_to_string(path).map_err(|e| CliError::Usage(format!("--prompts: {e}")))?;
    let mut rows = dflash_core::prompt_file::parse(&text, m)?;
    rows.drain(..a.skip.min(rows.len()));
    if rows.is_empty() {
        return Err(CliError::Usage(
            "--prompts: no prompts left after --skip".into(),
        ));
    }
    if let Some(n) = a.limit {
        rows.truncate(n.max(1));
    }
    Ok(rows)
}

/// Plain and DFlash decoding of the same prompts in the same run, on the same adapter:
/// a loaded model with a drafter folder and --prompts, or a synthetic pair on random
/// prompts; acceptance measured, or simulated with --accept-profile.
fn run_dflash(
    a: BenchArgs,
    synthetic: Option<SyntheticSpec>,
    accept: Option<AcceptProfile>,
) -> Result<(), CliError> {
    let t_load = Instant::now();
    // The host side first (model, drafter, prompts, every check); then the device.
    let host = dflash_host(&a, synthetic.as_ref(), accept.as_ref())?;
    let ctx = open_device(Some(Device::Gpu), &gpu_options(&a, a.profile))?.expect("gpu");
    let (budget, budget_json) = memory_budget(&a, &ctx);
    let opts = GpuModelOptions {
        context: a.context.min(host.config.max_position_embeddings),
        memory_budget: budget,
        ..Default::default()
    };
    let (mut plain, mut spec) = dflash_pair(&a, &ctx, &host, synthetic.as_ref(), &opts)?;
    let t0 = Instant::now();
    let clock = move || t0.elapsed().as_secs_f64();
    let blocks = block_policies(&a.block, spec.max_block(), || {
        Ok(spec.measure_step_costs(16, &clock)?)
    })?;
    let runs = PairRuns {
        loaded: host.loaded.as_ref(),
        accept: accept.as_ref(),
        sampling: dflash_sampling(&a),
        context: opts.context,
        clock: &clock,
    };
    let first = host.rows.first();
    runs.warm_up(&mut plain, &mut spec, first, &blocks.policies, a.seed)?;
    let load_s = t_load.elapsed().as_secs_f64();
    let (plain_totals, block_runs) =
        runs.all_prompts(&mut plain, &mut spec, &host.rows, &blocks.policies, &a)?;
    let profile = dflash_profile(&a, &ctx, &mut plain, &mut spec, first, &clock)?;
    let adapter = &ctx.summary.name;
    let fields = gpu_fields(
        accept.as_ref(),
        adapter,
        budget_json,
        synthetic.as_ref(),
        profile,
    );
    let results = DflashResults {
        blocks,
        runs: block_runs,
        plain: plain_totals,
        load_s,
    };
    let suffix = match accept {
        Some(_) => " (simulated acceptance)",
        None => "",
    };
    report_dflash(&a, results, adapter, suffix, &fields)
}

/// The host side of a DFlash bench: the model and drafter files (None for a synthetic
/// pair), the target's config, and the prompts (each its fields and token ids).
struct DflashHost {
    loaded: Option<LoadedModel>,
    drafter: Option<DrafterWeights>,
    config: ModelConfig,
    rows: Vec<(serde_json::Value, Vec<u32>)>,
}

/// Loads the model and the drafter (none for a synthetic pair), checks --accept-profile
/// against the drafter's block, and reads --prompts (a synthetic pair: --limit random
/// prompts of --prompt-tokens ids, each its own seed).
fn dflash_host(
    args: &BenchArgs,
    synthetic: Option<&SyntheticSpec>,
    accept: Option<&AcceptProfile>,
) -> Result<DflashHost, CliError> {
    let (loaded, drafter): (Option<LoadedModel>, _) = match synthetic {
        None => (
            Some(load(args.model.as_ref().expect("clap requires --model"))?.0),
            Some(load_drafter_dir(
                args.drafter.as_ref().unwrap(),
                DrafterPrecision::Q8,
            )?),
        ),
        Some(_) => (None, None),
    };
    if let (Some(profile), Some(weights)) = (accept, &drafter) {
        check_profile_len(profile, weights.config.block_size)?;
    }
    let config = model_config(loaded.as_ref(), synthetic);
    let rows = match &loaded {
        Some(file) => prompt_rows(args, file)?,
        None => (0..args.limit.unwrap_or(1).max(1))
            .map(|i| {
                let seed = args.seed + i as u64;
                let ids = random_ids(args.prompt_tokens, config.vocab_size, seed);
                (serde_json::json!({ "id": i }), ids)
            })
            .collect(),
    };
    Ok(DflashHost {
        loaded,
        drafter,
        config,
        rows,
    })
}

/// The plain model and the DFlash pair on the device, the plain model sharing the
/// target's weight buffers: the loaded model with its drafter, or the synthetic pair
/// (checked whole, both models' KV caches and the drafter, before any allocation).
fn dflash_pair(
    args: &BenchArgs,
    ctx: &Rc<GpuContext>,
    host: &DflashHost,
    synthetic: Option<&SyntheticSpec>,
    opts: &GpuModelOptions,
) -> Result<(GpuModel, Speculative), CliError> {
    match (&host.loaded, synthetic, &host.drafter) {
        (Some(file), _, Some(weights)) => {
            let taps = GpuModelOptions {
                taps: weights.config.target_layer_ids.clone(),
                ..opts.clone()
            };
            let target = GpuModel::new(ctx.clone(), &file.weights, &taps)?;
            let plain = target.sharing_weights(opts)?;
            Ok((plain, Speculative::new(target, weights)?))
        }
        (None, Some(shape), _) => {
            let (context, budget) = (opts.context, opts.memory_budget);
            dflash_gpu::synthetic::plan(ctx, shape, context, Planned::PlainAndDFlash, budget)?;
            let (weights, drafter) = dflash_gpu::synthetic::build(ctx, shape, args.seed, true)?;
            let taps = GpuModelOptions {
                taps: shape.drafter.target_layer_ids.clone(),
                ..opts.clone()
            };
            let target = GpuModel::from_gpu_weights(ctx.clone(), weights, &taps)?;
            let plain = target.sharing_weights(opts)?;
            let drafter = drafter.expect("built with the drafter");
            let spec = Speculative::from_gpu_drafter(target, &shape.drafter, drafter)?;
            Ok((plain, spec))
        }
        _ => unreachable!(),
    }
}

/// The block sizes of a DFlash bench: as --block names them, the measured step costs
/// (where one of them is `auto`), and each one's policy.
struct Blocks {
    names: Vec<String>,
    costs: Option<Vec<f64>>,
    policies: Vec<BlockSize>,
}

/// The block sizes of --block (comma separated), with the step costs that `measure`
/// gives where one is `auto`, each size's policy up to `max_block`.
fn block_policies(
    arg: &str,
    max_block: usize,
    measure: impl FnOnce() -> Result<Vec<f64>, CliError>,
) -> Result<Blocks, CliError> {
    let names: Vec<String> = arg.split(',').map(|name| name.trim().to_string()).collect();
    let costs = if names.iter().any(|name| name == "auto") {
        Some(measure()?)
    } else {
        None
    };
    let policies = names
        .iter()
        .map(|name| crate::generate::block_policy(name, max_block, costs.clone()))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Blocks {
        names,
        costs,
        policies,
    })
}

/// The sampler of a DFlash bench: --temperature, --top-p, --seed and how drafts are
/// verified.
fn dflash_sampling(args: &BenchArgs) -> SamplingParams {
    SamplingParams {
        temperature: args.temperature,
        top_p: args.top_p,
        seed: args.seed,
        speculative_rejection: args.rejection_sampling,
        sampled_drafts: args.sampled_drafts,
        ..Default::default()
    }
}

/// A bench's request of up to `max_new_tokens` after `ids`: no stop strings.
fn bench_request(
    ids: Vec<u32>,
    max_new_tokens: usize,
    sampling: &SamplingParams,
    context: usize,
) -> GenerateRequest {
    GenerateRequest {
        prompt_ids: ids,
        max_new_tokens,
        sampling: sampling.clone(),
        stop_strings: vec![],
        context,
        interrupt: Default::default(),
    }
}

/// How a GPU DFlash bench decodes a prompt, plain and with DFlash: the model file (None
/// for a synthetic pair), the simulated acceptance, the sampler, the context and the
/// clock.
struct PairRuns<'a> {
    loaded: Option<&'a LoadedModel>,
    accept: Option<&'a AcceptProfile>,
    sampling: SamplingParams,
    context: usize,
    clock: &'a dyn Fn() -> f64,
}

impl PairRuns<'_> {
    /// The plain run of up to `n` tokens (its tokens and decode seconds): through the
    /// tokenizer's stop handling when there is one.
    fn plain(
        &self,
        plain: &mut GpuModel,
        ids: &[u32],
        n: usize,
    ) -> Result<(Vec<u32>, f64), CliError> {
        match self.loaded {
            Some(file) => {
                let request = bench_request(ids.to_vec(), n, &self.sampling, self.context);
                let result = crate::generate::generate_gpu(plain, file, &request, &mut |_| {})?;
                Ok((result.tokens, result.decode_s))
            }
            None => plain_ids(plain, ids, n, &self.sampling),
        }
    }

    /// The DFlash run of up to `n` tokens: measured acceptance (a loaded model runs
    /// `Speculative::generate`, a synthetic one the same loop by token id), or simulated
    /// (the plain run's `plain_tokens` replayed: as many tokens as it has).
    fn dflash(
        &self,
        spec: &mut Speculative,
        ids: &[u32],
        n: usize,
        plain_tokens: &[u32],
        policy: &BlockSize,
        rng: &mut Rng,
    ) -> Result<IdsRun, CliError> {
        match (self.accept, self.loaded) {
            (None, Some(file)) => {
                let request = bench_request(ids.to_vec(), n, &self.sampling, self.context);
                let result =
                    spec.generate(&file.tokenizer, &request, policy, self.clock, &mut |_| {})?;
                Ok(IdsRun::from(result))
            }
            (profile, _) => {
                let sim = profile.map(|profile| Sim {
                    profile,
                    plain: plain_tokens,
                    rng,
                });
                let n = if sim.is_some() { plain_tokens.len() } else { n };
                dflash_ids(spec, ids, n, policy, &self.sampling, sim, self.clock)
            }
        }
    }

    /// Every prompt of `rows` decoded plain and with each policy (each with its own
    /// generator of simulated drafts), as `bench_prompts` returns them.
    fn all_prompts(
        &self,
        plain: &mut GpuModel,
        spec: &mut Speculative,
        rows: &[(serde_json::Value, Vec<u32>)],
        policies: &[BlockSize],
        args: &BenchArgs,
    ) -> Result<((usize, f64), Vec<BlockRun>), CliError> {
        let mut rngs: Vec<Rng> = (0..policies.len())
            .map(|i| Rng(args.seed.wrapping_add(1 + i as u64)))
            .collect();
        let max_new = args.max_new_tokens;
        bench_prompts(
            rows,
            policies,
            |ids| self.plain(plain, ids, max_new),
            |i, policy, ids, plain_tokens| {
                self.dflash(spec, ids, max_new, plain_tokens, policy, &mut rngs[i])
            },
        )
    }

    /// Warm-up on the first prompt: compiles every plan the runs use.
    fn warm_up(
        &self,
        plain: &mut GpuModel,
        spec: &mut Speculative,
        first: Option<&(serde_json::Value, Vec<u32>)>,
        policies: &[BlockSize],
        seed: u64,
    ) -> Result<(), CliError> {
        if let Some((_, ids)) = first {
            let (plain_tokens, _) = self.plain(plain, ids, 4)?;
            for policy in policies {
                self.dflash(spec, ids, 4, &plain_tokens, policy, &mut Rng(seed))?;
            }
        }
        Ok(())
    }
}

/// Every prompt decoded plain (`plain`: its tokens and decode seconds), then with each
/// policy (`dflash`: the policy's index, the policy, the prompt and the plain tokens):
/// the plain totals (tokens after the first, decode seconds) and each policy's run.
fn bench_prompts(
    rows: &[(serde_json::Value, Vec<u32>)],
    policies: &[BlockSize],
    mut plain: impl FnMut(&[u32]) -> Result<(Vec<u32>, f64), CliError>,
    mut dflash: impl FnMut(usize, &BlockSize, &[u32], &[u32]) -> Result<IdsRun, CliError>,
) -> Result<((usize, f64), Vec<BlockRun>), CliError> {
    let (mut plain_tokens, mut plain_s) = (0usize, 0f64);
    let mut runs: Vec<BlockRun> = policies.iter().map(|_| BlockRun::default()).collect();
    for (fields, ids) in rows {
        let (plain_out, plain_decode_s) = plain(ids)?;
        plain_tokens += plain_out.len().saturating_sub(1);
        plain_s += plain_decode_s;
        for (i, (policy, run)) in policies.iter().zip(&mut runs).enumerate() {
            let dflash_out = dflash(i, policy, ids, &plain_out)?;
            run.add(fields, ids.len(), &plain_out, plain_decode_s, dflash_out);
        }
    }
    Ok(((plain_tokens, plain_s), runs))
}

/// With --profile, the one-row and the 16-row profiles (the pair's block step) on the
/// first prompt's cache, printed unless --json.
fn dflash_profile(
    args: &BenchArgs,
    ctx: &GpuContext,
    plain: &mut GpuModel,
    spec: &mut Speculative,
    first: Option<&(serde_json::Value, Vec<u32>)>,
    clock: &dyn Fn() -> f64,
) -> Result<Option<serde_json::Value>, CliError> {
    let Some((_, ids)) = first.filter(|_| args.profile) else {
        return Ok(None);
    };
    plain.truncate(0);
    plain.prefill(ids)?;
    spec.prefill(ids, OutputHead::Argmax)?;
    let profile = crate::profile::profile(ctx, plain, Some(spec), ids.len(), clock)?;
    if !args.json {
        crate::profile::print(&profile)?;
    }
    Ok(Some(profile))
}

/// The fields a GPU DFlash bench adds to each block size's JSON: how acceptance came
/// about, the adapter, the memory budget, the synthetic shape and the profile.
fn gpu_fields(
    accept: Option<&AcceptProfile>,
    adapter: &str,
    budget_json: serde_json::Value,
    synthetic: Option<&SyntheticSpec>,
    profile: Option<serde_json::Value>,
) -> serde_json::Value {
    let mut fields = serde_json::json!({
        "acceptance": if accept.is_some() { "simulated" } else { "measured" },
        "accept_profile": accept.map(|profile| profile.0.clone()),
        "adapter": adapter,
        "memory_budget": budget_json,
    });
    if let Some(shape) = synthetic {
        fields["synthetic"] = synthetic_json(shape, true);
    }
    if let Some(profile) = profile {
        fields["profile"] = profile;
    }
    fields
}

/// A DFlash bench's results: the block sizes, each one's run over the prompts, the
/// plain totals (tokens after the first, decode seconds) and the load time.
struct DflashResults {
    blocks: Blocks,
    runs: Vec<BlockRun>,
    plain: (usize, f64),
    load_s: f64,
}

/// Each block size's line (unless --json; `device` in front, `suffix` after) and JSON
/// (its summary, the step costs where it is `auto`, and `fields`), then as
/// `finish_dflash`.
fn report_dflash(
    args: &BenchArgs,
    results: DflashResults,
    device: &str,
    suffix: &str,
    fields: &serde_json::Value,
) -> Result<(), CliError> {
    let mut all_lossless = true;
    let mut out = Vec::new();
    let blocks = &results.blocks;
    for (block, run) in blocks.names.iter().zip(results.runs) {
        all_lossless &= run.lossless;
        let mut summary = run.summary(args, block, results.plain, results.load_s);
        summary["step_costs"] = serde_json::json!(if block == "auto" {
            blocks.costs.clone()
        } else {
            None
        });
        if let (Some(entries), Some(extra)) = (summary.as_object_mut(), fields.as_object()) {
            entries.extend(extra.clone());
        }
        if !args.json {
            outln!("{}{suffix}", run.line(device, block, results.plain))?;
        }
        out.push(summary);
    }
    finish_dflash(args, out, all_lossless)
}

/// Prints the JSON of every block size (one object, or an array of several); an error
/// where DFlash's output differed from plain decoding.
fn finish_dflash(
    a: &BenchArgs,
    mut out: Vec<serde_json::Value>,
    all_lossless: bool,
) -> Result<(), CliError> {
    if a.json {
        let v = if out.len() == 1 {
            out.pop().unwrap()
        } else {
            serde_json::Value::Array(out)
        };
        outln!("{}", serde_json::to_string_pretty(&v).unwrap())?;
    }
    if !all_lossless && !a.rejection_sampling {
        return Err(CliError::Usage(
            "DFlash output differed from plain decoding".into(),
        ));
    }
    Ok(())
}

/// One block size's totals over the prompts of a DFlash benchmark.
struct BlockRun {
    tokens: usize,
    seconds: f64,
    acceptance: dflash_core::speculative::Acceptance,
    taus: Vec<usize>,
    lossless: bool,
    rows: Vec<serde_json::Value>,
}

impl BlockRun {
    /// Adds one prompt's plain tokens (decoded in `plain_s` after the first) and DFlash
    /// run: the totals, and the prompt's row (the prompt file's fields but the text).
    fn add(
        &mut self,
        fields: &serde_json::Value,
        prompt_tokens: usize,
        plain: &[u32],
        plain_s: f64,
        s: IdsRun,
    ) {
        let lossless = plain == s.tokens.as_slice();
        self.lossless &= lossless;
        // Decode speed: tokens after the first over the decode time (prefill excluded).
        let p_tok_s = plain.len().saturating_sub(1) as f64 / plain_s.max(1e-9);
        let st = s.tokens.len();
        let s_tok_s = st.saturating_sub(1) as f64 / s.decode_s.max(1e-9);
        self.tokens += st.saturating_sub(1);
        self.seconds += s.decode_s;
        self.acceptance.add(&s.acceptance);
        self.taus.extend(&s.taus);
        let mut row = fields.clone();
        if let Some(o) = row.as_object_mut() {
            o.remove("chat");
            o.remove("prompt");
            let extra = serde_json::json!({
                "prompt_tokens": prompt_tokens,
                "tokens": plain.len(),
                "plain_tok_s": p_tok_s,
                "dflash_tok_s": s_tok_s,
                "speedup": s_tok_s / p_tok_s.max(1e-9),
                "mean_tau": s.mean_tau(),
                "acceptance_by_position": s.acceptance.rates(),
                "lossless": lossless,
                // Raw totals, so that slices of a sweep add up exactly.
                "plain_decode_s": plain_s,
                "dflash_tokens": st,
                "dflash_decode_s": s.decode_s,
                "steps": s.taus.len(),
                "tau_sum": s.taus.iter().sum::<usize>(),
                "accepted_by_position": s.acceptance.accepted,
                "tried_by_position": s.acceptance.tried,
            });
            o.extend(extra.as_object().cloned().unwrap_or_default());
        }
        self.rows.push(row);
    }

    fn mean_tau(&self) -> f64 {
        if self.taus.is_empty() {
            0.0
        } else {
            self.taus.iter().sum::<usize>() as f64 / self.taus.len() as f64
        }
    }

    /// The JSON of this block size over every prompt, beside the plain totals (tokens
    /// after the first, seconds).
    fn summary(
        &self,
        a: &BenchArgs,
        block: &str,
        (plain_tokens, plain_s): (usize, f64),
        load_s: f64,
    ) -> serde_json::Value {
        let plain_tok_s = plain_tokens as f64 / plain_s.max(1e-9);
        let dflash_tok_s = self.tokens as f64 / self.seconds.max(1e-9);
        serde_json::json!({
            "model": model_label(a),
            "drafter": a.drafter.as_ref().map(|d| d.display().to_string()),
            "block": block,
            "temperature": a.temperature,
            "top_p": a.top_p,
            "seed": a.seed,
            "rejection_sampling": a.rejection_sampling,
            "sampled_drafts": a.sampled_drafts,
            "max_new_tokens": a.max_new_tokens,
            "prompts": self.rows.len(),
            "plain_tok_s": plain_tok_s,
            "dflash_tok_s": dflash_tok_s,
            "speedup": dflash_tok_s / plain_tok_s.max(1e-9),
            "mean_tau": self.mean_tau(),
            "steps": self.taus.len(),
            "acceptance_by_position": self.acceptance.rates(),
            "plain_tokens": plain_tokens,
            "plain_decode_s": plain_s,
            "dflash_tokens": self.tokens,
            "dflash_decode_s": self.seconds,
            "accepted_by_position": self.acceptance.accepted,
            "tried_by_position": self.acceptance.tried,
            "skip": a.skip,
            "lossless": self.lossless,
            "load_s": load_s,
            "rows": self.rows,
        })
    }

    /// The one-line text summary.
    fn line(&self, device: &str, block: &str, (plain_tokens, plain_s): (usize, f64)) -> String {
        let plain_tok_s = plain_tokens as f64 / plain_s.max(1e-9);
        let dflash_tok_s = self.tokens as f64 / self.seconds.max(1e-9);
        format!(
            "{device} block {block}: plain {plain_tok_s:.2} tok/s, DFlash {dflash_tok_s:.2} tok/s ({:.2}x), mean tau {:.2}, lossless {}",
            dflash_tok_s / plain_tok_s.max(1e-9),
            self.mean_tau(),
            self.lossless
        )
    }
}

impl Default for BlockRun {
    fn default() -> Self {
        BlockRun {
            tokens: 0,
            seconds: 0.0,
            acceptance: Default::default(),
            taus: Vec::new(),
            lossless: true,
            rows: Vec::new(),
        }
    }
}
