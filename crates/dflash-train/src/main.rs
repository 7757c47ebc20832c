use clap::{Parser, Subcommand};
use dflash_train::data::{distill, DataOptions};
use dflash_train::prompts;
use dflash_train::target::Target;
use dflash_train::TrainError;
use std::path::PathBuf;

#[derive(Parser)]
#[command(
    name = "dflash-train",
    about = "Train DFlash drafters for dflash-web targets"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Build prompts and have the target answer them (self-distillation); resumable.
    Data(DataArgs),
    /// Train (or resume) a drafter on self-distilled data.
    Train(TrainArgs),
    /// Write a run's drafter in the z-lab format (config.json + bf16 safetensors).
    Export(ExportArgs),
    /// Mean tau and per-position acceptance on a prompt file, through the engine's loop.
    Eval(EvalArgs),
    /// A drafter's draft vocabulary (draft_vocab.json): the ids the target writes most
    /// in the data's responses, which its greedy drafts are then chosen among.
    DraftVocab(DraftVocabArgs),
    /// Complete an exported drafter folder for vLLM, SGLang and llama.cpp from its target:
    /// the mask token's text, `n_predict`, and the draft vocabulary's `d2t` form
    /// (draft_vocab.safetensors) where the folder has a draft_vocab.json.
    ServingFiles(ServingFilesArgs),
}

#[derive(clap::Args)]
struct ServingFilesArgs {
    /// An exported drafter folder (changed in place).
    #[arg(long)]
    drafter: PathBuf,
    /// Its target: a .gguf file or a Hugging Face folder (a folder gives the head's rows
    /// in the precision those servers load).
    #[arg(long)]
    model: PathBuf,
    /// Also write the draft vocabulary in its `d2t` form (draft_vocab.safetensors, the
    /// head's rows in bf16: 2 x hidden bytes per id) for vLLM.
    #[arg(long)]
    d2t: bool,
}

#[derive(clap::Args)]
struct DraftVocabArgs {
    /// The target: a .gguf file or a Hugging Face folder.
    #[arg(long)]
    model: PathBuf,
    /// JSON lines written by `data`.
    #[arg(long)]
    data: PathBuf,
    /// Ids in the list.
    #[arg(long, default_value_t = 8192)]
    size: usize,
    /// The file to write (a drafter folder's draft_vocab.json).
    #[arg(long)]
    out: PathBuf,
}

