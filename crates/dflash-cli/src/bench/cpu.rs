//! `dflash bench --device cpu|reference`: the CPU engines measured as the GPU bench
//! measures the GPU: prefill and decode of a real prompt, the bytes of weights a decode
//! step reads against a plain memory copy on the same host (the roofline), and with a
//! drafter, plain against DFlash decoding of the same prompts in the same run.

use super::{bench_prompt, model_label, AcceptProfile, BenchArgs};
use crate::{load, CliError};
use dflash_core::cpu::packed::packed_kernel;
use dflash_core::cpu::quant_matmul::{self, Kernel};
use dflash_core::cpu::{CpuKernels, CpuModel, LogitRows};
use dflash_core::model_files::LoadedModel;
use dflash_core::synthetic::SyntheticSpec;
use std::time::Instant;

/// The CPU bench: the usage checks of what only the GPU bench has, then plain or DFlash.
pub(super) fn run(
    a: BenchArgs,
    kernels: CpuKernels,
    synthetic: Option<&SyntheticSpec>,
    accept: Option<&AcceptProfile>,
) -> Result<(), CliError> {
    let gpu_only = a.gpu_only_options();
    if let Some((_, flag)) = gpu_only.iter().find(|(set, _)| *set) {
        return Err(CliError::Usage(format!(
            "{flag} is for the GPU bench, not --device cpu or reference"
        )));
    }
    if a.drafter.is_some() {
        return super::cpu_dflash::run(&a, kernels, synthetic, accept);
    }
    if let Some(spec) = synthetic {
        let v = super::cpu_synthetic::run(&a, spec, kernels)?;
        return print_synthetic(&a, v, kernels);
    }
    let t_load = Instant::now();
    let path = a
        .model
        .as_ref()
        .expect("clap requires --model without --synthetic");
    run_plain(&a, &load(path)?.0, kernels, t_load)
}

/// A synthetic run's JSON, or its figures in a line.
fn print_synthetic(
    a: &BenchArgs,
    mut v: serde_json::Value,
    kernels: CpuKernels,
) -> Result<(), CliError> {
    v["cpu"] = engine_json(kernels);
    if a.json {
        return outln!("{}", serde_json::to_string_pretty(&v).unwrap());
    }
    let f = |k: &str| v[k].as_f64().unwrap_or(0.0);
    let costs: Vec<String> = v["pass_cost_over_one_row"]
        .as_array()
        .into_iter()
        .flatten()
        .zip(v["pass_rows"].as_array().into_iter().flatten())
        .map(|(c, n)| format!("{n}: {:.2}", c.as_f64().unwrap_or(0.0)))
        .collect();
    outln!(
        "{} engine ({}, {} threads), synthetic {}: prefill {:.1} tok/s, decode {:.2} tok/s; weights {:.2} GB/s vs a read stream's {:.2} GB/s ({:.0}%); a pass of n rows in one-row passes: {}",
        kernels.device_name(),
        v["cpu"]["kernel"].as_str().unwrap_or(""),
        quant_matmul::threads(),
        v["synthetic"].as_str().unwrap_or(""),
        f("prefill_tok_s"),
        f("decode_tok_s"),
        f("decode_gbps"),
        f("read_gbps"),
        100.0 * f("decode_read_ratio"),
        costs.join(", ")
    )
}

/// What the CPU engine runs on, for the JSON.
pub(super) fn engine_json(kernels: CpuKernels) -> serde_json::Value {
    serde_json::json!({
        "device": kernels.device_name(),
        "kernel": match kernels {
            CpuKernels::Quantized => Kernel::detect().name(),
            CpuKernels::Reference => "f32",
        },
        // Matrices interleaved by rows for the packed (VNNI) kernels.
        "packed_rows": kernels == CpuKernels::Quantized && packed_kernel(Kernel::detect()),
        "threads": quant_matmul::threads(),
    })
}

