//! moe.wgsl and gemv.wgsl's `main_experts`: a mixture of experts' routing, its
//! experts' GEMVs and their weighted sum.
//!
//! # Mixture-of-experts targets
//!
//! **qwen3_moe** (`config::MoeConfig`; `weights::FeedForward::Moe`, in dflash-core). Each
//! projection of every expert is one matrix stacked by expert (GGUF's 3-D `ffn_*_exps`,
//! or Hugging Face's per-expert tensors stacked at load: `TensorSource::stacked_matrix`),
//! uploaded in chunks that never split an expert (`upload::stack_rows_per_chunk`). A
//! sparse layer on the GPU: the router GEMV (the norm fused), `moe.wgsl route` (softmax,
//! top-k ties to the lower index, renormalised: `cpu::ops::route_experts` is the same
//! rule), `gemv.wgsl main_experts` for `[gate; up]` of all experts with SwiGLU and then
//! for down (a workgroup per expert and row tile serves every row that chose the expert,
//! so a 16-row verify reads each chosen expert once; a row's sums are the plain kernel's,
//! so the pass stays batch-invariant; workgroups of unchosen experts return at once), and
//! `combine` (the slots summed in order, then the shared expert's output weighed by
//! sigmoid of its gate where the model has one (Qwen3.5-MoE; its GEMVs run before the
//! routed ones), then the residual; `combine_tap` for DFlash's taps). The verify cost
//! against one row is what `auto` sizes blocks by (`step_costs`, `dflash bench
//! --synthetic qwen3-coder-30b-a3b`).
//!
//! Qwen3.5's hybrid targets (`qwen3_5`, and `qwen3_5_moe` with experts in every layer),
//! and speculative verification over their recurrent state, are described in
//! `dflash_core::cpu::delta_net`'s module docs
//! (`crates/dflash-core/src/cpu/delta_net.rs`).

use super::gemv::{GemvBinding, GemvParams};
use super::gemv_fusion::{
    format_id, gemv_lanes, gemv_norm_params, gemv_outputs, gemv_rows_per_workgroup, gemv_threads,
    shape_name, GemvFusion, GemvTap,
};
use crate::context::GpuContext;
use crate::error::Result;
use crate::pipelines::{bindings, grid, Dispatch, Kernel, Shader, WORKGROUP_SIZE};
use crate::upload::GpuMatrix;

/// A mixture of experts' sizes (`dflash_core::config::MoeConfig`).
#[derive(Debug, Clone, Copy)]
pub struct ExpertShape {
    pub n_experts: usize,
    /// Experts each row uses.
    pub k: usize,
    pub normalize: bool,
    pub hidden: usize,
}

/// The uniform of moe.wgsl.
#[repr(C)]
#[derive(Clone, Copy, Default, bytemuck::Pod, bytemuck::Zeroable)]
pub struct MoeParams {
    pub n_rows: u32,
    pub n_experts: u32,
    pub normalize: u32,
    pub hidden: u32,
    pub tap_offset: u32,
    pub tap_stride: u32,
    pub pad0: u32,
    pub pad1: u32,
}

bindings! {
    /// The `@binding`s of moe.wgsl.
    MoeBinding(Moe) {
        SCORES = 1, ROUTES = 2, WEIGHTS = 3, EXPERT_OUT = 4, X = 5, TAPS = 6, SHARED_OUT = 7,
        SHARED_GATE = 8,
    }
}

/// Each of `n` rows' experts and weights from its router `scores` (`[n, n_experts]`):
/// `routes` (u32) and `weights` (f32), `[n, k]` each.
pub fn route_experts(
    ctx: &GpuContext,
    s: &ExpertShape,
    scores: &wgpu::Buffer,
    (routes, weights): (&wgpu::Buffer, &wgpu::Buffer),
    n: usize,
) -> Result<Dispatch> {
    let k = Kernel::new(Shader::Moe, "route").with("EXPERT_K", s.k as f64);
    let params = MoeParams {
        n_rows: n as u32,
        n_experts: s.n_experts as u32,
        normalize: s.normalize as u32,
        ..Default::default()
    };
    let bufs = [
        (MoeBinding::SCORES, scores),
        (MoeBinding::ROUTES, routes),
        (MoeBinding::WEIGHTS, weights),
    ];
    Ok(Dispatch::new(ctx, &k, Some(&params), &bufs, [1, 1, 1])?
        .shaped(format!("{} experts k={} n={n}", s.n_experts, s.k), 0))
}

