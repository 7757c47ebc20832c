//! Evaluation through the engine's own speculative loop (the CPU reference): mean tau and
//! per-position acceptance of a drafter on a prompt file, and whether every output equals
//! plain decoding.

use crate::TrainError;
use dflash_core::cpu::CpuModel;
use dflash_core::drafter::CpuDrafter;
use dflash_core::generate::{generate_cpu, GenerateRequest};
use dflash_core::model_files::LoadedModel;
use dflash_core::sampling::SamplingParams;
use dflash_core::speculative::{generate_speculative_cpu, Acceptance, BlockSize};
use rayon::prelude::*;
use serde::Serialize;

#[derive(Debug, Serialize)]
pub struct EvalRow {
    pub id: String,
    pub tokens: usize,
    pub steps: usize,
    pub tau: f64,
    /// Speculative output equals plain decoding (checked when asked).
    pub lossless: Option<bool>,
}

#[derive(Debug, Serialize)]
pub struct EvalReport {
    pub prompts: usize,
    pub block: usize,
    pub max_new_tokens: usize,
    /// Committed tokens per verification step, over all steps of all prompts.
    pub mean_tau: f64,
    pub acceptance_by_position: Vec<f64>,
    pub rows: Vec<EvalRow>,
}

/// The prompts of a JSON-lines file (see `dflash_core::prompt_file`) as (id, token ids).
pub fn read_prompts(
    path: &std::path::Path,
    m: &LoadedModel,
) -> Result<Vec<(String, Vec<u32>)>, TrainError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| TrainError::Io(format!("{}: {e}", path.display())))?;
    Ok(dflash_core::prompt_file::parse(&text, m)?
        .into_iter()
        .enumerate()
        .map(|(i, (v, ids))| (dflash_core::prompt_file::id_of(&v, i), ids))
        .collect())
}

/// The prompts of the samples in a `data` file as (id, prompt ids), the last `last` of them
/// (all when None): e.g. the samples `train --holdout` never trained on.
pub fn sample_prompts(
    path: &std::path::Path,
    last: Option<usize>,
) -> Result<Vec<(String, Vec<u32>)>, TrainError> {
    let samples = crate::data::read_samples(path)?;
    let n = last.unwrap_or(samples.len());
    if n == 0 || n > samples.len() {
        return Err(TrainError::Usage(format!(
            "--last {n}: {} holds {} samples",
            path.display(),
            samples.len()
        )));
    }
    Ok(samples[samples.len() - n..]
        .iter()
        .map(|s| (s.id.clone(), s.prompt_ids.clone()))
        .collect())
}

/// One prompt's speculative decoding: its row, acceptance and (taus, steps).
struct PromptResult {
    row: EvalRow,
    acceptance: Acceptance,
    taus: usize,
    steps: usize,
}

fn evaluate_prompt(
    m: &LoadedModel,
    (target, drafter): (&CpuModel, &CpuDrafter),
    (id, ids): &(String, Vec<u32>),
    (block, max_new_tokens): (usize, usize),
    check_plain: bool,
) -> Result<PromptResult, TrainError> {
    let clock = || 0.0;
    let req = GenerateRequest {
        prompt_ids: ids.clone(),
        max_new_tokens,
        sampling: SamplingParams::default(),
        stop_strings: vec![],
        context: ids.len() + max_new_tokens + block + 1,
        interrupt: Default::default(),
        grammar: None,
    };
    let r = generate_speculative_cpu(
        target,
        drafter,
        &m.tokenizer,
        &req,
        &BlockSize::Fixed(block),
        &clock,
        &mut |_| {},
    )?;
    let lossless = if check_plain {
        Some(
            generate_cpu(target, &m.tokenizer, &req, &clock, &mut |_| {})?.tokens
                == r.result.tokens,
        )
    } else {
        None
    };
    Ok(PromptResult {
        row: EvalRow {
            id: id.clone(),
            tokens: r.result.tokens.len(),
            steps: r.steps,
            tau: r.mean_tau(),
            lossless,
        },
        taus: r.taus.iter().sum::<usize>(),
        steps: r.steps,
        acceptance: r.acceptance,
    })
}

/// Mean tau and per-position acceptance over `prompts`, decoded in parallel (each prompt
/// on its own: the CPU reference's results do not depend on the threads), summed in the
/// prompts' order; `on_row` sees each row as its prompt finishes (in the order they
/// finish). Where prompts fail, the error is the first to happen, not necessarily the
/// first prompt's.
#[allow(clippy::too_many_arguments)]
pub fn evaluate(
    m: &LoadedModel,
    target: &CpuModel,
    drafter: &CpuDrafter,
    prompts: &[(String, Vec<u32>)],
    block: usize,
    max_new_tokens: usize,
    check_plain: bool,
    on_row: impl Fn(&EvalRow) + Sync,
) -> Result<EvalReport, TrainError> {
    let results: Vec<PromptResult> = prompts
        .par_iter()
        .map(|p| {
            let r = evaluate_prompt(
                m,
                (target, drafter),
                p,
                (block, max_new_tokens),
                check_plain,
            )?;
            on_row(&r.row);
            Ok(r)
        })
        .collect::<Result<_, TrainError>>()?;
    let mut acc = Acceptance::default();
    let (mut taus, mut steps) = (0usize, 0usize);
    let mut rows = Vec::with_capacity(results.len());
    for r in results {
        acc.add(&r.acceptance);
        taus += r.taus;
        steps += r.steps;
        rows.push(r.row);
    }
    Ok(EvalReport {
        prompts: prompts.len(),
        block,
        max_new_tokens,
        mean_tau: if steps > 0 {
            taus as f64 / steps as f64
        } else {
            0.0
        },
        acceptance_by_position: acc.rates(),
        rows,
    })
}