#[derive(clap::Args)]
struct TrainArgs {
    #[arg(long)]
    model: PathBuf,
    /// JSON lines written by `data`.
    #[arg(long)]
    data: PathBuf,
    /// Run directory: drafter config, checkpoint, log (resumed when present).
    #[arg(long)]
    out: PathBuf,
    #[arg(long, default_value_t = 3)]
    layers: usize,
    #[arg(long, default_value_t = 16)]
    block: usize,
    /// Loss decay along the block (default: 7 at B=16, 5 at B=10..15, 4 below).
    #[arg(long)]
    gamma: Option<f64>,
    #[arg(long, default_value_t = 6e-4)]
    lr: f64,
    #[arg(long, default_value_t = 0.04)]
    warmup: f64,
    #[arg(long, default_value_t = 0.01)]
    weight_decay: f64,
    /// Optimizer steps in the whole run (a resumed run continues to this step).
    #[arg(long, default_value_t = 1000)]
    steps: usize,
    /// Stop (checkpointed) after this step; the learning-rate schedule still spans
    /// --steps (to reproduce a run that was resumed with another --steps).
    #[arg(long)]
    stop_at: Option<usize>,
    #[arg(long, default_value_t = 4)]
    seqs_per_step: usize,
    #[arg(long, default_value_t = 32)]
    anchors: usize,
    #[arg(long, default_value_t = 768)]
    max_seq_len: usize,
    #[arg(long, default_value_t = 25)]
    checkpoint_every: usize,
    /// Mask token id (default: an unused special token of the target's vocabulary).
    #[arg(long)]
    mask_token: Option<u32>,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Hold out the last N samples (not trained on).
    #[arg(long, default_value_t = 0)]
    holdout: usize,
    /// Start a new run's layers from the target's top layers instead of random ones.
    #[arg(long, conflicts_with = "init_from")]
    init_from_target: bool,
    /// Start a new run from an exported drafter (same layers, taps and mask token): to
    /// train on, or to grow a DFlash drafter into a DFlash2 one (`--arch dflash2`).
    #[arg(long)]
    init_from: Option<PathBuf>,
    /// `dflash` (DFlashDraftModel) or `dflash2` (DFlash2DraftModel: grouped dynamic
    /// convolutions and the candidate selector).
    #[arg(long, default_value = "dflash")]
    arch: String,
    /// DFlash2: causal taps of each dynamic convolution.
    #[arg(long, default_value_t = 2)]
    conv_kernel_size: usize,
    /// DFlash2: channels sharing one kernel delta.
    #[arg(long, default_value_t = 16)]
    conv_group_size: usize,
    /// DFlash2: rank of the selector's codebooks (each `[vocab, rank]`).
    #[arg(long, default_value_t = 256)]
    selector_rank: usize,
    /// DFlash2: candidates per slot.
    #[arg(long, default_value_t = 16)]
    selector_top_k: usize,
    /// `cpu`, or `cuda` (a build with `--features cuda`).
    #[arg(long, default_value = "cpu")]
    device: String,
    /// Sample the loss's softmax: the tokens of the data's responses plus this many
    /// random vocabulary ids each step, instead of the whole vocabulary.
    #[arg(long)]
    sampled_head: Option<usize>,
    /// With --sampled-head: every Nth step runs over the whole vocabulary (0: never).
    #[arg(long, default_value_t = 8, requires = "sampled_head")]
    full_head_every: usize,
    /// On CUDA, the drafter's f32 matrix products (its layers, the head over the
    /// vocabulary and their gradients) run on TF32 tensor cores; the target's taps stay
    /// full f32. No effect on the CPU.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    tf32: bool,
}

#[derive(clap::Args)]
struct ExportArgs {
    /// Run directory of `train`.
    #[arg(long)]
    run: PathBuf,
    #[arg(long)]
    out: PathBuf,
}

#[derive(clap::Args)]
struct EvalArgs {
    #[arg(long)]
    model: PathBuf,
    /// An exported drafter folder.
    #[arg(long)]
    drafter: PathBuf,
    /// JSON lines with `chat` or `prompt` (and optional `id`).
    #[arg(long, required_unless_present = "samples", conflicts_with = "samples")]
    prompts: Option<PathBuf>,
    /// Instead of --prompts: the prompts (token ids as they are) of samples written by
    /// `data`, e.g. a run's held-out ones (with --last).
    #[arg(long)]
    samples: Option<PathBuf>,
    /// With --samples: only the last N samples (`train --holdout N` holds these out).
    #[arg(long, requires = "samples")]
    last: Option<usize>,
    #[arg(long, default_value_t = 16)]
    block: usize,
    #[arg(long, default_value_t = 64)]
    max_new_tokens: usize,
    /// Only the first N prompts.
    #[arg(long)]
    limit: Option<usize>,
    /// Also decode plainly and check the outputs are equal.
    #[arg(long)]
    check_plain: bool,
    /// Write the JSON report here too.
    #[arg(long)]
    json_out: Option<PathBuf>,
}

