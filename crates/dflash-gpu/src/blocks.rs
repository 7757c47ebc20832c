//! The transformer layer's dispatches, written once for the target model and the DFlash
//! drafter: an attention block (RMSNorm + stacked QKV GEMV, per-head norms + RoPE + KV
//! store, attention, o_proj + residual) and an MLP block (RMSNorm + stacked gate/up with
//! SwiGLU, down + residual). The norm goes into the following GEMV where the adapter
//! fuses it (`Tuning::fuse_norm`); DFlash2's convolutions around a sublayer keep it apart.
//! Where the adapter splits it (`Tuning::norm_in_residual`), the residual GEMV before a
//! norm does its share: each block returns the partial sums its last residual GEMV left
//! for the norm after it (`Prepared`), and takes those of the GEMV before it.

use crate::context::GpuContext;
use crate::error::Result;
use crate::ops;
use crate::pipelines::Dispatch;
use crate::upload::{concat_f32, concat_rows, GpuMatrix};
use dflash_core::config::RopeStyle;

/// The feed-forward's gate and up projections: stacked (`[gate; up]`, one GEMV with the
/// SwiGLU in its epilogue) where they can share buffers, else apart.
#[derive(Clone)]
pub(crate) enum GateUp {
    Stacked(GpuMatrix),
    Apart { gate: GpuMatrix, up: GpuMatrix },
}

impl GateUp {
    pub(crate) fn new(ctx: &GpuContext, label: &str, gate: GpuMatrix, up: GpuMatrix) -> Self {
        match concat_rows(ctx, label, &[&gate, &up]) {
            Some(m) => GateUp::Stacked(m),
            None => GateUp::Apart { gate, up },
        }
    }

    pub(crate) fn matrices(&self) -> Vec<&GpuMatrix> {
        match self {
            GateUp::Stacked(m) => vec![m],
            GateUp::Apart { gate, up } => vec![gate, up],
        }
    }
}

/// A layer's feed-forward: a SwiGLU MLP, or a mixture of experts.
#[derive(Clone)]
pub(crate) enum GpuFfn {
    Dense { gate_up: GateUp, down: GpuMatrix },
    Moe(GpuExperts),
}

/// A mixture of experts: the router, every expert's gate and up (`[gate; up]` of the
/// whole stacks where they share buffers) and down, stacked by expert.
#[derive(Clone)]
pub(crate) struct GpuExperts {
    pub router: GpuMatrix,
    pub gate_up: GateUp,
    pub down: GpuMatrix,
    pub shared: Option<Box<GpuSharedExpert>>,
    pub shape: ops::ExpertShape,
}

/// A mixture's shared expert: `[gate; up]`, down and its weighing row.
#[derive(Clone)]
pub(crate) struct GpuSharedExpert {
    pub gate_up: GateUp,
    pub down: GpuMatrix,
    pub weigh: GpuMatrix,
}

impl GpuFfn {
    pub(crate) fn matrices(&self) -> Vec<&GpuMatrix> {
        match self {
            GpuFfn::Dense { gate_up, down } => {
                let mut v = gate_up.matrices();
                v.push(down);
                v
            }
            GpuFfn::Moe(e) => {
                let mut v = vec![&e.router];
                v.extend(e.gate_up.matrices());
                v.push(&e.down);
                if let Some(s) = &e.shared {
                    v.extend(s.gate_up.matrices());
                    v.extend([&s.down, &s.weigh]);
                }
                v
            }
        }
    }
}

/// q, k and v rows with their biases: one stacked matrix where the three can share
/// buffers (one GEMV), else the three in order.
pub(crate) type StackedQkv = Vec<(GpuMatrix, Option<wgpu::Buffer>)>;

/// q, k and v (and their biases), and the output gate where the model has one, stacked
/// where they can share buffers.
pub(crate) fn stack_qkv(
    ctx: &GpuContext,
    label: &str,
    w: Vec<GpuMatrix>,
    b: [Option<wgpu::Buffer>; 3],
) -> StackedQkv {
    match concat_rows(ctx, label, &w.iter().collect::<Vec<_>>()) {
        Some(m) => {
            let bias = match &b {
                [Some(q), Some(k), Some(v)] if w.len() == 3 => Some(concat_f32(
                    ctx,
                    label,
                    &[(q, w[0].rows), (k, w[1].rows), (v, w[2].rows)],
                )),
                _ => None,
            };
            vec![(m, bias)]
        }
        None => w.into_iter().zip(b.into_iter().chain([None])).collect(),
    }
}

