//! The target model's activations: the work buffers of up to `MAX_ROWS` rows, the pass
//! state every kernel reads its position from (`PassState`), and the read-back buffers.

use super::memory_plan::{attention_parts_bytes, delta_net_shape, ffn_width, qkv_row};
use crate::context::GpuContext;
use crate::ops;
use crate::pipelines::MAX_ROWS;
use crate::upload::work_buffer;
use dflash_core::config::ModelConfig;

/// The layout of the `state` buffer every kernel reads its first row's position from
/// (`ext_state`, where the drafter's context grows, has the same layout and uses only the
/// position): written by the host before a pass, advanced on the GPU by DFlash's accept
/// kernels (dflash.wgsl `commit`: position and anchor).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, bytemuck::Pod, bytemuck::Zeroable)]
pub(crate) struct PassState {
    /// `state[0]`: the position of the pass's first row (the committed length).
    pub position: u32,
    /// `state[1]`: rows in the pass (for reading; no kernel needs it).
    pub rows: u32,
    /// `state[2]`: DFlash's anchor, the token the next block starts with.
    pub anchor: u32,
    pub pad: u32,
}

impl PassState {
    pub(crate) fn at(position: usize) -> Self {
        PassState {
            position: position as u32,
            ..Default::default()
        }
    }

    pub(crate) fn write(&self, ctx: &GpuContext, buffer: &wgpu::Buffer) {
        ctx.queue.write_buffer(buffer, 0, bytemuck::bytes_of(self));
    }
}

pub(crate) struct Activations {
    pub(crate) tokens: wgpu::Buffer,
    pub(crate) state: wgpu::Buffer,
    pub(crate) ext_state: wgpu::Buffer,
    pub(crate) result: wgpu::Buffer,
    pub(crate) x: wgpu::Buffer,
    /// RMSNorm(x) where the adapter does not fuse the norm into the next GEMV.
    pub(crate) xn: wgpu::Buffer,
    /// The next norm's x * weight and partial sums (`Tuning::norm_in_residual`).
    pub(crate) prenorm: wgpu::Buffer,
    /// q, k and v of each row: `[16, q_dim + 2 kv_dim]`.
    pub(crate) qkv: wgpu::Buffer,
    pub(crate) att: wgpu::Buffer,
    /// Chunked attention's partials: (max, sum) and outputs per (row, head, chunk).
    pub(crate) att_parts: [wgpu::Buffer; 2],
    pub(crate) gate: wgpu::Buffer,
    pub(crate) up: wgpu::Buffer,
    pub(crate) ff: wgpu::Buffer,
    /// A mixture of experts' router scores, routes, weights, expert outputs, and the
    /// shared expert's output and gate.
    pub(crate) moe: Option<Box<[wgpu::Buffer; 6]>>,
    /// A hybrid model's DeltaNet rows (convolved q/k/v, read-out) and where the last
    /// verify pass began.
    pub(crate) linear: Option<Box<[wgpu::Buffer; 3]>>,
    pub(crate) logits: wgpu::Buffer,
    /// A grammar's masks of the pass's rows (`ops::mask_logits`).
    pub(crate) logit_mask: wgpu::Buffer,
    /// The rows' log-probabilities (`ops::logprobs`) and their read-back.
    pub(crate) lp_vals: wgpu::Buffer,
    pub(crate) lp_ids: wgpu::Buffer,
    pub(crate) lp_readback: wgpu::Buffer,
    /// The greedy head's workgroup partials: `[16, argmax_parts]` (value, index).
    pub(crate) best: wgpu::Buffer,
    pub(crate) out_tokens: wgpu::Buffer,
    pub(crate) sample_params: wgpu::Buffer,
    pub(crate) sample_scratch: ops::SampleScratch,
    pub(crate) taps: wgpu::Buffer,
    pub(crate) readback: wgpu::Buffer,
    /// Pipelined decoding: where the step in flight and the one before it leave their
    /// token for the host (alternately).
    pub(crate) token_readback: [wgpu::Buffer; 2],
}

impl Activations {
    /// The work buffers of up to `MAX_ROWS` rows (attention over `context` positions,
    /// `n_taps` tapped layers), the state and the readback buffers.
    pub(super) fn new(ctx: &GpuContext, c: &ModelConfig, context: usize, n_taps: usize) -> Self {
        let n = MAX_ROWS as u64;
        let f = 4u64;
        let wb = |name: &str, size: u64| work_buffer(ctx, name, size);
        Activations {
            tokens: wb("tokens", n * 4),
            state: wb("state", 16),
            ext_state: wb("ext_state", 16),
            result: wb("result", (n + 4) * 4),
            x: wb("x", n * f * c.hidden_size as u64),
            xn: wb("xn", n * f * c.hidden_size as u64),
            prenorm: wb("prenorm", ops::prenorm_bytes(c.hidden_size)),
            qkv: wb("qkv", n * f * qkv_row(c) as u64),
            att: wb("att", n * f * c.q_dim() as u64),
            att_parts: {
                let (ml, acc) = attention_parts_bytes(ctx, c, context);
                [wb("att_ml", ml), wb("att_acc", acc)]
            },
            gate: wb("gate", n * f * ffn_width(c) as u64),
            up: wb("up", n * f * ffn_width(c) as u64),
            ff: wb("ff", n * f * ffn_width(c) as u64),
            linear: delta_net_shape(c).map(|s| {
                let read = n * f * (s.value_heads * s.value_head_dim) as u64;
                Box::new([
                    wb("linear_mixed", n * f * s.conv_dim as u64),
                    wb("linear_read", read),
                    wb("pass_start", 16),
                ])
            }),
            moe: c.moe.as_ref().map(|m| {
                let slots = n * m.experts_per_token as u64;
                Box::new([
                    wb("router_scores", n * f * m.num_experts as u64),
                    wb("routes", slots * 4),
                    wb("route_weights", slots * f),
                    wb("expert_out", slots * f * c.hidden_size as u64),
                    wb("shared_out", n * f * c.hidden_size as u64),
                    wb("shared_gate", n * f),
                ])
            }),
            logits: wb("logits", n * f * c.vocab_size as u64),
            logit_mask: wb("logit_mask", ops::mask_bytes(c.vocab_size)),
            lp_vals: wb("lp_vals", n * 4 * (1 + ops::LOGPROB_TOP as u64)),
            lp_ids: wb("lp_ids", n * 4 * ops::LOGPROB_TOP as u64),
            lp_readback: ctx.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("logprobs readback"),
                size: n * 4 * (2 + 2 * ops::LOGPROB_TOP as u64),
                usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            }),
            best: wb("best", n * 8 * c.vocab_size as u64),
            out_tokens: wb("out_tokens", n * 4),
            sample_params: ctx.buffer_with(
                "sample_params",
                &[0u8; std::mem::size_of::<ops::SampleParams>()],
                wgpu::BufferUsages::UNIFORM,
            ),
            sample_scratch: ops::SampleScratch::new(ctx, MAX_ROWS, c.vocab_size),
            taps: wb("taps", n * f * (n_taps.max(1) * c.hidden_size) as u64),
            readback: ctx.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("readback"),
                size: (n + 4) * 4,
                usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            }),
            token_readback: [0, 1].map(|_| {
                ctx.device.create_buffer(&wgpu::BufferDescriptor {
                    label: Some("token readback"),
                    size: 16,
                    usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                    mapped_at_creation: false,
                })
            }),
        }
    }
}