#[derive(clap::Args)]
struct DataArgs {
    /// The target: a .gguf file or a Hugging Face folder.
    #[arg(long)]
    model: PathBuf,
    /// Output JSON lines (appended; prompts already there are skipped).
    #[arg(long)]
    out: PathBuf,
    /// How many prompts to answer (the deterministic mix's first N).
    #[arg(long, default_value_t = 1000)]
    prompts: usize,
    #[arg(long, default_value_t = 192)]
    max_new_tokens: usize,
    #[arg(long, default_value_t = 384)]
    max_prompt_tokens: usize,
    /// Prompts answered together.
    #[arg(long, default_value_t = 16)]
    batch: usize,
    /// Python standard library to take coding prompts from (default: python3's).
    #[arg(long)]
    stdlib: Option<PathBuf>,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// The prompt mix: `code` (mostly coding, the committed drafter's), `general`
    /// (explanations, role-play, reasoning and rewriting besides code) or `self` (the
    /// target writes each prompt itself: its chat template's user turn sampled at
    /// temperature 1, top-p 0.95, seeded by --seed and the prompt's index) or
    /// `self-code` (the same after a system message about Python programming).
    #[arg(long, value_enum, default_value_t = prompts::Mix::Code)]
    mix: prompts::Mix,
    /// What answers: `cpu`, the quantized CPU engine (default; --batch is ignored), or
    /// `candle`, candle's f32 target with --batch prompts together.
    #[arg(long, default_value = "cpu")]
    engine: String,
    /// Where `--engine candle` runs: `cpu`, or `cuda` (a build with `--features cuda`).
    #[arg(long, default_value = "cpu")]
    device: String,
}

/// The candle device named by `--device`.
fn candle_device(name: &str) -> Result<candle_core::Device, TrainError> {
    match name {
        "cpu" => Ok(candle_core::Device::Cpu),
        "cuda" => Ok(candle_core::Device::new_cuda(0)?),
        other => Err(TrainError::Usage(format!("--device {other}: cpu or cuda"))),
    }
}

fn bar(len: u64, what: &str) -> indicatif::ProgressBar {
    let b = indicatif::ProgressBar::new(len);
    b.set_style(
        indicatif::ProgressStyle::with_template(&format!(
            "{what} {{bar:30}} {{pos}}/{{len}} {{elapsed}} eta {{eta}} {{msg}}"
        ))
        .expect("template"),
    );
    b
}

fn run_data(a: DataArgs) -> Result<(), TrainError> {
    use dflash_core::cpu::{CpuKernels, CpuModel};
    let model = dflash_core::model_files::load_path(&a.model)?;
    // The quantized CPU engine answers (`--engine cpu`) and writes the self mix's queries.
    let cpu = (a.engine == "cpu" || a.mix.self_written().is_some())
        .then(|| CpuModel::with_kernels(&model.weights, CpuKernels::Quantized));
    let candle;
    let target: &dyn dflash_train::data::Answerer = match (a.engine.as_str(), &cpu) {
        ("cpu", Some(cpu)) => cpu,
        ("candle", _) => {
            candle = Target::new(&model.weights, &candle_device(&a.device)?)?;
            &candle
        }
        (other, _) => {
            return Err(TrainError::Usage(format!(
                "--engine {other}: cpu or candle"
            )))
        }
    };
    let opts = DataOptions {
        batch: a.batch,
        max_new_tokens: a.max_new_tokens,
        max_prompt_tokens: a.max_prompt_tokens,
    };
    let b = bar(a.prompts as u64, "distill");
    let n = match (&cpu, a.mix.self_written()) {
        (Some(cpu), Some(topic)) => {
            let queries = dflash_train::self_prompts::QueryOptions {
                topic,
                max_tokens: topic.query_tokens(),
                prompts: a.prompts as u64,
                seed: a.seed,
                ..Default::default()
            };
            dflash_train::self_prompts::distill_self_written(
                &model, cpu, target, &a.out, &opts, &queries, &b,
            )?
        }
        _ => {
            let stdlib = a.stdlib.clone().or_else(prompts::find_stdlib);
            let mut all = prompts::build_mix(stdlib.as_deref(), a.seed, a.mix);
            all.truncate(a.prompts);
            distill(&model, target, &all, &a.out, &opts, &b)?
        }
    };
    b.finish();
    eprintln!("{n} new samples in {}", a.out.display());
    Ok(())
}

/// Training steps a run may ask for (the published drafters train for ~10^5).
const MAX_STEPS: usize = 10_000_000;
/// The longest sample a run trains on (its tables grow with it).
const MAX_SEQ_LEN: usize = 1 << 17;

