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
mod cpu_dflash;
mod cpu_synthetic;
mod dflash;
mod plain;
mod report;

use dflash::*;
use plain::*;
use report::*;

use crate::{load, CliError, Device};
use dflash_core::config::ModelConfig;
use dflash_core::drafter::{load_drafter_dir, DrafterPrecision, DrafterWeights};
use dflash_core::generate::GenerateRequest;
use dflash_core::model_files::LoadedModel;
use dflash_core::rng::Rng;
use dflash_core::sampling::SamplingParams;
use dflash_core::speculative::AcceptProfile;
use dflash_core::speculative::{Acceptance, BlockSize, SpeculativeResult};
use dflash_core::synthetic::random_ids;
use dflash_core::synthetic::SyntheticSpec;
use dflash_engine::device::{open_device, DeviceChoice};
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
    /// made on the device (with --device cpu: in host memory) (smollm2-135m, qwen3-0.6b,
    /// qwen3-4b, qwen3-8b, llama-3.1-8b, qwen2.5-32b; test-tiny). No tokenizer: prompts
    /// are random token ids.
    #[arg(long)]
    synthetic: Option<String>,
    /// With --synthetic: only the shape's first N layers (per-layer costs, such as a
    /// verify pass against one row, of a model too large for the device).
    #[arg(long, requires = "synthetic")]
    synthetic_layers: Option<usize>,
    /// With --synthetic and --drafter synthetic: the random drafter drafts among the
    /// first N token ids (what a draft vocabulary of N ids costs; JSON
    /// `synthetic_draft_vocab`).
    #[arg(long, requires = "synthetic")]
    synthetic_draft_vocab: Option<usize>,
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
    /// gpu, cpu (the quantized CPU engine) or reference (the f32 oracle). Default: the
    /// GPU on a hardware adapter (or where a GPU-only option asks for it), else the CPU
    /// engine, with a note (a software adapter such as lavapipe only with `gpu`).
    #[arg(long, value_enum)]
    device: Option<Device>,
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
    /// How a drafter folder's (or a synthetic drafter's) matrices are kept on the device:
    /// `q4` (4-bit groups, the default) or `q8` (nearly twice the bytes a step reads; its
    /// drafts may differ).
    #[arg(long, value_enum, default_value = "q4", requires = "drafter")]
    drafter_precision: crate::generate::DrafterPrecisionArg,
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
    /// Decode every prompt this many times, plainly and with each block (rows per prompt
    /// and round; the ratios are of the summed times): the first round decodes plainly
    /// first, odd rounds run DFlash first, so that a slow spell of a busy machine weighs
    /// on both sides.
    #[arg(long, default_value_t = 1, requires = "drafter", conflicts_with = "turns",
          value_parser = clap::value_parser!(u16).range(1..=100))]
    rounds: u16,
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
    /// With --profile: the rows of the profiled block step (the DFlash step of that block
    /// size with --drafter, else the target's pass of that many rows), 1..=16.
    #[arg(long, default_value_t = 16, requires = "profile",
          value_parser = clap::value_parser!(u16).range(1..=16))]
    profile_block: u16,
    /// The kernel knobs: this adapter's own (default), or those of a GPU, of an Intel
    /// Xe2 GPU or of a CPU adapter (to run the GPU plan on lavapipe, or the CPU plan on a
    /// GPU).
    #[arg(long, value_enum)]
    tuning: Option<TuningChoice>,
    /// Output rows per GEMV thread (1, 2, 4 or 8) for every matrix shape, in place of the
    /// tuning table's (to measure the choice on this adapter).
    #[arg(long, value_parser = gemv_outputs)]
    gemv_outputs: Option<usize>,
    /// Decoding (plain and DFlash) with the next step submitted before the previous one
    /// is read (`true`) or one step at a time (`false`), in place of the tuning's choice
    /// (GPUs pipeline, CPU adapters do not).
    #[arg(long)]
    pipelined: Option<bool>,
    /// RMSNorm fused into the GEMV that follows it (`true`) or a kernel of its own
    /// (`false`), in place of the tuning's choice (GPUs fuse, CPU adapters do not).
    #[arg(long)]
    fuse_norm: Option<bool>,
    /// RMSNorm split between the residual GEMV before it (x * weight and partial sums
    /// of squares in its epilogue) and the GEMVs after it (1/rms from those sums, applied
    /// at the end) where a residual GEMV precedes the norm (`true`), or not (`false`), in
    /// place of the tuning's choice.
    #[arg(long)]
    norm_in_residual: Option<bool>,
    /// Every GEMV over a q4 / q8 matrix on activations quantized to 8 bits per group with
    /// packed integer dot products (`true`: the CPU engine's arithmetic; an error where
    /// the adapter's WGSL has no packed_4x8_integer_dot_product) or on f32 activations
    /// (`false`), in place of the tuning's choice (f32 everywhere until measured).
    #[arg(long)]
    int8_activations: Option<bool>,
    /// Greedy drafts among the drafter's draft vocabulary (`draft_vocab.json`, where its
    /// folder has one: a few thousand rows of the lm_head instead of all), or `false`:
    /// among the whole vocabulary (the JSON's `draft_vocab`; `draft_head_ids`: the ids
    /// drafts were chosen among, null for the whole head).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    draft_vocab: bool,
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
pub(crate) fn mem_available() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
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
            "formats": format!(
                "q{}/32 (a bf16 checkpoint as the bench loads it)",
                s.drafter_format.bits()
            ),
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
    let synthetic = synthetic_spec(&a)?;
    check_synthetic_usage(&a, synthetic.is_some())?;
    if let (Some(p), Some(s)) = (&profile, &synthetic) {
        check_profile_len(p, s.drafter.block_size)?;
    }
    let a = BenchArgs {
        device: Some(resolve_device(&a)),
        ..a
    };
    if let Some(turns) = a.turns {
        return conversation::run(a, turns);
    }
    if let Some(kernels) = a.device().cpu_kernels() {
        return cpu::run(a, kernels, synthetic.as_ref(), profile.as_ref());
    }
    if a.drafter.is_some() {
        return run_dflash(a, synthetic, profile);
    }
    run_plain(a, synthetic)
}