/// The sizes a layer's dispatches are built from.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LayerShape {
    pub hidden: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub intermediate: usize,
    pub rope_style: RopeStyle,
    pub rope_dim: usize,
    pub eps: f32,
    /// Causal attention (the target), or every row over the whole context and block
    /// (the drafter's block pass).
    pub causal: bool,
    /// Positions the KV cache holds.
    pub capacity: usize,
    /// Attention's output multiplied by sigmoid of a gate projected beside q, k, v (the
    /// gate's rows follow v's in the stacked projection).
    pub gate: bool,
}

impl LayerShape {
    fn q_dim(&self) -> usize {
        self.n_heads * self.head_dim
    }
    fn kv_dim(&self) -> usize {
        self.n_kv_heads * self.head_dim
    }
    /// Floats per row of the stacked projection: q, k, v and the gate where there is one.
    pub(crate) fn qkv_row(&self) -> usize {
        self.q_dim() * (1 + self.gate as usize) + 2 * self.kv_dim()
    }
}

/// A Gated DeltaNet layer's vectors, its recurrent states (convolution inputs and S)
/// with their copies from before a verify pass, its input projection's rows of the last
/// pass (what DFlash's rollback replays), and sizes; its input projection `[qkv; z; b;
/// a]` is the layer's `qkv` and its output projection its `wo`.
#[derive(Clone)]
pub(crate) struct GpuDeltaNet {
    pub conv_w: wgpu::Buffer,
    pub dt_bias: wgpu::Buffer,
    pub decay: wgpu::Buffer,
    pub norm_w: wgpu::Buffer,
    pub conv_state: wgpu::Buffer,
    pub s_state: wgpu::Buffer,
    pub conv_pre: wgpu::Buffer,
    pub s_pre: wgpu::Buffer,
    pub proj: wgpu::Buffer,
    pub shape: ops::DeltaNetShape,
}

impl GpuDeltaNet {
    pub(crate) fn buffers<'a>(&'a self, lb: &LinearBuffers<'a>) -> ops::DeltaNetBuffers<'a> {
        ops::DeltaNetBuffers {
            proj: &self.proj,
            conv_pre: &self.conv_pre,
            s_pre: &self.s_pre,
            position: lb.position,
            pass_start: lb.pass_start,
            conv_w: &self.conv_w,
            conv_state: &self.conv_state,
            mixed: lb.mixed,
            s_state: &self.s_state,
            dt_bias: &self.dt_bias,
            decay: &self.decay,
            norm_w: &self.norm_w,
            read: lb.read,
        }
    }
}

/// A DeltaNet pass's shared work rows (the convolved q/k/v, the gated read-out), the
/// pass state and where the last verify pass began.
pub(crate) struct LinearBuffers<'a> {
    pub mixed: &'a wgpu::Buffer,
    pub read: &'a wgpu::Buffer,
    pub position: &'a wgpu::Buffer,
    pub pass_start: &'a wgpu::Buffer,
}

/// DFlash2's convolution of one sublayer: the kernel projection and base kernel.
pub(crate) struct ConvWeights<'a> {
    pub projection: &'a GpuMatrix,
    pub base: &'a wgpu::Buffer,
    /// Kernel taps and channel group size.
    pub taps: usize,
    pub group: usize,
}

/// One layer's weights and KV cache as the block builders take them.
pub(crate) struct LayerWeights<'a> {
    pub attn_norm: &'a wgpu::Buffer,
    pub ffn_norm: &'a wgpu::Buffer,
    pub qkv: &'a [(GpuMatrix, Option<wgpu::Buffer>)],
    pub qk_norm: Option<[&'a wgpu::Buffer; 2]>,
    pub wo: &'a GpuMatrix,
    pub ffn: &'a GpuFfn,
    pub k_cache: &'a wgpu::Buffer,
    pub v_cache: &'a wgpu::Buffer,
    /// Keys visible before a query (0: all).
    pub window: usize,
    /// Causal inside the pass for this layer even where the shape is not (a draft
    /// block's sliding layers).
    pub causal: bool,
    /// DFlash2: the attention and MLP sublayers' convolutions.
    pub conv: Option<[ConvWeights<'a>; 2]>,
}

/// DFlash2's work buffers: the convolution coefficients of the current sublayer, its
/// convolved input and its output before the second convolution.
pub(crate) struct ConvBuffers<'a> {
    pub coef: &'a wgpu::Buffer,
    pub xc: &'a wgpu::Buffer,
    pub o: &'a wgpu::Buffer,
}

