//! A synthetic pair's DFlash speed on the quantized CPU engine, for a host without the
//! CLI's bench (the browser's `benchSynthetic`, on the wasm engine in a worker): a named
//! shape's target and z-lab drafter with random weights in the formats a Q4_K_M GGUF
//! loads to, checked against a memory budget before anything is allocated; random
//! prompts; plain decoding, then each block policy with simulated acceptance (the real
//! drafter pass runs and is paid for, its drafts replaced by the plain run's tokens as
//! often as the profile says), every output checked against plain decoding's.

use dflash_core::cpu::{CpuKernels, CpuModel};
use dflash_core::drafter::CpuDrafter;
use dflash_core::generate::{generate_cpu, GenerateRequest};
use dflash_core::speculative::{
    generate_speculative_with, AcceptProfile, BlockSize, DFlashCpu, Simulated,
};
use dflash_core::synthetic::{random_ids, SyntheticSpec};
use dflash_core::synthetic_weights::{host_drafter, host_weights};
use dflash_core::tokenizer::TextTokenizer;
use dflash_core::Error;
use dflash_gpu::GpuError;
use serde::Deserialize;

type Result<T> = std::result::Result<T, GpuError>;

/// What to bench (the browser passes it as an object of these names in camelCase).
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SyntheticBench {
    /// A named shape (`dflash_core::synthetic::NAMES`).
    pub shape: String,
    /// Only the first layers of the shape (each of its real size), to fit a budget.
    pub layers: Option<usize>,
    /// Per draft slot, the probability that it is right given the slots before were.
    pub accept_profile: Vec<f64>,
    /// Block policies: a number of rows, or "auto".
    pub blocks: Vec<String>,
    #[serde(default = "one")]
    pub prompts: usize,
    #[serde(default = "prompt_tokens")]
    pub prompt_tokens: usize,
    #[serde(default = "max_new_tokens")]
    pub max_new_tokens: usize,
    #[serde(default)]
    pub seed: u64,
    /// Bytes the weights may take (the host's memory, or less).
    pub memory_budget: Option<f64>,
}

fn one() -> usize {
    1
}
fn prompt_tokens() -> usize {
    64
}
fn max_new_tokens() -> usize {
    64
}

/// The checked plan: the shape, the profile, the block policies' labels.
struct Plan {
    spec: SyntheticSpec,
    profile: AcceptProfile,
    blocks: Vec<Option<usize>>,
}

impl SyntheticBench {
    /// Checks every option, and the memory the pair needs against the budget, before
    /// anything is allocated: `BadRequest` for a bad option, `OutOfMemory` past the
    /// budget.
    fn plan(&self) -> Result<Plan> {
        let bad = |m: String| GpuError::Core(Error::BadRequest(m));
        let spec = dflash_core::synthetic::spec(&self.shape).ok_or_else(|| {
            let known = dflash_core::synthetic::NAMES.join(", ");
            bad(format!("no model shape {:?} (known: {known})", self.shape))
        })?;
        let spec = match self.layers {
            Some(n) => spec.first_layers(n).ok_or_else(|| {
                bad(format!(
                    "layers {n}: the shape has {} layers",
                    spec.config.num_layers
                ))
            })?,
            None => spec,
        };
        let slots = spec.drafter.block_size - 1;
        let profile = AcceptProfile::new(self.accept_profile.clone(), slots)
            .map_err(|e| bad(format!("acceptProfile: {e}")))?;
        let blocks = self
            .blocks
            .iter()
            .map(|b| match b.as_str() {
                "auto" => Ok(None),
                n => match n.parse::<usize>() {
                    Ok(n) if n >= 1 => Ok(Some(n)),
                    _ => Err(bad(format!("blocks: {n:?} is neither rows nor \"auto\""))),
                },
            })
            .collect::<Result<Vec<_>>>()?;
        if blocks.is_empty() || self.prompts == 0 || self.prompt_tokens == 0 {
            return Err(bad(
                "blocks, prompts and promptTokens must not be empty".into()
            ));
        }
        let need = spec.target_weight_bytes() + spec.drafter_weight_bytes();
        if let Some(budget) = self.memory_budget.filter(|&b| need as f64 > b) {
            return Err(GpuError::OverBudget {
                need,
                weights: need,
                kv_cache: 0,
                activations: 0,
                budget: budget as u64,
            });
        }
        Ok(Plan {
            spec,
            profile,
            blocks,
        })
    }

