//! The drafter's memory plan: checked against its target and the adapter's limits, and
//! what it allocates beside its weights (context cache, activations, a wider 8-bit
//! scratch), before anything is allocated.

use super::GpuDrafter;
use crate::context::GpuContext;
use crate::error::{GpuError, Result};
use crate::model::MAX_ROWS;
use crate::ops;

/// GPU memory a drafter takes beside its weights (DFlash2's selector buffers aside).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DrafterPlan {
    /// The context K/V cache of every layer.
    pub context_cache: u64,
    /// Block activations, the RoPE table and the host drafts.
    pub activations: u64,
}

/// Bytes of the drafter's chunked-attention partials over `capacity` positions.
pub(super) fn drafter_attention_parts(
    ctx: &GpuContext,
    c: &dflash_core::drafter::DrafterConfig,
    capacity: usize,
) -> (u64, u64) {
    if ctx.tuning.chunked_attention {
        ops::attention_partial_bytes(c.num_heads, c.head_dim, capacity)
    } else {
        (16, 16)
    }
}

/// The widest input of the drafter's GEMVs (its fc reads every tap).
pub(super) fn int8_scratch_cols(c: &dflash_core::drafter::DrafterConfig) -> usize {
    let widest = [
        c.hidden_size,
        c.q_dim(),
        c.intermediate_size,
        c.n_taps() * c.hidden_size,
    ];
    widest.into_iter().max().unwrap_or(0)
}

/// Bytes of the 8-bit activations' shared scratch a drafter adds: a new one where its
/// widest input is wider than its target's (the target's plans keep the old one).
fn int8_scratch_growth(
    ctx: &GpuContext,
    c: &dflash_core::drafter::DrafterConfig,
    target: &dflash_core::config::ModelConfig,
) -> u64 {
    let ours = int8_scratch_cols(c);
    if !ctx.tuning.int8_activations || ours <= crate::model::int8_scratch_cols(target, c.n_taps()) {
        return 0;
    }
    ops::dp4a::scratch_bytes(ours)
}

impl GpuDrafter {
    /// Checks a drafter against its target (context `target_context`) and the adapter's
    /// limits, and sizes what it allocates beside its weights. Nothing is allocated.
    pub fn plan(
        ctx: &GpuContext,
        c: &dflash_core::drafter::DrafterConfig,
        target: &dflash_core::config::ModelConfig,
        target_context: usize,
    ) -> Result<DrafterPlan> {
        c.validate_against(target)?;
        if let Some(d) = &c.dflash2 {
            if d.selector_top_k > 256 {
                return Err(GpuError::LimitExceeded {
                    what: "the selector's candidates per slot".into(),
                    need: d.selector_top_k as u64,
                    limit: 256,
                    limit_name: "selector_top_k (dflash2.wgsl)",
                });
            }
            let cb = (c.vocab_size * d.selector_rank * 4) as u64;
            if cb > ctx.max_binding() {
                return Err(GpuError::LimitExceeded {
                    what: "a selector codebook (f32)".into(),
                    need: cb,
                    limit: ctx.max_binding(),
                    limit_name: "max_storage_buffer_binding_size",
                });
            }
        }
        let cap = (target_context + MAX_ROWS) as u64;
        let elt = if ctx.f16 { 2 } else { 4 };
        let kv_bytes = cap * (c.kv_dim() * elt) as u64;
        if kv_bytes > ctx.max_binding() {
            return Err(GpuError::LimitExceeded {
                what: "the drafter's context cache of one layer".into(),
                need: kv_bytes,
                limit: ctx.max_binding(),
                limit_name: "max_storage_buffer_binding_size",
            });
        }
        let n = MAX_ROWS as u64 * 4;
        let rows = 3 * c.hidden_size + 2 * c.q_dim() + 2 * c.kv_dim() + 3 * c.intermediate_size;
        let parts = drafter_attention_parts(ctx, c, cap as usize);
        Ok(DrafterPlan {
            context_cache: 2 * c.num_layers as u64 * kv_bytes,
            activations: n * rows as u64
                + int8_scratch_growth(ctx, c, target)
                + ops::prenorm_bytes(c.hidden_size)
                + cap * (c.head_dim / 2 * 8) as u64
                + (cap + 1) * 4
                + 256
                + parts.0
                + parts.1,
        })
    }
}
