//! The target model's memory plan: what its KV cache and activations take beside its
//! weights (checked against the adapter's limits and the budget before anything is
//! allocated), the options it is sized by, and the sizes of its work rows.

use crate::context::GpuContext;
use crate::error::{GpuError, Result};
use crate::ops;
use crate::pipelines::MAX_ROWS;
use crate::upload::rows_per_chunk;
use dflash_core::config::ModelConfig;
use dflash_core::quant::QuantMatrix;
use dflash_core::weights::ModelWeights;

/// GPU memory a model will take, split the way users size models by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryPlan {
    pub weights: u64,
    pub kv_cache: u64,
    pub activations: u64,
}

impl MemoryPlan {
    pub fn total(&self) -> u64 {
        self.weights + self.kv_cache + self.activations
    }
}

#[derive(Debug, Clone)]
pub struct GpuModelOptions {
    /// KV capacity in tokens.
    pub context: usize,
    /// Layers whose residual output is written to the taps buffer, in this order (the
    /// last layer's after the final norm).
    pub taps: Vec<usize>,
    /// Refuse to load when the plan exceeds this many bytes (None: no budget).
    pub memory_budget: Option<u64>,
}

impl Default for GpuModelOptions {
    fn default() -> Self {
        GpuModelOptions {
            context: 4096,
            taps: vec![],
            memory_budget: None,
        }
    }
}

/// Bytes of chunked attention's two partials buffers where the adapter chunks attention.
pub(crate) fn attention_parts_bytes(
    ctx: &GpuContext,
    c: &ModelConfig,
    context: usize,
) -> (u64, u64) {
    if ctx.tuning.chunked_attention {
        ops::attention_partial_bytes(c.num_heads, c.head_dim, context)
    } else {
        (16, 16)
    }
}

/// Floats per row of the feed-forward's work buffers: the MLP's intermediate, or every
/// slot's expert intermediate in a mixture.
pub(super) fn ffn_width(c: &ModelConfig) -> usize {
    let experts = c
        .moe
        .as_ref()
        .map_or(0, |m| m.experts_per_token * m.expert_intermediate_size);
    c.intermediate_size.max(experts)
}

/// Floats per row of the stacked q, k, v (and attention's output gate).
pub(super) fn qkv_row(c: &ModelConfig) -> usize {
    c.q_dim() * (1 + c.arch.has_attention_gate() as usize) + 2 * c.kv_dim()
}

/// A hybrid model's DeltaNet sizes.
pub(super) fn delta_net_shape(c: &ModelConfig) -> Option<ops::DeltaNetShape> {
    c.hybrid.as_ref().map(|h| ops::DeltaNetShape {
        conv_dim: h.conv_dim(),
        kernel: h.conv_kernel,
        key_heads: h.key_heads,
        value_heads: h.value_heads,
        key_head_dim: h.key_head_dim,
        value_head_dim: h.value_head_dim,
        eps: c.rms_norm_eps,
        tiled: h.tiled_value_heads,
    })
}

/// Bytes of a hybrid model's shared DeltaNet work rows (16), and of every linear
/// layer's recurrent states (convolution inputs and S) with their copies from before a
/// verify pass and its input projection's rows (what DFlash's rollback replays).
fn linear_bytes(c: &ModelConfig) -> (u64, u64) {
    let (Some(h), Some(s)) = (&c.hybrid, delta_net_shape(c)) else {
        return (0, 0);
    };
    let rows = 4 * MAX_ROWS as u64 * (s.conv_dim + h.value_dim()) as u64;
    let layers = h.linear_layers.iter().filter(|&&l| l).count() as u64;
    let (conv, heads) = state_bytes(&s);
    let per_layer = 2 * (conv + heads) + 4 * (MAX_ROWS * s.proj_stride()) as u64;
    (rows, layers * per_layer)
}

/// Bytes of a hybrid model's recurrent states, their pre-verify copies and projection
/// rows: part of its plan's `kv_cache` (0 for other models).
pub fn recurrent_state_bytes(c: &ModelConfig) -> u64 {
    linear_bytes(c).1
}

/// Bytes of a mixture's own work buffers for 16 rows (none for a dense model).
fn moe_buffer_bytes(c: &ModelConfig) -> u64 {
    c.moe.as_ref().map_or(0, |m| {
        let slots = (MAX_ROWS * m.experts_per_token) as u64;
        let shared = 4 * (MAX_ROWS * (c.hidden_size + 1)) as u64;
        4 * (MAX_ROWS * m.num_experts) as u64
            + slots * 8
            + slots * 4 * c.hidden_size as u64
            + shared
    })
}

pub(super) fn kv_bytes(c: &ModelConfig, context: usize, f16: bool) -> u64 {
    context as u64 * c.kv_dim() as u64 * if f16 { 2 } else { 4 }
}