/// The activations a layer reads and writes (each `[16, width]`).
pub(crate) struct LayerBuffers<'a> {
    /// Positions: `state[0]` is the first row's.
    pub state: &'a wgpu::Buffer,
    pub rope_table: &'a wgpu::Buffer,
    /// The residual stream.
    pub x: &'a wgpu::Buffer,
    /// RMSNorm(x) where the norm is not fused.
    pub xn: &'a wgpu::Buffer,
    /// The next norm's x * weight and partial sums from a residual GEMV
    /// (`ops::prenorm_bytes`).
    pub prenorm: &'a wgpu::Buffer,
    /// q, k, v of each row: `[16, q_dim + 2 kv_dim]`.
    pub qkv: &'a wgpu::Buffer,
    pub att: &'a wgpu::Buffer,
    /// Chunked attention's partials: (max, sum) and outputs per (row, head, chunk).
    pub att_parts: [&'a wgpu::Buffer; 2],
    pub gate: &'a wgpu::Buffer,
    pub up: &'a wgpu::Buffer,
    pub ff: &'a wgpu::Buffer,
    pub conv: Option<ConvBuffers<'a>>,
    pub moe: Option<MoeBuffers<'a>>,
    pub linear: Option<LinearBuffers<'a>>,
}

/// A mixture of experts' work buffers (gate, up and ff hold `[16, k, expert
/// intermediate]` there): router scores `[16, experts]`, each row's experts (u32) and
/// weights `[16, k]`, the experts' outputs `[16, k, hidden]`.
pub(crate) struct MoeBuffers<'a> {
    pub scores: &'a wgpu::Buffer,
    pub routes: &'a wgpu::Buffer,
    pub weights: &'a wgpu::Buffer,
    pub expert_out: &'a wgpu::Buffer,
    /// The shared expert's output `[16, hidden]` and gate `[16]`.
    pub shared: [&'a wgpu::Buffer; 2],
}

/// The partial sums of squares per row that the residual GEMV before a norm left with
/// x * the norm's weight in the prenorm buffer (`Tuning::norm_in_residual`); `None`
/// where it left x alone.
pub(crate) type Prepared = Option<usize>;