/// The sizes a run asks for, bounded before anything is allocated; `vocab`: the target's.
fn check_train_sizes(a: &TrainArgs, vocab: usize) -> Result<(), TrainError> {
    let over = |flag: &str, v: usize, max: usize| {
        Err(TrainError::Usage(format!(
            "{flag} takes at most {max}, not {v}"
        )))
    };
    if a.steps > MAX_STEPS {
        return over("--steps", a.steps, MAX_STEPS);
    }
    if a.max_seq_len > MAX_SEQ_LEN {
        return over("--max-seq-len", a.max_seq_len, MAX_SEQ_LEN);
    }
    match a.sampled_head {
        Some(n) if n > vocab => over("--sampled-head (negatives)", n, vocab),
        _ => Ok(()),
    }
}

fn run_train(a: TrainArgs) -> Result<(), TrainError> {
    let model = dflash_core::model_files::load_path(&a.model)?;
    check_train_sizes(&a, model.config().vocab_size)?;
    let mut samples = dflash_train::data::read_samples(&a.data)?;
    if a.holdout >= samples.len() {
        return Err(TrainError::Usage(format!(
            "--holdout {} leaves no training sample of {}",
            a.holdout,
            samples.len()
        )));
    }
    samples.truncate(samples.len() - a.holdout);
    let mask = a.mask_token.unwrap_or_else(|| {
        dflash_train::train::pick_mask_token(&model.tokenizer, model.config().vocab_size)
    });
    let tc = dflash_train::train::TrainConfig {
        layers: a.layers,
        block_size: a.block,
        gamma: a
            .gamma
            .unwrap_or_else(|| dflash_train::train::default_gamma(a.block)),
        lr: a.lr,
        warmup_frac: a.warmup,
        weight_decay: a.weight_decay,
        steps: a.steps,
        seqs_per_step: a.seqs_per_step,
        anchors_per_seq: a.anchors,
        max_seq_len: a.max_seq_len,
        checkpoint_every: a.checkpoint_every.max(1),
        mask_token_id: mask,
        seed: a.seed,
        grad_clip: 1.0,
        dflash2: match a.arch.as_str() {
            "dflash" => None,
            "dflash2" => Some(dflash_core::drafter::DFlash2Config {
                conv_kernel_size: a.conv_kernel_size,
                conv_group_size: a.conv_group_size,
                selector_rank: a.selector_rank,
                selector_top_k: a.selector_top_k,
            }),
            other => {
                return Err(TrainError::Usage(format!(
                    "--arch {other}: dflash or dflash2"
                )))
            }
        },
        sampled_head: a
            .sampled_head
            .map(|negatives| dflash_train::train::SampledHead {
                negatives,
                full_every: a.full_head_every,
            }),
        stop_at: a.stop_at,
    };
    eprintln!(
        "{} samples, {} tokens; mask token {mask}",
        samples.len(),
        samples
            .iter()
            .map(|s| s.prompt_ids.len() + s.response_ids.len())
            .sum::<usize>()
    );
    let target = Target::new(&model.weights, &candle_device(&a.device)?)?;
    candle_core::cuda::set_gemm_reduced_precision_f32(a.tf32);
    use dflash_train::train::Init;
    let init = match (&a.init_from, a.init_from_target) {
        (Some(d), _) => Init::Drafter(d),
        (None, true) => Init::Target(&model.weights),
        (None, false) => Init::Random,
    };
    let s = dflash_train::train::train(&target, &samples, &a.out, &tc, init, false)?;
    println!("{}", serde_json::to_string(&s).expect("json"));
    Ok(())
}

fn run_export(a: ExportArgs) -> Result<(), TrainError> {
    dflash_train::export::export(&a.run, &a.out)?;
    eprintln!("wrote {}", a.out.display());
    Ok(())
}

fn run_serving_files(a: ServingFilesArgs) -> Result<(), TrainError> {
    let target = dflash_core::model_files::load_path(&a.model)?;
    let n = dflash_train::export::serving_files(&a.drafter, &target, a.d2t)?;
    eprintln!(
        "completed {} (draft vocabulary in d2t form: {n} ids)",
        a.drafter.display()
    );
    Ok(())
}