/// Greedy decoding of `n` tokens after `first` by token id (no stop tokens).
fn decode_ids(
    cpu: &CpuModel,
    cache: &mut dflash_core::cpu::KvCache,
    first: u32,
    n: usize,
) -> Result<(), CliError> {
    let mut t = first;
    for _ in 0..n {
        let out = cpu.forward(&[t], cache, LogitRows::Last, &[])?;
        t = cpu.argmax_last(&out.logits);
    }
    Ok(())
}

/// Prefill of --prompt-tokens real tokens and greedy decode of --decode-tokens, with the
/// decode's weight traffic against a memory copy of the same host.
fn run_plain(
    a: &BenchArgs,
    m: &LoadedModel,
    kernels: CpuKernels,
    t_load: Instant,
) -> Result<(), CliError> {
    let cpu = CpuModel::with_kernels(&m.weights, kernels);
    let context = (a.prompt_tokens + a.decode_tokens + 16).min(cpu.config.max_position_embeddings);
    // Warm-up: the pool's threads and the caches.
    let mut cache = cpu.new_cache(context);
    let out = cpu.forward(&bench_prompt(m, 17)?, &mut cache, LogitRows::Last, &[])?;
    decode_ids(&cpu, &mut cache, cpu.argmax_last(&out.logits), 2)?;
    let load_s = t_load.elapsed().as_secs_f64();
    let prompt = bench_prompt(m, a.prompt_tokens)?;
    let mut cache = cpu.new_cache(context);
    let t0 = Instant::now();
    let out = cpu.forward(&prompt, &mut cache, LogitRows::Last, &[])?;
    let first = cpu.argmax_last(&out.logits);
    let prefill_s = t0.elapsed().as_secs_f64();
    let t1 = Instant::now();
    decode_ids(&cpu, &mut cache, first, a.decode_tokens)?;
    let decode_tok_s = a.decode_tokens as f64 / t1.elapsed().as_secs_f64();
    let wbytes = cpu.weight_bytes_per_token();
    let copy_gbps = memcpy_gbps((4 * wbytes).max(64 << 20));
    let decode_gbps = wbytes as f64 * decode_tok_s / 1e9;
    let mut v = serde_json::json!({
        "model": model_label(a),
        "prompt_tokens": a.prompt_tokens,
        "decode_tokens": a.decode_tokens,
        "prefill_tok_s": a.prompt_tokens as f64 / prefill_s,
        "decode_tok_s": decode_tok_s,
        "weight_bytes_per_token": wbytes,
        "decode_gbps": decode_gbps,
        "copy_gbps": copy_gbps,
        "decode_copy_ratio": decode_gbps / copy_gbps,
        "load_s": load_s,
    });
    v["cpu"] = engine_json(kernels);
    if a.json {
        outln!("{}", serde_json::to_string_pretty(&v).unwrap())?;
    } else {
        outln!(
            "{} engine ({}, {} threads): prefill {:.1} tok/s, decode {decode_tok_s:.2} tok/s; weights {decode_gbps:.2} GB/s vs memcpy {copy_gbps:.2} GB/s ({:.0}%)",
            kernels.device_name(),
            v["cpu"]["kernel"].as_str().unwrap_or(""),
            quant_matmul::threads(),
            v["prefill_tok_s"].as_f64().unwrap_or(0.0),
            100.0 * decode_gbps / copy_gbps
        )?;
    }
    Ok(())
}

/// GB/s of one memcpy of `bytes` on this host (read + write counted, as the GPU copy
/// kernel counts them), best of 3.
fn memcpy_gbps(bytes: u64) -> f64 {
    let src = vec![1u8; bytes as usize];
    let mut dst = vec![0u8; bytes as usize];
    let mut best = f64::INFINITY;
    for _ in 0..3 {
        let t0 = Instant::now();
        dst.copy_from_slice(&src);
        best = best.min(t0.elapsed().as_secs_f64());
        std::hint::black_box(&dst);
    }
    2.0 * bytes as f64 / best.max(1e-9) / 1e9
}
