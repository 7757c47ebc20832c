//! The target model on the GPU: weights uploaded once, KV cache and activations
//! preallocated for the context, one recorded plan of dispatches per row count (1..16),
//! one submission per step, and only token ids read back.

use crate::blocks::{
    self, stack_qkv, GateUp, GpuDeltaNet, GpuExperts, GpuFfn, GpuSharedExpert, LayerBuffers,
    LayerShape, LayerWeights, LinearBuffers, MoeBuffers, StackedQkv,
};
use crate::context::GpuContext;
use crate::error::{GpuError, Result};
use crate::ops;
use crate::pipelines::Dispatch;
use crate::upload::{
    f32_buffer, rows_per_chunk, storage_buffer, upload_matrix, upload_stack, work_buffer, GpuMatrix,
};
use dflash_core::config::ModelConfig;
use dflash_core::cpu::ops::rope_cos_sin;
use dflash_core::quant::QuantMatrix;
use dflash_core::weights::{FeedForward, Mixer, ModelWeights};
use std::collections::HashMap;
use std::rc::Rc;

/// Rows one pass computes at most (`pipelines::MAX_ROWS`, beside the kernels' sizes).
pub use crate::pipelines::MAX_ROWS;

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

struct GpuLayer {
    attn_norm: wgpu::Buffer,
    ffn_norm: wgpu::Buffer,
    /// The mixer's input projection: q, k, v (and the output gate), or a DeltaNet's
    /// `[qkv; z; b; a]`.
    qkv: StackedQkv,
    /// A linear-attention layer's vectors and states (`qkv` and `wo` its projections).
    delta_net: Option<GpuDeltaNet>,
    wo: GpuMatrix,
    ffn: GpuFfn,
    qk_norm: Option<[wgpu::Buffer; 2]>,
    k_cache: wgpu::Buffer,
    v_cache: wgpu::Buffer,
}

impl GpuLayer {
    fn matrices(&self) -> Vec<&GpuMatrix> {
        let mut v: Vec<&GpuMatrix> = self.qkv.iter().map(|p| &p.0).collect();
        v.push(&self.wo);
        v.extend(self.ffn.matrices());
        v
    }