/// The memory plan, and a typed error if any buffer would exceed the adapter's limits.
/// Nothing is allocated.
pub fn plan_memory(
    ctx: &GpuContext,
    w: &ModelWeights,
    opts: &GpuModelOptions,
) -> Result<MemoryPlan> {
    let max = ctx.max_binding();
    let mut mats: Vec<&QuantMatrix> = vec![&w.embed];
    if let Some(l) = &w.lm_head {
        mats.push(l);
    }
    for l in &w.layers {
        mats.extend(l.mixer_matrices());
        mats.extend(l.ffn.matrices());
    }
    for m in &mats {
        rows_per_chunk(m, max)?;
    }
    plan_buffers(ctx, &w.config, w.n_bytes() as u64, opts)
}

/// The KV cache and activations of a model with `weight_bytes` of weights, checked
/// against the adapter's limits and the budget.
pub fn plan_buffers(
    ctx: &GpuContext,
    c: &ModelConfig,
    weight_bytes: u64,
    opts: &GpuModelOptions,
) -> Result<MemoryPlan> {
    let max = ctx.max_binding();
    let check = |what: String, need: u64| -> Result<()> {
        if need > max {
            return Err(GpuError::LimitExceeded {
                what,
                need,
                limit: max,
                limit_name: "max_storage_buffer_binding_size",
            });
        }
        Ok(())
    };
    let kv_layer = kv_bytes(c, opts.context, ctx.f16);
    let (linear_rows, linear_states) = linear_bytes(c);
    let attention_layers = (0..c.num_layers)
        .filter(|&i| !c.hybrid.as_ref().is_some_and(|h| h.is_linear(i)))
        .count() as u64;
    check(
        format!("the KV cache of one layer ({} tokens)", opts.context),
        kv_layer,
    )?;
    let rope = (opts.context * c.rope.dim / 2 * 8) as u64;
    check(format!("the RoPE table ({} tokens)", opts.context), rope)?;
    let n = MAX_ROWS as u64;
    let f = 4u64;
    let logits = n * c.vocab_size as u64 * f;
    check("the logits of 16 rows".into(), logits)?;
    // x, xn, qkv, att, gate, up, ff, the norm split's prenorm; the greedy head's partials
    // (one per row at most); chunked attention's partials.
    let parts = attention_parts_bytes(ctx, c, opts.context);
    check("chunked attention's partial outputs".into(), parts.1)?;
    let activations = parts.0
        + parts.1
        + n * f * (2 * c.hidden_size + 2 * c.q_dim() + 2 * c.kv_dim() + 3 * ffn_width(c)) as u64
        + moe_buffer_bytes(c)
        + ops::prenorm_bytes(c.hidden_size)
        + linear_rows
        + 2 * logits
        + logits
        + n * f * (opts.taps.len() * c.hidden_size) as u64
        + ops::sample_scratch_bytes(ctx, MAX_ROWS, c.vocab_size)
        + ops::mask_bytes(c.vocab_size)
        + n * 4 * (2 + 2 * ops::LOGPROB_TOP as u64)
        + int8_scratch_bytes(ctx, c, opts.taps.len())
        + rope;
    let plan = MemoryPlan {
        weights: weight_bytes,
        // A linear layer's recurrent state in the place of its KV cache.
        kv_cache: kv_layer * 2 * attention_layers + linear_states,
        activations,
    };
    if let Some(budget) = opts.memory_budget {
        if plan.total() > budget {
            return Err(GpuError::OverBudget {
                need: plan.total(),
                weights: plan.weights,
                kv_cache: plan.kv_cache,
                activations: plan.activations,
                budget,
            });
        }
    }
    Ok(plan)
}

/// The 8-bit activations' shared scratch where the tuning asks for them: 16 rows of the
/// widest GEMV input (the MLP's down projection, the hidden size, a linear layer's values,
/// or a DFlash drafter's taps, `taps` x hidden, for its fc).
fn int8_scratch_bytes(ctx: &GpuContext, c: &ModelConfig, taps: usize) -> u64 {
    if !ctx.tuning.int8_activations {
        return 0;
    }
    ops::dp4a::scratch_bytes(int8_scratch_cols(c, taps))
}

/// The widest GEMV input of a model with `taps` tapped layers (`int8_scratch_bytes`).
pub(crate) fn int8_scratch_cols(c: &ModelConfig, taps: usize) -> usize {
    let linear = c.hybrid.as_ref().map_or(0, |h| h.value_dim());
    let widest = [
        c.hidden_size,
        c.q_dim(),
        ffn_width(c),
        linear,
        taps * c.hidden_size,
    ];
    widest.into_iter().max().unwrap_or(0)
}

/// Bytes of one linear layer's convolution inputs and S.
pub(super) fn state_bytes(s: &ops::DeltaNetShape) -> (u64, u64) {
    let conv = 4 * ((s.kernel - 1).max(1) * s.conv_dim) as u64;
    let heads = 4 * (s.value_heads * s.key_head_dim * s.value_head_dim) as u64;
    (conv, heads)
}
