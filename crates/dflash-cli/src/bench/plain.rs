//! The plain bench: prefill and decode speed of one model on the GPU engine, and the
//! roofline (the decode GEMV's bandwidth against a copy kernel's on the same adapter).

use super::*;

/// Prefill and decode speed of a plain model, the decode GEMV's bandwidth against a copy
/// kernel's on the same adapter, and with --profile every dispatch timed.
pub(super) fn run_plain(a: BenchArgs, synthetic: Option<SyntheticSpec>) -> Result<(), CliError> {
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
pub(super) struct PlainBench {
    /// The model file; None for a synthetic model.
    pub(super) loaded: Option<LoadedModel>,
    pub(super) ctx: Rc<GpuContext>,
    pub(super) vocab_size: usize,
    /// The memory budget and where it came from, for the JSON.
    pub(super) budget_json: serde_json::Value,
    pub(super) model: GpuModel,
}

/// A plain bench's times: the load (the warm-up included) and the prefill in seconds,
/// the decode in tokens per second.
pub(super) struct PlainTimes {
    pub(super) load_s: f64,
    pub(super) prefill_s: f64,
    pub(super) decode_tok_s: f64,
}

/// The decode GEMV's bandwidth against a plain copy kernel's on the same adapter, the
/// bytes of weights one token reads, and the --profile timings.
pub(super) struct Roofline {
    pub(super) gemv_gbps: f64,
    pub(super) copy_gbps: f64,
    pub(super) weight_bytes: u64,
    pub(super) profile: Option<serde_json::Value>,
}

/// The target's config: the loaded file's, or the synthetic shape's.
pub(super) fn model_config(
    loaded: Option<&LoadedModel>,
    synthetic: Option<&SyntheticSpec>,
) -> ModelConfig {
    match (loaded, synthetic) {
        (Some(model), _) => model.config().clone(),
        (None, Some(shape)) => shape.config.clone(),
        (None, None) => unreachable!("clap requires --model or --synthetic"),
    }
}

/// Loads --model (or plans and builds the --synthetic one) on the GPU with room for
/// --prompt-tokens and --decode-tokens, within the memory budget.
pub(super) fn plain_model(
    args: &BenchArgs,
    synthetic: Option<&SyntheticSpec>,
) -> Result<PlainBench, CliError> {
    let loaded = match &args.model {
        Some(path) if synthetic.is_none() => Some(load(path)?.0),
        _ => None,
    };
    let ctx = std::rc::Rc::new(dflash_gpu::GpuContext::new(&gpu_options(args, true))?);
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
    pub(super) fn prompt(&self, n: usize, seed: u64) -> Result<Vec<u32>, CliError> {
        match &self.loaded {
            Some(file) => bench_prompt(file, n),
            None => Ok(random_ids(n, self.vocab_size, seed)),
        }
    }

    /// Decoding as generation does it (pipelined on GPUs), greedy or sampled at
    /// --temperature: the plans compiled on a short prompt (the load time ends there),
    /// then the prefill of --prompt-tokens and the decode of --decode-tokens timed.
    pub(super) fn time_decoding(
        &mut self,
        args: &BenchArgs,
        t_load: Instant,
    ) -> Result<PlainTimes, CliError> {
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
    pub(super) fn roofline(&mut self, args: &BenchArgs) -> Result<Roofline, CliError> {
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
                (args.prompt_tokens, usize::from(args.profile_block)),
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
pub(super) fn plain_json(
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
        "fuse_norm": ctx.tuning.fuse_norm,
        "norm_in_residual": ctx.tuning.norm_in_residual,
        "int8_activations": ctx.tuning.int8_activations,
        "pipelined_decode": ctx.tuning.pipelined_decode,
        "chunked_sampler": ctx.tuning.chunked_sampler,
        "gemv_outputs_override": ctx.tuning.gemv_outputs_override,
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
            "packed_int8_dot": summary.packed_int8_dot,
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
