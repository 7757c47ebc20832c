//! The target model on the GPU: weights uploaded once, KV cache and activations
//! preallocated for the context, one recorded plan of dispatches per row count (1..16),
//! one submission per step, and only token ids read back.
//!
//! Here the `GpuModel` itself and its cache's bookkeeping (committed length, the tokens
//! of its rows, rollback); the rest by concern under `model/`: the memory plan and the
//! options it is sized by (`memory_plan`), the activations (`activations`), the weights
//! and each layer's buffers (`weights`), making a model (`load`), its recorded plans
//! (`plan`), running passes (`step`) and measuring them (`profiling`, native only).

mod activations;
mod load;
mod memory_plan;
mod plan;
#[cfg(not(target_arch = "wasm32"))]
mod profiling;
mod step;
mod weights;

pub(crate) use activations::PassState;
pub(crate) use memory_plan::int8_scratch_cols;
pub use memory_plan::{
    plan_buffers, plan_memory, recurrent_state_bytes, GpuModelOptions, MemoryPlan,
};
pub use weights::{gpu_weight_bytes, GpuWeights};

use crate::context::GpuContext;
use crate::pipelines::Dispatch;
use crate::upload::GpuMatrix;
use activations::Activations;
use dflash_core::config::ModelConfig;
use std::collections::HashMap;
use std::rc::Rc;
use weights::GpuLayer;

/// Rows one pass computes at most (`pipelines::MAX_ROWS`, beside the kernels' sizes).
pub use crate::pipelines::MAX_ROWS;

/// What a pass produces beyond the KV cache: its output head (the lm_head and what
/// follows it), not to be confused with attention heads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OutputHead {
    /// No lm_head (prefill chunks before the last).
    None,
    /// lm_head and argmax for every row.
    Argmax,
    /// lm_head and the sampler (temperature, top-k, top-p, min-p) for every row.
    Sample,
    /// `Argmax` under a grammar's mask (the logits it refuses -inf first; the mask of
    /// row 0 for every row).
    ArgmaxMasked,
    /// `Sample` under a grammar's mask.
    SampleMasked,
    /// `Argmax` under a mask per row (a DFlash step's verify rows).
    ArgmaxRowMasks,
    /// `Sample` under a mask per row.
    SampleRowMasks,
}

impl OutputHead {
    /// The head of `sampling` (argmax when greedy), masked where a grammar constrains.
    pub fn of(sampling: &dflash_core::sampling::SamplingParams, masked: bool) -> Self {
        match (sampling.is_greedy(), masked) {
            (true, false) => OutputHead::Argmax,
            (false, false) => OutputHead::Sample,
            (true, true) => OutputHead::ArgmaxMasked,
            (false, true) => OutputHead::SampleMasked,
        }
    }

    /// The head with a mask per row (a verify pass's), of a masked or unmasked head.
    pub fn row_masked(self) -> Self {
        match self.samples() {
            true => OutputHead::SampleRowMasks,
            false => OutputHead::ArgmaxRowMasks,
        }
    }

    /// Whether it draws with the sampler (else argmax, or nothing).
    pub fn samples(self) -> bool {
        use OutputHead::*;
        matches!(self, Sample | SampleMasked | SampleRowMasks)
    }

    /// Whether a grammar's masks apply: None, one for every row, or one per row.
    pub fn masks(self) -> Option<bool> {
        use OutputHead::*;
        match self {
            ArgmaxMasked | SampleMasked => Some(true),
            ArgmaxRowMasks | SampleRowMasks => Some(false),
            None | Argmax | Sample => Option::None,
        }
    }
}

pub struct GpuModel {
    pub ctx: Rc<GpuContext>,
    pub config: ModelConfig,
    pub memory: MemoryPlan,
    pub context: usize,
    pub taps: Vec<usize>,
    pub(crate) embed: GpuMatrix,
    pub(crate) lm_head: Option<GpuMatrix>,
    out_norm: wgpu::Buffer,
    rope_table: wgpu::Buffer,
    layers: Vec<GpuLayer>,
    pub(crate) act: Activations,
    pub(crate) plans: HashMap<(usize, OutputHead), Vec<Dispatch>>,
    /// Committed positions in the KV cache.
    pub(crate) len: usize,
    /// The token of each leading row of the KV cache that is known (at most `len`;
    /// `UNKNOWN_ID` where a fed step's input is not read back yet): what the next prompt
    /// is matched against for multi-turn reuse.
    pub(crate) kv_ids: Vec<u32>,
    /// Leading rows whose drafter context (DFlash) matches the cache.
    pub(crate) drafted: usize,
    /// A linear layer's recurrent state no longer matches `len` (rolled back): the next
    /// pass is refused until a reset to the start.
    states_lost: bool,
}