fn run_eval(a: EvalArgs) -> Result<(), TrainError> {
    use dflash_core::drafter::{load_drafter_dir, CpuDrafter, DrafterPrecision};
    let model = dflash_core::model_files::load_path(&a.model)?;
    // The drafter's evaluation tables are of its 8-bit matrices, nearest the trained
    // values (the engines keep 4 bits by default, ~1% of tau below).
    let dw = load_drafter_dir(&a.drafter, DrafterPrecision::Q8)?;
    dw.config.validate_against(model.config())?;
    let target = dflash_core::cpu::CpuModel::new(&model.weights);
    let drafter = CpuDrafter::new(&dw);
    let mut prompts = match (&a.prompts, &a.samples) {
        (Some(p), _) => dflash_train::eval::read_prompts(p, &model)?,
        (None, Some(s)) => dflash_train::eval::sample_prompts(s, a.last)?,
        (None, None) => return Err(TrainError::Usage("--prompts or --samples".into())),
    };
    if let Some(n) = a.limit {
        prompts.truncate(n);
    }
    let b = bar(prompts.len() as u64, "eval");
    let rep = dflash_train::eval::evaluate(
        &model,
        &target,
        &drafter,
        &prompts,
        a.block.min(dw.config.block_size),
        a.max_new_tokens,
        a.check_plain,
        |r| {
            b.inc(1);
            b.set_message(format!("{} tau {:.2}", r.id, r.tau));
        },
    )?;
    b.finish();
    let text = serde_json::to_string_pretty(&rep).expect("json");
    if let Some(p) = &a.json_out {
        std::fs::write(p, &text).map_err(|e| TrainError::Io(e.to_string()))?;
    }
    println!("{text}");
    if a.check_plain && rep.rows.iter().any(|r| r.lossless == Some(false)) {
        return Err(TrainError::Data(
            "speculative output differs from plain decoding".into(),
        ));
    }
    Ok(())
}

fn run_draft_vocab(a: DraftVocabArgs) -> Result<(), TrainError> {
    let model = dflash_core::model_files::load_path(&a.model)?;
    let samples = dflash_train::data::read_samples(&a.data)?;
    let vocab = model.config().vocab_size;
    let stops: Vec<u32> = (0..vocab as u32)
        .filter(|&t| model.tokenizer.is_stop(t))
        .collect();
    let v = dflash_train::data::draft_vocab(&samples, vocab, a.size, &stops)?;
    let responses: usize = samples.iter().map(|s| s.response_ids.len()).sum();
    let covered: usize = samples
        .iter()
        .flat_map(|s| &s.response_ids)
        .filter(|t| v.ids().binary_search(t).is_ok())
        .count();
    let source = format!(
        "dflash-train draft-vocab --size {}: the ids the target wrote most in {} ({} samples, {} response tokens, {:.4} of them in the list), its stop tokens",
        a.size,
        a.data.file_name().unwrap_or_default().to_string_lossy(),
        samples.len(),
        responses,
        covered as f64 / responses.max(1) as f64
    );
    std::fs::write(&a.out, v.to_json(vocab, &source))
        .map_err(|e| TrainError::Io(format!("{}: {e}", a.out.display())))?;
    eprintln!("{}: {source}", a.out.display());
    Ok(())
}

fn main() {
    // Training allocates and frees logits tensors of hundreds of MB per step.
    dflash_core::keep_freed_memory();
    let cli = Cli::parse();
    let r = match cli.cmd {
        Cmd::Data(a) => run_data(a),
        Cmd::Train(a) => run_train(a),
        Cmd::Export(a) => run_export(a),
        Cmd::Eval(a) => run_eval(a),
        Cmd::DraftVocab(a) => run_draft_vocab(a),
        Cmd::ServingFiles(a) => run_serving_files(a),
    };
    if let Err(e) = r {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}
