//! The drafter's weights on the GPU: uploaded from host weights (a DFlash2 drafter's
//! convolutions and selector too) or already on the device (`GpuDrafterWeights`), and
//! its layers, context caches, RoPE table and activations allocated around them.

use super::memory_plan::{drafter_attention_parts, int8_scratch_cols};
use super::{DFlash2Gpu, DraftLayer, GpuConv, GpuDrafter, SampledProposal};
use crate::blocks::{stack_qkv, GateUp, GpuFfn};
use crate::context::GpuContext;
use crate::error::{GpuError, Result};
use crate::model::{GpuModel, MAX_ROWS};
use crate::ops;
use crate::upload::{concat_rows, f32_buffer, upload_matrix, work_buffer, GpuMatrix};
use dflash_core::cpu::ops::rope_cos_sin;
use dflash_core::drafter::DrafterWeights;
use dflash_core::synthetic_weights::{DrafterLayerTensors, DrafterTensors};

/// A DFlash drafter's weights already on the GPU (made on the device, for instance the
/// random drafters of `dflash bench --synthetic`). DFlash only: no DFlash2 extras.
pub type GpuDrafterWeights = DrafterTensors<GpuMatrix, wgpu::Buffer>;

/// One layer of [`GpuDrafterWeights`].
pub type GpuDrafterLayerWeights = DrafterLayerTensors<GpuMatrix, wgpu::Buffer>;

impl GpuDrafter {
    pub fn new(
        ctx: &GpuContext,
        w: &DrafterWeights,
        target: &GpuModel,
        host_draft_capacity: usize,
    ) -> Result<Self> {
        let c = &w.config;
        Self::plan(ctx, c, &target.config, target.context)?;
        if ctx.tuning.int8_activations {
            ops::dp4a::reserve_scratch(ctx, int8_scratch_cols(c));
        }
        let mut n_bytes = w.fc.n_bytes() as u64;
        let mut layers = Vec::new();
        let mut convs = Vec::new();
        for l in &w.layers {
            for m in [&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down] {
                n_bytes += m.n_bytes() as u64;
            }
            layers.push(upload_layer(ctx, l)?);
            convs.push(match &l.conv {
                Some(cv) => {
                    n_bytes += (cv.attention.projection.n_bytes()
                        + cv.mlp.projection.n_bytes()
                        + 4 * (cv.attention.base.len() + cv.mlp.base.len()))
                        as u64;
                    Some([upload_conv(ctx, &cv.attention)?, upload_conv(ctx, &cv.mlp)?])
                }
                None => None,
            });
        }
        let d2 = match (&c.dflash2, &w.selector) {
            (Some(d), Some(sel)) => Some(DFlash2Gpu::upload(ctx, c, d, sel, &mut n_bytes)?),
            _ => None,
        };
        let gw = GpuDrafterWeights {
            fc: upload_matrix(ctx, "d.fc", &w.fc)?,
            hidden_norm: f32_buffer(ctx, "d.hidden_norm", &w.hidden_norm),
            norm: f32_buffer(ctx, "d.norm", &w.norm),
            layers,
        };
        let mut d = Self::assemble(ctx, c, gw, convs, d2, n_bytes, target, host_draft_capacity);
        if let Some(v) = &w.draft_vocab {
            d.set_draft_vocab(ctx, target, v);
        }
        Ok(d)
    }

    /// A drafter whose weights are already on the GPU (checked against the target first).
    pub fn from_gpu_weights(
        ctx: &GpuContext,
        c: &dflash_core::drafter::DrafterConfig,
        w: GpuDrafterWeights,
        target: &GpuModel,
        host_draft_capacity: usize,
    ) -> Result<Self> {
        Self::plan(ctx, c, &target.config, target.context)?;
        if c.dflash2.is_some() {
            return Err(GpuError::Unsupported(
                "DFlash2 drafters from GPU weights".into(),
            ));
        }
        if w.layers.len() != c.num_layers {
            return Err(GpuError::Core(dflash_core::Error::BadConfig(format!(
                "{} drafter layers for a config of {}",
                w.layers.len(),
                c.num_layers
            ))));
        }
        let mut n_bytes = w.fc.n_bytes;
        for l in &w.layers {
            for m in [&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down] {
                n_bytes += m.n_bytes;
            }
        }
        let convs = (0..c.num_layers).map(|_| None).collect();
        Ok(Self::assemble(
            ctx,
            c,
            w,
            convs,
            None,
            n_bytes,
            target,
            host_draft_capacity,
        ))
    }

