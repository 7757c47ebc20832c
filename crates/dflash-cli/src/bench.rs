//! `dflash bench`: prefill and decode speed on the GPU engine, the bandwidth the decode
//! GEMV reaches, and in the same run the bandwidth of a plain copy kernel on the same
//! adapter (the roofline), with the ratio between them.

use crate::generate::open_device;
use crate::{load, CliError, Device};
use dflash_gpu::{GpuModel, GpuModelOptions};
use std::path::PathBuf;
use std::time::Instant;

#[derive(clap::Args)]
pub struct BenchArgs {
    /// A .gguf file or a Hugging Face model folder.
    #[arg(long)]
    model: PathBuf,
    /// Prompt length for the prefill measurement.
    #[arg(long, default_value_t = 128)]
    prompt_tokens: usize,
    /// Tokens to decode for the decode measurement.
    #[arg(long, default_value_t = 32)]
    decode_tokens: usize,
    /// Repetitions of the GEMV and copy kernels per timed submission.
    #[arg(long, default_value_t = 4)]
    reps: usize,
    /// Choose the GPU adapter whose name contains this.
    #[arg(long)]
    adapter: Option<String>,
    /// Keep the KV cache in f32 even where the adapter has shader-f16.
    #[arg(long)]
    no_f16: bool,
    #[arg(long)]
    json: bool,
}

/// A prompt of `n` real tokens: a paragraph of English repeated.
fn bench_prompt(m: &dflash_core::model_files::LoadedModel, n: usize) -> Result<Vec<u32>, CliError> {
    let text = "The history of computing is a story of machines that learned to remember, to calculate and finally to speak. ";
    let one = m.tokenizer.encode(text, true)?;
    Ok(one.iter().cycle().take(n).copied().collect())
}

pub fn run(a: BenchArgs) -> Result<(), CliError> {
    let t_load = Instant::now();
    let (m, _) = load(&a.model)?;
    let ctx = open_device(Some(Device::Gpu), &a.adapter, a.no_f16)?.expect("gpu");
    let context = (a.prompt_tokens + a.decode_tokens + 16).min(m.config().max_position_embeddings);
    let mut g = GpuModel::new(ctx.clone(), &m.weights, &GpuModelOptions { context, ..Default::default() })?;
    // Compile the plans before timing.
    g.prefill(&bench_prompt(&m, 17)?)?;
    let load_s = t_load.elapsed().as_secs_f64();
    let prompt = bench_prompt(&m, a.prompt_tokens)?;
    g.truncate(0);
    let t0 = Instant::now();
    let mut next = g.prefill(&prompt)?;
    let prefill_s = t0.elapsed().as_secs_f64();
    let t1 = Instant::now();
    for _ in 0..a.decode_tokens {
        next = g.step(&[next])?[0];
    }
    let decode_s = t1.elapsed().as_secs_f64();
    let decode_tok_s = a.decode_tokens as f64 / decode_s;
    let t_start = Instant::now();
    let now = move || t_start.elapsed().as_secs_f64();
    let gemv_gbps = g.gemv_gbps(a.reps, 3, &now)?;
    let wbytes = g.weight_bytes_per_token();
    let copy_gbps = dflash_gpu::bench::copy_gbps(&ctx, wbytes.max(1 << 20), a.reps, 3, &now)?;
    let s = &ctx.summary;
    let v = serde_json::json!({
        "model": a.model.display().to_string(),
        "prompt_tokens": a.prompt_tokens,
        "decode_tokens": a.decode_tokens,
        "prefill_tok_s": a.prompt_tokens as f64 / prefill_s,
        "decode_tok_s": decode_tok_s,
        "weight_bytes_per_token": wbytes,
        "decode_gbps": wbytes as f64 * decode_tok_s / 1e9,
        "gemv_gbps": gemv_gbps,
        "copy_gbps": copy_gbps,
        "gemv_copy_ratio": gemv_gbps / copy_gbps,
        "adapter": {
            "name": s.name, "backend": s.backend, "device_type": s.device_type, "driver": s.driver,
            "shader_f16": s.shader_f16, "subgroups": s.subgroups, "kv_cache_f16": ctx.f16,
            "max_storage_buffer_binding_size": s.max_storage_buffer_binding_size,
            "max_buffer_size": s.max_buffer_size,
            "max_compute_invocations_per_workgroup": s.max_compute_invocations_per_workgroup,
        },
        "load_s": load_s,
        "gpu_memory_bytes": {
            "weights": g.memory.weights,
            "kv_cache": g.memory.kv_cache,
            "activations": g.memory.activations,
            "total": g.memory.total(),
        },
    });
    if a.json {
        println!("{}", serde_json::to_string_pretty(&v).unwrap());
    } else {
        println!(
            "{}: prefill {:.1} tok/s, decode {:.2} tok/s; GEMV {:.2} GB/s vs copy {:.2} GB/s ({:.0}%)",
            s.name, v["prefill_tok_s"].as_f64().unwrap(), decode_tok_s, gemv_gbps, copy_gbps, 100.0 * gemv_gbps / copy_gbps
        );
    }
    Ok(())
}
