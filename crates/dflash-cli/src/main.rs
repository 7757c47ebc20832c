//! `dflash`: generate text and benchmark, on the GPU engine (wgpu: Vulkan / Metal / DX12,
//! lavapipe without a GPU) or the CPU reference engine.

/// `println!` through a handle: a closed stdout (`dflash ... | head`) is a
/// `CliError::Stdout` the caller passes up with `?`, and `main` ends quietly on a broken
/// pipe, where `println!` would panic.
macro_rules! outln {
    () => {
        $crate::write_stdout(format_args!("\n"))
    };
    ($($arg:tt)*) => {
        $crate::write_stdout(format_args!("{}\n", format_args!($($arg)*)))
    };
}

mod bench;
mod device_args;
mod generate;
mod plan;
mod profile;
mod serve;

use clap::{Parser, Subcommand, ValueEnum};
use dflash_core::model_files::{load_path, LoadedModel};
use std::path::PathBuf;
use std::time::Instant;

#[derive(Parser)]
#[command(
    name = "dflash",
    version,
    about = "dflash-web: fast LLM decoding with DFlash speculative decoding"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Device {
    /// The WebGPU engine on a wgpu adapter (the default when one exists).
    Gpu,
    /// The quantized CPU engine: 4/8-bit weights, 8-bit activations, integer dot
    /// products with SIMD, output rows split across threads.
    Cpu,
    /// The plain-Rust f32 CPU reference engine (the oracle of the tests; slow).
    Reference,
}

impl Device {
    /// The CPU engine's kernels, or None for the GPU.
    pub fn cpu_kernels(self) -> Option<dflash_core::cpu::CpuKernels> {
        match self {
            Device::Gpu => None,
            Device::Cpu => Some(dflash_core::cpu::CpuKernels::Quantized),
            Device::Reference => Some(dflash_core::cpu::CpuKernels::Reference),
        }
    }
}

#[derive(Subcommand)]
enum Cmd {
    /// Generate text from a prompt or a chat message.
    Generate(generate::GenerateArgs),
    /// Measure prefill and decode speed and memory bandwidth on the GPU engine.
    Bench(bench::BenchArgs),
    /// The GPU memory a target and its drafter would take, from their config.json files.
    Plan(plan::PlanArgs),
    /// An OpenAI-compatible HTTP server (/v1/chat/completions, /v1/completions,
    /// /v1/models, /health) over one model and optional DFlash drafter.
    Serve(serve::ServeArgs),
    /// Print the token ids of a text (special tokens in the text are recognised).
    Tokenize {
        #[arg(long)]
        model: PathBuf,
        #[arg(long)]
        text: String,
    },
    /// List the GPU adapters wgpu finds.
    Adapters,
    /// Write a drafter with random weights for a target, in the z-lab format (for tests
    /// of losslessness: its drafts are rarely accepted).
    MakeRandomDrafter {
        #[arg(long)]
        model: PathBuf,
        #[arg(long)]
        out: PathBuf,
        #[arg(long, default_value_t = 2)]
        layers: usize,
        #[arg(long, default_value_t = 16)]
        block: usize,
        /// Default: the last id of the vocabulary.
        #[arg(long)]
        mask_token_id: Option<u32>,
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// A DFlash2 drafter (convolutions kernel 2, groups of 16, selector rank 64, top-16).
        #[arg(long)]
        dflash2: bool,
    },
}