    fn weights(&self) -> LayerWeights<'_> {
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

/// (cos, sin) of every rotary frequency of `c` at each of `context` positions.
fn rope_table(c: &ModelConfig, context: usize) -> Vec<f32> {
    let inv = c.rope_inv_freq();
    let mut table = Vec::with_capacity(context * inv.len() * 2);
    for pos in 0..context {
        for &f in &inv {
            let (cs, sn) = rope_cos_sin(pos, f);
            table.push(cs);
            table.push(sn);
        }
    }
    table
}

impl Activations {
    /// The work buffers of up to `MAX_ROWS` rows (attention over `context` positions,
    /// `n_taps` tapped layers), the state and the readback buffers.
    fn new(ctx: &GpuContext, c: &ModelConfig, context: usize, n_taps: usize) -> Self {
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

/// Floats per row of the feed-forward's work buffers: the MLP's intermediate, or every
/// slot's expert intermediate in a mixture.
fn ffn_width(c: &ModelConfig) -> usize {
    let experts = c
        .moe
        .as_ref()
        .map_or(0, |m| m.experts_per_token * m.expert_intermediate_size);
    c.intermediate_size.max(experts)
}

/// Floats per row of the stacked q, k, v (and attention's output gate).
fn qkv_row(c: &ModelConfig) -> usize {
    c.q_dim() * (1 + c.arch.has_attention_gate() as usize) + 2 * c.kv_dim()
}

/// A hybrid model's DeltaNet sizes.
fn delta_net_shape(c: &ModelConfig) -> Option<ops::DeltaNetShape> {
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

/// Uploads a host tensor: a mixture's expert stacks in chunks that keep each expert
/// whole.
fn upload_weight(
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

fn kv_bytes(c: &ModelConfig, context: usize, f16: bool) -> u64 {
    context as u64 * c.kv_dim() as u64 * if f16 { 2 } else { 4 }
}

/// Weights already on the GPU (uploaded from host weights, or streamed in).
pub type GpuWeights = ModelWeights<GpuMatrix, wgpu::Buffer>;

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

/// The parts of layer `i`'s mixer: its input projection (stacked where the parts share
/// buffers), output projection, q/k norms, and a DeltaNet's vectors with fresh states.
fn gpu_mixer(
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
    fn states(ctx: &GpuContext, shape: ops::DeltaNetShape) -> Self {
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

/// Bytes of one linear layer's convolution inputs and S.
fn state_bytes(s: &ops::DeltaNetShape) -> (u64, u64) {
    let conv = 4 * ((s.kernel - 1).max(1) * s.conv_dim) as u64;
    let heads = 4 * (s.value_heads * s.key_head_dim * s.value_head_dim) as u64;
    (conv, heads)
}

/// Layer `i`'s feed-forward from its uploaded matrices: gate and up stacked where they
/// share buffers.
fn gpu_ffn(ctx: &GpuContext, c: &ModelConfig, i: usize, ffn: FeedForward<GpuMatrix>) -> GpuFfn {
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

impl GpuModel {
    pub fn new(ctx: Rc<GpuContext>, w: &ModelWeights, opts: &GpuModelOptions) -> Result<Self> {
        let opts = Self::checked_options(&w.config, opts)?;
        let memory = plan_memory(&ctx, w, &opts)?;
        let scope = ctx.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let gw = w.try_map(
            |name, m| upload_weight(&ctx, &w.config, name, m),
            |name, v| Ok::<_, GpuError>(f32_buffer(&ctx, name, v)),
        )?;
        let model = Self::assemble(ctx, gw, &opts, memory)?;
        #[cfg(not(target_arch = "wasm32"))]
        if let Some(e) = pollster::block_on(scope.pop()) {
            return Err(GpuError::OutOfMemory(format!("model buffers: {e}")));
        }
        #[cfg(target_arch = "wasm32")]
        drop(scope);
        model.ctx.check_lost()?;
        Ok(model)
    }

    /// A model whose weights are already on the GPU (streamed in by `StreamLoader`).
    pub fn from_gpu_weights(
        ctx: Rc<GpuContext>,
        w: GpuWeights,
        opts: &GpuModelOptions,
    ) -> Result<Self> {
        let opts = Self::checked_options(&w.config, opts)?;
        let memory = plan_buffers(&ctx, &w.config, gpu_weight_bytes(&w), &opts)?;
        let model = Self::assemble(ctx, w, &opts, memory)?;
        model.ctx.check_lost()?;
        Ok(model)
    }

    pub(crate) fn checked_options(
        c: &ModelConfig,
        opts: &GpuModelOptions,
    ) -> Result<GpuModelOptions> {
        if let Some(&bad) = opts.taps.iter().find(|&&t| t >= c.num_layers) {
            return Err(GpuError::Core(dflash_core::Error::BadConfig(format!(
                "tap layer {bad} >= {} layers",
                c.num_layers
            ))));
        }
        if c.head_dim > 256 {
            return Err(GpuError::Unsupported(format!(
                "head_dim {} > 256",
                c.head_dim
            )));
        }
        let context = opts.context.min(c.max_position_embeddings).max(1);
        Ok(GpuModelOptions {
            context,
            ..opts.clone()
        })
    }

    /// KV cache, RoPE table and activations around uploaded weights.
    fn assemble(
        ctx: Rc<GpuContext>,
        w: GpuWeights,
        opts: &GpuModelOptions,
        memory: MemoryPlan,
    ) -> Result<Self> {
        let c = w.config.clone();
        let kvb = kv_bytes(&c, opts.context, ctx.f16);
        let mut layers = Vec::with_capacity(c.num_layers);
        for (i, l) in w.layers.into_iter().enumerate() {
            let (qkv, wo, qk_norm, delta_net) = gpu_mixer(&ctx, &c, i, l.mixer);
            // A linear layer has no KV cache.
            let kv = if delta_net.is_some() { 16 } else { kvb };
            layers.push(GpuLayer {
                attn_norm: l.attn_norm,
                ffn_norm: l.ffn_norm,
                qkv,
                delta_net,
                wo,
                ffn: gpu_ffn(&ctx, &c, i, l.ffn),
                qk_norm,
                k_cache: work_buffer(&ctx, &format!("k_cache.{i}"), kv),
                v_cache: work_buffer(&ctx, &format!("v_cache.{i}"), kv),
            });
        }
        let head = (w.embed, w.lm_head, w.norm);
        Self::around_layers(ctx, c, head, layers, opts, memory)
    }

    /// A second model over this one's weight buffers (shared, not copied: the stacked
    /// matrices too), with its own KV cache, activations, taps and plans; its memory
    /// plan counts no weights.
    pub fn sharing_weights(&self, opts: &GpuModelOptions) -> Result<Self> {
        let opts = Self::checked_options(&self.config, opts)?;
        let memory = plan_buffers(&self.ctx, &self.config, 0, &opts)?;
        let kvb = kv_bytes(&self.config, opts.context, self.ctx.f16);
        let layers = self
            .layers
            .iter()
            .enumerate()
            .map(|(i, l)| GpuLayer {
                attn_norm: l.attn_norm.clone(),
                ffn_norm: l.ffn_norm.clone(),
                qkv: l.qkv.clone(),
                delta_net: l.delta_net.as_ref().map(|dn| GpuDeltaNet {
                    conv_w: dn.conv_w.clone(),
                    dt_bias: dn.dt_bias.clone(),
                    decay: dn.decay.clone(),
                    norm_w: dn.norm_w.clone(),
                    ..GpuDeltaNet::states(&self.ctx, dn.shape)
                }),
                wo: l.wo.clone(),
                ffn: l.ffn.clone(),
                qk_norm: l.qk_norm.clone(),
                k_cache: work_buffer(&self.ctx, &format!("k_cache.{i}"), kvb),
                v_cache: work_buffer(&self.ctx, &format!("v_cache.{i}"), kvb),
            })
            .collect();
        let head = (
            self.embed.clone(),
            self.lm_head.clone(),
            self.out_norm.clone(),
        );
        let config = self.config.clone();
        let model = Self::around_layers(self.ctx.clone(), config, head, layers, &opts, memory)?;
        model.ctx.check_lost()?;
        Ok(model)
    }

    /// The RoPE table, activations and state around a model's layers and head
    /// (embedding, lm_head, final norm).
    fn around_layers(
        ctx: Rc<GpuContext>,
        c: ModelConfig,
        head: (GpuMatrix, Option<GpuMatrix>, wgpu::Buffer),
        layers: Vec<GpuLayer>,
        opts: &GpuModelOptions,
        memory: MemoryPlan,
    ) -> Result<Self> {
        let context = opts.context;
        let table = rope_table(&c, context);
        let act = Activations::new(&ctx, &c, context, opts.taps.len());
        if ctx.tuning.int8_activations {
            ops::dp4a::reserve_scratch(&ctx, int8_scratch_cols(&c, opts.taps.len()));
        }
        Ok(GpuModel {
            embed: head.0,
            lm_head: head.1,
            out_norm: head.2,
            rope_table: storage_buffer(&ctx, "rope_table", bytemuck::cast_slice(&table)),
            layers,
            act,
            plans: HashMap::new(),
            len: 0,
            kv_ids: Vec::new(),
            drafted: 0,
            states_lost: false,
            memory,
            context,
            taps: opts.taps.clone(),
            config: c,
            ctx,
        })
    }

    /// Committed positions.
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Rolls the KV cache back to `len` positions (rows past it are overwritten later).
    /// DFlash's verify pass over a hybrid model: first each linear layer's states kept
    /// (`before`), after acceptance they are put back and the accepted rows replayed
    /// (delta_net.wgsl); nothing for other models.
    pub(crate) fn state_rollback(&self, before: bool) -> Result<Vec<Dispatch>> {
        let (ctx, bufs) = (&*self.ctx, self.layer_buffers());
        let mut d = Vec::new();
        let (Some(lb), true) = (&bufs.linear, self.is_hybrid()) else {
            return Ok(d);
        };
        for dn in self.layers.iter().filter_map(|l| l.delta_net.as_ref()) {
            let b = dn.buffers(lb);
            d.push(ops::delta_net_states(ctx, &dn.shape, &b, !before)?);
            if !before {
                d.extend(ops::delta_net(ctx, &dn.shape, &b, MAX_ROWS, true)?);
            }
        }
        Ok(d)
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

    pub(crate) fn build_plan(&self, n: usize, head: OutputHead) -> Result<Vec<Dispatch>> {
        self.build_plan_tapping_at(n, head, 0)
    }

    /// `build_plan` whose taps land at rows `tap_row..tap_row + n` of the taps buffer (a
    /// deferred DFlash step keeps the rows before it for the drafter's next extension).
    pub(crate) fn build_plan_tapping_at(
        &self,
        n: usize,
        head: OutputHead,
        tap_row: usize,
    ) -> Result<Vec<Dispatch>> {
        let ctx: &GpuContext = &self.ctx;
        let a = &self.act;
        let mut d = ops::embedding(ctx, &self.embed, &a.tokens, &a.x, n)?;
        let (shape, bufs) = (self.layer_shape(), self.layer_buffers());
        let (h, stride) = (
            self.config.hidden_size,
            self.taps.len() * self.config.hidden_size,
        );
        let mut prepared = None;
        for (li, l) in self.layers.iter().enumerate() {
            let w = l.weights();
            let last = li + 1 == self.layers.len();
            // A tap of a layer but the last is the down GEMV's epilogue (its first tap
            // there; a layer tapped twice copies the others).
            let first_tap = self.taps.iter().position(|&t| t == li).filter(|_| !last);
            let tap = first_tap.map(|ti| ops::GemvTap {
                buf: &a.taps,
                offset: tap_row * stride + ti * h,
                stride,
            });
            let b = (&bufs, prepared);
            let mlp_prepared = match &l.delta_net {
                Some(dn) => blocks::delta_net_block(ctx, &mut d, &shape, (&w, dn), b, n)?,
                None => blocks::attention_block(ctx, &mut d, &shape, &w, b, n)?,
            };
            // The norm after the layer: the next layer's, or the final one.
            let next = match self.layers.get(li + 1) {
                Some(l) => l.weights().attn_norm,
                None => &self.out_norm,
            };
            let links = (mlp_prepared, Some(next));
            prepared = blocks::mlp_block(ctx, &mut d, &shape, &w, (&bufs, tap), links, n)?;
            self.copy_taps(&mut d, (li, tap_row), first_tap, n)?;
        }
        if head != OutputHead::None {
            self.head(&mut d, (n, prepared), head)?;
        }
        Ok(d)
    }

    /// Layer `li`'s taps but the one its down GEMV wrote (`in_epilogue`): copies of the
    /// residual stream, or of the final norm's output for the last layer (the
    /// reference's `output_hidden_states`; the head norms `x` again itself).
    fn copy_taps(
        &self,
        d: &mut Vec<Dispatch>,
        (li, tap_row): (usize, usize),
        in_epilogue: Option<usize>,
        n: usize,
    ) -> Result<()> {
        let (ctx, a, c) = (&*self.ctx, &self.act, &self.config);
        let h = c.hidden_size;
        let last = li + 1 == self.layers.len();
        if last && self.taps.contains(&li) {
            d.push(ops::rmsnorm(
                ctx,
                c.rms_norm_eps,
                &self.out_norm,
                &a.x,
                &a.xn,
                n,
                h,
            )?);
        }
        let tapped = if last { &a.xn } else { &a.x };
        let stride = self.taps.len() * h;
        for (ti, _) in self
            .taps
            .iter()
            .enumerate()
            .filter(|&(ti, &t)| t == li && Some(ti) != in_epilogue)
        {
            d.push(ops::copy_rows(
                ctx,
                tapped,
                &a.taps,
                &a.state,
                n,
                h,
                stride,
                tap_row * stride + ti * h,
            )?);
        }
        Ok(())
    }

    /// The sizes of every layer's dispatches.
    fn layer_shape(&self) -> LayerShape {
        let c = &self.config;
        LayerShape {
            hidden: c.hidden_size,
            n_heads: c.num_heads,
            n_kv_heads: c.num_kv_heads,
            head_dim: c.head_dim,
            intermediate: c.intermediate_size,
            rope_style: c.rope.style,
            rope_dim: c.rope.dim,
            eps: c.rms_norm_eps,
            causal: true,
            capacity: self.context,
            gate: c.arch.has_attention_gate(),
        }
    }

    fn layer_buffers(&self) -> LayerBuffers<'_> {
        let a = &self.act;
        LayerBuffers {
            state: &a.state,
            rope_table: &self.rope_table,
            x: &a.x,
            xn: &a.xn,
            prenorm: &a.prenorm,
            qkv: &a.qkv,
            att: &a.att,
            att_parts: [&a.att_parts[0], &a.att_parts[1]],
            gate: &a.gate,
            up: &a.up,
            ff: &a.ff,
            conv: None,
            linear: a
                .linear
                .as_deref()
                .map(|[mixed, read, pass_start]| LinearBuffers {
                    mixed,
                    read,
                    position: &a.state,
                    pass_start,
                }),
            moe: a.moe.as_deref().map(
                |[scores, routes, weights, expert_out, shared_out, shared_gate]| MoeBuffers {
                    scores,
                    routes,
                    weights,
                    expert_out,
                    shared: [shared_out, shared_gate],
                },
            ),
        }
    }

    /// Final RMSNorm + lm_head (one GEMV), then the greedy head (`ops::greedy_head`) or
    /// the sampler.
    fn head(
        &self,
        d: &mut Vec<Dispatch>,
        (n, prepared): (usize, blocks::Prepared),
        head: OutputHead,
    ) -> Result<()> {
        let (ctx, a) = (&*self.ctx, &self.act);
        let lm = self.lm_head.as_ref().unwrap_or(&self.embed);
        let c = &self.config;
        let (norm, x) = blocks::norm_input(
            ctx,
            d,
            (&self.out_norm, c.rms_norm_eps),
            (&a.x, &a.xn, &a.prenorm),
            (prepared, n),
            c.hidden_size,
        )?;
        if head == OutputHead::Sample {
            d.extend(ops::gemv_fused(ctx, lm, x, &a.logits, n, &norm)?);
            let b = ops::SampleBuffers {
                params: &a.sample_params,
                state: &a.state,
                logits: &a.logits,
                tokens: &a.out_tokens,
                scratch: &a.sample_scratch,
            };
            d.extend(ops::sample(ctx, &b, n, c.vocab_size)?);
            return Ok(());
        }
        let bufs = (&a.logits, &a.best, &a.out_tokens);
        d.extend(ops::greedy_head(ctx, (lm, x, &norm), bufs, n, None)?);
        Ok(())
    }

    /// Encodes and submits one pass over `tokens` (at most 16) at positions
    /// `len..len+n`. Nothing is read back.
    pub(crate) fn submit_pass(&mut self, tokens: &[u32], head: OutputHead) -> Result<()> {
        self.prepare_pass(tokens, head)?;
        let cb = self.encode_pass(tokens.len(), head);
        self.ctx.queue.submit([cb]);
        self.record_ids(self.len, tokens);
        self.len += tokens.len();
        Ok(())
    }

    /// Checks a pass over `tokens`, builds its plan once, writes the tokens and state.
    fn prepare_pass(&mut self, tokens: &[u32], head: OutputHead) -> Result<()> {
        let n = tokens.len();
        assert!((1..=MAX_ROWS).contains(&n));
        if self.len + n > self.context {
            return Err(GpuError::Core(dflash_core::Error::ContextOverflow {
                prompt_tokens: self.len + n,
                max_new_tokens: 0,
                context: self.context,
            }));
        }
        let vocab = self.config.vocab_size;
        if let Some(&bad) = tokens.iter().find(|&&t| t as usize >= vocab) {
            return Err(GpuError::Core(dflash_core::Error::TokenOutOfRange {
                id: bad,
                vocab,
            }));
        }
        self.ctx.check_lost()?;
        if self.states_lost {
            return Err(GpuError::Core(dflash_core::Error::Internal(
                "a linear-attention state was rolled back; the GPU keeps no earlier states".into(),
            )));
        }
        if !self.plans.contains_key(&(n, head)) {
            let plan = self.build_plan(n, head)?;
            self.plans.insert((n, head), plan);
        }
        let q = &self.ctx.queue;
        q.write_buffer(&self.act.tokens, 0, bytemuck::cast_slice(tokens));
        let state = PassState {
            rows: n as u32,
            ..PassState::at(self.len)
        };
        state.write(&self.ctx, &self.act.state);
        Ok(())
    }

    /// The command buffer of a prepared pass of `n` rows (and the copy of its tokens to
    /// the read-back buffer when it has a head).
    fn encode_pass(&self, n: usize, head: OutputHead) -> wgpu::CommandBuffer {
        let mut enc = self
            .ctx
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some("step"),
            });
        {
            let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: Some("step"),
                timestamp_writes: None,
            });
            for disp in &self.plans[&(n, head)] {
                disp.encode(&mut pass);
            }
        }
        if head != OutputHead::None {
            enc.copy_buffer_to_buffer(
                &self.act.out_tokens,
                0,
                &self.act.readback,
                0,
                (n * 4) as u64,
            );
        }
        enc.finish()
    }

    /// Every dispatch of a pass of `n` rows at position `pos` timed on the GPU (the
    /// profiler); the committed length is left as it was.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn profile_pass(
        &mut self,
        n: usize,
        head: OutputHead,
        pos: usize,
        runs: usize,
        now: &dyn Fn() -> f64,
    ) -> Result<crate::profile::PlanProfile> {
        let keep = self.len;
        self.len = pos.min(self.context.saturating_sub(n));
        self.kv_ids.truncate(self.len);
        self.drafted = self.drafted.min(self.len);
        let r = self.prepare_pass(&vec![0; n], head);
        let keys = self.len + n;
        self.len = keep;
        r?;
        let plan: Vec<&Dispatch> = self.plans[&(n, head)].iter().collect();
        let name = format!("{n}-row pass at {pos}");
        crate::profile::profile_plan(&self.ctx, &name, &plan, &[], keys, runs, now)
    }

    /// Host times of ordinary one-row steps at the current length (the median of
    /// `steps`): encoding, submission, and waiting for the mapped token.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn host_times(
        &mut self,
        steps: usize,
        now: &dyn Fn() -> f64,
    ) -> Result<crate::profile::HostTimes> {
        let mut t = (Vec::new(), Vec::new(), Vec::new());
        let mut token = 0;
        for _ in 0..steps.max(1) {
            self.prepare_pass(&[token], OutputHead::Argmax)?;
            let t0 = now();
            let cb = self.encode_pass(1, OutputHead::Argmax);
            let t1 = now();
            self.ctx.queue.submit([cb]);
            let t2 = now();
            let bytes = self.ctx.read_mapped(&self.act.readback)?;
            let t3 = now();
            self.record_ids(self.len, &[token]);
            self.len += 1;
            token = bytemuck::cast_slice::<u8, u32>(&bytes)[0];
            t.0.push(t1 - t0);
            t.1.push(t2 - t1);
            t.2.push(t3 - t2);
        }
        use crate::profile::median;
        Ok(crate::profile::HostTimes {
            encode: median(&mut t.0),
            submit: median(&mut t.1),
            map: median(&mut t.2),
        })
    }

    /// Every weight matrix the decode step reads (q/k/v and gate/up stacked where the
    /// engine stacks them).
    pub fn weight_matrices(&self) -> Vec<&GpuMatrix> {
        let mut v: Vec<&GpuMatrix> = self.layers.iter().flat_map(|l| l.matrices()).collect();
        v.push(self.lm_head.as_ref().unwrap_or(&self.embed));
        v
    }

    /// One step over up to 16 tokens; returns the greedy next token of every row.
    /// The host reads back only those ids (4 bytes per row).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn step(&mut self, tokens: &[u32]) -> Result<Vec<u32>> {
        self.step_with(tokens, OutputHead::Argmax)
    }