/// Pushes RMSNorm(x) by `w` where the adapter does not fuse it into the next GEMV, and
/// returns that GEMV's fusion and input: the prenorm buffer where the residual GEMV
/// before did the norm's share (`prepared`), x with the norm in its prologue, else xn.
pub(crate) fn norm_input<'a>(
    ctx: &GpuContext,
    d: &mut Vec<Dispatch>,
    (w, eps): (&'a wgpu::Buffer, f32),
    (x, xn, prenorm): (&'a wgpu::Buffer, &'a wgpu::Buffer, &'a wgpu::Buffer),
    (prepared, n): (Prepared, usize),
    hidden: usize,
) -> Result<(ops::GemvFusion<'a>, &'a wgpu::Buffer)> {
    if let Some(parts) = prepared {
        let f = ops::GemvFusion {
            prenormed: Some(ops::Prenormed {
                buf: prenorm,
                parts,
                eps,
            }),
            ..Default::default()
        };
        return Ok((f, prenorm));
    }
    if ctx.tuning.fuse_norm {
        let f = ops::GemvFusion {
            norm: Some((w, eps)),
            ..Default::default()
        };
        return Ok((f, x));
    }
    d.push(ops::rmsnorm(ctx, eps, w, x, xn, n, hidden)?);
    Ok((ops::GemvFusion::default(), xn))
}

/// A sublayer's input: the fused or separate norm, then DFlash2's convolution (side 0)
/// where the layer has one (the norm apart, the GEMV reading the convolved rows).
fn sublayer_input<'a>(
    ctx: &GpuContext,
    d: &mut Vec<Dispatch>,
    s: &LayerShape,
    (norm, prepared): (&'a wgpu::Buffer, Prepared),
    conv: Option<&ConvWeights<'a>>,
    b: &LayerBuffers<'a>,
    n: usize,
) -> Result<(ops::GemvFusion<'a>, &'a wgpu::Buffer)> {
    let (Some(cv), Some(cb)) = (conv, &b.conv) else {
        let bufs = (b.x, b.xn, b.prenorm);
        return norm_input(ctx, d, (norm, s.eps), bufs, (prepared, n), s.hidden);
    };
    d.push(ops::rmsnorm(ctx, s.eps, norm, b.x, b.xn, n, s.hidden)?);
    d.extend(ops::gemv(ctx, cv.projection, b.xn, cb.coef, n, false)?);
    let shape = conv_shape(s, cv, 0);
    d.push(ops::grouped_conv(
        ctx, &shape, b.xn, cb.coef, cv.base, cb.xc, n, false,
    )?);
    Ok((ops::GemvFusion::default(), cb.xc))
}

/// A sublayer's output projection `m` of `input` added to the residual: directly (and
/// into `tap` where given, and the share of the norm `next` where the adapter splits
/// norms, in the GEMV's epilogue), or through DFlash2's convolution (side 1) where the
/// layer has one.
fn sublayer_output(
    ctx: &GpuContext,
    d: &mut Vec<Dispatch>,
    s: &LayerShape,
    (m, input, tap): (&GpuMatrix, &wgpu::Buffer, Option<ops::GemvTap>),
    (conv, next): (Option<&ConvWeights>, Option<&wgpu::Buffer>),
    b: &LayerBuffers,
    n: usize,
) -> Result<Prepared> {
    let (Some(cv), Some(cb)) = (conv, &b.conv) else {
        let room =
            tap.is_none() || ctx.storage_buffers() >= crate::context::TAP_NORM_OUT_STORAGE_BUFFERS;
        let split = ctx.tuning.norm_in_residual && m.chunks.len() == 1 && room;
        let f = ops::GemvFusion {
            accumulate: true,
            tap,
            norm_out: next.filter(|_| split).map(|weight| ops::NormOut {
                weight,
                buf: b.prenorm,
            }),
            ..Default::default()
        };
        d.extend(ops::gemv_fused(ctx, m, input, b.x, n, &f)?);
        return Ok(f.norm_out.map(|_| ops::norm_out_parts(ctx, m)));
    };
    if tap.is_some() {
        return Err(crate::error::GpuError::Unsupported(
            "a tap after a convolved sublayer".into(),
        ));
    }
    d.extend(ops::gemv(ctx, m, input, cb.o, n, false)?);
    let shape = conv_shape(s, cv, 1);
    d.push(ops::grouped_conv(
        ctx, &shape, cb.o, cb.coef, cv.base, b.x, n, true,
    )?);
    Ok(None)
}

/// The norm after a layer's attention: its MLP's, which a residual GEMV can prepare
/// unless DFlash2 convolves the MLP's input.
fn mlp_norm<'a>(w: &LayerWeights<'a>) -> Option<&'a wgpu::Buffer> {
    match &w.conv {
        None => Some(w.ffn_norm),
        Some(_) => None,
    }
}

fn conv_shape(s: &LayerShape, cv: &ConvWeights, side: usize) -> ops::ConvShape {
    ops::ConvShape {
        hidden: s.hidden,
        taps: cv.taps,
        group: cv.group,
        side,
    }
}

/// RMSNorm + QKV (one GEMV where q, k, v are stacked, the bias in its epilogue),
/// per-head norms + RoPE + KV store, attention, o_proj + residual (and the MLP norm's
/// share, whose partial sums it returns, where the adapter splits norms).
pub(crate) fn attention_block(
    ctx: &GpuContext,
    d: &mut Vec<Dispatch>,
    s: &LayerShape,
    w: &LayerWeights,
    (b, prepared): (&LayerBuffers, Prepared),
    n: usize,
) -> Result<Prepared> {
    let row = s.qkv_row();
    let conv = w.conv.as_ref().map(|c| &c[0]);
    let (norm, x) = sublayer_input(ctx, d, s, (w.attn_norm, prepared), conv, b, n)?;
    let mut col = 0;
    for (m, bias) in w.qkv {
        let f = ops::GemvFusion {
            bias: bias.as_ref(),
            out_offset: col,
            out_stride: row,
            ..norm
        };
        d.extend(ops::gemv_fused(ctx, m, x, b.qkv, n, &f)?);
        col += m.rows;
    }
    let shape = ops::QkvShape {
        style: s.rope_style,
        n_heads: s.n_heads,
        n_kv_heads: s.n_kv_heads,
        head_dim: s.head_dim,
        rope_dim: s.rope_dim,
        eps: s.eps,
        gate: s.gate,
    };
    let qkv = ops::QkvBuffers {
        state: b.state,
        table: b.rope_table,
        qkv: b.qkv,
        qk_norm: w.qk_norm,
        k_cache: w.k_cache,
        v_cache: w.v_cache,
    };
    let att = ops::AttentionShape {
        n_heads: s.n_heads,
        n_kv_heads: s.n_kv_heads,
        head_dim: s.head_dim,
        window: w.window,
        causal: s.causal || w.causal,
        q_stride: row,
    };
    if ctx.tuning.chunked_attention {
        let bufs = ops::ChunkedAttentionBuffers {
            qkv,
            part_ml: b.att_parts[0],
            part_acc: b.att_parts[1],
            out: b.att,
        };
        d.extend(ops::attention_chunked(
            ctx, &shape, &att, &bufs, s.capacity, n,
        )?);
    } else {
        d.push(ops::qkv_rope_store(ctx, &shape, &qkv, n)?);
        d.push(ops::attention(
            ctx, &att, b.state, b.qkv, w.k_cache, w.v_cache, b.att, n,
        )?);
    }
    if s.gate {
        let gate_at = s.q_dim() + 2 * s.kv_dim();
        d.push(ops::sigmoid_gate(
            ctx,
            b.qkv,
            (gate_at, row),
            b.att,
            n,
            s.q_dim(),
        )?);
    }
    sublayer_output(ctx, d, s, (w.wo, b.att, None), (conv, mlp_norm(w)), b, n)
}

