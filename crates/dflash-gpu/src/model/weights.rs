//! The target model's weights on the GPU: `GpuWeights` (uploaded or streamed in), each
//! layer's buffers around them (stacked projections, a DeltaNet's vectors and fresh
//! states, the feed-forward, the KV cache) and their byte count.

use super::memory_plan::{delta_net_shape, state_bytes};
use crate::blocks::{
    stack_qkv, GateUp, GpuDeltaNet, GpuExperts, GpuFfn, GpuSharedExpert, LayerWeights, StackedQkv,
};
use crate::context::GpuContext;
use crate::error::Result;
use crate::ops;
use crate::pipelines::MAX_ROWS;
use crate::upload::{upload_matrix, upload_stack, work_buffer, GpuMatrix};
use dflash_core::config::ModelConfig;
use dflash_core::quant::QuantMatrix;
use dflash_core::weights::{FeedForward, Mixer, ModelWeights};

pub(super) struct GpuLayer {
    pub(super) attn_norm: wgpu::Buffer,
    pub(super) ffn_norm: wgpu::Buffer,
    /// The mixer's input projection: q, k, v (and the output gate), or a DeltaNet's
    /// `[qkv; z; b; a]`.
    pub(super) qkv: StackedQkv,
    /// A linear-attention layer's vectors and states (`qkv` and `wo` its projections).
    pub(super) delta_net: Option<GpuDeltaNet>,
    pub(super) wo: GpuMatrix,
    pub(super) ffn: GpuFfn,
    pub(super) qk_norm: Option<[wgpu::Buffer; 2]>,
    pub(super) k_cache: wgpu::Buffer,
    pub(super) v_cache: wgpu::Buffer,
}

impl GpuLayer {
    pub(super) fn matrices(&self) -> Vec<&GpuMatrix> {
        let mut v: Vec<&GpuMatrix> = self.qkv.iter().map(|p| &p.0).collect();
        v.push(&self.wo);
        v.extend(self.ffn.matrices());
        v
    }

    pub(super) fn weights(&self) -> LayerWeights<'_> {
        LayerWeights {
            attn_norm: &self.attn_norm,
            ffn_norm: &self.ffn_norm,
            qkv: &self.qkv,
            qk_norm: self.qk_norm.as_ref().map(|[q, k]| [q, k]),
            wo: &self.wo,
            ffn: &self.ffn,
            k_cache: &self.k_cache,
            v_cache: &self.v_cache,
            window: 0,
            causal: false,
            conv: None,
        }
    }
}

/// Uploads a host tensor: a mixture's expert stacks in chunks that keep each expert
/// whole.
pub(super) fn upload_weight(
    ctx: &GpuContext,
    c: &ModelConfig,
    name: &str,
    m: &QuantMatrix,
) -> Result<GpuMatrix> {
    match (&c.moe, name.starts_with("experts_")) {
        (Some(moe), true) => upload_stack(ctx, name, m, moe.num_experts),
        _ => upload_matrix(ctx, name, m),
    }
}

/// Weights already on the GPU (uploaded from host weights, or streamed in).
pub type GpuWeights = ModelWeights<GpuMatrix, wgpu::Buffer>;