    /// Submits a one-row decode step without waiting for the previous one's token: the
    /// input is `token` where the host knows it, else the token the previous step left
    /// on the GPU (each step copies its output into the next step's input). The step's
    /// token goes to `token_readback[slot]`; returns the submission to wait for.
    pub(crate) fn submit_fed_step(
        &mut self,
        token: Option<u32>,
        head: OutputHead,
        slot: usize,
    ) -> Result<wgpu::SubmissionIndex> {
        // The check and the plan of a one-row pass (a token the GPU feeds is in range).
        self.prepare_pass(&[token.unwrap_or(0)], head)?;
        let mut enc = self.ctx.device.create_command_encoder(&Default::default());
        if token.is_none() {
            // Over prepare_pass's placeholder (its write lands before this submission).
            enc.copy_buffer_to_buffer(&self.act.out_tokens, 0, &self.act.tokens, 0, 4);
        }
        {
            let mut pass = enc.begin_compute_pass(&Default::default());
            for disp in &self.plans[&(1, head)] {
                disp.encode(&mut pass);
            }
        }
        let out = &self.act.token_readback[slot];
        enc.copy_buffer_to_buffer(&self.act.out_tokens, 0, out, 0, 4);
        let index = self.ctx.queue.submit([enc.finish()]);
        self.record_ids(self.len, &[token.unwrap_or(UNKNOWN_ID)]);
        self.len += 1;
        Ok(index)
    }

