//! `dflash bench --device cpu --synthetic NAME`: a real shape with random weights in the
//! formats a Q4_K_M GGUF loads to (`dflash_core::synthetic_weights`), made in host memory
//! once the plan fits what the host has: prefill, decode, the decode's weight stream
//! against a read stream of this host on the engine's threads (the roofline), and what
//! a pass of n rows costs against one (a verify pass: every row's logits), n = 1 to 64.

use super::{mem_available, model_label, BenchArgs};
use crate::CliError;
use dflash_core::cpu::quant_matmul::threads;
use dflash_core::cpu::{CpuKernels, CpuModel, LogitRows};
use dflash_core::rng::Rng;
use dflash_core::synthetic::SyntheticSpec;
use std::time::Instant;

/// Row counts whose pass is timed against a one-row pass.
const PASS_ROWS: [usize; 7] = [1, 2, 4, 8, 16, 32, 64];

pub(super) fn run(
    a: &BenchArgs,
    spec: &SyntheticSpec,
    kernels: CpuKernels,
) -> Result<serde_json::Value, CliError> {
    let memory = check_host_memory(a, spec, spec.target_weight_bytes())?;
    let t_load = Instant::now();
    let cpu = CpuModel::from_weights(
        dflash_core::synthetic_weights::host_weights(spec, a.seed)?,
        kernels,
    );
    let load_s = t_load.elapsed().as_secs_f64();
    let mut rng = Rng(a.seed ^ 0x9E37);
    let vocab = spec.config.vocab_size as u64;
    let mut ids =
        |n: usize| -> Vec<u32> { (0..n).map(|_| (rng.next_u64() % vocab) as u32).collect() };
    let prompt = ids(a.prompt_tokens);
    let context = a.prompt_tokens + a.decode_tokens + PASS_ROWS[PASS_ROWS.len() - 1] + 16;
    // Warm-up: the pool's threads and the caches.
    let mut cache = cpu.new_cache(context);
    cpu.forward(
        &prompt[..prompt.len().min(8)],
        &mut cache,
        LogitRows::Last,
        &[],
    )?;
    let mut cache = cpu.new_cache(context);
    let t0 = Instant::now();
    let out = cpu.forward(&prompt, &mut cache, LogitRows::Last, &[])?;
    let prefill_s = t0.elapsed().as_secs_f64();
    let mut t = cpu.argmax_last(&out.logits);
    let t1 = Instant::now();
    for _ in 0..a.decode_tokens {
        let out = cpu.forward(&[t], &mut cache, LogitRows::Last, &[])?;
        t = cpu.argmax_last(&out.logits);
    }
    let decode_tok_s = a.decode_tokens as f64 / t1.elapsed().as_secs_f64();
    let at = cache.len();
    let mut pass_s = Vec::new();
    for n in PASS_ROWS {
        let rows = ids(n);
        let mut best = f64::INFINITY;
        for _ in 0..3 {
            cache.truncate(at);
            let t = Instant::now();
            cpu.forward(&rows, &mut cache, LogitRows::All, &[])?;
            best = best.min(t.elapsed().as_secs_f64());
        }
        pass_s.push(best);
    }
    let wbytes = cpu.weight_bytes_per_token();
    let read_gbps = read_stream_gbps(1 << 30);
    let decode_gbps = wbytes as f64 * decode_tok_s / 1e9;
    Ok(serde_json::json!({
        "model": model_label(a),
        "synthetic": spec.name,
        "prompt_tokens": a.prompt_tokens,
        "decode_tokens": a.decode_tokens,
        "prefill_tok_s": a.prompt_tokens as f64 / prefill_s,
        "decode_tok_s": decode_tok_s,
        "weight_bytes_per_token": wbytes,
        "decode_gbps": decode_gbps,
        "read_gbps": read_gbps,
        "decode_read_ratio": decode_gbps / read_gbps,
        "pass_rows": PASS_ROWS,
        "pass_ms": pass_s.iter().map(|s| s * 1e3).collect::<Vec<_>>(),
        "pass_cost_over_one_row": pass_s.iter().map(|s| s / pass_s[0]).collect::<Vec<_>>(),
        "memory_budget": memory,
        "load_s": load_s,
    }))
}

/// Refuses a synthetic shape whose weights (`need` bytes) do not fit the host memory
/// budget (--memory-budget, else MemAvailable), before anything is allocated; the
/// budget for the JSON.
pub(super) fn check_host_memory(
    a: &BenchArgs,
    spec: &SyntheticSpec,
    need: u64,
) -> Result<serde_json::Value, CliError> {
    let (budget, source) = match (a.memory_budget, mem_available()) {
        (Some(b), _) => (Some(b), "--memory-budget"),
        (None, m) => (m, "MemAvailable"),
    };
    if let Some(b) = budget.filter(|&b| need > b) {
        return Err(CliError::Usage(format!(
            "synthetic {}: its weights need {need} bytes of host memory; the budget ({source}) is {b}",
            spec.name
        )));
    }
    Ok(serde_json::json!({"bytes": budget, "source": source, "weights": need}))
}

/// GB/s of reading `bytes` (far past any last-level cache) on the engine's threads, each
/// its own contiguous part, best of 3: the roofline a decode's weight stream meets.
fn read_stream_gbps(bytes: usize) -> f64 {
    let words = vec![1u64; bytes / 8];
    let parts = threads().max(1);
    let mut best = f64::INFINITY;
    for _ in 0..3 {
        let t0 = Instant::now();
        let sum: u64 = std::thread::scope(|s| {
            let part = words.len().div_ceil(parts);
            let handles: Vec<_> = words
                .chunks(part)
                .map(|c| s.spawn(move || c.iter().fold(0u64, |a, &x| a.wrapping_add(x))))
                .collect();
            handles.into_iter().map(|h| h.join().unwrap_or(0)).sum()
        });
        best = best.min(t0.elapsed().as_secs_f64());
        std::hint::black_box(sum);
    }
    bytes as f64 / best.max(1e-9) / 1e9
}
