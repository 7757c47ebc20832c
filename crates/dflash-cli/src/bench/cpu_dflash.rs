//! `dflash bench --device cpu --drafter ...`: plain and DFlash decoding on the CPU engine
//! in the same run, each block size of --block against the same plain outputs. The pair
//! is a model with its drafter folder, or with --synthetic the shape's target and its
//! z-lab drafter with random weights in host memory (numbered tokens, random prompts).
//! Acceptance is the drafter's own, or with --accept-profile simulated: the real drafter
//! pass runs (its cost is paid) and its drafts are replaced by the plain run's tokens,
//! right as often as the profile says; the target verifies them as always.

use super::cpu::engine_json;
use super::cpu_synthetic::check_host_memory;
use super::{
    bench_prompts, bench_request, block_policies, dflash_host, dflash_sampling, report_dflash,
    synthetic_json, AcceptProfile, BenchArgs, DflashResults, IdsRun,
};
use crate::CliError;
use dflash_core::cpu::{CpuKernels, CpuModel};
use dflash_core::drafter::{CpuDrafter, DrafterWeights};
use dflash_core::generate::generate_cpu;
use dflash_core::speculative::{generate_speculative_with, DFlashCpu, Proposer, Simulated};
use dflash_core::synthetic::SyntheticSpec;
use dflash_core::synthetic_weights::{host_drafter, host_weights};
use dflash_core::tokenizer::TextTokenizer;
use std::time::Instant;

/// The pair on the CPU engine, and the text side of its outputs.
struct CpuPair {
    target: CpuModel,
    drafter: DrafterWeights,
    tokenizer: TextTokenizer,
}

/// The loaded pair, or the synthetic one made in host memory once it fits.
fn cpu_pair(
    a: &BenchArgs,
    host: super::DflashHost,
    synthetic: Option<&SyntheticSpec>,
    kernels: CpuKernels,
) -> Result<(CpuPair, serde_json::Value), CliError> {
    match (host.loaded, host.drafter, synthetic) {
        (Some(m), Some(d), _) => {
            d.config.validate_against(m.config())?;
            let target = CpuModel::from_weights(m.weights, kernels);
            let pair = CpuPair {
                target,
                drafter: d,
                tokenizer: m.tokenizer,
            };
            Ok((pair, serde_json::Value::Null))
        }
        (_, _, Some(spec)) => {
            let need = spec.target_weight_bytes() + spec.drafter_weight_bytes();
            let memory = check_host_memory(a, spec, need)?;
            let pair = CpuPair {
                target: CpuModel::from_weights(host_weights(spec, a.seed)?, kernels),
                drafter: host_drafter(spec, a.seed)?,
                tokenizer: TextTokenizer::numbered(spec.config.vocab_size)?,
            };
            Ok((pair, memory))
        }
        _ => unreachable!("dflash_host loads a drafter unless the pair is synthetic"),
    }
}

pub(super) fn run(
    a: &BenchArgs,
    kernels: CpuKernels,
    synthetic: Option<&SyntheticSpec>,
    accept: Option<&AcceptProfile>,
) -> Result<(), CliError> {
    if a.synthetic_draft_vocab.is_some() {
        return Err(CliError::Usage(
            "--synthetic-draft-vocab is for the GPU bench, not --device cpu or reference".into(),
        ));
    }
    let t_load = Instant::now();
    let host = dflash_host(a, synthetic, accept)?;
    let rows_in = host.rows.clone();
    let (pair, memory) = cpu_pair(a, host, synthetic, kernels)?;
    let (cpu, tok) = (&pair.target, &pair.tokenizer);
    let drafter = CpuDrafter::with_kernels(&pair.drafter, kernels);
    let context = a.context.min(cpu.config.max_position_embeddings);
    let t0 = Instant::now();
    let clock = move || t0.elapsed().as_secs_f64();
    let blocks = block_policies(&a.block, pair.drafter.config.block_size, || {
        Ok(DFlashCpu::new(&drafter, cpu)?.measure_step_costs(16, &clock)?)
    })?;
    let sampling = dflash_sampling(a);
    let request = |ids: &[u32]| bench_request(ids.to_vec(), a.max_new_tokens, &sampling, context);
    let load_s = t_load.elapsed().as_secs_f64();
    let (plain, runs) = bench_prompts(
        &rows_in,
        &blocks.policies,
        usize::from(a.rounds),
        |ids| {
            let result = generate_cpu(cpu, tok, &request(ids), &clock, &mut |_| {})?;
            Ok((result.tokens, result.decode_s))
        },
        |_, policy, ids, truth| {
            let mut real = DFlashCpu::new(&drafter, cpu)?;
            let mut simulated;
            let proposer: &mut dyn Proposer = match accept {
                Some(profile) => {
                    simulated = Simulated::new(real, profile, ids, truth, a.seed);
                    &mut simulated
                }
                None => &mut real,
            };
            let req = request(ids);
            let run =
                generate_speculative_with(cpu, proposer, tok, &req, policy, &clock, &mut |_| {})?;
            Ok(IdsRun::from(run))
        },
    )?;
    let fields = serde_json::json!({
        "acceptance": if accept.is_some() { "simulated" } else { "measured" },
        "accept_profile": accept.map(|p| p.0.clone()),
        "cpu": engine_json(kernels),
        // A DFlash2 drafter drafts through its selector, not the draft head.
        "draft_head_ids": (!drafter.is_dflash2())
            .then(|| drafter.draft_vocab.as_ref().map(|v| v.len()))
            .flatten(),
        "synthetic": synthetic.map(|s| {
            let mut v = synthetic_json(s, true);
            v["weights"] = "random, made in host memory".into();
            v
        }),
        "memory_budget": memory,
    });
    let results = DflashResults {
        blocks,
        runs,
        plain,
        load_s,
    };
    let suffix = if accept.is_some() {
        " (simulated acceptance)"
    } else {
        ""
    };
    report_dflash(a, results, kernels.device_name(), suffix, &fields)
}