    /// Sets the sampler's parameters for `OutputHead::Sample` passes (greedy parameters are
    /// served by the argmax head instead).
    pub fn set_sampling(&self, sp: &dflash_core::sampling::SamplingParams) -> Result<()> {
        sp.validate()?;
        if sp.has_penalties() {
            return Err(GpuError::Unsupported(
                "repetition, frequency and presence penalties on the GPU sampler (use the CPU engine)".into(),
            ));
        }
        let v = self.config.vocab_size;
        self.ctx.queue.write_buffer(
            &self.act.sample_params,
            0,
            bytemuck::bytes_of(&ops::sample_params(v, v, sp, 1)),
        );
        Ok(())
    }

    /// One step; the next token of every row from the given head.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn step_with(&mut self, tokens: &[u32], head: OutputHead) -> Result<Vec<u32>> {
        pollster::block_on(self.step_with_async(tokens, head))
    }

    /// `step_with` for hosts whose GPU answers through the event loop (the browser).
    pub async fn step_with_async(&mut self, tokens: &[u32], head: OutputHead) -> Result<Vec<u32>> {
        self.submit_pass(tokens, head)?;
        let bytes = self.ctx.read_mapped_async(&self.act.readback).await?;
        Ok(bytemuck::cast_slice::<u8, u32>(&bytes)[..tokens.len()].to_vec())
    }

