//! The DFlash bench on the GPU engine: plain and DFlash decoding of the same prompts in
//! the same run, by token id, with measured or simulated (`--accept-profile`) acceptance.

use super::*;
use dflash_gpu::speculative::step_seconds;

/// Plain decoding of `n` tokens by token id (no tokenizer, no stop tokens): the tokens
/// and the decode time after the first token (prefill excluded).
pub(super) fn plain_ids(
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
pub(super) struct Sim<'a> {
    pub(super) profile: &'a AcceptProfile,
    pub(super) plain: &'a [u32],
    pub(super) rng: &'a mut Rng,
}

/// A DFlash run's tokens and statistics.
pub(super) struct IdsRun {
    pub(super) tokens: Vec<u32>,
    pub(super) decode_s: f64,
    pub(super) taus: Vec<usize>,
    pub(super) acceptance: Acceptance,
    /// In auto mode, the step costs as the run's steps refined them.
    pub(super) step_costs: Option<Vec<f64>>,
}

impl From<SpeculativeResult> for IdsRun {
    /// A speculative generation's tokens and statistics.
    fn from(run: SpeculativeResult) -> Self {
        IdsRun {
            tokens: run.result.tokens,
            decode_s: run.result.decode_s,
            taus: run.taus,
            acceptance: run.acceptance,
            step_costs: run.step_costs,
        }
    }
}

impl IdsRun {
    pub(super) fn mean_tau(&self) -> f64 {
        dflash_core::speculative::mean_tau(&self.taus)
    }
}