    /// Context caches, RoPE table and activations around the weights.
    #[allow(clippy::too_many_arguments)]
    fn assemble(
        ctx: &GpuContext,
        c: &dflash_core::drafter::DrafterConfig,
        w: GpuDrafterWeights,
        convs: Vec<Option<[GpuConv; 2]>>,
        d2: Option<DFlash2Gpu>,
        n_bytes: u64,
        target: &GpuModel,
        host_draft_capacity: usize,
    ) -> Self {
        let cap = target.context + MAX_ROWS;
        let elt = if ctx.f16 { 2 } else { 4 };
        let kv_bytes = (cap * c.kv_dim() * elt) as u64;
        // The norms' vectors beside the matrices counted by the caller.
        let norms = w.hidden_norm.size()
            + w.norm.size()
            + w.layers
                .iter()
                .map(|l| {
                    l.input_norm.size() + l.post_norm.size() + l.q_norm.size() + l.k_norm.size()
                })
                .sum::<u64>();
        let layers = draft_layers(ctx, c, w.layers, convs, kv_bytes);
        // The context's stacked [wk; wv] copies weights the block pass also holds.
        let n_bytes = n_bytes
            + norms
            + layers
                .iter()
                .filter(|l| l.context_kv.len() == 1)
                .map(|l| l.context_kv[0].n_bytes)
                .sum::<u64>();
        let table = rope_table(c, cap);
        let n = MAX_ROWS as u64 * 4;
        let (h, qd, kvd, ff) = (
            c.hidden_size as u64,
            c.q_dim() as u64,
            c.kv_dim() as u64,
            c.intermediate_size as u64,
        );
        GpuDrafter {
            fc: w.fc,
            hidden_norm: w.hidden_norm,
            norm: w.norm,
            layers,
            rope_table: f32_buffer(ctx, "d.rope", &table),
            c: work_buffer(ctx, "d.c", n * h),
            x: work_buffer(ctx, "d.x", n * h),
            xn: work_buffer(ctx, "d.xn", n * h),
            prenorm: work_buffer(ctx, "d.prenorm", ops::prenorm_bytes(c.hidden_size)),
            qkv: work_buffer(ctx, "d.qkv", n * (qd + 2 * kvd)),
            att: work_buffer(ctx, "d.att", n * qd),
            att_parts: {
                let (ml, acc) = drafter_attention_parts(ctx, c, cap);
                [
                    work_buffer(ctx, "d.att_ml", ml),
                    work_buffer(ctx, "d.att_acc", acc),
                ]
            },
            capacity: cap,
            gate: work_buffer(ctx, "d.gate", n * ff),
            up: work_buffer(ctx, "d.up", n * ff),
            ff: work_buffer(ctx, "d.ffo", n * ff),
            ids: work_buffer(ctx, "d.ids", 64),
            drafts: work_buffer(ctx, "d.drafts", 64),
            host_drafts: work_buffer(ctx, "d.host", (host_draft_capacity.max(1) * 4) as u64),
            verdict: work_buffer(ctx, "d.verdict", (MAX_ROWS * 2 * 4) as u64),
            sampled: d2.is_none().then(|| {
                let bytes = (MAX_ROWS * 4 * c.candidate_count()) as u64;
                SampledProposal {
                    ids: work_buffer(ctx, "d.sample_ids", bytes),
                    vals: work_buffer(ctx, "d.sample_vals", bytes),
                    q: work_buffer(ctx, "d.sample_q", bytes),
                    none: work_buffer(ctx, "d.no_selector", 16),
                }
            }),
            d2,
            draft_head: None,
            n_bytes,
            config: c.clone(),
        }
    }
}

/// The draft layers around their weights: stacked QKV for the block pass, stacked
/// `[wk; wv]` for the context, the context caches of `kv_bytes` each.
fn draft_layers(
    ctx: &GpuContext,
    c: &dflash_core::drafter::DrafterConfig,
    weights: Vec<GpuDrafterLayerWeights>,
    convs: Vec<Option<[GpuConv; 2]>>,
    kv_bytes: u64,
) -> Vec<DraftLayer> {
    weights
        .into_iter()
        .zip(convs)
        .zip(&c.layer_kinds)
        .map(|((l, conv), kind)| DraftLayer {
            input_norm: l.input_norm,
            post_norm: l.post_norm,
            qk_norm: [l.q_norm, l.k_norm],
            context_kv: match concat_rows(ctx, "d.context_kv", &[&l.wk, &l.wv]) {
                Some(m) => vec![m],
                None => vec![l.wk.clone(), l.wv.clone()],
            },
            qkv: stack_qkv(ctx, "d.qkv", vec![l.wq, l.wk, l.wv], [None, None, None]),
            wo: l.wo,
            ffn: GpuFfn::Dense {
                gate_up: GateUp::new(ctx, "d.gate_up", l.w_gate, l.w_up),
                down: l.w_down,
            },
            k_ctx: work_buffer(ctx, "d.k_ctx", kv_bytes),
            v_ctx: work_buffer(ctx, "d.v_ctx", kv_bytes),
            window: c.window(*kind).unwrap_or(0),
            causal: c.is_causal(*kind),
            conv,
        })
        .collect()
}