#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error(transparent)]
    Core(#[from] dflash_core::Error),
    #[error(transparent)]
    Gpu(#[from] dflash_gpu::GpuError),
    #[error("{0}")]
    Usage(String),
    #[error("writing to stdout: {0}")]
    Stdout(#[source] std::io::Error),
}

/// Writes to stdout through a locked handle, returning the error `print!` would panic on.
pub fn write_stdout(args: std::fmt::Arguments) -> Result<(), CliError> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    out.write_fmt(args)
        .and_then(|()| out.flush())
        .map_err(CliError::Stdout)
}

/// Whether an error is stdout closed by its reader: the end of the output, not a failure.
pub fn is_broken_pipe(e: &std::io::Error) -> bool {
    e.kind() == std::io::ErrorKind::BrokenPipe
}

fn main() {
    dflash_core::keep_freed_memory();
    let cli = Cli::parse();
    // A forced CPU kernel this host lacks (DFLASH_CPU_KERNEL) is a usage error up front.
    let forced = dflash_core::cpu::quant_matmul::Kernel::requested().map_err(CliError::Usage);
    let result = forced.and_then(|_| match cli.cmd {
        Cmd::Generate(a) => generate::run(a),
        Cmd::Bench(a) => bench::run(a),
        Cmd::Plan(a) => plan::run(a),
        Cmd::Serve(a) => serve::run(a),
        Cmd::Tokenize { model, text } => tokenize(&model, &text),
        Cmd::Adapters => adapters(),
        Cmd::MakeRandomDrafter {
            model,
            out,
            layers,
            block,
            mask_token_id,
            seed,
            dflash2,
        } => make_random_drafter(&model, &out, layers, block, mask_token_id, seed, dflash2),
    });
    match result {
        Ok(()) => {}
        Err(CliError::Stdout(e)) if is_broken_pipe(&e) => {}
        Err(e) => {
            use std::io::Write;
            // Not eprintln!: a closed stderr must not turn the error into a panic.
            let _ = writeln!(std::io::stderr(), "error: {e}");
            std::process::exit(1);
        }
    }
}

pub fn load(path: &std::path::Path) -> Result<(LoadedModel, f64), CliError> {
    let t = Instant::now();
    let m = load_path(path)?;
    for n in &m.notes {
        eprintln!("note: {n}");
    }
    Ok((m, t.elapsed().as_secs_f64()))
}

fn tokenize(model: &std::path::Path, text: &str) -> Result<(), CliError> {
    let (m, _) = load(model)?;
    let ids = m.tokenizer.encode(text, true)?;
    outln!("{}", serde_json::to_string(&ids).unwrap())?;
    Ok(())
}

fn adapters() -> Result<(), CliError> {
    let instance =
        wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle_from_env());
    for a in pollster::block_on(instance.enumerate_adapters(wgpu::Backends::all())) {
        let i = a.get_info();
        outln!(
            "{} ({:?}, {:?}, {})",
            i.name,
            i.backend,
            i.device_type,
            i.driver
        )?;
    }
    Ok(())
}

fn make_random_drafter(
    model: &std::path::Path,
    out: &std::path::Path,
    layers: usize,
    block: usize,
    mask: Option<u32>,
    seed: u64,
    dflash2: bool,
) -> Result<(), CliError> {
    use dflash_core::drafter::random::{
        write_dflash2_drafter, write_dir, write_drafter, DFlash2Spec, DrafterSpec,
    };
    use dflash_core::limits::{MAX_BLOCK_SIZE, MAX_LAYERS};
    let usage = |m: String| Err(CliError::Usage(m));
    if !(1..=MAX_LAYERS as usize).contains(&layers) {
        return usage(format!("--layers takes 1 to {MAX_LAYERS}, not {layers}"));
    }
    if !(1..=MAX_BLOCK_SIZE as usize).contains(&block) {
        return usage(format!("--block takes 1 to {MAX_BLOCK_SIZE}, not {block}"));
    }
    let (m, _) = load(model)?;
    let c = m.config();
    if let Some(id) = mask.filter(|&id| id as usize >= c.vocab_size) {
        let v = c.vocab_size;
        return usage(format!(
            "--mask-token-id {id} is past the vocabulary of {v}"
        ));
    }
    let spec = DrafterSpec {
        layers,
        block_size: block,
        target_layer_ids: None,
        block_in_dflash_config: true,
        layer_types: None,
        sliding_window: 0,
        mask_token_id: mask.unwrap_or(c.vocab_size as u32 - 1),
        seed,
    };
    let needs = spec.write_bytes(c, dflash2.then_some(64));
    if let Some(have) = bench::mem_available().filter(|&have| needs > have) {
        let gb = |b: u64| b as f64 / 1e9;
        return usage(format!(
            "writing this drafter takes about {:.1} GB, over the {:.1} GB this machine has available (fewer --layers)",
            gb(needs),
            gb(have)
        ));
    }
    let files = if dflash2 {
        let d = DFlash2Spec::new(2, 16, 64, 16);
        write_dflash2_drafter(c, &spec, &d)
    } else {
        write_drafter(c, &spec)
    };
    write_dir(out, &files).map_err(|e| dflash_core::Error::Io {
        path: out.display().to_string(),
        source: e,
    })?;
    outln!("{}", out.display())?;
    Ok(())
}