/// A row's token the host has not seen (never equal to a token id).
pub(crate) const UNKNOWN_ID: u32 = u32::MAX;

impl GpuModel {
    /// Committed positions.
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether some layers keep a recurrent state (Gated DeltaNet).
    pub fn is_hybrid(&self) -> bool {
        self.layers.iter().any(|l| l.delta_net.is_some())
    }

    /// A hybrid model's recurrent states go back to the start with `len` 0 (cleared);
    /// any other rollback loses them (the next pass is an error, not wrong logits).
    pub fn truncate(&mut self, len: usize) {
        let len = self.len.min(len);
        let states: Vec<&wgpu::Buffer> = self
            .layers
            .iter()
            .flat_map(|l| l.delta_net.iter().flat_map(|d| [&d.conv_state, &d.s_state]))
            .collect();
        if len < self.len && !states.is_empty() {
            if len == 0 {
                let mut enc = self.ctx.device.create_command_encoder(&Default::default());
                states.iter().for_each(|b| enc.clear_buffer(b, 0, None));
                self.ctx.queue.submit([enc.finish()]);
                self.states_lost = false;
            } else {
                self.states_lost = true;
            }
        }
        self.len = len;
        self.kv_ids.truncate(self.len);
        self.drafted = self.drafted.min(self.len);
    }

    /// A pass past the committed rows ran and is not committed (a pipelined step after
    /// the end of generation): a hybrid model's recurrent states include it, so they are
    /// lost like a rollback's (the next prompt is prefilled from the start).
    pub(crate) fn states_ran_ahead(&mut self) {
        self.states_lost |= self.is_hybrid();
    }

    /// Forgets which tokens the KV cache holds, so that the next prompt is prefilled
    /// whole (`resetChat`).
    pub fn forget_cached(&mut self) {
        self.truncate(0);
    }

    /// Rows of the cache the next prompt may reuse (see `reusable_prefix`); with
    /// `drafted_too`, only rows the drafter's context holds as well.
    pub(crate) fn reusable_rows(&self, prompt: &[u32], drafted_too: bool) -> usize {
        let k = dflash_core::generate::reusable_prefix(&self.kv_ids, prompt);
        let k = match drafted_too {
            true => k.min(self.drafted),
            false => k,
        };
        // A recurrent state is kept only for the end of the cache: reused whole or not
        // (not at all once lost, e.g. to a pipelined step past the end of generation;
        // after DFlash the drafter's context ends before the cache, so not then either).
        if self.is_hybrid() && (k != self.len || self.states_lost) {
            return 0;
        }
        k
    }

    /// Records the tokens of the rows `at..at + tokens.len()` (rows past them are
    /// forgotten).
    pub(crate) fn record_ids(&mut self, at: usize, tokens: &[u32]) {
        self.kv_ids.truncate(at);
        if self.kv_ids.len() == at {
            self.kv_ids.extend_from_slice(tokens);
        }
    }

    pub fn pipelines_compiled(&self) -> usize {
        self.ctx.pipelines.len()
    }

    /// Every weight matrix the decode step reads (q/k/v and gate/up stacked where the
    /// engine stacks them).
    pub fn weight_matrices(&self) -> Vec<&GpuMatrix> {
        let mut v: Vec<&GpuMatrix> = self.layers.iter().flat_map(|l| l.matrices()).collect();
        v.push(self.lm_head.as_ref().unwrap_or(&self.embed));
        v
    }

    /// Bytes of weights one decode step reads: every layer matrix, the norms and lm_head.
    pub fn weight_bytes_per_token(&self) -> u64 {
        let lm = self.lm_head.as_ref().unwrap_or(&self.embed).n_bytes;
        let norms = 2 * self.config.hidden_size as u64 * 4;
        lm + self
            .layers
            .iter()
            .map(|l| l.matrices().iter().map(|m| m.n_bytes).sum::<u64>() + norms)
            .sum::<u64>()
    }
}