    /// Makes the pair, decodes every prompt plainly and with each block, and reports
    /// tokens per second, speedups, tau and whether every output was plain decoding's.
    pub fn run(&self, clock: &dyn Fn() -> f64) -> Result<serde_json::Value> {
        let plan = self.plan()?;
        let t_load = clock();
        let kernels = CpuKernels::Quantized;
        let target = CpuModel::from_weights(host_weights(&plan.spec, self.seed)?, kernels);
        let weights = host_drafter(&plan.spec, self.seed)?;
        let pair = Pair {
            drafter: CpuDrafter::with_kernels(&weights, kernels),
            tok: TextTokenizer::numbered(plan.spec.config.vocab_size)?,
            target,
        };
        let load_s = clock() - t_load;
        let vocab = plan.spec.config.vocab_size;
        let prompts: Vec<Vec<u32>> = (0..self.prompts)
            .map(|i| random_ids(self.prompt_tokens, vocab, self.seed.wrapping_add(i as u64)))
            .collect();
        let mut plain = Vec::new();
        let (mut plain_tokens, mut plain_s) = (0, 0.0);
        for ids in &prompts {
            let req = self.request(ids);
            let r = generate_cpu(&pair.target, &pair.tok, &req, clock, &mut |_| {})?;
            plain_tokens += r.tokens.len();
            plain_s += r.decode_s;
            plain.push(r.tokens);
        }
        let plain_tok_s = plain_tokens as f64 / plain_s.max(1e-9);
        let runs = plan
            .blocks
            .iter()
            .map(|&block| {
                let mut run =
                    self.block_run(&pair, &plan.profile, block, (&prompts, &plain), clock)?;
                run["speedup"] = (run["dflash_tok_s"].as_f64().unwrap_or(0.0) / plain_tok_s).into();
                Ok(run)
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(serde_json::json!({
            "shape": plan.spec.name, "layers": plan.spec.config.num_layers,
            "weight_bytes": plan.spec.target_weight_bytes(),
            "drafter_weight_bytes": plan.spec.drafter_weight_bytes(),
            "accept_profile": plan.profile.0,
            "cpu": { "kernel": dflash_core::cpu::quant_matmul::Kernel::detect().name(),
                     "threads": dflash_core::cpu::quant_matmul::threads() },
            "prompts": self.prompts, "prompt_tokens": self.prompt_tokens,
            "max_new_tokens": self.max_new_tokens, "load_s": load_s,
            "plain_tok_s": plain_tok_s, "plain_tokens": plain_tokens, "runs": runs,
        }))
    }

    /// A greedy request for `ids` with the bench's token budget.
    fn request(&self, ids: &[u32]) -> GenerateRequest {
        GenerateRequest {
            prompt_ids: ids.to_vec(),
            max_new_tokens: self.max_new_tokens,
            sampling: Default::default(),
            stop_strings: vec![],
            context: self.prompt_tokens + self.max_new_tokens + 1,
            interrupt: Default::default(),
            grammar: None,
        }
    }

    /// Every prompt decoded with `block` rows (None: auto, from step costs measured
    /// first) and simulated acceptance, against its plain outputs `truths`.
    fn block_run(
        &self,
        pair: &Pair,
        profile: &AcceptProfile,
        block: Option<usize>,
        (prompts, truths): (&[Vec<u32>], &[Vec<u32>]),
        clock: &dyn Fn() -> f64,
    ) -> Result<serde_json::Value> {
        let policy = match block {
            Some(n) => BlockSize::Fixed(n),
            None => BlockSize::Auto {
                verify_cost: DFlashCpu::new(&pair.drafter, &pair.target)?
                    .measure_step_costs(16, clock)?,
            },
        };
        let (mut tokens, mut secs, mut steps, mut lossless) = (0, 0.0, 0, true);
        for (i, (ids, truth)) in prompts.iter().zip(truths).enumerate() {
            let real = DFlashCpu::new(&pair.drafter, &pair.target)?;
            let seed = self.seed.wrapping_add(i as u64);
            let mut sim = Simulated::new(real, profile, ids, truth, seed);
            let req = self.request(ids);
            let r = generate_speculative_with(
                &pair.target,
                &mut sim,
                &pair.tok,
                &req,
                &policy,
                clock,
                &mut |_| {},
            )?;
            tokens += r.result.tokens.len();
            secs += r.result.decode_s;
            steps += r.steps;
            lossless &= r.result.tokens == *truth;
        }
        Ok(serde_json::json!({
            "block": block.map_or("auto".to_string(), |n| n.to_string()),
            "dflash_tok_s": tokens as f64 / secs.max(1e-9),
            "mean_tau": tokens as f64 / steps.max(1) as f64,
            "steps": steps, "lossless": lossless,
            "step_costs": match &policy { BlockSize::Auto { verify_cost } => Some(verify_cost), _ => None },
        }))
    }
}

/// The synthetic pair on the CPU engine and its numbered tokenizer.
struct Pair {
    target: CpuModel,
    drafter: CpuDrafter,
    tok: TextTokenizer,
}