/// The parts of layer `i`'s mixer: its input projection (stacked where the parts share
/// buffers), output projection, q/k norms, and a DeltaNet's vectors with fresh states.
pub(super) fn gpu_mixer(
    ctx: &GpuContext,
    c: &ModelConfig,
    i: usize,
    mixer: Mixer<GpuMatrix, wgpu::Buffer>,
) -> (
    StackedQkv,
    GpuMatrix,
    Option<[wgpu::Buffer; 2]>,
    Option<GpuDeltaNet>,
) {
    let label = format!("qkv.{i}");
    match (mixer, delta_net_shape(c)) {
        (Mixer::Attention(a), _) => {
            let w = [a.wq, a.wk, a.wv].into_iter().chain(a.gate).collect();
            let qk_norm = a.q_norm.zip(a.k_norm).map(|(q, k)| [q, k]);
            (
                stack_qkv(ctx, &label, w, [a.bq, a.bk, a.bv]),
                a.wo,
                qk_norm,
                None,
            )
        }
        (Mixer::DeltaNet(d), Some(shape)) => {
            let dn = GpuDeltaNet {
                conv_w: d.conv,
                dt_bias: d.dt_bias,
                decay: d.decay,
                norm_w: d.norm,
                ..GpuDeltaNet::states(ctx, shape)
            };
            let w = vec![d.qkv, d.z, d.b, d.a];
            (
                stack_qkv(ctx, &label, w, [None, None, None]),
                d.out,
                None,
                Some(dn),
            )
        }
        (Mixer::DeltaNet(_), None) => unreachable!("linear layers come with a HybridConfig"),
    }
}

impl GpuDeltaNet {
    /// Fresh (zero) states, their copies and projection rows around empty vectors: the
    /// caller sets the vectors.
    pub(super) fn states(ctx: &GpuContext, shape: ops::DeltaNetShape) -> Self {
        let (conv, heads) = state_bytes(&shape);
        let empty = || work_buffer(ctx, "unset", 16);
        GpuDeltaNet {
            conv_w: empty(),
            dt_bias: empty(),
            decay: empty(),
            norm_w: empty(),
            conv_state: work_buffer(ctx, "conv_state", conv),
            s_state: work_buffer(ctx, "s_state", heads),
            conv_pre: work_buffer(ctx, "conv_pre", conv),
            s_pre: work_buffer(ctx, "s_pre", heads),
            proj: work_buffer(
                ctx,
                "linear_proj",
                4 * (MAX_ROWS * shape.proj_stride()) as u64,
            ),
            shape,
        }
    }
}

/// Layer `i`'s feed-forward from its uploaded matrices: gate and up stacked where they
/// share buffers.
pub(super) fn gpu_ffn(
    ctx: &GpuContext,
    c: &ModelConfig,
    i: usize,
    ffn: FeedForward<GpuMatrix>,
) -> GpuFfn {
    match (ffn, &c.moe) {
        (FeedForward::Dense { gate, up, down }, _) => GpuFfn::Dense {
            gate_up: GateUp::new(ctx, &format!("gate_up.{i}"), gate, up),
            down,
        },
        (FeedForward::Moe(m), Some(moe)) => GpuFfn::Moe(GpuExperts {
            router: m.router,
            gate_up: GateUp::new(ctx, &format!("experts_gate_up.{i}"), m.gate, m.up),
            down: m.down,
            shared: m.shared.map(|s| {
                Box::new(GpuSharedExpert {
                    gate_up: GateUp::new(ctx, &format!("shared_gate_up.{i}"), s.gate, s.up),
                    down: s.down,
                    weigh: s.weigh,
                })
            }),
            shape: ops::ExpertShape {
                n_experts: moe.num_experts,
                k: moe.experts_per_token,
                normalize: moe.norm_topk_prob,
                hidden: c.hidden_size,
            },
        }),
        (FeedForward::Moe(_), None) => {
            unreachable!("ModelWeights::load gives experts only with a MoeConfig")
        }
    }
}

/// Bytes of weights on the GPU.
pub fn gpu_weight_bytes(w: &GpuWeights) -> u64 {
    let v = |b: &wgpu::Buffer| b.size();
    let mut n = w.embed.n_bytes + w.lm_head.as_ref().map_or(0, |m| m.n_bytes) + v(&w.norm);
    for l in &w.layers {
        n += v(&l.attn_norm) + v(&l.ffn_norm);
        n += l.mixer_vectors().into_iter().map(v).sum::<u64>();
        n += l
            .mixer_matrices()
            .into_iter()
            .chain(l.ffn.matrices())
            .map(|m| m.n_bytes)
            .sum::<u64>();
    }
    n
}