/// DFlash decoding of `n` tokens by token id, through the engine's own steps (context
/// extension, draft pass, verification, acceptance, rollback) and the same block choice
/// as `Speculative::generate`: its step loop (`decode_steps`, pipelined on GPUs). With
/// `sim`, one step at a time: before each step the host writes the block's
/// drafts (`set_host_drafts_at`, by absolute position): slot i is the plain run's token
/// with the profile's probability given slots < i were right, a wrong token otherwise;
/// the drafter's pass still runs, its drafts unused.
pub(super) fn dflash_ids(
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
        if sim.is_none() {
            // The engine's own loop (pipelined on GPUs), as generation runs it.
            let mut push = |t: u32, _: bool| {
                tokens.push(t);
                Ok(false)
            };
            spec.decode_steps(&mut blocks, head, n - 1, clock, &mut push)?;
            return Ok(clock() - t1);
        }
        let mut prev_rows = None;
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
            let seconds = step_seconds(prev_rows.replace(b), b, &r, clock() - t_step);
            blocks.commit_step(b, seconds, r.accepted, r.tokens, |t, _| {
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
    let step_costs = blocks.step_costs();
    Ok(IdsRun {
        tokens,
        decode_s,
        taus: blocks.taus,
        acceptance: blocks.acceptance,
        step_costs,
    })
}

/// The rows of --prompts (each its fields and token ids), after --skip, at most --limit.
pub(super) fn prompt_rows(
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
pub(super) fn run_dflash(
    a: BenchArgs,
    synthetic: Option<SyntheticSpec>,
    accept: Option<AcceptProfile>,
) -> Result<(), CliError> {
    let t_load = Instant::now();
    // The host side first (model, drafter, prompts, every check); then the device.
    let host = dflash_host(&a, synthetic.as_ref(), accept.as_ref())?;
    let ctx = std::rc::Rc::new(dflash_gpu::GpuContext::new(&gpu_options(&a, a.profile))?);
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
    let mut fields = gpu_fields(
        accept.as_ref(),
        adapter,
        budget_json,
        synthetic.as_ref(),
        profile,
        ctx.tuning.pipelined_decode,
    );
    fields["draft_head_ids"] = serde_json::json!(spec.drafter.draft_head_ids());
    let precision = clap::ValueEnum::to_possible_value(&a.drafter_precision);
    fields["drafter_precision"] = serde_json::json!(precision.map(|p| p.get_name().to_owned()));
    fields["fuse_norm"] = serde_json::json!(ctx.tuning.fuse_norm);
    fields["norm_in_residual"] = serde_json::json!(ctx.tuning.norm_in_residual);
    fields["int8_activations"] = serde_json::json!(ctx.tuning.int8_activations);
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
pub(super) struct DflashHost {
    pub(super) loaded: Option<LoadedModel>,
    pub(super) drafter: Option<DrafterWeights>,
    pub(super) config: ModelConfig,
    pub(super) rows: Vec<(serde_json::Value, Vec<u32>)>,
}

/// Loads the model and the drafter (none for a synthetic pair), checks --accept-profile
/// against the drafter's block, and reads --prompts (a synthetic pair: --limit random
/// prompts of --prompt-tokens ids, each its own seed).
pub(super) fn dflash_host(
    args: &BenchArgs,
    synthetic: Option<&SyntheticSpec>,
    accept: Option<&AcceptProfile>,
) -> Result<DflashHost, CliError> {
    let (loaded, drafter): (Option<LoadedModel>, _) = match synthetic {
        None => (
            Some(load(args.model.as_ref().expect("clap requires --model"))?.0),
            Some(super::load_bench_drafter(args)?),
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
pub(super) fn dflash_pair(
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
            let vocab = synthetic_draft_vocab(shape)?;
            let spec =
                Speculative::from_gpu_drafter(target, &shape.drafter, drafter, vocab.as_ref())?;
            Ok((plain, spec))
        }
        _ => unreachable!(),
    }
}

/// --synthetic-draft-vocab N (checked against the vocabulary, counted in the shape's
/// plan): the synthetic drafter drafts among ids 0..N (the cost of a draft vocabulary of
/// N ids; the random drafter's drafts are noise either way).
fn synthetic_draft_vocab(
    shape: &SyntheticSpec,
) -> Result<Option<dflash_core::drafter::DraftVocab>, CliError> {
    let Some(n) = shape.draft_vocab else {
        return Ok(None);
    };
    Ok(Some(dflash_core::drafter::DraftVocab::new(
        (0..n as u32).collect(),
        shape.config.vocab_size,
    )?))
}

/// The block sizes of a DFlash bench: as --block names them, the measured step costs
/// (where one of them is `auto`), and each one's policy.
pub(super) struct Blocks {
    pub(super) names: Vec<String>,
    pub(super) costs: Option<Vec<f64>>,
    pub(super) policies: Vec<BlockSize>,
}

/// The block sizes of --block (comma separated), with the step costs that `measure`
/// gives where one is `auto`, each size's policy up to `max_block`.
pub(super) fn block_policies(
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
pub(super) fn dflash_sampling(args: &BenchArgs) -> SamplingParams {
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
pub(super) fn bench_request(
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
        grammar: None,
    }
}

/// How a GPU DFlash bench decodes a prompt, plain and with DFlash: the model file (None
/// for a synthetic pair), the simulated acceptance, the sampler, the context and the
/// clock.
pub(super) struct PairRuns<'a> {
    pub(super) loaded: Option<&'a LoadedModel>,
    pub(super) accept: Option<&'a AcceptProfile>,
    pub(super) sampling: SamplingParams,
    pub(super) context: usize,
    pub(super) clock: &'a dyn Fn() -> f64,
}

impl PairRuns<'_> {
    /// The plain run of up to `n` tokens (its tokens and decode seconds): through the
    /// tokenizer's stop handling when there is one.
    pub(super) fn plain(
        &self,
        plain: &mut GpuModel,
        ids: &[u32],
        n: usize,
    ) -> Result<(Vec<u32>, f64), CliError> {
        match self.loaded {
            Some(file) => {
                let request = bench_request(ids.to_vec(), n, &self.sampling, self.context);
                let t0 = std::time::Instant::now();
                let clock = move || t0.elapsed().as_secs_f64();
                let result = plain.generate(&file.tokenizer, &request, &clock, &mut |_| {})?;
                Ok((result.tokens, result.decode_s))
            }
            None => plain_ids(plain, ids, n, &self.sampling),
        }
    }

    /// The DFlash run of up to `n` tokens: measured acceptance (a loaded model runs
    /// `Speculative::generate`, a synthetic one the same loop by token id), or simulated
    /// (the plain run's `plain_tokens` replayed: as many tokens as it has).
    pub(super) fn dflash(
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
    pub(super) fn all_prompts(
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
            usize::from(args.rounds),
            |ids| self.plain(plain, ids, max_new),
            |i, policy, ids, plain_tokens| {
                self.dflash(spec, ids, max_new, plain_tokens, policy, &mut rngs[i])
            },
        )
    }

    /// Warm-up on the first prompt: compiles every plan the runs use.
    pub(super) fn warm_up(
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

/// Every prompt decoded plain (`plain`: its tokens and decode seconds) and with each
/// policy (`dflash`: the policy's index, the policy, the prompt and the plain tokens),
/// `rounds` times over: the plain totals (tokens after the first, decode seconds) and
/// each policy's runs (a row per prompt and round). Round 0 decodes a prompt plainly
/// first (its tokens are what every DFlash run must equal, and what simulated
/// acceptance replays); odd rounds run the policies first, so that a slow spell of the
/// machine weighs on both sides of the ratio.
pub(super) fn bench_prompts(
    rows: &[(serde_json::Value, Vec<u32>)],
    policies: &[BlockSize],
    rounds: usize,
    mut plain: impl FnMut(&[u32]) -> Result<(Vec<u32>, f64), CliError>,
    mut dflash: impl FnMut(usize, &BlockSize, &[u32], &[u32]) -> Result<IdsRun, CliError>,
) -> Result<((usize, f64), Vec<BlockRun>), CliError> {
    let (mut plain_tokens, mut plain_s) = (0usize, 0f64);
    let mut runs: Vec<BlockRun> = policies.iter().map(|_| BlockRun::default()).collect();
    // As a host does (serve, the browser): each auto request starts from the costs the
    // one before refined.
    let mut policies = policies.to_vec();
    let mut truth: Vec<Vec<u32>> = Vec::with_capacity(rows.len());
    for round in 0..rounds.max(1) {
        for (p, (fields, ids)) in rows.iter().enumerate() {
            let timed = (round % 2 == 0).then(|| plain(ids)).transpose()?;
            if round == 0 {
                truth.push(timed.as_ref().map(|t| t.0.clone()).unwrap_or_default());
            }
            let mut outs = Vec::with_capacity(policies.len());
            for (i, policy) in policies.iter_mut().enumerate() {
                let out = dflash(i, policy, ids, &truth[p])?;
                if let (BlockSize::Auto { verify_cost }, Some(refined)) =
                    (&mut *policy, &out.step_costs)
                {
                    verify_cost.clone_from(refined);
                    runs[i].step_costs = Some(refined.clone());
                }
                outs.push(out);
            }
            let (plain_out, plain_decode_s) = match timed {
                Some(t) => t,
                None => plain(ids)?,
            };
            plain_tokens += plain_out.len().saturating_sub(1);
            plain_s += plain_decode_s;
            for (run, out) in runs.iter_mut().zip(outs) {
                let prompt = (fields, ids.len(), round);
                run.add(prompt, &plain_out, plain_decode_s, out);
            }
        }
    }
    Ok(((plain_tokens, plain_s), runs))
}

/// With --profile, the one-row and the 16-row profiles (the pair's block step) on the
/// first prompt's cache, printed unless --json.
pub(super) fn dflash_profile(
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
    let profile = crate::profile::profile(
        ctx,
        plain,
        Some(spec),
        (ids.len(), usize::from(args.profile_block)),
        clock,
    )?;
    if !args.json {
        crate::profile::print(&profile)?;
    }
    Ok(Some(profile))
}

/// The fields a GPU DFlash bench adds to each block size's JSON: how acceptance came
/// about, the adapter, the memory budget, the synthetic shape and the profile.
pub(super) fn gpu_fields(
    accept: Option<&AcceptProfile>,
    adapter: &str,
    budget_json: serde_json::Value,
    synthetic: Option<&SyntheticSpec>,
    profile: Option<serde_json::Value>,
    pipelined: bool,
) -> serde_json::Value {
    let mut fields = serde_json::json!({
        "acceptance": if accept.is_some() { "simulated" } else { "measured" },
        // The DFlash steps' loop kept the next step in flight (simulated acceptance
        // writes each step's drafts after the step before: one at a time).
        "pipelined": pipelined && accept.is_none(),
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