/// (cos, sin) of every position below `cap` and every RoPE frequency of the drafter.
fn rope_table(c: &dflash_core::drafter::DrafterConfig, cap: usize) -> Vec<f32> {
    let inv = c.rope_inv_freq();
    let mut table = Vec::with_capacity(cap * inv.len() * 2);
    for pos in 0..cap {
        for &f in &inv {
            let (cs, sn) = rope_cos_sin(pos, f);
            table.extend([cs, sn]);
        }
    }
    table
}

/// A drafter layer's norms and matrices, uploaded in order.
fn upload_layer(
    ctx: &GpuContext,
    l: &dflash_core::drafter::DrafterLayer,
) -> Result<GpuDrafterLayerWeights> {
    Ok(GpuDrafterLayerWeights {
        input_norm: f32_buffer(ctx, "d.input_norm", &l.input_norm),
        post_norm: f32_buffer(ctx, "d.post_norm", &l.post_norm),
        q_norm: f32_buffer(ctx, "d.q_norm", &l.q_norm),
        k_norm: f32_buffer(ctx, "d.k_norm", &l.k_norm),
        wq: upload_matrix(ctx, "d.wq", &l.wq)?,
        wk: upload_matrix(ctx, "d.wk", &l.wk)?,
        wv: upload_matrix(ctx, "d.wv", &l.wv)?,
        wo: upload_matrix(ctx, "d.wo", &l.wo)?,
        w_gate: upload_matrix(ctx, "d.gate", &l.w_gate)?,
        w_up: upload_matrix(ctx, "d.up", &l.w_up)?,
        w_down: upload_matrix(ctx, "d.down", &l.w_down)?,
    })
}

/// One DFlash2 convolution uploaded: its base kernel, then its projection.
fn upload_conv(ctx: &GpuContext, g: &dflash_core::drafter::GroupedConv) -> Result<GpuConv> {
    Ok(GpuConv {
        base: f32_buffer(ctx, "d2.base", &g.base),
        projection: upload_matrix(ctx, "d2.proj", &g.projection)?,
    })
}

impl DFlash2Gpu {
    /// The selector's weights uploaded (their bytes added to `n_bytes`) and its work
    /// buffers allocated for `MAX_ROWS` block rows.
    fn upload(
        ctx: &GpuContext,
        c: &dflash_core::drafter::DrafterConfig,
        d: &dflash_core::drafter::DFlash2Config,
        sel: &dflash_core::drafter::Selector,
        n_bytes: &mut u64,
    ) -> Result<Self> {
        let n_rows = MAX_ROWS as u64;
        let (pred, succ) = (sel.predecessor.dequantize(), sel.successor.dequantize());
        *n_bytes += (sel.hidden_projection.n_bytes() + 4 * (pred.len() + succ.len())) as u64;
        let k = d.selector_top_k as u64;
        Ok(DFlash2Gpu {
            hidden_projection: upload_matrix(ctx, "d2.hidden_projection", &sel.hidden_projection)?,
            predecessor: f32_buffer(ctx, "d2.predecessor", &pred),
            successor: f32_buffer(ctx, "d2.successor", &succ),
            coef: work_buffer(
                ctx,
                "d2.coef",
                n_rows * 4 * d.projection_rows(c.hidden_size) as u64,
            ),
            xc: work_buffer(ctx, "d2.xc", n_rows * 4 * c.hidden_size as u64),
            o: work_buffer(ctx, "d2.o", n_rows * 4 * c.hidden_size as u64),
            hp: work_buffer(ctx, "d2.hp", n_rows * 4 * d.selector_rank as u64),
            cand_ids: work_buffer(ctx, "d2.cand_ids", n_rows * 4 * k),
            cand_vals: work_buffer(ctx, "d2.cand_vals", n_rows * 4 * k),
            q_vals: work_buffer(ctx, "d2.q_vals", n_rows * 4 * k),
            config: d.clone(),
        })
    }
}