/// RMSNorm + the input projection `[qkv; z; b; a]` (one GEMV where stacked), the
/// convolution and the recurrence over the layer's states, the output projection +
/// residual.
pub(crate) fn delta_net_block(
    ctx: &GpuContext,
    d: &mut Vec<Dispatch>,
    s: &LayerShape,
    (w, dn): (&LayerWeights, &GpuDeltaNet),
    (b, prepared): (&LayerBuffers, Prepared),
    n: usize,
) -> Result<Prepared> {
    let Some(lb) = &b.linear else {
        return Err(crate::error::GpuError::Unsupported(
            "a linear-attention layer without its work buffers".into(),
        ));
    };
    let bufs = (b.x, b.xn, b.prenorm);
    let (norm, x) = norm_input(ctx, d, (w.attn_norm, s.eps), bufs, (prepared, n), s.hidden)?;
    let stride = dn.shape.proj_stride();
    let mut col = 0;
    for (m, _) in w.qkv {
        let f = ops::GemvFusion {
            out_offset: col,
            out_stride: stride,
            ..norm
        };
        d.extend(ops::gemv_fused(ctx, m, x, &dn.proj, n, &f)?);
        col += m.rows;
    }
    d.extend(ops::delta_net(ctx, &dn.shape, &dn.buffers(lb), n, false)?);
    sublayer_output(ctx, d, s, (w.wo, lb.read, None), (None, mlp_norm(w)), b, n)
}

/// RMSNorm + gate/up + SwiGLU (one GEMV where the two are stacked), down + residual,
/// the layer's output also into `tap` where given; where the adapter splits norms, the
/// share of the norm `next` (the next layer's or the final one) in the down GEMV, whose
/// partial sums it returns.
pub(crate) fn mlp_block(
    ctx: &GpuContext,
    d: &mut Vec<Dispatch>,
    s: &LayerShape,
    w: &LayerWeights,
    (b, tap): (&LayerBuffers, Option<ops::GemvTap>),
    (prepared, next): (Prepared, Option<&wgpu::Buffer>),
    n: usize,
) -> Result<Prepared> {
    let conv = w.conv.as_ref().map(|c| &c[1]);
    let (norm, x) = sublayer_input(ctx, d, s, (w.ffn_norm, prepared), conv, b, n)?;
    let (gate_up, down) = match w.ffn {
        GpuFfn::Dense { gate_up, down } => (gate_up, down),
        GpuFfn::Moe(e) if conv.is_none() => {
            experts_block(ctx, d, e, (norm, x), (b, tap), n)?;
            return Ok(None);
        }
        GpuFfn::Moe(_) => {
            return Err(crate::error::GpuError::Unsupported(
                "a convolved mixture of experts".into(),
            ))
        }
    };
    gate_up_swiglu(ctx, d, gate_up, (x, &norm), b, n, s.intermediate)?;
    sublayer_output(ctx, d, s, (down, b.ff, tap), (conv, next), b, n)
}