impl BenchArgs {
    /// The device (after `resolve_device`).
    fn device(&self) -> Device {
        self.device.unwrap_or(Device::Gpu)
    }

    /// The options only the GPU bench has, each with whether it was given.
    fn gpu_only_options(&self) -> [(bool, &'static str); 8] {
        [
            (self.profile, "--profile"),
            (self.tuning.is_some(), "--tuning"),
            (self.pipelined.is_some(), "--pipelined"),
            (self.fuse_norm.is_some(), "--fuse-norm"),
            (self.norm_in_residual.is_some(), "--norm-in-residual"),
            (self.int8_activations.is_some(), "--int8-activations"),
            (self.adapter.is_some(), "--adapter"),
            (self.turns.is_some(), "--turns"),
        ]
    }
}

/// `--device`, or without it what `generate` and `serve` choose: the GPU where a GPU-only
/// option asks for it or the adapter is a hardware one, else the quantized CPU engine,
/// with a note on stderr saying why.
fn resolve_device(a: &BenchArgs) -> Device {
    if let Some(d) = a.device {
        return d;
    }
    if a.gpu_only_options().iter().any(|(given, _)| *given) {
        return Device::Gpu;
    }
    let note = &mut |n: &str| eprintln!("note: {n}");
    match open_device(DeviceChoice::Auto, &dflash_gpu::GpuOptions::default(), note) {
        Ok(Some(_)) => Device::Gpu,
        _ => Device::Cpu,
    }
}

/// The `--synthetic` shape asked for, with its layer count and draft vocabulary.
fn synthetic_spec(a: &BenchArgs) -> Result<Option<SyntheticSpec>, CliError> {
    let synthetic = match &a.synthetic {
        Some(n) => Some(dflash_core::synthetic::spec(n).ok_or_else(|| {
            CliError::Usage(format!(
                "--synthetic: unknown shape {n:?} (known: {})",
                dflash_core::synthetic::NAMES.join(", ")
            ))
        })?),
        None => None,
    };
    let synthetic = match (synthetic, a.synthetic_layers) {
        (Some(s), Some(n)) => Some(s.first_layers(n).ok_or_else(|| {
            CliError::Usage(format!(
                "--synthetic-layers {n}: the shape has {} layers",
                s.config.num_layers
            ))
        })?),
        (s, _) => s,
    };
    let synthetic = match (synthetic, a.synthetic_draft_vocab) {
        (Some(s), Some(n)) if n == 0 || n > s.config.vocab_size => {
            return Err(CliError::Usage(format!(
                "--synthetic-draft-vocab {n}: 1..={} (the model's vocabulary)",
                s.config.vocab_size
            )))
        }
        (Some(s), n) => Some(SyntheticSpec {
            draft_vocab: n,
            drafter_format: DrafterPrecision::from(a.drafter_precision).matrix_format(),
            ..s
        }),
        (None, _) => None,
    };
    Ok(synthetic)
}

/// `--prompts` and `--drafter` as `--synthetic` (or its absence) allows them.
fn check_synthetic_usage(a: &BenchArgs, synthetic: bool) -> Result<(), CliError> {
    if synthetic {
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
    Ok(())
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

/// The --drafter folder, without its draft vocabulary when --draft-vocab false.
fn load_bench_drafter(a: &BenchArgs) -> Result<DrafterWeights, CliError> {
    let dir = a.drafter.as_ref().expect("a DFlash bench has --drafter");
    let mut w = load_drafter_dir(dir, a.drafter_precision.into())?;
    if !a.draft_vocab {
        w.draft_vocab = None;
    }
    Ok(w)
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

/// `--gemv-outputs`: 1, 2, 4 or 8.
fn gemv_outputs(s: &str) -> Result<usize, String> {
    match s.parse() {
        Ok(n @ (1 | 2 | 4 | 8)) => Ok(n),
        _ => Err(format!("{s}: 1, 2, 4 or 8 output rows per thread")),
    }
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
        gemv_outputs: a.gemv_outputs,
        pipelined_decode: a.pipelined,
        fuse_norm: a.fuse_norm,
        norm_in_residual: a.norm_in_residual,
        int8_activations: a.int8_activations,
        ..Default::default()
    }
}

/// A prompt of `n` real tokens: a paragraph of English repeated.
fn bench_prompt(m: &dflash_core::model_files::LoadedModel, n: usize) -> Result<Vec<u32>, CliError> {
    let text = "The history of computing is a story of machines that learned to remember, to calculate and finally to speak. ";
    let one = m.tokenizer.encode(text, true)?;
    Ok(one.iter().cycle().take(n).copied().collect())
}

/// The sampler's head for `sampling`.
fn head_of(sampling: &SamplingParams) -> OutputHead {
    if sampling.is_greedy() {
        OutputHead::Argmax
    } else {
        OutputHead::Sample
    }
}