/// `x[r] += sum_j weights[r, j] * expert_out[r, j]` over `n` rows, plus
/// `sigmoid(gate[r]) * out[r]` of the shared expert's `(out, gate)` where given (and the
/// new x into `tap` where given).
pub fn combine_experts(
    ctx: &GpuContext,
    s: &ExpertShape,
    (weights, expert_out): (&wgpu::Buffer, &wgpu::Buffer),
    shared: Option<(&wgpu::Buffer, &wgpu::Buffer)>,
    x: &wgpu::Buffer,
    tap: Option<GemvTap>,
    n: usize,
) -> Result<Dispatch> {
    let entry = if tap.is_some() {
        "combine_tap"
    } else {
        "combine"
    };
    let k = Kernel::new(Shader::Moe, entry)
        .with("EXPERT_K", s.k as f64)
        .with("SHARED", shared.is_some() as u8 as f64);
    let params = MoeParams {
        n_rows: n as u32,
        hidden: s.hidden as u32,
        tap_offset: tap.map_or(0, |t| t.offset) as u32,
        tap_stride: tap.map_or(0, |t| t.stride) as u32,
        ..Default::default()
    };
    let mut bufs = vec![
        (MoeBinding::WEIGHTS, weights),
        (MoeBinding::EXPERT_OUT, expert_out),
        (MoeBinding::X, x),
    ];
    if let Some(t) = tap {
        bufs.push((MoeBinding::TAPS, t.buf));
    }
    let (out, gate) = shared.unwrap_or((&ctx.unused, &ctx.unused));
    bufs.extend([
        (MoeBinding::SHARED_OUT, out),
        (MoeBinding::SHARED_GATE, gate),
    ]);
    let groups = (n * s.hidden).div_ceil(WORKGROUP_SIZE as usize) as u32;
    let io = 4 * (n * s.hidden * (s.k + 2)) as u64;
    Ok(
        Dispatch::new(ctx, &k, Some(&params), &bufs, [groups, 1, 1])?
            .shaped(format!("{}x{} k={} n={n}", n, s.hidden, s.k), io),
    )
}

/// One projection of every expert a row chose, over `n` rows (gemv.wgsl
/// `main_experts`): `m` stacks the experts' rows (`rows_per_expert` each, no expert
/// split between chunks), `y[(r * k + j) * rows_per_expert + o]` for row r's slot j;
/// `x_slots`: row r's input for slot j is x row `r * k + j` (the down projection), else
/// x row r (with the norm of `f` where given). `f.pair`: `m` is `[gate; up]` of every
/// expert and y gets SwiGLU of the two.
#[allow(clippy::too_many_arguments)]
pub fn gemv_experts(
    ctx: &GpuContext,
    m: &GpuMatrix,
    s: &ExpertShape,
    routes: &wgpu::Buffer,
    (x, y): (&wgpu::Buffer, &wgpu::Buffer),
    x_slots: bool,
    f: &GemvFusion,
    n: usize,
) -> Result<Vec<Dispatch>> {
    let halves = if f.pair { 2 } else { 1 };
    let rows_per_expert = m.rows / s.n_experts / halves;
    let whole = |r: usize| r.is_multiple_of(rows_per_expert * halves);
    if f.norm_out.is_some() {
        return Err(crate::error::GpuError::Unsupported(
            "a next norm's share in an expert GEMV's epilogue".into(),
        ));
    }
    if rows_per_expert == 0
        || rows_per_expert * s.n_experts * halves != m.rows
        || (f.pair && m.chunks.len() != 1)
        || m.chunks.iter().any(|c| !whole(c.row_lo) || !whole(c.rows))
    {
        return Err(crate::error::GpuError::Unsupported(format!(
            "an expert stack of {} rows for {} experts, split between buffers",
            m.rows, s.n_experts
        )));
    }
    let k = Kernel::new(Shader::Gemv, "main_experts")
        .with("FORMAT", format_id(m.format))
        .with("GROUP", m.group as f64)
        .with("N_ROWS", n as f64)
        .with("LANES", gemv_lanes(ctx, m) as f64)
        .with("OUTS", gemv_outputs(ctx, m, f.pair) as f64)
        .with("THREADS", gemv_threads(ctx, m) as f64)
        .with("NORM", f.norm.is_some() as u8 as f64)
        .with("NORM_SUMS", f.prenormed.is_some() as u8 as f64)
        .with("PAIR", f.pair as u8 as f64)
        .with("EXPERT_K", s.k as f64)
        .with("X_SLOTS", x_slots as u8 as f64);
    let tiles = rows_per_expert.div_ceil(gemv_rows_per_workgroup(ctx, m, f.pair));
    let (eps, norm_parts) = gemv_norm_params(ctx, m, f);
    let mut out = Vec::new();
    for ch in &m.chunks {
        let experts = ch.rows / rows_per_expert / halves;
        let (gx, gy) = grid((experts * tiles) as u32);
        let params = GemvParams {
            n_rows: n as u32,
            k: m.cols as u32,
            m: rows_per_expert as u32,
            out_stride: rows_per_expert as u32,
            wg_x: gx,
            eps,
            pair_rows: if f.pair { (ch.rows / 2) as u32 } else { 0 },
            expert_lo: (ch.row_lo / rows_per_expert / halves) as u32,
            norm_parts: norm_parts as u32,
            ..Default::default()
        };
        let bufs = [
            (GemvBinding::X, x),
            (GemvBinding::QS, &ch.qs),
            (GemvBinding::SCALES, &ch.scales),
            (GemvBinding::MINS, &ch.mins),
            (GemvBinding::Y, y),
            (GemvBinding::NORM_W, f.norm.map_or(&ctx.unused, |(w, _)| w)),
            (GemvBinding::BIAS, &ctx.unused),
            (GemvBinding::ROUTES, routes),
        ];
        // What a pass reads at most: every expert some row chose, once.
        let chosen = (n * s.k).min(experts) as u64;
        let per_expert = (ch.qs.size() + ch.scales.size() + ch.mins.size()) / experts as u64;
        let io = 4 * (n * (m.cols + rows_per_expert * halves * s.k)) as u64;
        out.push(
            Dispatch::new(ctx, &k, Some(&params), &bufs, [gx, gy, 1])?.shaped(
                format!(
                    "experts {}",
                    shape_name(rows_per_expert * halves, m.cols, m.format, n)
                ),
                chosen * per_expert + io,
            ),
        );
    }
    Ok(out)
}
