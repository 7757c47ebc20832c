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
    /// A DFlash drafter: benchmark plain against DFlash decoding on --prompts.
    #[arg(long, requires = "prompts")]
    drafter: Option<PathBuf>,
    /// JSON lines, each with `chat` (a user message, through the chat template) or
    /// `prompt` (raw text); other fields (`id`, ...) are carried into the rows.
    #[arg(long)]
    prompts: Option<PathBuf>,
    /// Skip the first N prompts of --prompts (with --limit: run a slice, so that a long
    /// sweep can be run and resumed in pieces).
    #[arg(long, default_value_t = 0)]
    skip: usize,
    /// Only the first N prompts of --prompts (after --skip).
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
    #[arg(long, default_value_t = 1.0)]
    top_p: f32,
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
}

/// A prompt of `n` real tokens: a paragraph of English repeated.
fn bench_prompt(m: &dflash_core::model_files::LoadedModel, n: usize) -> Result<Vec<u32>, CliError> {
    let text = "The history of computing is a story of machines that learned to remember, to calculate and finally to speak. ";
    let one = m.tokenizer.encode(text, true)?;
    Ok(one.iter().cycle().take(n).copied().collect())
}

pub fn run(a: BenchArgs) -> Result<(), CliError> {
    if a.drafter.is_some() {
        return run_dflash(a);
    }
    let t_load = Instant::now();
    let (m, _) = load(&a.model)?;
    let ctx = open_device(Some(Device::Gpu), &a.adapter, a.no_f16, true)?.expect("gpu");
    let context = (a.prompt_tokens + a.decode_tokens + 16).min(m.config().max_position_embeddings);
    let mut g = GpuModel::new(
        ctx.clone(),
        &m.weights,
        &GpuModelOptions {
            context,
            ..Default::default()
        },
    )?;
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
    let copy_gbps = dflash_gpu::profile::copy_gbps(&ctx, (4 * wbytes).max(64 << 20), &now)?;
    let profile = if a.profile {
        Some(crate::profile::profile(
            &ctx,
            &mut g,
            None,
            a.prompt_tokens,
            &now,
        )?)
    } else {
        None
    };
    let s = &ctx.summary;
    let mut v = serde_json::json!({
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
    if let Some(p) = profile {
        if !a.json {
            crate::profile::print(&p);
        }
        v["profile"] = p;
    }
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

/// Plain and DFlash decoding of the same prompts in the same run, on the same adapter.
fn run_dflash(a: BenchArgs) -> Result<(), CliError> {
    use dflash_core::drafter::{load_drafter_dir, DrafterPrecision};
    use dflash_core::generate::GenerateRequest;
    use dflash_core::sampling::SamplingParams;
    use dflash_gpu::dflash::Speculative;
    let t_load = Instant::now();
    let (m, _) = load(&a.model)?;
    let w = load_drafter_dir(a.drafter.as_ref().unwrap(), DrafterPrecision::Q8)?;
    let text = std::fs::read_to_string(a.prompts.as_ref().unwrap())
        .map_err(|e| CliError::Usage(format!("--prompts: {e}")))?;
    let mut rows_in = dflash_core::prompt_file::parse(&text, &m)?;
    rows_in.drain(..a.skip.min(rows_in.len()));
    if rows_in.is_empty() {
        return Err(CliError::Usage(
            "--prompts: no prompts left after --skip".into(),
        ));
    }
    if let Some(n) = a.limit {
        rows_in.truncate(n);
    }
    let ctx = open_device(Some(Device::Gpu), &a.adapter, a.no_f16, a.profile)?.expect("gpu");
    let context = a.context.min(m.config().max_position_embeddings);
    let mut plain = GpuModel::new(
        ctx.clone(),
        &m.weights,
        &GpuModelOptions {
            context,
            ..Default::default()
        },
    )?;
    let target = GpuModel::new(
        ctx.clone(),
        &m.weights,
        &GpuModelOptions {
            context,
            taps: w.config.target_layer_ids.clone(),
            ..Default::default()
        },
    )?;
    let t0 = Instant::now();
    let clock = move || t0.elapsed().as_secs_f64();
    let mut spec = Speculative::new(target, &w)?;
    let blocks: Vec<String> = a.block.split(',').map(|b| b.trim().to_string()).collect();
    let costs = if blocks.iter().any(|b| b == "auto") {
        Some(spec.measure_step_costs(16, &clock)?)
    } else {
        None
    };
    let policies = blocks
        .iter()
        .map(|b| crate::generate::block_policy(b, spec.max_block(), costs.clone()))
        .collect::<Result<Vec<_>, _>>()?;
    let sampling = SamplingParams {
        temperature: a.temperature,
        top_p: a.top_p,
        seed: a.seed,
        ..Default::default()
    };
    // Warm-up: compile every plan used below.
    if let Some((_, ids)) = rows_in.first() {
        let req = GenerateRequest {
            prompt_ids: ids.clone(),
            max_new_tokens: 4,
            sampling: sampling.clone(),
            stop_strings: vec![],
            context,
        };
        crate::generate::generate_gpu(&mut plain, &m, &req, &mut |_| {})?;
        for policy in &policies {
            spec.generate(&m.tokenizer, &req, policy, &clock, &mut |_| {})?;
        }
    }
    let load_s = t_load.elapsed().as_secs_f64();
    let (mut plain_tokens, mut plain_s) = (0usize, 0f64);
    let mut runs: Vec<BlockRun> = blocks.iter().map(|_| BlockRun::default()).collect();
    for (v, ids) in &rows_in {
        let req = GenerateRequest {
            prompt_ids: ids.clone(),
            max_new_tokens: a.max_new_tokens,
            sampling: sampling.clone(),
            stop_strings: vec![],
            context,
        };
        let p = crate::generate::generate_gpu(&mut plain, &m, &req, &mut |_| {})?;
        let pt = p.tokens.len();
        // Decode speed: tokens after the first over the decode time (prefill excluded).
        let p_tok_s = pt.saturating_sub(1) as f64 / p.decode_s.max(1e-9);
        plain_tokens += pt.saturating_sub(1);
        plain_s += p.decode_s;
        for (policy, run) in policies.iter().zip(&mut runs) {
            let s = spec.generate(&m.tokenizer, &req, policy, &clock, &mut |_| {})?;
            let lossless = p.tokens == s.result.tokens;
            run.lossless &= lossless;
            let st = s.result.tokens.len();
            let s_tok_s = st.saturating_sub(1) as f64 / s.result.decode_s.max(1e-9);
            run.tokens += st.saturating_sub(1);
            run.seconds += s.result.decode_s;
            run.acceptance.add(&s.acceptance);
            run.taus.extend(&s.taus);
            let mut row = v.clone();
            if let Some(o) = row.as_object_mut() {
                o.remove("chat");
                o.remove("prompt");
                o.insert("prompt_tokens".into(), ids.len().into());
                o.insert("tokens".into(), pt.into());
                o.insert("plain_tok_s".into(), p_tok_s.into());
                o.insert("dflash_tok_s".into(), s_tok_s.into());
                o.insert("speedup".into(), (s_tok_s / p_tok_s.max(1e-9)).into());
                o.insert("mean_tau".into(), s.mean_tau().into());
                o.insert(
                    "acceptance_by_position".into(),
                    serde_json::json!(s.acceptance.rates()),
                );
                o.insert("lossless".into(), lossless.into());
                // Raw totals, so that slices of a sweep add up exactly.
                o.insert("plain_decode_s".into(), p.decode_s.into());
                o.insert("dflash_tokens".into(), st.into());
                o.insert("dflash_decode_s".into(), s.result.decode_s.into());
                o.insert("steps".into(), s.taus.len().into());
                o.insert("tau_sum".into(), s.taus.iter().sum::<usize>().into());
                o.insert(
                    "accepted_by_position".into(),
                    serde_json::json!(s.acceptance.accepted),
                );
                o.insert(
                    "tried_by_position".into(),
                    serde_json::json!(s.acceptance.tried),
                );
            }
            run.rows.push(row);
        }
    }
    let plain_tok_s = plain_tokens as f64 / plain_s.max(1e-9);
    let profile = match (a.profile, rows_in.first()) {
        (true, Some((_, ids))) => {
            plain.truncate(0);
            plain.prefill(ids)?;
            spec.prefill(ids, dflash_gpu::model::Head::Argmax)?;
            let p = crate::profile::profile(&ctx, &mut plain, Some(&mut spec), ids.len(), &clock)?;
            if !a.json {
                crate::profile::print(&p);
            }
            Some(p)
        }
        _ => None,
    };
    let mut all_lossless = true;
    let mut out = Vec::new();
    for (block, run) in blocks.iter().zip(runs) {
        let dflash_tok_s = run.tokens as f64 / run.seconds.max(1e-9);
        let mean_tau = if run.taus.is_empty() {
            0.0
        } else {
            run.taus.iter().sum::<usize>() as f64 / run.taus.len() as f64
        };
        all_lossless &= run.lossless;
        let mut v = serde_json::json!({
            "model": a.model.display().to_string(),
            "drafter": a.drafter.as_ref().unwrap().display().to_string(),
            "adapter": ctx.summary.name,
            "block": block,
            "step_costs": if block == "auto" { costs.clone() } else { None },
            "temperature": a.temperature,
            "top_p": a.top_p,
            "seed": a.seed,
            "max_new_tokens": a.max_new_tokens,
            "prompts": run.rows.len(),
            "plain_tok_s": plain_tok_s,
            "dflash_tok_s": dflash_tok_s,
            "speedup": dflash_tok_s / plain_tok_s.max(1e-9),
            "mean_tau": mean_tau,
            "steps": run.taus.len(),
            "acceptance_by_position": run.acceptance.rates(),
            "plain_tokens": plain_tokens,
            "plain_decode_s": plain_s,
            "dflash_tokens": run.tokens,
            "dflash_decode_s": run.seconds,
            "accepted_by_position": run.acceptance.accepted,
            "tried_by_position": run.acceptance.tried,
            "skip": a.skip,
            "lossless": run.lossless,
            "load_s": load_s,
            "rows": run.rows,
        });
        if !a.json {
            println!(
                "{} block {block}: plain {plain_tok_s:.2} tok/s, DFlash {dflash_tok_s:.2} tok/s ({:.2}x), mean tau {mean_tau:.2}, lossless {}",
                ctx.summary.name,
                dflash_tok_s / plain_tok_s.max(1e-9),
                run.lossless
            );
        }
        if let Some(p) = &profile {
            v["profile"] = p.clone();
        }
        out.push(v);
    }
    if a.json {
        let v = if out.len() == 1 {
            out.pop().unwrap()
        } else {
            serde_json::Value::Array(out)
        };
        println!("{}", serde_json::to_string_pretty(&v).unwrap());
    }
    if !all_lossless {
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