    /// Prefill of a new sequence in chunks of 16 rows through the same kernels as decode (so a position's
    /// results are the same bits as in a one-row step); returns the greedy next token.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn prefill(&mut self, tokens: &[u32]) -> Result<u32> {
        self.prefill_with(tokens, OutputHead::Argmax)
    }

    /// Prefill of a new sequence (from position 0), choosing the next token with `head`
    /// (Argmax or Sample).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn prefill_with(&mut self, tokens: &[u32], head: OutputHead) -> Result<u32> {
        pollster::block_on(self.prefill_with_async(tokens, head))
    }

    /// `prefill_with` for event-loop hosts.
    pub async fn prefill_with_async(&mut self, tokens: &[u32], head: OutputHead) -> Result<u32> {
        self.prefill_from_async(tokens, 0, head).await
    }

    /// The prefill of `tokens` past their first `keep` rows, which the cache holds from
    /// the last request (`reusable_rows`).
    pub(crate) async fn prefill_from_async(
        &mut self,
        tokens: &[u32],
        keep: usize,
        head: OutputHead,
    ) -> Result<u32> {
        self.truncate(keep);
        if tokens.len() <= keep {
            return Err(GpuError::Core(dflash_core::Error::EmptyPrompt));
        }
        let chunks: Vec<&[u32]> = tokens[keep..].chunks(MAX_ROWS).collect();
        for ch in &chunks[..chunks.len() - 1] {
            self.submit_pass(ch, OutputHead::None)?;
        }
        let last = self.step_with_async(chunks[chunks.len() - 1], head).await?;
        Ok(*last.last().unwrap())
    }

    /// Logits of every row of the last pass (tests and tools only: the decode loop never
    /// reads logits back).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn read_logits(&self, n: usize) -> Result<Vec<f32>> {
        let bytes =
            self.ctx
                .read_back(&self.act.logits, 0, (n * self.config.vocab_size * 4) as u64)?;
        Ok(bytemuck::cast_slice(&bytes).to_vec())
    }

    /// Tap rows of the last pass: `[n, taps.len() * hidden]`.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn read_taps(&self, n: usize) -> Result<Vec<f32>> {
        let bytes = self.ctx.read_back(
            &self.act.taps,
            0,
            (n * self.taps.len() * self.config.hidden_size * 4) as u64,
        )?;
        Ok(bytemuck::cast_slice(&bytes).to_vec())
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

    /// GB/s of the one-row GEMV over every weight matrix of the model (the decode
    /// traffic: weights, x and y, counted as the copy kernel counts its bytes), `reps`
    /// repetitions per pass, GPU timestamps where the adapter has them.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn gemv_gbps(&self, reps: usize, trials: usize, now: &dyn Fn() -> f64) -> Result<f64> {
        let ctx: &GpuContext = &self.ctx;
        let mats = self.weight_matrices();
        let cols = mats.iter().map(|m| m.cols).max().unwrap_or(1);
        let rows = mats.iter().map(|m| m.rows).max().unwrap_or(1);
        let x = work_buffer(ctx, "gemv_x", 4 * cols as u64);
        let y = work_buffer(ctx, "gemv_y", 4 * rows as u64);
        let mut d = Vec::new();
        for m in mats {
            d.extend(ops::gemv(ctx, m, &x, &y, 1, false)?);
        }
        crate::profile::gbps(ctx, &d.iter().collect::<Vec<_>>(), reps, trials, now)
    }

    /// Measured cost of a pass over b rows relative to one row, for b in 0..=max (index 0
    /// unused): the device-specific input of the adaptive block size. Call it before a
    /// prefill: it runs passes over the first 16 positions of the KV cache.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn measure_row_costs(&mut self, max: usize, now: &dyn Fn() -> f64) -> Result<Vec<f64>> {
        let keep = self.len;
        let probe = [1, 2, 4, 8, 16]
            .into_iter()
            .filter(|&b| b <= max.min(self.context))
            .collect::<Vec<_>>();
        let mut times = Vec::new();
        for &b in &probe {
            let toks = vec![0u32; b];
            self.truncate(0);
            self.step(&toks)?; // compile and warm up
            let mut best = f64::INFINITY;
            for _ in 0..2 {
                self.truncate(0);
                let t0 = now();
                self.step(&toks)?;
                best = best.min(now() - t0);
            }
            times.push((b, best));
        }
        self.len = keep;
        self.kv_ids.truncate(keep);
        Ok(dflash_core::speculative::interpolate_costs(&times, max))
    }

    /// Greedy generation: prefill then one-row steps; stops at a stop id.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn generate_greedy(
        &mut self,
        prompt: &[u32],
        max_new: usize,
        is_stop: &dyn Fn(u32) -> bool,
    ) -> Result<Vec<u32>> {
        self.truncate(0);
        let mut out = Vec::new();
        if max_new == 0 {
            return Ok(out);
        }
        let mut next = self.prefill(prompt)?;
        loop {
            if is_stop(next) {
                break;
            }
            out.push(next);
            if out.len() >= max_new {
                break;
            }
            next = self.step(&[next])?[0];
        }
        Ok(out)
    }
}