/// `ff = silu(gate x) * up x` over `n` rows of `width`: one paired GEMV where gate and
/// up are stacked, else two and the SwiGLU kernel.
fn gate_up_swiglu(
    ctx: &GpuContext,
    d: &mut Vec<Dispatch>,
    gate_up: &GateUp,
    (x, norm): (&wgpu::Buffer, &ops::GemvFusion),
    b: &LayerBuffers,
    n: usize,
    width: usize,
) -> Result<()> {
    match gate_up {
        GateUp::Stacked(m) => {
            let f = ops::GemvFusion {
                pair: true,
                ..*norm
            };
            d.extend(ops::gemv_fused(ctx, m, x, b.ff, n, &f)?);
        }
        GateUp::Apart { gate, up } => {
            d.extend(ops::gemv_fused(ctx, gate, x, b.gate, n, norm)?);
            d.extend(ops::gemv_fused(ctx, up, x, b.up, n, norm)?);
            d.push(ops::swiglu(ctx, b.gate, b.up, b.ff, n, width)?);
        }
    }
    Ok(())
}

/// A mixture of experts on the normalised rows (`norm` fused into the router's and the
/// experts' GEMVs where the adapter fuses it): router scores, each row's experts and
/// weights (moe.wgsl `route`), gate/up + SwiGLU of each chosen expert, down, and the
/// weighted sum added to the residual (into `tap` too where given).
fn experts_block<'a>(
    ctx: &GpuContext,
    d: &mut Vec<Dispatch>,
    e: &GpuExperts,
    (norm, x): (ops::GemvFusion<'a>, &'a wgpu::Buffer),
    (b, tap): (&LayerBuffers, Option<ops::GemvTap>),
    n: usize,
) -> Result<()> {
    let Some(mb) = &b.moe else {
        return Err(crate::error::GpuError::Unsupported(
            "a mixture of experts without its work buffers".into(),
        ));
    };
    let s = &e.shape;
    // The shared expert first (its SwiGLU rows in ff before the routed experts' use it).
    if let Some(sh) = &e.shared {
        let width = sh.down.cols;
        gate_up_swiglu(ctx, d, &sh.gate_up, (x, &norm), b, n, width)?;
        d.extend(ops::gemv(ctx, &sh.down, b.ff, mb.shared[0], n, false)?);
        d.extend(ops::gemv_fused(ctx, &sh.weigh, x, mb.shared[1], n, &norm)?);
    }
    d.extend(ops::gemv_fused(ctx, &e.router, x, mb.scores, n, &norm)?);
    d.push(ops::route_experts(
        ctx,
        s,
        mb.scores,
        (mb.routes, mb.weights),
        n,
    )?);
    experts_gate_up(ctx, d, e, (&norm, x), (b, mb), n)?;
    let plain = ops::GemvFusion::default();
    d.extend(ops::gemv_experts(
        ctx,
        &e.down,
        s,
        mb.routes,
        (b.ff, mb.expert_out),
        true,
        &plain,
        n,
    )?);
    let shared = e.shared.as_ref().map(|_| (mb.shared[0], mb.shared[1]));
    d.push(ops::combine_experts(
        ctx,
        s,
        (mb.weights, mb.expert_out),
        shared,
        b.x,
        tap,
        n,
    )?);
    Ok(())
}

/// Gate/up + SwiGLU of each row's chosen experts into `b.ff` (one paired GEMV where the
/// stacks share buffers, else gate, up and a SwiGLU apart).
fn experts_gate_up(
    ctx: &GpuContext,
    d: &mut Vec<Dispatch>,
    e: &GpuExperts,
    (norm, x): (&ops::GemvFusion, &wgpu::Buffer),
    (b, mb): (&LayerBuffers, &MoeBuffers),
    n: usize,
) -> Result<()> {
    let s = &e.shape;
    let slots = n * s.k;
    match &e.gate_up {
        GateUp::Stacked(m) => {
            let f = ops::GemvFusion {
                pair: true,
                ..*norm
            };
            d.extend(ops::gemv_experts(
                ctx,
                m,
                s,
                mb.routes,
                (x, b.ff),
                false,
                &f,
                n,
            )?);
        }
        GateUp::Apart { gate, up } => {
            d.extend(ops::gemv_experts(
                ctx,
                gate,
                s,
                mb.routes,
                (x, b.gate),
                false,
                norm,
                n,
            )?);
            d.extend(ops::gemv_experts(
                ctx,
                up,
                s,
                mb.routes,
                (x, b.up),
                false,
                norm,
                n,
            )?);
            d.push(ops::swiglu(
                ctx,
                b.gate,
                b.up,
                b.ff,
                slots,
                up.rows / s.n_experts,
            )?);
        }
    }
    Ok(())
}
